#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# smoke.sh — ctest containers.smoke: proves the container test kit (container_kit.sh) on this node,
# for podman and for docker each: a program of the build tree runs inside and reaches a private
# malld through the bind-mounted socket folder (mallctl status, with MALL_SOCKET from the run
# options), the container's init lands under the given --cgroup-parent, an exec'd process joins the
# container's cgroup, narrowing the --cgroup-parent's cpuset from outside changes nproc inside (and
# widening brings it back), and after the kit's cleanup nothing of the test is left.
# Exit 0 pass, 1 fail, 2 usage, 77 skip (not root, or podman/docker not installed: printed, and
# logged to $MALL_TEST_SKIP_LOG); --help for the manual.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=container_kit.sh
. "$here/container_kit.sh"

usage() {
  cat <<'EOF'
NAME
    smoke.sh - the container test kit's smoke test (ctest containers.smoke, label containers)

SYNOPSIS
    smoke.sh --bin-dir DIR [--engines LIST] [--timeout SECONDS]
    smoke.sh --help

DESCRIPTION
    Starts a private malld (--backend affinity: it touches no cgroup) on a socket in the kit's
    folder, then for each engine (podman, docker; docker through a private dockerd):
      1. `run --rm` of DIR/mallctl status inside, with the socket folder bind-mounted and
         MALL_SOCKET/MALL_JOB_ID set by the kit's mall options: it must exit 0;
      2. a detached container under --cgroup-parent <kit cgroup>/<engine>-job: its init's host pid
         must be in that folder's cpuset subtree, and an exec'd process in the init's cgroup;
      3. nproc inside equals the parent's cpus; after the parent's cpuset is narrowed from outside
         (the container's own folder too, in v1's order) nproc is 1, after widening it is back;
         os.cpu_count(), sched_getaffinity and /proc/cpuinfo are printed;
      4. the container is removed and the engine lists none.
    Then malld stops, the kit cleans up, and the kit's leak check must find nothing: no container
    process, conmon, dockerd, containerd or shim of the test, no cgroup folder of the test in any
    hierarchy, no mount under the test's folder, no runc state, no folder. Each step is bounded by
    a watchdog (a hang fails the step); the whole run by --timeout. Timings are printed.

OPTIONS
    --bin-dir DIR     the build's runtime output folder (CMAKE_RUNTIME_OUTPUT_DIRECTORY): malld
                      and mallctl are taken from there (and mounted read-only in the containers)
    --engines LIST    comma-separated subset of podman,docker (default: both)
    --timeout S       the whole run's watchdog (default 150); every engine command has its own
                      (CTR_STEP_TIMEOUT_S, default here 30)

EXIT STATUS
    0 every check passed; 1 a check failed (FAIL lines say which); 2 usage; 77 skipped: not root,
    or an engine is not installed (the other one is still tested: a failure there exits 1).
EOF
}

bin="" engines="podman,docker" timeout_s=150
while [ $# -gt 0 ]; do
  case $1 in
    --bin-dir) bin=${2-}; shift 2 || { usage >&2; exit 2; } ;;
    --engines) engines=${2-}; shift 2 || { usage >&2; exit 2; } ;;
    --timeout) timeout_s=${2-}; shift 2 || { usage >&2; exit 2; } ;;
    -h|--help) usage; exit 0 ;;
    *) echo "smoke.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
done
[ -n "$bin" ] || { echo "smoke.sh: --bin-dir is required" >&2; exit 2; }
watchdog_script "$timeout_s" --bin-dir "$bin" --engines "$engines" --timeout "$timeout_s"
export CTR_STEP_TIMEOUT_S=${CTR_STEP_TIMEOUT_S:-30}

ctr_test_reporting containers.smoke   # pass, fail, note, skip WHAT WHY
t_start=$(ctr__now_ms)

if [ "$(id -u)" -ne 0 ]; then
  skip "all" "needs root (cgroup folders, a private dockerd, podman as root); run as root"
  exit 77
