#!/usr/bin/env bash
# test_slurm_plugin_release.sh — proves that mall's SPANK plugin, built for another Slurm release
# than the one that loads it, says so in words and stays off, and that jobs still run: a private
# cluster whose plugstack.conf loads <build>/lib/mall_spank_other_release.so (mall_spank.cpp built
# with MALL_SPANK_BUILT_FOR naming another release; its plugin_version is this Slurm's, so Slurm's
# loader takes it, as Slurm 24.11's takes any SPANK plugin) and checks, as an admin would:
#   (1) `srun --malleable=1:2` prints "mall_spank.so was built for Slurm X but runs in Slurm Y",
#       that the plugin is disabled and how to rebuild (-DMALL_SLURM_INCLUDE_DIR); the task runs
#       with exit 0, without MALL_JOB_ID;
#   (2) `sbatch --malleable=1:2` prints the same, the job COMPLETES without MALL_JOB_ID, slurmd's log
#       carries the line too, and malld never registered a job;
#   (3) with the right plugin back in plugstack.conf, srun --malleable prints no such line and its
#       task gets MALL_JOB_ID (the check does not fire in the right release);
#   (4) local-cluster.sh down leaves no process, cgroup or state folder.
# Label `system`. Usage: test_slurm_plugin_release.sh BUILD_DIR SOURCE_DIR (ctest passes both; needs
# root, Slurm, jq). One PASS/FAIL line per check; exits non-zero when any check fails. Always brings
# its private cluster down (trap); a watchdog ends the run after MALL_SYSTEST_TIMEOUT_S (default 180).
set -uo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/private_cluster.sh"   # systest_begin, pass, fail, the cluster set-up
systest_begin 180 "$@"   # watchdog (MALL_SYSTEST_TIMEOUT_S), $build/$src/$cluster, root or exit 77
mallctl=$build/bin/mallctl
other=$build/lib/mall_spank_other_release.so
right=$build/lib/mall_spank.so
systest_require "slurmctld slurmd sbatch srun scontrol jq" "$mallctl" "$build/bin/malld" "$right" "$other"

private_cluster_init mall-systest-release 6877
cluster_down_done=0
cleanup() {
  trap - EXIT INT TERM
  if [ "$cluster_down_done" -eq 0 ]; then "$cluster" down >/dev/null || echo "FAIL: local-cluster.sh down (in the cleanup)"; fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'echo "FAIL: interrupted"; exit 1' INT
trap 'watchdog_fired "$timeout_s"; exit 1' TERM

if ! "$cluster" up >"$work/up.log" 2>&1; then
  fail "local-cluster.sh up: $(cat "$work/up.log")"
  exit 1
fi
eval "$("$cluster" env)"
plugstack=$MALL_CLUSTER_DIR/etc/plugstack.conf
use_plugin() { sed -i "s#^\(optional\|required\) [^ ]*mall_spank[^ ]*\.so#\1 $1#" "$plugstack" && grep -qF " $1 " "$plugstack"; }
use_plugin "$other" || { fail "cannot point $plugstack at $other: $(cat "$plugstack")"; exit 1; }
pass "local-cluster.sh up (port $port); plugstack.conf loads $other"
running=$(srun --version 2>/dev/null | awk '{print $2}')
said() { grep -F "was built for Slurm" "$1" | grep -F "but runs in Slurm ${running%.*}" | grep -F "disabled" | grep -qF -- "-DMALL_SLURM_INCLUDE_DIR="; }

# ---- (1) srun ----------------------------------------------------------------------------------------
timeout 60 srun --malleable=1:2 -c 1 sh -c 'echo "job-id=${MALL_JOB_ID:-none}"' >"$work/srun.out" 2>"$work/srun.err"
rc=$?
if [ $rc -eq 0 ] && said "$work/srun.err" && grep -qx 'job-id=none' "$work/srun.out"; then
  pass "(1) srun --malleable ran (exit 0, no MALL_JOB_ID) and said: $(grep -m1 -F 'was built for Slurm' "$work/srun.err")"
else
  fail "(1) srun --malleable: exit $rc, stdout $(tr '\n' '|' <"$work/srun.out"), stderr $(tr '\n' '|' <"$work/srun.err")"
fi

# ---- (2) sbatch --------------------------------------------------------------------------------------
if jb=$(submit batch --malleable=1:2 -c 1 --wrap 'echo "job-id=${MALL_JOB_ID:-none}"'); then
  wait_for 60 job_final "$jb"
  if [ "$(job_state "$jb")" = COMPLETED ] && said "$work/batch.sbatch.err" && grep -qx 'job-id=none' "$work/batch.out" &&
     said "$MALL_CLUSTER_DIR/log/slurmd.log" && [ "$(status_json | jq '.jobs | length')" = 0 ] &&
     ! grep -q 'slurm-' "$MALL_CLUSTER_DIR/log/malld.log"; then
    pass "(2) sbatch --malleable job $jb COMPLETED non-malleable (no MALL_JOB_ID, malld never registered it); sbatch's stderr and slurmd's log carry the line"
  else
    fail "(2) job $jb: $(job_state "$jb"), output $(tr '\n' '|' <"$work/batch.out" 2>/dev/null), sbatch stderr $(tr '\n' '|' <"$work/batch.sbatch.err"), slurmd log line: $(grep -c 'was built for Slurm' "$MALL_CLUSTER_DIR/log/slurmd.log"), malld: $(status_json | jq -c '[.jobs[].job]')"
  fi
else
  fail "(2) sbatch refused the job: $(cat "$work/batch.sbatch.err")"
fi

# ---- (3) the right plugin: no such line --------------------------------------------------------------
use_plugin "$right" || fail "(3) cannot point $plugstack back at $right"
timeout 60 srun --malleable=1:2 -c 1 sh -c 'echo "job-id=${MALL_JOB_ID:-none}"' >"$work/srun-right.out" 2>"$work/srun-right.err"
rc=$?
if [ $rc -eq 0 ] && ! grep -q 'was built for Slurm' "$work/srun-right.err" && grep -qE '^job-id=slurm-[0-9]+$' "$work/srun-right.out"; then
  pass "(3) with $right: srun --malleable says nothing of releases and its task is $(cat "$work/srun-right.out")"
else
  fail "(3) with $right: exit $rc, stdout $(tr '\n' '|' <"$work/srun-right.out"), stderr $(tr '\n' '|' <"$work/srun-right.err")"
fi

# ---- (4) down ----------------------------------------------------------------------------------------
cluster_down_and_nothing_left
[ "$failures" -eq 0 ] || exit 1
