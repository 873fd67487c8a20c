#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# test_slurm_mpi.sh — proves that the MPI example (mall_train_mpi, libmall_mpi) runs under the real
# local Slurm cluster (launch_scripts/local-cluster.sh with the mall SPANK plugin and malld --slurm):
# `sbatch --malleable=1:2 -n2` with `srun --mpi=pmix -n2 mall_train_mpi`: both tasks join one malld
# job slurm-<id>, each rank finds the other as a sharer of that job and runs on its own slice of
# its cpus, the ranks train to identical weights, the job completes, and malld is left with no job
# and nothing reserved. Label `system`.
# Usage: test_slurm_mpi.sh BUILD_DIR SOURCE_DIR   (ctest passes both; needs root, Slurm, Open MPI, jq)
# Prints one PASS/FAIL line per check; exits non-zero when any check fails, 77 (skip) when not root.
# Always brings its private cluster down (trap); a watchdog ends the run after MALL_SYSTEST_TIMEOUT_S
# (default 300). MALL_SYSTEST_LOG_DIR=DIR keeps the cluster's logs and the job's output there.
set -uo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/private_cluster.sh"   # systest_begin, pass, fail, the cluster set-up
systest_begin 300 "$@"
mallctl=$build/bin/mallctl
trainer=$build/bin/mall_train_mpi
systest_require "slurmctld slurmd sbatch srun scontrol scancel jq" "$mallctl" "$trainer" "$build/bin/malld" "$build/lib/mall_spank.so"

private_cluster_init mall-systest-mpi 6847
cluster_cleanup_traps   # on exit: the cluster down (unless already), $work removed

job_view() { status_json | jq -c --arg j "$1" '.jobs[] | select(.job == $j) | {cpus, cpuset, state, attached, npids: (.pids | length)}' 2>/dev/null; }
change_lines() { grep -E '^rank [0-9]+ change step ' "$work/mpi.out" 2>/dev/null; }
dump_job() {
  note "--- job $1: state $(job_state "$1"); output:"; sed 's/^/        /' "$work/mpi.out" 2>/dev/null | tail -n 20
  note "--- malld status: $(status_json | jq -c '{reserved, jobs: [.jobs[] | {job, cpus, cpuset, state, pids, attached}]}' 2>/dev/null)"
}

# ---- up -------------------------------------------------------------------------------------------
if ! "$cluster" up >"$work/up.log" 2>&1; then
  fail "local-cluster.sh up: $(cat "$work/up.log")"
  exit 1
fi
eval "$("$cluster" env)"
pass "local-cluster.sh up (port $port, cgroup parent $MALL_CLUSTER_CGROUP)"

# ---- the job: two ranks, one malld job --------------------------------------------------------------
# The ranks train until rank 0 sees the stop file (all ranks stop at one step), at most 120 s.
stop_file=$work/stop
id=$(sbatch --parsable --job-name=mpi --output="$work/mpi.out" --malleable=1:2 -n 2 \
       --wrap "srun --mpi=pmix -n 2 $trainer --steps 100000000 --print-every 0 --log-changes --stop-file $stop_file --max-seconds 120; echo srun-rc=\$?" \
       2>"$work/sbatch.err")
id=${id%%;*}
if [ -z "$id" ]; then fail "sbatch refused the job: $(cat "$work/sbatch.err")"; exit 1; fi
job=slurm-$id

# The batch step registers too (its shell is a task of the job: 3 pids), only the ranks attach.
two_ranks_attached() { [ "$(job_view "$job")" = '{"cpus":"0-1","cpuset":"0-1","state":"settled","attached":2,"npids":3}' ]; }
if wait_for 60 two_ranks_attached; then
  pass "both tasks of job $id joined malld job $job and attached: $(job_view "$job")"
else
  fail "job $id's tasks did not both attach to $job on 0-1: $(job_view "$job")"; dump_job "$id"
fi

# Each rank applied its first allocation: 2 sharers of the node job, one cpu each, different cpus.
two_change_lines() { [ "$(change_lines | grep -c ' step 1 ')" -ge 2 ]; }
if wait_for 30 two_change_lines; then
  r0=$(change_lines | grep -m1 '^rank 0 change step 1 ')
  r1=$(change_lines | grep -m1 '^rank 1 change step 1 ')
  c0=${r0##* cpus }; c1=${r1##* cpus }
  if [[ $r0 == *"-> 1 share 1 cap 0 sharers 2 cpus"* && $r1 == *"-> 1 share 1 cap 0 sharers 2 cpus"* ]] &&
     [ "$(printf '%s\n' "$c0" "$c1" | sort | tr '\n' ' ')" = "0 1 " ]; then
    pass "the ranks share $job (sharers 2), one thread each, on cpus $c0 and $c1: '$r0' / '$r1'"
  else
    fail "unexpected first changes: '$r0' / '$r1'"
  fi
else
  fail "the ranks did not both log their first allocation"; dump_job "$id"
fi

# ---- stop, results --------------------------------------------------------------------------------
touch "$stop_file"
if wait_for 90 job_final "$id" && [ "$(job_state "$id")" = COMPLETED ] && grep -qx 'srun-rc=0' "$work/mpi.out"; then
  pass "job $id completed, srun exit 0"
else
  fail "job $id did not complete cleanly ($(job_state "$id"))"; dump_job "$id"
fi
sums=$(sed -n 's/^rank [0-9]* final .* checksum \([0-9a-f]*\)$/\1/p' "$work/mpi.out" | sort -u)
finals=$(grep -c '^rank [0-9]* final ' "$work/mpi.out")
if [ "$finals" -eq 2 ] && [ "$(wc -w <<<"$sums")" -eq 1 ]; then
  pass "both ranks trained to the same weights (checksum $sums): $(grep -m1 '^rank 0 final ' "$work/mpi.out")"
else
  fail "final lines: $finals, distinct checksums: '$sums'"; dump_job "$id"
fi
# "rank R final loss X first_loss Y ...": X ($5) below Y ($7)
if awk '/^rank [0-9]+ final loss/ { if (!($5 + 0 < $7 + 0)) bad = 1; n++ } END { exit !(n == 2 && !bad) }' "$work/mpi.out"; then
  pass "the loss went down on every rank"
else
  fail "the loss did not go down: $(grep '^rank [0-9]* final ' "$work/mpi.out" | tr '\n' '|')"
fi
if wait_for 30 bash -c "[ \"\$('$mallctl' status --json | jq -c '[.jobs, .reserved]')\" = '[[],{}]' ]"; then
  pass "malld lists no job and reserves nothing afterwards"
else
  fail "malld after the job: $(status_json | jq -c '{reserved, jobs: [.jobs[].job]}')"
fi

# ---- down, and nothing left -----------------------------------------------------------------------
if [ -n "${MALL_SYSTEST_LOG_DIR:-}" ]; then
  mkdir -p "$MALL_SYSTEST_LOG_DIR" && cp -r "$MALL_CLUSTER_DIR/log" "$work"/*.out "$MALL_SYSTEST_LOG_DIR"/ 2>/dev/null
fi
if [ $failures -gt 0 ]; then "$cluster" logs 20 2>/dev/null | sed 's/^/    /'; fi
cluster_down_and_nothing_left "$(pgrep -f "^$trainer .*--stop-file $stop_file" | tr '\n' ' ')"

note "run time: ${SECONDS}s"
if [ $failures -eq 0 ]; then echo "test_slurm_mpi: all checks passed"; exit 0; fi
echo "test_slurm_mpi: $failures check(s) failed"
exit 1
