#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# test_cluster_nodes.sh — proves `launch_scripts/local-cluster.sh up --nodes 2`: two Slurm nodes,
# each in network, UTS and mount namespaces of its own with its own slurmd and malld, a slurmctld in
# the head namespace, and nothing in the host's network or mounts; steps span both nodes; a dead
# daemon is restarted alone by a second up; bad --nodes values are refused and change nothing; down
# leaves no process, namespace, cgroup or folder. Label `system`. (test_slurm_nodes.sh runs
# malleable jobs on such a cluster.)
# Usage: test_cluster_nodes.sh BUILD_DIR SOURCE_DIR   (ctest passes both; needs root, Slurm, iproute2)
# Prints one PASS/FAIL line per check; exits non-zero when any check fails, 77 (skip) when not root.
# Always brings its private cluster down (trap); a watchdog ends the run after MALL_SYSTEST_TIMEOUT_S
# (default 300).
set -uo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/private_cluster.sh"   # systest_begin, pass, fail, the cluster set-up
systest_begin 300 "$@"
mallctl=$build/bin/mallctl
systest_require "slurmctld slurmd sbatch srun scontrol sinfo ip nsenter unshare jq" "$mallctl" "$build/bin/malld" "$build/lib/mall_spank.so"

private_cluster_init mall-systest-nodes 6867
cluster_cleanup_traps   # on exit: the cluster down (unless already), $work removed

host_links_before=$(ip -o link show | awk -F': ' '{print $2}' | sort | tr '\n' ' ')
host_addrs_before=$(ip -o addr show | awk '{print $2, $4}' | sort | tr '\n' ' ')
host_mounts_before=$(awk '{print $5}' /proc/self/mountinfo | sort | tr '\n' ' ')

# ---- bad values are refused before anything starts --------------------------------------------------
for bad in 0 abc 201; do
  out=$("$cluster" up --nodes "$bad" 2>&1); rc=$?
  if [ $rc -eq 2 ] && grep -q -- "--nodes must be a node count from 1 to 200, not '$bad'" <<<"$out" && [ ! -e "$MALL_CLUSTER_DIR" ]; then
    pass "up --nodes $bad is refused (exit 2, nothing made): $out"
  else
    fail "up --nodes $bad: exit $rc, '$out', state folder $( [ -e "$MALL_CLUSTER_DIR" ] && echo made || echo absent)"
  fi
done

# ---- up ---------------------------------------------------------------------------------------------
t0=$(date +%s%N)
if ! "$cluster" up --nodes 2 >"$work/up.log" 2>&1; then
  fail "local-cluster.sh up --nodes 2: $(cat "$work/up.log")"; "$cluster" logs 20; exit 1
fi
pass "local-cluster.sh up --nodes 2 in $(( ($(date +%s%N) - t0) / 1000000 )) ms: $(head -n1 "$work/up.log")"
eval "$("$cluster" env)"
if [ "$MALL_CLUSTER_NODES" = "node1 node2" ] && [ "$(command -v sbatch)" = "$MALL_CLUSTER_DIR/bin/sbatch" ] &&
   [ "$MALL_SOCKET" = "$MALL_CLUSTER_DIR/nodes/node1/malld.sock" ]; then
  pass "env: MALL_CLUSTER_NODES='$MALL_CLUSTER_NODES', Slurm's clients from $MALL_CLUSTER_DIR/bin, MALL_SOCKET node1's malld"
else
  fail "env: nodes '${MALL_CLUSTER_NODES:-}', sbatch $(command -v sbatch), MALL_SOCKET $MALL_SOCKET"
fi

# The host's network and mounts are untouched: the bridge, veths and addresses live in the namespaces.
if [ "$(ip -o link show | awk -F': ' '{print $2}' | sort | tr '\n' ' ')" = "$host_links_before" ] &&
   [ "$(ip -o addr show | awk '{print $2, $4}' | sort | tr '\n' ' ')" = "$host_addrs_before" ] &&
   [ "$(awk '{print $5}' /proc/self/mountinfo | sort | tr '\n' ' ')" = "$host_mounts_before" ]; then
  pass "the host's links, addresses and mounts are unchanged"
else
  fail "the host changed: links '$(ip -o link show | awk -F': ' '{print $2}' | tr '\n' ' ')' addresses '$(ip -o addr show | awk '{print $2, $4}' | tr '\n' ' ')'"
fi

# Each node: its host name, its address on eth0, its own folder at $MALL_CLUSTER_DIR/node, and the
# host's cgroup hierarchies (nsenter, unlike `ip netns exec`, keeps /sys/fs/cgroup).
for k in 1 2; do
  view=$("$cluster" exec "node$k" -- sh -c "hostname; ip -4 -o addr show eth0 | awk '{print \$4}'; ls '$MALL_CLUSTER_DIR/node'; stat -f -c %T /sys/fs/cgroup/cpuset" 2>&1 | tr '\n' ' ')
  if [[ $view == "node$k 10.215.0.$k/24 "*"malld.sock"*"cgroupfs " ]]; then
    pass "node$k: host name, address, own folder with its malld.sock, cgroup hierarchies: $view"
  else
    fail "node$k's view: $view"
  fi
