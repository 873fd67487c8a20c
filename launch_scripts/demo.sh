#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# demo.sh — mall end to end on this machine: builds if needed, then either (default) starts a private
# malld and runs two malleable training jobs with mallrun, or (--slurm) brings up a private
# single-node Slurm cluster with the mall plugin and submits three sbatch jobs, or (--containers)
# runs three training containers (podman or docker: Eigen, Keras, PyTorch) as malleable jobs;
# prints a line per event as the cores move, then a summary; stops and removes everything it
# started. See --help. It stays one script (about 750 lines): it is what a newcomer runs and reads
# first, and its three tours share the build step, the event printer and the clean-up trap.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$repo/launch_scripts/lib/stats.sh"  # median
build=${MALL_BUILD_DIR:-$repo/build}
bin=$build/bin
steps=${MALL_DEMO_STEPS:-600}   # per job; ~10 ms/step on one core, ~5 on two
seed=7

usage() {
  cat <<EOF
demo.sh — watch mall move cores between training jobs on this machine

Usage: launch_scripts/demo.sh [--tensorflow | --slurm [--nodes 2] | --containers [--engine podman|docker]]
       launch_scripts/demo.sh -h|--help

Both modes build what they need first (cmake + ninja into the build folder; dependencies with
launch_scripts/install-deps.sh when missing), print one line per malld event as cores move
("malld |" lines), the jobs' own output ("job X |" lines), then a summary. Everything they start
(daemons, jobs, cgroups, temporary folders) is stopped and removed at the end, also on failure or
Ctrl-C.

Modes:
  (default)  No cluster: a private malld and two malleable training jobs (mall_train_sgd) started
             with mallrun, the second while the first runs. As root cores are enforced with cgroup
             cpusets; as another user with the affinity backend (it says so). About 15 s.
  --tensorflow  The same story with two Keras trainings (examples/keras_digits.py, model.fit
             with mall.keras.Malleable, from the project's venv): job A alone runs TensorFlow's
             pools on both cores; job B arrives and A parks a worker of each pool at its next batch
             end (its "parked" line); when B ends, A releases it. Needs the venv
             (launch_scripts/install-deps.sh makes <repo>/.venv) and a build with TensorFlow
             (lib/libmall_tf_ops.so, built here when the build folder has it). About 30 s.
  --slurm    Through Slurm, the way a site runs mall: brings up a private single-node Slurm
             cluster with the mall SPANK plugin and malld (launch_scripts/local-cluster.sh, in a
             temporary folder, on free ports, with its own cgroup parent, so it runs beside any
             other cluster), then submits three sbatch jobs:
               A  sbatch --malleable=1:2 -c1  (srun mall_train_sgd): alone, it grows to both cores
               B  sbatch -c1, a plain job: before it starts, A shrinks to its own core; when it
                  ends, A grows back
               C  sbatch --malleable=1:2 -c1 (srun mall_train_sgd): A and C each keep their core;
                  when A ends, C grows to both
             The summary gives each job's state, exit code, cores over time, resizes, and for the
             trainers their steps and final loss. Needs root. About 30 s.
  --slurm --nodes 2  The same story across two Slurm nodes, each in network, UTS and mount
             namespaces of its own with its own slurmd and malld (local-cluster.sh up --nodes 2;
             both nodes share this machine's cpus, so each has 2):
               A  sbatch -N2 --ntasks-per-node=1 --malleable=1:2 -c1, srun --mpi=pmix
                  mall_train_mpi: one rank per node, data-parallel over TCP between the nodes;
                  each node's malld lends its idle core to its rank
               B  sbatch -w node2 -c1, a plain job: node2's malld takes its core back before B's
                  task starts; A's rank there shrinks, and (balanced mode) the rank on node1
                  caps itself at the same thread count, so node1's malld gets that core back as
                  free; when B ends, both ranks grow back together
               C  sbatch -w node1 --malleable=1:2 -c1 (srun mall_train_sgd): node1 shares its
                  cores, A's ranks both run one thread; then A is stopped and C grows to both
             Events are printed per node ("malld@node1 |"); the summary gives cores over time on
             each node and both ranks' checksums (equal: the ranks stepped together). About 20 s.
  --containers  Containers as malleable jobs: a private malld (cgroup cpusets) and three training
             containers started with "mallrun --container -- podman run ...":
               eigen  the Eigen trainer (mall_train_digits), alone at first: it gets the pool
               keras  a Keras model.fit (examples/keras_digits.py, mall.keras.Malleable: TensorFlow's
                      own pool workers parked and released at batch ends), arriving while eigen
                      runs: the pool is shared, eigen shrinks first; when eigen ends, keras grows
               torch  the PyTorch trainer (examples/train_torch.py, Debian's python3-torch),
                      arriving once eigen is gone: keras shrinks again; when one of the two ends,
                      the other grows back
             Nothing in the image knows mall: libmall inside attaches through the socket folder
             mallrun bind-mounts. With no registry the image is a tiny folder with the host's /usr,
             the checkout (with its .venv, TensorFlow's wheel) and the build mounted read-only
             (tests/containers/container_kit.sh makes it, with a private podman store or a private
             dockerd, all removed at the end). Without the venv (launch_scripts/install-deps.sh
             makes it) or a build with TensorFlow (build/lib/libmall_tf_ops.so) keras is left
             out and torch arrives while eigen runs; without python3-torch the last container runs
             mall_train_linear. Needs root. About 25-40 s.
  --engine E with --containers: podman (default) or docker

Environment:
  MALL_BUILD_DIR   build folder (default <repo>/build)
  MALL_DEMO_STEPS  training steps per job in the default mode (default 600; --tensorflow: 8000)
  MALL_DEMO_PYTHON --containers: the Python with TensorFlow and Keras for the keras container
                   (default <repo>/.venv/bin/python; a venv outside the checkout is mounted too)
EOF
}

slurm_mode=0 containers_mode=0 tensorflow_mode=0 engine=podman demo_nodes=1
while [ $# -gt 0 ]; do
  case $1 in
    --slurm) slurm_mode=1 ;;
    --containers) containers_mode=1 ;;
    --tensorflow) tensorflow_mode=1 ;;
    --nodes)
      case ${2-} in 1|2) demo_nodes=$2; shift ;;
        *) echo "demo: --nodes takes 1 or 2 (got '${2-}')" >&2; exit 2 ;; esac ;;
    --engine)
      case ${2-} in podman|docker) engine=$2; shift ;;
        *) echo "demo: --engine takes podman or docker (got '${2-}')" >&2; exit 2 ;; esac ;;
    -h|--help) usage; exit 0 ;;
    *) echo "demo: unknown argument '$1' (expected --tensorflow, --slurm [--nodes 2], --containers, --engine E or --help)" >&2; exit 2 ;;
  esac
  shift
