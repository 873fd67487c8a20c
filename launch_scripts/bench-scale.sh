#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# bench-scale.sh — what mall costs slurmctld at cluster scale (issue 39): brings up a private
# multi-node Slurm cluster (launch_scripts/local-cluster.sh up --nodes N: one slurmd and one malld
# --slurm per node, the mall plugin), runs J malleable jobs per node, and reads slurmctld's own RPC
# counters (sdiag) over a steady window, over a short job's life, and the plugin's added start time
# of a plain job. A benchmark: prints figures, never passes or fails. Brings everything down at the
# end, also on failure or Ctrl-C. See --help.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$repo/launch_scripts/lib/stats.sh"  # median
build=${MALL_BUILD_DIR:-$repo/build}
bin=$build/bin
prog=bench-scale.sh
nodes=''
jobs_per_node=''
window_s=60
life_s=5
samples=10
trainer=idle
span_trainer=client
comment_merge=malld
# The RPC types malld (--slurm) and the plugin send to slurmctld (libslurm's slurm_load_job, which
# also loads the federation unless given SHOW_LOCAL, slurm_update_job, slurm_load_node_single,
# slurm_load_node).
mall_types='REQUEST_JOB_INFO_SINGLE REQUEST_FED_INFO REQUEST_UPDATE_JOB REQUEST_NODE_INFO_SINGLE REQUEST_NODE_INFO'

usage() {
  cat <<EOF
$prog — what mall's malld and plugin cost slurmctld, measured with slurmctld's own counters

Usage: launch_scripts/$prog --nodes N --jobs-per-node J [--window-s S] [--life-s L]
                             [--samples R] [--trainer idle|sgd] [--span-trainer client|mpi]
                             [--comment-merge malld|slurmctld]
       launch_scripts/$prog -h|--help

Brings up a private Slurm cluster of N nodes (launch_scripts/local-cluster.sh up --nodes N:
temporary folder, its own cgroup parent; each node in network, UTS and mount namespaces of its own
with its own slurmd and its own malld --slurm, the mall SPANK plugin loaded), then, in order:
  1. start delay: after one warm-up job, R times each, alternating, a plain job (sbatch -w node1
     -c1 --wrap 'date +%s%N') with the plugin and without it (plugstack.conf emptied for that
     submission: slurmstepd reads it at each job start); each waits until the previous one
     completed and node1 is idle;
  2. a job's life: sdiag --reset, one short malleable job per node (sbatch -w nodeK
     --malleable=1:2 -c1 --wrap 'srun mall_test_client --duration-s L'), waits until every one
     ended, every malld lists no job, and then one more reconciliation period (11 s), reads sdiag;
  2b. a multi-node job's life: the same with one job over all N nodes (sbatch -N N
     --ntasks-per-node=1 --malleable=1:2 -c1, running --span-trainer), whose N mallds write the one
     AdminComment at its end;
  3. steady state: J jobs per node (sbatch -w nodeK --malleable=1:2 -c1 --wrap 'srun TRAINER'),
     waits until every one runs and is attached (mallctl status --json on each node's socket),
     sdiag --reset, waits S seconds without any Slurm client call, reads sdiag, checks that all
     N*J jobs are still attached;
  4. reads VmRSS of every node's malld, brings the cluster down.
Then prints the sdiag RPC lines of phases 2 and 3 (types mall uses marked "mall", the others
"other"), and a last line:
  ctld_rpcs_per_job_minute=X ctld_rpcs_per_job_life=Y start_delay_ms=Z malld_rss_kb=W
  ctld_rpcs_per_node_of_multinode_job=V

The figures:
  ctld_rpcs_per_job_minute  RPCs slurmctld counted in phase 3 of the types mall uses
                            (REQUEST_JOB_INFO_SINGLE and REQUEST_FED_INFO: libslurm's slurm_load_job
                            sends both unless given SHOW_LOCAL, as malld does since issue 39;
                            REQUEST_UPDATE_JOB, REQUEST_NODE_INFO_SINGLE,
                            REQUEST_NODE_INFO), divided by the N*J jobs and by S/60 minutes.
                            All of malld's RPCs come from root, but so do slurmd's and
                            slurmstepd's (here every daemon runs as root): the type tells them
                            apart. slurmd's own steady traffic (MESSAGE_NODE_REGISTRATION_STATUS,
                            ...) and sdiag's REQUEST_STATS_INFO are printed as "other", never
                            counted. No
                            Slurm client (squeue, scontrol) runs during the window: scontrol show
                            job would itself send REQUEST_JOB_INFO_SINGLE.
  ctld_rpcs_per_job_life    RPCs of the same types in phase 2, divided by N: what one malleable job
                            of L seconds costs from submission to end, on one node, including
                            malld's checks at registration, the reconciliations during its life and
                            its end (AdminComment update). The cluster has no other job then.
                            Without the plugin sbatch and srun send none of these types (sbatch:
                            REQUEST_SUBMIT_BATCH_JOB; srun in the job: REQUEST_HET_JOB_ALLOC_INFO,
                            REQUEST_JOB_STEP_CREATE, REQUEST_STEP_COMPLETE); with it, the plugin in
                            each checks --malleable against the nodes' cpus (REQUEST_NODE_INFO),
                            which counts as mall's (since issue 39 only where MIN or MAX exceed
                            the submitting host's cpus, never in srun inside a job: each node
                            checks its own cpus).
  ctld_rpcs_per_node_of_multinode_job  RPCs of the same types in phase 2b, divided by N: what a
                            multi-node job costs per node it spans. With --comment-merge malld its
                            nodes write the field one after the other; a node that reads before
                            the one ahead of it wrote reads again, so the figure grows with how far
                            apart the tasks end. With slurmctld each node writes once, no read.
  start_delay_ms            median over R of (sbatch called -> the plain job's first command ran,
                            same clock) with the plugin, minus the same median without the plugin:
                            what the plugin adds to a plain job's start on a node with no malleable
                            job (the medians are printed too). Slurm's StartTime has 1 s resolution
                            and is not used. With a malleable job borrowing the node's cores the
                            reclaim adds more: launch_scripts/bench-reclaim.sh measures that.
  malld_rss_kb              the largest VmRSS (/proc/PID/status) of the N mallds after phase 3,
                            each holding J jobs.

