#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# local-cluster.sh — a Slurm 22.05 cluster on this machine, without systemd, for mall's demos and
# system tests: munged (or auth/none), slurmctld, one slurmd and one malld per node, the mall SPANK
# plugin (when built), every file under one folder, every daemon tracked by its pid. One node on
# localhost by default; `up --nodes N` makes N nodes, each in network, UTS and mount namespaces of its
# own on a private bridge (see --help). Contract: `down` removes everything `up` made.
# It stays one script (about 1,000 lines) on purpose: `down` must undo exactly what `up` made, both
# read the same layout of one folder, and that is easiest to check with both side by side.
#
# Choices, and why:
# - Slurm's process tracking and task plugins (`up --cgroup-plugins`, see --help): `linuxproc` (the
#   default) is ProctrackType=proctrack/linuxproc + TaskPlugin=task/affinity, the simplest pair that
#   works here: Slurm then creates no cgroups of its own, so malld's cpusets (under "mall_cluster")
#   are the only ones on the node. `cgroup` is proctrack/cgroup + task/cgroup,task/affinity with a
#   cgroup.conf (ConstrainCores=yes, the cgroup plugin named for the hierarchy this node mounts), as
#   most sites run Slurm: each task then lives in Slurm's step cgroup and malld resizes that cgroup
#   in place. `down` removes the cgroups Slurm made for this cluster.
# - auth/munge + cred/munge with a private munged (run as user munge, socket under the cluster
#   folder) when munge is installed; otherwise auth/none + cred/none, which Slurm 22.05 accepts. `up`
#   says which one it used.
# - SlurmUser=root, select/cons_tres with CR_Core, batch_sched_delay=0 (jobs start at once),
#   MpiDefault=pmix (Debian's Open MPI only speaks PMIx), node values from `slurmd -C`.
# - --nodes N: namespaces held by `sleep infinity` holders and entered with nsenter (`ip netns exec`
#   would remount /sys and hide the cgroup hierarchies); Debian's slurmd is built for several slurmd
#   per host (-N, %n in its spool, pid and log paths), so one munged serves every node.
# - PlugStackConfig names a generated plugstack.conf that loads <build>/lib/mall_spank.so as
#   `optional` when that file exists, so the cluster works with or without the plugin.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${MALL_BUILD_DIR:-$repo/build}
[ -d "$build" ] && build=$(cd "$build" && pwd)
dir=${MALL_CLUSTER_DIR:-/tmp/mall-cluster}
[[ $dir == /* ]] || dir=$PWD/$dir
ctld_port=${MALL_CLUSTER_PORT:-6817}
slurmd_port=$(( ctld_port + 1 ))
cgroup_parent=${MALL_CLUSTER_CGROUP:-mall_cluster}
cgroup_plugins=${MALL_CLUSTER_CGROUP_PLUGINS:-}   # linuxproc|cgroup; empty: the marker's, else linuxproc
wait_s=${MALL_CLUSTER_TIMEOUT_S:-30}
node=$(hostname -s)
prog=local-cluster.sh

usage() {
  cat <<EOF
$prog — a Slurm cluster on this machine, with mall's malld (one per node) and SPANK plugin

Usage: launch_scripts/$prog up [--nodes N] [--cgroup-plugins linuxproc|cgroup]
       launch_scripts/$prog down|status|env|logs [N]
       launch_scripts/$prog exec [NODE] -- COMMAND [ARG...]
       launch_scripts/$prog -h|--help

Commands:
  up      write the configuration and start munged, malld, slurmctld and slurmd (those not already
          running), then wait until the controller answers and every node is idle. Idempotent: when
          everything runs it returns at once; a daemon that died is started again alone. Needs root.
          --nodes N   (1 to 200; default 1, or what the running cluster has; remembered)
            1   one node named after this host ($node), on 127.0.0.1: the classic set-up.
            N   nodes node1..nodeN. Each node has network, UTS (host name nodeK) and mount
                namespaces of its own, its own slurmd and malld (cgroup parent
                ${cgroup_parent}_nodeK), spool, TmpFS, logs and malld state under
                \$MALL_CLUSTER_DIR/nodes/nodeK; inside node K, \$MALL_CLUSTER_DIR/node is that folder,
                so plugstack.conf's one socket path names each node's own malld. Node K's veth
                has address $subnet.K on a bridge in a "head" namespace ($subnet.254), where
                slurmctld runs. These addresses exist only inside the cluster's namespaces: the
                host's network is never touched, and Slurm's clients reach slurmctld through
                wrappers in \$MALL_CLUSTER_DIR/bin (env puts them first in PATH; from the host
                they enter the head namespace, as root; inside a job they run directly).
                All nodes share this machine's cpus ($(nproc --all 2>/dev/null) here) and each reports
                them all: the nodes are logically separate and physically overlapping. Per-node
                cpu lists, cpusets and malld's decisions are real; the cluster's total is not. No pid namespace: task pids are the host's,
                so /proc/PID/status and malld's cgroups read the same from anywhere.
                Open MPI ranks on different nodes talk over TCP on the bridge (IPv6 is off in
                the namespaces). Reach node K's malld from the host with
                  mallctl --socket \$MALL_CLUSTER_DIR/nodes/nodeK/malld.sock status
          --cgroup-plugins linuxproc|cgroup   Slurm's process tracking and task plugins (also
          MALL_CLUSTER_CGROUP_PLUGINS; the option wins; remembered for down/status):
            linuxproc  (default) ProctrackType=proctrack/linuxproc, TaskPlugin=task/affinity: Slurm
                       makes no cgroups; malld puts each malleable task in a cpuset folder of its
                       own under $cgroup_parent. The fastest start.
            cgroup     ProctrackType=proctrack/cgroup, TaskPlugin=task/cgroup,task/affinity and an
                       etc/cgroup.conf with ConstrainCores=yes and CgroupPlugin=cgroup/v1 or
                       cgroup/v2, whichever this node mounts (/sys/fs/cgroup a tmpfs of v1
                       hierarchies with cpuset: v1; a cgroup2 mount: v2). Written explicitly:
                       Slurm's "autodetect" fails when /sys/fs/cgroup/systemd is missing. Slurm then
                       keeps each task in its step cgroup, tracks and kills the job through it, and
                       malld resizes that cgroup in place (mallctl status: in place). Slurm puts
                       each task there before the plugin registers it (task_post_fork):
                         v1: /sys/fs/cgroup/cpuset/slurm_$node/uid_<uid>/job_<id>/step_<step>
                             (step_batch, step_0, ...; slurmstepd sits there too) and the same
                             path under /sys/fs/cgroup/freezer for proctrack/cgroup
                         v2: /sys/fs/cgroup/system.slice/${node}_slurmstepd.scope/job_<id>/
                             step_<step>/user/task_special (task_<n> with memory or accounting
                             cgroups); slurmstepd in .../step_<step>/slurm
                       Before a later step of a job malld has grown, the plugin pins the job to
                       its Slurm cores until the step's cgroups exist: task/cgroup writes the job
                       cgroup's cpus back for every step, which v1 refuses while a grown step
                       cgroup is wider (the step would fail).
                       Slurm 22.05.8's cgroup/v2 runs without systemd (checked in the qemu guest of
                       tests/vm, ctest vm.slurm_cgroup_v2) given two things:
                       - IgnoreSystemd=yes (written): without it slurmd asks systemd over D-Bus
                         for its stepd scope and stops: "cgroup_dbus_attach_to_scope: cannot
                         connect to dbus system daemon", "cannot initialize cgroup directory for
                         stepds" (src/plugins/cgroup/v2/cgroup_v2.c:736, slurm-22-05-8-1);
                       - the folder /sys/fs/cgroup/system.slice: slurmd makes its scope with a
                         plain mkdir (no parents) and otherwise stops: "Could not create scope
                         directory .../system.slice/${node}_slurmstepd.scope: No such file or
                         directory" (cgroup_v2.c:592). up makes it; down removes it if up did.
                       CgroupAutomount=yes (written) lets slurmd enable cpuset from the root down.
                       Slurm names its cgroup root after the node, not the cluster: only one cluster
                       with the cgroup plugins can run on a node at a time, and up refuses to start
                       slurmd while Slurm's cgroups on this node hold processes.
  down    cancel the cluster's jobs, stop every daemon by its pid (SIGTERM, SIGKILL after a
          deadline; with the cgroup plugins also any process left in Slurm's cgroups of this node),
          remove the cgroups the cluster made (malld's $cgroup_parent; with the cgroup plugins
          Slurm's slurm_$node folders in every v1 hierarchy, or on v2 its
          system.slice/${node}_slurmstepd.scope) and the whole state folder. Idempotent.
  status  each daemon with its pid, then sinfo. Exit 0 when all run, 1 when some do, 3 when none.
  env     the export lines a shell needs to use the cluster (with --nodes also PATH with the
          client wrappers and MALL_CLUSTER_NODES, the node names; MALL_SOCKET is node1's malld):
            eval "\$(launch_scripts/$prog env)"
  exec [NODE] -- COMMAND  (--nodes N only; root) COMMAND in node NODE's namespaces (its network,
          host name and mounts), or without NODE in the head namespace (the clients' view).
  logs [N] the last N lines (default 15) of every malld's, slurmctld's and slurmd's log, for scripts
          that report a failure before they bring the cluster down.

Environment:
  MALL_CLUSTER_DIR        state folder: configuration, logs, pid files, spool, malld socket
                          (default /tmp/mall-cluster; now $dir)
  MALL_BUILD_DIR          build folder with bin/malld and lib/mall_spank.so (default <repo>/build)
  MALL_CLUSTER_PORT       slurmctld port; slurmd uses the next one (default 6817; with --nodes
                          the same in every namespace: the ports are the namespaces' own)
  MALL_CLUSTER_NODES_COUNT  the node count when up has no --nodes (default 1)
  MALL_CLUSTER_SUBNET     the first three numbers of the nodes' private /24 (default 10.215.0)
  MALL_CLUSTER_AUTH       munge|none (default: munge when munged is installed, else none)
  MALL_CLUSTER_CGROUP     malld's cgroup parent (default mall_cluster)
  MALL_CLUSTER_CGROUP_PLUGINS  linuxproc|cgroup, as up's --cgroup-plugins (default linuxproc)
  MALL_CLUSTER_TIMEOUT_S  how long up/down wait for each step (default 30)
  MALL_CLUSTER_MALLD_SLURM  1 (default): start malld with --slurm (checks jobs against slurmctld)
                          when it supports it; 0: without
  MALL_CLUSTER_PLUGIN_ARGS more plugstack.conf arguments for the mall plugin after socket=
                          (e.g. "prolog_lookup=yes"; docs/admin-slurm.md lists them)
  MALL_CLUSTER_MALLD_ARGS more malld options for every node, split at spaces (e.g.
                          '--slurm-comment-interval 60 --metrics-file /run/mall.prom')

Files under the state folder:
  etc/slurm.conf etc/plugstack.conf   the generated configuration (SLURM_CONF points here)
  etc/cli_filter.lua etc/job_submit.lua  mall's submission filter and AdminComment merge
                                      (slurm_plugin/; malld merges itself unless given
                                      --slurm-comment-merge slurmctld in MALL_CLUSTER_MALLD_ARGS)
  etc/cgroup.conf                     with --cgroup-plugins cgroup only
  log/*.log                           slurmctld, slurmd, malld logs (munge/munged.log for munged)
  run/*.pid                           pid of each daemon as started by this script
  malld.sock malld/                   malld's socket and state folder
  tmp/                                the node's TmpFS (PMIx step folders)
  with --nodes N instead of the last three, per node K:
  nodes/nodeK/{malld.sock,malld/,spool/,tmp/,log/}   node K's malld, Slurm spool, TmpFS and logs
  run/ns-head.pid run/ns@nodeK.pid    the namespace holders; run/netns their namespaces
  bin/                                the client wrappers (sbatch, srun, salloc, scancel, ...)

Example:
  launch_scripts/$prog up
  eval "\$(launch_scripts/$prog env)"
  sbatch --wrap 'grep Cpus_allowed_list /proc/self/status'
  launch_scripts/$prog status
  launch_scripts/$prog down

  launch_scripts/$prog up --cgroup-plugins cgroup
  srun --malleable=1:2 -c 1 sh -c 'cat /proc/self/cgroup; grep Cpus_allowed_list /proc/self/status'

  launch_scripts/$prog up --nodes 2
  eval "\$(launch_scripts/$prog env)"
  srun -N2 --ntasks-per-node=1 --malleable=1:2 sh -c 'echo \$(hostname) \$(grep Cpus_allowed_list /proc/self/status)'
  mallctl --socket \$MALL_CLUSTER_DIR/nodes/node2/malld.sock status
  launch_scripts/$prog exec node2 -- ip -4 addr show eth0
EOF
}

say() { printf '%s: %s\n' "$prog" "$*"; }
die() { printf '%s: error: %s\n' "$prog" "$*" >&2; exit 1; }

conf=$dir/etc/slurm.conf
plugstack=$dir/etc/plugstack.conf
marker=$dir/.mall-cluster
# A cluster remembers the port and cgroup parent it was brought up with (in its marker file), so
# `down`, `status` and `env` need only MALL_CLUSTER_DIR; explicit variables still win.
saved_nodes=''
if [ -s "$marker" ]; then
  saved_nodes=$(sed -n 's/^nodes=//p' "$marker")
  saved_port=$(sed -n 's/^port=//p' "$marker")
  saved_cgroup=$(sed -n 's/^cgroup=//p' "$marker")
  saved_plugins=$(sed -n 's/^plugins=//p' "$marker")
  if [ -z "$cgroup_plugins" ] && [ -n "$saved_plugins" ]; then cgroup_plugins=$saved_plugins; fi
  if [ -z "${MALL_CLUSTER_PORT:-}" ] && [ -n "$saved_port" ]; then
    ctld_port=$saved_port
    slurmd_port=$(( ctld_port + 1 ))
  fi
  if [ -z "${MALL_CLUSTER_CGROUP:-}" ] && [ -n "$saved_cgroup" ]; then cgroup_parent=$saved_cgroup; fi
fi
munge_sock=$dir/munge/munge.socket.2
plugin=$build/lib/mall_spank.so
subnet=${MALL_CLUSTER_SUBNET:-10.215.0}   # --nodes N: node K is $subnet.K, the head (slurmctld) .254
n_nodes=${saved_nodes:-1}                 # up --nodes N sets it; down/status/env read the marker's

# ---- the nodes ----------------------------------------------------------------------------------
# One node (the default): this host, on 127.0.0.1, daemons named malld and slurmd. N >= 2 nodes:
# node1..nodeN, each in network, UTS and mount namespaces of its own (see --help), daemons named
# malld@nodeK and slurmd@nodeK; slurmctld and every client run in the "head" namespace, which holds
# the bridge. set_nodes fills node_names, daemons_up_order and daemons_down_order.
multi() { [ "$n_nodes" -gt 1 ]; }
set_nodes() {
  local k
  node_names=()
  if multi; then
    for (( k = 1; k <= n_nodes; k++ )); do node_names+=("node$k"); done
    daemons_up_order=(munged)
    for k in "${node_names[@]}"; do daemons_up_order+=("malld@$k"); done
    daemons_up_order+=(slurmctld)
    for k in "${node_names[@]}"; do daemons_up_order+=("slurmd@$k"); done
    daemons_down_order=()
    for (( k = ${#daemons_up_order[@]} - 1; k >= 0; k-- )); do daemons_down_order+=("${daemons_up_order[k]}"); done
  else
    node_names=("$node")
    daemons_up_order=(munged malld slurmctld slurmd)
    daemons_down_order=(slurmd slurmctld malld munged)
  fi
}
node_of() { [[ $1 == *@* ]] && echo "${1#*@}"; }   # malld@node2 -> node2; malld -> ""
node_home() { echo "$dir/nodes/$1"; }              # node K's private folder, seen from the host
malld_sock_of() { if multi; then echo "$dir/nodes/$1/malld.sock"; else echo "$dir/malld.sock"; fi; }
# Inside node K's mount namespace $dir/node is node K's folder: one path in the shared configuration
# (plugstack.conf's socket=) names each node's own malld socket.
inner_node=$dir/node
v2_scope_of() { echo "/sys/fs/cgroup/system.slice/${1}_slurmstepd.scope"; }   # Slurm 22.05's cgroup/v2 stepd scope
malld_cgroup_of() { if multi; then echo "${cgroup_parent}_$1"; else echo "$cgroup_parent"; fi; }

# ---- processes ----------------------------------------------------------------------------------
# A pid is "alive" when /proc/PID/stat exists, its state is not zombie/dead and its comm is the
# expected name. kill -0 is not enough: orphans stay zombies until init reaps them, which is late here.
proc_state() { # proc_state PID: the state letter of /proc/PID/stat, empty when gone
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  stat=${stat##*) }
  printf '%s' "${stat%% *}"
}
alive() { # alive PID [COMM]
  local pid=$1 want=${2:-} state comm
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  state=$(proc_state "$pid")
  [ -n "$state" ] && [ "$state" != Z ] && [ "$state" != X ] || return 1
  if [ -n "$want" ]; then
    comm=$(cat "/proc/$pid/comm" 2>/dev/null) || return 1
    [ "$comm" = "$want" ] || return 1
  fi
}
pidfile() { printf '%s/run/%s.pid' "$dir" "$1"; }
# A daemon's process name: slurmd@node2 is a slurmd; the namespace holders (ns-head, ns@nodeK) sleep.
comm_of() { case $1 in ns-head|ns@*) echo sleep ;; *) echo "${1%@*}" ;; esac; }
daemon_pid() { # daemon_pid NAME: prints the pid when the daemon runs, else fails
  local pid
  pid=$(cat "$(pidfile "$1")" 2>/dev/null) || return 1
  alive "$pid" "$(comm_of "$1")" || return 1
  printf '%s' "$pid"
}
stop_pid() { # stop_pid PID NAME: SIGTERM, SIGKILL after the deadline; true when it is gone
  local pid=$1 name=$2 deadline
  alive "$pid" || return 0
  kill -TERM "$pid" 2>/dev/null || true
  deadline=$(( SECONDS + wait_s / 3 + 1 ))
  while alive "$pid" && [ $SECONDS -lt $deadline ]; do sleep 0.05; done
  if alive "$pid"; then
    say "$name (pid $pid) still runs $(( wait_s / 3 + 1 ))s after SIGTERM; sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    deadline=$(( SECONDS + 5 ))
    while alive "$pid" && [ $SECONDS -lt $deadline ]; do sleep 0.05; done
  fi
  ! alive "$pid"
}
descendants() { # descendants PID: every live descendant pid, deepest last
  local parent=$1 p ppid stat
  for p in /proc/[0-9]*; do
    stat=$(cat "$p/stat" 2>/dev/null) || continue
    stat=${stat##*) }
    ppid=$(cut -d' ' -f2 <<<"$stat")
    if [ "$ppid" = "$parent" ]; then echo "${p#/proc/}"; descendants "${p#/proc/}"; fi
  done
}
# Every process that this cluster's daemons started carries MALL_CLUSTER_DAEMON=<dir> in its own
# environment (slurmstepd inherits slurmd's): that finds step daemons left behind by a killed slurmd.
# namespace_processes: every live process in one of the cluster's network namespaces (run/netns).
namespace_processes() {
  local p ns inodes
  [ -s "$dir/run/netns" ] || return 0
  inodes=" $(cut -d' ' -f2 "$dir/run/netns" | tr '\n' ' ')"
  for p in /proc/[0-9]*; do
    ns=$(readlink "$p/ns/net" 2>/dev/null) || continue   # unreadable (another user namespace): not ours
    [ -n "$ns" ] && [[ $inodes == *" $ns "* ]] || continue
    if alive "${p#/proc/}"; then echo "${p#/proc/}"; fi
  done
}
holder_pids() { local n; for n in ns-head "${node_names[@]/#/ns@}"; do daemon_pid "$n" 2>/dev/null && echo; done; }
any_slurmd_alive() { local n; for n in "${daemons_up_order[@]}"; do [[ $n == slurmd* ]] && daemon_pid "$n" >/dev/null && return 0; done; return 1; }
cluster_processes() {
  local p
  for p in /proc/[0-9]*; do
    [ "${p#/proc/}" = $$ ] && continue
    grep -qzxF "MALL_CLUSTER_DAEMON=$dir" "$p/environ" 2>/dev/null || continue
    if alive "${p#/proc/}"; then echo "${p#/proc/}"; fi
  done
}

# ---- waiting (poll with a deadline, never a fixed sleep) ----------------------------------------
wait_until() { # wait_until WHAT CMD...: polls CMD until it succeeds; fails after $wait_s seconds
  local what=$1; shift
  local deadline=$(( SECONDS + wait_s ))
  until "$@" >/dev/null 2>&1; do
    check_daemons_alive
    [ $SECONDS -lt $deadline ] ||
      die "timed out after ${wait_s}s waiting for $what; see the logs in $dir/log, then run: $prog down && $prog up"
    sleep 0.05
  done
}
check_daemons_alive() { # while waiting: a daemon that died is reported with its log tail
  local name
  for name in "${started[@]}"; do
    # No name check here: for a moment after the start the process is still setsid/setpriv.
    alive "$(cat "$(pidfile "$name")" 2>/dev/null)" && continue
    say "$name exited during start-up; the end of its output ($(outfile "$name"), $(logfile "$name")):" >&2
    tail -n 20 "$(outfile "$name")" >&2 2>/dev/null || true
    [ "$(outfile "$name")" = "$(logfile "$name")" ] || tail -n 20 "$(logfile "$name")" >&2 2>/dev/null || true
    die "$name did not start (see its log above); fix the cause, then run: $prog down && $prog up"
  done
}
logfile() {
  if [ "$1" = munged ]; then echo "$dir/munge/munged.log"
  elif [ -n "$(node_of "$1")" ]; then echo "$(node_home "$(node_of "$1")")/log/${1%@*}.log"
  else echo "$dir/log/$1.log"; fi
}
# Where a daemon's stdout/stderr go: malld logs to stderr only; the others write their log file
# themselves and print only start-up failures (e.g. a bad slurm.conf) to stderr.
outfile() {
  case $1 in
    malld|malld@*) logfile "$1" ;;
    *@*|ns-head) echo "$(dirname "$(logfile "$1")")/${1%@*}.stderr" ;;
    *) echo "$dir/log/$1.stderr" ;;
  esac
}

# ---- configuration ------------------------------------------------------------------------------
auth_mode() {
  case ${MALL_CLUSTER_AUTH:-auto} in
    munge) command -v munged >/dev/null || die "MALL_CLUSTER_AUTH=munge but munged is not installed: run launch_scripts/install-deps.sh"
           echo munge ;;
    none)  echo none ;;
    auto)  if command -v munged >/dev/null 2>&1 && id munge >/dev/null 2>&1; then echo munge; else echo none; fi ;;
    *)     die "MALL_CLUSTER_AUTH must be munge or none, not '${MALL_CLUSTER_AUTH}'" ;;
  esac
}

# Slurm's cgroup plugin for this node's hierarchy, by the rule of Slurm 22.05's "autodetect"
# (src/common/cgroup.c) minus its need for /sys/fs/cgroup/systemd: a cgroup2 mount at
# /sys/fs/cgroup is v2; a tmpfs there with a v1 cpuset hierarchy is v1.
slurm_cgroup_version() {
  case $(stat -f -c %T /sys/fs/cgroup/ 2>/dev/null) in
    cgroup2fs) echo v2 ;;
    tmpfs) if [ "$(stat -f -c %T /sys/fs/cgroup/cpuset/ 2>/dev/null)" = cgroupfs ]; then echo v1; else
             die "--cgroup-plugins cgroup: /sys/fs/cgroup is a tmpfs without a v1 cpuset hierarchy at /sys/fs/cgroup/cpuset; Slurm's task/cgroup cannot constrain cores here (use --cgroup-plugins linuxproc)"
           fi ;;
    *) die "--cgroup-plugins cgroup: nothing usable is mounted at /sys/fs/cgroup (neither cgroup2 nor a tmpfs of v1 hierarchies); use --cgroup-plugins linuxproc" ;;
  esac
}
# The cgroups Slurm's plugins make for this node (not for this cluster: Slurm names them after the
# node), in every hierarchy: v1 /sys/fs/cgroup/<controller>/slurm_<node>, v2 the stepd scope.
slurm_cgroup_roots() {
  local h n
  for n in "${node_names[@]}"; do
    for h in /sys/fs/cgroup/*/; do
      h=${h%/}
      if [ -d "$h/slurm_$n" ]; then echo "$h/slurm_$n"; fi
    done
    if [ -d "$(v2_scope_of "$n")" ]; then v2_scope_of "$n"; fi
  done
}
pids_in_tree() { # pids_in_tree DIR...: every pid in the cgroups at and below each DIR
  local d
  find "$@" -name cgroup.procs -type f 2>/dev/null | while read -r d; do cat "$d" 2>/dev/null; done | sort -un
}

write_config() { # write_config AUTH write|check: (re)writes slurm.conf, cgroup.conf and
  # plugstack.conf, or only compares; true when the files differ from what this call would write
  local auth=$1 mode=$2 nodeline new changed=0 proctrack task
  if [ "$cgroup_plugins" = cgroup ]; then
    proctrack=proctrack/cgroup; task=task/cgroup,task/affinity
  else
    proctrack=proctrack/linuxproc; task=task/affinity
  fi
  nodeline=$(slurmd -C 2>/dev/null) || true
  nodeline=$(grep -m1 '^NodeName=' <<<"$nodeline") ||
    die "'slurmd -C' printed no node line; check that slurmd runs on this machine (launch_scripts/install-deps.sh)"
  local ctld_addr=127.0.0.1 spool=$dir/spool slurmd_pid=$dir/run/slurmd.slurm.pid
  local slurmd_log=$dir/log/slurmd.log tmpfs=$dir/tmp what="a single-node cluster" k
  if multi; then
    # Every node has this machine's hardware (they share its cpus); each is reached at its own
    # address on the cluster's bridge. %n (the node name) keeps each slurmd's files apart: a shared
    # SlurmdPidFile would let one slurmd kill another at its start.
    local hardware=${nodeline#NodeName=* }
    nodeline="NodeName=DEFAULT $hardware State=UNKNOWN"
    for (( k = 1; k <= n_nodes; k++ )); do nodeline+=$'\n'"NodeName=node$k NodeAddr=$subnet.$k"; done
    ctld_addr=$subnet.254
    spool=$dir/nodes/%n/spool; slurmd_pid=$dir/nodes/%n/slurmd.slurm.pid
    slurmd_log=$dir/nodes/%n/log/slurmd.log; tmpfs=$dir/nodes/%n/tmp
    what="a cluster of $n_nodes nodes in network namespaces"
  else
    nodeline="$nodeline NodeAddr=127.0.0.1 State=UNKNOWN"
  fi
  new=$(cat <<EOF
# Generated by launch_scripts/$prog for $what; rewritten by 'up' when no daemon runs.
ClusterName=mall
SlurmctldHost=$node($ctld_addr)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
$(if [ "$auth" = munge ]; then
    printf 'AuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket=%s\n' "$munge_sock"
  else
    printf 'AuthType=auth/none\nCredType=cred/none\n'
  fi)
StateSaveLocation=$dir/state
SlurmdSpoolDir=$spool
SlurmctldPidFile=$dir/run/slurmctld.slurm.pid
SlurmdPidFile=$slurmd_pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$slurmd_log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=$proctrack
TaskPlugin=$task
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
MpiDefault=pmix
# PMIx makes a per-step folder under TmpFS named by uid, job id and step only: a cluster folder of
# its own keeps a new cluster's job 1 from colliding with a dead cluster's leftover /tmp folders.
TmpFS=$tmpfs
MailProg=/bin/true
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
ReturnToService=2
KillWait=2
MinJobAge=600
PlugStackConfig=$plugstack
CliFilterPlugins=cli_filter/lua
JobSubmitPlugins=lua
$nodeline
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
)
  if [ "$(cat "$conf" 2>/dev/null)" != "$new" ]; then
    changed=1
    if [ "$mode" = write ]; then printf '%s\n' "$new" >"$conf"; fi
  fi

  # Slurm reads cgroup.conf beside slurm.conf. Only cores are constrained (memory and devices are
  # not malld's business, and this machine's memory hierarchy may belong to its container).
  if [ "$cgroup_plugins" = cgroup ]; then
    local version; version=$(slurm_cgroup_version)
    new=$(cat <<EOF
# Generated by launch_scripts/$prog (--cgroup-plugins cgroup) for proctrack/cgroup + task/cgroup.
CgroupPlugin=cgroup/$version
CgroupMountpoint=/sys/fs/cgroup
ConstrainCores=yes
ConstrainRAMSpace=no
ConstrainSwapSpace=no
ConstrainDevices=no
$(if [ "$version" = v2 ]; then
    printf '%s\n' '# No systemd here: slurmd makes the stepd scope folder itself (mkdir, no D-Bus) and enables' \
                   '# the controllers from the root down to it.' 'IgnoreSystemd=yes' 'CgroupAutomount=yes'
  fi)
EOF
)
    if [ "$(cat "$dir/etc/cgroup.conf" 2>/dev/null)" != "$new" ]; then
      changed=1
      if [ "$mode" = write ]; then printf '%s\n' "$new" >"$dir/etc/cgroup.conf"; fi
    fi
  elif [ -e "$dir/etc/cgroup.conf" ]; then
    changed=1
    if [ "$mode" = write ]; then rm -f "$dir/etc/cgroup.conf"; fi
  fi

  # mall's submission filter (--malleable=MIN sets -c MIN) and slurmctld's AdminComment merge (for
  # malld --slurm-comment-merge slurmctld): Slurm reads both scripts beside slurm.conf.
  local script
  for script in cli_filter.lua job_submit.lua; do
    new=$(cat "$repo/slurm_plugin/$script")
    if [ "$(cat "$dir/etc/$script" 2>/dev/null)" != "$new" ]; then
      changed=1
      if [ "$mode" = write ]; then printf '%s\n' "$new" >"$dir/etc/$script"; fi
    fi
  done

  if [ -f "$plugin" ]; then
    new="optional $plugin socket=$(if multi; then echo "$inner_node/malld.sock"; else malld_sock_of "$node"; fi)${MALL_CLUSTER_PLUGIN_ARGS:+ $MALL_CLUSTER_PLUGIN_ARGS}"
  else
    new="# $plugin is not built yet: the cluster runs without the mall plugin. Build it, then: $prog down && $prog up"
  fi
  if [ "$(cat "$plugstack" 2>/dev/null)" != "$new" ]; then
    changed=1
    if [ "$mode" = write ]; then printf '%s\n' "$new" >"$plugstack"; fi
  fi
  return $(( changed == 0 ))   # 0 (true) when something changed
}

# ---- up -----------------------------------------------------------------------------------------
start_daemon() { # start_daemon NAME CMD...: setsid in the background, pid file, stdout+stderr to a file
  local name=$1; shift
  local pid
  MALL_CLUSTER_DAEMON=$dir SLURM_CONF=$conf setsid "$@" </dev/null >>"$(outfile "$name")" 2>&1 &
  pid=$!   # setsid execs in place (a background job of a script is no group leader): this is the daemon
  echo "$pid" >"$(pidfile "$name")"
  started+=("$name")
}

port_taken() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Before slurmd starts with the cgroup plugins: Slurm's cgroups are named after the node, so another
# cluster's live jobs there would mix with this one's (same job ids): refuse. On v2 without systemd,
# 22.05's slurmd only mkdirs its scope (no parents): make /sys/fs/cgroup/system.slice for it.
prepare_slurm_cgroups() {
  local roots busy
  roots=$(slurm_cgroup_roots)
  if [ -n "$roots" ]; then
    # shellcheck disable=SC2086  # one folder a word
    busy=$(pids_in_tree $roots | tr '\n' ' ')
    [ -z "${busy// }" ] ||
      die "Slurm's cgroups of node $node ($(tr "\n" " " <<<"$roots" | sed "s/ $//")) hold processes (${busy% }): another Slurm cluster with the cgroup plugins runs on this node (Slurm names its cgroups after the node, so only one can); bring it down first, or use --cgroup-plugins linuxproc"
  fi
  if [ "$(slurm_cgroup_version)" = v2 ] && [ ! -d /sys/fs/cgroup/system.slice ]; then
    mkdir /sys/fs/cgroup/system.slice || die "cannot create /sys/fs/cgroup/system.slice for Slurm's cgroup/v2 scope"
    touch "$dir/run/made-system-slice"
  fi
}

# ---- namespaces (--nodes N >= 2) ------------------------------------------------------------------
# Each namespace is held by a "holder": `sleep infinity` started by unshare in new namespaces (pid
# file run/ns-head.pid, run/ns@nodeK.pid). Daemons enter them with nsenter, never `ip netns exec`,
# which mounts a fresh /sys and hides /sys/fs/cgroup (malld's and Slurm's cgroups). Nothing is made
# in the host's network namespace and nothing is mounted in the host's mount namespace: killing the
# holders and every process inside frees the namespaces, and the bridge, links, addresses and node
# bind mounts go with them.
holder_pid() { daemon_pid "$(if [ "$1" = head ]; then echo ns-head; else echo "ns@$1"; fi)"; }
# ns_enter head|NODE: sets ns_cmd to the words that run a command in the head namespace (network
# only: host files, host name) or in node NODE's network, UTS and mount namespaces (its host name,
# $dir/node = its own folder). in_ns head|NODE CMD...: runs CMD there.
ns_enter() {
  local pid
  pid=$(holder_pid "$1") || die "the namespace of $1 is gone (its holder died); run: $prog down && $prog up --nodes $n_nodes"
  if [ "$1" = head ]; then
    ns_cmd=(nsenter --target "$pid" --net --)
  else
    ns_cmd=(nsenter --target "$pid" --net --uts --mount --wdns="$dir" --)
  fi
}
in_ns() { ns_enter "$1"; shift; "${ns_cmd[@]}" "$@"; }
start_namespaces() { # the holders and the network: bridge br0 in head, a veth pair per node
  local k n have=0 pid batch
  for n in head "${node_names[@]}"; do holder_pid "$n" >/dev/null && have=$(( have + 1 )); done
  [ $have -eq 0 ] || [ $have -eq $(( n_nodes + 1 )) ] ||
    die "only $have of the cluster's $(( n_nodes + 1 )) namespaces are alive (a holder was killed): run $prog down, then $prog up --nodes $n_nodes"
  [ $have -eq 0 ] || return 0
  for need in unshare nsenter ip; do command -v "$need" >/dev/null || die "$need is not installed (util-linux, iproute2): run launch_scripts/install-deps.sh"; done
  rm -f "$dir"/run/ready-*
  # The holders disable IPv6 (Open MPI would also try the veths' link-local addresses) and bring up
  # lo (PMIx 4 clients reach their slurmstepd over TCP on 127.0.0.1).
  local setup='ip link set lo up && if [ -d /proc/sys/net/ipv6 ]; then sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1; fi'
  MALL_CLUSTER_DAEMON=$dir setsid unshare --net -- sh -c "$setup"' && : >"$1" && exec sleep infinity' \
    sh "$dir/run/ready-head" </dev/null >>"$dir/log/ns.stderr" 2>&1 &
  echo $! >"$(pidfile ns-head)"; started+=(ns-head)
  for n in "${node_names[@]}"; do
    MALL_CLUSTER_DAEMON=$dir setsid unshare --net --uts --mount -- sh -c \
      'hostname "$1" && mount --bind "$2" "$3" && '"$setup"' && : >"$4" && exec sleep infinity' \
      sh "$n" "$(node_home "$n")" "$inner_node" "$dir/run/ready-$n" </dev/null >>"$(node_home "$n")/log/ns.stderr" 2>&1 &
    echo $! >"$(pidfile "ns@$n")"; started+=("ns@$n")
  done
  for n in head "${node_names[@]}"; do wait_until "the namespaces of $n" test -e "$dir/run/ready-$n"; done
  : >"$dir/run/netns"
  for n in head "${node_names[@]}"; do
    pid=$(holder_pid "$n") || die "the namespace holder of $n exited; see $dir/log/ns.stderr and $dir/nodes/*/log/ns.stderr"
    echo "$n $(readlink "/proc/$pid/ns/net")" >>"$dir/run/netns"
  done
  batch=$(printf 'link add br0 type bridge\nlink set br0 up\naddr add %s.254/24 dev br0\n' "$subnet")
  k=0
  for n in "${node_names[@]}"; do
    k=$(( k + 1 ))
    batch+=$'\n'"link add v$n type veth peer name eth0 netns $(holder_pid "$n")"$'\n'"link set v$n master br0 up"
  done
  printf '%s\n' "$batch" | in_ns head ip -batch - ||
    die "could not build the cluster's network (bridge and veth pairs; does this kernel have CONFIG_VETH and CONFIG_BRIDGE?)"
  k=0
  for n in "${node_names[@]}"; do
    k=$(( k + 1 ))
    printf 'addr add %s.%s/24 dev eth0\nlink set eth0 up\n' "$subnet" "$k" | in_ns "$n" ip -batch - ||
      die "could not give $n its address $subnet.$k"
  done
}
# Client wrappers in $dir/bin (env puts them first in PATH): from outside the cluster's namespaces
# they run the real tool in the head namespace, where slurmctld's address exists; inside (a job's
# task, exec, salloc's shell) they run it directly. sbatch copies PATH into jobs, hence the check.
write_client_wrappers() {
  local tool real inodes
  inodes=$(cut -d' ' -f2 "$dir/run/netns" | paste -sd' ')
  mkdir -p "$dir/bin"
  for tool in sbatch srun salloc scancel scontrol squeue sinfo sattach sstat sprio sshare sbcast; do
    real=$(PATH=${PATH//$dir\/bin:/} command -v "$tool") || continue
    cat >"$dir/bin/$tool" <<EOF
#!/bin/sh
# Generated by launch_scripts/$prog: runs $real where the cluster's network exists.
case " $inodes " in
  *" \$(readlink /proc/self/ns/net) "*) exec $real "\$@" ;;
esac
[ "\$(id -u)" -eq 0 ] || { echo "$tool: the cluster's network exists only in its namespaces; run Slurm's clients as root here, or inside a node: $repo/launch_scripts/$prog exec node1 -- $tool ..." >&2; exit 1; }
exec nsenter --net=/proc/$(holder_pid head)/ns/net -- $real "\$@"
EOF
    chmod 0755 "$dir/bin/$tool"
  done
}

# start_malld NAME NODE: malld for one node, in the root cpuset, enforcing with cpusets (it logs why
# it chose a backend); with --slurm (when this malld has it) it checks the plugin's registrations
# against slurmctld (libslurm, through SLURM_CONF) and drops jobs Slurm no longer runs.
start_malld() {
  local name=$1 n=$2 sock inner_sock state slurm_check=() malld_help prefix=() extra=()
  sock=$(malld_sock_of "$n")
  if [ -S "$sock" ] && "$build/bin/mallctl" --socket "$sock" status >/dev/null 2>&1; then
    die "a malld not started by $prog serves $sock; stop it first"
  fi
  malld_help=$("$build/bin/malld" --help 2>/dev/null) || true
  if [ "${MALL_CLUSTER_MALLD_SLURM:-1}" = 1 ] && grep -q -- '--slurm ' <<<"$malld_help"; then
    slurm_check=(--slurm --slurm-node "$n")
  fi
  read -r -a extra <<<"${MALL_CLUSTER_MALLD_ARGS:-}"
  inner_sock=$sock; state=$dir/malld
  if multi; then
    inner_sock=$inner_node/malld.sock; state=$inner_node/malld
    ns_enter "$n"; prefix=("${ns_cmd[@]}")
  fi
  start_daemon "$name" "${prefix[@]}" "$build/bin/malld" --socket "$inner_sock" --state-dir "$state" \
    --cgroup-parent "$(malld_cgroup_of "$n")" --log-level info "${slurm_check[@]}" "${extra[@]}"
}

nodes_idle() { # every node of the cluster is idle in sinfo
  local states
  states=$(ctl sinfo -h -N -o '%N %t' 2>/dev/null) || return 1
  [ "$(wc -l <<<"$states")" -eq "${#node_names[@]}" ] && ! grep -qvE ' (idle|mix|alloc|comp)$' <<<"$states"
}
ctl() { if multi; then in_ns head "$@"; else "$@"; fi; }   # a Slurm client where slurmctld is reached

cmd_up() {
  local t0_ms auth name missing=() need n
  t0_ms=$(( $(date +%s%N) / 1000000 ))
  [ "$(id -u)" -eq 0 ] || die "up needs root (Slurm's daemons, munged and malld's cgroups); run it as root"
  for need in slurmctld slurmd scontrol sinfo; do
    command -v "$need" >/dev/null 2>&1 || missing+=("$need")
  done
  [ ${#missing[@]} -eq 0 ] || die "${missing[*]} not installed: run launch_scripts/install-deps.sh"
  [ -x "$build/bin/malld" ] ||
    die "malld is not built ($build/bin/malld missing): run cmake -G Ninja -B $build -S $repo && ninja -C $build malld (or set MALL_BUILD_DIR)"
  auth=$(auth_mode)
  cgroup_plugins=${cgroup_plugins:-linuxproc}
  case $cgroup_plugins in
    linuxproc|cgroup) ;;
    *) die "--cgroup-plugins (or MALL_CLUSTER_CGROUP_PLUGINS) must be linuxproc or cgroup, not '$cgroup_plugins'" ;;
  esac
  if [ "$cgroup_plugins" = cgroup ]; then slurm_cgroup_version >/dev/null; fi   # dies with the reason

  # The state folder: ours (marker), or new/empty (e.g. from mktemp). Never adopt a foreign folder.
  if [ -e "$dir" ] && [ ! -e "$marker" ] && [ -n "$(ls -A "$dir" 2>/dev/null)" ]; then
    die "$dir exists and is not a mall cluster folder; remove it or set MALL_CLUSTER_DIR to another folder"
  fi

  started=()
  local running=()
  for name in "${daemons_up_order[@]}" ns-head; do   # the marker's node count (set_nodes)
    if [ "$name" = munged ] && [ "$auth" = none ]; then continue; fi
    if daemon_pid "$name" >/dev/null; then running+=("$name"); fi
  done
  # Running daemons keep the plugins and the nodes they started with (the marker says which).
  if [ ${#running[@]} -gt 0 ] && [ -n "${saved_plugins:-}" ] && [ "$saved_plugins" != "$cgroup_plugins" ]; then
    say "warning: the cluster runs with --cgroup-plugins $saved_plugins; to change it: $prog down && $prog up --cgroup-plugins $cgroup_plugins"
    cgroup_plugins=$saved_plugins
  fi
  if [ -n "$requested_nodes" ] && [ "$requested_nodes" != "$n_nodes" ]; then
    if [ ${#running[@]} -gt 0 ]; then
      say "warning: the cluster runs with $n_nodes node(s); to change it: $prog down && $prog up --nodes $requested_nodes"
    else
      n_nodes=$requested_nodes; set_nodes
    fi
  fi
  mkdir -p "$dir"/{etc,log,run,state}
  if multi; then
    mkdir -p "$inner_node"
    for n in "${node_names[@]}"; do mkdir -p "$(node_home "$n")"/{spool,malld,log,tmp}; chmod 1777 "$(node_home "$n")/tmp"; done
  else
    mkdir -p "$dir"/{spool,malld,tmp}
    chmod 1777 "$dir/tmp"
  fi
  cd "$dir"   # the daemons' working folder: none of them keeps the caller's folder busy
  chmod 0755 "$dir" "$dir/etc" "$dir/log"   # users' clients read slurm.conf; munge must reach its folder
  printf 'port=%s\ncgroup=%s\nplugins=%s\nnodes=%s\n' "$ctld_port" "$cgroup_parent" "$cgroup_plugins" "$n_nodes" >"$marker"

  # Rewriting slurm.conf under running daemons would split clients from daemons (e.g. another
  # AuthType): while anything runs, the configuration it started with stays.
  if [ ${#running[@]} -eq 0 ]; then
    write_config "$auth" write || true
  elif write_config "$auth" check; then
    say "warning: ${running[*]} run(s) with an older configuration (auth, plugin, node or ports differ); apply the new one with: $prog down && $prog up"
  fi

  # Another cluster's live jobs in Slurm's cgroups of these nodes: refuse before starting anything.
  if [ "$cgroup_plugins" = cgroup ]; then
    local any_slurmd=0
    for name in "${daemons_up_order[@]}"; do [[ $name == slurmd* ]] && daemon_pid "$name" >/dev/null && any_slurmd=1; done
    [ $any_slurmd = 1 ] || prepare_slurm_cgroups
  fi
  if multi; then start_namespaces; fi

  # munged, as user munge, with its socket, pid, seed and log under the cluster folder (in the
  # host's namespaces: every node reaches its socket file; Debian's Slurm is built for several
  # slurmd per host and accepts the credential replays one munged then reports).
  if [ "$auth" = munge ] && ! daemon_pid munged >/dev/null; then
    local key=/etc/munge/munge.key
    install -d -o munge -g munge -m 0755 "$dir/munge"   # clients must reach the socket
    if [ ! -r "$key" ]; then  # the package makes one; a private key works as well on one node
      key=$dir/munge/munge.key
      [ -f "$key" ] || { mungekey --create --keyfile="$key" && chown munge:munge "$key" && chmod 0400 "$key"; } ||
        die "no munge key and mungekey failed; reinstall munge (launch_scripts/install-deps.sh) or set MALL_CLUSTER_AUTH=none"
    fi
    rm -f "$munge_sock" "$munge_sock.lock"
    start_daemon munged setpriv --reuid=munge --regid=munge --init-groups \
      munged --foreground --socket="$munge_sock" --key-file="$key" --pid-file="$dir/munge/munged.pid" \
      --seed-file="$dir/munge/munged.seed" --log-file="$dir/munge/munged.log"
    wait_until "munged's socket $munge_sock" test -S "$munge_sock"
  fi

  # One malld per node, all started before any is waited for.
  local mallds=()
  for name in "${daemons_up_order[@]}"; do
    [[ $name == malld* ]] || continue
    if ! daemon_pid "$name" >/dev/null; then
      n=$(node_of "$name") || n=$node
      start_malld "$name" "$n"; mallds+=("$name")
    fi
  done
  for name in "${mallds[@]}"; do
    n=$(node_of "$name") || n=$node
    wait_until "$name's socket $(malld_sock_of "$n")" "$build/bin/mallctl" --socket "$(malld_sock_of "$n")" status
  done

  export SLURM_CONF=$conf
  if ! daemon_pid slurmctld >/dev/null; then
    if multi; then
      ns_enter head
      start_daemon slurmctld "${ns_cmd[@]}" slurmctld -D -f "$conf"
    else
      if port_taken "$ctld_port"; then
        die "port $ctld_port is in use (another Slurm cluster? stop it with '$prog down' and its MALL_CLUSTER_DIR, or set MALL_CLUSTER_PORT)"
      fi
      start_daemon slurmctld slurmctld -D -f "$conf"
    fi
  fi
  wait_until "slurmctld to answer 'scontrol ping'" slurmctld_up

  for name in "${daemons_up_order[@]}"; do
    [[ $name == slurmd* ]] || continue
    daemon_pid "$name" >/dev/null && continue
    # From here on Slurm's cgroups of these nodes are this cluster's to clean up (see cmd_down).
    if [ "$cgroup_plugins" = cgroup ]; then touch "$dir/run/slurm-cgroups-ours"; fi
    if multi; then
      n=$(node_of "$name")
      ns_enter "$n"
      start_daemon "$name" "${ns_cmd[@]}" slurmd -D -N "$n" -f "$conf"
    else
      if port_taken "$slurmd_port"; then
        die "port $slurmd_port (slurmd) is in use (another slurmd? stop it, or set MALL_CLUSTER_PORT)"
      fi
      start_daemon slurmd slurmd -D -f "$conf"
    fi
  done
  if multi; then write_client_wrappers; fi
  wait_until "$(if multi; then echo "nodes ${node_names[*]}"; else echo "node $node"; fi) to be idle (sinfo)" nodes_idle

  if [ ${#started[@]} -eq 0 ]; then
    say "already up ($dir): $(status_line)"
  else
    say "up in $(( $(date +%s%N) / 1000000 - t0_ms )) ms ($dir, $(if multi; then echo "$n_nodes nodes in namespaces on $subnet.0/24, "; fi)auth/$auth, $(plugins_words), plugin $( [ -f "$plugin" ] && echo "loaded from $plugin" || echo "not built: running without it")): started ${started[*]}"
  fi
  say "use it with: eval \"\$(launch_scripts/$prog env)\""
}
slurmctld_up() { ctl scontrol ping 2>/dev/null | grep -q "is UP"; }

plugins_words() { # the Slurm plugins in the configuration, for messages
  if [ "$cgroup_plugins" = cgroup ]; then
    echo "proctrack/cgroup + task/cgroup ($(sed -n 's/^CgroupPlugin=//p' "$dir/etc/cgroup.conf" 2>/dev/null))"
  else
    echo "proctrack/linuxproc + task/affinity"
  fi
}

# ---- down ---------------------------------------------------------------------------------------
cgroup_dirs() { # the cgroup folders this cluster may have made, in every mounted hierarchy: malld's
  # parent, and Slurm's (only when this cluster started slurmd with the cgroup plugins: a linuxproc
  # cluster, or one whose up was refused, leaves another cluster's Slurm cgroups alone)
  local h n
  for h in /sys/fs/cgroup /sys/fs/cgroup/*; do
    [ -d "$h" ] || continue
    for n in "${node_names[@]}"; do
      if [ -d "$h/$(malld_cgroup_of "$n")" ]; then echo "$h/$(malld_cgroup_of "$n")"; fi
    done
  done
  if [ -e "$dir/run/slurm-cgroups-ours" ]; then slurm_cgroup_roots; fi
}
remove_cgroup_tree() { # remove_cgroup_tree DIR MOVE: removes the folders deepest first; with MOVE=1
  # pids left inside go to the hierarchy's root first (only for malld's parent, which is ours alone;
  # Slurm's folders are emptied by killing what is left in them, see cmd_down)
  local top=$1 move=$2 root d p
  root=$(dirname "$top")
  find "$top" -depth -type d 2>/dev/null | while read -r d; do
    if [ "$move" = 1 ] && [ -f "$d/cgroup.procs" ]; then
      while read -r p; do echo "$p" >"$root/cgroup.procs" 2>/dev/null || true; done <"$d/cgroup.procs"
    fi
    rmdir "$d" 2>/dev/null || say "warning: could not remove cgroup $d (still in use?)"
  done
}

cmd_down() {
  set +e   # a teardown goes on past every failure: each step below checks what it needs
  local name pid stopped=() left p
  if [ ! -e "$dir" ]; then
    say "not running (no $dir)"
  elif [ ! -e "$marker" ]; then
    die "$dir is not a mall cluster folder (no $marker); not touching it"
  fi
  [ "$(id -u)" -eq 0 ] || [ ! -e "$dir" ] || die "down needs root (the daemons and cgroups are root's); run it as root"

  if [ -e "$dir" ]; then
    # Jobs first, so their tasks end through Slurm (KillWait=2) and no stray step is left.
    if daemon_pid slurmctld >/dev/null && command -v squeue >/dev/null && { ! multi || holder_pid head >/dev/null; }; then
      export SLURM_CONF=$conf
      local jobs ctl_in=()   # for timeout(1), which needs a command, not a function
      if multi; then ns_enter head; ctl_in=("${ns_cmd[@]}"); fi
      jobs=$(timeout 15 "${ctl_in[@]}" squeue -h -o %A 2>/dev/null | tr '\n' ' ')
      if [ -n "${jobs// }" ]; then
        say "cancelling jobs $jobs"
        # shellcheck disable=SC2086
        timeout 15 "${ctl_in[@]}" scancel $jobs 2>/dev/null
        local deadline=$(( SECONDS + wait_s ))
        # Without a slurmd the jobs stay COMPLETING: their steps are then stopped below, by pid.
        while [ -n "$(timeout 15 "${ctl_in[@]}" squeue -h -o %A 2>/dev/null)" ] && [ $SECONDS -lt $deadline ] &&
              any_slurmd_alive; do
          sleep 0.1
        done
      fi
    fi
    for name in "${daemons_down_order[@]}"; do
      pid=$(cat "$(pidfile "$name")" 2>/dev/null) || continue
      if alive "$pid" "$(comm_of "$name")"; then
        stop_pid "$pid" "$name" || say "warning: $name (pid $pid) is still alive"
        stopped+=("$name($pid)")
      fi
    done
    # Step daemons (and their tasks) that outlived slurmd, e.g. after a crash.
    # Without their slurmd they serve no one, so SIGKILL at once, tasks included (collected first:
    # once a step daemon dies its tasks are orphans and no longer found below it).
    # With --nodes, also whatever still runs in the cluster's namespaces (e.g. started by exec).
    local holders
    holders=" $(holder_pids | tr '\n' ' ') "
    left=$( { cluster_processes; namespace_processes; } | sort -un | while read -r p; do
              [[ $holders == *" $p "* ]] || echo "$p"; done | tr '\n' ' ')
    if [ -n "${left// }" ]; then
      local all=()
      for p in $left; do mapfile -t -O ${#all[@]} all < <(descendants "$p"); all+=("$p"); done
      say "killing leftover processes of the cluster (step daemons and their tasks): ${all[*]}"
      kill -KILL "${all[@]}" 2>/dev/null || true
      local deadline=$(( SECONDS + wait_s ))
      for pid in "${all[@]}"; do
        while alive "$pid" && [ $SECONDS -lt $deadline ]; do sleep 0.05; done
        if alive "$pid"; then say "warning: pid $pid survived SIGKILL (state $(proc_state "$pid"))"; fi
      done
    fi
    # Last, the namespace holders: with nothing else inside, the kernel frees the namespaces and
    # with them the bridge, the veth pairs, the addresses and the nodes' bind mounts.
    for name in ns-head "${node_names[@]/#/ns@}"; do
      pid=$(daemon_pid "$name") || continue
      kill -KILL "$pid" 2>/dev/null
      local deadline=$(( SECONDS + 5 ))
      while alive "$pid" && [ $SECONDS -lt $deadline ]; do sleep 0.02; done
      stopped+=("$name($pid)")
    done
  fi

  # With the cgroup plugins, a process still in Slurm's cgroups of this node once slurmd and its
  # step daemons are gone is a task of this cluster's jobs (up refuses to start slurmd beside
  # another cluster's jobs there): nothing will signal it any more, so SIGKILL, then the folders go.
  local roots
  roots=$(if [ -e "$dir/run/slurm-cgroups-ours" ]; then slurm_cgroup_roots; fi)
  if [ -n "$roots" ]; then
    # shellcheck disable=SC2086  # one folder a word
    left=$(pids_in_tree $roots | tr '\n' ' ')
    if [ -n "${left// }" ]; then
      say "killing processes left in Slurm's cgroups: $left"
      # shellcheck disable=SC2086
      kill -KILL $left 2>/dev/null || true
      local deadline=$(( SECONDS + wait_s ))
      # shellcheck disable=SC2086
      while [ -n "$(pids_in_tree $roots)" ] && [ $SECONDS -lt $deadline ]; do sleep 0.05; done
    fi
  fi
  local cg
  for cg in $(cgroup_dirs); do
    if [[ $(basename "$cg") == "$cgroup_parent"* ]]; then remove_cgroup_tree "$cg" 1; else remove_cgroup_tree "$cg" 0; fi
  done
  if [ -e "$dir/run/made-system-slice" ]; then
    rmdir /sys/fs/cgroup/system.slice 2>/dev/null || say "warning: could not remove /sys/fs/cgroup/system.slice (made by up; still in use?)"
  fi
  if [ -e "$marker" ]; then rm -rf "$dir"; fi
  if [ ${#stopped[@]} -gt 0 ]; then say "down: stopped ${stopped[*]}; removed $dir"; else say "down: nothing was running; $dir is gone"; fi
}

# ---- status / env -------------------------------------------------------------------------------
status_line() {
  local name pid out=()
  for name in "${daemons_up_order[@]}"; do
    if pid=$(daemon_pid "$name"); then out+=("$name=$pid"); fi
  done
  echo "${out[*]:-nothing running}"
}
cmd_status() {
  local name pid n_up=0 n=0 auth
  if [ ! -e "$marker" ]; then say "not running (no cluster in $dir)"; exit 3; fi
  auth=none; grep -q '^AuthType=auth/munge' "$conf" 2>/dev/null && auth=munge
  local names=("${daemons_up_order[@]}")
  if multi; then names=(ns-head "${node_names[@]/#/ns@}" "${names[@]}"); fi
  for name in "${names[@]}"; do
    [ "$name" = munged ] && [ "$auth" = none ] && { printf '%-14s not used (auth/none)\n' munged; continue; }
    n=$(( n + 1 ))
    if pid=$(daemon_pid "$name"); then
      case $name in
        ns-head) printf '%-14s running  pid %-8s namespace: network (bridge br0, %s.254)\n' "$name" "$pid" "$subnet" ;;
        ns@*)    printf '%-14s running  pid %-8s namespaces: network (%s.%s), host name, mounts\n' "$name" "$pid" "$subnet" "${name#ns@node}" ;;
        *)       printf '%-14s running  pid %-8s log %s\n' "$name" "$pid" "$(logfile "$name")" ;;
      esac
      n_up=$(( n_up + 1 ))
    else
      printf '%-14s stopped\n' "$name"
    fi
  done
  printf '%-14s %s\n' plugin "$(grep -v '^#' "$plugstack" 2>/dev/null || echo "not loaded ($plugin not built)")"
  printf '%-14s %s\n' slurm "$(plugins_words)"
  if multi; then
    for name in "${node_names[@]}"; do printf '%-14s %s\n' "mallctl@$name" "mallctl --socket $(malld_sock_of "$name")"; done
  fi
  if daemon_pid slurmctld >/dev/null && { ! multi || holder_pid head >/dev/null; }; then
    SLURM_CONF=$conf ctl sinfo -N -o '%N %P %t %C %c' || true
    SLURM_CONF=$conf ctl squeue || true
  fi
  [ $n_up -eq $n ] && exit 0
  [ $n_up -eq 0 ] && exit 3
  exit 1
}
cmd_env() {
  [ -e "$marker" ] || echo "# $prog: no cluster in $dir yet; start it with: launch_scripts/$prog up" >&2
  printf 'export MALL_CLUSTER_DIR=%q\n' "$dir"
  printf 'export SLURM_CONF=%q\n' "$conf"
  printf 'export MALL_SOCKET=%q\n' "$(malld_sock_of "${node_names[0]}")"
  if multi; then
    # Slurm's clients through the wrappers (they enter the head namespace); each node's malld at its socket.
    printf 'export MALL_CLUSTER_NODES=%q\n' "${node_names[*]}"
    printf 'case ":$PATH:" in *:%s:*) ;; *) export PATH=%q:"$PATH" ;; esac\n' "$dir/bin" "$dir/bin"
  fi
}

cmd_logs() {
  local lines=${1:-15} name
  [[ $lines =~ ^[0-9]+$ ]] || die "logs takes a line count, not '$lines'"
  for name in "${daemons_up_order[@]}"; do
    [ "$name" = munged ] && continue
    echo "--- $name ($(logfile "$name"))"
    tail -n "$lines" "$(logfile "$name")" 2>/dev/null || echo "(no log)"
  done
}

# exec [NODE] -- CMD...: CMD in node NODE's namespaces (its network, host name and mounts: $dir/node
# is its folder, $dir/node/malld.sock its malld), or without NODE in the head namespace.
cmd_exec() {
  local where=head
  multi || die "exec is for clusters of several nodes (up --nodes N); this one runs on the host: run the command directly"
  if [ $# -gt 0 ] && [ "$1" != -- ]; then where=$1; shift; fi
  [ "${1:-}" = -- ] && shift
  [ $# -gt 0 ] || die "exec needs a command: $prog exec [NODE] -- CMD [ARG...]"
  if [ "$where" != head ] && [[ " ${node_names[*]} " != *" $where "* ]]; then
    die "no node '$where' in this cluster (nodes: ${node_names[*]}; or none for the head namespace)"
  fi
  [ "$(id -u)" -eq 0 ] || die "exec needs root (entering namespaces)"
  local pid
  pid=$(holder_pid "$where") || die "the cluster is not up (no namespace for $where); run: $prog up --nodes $n_nodes"
  export SLURM_CONF=$conf
  if [ "$where" = head ]; then
    exec nsenter --target "$pid" --net -- "$@"
  else
    exec nsenter --target "$pid" --net --uts --mount --wd="$PWD" -- "$@"
  fi
}

requested_nodes=${MALL_CLUSTER_NODES_COUNT:-}
parse_up_options() { # up [--cgroup-plugins linuxproc|cgroup] [--nodes N]
  while [ $# -gt 0 ]; do
    case $1 in
      --cgroup-plugins) [ $# -ge 2 ] || { echo "$prog: --cgroup-plugins needs a value: linuxproc or cgroup" >&2; exit 2; }
                        cgroup_plugins=$2; shift 2 ;;
      --cgroup-plugins=*) cgroup_plugins=${1#*=}; shift ;;
      --nodes) [ $# -ge 2 ] || { echo "$prog: --nodes needs a node count (1 to 200)" >&2; exit 2; }
               requested_nodes=$2; shift 2 ;;
      --nodes=*) requested_nodes=${1#*=}; shift ;;
      *) echo "$prog: unknown option for up: '$1' (expected --cgroup-plugins linuxproc|cgroup or --nodes N; see --help)" >&2; exit 2 ;;
    esac
  done
  if [ -n "$requested_nodes" ] && { ! [[ $requested_nodes =~ ^[0-9]+$ ]] || [ "$requested_nodes" -lt 1 ] || [ "$requested_nodes" -gt 200 ]; }; then
    echo "$prog: --nodes must be a node count from 1 to 200, not '$requested_nodes'" >&2; exit 2
  fi
  if [ -z "$saved_nodes" ] && [ -n "$requested_nodes" ]; then n_nodes=$requested_nodes; fi
}

case ${1:-} in
  up) shift; parse_up_options "$@"; set_nodes; cmd_up ;;
  down) set_nodes; cmd_down ;;
  status) set_nodes; cmd_status ;;
  env) set_nodes; cmd_env ;;
  logs) set_nodes; cmd_logs "${2:-15}" ;;
  exec) shift; set_nodes; cmd_exec "$@" ;;
  -h|--help|help) usage ;;
  '') usage >&2; exit 2 ;;
  *) echo "$prog: unknown command '$1' (expected up, down, status, env, logs or exec; see --help)" >&2; exit 2 ;;
esac
