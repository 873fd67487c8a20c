#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# test_slurm_scale.sh — issue 39, mall at cluster scale: a 64-node Slurm cluster
# (launch_scripts/local-cluster.sh up --nodes 64: node1..node64, each in network, UTS and mount
# namespaces of its own with its own slurmd and malld --slurm, the mall SPANK plugin), filled as a
# user would fill it, and checked as a user would check it. Every node declares this machine's 2
# cpus, so each node has 2 Slurm cores (128 core slots):
#  - 8 multi-node malleable jobs `sbatch -N8 --ntasks-per-node=1 -c1 --malleable=1:2` over nodes
#    1-8, 9-16, ..., 57-64, one task per node: the first runs an MPI program over its 8 nodes
#    (srun --mpi=pmix mall_train_mpi, balanced mode), the others mall_test_client (64 computing MPI
#    ranks on 2 cpus would starve the daemons; one MPI job keeps PMIx and mall_mpi at 8 nodes);
#  - 48 single-node malleable jobs (`-w nodeK -c1 --malleable=1:2`) on nodes 17-64, on the second core.
# Checks, one PASS/FAIL line each:
#  (a) every malleable job is listed, settled and attached at the malld of every node it spans, with
#      the allocation its task's threads allow (Cpus_allowed_list of every thread of every task); on
#      nodes 1-16 the -N8 job's task borrowed the idle core (0-1), on nodes 17-64 each job holds
#      exactly its Slurm core;
#  (b) a plain job (`sbatch -w nodeK -c1`) on each of nodes 1-16 gets its core back before its task
#      starts: its first command prints its own Cpus_allowed_list and the borrower's threads' lists,
#      and none of them holds the plain job's core (the node's malld logs the reclaim, which the
#      plugin sends as the plain job's step starts: the plugin's defaults, no prolog lookup); the MPI
#      job's ranks shrink at the same steps, and it then completes (srun exit 0, one checksum) with
#      each of its 8 nodes' last figures in its AdminComment;
#  (c) the mallds of nodes 17-24 killed at once (SIGKILL): `up --nodes 64` restarts only those 8,
#      each re-adopts its jobs with the same allocation (tasks' threads untouched, re-attached), and
#      a re-adopted job still resizes (it grows into a freed core, mallctl set shrinks and frees it);
#  (d) steady state: over a 120 s window without any Slurm client call by the test, slurmctld
#      (sdiag) counts 0 RPCs of the types malld and the plugin send (REQUEST_JOB_INFO_SINGLE,
#      REQUEST_FED_INFO, REQUEST_UPDATE_JOB, REQUEST_NODE_INFO_SINGLE, REQUEST_NODE_INFO,
#      REQUEST_JOB_INFO); the whole by-type table is printed;
#  (e) scancel of every job leaves no registration, reservation or cgroup on any node; down leaves
#      no process, cgroup or folder.
# Label `system`. Prints the time of each phase; about 4 minutes on the project's 2-cpu machine (up
# 9 s, jobs attached ~25 s, checks (a)-(c) ~1 min, the window 2 min, scancel and down ~30 s).
# Usage: test_slurm_scale.sh BUILD_DIR SOURCE_DIR   (ctest passes both; needs root, Slurm, Open MPI,
# jq, unshare/nsenter/ip). Exits non-zero when any check fails, 77 (skip) when not root. Always
# brings its private cluster down (trap); a watchdog ends the run after MALL_SYSTEST_TIMEOUT_S
# (default 420). MALL_SYSTEST_SCALE_WINDOW_S changes the steady window (default 120; for
# development only). MALL_SYSTEST_LOG_DIR=DIR keeps the cluster's logs and the jobs' outputs there.
# Every wait polls with a deadline.
set -uo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/private_cluster.sh"   # systest_begin, pass, fail, the cluster set-up
systest_begin 420 "$@"   # watchdog (MALL_SYSTEST_TIMEOUT_S), $build/$src/$cluster, root or exit 77
mallctl=$build/bin/mallctl
client=$build/bin/mall_test_client
trainer=$build/bin/mall_train_mpi
nodes=64
group=8                                          # nodes per multi-node job
lenders=16                                       # nodes 1-16: the -N8 job's task borrows the idle core
window_s=${MALL_SYSTEST_SCALE_WINDOW_S:-120}
restarted_nodes=$(seq 17 24)                     # (c): their mallds are killed at once
# The RPC types malld (--slurm) and the plugin send to slurmctld: libslurm's slurm_load_job (which
# also loads the federation), slurm_load_jobs, slurm_update_job, slurm_load_node_single, slurm_load_node.
mall_types='REQUEST_JOB_INFO_SINGLE REQUEST_FED_INFO REQUEST_UPDATE_JOB REQUEST_NODE_INFO_SINGLE REQUEST_NODE_INFO REQUEST_JOB_INFO'
systest_require "slurmctld slurmd sbatch srun scontrol squeue scancel sinfo sdiag jq unshare nsenter ip" \
  "$mallctl" "$client" "$trainer" "$build/bin/malld" "$build/lib/mall_spank.so"

