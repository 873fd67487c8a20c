#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# test_slurm_malleable.sh — proves that cores move between Slurm jobs on the real local cluster
# (launch_scripts/local-cluster.sh: slurmctld, slurmd, the mall SPANK plugin, `malld --slurm`):
# a lone --malleable job grows to the whole node, shrinks to its own core before a second job's tasks
# run (malleable or not), never shares a core with it, grows back when it ends; scancel returns
# cores; a job killed before it ever acks, or while malld waits for its ack, does not wedge malld;
# bad --malleable values are refused; malld --slurm ends a registration Slurm does not run; with
# malld stopped a --malleable job still runs and the node stays up; an srun --mpi=pmix step runs
# inside a malleable allocation; --malleable=MIN:MAX,weight=W reaches malld as the job's weight; a
# job that completes carries malld's figures in its AdminComment and malld's history; a running
# job's AdminComment carries its figures so far (malld --slurm-comment-interval), which a cancelled
# job keeps.
# Label `system`.
# Usage: test_slurm_malleable.sh BUILD_DIR SOURCE_DIR   (ctest passes both; needs root, Slurm, jq)
# Prints one PASS/FAIL/SKIP line per check; exits non-zero when any check fails. Always brings its
# private cluster down (trap); a watchdog ends the run after MALL_SYSTEST_TIMEOUT_S (default 420).
# MALL_SYSTEST_LOG_DIR=DIR keeps the cluster's logs, the jobs' outputs and malld's events there.
# The node has 2 cores (cpus 0 and 1); each job asks -c 1: the first job keeps the core Slurm gave it
# and the next one gets the other. Every wait polls with a deadline; a fixed sleep is only a sampling interval.
set -uo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/private_cluster.sh"   # systest_begin, pass, fail, the cluster set-up
systest_begin 420 "$@"   # watchdog (MALL_SYSTEST_TIMEOUT_S), $build/$src/$cluster, root or exit 77
mallctl=$build/bin/mallctl
client=$build/bin/mall_test_client
wait_default_s=30   # a deadline for each wait; every one here normally ends in well under a second
systest_require "slurmctld slurmd sbatch srun scontrol squeue scancel sinfo jq" "$mallctl" "$client" "$build/bin/malld" "$build/lib/mall_spank.so"

# A private cluster: its own folder, cgroup parent and ports (tests/system/private_cluster.sh).
private_cluster_init mall-systest-slurm 6827
# The plain job's prolog asks malld to look its cores up in slurmctld (plugstack prolog_lookup=yes,
# off by default since issue 39: one RPC per job and node); this test checks that path.
export MALL_CLUSTER_PLUGIN_ARGS=prolog_lookup=yes
# Running jobs' figures reach their AdminComment every second (300 s by default).
export MALL_CLUSTER_MALLD_ARGS="--slurm-comment-interval 1"
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
job_field() { # job_field JOB FIELD: a field of malld's job JOB ("" when malld does not list it)
  status_json | jq -r --arg j "$1" --arg f "$2" '.jobs[] | select(.job == $j) | .[$f] | tostring' 2>/dev/null
}
job_listed() { [ -n "$(job_field "$1" job)" ]; }
job_settled_on_one() { # job_settled_on_one JOB: holds exactly one cpu, settled
  local s; s=$(status_json) || return 1
  [ "$(jq -r --arg j "$1" '.jobs[] | select(.job == $j) | "\(.ncpus) \(.state) \(.cpus == .cpuset)"' <<<"$s")" = "1 settled true" ]
}
job_gone_and_released() { ! job_listed "$1" && [ -z "$(reserved_for "$1")" ]; }
dump_job() { # dump_job NAME ID: what helps to understand a failure
  note "--- job $2 ($1): state $(job_state "$2"); output:"; sed 's/^/        /' "$work/$1.out" 2>/dev/null | tail -n 15
  note "--- malld status: $(status_json | jq -c '{reserved, jobs: [.jobs[] | {job, cpus, cpuset, state, pids}]}' 2>/dev/null)"
}

# ---- up -------------------------------------------------------------------------------------------
cluster_up_recording   # private_cluster.sh: up, its environment, one event recorder for the run

client_cmd() { # the malleable stand-in for a training process: 2 worker threads, a step every 2 ms
  echo "exec $client --threads 2 --step-us 2000 --duration-s 300"
}

# ---- 1. a lone --malleable=1:2 job grows to both cores --------------------------------------------
j1=$(submit first --malleable=1:2 -c 1 --wrap "$(client_cmd)") || { fail "(1) sbatch refused the first job: $(cat "$work/first.sbatch.err")"; exit 1; }
if wait_for $wait_default_s job_settled_on "slurm-$j1" 0-1; then
  j1_pids=$(job_pids "slurm-$j1" | tr '\n' ' ')
  pass "(1) job $j1 (--malleable=1:2 -c 1) holds cpus 0-1 in mallctl status (pids $j1_pids)"
