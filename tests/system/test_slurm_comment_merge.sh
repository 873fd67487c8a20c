#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# test_slurm_comment_merge.sh — issue 39, accounting at one RPC per node: malld
# --slurm-comment-merge slurmctld sends each node's figures to a job's AdminComment as one merge
# request, and mall's job_submit.lua (slurm_plugin/, JobSubmitPlugins=lua, which local-cluster.sh
# installs) merges it inside slurmctld. Checked on a private 4-node cluster (local-cluster.sh up
# --nodes 4, every malld with --slurm-comment-merge slurmctld), as an admin would:
#  (1) malld refuses the option with words, and starts nothing: a value other than malld|slurmctld,
#      the option without --slurm, and slurmctld with a slurm.conf whose JobSubmitPlugins has no lua;
#  (2) a 4-node malleable job (sbatch -N4 --ntasks-per-node=1 --malleable=1:2 -c1): a site's own
#      AdminComment text set by root and node3's running figures (`mallctl record`) are kept or
#      replaced as they should; from the moment the job is settled to its end slurmctld (sdiag)
#      counts exactly 4 REQUEST_UPDATE_JOB and no job read (REQUEST_JOB_INFO_SINGLE, REQUEST_FED_INFO);
#      the field then holds the site's text and each node's last figures once, without running_as_of;
#  (3) a malformed merge request from root for the running job is refused by job_submit.lua, and a
#      well-formed one from an unprivileged uid (setpriv) by slurmctld; neither changes the field;
#  (4) a single-node job's end costs one REQUEST_UPDATE_JOB and no read;
#  (5) down leaves nothing behind.
# Label `system`.
# Usage: test_slurm_comment_merge.sh BUILD_DIR SOURCE_DIR   (ctest passes both; needs root, Slurm with
# job_submit/lua, jq, unshare/nsenter/ip). One PASS/FAIL line per check; exits non-zero when any
# fails, 77 (skip) when not root. Always brings its private cluster down (trap); a watchdog ends the
# run after MALL_SYSTEST_TIMEOUT_S (default 240). Every wait polls with a deadline.
set -uo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/private_cluster.sh"   # systest_begin, pass, fail, the cluster set-up
systest_begin 240 "$@"
mallctl=$build/bin/mallctl
client=$build/bin/mall_test_client
malld=$build/bin/malld
nodes=4
systest_require "slurmctld slurmd sbatch srun scontrol sdiag jq unshare nsenter ip setpriv" \
  "$mallctl" "$client" "$malld" "$build/lib/mall_spank.so"
[ -f /usr/lib/x86_64-linux-gnu/slurm-wlm/job_submit_lua.so ] || [ -n "$(find /usr/lib* -name job_submit_lua.so -print -quit 2>/dev/null)" ] ||
  { fail "Slurm's job_submit/lua plugin (job_submit_lua.so) is not installed: install slurm-wlm-basic-plugins (launch_scripts/install-deps.sh)"; exit 1; }

private_cluster_init mall-systest-merge 6877   # folder, cgroup parent (the ports are unused: namespaces)
export MALL_CLUSTER_MALLD_ARGS="--slurm-comment-merge slurmctld"
cluster_cleanup_traps   # on exit: the cluster down (unless already), $work removed

sdiag_() { "$cluster" exec -- sdiag "$@"; }   # slurmctld is reached only from the head namespace
rpc_count() { rpc_table "$1" | awk -v t="$2" '$1 == t { n = $2 } END { print n + 0 }'; }
reads_in() { echo $(( $(rpc_count "$1" REQUEST_JOB_INFO_SINGLE) + $(rpc_count "$1" REQUEST_FED_INFO) )); }
admin_comment() { scontrol show job "$1" 2>/dev/null | sed -n 's/^ *AdminComment=//p'; }
settled_everywhere() { # settled_everywhere JOB NODE...: attached and settled on each NODE's malld
  local n
  for n in "${@:2}"; do
    [ "$(node_status "$n" | jq -r --arg j "$1" '.jobs[] | select(.job == $j) | "\(.attached > 0) \(.state)"')" = "true settled" ] || return 1
  done
}
gone_everywhere() { local n; for n in "${@:2}"; do [ -z "$(node_job_field "$n" "$1" job)" ] || return 1; done; }