done
if [ "$demo_nodes" != 1 ] && [ "$slurm_mode" != 1 ]; then
  echo "demo: --nodes goes with --slurm (a cluster of nodes in network namespaces): launch_scripts/demo.sh --slurm --nodes 2" >&2; exit 2
fi
if [ $((slurm_mode + containers_mode + tensorflow_mode)) -gt 1 ]; then
  echo "demo: choose one of --tensorflow, --slurm and --containers" >&2; exit 2
fi
keras_python=${MALL_DEMO_PYTHON:-$repo/.venv/bin/python}
if [ "$tensorflow_mode" = 1 ]; then
  steps=${MALL_DEMO_STEPS:-8000}
  if [ ! -x "$keras_python" ] ||
     ! "$keras_python" -c 'import importlib.util as u, sys; sys.exit(not (u.find_spec("tensorflow") and u.find_spec("keras")))' 2>/dev/null; then
    echo "demo: --tensorflow needs a Python with TensorFlow and Keras at $keras_python: run" \
         "launch_scripts/install-deps.sh (it makes <repo>/.venv), or set MALL_DEMO_PYTHON" >&2
    exit 1
  fi
fi
if [ "$containers_mode" = 1 ] && [ "$(id -u)" -ne 0 ]; then
  echo "demo: --containers needs root (rootful $engine, and malld makes the containers' cgroups);" \
       "run it as root, or run the demo without --containers" >&2
  exit 1
fi
if [ "$slurm_mode" = 1 ] && [ "$(id -u)" -ne 0 ]; then
  echo "demo: --slurm needs root (it starts Slurm's daemons, munged and malld, which makes cgroups);" \
       "run it as root, or run the demo without --slurm" >&2
  exit 1
fi

if [ -t 1 ]; then bold=$'\033[1m' dim=$'\033[2m' off=$'\033[0m'; else bold='' dim='' off=''; fi
say() { printf '%s==> %s%s\n' "$bold" "$*" "$off"; }
note() { printf '    %s\n' "$*"; }
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }

# ---- everything this script starts, and how it is stopped -------------------------------------
tmp=''
malld_pid='' watch_pid='' watch_json_pid='' job_pids=()
cgroup_parent="mall_demo_$$"
cluster_up=0 follow_pids=()   # --slurm: the private cluster (local-cluster.sh) and the output followers

