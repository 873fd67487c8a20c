#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# bench_containers_check.sh — ctest containers.bench: what a user of launch_scripts/bench-containers.sh
# relies on, on a tiny run (--work-scale 0.05, small datasets, podman): it finishes the three ways,
# prints the table (with the runnable-per-core columns) and the documented last line, writes
# summary.csv (3 ways), timeline.csv (samples of every container in every way, each ending at 0
# cores; static cpusets that never move) and timeline.png; bad options exit 2 naming the option;
# without root it exits 1 saying so; a SIGTERM through timeout(1) in the middle of the mall way
# exits non-zero and leaves nothing behind (containers, runc state, cgroups, malld, temp folders:
# the kit's leak check and a before/after listing); where the venv and the op library are there, a
# tiny mall way of --mix keras (the keras kind) runs to its end. Figures are not judged: it is a benchmark.
# Usage: bench_containers_check.sh REPO BUILD_DIR. Exit 0 pass, 1 fail, 77 skip (not root, or
# podman/runc/conmon missing: printed). About 60 s on 2 cpus.
set -uo pipefail
repo=${1:?usage: bench_containers_check.sh REPO BUILD_DIR}
export MALL_BUILD_DIR=${2:?usage: bench_containers_check.sh REPO BUILD_DIR}
bench=$repo/launch_scripts/bench-containers.sh
kit=$repo/tests/containers/container_kit.sh
fail() { echo "bench_containers_check: FAIL: $*" >&2; exit 1; }