# ---- (1) refusals, before any cluster: malld starts nothing, says why ---------------------------
mkdir -p "$work/refuse"
refused() { # refused WORDS CMD...: exits 2, prints WORDS on stderr, leaves no socket
  local words=$1 rc; shift
  "$@" >"$work/refuse/out" 2>"$work/refuse/err"; rc=$?
  if [ "$rc" -eq 2 ] && grep -qF -- "$words" "$work/refuse/err" && [ ! -e "$work/refuse/malld.sock" ]; then return 0; fi
  note "exit $rc, stderr: $(head -c 400 "$work/refuse/err")"
  return 1
}
base=(timeout 20 "$malld" --backend affinity --socket "$work/refuse/malld.sock" --state-dir "$work/refuse/state")
if refused "--slurm-comment-merge must be malld or slurmctld (got 'ctld')" "${base[@]}" --slurm --slurm-comment-merge ctld &&
   refused "--slurm-comment-merge applies only with --slurm" "${base[@]}" --slurm-comment-merge slurmctld; then
  pass "(1) malld refuses --slurm-comment-merge ctld and the option without --slurm, with the fix, starting nothing"
else
  fail "(1) malld did not refuse a bad --slurm-comment-merge as it should (above)"
fi

# ---- up: 4 nodes, every malld merging through slurmctld -------------------------------------------
if ! "$cluster" up --nodes $nodes >"$work/up.log" 2>&1; then
  fail "local-cluster.sh up --nodes $nodes: $(tail -n 20 "$work/up.log")"
  "$cluster" logs 10 2>/dev/null | tail -n 40 | sed 's/^/    /'
  exit 1
fi
eval "$("$cluster" env)"
all_nodes=(node1 node2 node3 node4)
if grep -qx 'JobSubmitPlugins=lua' "$MALL_CLUSTER_DIR/etc/slurm.conf" && cmp -s "$MALL_CLUSTER_DIR/etc/job_submit.lua" "$src/slurm_plugin/job_submit.lua" &&
   grep -q 'AdminComment segments merged by slurmctld' "$MALL_CLUSTER_DIR/nodes/node1/log/malld.log"; then
  pass "local-cluster.sh up --nodes $nodes: JobSubmitPlugins=lua with mall's job_submit.lua; node1's malld logs 'AdminComment segments merged by slurmctld'"
else
  fail "the cluster is not set up for slurmctld's merge: $(grep JobSubmit "$MALL_CLUSTER_DIR/etc/slurm.conf"); malld: $(grep -m1 'checking Slurm' "$MALL_CLUSTER_DIR/nodes/node1/log/malld.log")"
fi

# (1, continued) the same malld against a copy of this slurm.conf without JobSubmitPlugins=lua
sed '/^JobSubmitPlugins=/d' "$MALL_CLUSTER_DIR/etc/slurm.conf" >"$work/refuse/slurm.conf"
if refused "slurm.conf's JobSubmitPlugins is not set, without lua: add lua to it and install mall's job_submit.lua" \
     env SLURM_CONF="$work/refuse/slurm.conf" "${base[@]}" --slurm --slurm-node node1 --slurm-comment-merge slurmctld; then
  pass "(1) with a slurm.conf that names no job_submit/lua, malld --slurm-comment-merge slurmctld refuses to start and says how to fix it"
else
  fail "(1) malld started (or said something else) against a slurm.conf without JobSubmitPlugins=lua (above)"
fi

# ---- (2) a 4-node job: one update per node, no read, every figure kept --------------------------
if ! job=$(submit merged -N$nodes --ntasks-per-node=1 --malleable=1:2 -c1 --wrap "srun $client --duration-s 6 --step-us 20000"); then
  fail "(2) sbatch -N$nodes: $(cat "$work/merged.sbatch.err")"
  exit 1
fi
name=slurm-$job
if ! wait_for 30 settled_everywhere "$name" "${all_nodes[@]}"; then
  fail "(2) job $job was not attached and settled on all $nodes nodes within 30 s"
  for n in "${all_nodes[@]}"; do note "$n: $(node_status "$n" | jq -c '.jobs' 2>/dev/null)"; done
  note "job $job: $(job_state "$job"); its output: $(tail -n 8 "$work/merged.out" 2>/dev/null | tr '\n' '|')"
  exit 1
fi
scontrol update job "$job" AdminComment="site:ticket=42" 2>"$work/update.err" || fail "(2) root could not set AdminComment: $(cat "$work/update.err")"
if node_ctl node3 record "$name" >"$work/record.out" 2>&1 && [[ $(admin_comment "$job") == "site:ticket=42;mall:node3:"*running_as_of=* ]]; then
  pass "(2) mallctl record on node3 merged node3's running figures after the site's text: $(admin_comment "$job")"
else
  fail "(2) mallctl record on node3: '$(cat "$work/record.out")'; AdminComment '$(admin_comment "$job")'"
fi
# ---- (3) a malformed merge request for the running job changes nothing ---------------------------
before=$(admin_comment "$job")
if ! scontrol update job "$job" AdminComment="mall-merge;not a segment" >"$work/bad.out" 2>&1 && [ "$(admin_comment "$job")" = "$before" ]; then
  pass "(3) root's malformed merge request is refused ($(head -c 160 "$work/bad.out" | tr '\n' ' ')) and the field is unchanged"