Options:
  --nodes N          Slurm nodes, 2 to 200 (local-cluster.sh up --nodes N)
  --jobs-per-node J  malleable -c1 jobs per node in phase 3, 1 to the node's cpus: every node
                     reports all of this machine's cpus and Slurm gives each job its own core, so
                     more would pend (2 on a 2-cpu machine)
  --window-s S       the steady window (default $window_s); a multiple of malld's --slurm-interval-s
                     (10 s here), or the count depends on where its timers fall
  --life-s L         how long phase 2's short job runs (default $life_s)
  --samples R        plain jobs with and without the plugin in phase 1 (default $samples)
  --trainer T        what each phase-3 job runs under srun:
                       idle (default) mall_test_client --step-us 100000: attaches, steps 10 times a
                            second, its threads sleep. N*J computing trainers on a small machine
                            would starve slurmctld and skew its figures;
                       sgd  mall_train_sgd with enough steps to outlast the window (as the demos).
  --span-trainer T   what phase 2b's N-node job runs under srun:
                       client (default) mall_test_client --duration-s L on each node: independent
                            tasks, each ending L s after its own start (on a small machine the N
                            starts, hence the ends, spread over up to a second);
                       mpi  srun --mpi=pmix mall_train_mpi --max-seconds L: one rank per node,
                            stopping at the same step, as a data-parallel training job ends.
  --comment-merge M  who merges each node's figures into a job's AdminComment (every malld gets
                     --slurm-comment-merge M; the cluster's slurmctld has mall's job_submit.lua):
                       malld (default) each node reads the field, merges and writes it;
                       slurmctld  each node sends its segment once, job_submit.lua merges it.

Needs root (the cluster's daemons, munged, malld's cgroups), jq, and a build with malld, mallctl,
mall_test_client, mall_train_sgd and the plugin. Takes 1 min 45 s for N=8, J=2 and the defaults on
a 2-cpu machine, 2 min 20 s for N=64 (phase 1 about 21 s, phase 2 about 20 s, phase 3 the window
plus 1-9 s until every job is attached). Figures from it: docs/benchmarks.md.
Environment: MALL_BUILD_DIR (default <repo>/build).

Example:
  launch_scripts/$prog --nodes 8 --jobs-per-node 2
EOF
}

