#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# container_kit.sh — the container test kit: podman and docker containers as mall jobs on this node,
# with no registry, engine state private to each test, and a cleanup that leaves nothing behind.
# Contract: everything the kit makes (containers, images, storage, a private dockerd + containerd,
# cgroup folders, mounts, temp files) lives under the test's folder $CTR_DIR, its cgroup subtree
# $CTR_CGROUP and its name prefix $CTR_PREFIX, and ctr_cleanup removes all of it — also after a
# failed step or a killed test, from the files the kit keeps in $CTR_DIR. Every engine command runs
# under a watchdog ($CTR_STEP_TIMEOUT_S): a hang fails the step, it never stalls the test.
# It stays one file (about 800 lines): tests source one kit, and ctr_cleanup must know every kind
# of thing the kit makes, which the kit records in $CTR_DIR as it makes them.
#
# Sourced by tests (functions below); run directly for watchdogs and humans: --help.
#
# Using it from a test (bash; root; see tests/containers/smoke.sh for a complete one):
#   . tests/containers/container_kit.sh
#   ctr_init mytest || exit 1                  # $CTR_DIR, $CTR_CGROUP, $CTR_PREFIX; sweeps nothing
#   trap ctr_cleanup EXIT                      # or ctr_install_traps (EXIT/INT/TERM)
#   ctr_have podman || { echo "SKIP: $CTR_WHY"; exit 77; }
#   ctr_bind_ro "$MALL_BIN_DIR"                 # host folders seen read-only at the same path
#   ctr_cgroup_make "$CTR_CGROUP/job1"          # v1: cpus + mems copied from the parent
#   ctr_mall_opts "$CTR_DIR/sock/malld.sock" job1 "$CTR_CGROUP/job1"
#   ctr_run podman c1 -d "${CTR_MALL_OPTS[@]}" -- /usr/bin/sleep 600
#   ctr_exec podman c1 nproc                   # 2
#   ctr_cpuset_set "$CTR_CGROUP/job1" 1         # the folder and every descendant, in a safe order
#   ctr_exec podman c1 nproc                   # 1
#   ctr_cleanup                                # containers, storage, cgroups, mounts, daemons, $CTR_DIR
#
# Functions (each returns non-zero on failure, with a line on stderr saying what failed):
#   ctr_init NAME            make $CTR_DIR (${TMPDIR:-/tmp}/mallctr-NAME-XXXXXX, mode 0700), set
#                            $CTR_CGROUP (/mallctr-NAME-XXXXXX under each cgroup hierarchy's root),
#                            $CTR_PREFIX (lower case, for container and image names) and record them
#                            in $CTR_DIR/kit.env. Everything else derives from the folder's name.
#   ctr_have ENGINE          podman|docker: 0 when every program it needs is installed, else 1 and
#                            $CTR_WHY says which is missing (the only reason to skip a test).
#   ctr_podman ARGS...       podman with this test's private config, storage, locks and runtime state
#   ctr_docker ARGS...       the docker client against this test's private dockerd
#   ctr_docker_start         start the private dockerd (and the containerd it supervises); waits
#                            until it answers; $CTR_DOCKERD_START_MS says how long that took
#   ctr_docker_stop          stop them (TERM, then KILL after $CTR_DOCKERD_STOP_S), shims included
#   ctr_image ENGINE         import the tiny rootfs as image $CTR_PREFIX-img (docker: needed, done by
#                            the first ctr_run; podman: optional, sets CTR_PODMAN_IMAGE, and then
#                            ctr_run podman uses the image instead of --rootfs; call it directly,
#                            not in $(...), for that variable to stay set)
#   ctr_bind_ro PATH...      add host folders mounted read-only at the same path in every container
#   ctr_mall_opts SOCKET JOB [CGROUP_PARENT]
#                            fill the array CTR_MALL_OPTS with what a mall container needs:
#                            --cgroup-parent, the socket's folder bind-mounted (read-only, same
#                            path), MALL_SOCKET and MALL_JOB_ID
#   ctr_run ENGINE NAME [RUN-OPTIONS...] -- CMD...
#                            podman/docker run of CMD in container $CTR_PREFIX-NAME: --network none,
#                            the host's /usr (+ lib/bin links), /etc/ld.so.cache, /etc/alternatives
#                            and every ctr_bind_ro folder read-only; --cgroup-parent defaults to
#                            $CTR_CGROUP/default (never the engine's shared /libpod_parent or /docker)
#   ctr_engine_bin ENGINE    print the path of an executable that runs the engine as ctr_podman/
#                            ctr_docker do (for mallrun --container -- "$(ctr_engine_bin podman)" run ...)
#   ctr_run_args ENGINE NAME fill CTR_RUN_ARGS with ctr_run's run options and image (or --rootfs) for
#                            container $CTR_PREFIX-NAME, without --cgroup-parent
#   ctr_test_reporting NAME  define pass/fail/note/skip for test NAME (counts in $failures, $skipped)
#   ctr_wait_until MS WHAT CMD...  poll CMD every 50 ms until it succeeds; 1 after MS
#   ctr_malld_start BIN SOCKET ARGS... / ctr_malld_stop
#                            a private malld of the build on SOCKET (state and log in $CTR_DIR)
#   ctr_check_nothing_left   ctr_cleanup, then ctr_leaks, reported as PASS/FAIL lines
#   ctr_exec ENGINE NAME CMD...   run CMD in the running container (podman/docker exec)
#   ctr_rm ENGINE NAME            remove the container at once (rm -f, no grace time)
#   ctr_id / ctr_pid / ctr_monitor_pid ENGINE NAME
#                            the container's full id / its init's host pid / the host pid of the
#                            process that watches it (podman: conmon; docker: containerd-shim)
#   ctr_cgroup_make REL [CPUS]    make the cpuset folder REL (e.g. $CTR_CGROUP/job1) and its parents
#   ctr_cpuset_set REL CPUS  set REL's cpuset.cpus and every descendant's (containers under a
#                            --cgroup-parent) to CPUS: on v1 ancestors-first when widening and
#                            descendants-first when narrowing, which is the only order v1 accepts
#   ctr_cpuset_get REL       print REL's cpuset.cpus
#   ctr_cgroup_of PID        print PID's cpuset cgroup (v1 cpuset line, else the v2 line), e.g.
#                            /mallctr-smoke-Ab12Cd/job1/libpod-<id>
#   ctr_ms VAR CMD...        run CMD, store its wall time in ms in VAR, return CMD's status
#   ctr_leaks                print what this test left (processes, cgroup folders, mounts, runc
#                            state, $CTR_DIR); 0 when nothing is left
#   ctr_cleanup [DIR]        remove everything of this test (or of the kit in DIR); idempotent, safe
#                            in traps; a watchdog in another process runs `container_kit.sh cleanup DIR`
#   ctr_install_traps [S]    EXIT: ctr_cleanup; TERM: watchdog_fired S, exit 1; INT: exit 130
#   ctr_sweep                clean the kits of tests that died without cleaning up (owner pid gone)
#
# Why these choices (measured on the project's machine kind, Debian 12, cgroup v1 cpuset, 2 cpus):
# - Images without a registry: podman runs a tiny rootfs folder with --rootfs (a few folders, /etc/
#   passwd, /etc/group, bin/lib links into the bind-mounted host /usr): no image store, no overlay
#   mount, nothing to unpack; `podman run --rm` of /usr/bin/true takes ~0.45 s, ~0.55 s from an
#   imported image (import ~0.3 s; it also writes root's host-wide blob-info cache in
#   /var/lib/containers/cache, which the kit removes when it made it). Docker has no --rootfs: the same folder as a tarball through
#   `docker import` (~0.2 s, a 147-byte image). Host-built binaries, Debian's Python, numpy and torch
#   run unchanged because /usr is the host's; /etc/ld.so.cache and /etc/alternatives are bound too
#   (without them numpy fails: "libblas.so.3: cannot open shared object file").
# - podman: a private containers.conf/storage.conf per test (root, runroot, tmp dir, events file,
#   cni folder, hooks folder, lock_type "file"): the default shm locks live in one host-wide segment
#   (/dev/shm/libpod_lock) that every store shares, file locks stay in the test's tmp dir. Private
#   storage costs ~0.1-0.3 s on the first command. runc, not crun (crun refuses this hybrid cgroup
#   layout); nofile/nproc ulimits explicit (no CAP_SYS_RESOURCE: podman's defaults fail with EPERM);
#   --network none (no netavark/CNI); pull_policy never. runc's own state is in /run/runc/<id>
#   (podman passes no --root to runc), removed with the container.
# - docker: a private dockerd (--data-root, --exec-root, its own containerd under the exec root, own
#   socket, pidfile, empty --config-file, cgroupfs driver, --cgroup-parent $CTR_CGROUP/docker, no
#   iptables/bridge). Ready in ~0.5-0.7 s, stops in ~1.5-2.5 s. Outside the test's folder it only
#   makes the folders /run/docker/plugins and /run/containerd/s (shim sockets, removed by the shims);
#   the kit removes those (and /run/runc) when they are empty and no dockerd, containerd or conmon
#   runs. Its trust key goes to the test's folder ("deprecated-key-path"), not /etc/docker/key.json.
# - Where things land (v1, with --cgroup-parent /P): podman's container in /P/libpod-<id> in every
#   hierarchy, conmon in /P/conmon (cpuset, memory, ...; not in name=systemd), conmon's parent is
#   pid 1; docker's container in /P/<id>, its containerd-shim stays in dockerd's cgroups (not under
#   /P), parent pid 1. runc makes /P in every hierarchy (also the v2 mount); rm removes the
#   container's folders, never /P or /P/conmon. `exec`: the process joins the container's cgroups;
#   its parent is a new conmon (podman: one per exec, parent pid 1, in /P/conmon) or the container's
#   shim (docker); /proc/PID/status NSpid shows the host pid and the container pid.
# - After the container's cpuset.cpus is narrowed from outside: nproc and sched_getaffinity follow
#   at once (also for processes already running); /proc/cpuinfo and os.cpu_count() still show every
#   host cpu; the container's /sys/fs/cgroup/cpuset/cpuset.cpus shows the narrowed list.
# - Rootless podman (user nobody, HOME and XDG_RUNTIME_DIR in a temp folder, runc, cgroupfs) runs
#   here with a single uid mapping (no /etc/subuid entries, no newuidmap: uidmap is not installed)
#   and the vfs driver; on cgroup v1 its containers stay in the caller's cgroups, and --cgroup-parent
#   works only when root made /P in every hierarchy (devices included) and chowned it to the user.
#   It leaves a `catatonit -P` pause process per user. The kit runs podman as root only.
#
# Environment: CTR_STEP_TIMEOUT_S (60: any one engine command), CTR_DOCKERD_TIMEOUT_S (60: dockerd
# start), CTR_DOCKERD_STOP_S (20), MALL_CTR_DOCKER (the docker client; default /usr/bin/docker, the
# one shipped with dockerd, ahead of other clients on PATH).

