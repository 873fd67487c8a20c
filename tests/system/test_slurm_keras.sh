#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# test_slurm_keras.sh — issue 28 as a user checks it on the real local cluster
# (launch_scripts/local-cluster.sh: slurmctld, slurmd, the mall SPANK plugin, `malld --slurm`):
# `sbatch --malleable=1:2 -c 1` of a batch script whose srun step trains Keras (model.fit with
# mall.keras.Malleable: examples/keras_digits.py --log-changes) grows to the whole node, shrinks to
# its own cpu before a plain job's task runs (every thread of the Keras process then allows only that
# cpu, the two jobs never share a cpu, TensorFlow's pools park workers, training goes on), grows back
# to 0-1 when the plain job is cancelled, and completes with exit code 0; malld then lists no job and
# the cluster leaves nothing behind.
# Label `system`.
# Usage: test_slurm_keras.sh BUILD_DIR SOURCE_DIR [PYTHON]   (ctest passes all three: PYTHON is
#        MALL_TENSORFLOW_PYTHON, a python with tensorflow-cpu; default SOURCE_DIR/.venv/bin/python;
#        needs root, Slurm, jq, the op library BUILD_DIR/lib/libmall_tf_ops.so)
# Prints one PASS/FAIL line per check; exits non-zero when any check fails. Always brings its private
# cluster down (trap); a watchdog ends the run after MALL_SYSTEST_TIMEOUT_S (default 240).
# MALL_SYSTEST_LOG_DIR=DIR keeps the cluster's logs, the jobs' outputs and malld's events there.
# MALL_SYSTEST_KERAS_STEPS=N: the training's timed steps (default 30000: about 30-45 s on the 2-cpu
# node, a step is about 1-1.5 ms; the checks need about 15 s of it). Every wait polls with a deadline;
# a fixed sleep is only a sampling interval.
set -uo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/private_cluster.sh"   # systest_begin, pass, fail, the cluster set-up
systest_begin 240 "$@"   # watchdog (MALL_SYSTEST_TIMEOUT_S), $build/$src/$cluster, root or exit 77
python=${3:-$src/.venv/bin/python}
mallctl=$build/bin/mallctl
steps=${MALL_SYSTEST_KERAS_STEPS:-30000}
print_every=1000
wait_default_s=30   # a deadline for each cluster wait; each normally ends in well under a second
start_s=90          # importing TensorFlow and the warm-up fit: ~10 s, more on a loaded machine
systest_require "slurmctld slurmd sbatch srun scontrol squeue scancel jq" "$mallctl" "$build/bin/malld" \
  "$build/lib/mall_spank.so" "$build/lib/libmall.so" "$build/lib/libmall_tf_ops.so" "$python" "$src/examples/keras_digits.py"
if ! "$python" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("tensorflow") is None or u.find_spec("keras") is None)'; then
  echo "FAIL: $python has no tensorflow/keras: run launch_scripts/install-deps.sh (the venv), or pass a python that has them"
  exit 1
fi

# A private cluster: its own folder, cgroup parent and ports (tests/system/private_cluster.sh).
private_cluster_init mall-systest-keras 6887
cluster_down_done=0
watch_pid=''