stop_pid() {  # stop_pid PID: SIGTERM, wait up to 5 s, then SIGKILL
  local pid=$1 i
  [ -n "$pid" ] || return 0
  kill -TERM "$pid" 2>/dev/null || return 0
  for i in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

cleanup() {
  local rc=$?
  set +e
  # The teardown must finish: a reader gone (demo | head) or a second Ctrl-C must not cut it short.
  trap '' PIPE INT TERM
  local pid
  for pid in "${job_pids[@]}"; do stop_pid "$pid"; done
  for pid in "${follow_pids[@]}"; do stop_pid "$pid"; done
  if [ "$cluster_up" = 1 ]; then
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 130 ] && [ "$rc" -ne 143 ]; then
      echo "demo: failed; the end of the cluster's logs (removed with the cluster):" >&2
      "$repo/launch_scripts/local-cluster.sh" logs 15 >&2
    fi
    # Cancels the jobs, stops the daemons by pid, removes the cluster's cgroups and its folder.
    "$repo/launch_scripts/local-cluster.sh" down >"$tmp/down.log" 2>&1 ||
      { echo "demo: bringing the cluster down failed:" >&2; cat "$tmp/down.log" >&2; }
  fi
  stop_pid "$watch_pid"
  stop_pid "$watch_json_pid"
  # --containers: the containers, the private podman store or dockerd, the image folder.
  [ -n "${CTR_DIR:-}" ] && ctr_cleanup
  stop_pid "$malld_pid"
  # malld removes its cgroups on a clean stop; remove what a crash may have left.
  for dir in "/sys/fs/cgroup/cpuset/$cgroup_parent" "/sys/fs/cgroup/$cgroup_parent"; do
    [ -d "$dir" ] && find "$dir" -depth -type d -exec rmdir {} \; 2>/dev/null
  done
  [ -n "$tmp" ] && rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

tmp=$(mktemp -d "${TMPDIR:-/tmp}/mall-demo.XXXXXX")
# --slurm: munged (user munge) and the jobs must reach the cluster folder inside
if [ "$slurm_mode" = 1 ]; then chmod 0755 "$tmp"; fi
sock=$tmp/malld.sock
demo_start=$(now_ms)

# ---- --slurm: the same story through a private single-node Slurm cluster ------------------------
# Called after the build (below). Uses local-cluster.sh with a folder inside $tmp, free ports and a
# cgroup parent of its own; cleanup (the EXIT trap) brings it down whatever happens.
slurm_demo() {
  local cluster_sh=$repo/launch_scripts/local-cluster.sh port
  # C trains longer than what A has left when C starts, so A ends first and C grows to both cores.
  local a_steps=1000 c_steps=900
  port_taken() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
  port=$(( 20000 + RANDOM % 4000 * 2 ))
  while port_taken "$port" || port_taken $(( port + 1 )); do port=$(( port + 2 )); done
  export MALL_CLUSTER_DIR=$tmp/cluster MALL_BUILD_DIR=$build MALL_CLUSTER_PORT=$port
  export MALL_CLUSTER_CGROUP=mall_demo_slurm_$$ MALL_CLUSTER_TIMEOUT_S=30

  if [ "$demo_nodes" = 1 ]; then
    say "bringing up a private single-node Slurm cluster: munged, malld, slurmctld, slurmd, the mall plugin"
  else
    say "bringing up a private Slurm cluster of $demo_nodes nodes, each in network, UTS and mount namespaces"
    note "of its own with its own slurmd and malld; slurmctld and munged shared; the mall plugin"
  fi
  cluster_up=1   # from here on, cleanup runs `local-cluster.sh down`, even after a failed `up`
  if ! "$cluster_sh" up --nodes "$demo_nodes" >"$tmp/up.log" 2>&1; then
    cat "$tmp/up.log" >&2
    echo "demo: the local cluster did not come up (its output above)" >&2
    return 1
  fi
  eval "$("$cluster_sh" env)"   # SLURM_CONF, MALL_SOCKET (and with nodes PATH) for sbatch, scontrol, mallctl
  note "$(grep -m1 ': up in' "$tmp/up.log" | sed 's/^local-cluster.sh: //; s/ (.*): /: /')"
  note "folder $MALL_CLUSTER_DIR, ports $port-$(( port + 1 )), cgroup parent $MALL_CLUSTER_CGROUP"
  note "plugstack.conf: $(cat "$MALL_CLUSTER_DIR/etc/plugstack.conf")"
  # One malld per node: node_sock[N] and its events in $tmp/events[-N].jsonl, printed as "malld@N |".
  declare -gA node_sock=() node_events=()
  local n label
  if [ "$demo_nodes" = 1 ]; then
    node_sock[local]=$MALL_SOCKET node_events[local]=$tmp/events.jsonl
    note "malld: $(grep -m1 ' info: backend' "$MALL_CLUSTER_DIR/log/malld.log" | sed 's/.* info: //')"
  else
    for n in $MALL_CLUSTER_NODES; do
      node_sock[$n]=$MALL_CLUSTER_DIR/nodes/$n/malld.sock node_events[$n]=$tmp/events-$n.jsonl
      note "$n: address $("$cluster_sh" exec "$n" -- ip -4 -o addr show eth0 | awk '{print $4}'), malld $(grep -m1 ' info: backend' "$MALL_CLUSTER_DIR/nodes/$n/log/malld.log" | sed 's/.* info: //')"
    done
  fi
  for n in "${!node_sock[@]}"; do
    label=malld; [ "$n" = local ] || label=malld@$n
    "$bin/mallctl" --socket "${node_sock[$n]}" watch --json >"${node_events[$n]}" 2>/dev/null &
    follow_pids+=($!)
    "$bin/mallctl" --socket "${node_sock[$n]}" watch > >(sed -u "s/^/  ${dim}$label${off} | /") 2>&1 &
    follow_pids+=($!)
  done
  sleep 0.3   # the watchers subscribe before the first job's prolog

  declare -gA job_id=()
  submit() {  # submit NAME SBATCH-ARGS...: submits, follows the job's output, sets job_id[NAME]
    local name=$1 id; shift
    # The output file exists before tail starts, so tail follows it through inotify, without lag.
    touch "$tmp/$name.out"
    id=$(sbatch --parsable -J "demo-$name" -D "$tmp" -o "$tmp/$name.out" "$@") || {
      echo "demo: sbatch refused job $name" >&2; return 1; }
    job_id[$name]=${id%%;*}
    tail -n +1 -s 0.1 -F "$tmp/$name.out" 2>/dev/null > >(sed -u "s/^/  ${bold}job $name${off} | /") &
    follow_pids+=($!)
    note "job $name is Slurm job ${job_id[$name]} (malld job slurm-${job_id[$name]})"
  }
  wait_line() {  # wait_line FILE REGEX [MIN_COUNT]: until MIN_COUNT lines match (60 s at most)
    local i n
    for i in $(seq 600); do
      n=$(grep -cE "$2" "$1" 2>/dev/null || true)
      [ "${n:-0}" -ge "${3:-1}" ] && return 0
      sleep 0.1
    done
    echo "demo: no line matching '$2' in $1 after 60 s" >&2
    return 1
  }
  job_field() { scontrol show job -o "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p"; }
  wait_job_end() {  # wait_job_end NAME: until Slurm says the job ended (90 s at most)
    local i state
    for i in $(seq 900); do
      state=$(job_field "${job_id[$1]}" JobState)
      case $state in PENDING|CONFIGURING|RUNNING|COMPLETING|'') sleep 0.1 ;; *) return 0 ;; esac
    done
    echo "demo: job $1 did not end within 90 s (state $state)" >&2
    return 1
  }
  local train
  train=$(printf '%q' "$bin/mall_train_sgd")
  cores_line='echo "cores $(grep Cpus_allowed_list /proc/self/status | cut -f2) (Slurm job $SLURM_JOB_ID)"'
  ev_time() { sed -n 's/.*"time":\([0-9.]*\).*/\1/p'; }
  seconds() { printf '%d.%01d s' $(( $1 / 1000 )) $(( $1 % 1000 / 100 )); }
  reclaim_note() { # reclaim_note NAME EVENTS: how long the prolog of job NAME waited for its core
    local t_r t_n
    t_r=$(grep '"event":"reclaim"' "$2" | grep "\"owner\":\"slurm-${job_id[$1]}\"" | head -1 | ev_time)
    [ -n "$t_r" ] || return 0
    t_n=$(grep '"event":"enforce"' "$2" | grep '"growing":false' | ev_time | awk -v t="$t_r" '$1 >= t { print; exit }')
    [ -n "$t_n" ] || return 0
    note "job $1's core came back from the borrower in $(awk -v a="$t_r" -v b="$t_n" 'BEGIN { printf "%.1f", (b - a) * 1000 }') ms" \
         "(reclaim in its prolog -> the borrower's ack -> cpuset narrowed)"
  }
  cores_of() { # cores_of ID EVENTS: the cpus malld published to job ID over time, "a -> b -> c"
    grep '"event":"publish"' "$2" | grep "\"job\":\"slurm-$1\"" | sed -n 's/.*"cpus":"\([^"]*\)".*/\1/p' | paste -sd' ' | sed 's/ / -> /g'
  }
  end_story() { # end_story EVENTS: A and C ended, C's cores released (EVENTS: C's node's), followers stopped
    wait_job_end A
    wait_job_end C
    wait_line "$1" "\"event\":\"release\".*\"owner\":\"slurm-${job_id[C]}\"" || true
    sleep 0.3   # the last lines reach the screen
    local pid
    for pid in "${follow_pids[@]}"; do stop_pid "$pid"; done
    follow_pids=()
  }
  if [ "$demo_nodes" != 1 ]; then slurm_nodes_story; return; fi

  say "job A: sbatch --malleable=1:2 -c1 --wrap 'srun mall_train_sgd --steps $a_steps' (Slurm guarantees it 1 core;"
  note "alone on the node, malld lends it the other one)"
  submit A --malleable=1:2 -c1 --wrap "$cores_line; srun $train --steps $a_steps --seed $seed --print-every 100 --log-changes"
  wait_line "$tmp/A.out" '^step 100 '

  say "job B: sbatch -c1 --wrap '...sleep 3', a plain job: Slurm gives it the core A borrowed, so before"
  note "B's tasks start, the plugin has malld take it back (A shrinks to its own core); when B ends, A grows back"
  submit B -c1 --wrap "$cores_line; sleep 3; echo done"
  wait_job_end B
  wait_line "$tmp/A.out" 'threads 1 -> 2'

  say "job C: sbatch --malleable=1:2 -c1 --wrap 'srun mall_train_sgd --steps $c_steps': A gives the lent core"
  note "back again and each trainer keeps the core Slurm gave it; when one ends, the other grows to both"
  submit C --malleable=1:2 -c1 --wrap "$cores_line; srun $train --steps $c_steps --seed $seed --print-every 100 --log-changes"
  end_story "$tmp/events.jsonl"

  # ---- summary ----------------------------------------------------------------------------------
  echo
  say "summary"
  printf '    %-3s %5s  %-10s %-5s %-28s %7s %6s %10s\n' JOB SLURM STATE EXIT "CORES OVER TIME" RESIZES STEPS "FINAL LOSS"
  local name id state exitc cores resizes steps_done loss ok=1
  for name in A B C; do
    id=${job_id[$name]}
    state=$(job_field "$id" JobState) exitc=$(job_field "$id" ExitCode)
    [ "$state" = COMPLETED ] && [ "$exitc" = 0:0 ] || ok=0
    if [ "$name" = B ]; then
      cores="$(sed -n 's/^cores \([^ ]*\).*/\1/p' "$tmp/B.out" | head -1) (plain: never moved)"
      resizes=- steps_done=- loss=-
    else
      cores=$(cores_of "$id" "$tmp/events.jsonl")
      resizes=$(grep '"event":"publish"' "$tmp/events.jsonl" | grep -c "\"job\":\"slurm-$id\"" || true)
      resizes=$(( resizes > 0 ? resizes - 1 : 0 ))
      steps_done=$(sed -n 's/^done steps \([0-9]*\).*/\1/p' "$tmp/$name.out")
      loss=$(sed -n 's/^final loss \([^ ]*\).*/\1/p' "$tmp/$name.out")
    fi
    printf '    %-3s %5s  %-10s %-5s %-28s %7s %6s %10s\n' "$name" "$id" "${state:--}" "${exitc:--}" \
      "${cores:--}" "$resizes" "${steps_done:--}" "${loss:--}"
  done
  note "cores over time: each allocation malld published to the trainer (Slurm guaranteed one core)"
  for name in B C; do reclaim_note "$name" "$tmp/events.jsonl"; done   # the prologs' waits
  local end_ms; end_ms=$(now_ms)
  note "the cluster and the jobs ran $(seconds $(( end_ms - run_start ))); total wall time $(seconds $(( end_ms - demo_start ))) (with the build check)"
  if grep -qE ' (error|warn): ' "$MALL_CLUSTER_DIR/log/malld.log"; then
    note "malld reported problems:"
    grep -E ' (error|warn): ' "$MALL_CLUSTER_DIR/log/malld.log" | sed 's/^/      /'
  fi
  say "bringing the cluster down"
  [ "$ok" = 1 ]
}