# shellcheck source=../support/watchdog.sh
. "$(dirname "${BASH_SOURCE[0]}")/../support/watchdog.sh"   # watchdog_run, watchdog_fired

: "${CTR_STEP_TIMEOUT_S:=60}" "${CTR_DOCKERD_TIMEOUT_S:=60}" "${CTR_DOCKERD_STOP_S:=20}"
CTR_BINDS=()        # host folders every container sees read-only (ctr_bind_ro)
CTR_MALL_OPTS=()    # ctr_mall_opts' result
CTR_RUN_ARGS=()     # ctr_run_args' result
CTR_PODMAN_IMAGE=   # set by `ctr_image podman`: ctr_run podman then uses it instead of --rootfs
CTR_WHY=
# Folders outside $CTR_DIR that the engines make on first use and never remove.
ctr__shared_run_dirs=(/run/runc /run/containerd/s /run/containerd /run/docker/plugins /run/docker)

ctr__err() { echo "container_kit: $*" >&2; }
ctr__now_ms() { echo $(( $(date +%s%N) / 1000000 )); }

ctr_ms() { # ctr_ms VAR CMD...
  local __var=$1 __t0 __rc=0
  shift
  __t0=$(ctr__now_ms)
  "$@" || __rc=$?
  printf -v "$__var" '%s' "$(( $(ctr__now_ms) - __t0 ))"
  return "$__rc"
}

# ---- the test's identity ---------------------------------------------------------------------------
# Everything derives from the folder's base name, so `cleanup DIR` works even without kit.env.
ctr__derive() { # ctr__derive DIR: sets CTR_DIR, CTR_CGROUP, CTR_PREFIX
  CTR_DIR=${1%/}
  local base; base=$(basename "$CTR_DIR")
  CTR_CGROUP=/$base
  CTR_PREFIX=$(tr '[:upper:]' '[:lower:]' <<<"$base")
}

