#!/usr/bin/env bash
# bench-tf.sh — what running TensorFlow's kernels on mall's pools costs: runs the TensorFlow example
# (mall_train_tf) at a fixed size three ways, alternating, and prints each way's step rate (training
# images per second, TensorFlow's startup excluded) and the ratios of their medians:
#   tensorflow  TensorFlow's own intra-op and inter-op pools (a plain TensorFlow program)
#   eigen       Eigen's fixed ThreadPool handed to Session::Run through ThreadPoolOptions, the path
#               mall's pools take: tensorflow/eigen is the cost of that path alone
#   mall        mall's resizable pools through the same path (not attached to malld: the pools keep
#               their size, so only the pool itself is measured)
# Last line: "mall_vs_tensorflow=X.XX eigen_vs_tensorflow=Y.YY mall_vs_eigen=Z.ZZ". A benchmark,
# not a test: figures vary with the machine's load. It starts no daemon and leaves nothing behind.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${MALL_BUILD_DIR:-$repo/build}
steps=1500
batch=512
hidden=1024
threads=$(nproc)
repeat=5

usage() {
  cat <<EOF
bench-tf.sh — TensorFlow's step rate on mall's pools against TensorFlow's own and Eigen's

Usage: launch_scripts/bench-tf.sh [--steps N] [--batch B] [--hidden H] [--threads T] [--repeat R]

Options:
  --steps N    training steps per run (default $steps)
  --batch B    images per step (default $batch) and
  --hidden H   hidden units (default $hidden): the size of each step's kernels (the default makes
               few long parallel regions, ~5 ms a step on 2 cores; --batch 128 --hidden 128 makes
               many short ones)
  --threads T  intra-op and inter-op pool size of every way (default: the cpus, $threads)
  --repeat R   runs of each way, interleaved, reported as medians (default $repeat)
  -h, --help   this text

Needs a build with TensorFlow (MALL_BUILD_DIR, default build/): launch_scripts/install-deps.sh puts
the pinned wheel in <repo>/.venv and launch_scripts/run-tests.sh configures with it; or configure
with -DMALL_WITH_TENSORFLOW=ON and run ninja mall_train_tf.
Output: one line per run, a table of medians (with min and max), then
  mall_vs_tensorflow=X.XX eigen_vs_tensorflow=Y.YY mall_vs_eigen=Z.ZZ
EOF
}

while [ $# -gt 0 ]; do
  case $1 in
    --steps) steps=${2:?--steps needs a value}; shift 2 ;;
    --batch) batch=${2:?--batch needs a value}; shift 2 ;;
    --hidden) hidden=${2:?--hidden needs a value}; shift 2 ;;
    --threads) threads=${2:?--threads needs a value}; shift 2 ;;
    --repeat) repeat=${2:?--repeat needs a value}; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "bench-tf.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for v in steps batch hidden threads repeat; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "bench-tf.sh: --$v must be a positive integer" >&2; exit 2; }
done

program=$build/bin/mall_train_tf
if [ ! -x "$program" ]; then
  echo "bench-tf.sh: $program is missing: build with TensorFlow first (launch_scripts/install-deps.sh, then launch_scripts/run-tests.sh or cmake -DMALL_WITH_TENSORFLOW=ON and ninja mall_train_tf)" >&2
  exit 1
fi

echo "bench-tf.sh: mall_train_tf, $steps steps of $batch images, $hidden hidden units, pools of $threads threads, $repeat round(s)"
declare -A results
for ((round = 1; round <= repeat; round++)); do
  for way in tensorflow eigen mall; do
    # Not under malld (no MALL_SOCKET/MALL_JOB_ID): the pools keep --threads.
    if ! output=$(env -u MALL_SOCKET -u MALL_JOB_ID "$program" --pool "$way" --threads "$threads" \
                    --steps "$steps" --batch "$batch" --hidden "$hidden" --print-every 0 2>&1); then
      echo "bench-tf.sh: the $way run failed:" >&2
      echo "$output" >&2
      exit 1
    fi
    rate=$(awk '$1 == "done" {print $7}' <<<"$output")
    [ -n "$rate" ] || { echo "bench-tf.sh: the $way run printed no done line:" >&2; echo "$output" >&2; exit 1; }
    printf '  round %d %-10s %10.1f images/s\n' "$round" "$way" "$rate"
    results[$way]+="$rate "
  done
done

stats() { tr ' ' '\n' <<<"$1" | grep . | sort -g | awk '{v[NR] = $1} END {m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; print m, v[1], v[NR]}'; }
printf '\n%-10s %12s %12s %12s\n' way "median" "min" "max"
declare -A median
for way in tensorflow eigen mall; do
  read -r med low high <<<"$(stats "${results[$way]}")"
  median[$way]=$med
  printf '%-10s %12.1f %12.1f %12.1f\n' "$way" "$med" "$low" "$high"
done
awk -v m="${median[mall]}" -v t="${median[tensorflow]}" -v e="${median[eigen]}" \
  'BEGIN {printf "mall_vs_tensorflow=%.2f eigen_vs_tensorflow=%.2f mall_vs_eigen=%.2f\n", m / t, e / t, m / e}'
