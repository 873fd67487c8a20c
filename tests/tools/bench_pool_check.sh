#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# bench_pool_check.sh — what a user of launch_scripts/bench-pool.sh relies on, on a tiny run (the
# figures are not judged: it is a benchmark): a row per case and running count with both ways'
# times, the documented last line, usage errors that exit 2 with words, nothing left in /tmp.
# Usage: bench_pool_check.sh REPO BUILD_DIR
set -euo pipefail
repo=$1
build=$2
. "$(dirname "${BASH_SOURCE[0]}")/../support/watchdog.sh"
fail() { echo "bench_pool_check: FAIL: $*" >&2; exit 1; }
leftovers() { ls -d /tmp/mall-bench-pool.* 2>/dev/null | sort || true; }
before=$(leftovers)

out=$(watchdog_run 300 "$repo/launch_scripts/bench-pool.sh" --build-dir "$build" --threads 4 --active 4,2,1 \
        --repeat 1 --min-time 0.01) || fail "bench-pool.sh exited $?: $out"
echo "$out"
for case in contraction128 contraction512 mlp512x64x1024x10 parallelfor64k parallelfor4M; do
  for a in 4 2 1; do
    grep -Eq "^$case +$a +[0-9.]+ +[0-9.]+ +[0-9.]+$" <<<"$out" || fail "no row for $case at $a running workers"
  done
done
[[ $(tail -n 1 <<<"$out") =~ ^full_vs_own=[0-9]+\.[0-9]{2}\ parked_vs_fixed=[0-9]+\.[0-9]{2}$ ]] ||
  fail "last line: $(tail -n 1 <<<"$out")"

for bad in "--threads 0" "--active 4,x" "--repeat -1" "--min-time 0" "--frobnicate"; do
  rc=0
  # shellcheck disable=SC2086  # the words of one bad option
  err=$("$repo/launch_scripts/bench-pool.sh" --build-dir "$build" $bad 2>&1) || rc=$?
  [ "$rc" -eq 2 ] && [ -n "$err" ] || fail "bench-pool.sh $bad: exit $rc, '$err'"
done
rc=0; err=$("$repo/launch_scripts/bench-pool.sh" --build-dir /nonexistent 2>&1) || rc=$?
[ "$rc" -eq 1 ] && grep -q 'tf_bench_pool' <<<"$err" || fail "a missing build: exit $rc, '$err'"
[ "$(leftovers)" = "$before" ] || fail "left behind: $(comm -13 <(echo "$before") <(leftovers))"
echo "bench_pool_check: PASS"