ctr__proc_start() { # the start time (field 22 of /proc/PID/stat) of a live, non-zombie PID
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }   # fields from 3 on (comm may hold spaces)
  # shellcheck disable=SC2086  # split the fields on purpose
  set -- $stat
  [ "$1" != Z ] || return 1
  echo "${20}"
}

ctr_init() { # ctr_init NAME
  local name=${1:?usage: ctr_init NAME} tmp=${TMPDIR:-/tmp} d
  name=$(tr -c 'A-Za-z0-9_\n-' '_' <<<"$name")
  # Unix socket paths (dockerd's, containerd's ttrpc socket) must stay under 108 bytes.
  [ ${#tmp} -le 40 ] || tmp=/tmp
  d=$(mktemp -d "$tmp/mallctr-$name-XXXXXX") || { ctr__err "cannot make a folder in $tmp"; return 1; }
  chmod 0700 "$d"
  ctr__derive "$d"
  printf 'CTR_OWNER_PID=%q\nCTR_OWNER_START=%q\n' "$$" "$(ctr__proc_start $$)" >"$CTR_DIR/kit.env"
  mkdir -p "$CTR_DIR/rootfs" "$CTR_DIR/sock"
  ctr__make_rootfs "$CTR_DIR/rootfs"
}

ctr_have() { # ctr_have podman|docker
  local p need=()
  case $1 in
    podman) need=(podman runc conmon) ;;
    docker) need=(dockerd containerd containerd-shim-runc-v2 runc) ;;
    *) CTR_WHY="unknown engine $1"; return 1 ;;
  esac
  for p in "${need[@]}"; do
    command -v "$p" >/dev/null 2>&1 || { CTR_WHY="$p is not installed (launch_scripts/install-deps.sh installs it)"; return 1; }
  done
  if [ "$1" = docker ] && [ ! -x "$(ctr__docker_client)" ]; then
    CTR_WHY="no docker client (launch_scripts/install-deps.sh installs docker.io)"; return 1
  fi
  CTR_WHY=""   # read by the caller
  : "$CTR_WHY"
}

# ---- the rootfs and the host folders every container sees --------------------------------------------
ctr__make_rootfs() { # a few folders, users, and the host's bin/lib links (merged /usr) or binds
  local r=$1 l
  mkdir -p "$r"/{etc,proc,sys,dev,tmp,run,root,usr,var/tmp}
  chmod 1777 "$r/tmp" "$r/var/tmp"
  printf '%s\n' 'root:x:0:0:root:/root:/bin/sh' 'nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin' >"$r/etc/passwd"
  printf '%s\n' 'root:x:0:' 'nogroup:x:65534:' >"$r/etc/group"
  for l in bin sbin lib lib32 lib64 libx32; do
    if [ -L "/$l" ]; then ln -s "$(readlink "/$l")" "$r/$l"
    elif [ -d "/$l" ]; then mkdir -p "$r/$l"
    fi
  done
}

ctr__host_binds() { # prints one -v argument per line: the host's /usr and friends, then ctr_bind_ro's
  local l p
  echo "--volume=/usr:/usr:ro"
  for l in bin sbin lib lib32 lib64 libx32; do
    if [ -d "/$l" ] && [ ! -L "/$l" ]; then echo "--volume=/$l:/$l:ro"; fi
  done
  for p in /etc/ld.so.cache /etc/alternatives; do [ -e "$p" ] && echo "--volume=$p:$p:ro"; done
  for p in "${CTR_BINDS[@]}"; do echo "--volume=$p:$p:ro"; done
}

ctr_bind_ro() { # ctr_bind_ro PATH...
  local p
  for p in "$@"; do
    [ -e "$p" ] || { ctr__err "ctr_bind_ro: $p does not exist"; return 1; }
    CTR_BINDS+=("$(cd "$p" 2>/dev/null && pwd || echo "$p")")
  done
}

ctr_mall_opts() { # ctr_mall_opts SOCKET JOB [CGROUP_PARENT]
  local socket=${1:?usage: ctr_mall_opts SOCKET JOB [CGROUP_PARENT]} job=${2:?usage: ctr_mall_opts SOCKET JOB [CGROUP_PARENT]}
  local parent=${3:-$CTR_CGROUP/$2} dir
  dir=$(dirname "$socket")
  [ -d "$dir" ] || { ctr__err "ctr_mall_opts: the socket's folder $dir does not exist"; return 1; }
  [ -d "$(ctr_cgroup_path "$parent")" ] || ctr_cgroup_make "$parent" || return 1
  # shellcheck disable=SC2034  # the caller's: "${CTR_MALL_OPTS[@]}"
  CTR_MALL_OPTS=(--cgroup-parent="$parent" --volume="$dir:$dir:ro" --env="MALL_SOCKET=$socket" --env="MALL_JOB_ID=$job")
}

# ---- cgroups ----------------------------------------------------------------------------------------
ctr__cgroup_mounts() { # every cgroup (v1) and cgroup2 mount point, one a line
  awk '{ split($0, halves, " - "); split(halves[2], after, " ");
         if (after[1] == "cgroup" || after[1] == "cgroup2") print $5 }' /proc/self/mountinfo
}

ctr__cpuset_mount() { # the v1 cpuset hierarchy, else a cgroup2 mount that offers cpuset
  local m
  m=$(awk '{ split($0, halves, " - "); split(halves[2], after, " ");
             if (after[1] == "cgroup" && ("," after[3] ",") ~ /,cpuset,/) { print $5; exit } }' /proc/self/mountinfo)
  if [ -n "$m" ]; then echo "v1 $m"; return 0; fi
  while read -r m; do
    if grep -qw cpuset "$m/cgroup.controllers" 2>/dev/null; then echo "v2 $m"; return 0; fi
  done < <(awk '{ split($0, halves, " - "); split(halves[2], after, " ");
                  if (after[1] == "cgroup2") print $5 }' /proc/self/mountinfo)
  return 1
}

ctr_cgroup_path() { # ctr_cgroup_path REL: the cpuset folder's absolute path
  local kind mount
  read -r kind mount < <(ctr__cpuset_mount) || { ctr__err "no cpuset controller (cgroup v1 cpuset or v2 with cpuset)"; return 1; }
  : "$kind"
  echo "$mount/${1#/}"
}