# ---- --slurm --nodes 2: the story across two nodes ---------------------------------------------------
# Called by slurm_demo once the cluster, the per-node watchers and the helpers (submit, wait_line,
# wait_job_end, job_field, cores_of, reclaim_note) are there; job B goes to the last node, C to node1.
slurm_nodes_story() {
  # A trains until the demo drops its stop file (every rank stops at the same step), once C runs:
  # the story does not depend on how fast this machine trains.
  local first=node1 last=node$demo_nodes mpi sgd c_steps=900 stop_a=$tmp/stop-A grown
  mpi=$(printf '%q' "$bin/mall_train_mpi") sgd=$(printf '%q' "$bin/mall_train_sgd")
  say "job A: sbatch -N$demo_nodes --ntasks-per-node=1 --malleable=1:2 -c1 --wrap 'srun --mpi=pmix mall_train_mpi'"
  note "one rank per node (TCP between the nodes); alone, each node's malld lends its idle core to its rank"
  submit A -N"$demo_nodes" --ntasks-per-node=1 --malleable=1:2 -c1 \
    --wrap "srun --mpi=pmix $mpi --steps 100000000 --stop-file $(printf '%q' "$stop_a") --max-seconds 120 --seed $seed --print-every 1000 --log-changes; echo srun-rc=\$?"
  wait_line "$tmp/A.out" '^rank 0 step 1000 '

  say "job B: sbatch -w $last -c1 --wrap '...sleep 3', a plain job on $last: $last's malld takes the"
  note "lent core back before B's task starts; A's rank on $last shrinks, and in balanced mode the rank"
  note "on $first caps itself at one thread, so $first's malld lists that core free; when B ends, both grow"
  grown=$(grep -cE '^rank 0 change .* threads 1 -> 2 ' "$tmp/A.out" || true)
  submit B -w "$last" -c1 --wrap "$cores_line; sleep 3; echo done"
  wait_job_end B
  wait_line "$tmp/A.out" '^rank 0 change .* threads 1 -> 2 ' $(( grown + 1 ))

  say "job C: sbatch -w $first --malleable=1:2 -c1 --wrap 'srun mall_train_sgd': $first shares its cores,"
  note "both of A's ranks run one thread again; when A ends, C grows to both cores of $first"
  submit C -w "$first" --malleable=1:2 -c1 --wrap "$cores_line; srun $sgd --steps $c_steps --seed $seed --print-every 100 --log-changes"
  wait_line "$tmp/C.out" '^step 200 '
  say "A is told to stop (its stop file): every rank stops at the same step; C then grows to both cores"
  touch "$stop_a"
  end_story "${node_events[$first]}"

  echo
  say "summary"
  printf '    %-3s %5s  %-10s %-5s %-6s %-26s %7s\n' JOB SLURM STATE EXIT NODE "CORES OVER TIME" RESIZES
  local name id state exitc n cores resizes ok=1 nodes
  for name in A B C; do
    id=${job_id[$name]}
    state=$(job_field "$id" JobState) exitc=$(job_field "$id" ExitCode)
    [ "$state" = COMPLETED ] && [ "$exitc" = 0:0 ] || ok=0
    case $name in A) nodes=$MALL_CLUSTER_NODES ;; B) nodes=$last ;; C) nodes=$first ;; esac
    for n in $nodes; do
      if [ "$name" = B ]; then
        cores="$(sed -n 's/^cores \([^ ]*\).*/\1/p' "$tmp/B.out" | head -1) (plain: never moved)" resizes=-
      else
        cores=$(cores_of "$id" "${node_events[$n]}")
        resizes=$(grep '"event":"publish"' "${node_events[$n]}" | grep -c "\"job\":\"slurm-$id\"" || true)
        resizes=$(( resizes > 0 ? resizes - 1 : 0 ))
      fi
      printf '    %-3s %5s  %-10s %-5s %-6s %-26s %7s\n' "$name" "$id" "${state:--}" "${exitc:--}" "$n" "${cores:--}" "$resizes"
    done
  done
  note "cores over time: each allocation a node's malld published to the job's task there"
  local sums
  sums=$(sed -n 's/^rank [0-9]* final .* checksum \([0-9a-f]*\)$/\1/p' "$tmp/A.out" | sort -u | paste -sd' ')
  note "A's ranks: $(grep -c '^rank [0-9]* final ' "$tmp/A.out") final lines, checksum(s) $sums" \
       "$([ "$(wc -w <<<"$sums")" = 1 ] && echo "(equal: the ranks changed threads at the same steps)" || echo "(DIFFERENT)")"
  [ "$(wc -w <<<"$sums")" = 1 ] && grep -qx 'srun-rc=0' "$tmp/A.out" || ok=0
  note "A's changes: $(grep -c ' change step ' "$tmp/A.out") rank lines, e.g. $(grep -m1 '^rank 1 change .* -> 1 ' "$tmp/A.out")"
  reclaim_note B "${node_events[$last]}"
  reclaim_note C "${node_events[$first]}"
  note "the cluster and the jobs ran $(seconds $(( $(now_ms) - run_start ))); total wall time $(seconds $(( $(now_ms) - demo_start ))) (with the build check)"
  for n in $MALL_CLUSTER_NODES; do
    if grep -qE ' (error|warn): ' "$MALL_CLUSTER_DIR/nodes/$n/log/malld.log"; then
      note "malld@$n reported problems:"
      grep -E ' (error|warn): ' "$MALL_CLUSTER_DIR/nodes/$n/log/malld.log" | sed 's/^/      /'
    fi
  done
  say "bringing the cluster down"
  [ "$ok" = 1 ]
}

