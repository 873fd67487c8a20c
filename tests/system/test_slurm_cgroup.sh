#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# test_slurm_cgroup.sh — mall under Slurm's own cgroup plugins (issue 13, Slurm point): a private
# cluster with proctrack/cgroup + task/cgroup (local-cluster.sh up --cgroup-plugins cgroup; cgroup/v1
# on the host, cgroup/v2 in the qemu guest of ctest's vm.slurm_cgroup_v2) and checks, as a user
# would with /proc, mallctl and scancel, that
#   (1) the cluster runs Slurm's cgroup plugins;
#   (2) a --malleable task registers where Slurm put it: its /proc/PID/cgroup is Slurm's step
#       cgroup, and mallctl status --json names that cgroup with in_place true;
#   (3) a lone --malleable=1:2 job grows to 0-1 in place: Slurm's cgroup holds cpus 0-1, every
#       thread of the task allows 0-1, and the task is still in Slurm's cgroup;
#   (4) a plain job arriving makes it shrink (malld's enforce event) before the plain job's task
#       runs, in Slurm's cgroup, which then holds the job's own core only;
#   (5) scancel kills every process of the job (also one that left its session and parent) and
#       leaves no registration in malld and no cgroup of the job, Slurm's or malld's;
#   (6) an srun step inside a grown --malleable job runs (Slurm's task/cgroup rewrites the job
#       cgroup's cpus for each new step: cgroup v1 refuses that while the grown step is wider, so
#       the plugin narrows the job first), in Slurm's step cgroup, and the job grows back after;
#       scancel then ends it as in (5);
#   (7) local-cluster.sh down leaves no process, cgroup or state folder.
# Label `system` (and `vm` for the guest run). Usage: test_slurm_cgroup.sh BUILD_DIR SOURCE_DIR
# (ctest passes both; needs root, Slurm, jq). One PASS/FAIL line per check; exits non-zero when any
# check fails. Always brings its private cluster down (trap); a watchdog ends the run after
# MALL_SYSTEST_TIMEOUT_S (default 240). MALL_SYSTEST_LOG_DIR=DIR keeps the cluster's logs and the
# jobs' outputs. Every wait polls with a deadline; a fixed sleep is only a sampling interval.
set -uo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/private_cluster.sh"   # systest_begin, pass, fail, the cluster set-up
systest_begin 240 "$@"   # watchdog (MALL_SYSTEST_TIMEOUT_S), $build/$src/$cluster, root or exit 77
mallctl=$build/bin/mallctl
client=$build/bin/mall_test_client
wait_default_s=${MALL_SYSTEST_WAIT_S:-30}   # each wait normally ends in a second (minutes in the guest)
systest_require "slurmctld slurmd sbatch srun scontrol squeue scancel jq" "$mallctl" "$client" "$build/bin/malld" "$build/lib/mall_spank.so"
guest_setup_for_slurm   # in the qemu guest only: /dev/fd, a host name, an address Slurm can resolve

private_cluster_init mall-systest-cgroup 6867
cluster_down_done=0
escapee=''
cleanup() {
  trap - EXIT INT TERM
  if [ "$cluster_down_done" -eq 0 ]; then "$cluster" down >/dev/null || echo "FAIL: local-cluster.sh down (in the cleanup)"; fi
  if [ -n "$escapee" ]; then pkill -KILL -x -f "sleep $escapee" 2>/dev/null; fi   # only if (5) failed
  rm -rf "$work"
}
trap cleanup EXIT
trap 'echo "FAIL: interrupted"; exit 1' INT
trap 'watchdog_fired "$timeout_s"; exit 1' TERM