else
  fail "(1) job $j1 did not reach cpus 0-1 within ${wait_default_s}s"; dump_job first "$j1"; exit 1
fi
j1_pid=${j1_pids%% *}
# The core Slurm gave job 1 (reserved for it in malld): it keeps that one; the next job gets the other.
own=$(reserved_for "slurm-$j1")
case $own in
  0) other=1 ;;
  1) other=0 ;;
  *) fail "(1) malld reserves '$own' for job $j1, not one of cpus 0 and 1"; dump_job first "$j1"; exit 1 ;;
esac
# 3 threads: the main one and the 2 workers (each bound with mall_bind_thread)
if wait_for 10 all_threads_on "$j1_pid" 3 0-1; then
  pass "(1) every thread of job $j1's task allows cpus 0-1 ($(threads_lists "$j1_pid"))"
else
  fail "(1) job $j1's threads do not all allow 0-1: $(threads_lists "$j1_pid")"
fi
if wait_for 10 grep -q 'cpus=0-1$' "$work/first.out"; then
  pass "(1) inside job $j1, libmall applied the allocation: $(grep -m1 'cpus=0-1$' "$work/first.out")"
else
  fail "(1) job $j1's output has no 'change ... cpus=0-1' line: $(tr '\n' '|' <"$work/first.out")"
fi

# ---- 2b. a plain (non-malleable) job arrives: the first shrinks before its task runs ----------------
# The plain job's task prints the time first, then runs a multi-threaded program that does not use
# malld (a socket nobody serves: libmall stays detached).
mark=$(date +%s.%N)
j2=$(submit plain -c 1 --wrap "date +%s.%N; exec $client --socket $work/nobody.sock --threads 2 --duration-s 300") ||
  { fail "(2b) sbatch refused the plain job: $(cat "$work/plain.sbatch.err")"; exit 1; }
if wait_for $wait_default_s bash -c "grep -Eq '^[0-9]+\.[0-9]+$' '$work/plain.out' && grep -q '^open' '$work/plain.out'" &&
   wait_for 10 job_settled_on "slurm-$j1" "$own"; then
  j2_start=$(grep -m1 -E '^[0-9]+\.[0-9]+$' "$work/plain.out")
  narrowed=$(first_event_time ".event == \"enforce\" and .job == \"slurm-$j1\" and .growing == false and .time > $mark")
  if [ -n "$narrowed" ] && earlier "$narrowed" "$j2_start"; then
    pass "(2b) job $j1 narrowed to cpu $own at $narrowed, before plain job $j2's task started at $j2_start"
  else
    fail "(2b) job $j1's narrowing (enforce at ${narrowed:-never}) is not before plain job $j2's task start ($j2_start)"
    note "events: $(events_of ".time > $mark" | tr '\n' ' ')"
  fi
else
  fail "(2b) plain job $j2 did not start, or job $j1 did not settle on cpu $own, within the deadline"
  dump_job plain "$j2"; dump_job first "$j1"
fi
j2_pid=$(pgrep -f "^$client --socket $work/nobody.sock" | head -n1)
seen=''
if [ -n "$j2_pid" ] && wait_for 10 all_threads_on "$j2_pid" 3 "$other" && seen=$(never_share "$j1_pid" "$j2_pid" 20); then
  pass "(2b) jobs $j1 and $j2 never shared a core: $seen"
else
  fail "(2b) jobs $j1 and $j2 share a core or a task is missing (plain task pid '${j2_pid}'): ${seen:-$(threads_lists "${j2_pid:-0}")}"
fi

# The reclaim came from the plain job's prolog: malld (--slurm) looked its cores up in Slurm.
if grep -q "reclaiming cpus $other for slurm-$j2 (Slurm's allocation on this node)" "$MALL_CLUSTER_DIR/log/malld.log"; then
  pass "(2b) the reclaim for job $j2 came from its job prolog (malld looked its cpus up in Slurm)"
else
  fail "(2b) no prolog reclaim for job $j2 in malld's log: $(grep -m3 "slurm-$j2" "$MALL_CLUSTER_DIR/log/malld.log" | tr '\n' ' ')"
fi

# ---- 3. the plain job ends: the first grows back --------------------------------------------------
[ -n "$j2_pid" ] && kill -TERM "$j2_pid"   # mall_test_client exits 0: the job completes normally
if wait_for $wait_default_s job_final "$j2" && wait_for $wait_default_s job_settled_on "slurm-$j1" 0-1 &&
   wait_for 10 all_threads_on "$j1_pid" 3 0-1; then
  pass "(3) plain job $j2 ended ($(job_state "$j2")); job $j1 grew back to 0-1 ($(threads_lists "$j1_pid"))"
else
  fail "(3) after plain job $j2 ended ($(job_state "$j2")), job $j1 did not grow back to 0-1"; dump_job first "$j1"
