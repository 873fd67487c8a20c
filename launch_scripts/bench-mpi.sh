#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# bench-mpi.sh — measures libmall_mpi with real Open MPI over private mallds (one per modelled node,
# all on this machine's cpus): (1) the cost of mall_mpi_step() when nothing changed against the
# example's gradient MPI_Allreduce, at 2 and 4 ranks; (2) with one rank shrunk to one cpu, the job's
# throughput and the cpus its other rank burns, balanced against unbalanced, and what a co-located
# job on that rank's node gets; (3, --part nodes) the collective step under Slurm with the ranks on
# two nodes in network namespaces (TCP) against two ranks on one node (shared memory).
# A benchmark: prints figures, never passes or fails. See --help.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${MALL_BUILD_DIR:-$repo/build}
bin=$build/bin
prog=bench-mpi.sh
seconds=8
bench_n=20000
parts=all

usage() {
  cat <<EOF
$prog — what mall's collective step costs an MPI job, and what balanced mode returns

Usage: launch_scripts/$prog [--seconds S] [--collectives N] [--part cost|shrink|nodes|all]
       launch_scripts/$prog -h|--help

Starts four private mallds (pool 0-1 each, own sockets and cgroup parents in a temporary folder,
stopped and removed at the end, also on failure or Ctrl-C); rank r of an mpirun job
(--bind-to none --oversubscribe) is registered by mallrun --malleable=1:2 at malld r: each rank
models one node. Then:
  cost    for 2 and 4 ranks: mall_train_mpi --sync-timing trains 3000 steps (hidden 256, global
          batch 256: a 19213-float gradient allreduce per step), timing mall_mpi_step() and the
          allreduce at each step where nothing changed, each after an untimed barrier (per rank
          the median; shown: the smallest over ranks, the call's own cost once every rank is
          there; the mean over ranks and the plain means, which include the ranks' barrier-exit
          skew, are in the summary), then N back-to-back calls of each after a barrier (slowest
          rank's mean); prints the ratios.
  shrink  2 ranks; an admin pins rank 0 to one cpu. For balanced and unbalanced mode: the job's
          steps/s (malld's progress counters over S seconds), the cpus rank 1 burns (utime+stime
          of its process), what rank 1's malld holds for it and lists as free; then a co-located
          job (mall_train_digits under mallrun --malleable=1:2 at rank 1's malld) runs 200 steps:
          its images/s and cpus, and the MPI job's steps/s meanwhile. Reference: the same
          mall_train_digits on one cpu alone.
  nodes   (root) through Slurm: a private cluster of two nodes in network namespaces
          (local-cluster.sh up --nodes 2, a malld per node), then the cost part's measurement for
          a --malleable=1:2 job of two ranks (srun --mpi=pmix), once with one rank on each node
          (-N2: Open MPI's TCP over the cluster's bridge, as between real nodes) and once with both
          ranks on node1 (-N1 -n2: shared memory). The step's collective is an allreduce of 5
          ints, so its cost follows the interconnect's latency, not its bandwidth.
Caveat: the modelled nodes share this machine's two cpus, so a co-located job and the ranks also
meet on physical cpus; only malld's accounting is per node.

Options:
  --seconds S      sampling window of the shrink part (default $seconds)
  --collectives N  back-to-back calls in the cost part (default $bench_n)
  --part P         cost, shrink, nodes or all (default all: nodes only as root)

Needs Open MPI (mpirun), a build with malld, mallctl, mallrun, mall_train_mpi, mall_train_digits
(built here when missing), jq, and root for cgroup enforcement (otherwise malld uses affinity).
Environment: MALL_BUILD_DIR (default <repo>/build). Takes about a minute.
EOF
}

while [ $# -gt 0 ]; do
  case $1 in
    --seconds) seconds=${2:?"$prog: $1 needs a value"}; shift ;;
    --seconds=*) seconds=${1#*=} ;;
    --collectives) bench_n=${2:?"$prog: $1 needs a value"}; shift ;;
    --collectives=*) bench_n=${1#*=} ;;
    --part) parts=${2:?"$prog: $1 needs a value"}; shift ;;
    --part=*) parts=${1#*=} ;;
    -h|--help) usage; exit 0 ;;
    *) echo "$prog: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[[ $seconds =~ ^[1-9][0-9]*$ ]] || { echo "$prog: --seconds must be a positive integer" >&2; exit 2; }