ctr_cgroup_make() { # ctr_cgroup_make REL [CPUS]
  local rel=${1#/} cpus=${2-} kind mount path="" part parent parts=()
  read -r kind mount < <(ctr__cpuset_mount) || { ctr__err "no cpuset controller (cgroup v1 cpuset or v2 with cpuset)"; return 1; }
  IFS=/ read -ra parts <<<"$rel"
  for part in "${parts[@]}"; do
    [ -n "$part" ] || continue
    parent=$mount$path
    path=$path/$part
    if [ "$kind" = v2 ] && ! grep -qw cpuset "$parent/cgroup.subtree_control"; then
      echo +cpuset >"$parent/cgroup.subtree_control" || { ctr__err "cannot enable cpuset in $parent"; return 1; }
    fi
    mkdir -p "$mount$path" || { ctr__err "cannot make $mount$path"; return 1; }
    if [ "$kind" = v1 ] && [ -z "$(cat "$mount$path/cpuset.cpus")" ]; then
      if ! { cat "$parent/cpuset.cpus" >"$mount$path/cpuset.cpus" && cat "$parent/cpuset.mems" >"$mount$path/cpuset.mems"; }; then
        ctr__err "cannot give $mount$path the cpus and mems of $parent"; return 1
      fi
    fi
  done
  [ -z "$cpus" ] || ctr_cpuset_set "/$rel" "$cpus"
}

ctr_cpuset_get() { cat "$(ctr_cgroup_path "$1")/cpuset.cpus"; }

ctr__cpulist_expand() { # "0-2,5" -> 0 1 2 5, one a line
  local part IFS=,
  for part in $1; do
    case $part in
      *-*) seq "${part%-*}" "${part#*-}" ;;
      ?*) echo "$part" ;;
    esac
  done
}