cleanup() {
  trap - EXIT INT TERM
  if [ -n "$watch_pid" ]; then kill "$watch_pid" 2>/dev/null; wait "$watch_pid" 2>/dev/null; fi
  if [ "$cluster_down_done" -eq 0 ]; then "$cluster" down >/dev/null || echo "FAIL: local-cluster.sh down (in the cleanup)"; fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'echo "FAIL: interrupted"; exit 1' INT
trap 'watchdog_fired "$timeout_s"; exit 1' TERM

# ---- helpers --------------------------------------------------------------------------------------
malld_empty() { [ "$(status_json | jq -c '[.jobs, .reserved]')" = '[[],{}]' ]; }
out_has() { grep -Eq "$1" "$work/keras.out"; }
# after_line PATTERN_A PATTERN_B: the output has a line matching B after its last line matching A;
# prints that B line
after_line() {
  awk -v a="$1" -v b="$2" '$0 ~ a { seen = NR; hit = "" } seen && NR > seen && $0 ~ b && hit == "" { hit = $0 } END { if (hit == "") exit 1; print hit }' "$work/keras.out"
}
training_ended() { out_has '^done steps '; }
dump_keras() { # what helps to understand a failure
  note "--- keras job $jk: state $(job_state "$jk"); output (resize, parked and last lines):"
  grep -E '^(start|resize|parked|done|final)|rror|raceback' "$work/keras.out" 2>/dev/null | tail -n 20 | sed 's/^/        /'
  tail -n 5 "$work/keras.out" 2>/dev/null | sed 's/^/        /'
  note "--- malld status: $(status_json | jq -c '{reserved, jobs: [.jobs[] | {job, cpus, cpuset, state, pids}]}' 2>/dev/null)"
  [ -n "${kpid:-}" ] && note "--- keras threads: $(threads_lists "$kpid")"
}

# ---- up -------------------------------------------------------------------------------------------
cluster_up_recording   # private_cluster.sh: up, its environment, one event recorder for the run

# ---- 1. the Keras job alone grows to the whole node ------------------------------------------------
# The batch script a user writes: mall's Python package, libmall and the op library from the build
# (an install has them in place), then one srun step that trains.
cat >"$work/keras.sbatch" <<EOF
#!/bin/bash
export PYTHONPATH=$src/python MALL_LIBRARY=$build/lib/libmall.so MALL_TF_OPS_LIBRARY=$build/lib/libmall_tf_ops.so
srun $python $src/examples/keras_digits.py --steps $steps --print-every $print_every --log-changes
echo "srun-rc=\$?"
EOF
t_submit=$SECONDS
jk=$(submit keras --malleable=1:2 -c 1 "$work/keras.sbatch") || { fail "(1) sbatch refused the Keras job: $(cat "$work/keras.sbatch.err")"; exit 1; }
kpid=''
if wait_for $start_s out_has '^start pid [0-9]+ '; then
  kpid=$(sed -n 's/^start pid \([0-9]*\) .*/\1/p' "$work/keras.out" | head -n1)
  note "Keras job $jk: $(grep -m1 '^start pid' "$work/keras.out") ($(( SECONDS - t_submit )) s after sbatch)"
else
  fail "(1) Keras job $jk printed no 'start pid' line within ${start_s}s"; dump_keras; exit 1
fi
# The plugin tells the task the most cores it may grow to (MAX per task), which size_pools() reads.
task_max=$(tr '\0' '\n' < "/proc/$kpid/environ" 2>/dev/null | sed -n 's/^MALL_MAX=//p')
if [ "$task_max" = 2 ]; then
  pass "(1) the task's environment has MALL_MAX=2 (--malleable=1:2)"
else
  fail "(1) the task's environment has MALL_MAX='$task_max', not 2 (--malleable=1:2)"
fi
if wait_for $start_s out_has '^resize step [0-9]+ threads [0-9]+ -> 2 cpus 0-1$' &&
   wait_for $wait_default_s job_settled_on "slurm-$jk" 0-1 && wait_for 10 all_threads_on "$kpid" 5 0-1; then
  pass "(1) Keras job $jk (--malleable=1:2 -c 1) settled on 0-1 in mallctl status (pids $(job_pids "slurm-$jk" | tr '\n' ' ')), its output: $(grep -m1 -E -- '-> 2 cpus 0-1$' "$work/keras.out"), every one of its $(ls /proc/"$kpid"/task | wc -l) threads allows 0-1"
else
  fail "(1) Keras job $jk did not grow to 0-1 (mallctl status, its resize line, its threads' masks)"; dump_keras; exit 1
fi
if ! job_pids "slurm-$jk" | grep -qx "$kpid"; then
  fail "(1) malld does not list the Keras process $kpid among job $jk's pids ($(job_pids "slurm-$jk" | tr '\n' ' '))"
fi
# The core Slurm gave the Keras job (reserved for it in malld): it keeps that one; the plain job gets the other.
own=$(reserved_for "slurm-$jk")
case $own in
  0) other=1 ;;
  1) other=0 ;;
  *) fail "(1) malld reserves '$own' for job $jk, not one of cpus 0 and 1"; dump_keras; exit 1 ;;
esac

