#!/usr/bin/env bash
# local-cluster.sh — a single-node Slurm 22.05 cluster on localhost, without systemd, for mall's
# demos and system tests: munged (or auth/none), slurmctld, slurmd, the mall SPANK plugin (when built)
# and malld, every file under one folder, every daemon tracked by its pid. See --help.
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
$prog — a single-node Slurm cluster on this machine, with mall's malld and SPANK plugin

Usage: launch_scripts/$prog up [--cgroup-plugins linuxproc|cgroup]
       launch_scripts/$prog down|status|env|logs [N]
       launch_scripts/$prog -h|--help

Commands:
  up      write the configuration and start munged, malld, slurmctld and slurmd (those not already
          running), then wait until the controller answers and node $node is idle. Idempotent: when
          everything runs it returns at once. Needs root.
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
  env     the export lines a shell needs to use the cluster:
            eval "\$(launch_scripts/$prog env)"
  logs [N] the last N lines (default 15) of malld's, slurmctld's and slurmd's logs, for scripts
          that report a failure before they bring the cluster down.

Environment:
  MALL_CLUSTER_DIR        state folder: configuration, logs, pid files, spool, malld socket
                          (default /tmp/mall-cluster; now $dir)
  MALL_BUILD_DIR          build folder with bin/malld and lib/mall_spank.so (default <repo>/build)
  MALL_CLUSTER_PORT       slurmctld port; slurmd uses the next one (default 6817)
  MALL_CLUSTER_AUTH       munge|none (default: munge when munged is installed, else none)
  MALL_CLUSTER_CGROUP     malld's cgroup parent (default mall_cluster)
  MALL_CLUSTER_CGROUP_PLUGINS  linuxproc|cgroup, as up's --cgroup-plugins (default linuxproc)
  MALL_CLUSTER_TIMEOUT_S  how long up/down wait for each step (default 30)
  MALL_CLUSTER_MALLD_SLURM  1 (default): start malld with --slurm (checks jobs against slurmctld)
                          when it supports it; 0: without

