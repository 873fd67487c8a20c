# SPDX-License-Identifier: BSD-3-Clause
# private_cluster.sh — sourced by the system tests: sets up a private cluster's environment (own
# folder, cgroup parent and free port pair, so a test runs beside a developer's cluster without
# touching it; one node, or `up --nodes N`), the helpers that check what the cluster leaves behind,
# and the helpers the tests share (jobs, thread masks, and each node's malld of a multi-node
# cluster: node_*).
# Usage: systest_begin DEFAULT_TIMEOUT_S "$@" first (watchdog, arguments, root check, PASS/FAIL),
# then private_cluster_init NAME FIRST_PORT (sets $work, MALL_CLUSTER_*, $port, $cgroups_before).
# The caller owns the cleanup trap (cluster_cleanup_traps sets the usual one) and calls
# local-cluster.sh up/down. A script that also runs in the
# qemu guest of tests/vm calls guest_setup_for_slurm before private_cluster_init.

. "$(dirname "${BASH_SOURCE[0]}")/../support/watchdog.sh"   # watchdog_script, watchdog_fired

# Re-runs the calling script under the watchdog (watchdog_script: its SIGTERM reaches the script's
# trap, which brings the cluster down and calls watchdog_fired, so a hang fails the test instead of
# stalling CI; ctest's TIMEOUT is the outer one), reads BUILD_DIR SOURCE_DIR into $build and $src,
# and exits 77 (ctest's skip) when not root.
systest_begin() {
  timeout_s=${MALL_SYSTEST_TIMEOUT_S:-$1}; shift   # global: the scripts' TERM traps name it
  watchdog_script "$timeout_s" "$@"
  local me; me=$(basename "$0")
  build=$(cd "${1:?usage: $me BUILD_DIR SOURCE_DIR}" && pwd)
  src=$(cd "${2:?usage: $me BUILD_DIR SOURCE_DIR}" && pwd)
  cluster=$src/launch_scripts/local-cluster.sh
  failures=0
  if [ "$(id -u)" -ne 0 ]; then
    local why="the local cluster needs root (Slurm's daemons, munged, malld's cgroups); run as root"
    echo "SKIP: $why"
    # run-tests.sh lists skips with their reasons from this log (the format of tests/support/gtest_main.cpp).
    [ -n "${MALL_TEST_SKIP_LOG:-}" ] && echo "SKIPPED $me $me: $why" >>"$MALL_TEST_SKIP_LOG"
    exit 77   # ctest: SKIP_RETURN_CODE
  fi
}
# systest_require "TOOL..." FILE...: every tool installed, every file built, and the project's
# 2-cpu node (not a skip: only "not root" skips, so CI never passes silently); else FAIL and exit 1.
systest_require() {
  local tool f
  for tool in $1; do
    command -v "$tool" >/dev/null || { echo "FAIL: $tool not installed: run launch_scripts/install-deps.sh"; exit 1; }
  done
  shift
  for f in "$@"; do
    [ -e "$f" ] || { echo "FAIL: $f is not built: run ninja -C $build (the plugin needs libslurm-dev, the MPI trainer Open MPI)"; exit 1; }
  done
  if [ "$(nproc --all)" -ne 2 ]; then
    echo "FAIL: this test is written for the project's 2-cpu node (cpus 0 and 1); this one has $(nproc --all) cpus"
    exit 1
  fi
}
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; failures=$(( failures + 1 )); }
# Helpers every system test uses (status_json reads $mallctl, set by the test).
note() { echo "      $*"; }
wait_for() { # wait_for SECONDS CMD...: polls CMD every 50 ms until it succeeds; false at the deadline
  local limit=$1; shift
  local deadline=$(( $(date +%s%N) + limit * 1000000000 ))
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s%N)" -lt $deadline ] || return 1
    sleep 0.05
  done
}
status_json() { timeout 10 "$mallctl" status --json 2>/dev/null; }
threads_lists() { # threads_lists PID: "tid:list" of each thread, for messages
  local f
  for f in /proc/"$1"/task/*/status; do
    printf '%s:%s ' "$(basename "$(dirname "$f")")" "$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' "$f" 2>/dev/null)"
  done
}
all_threads_on() { # all_threads_on PID MIN_THREADS LIST: every thread (at least MIN_THREADS) allows exactly LIST
  local pid=$1 min=$2 want=$3 f n=0 list
  for f in /proc/"$pid"/task/*/status; do
    list=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' "$f" 2>/dev/null) || return 1
    [ "$list" = "$want" ] || return 1
    n=$(( n + 1 ))
  done
  [ "$n" -ge "$min" ]
}
job_state() { scontrol show job "$1" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p'; }
job_final() {
  case $(job_state "$1") in
    COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE|PREEMPTED) return 0 ;;
  esac
  return 1
}

