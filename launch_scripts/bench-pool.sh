#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# bench-pool.sh — what "park, don't replace" costs: Eigen's own ThreadPool as a rigid job has it
# (made with A threads) against the same pool as a malleable job has it under mall (made with N
# threads, PoolParking parked to A), on Eigen contractions (128, 512), an MLP training step
# (512x64x1024x10) and parallelFor (64k, 4M), for A = N, N/2, N/4 (tests/bench/tf_bench_pool.cpp).
# The two ways of a case run one after the other, and the whole program runs --repeat times
# (interleaved rounds); each figure is the median time. Prints a table of speed ratios
# (own time / parked time: above 1 means parked is faster), then the last line
#   full_vs_own=X.XX parked_vs_fixed=Y.YY
# full_vs_own: the worst ratio at A = N (nothing parked: what being malleable costs a job that
# keeps every cpu); parked_vs_fixed: the worst ratio over A < N (a parked pool against a pool made
# that small). A benchmark, not a test: figures vary with the machine's load.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${MALL_BUILD_DIR:-$repo/build}
threads=$(nproc)
active=""
repeat=3
min_time=0.3

usage() {
  cat <<EOF
bench-pool.sh — Eigen's own pool, parked by mall, against the same pool made that small

Usage: launch_scripts/bench-pool.sh [--threads N] [--active A1,A2,...] [--repeat R] [--min-time S]
                                   [--build-dir DIR]

Options:
  --threads N     the parked pool's size, the most a malleable job can grow to (default: the
                  online cpus, $threads)
  --active LIST   running counts A to measure (default: N, N/2, N/4, each at least 1)
  --repeat R      rounds of the whole benchmark program, interleaved (default $repeat); medians
  --min-time S    Google Benchmark's minimum time per benchmark, seconds (default $min_time)
  --build-dir DIR the build tree (default: \$MALL_BUILD_DIR, else <repo>/build)
  -h, --help      this text

Needs the benchmark program tf_bench_pool (built with the tests: launch_scripts/run-tests.sh, or
ninja -C build tf_bench_pool).
Output: one row per case and running count (own and parked microseconds, their ratio), then
  full_vs_own=X.XX parked_vs_fixed=Y.YY
EOF
}

while [ $# -gt 0 ]; do
  case $1 in
    --threads) threads=${2:?--threads needs a value}; shift 2 ;;
    --active) active=${2:?--active needs a value}; shift 2 ;;
    --repeat) repeat=${2:?--repeat needs a value}; shift 2 ;;
    --min-time) min_time=${2:?--min-time needs a value}; shift 2 ;;
    --build-dir) build=${2:?--build-dir needs a value}; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "bench-pool.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for v in threads repeat; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "bench-pool.sh: --$v must be a positive integer" >&2; exit 2; }
done
[[ $min_time =~ ^[0-9]+(\.[0-9]+)?$ ]] && awk -v t="$min_time" 'BEGIN {exit !(t > 0)}' ||
  { echo "bench-pool.sh: --min-time must be a positive number of seconds" >&2; exit 2; }
[ -z "$active" ] || [[ $active =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] ||
  { echo "bench-pool.sh: --active must be a comma-separated list of positive counts (e.g. 16,8,4)" >&2; exit 2; }

program=$build/bin/tf_bench_pool
[ -x "$program" ] || { echo "bench-pool.sh: $program is missing: build it (ninja -C $build tf_bench_pool)" >&2; exit 1; }

tmp=$(mktemp -d /tmp/mall-bench-pool.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
echo "bench-pool.sh: pools of $threads threads, running counts ${active:-N, N/2, N/4}, $repeat round(s) of ${min_time}s per benchmark"
args=(--pool-threads "$threads" --benchmark_min_time="$min_time" --benchmark_format=json)
[ -n "$active" ] && args+=(--active "$active")
for ((round = 1; round <= repeat; round++)); do
  if ! "$program" "${args[@]}" >"$tmp/round$round.json" 2>"$tmp/round$round.err"; then
    echo "bench-pool.sh: round $round failed:" >&2
    cat "$tmp/round$round.err" >&2
    exit 1
  fi
  echo "  round $round done"
done

python3 - "$tmp"/round*.json <<'EOF'
import json, statistics, sys
times = {}
for path in sys.argv[1:]:
    with open(path) as f:
        for b in json.load(f)["benchmarks"]:
            way, case, active = b["run_name"].split("/")[:3]
            times.setdefault((case, int(active), way), []).append(b["real_time"])
cases = sorted({(c, a) for c, a, _ in times}, key=lambda k: (list(dict.fromkeys(c for c, _, _ in times)).index(k[0]), -k[1]))
full = max(a for _, a in cases)
print(f"\n{'case':<20} {'A':>4} {'own us':>10} {'parked us':>10} {'own/parked':>10}")
worst_full, worst_parked = None, None
for case, a in cases:
    own = statistics.median(times[(case, a, "own")])
    parked = statistics.median(times[(case, a, "parked")])
    ratio = own / parked
    print(f"{case:<20} {a:>4} {own:>10.1f} {parked:>10.1f} {ratio:>10.2f}")
    if a == full:
        worst_full = ratio if worst_full is None else min(worst_full, ratio)
    else:
        worst_parked = ratio if worst_parked is None else min(worst_parked, ratio)
fmt = lambda r: "n/a" if r is None else f"{r:.2f}"
print(f"full_vs_own={fmt(worst_full)} parked_vs_fixed={fmt(worst_parked)}")
EOF