ctr_cpuset_set() { # ctr_cpuset_set REL CPUS
  local top cpus=${2:?usage: ctr_cpuset_set REL CPUS} d union i dirs=()
  top=$(ctr_cgroup_path "$1") || return 1
  [ -d "$top" ] || { ctr__err "ctr_cpuset_set: no cgroup $top"; return 1; }
  mapfile -t dirs < <(find "$top" -type d)   # pre-order: every folder before its children
  # Widen top-down to the union of old and new (v1 refuses a child wider than its parent), then
  # narrow bottom-up to the new list (v1 refuses a parent narrower than a child: EBUSY).
  for d in "${dirs[@]}"; do
    union=$( { ctr__cpulist_expand "$(cat "$d/cpuset.cpus")"; ctr__cpulist_expand "$cpus"; } | sort -un | paste -sd, -)
    [ "$union" = "$(ctr__cpulist_expand "$(cat "$d/cpuset.cpus")" | paste -sd, -)" ] && continue
    echo "$union" >"$d/cpuset.cpus" 2>/dev/null || { ctr__err "cannot widen $d to $union"; return 1; }
  done
  for (( i = ${#dirs[@]} - 1; i >= 0; i-- )); do
    echo "$cpus" >"${dirs[i]}/cpuset.cpus" 2>/dev/null || { ctr__err "cannot set ${dirs[i]} to $cpus"; return 1; }
  done
}

ctr_cgroup_of() { # ctr_cgroup_of PID
  local line
  line=$(grep -E '^[0-9]+:([^:]*,)?cpuset(,[^:]*)?:' "/proc/$1/cgroup" 2>/dev/null) ||
    line=$(grep -E '^0::' "/proc/$1/cgroup" 2>/dev/null) || return 1
  echo "${line#*:*:}"
}

ctr__kill_cgroup_tree() { # SIGKILL every process left in $CTR_CGROUP, in every hierarchy
  local m d p
  for m in $(ctr__cgroup_mounts); do
    [ -d "$m$CTR_CGROUP" ] || continue
    while read -r d; do
      while read -r p; do
        [ -n "$p" ] && [ "$p" != $$ ] && kill -KILL "$p" 2>/dev/null
      done <"$d/cgroup.procs"
    done < <(find "$m$CTR_CGROUP" -type d 2>/dev/null)
  done
}

ctr__remove_cgroups() { # remove $CTR_CGROUP in every hierarchy, deepest first; retries while tasks exit
  local m deadline left
  deadline=$(( $(ctr__now_ms) + 5000 ))
  while :; do
    left=0
    for m in $(ctr__cgroup_mounts); do
      [ -d "$m$CTR_CGROUP" ] || continue
      find "$m$CTR_CGROUP" -depth -type d -exec rmdir {} + 2>/dev/null
      [ -d "$m$CTR_CGROUP" ] && left=1
    done
    [ "$left" = 0 ] && return 0
    [ "$(ctr__now_ms)" -lt "$deadline" ] || break
    ctr__kill_cgroup_tree
    sleep 0.1
  done
  ctr__err "cgroup folders left: $(for m in $(ctr__cgroup_mounts); do [ -d "$m$CTR_CGROUP" ] && echo -n "$m$CTR_CGROUP "; done)"
  return 1
}

# ---- podman ------------------------------------------------------------------------------------------
ctr__podman_setup() {
  local d=$CTR_DIR/podman
  mkdir -p "$d/root" "$d/runroot" "$d/tmp" "$d/cni" "$d/hooks.d"
  cat >"$d/containers.conf" <<EOF
# This test's podman (container_kit.sh): private state, runc, cgroupfs, no network, no registry.
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]
netns = "none"
log_driver = "k8s-file"
[network]
network_config_dir = "$d/cni"
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$d/events.log"
hooks_dir = ["$d/hooks.d"]
image_copy_tmp_dir = "$d/tmp"
lock_type = "file"
pull_policy = "never"
runtime = "runc"
tmp_dir = "$d/tmp"
EOF
  cat >"$d/storage.conf" <<EOF
[storage]
driver = "overlay"
graphroot = "$d/root"
runroot = "$d/runroot"
EOF
  echo 'unqualified-search-registries = []' >"$d/registries.conf"
}

ctr_podman() { # ctr_podman ARGS...
  local d=$CTR_DIR/podman
  [ -f "$d/containers.conf" ] || ctr__podman_setup
  CONTAINERS_CONF=$d/containers.conf CONTAINERS_STORAGE_CONF=$d/storage.conf \
  CONTAINERS_REGISTRIES_CONF=$d/registries.conf \
    watchdog_run "$CTR_STEP_TIMEOUT_S" podman --root "$d/root" --runroot "$d/runroot" --tmpdir "$d/tmp" \
      --cgroup-manager cgroupfs --runtime runc --events-backend file --log-level error "$@"
}

# ---- docker ------------------------------------------------------------------------------------------
ctr__docker_client() { # the client shipped with dockerd, not whichever docker comes first on PATH
  if [ -n "${MALL_CTR_DOCKER-}" ]; then echo "$MALL_CTR_DOCKER"
  elif [ -x /usr/bin/docker ]; then echo /usr/bin/docker
  else command -v docker
  fi
}

ctr_docker() { # ctr_docker ARGS...
  DOCKER_CONFIG=$CTR_DIR/docker/client \
    watchdog_run "$CTR_STEP_TIMEOUT_S" "$(ctr__docker_client)" --host "unix://$CTR_DIR/docker/docker.sock" "$@"
}

ctr__dockerd_pid() { # the private dockerd's pid, when it runs
  local p
  p=$(cat "$CTR_DIR/docker/docker.pid" 2>/dev/null) || p=$(cat "$CTR_DIR/docker/launched.pid" 2>/dev/null) || return 1
  ctr__proc_start "$p" >/dev/null && echo "$p"
}

ctr_docker_start() {
  local d=$CTR_DIR/docker t0 deadline
  if ctr__dockerd_pid >/dev/null; then return 0; fi
  mkdir -p "$d/data" "$d/exec" "$d/client"
  printf '{ "deprecated-key-path": "%s/key.json" }\n' "$d" >"$d/daemon.json"
  t0=$(ctr__now_ms)
  # setsid: a signal to the test's process group (a watchdog's) must not reach dockerd before the
  # test's cleanup has asked it to remove its containers; no stdio of the test's (ctest waits on it).
  setsid dockerd --config-file "$d/daemon.json" --data-root "$d/data" --exec-root "$d/exec" \
    --host "unix://$d/docker.sock" --pidfile "$d/docker.pid" --exec-opt native.cgroupdriver=cgroupfs \
    --cgroup-parent "$CTR_CGROUP/docker" --storage-driver overlay2 --iptables=false --ip-masq=false \
    --bridge=none --userland-proxy=false --log-level warn </dev/null >"$d/dockerd.log" 2>&1 &
  echo $! >"$d/launched.pid"
  deadline=$(( t0 + CTR_DOCKERD_TIMEOUT_S * 1000 ))
  until CTR_STEP_TIMEOUT_S=5 ctr_docker version >/dev/null 2>&1; do
    if ! ctr__proc_start "$(cat "$d/launched.pid")" >/dev/null; then
      ctr__err "dockerd exited at start; its log:"; tail -n 20 "$d/dockerd.log" >&2; return 1
    fi
    if [ "$(ctr__now_ms)" -ge "$deadline" ]; then
      ctr__err "dockerd did not answer within $CTR_DOCKERD_TIMEOUT_S s; its log:"; tail -n 20 "$d/dockerd.log" >&2; return 1
    fi
    sleep 0.05
  done
  CTR_DOCKERD_START_MS=$(( $(ctr__now_ms) - t0 ))
  export CTR_DOCKERD_START_MS
}

ctr__pids_matching() { # pids (not zombies, not this shell or its parents) whose command line names $1
  local p self=" $$ $BASHPID $PPID "
  for p in $(pgrep -f -- "$1" 2>/dev/null); do
    case $self in *" $p "*) continue ;; esac
    ctr__proc_start "$p" >/dev/null && echo "$p"
  done
}

ctr__live_named() { # true when a process named $1 runs (zombies, which pgrep lists, do not count)
  local p
  for p in $(pgrep -x -- "$1" 2>/dev/null); do ctr__proc_start "$p" >/dev/null && return 0; done
  return 1
}

ctr__wait_gone() { # ctr__wait_gone MS PID...: true once every PID is gone or a zombie
  local deadline=$(( $(ctr__now_ms) + $1 )) p alive
  shift
  while :; do
    alive=0
    for p in "$@"; do ctr__proc_start "$p" >/dev/null && alive=1; done
    [ "$alive" = 0 ] && return 0
    [ "$(ctr__now_ms)" -lt "$deadline" ] || return 1
    sleep 0.05
  done
}

ctr_docker_stop() {
  local d=$CTR_DIR/docker pid rest
  if pid=$(ctr__dockerd_pid); then
    kill -TERM "$pid" 2>/dev/null
    if ! ctr__wait_gone $(( CTR_DOCKERD_STOP_S * 1000 )) "$pid"; then
      ctr__err "dockerd ($pid) still running $CTR_DOCKERD_STOP_S s after SIGTERM: SIGKILL"
      kill -KILL "$pid" 2>/dev/null
    fi
  fi
  # Its containerd (--config under the exec root) and the shims (-address under it) go with it;
  # after a SIGKILL they would not.
  mapfile -t rest < <(ctr__pids_matching "$d/")
  if [ ${#rest[@]} -gt 0 ]; then
    kill -TERM "${rest[@]}" 2>/dev/null
    ctr__wait_gone 3000 "${rest[@]}" || kill -KILL "${rest[@]}" 2>/dev/null
    ctr__wait_gone 2000 "${rest[@]}"
  fi
}

# ---- images and containers -----------------------------------------------------------------------------
ctr_image() { # ctr_image podman|docker (not in $(...): it sets CTR_PODMAN_IMAGE)
  local img=$CTR_PREFIX-img
  case $1 in
    docker)
      if ! ctr_docker image inspect "$img" >/dev/null 2>&1; then
        tar -C "$CTR_DIR/rootfs" -c . | ctr_docker import - "$img" >/dev/null || { ctr__err "docker import failed"; return 1; }
      fi ;;
    podman)
      # containers/image keeps root's blob-info cache in /var/lib/containers/cache whatever --root
      # says (no option moves it in Debian 12's podman): note whether the kit made that folder.
      [ -e /var/lib/containers ] || : >"$CTR_DIR/made-var-lib-containers"
      if ! ctr_podman image exists "$img"; then
        tar -C "$CTR_DIR/rootfs" -c . | ctr_podman import --quiet - "$img" >/dev/null || { ctr__err "podman import failed"; return 1; }
      fi
      CTR_PODMAN_IMAGE=$img ;;
    *) ctr__err "ctr_image: unknown engine $1"; return 1 ;;
  esac
}

