#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# bench-reclaim.sh — measures the prolog reclaim on a private Slurm cluster (one node, or --nodes N
# in network namespaces): while a malleable job A borrows every idle core, how long the reclaim in a
# new job B's prolog takes (malld's events: reclaim -> A's ack -> A's cpuset narrowed) and how much
# it delays B's start (against the same submissions with no borrower). A benchmark: prints figures,
# never passes or fails. See --help.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${MALL_BUILD_DIR:-$repo/build}
bin=$build/bin
prog=bench-reclaim.sh
iterations=20
step_us=1000
nodes=1
borrower=client

usage() {
  cat <<EOF
$prog — how long mall's reclaim in a Slurm job prolog takes, and what it costs the new job

Usage: launch_scripts/$prog [-n|--iterations N] [--step-us U] [--nodes K] [--borrower client|mpi]
       launch_scripts/$prog -h|--help

Brings up a private Slurm cluster with the mall plugin and malld (launch_scripts/local-cluster.sh:
temporary folder, free ports, its own cgroup parent; brought down at the end, also on failure or
Ctrl-C), then:
  1. baseline: N times, submits a plain job B (sbatch -c1 --wrap 'date +%s.%N') on the idle node
     and waits until it ended and its cores were released;
  2. starts a malleable job A (sbatch --malleable=1:<all cpus> -c1, srun mall_test_client
     --threads 2 --step-us U) that borrows every idle core, then submits the same N jobs B: each
     one's prolog makes malld take a core back from A (A acks at its next step, then its cpuset is
     narrowed) before B's task starts; after each B, A grows back before the next submission.
Times come from malld's event stream (mallctl watch --json: B's "reclaim", A's "ack" and A's
narrowing "enforce") and from B's own first output line (same clock). Slurm's StartTime has
1 s resolution, so it is not used.

Prints median and p99 (nearest rank: with N=20 that is the largest value) of:
  reclaim -> A's ack, reclaim -> A's cpuset narrowed,
  reclaim -> B's first output and submit -> B's first output, with A borrowing and without,
then the start delay the reclaim causes (median with A minus median without, reclaim -> first
output), and a last line:
  reclaim_to_narrowed_ms_median=X reclaim_to_narrowed_ms_p99=Y start_delay_ms_median=Z

With --nodes K (K >= 2; local-cluster.sh up --nodes K, each node in namespaces of its own with its
own malld) A has one task on every node (sbatch -N K --ntasks-per-node=1) and every B goes to the
last node (-w nodeK); the figures are that node's malld's. With --borrower mpi, A is
mall_train_mpi (srun --mpi=pmix, balanced mode) instead of mall_test_client: a rank applies a change
at the step where every rank does (an allreduce across the nodes), so its ack includes that
collective step; the other nodes' ranks cap themselves, and A must hold every node's pool again
before the next submission.

Options:
  -n, --iterations N  submissions per phase (default $iterations)
  --step-us U         A's step period in microseconds with --borrower client: A acks at its next
                      step (default $step_us)
  --nodes K           Slurm nodes (default 1: the classic single node on localhost)
  --borrower B        client (default): mall_test_client; mpi: mall_train_mpi, one rank per node

Needs root (the cluster's daemons and cgroups) and a build with malld, mallctl,
mall_test_client and the plugin (built here when missing). Takes about 1.5 minutes for N=20:
Slurm starts each job on its next scheduler pass, about once a second.
Environment: MALL_BUILD_DIR (default <repo>/build).
EOF
}

while [ $# -gt 0 ]; do
  case $1 in
    -n|--iterations) iterations=${2:?"$prog: $1 needs a value"}; shift ;;
    --iterations=*) iterations=${1#*=} ;;
    --step-us) step_us=${2:?"$prog: $1 needs a value"}; shift ;;
    --step-us=*) step_us=${1#*=} ;;
    --nodes) nodes=${2:?"$prog: $1 needs a value"}; shift ;;
    --nodes=*) nodes=${1#*=} ;;
    --borrower) borrower=${2:?"$prog: $1 needs a value"}; shift ;;
    --borrower=*) borrower=${1#*=} ;;
    -h|--help) usage; exit 0 ;;
    *) echo "$prog: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[[ $iterations =~ ^[1-9][0-9]*$ ]] || { echo "$prog: --iterations must be a positive integer, not '$iterations'" >&2; exit 2; }
[[ $step_us =~ ^[1-9][0-9]*$ ]] || { echo "$prog: --step-us must be a positive integer, not '$step_us'" >&2; exit 2; }
[[ $nodes =~ ^[1-9][0-9]*$ ]] && [ "$nodes" -le 16 ] || { echo "$prog: --nodes must be a node count from 1 to 16, not '$nodes'" >&2; exit 2; }
case $borrower in client|mpi) ;; *) echo "$prog: --borrower must be client or mpi, not '$borrower'" >&2; exit 2 ;; esac
[ "$(id -u)" -eq 0 ] || { echo "$prog: needs root (it starts Slurm's daemons, munged and malld); run it as root" >&2; exit 1; }

