#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# bench-signal.sh — measures control by signal without malld: how long `mallctl signal PID
# --threads N` takes from the signal to the process's confirmation (mallctl's "applied after"), and
# the whole command's wall time, for a process stepping every --step-us. A benchmark: prints
# figures, never passes or fails. See --help.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${MALL_BUILD_DIR:-$repo/build}
bin=$build/bin
prog=bench-signal.sh
iterations=50
step_us=1000

usage() {
  cat <<USAGE
$prog — the latency of resizing a process with \`mallctl signal\` (no malld)

Usage: launch_scripts/$prog [-n|--iterations N] [--step-us U]
       launch_scripts/$prog -h|--help

Starts mall_test_client --threads 2 --step-us U with MALL_SIGNAL_CONTROL=1 and no malld, then runs
\`mallctl signal PID --threads 1\` and \`--threads 2\` alternately, N times in all. Each command
checks the process (/proc/PID/status, its mall-signal record), queues the signal, and polls the
record until the process applied the request at its next mall_step().

Prints median and p99 (nearest rank) of:
  apply_ms  signal sent -> the process's record says "applied" (mallctl's "applied after")
  wall_ms   the whole mallctl command, from exec to exit
then apply_ms as a multiple of the step period (a process sees a request on average half a
period after it arrives), and a last line:
  signal_apply_ms_median=X signal_apply_ms_p99=Y mallctl_wall_ms_median=Z

Options:
  -n, --iterations N  commands in all (default $iterations)
  --step-us U         the process's step period in microseconds (default $step_us)

Needs a build (MALL_BUILD_DIR, default build/) with mallctl and mall_test_client; no root.
Takes a few seconds.
USAGE
}

while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    -n|--iterations) iterations=${2:?--iterations needs a number}; shift 2 ;;
    --step-us) step_us=${2:?--step-us needs microseconds}; shift 2 ;;
    *) echo "$prog: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$iterations$step_us" in *[!0-9]*|'') echo "$prog: --iterations and --step-us take whole numbers" >&2; exit 2 ;; esac
[ "$iterations" -ge 2 ] || { echo "$prog: --iterations must be at least 2" >&2; exit 2; }
for p in mallctl mall_test_client; do
  [ -x "$bin/$p" ] || { echo "$prog: $bin/$p is missing: build first (cmake --build build)" >&2; exit 2; }
done

tmp=$(mktemp -d)
client=
cleanup() { [ -n "$client" ] && kill "$client" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT INT TERM

MALL_SIGNAL_CONTROL=1 MALL_QUIET=1 MALL_SOCKET="$tmp/no-malld.sock" \
  "$bin/mall_test_client" --threads 2 --step-us "$step_us" --duration-s 600 >"$tmp/client.out" 2>&1 &
client=$!
for _ in $(seq 100); do
  ls -l "/proc/$client/fd" 2>/dev/null | grep -q mall-signal && break
  sleep 0.05
done
ls -l "/proc/$client/fd" 2>/dev/null | grep -q mall-signal || { echo "$prog: the client did not opt in" >&2; exit 1; }

: >"$tmp/apply" ; : >"$tmp/wall"
for i in $(seq "$iterations"); do
  threads=$(( i % 2 == 1 ? 1 : 2 ))
  t0=$(date +%s%N)
  out=$("$bin/mallctl" signal "$client" --threads "$threads")
  t1=$(date +%s%N)
  echo "$out" | sed -n 's/.*applied after \([0-9.]*\) ms.*/\1/p' >>"$tmp/apply"
  echo "scale=3; ($t1 - $t0) / 1000000" | bc >>"$tmp/wall"
done

stats() {  # median and p99 (nearest rank) of a file of numbers
  sort -g "$1" | awk '{v[NR]=$1} END {m=v[int((NR+1)/2)]; r=int(0.99*NR+0.999); if (r<1) r=1; printf "%.3f %.3f\n", m, v[r]}'
}
read -r apply_med apply_p99 < <(stats "$tmp/apply")
read -r wall_med wall_p99 < <(stats "$tmp/wall")
period_ms=$(echo "scale=3; $step_us / 1000" | bc)
echo "process stepping every ${step_us} us, $iterations requests (--threads 1 / 2 alternately)"
printf '  apply_ms  median %s  p99 %s  (%.2fx the step period)\n' "$apply_med" "$apply_p99" "$(echo "$apply_med / $period_ms" | bc -l)"
printf '  wall_ms   median %s  p99 %s\n' "$wall_med" "$wall_p99"
echo "signal_apply_ms_median=$apply_med signal_apply_ms_p99=$apply_p99 mallctl_wall_ms_median=$wall_med"