# ---- helpers --------------------------------------------------------------------------------------
node=$(hostname -s)
job_field() { status_json | jq -r --arg j "$1" --arg f "$2" '.jobs[] | select(.job == $j) | .[$f] | tostring' 2>/dev/null; }
job_listed() { [ -n "$(job_field "$1" job)" ]; }
reserved_for() { status_json | jq -r --arg j "$1" '.reserved[$j] // ""' 2>/dev/null; }
job_settled_on() { # job_settled_on JOB CPUS: published and enforced on exactly CPUS, nothing pending
  local s; s=$(status_json) || return 1
  [ "$(jq -r --arg j "$1" '.jobs[] | select(.job == $j) | "\(.cpus) \(.cpuset) \(.state)"' <<<"$s")" = "$2 $2 settled" ]
}
job_gone_and_released() { ! job_listed "$1" && [ -z "$(reserved_for "$1")" ]; }
# Where a process lives in the cpuset hierarchy Slurm uses: v1 the cpuset line of /proc/PID/cgroup,
# v2 its only line; the path is relative to $mount.
proc_cgroup() { cgroup_of_lines <"/proc/$1/cgroup" 2>/dev/null; }
cgroup_of_lines() { # the same, from /proc/PID/cgroup lines on stdin
  if [ "$version" = v1 ]; then sed -n 's/^[0-9]*:cpuset://p'; else sed -n 's/^0:://p'; fi
}
# A job's own report of its cgroup: the lines its task printed with "PREFIX " before each line of
# its /proc/self/cgroup (job_cgroup_report PREFIX FILE).
job_cgroup_report() { sed -n "s/^$1 //p" "$2" | cgroup_of_lines; }
# Slurm's step cgroup of job $1, step $2 (batch, 0, ...), as a pattern of /proc/PID/cgroup paths.
slurm_step_pattern() {
  if [ "$version" = v1 ]; then echo "^/slurm_$node/uid_0/job_$1/step_$2\$"
  else echo "^/system.slice/${node}_slurmstepd.scope/job_$1/step_$2/user/task_(special|[0-9]+)\$"; fi
}
cgroup_cpus() { # the cpus a cgroup folder applies (v1 cpuset.cpus, v2 cpuset.cpus.effective)
  if [ "$version" = v1 ]; then cat "$1/cpuset.cpus" 2>/dev/null; else cat "$1/cpuset.cpus.effective" 2>/dev/null; fi
}
# The job's cgroup folders, Slurm's (in every hierarchy) and malld's own; one a line.
job_cgroups_left() {
  local id=$1
  {
    find /sys/fs/cgroup -maxdepth 5 -type d -path "*/slurm_$node/uid_*/job_$id" 2>/dev/null
    find /sys/fs/cgroup -maxdepth 4 -type d -path "*_slurmstepd.scope/job_$id" 2>/dev/null
    find /sys/fs/cgroup -maxdepth 3 -type d -path "*/$MALL_CLUSTER_CGROUP/job_slurm-$id" 2>/dev/null
  } | sort -u
}
no_job_cgroups_left() { [ -z "$(job_cgroups_left "$1")" ]; }
job_processes() { # job_processes JOB: every pid in Slurm's cgroups of JOB (all hierarchies), one a line
  job_cgroups_left "$1" | grep -v "/$MALL_CLUSTER_CGROUP/" | while read -r d; do
    find "$d" -name cgroup.procs -type f -exec cat {} + 2>/dev/null
  done | sort -un
}
none_alive() { local p; for p in "$@"; do live "$p" && return 1; done; return 0; }
enforce_events() { # enforce_events JOB: malld's enforce events for JOB, from its log, one JSON a line
  sed -n 's/^.* info: event //p' "$MALL_CLUSTER_DIR/log/malld.log" | jq -c --arg j "$1" 'select(.event == "enforce" and .job == $j)' 2>/dev/null
}
earlier() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a + 0 < b + 0) }'; }
dump_job() { # dump_job NAME ID: what helps to understand a failure
  note "--- job $2 ($1): state $(job_state "$2"); output:"; sed 's/^/        /' "$work/$1.out" 2>/dev/null | tail -n 15
  note "--- malld status: $(status_json | jq -c '{reserved, jobs: [.jobs[] | {job, cpus, cpuset, state, pids, cgroups}]}' 2>/dev/null)"
}
client_cmd() { echo "$client --threads 2 --step-us 2000 --duration-s 300"; }