# ---- --containers: two training containers as malleable jobs --------------------------------------
# Called once malld and the watchers run (below). The container kit (tests/containers/
# container_kit.sh) gives a registry-free image and a private engine; cleanup removes both.
container_demo() {
  # shellcheck source=../tests/containers/container_kit.sh
  . "$repo/tests/containers/container_kit.sh"
  if ! ctr_have "$engine"; then
    note "$CTR_WHY: running launch_scripts/install-deps.sh"
    "$repo/launch_scripts/install-deps.sh" >"$tmp/deps.log" 2>&1 || true
    ctr_have "$engine" || { echo "demo: $CTR_WHY" >&2; return 1; }
  fi
  ctr_init demo || return 1
  ctr_bind_ro "$repo"
  case $build in "$repo"/*) ;; *) ctr_bind_ro "$build" ;; esac
  if [ "$engine" = docker ]; then
    say "starting a private dockerd (cgroupfs driver) for the demo"
    ctr_docker_start || { echo "demo: the private dockerd did not start" >&2; return 1; }
    ctr_image docker || return 1
  fi
  local engine_bin torch_cmd torch_kind=torch torch_trainer=train_torch.py keras_python keras_venv
  local keras=0 keras_why="" keras_cmd=() keras_env=()
  engine_bin=$(ctr_engine_bin "$engine")
  # The PyTorch trainer needs Debian's python3-torch (and numpy, sklearn's digits) on the host's
  # /usr, which the containers see; without it the last container runs the linear trainer.
  if /usr/bin/python3 -c 'import torch, numpy' 2>/dev/null && [ -f "$repo/examples/train_torch.py" ]; then
    torch_cmd=(/usr/bin/python3 -u "$repo/examples/train_torch.py" --steps 300 --print-every 100)
  else
    torch_kind=linear torch_trainer=mall_train_linear
    note "python3-torch is not installed: the last container runs mall_train_linear instead"
    torch_cmd=("$bin/mall_train_linear" --steps 400 --print-every 100 --log-changes)
  fi
  # The Keras trainer needs the venv with TensorFlow's wheel (install-deps.sh makes <repo>/.venv),
  # mounted read-only at the same path, and mall's op library (a build with TensorFlow).
  keras_python=${MALL_DEMO_PYTHON:-$repo/.venv/bin/python}
  if [ ! -x "$keras_python" ] ||
     ! "$keras_python" -c 'import importlib.util as u, sys; sys.exit(not (u.find_spec("tensorflow") and u.find_spec("keras")))' 2>/dev/null; then
    keras_why="no Python with TensorFlow and Keras at $keras_python (launch_scripts/install-deps.sh makes the venv)"
  elif [ ! -f "$build/lib/libmall_tf_ops.so" ]; then
    keras_why="no $build/lib/libmall_tf_ops.so (mall built without TensorFlow)"
  else
    keras=1
    keras_venv=$(dirname "$(dirname "$keras_python")")
    # <repo> is mounted already; a venv elsewhere is mounted at its own path.
    if [ -f "$keras_venv/pyvenv.cfg" ] && [[ $keras_venv != "$repo"/* ]]; then ctr_bind_ro "$keras_venv"; fi
    keras_env=(--env=PYTHONPATH="$repo/python" --env=MALL_TF_OPS_LIBRARY="$build/lib/libmall_tf_ops.so"
               --env=TF_CPP_MIN_LOG_LEVEL=2)
    keras_cmd=("$keras_python" -u "$repo/examples/keras_digits.py" --steps 1500 --batch 512 --hidden 1024
               --print-every 250 --log-changes)
  fi
  [ "$keras" = 1 ] || note "$keras_why: the demo runs without the Keras container"
  declare -A pid_of=() trainer_of=([eigen]=mall_train_digits [keras]=keras_digits.py [$torch_kind]=$torch_trainer)
  start_container() {  # start_container NAME [--env=...]... WORDS...: mallrun --container ... run --rm ... WORDS
    local name=$1 envs=(); shift
    while [[ ${1-} == --env=* ]]; do envs+=("$1"); shift; done
    ctr_run_args "$engine" "$name" || return 1
    "$bin/mallrun" --socket "$sock" --container --malleable="1:$ncpus" --job "$name" --require -- \
      "$engine_bin" run --rm --env=MALL_LIBRARY="$build/lib/libmall.so.0" "${envs[@]}" "${CTR_RUN_ARGS[@]}" "$@" \
      > >(tee "$tmp/$name.log" | sed -u "s/^/  ${bold}$name${off} | /") 2>&1 &
    pid_of[$name]=$!
    job_pids+=($!)
  }
  status_now() { "$bin/mallctl" --socket "$sock" status 2>&1 | sed "s/^/  ${dim}status${off} | /"; }
  say "container eigen: mallrun --container --malleable=1:$ncpus -- $engine run --rm IMAGE mall_train_digits"
  note "(alone: it gets the whole pool; inside, nothing knows mall but libmall, told at each step)"
  # With keras, eigen trains longer: keras's model.fit should start (TensorFlow takes a few seconds)
  # while eigen still holds a core, so that eigen's end shows keras growing inside its fit.
  start_container eigen "$bin/mall_train_digits" --steps "$([ "$keras" = 1 ] && echo 800 || echo 500)" \
    --print-every 100 --log-changes || return 1
  wait_for_line "$tmp/eigen.log" '^step 100 ' || true
  local second=$torch_kind jobs=(eigen)
  if [ "$keras" = 1 ]; then
    second=keras
    say "container keras: mallrun --container ... -- $engine run --rm IMAGE python -u keras_digits.py (Keras model.fit)"
    note "(the equal policy shares the pool: eigen shrinks at its next step, keras starts on the other core;"
    note "mall.keras.Malleable parks TensorFlow's own pool workers at each batch end to follow its cores)"
    start_container keras "${keras_env[@]}" "${keras_cmd[@]}" || return 1
    jobs+=(keras)
  else
    say "container $torch_kind: mallrun --container ... -- $engine run --rm IMAGE ${torch_cmd[*]##*/}"
    note "(the equal policy shares the pool: eigen shrinks at its next step, then $torch_kind starts on its core)"
    start_container "$torch_kind" "${torch_cmd[@]}" || return 1
    jobs+=("$torch_kind")
  fi
  if wait_for_line "$tmp/$second.log" '^(step|resize)' 600; then
    sleep 0.3
    status_now
  fi
  local job rc
  declare -A rc_of=()
  if [ "$keras" = 1 ]; then
    rc=0; wait "${pid_of[eigen]}" || rc=$?; rc_of[eigen]=$rc
    # eigen's cores go to keras at its next batch end (when its fit runs: TensorFlow takes a few s to start).
    wait_for_line "$tmp/keras.log" '^resize step [0-9]+ threads 1 -> ' 100 || true
    say "container $torch_kind: mallrun --container ... -- $engine run --rm IMAGE ${torch_cmd[*]##*/}"
    note "(keras gives a core back at its next batch end, then $torch_kind starts on it; when one ends, the other grows)"
    start_container "$torch_kind" "${torch_cmd[@]}" || return 1
    jobs+=("$torch_kind")
  fi
  for job in "${jobs[@]}"; do
    [ -n "${rc_of[$job]:-}" ] && continue
    rc=0; wait "${pid_of[$job]}" || rc=$?; rc_of[$job]=$rc
  done
  job_pids=()
  sleep 1.5  # the jobs end with their containers' last processes: let malld see it and the watchers print it
  stop_pid "$watch_pid"; watch_pid=''
  stop_pid "$watch_json_pid"; watch_json_pid=''

  echo
  say "summary"
  printf '    %-7s %-22s %8s %-48s  %s\n' JOB TRAINER RESIZES "RESULT" STATUS
  local events publishes result ok=1
  for job in "${jobs[@]}"; do
    rc=${rc_of[$job]}
    [ "$rc" -eq 0 ] || ok=0
    events=$(grep "\"job\":\"$job\"" "$tmp/events.jsonl" || true)
    publishes=$(grep -c '"event":"publish"' <<<"$events" || true)
    result=$(grep -E '^final ' "$tmp/$job.log" | tail -n 1 | cut -c1-48)
    printf '    %-7s %-22s %8s %-48s  %s\n' "$job" "${trainer_of[$job]}" "$(( publishes > 0 ? publishes - 1 : 0 ))" \
      "${result:--}" "$([ "$rc" -eq 0 ] && echo ok || echo "exit $rc")"
  done
  note "resizes: allocation changes after the first, each applied inside the container at a step boundary"
  if [ "$keras" = 1 ]; then
    note "keras applied each allocation inside model.fit at a batch end (mall.keras.Malleable), e.g." \
         "'$(grep -E '^resize .* -> 1 ' "$tmp/keras.log" | tail -n 1 || true)' and" \
         "'$(grep -A1 -E '^resize .* -> 1 ' "$tmp/keras.log" | grep -E '^parked ' | tail -n 1 || true)' (TensorFlow's workers parked)"
  fi
  note "engine $engine ($("$engine_bin" --version 2>/dev/null | head -n 1)); backend $used_backend;" \
       "malld and the containers ran $(( ($(now_ms) - run_start) / 1000 )) s"
  if grep -qE ' (error|warn): ' "$tmp/malld.log"; then
    note "malld reported problems:"
    grep -E ' (error|warn): ' "$tmp/malld.log" | sed 's/^/      /'
  fi
  [ "$ok" = 1 ]
}

