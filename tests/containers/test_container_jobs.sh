#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# test_container_jobs.sh — ctest containers.jobs: podman and docker containers as malleable jobs,
# started the way a user starts them (`mallrun --container -- ENGINE run ...`) under a private
# malld with its cgroup backend. What a user would check, for each engine:
#   1. the container lands in the job's cgroup folder and libmall inside attaches by itself
#      (status JSON: container true, attached >= 1);
#   2. it follows `mallctl set`: the threads of the container's process, seen from the host
#      (/proc/PID/task/*/status) and from inside, and nproc inside, show the job's cpus; back with auto;
#   3. a process added with `exec` attaches to the job (as root and as another uid inside);
#   4. two containers share the node without overlap (status and their cpuset.cpus);
#   5. SIGKILL of a container's process ends its job and returns its cores to the other one;
#   6. a malld restart re-adopts a container job without touching it (same pids, same cpuset),
#      and the job follows `mallctl set` afterwards;
#   7. a foreground `run --rm` gives mallrun the container's exit code, and its job ends;
#   8. refusals across users: a container process may not attach to another user's job, and another
#      user's process may not attach to a container job; a user-namespaced container (its root is
#      host uid 200000) attaches to its own job;
#   9. nothing is left: no job, no cgroup folder in any hierarchy, no container (the kit's leak check).
# Exit 0 pass, 1 fail, 2 usage, 77 skip (not root, or podman/docker missing: printed, and logged
# to $MALL_TEST_SKIP_LOG). --help for the manual.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=container_kit.sh
. "$here/container_kit.sh"

usage() {
  cat <<'EOF'
NAME
    test_container_jobs.sh - containers as malleable jobs (ctest containers.jobs, label containers)

SYNOPSIS
    test_container_jobs.sh --bin-dir DIR [--engines LIST] [--timeout SECONDS]

DESCRIPTION
    Starts a private malld (cgroup backend, policy equal) and, for each engine, runs containers
    with `mallrun --container` of the build tree, then checks the nine points listed at the top
    of this file. Every step is bounded by a watchdog; the kit removes everything at the end and
    its leak check must find nothing.

OPTIONS
    --bin-dir DIR   the build's runtime output folder (malld, mallctl, mallrun, mall_test_client)
    --engines LIST  comma-separated subset of podman,docker (default: both)
    --timeout S     the whole run's watchdog (default 300)

EXIT STATUS
    0 all checks passed; 1 a check failed; 2 usage; 77 skipped (not root, no cgroup cpuset
    controller, or an engine not installed: the reason is printed).
EOF
}

bin="" engines="podman,docker" timeout_s=300
while [ $# -gt 0 ]; do
  case $1 in
    --bin-dir) bin=${2-}; shift 2 || { usage >&2; exit 2; } ;;
    --engines) engines=${2-}; shift 2 || { usage >&2; exit 2; } ;;
    --timeout) timeout_s=${2-}; shift 2 || { usage >&2; exit 2; } ;;
    -h|--help) usage; exit 0 ;;
    *) echo "test_container_jobs.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
done
[ -n "$bin" ] || { echo "test_container_jobs.sh: --bin-dir is required" >&2; exit 2; }
watchdog_script "$timeout_s" --bin-dir "$bin" --engines "$engines" --timeout "$timeout_s"
export CTR_STEP_TIMEOUT_S=${CTR_STEP_TIMEOUT_S:-30}

ctr_test_reporting containers.jobs   # pass, fail, note, skip WHAT WHY

if [ "$(id -u)" -ne 0 ]; then skip all "needs root (cgroups, podman as root, a private dockerd)"; exit 77; fi
for p in malld mallctl mallrun mall_test_client; do
  [ -x "$bin/$p" ] || { echo "FAIL: $bin/$p is missing: build it first"; exit 1; }
done
bin=$(cd "$bin" && pwd)
lib=$(cd "$bin/../lib" 2>/dev/null && pwd) || lib=""

