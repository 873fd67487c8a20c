#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# bench-oversubscription.sh — what mall buys two training jobs that share a node: runs the same
# copies of a training example three ways, one after the other, and prints the total throughput
# (training images per second over all jobs) of each way and the ratios:
#   oversub  every copy sized for the whole node on its framework's stock pools (the default: Eigen's
#            ThreadPool for mall_train_digits, TensorFlow's own intra-op and inter-op pools for
#            mall_train_tf — the research's scenario)
#   static   every copy pinned (taskset) to its own equal share of the cores, sized to it
#   mall     every copy under a private malld (mallrun --malleable=1:NCPU, policy equal) on its
#            framework's own pools, parked by mall to follow the cores malld gives it
# --program digits (default) runs the Eigen example mall_train_digits, --program tf the TensorFlow
# one, mall_train_tf (a build with TensorFlow: launch_scripts/run-tests.sh makes one).
# Last line: "mall_vs_oversub=X.XX mall_vs_static=Y.YY". A benchmark, not a test: figures vary
# with the machine's load. Everything it starts (malld, jobs, cgroups, temp folder) is removed.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$repo/launch_scripts/lib/stats.sh"  # median
build=${MALL_BUILD_DIR:-$repo/build}
steps=8000
batch=128
hidden=256
jobs=2
repeat=1
program=digits

usage() {
  cat <<EOF
bench-oversubscription.sh — total throughput of co-located training jobs: oversubscribed,
statically partitioned, and under mall

Usage: launch_scripts/bench-oversubscription.sh [--program digits|tf] [--steps N] [--batch B]
                                                [--hidden H] [--jobs J] [--repeat R]

Options:
  --program P  digits (default): mall_train_digits, Eigen's ThreadPool as the oversubscribed way;
               tf: mall_train_tf, a TensorFlow training on TensorFlow's own pools (intra-op and
               inter-op both of NCPU threads, TensorFlow's default sizes) as the oversubscribed
               way and on mall's pools under mallrun (needs a build with TensorFlow)
  --steps N    training steps per copy (default $steps)
  --batch B    images per step (default $batch) and
  --hidden H   hidden units (default $hidden): the size of each step's kernels. Small kernels (the
               default, ~0.5 ms a step on one core here) make many short parallel regions per
               second, where oversubscription hurts most; --batch 512 --hidden 1024 (the example's
               own default, ~8 ms a step) makes few long ones, where it hurts least.
  --jobs J     copies run at once (default $jobs; at most the number of cpus)
  --repeat R   run the three ways R times, alternating, and report medians (default $repeat)
  -h, --help   this text

Needs a build (MALL_BUILD_DIR, default build/; built here if missing) and python3-sklearn's digits.
As root, with a cgroup-v1 cpuset hierarchy at /sys/fs/cgroup/cpuset, malld enforces cores with
cgroup cpusets (--backend auto); otherwise, cgroup v2 included, with thread affinity (it says so).
Output: one line per run, a table of medians, then
  mall_vs_oversub=X.XX mall_vs_static=Y.YY
(total images per second under mall divided by that of each other way).
EOF
}

while [ $# -gt 0 ]; do
  case $1 in
    --program) program=${2:?--program needs a value}; shift 2 ;;
    --steps) steps=${2:?--steps needs a value}; shift 2 ;;
    --batch) batch=${2:?--batch needs a value}; shift 2 ;;
    --hidden) hidden=${2:?--hidden needs a value}; shift 2 ;;
    --jobs) jobs=${2:?--jobs needs a value}; shift 2 ;;
    --repeat) repeat=${2:?--repeat needs a value}; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "bench-oversubscription.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
ncpu=$(nproc)
case $program in
  digits) program_bin=mall_train_digits ;;
  tf) program_bin=mall_train_tf ;;
  *) echo "bench-oversubscription.sh: --program must be digits or tf, not '$program'" >&2; exit 2 ;;
esac
for v in steps batch hidden jobs repeat; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "bench-oversubscription.sh: --$v must be a positive integer" >&2; exit 2; }
done
if [ "$jobs" -gt "$ncpu" ]; then
  echo "bench-oversubscription.sh: --jobs $jobs is more than the $ncpu cpus (static needs a core per job)" >&2
  exit 2
fi

for needed in "$program_bin" malld mallrun mallctl; do
  if [ ! -x "$build/bin/$needed" ]; then
    echo "bench-oversubscription.sh: building ($build)"
    [ -f "$build/build.ninja" ] || cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
    ninja -C "$build" -j2 "$program_bin" malld mallrun mallctl >/dev/null || {
      [ "$program" = tf ] && echo "bench-oversubscription.sh: mall_train_tf needs a build with TensorFlow (launch_scripts/install-deps.sh, then configure with -DMALL_WITH_TENSORFLOW=ON)" >&2
      exit 1
    }
    break
  fi
