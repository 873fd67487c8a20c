#!/usr/bin/env bash
# demo.sh — mall end to end on this machine, no cluster needed: builds if needed, starts a private
# malld, runs two malleable training jobs with mallrun (the second starts while the first runs),
# prints a line per event as the cores move, then a summary; stops everything it started.
# Usage: launch_scripts/demo.sh   (from any folder; as root it uses cgroup cpusets, else affinity)
#        MALL_BUILD_DIR=DIR picks the build folder (default: <repo>/build).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${MALL_BUILD_DIR:-$repo/build}
bin=$build/bin
steps=${MALL_DEMO_STEPS:-600}   # per job; ~10 ms/step on one core, ~5 on two
seed=7

if [ -t 1 ]; then bold=$'\033[1m' dim=$'\033[2m' off=$'\033[0m'; else bold='' dim='' off=''; fi
say() { printf '%s==> %s%s\n' "$bold" "$*" "$off"; }
note() { printf '    %s\n' "$*"; }
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }

# ---- everything this script starts, and how it is stopped -------------------------------------
tmp=''
malld_pid='' watch_pid='' watch_json_pid='' job_pids=()
cgroup_parent="mall_demo_$$"

stop_pid() {  # stop_pid PID: SIGTERM, wait up to 5 s, then SIGKILL
  local pid=$1 i
  [ -n "$pid" ] || return 0
  kill -TERM "$pid" 2>/dev/null || return 0
  for i in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

cleanup() {
  set +e
  local pid
  for pid in "${job_pids[@]}"; do stop_pid "$pid"; done
  stop_pid "$watch_pid"
  stop_pid "$watch_json_pid"
  stop_pid "$malld_pid"
  # malld removes its cgroups on a clean stop; remove what a crash may have left.
  for dir in "/sys/fs/cgroup/cpuset/$cgroup_parent" "/sys/fs/cgroup/$cgroup_parent"; do
    [ -d "$dir" ] && find "$dir" -depth -type d -exec rmdir {} \; 2>/dev/null
  done
  [ -n "$tmp" ] && rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

tmp=$(mktemp -d "${TMPDIR:-/tmp}/mall-demo.XXXXXX")
sock=$tmp/malld.sock
demo_start=$(now_ms)

# ---- build --------------------------------------------------------------------------------------
have_binaries() { local b; for b in malld mallctl mallrun mall_train_sgd; do [ -x "$bin/$b" ] || return 1; done; }
if [ -d "$build" ] && [ ! -w "$build" ] && have_binaries; then
  say "using the binaries in $build as they are (the folder is not writable by $(id -un), so no rebuild)"
else
say "building malld, mallctl, mallrun and mall_train_sgd in $build"
if ! command -v cmake >/dev/null || ! command -v ninja >/dev/null || ! command -v c++ >/dev/null; then
  note "build tools missing: running launch_scripts/install-deps.sh"
  "$repo/launch_scripts/install-deps.sh"
fi
if [ ! -f "$build/build.ninja" ]; then
  note "first build: configuring and compiling takes a minute or two"
  if ! cmake -G Ninja -B "$build" -S "$repo" >"$tmp/configure.log" 2>&1; then
    note "configure failed; installing dependencies and trying again"
    "$repo/launch_scripts/install-deps.sh"
    cmake -G Ninja -B "$build" -S "$repo" >"$tmp/configure.log" 2>&1 || {
      tail -30 "$tmp/configure.log"; echo "demo: cmake failed (log above)" >&2; exit 1; }
  fi
fi
if ! ninja -C "$build" -j2 malld mallctl mallrun mall_train_sgd >"$tmp/build.log" 2>&1; then
  tail -40 "$tmp/build.log"
  echo "demo: the build failed (see above)" >&2
  exit 1
fi
note "$(grep -c '^\[' "$tmp/build.log" || true) build steps; binaries in $bin"
fi

run_start=$(now_ms)

# ---- malld --------------------------------------------------------------------------------------
backend=affinity
if [ "$(id -u)" -eq 0 ] &&
   { [ -w /sys/fs/cgroup/cpuset/cgroup.procs ] || grep -qw cpuset /sys/fs/cgroup/cgroup.controllers 2>/dev/null; }; then
  backend=auto
  say "starting a private malld (root: cores are enforced with cgroup cpusets under $cgroup_parent)"
else
  if [ "$(id -u)" -ne 0 ]; then why="not running as root"; else why="no usable cpuset controller"; fi
  say "starting a private malld with the AFFINITY backend ($why):"
  note "cores are moved with sched_setaffinity on every thread, not enforced by a cgroup cpuset;"
  note "run the demo as root to see cgroup cpusets."
fi
"$bin/malld" --socket "$sock" --state-dir "$tmp" --backend "$backend" --cgroup-parent "$cgroup_parent" \
  --policy equal --log-level info 2>"$tmp/malld.log" &
malld_pid=$!
for _ in $(seq 100); do
  "$bin/mallctl" --socket "$sock" status >/dev/null 2>&1 && break
  kill -0 "$malld_pid" 2>/dev/null || break
  sleep 0.05
done
if ! "$bin/mallctl" --socket "$sock" status >"$tmp/status.txt" 2>&1; then
  echo "demo: malld did not start; its log:" >&2
  cat "$tmp/malld.log" >&2
  exit 1
fi
pool=$(sed -n 's/^POOL *\([^ ]*\).*/\1/p' "$tmp/status.txt")
used_backend=$(sed -n 's/^BACKEND *\([^ ]*\).*/\1/p' "$tmp/status.txt")
# Count the cpus of a list such as 0-3,8.
ncpus=0
IFS=, read -r -a items <<<"$pool"
for item in "${items[@]}"; do
  if [[ $item == *-* ]]; then ncpus=$(( ncpus + ${item#*-} - ${item%-*} + 1 )); else ncpus=$(( ncpus + 1 )); fi
done
note "socket $sock, pool $pool ($ncpus cpus), policy equal"
note "malld: $(grep -m1 ' info: backend' "$tmp/malld.log" | sed 's/.* info: //')"

# ---- watchers: one for the reader, one (JSON) for the summary -----------------------------------
"$bin/mallctl" --socket "$sock" watch --json >"$tmp/events.jsonl" 2>/dev/null &
watch_json_pid=$!
"$bin/mallctl" --socket "$sock" watch > >(sed -u "s/^/  ${dim}malld${off} | /") 2>&1 &
watch_pid=$!
sleep 0.3  # let both watchers subscribe before the first job registers

# ---- the two jobs -------------------------------------------------------------------------------
start_job() {  # start_job NAME: runs mall_train_sgd under mallrun in the background
  local name=$1
  "$bin/mallrun" --socket "$sock" --malleable="1:$ncpus" --job "$name" -- \
    "$bin/mall_train_sgd" --steps "$steps" --seed "$seed" --print-every 100 --log-changes \
    > >(tee "$tmp/$name.log" | sed -u "s/^/  ${bold}job $name${off} | /") 2>&1 &
  job_pids+=($!)
}
wait_for_line() {  # wait_for_line FILE REGEX: until a line matches (30 s at most)
  local i
  for i in $(seq 300); do grep -qE "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
  return 1
}
say "job A: mallrun --malleable=1:$ncpus -- mall_train_sgd --steps $steps --seed $seed (alone: gets the whole pool)"
start_job A
wait_for_line "$tmp/A.log" '^step 200 ' || true
say "job B: the same training, started while A runs (the equal policy shares the pool: A shrinks first)"
start_job B
if wait_for_line "$tmp/B.log" '^step 1 '; then
  sleep 0.2
  "$bin/mallctl" --socket "$sock" status 2>&1 | sed "s/^/  ${dim}status${off} | /"
fi
rc_a=0 rc_b=0
wait "${job_pids[0]}" || rc_a=$?
wait "${job_pids[1]}" || rc_b=$?
job_pids=()
sleep 0.3  # let the last events (end, grow) reach the watchers
stop_pid "$watch_pid"; watch_pid=''
stop_pid "$watch_json_pid"; watch_json_pid=''
end_ms=$(now_ms)
wall_ms=$(( end_ms - demo_start )) run_ms=$(( end_ms - run_start ))

# ---- summary ------------------------------------------------------------------------------------
median() { sort -g | awk '{v[NR]=$1} END {if (NR==0) print "-"; else if (NR%2) printf "%.1f", v[(NR+1)/2]; else printf "%.1f", (v[NR/2]+v[NR/2+1])/2}'; }
field() { grep -o "\"$1\":[^,}]*" | sed 's/^[^:]*://; s/"//g'; }

echo
say "summary"
printf '    %-4s %6s %10s %9s %9s %12s %16s  %s\n' JOB STEPS "FINAL LOSS" ACCURACY RESIZES "MEDIAN ACK" CHECKSUM STATUS
checksums=()
for job in A B; do
  rc=$rc_a; [ "$job" = B ] && rc=$rc_b
  final=$(grep '^final loss' "$tmp/$job.log" || true)
  done_steps=$(sed -n 's/^done steps \([0-9]*\).*/\1/p' "$tmp/$job.log")
  loss=$(sed -n 's/^final loss \([^ ]*\).*/\1/p' <<<"$final")
  acc=$(sed -n 's/.* accuracy \([^ ]*\).*/\1/p' <<<"$final")
  sum=$(sed -n 's/.* checksum \([^ ]*\).*/\1/p' <<<"$final")
  checksums+=("$sum")
  events=$(grep "\"job\":\"$job\"" "$tmp/events.jsonl" || true)
  publishes=$(grep -c '"event":"publish"' <<<"$events" || true)
  resizes=$(( publishes > 0 ? publishes - 1 : 0 ))
  ack=$(grep '"event":"ack"' <<<"$events" | field latency_us | median)
  [ "$ack" = "-" ] || ack="$ack us"
  printf '    %-4s %6s %10s %9s %9s %12s %16s  %s\n' "$job" "${done_steps:--}" "${loss:--}" "${acc:--}" \
    "$resizes" "$ack" "${sum:--}" "$([ "$rc" -eq 0 ] && echo ok || echo "exit $rc")"
done
note "resizes: allocation changes after the first; median ack: publish-to-ack latency of those"
note "changes (a job acks at its next step boundary, so this is up to one training step)"
if [ -n "${checksums[0]}" ] && [ "${checksums[0]}" = "${checksums[1]}" ]; then
  note "A and B trained with the same seed under different resize histories: identical weights (same checksum)"
fi
seconds() { printf '%d.%01d s' $(( $1 / 1000 )) $(( $1 % 1000 / 100 )); }
note "backend $used_backend; malld and the jobs ran $(seconds "$run_ms"); total wall time $(seconds "$wall_ms") (with the build check)"
if grep -qE ' (error|warn): ' "$tmp/malld.log"; then
  note "malld reported problems:"
  grep -E ' (error|warn): ' "$tmp/malld.log" | sed 's/^/      /'
fi
[ "$rc_a" -eq 0 ] && [ "$rc_b" -eq 0 ]