while [ $# -gt 0 ]; do
  case $1 in
    --nodes) nodes=${2:?"$prog: $1 needs a value"}; shift ;;
    --nodes=*) nodes=${1#*=} ;;
    --jobs-per-node) jobs_per_node=${2:?"$prog: $1 needs a value"}; shift ;;
    --jobs-per-node=*) jobs_per_node=${1#*=} ;;
    --window-s) window_s=${2:?"$prog: $1 needs a value"}; shift ;;
    --window-s=*) window_s=${1#*=} ;;
    --life-s) life_s=${2:?"$prog: $1 needs a value"}; shift ;;
    --life-s=*) life_s=${1#*=} ;;
    --samples) samples=${2:?"$prog: $1 needs a value"}; shift ;;
    --samples=*) samples=${1#*=} ;;
    --trainer) trainer=${2:?"$prog: $1 needs a value"}; shift ;;
    --trainer=*) trainer=${1#*=} ;;
    --span-trainer) span_trainer=${2:?"$prog: $1 needs a value"}; shift ;;
    --span-trainer=*) span_trainer=${1#*=} ;;
    --comment-merge) comment_merge=${2:?"$prog: $1 needs a value"}; shift ;;
    --comment-merge=*) comment_merge=${1#*=} ;;
    -h|--help) usage; exit 0 ;;
    *) echo "$prog: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
bad() { echo "$prog: $*" >&2; exit 2; }
[ -n "$nodes" ] && [ -n "$jobs_per_node" ] || bad "--nodes and --jobs-per-node are required (see --help)"
[[ $nodes =~ ^[1-9][0-9]*$ ]] && [ "$nodes" -ge 2 ] && [ "$nodes" -le 200 ] || bad "--nodes must be a node count from 2 to 200, not '$nodes'"
cpus=$(nproc --all)
[[ $jobs_per_node =~ ^[1-9][0-9]*$ ]] && [ "$jobs_per_node" -le "$cpus" ] ||
  bad "--jobs-per-node must be 1 to $cpus (this machine's cpus: each node reports them all and each job holds one), not '$jobs_per_node'"
[[ $window_s =~ ^[1-9][0-9]*$ ]] || bad "--window-s must be a positive number of seconds, not '$window_s'"
[[ $life_s =~ ^[1-9][0-9]*$ ]] || bad "--life-s must be a positive number of seconds, not '$life_s'"
[[ $samples =~ ^[1-9][0-9]*$ ]] || bad "--samples must be a positive integer, not '$samples'"
case $trainer in idle|sgd) ;; *) bad "--trainer must be idle or sgd, not '$trainer'" ;; esac
case $span_trainer in client|mpi) ;; *) bad "--span-trainer must be client or mpi, not '$span_trainer'" ;; esac
case $comment_merge in malld|slurmctld) ;; *) bad "--comment-merge must be malld or slurmctld, not '$comment_merge'" ;; esac
[ "$(id -u)" -eq 0 ] || { echo "$prog: needs root (it starts Slurm's daemons, munged and malld); run it as root" >&2; exit 1; }
command -v jq >/dev/null || { echo "$prog: jq is not installed: run launch_scripts/install-deps.sh" >&2; exit 1; }
needed='bin/malld bin/mallctl bin/mall_test_client bin/mall_train_sgd lib/mall_spank.so'
[ "$span_trainer" = mpi ] && needed+=' bin/mall_train_mpi'
for f in $needed; do
  [ -e "$build/$f" ] || { echo "$prog: $build/$f is missing: build it (ninja -C $build malld mallctl mall_test_client mall_train_sgd mall_spank mall_train_mpi)" >&2; exit 1; }
done

say() { printf '==> %s\n' "$*"; }
note() { printf '    %s\n' "$*"; }
die() { printf '%s: error: %s\n' "$prog" "$*" >&2; exit 1; }
ms_now() { echo $(( $(date +%s%N) / 1000000 )); }

# ---- everything this script starts, and how it is stopped -------------------------------------
tmp='' cluster_up=0 sleep_pid=''
cluster_sh=$repo/launch_scripts/local-cluster.sh
cleanup() {
  local rc=$?
  set +e
  trap '' PIPE INT TERM   # the teardown must finish, even after a second Ctrl-C
  [ -n "$sleep_pid" ] && kill "$sleep_pid" 2>/dev/null
  if [ "$cluster_up" = 1 ]; then
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 130 ] && [ "$rc" -ne 143 ]; then
      echo "$prog: failed; the end of the cluster's logs (removed with the cluster):" >&2
      "$cluster_sh" logs 10 >&2
    fi
    "$cluster_sh" down >"$tmp/down.log" 2>&1 || { echo "$prog: bringing the cluster down failed:" >&2; cat "$tmp/down.log" >&2; }
  fi
  [ -n "$tmp" ] && rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