export MALL_CLUSTER_TIMEOUT_S=${MALL_CLUSTER_TIMEOUT_S:-60}   # up/down wait for 64 nodes at a time
private_cluster_init mall-systest-scale 6867   # folder, cgroup parent (the ports are unused: namespaces)
cluster_cleanup_traps   # on exit: the cluster down (unless already), $work removed

# ---- helpers (K is a node number) -----------------------------------------------------------------
# Node K (a number) through private_cluster.sh's per-node helpers (which take its name, nodeK).
sock() { node_sock "node$1"; }
nctl() { local k=$1; shift; node_ctl "node$k" "$@"; }
nstatus() { node_status "node$1"; }
job_field() { node_job_field "node$1" "$2" "$3"; }
reserved_for() { node_reserved_for "node$1" "$2"; }
job_settled_on() { node_job_settled_on "node$1" "$2" "$3"; }   # job_settled_on K JOB CPUS
# node_view K: what node K's malld says, one line: each job (sorted) as job:cpus:cpuset:state:attached,
# then each reservation as job=cpus
node_view() {
  nstatus "$1" | jq -r '([.jobs[] | "\(.job):\(.cpus):\(.cpuset):\(.state):\(.attached)"] | sort | join(" ")) + " | " +
                        (.reserved | to_entries | map("\(.key)=\(.value)") | sort | join(" "))' 2>/dev/null
}
job_cgroups() { node_job_cgroups "node$1"; }
task_pid() { node_task_pid "node$1" "$2" "$3"; }   # task_pid K JOB PROGRAM
group_of() { echo $(( ($1 - 1) / group )); }   # node K's multi-node job: multi[group_of K]
program_of_group() { if [ "$1" -eq 0 ]; then echo "$trainer"; else echo "$client"; fi; }
min_threads_of() { if [ "$1" = "$trainer" ]; then echo 1; else echo 3; fi; }   # client: main + 2 workers
phase_start=$SECONDS
phase_done() { note "phase $1 took $(( SECONDS - phase_start )) s (total ${SECONDS} s)"; phase_start=$SECONDS; }
every_node() { # every_node CHECK: CHECK K for K = 1..64; false at the first node that fails (in $bad_node)
  local k
  for (( k = 1; k <= nodes; k++ )); do "$1" "$k" || { bad_node=$k; return 1; }; done
}
is_mall_type() { [[ " $mall_types " == *" $1 "* ]]; }

# The MPI job's ranks run in $work/mpi-cores with cores allowed: a rank that crashes leaves its core
# there, and mpi_cores_backtrace prints where (as test_slurm_nodes.sh: Open MPI's own handler cannot
# unwind past a SIGSEGV at address 0). The ranks run with PMIX_MCA_gds=hash, as there: the documented
# workaround of PMIx's intermittent ds21 dstore crash at init (openpmix#1114, ompi#7335).
mkdir -p "$work/mpi-cores"
mpi_cores_shown=''
mpi_cores_backtrace() {
  local core
  for core in "$work"/mpi-cores/core*; do
    [ -f "$core" ] || continue
    case " $mpi_cores_shown " in *" $core "*) continue ;; esac
    mpi_cores_shown+=" $core"
    if command -v gdb >/dev/null; then
      note "--- backtrace of $core:"
      gdb -batch -ex 'bt 15' "$trainer" "$core" 2>&1 | grep -E '^#' | sed 's/^/        /'
    else
      note "--- $core kept no backtrace: gdb is not installed"
    fi
  done
}
dump_node() { note "--- node$1's malld: $(nstatus "$1" | jq -c '{free, reserved, jobs: [.jobs[] | {job, cpus, cpuset, state, attached, pids}]}' 2>/dev/null)"; }

