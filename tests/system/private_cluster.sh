# private_cluster.sh — sourced by the system tests: sets up a private single-node cluster's
# environment (own folder, cgroup parent and free port pair, so a test runs beside a developer's
# cluster without touching it) and the helpers that check what the cluster leaves behind.
# Usage: private_cluster_init NAME FIRST_PORT  (needs $build; sets $work, MALL_CLUSTER_* and
# $port, $cgroups_before). The caller owns the cleanup trap and calls local-cluster.sh up/down.

private_cluster_init() {
  local name=$1 first_port=$2
  work=$(mktemp -d "/tmp/$name.XXXXXX")
  chmod 0755 "$work"
  export MALL_CLUSTER_DIR=$work/cluster
  export MALL_BUILD_DIR=$build
  export MALL_CLUSTER_CGROUP=mall_cluster_systest$$
  export MALL_CLUSTER_TIMEOUT_S=30
  port=$first_port   # global: the tests print it
  while port_taken $port || port_taken $(( port + 1 )); do
    port=$(( port + 10 ))
    [ $port -lt 7500 ] || { echo "FAIL: no free port pair for slurmctld/slurmd in $first_port..7500"; exit 1; }
  done
  export MALL_CLUSTER_PORT=$port
  cgroups_before=$(cgroups_now)
}

port_taken() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# cgroup folders a cluster makes: malld's parent and Slurm's slurm_<node> (the latter only with the
# cgroup plugins; compared before/after, so another cluster's folders are not counted).
cgroups_now() {
  find /sys/fs/cgroup /sys/fs/cgroup/* -mindepth 1 -maxdepth 1 -type d \
       \( -name "$MALL_CLUSTER_CGROUP" -o -name 'mall_cluster' -o -name 'slurm_*' \) 2>/dev/null | sort -u
}
state_of() { local stat; stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0; stat=${stat##*) }; echo "${stat%% *}"; }
live() { local st; st=$(state_of "$1"); [ -n "$st" ] && [ "$st" != Z ] && [ "$st" != X ]; }
run_processes() { # live processes started by this run's cluster (they carry MALL_CLUSTER_DAEMON=<dir>)
  local p
  for p in /proc/[0-9]*; do
    grep -qzxF "MALL_CLUSTER_DAEMON=$MALL_CLUSTER_DIR" "$p/environ" 2>/dev/null || continue
    live "${p#/proc/}" && echo "${p#/proc/}($(cat "$p/comm" 2>/dev/null))"
  done
}
