#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# soak.sh — the soak test: a private malld under random load for N minutes per backend, with a
# sampler checking all along that no cpu is in two jobs' cpusets. Passes (exit 0) only when no
# check failed and nothing was left behind; the driver and sampler are tests/soak/soak.py. A trap
# ends and removes everything the run started, on every exit path (also a watchdog's SIGTERM).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
prog=soak.sh
minutes=10
backend=both
seed=""
build=${MALL_BUILD_DIR:-$repo/build}  # every launch script: $MALL_BUILD_DIR, else <repo>/build
keep_logs=0
ack_timeout_ms=500
sample_ms=25
restarts=-1
verbose=0
python=/usr/bin/python3

usage() {
  cat <<EOF
NAME
    $prog - soak test of malld, libmall, mallrun and mallctl under random load

SYNOPSIS
    launch_scripts/$prog [--minutes N] [--backend cgroup-v1|affinity|both] [--seed S]
                         [--build-dir DIR] [--keep-logs] [--ack-timeout-ms MS]
                         [--sample-ms MS] [--restarts R] [--verbose]
    launch_scripts/$prog -h|--help

DESCRIPTION
    For each backend, starts a private malld (its own socket, state folder and cgroup parent
    /sys/fs/cgroup/cpuset/mall_soak_<pid>_v1; pool: every cpu, policy equal, ack timeout MS)
    and runs a plan drawn from the seed against it for N minutes:

    - jobs arrive at random (every 1.5 s on average) through mallrun --malleable=1:2, 1:1, 2:2
      or 1 (up to the pool), with random weights: mall_test_client stepping every 0.2-5 ms,
      "slow" clients stepping every 0.7-1.5 s (their acks come after the ack timeout),
      "noack" clients that attach and never step (every move of theirs times out), the
      examples mall_train_sgd, mall_train_digits and mall_train_linear on small presets, and
      two-rank mall_train_mpi jobs (mpirun, each rank under its own mallrun; when built);
      a long-lived client (the "resident") runs through the whole restart phase;
    - jobs leave at random: most run to their end, some are stopped by SIGTERM, some are
      SIGKILLed mid-step (the process alone, or with its mallrun);
    - admin commands at random (every 1.2 s on average): mallctl set JOB --cpus LIST|auto,
      set JOB --weight W, policy equal|weighted|static|throughput, reclaim CPU [--owner O]
      and release; half of the moves go to a job that acks late or never;
    - malld is restarted R times in the middle half of the run (SIGKILL, or now and then
      SIGTERM): jobs keep running, arrivals meanwhile run unmanaged or lose their
      registration (mallrun exit 3), and the new malld re-adopts the survivors.

    The run has three phases: a warm-up (10%, at least 6 s), the restarts (50%) and a steady
    part (40%). Each phase ends in a drain: no new jobs, the test clients are stopped with
    SIGTERM, the examples finish, reclaimed cpus are released; malld must then hold no job,
    no reclaimed cpu and no job cgroup, and its RSS and open fds are taken.

    A seed gives the same plan (arrivals, job kinds and sizes, fates, admin commands, restart
    times); timing on a loaded machine decides the rest, so a failure replays as the same
    scenario rather than the same interleaving. The seed is printed first.

WHAT IS CHECKED (each failure is a violation; the run fails on any)
    - no cpu is in two jobs' cpusets. Every MS ms a sampler asks malld for its status, reads
      every job's cpus from the kernel (cgroup-v1: the job folder's cpuset.cpus; both
      backends: Cpus_allowed_list of every live thread of the job's processes, from
      /proc/PID/task/*/status), reads them again in reverse order, and asks for the status
      again. A cpu counts as in jobs A and B when both reads of A (which bracket B's) and one
      read of B hold it. Such an overlap is tolerated, and counted apart, only while one of
      the two jobs is in an ack window (the status shows attached processes and
      acked_generation < generation); malld's ack_timeout events count the windows that
      timed out. Jobs without cpus yet (held at mallrun's gate) are not sampled.
    - malld's status never shows a cpu held (cpuset or published) by two jobs.
    - the kernel agrees with malld: for a job steady in both statuses of a sample, its cgroup
      (cgroup-v1) holds what malld says, and its threads run nowhere else; a disagreement
      counts when two samples in a row see it.
    - every job ends as expected: exit 0 with the right result (mall_test_client: FNV-1a
      checksum of the steps it took, and all of them unless stopped by SIGTERM; the examples:
      the checksum, or for mall_train_digits the loss and accuracy, of a reference run
      without malld on one thread; an MPI job: every rank's), 137 or -9 when SIGKILLed, 1
      when malld refused the registration (reasons are counted, and refusals the driver did
      not expect from the claims it knows are counted apart), 3 only when malld was killed
      during the registration. mallctl exits 0, 1 (refused) or, when malld was away, 3.
    - a job's process holds no pipe or file beyond its stdio (nothing leaks in from mallrun
      or the driver) and not two sockets in two scans a second apart (libmall keeps one
      connection); the resident client's fds and RSS do not grow over the restarts.
    - malld answers within 15 s of each start, and exits 0 on SIGTERM.
    - the malld instance that runs the last two phases did not grow: between its drains its
      open fds may not grow at all and its RSS by at most max(1 MiB, 10%); at every drain it
      holds no job page (memfd) and no pidfd beyond one per open connection.
    - nothing is left at the end: no cgroup folder under the private parent, no socket, no
      process carrying the run's marker (MALL_SOAK_RUN=<work dir> in its environment) or in
      a process group the run created, no fd left open in the driver.

OPTIONS
    --minutes N         minutes per backend, a decimal number (default $minutes); the
                        reference runs of the examples and the drains add about 15 s in all
    --backend B         cgroup-v1, affinity or both (default $backend, one after the other)
    --seed S            the plan's seed (default: drawn from the clock, printed)
    --build-dir DIR     where bin/malld, mallctl, mallrun, mall_test_client and the examples
                        mall_train_sgd, _digits, _linear (and _mpi, optional) are
                        (default: \$MALL_BUILD_DIR, else <repo>/build; the option wins)
    --keep-logs         keep the work folder (/tmp/mall_soak_XXXXXX): per backend soak.log,
                        plan.txt, events.jsonl, malld.N.log, mallctl.log, jobs/*.out|err,
                        report-BACKEND.json; without it, it is removed (also on failure,
                        after the tails that matter were printed)
    --ack-timeout-ms MS malld's --ack-timeout-ms (default $ack_timeout_ms)
    --sample-ms MS      the sampler's period (default $sample_ms)
    --restarts R        malld restarts per backend (default max(2, seconds/100): 6 in 10 min)
    --verbose           print every action as it happens
    -h, --help          this text

OUTPUT
    One line every 30 s, then per backend the figures: jobs started per kind and how they
    ended, transitions (publish, ack and ack_timeout events), malld restarts, admin commands
    (ok/refused/malld away), samples, ack-timeout windows and overlaps inside them,
    violations, malld's RSS and fds at each drain, leftovers. Last line: "soak: PASS" or
    "soak: FAIL".

EXIT STATUS
    0   every backend passed
    1   a violation, a wrong result or exit code, or a leftover
    2   usage error, or a missing binary
    77  cannot run here: cgroup-v1 was asked for without root or a writable cpuset hierarchy
        (with --backend both, affinity alone is run and the skip is said)
    124 the watchdog stopped a run that went on too long (nb_backends x (N min + 5 min) + 2 min)

ENVIRONMENT
    Needs /usr/bin/python3 (Debian's), root for cgroup-v1; loads the machine's cpus. On the
    affinity backend the MPI jobs run with OMPI_MCA_mtl=^ofi,psm,psm2 OMPI_MCA_btl=^ofi
    HWLOC_COMPONENTS=-x86: otherwise Open MPI's start moves a rank's threads onto other jobs'
    cpus for up to ~100 ms, which sched_setaffinity enforcement cannot prevent (a cgroup does).

EXAMPLES
    launch_scripts/$prog --minutes 10                       # both backends, 10 min each
    launch_scripts/$prog --minutes 1 --backend both         # the CI form (ctest -L soak)
    launch_scripts/$prog --backend affinity --seed 4242 --keep-logs --verbose   # replay
EOF
}

die_usage() { echo "$prog: $1 (see --help)" >&2; exit 2; }

args=("$@")
while [ $# -gt 0 ]; do
  case $1 in
    -h|--help) usage; exit 0 ;;
    --minutes) [ $# -ge 2 ] || die_usage "--minutes needs a value"; minutes=$2; shift 2 ;;
    --minutes=*) minutes=${1#*=}; shift ;;
    --backend) [ $# -ge 2 ] || die_usage "--backend needs a value"; backend=$2; shift 2 ;;
    --backend=*) backend=${1#*=}; shift ;;
    --seed) [ $# -ge 2 ] || die_usage "--seed needs a value"; seed=$2; shift 2 ;;
    --seed=*) seed=${1#*=}; shift ;;
    --build-dir) [ $# -ge 2 ] || die_usage "--build-dir needs a value"; build=$2; shift 2 ;;
    --build-dir=*) build=${1#*=}; shift ;;
    --keep-logs) keep_logs=1; shift ;;
    --ack-timeout-ms) [ $# -ge 2 ] || die_usage "--ack-timeout-ms needs a value"; ack_timeout_ms=$2; shift 2 ;;
    --ack-timeout-ms=*) ack_timeout_ms=${1#*=}; shift ;;
    --sample-ms) [ $# -ge 2 ] || die_usage "--sample-ms needs a value"; sample_ms=$2; shift 2 ;;
    --sample-ms=*) sample_ms=${1#*=}; shift ;;
    --restarts) [ $# -ge 2 ] || die_usage "--restarts needs a value"; restarts=$2; shift 2 ;;
    --restarts=*) restarts=${1#*=}; shift ;;
    --verbose) verbose=1; shift ;;
    *) die_usage "unknown argument '$1'" ;;
  esac
done

[[ $minutes =~ ^[0-9]+(\.[0-9]+)?$ ]] && awk "BEGIN{exit !($minutes > 0 && $minutes <= 1440)}" ||
  die_usage "--minutes must be a number above 0 and at most 1440, got '$minutes'"
case $backend in
  cgroup-v1|affinity) backends=("$backend") ;;
  both) backends=(cgroup-v1 affinity) ;;
  *) die_usage "--backend must be cgroup-v1, affinity or both, got '$backend'" ;;
esac
[ -z "$seed" ] && seed=$(( $(date +%s%N) / 1000 % 1000000 ))
[[ $seed =~ ^[A-Za-z0-9_.-]{1,64}$ ]] || die_usage "--seed must be 1-64 letters, digits, '.', '_' or '-', got '$seed'"
[[ $ack_timeout_ms =~ ^[1-9][0-9]{0,6}$ ]] || die_usage "--ack-timeout-ms must be a positive integer, got '$ack_timeout_ms'"
[[ $sample_ms =~ ^[1-9][0-9]{0,5}$ ]] || die_usage "--sample-ms must be a positive integer, got '$sample_ms'"
[[ $restarts =~ ^(-1|[0-9]{1,3})$ ]] || die_usage "--restarts must be an integer from 0 to 999, got '$restarts'"
[ -d "$build" ] || die_usage "the build folder '$build' does not exist (--build-dir or \$MALL_BUILD_DIR; default <repo>/build)"
build=$(cd "$build" && pwd)

missing=()
for b in malld mallctl mallrun mall_test_client mall_train_sgd mall_train_digits mall_train_linear; do
  [ -x "$build/bin/$b" ] || missing+=("$b")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "$prog: missing in $build/bin: ${missing[*]}; build them with: ninja -C $build ${missing[*]}" >&2
  exit 2
fi
[ -x "$python" ] || { echo "$prog: needs $python (Debian's python3 package)" >&2; exit 2; }

# cgroup-v1 needs root and a writable cpuset hierarchy.
skip_reason=""
if [ "$(id -u)" -ne 0 ]; then
  skip_reason="not root"
elif [ ! -w /sys/fs/cgroup/cpuset/cgroup.procs ]; then
  skip_reason="no writable cgroup-v1 cpuset hierarchy at /sys/fs/cgroup/cpuset"
fi
if [ -n "$skip_reason" ]; then
  if [ "$backend" = cgroup-v1 ]; then
    echo "$prog: SKIP: the cgroup-v1 backend cannot run here: $skip_reason"
    exit 77
  elif [ "$backend" = both ]; then
    echo "$prog: note: cgroup-v1 skipped ($skip_reason); affinity only"
    backends=(affinity)
  fi
fi

# The watchdog: the run is re-executed under timeout(1); its SIGTERM reaches the trap below.
bound=$(awk "BEGIN{printf \"%d\", ${#backends[@]} * ($minutes * 60 + 300) + 120}")
# shellcheck source=../tests/support/watchdog.sh
. "$repo/tests/support/watchdog.sh"
watchdog_script "$bound" "${args[@]}"

work=$(mktemp -d /tmp/mall_soak_XXXXXX)
driver_pid=""
status=0
failed=()

# On every exit path: end the driver, then sweep whatever a run left (processes carrying the
# run's marker, cgroup folders, sockets), then remove the work folder unless --keep-logs.
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [ -n "$driver_pid" ] && kill -0 "$driver_pid" 2>/dev/null; then
    kill -TERM "$driver_pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$driver_pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$driver_pid" 2>/dev/null || true
    wait "$driver_pid" 2>/dev/null || true
  fi
  for b in "${backends[@]}"; do
    [ -d "$work/$b" ] && "$python" "$repo/tests/soak/soak.py" --sweep --build-dir "$build" --workdir "$work/$b" || true
  done
  if [ "$keep_logs" = 1 ]; then
    echo "$prog: logs kept in $work"
  else
    rm -rf "$work"
  fi
  exit "$rc"
}
on_signal() {
  watchdog_fired "$bound"
  exit 124
}
trap cleanup EXIT
trap on_signal INT TERM

echo "soak: seed $seed; ${minutes} min per backend (${backends[*]}); build $build; replay with: launch_scripts/$prog --minutes $minutes --backend $backend --seed $seed"
started=$(date +%s)
for b in "${backends[@]}"; do
  mkdir -p "$work/$b"
  extra=()
  [ "$verbose" = 1 ] && extra+=(--verbose)
  "$python" "$repo/tests/soak/soak.py" --build-dir "$build" --workdir "$work/$b" --backend "$b" \
      --minutes "$minutes" --seed "$seed" --ack-timeout-ms "$ack_timeout_ms" --sample-ms "$sample_ms" \
      --restarts "$restarts" --references "$work/references.json" "${extra[@]}" &
  driver_pid=$!
  rc=0
  wait "$driver_pid" || rc=$?
  driver_pid=""
  if [ "$rc" -ne 0 ]; then
    status=1
    failed+=("$b")
    echo "soak: $b failed (exit $rc); last lines of its log:"
    tail -n 15 "$work/$b/soak.log" 2>/dev/null | sed 's/^/soak:   | /' || true
  fi
done

if [ "$status" -eq 0 ]; then
  echo "soak: PASS (${backends[*]}, seed $seed, $(( $(date +%s) - started )) s)"
else
  echo "soak: FAIL (${failed[*]}; seed $seed, $(( $(date +%s) - started )) s)"
fi
exit "$status"
