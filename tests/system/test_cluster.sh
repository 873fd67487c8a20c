#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# test_cluster.sh — proves the local Slurm cluster (launch_scripts/local-cluster.sh) works end to end:
# batch jobs and srun steps run, the mall plugin's --malleable shows in the clients' --help (when the
# plugin is built), and `down` leaves no process and no cgroup behind. Label `system`.
# Usage: test_cluster.sh BUILD_DIR SOURCE_DIR   (ctest passes both; needs root and Slurm installed)
# Prints one PASS/FAIL/SKIP line per check; exits non-zero when any check fails. Always brings its
# private cluster down (trap), and a watchdog ends the run after MALL_SYSTEST_TIMEOUT_S (default 480).
set -uo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/private_cluster.sh"   # systest_begin, pass, fail, the cluster set-up
systest_begin 480 "$@"   # watchdog (MALL_SYSTEST_TIMEOUT_S), $build/$src/$cluster, root or exit 77
job_timeout_s=60
for tool in slurmctld slurmd sbatch srun scontrol; do
  command -v "$tool" >/dev/null || { echo "FAIL: $tool not installed: run launch_scripts/install-deps.sh"; exit 1; }
done

# A private cluster: its own folder, cgroup parent and ports (tests/system/private_cluster.sh).
private_cluster_init mall-systest 6817
cluster_down_done=0