# ---- up -------------------------------------------------------------------------------------------
if ! "$cluster" up --nodes $nodes >"$work/up.log" 2>&1; then
  fail "local-cluster.sh up --nodes $nodes: $(tail -n 20 "$work/up.log")"
  "$cluster" logs 10 2>/dev/null | tail -n 60 | sed 's/^/    /'
  exit 1
fi
eval "$("$cluster" env)"
subnet=${MALL_CLUSTER_SUBNET:-10.215.0}
idle_nodes=$(sinfo -h -N -o '%N:%t:%c' 2>/dev/null | sort -u | grep -c ':idle:2$')
pools=$(for (( k = 1; k <= nodes; k++ )); do nstatus "$k" | jq -r .pool 2>/dev/null; done | sort | uniq -c | sed 's/^ *//')
if [ "$idle_nodes" -eq $nodes ] && [ "$pools" = "$nodes 0-1" ]; then
  pass "local-cluster.sh up --nodes $nodes: $(grep -m1 -o 'up in [0-9]* ms' "$work/up.log"), sinfo lists $idle_nodes idle nodes of 2 cpus, every malld's pool 0-1"
else
  fail "the $nodes-node cluster: $idle_nodes idle nodes of 2 cpus in sinfo, mallds' pools '$pools'"
  exit 1
fi
phase_done up

# ---- a. the jobs: every one attaches on every node it spans, with the allocation its threads allow --
multi=()    # multi[G]: the job id of the -N8 job over nodes 8G+1 .. 8G+8
single=()   # single[K]: the job id of the single-node job on node K (K >= 17)
stop_file=$work/stop
for (( g = 0; g < nodes / group; g++ )); do
  first=$(( g * group + 1 )); last=$(( first + group - 1 ))
  if [ $g -eq 0 ]; then
    wrap="ulimit -c unlimited 2>/dev/null; export OMPI_MCA_btl_tcp_if_include=$subnet.0/24 PMIX_MCA_gds=hash; srun --mpi=pmix $trainer --steps 100000000 --batch 64 --hidden 16 --print-every 0 --log-changes --stop-file $stop_file --max-seconds 400; echo srun-rc=\$?"
    id=$(submit "multi$g" -N $group -w "node[$first-$last]" --ntasks-per-node=1 -c1 --malleable=1:2 --chdir="$work/mpi-cores" --wrap "$wrap")
  else
    id=$(submit "multi$g" -N $group -w "node[$first-$last]" --ntasks-per-node=1 -c1 --malleable=1:2 \
           --wrap "srun $client --threads 2 --step-us 50000 --duration-s 900")
  fi || { fail "(a) sbatch refused the -N$group job over node$first-node$last: $(cat "$work/multi$g.sbatch.err")"; exit 1; }
  multi[g]=$id
done
for (( k = lenders + 1; k <= nodes; k++ )); do
  single[k]=$(submit "single$k" -w "node$k" -c1 --malleable=1:2 --wrap "srun $client --threads 2 --step-us 50000 --duration-s 900") ||
    { fail "(a) sbatch refused the single-node job on node$k: $(cat "$work/single$k.sbatch.err")"; exit 1; }
done
note "submitted ${#multi[@]} jobs -N$group (${multi[*]}) and ${#single[@]} single-node jobs (${single[lenders + 1]}..${single[nodes]}) in $(( SECONDS - phase_start )) s"

# node_as_planned K: node K's malld lists exactly the jobs planned there, settled and attached: on
# nodes 1-16 the -N8 job on 0-1 (it borrowed the idle core), elsewhere each job on exactly its own
# Slurm core (the reservation), the two cores different.
node_as_planned() {
  local k=$1 view m s rm rs
  view=$(node_view "$k") || return 1
  m=slurm-${multi[$(group_of "$k")]}
  if [ "$k" -le "$lenders" ]; then
    rm=$(cut -d'|' -f2 <<<"$view" | sed -n "s/.*$m=\([01]\)\b.*/\1/p")
    [ "$view" = "$m:0-1:0-1:settled:1 | $m=$rm" ] && [ -n "$rm" ]
  else
    s=slurm-${single[k]}
    rm=$(cut -d'|' -f2 <<<"$view" | sed -n "s/.* $m=\([01]\)\b.*/\1/p")
    rs=$(cut -d'|' -f2 <<<"$view" | sed -n "s/.* $s=\([01]\)\b.*/\1/p")
    [ -n "$rm" ] && [ -n "$rs" ] && [ "$rm" != "$rs" ] &&
      [ "$view" = "$(printf '%s\n' "$m:$rm:$rm:settled:1" "$s:$rs:$rs:settled:1" | LC_ALL=C sort | paste -sd' ') | $(printf '%s\n' "$m=$rm" "$s=$rs" | LC_ALL=C sort | paste -sd' ')" ]
  fi
}
all_as_planned() { every_node node_as_planned; }
if wait_for 180 all_as_planned; then
  pass "(a) all $(( ${#multi[@]} + ${#single[@]} )) malleable jobs attached and settled at the malld of every node they span, $(( SECONDS - phase_start )) s after the first submission (node1: $(node_view 1); node64: $(node_view 64))"