[[ $bench_n =~ ^[1-9][0-9]*$ ]] || { echo "$prog: --collectives must be a positive integer" >&2; exit 2; }
case $parts in cost|shrink|nodes|all) ;; *) echo "$prog: --part must be cost, shrink, nodes or all" >&2; exit 2 ;; esac
if [ "$parts" = nodes ] && [ "$(id -u)" -ne 0 ]; then echo "$prog: --part nodes needs root (it starts a Slurm cluster)" >&2; exit 1; fi
for tool in mpirun jq; do command -v "$tool" >/dev/null || { echo "$prog: $tool is missing (launch_scripts/install-deps.sh)" >&2; exit 1; }; done

say() { printf '==> %s\n' "$*"; }
note() { printf '    %s\n' "$*"; }
die() { printf '%s: error: %s\n' "$prog" "$*" >&2; exit 1; }

# ---- everything this script starts, and how it is stopped -------------------------------------
tmp='' malld_pids=() job_pid='' cgroup_parents=() cluster_up=0
cleanup() {
  set +e
  trap '' PIPE INT TERM
  if [ "$cluster_up" = 1 ]; then
    "$repo/launch_scripts/local-cluster.sh" down >"$tmp/down.log" 2>&1 || { echo "$prog: bringing the cluster down failed:" >&2; cat "$tmp/down.log" >&2; }
  fi
  [ -n "$job_pid" ] && kill -TERM "$job_pid" 2>/dev/null && wait "$job_pid" 2>/dev/null
  for pid in "${malld_pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for pid in "${malld_pids[@]}"; do wait "$pid" 2>/dev/null; done
  for parent in "${cgroup_parents[@]}"; do
    [ -d "/sys/fs/cgroup/cpuset/$parent" ] || continue
    find "/sys/fs/cgroup/cpuset/$parent" -mindepth 1 -depth -type d -exec rmdir {} \; 2>/dev/null
    rmdir "/sys/fs/cgroup/cpuset/$parent" 2>/dev/null
  done
  [ -n "$tmp" ] && rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mall-bench-mpi.XXXXXX")

# ---- build (only what is missing or out of date) ------------------------------------------------
targets=(malld mallctl mallrun mall_train_mpi mall_train_digits)
[ "$parts" = cost ] || [ "$parts" = shrink ] || [ "$(id -u)" -ne 0 ] || targets+=(mall_spank)
if [ ! -f "$build/build.ninja" ]; then
  say "configuring $build"
  cmake -G Ninja -B "$build" -S "$repo" >"$tmp/configure.log" 2>&1 || { tail -30 "$tmp/configure.log" >&2; die "cmake failed"; }
fi
if [ -w "$build" ]; then
  ninja -C "$build" -j2 "${targets[@]}" >"$tmp/build.log" 2>&1 || { tail -40 "$tmp/build.log" >&2; die "the build failed (above)"; }
fi
for t in "${targets[@]}"; do [ "$t" = mall_spank ] && continue; [ -x "$bin/$t" ] || die "$bin/$t is missing (is Open MPI installed? libmall_mpi needs it)"; done

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
nodes=4
for (( n = 0; n < nodes; n++ )); do
  mkdir -p "$tmp/n$n"
  cgroup_parents+=("mall_bench_mpi_$$_$n")
  "$bin/malld" --socket "$tmp/n$n/s.sock" --state-dir "$tmp/n$n" --cpus 0-1 --backend auto \
    --cgroup-parent "mall_bench_mpi_$$_$n" --ack-timeout-ms 5000 >"$tmp/n$n/malld.log" 2>&1 &
  malld_pids+=($!)
done
for (( n = 0; n < nodes; n++ )); do
  for (( i = 0; i < 100; i++ )); do "$bin/mallctl" --socket "$tmp/n$n/s.sock" status >/dev/null 2>&1 && break; sleep 0.05; done
  "$bin/mallctl" --socket "$tmp/n$n/s.sock" status >/dev/null 2>&1 || { tail "$tmp/n$n/malld.log" >&2; die "malld $n did not start"; }
done
backend=$(jq -r .backend < <("$bin/mallctl" --socket "$tmp/n0/s.sock" status --json))
say "4 private mallds up (pool 0-1 each, backend $backend); Open MPI $(mpirun --version | sed -n 's/.*Open MPI) //p' | head -n1)"

mctl() { local n=$1; shift; "$bin/mallctl" --socket "$tmp/n$n/s.sock" "$@"; }
job_json() { mctl "$1" status --json 2>/dev/null | jq -c --arg j "$2" '.jobs[] | select(.job == $j)'; }
job_field() { job_json "$1" "$2" | jq -r --arg f "$3" '.[$f] | tostring'; }
settled() { [ "$(job_json "$1" "$2" | jq -r '"\(.state) \(.cpus == .cpuset) \(.generation == .acked_generation)"')" = "settled true true" ]; }
wait_for() { local limit=$1; shift; local i; for (( i = 0; i < limit * 20; i++ )); do "$@" && return 0; sleep 0.05; done; return 1; }
# start_job NP LOG TRAINER_ARGS...: mpirun in the background; rank r registered at malld r
start_job() {
  local np=$1 log=$2; shift 2
  local script='i=$OMPI_COMM_WORLD_RANK; exec '"$bin"'/mallrun --socket '"$tmp"'/n$i/s.sock --malleable=1:2 --job rank$i -- "$@"'
  mpirun --bind-to none --oversubscribe -np "$np" sh -c "$script" sh "$bin/mall_train_mpi" "$@" >"$log" 2>&1 &
  job_pid=$!
}
finish_job() { wait "$job_pid" 2>/dev/null || true; job_pid=''; }
mean_of() { awk -v f="$1" '{ for (i = 1; i < NF; i++) if ($i == f) { s += $(i + 1); n++ } } END { if (n) printf "%.3f", s / n; else print "?" }'; }
min_of() { awk -v f="$1" '{ for (i = 1; i < NF; i++) if ($i == f && (m == "" || $(i + 1) + 0 < m)) m = $(i + 1) + 0 } END { if (m != "") printf "%.3f", m; else print "?" }'; }

# cost_row LABEL LOG: one table row and one summary line from a --sync-timing --bench-collectives run
cost_row() {
  local label=$1 log=$2 step reduce skew_step skew_reduce ratio mstep mreduce bstep breduce bratio
  step=$(grep ' timing ' "$log" | min_of median_step_us)
  reduce=$(grep ' timing ' "$log" | min_of median_allreduce_us)
  skew_step=$(grep ' timing ' "$log" | mean_of median_step_us)
  skew_reduce=$(grep ' timing ' "$log" | mean_of median_allreduce_us)
  ratio=$(awk -v a="$step" -v b="$reduce" 'BEGIN { printf "%.4f", a / b }')
  mstep=$(grep ' timing ' "$log" | mean_of mall_mpi_step_us)
  mreduce=$(grep ' timing ' "$log" | mean_of allreduce_us)
  read -r bstep breduce bratio < <(sed -n 's/^bench .* mall_mpi_step_us \([0-9.]*\) allreduce_us \([0-9.]*\) ratio \([0-9.]*\).*/\1 \2 \3/p' "$log")
  printf '    %-6s %-22s %-22s %-8s | %-26s %-24s %-8s\n' "$label" "$step" "$reduce" "$ratio" "$bstep" "$breduce" "$bratio"
  echo "cost ranks=$label inloop_median_step_us=$step inloop_median_allreduce_us=$reduce inloop_median_ratio=$ratio inloop_rank_mean_of_median_step_us=$skew_step inloop_rank_mean_of_median_allreduce_us=$skew_reduce inloop_mean_step_us=$mstep inloop_mean_allreduce_us=$mreduce b2b_step_us=$bstep b2b_allreduce_us=$breduce b2b_ratio=$bratio" >>"$tmp/summary"
}
cost_header() {
  printf '    %-6s %-22s %-22s %-8s | %-26s %-24s %-8s\n' "$1" "in-loop step (us)" "in-loop allreduce (us)" ratio \
    "back-to-back step (us)" "back-to-back allreduce" ratio
}

# ---- 1. cost of the collective step ---------------------------------------------------------------
if [ "$parts" = cost ] || [ "$parts" = all ]; then
  say "cost of mall_mpi_step() with nothing changed, against the gradient allreduce"
  cost_header ranks
  for np in 2 4; do
    log=$tmp/cost$np.log
    start_job "$np" "$log" --steps 3000 --print-every 0 --sync-timing --bench-collectives "$bench_n"
    finish_job
    grep -q '^bench ' "$log" || { tail -20 "$log" >&2; die "the $np-rank run failed (above)"; }
    cost_row "$np" "$log"
  done
  note "in-loop: per rank the median over the steps where nothing changed, each call started after an untimed barrier;"
  note "  shown: the smallest over ranks (the rank that leaves the barrier last sees the call's own cost; the"
  note "  others also wait for it: with more ranks than cores that wait is scheduling, see the summary);"
  note "back-to-back: $bench_n calls of each after a barrier, slowest rank's mean."
fi

# ---- 2. one rank shrunk: balanced against unbalanced ------------------------------------------------
proc_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0; }
if [ "$parts" = shrink ] || [ "$parts" = all ]; then
  hz=$(getconf CLK_TCK)
  say "reference: mall_train_digits alone on one cpu (200 steps)"
  ref=$(taskset -c 1 "$bin/mall_train_digits" --steps 200 --threads 1 --quiet | sed -n 's/.*images_per_s \([0-9.]*\).*/\1/p')
  note "images/s alone on 1 cpu: $ref"
  for mode in balanced unbalanced; do
    say "2 ranks, rank 0 pinned to cpu 1 by an admin, $mode mode"
    extra=(); [ "$mode" = unbalanced ] && extra=(--unbalanced)
    log=$tmp/shrink-$mode.log
    start_job 2 "$log" --steps 100000000 --print-every 0 --log-changes --stop-file "$tmp/stop-$mode" --max-seconds 300 "${extra[@]}"
    wait_for 60 bash -c "[ \"\$('$bin/mallctl' --socket '$tmp/n1/s.sock' status --json | jq -r '.jobs[] | select(.job == \"rank1\") | .attached')\" = 1 ]" ||
      { tail -20 "$log" >&2; die "rank 1 did not attach"; }
    wait_for 30 settled 0 rank0 && wait_for 30 settled 1 rank1 || die "the ranks did not settle"
    mctl 0 set rank0 --cpus 1 >/dev/null
    want1=2; [ "$mode" = balanced ] && want1=1
    wait_for 30 bash -c "[ \"\$('$bin/mallctl' --socket '$tmp/n1/s.sock' status --json | jq -r '.jobs[] | select(.job == \"rank1\") | .ncpus')\" = $want1 ]" ||
      die "rank 1 did not settle on $want1 cpu(s) in $mode mode"
    wait_for 30 settled 1 rank1 || die "rank 1 did not settle"
    sleep 1   # the first step after the change is not typical
    rank1_pid=$(job_json 1 rank1 | jq -r '.pids[0]')
    s0=$(job_field 0 rank0 steps); t0=$(date +%s.%N); c0=$(proc_ticks "$rank1_pid")
    sleep "$seconds"
    s1=$(job_field 0 rank0 steps); t1=$(date +%s.%N); c1=$(proc_ticks "$rank1_pid")
    rate=$(awk -v a="$s0" -v b="$s1" -v x="$t0" -v y="$t1" 'BEGIN { printf "%.1f", (b - a) / (y - x) }')
    busy=$(awk -v a="$c0" -v b="$c1" -v x="$t0" -v y="$t1" -v hz="$hz" 'BEGIN { printf "%.2f", (b - a) / hz / (y - x) }')
    held=$(job_field 1 rank1 cpus); cap=$(job_field 1 rank1 usage_cap); free=$(mctl 1 status --json | jq -r .free)
    threads=$(grep '^rank 1 change ' "$log" | tail -n1 | sed 's/.* -> \([0-9]*\) share.*/\1/')
    note "job steps/s $rate; rank 1 runs $threads thread(s), holds cpus '$held' (usage_cap $cap), burns $busy cpus; its malld lists free '${free:--}'"
    # The co-located job at rank 1's malld.
    s2=$(job_field 0 rank0 steps); t2=$(date +%s.%N)
    "$bin/mallrun" --socket "$tmp/n1/s.sock" --malleable=1:2 --job colocated -- \
      "$bin/mall_train_digits" --steps 200 --log-changes >"$tmp/colocated-$mode.log" 2>&1 &
    co_pid=$!
    wait_for 20 bash -c "[ -n \"\$('$bin/mallctl' --socket '$tmp/n1/s.sock' status --json | jq -r '.jobs[] | select(.job == \"colocated\") | .cpus')\" ]" || true
    sleep 0.5
    co_cpus=$(job_field 1 colocated cpus); held2=$(job_field 1 rank1 cpus)
    wait "$co_pid" || true
    s3=$(job_field 0 rank0 steps); t3=$(date +%s.%N)
    co_rate=$(sed -n 's/.*images_per_s \([0-9.]*\).*/\1/p' "$tmp/colocated-$mode.log")
    rate2=$(awk -v a="$s2" -v b="$s3" -v x="$t2" -v y="$t3" 'BEGIN { printf "%.1f", (b - a) / (y - x) }')
    note "co-located job: cpus '$co_cpus' (rank 1 then held '$held2'), images/s ${co_rate:-?}; job steps/s meanwhile $rate2"
    echo "shrink mode=$mode job_steps_per_s=$rate rank1_threads=$threads rank1_cpus=$held rank1_busy_cpus=$busy free=${free:--} colocated_cpus=$co_cpus colocated_images_per_s=${co_rate:-?} job_steps_per_s_with_colocated=$rate2" >>"$tmp/summary"
    touch "$tmp/stop-$mode"
    finish_job
    grep -q '^rank 0 final' "$log" || { tail -20 "$log" >&2; die "the $mode run did not finish cleanly"; }
  done
  echo "reference colocated_alone_1cpu_images_per_s=$ref" >>"$tmp/summary"