tmp=$(mktemp -d "${TMPDIR:-/tmp}/mall-bench-scale.XXXXXX")
chmod 0755 "$tmp"   # munged (user munge) and the jobs must reach the folder

# ---- a private cluster (its network, hence its ports, exist only in its namespaces) --------------
export MALL_CLUSTER_DIR=$tmp/cluster MALL_BUILD_DIR=$build MALL_CLUSTER_CGROUP=mall_bench_scale_$$
export MALL_CLUSTER_TIMEOUT_S=$(( 30 + nodes ))
export MALL_CLUSTER_MALLD_ARGS="${MALL_CLUSTER_MALLD_ARGS:+$MALL_CLUSTER_MALLD_ARGS }--slurm-comment-merge $comment_merge"
t_up=$(ms_now)
say "bringing up a private Slurm cluster of $nodes nodes (cgroup parent $MALL_CLUSTER_CGROUP, AdminComment merged by $comment_merge)"
cluster_up=1
"$cluster_sh" up --nodes "$nodes" >"$tmp/up.log" 2>&1 || { cat "$tmp/up.log" >&2; die "the local cluster did not come up (above)"; }
eval "$("$cluster_sh" env)"
note "$(grep -m1 ': up in' "$tmp/up.log" | sed 's/^local-cluster.sh: //; s/: started.*//')"
plugstack=$MALL_CLUSTER_DIR/etc/plugstack.conf
grep -q '^optional .*mall_spank' "$plugstack" || die "the plugin is not loaded ($plugstack: $(cat "$plugstack"))"
cp "$plugstack" "$tmp/plugstack.with"

sdiag_() { "$cluster_sh" exec -- sdiag "$@"; }   # slurmctld is reached only from the head namespace
sock() { echo "$MALL_CLUSTER_DIR/nodes/$1/malld.sock"; }
attached_jobs() { # attached_jobs NODE: how many jobs NODE's malld lists as attached
  timeout 10 "$bin/mallctl" --socket "$(sock "$1")" status --json 2>/dev/null |
    jq '[.jobs[] | select((.attached // 0) != 0 and .attached != false)] | length' 2>/dev/null || echo 0
}
node_jobs() { timeout 10 "$bin/mallctl" --socket "$(sock "$1")" status --json 2>/dev/null | jq '.jobs | length' 2>/dev/null || echo 99; }
wait_until() { # wait_until SECONDS WHAT CMD...: polls CMD every 100 ms
  local limit=$1 what=$2; shift 2
  local deadline=$(( $(ms_now) + limit * 1000 ))
  until "$@"; do
    [ "$(ms_now)" -lt "$deadline" ] || die "timed out after $limit s waiting for $what"
    sleep 0.1
  done
}
job_completed() { scontrol show job -o "$1" 2>/dev/null | grep -q 'JobState=COMPLETED '; }
node1_idle() { [ "$(sinfo -h -n node1 -o %t 2>/dev/null)" = idle ]; }
# rpc_table FILE: the "by message type" lines of an sdiag output, as "TYPE COUNT"
rpc_table() { sed -n '/statistics by message type/,/^$/p' "$1" | awk '$1 ~ /^(REQUEST|MESSAGE|RESPONSE)_/ { c = $0; sub(/.*count:/, "", c); sub(/ .*/, "", c); print $1, c }'; }
is_mall_type() { [[ " $mall_types " == *" $1 "* ]]; }
mall_count() { # mall_count FILE: sum of the counts of mall's types in an sdiag output
  local type count sum=0
  while read -r type count; do is_mall_type "$type" && sum=$(( sum + count )); done < <(rpc_table "$1")
  echo "$sum"
}
show_rpcs() { # show_rpcs FILE TITLE
  local type count
  note "$2 (sdiag, by message type):"
  while read -r type count; do
    if is_mall_type "$type"; then note "  mall  $type $count"; else note "  other $type $count"; fi
  done < <(rpc_table "$1")
  note "  by user: $(sed -n '/statistics by user/,/^$/p' "$1" | awk '!/statistics/ && NF > 2 { c = $0; sub(/.*count:/, "", c); sub(/ .*/, "", c); printf "%s %s; ", $1, c }')"
}