else
  fail "(a) node$bad_node's malld: '$(node_view "$bad_node")' (not as planned); squeue: $(squeue -h -o '%i:%t:%N' | grep -v ':R:' | head -n 5 | tr '\n' ' ')"
  dump_node "$bad_node"; mpi_cores_backtrace
  for f in "$work/multi$(group_of "$bad_node").out" "$work/single$bad_node.out"; do [ -f "$f" ] && note "--- $f: $(tail -n 5 "$f" | tr '\n' '|')"; done
  exit 1
fi

# Every task's threads allow exactly what its node's malld reports (a task's pid is listed at its
# registration, before slurmstepd execs it: wait for the exec).
declare -A task cpus_of   # task[K:JOB]: the pid of JOB's task on node K; cpus_of[K:JOB]: its allocation there
threads_wrong=''
checked=0
for (( k = 1; k <= nodes; k++ )); do
  g=$(group_of "$k")
  jobs_here="${multi[g]}"; [ "$k" -gt "$lenders" ] && jobs_here+=" ${single[k]}"
  tries=0
  # One status a node: "slurm-ID CPUS PID..." for each job; again (up to 30 s) while a task has not exec'd.
  while :; do
    listed=$(nstatus "$k" | jq -r '.jobs[] | "\(.job) \(.cpus) \(.pids | join(" "))"' 2>/dev/null)
    missing=0
    for j in $jobs_here; do
      prog=$client; [ "$j" = "${multi[g]}" ] && prog=$(program_of_group "$g")
      read -r _ cpus pids < <(grep "^slurm-$j " <<<"$listed")
      task[$k:$j]=''
      for p in $pids; do argv0_is "$p" "$prog" && task[$k:$j]=$p; done
      [ -n "${task[$k:$j]}" ] || missing=1
      cpus_of[$k:$j]=$cpus
    done
    [ $missing = 0 ] || [ $tries -ge 300 ] && break
    tries=$(( tries + 1 )); sleep 0.1
  done
  for j in $jobs_here; do
    prog=$client; [ "$j" = "${multi[g]}" ] && prog=$(program_of_group "$g")
    pid=${task[$k:$j]}; cpus=${cpus_of[$k:$j]}
    if [ -n "$pid" ] && wait_for 10 all_threads_on "$pid" "$(min_threads_of "$prog")" "$cpus"; then
      checked=$(( checked + 1 ))
    else
      threads_wrong+="node$k job $j (cpus '$cpus', pid '$pid': $(threads_lists "${pid:-0}")); "
    fi
  done
done
if [ -z "$threads_wrong" ]; then
  pass "(a) every thread of all $checked tasks allows exactly its job's allocation at its node's malld (node1's MPI rank: $(threads_lists "${task[1:${multi[0]}]}"); node17's: $(threads_lists "${task[17:${multi[2]}]}") / $(threads_lists "${task[17:${single[17]}]}"))"
else
  fail "(a) tasks whose threads do not allow what their malld reports: $threads_wrong"
fi
rank_changes() { grep -cE '^rank [0-9]+ change step [0-9]+ threads [0-9]+ -> 2 .* cpus 0-1$' "$work/multi0.out" 2>/dev/null; }
if wait_for 30 bash -c "[ \$(grep -cE '^rank [0-9]+ change step [0-9]+ threads [0-9]+ -> 2 .* cpus 0-1$' '$work/multi0.out') -ge $group ]"; then
  pass "(a) the MPI job ${multi[0]} (srun --mpi=pmix over node1-node$group): all $group ranks applied 0-1 with 2 threads ($(grep -m1 '^rank 0 change' "$work/multi0.out"))"
else
  fail "(a) the MPI job ${multi[0]}: $(rank_changes) ranks applied 0-1: $(tail -n 5 "$work/multi0.out" | tr '\n' '|')"
  mpi_cores_backtrace