ctr_sweep
ctr_init jobs || { echo "FAIL: ctr_init"; exit 1; }
parent=mallctrjobs$$          # malld's --cgroup-parent: its folders in every hierarchy
sock=$CTR_DIR/sock/malld.sock
start_malld() { # start_malld [MALLD-ARGS...]: the test's malld (same socket, state and folders)
  ctr_malld_start "$bin" "$sock" --cgroup-parent "$parent" --policy equal --log-level debug "$@" ||
    { echo "FAIL: the private malld did not start (log above)"; return 1; }
}
our_folders() { # every folder of this malld, in any hierarchy
  local m
  for m in $(ctr__cgroup_mounts); do [ -d "$m/$parent" ] && find "$m/$parent" -mindepth 0 -type d; done
}
remove_our_folders() { # what a failed run left (malld removes them when everything goes well)
  local m
  for m in $(ctr__cgroup_mounts); do
    [ -d "$m/$parent" ] && find "$m/$parent" -depth -type d -exec rmdir {} \; 2>/dev/null
  done
  return 0
}
cleanup() {
  trap - EXIT
  [ -n "${other_pid:-}" ] && kill -KILL "$other_pid" 2>/dev/null
  ctr_malld_stop
  ctr_cleanup
  remove_our_folders
}
trap cleanup EXIT
trap 'watchdog_fired "$timeout_s"; exit 1' TERM
trap 'echo "FAIL: interrupted"; exit 130' INT

if ! ctr__cpuset_mount >/dev/null; then skip all "no cgroup cpuset controller on this machine"; exit 77; fi
start_malld || exit 1
pass "private malld (cgroup backend, --cgroup-parent $parent) answers on $sock"
all=$(timeout 10 "$bin/mallctl" --socket "$sock" status --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["pool"])')
ncpu=$(ctr__cpulist_expand "$all" | wc -l)
[ "$ncpu" -ge 2 ] || { skip all "malld's pool ($all) has one cpu: nothing can move"; exit 77; }
ctr_bind_ro "$bin"
[ -n "$lib" ] && ctr_bind_ro "$lib"