# ---- (1) up with Slurm's cgroup plugins ------------------------------------------------------------
if ! "$cluster" up --cgroup-plugins cgroup >"$work/up.log" 2>&1; then
  fail "(1) local-cluster.sh up --cgroup-plugins cgroup: $(cat "$work/up.log")"
  for f in "$MALL_CLUSTER_DIR"/log/*; do echo "--- $f"; tail -n 20 "$f"; done
  exit 1
fi
eval "$("$cluster" env)"
version=$(sed -n 's|^CgroupPlugin=cgroup/||p' "$MALL_CLUSTER_DIR/etc/cgroup.conf" 2>/dev/null)
if [ "$version" = v1 ]; then mount=/sys/fs/cgroup/cpuset; else mount=/sys/fs/cgroup; fi
if grep -qx 'ProctrackType=proctrack/cgroup' "$SLURM_CONF" && grep -qx 'TaskPlugin=task/cgroup,task/affinity' "$SLURM_CONF" &&
   grep -qx 'ConstrainCores=yes' "$MALL_CLUSTER_DIR/etc/cgroup.conf" && [[ $version == v[12] ]] &&
   [ "$(stat -f -c %T /sys/fs/cgroup/)" = "$( [ "$version" = v2 ] && echo cgroup2fs || echo tmpfs)" ]; then
  pass "(1) local-cluster.sh up --cgroup-plugins cgroup (port $port): proctrack/cgroup, task/cgroup,task/affinity, CgroupPlugin=cgroup/$version, ConstrainCores=yes"
else
  fail "(1) the cluster's configuration: $(grep -E '^(ProctrackType|TaskPlugin)=' "$SLURM_CONF" | tr '\n' ' ') cgroup.conf: $(tr '\n' ' ' <"$MALL_CLUSTER_DIR/etc/cgroup.conf" 2>/dev/null)"
fi

# ---- (2) job A registers in Slurm's step cgroup ---------------------------------------------------
# Its shell first starts a process that leaves its session and its parent (setsid in a subshell
# that exits): only a cgroup finds it for scancel (5).
escapee=$(( 7000000 + $$ % 1000000 ))
ja=$(submit first --malleable=1:2 -c 1 --wrap "(setsid sleep $escapee </dev/null >/dev/null 2>&1 &); exec $(client_cmd)") ||
  { fail "(2) sbatch refused job A: $(cat "$work/first.sbatch.err")"; exit 1; }
if ! wait_for "$wait_default_s" job_listed "slurm-$ja"; then
  fail "(2) job $ja was not registered with malld within ${wait_default_s}s"; dump_job first "$ja"; exit 1
fi
a_pid=$(job_field "slurm-$ja" pids | jq -r '.[0]')
a_cg=$(proc_cgroup "$a_pid")
# Slurm's step cgroup of job A, where Slurm put the task (checks 3 and 4 look there even when the
# task is elsewhere): v1 the step folder; v2 the task's leaf below it (task_special without
# memory or accounting cgroups, else task_<n>).
if [[ $a_cg =~ $(slurm_step_pattern "$ja" batch) ]]; then
  a_slurm_cg=$a_cg
elif [ "$version" = v1 ]; then
  a_slurm_cg=/slurm_$node/uid_0/job_$ja/step_batch
else
  a_slurm_cg=$(cd "$mount" && find "system.slice/${node}_slurmstepd.scope/job_$ja/step_batch/user" -mindepth 1 -maxdepth 1 -type d -name 'task_*' 2>/dev/null | sort | head -n1)
  a_slurm_cg=/${a_slurm_cg:-system.slice/${node}_slurmstepd.scope/job_$ja/step_batch/user/task_special}
fi
a_dir=$mount$a_slurm_cg
a_status=$(status_json | jq -c --arg j "slurm-$ja" '.jobs[] | select(.job == $j) | {cgroup, cgroups}')
if [[ $a_cg =~ $(slurm_step_pattern "$ja" batch) ]] &&
   [ "$a_status" = "$(jq -nc --arg p "$a_dir" '{cgroup: $p, cgroups: [{in_place: true, path: $p}]}')" ]; then
  pass "(2) job $ja's task (pid $a_pid) lives in Slurm's step cgroup $a_cg, and mallctl status --json says $a_status"
else
  fail "(2) job $ja's task (pid $a_pid) is in '$a_cg' (Slurm's step cgroup would match $(slurm_step_pattern "$ja" batch)); mallctl status --json: $a_status"
fi

# ---- (3) alone, job A grows to 0-1 in Slurm's cgroup ----------------------------------------------
# 3 threads: the main one and the 2 workers (each bound with mall_bind_thread).
if wait_for "$wait_default_s" job_settled_on "slurm-$ja" 0-1 && wait_for 10 all_threads_on "$a_pid" 3 0-1 &&
   [ "$(cgroup_cpus "$a_dir")" = 0-1 ] && [ "$(proc_cgroup "$a_pid")" = "$a_slurm_cg" ]; then
  pass "(3) job $ja grew to 0-1 in place: Slurm's $a_dir holds $(cgroup_cpus "$a_dir"), threads $(threads_lists "$a_pid"), the task still in it"
else
  fail "(3) job $ja did not grow to 0-1 in Slurm's cgroup: malld $(job_field "slurm-$ja" cpuset), Slurm's $a_dir holds '$(cgroup_cpus "$a_dir")', threads $(threads_lists "$a_pid"), task in '$(proc_cgroup "$a_pid")'"
  dump_job first "$ja"
fi
own=$(job_field "slurm-$ja" guaranteed)   # the core Slurm gave job A; the plain job gets the other
case $own in 0) other=1 ;; 1) other=0 ;; *) fail "(3) job $ja's guaranteed cpus in malld are '$own', not cpu 0 or 1"; exit 1 ;; esac

# ---- (4) a plain job arrives: job A shrinks before the plain job's task runs -----------------------
jp=$(submit plain -c 1 --wrap "date +%s.%N; sed 's/^/cgroup-line /' /proc/self/cgroup; grep Cpus_allowed_list /proc/self/status; exec sleep 300") ||
  { fail "(4) sbatch refused the plain job: $(cat "$work/plain.sbatch.err")"; exit 1; }
if wait_for "$wait_default_s" grep -q Cpus_allowed_list "$work/plain.out" && wait_for 10 job_settled_on "slurm-$ja" "$own"; then
  p_start=$(grep -m1 -E '^[0-9]+\.[0-9]+$' "$work/plain.out")
  narrowed=$(enforce_events "slurm-$ja" | jq -r 'select(.growing == false) | .time' | head -n1)
  p_cg=$(job_cgroup_report cgroup-line "$work/plain.out")
  if [ -n "$narrowed" ] && earlier "$narrowed" "$p_start" && [ "$(cgroup_cpus "$a_dir")" = "$own" ] &&
     all_threads_on "$a_pid" 3 "$own" && [ "$(proc_cgroup "$a_pid")" = "$a_slurm_cg" ] &&
     [[ $p_cg =~ $(slurm_step_pattern "$jp" batch) ]] && grep -qx "Cpus_allowed_list:[[:space:]]*$other" "$work/plain.out"; then
    pass "(4) job $ja narrowed to cpu $own at $narrowed, before plain job $jp's task started at $p_start (in $p_cg on cpu $other); Slurm's $a_dir holds $own, job $ja's task still in it"
  else
    fail "(4) job $ja's narrowing (enforce at ${narrowed:-never}) vs plain job $jp's task start (${p_start:-?}): $a_dir holds '$(cgroup_cpus "$a_dir")', threads $(threads_lists "$a_pid"), task in '$(proc_cgroup "$a_pid")'; plain task: $(tr '\n' '|' <"$work/plain.out")"
  fi
else
  fail "(4) plain job $jp did not start, or job $ja did not settle on cpu $own, within the deadline"
  dump_job plain "$jp"; dump_job first "$ja"
fi

# ---- (5) scancel: every process gone, no registration, no cgroup ----------------------------------
esc_pid=$(pgrep -x -f "sleep $escapee" | head -n1)
a_esc_cg=$( [ -n "$esc_pid" ] && proc_cgroup "$esc_pid")
a_all=$(job_processes "$ja" | tr '\n' ' ')
scancel "$jp" "$ja"
# shellcheck disable=SC2086  # a list of pids
if [ -n "$esc_pid" ] && wait_for "$wait_default_s" job_final "$ja" && wait_for "$wait_default_s" none_alive "$a_pid" "$esc_pid" $a_all &&
   wait_for "$wait_default_s" job_gone_and_released "slurm-$ja" && wait_for "$wait_default_s" no_job_cgroups_left "$ja"; then
  pass "(5) scancel $ja: every process in its cgroups ($a_all) is gone, with its task $a_pid and pid $esc_pid (setsid, reparented, in $a_esc_cg), malld lists and reserves nothing for slurm-$ja, no cgroup of job $ja is left"
else
  fail "(5) after scancel $ja ($(job_state "$ja")): alive: $(for p in $a_pid ${esc_pid:-} $a_all; do live "$p" && printf '%s ' "$p"; done)(escapee pid '${esc_pid}'), malld: $(status_json | jq -c '{reserved, jobs: [.jobs[].job]}'), cgroups left: $(job_cgroups_left "$ja" | tr '\n' ' ')"
fi
escapee_left=$(pgrep -x -f "sleep $escapee")
[ -z "$escapee_left" ] && escapee=''
wait_for "$wait_default_s" job_final "$jp" || fail "(5) plain job $jp did not end after scancel ($(job_state "$jp"))"

# ---- (6) an srun step inside a grown --malleable job ------------------------------------------------
# Job B's batch shell is its registered task; the client it starts attaches as part of the job.
# Once malld has grown the job (the shell's own cpus widen with Slurm's cgroup), the shell runs a step.
cat >"$work/stepjob.sh" <<EOF
#!/bin/bash
$(client_cmd) &
for i in \$(seq 1 1200); do grep -qx 'Cpus_allowed_list:[[:space:]]*0-1' /proc/\$\$/status && break; sleep 0.05; done
echo "before-step \$(date +%s.%N) \$(grep Cpus_allowed_list /proc/\$\$/status)"
srun -n1 sh -c 'sed "s/^/step-cgroup /" /proc/self/cgroup; echo step-ran'
echo "srun-rc=\$?"
wait
EOF
jb=$(submit stepjob --malleable=1:2 -c 1 "$work/stepjob.sh") || { fail "(6) sbatch refused job B: $(cat "$work/stepjob.sbatch.err")"; exit 1; }
if wait_for "$wait_default_s" grep -q '^srun-rc=' "$work/stepjob.out"; then
  s_cg=$(job_cgroup_report step-cgroup "$work/stepjob.out")
  b_shell=$(job_field "slurm-$jb" pids | jq -r '.[0]' 2>/dev/null)
  b_dir=$mount$(proc_cgroup "$b_shell")
  b_grown() { job_settled_on "slurm-$jb" 0-1 && [ "$(cgroup_cpus "$b_dir")" = 0-1 ]; }
  if grep -q 'before-step .*0-1$' "$work/stepjob.out" && grep -qx step-ran "$work/stepjob.out" &&
     [[ $s_cg =~ $(slurm_step_pattern "$jb" 0) ]] && [[ ${b_dir#"$mount"} =~ $(slurm_step_pattern "$jb" batch) ]] &&
     wait_for "$wait_default_s" b_grown; then
    pass "(6) job $jb, grown to 0-1, ran an srun step (its task in Slurm's $s_cg) and holds 0-1 again, also in Slurm's $b_dir: $(grep -m1 'job '"$jb"': narrowed' "$MALL_CLUSTER_DIR/log/slurmd.log" | sed 's/^.*mall: //')"
  else
    fail "(6) job $jb's srun step: $(tr '\n' '|' <"$work/stepjob.out"); malld: $(job_field "slurm-$jb" cpuset), $b_dir holds '$(cgroup_cpus "$b_dir")'; slurmd: $(grep "\[$jb\.0\]" "$MALL_CLUSTER_DIR/log/slurmd.log" | grep -iE 'error|mall' | tail -n 3 | tr '\n' '|')"
  fi
else
  fail "(6) job $jb's step did not run within ${wait_default_s}s"; dump_job stepjob "$jb"
fi
b_all=$(job_processes "$jb" | tr '\n' ' ')
scancel "$jb"
# shellcheck disable=SC2086  # a list of pids
if [ -n "${b_all// }" ] && wait_for "$wait_default_s" job_final "$jb" && wait_for "$wait_default_s" none_alive $b_all &&
   wait_for "$wait_default_s" job_gone_and_released "slurm-$jb" && wait_for "$wait_default_s" no_job_cgroups_left "$jb"; then
  pass "(6) scancel $jb: every process in its cgroups ($b_all) is gone, malld lists and reserves nothing for slurm-$jb, no cgroup of job $jb is left"
else
  fail "(6) after scancel $jb ($(job_state "$jb")): alive: $(for p in $b_all; do live "$p" && printf '%s ' "$p"; done), malld: $(status_json | jq -c '{reserved, jobs: [.jobs[].job]}'), cgroups left: $(job_cgroups_left "$jb" | tr '\n' ' ')"
fi

# ---- (7) down, and nothing left --------------------------------------------------------------------
if [ $failures -gt 0 ]; then
  for f in "$MALL_CLUSTER_DIR"/log/malld.log "$MALL_CLUSTER_DIR"/log/slurmd.log; do
    echo "--- end of $f"; tail -n 30 "$f" 2>/dev/null | sed 's/^/    /'
  done
fi
if [ -n "${MALL_SYSTEST_LOG_DIR:-}" ]; then   # keep the logs and job outputs (e.g. for CI artifacts)
  mkdir -p "$MALL_SYSTEST_LOG_DIR" && cp -r "$MALL_CLUSTER_DIR/log" "$work"/*.out "$MALL_SYSTEST_LOG_DIR"/ 2>/dev/null
fi
cluster_down_and_nothing_left "${escapee_left:-}"

note "run time: ${SECONDS}s"
if [ $failures -eq 0 ]; then echo "test_slurm_cgroup: all checks passed"; exit 0; fi
echo "test_slurm_cgroup: $failures check(s) failed"
exit 1