fi
phase_done a

# ---- b. a plain job on each of nodes 1-16 gets its core back before its task starts ---------------
# Its first command prints its own Cpus_allowed_list, then every thread's of the borrower (the -N8
# job's task on that node: no pid namespace, host pids); it stays (sleep) until the end.
declare -A plain own
for (( k = 1; k <= lenders; k++ )); do
  j=${multi[$(group_of "$k")]}
  own[$k]=$(reserved_for "$k" "slurm-$j")
  bpid=${task[$k:$j]:-0}
  plain[$k]=$(submit "plain$k" -w "node$k" -c1 \
    --wrap "grep Cpus_allowed_list /proc/self/status; for f in /proc/$bpid/task/*/status; do sed -n 's/^Cpus_allowed_list:[[:space:]]*/borrower /p' \$f; done; hostname; exec sleep 900") ||
    { fail "(b) sbatch refused the plain job on node$k: $(cat "$work/plain$k.sbatch.err")"; exit 1; }
done
plain_started() { grep -qx "node$1" "$work/plain$1.out" 2>/dev/null; }   # its last line before the sleep
all_plain_started() { local k; for (( k = 1; k <= lenders; k++ )); do plain_started "$k" || { bad_node=$k; return 1; }; done; }
if ! wait_for 60 all_plain_started; then
  fail "(b) the plain job ${plain[$bad_node]} on node$bad_node did not start within 60 s ($(job_state "${plain[$bad_node]}")): $(tr '\n' '|' <"$work/plain$bad_node.out" 2>/dev/null)"
fi
plain_wrong=''
for (( k = 1; k <= lenders; k++ )); do
  j=${multi[$(group_of "$k")]}; p=${plain[$k]}; mine=$(other_cpu "${own[$k]}")
  out=$work/plain$k.out
  plain_list=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' "$out" 2>/dev/null | head -n1)
  borrower_lists=$(sed -n 's/^borrower //p' "$out" 2>/dev/null | sort -u | paste -sd' ')
  if [ "$plain_list" != "$mine" ] || [ "$borrower_lists" != "${own[$k]}" ] ||
     ! grep -Eq "reclaiming cpus $mine for slurm-$p( |$)" "$MALL_CLUSTER_DIR/nodes/node$k/log/malld.log" ||
     ! wait_for 10 job_settled_on "$k" "slurm-$j" "${own[$k]}" || [ "$(reserved_for "$k" "slurm-$p")" != "$mine" ]; then
    plain_wrong+="node$k: plain job $p's task started on '$plain_list' (want $mine), the borrower's threads then allowed '$borrower_lists' (want ${own[$k]}), malld: $(node_view "$k"), reclaim logged: $(grep -c "reclaiming cpus $mine for slurm-$p" "$MALL_CLUSTER_DIR/nodes/node$k/log/malld.log"); "
  fi
done
if [ -z "$plain_wrong" ]; then
  pass "(b) on each of nodes 1-$lenders a plain job's task started on the core its node's malld had just reclaimed from the borrower, whose every thread already allowed only its own core (node1: '$(tr '\n' ' ' <"$work/plain1.out")'; $(grep -m1 "reclaiming cpus .* for slurm-${plain[1]}" "$MALL_CLUSTER_DIR/nodes/node1/log/malld.log" | sed 's/^.*info: //'))"
else
  fail "(b) $plain_wrong"
fi
# The MPI job stops at one step on every rank, completes, and every rank trained the same weights.
# Balanced mode: every rank changes at the same steps to the same thread counts (step:threads).
steps_of() { grep -E '^rank [0-9]+ change step ' "$work/multi0.out" | awk -v r="$1" '$2 == r { print $5 ":" $9 }' | paste -sd' '; }
touch "$stop_file"
sums=''
if wait_for 90 job_final "${multi[0]}" && [ "$(job_state "${multi[0]}")" = COMPLETED ] && grep -qx 'srun-rc=0' "$work/multi0.out" &&
   sums=$(sed -n 's/^rank [0-9]* final .* checksum \([0-9a-f]*\)$/\1/p' "$work/multi0.out" | sort -u) &&
   [ "$(grep -c '^rank [0-9]* final ' "$work/multi0.out")" -eq $group ] && [ "$(wc -w <<<"$sums")" -eq 1 ]; then
  pass "(b) the MPI job ${multi[0]} completed (srun exit 0) and its $group ranks trained the same weights (checksum $sums)"