cleanup() {
  trap - EXIT INT TERM
  if [ "$cluster_down_done" -eq 0 ]; then "$cluster" down || echo "FAIL: local-cluster.sh down (in the cleanup)"; fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'echo "FAIL: interrupted"; exit 1' INT
trap 'watchdog_fired "$timeout_s"; exit 1' TERM

# ---- up -------------------------------------------------------------------------------------------
t0=$(date +%s%N)
if ! "$cluster" up; then
  fail "local-cluster.sh up"
  for f in "$MALL_CLUSTER_DIR"/log/*; do echo "--- $f"; tail -n 20 "$f"; done
  exit 1
fi
pass "local-cluster.sh up ($(( ($(date +%s%N) - t0) / 1000000 )) ms; port $port, cgroup parent $MALL_CLUSTER_CGROUP)"
eval "$("$cluster" env)"
pids_of_run=$(cat "$MALL_CLUSTER_DIR"/run/*.pid 2>/dev/null | sort -u | tr "\n" " ")

t0=$(date +%s%N)
if second_up=$("$cluster" up 2>&1) && grep -q 'already up' <<<"$second_up"; then
  pass "a second up is a no-op ($(( ($(date +%s%N) - t0) / 1000000 )) ms)"
else
  fail "a second up did not find the cluster running: $second_up"
fi

# ---- helpers --------------------------------------------------------------------------------------
wait_job_done() { # wait_job_done JOBID: polls until a final state; prints it
  local id=$1 state deadline=$(( SECONDS + job_timeout_s ))
  while :; do
    state=$(job_state "$id")
    case $state in
      COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE|PREEMPTED) echo "$state"; return 0 ;;
    esac
    [ $SECONDS -lt $deadline ] || { echo "TIMEOUT_WAITING(${state:-unknown})"; return 1; }
    sleep 0.1
  done
}

# ---- (a) a batch job runs and sees its allowed cpus -----------------------------------------------
out=$work/job-a.out
if jobid=$(sbatch --parsable --output="$out" --wrap 'cat /proc/self/status | grep Cpus_allowed_list' 2>"$work/sbatch-a.err"); then
  jobid=${jobid%%;*}
  state=$(wait_job_done "$jobid")
  if [ "$state" = COMPLETED ] && grep -qE '^Cpus_allowed_list:[[:space:]]+[0-9]' "$out"; then
    pass "(a) sbatch job $jobid COMPLETED; output: $(tr -s '\t ' ' ' <"$out")"
  else
    fail "(a) sbatch job $jobid ended $state; output: $(cat "$out" 2>/dev/null)"
    scontrol show job "$jobid" | sed 's/^/      /'
  fi
else
  fail "(a) sbatch refused the job: $(cat "$work/sbatch-a.err")"
fi

# ---- (b) an srun step ------------------------------------------------------------------------------
if timeout "$job_timeout_s" srun -n1 true >"$work/srun-b.out" 2>&1; then
  pass "(b) srun -n1 true"
else
  fail "(b) srun -n1 true failed: $(cat "$work/srun-b.out")"
fi

# ---- (c) --malleable in the clients' --help (needs the plugin) --------------------------------------
if [ -f "$build/lib/mall_spank.so" ]; then
  for client in sbatch srun salloc; do
    help_text=$("$client" --help 2>&1)   # captured first: grep -q in a pipe would SIGPIPE the client
    if grep -q -- '--malleable' <<<"$help_text"; then
      pass "(c) $client --help lists --malleable: $(grep -m1 -- '--malleable' <<<"$help_text" | sed 's/^ *//')"
    else
      fail "(c) $client --help does not list --malleable (plugstack: $(cat "$MALL_CLUSTER_DIR/etc/plugstack.conf"))"
    fi
  done
else
  fail "(c) --malleable in --help: $build/lib/mall_spank.so is not built (it needs libslurm-dev: run launch_scripts/install-deps.sh, then reconfigure)"
fi

# ---- (d) down leaves nothing behind, even with a job running -----------------------------------------
running_task=''
if jobid=$(sbatch --parsable --output=/dev/null --wrap "echo \$\$ >$work/running.pid; exec sleep 600" 2>"$work/sbatch-d.err"); then
  deadline=$(( SECONDS + job_timeout_s ))
  until [ -s "$work/running.pid" ] || [ $SECONDS -ge $deadline ]; do sleep 0.1; done
  running_task=$(cat "$work/running.pid" 2>/dev/null)
  if [ -n "$running_task" ] && live "$running_task"; then
    echo "      job $jobid runs (task pid $running_task) while the cluster goes down"
  else
    fail "(d) job $jobid did not start within ${job_timeout_s}s (state $(job_state "$jobid"))"
  fi
else
  fail "(d) sbatch refused the long job: $(cat "$work/sbatch-d.err")"
fi
# shellcheck disable=SC2086,SC2046  # word lists of pids
pids_of_run=$(printf '%s\n' $pids_of_run $(run_processes | sed 's/([^)]*)//g') | sort -un | tr '\n' ' ')
cluster_down_done=1
if "$cluster" down; then pass "local-cluster.sh down"; else fail "local-cluster.sh down"; fi
if "$cluster" down >/dev/null; then pass "a second down is a no-op"; else fail "a second down failed"; fi
alive_left=''
for pid in $pids_of_run $running_task; do
  live "$pid" && alive_left+="$pid($(cat "/proc/$pid/comm" 2>/dev/null)) "
done
alive_left+=$(run_processes | tr '\n' ' ')
if [ -z "${alive_left// }" ]; then
  pass "(d) no slurm/munge/malld process or job task of the run remains (were: $pids_of_run $running_task; zombies not yet reaped by init count as gone)"
else
  fail "(d) processes remain after down: $alive_left"
fi
new_cgroups=$(comm -13 <(echo "$cgroups_before") <(cgroups_now) | tr '\n' ' ')
if [ -z "${new_cgroups// }" ]; then
  pass "(d) no $MALL_CLUSTER_CGROUP, mall_cluster or slurm_* cgroup folder was left behind"
else
  fail "(d) cgroup folders remain after down: $new_cgroups"
fi
if [ ! -e "$MALL_CLUSTER_DIR" ]; then pass "(d) the state folder is gone"; else fail "(d) $MALL_CLUSTER_DIR remains"; fi

if [ $failures -eq 0 ]; then echo "test_cluster: all checks passed"; exit 0; fi
echo "test_cluster: $failures check(s) failed"
exit 1