Files under the state folder:
  etc/slurm.conf etc/plugstack.conf   the generated configuration (SLURM_CONF points here)
  etc/cgroup.conf                     with --cgroup-plugins cgroup only
  log/*.log                           slurmctld, slurmd, malld logs (munge/munged.log for munged)
  run/*.pid                           pid of each daemon as started by this script
  malld.sock malld/                   malld's socket and state folder
  tmp/                                the node's TmpFS (PMIx step folders)

Example:
  launch_scripts/$prog up
  eval "\$(launch_scripts/$prog env)"
  sbatch --wrap 'grep Cpus_allowed_list /proc/self/status'
  launch_scripts/$prog status
  launch_scripts/$prog down

  launch_scripts/$prog up --cgroup-plugins cgroup
  srun --malleable=1:2 -c 1 sh -c 'cat /proc/self/cgroup; grep Cpus_allowed_list /proc/self/status'
EOF
}

say() { printf '%s: %s\n' "$prog" "$*"; }
die() { printf '%s: error: %s\n' "$prog" "$*" >&2; exit 1; }

conf=$dir/etc/slurm.conf
plugstack=$dir/etc/plugstack.conf
marker=$dir/.mall-cluster
# A cluster remembers the port and cgroup parent it was brought up with (in its marker file), so
# `down`, `status` and `env` need only MALL_CLUSTER_DIR; explicit variables still win.
if [ -s "$marker" ]; then
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
v2_scope=/sys/fs/cgroup/system.slice/${node}_slurmstepd.scope   # Slurm 22.05's cgroup/v2 stepd scope
malld_sock=$dir/malld.sock
munge_sock=$dir/munge/munge.socket.2
plugin=$build/lib/mall_spank.so
daemons_up_order=(munged malld slurmctld slurmd)
daemons_down_order=(slurmd slurmctld malld munged)

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
daemon_pid() { # daemon_pid NAME: prints the pid when the daemon runs, else fails
  local pid
  pid=$(cat "$(pidfile "$1")" 2>/dev/null) || return 1
  alive "$pid" "$1" || return 1
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
logfile() { if [ "$1" = munged ]; then echo "$dir/munge/munged.log"; else echo "$dir/log/$1.log"; fi; }
# Where a daemon's stdout/stderr go: malld logs to stderr only; the others write their log file
# themselves and print only start-up failures (e.g. a bad slurm.conf) to stderr.
outfile() { if [ "$1" = malld ]; then echo "$dir/log/malld.log"; else echo "$dir/log/$1.stderr"; fi; }

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
  local h
  for h in /sys/fs/cgroup/*/; do
    h=${h%/}
    if [ -d "$h/slurm_$node" ]; then echo "$h/slurm_$node"; fi
  done
  if [ -d "$v2_scope" ]; then echo "$v2_scope"; fi
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
  nodeline="$nodeline NodeAddr=127.0.0.1 State=UNKNOWN"
  new=$(cat <<EOF
# Generated by launch_scripts/$prog for a single-node cluster; rewritten by 'up' when no daemon runs.
ClusterName=mall
SlurmctldHost=$node(127.0.0.1)
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
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/run/slurmctld.slurm.pid
SlurmdPidFile=$dir/run/slurmd.slurm.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
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
TmpFS=$dir/tmp
MailProg=/bin/true
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
ReturnToService=2
KillWait=2
MinJobAge=600
PlugStackConfig=$plugstack
CliFilterPlugins=cli_filter/lua
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

  # mall's submission filter (--malleable=MIN sets -c MIN): Slurm reads cli_filter.lua beside slurm.conf.
  new=$(cat "$repo/slurm_plugin/cli_filter.lua")
  if [ "$(cat "$dir/etc/cli_filter.lua" 2>/dev/null)" != "$new" ]; then
    changed=1
    if [ "$mode" = write ]; then printf '%s\n' "$new" >"$dir/etc/cli_filter.lua"; fi
  fi

  if [ -f "$plugin" ]; then
    new="optional $plugin socket=$malld_sock"
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

cmd_up() {
  local t0_ms auth name missing=() need
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
  mkdir -p "$dir"/{etc,log,run,state,spool,malld,tmp}
  chmod 1777 "$dir/tmp"
  cd "$dir"   # the daemons' working folder: none of them keeps the caller's folder busy
  chmod 0755 "$dir" "$dir/etc" "$dir/log"   # users' clients read slurm.conf; munge must reach its folder

  started=()
  local running=()
  for name in "${daemons_up_order[@]}"; do
    if [ "$name" = munged ] && [ "$auth" = none ]; then continue; fi
    if daemon_pid "$name" >/dev/null; then running+=("$name"); fi
  done
  # Running daemons keep the plugins they started with (the marker says which).
  if [ ${#running[@]} -gt 0 ] && [ -n "${saved_plugins:-}" ] && [ "$saved_plugins" != "$cgroup_plugins" ]; then
    say "warning: the cluster runs with --cgroup-plugins $saved_plugins; to change it: $prog down && $prog up --cgroup-plugins $cgroup_plugins"
    cgroup_plugins=$saved_plugins
  fi
  printf 'port=%s\ncgroup=%s\nplugins=%s\n' "$ctld_port" "$cgroup_parent" "$cgroup_plugins" >"$marker"

  # Rewriting slurm.conf under running daemons would split clients from daemons (e.g. another
  # AuthType): while anything runs, the configuration it started with stays.
  if [ ${#running[@]} -eq 0 ]; then
    write_config "$auth" write || true
  elif write_config "$auth" check; then
    say "warning: ${running[*]} run(s) with an older configuration (auth, plugin, node or ports differ); apply the new one with: $prog down && $prog up"
  fi

  # Another cluster's live jobs in Slurm's cgroups of this node: refuse before starting anything.
  if [ "$cgroup_plugins" = cgroup ] && ! daemon_pid slurmd >/dev/null; then prepare_slurm_cgroups; fi

  # munged, as user munge, with its socket, pid, seed and log under the cluster folder.
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

  # malld, in the root cpuset, enforcing with cgroup v1 cpusets here (it logs why it chose a backend).
  if ! daemon_pid malld >/dev/null; then
    if [ -S "$malld_sock" ] && "$build/bin/mallctl" --socket "$malld_sock" status >/dev/null 2>&1; then
      die "a malld not started by $prog serves $malld_sock; stop it first"
    fi
    # --slurm (when this malld has it): malld checks the plugin's registrations against slurmctld
    # (libslurm, through SLURM_CONF) and drops jobs Slurm no longer runs.
    local slurm_check=()
    local malld_help
    malld_help=$("$build/bin/malld" --help 2>/dev/null) || true
    if [ "${MALL_CLUSTER_MALLD_SLURM:-1}" = 1 ] && grep -q -- '--slurm ' <<<"$malld_help"; then
      slurm_check=(--slurm --slurm-node "$node")
    fi
    start_daemon malld "$build/bin/malld" --socket "$malld_sock" --state-dir "$dir/malld" \
      --cgroup-parent "$cgroup_parent" --log-level info "${slurm_check[@]}"
    wait_until "malld's socket $malld_sock" "$build/bin/mallctl" --socket "$malld_sock" status
  fi

  if ! daemon_pid slurmctld >/dev/null; then
    if port_taken "$ctld_port"; then
      die "port $ctld_port is in use (another Slurm cluster? stop it with '$prog down' and its MALL_CLUSTER_DIR, or set MALL_CLUSTER_PORT)"
    fi
    start_daemon slurmctld slurmctld -D -f "$conf"
  fi
  export SLURM_CONF=$conf
  wait_until "slurmctld to answer 'scontrol ping'" bash -c 'scontrol ping | grep -q "is UP"'

  if ! daemon_pid slurmd >/dev/null; then
    if port_taken "$slurmd_port"; then
      die "port $slurmd_port (slurmd) is in use (another slurmd? stop it, or set MALL_CLUSTER_PORT)"
    fi
    # From here on Slurm's cgroups of this node are this cluster's to clean up (see cmd_down).
    if [ "$cgroup_plugins" = cgroup ]; then touch "$dir/run/slurm-cgroups-ours"; fi
    start_daemon slurmd slurmd -D -f "$conf"
  fi
  wait_until "node $node to be idle (sinfo)" bash -c "sinfo -h -n '$node' -o %t | grep -qx idle"

  if [ ${#started[@]} -eq 0 ]; then
    say "already up ($dir): $(status_line)"
  else
    say "up in $(( $(date +%s%N) / 1000000 - t0_ms )) ms ($dir, auth/$auth, $(plugins_words), plugin $( [ -f "$plugin" ] && echo "loaded from $plugin" || echo "not built: running without it")): started ${started[*]}"
  fi
  say "use it with: eval \"\$(launch_scripts/$prog env)\""
}

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
  local h
  for h in /sys/fs/cgroup /sys/fs/cgroup/*; do
    [ -d "$h" ] || continue
    if [ -d "$h/$cgroup_parent" ]; then echo "$h/$cgroup_parent"; fi
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
    if daemon_pid slurmctld >/dev/null && command -v squeue >/dev/null; then
      export SLURM_CONF=$conf
      local jobs
      jobs=$(timeout 15 squeue -h -o %A 2>/dev/null | tr '\n' ' ')
      if [ -n "${jobs// }" ]; then
        say "cancelling jobs $jobs"
        # shellcheck disable=SC2086
        timeout 15 scancel $jobs 2>/dev/null
        local deadline=$(( SECONDS + wait_s ))
        # Without a slurmd the jobs stay COMPLETING: their steps are then stopped below, by pid.
        while [ -n "$(timeout 15 squeue -h -o %A 2>/dev/null)" ] && [ $SECONDS -lt $deadline ] &&
              daemon_pid slurmd >/dev/null; do
          sleep 0.1
        done
      fi
    fi
    for name in "${daemons_down_order[@]}"; do
      pid=$(cat "$(pidfile "$name")" 2>/dev/null) || continue
      if alive "$pid" "$name"; then
        stop_pid "$pid" "$name" || say "warning: $name (pid $pid) is still alive"
        stopped+=("$name($pid)")
      fi
    done
    # Step daemons (and their tasks) that outlived slurmd, e.g. after a crash.
    # Without their slurmd they serve no one, so SIGKILL at once, tasks included (collected first:
    # once a step daemon dies its tasks are orphans and no longer found below it).
    left=$(cluster_processes | tr '\n' ' ')
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
    if [ "$(basename "$cg")" = "$cgroup_parent" ]; then remove_cgroup_tree "$cg" 1; else remove_cgroup_tree "$cg" 0; fi
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
  for name in "${daemons_up_order[@]}"; do
    [ "$name" = munged ] && [ "$auth" = none ] && { printf '%-10s not used (auth/none)\n' munged; continue; }
    n=$(( n + 1 ))
    if pid=$(daemon_pid "$name"); then
      printf '%-10s running  pid %-8s log %s\n' "$name" "$pid" "$(logfile "$name")"
      n_up=$(( n_up + 1 ))
    else
      printf '%-10s stopped\n' "$name"
    fi
  done
  printf '%-10s %s\n' plugin "$(grep -v '^#' "$plugstack" 2>/dev/null || echo "not loaded ($plugin not built)")"
  printf '%-10s %s\n' slurm "$(plugins_words)"
  if daemon_pid slurmctld >/dev/null; then
    SLURM_CONF=$conf sinfo -N -o '%N %P %t %C %c' || true
    SLURM_CONF=$conf squeue || true
  fi
  [ $n_up -eq $n ] && exit 0
  [ $n_up -eq 0 ] && exit 3
  exit 1
}
cmd_env() {
  [ -e "$marker" ] || echo "# $prog: no cluster in $dir yet; start it with: launch_scripts/$prog up" >&2
  printf 'export MALL_CLUSTER_DIR=%q\n' "$dir"
  printf 'export SLURM_CONF=%q\n' "$conf"
  printf 'export MALL_SOCKET=%q\n' "$malld_sock"
}

cmd_logs() {
  local lines=${1:-15} name
  [[ $lines =~ ^[0-9]+$ ]] || die "logs takes a line count, not '$lines'"
  for name in malld slurmctld slurmd; do
    echo "--- $name ($(logfile "$name"))"
    tail -n "$lines" "$(logfile "$name")" 2>/dev/null || echo "(no log)"
  done
}

parse_up_options() { # up [--cgroup-plugins linuxproc|cgroup]
  while [ $# -gt 0 ]; do
    case $1 in
      --cgroup-plugins) [ $# -ge 2 ] || { echo "$prog: --cgroup-plugins needs a value: linuxproc or cgroup" >&2; exit 2; }
                        cgroup_plugins=$2; shift 2 ;;
      --cgroup-plugins=*) cgroup_plugins=${1#*=}; shift ;;
      *) echo "$prog: unknown option for up: '$1' (expected --cgroup-plugins linuxproc|cgroup; see --help)" >&2; exit 2 ;;
    esac
  done
}

case ${1:-} in
  up) shift; parse_up_options "$@"; cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  env) cmd_env ;;
  logs) cmd_logs "${2:-15}" ;;
  -h|--help|help) usage ;;
  '') usage >&2; exit 2 ;;
  *) echo "$prog: unknown command '$1' (expected up, down, status, env or logs; see --help)" >&2; exit 2 ;;
esac