# ---- malld's jobs and its event log, for the tests that record events (cluster_up_recording) -----
job_pids() { status_json | jq -r --arg j "$1" '.jobs[] | select(.job == $j) | .pids[]' 2>/dev/null; }
reserved_for() { status_json | jq -r --arg j "$1" '.reserved[$j] // ""' 2>/dev/null; }
job_settled_on() { # job_settled_on JOB CPUS: published and enforced on exactly CPUS, nothing pending
  local s; s=$(status_json) || return 1
  [ "$(jq -r --arg j "$1" '.jobs[] | select(.job == $j) | "\(.cpus) \(.cpuset) \(.state)"' <<<"$s")" = "$2 $2 settled" ]
}
events_of() { # events_of FILTER: matching events from the running watch, one JSON line each
  jq -c "select($1)" "$work/watch.jsonl" 2>/dev/null
}
has_event() { [ -n "$(events_of "$1")" ]; }
first_event_time() { events_of "$1" | head -n1 | jq -r '.time'; }
# "a < b" for decimal seconds since the epoch
earlier() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a + 0 < b + 0) }'; }
# cluster_up_recording: brings the private cluster up (local-cluster.sh up, then its environment),
# then starts one `mallctl watch --json` for the whole run into $work/watch.jsonl (its pid in
# watch_pid, for the cleanup), synced: a `policy` event proves it is subscribed. Exits 1 on failure.
cluster_up_recording() {
  if ! "$cluster" up >"$work/up.log" 2>&1; then
    fail "local-cluster.sh up: $(cat "$work/up.log")"
    for f in "$MALL_CLUSTER_DIR"/log/*; do echo "--- $f"; tail -n 20 "$f"; done
    exit 1
  fi
  eval "$("$cluster" env)"
  pass "local-cluster.sh up (port $port, cgroup parent $MALL_CLUSTER_CGROUP, plugin loaded: $(grep -c mall_spank "$MALL_CLUSTER_DIR/etc/plugstack.conf"))"
  "$mallctl" watch --json --timeout-s "$timeout_s" >"$work/watch.jsonl" 2>"$work/watch.err" &
  watch_pid=$!
  watch_ready() { "$mallctl" policy equal >/dev/null 2>&1; has_event '.event == "policy"'; }
  if ! wait_for 10 watch_ready; then
    fail "mallctl watch recorded no event within 10s ($(cat "$work/watch.err"))"
    exit 1
  fi
}

private_cluster_init() {
  local name=$1 first_port=$2
  work=$(mktemp -d "/tmp/$name.XXXXXX")
  chmod 0755 "$work"
  export MALL_CLUSTER_DIR=$work/cluster
  export MALL_BUILD_DIR=$build
  export MALL_CLUSTER_CGROUP=mall_cluster_systest$$
  export MALL_CLUSTER_TIMEOUT_S=${MALL_CLUSTER_TIMEOUT_S:-30}   # longer in the qemu guest
  port=$first_port   # global: the tests print it
  while port_taken $port || port_taken $(( port + 1 )); do
    port=$(( port + 10 ))
    [ $port -lt 7500 ] || { echo "FAIL: no free port pair for slurmctld/slurmd in $first_port..7500"; exit 1; }
  done
  export MALL_CLUSTER_PORT=$port
  cgroups_before=$(cgroups_now)
}

# cluster_cleanup_traps: for a test whose leftovers are only its cluster and $work: on exit brings
# the cluster down (unless cluster_down_and_nothing_left already did: cluster_down_done=1) and
# removes $work; ^C fails the test, and the watchdog's SIGTERM fails it through watchdog_fired.
# Tests with more to clean (watchers, borrowers, extra pids) keep their own cleanup.
cluster_cleanup_traps() {
  cluster_down_done=0
  cleanup() {
    trap - EXIT INT TERM
    if [ "$cluster_down_done" -eq 0 ]; then "$cluster" down >/dev/null || echo "FAIL: local-cluster.sh down (in the cleanup)"; fi
    rm -rf "$work"
  }
  trap cleanup EXIT
  trap 'echo "FAIL: interrupted"; exit 1' INT
  trap 'watchdog_fired "$timeout_s"; exit 1' TERM
}

port_taken() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# cluster_down_and_nothing_left [EXTRA_PIDS]: brings the cluster down (sets cluster_down_done=1 for
# the caller's cleanup trap) and checks that no daemon of the run, no process of the run's jobs (and
# none of EXTRA_PIDS), no new cgroup folder and no state folder remain; one PASS/FAIL line each.
cluster_down_and_nothing_left() {
  local pids_of_run alive_left='' new_cgroups pid
  pids_of_run=$(cat "$MALL_CLUSTER_DIR"/run/*.pid 2>/dev/null | sort -u | tr "\n" " ")
  cluster_down_done=1
  if "$cluster" down >"$work/down.log" 2>&1; then pass "local-cluster.sh down"; else fail "local-cluster.sh down: $(cat "$work/down.log")"; fi
  for pid in $pids_of_run ${1:-}; do live "$pid" && alive_left+="$pid($(cat "/proc/$pid/comm" 2>/dev/null)) "; done
  alive_left+=$(run_processes | tr '\n' ' ')
  new_cgroups=$(comm -13 <(echo "$cgroups_before") <(cgroups_now) | tr '\n' ' ')
  if [ -z "${alive_left// }" ] && [ -z "${new_cgroups// }" ] && [ ! -e "$MALL_CLUSTER_DIR" ]; then
    pass "no process, cgroup folder or state folder of the cluster remains"
  else
    fail "left behind: processes '$alive_left', cgroups '$new_cgroups', state folder $( [ -e "$MALL_CLUSTER_DIR" ] && echo present || echo gone)"
  fi
}

# cgroup folders a cluster makes: malld's parent (one per node with --nodes: <parent>_nodeK) and, with the cgroup plugins, Slurm's: v1
# slurm_<node> in each hierarchy, v2 system.slice (made by local-cluster.sh where systemd is absent)
# and its <node>_slurmstepd.scope (compared before/after, so another cluster's folders are not counted).
cgroups_now() {
  find /sys/fs/cgroup /sys/fs/cgroup/* -mindepth 1 -maxdepth 1 -type d \
       \( -name "$MALL_CLUSTER_CGROUP" -o -name "${MALL_CLUSTER_CGROUP}_*" -o -name 'mall_cluster' -o -name 'slurm_*' -o -name system.slice \
          -o -name '*_slurmstepd.scope' \) 2>/dev/null | sort -u
}

# guest_setup_for_slurm: in the qemu guest of tests/vm (MALL_IN_VM=1) only, what Slurm and these
# scripts need and the guest lacks: /dev/fd (bash's <(...) in cluster_down_and_nothing_left), a host
# name (it has "(none)"), the loopback interface up, and one non-loopback IPv4 address (a dummy
# interface), without which getaddrinfo(AI_ADDRCONFIG) resolves nothing, not even 127.0.0.1, and
# slurmctld stops ("Unable to resolve"). Elsewhere it does nothing.
guest_setup_for_slurm() {
  [ "${MALL_IN_VM:-}" = 1 ] || return 0
  [ -e /dev/fd ] || ln -s /proc/self/fd /dev/fd
  [ "$(hostname)" != '(none)' ] || hostname mallvm
  grep -qw "$(hostname)" /etc/hosts 2>/dev/null || echo "127.0.0.1 $(hostname)" >>/etc/hosts
  ip link set lo up
  if ! ip -4 addr show scope global | grep -q inet; then
    modprobe dummy && ip link add mall0 type dummy && ip addr add 10.213.0.1/24 dev mall0 && ip link set mall0 up ||
      { echo "FAIL: cannot give the guest a non-loopback address for Slurm (dummy interface)"; exit 1; }
  fi
}
state_of() { local stat; stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0; stat=${stat##*) }; echo "${stat%% *}"; }
live() { local st; st=$(state_of "$1"); [ -n "$st" ] && [ "$st" != Z ] && [ "$st" != X ]; }
run_processes() { # live processes started by this run's cluster (they carry MALL_CLUSTER_DAEMON=<dir>)
  local p
  for p in /proc/[0-9]*; do
    grep -qzxF "MALL_CLUSTER_DAEMON=$MALL_CLUSTER_DIR" "$p/environ" 2>/dev/null || continue
    live "${p#/proc/}" && echo "${p#/proc/}($(cat "$p/comm" 2>/dev/null))"
  done
}

# ---- helpers the Slurm system tests share (submit writes $work/NAME.out and NAME.sbatch.err) --------
expand_cpus() { # expand_cpus "0-1,3": one cpu number per line
  local part a b
  for part in ${1//,/ }; do
    if [[ $part == *-* ]]; then a=${part%-*}; b=${part#*-}; seq "$a" "$b"; else echo "$part"; fi
  done
}
threads_cpus() { # threads_cpus PID...: the union of Cpus_allowed_list over every thread, one cpu a line
  local pid f list
  for pid in "$@"; do
    for f in /proc/"$pid"/task/*/status; do
      list=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' "$f" 2>/dev/null)
      [ -n "$list" ] && expand_cpus "$list"
    done
  done | sort -un
}
job_running() { [ "$(job_state "$1")" = RUNNING ]; }
submit() { # submit NAME SBATCH_ARGS...: prints the job id; the output goes to $work/NAME.out
  local name=$1; shift
  local id
  id=$(sbatch --parsable --job-name="$name" --output="$work/$name.out" "$@" 2>"$work/$name.sbatch.err") || return 1
  [ -n "$id" ] || return 1
  echo "${id%%;*}"
}
never_share() { # never_share PIDS_A PIDS_B N: N samples; fails at the first one where the threads of the
  # two pid lists allow a common cpu (or a list is empty); prints what it saw
  local a=$1 b=$2 n=$3 i ca cb common
  for (( i = 1; i <= n; i++ )); do
    # shellcheck disable=SC2086  # word lists of pids
    ca=$(threads_cpus $a | tr '\n' ',')
    # shellcheck disable=SC2086
    cb=$(threads_cpus $b | tr '\n' ',')
    common=$(comm -12 <(tr ',' '\n' <<<"$ca" | sed '/^$/d' | sort) <(tr ',' '\n' <<<"$cb" | sed '/^$/d' | sort) | tr '\n' ',')
    if [ -z "$ca" ] || [ -z "$cb" ] || [ -n "$common" ]; then
      echo "sample $i: first job's threads allow {${ca%,}}, second job's {${cb%,}}"
      return 1
    fi
    sleep 0.05   # sampling interval, not a wait
  done
  echo "$n samples: first job's threads allow {${ca%,}}, second job's {${cb%,}}"
}