if training_ended; then   # the checks below need a running training
  fail "(1) the training ended before the plain job could come: raise MALL_SYSTEST_KERAS_STEPS ($steps)"; dump_keras; exit 1
fi

# ---- 2. a plain job arrives: the Keras job shrinks to its own cpu before the plain task runs ------
mark=$(date +%s.%N)
jp=$(submit plain -c 1 --wrap 'date +%s.%N; echo "pid $$"; exec sleep 300') ||
  { fail "(2) sbatch refused the plain job: $(cat "$work/plain.sbatch.err")"; exit 1; }
ppid_plain=''
if wait_for $wait_default_s grep -q '^pid [0-9]' "$work/plain.out" && wait_for $wait_default_s job_settled_on "slurm-$jk" "$own"; then
  ppid_plain=$(sed -n 's/^pid \([0-9]*\)$/\1/p' "$work/plain.out")
  jp_start=$(grep -m1 -E '^[0-9]+\.[0-9]+$' "$work/plain.out")
  narrowed=$(first_event_time ".event == \"enforce\" and .job == \"slurm-$jk\" and .growing == false and .time > $mark")
  acked=$(first_event_time ".event == \"ack\" and .job == \"slurm-$jk\" and .time > $mark")
  if [ -n "$narrowed" ] && earlier "$narrowed" "$jp_start"; then
    pass "(2) Keras job $jk acked at ${acked:-?} and was narrowed to cpu $own at $narrowed, before plain job $jp's task started at $jp_start"
  else
    fail "(2) Keras job $jk's narrowing (enforce at ${narrowed:-never}) is not before plain job $jp's task start ($jp_start)"
    note "events: $(events_of ".time > $mark" | tr '\n' ' ')"
  fi
else
  fail "(2) plain job $jp did not start, or Keras job $jk did not settle on cpu $own, within the deadline"
  dump_keras
