#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# bench-cosched.sh — does mall's co-scheduling raise a node's throughput? Replays one scenario of
# real training jobs (mall_train_digits with large or small kernels, memory-bound mall_train_linear) on
# this node four ways — static partition, oversubscription, mall `equal`, mall `throughput` — and
# prints makespan, mean job completion, total work per second and ratios; writes timeline.csv,
# summary.csv and timeline.png (gnuplot) into --out. Last line:
#   throughput_vs_static=X.XX throughput_vs_oversub=Y.YY
# A benchmark, not a test: a few minutes on 2 cpus, figures vary with the machine's load. The
# driver is bench_cosched.py (same folder); this wrapper builds what it needs and passes options on.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${MALL_BUILD_DIR:-$repo/build}

for arg in "$@"; do
  if [ "$arg" = -h ] || [ "$arg" = --help ]; then
    cat <<USAGE
bench-cosched.sh — total throughput of a mix of training jobs arriving on one node, four ways

Usage: launch_scripts/bench-cosched.sh [options]

USAGE
    python3 "$repo/launch_scripts/bench_cosched.py" --build "$build" --help | sed -n '/^options:/,$p'
    cat <<USAGE

The ways (one after the other, same jobs, same admission: a job starts when it has arrived and the
running jobs' MIN cores leave room for its own MIN):
  static      each job pinned (taskset) to its MIN cores and sized to them: no lending
  oversub     no mall: every job runs as many threads as the node has cpus, unpinned
  equal       a private malld, --policy equal; jobs under mallrun --malleable=MIN:MAX
  throughput  the same with --policy throughput (measured speedup curves)
The kinds of job: dense (mall_train_digits, batch 512, 1024 hidden units: compute-bound), small
(mall_train_digits, batch 128, 256 hidden units: short parallel regions bound by their
synchronisation, so it scales poorly), waiting (dense, but each step first waits 4 ms for its
input, --input-wait-us: its cores idle meanwhile) and linear (mall_train_linear: memory-bound).
The built-in mixes (--mix), per 2 cpus, all jobs MIN 1 and MAX all cpus: a long run (40 one-core
seconds) shares the node with three short jobs (6 each) arriving at 0, 8 and 16 s, so cores fall
idle when short jobs end, which a static partition cannot use.
  long-dense  the long run is dense (lending it idle cores pays); short: small, linear, small
  long-small  the long run is small (lending it cores slows it); short: dense, linear, dense
  long-waiting  the long run waits 4 ms for its input at each step (its cores idle a third to
              two thirds of the time); short: dense, waiting, dense
Work is counted in one-core seconds (steps / the kind's one-core step rate, measured first), so
"work/s" is the number of cores' worth of work finished per second of makespan.

Needs a build (MALL_BUILD_DIR, default build/; built here if missing), python3, python3-sklearn's
digits, ~1 GiB of memory per memory-bound job, gnuplot for the PNG. As root malld enforces with
cgroup cpusets, otherwise with thread affinity. Everything it starts is removed at the end.

Example:
  launch_scripts/bench-cosched.sh --out /tmp/cosched && xdg-open /tmp/cosched/timeline.png
USAGE
    exit 0
  fi
done

programs=(mall_train_digits mall_train_linear malld mallrun mallctl)
for program in "${programs[@]}"; do
  if [ ! -x "$build/bin/$program" ]; then
    echo "bench-cosched.sh: building ($build)"
    [ -f "$build/build.ninja" ] || cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
    ninja -C "$build" -j2 "${programs[@]}" >/dev/null
    break
  fi
done
command -v python3 >/dev/null || { echo "bench-cosched.sh: needs python3" >&2; exit 1; }
exec python3 "$repo/launch_scripts/bench_cosched.py" --build "$build" "$@"
