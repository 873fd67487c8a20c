#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# bench_cosched_check.sh — what a user of launch_scripts/bench-cosched.sh relies on, on a tiny run
# (--work-scale 0.05, small datasets): it finishes all four ways, prints the table and the
# documented last line, writes summary.csv (4 ways), timeline.csv (samples of every job in every
# way, mall ways with cores malld gave) and timeline.png; bad options exit 2 with words; a SIGTERM
# in the middle exits non-zero and leaves nothing behind (malld, jobs, cgroups, temp folders).
# Figures are not judged: it is a benchmark. Usage: bench_cosched_check.sh REPO BUILD_DIR
set -euo pipefail
repo=$1
export MALL_BUILD_DIR=$2
bench=$repo/launch_scripts/bench-cosched.sh
tmp=$(mktemp -d /tmp/mall-bench-cosched-check.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "bench_cosched_check: FAIL: $*" >&2; exit 1; }
small=(--work-scale 0.05 --linear-rows 65536 --linear-batch 4096)
leftovers() {
  { ls -d /tmp/mall-bench-cosched.* /sys/fs/cgroup/cpuset/mall_bench_cosched* /sys/fs/cgroup/mall_bench_cosched* 2>/dev/null || true
    pgrep -f 'mall-bench-cosched\.' 2>/dev/null || true; } | sort
}
before=$(leftovers)

# The watchdog: every run is bounded (a hang fails with 124 instead of stalling CI).
. "$(dirname "${BASH_SOURCE[0]}")/../support/watchdog.sh"
out=$(watchdog_run 600 "$bench" "${small[@]}" --out "$tmp/out") || fail "bench exited $?: $out"
echo "$out"
# malld decides the enforcement (--backend auto as root) and the bench says which it used.
if [ "$(id -u)" -eq 0 ]; then
  grep -Eq '^bench-cosched.sh: malld --backend auto enforces with (cgroup-v1|cgroup-v2|affinity)$' <<<"$out" ||
    fail "the bench did not say which enforcement malld chose"
fi
last=$(tail -n 1 <<<"$out")
[[ $last =~ ^throughput_vs_static=[0-9]+\.[0-9]{2}\ throughput_vs_oversub=[0-9]+\.[0-9]{2}$ ]] || fail "last line: $last"
for way in static oversub equal throughput; do
  grep -Eq "^$way +[0-9.]+ +[0-9.]+ +[0-9.]+ " <<<"$out" || fail "no table row for $way"
done
[ "$(wc -l < "$tmp/out/summary.csv")" -eq 5 ] || fail "summary.csv should have a header and 4 ways"
head -1 "$tmp/out/timeline.csv" | grep -qx 'way,time_s,job,kind,cores,cpus' || fail "timeline.csv header"
jobs=$(grep -Eo '^  j[0-9]+-(dense|small|linear)' <<<"$out" | tr -d ' ' | sort -u)
[ "$(wc -l <<<"$jobs")" -eq 4 ] || fail "expected 4 jobs in the scenario: $jobs"
for way in static oversub equal throughput; do
  for job in $jobs; do
    # Every job held cores (threads for oversub) at some point, and held none at its end.
    awk -F, -v w="$way" -v j="$job" '$1 == w && $3 == j && $5 >= 1 {found = 1} END {exit !found}' \
      "$tmp/out/timeline.csv" || fail "$way: no sample with cores for $job"
    awk -F, -v w="$way" -v j="$job" '$1 == w && $3 == j {last = $5} END {exit !(last == 0)}' \
      "$tmp/out/timeline.csv" || fail "$way: $job does not end at 0 cores"
  done
done
[ "$(head -c 4 "$tmp/out/timeline.png" | tail -c 3)" = PNG ] || fail "no timeline.png"

# Bad options: exit 2 with words, nothing run.
for bad in "--ways static,nonsense" "--work-scale 0" "--cpus 0" "--linear-batch 10"; do
  set +e; err=$("$bench" $bad 2>&1 >/dev/null); rc=$?; set -e
  [ $rc -eq 2 ] || fail "bench-cosched.sh $bad: exit $rc, expected 2"
  grep -q -- "${bad%% *}" <<<"$err" || fail "bench-cosched.sh $bad: the error does not name the option: $err"
done

# A bad scenario file: exit 1 naming the file and the rule, before anything runs.
printf 'name,kind,arrival_s,work_core_s,min,max\nj one,dense,0,1,1,2\n' > "$tmp/bad.csv"
set +e; err=$("$bench" --scenario "$tmp/bad.csv" --out "$tmp/bad" 2>&1); rc=$?; set -e
[ $rc -eq 1 ] || fail "a bad scenario: exit $rc, expected 1"
grep -q "bad.csv: job name 'j one'" <<<"$err" || fail "a bad scenario: $err"
grep -q calibration <<<"$err" && fail "a bad scenario was noticed only after the calibration: $err"

# SIGTERM in the middle of a mall way: non-zero exit, nothing left behind. (timeout(1) itself, not
# watchdog_run: $pid must be the process that passes the TERM on to the benchmark.)
timeout 600 "$bench" --work-scale 0.5 --ways equal --linear-rows 65536 --linear-batch 4096 --out "$tmp/term" \
  > "$tmp/term.log" 2>&1 &
pid=$!
for _ in $(seq 300); do
  grep -q 'j00-dense' "$tmp/term.log" 2>/dev/null && pgrep -f 'mall-bench-cosched\..*malld' >/dev/null && break
  sleep 0.1
done
sleep 1
kill -TERM "$pid"
set +e; wait "$pid"; rc=$?; set -e
[ $rc -ne 0 ] || fail "a SIGTERM run exited 0"
sleep 0.5
after=$(leftovers)
[ "$before" = "$after" ] || fail "left behind: $(comm -13 <(echo "$before") <(echo "$after"))"
echo "bench_cosched_check: OK"