else
  fail "(3) a malformed merge request was taken or changed the field: '$(cat "$work/bad.out")'; now '$(admin_comment "$job")'"
fi
# The same request, well formed, from a user who is not an operator (uid 61001): slurmctld refuses
# AdminComment to anyone but root, SlurmUser and operators before job_submit.lua runs.
# (Run in the head namespace: the cluster's network exists only there.)
if ! "$cluster" exec -- setpriv --reuid 61001 --regid 61001 --clear-groups scontrol update job "$job" \
       AdminComment="mall-merge;mall:node1:lent_core_s=999.0" >"$work/user.out" 2>&1 &&
   grep -qi 'denied' "$work/user.out" && [ "$(admin_comment "$job")" = "$before" ]; then
  pass "(3) uid 61001's merge request is refused ($(head -c 160 "$work/user.out" | tr '\n' ' ')) and the field is unchanged"
else
  fail "(3) uid 61001's merge request was taken or changed the field: '$(cat "$work/user.out")'; now '$(admin_comment "$job")'"
fi

# From here to the job's end no Slurm client runs: only the mallds' RPCs reach slurmctld's counters
# (and the job's own step completion, of other types).
sdiag_ --reset >/dev/null 2>&1 || fail "(2) sdiag --reset: $(sdiag_ --reset 2>&1)"
if ! wait_for 40 gone_everywhere "$name" "${all_nodes[@]}"; then fail "(2) job $job still listed by a malld 40 s later"; fi
sdiag_ >"$work/sdiag.multi" 2>&1
updates=$(rpc_count "$work/sdiag.multi" REQUEST_UPDATE_JOB)
reads=$(reads_in "$work/sdiag.multi")
if [ "$updates" -eq $nodes ] && [ "$reads" -eq 0 ]; then
  pass "(2) the $nodes-node job's end cost slurmctld $updates REQUEST_UPDATE_JOB (one per node) and $reads job reads"
else
  fail "(2) the $nodes-node job's end cost $updates REQUEST_UPDATE_JOB and $reads job reads, not $nodes and 0: $(rpc_table "$work/sdiag.multi" | tr '\n' ';')"
fi
comment=$(admin_comment "$job")
IFS=';' read -r -a parts <<<"$comment"
bad_parts=''
[ "${parts[0]:-}" = "site:ticket=42" ] || bad_parts+=" the site's text is not first;"
[ "${#parts[@]}" -eq $(( nodes + 1 )) ] || bad_parts+=" ${#parts[@]} parts, not $(( nodes + 1 ));"
for n in "${all_nodes[@]}"; do
  mine=$(printf '%s\n' "${parts[@]}" | grep -c "^mall:$n:")
  last=$(printf '%s\n' "${parts[@]}" | grep "^mall:$n:" | grep -c 'ended_at=')
  [ "$mine" -eq 1 ] && [ "$last" -eq 1 ] || bad_parts+=" $n has $mine segments, $last with ended_at;"
done
[[ $comment != *running_as_of=* ]] || bad_parts+=" a running segment is left;"
if [ -z "$bad_parts" ]; then
  pass "(2) AdminComment holds the site's text and each node's last figures once: $comment"
else
  fail "(2) AdminComment '$comment':$bad_parts"
fi

# ---- (4) a single-node job: one update, no read ---------------------------------------------------
if single=$(submit single -w node2 --malleable=1:2 -c1 --wrap "srun $client --duration-s 2 --step-us 20000") &&
   wait_for 30 settled_everywhere "slurm-$single" node2; then
  sdiag_ --reset >/dev/null 2>&1
  wait_for 30 gone_everywhere "slurm-$single" node2 || fail "(4) job $single still listed by node2's malld 30 s later"
  sdiag_ >"$work/sdiag.single" 2>&1
  updates=$(rpc_count "$work/sdiag.single" REQUEST_UPDATE_JOB)
  reads=$(reads_in "$work/sdiag.single")
  comment=$(admin_comment "$single")
  if [ "$updates" -eq 1 ] && [ "$reads" -eq 0 ] && [[ $comment == mall:node2:*ended_at=* ]] && [[ $comment != *';'* ]]; then
    pass "(4) a single-node job's end cost 1 REQUEST_UPDATE_JOB and no read; AdminComment $comment"
  else
    fail "(4) a single-node job's end cost $updates updates and $reads reads; AdminComment '$comment'"
  fi
else
  fail "(4) the single-node job did not start and settle on node2: $(cat "$work/single.sbatch.err" 2>/dev/null)"
fi

# ---- (5) down leaves nothing ----------------------------------------------------------------------
cluster_down_and_nothing_left
[ "$failures" -eq 0 ]