fi
shrunk=$(after_line '-> 2 cpus 0-1$' "^resize step [0-9]+ threads 2 -> 1 cpus $own\$")
parked=$(after_line "^resize step [0-9]+ threads 2 -> 1 cpus $own\$" '^parked step ')
if [ -n "$shrunk" ] && [[ $parked =~ ^parked\ step\ [0-9]+\ tids\ ([0-9,]+)$ ]]; then
  tids=${BASH_REMATCH[1]} missing=''
  for t in ${tids//,/ }; do [ -d "/proc/$kpid/task/$t" ] || missing+="$t "; done
  if [ -z "$missing" ]; then
    pass "(2) the Keras job's output: '$shrunk', then '$parked' (threads of pid $kpid)"
  else
    fail "(2) parked tids $missing are not threads of the Keras process $kpid: '$parked'"
  fi
else
  fail "(2) no 'resize ... 2 -> 1 cpus $own' line followed by a 'parked ... tids T,...' line in the Keras job's output"; dump_keras
fi
if wait_for 10 all_threads_on "$kpid" 5 "$own"; then
  pass "(2) every one of the Keras process's $(ls /proc/"$kpid"/task | wc -l) threads allows only cpu $own"
else
  fail "(2) the Keras process's threads do not all allow only cpu $own: $(threads_lists "$kpid")"
fi
seen=''
if [ -n "$ppid_plain" ] && wait_for 10 all_threads_on "$ppid_plain" 1 "$other" && seen=$(never_share "$kpid" "$ppid_plain" 20); then
  pass "(2) Keras job $jk and plain job $jp never shared a cpu: $seen"
else
  fail "(2) the jobs share a cpu or the plain task is missing (pid '${ppid_plain}'): ${seen:-$(threads_lists "${ppid_plain:-0}")}"
fi
# Training goes on, shrunk: a later step line shows one running worker on cpu $own.
if line=$(wait_for 20 after_line "^resize step [0-9]+ threads 2 -> 1 cpus $own\$" "^step [0-9]+ loss [0-9.]+ threads 1 cpus $own\$" &&
          after_line "^resize step [0-9]+ threads 2 -> 1 cpus $own\$" "^step [0-9]+ loss [0-9.]+ threads 1 cpus $own\$"); then
  pass "(2) training goes on shrunk: '$line'"
else
  fail "(2) no step line with 'threads 1 cpus $own' after the shrink"; dump_keras
fi
if training_ended; then
  fail "(2) the training ended while the plain job ran: raise MALL_SYSTEST_KERAS_STEPS ($steps)"
fi

# ---- 3. the plain job is cancelled: the Keras job grows back to 0-1 --------------------------------
scancel "$jp"
if wait_for $wait_default_s job_final "$jp" && wait_for $wait_default_s job_settled_on "slurm-$jk" 0-1 &&
   wait_for 20 after_line "^resize step [0-9]+ threads 2 -> 1 cpus $own\$" '^resize step [0-9]+ threads 1 -> 2 cpus 0-1$' &&
   wait_for 10 all_threads_on "$kpid" 5 0-1; then
  regrown=$(after_line "^resize step [0-9]+ threads 2 -> 1 cpus $own\$" '^resize step [0-9]+ threads 1 -> 2 cpus 0-1$')
  pass "(3) plain job $jp cancelled ($(job_state "$jp")); Keras job $jk settled on 0-1 again, its output: '$regrown', all its threads allow 0-1"
  unparked=$(after_line '^resize step [0-9]+ threads 1 -> 2 cpus 0-1$' '^parked step ')
  if [[ $unparked =~ ^parked\ step\ [0-9]+\ tids\ -$ ]]; then
    pass "(3) every worker released: '$unparked'"
  else
    fail "(3) workers still parked after growing back: '$unparked'"
  fi
else
  fail "(3) after plain job $jp was cancelled ($(job_state "$jp")), Keras job $jk did not grow back to 0-1"; dump_keras
fi
if training_ended && ! after_line '^resize step [0-9]+ threads 1 -> 2 cpus 0-1$' '^done steps ' >/dev/null; then
  fail "(3) the training ended before it grew back: raise MALL_SYSTEST_KERAS_STEPS ($steps)"
fi

# ---- 4. the Keras job completes with exit code 0 and malld lets it go ------------------------------
if wait_for 150 job_final "$jk"; then
  state=$(job_state "$jk") exit_code=$(scontrol show job "$jk" | grep -o ' ExitCode=[0-9:]*' | head -n1)
  if [ "$state" = COMPLETED ] && [ "$exit_code" = ' ExitCode=0:0' ] && grep -qx 'srun-rc=0' "$work/keras.out" && out_has '^final loss '; then
    pass "(4) Keras job $jk $state,$exit_code: $(grep -m1 '^done steps' "$work/keras.out"); $(grep -m1 '^final loss' "$work/keras.out")"
  else
    fail "(4) Keras job $jk ended $state,$exit_code"; dump_keras
  fi
else
  fail "(4) Keras job $jk did not end within 150 s ($(job_state "$jk"))"; dump_keras
fi
if wait_for $wait_default_s malld_empty; then
  pass "(4) malld lists no job and reserves nothing"
else
  fail "(4) malld still has: $(status_json | jq -c '{reserved, jobs: [.jobs[].job]}')"
fi
kill "$watch_pid" 2>/dev/null; wait "$watch_pid" 2>/dev/null; watch_pid=''

# ---- down, and nothing left -----------------------------------------------------------------------
if [ $failures -gt 0 ]; then
  for f in "$MALL_CLUSTER_DIR"/log/malld.log "$MALL_CLUSTER_DIR"/log/slurmd.log; do
    echo "--- end of $f"; tail -n 30 "$f" 2>/dev/null | sed 's/^/    /'
  done
fi
if [ -n "${MALL_SYSTEST_LOG_DIR:-}" ]; then   # keep the logs, job outputs and events (e.g. for CI artifacts)
  mkdir -p "$MALL_SYSTEST_LOG_DIR" && cp -r "$MALL_CLUSTER_DIR/log" "$work"/*.out "$work"/*.jsonl "$MALL_SYSTEST_LOG_DIR"/ 2>/dev/null
fi
cluster_down_and_nothing_left "$kpid ${ppid_plain:-}"

note "run time: ${SECONDS}s"
if [ $failures -eq 0 ]; then echo "test_slurm_keras: all checks passed"; exit 0; fi
echo "test_slurm_keras: $failures check(s) failed"
exit 1
