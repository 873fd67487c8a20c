#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# test_slurm_smt.sh — proves a plain job's prolog reclaim (malld --slurm looks the job's cores up in
# slurmctld) reserves the Linux cpus Slurm gives the job when slurm.conf describes SMT cores (issue
# 12, defect 4: malld took Slurm's core ids for Linux cpus). A `slurmd -C` wrapper makes
# local-cluster.sh declare this 2-cpu node as 1 core x 2 threads (ThreadsPerCore=2): Slurm's core 0
# is then cpus 0-1, which `scontrol show job -d` prints as CPU_IDs=0-1 and task/affinity binds.
# malld must reserve 0-1 (the old lookup reserved cpu 0 alone) and log that slurm.conf and hwloc
# disagree. Label `system`.
# Usage: test_slurm_smt.sh BUILD_DIR SOURCE_DIR   (ctest passes both; needs root, Slurm, jq)
# Prints one PASS/FAIL line per check; exits non-zero when any check fails. Always brings its
# private cluster down (trap); a watchdog ends the run after MALL_SYSTEST_TIMEOUT_S (default 240).
set -uo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/private_cluster.sh"   # systest_begin, pass, fail, the cluster set-up
systest_begin 240 "$@"   # watchdog (MALL_SYSTEST_TIMEOUT_S), $build/$src/$cluster, root or exit 77
mallctl=$build/bin/mallctl
wait_default_s=30
systest_require "slurmctld slurmd sbatch scontrol scancel jq" "$mallctl" "$build/bin/malld" "$build/lib/mall_spank.so"

private_cluster_init mall-systest-smt 6857
# The plain job's prolog asks malld to look its cores up in slurmctld (plugstack prolog_lookup=yes,
# off by default since issue 39: one RPC per job and node); this test checks that path.
export MALL_CLUSTER_PLUGIN_ARGS=prolog_lookup=yes
cluster_cleanup_traps   # on exit: the cluster down (unless already), $work removed

# local-cluster.sh writes slurm.conf's node line from `slurmd -C`: this one says 1 core x 2 threads.
real_slurmd=$(command -v slurmd)
mkdir -p "$work/path"
cat >"$work/path/slurmd" <<EOF
#!/bin/sh
if [ "\$1" = -C ]; then
  "$real_slurmd" -C | sed 's/SocketsPerBoard=[0-9]* CoresPerSocket=[0-9]* ThreadsPerCore=[0-9]*/SocketsPerBoard=1 CoresPerSocket=1 ThreadsPerCore=2/'
  exit 0
fi
exec "$real_slurmd" "\$@"
EOF
chmod +x "$work/path/slurmd"
export PATH=$work/path:$PATH

if ! "$cluster" up >"$work/up.log" 2>&1; then
  fail "local-cluster.sh up: $(tail -n 5 "$work/up.log")"
  exit 1
fi
eval "$("$cluster" env)"
nodeline=$(grep '^NodeName=' "$MALL_CLUSTER_DIR/etc/slurm.conf")
if grep -q 'CoresPerSocket=1 ThreadsPerCore=2' <<<"$nodeline"; then
  pass "slurm.conf describes the node as one core with two threads: $nodeline"
else
  fail "slurm.conf's node line is not the SMT one: $nodeline"
fi

# A plain job (not --malleable): its prolog sends a Reclaim naming only the owner, malld looks it up.
out=$work/plain.out
j=$(sbatch --parsable -c 1 -o "$out" --wrap 'grep Cpus_allowed_list /proc/self/status; sleep 30' 2>"$work/sbatch.err")
j=${j%%;*}
if [ -z "$j" ]; then
  fail "sbatch refused the job: $(cat "$work/sbatch.err")"
  exit 1
fi
wait_for $wait_default_s test -s "$out"
bound=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' "$out")
cpu_ids=$(scontrol show job -d "$j" | grep -o 'CPU_IDs=[^ ]*')
reserved_for_job() { [ "$(status_json | jq -r --arg j "slurm-$j" '.reserved[$j] // ""')" = "$1" ]; }
if [ "$bound" = 0-1 ] && wait_for $wait_default_s reserved_for_job 0-1; then
  pass "job $j: Slurm gave core 0 ($cpu_ids, task bound to $bound) and malld reserved cpus 0-1 for it"
else
  fail "job $j: Slurm says $cpu_ids, the task is bound to '$bound', malld reserved '$(status_json | jq -c .reserved)' (want 0-1)"
fi
if grep -q "reclaiming cpus 0-1 for slurm-$j (Slurm's allocation on this node)" "$MALL_CLUSTER_DIR/log/malld.log"; then
  pass "the reclaim came from job $j's prolog (malld looked its cores up in Slurm)"
else
  fail "no prolog reclaim of cpus 0-1 for job $j in malld's log: $(grep "slurm-$j" "$MALL_CLUSTER_DIR/log/malld.log" | head -n 3 | tr '\n' ' ')"
fi
if grep -q "Slurm describes this node as 1 socket x 1 core x 2 threads (2 cpus) but hwloc finds 2 cores x 1 thread" "$MALL_CLUSTER_DIR/log/malld.log"; then
  pass "malld logged that slurm.conf and hwloc disagree"
else
  fail "malld did not log the disagreement: $(grep -i 'describes\|warn' "$MALL_CLUSTER_DIR/log/malld.log" | head -n 3 | tr '\n' ' ')"
fi
scancel "$j" 2>/dev/null
wait_for $wait_default_s job_final "$j"

# ---- down, and nothing left -----------------------------------------------------------------------
if [ $failures -gt 0 ]; then
  for f in "$MALL_CLUSTER_DIR"/log/malld.log "$MALL_CLUSTER_DIR"/log/slurmd.log; do
    echo "--- end of $f"; tail -n 30 "$f" 2>/dev/null | sed 's/^/    /'
  done
fi
cluster_down_and_nothing_left

if [ $failures -eq 0 ]; then echo "test_slurm_smt: all checks passed"; exit 0; fi
echo "test_slurm_smt: $failures check(s) failed"
exit 1
