#!/usr/bin/env bash
# local-cluster.sh — a single-node Slurm 22.05 cluster on localhost, without systemd, for mall's
# demos and system tests: munged (or auth/none), slurmctld, slurmd, the mall SPANK plugin (when built)
# and malld, every file under one folder, every daemon tracked by its pid. See --help.
#
# Choices, and why:
# - ProctrackType=proctrack/linuxproc + TaskPlugin=task/affinity: the simplest pair that works here;
#   Slurm then creates no cgroups of its own, so malld's cpusets (under "mall_cluster") are the only
#   ones on the node. (proctrack/cgroup + task/cgroup also work, see ../shared/PLATFORM.md; `down`
#   removes a slurm_<node> cpuset folder anyway, in case a site's config made one.)
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
wait_s=${MALL_CLUSTER_TIMEOUT_S:-30}
node=$(hostname -s)
prog=local-cluster.sh

usage() {
  cat <<EOF
$prog — a single-node Slurm cluster on this machine, with mall's malld and SPANK plugin

Usage: launch_scripts/$prog up|down|status|env
       launch_scripts/$prog -h|--help

Commands:
  up      write the configuration and start munged, malld, slurmctld and slurmd (those not already
          running), then wait until the controller answers and node $node is idle. Idempotent: when
          everything runs it returns at once. Needs root.
  down    cancel the cluster's jobs, stop every daemon by its pid (SIGTERM, SIGKILL after a
          deadline), remove the cgroups the cluster made ($cgroup_parent and slurm_$node cpusets)
          and the whole state folder. Idempotent.
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
  MALL_CLUSTER_TIMEOUT_S  how long up/down wait for each step (default 30)
  MALL_CLUSTER_MALLD_SLURM  1 (default): start malld with --slurm (checks jobs against slurmctld)
                          when it supports it; 0: without

Files under the state folder:
  etc/slurm.conf etc/plugstack.conf   the generated configuration (SLURM_CONF points here)
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
  if [ -z "${MALL_CLUSTER_PORT:-}" ] && [ -n "$saved_port" ]; then
    ctld_port=$saved_port
    slurmd_port=$(( ctld_port + 1 ))
  fi
  if [ -z "${MALL_CLUSTER_CGROUP:-}" ] && [ -n "$saved_cgroup" ]; then cgroup_parent=$saved_cgroup; fi
fi
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

write_config() { # write_config AUTH write|check: (re)writes slurm.conf and plugstack.conf, or only
  # compares; true when the files differ from what this call would write
  local auth=$1 mode=$2 nodeline new changed=0
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
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
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

  # The state folder: ours (marker), or new/empty (e.g. from mktemp). Never adopt a foreign folder.
  if [ -e "$dir" ] && [ ! -e "$marker" ] && [ -n "$(ls -A "$dir" 2>/dev/null)" ]; then
    die "$dir exists and is not a mall cluster folder; remove it or set MALL_CLUSTER_DIR to another folder"
  fi
  mkdir -p "$dir"/{etc,log,run,state,spool,malld,tmp}
  chmod 1777 "$dir/tmp"
  printf 'port=%s\ncgroup=%s\n' "$ctld_port" "$cgroup_parent" >"$marker"
  cd "$dir"   # the daemons' working folder: none of them keeps the caller's folder busy
  chmod 0755 "$dir" "$dir/etc" "$dir/log"   # users' clients read slurm.conf; munge must reach its folder

  started=()
  local running=()
  for name in "${daemons_up_order[@]}"; do
    if [ "$name" = munged ] && [ "$auth" = none ]; then continue; fi
    if daemon_pid "$name" >/dev/null; then running+=("$name"); fi
  done

  # Rewriting slurm.conf under running daemons would split clients from daemons (e.g. another
  # AuthType): while anything runs, the configuration it started with stays.
  if [ ${#running[@]} -eq 0 ]; then
    write_config "$auth" write || true
  elif write_config "$auth" check; then
    say "warning: ${running[*]} run(s) with an older configuration (auth, plugin, node or ports differ); apply the new one with: $prog down && $prog up"
  fi

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
    start_daemon slurmd slurmd -D -f "$conf"
  fi
  wait_until "node $node to be idle (sinfo)" bash -c "sinfo -h -n '$node' -o %t | grep -qx idle"

  if [ ${#started[@]} -eq 0 ]; then
    say "already up ($dir): $(status_line)"
  else
    say "up in $(( $(date +%s%N) / 1000000 - t0_ms )) ms ($dir, auth/$auth, plugin $( [ -f "$plugin" ] && echo "loaded from $plugin" || echo "not built: running without it")): started ${started[*]}"
  fi
  say "use it with: eval \"\$(launch_scripts/$prog env)\""
}

# ---- down ---------------------------------------------------------------------------------------
cgroup_dirs() { # the cgroup folders this cluster may have made, in every mounted hierarchy
  local h
  for h in /sys/fs/cgroup /sys/fs/cgroup/*; do
    [ -d "$h" ] || continue
    if [ -d "$h/$cgroup_parent" ]; then echo "$h/$cgroup_parent"; fi
    if [ -d "$h/slurm_$node" ]; then echo "$h/slurm_$node"; fi
  done | sort -u
}
remove_cgroup_tree() { # remove_cgroup_tree DIR MOVE: removes the folders deepest first; with MOVE=1
  # pids left inside go to the hierarchy's root first (only for malld's parent, which is ours alone:
  # a slurm_<node> folder that still holds processes may belong to another cluster on this node)
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

  local cg
  for cg in $(cgroup_dirs); do
    if [ "$(basename "$cg")" = "$cgroup_parent" ]; then remove_cgroup_tree "$cg" 1; else remove_cgroup_tree "$cg" 0; fi
  done
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

case ${1:-} in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  env) cmd_env ;;
  logs) cmd_logs "${2:-15}" ;;
  -h|--help|help) usage ;;
  '') usage >&2; exit 2 ;;
  *) echo "$prog: unknown command '$1' (expected up, down, status, env or logs; see --help)" >&2; exit 2 ;;
esac