fi

# ---- 2a. a malleable job arrives: the first shrinks before its task runs ---------------------------
mark=$(date +%s.%N)
j3=$(submit second --malleable=1:2 -c 1 --wrap "date +%s.%N; $(client_cmd)") ||
  { fail "(2a) sbatch refused the second malleable job: $(cat "$work/second.sbatch.err")"; exit 1; }
if wait_for $wait_default_s job_settled_on_one "slurm-$j3" && wait_for 10 job_settled_on "slurm-$j1" "$own" &&
   wait_for 10 grep -Eq '^[0-9]+\.[0-9]+$' "$work/second.out"; then
  j3_start=$(grep -m1 -E '^[0-9]+\.[0-9]+$' "$work/second.out")
  narrowed=$(first_event_time ".event == \"enforce\" and .job == \"slurm-$j1\" and .growing == false and .time > $mark")
  registered=$(first_event_time ".event == \"register\" and .job == \"slurm-$j3\"")
  if [ -n "$narrowed" ] && [ -n "$registered" ] && earlier "$narrowed" "$registered" && earlier "$narrowed" "$j3_start"; then
    pass "(2a) job $j1 narrowed to cpu $own at $narrowed, before malleable job $j3 registered ($registered) and its task started ($j3_start)"
  else
    fail "(2a) job $j1's narrowing (${narrowed:-never}) is not before job $j3's registration (${registered:-never}) and task start ($j3_start)"
    note "events: $(events_of ".time > $mark" | tr '\n' ' ')"
  fi
else
  fail "(2a) malleable job $j3 did not settle on one cpu, or job $j1 on cpu $own, within the deadline"
  dump_job second "$j3"; dump_job first "$j1"
fi
j3_pids=$(job_pids "slurm-$j3" | tr '\n' ' ')
j3_pid=${j3_pids%% *}
seen=''
if [ -n "$j3_pid" ] && wait_for 10 all_threads_on "$j3_pid" 3 "$other" && seen=$(never_share "$j1_pid" "$j3_pid" 20); then
  pass "(2a) jobs $j1 and $j3 never shared a core: $seen"
else
  fail "(2a) jobs $j1 and $j3 share a core or a task is missing (pid '${j3_pid}'): ${seen:-$(threads_lists "${j3_pid:-0}")}"
fi

# ---- 12. a running job's AdminComment carries its figures so far; cancelled, it keeps them -----------
admin_comment() { scontrol show job "$1" -o | grep -o 'AdminComment=[^ ]*' | sed 's/^AdminComment=//'; }
running_figures() { # running_figures JOB: its AdminComment has this node's running segment with core-seconds
  [[ $(admin_comment "$1") =~ mall:[^:]+:lent_core_s=[0-9.]+,core_s=([0-9.]+),resizes=[0-9]+,ack_timeouts=[0-9]+,oversub_s=[0-9.]+,running_as_of=([0-9]+) ]] &&
    awk -v c="${BASH_REMATCH[1]}" 'BEGIN { exit !(c > 0) }'
}
if wait_for 15 running_figures "$j3"; then
  pass "(12) running job $j3's AdminComment carries its figures so far: $(admin_comment "$j3")"
else
  fail "(12) running job $j3's AdminComment has no running figures: '$(admin_comment "$j3")'"
  grep -E "AdminComment|slurm-$j3" "$MALL_CLUSTER_DIR/log/malld.log" | tail -n 5
fi

# ---- 4. scancel of a malleable job mid-run returns its cores ---------------------------------------
scancel "$j3"
if wait_for $wait_default_s job_gone_and_released "slurm-$j3" && wait_for $wait_default_s job_settled_on "slurm-$j1" 0-1 &&
   wait_for 10 all_threads_on "$j1_pid" 3 0-1; then
  pass "(4) scancel $j3: malld no longer lists slurm-$j3, nothing is reserved for it, job $j1 regrew to 0-1"
  pass "(3) malleable job $j3 ended ($(job_state "$j3")); job $j1 grew back to 0-1"
  # Slurm finished the cancelled job before its task ended: its figures are in malld's history.
  if wait_for 10 bash -c "'$mallctl' history --job slurm-$j3 --json | jq -e 'length == 1 and .[0].core_seconds > 0' >/dev/null"; then
    pass "(12) cancelled job $j3's record is in mallctl history: $("$mallctl" history --job "slurm-$j3" --json | jq -c '.[0] | {reason, core_seconds, resizes}')"
    if running_figures "$j3"; then
      pass "(12) cancelled job $j3 keeps its last running figures in Slurm: $(admin_comment "$j3")"
    else
      fail "(12) cancelled job $j3 lost its running figures in Slurm: '$(admin_comment "$j3")'"
    fi
  else
    fail "(12) no record of cancelled job $j3 in mallctl history: $("$mallctl" history --json | jq -c '[.[].job]')"
  fi