done
if [ "$("$cluster" exec -- sh -c "ip -4 -o addr show br0 | awk '{print \$4}'; hostname")" = "10.215.0.254/24
$(hostname)" ]; then
  pass "the head namespace holds the bridge (10.215.0.254) under the host's name"
else
  fail "head namespace: $("$cluster" exec -- ip -4 -o addr 2>&1 | tr '\n' ' ')"
fi

# Each node has its own malld (its own cgroup parent) and slurmd (pid, spool, log).
for k in 1 2; do
  backend=$(timeout 10 "$mallctl" --socket "$MALL_CLUSTER_DIR/nodes/node$k/malld.sock" status --json | jq -r '.backend' 2>/dev/null)
  mpid=$(cat "$MALL_CLUSTER_DIR/run/malld@node$k.pid"); spid=$(cat "$MALL_CLUSTER_DIR/run/slurmd@node$k.pid")
  if [ -n "$backend" ] && [ "$(readlink "/proc/$mpid/ns/uts")" = "$(readlink "/proc/$spid/ns/uts")" ] &&
     [ "$(readlink "/proc/$mpid/ns/uts")" != "$(readlink /proc/self/ns/uts)" ] &&
     [ -s "$MALL_CLUSTER_DIR/nodes/node$k/slurmd.slurm.pid" ] && [ -d "$MALL_CLUSTER_DIR/nodes/node$k/spool" ] &&
     grep -q "slurmd version .* started" "$MALL_CLUSTER_DIR/nodes/node$k/log/slurmd.log"; then
    pass "node$k: malld (pid $mpid, backend $backend) and slurmd (pid $spid) in the node's namespaces, with their own pid file, spool and log"
  else
    fail "node$k: malld backend '$backend', malld/slurmd pids $mpid/$spid"
  fi
done
if [ "$(sinfo -h -N -o '%N %t %c' | tr '\n' ' ')" = "node1 idle 2 node2 idle 2 " ]; then
  pass "sinfo (through the wrapper, from the host): node1 and node2 idle, 2 cpus each"
else
  fail "sinfo: $(sinfo -N 2>&1 | tr '\n' ' ')"
fi

# ---- a step across both nodes --------------------------------------------------------------------------
out=$(timeout 60 srun -N2 -n2 sh -c 'echo "$SLURM_NODEID $(hostname) $(ip -4 -o addr show eth0 | awk "{print \$4}")"' 2>&1 | sort | tr '\n' ' ')
if [ "$out" = "0 node1 10.215.0.1/24 1 node2 10.215.0.2/24 " ]; then
  pass "srun -N2 -n2: one task on each node, each in its node's namespaces: $out"
else
  fail "srun -N2 -n2: $out"
fi
job=$(sbatch --parsable -N2 --ntasks-per-node=1 --output="$work/batch.out" --wrap 'srun hostname' 2>&1)
if wait_for 60 job_final "$job" && [ "$(job_state "$job")" = COMPLETED ] && [ "$(sort "$work/batch.out" | tr '\n' ' ')" = "node1 node2 " ]; then
  pass "sbatch -N2 job $job: its batch step's srun (in node1, through the wrapper) ran on both nodes"
else
  fail "sbatch -N2 job $job: $(job_state "$job"), output '$(cat "$work/batch.out" 2>/dev/null)'"
fi

# ---- a dead daemon is restarted alone -----------------------------------------------------------------
spid=$(cat "$MALL_CLUSTER_DIR/run/slurmd@node2.pid")
kill -KILL "$spid"
wait_for 10 bash -c "! [ -d /proc/$spid ] || grep -q '^State:.*Z' /proc/$spid/status"
if out=$("$cluster" up 2>&1) && grep -q 'started slurmd@node2$' <<<"$out" && [ "$(sinfo -h -N -o '%N %t' | tr '\n' ' ')" = "node1 idle node2 idle " ]; then
  pass "after slurmd@node2 was killed, a second up started it alone and both nodes are idle: $(head -n1 <<<"$out")"
else
  fail "second up after killing slurmd@node2: $out / $(sinfo -N 2>&1 | tr '\n' ' ')"
fi
out=$("$cluster" up --nodes 3 2>&1)
if grep -q "warning: the cluster runs with 2 node(s)" <<<"$out" && grep -q "already up" <<<"$out"; then
  pass "up --nodes 3 on a running 2-node cluster keeps it and says how to change it"
else
  fail "up --nodes 3 on a running cluster: $out"
fi

# ---- down: no process, namespace, cgroup or folder --------------------------------------------------------
netns_of_run=$(cut -d' ' -f2 "$MALL_CLUSTER_DIR/run/netns" | tr '\n' ' ')
cluster_down_and_nothing_left
in_netns=''
for p in /proc/[0-9]*; do
  ns=$(readlink "$p/ns/net" 2>/dev/null) || continue
  [[ " $netns_of_run " == *" $ns "* ]] && live "${p#/proc/}" && in_netns+="${p#/proc/} "
done
if [ -z "$in_netns" ] && [ "$(ip -o link show | awk -F': ' '{print $2}' | sort | tr '\n' ' ')" = "$host_links_before" ]; then
  pass "no process is left in the cluster's namespaces ($netns_of_run): the kernel frees them"
else
  fail "processes left in the cluster's namespaces: $in_netns"
fi

note "run time: ${SECONDS}s"
if [ $failures -eq 0 ]; then echo "test_cluster_nodes: all checks passed"; exit 0; fi
echo "test_cluster_nodes: $failures check(s) failed"
exit 1