fi

# ---- 3. across nodes in network namespaces, through Slurm --------------------------------------------
if [ "$parts" = nodes ] || { [ "$parts" = all ] && [ "$(id -u)" -eq 0 ]; }; then
  for pid in "${malld_pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done   # the private mallds are done
  chmod 0755 "$tmp"   # munged (user munge) must reach the cluster folder inside
  export MALL_CLUSTER_DIR=$tmp/cluster MALL_BUILD_DIR=$build MALL_CLUSTER_CGROUP=mall_bench_mpi_$$ MALL_CLUSTER_TIMEOUT_S=30
  say "a private Slurm cluster of 2 nodes in network namespaces (local-cluster.sh up --nodes 2)"
  cluster_up=1
  "$repo/launch_scripts/local-cluster.sh" up --nodes 2 >"$tmp/up.log" 2>&1 || { cat "$tmp/up.log" >&2; die "the cluster did not come up (above)"; }
  eval "$("$repo/launch_scripts/local-cluster.sh" env)"
  note "$(grep -m1 ': up in' "$tmp/up.log" | sed 's/^local-cluster.sh: //; s/ (.*): /: /')"
  say "cost of mall_mpi_step() under Slurm: 2 ranks of a --malleable=1:2 job, across nodes and on one node"
  cost_header where
  for where in nodes node; do
    log=$tmp/slurm-$where.log
    spread=(-N2 --ntasks-per-node=1); [ "$where" = node ] && spread=(-N1 -n2 -w node1)
    id=$(sbatch --parsable "${spread[@]}" --malleable=1:2 -c1 -o "$log" \
           --wrap "srun --mpi=pmix $(printf '%q' "$bin/mall_train_mpi") --steps 3000 --print-every 0 --sync-timing --bench-collectives $bench_n") ||
      die "sbatch refused the $where job"
    id=${id%%;*}
    wait_for 300 bash -c "scontrol show job $id | grep -qE 'JobState=(COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL)'" || die "job $id did not end"
    grep -q '^bench ' "$log" || { tail -20 "$log" >&2; die "the $where job failed (above)"; }
    cost_row "$( [ "$where" = nodes ] && echo 2x1 || echo 1x2)" "$log"
  done
  note "2x1: one rank on node1 and one on node2 (TCP over the bridge between their namespaces);"
  note "1x2: both ranks on node1 (shared memory). Same Slurm, mallds, plugin and trainer."
fi

say "summary"
sed 's/^/    /' "$tmp/summary"