else
  fail "(4) after scancel $j3 (state $(job_state "$j3")): listed=$(job_listed "slurm-$j3" && echo yes || echo no) reserved='$(reserved_for "slurm-$j3")'"
  dump_job first "$j1"
fi

# ---- 4. a job killed between registration and ack does not wedge malld -----------------------------
# --no-step: the task attaches but never acknowledges an allocation; it is cancelled once registered.
j4=$(submit unacked --malleable=1:2 -c 1 --wrap "exec $client --threads 2 --no-step --duration-s 300") ||
  { fail "(4) sbatch refused the never-acking job: $(cat "$work/unacked.sbatch.err")"; exit 1; }
if wait_for $wait_default_s has_event ".event == \"register\" and .job == \"slurm-$j4\""; then
  scancel "$j4"
  never_acked=$(events_of ".event == \"ack\" and .job == \"slurm-$j4\"" | wc -l)
  note "job $j4 registered and was cancelled (acks from it before the cancel: $never_acked)"
  t0=$(date +%s%N)
  if wait_for 10 status_json && wait_for $wait_default_s job_gone_and_released "slurm-$j4" &&
     wait_for $wait_default_s job_settled_on "slurm-$j1" 0-1; then
    pass "(4) after job $j4 was killed unacknowledged, malld answers, dropped it and job $j1 regrew to 0-1 ($(( ($(date +%s%N) - t0) / 1000000 )) ms)"
  else
    fail "(4) malld after the unacknowledged job $j4 was killed: status $(status_json >/dev/null && echo answers || echo 'does not answer')"
    dump_job unacked "$j4"; dump_job first "$j1"
  fi
else
  fail "(4) job $j4 never registered with malld"; dump_job unacked "$j4"
fi
j5=$(submit next --malleable=1:2 -c 1 --wrap "$(client_cmd)") ||
  { fail "(4) sbatch refused the next job: $(cat "$work/next.sbatch.err")"; exit 1; }
if wait_for $wait_default_s job_settled_on_one "slurm-$j5" && wait_for 10 job_settled_on "slurm-$j1" "$own" &&
   wait_for 10 grep -q "^change .* cpus=$other$" "$work/next.out"; then
  pass "(4) the next job $j5 got its core: $(grep -m1 '^change' "$work/next.out")"
else
  fail "(4) the next job $j5 did not get a core"; dump_job next "$j5"; dump_job first "$j1"
fi
scancel "$j5" "$j1"
if wait_for $wait_default_s job_final "$j5" && wait_for $wait_default_s job_final "$j1" &&
   wait_for $wait_default_s job_gone_and_released "slurm-$j5" && wait_for $wait_default_s job_gone_and_released "slurm-$j1" &&
   wait_for $wait_default_s bash -c "[ \"\$('$mallctl' status --json | jq -c '[.jobs, .reserved]')\" = '[[],{}]' ]"; then
  pass "(4) scancel $j5 $j1: malld lists no job and reserves nothing"
else
  fail "(4) after scancel $j5 $j1: $(status_json | jq -c '{reserved, jobs: [.jobs[].job]}')"
fi

# ---- 12. a job that completes has its figures in Slurm (AdminComment) and malld's history ----------
# Alone on the node it holds both cores, one above its own: its lent core-seconds grow about one per
# second. Its task exits 0 after 3 s; malld records the figures before Slurm completes the job.
j12=$(submit accounted --malleable=1:2 -c 1 --wrap "exec $client --threads 2 --step-us 2000 --duration-s 3") ||
  { fail "(12) sbatch refused the job: $(cat "$work/accounted.sbatch.err")"; exit 1; }
if wait_for 60 job_final "$j12" && [ "$(job_state "$j12")" = COMPLETED ]; then
  comment=$(admin_comment "$j12")
  record=$("$mallctl" history --job "slurm-$j12" --json | jq -c '.[0] // empty')
  lent=$(jq -r '.lent_core_seconds // empty' <<<"$record")
  # Its last figures replaced the running ones (no running_as_of).
  if [[ $comment != *running_as_of* ]] &&
     [[ $comment =~ mall:[^:]+:lent_core_s=([0-9.]+),core_s=([0-9.]+),resizes=([0-9]+),ack_timeouts=0,oversub_s=0\.0 ]] &&
     awk -v c="${BASH_REMATCH[1]}" -v h="$lent" 'BEGIN { exit !(c > 1 && h != "" && c - h < 0.06 && h - c < 0.06) }'; then
    pass "(12) job $j12 completed with AdminComment=$comment; mallctl history: lent $lent core-s"
  else
    fail "(12) job $j12: AdminComment='$comment', history record '$record'"
    grep -E "AdminComment|slurm-$j12" "$MALL_CLUSTER_DIR/log/malld.log" | tail -n 5
  fi