done
bin=$build/bin

tmp=$(mktemp -d /tmp/mall-bench-oversub.XXXXXX)
malld_pid=
cleanup() {
  local pids
  pids=$(jobs -p) || true
  [ -n "$pids" ] && kill $pids 2>/dev/null || true
  if [ -n "$malld_pid" ]; then
    kill -TERM "$malld_pid" 2>/dev/null || true
    wait "$malld_pid" 2>/dev/null || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ "$program" = tf ]; then
  train=("$bin/mall_train_tf" --steps "$steps" --batch "$batch" --hidden "$hidden" --print-every 0)
  stock_pool=tensorflow
else
  train=("$bin/mall_train_digits" --steps "$steps" --batch "$batch" --hidden "$hidden" --quiet)
  stock_pool=eigen
fi
share=$((ncpu / jobs))

# Starts the copies at once with the command prefix each gets from "$1 <index>", waits for all,
# prints "<total images/s> <makespan s> <mean job s>".
run_copies() {
  local make_command=$1 i start end
  local -a pids=()
  start=$(date +%s.%N)
  for ((i = 0; i < jobs; i++)); do
    # shellcheck disable=SC2046  # the command words are paths and options without spaces
    $("$make_command" "$i") > "$tmp/job$i.out" 2> "$tmp/job$i.err" &
    pids+=($!)
  done
  for ((i = 0; i < jobs; i++)); do
    if ! wait "${pids[$i]}"; then
      echo "bench-oversubscription.sh: copy $i failed:" >&2
      cat "$tmp/job$i.err" >&2
      exit 1
    fi
  done
  end=$(date +%s.%N)
  local total_seconds=0 images=0
  for ((i = 0; i < jobs; i++)); do
    local line
    line=$(grep '^done ' "$tmp/job$i.out") || { echo "bench-oversubscription.sh: copy $i printed no done line" >&2; exit 1; }
    total_seconds=$(awk -v a="$total_seconds" -v b="$(awk '{print $5}' <<<"$line")" 'BEGIN {print a + b}')
    images=$((images + steps * batch))
  done
  awk -v n="$images" -v s="$start" -v e="$end" -v t="$total_seconds" -v j="$jobs" \
    'BEGIN {printf "%.1f %.3f %.3f\n", n / (e - s), e - s, t / j}'
}

oversub_command() { echo "${train[*]} --pool $stock_pool --threads $ncpu"; }
static_command() {
  local first=$(($1 * share)) last=$(($1 * share + share - 1))
  local pool_option=""
  [ "$program" = tf ] && pool_option="--pool tensorflow"
  echo "taskset -c $first-$last ${train[*]} $pool_option --threads $share"
}
mall_command() { echo "$bin/mallrun --socket $tmp/malld.sock --malleable=1:$ncpu --job copy$1 -- ${train[*]}"; }

backend=affinity
[ "$(id -u)" -eq 0 ] && [ -d /sys/fs/cgroup/cpuset ] && backend=auto
"$bin/malld" --socket "$tmp/malld.sock" --state-dir "$tmp" --cgroup-parent "mall_bench_oversub$$" \
  --backend "$backend" --policy equal --log-level warn 2> "$tmp/malld.log" &
malld_pid=$!
for _ in $(seq 100); do
  "$bin/mallctl" --socket "$tmp/malld.sock" status >/dev/null 2>&1 && break
  kill -0 "$malld_pid" 2>/dev/null || { echo "bench-oversubscription.sh: malld exited:" >&2; cat "$tmp/malld.log" >&2; exit 1; }
  sleep 0.1
done
[ "$backend" = affinity ] && echo "bench-oversubscription.sh: not root (or no cpuset controller): malld enforces with thread affinity"

echo "bench-oversubscription.sh: $jobs copies of $program_bin ($steps steps of $batch images, $hidden hidden units), $ncpu cpus, $repeat round(s)"
declare -A results
for ((round = 1; round <= repeat; round++)); do
  for way in oversub static mall; do
    measured=$(run_copies "${way}_command") || exit 1
    read -r rate makespan mean <<<"$measured"
    printf '  round %d %-8s total %10.1f images/s  makespan %7.3f s  mean job %7.3f s\n' \
      "$round" "$way" "$rate" "$makespan" "$mean"
    results[$way]+="$rate "
  done
done

oversub=$(median <<<"${results[oversub]}")
static=$(median <<<"${results[static]}")
mall=$(median <<<"${results[mall]}")
printf '\n%-10s %14s\n' way "images/s (median)"
printf '%-10s %14.1f\n' oversub "$oversub" static "$static" mall "$mall"
awk -v m="$mall" -v o="$oversub" -v s="$static" 'BEGIN {printf "mall_vs_oversub=%.2f mall_vs_static=%.2f\n", m / o, m / s}'