ctr_run() { # ctr_run ENGINE NAME [RUN-OPTIONS...] -- CMD...
  local engine=${1:?usage: ctr_run ENGINE NAME [OPTIONS...] -- CMD...} name=$CTR_PREFIX-${2:?usage: ctr_run ENGINE NAME [OPTIONS...] -- CMD...}
  shift 2
  local opts=() binds=() o=() has_parent=0
  while [ $# -gt 0 ] && [ "$1" != -- ]; do
    case $1 in --cgroup-parent|--cgroup-parent=*) has_parent=1 ;; esac
    opts+=("$1"); shift
  done
  [ "${1-}" = -- ] && shift
  [ $# -gt 0 ] || { ctr__err "ctr_run: no command"; return 1; }
  if [ "$has_parent" = 0 ]; then
    [ -d "$(ctr_cgroup_path "$CTR_CGROUP/default")" ] || ctr_cgroup_make "$CTR_CGROUP/default" || return 1
    opts=(--cgroup-parent="$CTR_CGROUP/default" "${opts[@]}")
  fi
  mapfile -t binds < <(ctr__host_binds)
  case $engine in
    podman)
      o=(run --name "$name" --network none --ulimit nofile=20000:20000 --ulimit nproc=4096:4096 "${binds[@]}" "${opts[@]}")
      if [ -n "$CTR_PODMAN_IMAGE" ]; then ctr_podman "${o[@]}" "$CTR_PODMAN_IMAGE" "$@"
      else ctr_podman "${o[@]}" --rootfs "$CTR_DIR/rootfs" "$@"; fi ;;
    docker)
      ctr_image docker || return 1
      ctr_docker run --name "$name" --network none "${binds[@]}" "${opts[@]}" "$CTR_PREFIX-img" "$@" ;;
    *) ctr__err "ctr_run: unknown engine $engine"; return 1 ;;
  esac
}

ctr_engine_bin() { # ctr_engine_bin ENGINE: an executable ($CTR_DIR/bin/ENGINE) that runs the engine
  # as ctr_podman/ctr_docker do (private state; no watchdog: the caller bounds it), for programs that
  # take an engine command line, e.g. mallrun --container -- "$(ctr_engine_bin podman)" run ...
  local e=${1:?usage: ctr_engine_bin podman|docker} d=$CTR_DIR/podman w=$CTR_DIR/bin/$1
  mkdir -p "$CTR_DIR/bin"
  case $e in
    podman)
      [ -f "$d/containers.conf" ] || ctr__podman_setup
      printf '#!/bin/sh\nCONTAINERS_CONF=%q CONTAINERS_STORAGE_CONF=%q CONTAINERS_REGISTRIES_CONF=%q exec podman --root %q --runroot %q --tmpdir %q --cgroup-manager cgroupfs --runtime runc --events-backend file --log-level error "$@"\n' \
        "$d/containers.conf" "$d/storage.conf" "$d/registries.conf" "$d/root" "$d/runroot" "$d/tmp" >"$w" ;;
    docker)
      printf '#!/bin/sh\nDOCKER_CONFIG=%q exec %q --host %q "$@"\n' \
        "$CTR_DIR/docker/client" "$(ctr__docker_client)" "unix://$CTR_DIR/docker/docker.sock" >"$w" ;;
    *) ctr__err "ctr_engine_bin: unknown engine $e"; return 1 ;;
  esac
  chmod 0755 "$w" && echo "$w"
}

ctr_run_args() { # ctr_run_args ENGINE NAME: fill CTR_RUN_ARGS with what ctr_run puts between `run` and
  # the container's command (name, no network, ulimits, the host binds, then the image or --rootfs),
  # without --cgroup-parent: for `mallrun --container -- ENGINE run [-d] "${CTR_RUN_ARGS[@]}" CMD...`
  local e=${1:?usage: ctr_run_args ENGINE NAME} name=$CTR_PREFIX-${2:?usage: ctr_run_args ENGINE NAME} binds=()
  mapfile -t binds < <(ctr__host_binds)
  case $e in
    podman)
      CTR_RUN_ARGS=(--name "$name" --network none --ulimit nofile=20000:20000 --ulimit nproc=4096:4096 "${binds[@]}")
      if [ -n "$CTR_PODMAN_IMAGE" ]; then CTR_RUN_ARGS+=("$CTR_PODMAN_IMAGE")
      else CTR_RUN_ARGS+=(--rootfs "$CTR_DIR/rootfs"); fi ;;
    docker)
      ctr_image docker || return 1
      CTR_RUN_ARGS=(--name "$name" --network none "${binds[@]}" "$CTR_PREFIX-img") ;;
    *) ctr__err "ctr_run_args: unknown engine $e"; return 1 ;;
  esac
}

ctr__engine() { # ctr__engine ENGINE ARGS...
  case $1 in
    podman) shift; ctr_podman "$@" ;;
    docker) shift; ctr_docker "$@" ;;
    *) ctr__err "unknown engine $1"; return 1 ;;
  esac
}

ctr_exec() { local e=$1 n=$2; shift 2; ctr__engine "$e" exec "$CTR_PREFIX-$n" "$@"; }
ctr_rm() { # no grace time: `sleep` as a container's pid 1 ignores SIGTERM (podman would wait 10 s)
  case $1 in
    podman) ctr_podman rm --force --time 0 "$CTR_PREFIX-$2" >/dev/null ;;
    *) ctr__engine "$1" rm --force "$CTR_PREFIX-$2" >/dev/null ;;
  esac
}
ctr_id() { ctr__engine "$1" inspect --format '{{.Id}}' "$CTR_PREFIX-$2"; }
ctr_pid() { ctr__engine "$1" inspect --format '{{.State.Pid}}' "$CTR_PREFIX-$2"; }
ctr_monitor_pid() {
  local pid
  case $1 in
    podman) ctr_podman inspect --format '{{.State.ConmonPid}}' "$CTR_PREFIX-$2" ;;
    docker) pid=$(ctr_pid docker "$2") && ps -o ppid= -p "$pid" | tr -d ' ' ;;
    *) ctr__err "unknown engine $1"; return 1 ;;
  esac
}

# ---- cleanup and leak checks ---------------------------------------------------------------------------
ctr__mounts_under() { # mount points under $CTR_DIR, deepest first
  awk -v dir="$CTR_DIR/" 'index($5, dir) == 1 { print length($5), $5 }' /proc/self/mountinfo | sort -rn | cut -d' ' -f2-
}