else
  fail "(12) job $j12 did not complete ($(job_state "$j12"))"; dump_job accounted "$j12"
fi

# ---- 4. a job killed while malld waits for its ack (shrinking for a new job) does not wedge malld ----
# Alone on the node, a --no-step job grows to both cores (growing needs no ack); a second job's
# reclaim then asks it to shrink, and it is cancelled while malld waits for that ack.
j8=$(submit noack --malleable=1:2 -c 1 --wrap "exec $client --threads 2 --no-step --duration-s 300") ||
  { fail "(4) sbatch refused the never-acking job: $(cat "$work/noack.sbatch.err")"; exit 1; }
if wait_for $wait_default_s bash -c "[ \"\$('$mallctl' status --json | jq -r '.jobs[] | select(.job == \"slurm-$j8\") | .cpuset')\" = 0-1 ]"; then
  j8_own=$(reserved_for "slurm-$j8")
  mark=$(date +%s.%N)
  j9=$(submit after_noack --malleable=1:2 -c 1 --wrap "$(client_cmd)") ||
    { fail "(4) sbatch refused the job after the never-acking one: $(cat "$work/after_noack.sbatch.err")"; exit 1; }
  if wait_for $wait_default_s has_event ".event == \"publish\" and .job == \"slurm-$j8\" and .ncpus == 1 and .time > $mark"; then
    timed_out=$(events_of ".event == \"ack_timeout\" and .job == \"slurm-$j8\"" | wc -l)
    scancel "$j8"
    note "job $j8 (never acks) was asked to shrink for job $j9 and cancelled while malld waited (ack timeouts already: $timed_out)"
    # Job j9 may hold one cpu only for a moment (until j8's cores are released): no wait for that.
    if wait_for $wait_default_s job_gone_and_released "slurm-$j8" && wait_for $wait_default_s job_settled_on "slurm-$j9" 0-1 &&
       wait_for 10 grep -q '^change .* cpus=0-1$' "$work/after_noack.out"; then
      pass "(4) malld was not wedged: job $j8 is gone and released (had cpu $j8_own), job $j9 runs and grew to 0-1: $(grep -m1 '^change .* cpus=0-1$' "$work/after_noack.out")"
    else
      fail "(4) after cancelling job $j8 during its pending shrink"; dump_job after_noack "$j9"; dump_job noack "$j8"
    fi
  else
    fail "(4) job $j8 was never asked to shrink for job $j9"; dump_job after_noack "$j9"; dump_job noack "$j8"
  fi
  scancel "$j9" "$j8"
  if wait_for $wait_default_s job_final "$j9" &&
     wait_for $wait_default_s bash -c "[ \"\$('$mallctl' status --json | jq -c '[.jobs, .reserved]')\" = '[[],{}]' ]"; then
    pass "(4) scancel $j9: malld lists no job and reserves nothing"
  else
    fail "(4) after scancel $j9: $(status_json | jq -c '{reserved, jobs: [.jobs[].job]}')"
  fi
else
  fail "(4) the never-acking job $j8 did not grow to 0-1"; dump_job noack "$j8"
fi
kill "$watch_pid" 2>/dev/null; wait "$watch_pid" 2>/dev/null; watch_pid=''

# ---- 5. bad --malleable values are refused and no job is submitted --------------------------------
declare -A bad_words=([x]='MIN "x" is not a whole number' [3:1]='MAX (1) is below MIN (3)' [0:2]='MIN must be at least 1'
                      [1:3]="MAX (3) is above the largest node's 2 cores" [1:2,wieght=2]='unknown key "wieght"')
jobs_before=$(squeue -h -o %A | sort | tr '\n' ' ')
for value in x 3:1 0:2 1:3 1:2,wieght=2; do
  out=$(sbatch --parsable --malleable="$value" -c 1 --wrap true 2>&1); rc=$?
  if [ $rc -ne 0 ] && ! grep -qE '^[0-9]+(;.*)?$' <<<"$out" && grep -qF -- "--malleable=$value: ${bad_words[$value]}" <<<"$out" &&
     grep -qF 'allowed: --malleable' <<<"$out"; then
    pass "(5) --malleable=$value refused (exit $rc): $(grep -m1 -F -- "--malleable=$value:" <<<"$out")"
  else
    fail "(5) --malleable=$value: exit $rc, output: $out"
  fi
done
jobs_after=$(squeue -h -o %A | sort | tr '\n' ' ')
if [ "$jobs_after" = "$jobs_before" ]; then
  pass "(5) no job was queued by the refused submissions (squeue: '${jobs_after}')"
else
  fail "(5) squeue changed: before '$jobs_before', after '$jobs_after'"
fi