else
  fail "(b) the MPI job ${multi[0]}: $(job_state "${multi[0]}"), checksums '$(tr '\n' ' ' <<<"$sums")': $(tail -n 8 "$work/multi0.out" | tr '\n' '|')"
  mpi_cores_backtrace
fi
rank0_steps=$(steps_of 0); same=1
for (( r = 1; r < group; r++ )); do [ "$(steps_of "$r")" = "$rank0_steps" ] || same=0; done
if [ $same = 1 ] && [[ " $rank0_steps" =~ :2\ .*:1 ]]; then
  pass "(b) the MPI job's $group ranks (balanced) changed at the same steps to the same thread counts, 2 then 1 as the plain jobs reclaimed their cores (step:threads): $rank0_steps"
else
  fail "(b) the MPI job's ranks changed differently: $(for (( r = 0; r < group; r++ )); do printf 'rank %s: %s; ' "$r" "$(steps_of "$r")"; done)"
fi
# Its 8 nodes' last figures (with ended_at) all reached its AdminComment at its end, none lost to
# another node's write (the nodes merge their segments into the one field one after the other).
comment=$(scontrol show job "${multi[0]}" -o 2>/dev/null | grep -o 'AdminComment=[^ ]*' | sed 's/^AdminComment=//')
segments=$(grep -o 'mall:node[0-9]*:lent_core_s=[0-9.]*,core_s=[0-9.]*,resizes=[0-9]*,ack_timeouts=[0-9]*,oversub_s=[0-9.]*,ended_at=[0-9.]*' <<<"$comment" |
           cut -d: -f2 | sort -u | paste -sd' ')
if [ "$segments" = "$(for (( k = 1; k <= group; k++ )); do echo "node$k"; done | sort -u | paste -sd' ')" ] &&
   [[ $comment != *running_as_of* ]]; then
  pass "(b) the MPI job's AdminComment has the last figures of each of its $group nodes: $segments"
else
  fail "(b) the MPI job's AdminComment lacks a node's figures (has: '$segments'): '$comment'"
fi
phase_done b

# ---- c. 8 mallds killed at once: up restarts only them, and each re-adopts its jobs ----------------
declare -A view_before threads_before pids_before
for d in slurmctld $(for (( k = 1; k <= nodes; k++ )); do echo "slurmd@node$k"; done) malld@node1 malld@node$nodes; do pids_before[$d]=$(pid_of "$d"); done
killed=''
for k in $restarted_nodes; do
  view_before[$k]=$(node_view "$k")
  for j in "${multi[$(group_of "$k")]}" "${single[k]}"; do threads_before[$k:$j]=$(threads_lists "${task[$k:$j]}"); done
  killed+=" $(pid_of "malld@node$k")"
done
# shellcheck disable=SC2086  # one pid a word
kill -KILL $killed
all_dead() { local p; for p in $killed; do live "$p" && return 1; done; return 0; }
if ! wait_for 10 all_dead; then fail "(c) the mallds of nodes $(paste -sd, <<<"$restarted_nodes") (pids$killed) survived SIGKILL"; fi
note "killed the mallds of node$(head -n1 <<<"$restarted_nodes")-node$(tail -n1 <<<"$restarted_nodes") (pids$killed)"
if ! "$cluster" up --nodes $nodes >"$work/up2.log" 2>&1; then
  fail "(c) local-cluster.sh up --nodes $nodes (restart): $(tail -n 5 "$work/up2.log")"
fi
restarted=$(sed -n 's/^.*: started \(.*\)$/\1/p' "$work/up2.log")
want_restarted=$(for k in $restarted_nodes; do printf 'malld@node%s ' "$k"; done)
unchanged=1
for d in "${!pids_before[@]}"; do [ "$(pid_of "$d")" = "${pids_before[$d]}" ] && live "${pids_before[$d]}" || unchanged=0; done
if [ "$restarted " = "$want_restarted" ] && [ $unchanged = 1 ]; then
  pass "(c) local-cluster.sh up --nodes $nodes restarted exactly ${want_restarted% } (slurmctld, every slurmd and the other mallds kept their pids)"
else
  fail "(c) the restart started '$restarted' (want '${want_restarted% }'), the other daemons unchanged: $unchanged"