# ---- build --------------------------------------------------------------------------------------
targets=(malld mallctl mallrun mall_train_sgd)
[ "$slurm_mode" = 1 ] && targets+=(mall_spank)
[ "$demo_nodes" = 1 ] || targets+=(mall_train_mpi)
[ "$containers_mode" = 1 ] && targets+=(mall_train_digits mall)
have_binaries() {
  local b
  for b in malld mallctl mallrun mall_train_sgd; do [ -x "$bin/$b" ] || return 1; done
  [ "$slurm_mode" = 0 ] || [ -f "$build/lib/mall_spank.so" ]
}
if [ -d "$build" ] && [ ! -w "$build" ] && have_binaries; then
  say "using the binaries in $build as they are (the folder is not writable by $(id -un), so no rebuild)"
else
say "building ${targets[*]} in $build"
if ! command -v cmake >/dev/null || ! command -v ninja >/dev/null || ! command -v c++ >/dev/null; then
  note "build tools missing: running launch_scripts/install-deps.sh"
  "$repo/launch_scripts/install-deps.sh"
fi
if [ "$slurm_mode" = 1 ]; then
  if ! command -v slurmctld >/dev/null || ! command -v sbatch >/dev/null || [ ! -f /usr/include/slurm/spank.h ]; then
    note "Slurm missing: running launch_scripts/install-deps.sh"
    "$repo/launch_scripts/install-deps.sh"
  fi
  # A build folder configured before Slurm's headers were installed has no plugin target: configure again.
  if [ -f "$build/build.ninja" ] && ! ninja -C "$build" -t query mall_spank >/dev/null 2>&1; then
    note "the build folder has no mall_spank target: configuring again (Slurm's headers are there now)"
    cmake -G Ninja -B "$build" -S "$repo" >"$tmp/configure.log" 2>&1 || {
      tail -30 "$tmp/configure.log"; echo "demo: cmake failed (log above)" >&2; exit 1; }
  fi