# ---- 9. MIN is the job's cpus-per-task (mall's cli_filter.lua) --------------------------------------
# Without -c, --malleable=2:2 asks Slurm for 2 cpus per task, and the task starts on both cores; a -c
# below MIN is refused at submission with the fix, and nothing is queued.
j9=$(submit minreq --malleable=2:2 --wrap 'grep Cpus_allowed_list /proc/self/status') ||
  fail "(9) sbatch refused --malleable=2:2: $(cat "$work/minreq.sbatch.err")"
if [ -n "${j9:-}" ]; then
  per_task=$(scontrol show job "$j9" | grep -o 'CPUs/Task=[0-9]*' | head -n1)
  if [ "$per_task" = 'CPUs/Task=2' ] && wait_for 60 job_final "$j9" &&
     grep -qx $'Cpus_allowed_list:\t0-1' "$work/minreq.out"; then
    pass "(9) sbatch --malleable=2:2 without -c got $per_task and ran on 0-1"
  else
    fail "(9) --malleable=2:2 without -c: '$per_task', output '$(cat "$work/minreq.out" 2>/dev/null)'"
  fi
fi
jobs_before=$(squeue -h -o %A | sort | tr '\n' ' ')
out=$(sbatch --parsable --malleable=2:2 -c 1 --wrap true 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -qF 'guarantees 2 cpus per task, but -c 1' <<<"$out" &&
   [ "$(squeue -h -o %A | sort | tr '\n' ' ')" = "$jobs_before" ]; then
  pass "(9) -c 1 with --malleable=2:2 refused at submission: $(grep -m1 -F 'guarantees' <<<"$out")"
else
  fail "(9) -c 1 with --malleable=2:2: exit $rc, output: $out"
fi
# The filter finds MIN before a ",weight=W" too (a held job: only its request is looked at).
held=$(sbatch --parsable --hold --malleable=2:2,weight=2 --wrap true 2>"$work/held.sbatch.err")
held=${held%%;*}
per_task=$( [ -n "$held" ] && scontrol show job "$held" | grep -o 'CPUs/Task=[0-9]*' | head -n1)
if [ "$per_task" = 'CPUs/Task=2' ]; then
  pass "(9) sbatch --malleable=2:2,weight=2 without -c got $per_task"
else
  fail "(9) --malleable=2:2,weight=2 without -c: job '${held}' has '$per_task' ($(cat "$work/held.sbatch.err"))"
fi
[ -n "$held" ] && scancel "$held" && wait_for $wait_default_s job_final "$held"

# ---- 10. the job's weight reaches malld ------------------------------------------------------------
job_weight_is() { # job_weight_is JOB W: malld lists JOB with weight W (compared as numbers)
  status_json | jq -e --arg j "$1" --argjson w "$2" '[.jobs[] | select(.job == $j) | .weight == $w] == [true]' >/dev/null
}
j10=$(submit weighted --malleable=1:2,weight=3 -c 1 --wrap "$(client_cmd)") ||
  fail "(10) sbatch refused --malleable=1:2,weight=3: $(cat "$work/weighted.sbatch.err")"
if [ -n "${j10:-}" ]; then
  if wait_for $wait_default_s job_weight_is "slurm-$j10" 3; then
    pass "(10) job $j10 (--malleable=1:2,weight=3) is in mallctl status with $(status_json | jq -c --arg j "slurm-$j10" '.jobs[] | select(.job == $j) | {job, weight, min, max}')"
  else
    fail "(10) job $j10 (--malleable=1:2,weight=3) not listed with weight 3: $(status_json | jq -c '[.jobs[] | {job, weight}]')"
    dump_job weighted "$j10"
  fi
  scancel "$j10"
  if ! { wait_for $wait_default_s job_final "$j10" && wait_for $wait_default_s job_gone_and_released "slurm-$j10"; }; then
    fail "(10) after scancel $j10: $(status_json | jq -c '{reserved, jobs: [.jobs[].job]}')"
  fi
fi

# ---- 8. malld --slurm: a registration Slurm does not run is ended ---------------------------------
# A launcher registers "slurm-999999", a job slurmctld never had (a made-up or long-gone job): malld
# asks Slurm at registration, ends the registration and returns its cores; the process keeps running
# (non-malleable) and a real job still gets cores afterwards.
fake=slurm-999999
"$build/bin/mallrun" --job "$fake" --malleable=1 -- sleep 60 >"$work/fake.out" 2>&1 &
fake_pid=$!
if wait_for 20 grep -q "Slurm reports job 999999 .*ending $fake" "$MALL_CLUSTER_DIR/log/malld.log" &&
   wait_for 10 bash -c "[ -z \"\$('$mallctl' status --json | jq -r '.jobs[] | select(.job == \"$fake\") | .job')\" ]" &&
   kill -0 "$fake_pid" 2>/dev/null; then
  pass "(8) malld --slurm ended the registration of $fake, unknown to Slurm: $(grep -m1 "Slurm reports job 999999" "$MALL_CLUSTER_DIR/log/malld.log" | sed 's/^.*info: //')"
else
  fail "(8) $fake (unknown to Slurm) was not ended by malld --slurm: $(status_json | jq -c '[.jobs[].job]')"
  note "--- malld log: $(tail -n 5 "$MALL_CLUSTER_DIR/log/malld.log" 2>/dev/null)"
fi
kill "$fake_pid" 2>/dev/null; wait "$fake_pid" 2>/dev/null

# ---- 7. an srun --mpi=pmix step inside a --malleable allocation ------------------------------------
cat >"$work/mpi_ranks.c" <<'EOF'
/* mpi_ranks.c: each rank adds its rank; rank 0 prints the sum (0 + 1 for two ranks). */
#include <mpi.h>
#include <stdio.h>
int main(int argc, char **argv) {
    int rank = -1, size = -1, sum = -1;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) printf("mpi ranks=%d sum=%d\n", size, sum);
    MPI_Finalize();
    return 0;
}
EOF
if command -v mpicc >/dev/null && mpicc -o "$work/mpi_ranks" "$work/mpi_ranks.c" 2>"$work/mpicc.err"; then
  mpi_cmd="$work/mpi_ranks"; mpi_expect='mpi ranks=2 sum=1'