say() { printf '==> %s\n' "$*"; }
note() { printf '    %s\n' "$*"; }
die() { printf '%s: error: %s\n' "$prog" "$*" >&2; exit 1; }

# ---- everything this script starts, and how it is stopped -------------------------------------
tmp='' cluster_up=0 watch_pid=''
cluster_sh=$repo/launch_scripts/local-cluster.sh
cleanup() {
  local rc=$?
  set +e
  # The teardown must finish: a reader gone (demo | head) or a second Ctrl-C must not cut it short.
  trap '' PIPE INT TERM
  if [ -n "$watch_pid" ]; then kill -TERM "$watch_pid" 2>/dev/null; wait "$watch_pid" 2>/dev/null; fi
  if [ "$cluster_up" = 1 ]; then
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 130 ] && [ "$rc" -ne 143 ]; then
      echo "$prog: failed; the end of the cluster's logs (removed with the cluster):" >&2
      "$cluster_sh" logs 15 >&2
    fi
    "$cluster_sh" down >"$tmp/down.log" 2>&1 || { echo "$prog: bringing the cluster down failed:" >&2; cat "$tmp/down.log" >&2; }
  fi
  [ -n "$tmp" ] && rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

tmp=$(mktemp -d "${TMPDIR:-/tmp}/mall-bench-reclaim.XXXXXX")
chmod 0755 "$tmp"   # munged (user munge) must reach the cluster folder inside

# ---- build (only what is missing or out of date) ------------------------------------------------
targets=(malld mallctl mall_test_client mall_spank)
[ "$borrower" = client ] || targets+=(mall_train_mpi)
if [ ! -f "$build/build.ninja" ]; then
  say "configuring $build (first build: a minute or two)"
  cmake -G Ninja -B "$build" -S "$repo" >"$tmp/configure.log" 2>&1 || { tail -30 "$tmp/configure.log" >&2; die "cmake failed (log above)"; }
fi
if [ -w "$build" ]; then
  # One retry: another ninja in the same build folder (e.g. a test run) can make one step fail.
  ninja -C "$build" -j2 "${targets[@]}" >"$tmp/build.log" 2>&1 ||
    { sleep 2; ninja -C "$build" -j2 "${targets[@]}" >"$tmp/build.log" 2>&1; } ||
    { tail -40 "$tmp/build.log" >&2; die "the build failed (above); is libslurm-dev installed? (launch_scripts/install-deps.sh)"; }
fi
for f in bin/malld bin/mallctl bin/mall_test_client lib/mall_spank.so; do
  [ -e "$build/$f" ] || die "$build/$f is missing: build it (ninja -C $build ${targets[*]})"
done

# ---- a private cluster ----------------------------------------------------------------------------
port_taken() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
port=$(( 20000 + RANDOM % 4000 * 2 ))
while port_taken "$port" || port_taken $(( port + 1 )); do port=$(( port + 2 )); done
export MALL_CLUSTER_DIR=$tmp/cluster MALL_BUILD_DIR=$build MALL_CLUSTER_PORT=$port
export MALL_CLUSTER_CGROUP=mall_bench_reclaim_$$ MALL_CLUSTER_TIMEOUT_S=30
export MALL_CLUSTER_PLUGIN_ARGS=prolog_lookup=yes   # the prolog's reclaim is what this measures
say "bringing up a private Slurm cluster of $nodes node(s) (ports $port-$(( port + 1 )), cgroup parent $MALL_CLUSTER_CGROUP)"
cluster_up=1
"$cluster_sh" up --nodes "$nodes" >"$tmp/up.log" 2>&1 || { cat "$tmp/up.log" >&2; die "the local cluster did not come up (above)"; }
eval "$("$cluster_sh" env)"
note "$(grep -m1 ': up in' "$tmp/up.log" | sed 's/^local-cluster.sh: //')"
# The measured node (B's) and every node's malld socket (A must hold each node's pool).
socks=("$MALL_SOCKET") b_where=() malld_log=$MALL_CLUSTER_DIR/log/malld.log
if [ "$nodes" -gt 1 ]; then
  socks=()
  for n in $MALL_CLUSTER_NODES; do socks+=("$MALL_CLUSTER_DIR/nodes/$n/malld.sock"); done
  export MALL_SOCKET=${socks[-1]}
  b_where=(-w "node$nodes") malld_log=$MALL_CLUSTER_DIR/nodes/node$nodes/log/malld.log