fi
if [ ! -f "$build/build.ninja" ]; then
  note "first build: configuring and compiling takes a minute or two"
  if ! cmake -G Ninja -B "$build" -S "$repo" >"$tmp/configure.log" 2>&1; then
    note "configure failed; installing dependencies and trying again"
    "$repo/launch_scripts/install-deps.sh"
    cmake -G Ninja -B "$build" -S "$repo" >"$tmp/configure.log" 2>&1 || {
      tail -30 "$tmp/configure.log"; echo "demo: cmake failed (log above)" >&2; exit 1; }
  fi
fi
# --containers: the Keras container needs mall's TensorFlow op library, where the build has TensorFlow.
if [ "$containers_mode" = 1 ] && ninja -C "$build" -t query mall_tf_ops >/dev/null 2>&1; then targets+=(mall_tf_ops); fi
if [ "$tensorflow_mode" = 1 ]; then
  if ! ninja -C "$build" -t query mall_tf_ops >/dev/null 2>&1; then
    echo "demo: --tensorflow needs mall built with TensorFlow (no mall_tf_ops target in $build):" \
         "cmake -B $build -DMALL_WITH_TENSORFLOW=ON (after launch_scripts/install-deps.sh)" >&2
    exit 1
  fi
  targets+=(mall mall_tf_ops)
fi
# One retry: another ninja in the same build folder (e.g. a test run) can make one step fail.
if ! ninja -C "$build" -j2 "${targets[@]}" >"$tmp/build.log" 2>&1 &&
   ! { sleep 2; ninja -C "$build" -j2 "${targets[@]}" >"$tmp/build.log" 2>&1; }; then
  tail -40 "$tmp/build.log"
  echo "demo: the build failed (see above)" >&2
  exit 1
fi
note "$(grep -c '^\[' "$tmp/build.log" || true) build steps; binaries in $bin"
fi

run_start=$(now_ms)
if [ "$slurm_mode" = 1 ]; then
  slurm_demo
  exit $?
fi

# ---- malld --------------------------------------------------------------------------------------
backend=affinity
if [ "$(id -u)" -eq 0 ] &&
   { [ -w /sys/fs/cgroup/cpuset/cgroup.procs ] || grep -qw cpuset /sys/fs/cgroup/cgroup.controllers 2>/dev/null; }; then
  backend=auto
  say "starting a private malld (root: cores are enforced with cgroup cpusets under $cgroup_parent)"
else
  if [ "$(id -u)" -ne 0 ]; then why="not running as root"; else why="no usable cpuset controller"; fi
  say "starting a private malld with the AFFINITY backend ($why):"
  note "cores are moved with sched_setaffinity on every thread, not enforced by a cgroup cpuset;"
  note "run the demo as root to see cgroup cpusets."
fi
"$bin/malld" --socket "$sock" --state-dir "$tmp" --backend "$backend" --cgroup-parent "$cgroup_parent" \
  --policy equal --log-level info 2>"$tmp/malld.log" &
malld_pid=$!
for _ in $(seq 100); do
  "$bin/mallctl" --socket "$sock" status >/dev/null 2>&1 && break
  kill -0 "$malld_pid" 2>/dev/null || break
  sleep 0.05
done
if ! "$bin/mallctl" --socket "$sock" status >"$tmp/status.txt" 2>&1; then
  echo "demo: malld did not start; its log:" >&2
  cat "$tmp/malld.log" >&2
  exit 1