else
  note "mpicc unavailable or failed ($(head -c 300 "$work/mpicc.err" 2>/dev/null)): the step runs hostname"
  mpi_cmd=hostname; mpi_expect=$(hostname)
fi
j7=$(submit mpi --malleable=1:2 -n 2 -c 1 --wrap "srun --mpi=pmix -n 2 $mpi_cmd; echo srun-rc=\$?") ||
  { fail "(7) sbatch refused the MPI job: $(cat "$work/mpi.sbatch.err")"; }
if [ -n "${j7:-}" ]; then
  if wait_for 60 job_final "$j7" && [ "$(job_state "$j7")" = COMPLETED ] && grep -qx 'srun-rc=0' "$work/mpi.out" &&
     grep -qF "$mpi_expect" "$work/mpi.out"; then
    pass "(7) srun --mpi=pmix -n 2 in a --malleable=1:2 -n 2 allocation: $(grep -F "$mpi_expect" "$work/mpi.out" | head -n1 | tr -d '\n'), srun exit 0"
  else
    fail "(7) the pmix step of job $j7 failed"; dump_job mpi "$j7"
  fi
fi

# ---- 11. a wedged malld (SIGSTOPped, backlog full): a --malleable job starts non-malleable in time --
# The plugin bounds each callback's time with malld (ack_timeout_ms + 3 s = 5 s here; see
# slurm_plugin/spank_malld.cpp): the job prolog's and the step's reclaims and the task's registration each give
# up after that, so the task starts after at most ~2 x 5 s + 0.5 s of plugin time. The check below
# allows 40 s on top for Slurm itself: it catches a hang, it does not time the plugin.
malld_pid=$(cat "$MALL_CLUSTER_DIR/run/malld.pid" 2>/dev/null)
plugin_bound_s=11
if [ -n "$malld_pid" ] && live "$malld_pid" && kill -STOP "$malld_pid"; then
  # Connections nobody accepts, held until killed: the listen backlog is full.
  python3 - "$MALL_SOCKET" >"$work/backlog.out" 2>&1 <<'PY' &
import errno, socket, sys, time
held = []
while True:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.setblocking(False)
    try:
        s.connect(sys.argv[1])
    except BlockingIOError:
        break
    held.append(s)
print("full after", len(held), "connections", flush=True)
time.sleep(3600)
PY
  filler_pid=$!
  if wait_for 10 grep -q '^full after' "$work/backlog.out"; then
    submitted=$(date +%s.%N)
    j11=$(submit wedged --malleable=1:2 -c 1 --wrap "date +%s.%N; $client --threads 2 --duration-s 0.5; echo client-rc=\$?") ||
      fail "(11) sbatch refused the job while malld is wedged: $(cat "$work/wedged.sbatch.err")"
    if [ -n "${j11:-}" ]; then
      if wait_for 120 job_final "$j11" && [ "$(job_state "$j11")" = COMPLETED ] && grep -qx 'client-rc=0' "$work/wedged.out" &&
         grep -q 'runs non-malleable' "$work/wedged.out"; then
        started=$(grep -m1 -E '^[0-9]+\.[0-9]+$' "$work/wedged.out")   # the task's `date`; stderr lines come first
        delay=$(awk -v a="$submitted" -v b="${started:-0}" 'BEGIN { printf "%.1f", b - a }')
        if [ -n "$started" ] && awk -v d="$delay" -v lim="$plugin_bound_s" 'BEGIN { exit !(d >= 0 && d < lim + 40) }'; then
          pass "(11) with malld wedged ($(cat "$work/backlog.out")), job $j11's task started ${delay}s after sbatch (plugin bound ${plugin_bound_s}s) and ran non-malleable: $(grep -m1 'runs non-malleable' "$work/wedged.out")"
        else
          fail "(11) job $j11's task started ${delay}s after sbatch with malld wedged (plugin bound ${plugin_bound_s}s)"
        fi
      else
        fail "(11) job $j11 with malld wedged"; dump_job wedged "$j11"
      fi
    fi
  else
    fail "(11) could not fill malld's backlog: $(cat "$work/backlog.out")"
  fi
  kill "$filler_pid" 2>/dev/null; wait "$filler_pid" 2>/dev/null
  kill -CONT "$malld_pid"
  if wait_for $wait_default_s status_json >/dev/null; then
    pass "(11) malld serves again after SIGCONT"
  else
    fail "(11) malld does not answer after SIGCONT"
  fi