fi
readopted() { # readopted K: node K's new malld lists the same jobs, allocations and reservations, attached
  [ "$(node_view "$1")" = "${view_before[$1]}" ] && grep -q "re-adopted job slurm-${single[$1]} " "$MALL_CLUSTER_DIR/nodes/node$1/log/malld.log" &&
    grep -q "re-adopted job slurm-${multi[$(group_of "$1")]} " "$MALL_CLUSTER_DIR/nodes/node$1/log/malld.log"
}
readopt_wrong=''
for k in $restarted_nodes; do
  if ! wait_for 60 readopted "$k"; then
    readopt_wrong+="node$k: '$(node_view "$k")' (before: '${view_before[$k]}'), log: $(grep 're-adopted\|not re-adopted' "$MALL_CLUSTER_DIR/nodes/node$k/log/malld.log" | tail -n 2 | tr '\n' '|'); "
    continue
  fi
  for j in "${multi[$(group_of "$k")]}" "${single[k]}"; do
    [ "$(threads_lists "${task[$k:$j]}")" = "${threads_before[$k:$j]}" ] ||
      readopt_wrong+="node$k job $j's threads changed: $(threads_lists "${task[$k:$j]}") (before: ${threads_before[$k:$j]}); "
  done
done
if [ -z "$readopt_wrong" ]; then
  k=$(head -n1 <<<"$restarted_nodes")
  pass "(c) each restarted malld re-adopted its 2 jobs with the same allocations and reservations, re-attached, threads untouched (node$k: $(node_view "$k"); $(grep -m1 "re-adopted job" "$MALL_CLUSTER_DIR/nodes/node$k/log/malld.log" | sed 's/^.*info: //'))"
else
  fail "(c) $readopt_wrong"
fi
# A re-adopted job still resizes: the single job on the first restarted node ends, the -N8 job's
# task there grows into the freed core, then an admin pins it to its own core and hands it back.
k=$(head -n1 <<<"$restarted_nodes"); j=${multi[$(group_of "$k")]}; rpid=${task[$k:$j]}; rown=$(reserved_for "$k" "slurm-$j")
scancel "${single[k]}"
if wait_for 30 job_final "${single[k]}" && wait_for 30 job_settled_on "$k" "slurm-$j" 0-1 && wait_for 10 all_threads_on "$rpid" 3 0-1 &&
   nctl "$k" set "slurm-$j" --cpus "$rown" >"$work/set.out" 2>&1 && wait_for 30 job_settled_on "$k" "slurm-$j" "$rown" &&
   wait_for 10 all_threads_on "$rpid" 3 "$rown" &&
   nctl "$k" set "slurm-$j" --cpus auto >>"$work/set.out" 2>&1 && wait_for 30 job_settled_on "$k" "slurm-$j" 0-1 &&
   wait_for 10 all_threads_on "$rpid" 3 0-1; then
  pass "(c) the re-adopted job $j on node$k grew into the core job ${single[k]} freed, followed mallctl set --cpus $rown and then auto (threads now $(threads_lists "$rpid"))"
else
  fail "(c) resizing the re-adopted job $j on node$k: $(tr '\n' '|' <"$work/set.out" 2>/dev/null) malld: $(node_view "$k"), threads $(threads_lists "$rpid")"
fi
phase_done c

# ---- d. steady state: no RPC from mall to slurmctld --------------------------------------------
running_jobs=$(squeue -h -t R -o %i | wc -l)
malleable_now=$(for (( k = 1; k <= nodes; k++ )); do nstatus "$k" | jq -r '.jobs[].job'; done | sort -u | wc -l)
"$cluster" exec -- sdiag --reset >/dev/null 2>&1 || fail "(d) sdiag --reset: $("$cluster" exec -- sdiag --reset 2>&1)"
window_t0=$SECONDS
sleep "$window_s"   # no Slurm client call in the window: squeue or scontrol would send RPCs themselves
window_took=$(( SECONDS - window_t0 ))
"$cluster" exec -- sdiag >"$work/sdiag.steady" 2>&1
mall_rpcs=0
note "sdiag over the $window_took s window with $running_jobs running jobs ($malleable_now malleable), by message type:"
while read -r type count; do
  if is_mall_type "$type"; then note "  mall  $type $count"; mall_rpcs=$(( mall_rpcs + count )); else note "  other $type $count"; fi
done < <(rpc_table "$work/sdiag.steady")
note "  by user: $(sed -n '/statistics by user/,/^$/p' "$work/sdiag.steady" | awk '!/statistics/ && NF > 2 { c = $0; sub(/.*count:/, "", c); sub(/ .*/, "", c); printf "%s %s; ", $1, c }')"
if ! grep -q 'statistics by message type' "$work/sdiag.steady"; then
  fail "(d) sdiag printed no RPC table: $(head -n 5 "$work/sdiag.steady" | tr '\n' '|')"