if [ "$(id -u)" -ne 0 ]; then echo "bench_containers_check: SKIP: needs root (cgroup cpusets, podman as root)"; exit 77; fi
# shellcheck source=../containers/container_kit.sh
. "$kit"
ctr_have podman || { echo "bench_containers_check: SKIP: $CTR_WHY"; exit 77; }
tmp=$(mktemp -d /tmp/mall-bench-containers-check.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
small=(--work-scale 0.05 --linear-rows 65536 --linear-batch 4096)
leftovers() { # what a run may leave: kit folders and cgroups, malld's cgroups, processes, runc state
  { ls -d /tmp/mallctr-bench-* /sys/fs/cgroup/*/mallctr-bench-* /sys/fs/cgroup/*/mall_bench_containers* 2>/dev/null
    pgrep -f 'mallctr-bench-' 2>/dev/null
    grep -l 'mallctr-bench-' /run/runc/*/state.json 2>/dev/null
    true; } | sort
}
kit_dir_of() { sed -n "s/^bench-containers.sh: the container kit's folder is \([^ ]*\) .*/\1/p" "$1" | head -n 1; }
before=$(leftovers)
t_start=$(date +%s)

# 1. A tiny run of the three ways. (The watchdog: a hang fails with 124 instead of stalling CI.)
# shellcheck source=../support/watchdog.sh
. "$repo/tests/support/watchdog.sh"
watchdog_run 240 "$bench" "${small[@]}" --out "$tmp/out" >"$tmp/run.log" 2>"$tmp/run.err" ||
  fail "bench exited $?: $(cat "$tmp/run.log" "$tmp/run.err")"
cat "$tmp/run.log"
last=$(tail -n 1 "$tmp/run.log")
[[ $last =~ ^mall_vs_static=[0-9]+\.[0-9]{2}\ mall_vs_outside=[0-9]+\.[0-9]{2}$ ]] || fail "last line: $last"
grep -Eq '^way +makespan_s +mean_job_s +work/s +vs_static +vs_outside +rq/core_mean +rq/core_peak$' "$tmp/run.log" ||
  fail "no table header"
num='[0-9]+\.[0-9]+'
for way in static outside mall; do
  grep -Eq "^$way +$num +$num +$num +$num +$num +$num +$num$" "$tmp/run.log" || fail "no table row for $way"
done
grep -Eq '^outside: ([0-9]+ resizes? by podman update --cpuset-cpus: [0-9.]+ ms|no resize)' "$tmp/run.log" ||
  fail "no line with the outside way's update time"
[ "$(wc -l <"$tmp/out/summary.csv")" -eq 4 ] || fail "summary.csv should have a header and 3 ways"
head -1 "$tmp/out/summary.csv" | grep -qx 'way,makespan_s,mean_completion_s,work_per_s,vs_static,vs_outside,runnable_per_core_mean,runnable_per_core_peak,resizes,resize_ms_mean' ||
  fail "summary.csv header: $(head -1 "$tmp/out/summary.csv")"
head -1 "$tmp/out/timeline.csv" | grep -qx 'way,time_s,job,kind,cores,cpus,threads,runnable' || fail "timeline.csv header"
jobs=$(grep -Eo '^  j[0-9]+-(dense|small|linear)' "$tmp/run.log" | tr -d ' ' | sort -u)
[ "$(wc -l <<<"$jobs")" -eq 4 ] || fail "expected 4 containers in the scenario: $jobs"
for way in static outside mall; do
  for job in $jobs; do
    # Every container was seen running (cores and threads), and holds nothing at its end.
    awk -F, -v w="$way" -v j="$job" '$1 == w && $3 == j && $5 >= 1 && $7 >= 1 {found = 1} END {exit !found}' \
      "$tmp/out/timeline.csv" || fail "$way: no sample of $job running"
    awk -F, -v w="$way" -v j="$job" '$1 == w && $3 == j {last = $5} END {exit !(last == 0)}' \
      "$tmp/out/timeline.csv" || fail "$way: $job does not end at 0 cores"
  done
done
# static: a container's cpuset never moves (one distinct cpus value per job while it runs).
awk -F, '$1 == "static" && $5 > 0 {seen[$3 "|" $6] = 1} END {for (k in seen) {split(k, a, "|"); n[a[1]]++}
          for (j in n) if (n[j] > 1) exit 1}' "$tmp/out/timeline.csv" || fail "static: a container's cpuset moved"
[ "$(head -c 4 "$tmp/out/timeline.png" | tail -c 3)" = PNG ] || fail "no timeline.png"
dir=$(kit_dir_of "$tmp/run.log")
[ -n "$dir" ] || fail "the run did not name its kit folder"
left=$("$kit" leaks "$dir") || fail "the run left: $left"
echo "bench_containers_check: the tiny run took $(( $(date +%s) - t_start )) s"

# 1b. The keras kind (the driver's KerasKind: examples/keras_digits.py in the venv): a tiny mall way of
# --mix keras, where the job's most threads must reach keras_digits.py as --threads and the job
# run to its end; only where the venv and the op library are there (install-deps.sh, a TensorFlow build).
keras_python=${MALL_BENCH_PYTHON:-$repo/.venv/bin/python}
if [ -x "$keras_python" ] && [ -f "$MALL_BUILD_DIR/lib/libmall_tf_ops.so" ]; then
  t_keras=$(date +%s)
  watchdog_run 180 "$bench" --mix keras --ways mall "${small[@]}" --out "$tmp/keras" >"$tmp/keras.log" 2>"$tmp/keras.err" ||
    fail "--mix keras exited $?: $(cat "$tmp/keras.log" "$tmp/keras.err")"
  grep -Eq '^  keras +keras_digits\.py +[0-9.]+ steps/s on 1 core' "$tmp/keras.log" || fail "--mix keras: no calibration line of the keras kind"
  grep -Eq "^mall +$num +$num +$num " "$tmp/keras.log" || fail "--mix keras: no table row for mall"
  awk -F, '$1 == "mall" && $4 == "keras" && $5 >= 1 && $7 >= 1 {found = 1} END {exit !found}' "$tmp/keras/timeline.csv" ||
    fail "--mix keras: no sample of the keras container running"
  dir=$(kit_dir_of "$tmp/keras.log")
  left=$("$kit" leaks "$dir") || fail "the keras run left: $left"
  echo "bench_containers_check: the tiny keras run took $(( $(date +%s) - t_keras )) s"
else
  echo "bench_containers_check: no $keras_python or $MALL_BUILD_DIR/lib/libmall_tf_ops.so: the keras kind's run is left out"
fi

# 2. Bad options: exit 2 with words naming the option, nothing run.
for bad in "--ways static,nonsense" "--ways mall,mall" "--work-scale 0" "--cpus 0" "--engine lxc" \
           "--policy fastest" "--resize-by magic" "--sample-ms 5" "--timeout 0" "--linear-batch 10" "--mix nonsense" "--bogus"; do
  # shellcheck disable=SC2086  # split the option from its value on purpose
  err=$("$bench" $bad 2>&1 >/dev/null); rc=$?
  [ $rc -eq 2 ] || fail "bench-containers.sh $bad: exit $rc, expected 2"
  grep -q -- "${bad%% *}" <<<"$err" || fail "bench-containers.sh $bad: the error does not name the option: $err"
done
"$bench" --help | grep -q '^EXIT STATUS' || fail "--help has no EXIT STATUS section"
"$bench" --help | grep -q '^THE KERAS KIND' || fail "--help has no section on the keras kind"

# 3. Not root: exit 1 saying so, before anything is set up.
err=$(setpriv --reuid 65534 --regid 65534 --clear-groups env PATH=/usr/bin:/bin "$bench" "${small[@]}" 2>&1); rc=$?
if [ $rc -ne 1 ] || ! grep -q 'needs root' <<<"$err"; then
  fail "as uid 65534: exit $rc, expected 1 with 'needs root': $err"
fi

# 4. SIGTERM in the middle of the mall way (timeout(1) signals the wrapper, then its whole
# process group): non-zero exit, nothing left behind.
timeout 240 "$bench" --work-scale 0.5 --ways mall --linear-rows 65536 --linear-batch 4096 --out "$tmp/term" \
  >"$tmp/term.log" 2>&1 &
pid=$!
running=0
for _ in $(seq 300); do
  for f in /sys/fs/cgroup/cpuset/mall_bench_containers*/job_*/libpod-*/cgroup.procs; do
    grep -q . "$f" 2>/dev/null && running=1
  done
  [ $running = 1 ] && break
  sleep 0.1
done
[ $running = 1 ] || fail "the SIGTERM run started no container within 30 s: $(cat "$tmp/term.log")"
sleep 1
kill -TERM "$pid"
wait "$pid"; rc=$?
[ $rc -ne 0 ] || fail "a SIGTERM run exited 0"
dir=$(kit_dir_of "$tmp/term.log")
[ -n "$dir" ] || fail "the SIGTERM run did not name its kit folder"
left=$("$kit" leaks "$dir") || fail "after SIGTERM the kit's leak check found: $left"
after=$(leftovers)
[ "$before" = "$after" ] || fail "left behind after SIGTERM: $(comm -13 <(echo "$before") <(echo "$after"))"
echo "bench_containers_check: OK ($(( $(date +%s) - t_start )) s)"