# ---- a multi-node cluster (`up --nodes N`): each node's malld, by node name (node1, node2, ...) ----
node_sock() { echo "$MALL_CLUSTER_DIR/nodes/$1/malld.sock"; }
node_ctl() { local n=$1; shift; timeout 10 "$mallctl" --socket "$(node_sock "$n")" "$@"; }
node_status() { node_ctl "$1" status --json 2>/dev/null; }
node_job_field() { # node_job_field NODE JOB FIELD: a field of JOB in NODE's malld ("" when not listed)
  node_status "$1" | jq -r --arg j "$2" --arg f "$3" '.jobs[] | select(.job == $j) | .[$f] | tostring' 2>/dev/null
}
node_job_pids() { node_status "$1" | jq -r --arg j "$2" '.jobs[] | select(.job == $j) | .pids[]' 2>/dev/null; }
node_reserved_for() { node_status "$1" | jq -r --arg j "$2" '.reserved[$j] // ""' 2>/dev/null; }
node_job_settled_on() { # node_job_settled_on NODE JOB CPUS: published and enforced on exactly CPUS, nothing pending
  [ "$(node_status "$1" | jq -r --arg j "$2" '.jobs[] | select(.job == $j) | "\(.cpus) \(.cpuset) \(.state)"')" = "$3 $3 settled" ]
}
node_job_cgroups() { # node_job_cgroups NODE: folders below NODE's malld cgroup parent, in every hierarchy
  local h
  for h in /sys/fs/cgroup/*/; do
    [ -d "$h${MALL_CLUSTER_CGROUP}_$1" ] && find "$h${MALL_CLUSTER_CGROUP}_$1" -mindepth 1 -type d
  done 2>/dev/null
}
argv0_is() { [ "$(tr '\0' '\n' <"/proc/$1/cmdline" 2>/dev/null | head -n1)" = "$2" ]; }
node_task_pid() { # node_task_pid NODE JOB PROGRAM: the pid among JOB's pids at NODE's malld that runs PROGRAM
  local p
  for p in $(node_job_pids "$1" "$2"); do argv0_is "$p" "$3" && { echo "$p"; return 0; }; done
  return 1
}
# rpc_table FILE: the "by message type" lines of an sdiag output, as "TYPE COUNT"
rpc_table() { sed -n '/statistics by message type/,/^$/p' "$1" | awk '$1 ~ /^(REQUEST|MESSAGE|RESPONSE)_/ { c = $0; sub(/.*count:/, "", c); sub(/ .*/, "", c); print $1, c }'; }
other_cpu() { case $1 in 0) echo 1 ;; 1) echo 0 ;; *) echo '?' ;; esac; }   # of a 2-cpu node
pid_of() { cat "$MALL_CLUSTER_DIR/run/$1.pid" 2>/dev/null; }   # a daemon local-cluster.sh started
