#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# test_signal_control.sh — ctest containers.signal_control: a container without malld's socket is
# resized from the host by `mallctl signal`, for podman and for docker each. The C client
# mall_signal_client runs as the container's init with MALL_SIGNAL_CONTROL=1 and no malld; the
# host's root sends it `--threads 1`, `--cpus <first>` and back, by its host pid, and checks each
# confirmation, the client's own lines and every one of its threads' Cpus_allowed_list from the
# host; a request beyond the container's cpuset is refused with words; then nothing is left.
# Exit 0 pass, 1 fail, 2 usage, 77 skip (not root, or podman/docker not installed: printed, and
# logged to $MALL_TEST_SKIP_LOG); --help for the manual.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=container_kit.sh
. "$here/container_kit.sh"

usage() {
  cat <<'EOF'
NAME
    test_signal_control.sh - control by signal of a process inside a container (ctest
    containers.signal_control, label containers)

SYNOPSIS
    test_signal_control.sh --bin-dir DIR [--engines LIST] [--timeout SECONDS]
    test_signal_control.sh --help

DESCRIPTION
    For each engine (podman, docker; docker through a private dockerd), with no malld at all:
      1. runs DIR/mall_signal_client --workers 4 detached as the container's init, with
         MALL_SIGNAL_CONTROL=1, under a cgroup parent of the kit with two cpus;
      2. from the host, `mallctl signal <host pid> --threads 1` must exit 0 with the container's
         confirmation, the client must print its change (threads=1), every thread of the process
         stays on the two cpus;
      3. `--cpus <first cpu>`: every thread on that cpu; `--cpus <both> --threads auto`: back;
      4. `--cpus 1000` (outside the container's cpus) is refused with words, the process lives;
      5. the container is removed, and after the kit's cleanup nothing of the test is left.

OPTIONS
    --bin-dir DIR     the build's runtime output folder: mallctl and mall_signal_client are taken
                      from there (mounted read-only in the containers, with the build's lib/)
    --engines LIST    comma-separated subset of podman,docker (default: both)
    --timeout S       the whole run's watchdog (default 150)

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
    *) echo "test_signal_control.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
done
[ -n "$bin" ] || { echo "test_signal_control.sh: --bin-dir is required" >&2; exit 2; }
watchdog_script "$timeout_s" --bin-dir "$bin" --engines "$engines" --timeout "$timeout_s"
export CTR_STEP_TIMEOUT_S=${CTR_STEP_TIMEOUT_S:-30}

ctr_test_reporting containers.signal_control

if [ "$(id -u)" -ne 0 ]; then
  skip "all" "needs root (cgroup folders, a private dockerd, podman as root); run as root"
  exit 77
fi
for p in mallctl mall_signal_client; do
  [ -x "$bin/$p" ] || { fail "$bin/$p is missing: build it first (ninja mallctl mall_signal_client)"; exit 1; }
done
bin=$(cd "$bin" && pwd)
lib=$(cd "$bin/../lib" 2>/dev/null && pwd) || { fail "$bin/../lib (libmall.so) is missing"; exit 1; }

ctr_sweep
ctr_init signal || { fail "ctr_init"; exit 1; }
trap ctr_cleanup EXIT
trap 'watchdog_fired "$timeout_s"; exit 1' TERM
trap 'echo "FAIL: interrupted"; exit 130' INT
ctr_bind_ro "$bin" "$lib"

# Every thread of PID on CPUS (from the host's /proc)?
threads_on() {
  local pid=$1 want=$2 t got
  for t in /proc/"$pid"/task/*; do
    got=$(sed -n 's/^Cpus_allowed_list:\s*//p' "$t/status" 2>/dev/null) || continue
    [ -z "$got" ] || [ "$got" = "$want" ] || return 1
  done
}
describe_threads() { local t; for t in /proc/"$1"/task/*; do echo "$(basename "$t"):$(sed -n 's/^Cpus_allowed_list:\s*//p' "$t/status" 2>/dev/null)"; done | tr '\n' ' '; }
signal() { "$bin/mallctl" signal "$@" >"$CTR_DIR/out" 2>"$CTR_DIR/err"; }

check_engine() {
  local e=$1 parent=$CTR_CGROUP/$1-sig cpus first pid rc eng
  if [ "$e" = docker ]; then
    ctr_docker_start || { fail "docker: the private dockerd did not start"; return; }
    ctr_image docker || { fail "docker: importing the rootfs as an image"; return; }
  fi
  # Cpus 0-1 (every machine of this kind has them): the moves go between them.
  ctr_cgroup_make "$parent" 0-1 || { fail "$e: making the cgroup parent $parent with cpus 0-1"; return; }
  cpus=$(ctr_cpuset_get "$parent") first=0
  [ "$cpus" = 0-1 ] || { fail "$e: the parent $parent has cpus '$cpus', not 0-1"; return; }
  eng=$(ctr_engine_bin "$e") || { fail "$e: ctr_engine_bin"; return; }
  ctr_run "$e" sig -d --cgroup-parent "$parent" -e MALL_SIGNAL_CONTROL=1 -e MALL_QUIET=1 \
    -- "$bin/mall_signal_client" --workers 4 --duration-s 120 >/dev/null ||
    { fail "$e: run -d of mall_signal_client"; return; }
  pid=$(ctr_pid "$e" sig) || { fail "$e: no host pid for the container"; return; }
  if ! ctr_wait_until 10000 "its mall-signal record" sh -c "ls -l /proc/$pid/fd | grep -q mall-signal"; then
    fail "$e: the client in the container (host pid $pid) did not opt in"; ctr__engine "$e" logs "$CTR_PREFIX-sig"; return
  fi
  pass "$e: mall_signal_client is the container's init, host pid $pid, cpus $cpus, no malld"

  if signal "$pid" --threads 1 && grep -q "1 thread on cpus $cpus" "$CTR_DIR/out"; then
    pass "$e: mallctl signal $pid --threads 1: $(cat "$CTR_DIR/out")"
  else fail "$e: mallctl signal --threads 1: $(cat "$CTR_DIR/out" "$CTR_DIR/err")"; fi
  if ctr_wait_until 5000 "the client's change line" \
       sh -c "'$eng' logs '$CTR_PREFIX-sig' 2>/dev/null | grep -q 'change threads=1 ncpus=2 cpus=$cpus gen=0'"; then
    pass "$e: the client applied it (change threads=1 ncpus=2 cpus=$cpus gen=0)"
  else fail "$e: the client's lines: $("$eng" logs "$CTR_PREFIX-sig" 2>&1 | tr '\n' ' ')"; fi
  if threads_on "$pid" "$cpus"; then pass "$e: every thread on $cpus"
  else fail "$e: threads: $(describe_threads "$pid")"; fi

  if signal "$pid" --cpus "$first" && ctr_wait_until 2000 "every thread on $first" threads_on "$pid" "$first"; then
    pass "$e: --cpus $first: every thread of the container's process on cpu $first ($(cat "$CTR_DIR/out"))"
  else fail "$e: --cpus $first: $(cat "$CTR_DIR/out" "$CTR_DIR/err"); threads: $(describe_threads "$pid")"; fi
  if signal "$pid" --cpus "$cpus" --threads auto && grep -q "2 threads on cpus $cpus" "$CTR_DIR/out" &&
     ctr_wait_until 2000 "every thread on $cpus" threads_on "$pid" "$cpus"; then
    pass "$e: --cpus $cpus --threads auto: back on $cpus with 2 threads"
  else fail "$e: back to $cpus: $(cat "$CTR_DIR/out" "$CTR_DIR/err"); threads: $(describe_threads "$pid")"; fi

  rc=0; signal "$pid" --cpus 1000 || rc=$?
  if [ "$rc" = 1 ] && grep -q "not all within $cpus" "$CTR_DIR/err" && kill -0 "$pid" 2>/dev/null; then
    pass "$e: --cpus 1000 refused ($(cat "$CTR_DIR/err")), the process lives"
  else fail "$e: --cpus 1000 exited $rc: $(cat "$CTR_DIR/err")"; fi

  ctr_rm "$e" sig || fail "$e: rm -f of the container"
}

IFS=, read -ra engine_list <<<"$engines"
for e in "${engine_list[@]}"; do
  case $e in
    podman|docker) ;;
    *) echo "test_signal_control.sh: unknown engine $e" >&2; exit 2 ;;
  esac
  if ! ctr_have "$e"; then skip "$e" "$CTR_WHY"; continue; fi
  check_engine "$e"
done

ctr_check_nothing_left
trap - EXIT
if [ "$failures" -gt 0 ]; then echo "signal_control: $failures check(s) failed"; exit 1; fi
if [ "$skipped" -gt 0 ]; then echo "signal_control: passed, but $skipped engine(s) skipped (above): exit 77"; exit 77; fi
echo "signal_control: all checks passed"