# ---- helpers: status JSON and /proc --------------------------------------------------------------
status_json() { timeout 10 "$bin/mallctl" --socket "$sock" status --json; }
job_field() { # job_field JOB FIELD: the field of JOB in status, "" when the job is not there
  status_json | python3 -c 'import json,sys
s=json.load(sys.stdin); job,field=sys.argv[1],sys.argv[2]
for j in s.get("jobs",[]):
    if j.get("job")==job:
        v=j.get(field,""); print(json.dumps(v) if isinstance(v,(list,dict,bool)) else v)' "$1" "$2"
}
job_is() { [ "$(job_field "$1" cpus)" = "$2" ] && [ "$(job_field "$1" state)" = settled ]; }
job_gone() { [ -z "$(job_field "$1" job)" ]; }
job_exists() { [ -n "$(job_field "$1" job)" ]; }
threads_on() { [ "$(host_thread_masks "$1")" = "$2" ]; }  # threads_on PID CPUS
job_attached() { [ "$(job_field "$1" attached)" -ge "${2:-1}" ] 2>/dev/null; }
host_thread_masks() { # the distinct Cpus_allowed_list of PID's threads, comma-joined
  local t
  for t in /proc/"$1"/task/*; do sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' "$t/status" 2>/dev/null; done | sort -u | paste -sd, -
}
mallrun_container() { # mallrun_container ENGINE JOB MALLRUN-OPTS... -- RUN-WORDS...: mallrun --container
  local e=$1 job=$2; shift 2
  local opts=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do opts+=("$1"); shift; done
  shift
  watchdog_run "$CTR_STEP_TIMEOUT_S" "$bin/mallrun" --socket "$sock" --container --require --job "$job" "${opts[@]}" \
    -- "$(ctr_engine_bin "$e")" run "$@"
}

check_engine() {
  local e=$1 a=$1-a b=$1-b pid pid_b cg folder masks out rc cpus_a cpus_b t0 t
  if [ "$e" = docker ]; then
    ctr_docker_start || { fail "docker: the private dockerd did not start"; return; }
    ctr_image docker || { fail "docker: importing the rootfs"; return; }
  fi

  # 1. a detached container job: in the job's folder, libmall inside attached.
  ctr_run_args "$e" a || { fail "$e: ctr_run_args"; return; }
  t0=$(ctr__now_ms)
  out=$(mallrun_container "$e" "$a" --malleable=1:2 -- -d "${CTR_RUN_ARGS[@]}" \
          "$bin/mall_test_client" --threads 2 --step-us 2000 --duration-s 200 2>&1) ||
    { fail "$e: mallrun --container ... run -d exited $?: $out"; return; }
  t=$(( $(ctr__now_ms) - t0 ))
  pid=$(ctr_pid "$e" a) || { fail "$e: no host pid for container a"; return; }
  cg=$(ctr_cgroup_of "$pid")
  case $cg in
    "/$parent/job_$a/"*) pass "$e: mallrun --container returned in $t ms; the container's process (host pid $pid) is in $cg" ;;
    *) fail "$e: the container's process is in '$cg', not below /$parent/job_$a" ;;
  esac
  if ctr_wait_until 10000 "$a attached" job_attached "$a" && [ "$(job_field "$a" container)" = true ]; then
    pass "$e: status shows $a as a container job with libmall inside attached (attached $(job_field "$a" attached))"
  else fail "$e: $a is not an attached container job: $(status_json)"; fi

  # 2. it follows mallctl set: threads outside and inside, nproc inside.
  local first=${all%%-*}
  timeout 10 "$bin/mallctl" --socket "$sock" set "$a" --cpus "$first" >/dev/null || fail "$e: mallctl set $a --cpus $first"
  if ctr_wait_until 10000 "$a on cpu $first" job_is "$a" "$first"; then
    masks=$(host_thread_masks "$pid")
    out=$(ctr_exec "$e" a sh -c 'nproc; for t in /proc/1/task/*; do sed -n "s/^Cpus_allowed_list:[[:space:]]*//p" $t/status; done | sort -u | paste -sd, -')
    if [ "$masks" = "$first" ] && [ "$out" = "1
$first" ]; then
      pass "$e: after mallctl set --cpus $first: every thread on $first seen from the host and inside, nproc 1"
    else fail "$e: after set --cpus $first: host thread masks '$masks', inside (nproc, masks) '$(echo $out)'"; fi
    note "$e: inside, narrowed: $(ctr_exec "$e" a /usr/bin/python3 -c 'import os; print("os.cpu_count()", os.cpu_count(), "len(sched_getaffinity)", len(os.sched_getaffinity(0)))'); /proc/cpuinfo lists $(ctr_exec "$e" a grep -c ^processor /proc/cpuinfo) cpus"
  else fail "$e: $a did not settle on cpu $first: $(status_json)"; fi
  timeout 10 "$bin/mallctl" --socket "$sock" set "$a" --cpus auto >/dev/null || fail "$e: mallctl set $a --cpus auto"
  if ctr_wait_until 10000 "$a back on $all" job_is "$a" "$all" &&
     ctr_wait_until 5000 "threads of $a on $all" threads_on "$pid" "$all" &&
     [ "$(ctr_exec "$e" a nproc)" = "$ncpu" ]; then
    pass "$e: with --cpus auto the job is back on $all (threads and nproc follow)"
  else fail "$e: after set --cpus auto: status $(job_field "$a" cpus), masks $(host_thread_masks "$pid"), nproc $(ctr_exec "$e" a nproc)"; fi

  # 3. exec'd processes attach (children of conmon or the shim, known by their cgroup), as root and uid 1000.
  out=$(ctr_exec "$e" a "$bin/mall_test_client" --threads 1 --steps 3 --duration-s 20 2>&1)
  if grep -q "^open rc=0 job=$a" <<<"$out" && grep -q '^done steps=3' <<<"$out"; then
    pass "$e: a process added with $e exec attaches to $a and steps"
  else fail "$e: the exec'd process did not attach: $out"; fi
  out=$(ctr__engine "$e" exec --user 1000:1000 "$CTR_PREFIX-a" "$bin/mall_test_client" --threads 1 --steps 3 --duration-s 20 2>&1)
  if grep -q "^open rc=0 job=$a" <<<"$out"; then pass "$e: an exec'd process of uid 1000 (job owner: root) attaches too"
  else fail "$e: the exec'd uid-1000 process did not attach: $out"; fi

  # 4. two containers share the node without overlap.
  ctr_run_args "$e" b || { fail "$e: ctr_run_args b"; return; }
  out=$(mallrun_container "$e" "$b" --malleable=1:2 -- -d "${CTR_RUN_ARGS[@]}" \
          "$bin/mall_test_client" --threads 2 --step-us 2000 --duration-s 200 2>&1) ||
    { fail "$e: mallrun --container for $b exited $?: $out"; return; }
  pid_b=$(ctr_pid "$e" b)
  local deadline=$(( $(ctr__now_ms) + 10000 ))
  while :; do
    cpus_a=$(job_field "$a" cpus); cpus_b=$(job_field "$b" cpus)
    [ "$(job_field "$a" state)" = settled ] && [ "$(job_field "$b" state)" = settled ] &&
      [ -n "$cpus_a" ] && [ -n "$cpus_b" ] && [ "$cpus_a" != "$all" ] && break
    [ "$(ctr__now_ms)" -ge "$deadline" ] && break
    sleep 0.1
  done
  local set_a set_b
  set_a=$(cat "$(ctr_cgroup_path "$parent/job_$a")/cpuset.cpus" 2>/dev/null)
  set_b=$(cat "$(ctr_cgroup_path "$parent/job_$b")/cpuset.cpus" 2>/dev/null)
  if [ -n "$cpus_a" ] && [ -n "$cpus_b" ] && [ "$cpus_a" = "$set_a" ] && [ "$cpus_b" = "$set_b" ] &&
     [ -z "$(comm -12 <(ctr__cpulist_expand "$cpus_a" | sort) <(ctr__cpulist_expand "$cpus_b" | sort))" ] &&
     [ "$(host_thread_masks "$pid")" = "$cpus_a" ] && [ "$(host_thread_masks "$pid_b")" = "$cpus_b" ]; then
    pass "$e: two containers share the node without overlap: $a on $cpus_a, $b on $cpus_b (status, cpuset.cpus, threads)"
  else fail "$e: overlap or mismatch: status $a '$cpus_a' $b '$cpus_b'; cpuset.cpus '$set_a' '$set_b'; threads '$(host_thread_masks "$pid")' '$(host_thread_masks "$pid_b")'"; fi

  # 5. SIGKILL of b's process: its job ends and a gets the cores back.
  kill -KILL "$pid_b"
  if ctr_wait_until 10000 "$b gone" job_gone "$b" && ctr_wait_until 10000 "$a back on $all" job_is "$a" "$all"; then
    pass "$e: after SIGKILL of $b's process its job ended and $a has $all again"
  else fail "$e: after SIGKILL of $b: $(status_json)"; fi
  ctr_rm "$e" b >/dev/null 2>&1

  # 6. a malld restart re-adopts a without touching it.
  local pids_before cpuset_before
  timeout 10 "$bin/mallctl" --socket "$sock" set "$a" --cpus "$first" >/dev/null
  ctr_wait_until 10000 "$a on $first" job_is "$a" "$first"
  pids_before=$(job_field "$a" pids)
  cpuset_before=$(cat "$(ctr_cgroup_path "$parent/job_$a")/cpuset.cpus")
  ctr_malld_stop
  masks=$(host_thread_masks "$pid")
  start_malld || return
  if [ "$(job_field "$a" pids)" = "$pids_before" ] && [ "$(job_field "$a" cpus)" = "$first" ] &&
     [ "$(cat "$(ctr_cgroup_path "$parent/job_$a")/cpuset.cpus")" = "$cpuset_before" ] &&
     [ "$(host_thread_masks "$pid")" = "$masks" ] && [ "$(job_field "$a" container)" = true ]; then
    pass "$e: a malld restart re-adopted $a (pids $pids_before, cpus $first) without touching its cpuset"
  else fail "$e: after the restart: $(status_json); cpuset $(cat "$(ctr_cgroup_path "$parent/job_$a")/cpuset.cpus")"; fi
  timeout 10 "$bin/mallctl" --socket "$sock" set "$a" --cpus auto >/dev/null
  if ctr_wait_until 10000 "$a back on $all after the restart" job_is "$a" "$all" &&
     ctr_wait_until 5000 "threads on $all" threads_on "$pid" "$all"; then
    pass "$e: after the restart $a follows mallctl set again (back on $all, threads too)"
  else fail "$e: after the restart $a did not follow set --cpus auto: $(status_json)"; fi

  # 7. foreground run --rm: mallrun exits with the container's code; the job ends.
  ctr_run_args "$e" fg || { fail "$e: ctr_run_args fg"; return; }
  out=$(mallrun_container "$e" "$e-fg" --malleable=1 -- --rm "${CTR_RUN_ARGS[@]}" /bin/sh -c 'nproc; exit 3' 2>&1)
  rc=$?
  if [ "$rc" = 3 ] && ctr_wait_until 10000 "$e-fg gone" job_gone "$e-fg"; then
    pass "$e: a foreground run --rm: mallrun exited 3 like the container, and its job ended"
  else fail "$e: foreground run: mallrun exited $rc (want 3), job $(job_field "$e-fg" job): $out"; fi

  # 9 (per engine). removing the container ends the job and its folders go in every hierarchy.
  ctr_rm "$e" a >/dev/null
  if ctr_wait_until 10000 "$a gone" job_gone "$a" &&
     ctr_wait_until 5000 "no folder of $a" sh -c "! ls -d $(ctr__cgroup_mounts | sed "s|\$|/$parent/job_$a|" | tr '\n' ' ') >/dev/null 2>&1"; then
    pass "$e: rm of the container ended $a; its folder is gone from every hierarchy"
  else fail "$e: after rm: $(status_json); folders: $(our_folders | tr '\n' ' ')"; fi
}

# 8. refusals across users (podman): uid 1001's own job (malld --admin-uid 1001 lets it register).
check_users() {
  local out
  ctr_malld_stop
  chmod o+x "$CTR_DIR" "$CTR_DIR/sock"   # uid 1001 must reach the socket (mode 0666)
  start_malld --admin-uid 1001 || { fail "users: malld"; return; }
  # A user namespace: the container's root is host uid 200000, neither the job's owner nor an
  # admin; its process belongs to the job by its cgroup and attaches.
  ctr_run_args podman ns || return
  out=$(mallrun_container podman users-ns --malleable=1 -- --rm --uidmap 0:200000:65536 --gidmap 0:200000:65536 \
          "${CTR_RUN_ARGS[@]}" /bin/sh -c "grep -E '^Uid:' /proc/self/status; cat /proc/self/uid_map; '$bin/mall_test_client' --steps 3 --duration-s 20" 2>&1)
  if grep -q "^open rc=0 job=users-ns" <<<"$out" && grep -q '^done steps=3' <<<"$out" &&
     grep -qE '^ *0 +200000 +65536' <<<"$out"; then
    pass "users: in a user namespace (container root = host uid 200000) the process attaches to its job"
  else fail "users: the user-namespaced container did not attach: $out"; fi
  ctr_wait_until 10000 "users-ns gone" job_gone users-ns || fail "users: users-ns did not end with its container"
  setpriv --reuid 1001 --regid 1001 --clear-groups "$bin/mallrun" --socket "$sock" --malleable=1 --job users-other \
    --require -- sleep 120 </dev/null >"$CTR_DIR/other.log" 2>&1 &
  other_pid=$!
  ctr_wait_until 20000 "users-other registered" job_exists users-other ||
    { fail "users: uid 1001's job did not register: $(cat "$CTR_DIR/other.log"); malld: $(tail -n 15 "$CTR_DIR/malld.log")"; return; }
  ctr_run_args podman u || return
  out=$(mallrun_container podman users-ctr --malleable=1 -- -d --user 1002:1002 "${CTR_RUN_ARGS[@]}" /usr/bin/sleep 120 2>&1) ||
    { fail "users: mallrun --container exited $?: $out"; return; }
  out=$(ctr__engine podman exec --user 1002:1002 --env MALL_JOB_ID=users-other "$CTR_PREFIX-u" "$bin/mall_test_client" --steps 1 --duration-s 10 2>&1)
  if grep -q "^open rc=0" <<<"$out"; then fail "users: a uid-1002 container process attached to uid 1001's job: $out"
  elif grep -q "users-other" <<<"$out"; then pass "users: a container process (uid 1002) may not attach to uid 1001's job ($(grep -o 'mall_open: .*' <<<"$out" | head -c 160))"
  else fail "users: the refusal does not name the job: $out"; fi
  out=$(ctr__engine podman exec --user 1002:1002 "$CTR_PREFIX-u" "$bin/mall_test_client" --steps 1 --duration-s 10 2>&1)
  if grep -q "^open rc=0 job=users-ctr" <<<"$out"; then pass "users: the same process attaches to its own container job"
  else fail "users: the container process did not attach to its own job: $out"; fi
  out=$(MALL_SOCKET=$sock MALL_JOB_ID=users-ctr setpriv --reuid 1001 --regid 1001 --clear-groups \
          "$bin/mall_test_client" --steps 1 --duration-s 10 2>&1)
  if grep -q "^open rc=0" <<<"$out"; then fail "users: uid 1001's process outside attached to the container job: $out"
  else pass "users: a process of uid 1001 outside the container may not attach to the container job"; fi
  ctr_rm podman u >/dev/null
  kill -TERM "$other_pid" 2>/dev/null; wait "$other_pid" 2>/dev/null; other_pid=""
  ctr_wait_until 10000 "users jobs gone" sh -c "[ -z \"\$(timeout 10 '$bin/mallctl' --socket '$sock' status --json | grep -o users-)\" ]" ||
    fail "users: jobs left: $(status_json)"
}

IFS=, read -ra engine_list <<<"$engines"
for e in "${engine_list[@]}"; do
  case $e in podman|docker) ;; *) echo "test_container_jobs.sh: unknown engine $e" >&2; exit 2 ;; esac
  if ! ctr_have "$e"; then skip "$e" "$CTR_WHY"; continue; fi
  check_engine "$e"
done
if ctr_have podman; then check_users; fi

# 9. clean teardown: no job, no folder of this malld anywhere after it stops, no container left.
out=$(status_json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["jobs"]))')
[ "$out" = 0 ] && pass "no job left in malld" || fail "jobs left: $(status_json)"
ctr_malld_stop
grep -E " (warn|error): " "$CTR_DIR/malld.log" 2>/dev/null | head -n 8 | sed 's/^/      malld: /'
if [ -z "$(our_folders)" ]; then pass "malld stopped and left no folder in any cgroup hierarchy"
else fail "folders left: $(our_folders | tr '\n' ' ')"; remove_our_folders; fi  # reported, then removed
ctr_check_nothing_left
trap - EXIT
if [ "$failures" -gt 0 ]; then echo "test_container_jobs: $failures check(s) failed"; exit 1; fi
if [ "$skipped" -gt 0 ]; then echo "test_container_jobs: passed, but $skipped part(s) skipped: exit 77"; exit 77; fi
echo "test_container_jobs: all checks passed"