fi
pool=$("$bin/mallctl" status | sed -n 's/^POOL *\([^ ]*\).*/\1/p')
ncpus=0
IFS=, read -r -a items <<<"$pool"
for item in "${items[@]}"; do
  if [[ $item == *-* ]]; then ncpus=$(( ncpus + ${item#*-} - ${item%-*} + 1 )); else ncpus=$(( ncpus + 1 )); fi
done
[ "$ncpus" -ge 2 ] || die "malld's pool is $pool: a reclaim needs at least 2 cpus"
note "malld$([ "$nodes" -gt 1 ] && echo "@node$nodes"): $(grep -m1 ' info: backend' "$malld_log" | sed 's/.* info: backend \([^:]*\).*/backend \1/'), pool $pool"

events=$tmp/events.jsonl
"$bin/mallctl" watch --json >"$events" 2>"$tmp/watch.err" &
watch_pid=$!
sleep 0.3   # subscribed before the first submission

# ---- helpers --------------------------------------------------------------------------------------
now() { date +%s.%N; }
ev_time() { sed -n 's/.*"time":\([0-9.]*\).*/\1/p'; }
wait_until() {  # wait_until WHAT CMD...: polls CMD every 20 ms, 30 s at most
  local what=$1; shift
  for _ in $(seq 1500); do "$@" && return 0; sleep 0.02; done
  die "timed out after 30 s waiting for $what"
}
released() { grep '"event":"release"' "$events" | grep -q "\"owner\":\"slurm-$1\""; }
has_output() { [ -s "$1" ]; }
a_job=''
a_wide() {  # on every node A is the only malld job, holds the whole pool in its cpuset, and is settled (acked)
  local st sock
  for sock in "${socks[@]}"; do
    st=$("$bin/mallctl" --socket "$sock" status --json 2>/dev/null | tr -d ' \n') || return 1   # pretty-printed: one line
    grep -q "\"job\":\"slurm-$a_job\"" <<<"$st" && grep -q "\"cpuset\":\"$pool\"" <<<"$st" &&
      grep -q '"state":"settled"' <<<"$st" && ! grep -q '"state":"changing"' <<<"$st" || return 1
  done
}
# Slurm ends a job in steps (epilog, then the node reports back): a submission before that is only
# scheduled at the next scheduler pass, about a second later, which would swamp the figures.
job_done() { scontrol show job -o "$1" 2>/dev/null | grep -q 'JobState=COMPLETED '; }
node_idle() { [ "$(sinfo -h -o %t 2>/dev/null)" = "$1" ]; }   # every node in state $1

run_phase() {  # run_phase NAME: N plain one-core submissions; one "id submit_time" line each in NAME.jobs
  local name=$1 t_sub id
  : >"$tmp/$name.jobs"
  for _ in $(seq "$iterations"); do
    if [ -n "$a_job" ]; then wait_until "job A to grow back to $pool" a_wide; fi
    t_sub=$(now)
    id=$(sbatch --parsable -J "bench-B" -c1 "${b_where[@]}" -D "$tmp" -o "$tmp/B-%j.out" --wrap 'date +%s.%N') ||
      die "sbatch failed"
    id=${id%%;*}
    echo "$id $t_sub" >>"$tmp/$name.jobs"
    wait_until "job $id's output" has_output "$tmp/B-$id.out"
    wait_until "job $id's epilog (release of its cores)" released "$id"
    wait_until "job $id to be completed in Slurm" job_done "$id"
    wait_until "the node to be $idle_state again" node_idle "$idle_state"
    printf '.'
  done
  echo
}

# stats: values (ms) on stdin -> "median p99 min max" (p99 by nearest rank)
stats() {
  sort -g | awk '{ v[NR] = $1 }
    END {
      if (NR == 0) { print "- - - -"; exit }
      med = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
      r = int(0.99 * NR); if (r < 0.99 * NR) r++; if (r < 1) r = 1
      printf "%.1f %.1f %.1f %.1f\n", med, v[r], v[1], v[NR]
    }'
}
ms() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f\n", (b - a) * 1000 }'; }
first_after() {  # first_after T: the time of the first event on stdin at or after T
  ev_time | awk -v t="$1" '$1 >= t { print; exit }'
}

# ---- phase 1: no borrower ------------------------------------------------------------------------
say "baseline: $iterations x sbatch -c1 --wrap 'date +%s.%N' on the idle node (no borrower)"
idle_state=idle
run_phase base

# ---- phase 2: A borrows every idle core ----------------------------------------------------------
if [ "$borrower" = client ]; then
  a_what="srun mall_test_client --threads 2 --step-us $step_us"
  a_run="srun $(printf '%q' "$bin/mall_test_client") --threads 2 --step-us $step_us --duration-s 3600"
else
  a_what="srun --mpi=pmix mall_train_mpi (balanced)"
  a_run="srun --mpi=pmix $(printf '%q' "$bin/mall_train_mpi") --steps 100000000 --print-every 0 --max-seconds 3600"
fi
a_spread=(-N "$nodes" --ntasks-per-node=1)
say "job A: sbatch ${a_spread[*]} --malleable=1:$ncpus -c1, $a_what (borrows the idle cores)"
a_job=$(sbatch --parsable -J bench-A "${a_spread[@]}" --malleable="1:$ncpus" -c1 -D "$tmp" -o "$tmp/A.out" --wrap "$a_run")
a_job=${a_job%%;*}
wait_until "job A (slurm-$a_job) to hold the whole pool $pool" a_wide
note "A is Slurm job $a_job and holds $pool"
idle_state=mix
say "with A borrowing: $iterations x the same plain job (each prolog takes a core back from A)"
run_phase lent
wait_until "job A to grow back to $pool" a_wide
scancel "$a_job" 2>/dev/null || true
wait_until "job A's epilog" released "$a_job"

# ---- analysis ---------------------------------------------------------------------------------------
: >"$tmp/ack" ; : >"$tmp/narrow" ; : >"$tmp/lent.r2f" ; : >"$tmp/lent.s2f" ; : >"$tmp/base.r2f" ; : >"$tmp/base.s2f"
late=0
for phase in base lent; do
  while read -r id t_sub; do
    t_first=$(head -1 "$tmp/B-$id.out")
    t_r=$(grep '"event":"reclaim"' "$events" | grep "\"owner\":\"slurm-$id\"" | head -1 | ev_time)
    [ -n "$t_r" ] || die "no reclaim event for job $id (is the plugin loaded? see $MALL_CLUSTER_DIR/etc/plugstack.conf)"
    ms "$t_r" "$t_first" >>"$tmp/$phase.r2f"
    ms "$t_sub" "$t_first" >>"$tmp/$phase.s2f"
    if [ "$phase" = lent ]; then
      t_ack=$(grep '"event":"ack"' "$events" | grep "\"job\":\"slurm-$a_job\"" | first_after "$t_r")
      t_n=$(grep '"event":"enforce"' "$events" | grep "\"job\":\"slurm-$a_job\"" | grep '"growing":false' | first_after "$t_r")
      [ -n "$t_ack" ] && [ -n "$t_n" ] || die "job $id: no ack or narrowing of A after its reclaim (events in $events)"
      ms "$t_r" "$t_ack" >>"$tmp/ack"
      ms "$t_r" "$t_n" >>"$tmp/narrow"
      if awk -v n="$t_n" -v f="$t_first" 'BEGIN { exit !(f < n) }'; then late=$(( late + 1 )); fi
    fi
  done <"$tmp/$phase.jobs"
done

echo
say "results over $iterations submissions per phase (ms; p99 is the nearest rank, i.e. the maximum for N < 100)"
printf '    %-48s %8s %8s %8s %8s\n' "" median p99 min max
row() { read -r med p99 mn mx < <(stats <"$2"); printf '    %-48s %8s %8s %8s %8s\n' "$1" "$med" "$p99" "$mn" "$mx"; }
row "reclaim -> A's ack" "$tmp/ack"
row "reclaim -> A's cpuset narrowed (prolog may go on)" "$tmp/narrow"
row "reclaim -> B's first output, A borrowing" "$tmp/lent.r2f"
row "reclaim -> B's first output, no borrower" "$tmp/base.r2f"
row "submit -> B's first output, A borrowing" "$tmp/lent.s2f"
row "submit -> B's first output, no borrower" "$tmp/base.s2f"
narrow_med=$(stats <"$tmp/narrow" | cut -d' ' -f1)
narrow_p99=$(stats <"$tmp/narrow" | cut -d' ' -f2)
delay_r=$(awk -v a="$(stats <"$tmp/lent.r2f" | cut -d' ' -f1)" -v b="$(stats <"$tmp/base.r2f" | cut -d' ' -f1)" 'BEGIN { printf "%.1f", a - b }')
delay_s=$(awk -v a="$(stats <"$tmp/lent.s2f" | cut -d' ' -f1)" -v b="$(stats <"$tmp/base.s2f" | cut -d' ' -f1)" 'BEGIN { printf "%.1f", a - b }')
note "start delay caused by the reclaim (median with A minus median without): $delay_r ms from the reclaim,"
note "$delay_s ms from the submission (the latter includes Slurm's own variation)"
if [ "$borrower" = client ]; then a_period="A's step period: $step_us us (it acks at its next step)"; else a_period="A: mall_train_mpi, one rank per node, balanced"; fi
note "$nodes node(s); $a_period; B started before A's cpuset was narrowed: $late of $iterations"
echo "nodes=$nodes borrower=$borrower reclaim_to_narrowed_ms_median=$narrow_med reclaim_to_narrowed_ms_p99=$narrow_p99 start_delay_ms_median=$delay_r"
