#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# tf_bench_check.sh — what a user of the TensorFlow example's reports and benchmarks relies on, on
# tiny runs (figures are not judged: they are benchmarks):
# - mall_train_tf --report-pool, TensorFlow's own pools of 2 parked to 1: one worker of each pool
#   is parked, and each used under 5% of the cpu time the running threads (main and the workers not
#   parked) used: it ran no kernel; the tids it names are the process's threads;
# - launch_scripts/bench-tf.sh prints a row per way and its documented last line;
# - launch_scripts/bench-oversubscription.sh --program tf runs the three ways (malld included) and
#   prints its last line, leaving no malld, cgroup or temp folder behind;
# - bad options exit 2 with words.
# Usage: tf_bench_check.sh REPO BUILD_DIR
set -euo pipefail
repo=$1
build=$2
export MALL_BUILD_DIR=$build
. "$(dirname "${BASH_SOURCE[0]}")/../support/watchdog.sh"
fail() { echo "tf_bench_check: FAIL: $*" >&2; exit 1; }
leftovers() {
  { ls -d /tmp/mall-bench-oversub.* /sys/fs/cgroup/cpuset/mall_bench_oversub* 2>/dev/null || true
    pgrep -f 'mall-bench-oversub\.' 2>/dev/null || true; } | sort
}
before=$(leftovers)

# 1. Where TensorFlow's work ran, with one worker of each of TensorFlow's pools parked.
unset MALL_SOCKET MALL_JOB_ID  # not under malld: the pools keep --threads
# --hidden 512: with 256 hidden units TensorFlow judges most matrix products too small to split and
# runs them on the calling thread, and the running intra-op worker would have little to show.
export TF_CPP_MIN_LOG_LEVEL=2
out=$(watchdog_run 300 "$build/bin/mall_train_tf" \
        --threads 1 --max-threads 2 --steps 60 --batch 256 --hidden 512 --print-every 0 --report-pool) || fail "mall_train_tf exited $?: $out"
echo "$out"
grep -q '^done steps 60 ' <<<"$out" || fail "no done line"
# One worker of each pool parked once, and never lent back: nothing was stuck, so the stall guard
# had no reason to (a loan here would be a false alarm, running a parked worker).
grep -qx 'parking intra-op parks 1 loans 0 inter-op parks 1 loans 0' <<<"$out" || fail "parks or loans: $(grep '^parking' <<<"$out")"
for pool in intra inter; do
  [ "$(grep -Ec "role tf-$pool-op\[[0-9]+\] parked yes " <<<"$out")" -eq 1 ] || fail "not exactly one $pool-op worker parked"
  [ "$(grep -Ec "role tf-$pool-op\[[0-9]+\] parked no " <<<"$out")" -eq 1 ] || fail "not exactly one $pool-op worker running"
done
awk '$1 == "pool-thread" {
       cpu = $NF
       if (($7 ~ /^tf-/ || $7 == "main") && $9 == "no") running += cpu
       if ($9 == "yes") { parked += cpu; if (cpu > most) most = cpu }
     }
     END { printf "tf_bench_check: cpu ms on main and the running workers %.1f, on the parked workers %.1f\n", running, parked
           exit !(running > 0 && most < 0.05 * running) }' <<<"$out" || fail "a parked worker used cpu (ran kernels)"
while read -r tid; do
  [ -n "$tid" ] && [ "$tid" -gt 0 ] || fail "bad tid '$tid'"
done < <(awk '$1 == "pool-thread" {print $3}' <<<"$out")
[ "$(grep -c '^pool-thread ' <<<"$out")" -ge 5 ] || fail "fewer threads listed than the pools' workers and main"

# 2. bench-tf.sh on a tiny run, and its usage errors.
out=$(watchdog_run 600 "$repo/launch_scripts/bench-tf.sh" --steps 30 --batch 128 --hidden 128 --repeat 1) ||
  fail "bench-tf.sh exited $?: $out"
echo "$out"
for way in tensorflow mall tensorflow-small shrunk; do
  grep -Eq "^$way +[0-9.]+ +[0-9.]+ +[0-9.]+$" <<<"$out" || fail "bench-tf.sh: no row for $way"
done
[[ $(tail -n 1 <<<"$out") =~ ^mall_vs_tensorflow=[0-9]+\.[0-9]{2}\ shrunk_vs_small=[0-9]+\.[0-9]{2}$ ]] ||
  fail "bench-tf.sh last line: $(tail -n 1 <<<"$out")"
rc=0; err=$("$repo/launch_scripts/bench-tf.sh" --repeat 0 2>&1) || rc=$?
[ "$rc" -eq 2 ] && grep -q 'positive integer' <<<"$err" || fail "bench-tf.sh --repeat 0: exit $rc: $err"

# 3. The research's scenario on a tiny run.
out=$(watchdog_run 600 "$repo/launch_scripts/bench-oversubscription.sh" --program tf --steps 200) ||
  fail "bench-oversubscription.sh --program tf exited $?: $out"
echo "$out"
grep -q 'copies of mall_train_tf' <<<"$out" || fail "the scenario did not run mall_train_tf"
[[ $(tail -n 1 <<<"$out") =~ ^mall_vs_oversub=[0-9]+\.[0-9]{2}\ mall_vs_static=[0-9]+\.[0-9]{2}$ ]] ||
  fail "bench-oversubscription.sh last line: $(tail -n 1 <<<"$out")"
rc=0; err=$("$repo/launch_scripts/bench-oversubscription.sh" --program torch 2>&1) || rc=$?
[ "$rc" -eq 2 ] && grep -q 'digits or tf' <<<"$err" || fail "--program torch: exit $rc: $err"
[ "$(leftovers)" = "$before" ] || fail "left behind: $(comm -13 <(echo "$before") <(leftovers))"
echo "tf_bench_check: PASS"