elif [ "$mall_rpcs" -eq 0 ]; then
  pass "(d) steady state: slurmctld counted 0 RPCs of mall's types over $window_took s with $malleable_now malleable jobs running on $nodes nodes"
else
  fail "(d) steady state: slurmctld counted $mall_rpcs RPCs of mall's types over $window_took s with $malleable_now malleable jobs ($(awk -v c="$mall_rpcs" -v j="$malleable_now" -v s="$window_took" 'BEGIN { printf "%.2f", c / j / (s / 60) }') per job-minute; want 0)"
fi
still=$(for (( k = 1; k <= nodes; k++ )); do nstatus "$k" | jq -r '.jobs[] | select(.attached == 1 and .state == "settled") | .job'; done | sort -u | wc -l)
if [ "$still" -eq "$malleable_now" ]; then
  pass "(d) after the window all $still malleable jobs are still settled and attached"
else
  fail "(d) after the window $still of $malleable_now malleable jobs are settled and attached"
fi
phase_done d

# ---- e. scancel everything: nothing left on any node ------------------------------------------------
all_jobs=$(squeue -h -o %i | tr '\n' ' ')
# shellcheck disable=SC2086  # one job id a word
[ -n "${all_jobs// }" ] && scancel $all_jobs 2>"$work/scancel.err"   # its retry notes under load: shown on failure
no_job_left() { [ -z "$(squeue -h -o %i 2>/dev/null)" ]; }
nothing_on() { [ "$(nstatus "$1" | jq -c '[.jobs, .reserved]')" = '[[],{}]' ] && [ -z "$(job_cgroups "$1")" ]; }
if wait_for 60 no_job_left && wait_for 60 every_node nothing_on; then
  pass "(e) scancel of every job (${all_jobs% }): no job in squeue; all $nodes mallds list no job and reserve nothing, no cgroup below ${MALL_CLUSTER_CGROUP}_nodeK"
else
  note "scancel said: $(sort -u "$work/scancel.err" | tail -n 3 | tr '\n' '|')"
  fail "(e) after scancel: squeue '$(squeue -h -o '%i:%t' | head -n 5 | tr '\n' ' ')', node$bad_node: $(node_view "$bad_node"), cgroups '$(job_cgroups "$bad_node" | tr '\n' ' ')'"
fi
phase_done e

# ---- down, and nothing left -----------------------------------------------------------------------
if [ -n "${MALL_SYSTEST_LOG_DIR:-}" ]; then   # keep the logs and job outputs (e.g. for CI artifacts)
  mkdir -p "$MALL_SYSTEST_LOG_DIR" && cp -r "$MALL_CLUSTER_DIR/log" "$work"/*.out "$work"/*.err "$work/sdiag.steady" "$MALL_SYSTEST_LOG_DIR"/ 2>/dev/null
  for (( k = 1; k <= nodes; k++ )); do mkdir -p "$MALL_SYSTEST_LOG_DIR/node$k" && cp -r "$MALL_CLUSTER_DIR/nodes/node$k/log" "$MALL_SYSTEST_LOG_DIR/node$k/" 2>/dev/null; done
fi
if [ "$failures" -gt 0 ]; then   # the daemons' recent errors, without (e)'s cancellations and PMIx's step-end notes
  "$cluster" logs 20 2>/dev/null | grep -iE 'error|fatal|warn' | grep -vE 'CANCELLED AT|rmdir_recursive|pmixp_libpmix_finalize' |
    tail -n 40 | sed 's/^/    /'
fi
cluster_down_and_nothing_left "${task[*]}"   # no task of the run may survive
left=$(find /sys/fs/cgroup/*/ -maxdepth 1 -type d -name "${MALL_CLUSTER_CGROUP}_node*" 2>/dev/null | tr '\n' ' ')
if [ -z "$left" ]; then
  pass "no cgroup parent ${MALL_CLUSTER_CGROUP}_nodeK remains in any hierarchy"
else
  fail "cgroup parents left: $left"
fi
phase_done down

note "run time: ${SECONDS}s"
if [ "$failures" -eq 0 ]; then echo "test_slurm_scale: all checks passed"; exit 0; fi
echo "test_slurm_scale: $failures check(s) failed"
exit 1