fi
pool=$(sed -n 's/^POOL *\([^ ]*\).*/\1/p' "$tmp/status.txt")
used_backend=$(sed -n 's/^BACKEND *\([^ ]*\).*/\1/p' "$tmp/status.txt")
# Count the cpus of a list such as 0-3,8.
ncpus=0
IFS=, read -r -a items <<<"$pool"
for item in "${items[@]}"; do
  if [[ $item == *-* ]]; then ncpus=$(( ncpus + ${item#*-} - ${item%-*} + 1 )); else ncpus=$(( ncpus + 1 )); fi
done
note "socket $sock, pool $pool ($ncpus cpus), policy equal"
note "malld: $(grep -m1 ' info: backend' "$tmp/malld.log" | sed 's/.* info: //')"

# ---- watchers: one for the reader, one (JSON) for the summary -----------------------------------
"$bin/mallctl" --socket "$sock" watch --json >"$tmp/events.jsonl" 2>/dev/null &
watch_json_pid=$!
"$bin/mallctl" --socket "$sock" watch > >(sed -u "s/^/  ${dim}malld${off} | /") 2>&1 &
watch_pid=$!
sleep 0.3  # let both watchers subscribe before the first job registers

# ---- the two jobs -------------------------------------------------------------------------------
start_job() {  # start_job NAME: runs the trainer under mallrun in the background
  local name=$1
  local -a trainer=("$bin/mall_train_sgd" --steps "$steps" --seed "$seed" --print-every 100 --log-changes)
  if [ "$tensorflow_mode" = 1 ]; then
    # mall's Python package and libraries from this checkout and build (an install puts them in place).
    trainer=(env PYTHONPATH="$repo/python" MALL_LIBRARY="$build/lib/libmall.so.0"
             MALL_TF_OPS_LIBRARY="$build/lib/libmall_tf_ops.so" TF_CPP_MIN_LOG_LEVEL=3
             "$keras_python" -u "$repo/examples/keras_digits.py" --steps "$steps" --seed "$seed"
             --print-every 1000 --log-changes)
  fi
  "$bin/mallrun" --socket "$sock" --malleable="1:$ncpus" --job "$name" -- "${trainer[@]}" \
    > >(grep --line-buffered -v -e '^WARNING: All log messages' -e '^I0000 ' | tee "$tmp/$name.log" |
        sed -u "s/^/  ${bold}job $name${off} | /") 2>&1 &
  job_pids+=($!)
}
wait_for_line() {  # wait_for_line FILE REGEX [TENTHS]: until a line matches (TENTHS/10 s at most, default 30 s)
  local i
  for i in $(seq "${3:-300}"); do grep -qE "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
  return 1
}
if [ "$containers_mode" = 1 ]; then
  container_demo
  exit $?
fi
if [ "$tensorflow_mode" = 1 ]; then
  say "job A: mallrun --malleable=1:$ncpus -- python keras_digits.py --steps $steps (Keras model.fit with mall.keras.Malleable; alone: gets the whole pool)"
  start_job A
  wait_for_line "$tmp/A.log" '^step 1000 ' || true
  say "job B: the same Keras training, started while A runs (the equal policy shares the pool: A parks a worker of each of TensorFlow's pools first)"
else
  say "job A: mallrun --malleable=1:$ncpus -- mall_train_sgd --steps $steps --seed $seed (alone: gets the whole pool)"
  start_job A
  wait_for_line "$tmp/A.log" '^step 200 ' || true
  say "job B: the same training, started while A runs (the equal policy shares the pool: A shrinks first)"
fi
start_job B
if wait_for_line "$tmp/B.log" '^step 1 '; then
  sleep 0.2
  "$bin/mallctl" --socket "$sock" status 2>&1 | sed "s/^/  ${dim}status${off} | /"
fi
rc_a=0 rc_b=0
wait "${job_pids[0]}" || rc_a=$?
wait "${job_pids[1]}" || rc_b=$?
job_pids=()
sleep 0.3  # let the last events (end, grow) reach the watchers
stop_pid "$watch_pid"; watch_pid=''
stop_pid "$watch_json_pid"; watch_json_pid=''
end_ms=$(now_ms)
wall_ms=$(( end_ms - demo_start )) run_ms=$(( end_ms - run_start ))

# ---- summary ------------------------------------------------------------------------------------
field() { grep -o "\"$1\":[^,}]*" | sed 's/^[^:]*://; s/"//g'; }

echo
say "summary"
printf '    %-4s %6s %10s %9s %9s %12s %16s  %s\n' JOB STEPS "FINAL LOSS" ACCURACY RESIZES "MEDIAN ACK" CHECKSUM STATUS
checksums=()
for job in A B; do
  rc=$rc_a; [ "$job" = B ] && rc=$rc_b
  final=$(grep '^final loss' "$tmp/$job.log" || true)
  done_steps=$(sed -n 's/^done steps \([0-9]*\).*/\1/p' "$tmp/$job.log")
  loss=$(sed -n 's/^final loss \([^ ]*\).*/\1/p' <<<"$final")
  acc=$(sed -n 's/.* accuracy \([^ ]*\).*/\1/p' <<<"$final")
  sum=$(sed -n 's/.* checksum \([^ ]*\).*/\1/p' <<<"$final")
  checksums+=("$sum")
  events=$(grep "\"job\":\"$job\"" "$tmp/events.jsonl" || true)
  publishes=$(grep -c '"event":"publish"' <<<"$events" || true)
  resizes=$(( publishes > 0 ? publishes - 1 : 0 ))
  ack=$(grep '"event":"ack"' <<<"$events" | field latency_us | median %.1f -)
  [ "$ack" = "-" ] || ack="$ack us"
  printf '    %-4s %6s %10s %9s %9s %12s %16s  %s\n' "$job" "${done_steps:--}" "${loss:--}" "${acc:--}" \
    "$resizes" "$ack" "${sum:--}" "$([ "$rc" -eq 0 ] && echo ok || echo "exit $rc")"
done
note "resizes: allocation changes after the first; median ack: publish-to-ack latency of those"
note "changes (a job acks at its next step boundary, so this is up to one training step)"
if [ "$tensorflow_mode" = 1 ]; then
  note "TensorFlow's pools followed each allocation inside model.fit (mall.keras.Malleable), e.g." \
       "'$(grep -E '^resize .* -> 1 ' "$tmp/A.log" | head -n 1 || true)'," \
       "'$(grep -A1 -E '^resize .* -> 1 ' "$tmp/A.log" | grep -E '^parked ' | head -n 1 || true)' (workers parked)"
fi
if [ -n "${checksums[0]}" ] && [ "${checksums[0]}" = "${checksums[1]}" ]; then
  note "A and B trained with the same seed under different resize histories: identical weights (same checksum)"
fi
seconds() { printf '%d.%01d s' $(( $1 / 1000 )) $(( $1 % 1000 / 100 )); }
note "backend $used_backend; malld and the jobs ran $(seconds "$run_ms"); total wall time $(seconds "$wall_ms") (with the build check)"
if grep -qE ' (error|warn): ' "$tmp/malld.log"; then
  note "malld reported problems:"
  grep -E ' (error|warn): ' "$tmp/malld.log" | sed 's/^/      /'
fi
[ "$rc_a" -eq 0 ] && [ "$rc_b" -eq 0 ]
