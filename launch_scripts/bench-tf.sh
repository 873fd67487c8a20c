#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# bench-tf.sh — what being malleable costs a TensorFlow C++ job: runs the TensorFlow example
# (mall_train_tf) four ways, alternating, and prints each way's step rate (training images per
# second, TensorFlow's startup excluded) and the ratios of their medians:
#   tensorflow        TensorFlow's own pools of T threads, nothing of mall (a plain program)
#   mall              the same pools with mall's parking on them, nothing parked (full size)
#   tensorflow-small  TensorFlow's own pools made with S threads (a rigid job that small)
#   shrunk            pools of T threads parked to S (a malleable job shrunk to S)
# with S = T/2 (at least 1). The two small ways run confined to S cpus (taskset), as malld confines a
# job shrunk to S. Not attached to malld: only the pools are measured.
# Last line: "mall_vs_tensorflow=X.XX shrunk_vs_small=Y.YY". A benchmark, not a test: figures vary
# with the machine's load. It starts no daemon and leaves nothing behind.
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
bench-tf.sh — TensorFlow's step rate with mall parking its pools against TensorFlow alone

Usage: launch_scripts/bench-tf.sh [--steps N] [--batch B] [--hidden H] [--threads T] [--repeat R]
                                 [--build-dir DIR]

Options:
  --steps N    training steps per run (default $steps)
  --batch B    images per step (default $batch) and
  --hidden H   hidden units (default $hidden): the size of each step's kernels (the default makes
               few long parallel regions, ~5 ms a step on 2 cores; --batch 128 --hidden 128 makes
               many short ones)
  --threads T  intra-op and inter-op pool size T (default: the cpus, $threads); the small and
               shrunk ways run S = T/2 threads (at least 1)
  --repeat R   runs of each way, interleaved, reported as medians (default $repeat)
  --build-dir DIR  the build tree (default: \$MALL_BUILD_DIR, else <repo>/build)
  -h, --help   this text

Needs a build with TensorFlow (MALL_BUILD_DIR, default build/): launch_scripts/install-deps.sh puts
the pinned wheel in <repo>/.venv and launch_scripts/run-tests.sh configures with it; or configure
with -DMALL_WITH_TENSORFLOW=ON and run ninja mall_train_tf.
Output: one line per run, a table of medians (with min and max), then
  mall_vs_tensorflow=X.XX shrunk_vs_small=Y.YY
EOF
}

while [ $# -gt 0 ]; do
  case $1 in
    --steps) steps=${2:?--steps needs a value}; shift 2 ;;
    --batch) batch=${2:?--batch needs a value}; shift 2 ;;
    --hidden) hidden=${2:?--hidden needs a value}; shift 2 ;;
    --threads) threads=${2:?--threads needs a value}; shift 2 ;;
    --repeat) repeat=${2:?--repeat needs a value}; shift 2 ;;
    --build-dir) build=${2:?--build-dir needs a value}; shift 2 ;;
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

small=$((threads / 2 > 0 ? threads / 2 : 1))
small_cpus=$(python3 -c 'import os, sys; print(",".join(map(str, sorted(os.sched_getaffinity(0))[:int(sys.argv[1])])))' "$small")
ways=(tensorflow mall tensorflow-small shrunk)
way_args() { # the command of one way
  case $1 in
    tensorflow) echo "$program --pool tensorflow --threads $threads" ;;
    mall) echo "$program --pool mall --threads $threads --max-threads $threads" ;;
    tensorflow-small) echo "taskset -c $small_cpus $program --pool tensorflow --threads $small" ;;
    shrunk) echo "taskset -c $small_cpus $program --pool mall --threads $small --max-threads $threads" ;;
  esac
}
echo "bench-tf.sh: mall_train_tf, $steps steps of $batch images, $hidden hidden units, pools of $threads threads (small: $small), $repeat round(s)"
declare -A results
for ((round = 1; round <= repeat; round++)); do
  for way in "${ways[@]}"; do
    # Not under malld (no MALL_SOCKET/MALL_JOB_ID): the pools keep --threads.
    # shellcheck disable=SC2046  # way_args is a list of words
    if ! output=$(env -u MALL_SOCKET -u MALL_JOB_ID TF_CPP_MIN_LOG_LEVEL=2 $(way_args "$way") \
                    --steps "$steps" --batch "$batch" --hidden "$hidden" --print-every 0 2>&1); then
      echo "bench-tf.sh: the $way run failed:" >&2
      echo "$output" >&2
      exit 1
    fi
    rate=$(awk '$1 == "done" {print $7}' <<<"$output")
    [ -n "$rate" ] || { echo "bench-tf.sh: the $way run printed no done line:" >&2; echo "$output" >&2; exit 1; }
    printf '  round %d %-16s %10.1f images/s\n' "$round" "$way" "$rate"
    results[$way]+="$rate "
  done
done

stats() { tr ' ' '\n' <<<"$1" | grep . | sort -g | awk '{v[NR] = $1} END {m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; print m, v[1], v[NR]}'; }
printf '\n%-16s %12s %12s %12s\n' way "median" "min" "max"
declare -A median
for way in "${ways[@]}"; do
  read -r med low high <<<"$(stats "${results[$way]}")"
  median[$way]=$med
  printf '%-16s %12.1f %12.1f %12.1f\n' "$way" "$med" "$low" "$high"
done
awk -v m="${median[mall]}" -v t="${median[tensorflow]}" -v s="${median[shrunk]}" -v f="${median[tensorflow-small]}" \
  'BEGIN {printf "mall_vs_tensorflow=%.2f shrunk_vs_small=%.2f\n", m / t, s / f}'
