#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# mallsim_check.sh — what a user of mallsim checks: a small trace with known curves gives a sane
# ordering (the throughput policy does at least as much work per second as the static partition,
# the poorly scaling job does not keep cores it cannot use), the last line has the documented
# form, a 1000-job generated trace completes with nothing unfinished, bad input exits 2 with words.
# Usage: mallsim_check.sh BIN_DIR
set -euo pipefail
sim=$1/mallsim
tmp=$(mktemp -d /tmp/mall-sim-check.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
# The watchdog: every mallsim run is bounded (a hang fails with exit 124 instead of stalling CI).
. "$(dirname "${BASH_SOURCE[0]}")/../support/watchdog.sh"
mallsim() { watchdog_run 120 "$sim" "$@"; }
fail() { echo "mallsim_check: FAIL: $*" >&2; exit 1; }

cat > "$tmp/trace.csv" <<'CSV'
arrival_s,work,min,max,curve
# a job that scales and one that stops at one core, on 8 cores
0,800,1,8,linear
0,200,1,8,flat:1
CSV
out=$(mallsim --topology 'pack:1 core:8 pu:1' --trace "$tmp/trace.csv" --csv "$tmp/out.csv")
echo "$out"
last=$(tail -n 1 <<<"$out")
[[ $last =~ ^throughput_vs_static=([0-9.]+)\ throughput_vs_oversub=([0-9.]+)$ ]] || fail "last line: $last"
vs_static=${BASH_REMATCH[1]}
awk -v v="$vs_static" 'BEGIN {exit !(v >= 1.5)}' || fail "throughput policy only ${vs_static}x static on a linear + flat pair"
tp=$(awk '$1 == "throughput" {print $4}' <<<"$out"); eq=$(awk '$1 == "equal" {print $4}' <<<"$out")
awk -v t="$tp" -v e="$eq" 'BEGIN {exit !(t >= e * 0.99)}' || fail "throughput ($tp) below equal ($eq)"
[ "$(wc -l < "$tmp/out.csv")" -eq 5 ] || fail "csv should have a header and 4 ways"

out=$(mallsim --generate 1000 --seed 3 --mean-gap 4)
awk 'NR > 2 && $1 !~ /=/ && $7 != 0 {exit 1}' <<<"$out" || fail "unfinished jobs: $out"

for bad in "--trace /nonexistent.csv" "--generate 0" "--generate 5 --step 0" "--generate 5 --topology nonsense:3"; do
  set +e; err=$(mallsim $bad 2>&1 >/dev/null); rc=$?; set -e
  [ $rc -eq 2 ] || fail "mallsim $bad: exit $rc, expected 2"
  [ -n "$err" ] || fail "mallsim $bad: no words on stderr"
done
printf '0,10,3,2,linear\n' > "$tmp/bad.csv"
set +e; err=$(mallsim --topology 'pack:1 core:4 pu:1' --trace "$tmp/bad.csv" 2>&1 >/dev/null); rc=$?; set -e
[ $rc -eq 2 ] && grep -q "bad.csv:1" <<<"$err" || fail "a bad trace line must be named: $err"
echo "mallsim_check: ok"