fi
for p in malld mallctl; do
  [ -x "$bin/$p" ] || { fail "$bin/$p is missing: build it first (ninja malld mallctl)"; exit 1; }
done
bin=$(cd "$bin" && pwd)

ctr_sweep
ctr_init smoke || { fail "ctr_init"; exit 1; }
cleanup() {
  trap - EXIT
  ctr_malld_stop
  ctr_cleanup
}
trap cleanup EXIT
trap 'watchdog_fired "$timeout_s"; exit 1' TERM
trap 'echo "FAIL: interrupted"; exit 130' INT
note "kit folder $CTR_DIR, cgroup $CTR_CGROUP"

# ---- a private malld -------------------------------------------------------------------------------
sock=$CTR_DIR/sock/malld.sock
ctr_malld_start "$bin" "$sock" --backend affinity --log-level warn || { fail "private malld (log above)"; exit 1; }
pass "private malld answers on $sock"
ctr_bind_ro "$bin"

ncpus_of() { ctr__cpulist_expand "$1" | wc -l; }
times=()

check_engine() { # check_engine ENGINE: the four checks of the manual for one engine
  local e=$1 parent=$CTR_CGROUP/$1-job t out pid cg mon cpus0 first n rc
  if [ "$e" = docker ]; then
    if ! ctr_docker_start; then fail "docker: the private dockerd did not start"; return; fi
    pass "docker: private dockerd ready in $CTR_DOCKERD_START_MS ms ($(dockerd --version | cut -d, -f1))"
    times+=("dockerd start ${CTR_DOCKERD_START_MS} ms")
    ctr_ms t ctr_image docker || { fail "docker: importing the rootfs as an image"; return; }
    note "docker import of the tiny rootfs: $t ms"
  else
    note "$(podman --version), runc $(runc --version | sed -n 's/^runc version //p')"
  fi
  ctr_cgroup_make "$parent" || { fail "$e: making the cgroup parent $parent"; return; }
  ctr_mall_opts "$sock" "$e-job" "$parent" || { fail "$e: ctr_mall_opts"; return; }

  # 1. a build-tree program inside reaches malld through the bind-mounted socket folder.
  rc=0
  ctr_ms t ctr_run "$e" probe --rm "${CTR_MALL_OPTS[@]}" -- "$bin/mallctl" status >"$CTR_DIR/probe.out" 2>&1 || rc=$?
  if [ "$rc" = 0 ]; then
    pass "$e: $bin/mallctl status inside (MALL_SOCKET=$sock) exits 0 ($e run --rm: $t ms)"
    times+=("$e run --rm $t ms")
  else
    fail "$e: mallctl status inside exited $rc:"; sed 's/^/      /' "$CTR_DIR/probe.out"
  fi

  # 2. the container's init under --cgroup-parent; an exec'd process in the same cgroup.
  ctr_ms t ctr_run "$e" job -d "${CTR_MALL_OPTS[@]}" -- /usr/bin/sleep 600 >/dev/null ||
    { fail "$e: run -d of the job container"; return; }
  note "$e run -d: $t ms"
  if ! { pid=$(ctr_pid "$e" job) && cg=$(ctr_cgroup_of "$pid"); }; then
    fail "$e: no host pid or cgroup for the job container"; return
  fi
  case $cg in
    "$parent"/*) pass "$e: the container's init (host pid $pid) is in $cg" ;;
    *) fail "$e: the container's init (host pid $pid) is in '$cg', not under $parent" ;;
  esac
  if mon=$(ctr_monitor_pid "$e" job); then
    note "$e: its monitor ($(cat "/proc/$mon/comm" 2>/dev/null), pid $mon, parent" \
         "$(ps -o ppid= -p "$mon" | tr -d ' ')) is in $(ctr_cgroup_of "$mon")"
  fi
  # Compared inside, as the container sees both (v2's private cgroup namespace shows "/" to both).
  # shellcheck disable=SC2016  # expanded inside the container
  out=$(ctr_exec "$e" job sh -c 'if [ "$(cat /proc/self/cgroup)" = "$(cat /proc/1/cgroup)" ]; then echo same
                                 else cat /proc/self/cgroup; echo "init:"; cat /proc/1/cgroup; fi')
  if [ "$out" = same ]; then pass "$e: an exec'd process is in the container's cgroups (those of its init)"
  else fail "$e: an exec'd process is not in the cgroups of the container's init:"; note "$out"; fi

  # 3. narrowing the parent from outside changes nproc inside; widening brings it back.
  cpus0=$(ctr_cpuset_get "$parent")
  n=$(ctr_exec "$e" job nproc)
  if [ "$n" = "$(ncpus_of "$cpus0")" ]; then pass "$e: nproc inside is $n (the parent's cpus: $cpus0)"
  else fail "$e: nproc inside is '$n', the parent has $cpus0"; fi
  if [ "$(ncpus_of "$cpus0")" -lt 2 ]; then
    note "$e: the parent has one cpu: narrowing cannot be shown on this machine"
  else
    first=$(ctr__cpulist_expand "$cpus0" | head -n 1)
    ctr_ms t ctr_cpuset_set "$parent" "$first" || fail "$e: narrowing $parent to $first"
    n=$(ctr_exec "$e" job nproc)
    if [ "$n" = 1 ]; then pass "$e: after narrowing $parent to cpu $first from outside ($t ms), nproc inside is 1"
    else fail "$e: after narrowing $parent to cpu $first, nproc inside is '$n'"; fi
    # shellcheck disable=SC2016  # expanded inside the container
    out=$(ctr_exec "$e" job sh -c 'echo "os.cpu_count(), len(sched_getaffinity):" \
      "$(/usr/bin/python3 -c "import os; print(os.cpu_count(), len(os.sched_getaffinity(0)))");" \
      "/proc/cpuinfo: $(grep -c ^processor /proc/cpuinfo) cpus;" \
      "cpuset.cpus seen inside: $(cat /sys/fs/cgroup/cpuset/cpuset.cpus 2>/dev/null || echo "(no v1 cpuset mount)")"')
    note "$e: narrowed: $out"
    ctr_cpuset_set "$parent" "$cpus0" || fail "$e: widening $parent back to $cpus0"
    n=$(ctr_exec "$e" job nproc)
    if [ "$n" = "$(ncpus_of "$cpus0")" ]; then pass "$e: after widening back to $cpus0, nproc inside is $n"
    else fail "$e: after widening back to $cpus0, nproc inside is '$n'"; fi
  fi

  # 4. removal: the engine lists no container of the test.
  ctr_ms t ctr_rm "$e" job || fail "$e: rm -f of the job container"
  out=$(ctr__engine "$e" ps --all --quiet)
  if [ -z "$out" ]; then pass "$e: rm -f took $t ms and the engine lists no container"
  else fail "$e: containers left after rm: $out"; fi
}

IFS=, read -ra engine_list <<<"$engines"
for e in "${engine_list[@]}"; do
  case $e in
    podman|docker) ;;
    *) echo "smoke.sh: unknown engine $e" >&2; exit 2 ;;
  esac
  if ! ctr_have "$e"; then skip "$e" "$CTR_WHY"; continue; fi
  check_engine "$e"
done

# ---- cleanup and the leak check ------------------------------------------------------------------------
ctr_malld_stop
ctr_ms t ctr_check_nothing_left
times+=("cleanup and leak check (dockerd stop included) $t ms")
trap - EXIT

times+=("total $(( $(ctr__now_ms) - t_start )) ms")
summary=$(printf '%s; ' "${times[@]}")
note "times: ${summary%; }"
if [ "$failures" -gt 0 ]; then echo "smoke: $failures check(s) failed"; exit 1; fi
if [ "$skipped" -gt 0 ]; then echo "smoke: passed, but $skipped engine(s) skipped (above): exit 77"; exit 77; fi
echo "smoke: all checks passed"