ctr__runc_states() { # runc state folders (/run/runc/<id>) of this test's containers
  local s
  for s in /run/runc/*/state.json; do
    [ -f "$s" ] && grep -qF -- "$CTR_DIR/" "$s" && dirname "$s"
  done
}

ctr_cleanup() { # ctr_cleanup [DIR]: idempotent; every step bounded; never fails the caller's trap
  if [ -n "${1-}" ]; then ctr__derive "$1"; fi
  [ -n "${CTR_DIR-}" ] || return 0
  local CTR_STEP_TIMEOUT_S=20 m s pids rc=0 made_var_lib=0
  [ -e "$CTR_DIR/made-var-lib-containers" ] && made_var_lib=1
  # podman: remove its containers (their processes, conmons, runc state, libpod-<id> folders).
  if [ -f "$CTR_DIR/podman/containers.conf" ]; then
    ctr_podman rm --all --force --time 0 >/dev/null 2>&1 || rc=1
  fi
  # docker: remove its containers while dockerd answers, then stop dockerd, containerd, shims.
  if ctr__dockerd_pid >/dev/null; then
    mapfile -t pids < <(ctr_docker ps --all --quiet 2>/dev/null)
    [ ${#pids[@]} -eq 0 ] || ctr_docker rm --force "${pids[@]}" >/dev/null 2>&1 || rc=1
  fi
  ctr_docker_stop
  # Anything the engines did not stop (a hung engine, a SIGKILLed test): conmons and the like by
  # their command line, container processes by their cgroup.
  mapfile -t pids < <(ctr__pids_matching "$CTR_DIR/")
  [ ${#pids[@]} -eq 0 ] || { kill -KILL "${pids[@]}" 2>/dev/null; ctr__wait_gone 2000 "${pids[@]}"; }
  ctr__kill_cgroup_tree
  for s in $(ctr__runc_states); do runc delete --force "$(basename "$s")" >/dev/null 2>&1 || rm -rf "$s"; done
  ctr__remove_cgroups || rc=1
  while read -r m; do
    [ -n "$m" ] || continue
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || { ctr__err "cannot unmount $m"; rc=1; }
  done < <(ctr__mounts_under)
  if [ -z "$(ctr__mounts_under)" ]; then rm -rf --one-file-system "$CTR_DIR" 2>/dev/null || rc=1
  else ctr__err "mounts left under $CTR_DIR: not removing it"; rc=1; fi
  # podman import's blob-info cache, when the kit made its folder and nothing else went in since.
  if [ "$made_var_lib" = 1 ] &&
     [ "$(find /var/lib/containers -mindepth 1 2>/dev/null | sort | tr '\n' ' ')" = \
       "/var/lib/containers/cache /var/lib/containers/cache/blob-info-cache-v1.boltdb " ]; then
    rm -rf /var/lib/containers
  fi
  # The engines' shared folders, when empty and no engine runs (each engine makes them on demand).
  if ! ctr__live_named dockerd && ! ctr__live_named containerd && ! ctr__live_named conmon; then
    for s in "${ctr__shared_run_dirs[@]}"; do rmdir "$s" 2>/dev/null; done
  fi
  return "$rc"
}

ctr_leaks() { # prints what is left of this test, one line each; 0 when nothing
  local left=() m p
  for p in $(ctr__pids_matching "$CTR_DIR/"); do left+=("process $p: $(tr '\0' ' ' <"/proc/$p/cmdline" | cut -c1-120)"); done
  for m in $(ctr__cgroup_mounts); do
    [ -d "$m$CTR_CGROUP" ] && left+=("cgroup folder $m$CTR_CGROUP ($(find "$m$CTR_CGROUP" -type d | wc -l) folders)")
  done
  for m in $(ctr__mounts_under); do left+=("mount $m"); done
  for p in $(ctr__runc_states); do left+=("runc state $p"); done
  [ -e "$CTR_DIR" ] && left+=("folder $CTR_DIR")
  [ ${#left[@]} -eq 0 ] && return 0
  printf '%s\n' "${left[@]}"
  return 1
}

ctr_install_traps() { # ctr_install_traps [WATCHDOG_S]
  local s=${1:-?}
  trap ctr_cleanup EXIT
  # shellcheck disable=SC2064  # the watchdog's seconds are fixed now
  trap "watchdog_fired '$s'; exit 1" TERM
  trap 'exit 130' INT
}

ctr_sweep() { # clean the kits whose owner is gone, and cgroup subtrees whose folder is gone
  local d m c CTR_OWNER_PID CTR_OWNER_START n=0
  for d in "${TMPDIR:-/tmp}"/mallctr-*-?????? /tmp/mallctr-*-??????; do
    [ -d "$d" ] || continue
    CTR_OWNER_PID="" CTR_OWNER_START=""
    # shellcheck source=/dev/null
    [ -f "$d/kit.env" ] && . "$d/kit.env"
    if [ -n "$CTR_OWNER_PID" ] && [ "$(ctr__proc_start "$CTR_OWNER_PID")" = "$CTR_OWNER_START" ]; then continue; fi
    # Without kit.env the owner died inside ctr_init: leave young folders to a running ctr_init.
    if [ -z "$CTR_OWNER_PID" ] && [ -z "$(find "$d" -maxdepth 0 -mmin +1)" ]; then continue; fi
    echo "container_kit: sweeping $d (its test is gone)" >&2
    ( ctr_cleanup "$d" ) || true
    n=$((n + 1))
  done
  for m in $(ctr__cgroup_mounts); do
    for c in "$m"/mallctr-*-??????; do
      [ -d "$c" ] || continue
      if [ -d "${TMPDIR:-/tmp}/$(basename "$c")" ] || [ -d "/tmp/$(basename "$c")" ]; then continue; fi
      echo "container_kit: sweeping cgroup $c (its folder is gone)" >&2
      ( ctr__derive "/tmp/$(basename "$c")"; ctr__kill_cgroup_tree; ctr__remove_cgroups ) || true
    done
  done
  return 0
}

# ---- what every container test does: report, a private malld, waits, the leak check ----------------
ctr_test_reporting() { # ctr_test_reporting NAME: pass/fail/note/skip for test NAME; counts in
  # $failures and $skipped; skip WHAT WHY also logs "SKIPPED NAME WHAT: WHY" to $MALL_TEST_SKIP_LOG
  CTR_TEST_NAME=$1 failures=0 skipped=0
  pass() { echo "PASS: $*"; }
  fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
  note() { echo "      $*"; }
  skip() {
    echo "SKIP: $1${2:+: $2}"
    [ -n "${MALL_TEST_SKIP_LOG:-}" ] && echo "SKIPPED $CTR_TEST_NAME $1${2:+: $2}" >>"$MALL_TEST_SKIP_LOG"
    skipped=$((skipped + 1))
  }
}

ctr_wait_until() { # ctr_wait_until MS DESCRIPTION CMD...: run CMD every 50 ms (its output discarded)
  # until it succeeds; 1 after MS, with "gave up waiting for: DESCRIPTION" on stdout
  local deadline=$(( $(ctr__now_ms) + $1 )) what=$2
  shift 2
  until "$@" >/dev/null 2>&1; do
    [ "$(ctr__now_ms)" -lt "$deadline" ] || { echo "      gave up waiting for: $what"; return 1; }
    sleep 0.05
  done
}

CTR_MALLD_PID=
ctr_malld_start() { # ctr_malld_start BIN_DIR SOCKET MALLD-ARGS...: a private malld on SOCKET (state in
  # $CTR_DIR/malld, log appended to $CTR_DIR/malld.log) that answers `mallctl status` within 10 s;
  # 1 with its log on stderr otherwise. $CTR_MALLD_PID is its pid.
  local bin=$1 socket=$2
  shift 2
  mkdir -p "$CTR_DIR/malld"
  "$bin/malld" --socket "$socket" --state-dir "$CTR_DIR/malld" "$@" </dev/null >>"$CTR_DIR/malld.log" 2>&1 &
  CTR_MALLD_PID=$!
  if ! ctr_wait_until 10000 "malld on $socket" timeout 5 "$bin/mallctl" --socket "$socket" status ||
     ! ctr__proc_start "$CTR_MALLD_PID" >/dev/null; then
    ctr__err "the private malld did not answer on $socket; its log:"; sed 's/^/      /' "$CTR_DIR/malld.log" >&2
    return 1
  fi
}
ctr_malld_stop() { # SIGTERM, SIGKILL after 10 s; reaped
  [ -n "$CTR_MALLD_PID" ] || return 0
  kill -TERM "$CTR_MALLD_PID" 2>/dev/null
  ctr__wait_gone 10000 "$CTR_MALLD_PID" || kill -KILL "$CTR_MALLD_PID" 2>/dev/null
  wait "$CTR_MALLD_PID" 2>/dev/null
  CTR_MALLD_PID=
}

ctr_malld_parent_dirs() { # ctr_malld_parent_dirs NAME: malld's --cgroup-parent NAME in every hierarchy, where it exists
  local m
  for m in $(ctr__cgroup_mounts); do [ -d "$m/$1" ] && echo "$m/$1"; done
}
ctr_malld_parent_remove() { # ctr_malld_parent_remove NAME: after a failed run, kill what is left in
  # malld's folders and remove them (malld removes them itself when it stops cleanly)
  local d p
  for d in $(ctr_malld_parent_dirs "$1"); do
    while read -r p; do [ -n "$p" ] && kill -KILL "$p" 2>/dev/null; done < <(find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null)
    find "$d" -depth -type d -exec rmdir {} + 2>/dev/null
  done
}
ctr_malld_status() { timeout 10 "$1/mallctl" --socket "$2" status --json; }  # BIN_DIR SOCKET: status --json

ctr_check_nothing_left() { # the kit's cleanup, then its leak check, as PASS/FAIL lines (ctr_test_reporting)
  ctr_cleanup || fail "the kit's cleanup reported an error (above)"
  local leftover line
  if leftover=$(ctr_leaks); then pass "nothing of the test is left (processes, cgroup folders, mounts, runc state, $CTR_DIR)"
  else fail "left after cleanup:"; while IFS= read -r line; do note "$line"; done <<<"$leftover"; fi
}

# ---- run directly ---------------------------------------------------------------------------------------
ctr__usage() {
  cat <<'EOF'
NAME
    container_kit.sh - the mall container test kit (podman and docker without a registry)

SYNOPSIS
    . tests/containers/container_kit.sh           (from a bash test: the ctr_* functions)
    container_kit.sh cleanup DIR                   remove everything of the kit in DIR
    container_kit.sh leaks DIR                     list what the kit in DIR left (exit 1 if anything)
    container_kit.sh sweep                         clean the kits of tests that died
    container_kit.sh --help

DESCRIPTION
    Sourced, the kit gives a test a private podman (own config, storage, locks), a private dockerd
    with its own containerd, a tiny rootfs in which the host's /usr is mounted read-only (so binaries
    of the build tree, Python and numpy run unchanged), cgroup v1 cpuset folders for --cgroup-parent,
    the run options a mall container needs (socket folder, MALL_SOCKET, MALL_JOB_ID), and a cleanup
    that removes containers, images, storage, cgroup folders, mounts and daemons. The comment at the
    top of this file lists every function and the facts behind the choices.

    DIR is a kit's folder, ${TMPDIR:-/tmp}/mallctr-NAME-XXXXXX; its cgroup subtree is
    /mallctr-NAME-XXXXXX in every cgroup hierarchy. `cleanup` is what a watchdog runs when the test
    itself cannot (SIGKILL); `sweep` finds such folders whose test is gone (its pid and start time
    are in DIR/kit.env) and cleans them, and cgroup subtrees whose folder is gone.

EXIT STATUS
    0 done (leaks: nothing left), 1 something could not be removed (leaks: something is left; each
    is printed), 2 usage error. Needs root.

ENVIRONMENT
    CTR_STEP_TIMEOUT_S (60), CTR_DOCKERD_TIMEOUT_S (60), CTR_DOCKERD_STOP_S (20), MALL_CTR_DOCKER.
EOF
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -uo pipefail
  case ${1-} in
    -h|--help) ctr__usage; exit 0 ;;
    cleanup) [ $# -eq 2 ] || { ctr__usage >&2; exit 2; }; ctr_cleanup "$2"; exit $? ;;
    leaks) [ $# -eq 2 ] || { ctr__usage >&2; exit 2; }; ctr__derive "$2"; ctr_leaks; exit $? ;;
    sweep) ctr_sweep; exit $? ;;
    *) ctr__usage >&2; exit 2 ;;
  esac
fi