# ---- 1. start delay of a plain job, with and without the plugin --------------------------------
t1=$(ms_now)
say "1. start delay: $samples plain jobs on node1 with the plugin and $samples without, alternating"
: >"$tmp/delay.with"; : >"$tmp/delay.without"
# Sample -1 (with the plugin) is a warm-up, not counted: a fresh cluster's first job starts late.
for (( i = -1; i < 2 * samples; i++ )); do
  if (( i == -1 )); then mode=warmup
  elif (( i % 2 )); then mode=without; echo "# $prog: the plugin is off for one submission" >"$plugstack"
  else mode=with; fi
  [ "$mode" = without ] || cp "$tmp/plugstack.with" "$plugstack"
  rm -f "$tmp/started"
  t_sub=$(date +%s%N)
  id=$(sbatch --parsable -J bench-plain -w node1 -c1 -o /dev/null \
       --wrap "date +%s%N >$tmp/started.part && mv $tmp/started.part $tmp/started") || die "sbatch failed"
  id=${id%%;*}
  wait_until 30 "plain job $id to start" test -s "$tmp/started"
  echo $(( ($(cat "$tmp/started") - t_sub) / 1000000 )) >>"$tmp/delay.$mode"
  wait_until 30 "plain job $id to complete" job_completed "$id"
  wait_until 30 "node1 to be idle after job $id" node1_idle
done
cp "$tmp/plugstack.with" "$plugstack"
with_ms=$(median %d n/a <"$tmp/delay.with"); without_ms=$(median %d n/a <"$tmp/delay.without")
note "sbatch -> first command, with the plugin (ms): $(paste -sd' ' "$tmp/delay.with"); median $with_ms"
note "                       without the plugin (ms): $(paste -sd' ' "$tmp/delay.without"); median $without_ms"
start_delay_ms=$(( with_ms - without_ms ))
note "phase 1 took $(( ($(ms_now) - t1) / 1000 )) s"

# ---- 2. one short malleable job per node: its whole life --------------------------------------
t2=$(ms_now)
say "2. a job's life: one malleable job of $life_s s on each node, sdiag from before its submission to after its end"
sdiag_ --reset >/dev/null
for (( k = 1; k <= nodes; k++ )); do
  sbatch --parsable -J bench-life -w "node$k" --malleable=1:2 -c1 -o "$tmp/life-$k.out" \
    --wrap "srun $bin/mall_test_client --step-us 100000 --duration-s $life_s; touch $tmp/life-$k.done" >/dev/null ||
    die "sbatch of the short job on node$k failed"
done
all_life_done() { local k; for (( k = 1; k <= nodes; k++ )); do [ -e "$tmp/life-$k.done" ] || return 1; done; }
wait_until $(( life_s + 60 + nodes )) "the short jobs to end" all_life_done
all_mallds_empty() { local k; for (( k = 1; k <= nodes; k++ )); do [ "$(node_jobs "node$k")" = 0 ] || return 1; done; }
wait_until 60 "every malld to drop its short job" all_mallds_empty
sleep 11   # one more --slurm-interval-s (default 10): a late check of an ended job counts too
sdiag_ >"$tmp/sdiag.life"
life_count=$(mall_count "$tmp/sdiag.life")
rpcs_per_life=$(awk -v c="$life_count" -v n="$nodes" 'BEGIN { printf "%.1f", c / n }')
note "phase 2 took $(( ($(ms_now) - t2) / 1000 )) s"

# ---- 2b. one short malleable job over every node: a multi-node job's life, per node -------------
t2b=$(ms_now)
say "2b. a multi-node job's life: one malleable job of $life_s s on all $nodes nodes (one $span_trainer task per node)"
sdiag_ --reset >/dev/null
if [ "$span_trainer" = mpi ]; then
  # PMIX_MCA_gds=hash: PMIx's shared-memory store (ds21) crashes now and then at this scale.
  span_run="PMIX_MCA_gds=hash srun --mpi=pmix $bin/mall_train_mpi --max-seconds $life_s --steps 100000000 --print-every 0"
else
  span_run="srun $bin/mall_test_client --step-us 100000 --duration-s $life_s"
fi
sbatch --parsable -J bench-span -N "$nodes" --ntasks-per-node=1 --malleable=1:2 -c1 -o "$tmp/span.out" \
  --wrap "$span_run; echo \$? >$tmp/span.rc; touch $tmp/span.done" >/dev/null ||
  die "sbatch of the $nodes-node job failed"