else
  fail "(11) could not stop malld with SIGSTOP (pid file: '${malld_pid}')"
fi

# ---- 6. malld stopped: a --malleable job still runs, the node stays up -----------------------------
# malld --slurm (with its Slurm checker thread) stops cleanly on SIGTERM: it says so, writes its
# state and removes its socket (issue 12: the checker thread used to take SIGTERM and die).
malld_pid=$(cat "$MALL_CLUSTER_DIR/run/malld.pid" 2>/dev/null)
if [ -n "$malld_pid" ] && live "$malld_pid" && kill -TERM "$malld_pid" && wait_for 15 bash -c "! kill -0 $malld_pid 2>/dev/null || [ \"\$(awk '{print \$3}' /proc/$malld_pid/stat 2>/dev/null)\" = Z ]"; then
  note "malld (pid $malld_pid) stopped with SIGTERM"
  if grep -q 'received SIGTERM' "$MALL_CLUSTER_DIR/log/malld.log" && grep -q 'info: stopped$' "$MALL_CLUSTER_DIR/log/malld.log" &&
     [ ! -e "$MALL_SOCKET" ]; then
    pass "(6) malld --slurm stopped cleanly on SIGTERM: $(grep -m1 'received SIGTERM' "$MALL_CLUSTER_DIR/log/malld.log" | sed 's/^.*info: //'), socket removed"
  else
    fail "(6) malld --slurm did not stop cleanly on SIGTERM (socket $( [ -e "$MALL_SOCKET" ] && echo left behind || echo removed)): $(tail -n 3 "$MALL_CLUSTER_DIR/log/malld.log" | tr '\n' '|')"
  fi
  j6=$(submit nodaemon --malleable=1:2 -c 1 --wrap "grep Cpus_allowed_list /proc/self/status; $client --threads 2 --duration-s 0.5; echo client-rc=\$?") ||
    fail "(6) sbatch refused the job while malld is down: $(cat "$work/nodaemon.sbatch.err")"
  if [ -n "${j6:-}" ]; then
    if wait_for 60 job_final "$j6" && [ "$(job_state "$j6")" = COMPLETED ] && grep -qx 'client-rc=0' "$work/nodaemon.out" &&
       grep -q 'runs non-malleable' "$work/nodaemon.out"; then
      pass "(6) job $j6 ran to completion without malld: $(grep -m1 'runs non-malleable' "$work/nodaemon.out")"
    else
      fail "(6) job $j6 without malld"; dump_job nodaemon "$j6"
    fi
    if wait_for $wait_default_s bash -c "[ \"\$(sinfo -h -n '$(hostname -s)' -o %t)\" = idle ]"; then
      pass "(6) sinfo shows the node idle afterwards: $(sinfo -h -N -o '%N %t %E' | tr -s ' ')"
    else
      fail "(6) the node is not idle: $(sinfo -h -N -o '%N %t %E')"
    fi
  fi
else
  fail "(6) could not stop malld (pid file: '${malld_pid}')"
fi

# ---- down, and nothing left -----------------------------------------------------------------------
if [ $failures -gt 0 ]; then
  for f in "$MALL_CLUSTER_DIR"/log/malld.log "$MALL_CLUSTER_DIR"/log/slurmd.log; do
    echo "--- end of $f"; tail -n 30 "$f" 2>/dev/null | sed 's/^/    /'
  done
fi
if [ -n "${MALL_SYSTEST_LOG_DIR:-}" ]; then   # keep the logs, job outputs and events (e.g. for CI artifacts)
  mkdir -p "$MALL_SYSTEST_LOG_DIR" && cp -r "$MALL_CLUSTER_DIR/log" "$work"/*.out "$work"/*.jsonl "$MALL_SYSTEST_LOG_DIR"/ 2>/dev/null
fi
cluster_down_and_nothing_left

note "run time: ${SECONDS}s"
if [ $failures -eq 0 ]; then echo "test_slurm_malleable: all checks passed"; exit 0; fi
echo "test_slurm_malleable: $failures check(s) failed"
exit 1