wait_until $(( life_s + 60 + nodes )) "the $nodes-node job to end" test -e "$tmp/span.done"
[ "$(cat "$tmp/span.rc")" = 0 ] ||
  die "the $nodes-node job's srun exited $(cat "$tmp/span.rc"); its output: $(tail -n 5 "$tmp/span.out" | tr '\n' ' ')"
wait_until 60 "every malld to drop the $nodes-node job" all_mallds_empty
sleep 11
sdiag_ >"$tmp/sdiag.span"
span_count=$(mall_count "$tmp/sdiag.span")
rpcs_per_span_node=$(awk -v c="$span_count" -v n="$nodes" 'BEGIN { printf "%.1f", c / n }')
note "phase 2b took $(( ($(ms_now) - t2b) / 1000 )) s"

# ---- 3. steady state: J long malleable jobs per node -------------------------------------------
t3=$(ms_now)
njobs=$(( nodes * jobs_per_node ))
long_s=$(( window_s + 900 ))
if [ "$trainer" = idle ]; then
  task="$bin/mall_test_client --step-us 100000 --duration-s $long_s"
else
  task="$bin/mall_train_sgd --steps 100000000 --print-every 0"
fi
say "3. steady state: $jobs_per_node malleable jobs on each of the $nodes nodes ($njobs jobs; srun ${task#"$bin/"})"
for (( k = 1; k <= nodes; k++ )); do
  for (( j = 1; j <= jobs_per_node; j++ )); do
    sbatch --parsable -J bench-steady -w "node$k" --malleable=1:2 -c1 -t "$(( long_s / 60 + 2 ))" \
      -o "$tmp/steady-$k-$j.out" --wrap "srun $task" >/dev/null || die "sbatch of job $j on node$k failed"
  done
done
attached_total() { local k sum=0; for (( k = 1; k <= nodes; k++ )); do sum=$(( sum + $(attached_jobs "node$k") )); done; echo "$sum"; }
all_attached() { [ "$(attached_total)" -eq "$njobs" ]; }
wait_until $(( 60 + 3 * njobs )) "all $njobs jobs to run and attach" all_attached
note "all $njobs jobs attached $(( ($(ms_now) - t3) / 1000 )) s after the first submission"
sdiag_ --reset >/dev/null
t_window=$(ms_now)
sleep "$window_s" & sleep_pid=$!
wait "$sleep_pid"   # a signal's trap runs at once, not after the window
sleep_pid=''
sdiag_ >"$tmp/sdiag.steady"
window_ms=$(( $(ms_now) - t_window ))
still=$(attached_total)
[ "$still" -eq "$njobs" ] || note "warning: only $still of $njobs jobs are attached after the window"
steady_count=$(mall_count "$tmp/sdiag.steady")
rpcs_per_minute=$(awk -v c="$steady_count" -v j="$njobs" -v ms="$window_ms" 'BEGIN { printf "%.2f", c / j / (ms / 60000) }')

# ---- 4. malld's memory ---------------------------------------------------------------------------
rss_max=0
for (( k = 1; k <= nodes; k++ )); do
  pid=$(cat "$MALL_CLUSTER_DIR/run/malld@node$k.pid")
  rss=$(awk '/^VmRSS:/ { print $2 }' "/proc/$pid/status" 2>/dev/null || echo 0)
  [ "${rss:-0}" -gt "$rss_max" ] && rss_max=$rss
done
note "phase 3 took $(( ($(ms_now) - t3) / 1000 )) s (window $(( window_ms / 1000 )) s)"

show_rpcs "$tmp/sdiag.life" "phase 2, $nodes short jobs' lives: $life_count RPCs of mall's types"
show_rpcs "$tmp/sdiag.span" "phase 2b, one $nodes-node job's life: $span_count RPCs of mall's types"
show_rpcs "$tmp/sdiag.steady" "phase 3, $(( window_ms / 1000 )) s with $njobs jobs: $steady_count RPCs of mall's types"
note "total $(( ($(ms_now) - t_up) / 1000 )) s before the cluster goes down"
echo "ctld_rpcs_per_job_minute=$rpcs_per_minute ctld_rpcs_per_job_life=$rpcs_per_life start_delay_ms=$start_delay_ms malld_rss_kb=$rss_max ctld_rpcs_per_node_of_multinode_job=$rpcs_per_span_node"
