#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# run-tsan.sh — the ThreadSanitizer pass: configures a -DMALL_SANITIZE=thread tree (build-tsan/),
# builds only the programs the thread-heavy tests need and runs those tests. Contract: exits 0 only
# when every test passed and no process of the pass (test programs, their malld, clients and MPI
# ranks) wrote a TSan report; 1 on a failure or a report (printed), 2 on bad usage, 124 when its
# watchdog fired. Leaves no process behind; the reports and logs stay in <build-dir>/tsan-logs/.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
here=$repo/tests/tsan
program=$(basename "$0")

usage() {
  cat <<EOF
NAME
    $program - run mall's thread-heavy tests under ThreadSanitizer

SYNOPSIS
    tests/tsan/$program [-B DIR] [-j N] [--only GROUPS] [--no-build] [--timeout SECONDS]
    tests/tsan/$program --list | --help

DESCRIPTION
    Configures DIR (default <repo>/build-tsan) with -DMALL_SANITIZE=thread, Ninja,
    RelWithDebInfo (-O2 -g), benchmarks, libtorch and TensorFlow off, builds only the
    programs of the selected groups, and runs their tests with
        TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1
                      suppressions=tests/tsan/suppressions.txt log_path=DIR/tsan-logs/report"
    Every instrumented process (the test programs and the malld, mallrun, mall_test_client
    and MPI ranks they start) writes its reports to DIR/tsan-logs/report.<pid>, so a race in
    a child fails the pass even when the test itself would not notice. The pass fails on
    any report, any failed test and any hang; reports and each test's output are printed
    on failure and kept in DIR/tsan-logs/.

    Before building, a canary with a deliberate race (tests/tsan/canary.cpp) must be
    reported. If TSan cannot map its shadow memory ("FATAL: ThreadSanitizer: unexpected
    memory mapping": a kernel with vm.mmap_rnd_bits above 28 and a TSan runtime that does
    not re-run itself without address randomisation, as GCC 12's), every test runs under
    "setarch \$(uname -m) -R" (no address randomisation, inherited by child processes); if
    that is not allowed either and this is root, vm.mmap_rnd_bits is set to 28 for the
    pass and restored afterwards.

GROUPS (--only, comma-separated; default all)
    pool    parking Eigen's own pool: tf_test_pool_parking, three times over
            (--gtest_repeat=3: parallelFor and contractions across resizes, tasks
            scheduled while workers park, resizes from inside tasks, destruction
            with work in flight).
    client  libmall's client threads against the in-process fake malld: test_client
            (monitor thread, reconnects, mall_fd, progress, the seqlock page) and
            tf_test_pool_live_handle, three times over (the pool attached to a live
            handle while the stepping thread, pool workers, binding threads and an
            mall_fd poller use it and the fake malld publishes and restarts).
    malld   the same client threads in real processes under a real, instrumented
            malld (whose own threads are checked too): test_restart, test_usage,
            test_two_jobs, and test_control_by_signal (mallctl signal against the C
            client's workers, libmall's handler and monitor; without its Eigen trainer
            case, which is the pool group's code at TSan's speed); test_slurm_jobs and
            test_slurm_lookup (the Slurm checker's thread: queries and AdminComment
            updates, and an in-process malld that holds a Deregister's answer for
            them); test_daemon_floods (malld's closer thread against the loop: passed
            descriptors, a stuck close, parked sockets); test_parking_soak_examples on cgroup-v1 (mall_train_digits and
            mall_train_linear, instrumented, 960 steps each while mallctl toggles
            their allocation every few steps: parking, the stall guard and the glue
            under real changes). They need root and a cpuset controller (else they
            skip).
    mpi     the MPI collective step: mpi_test_collective_step (mpirun -np 2 and -np 4
            of mall_train_mpi: libmall_mpi, the pool and libmall in every rank, with
            Open MPI's own threads beside them). Needs root (mpirun as root is
            allowed by the test) and a cpuset controller.

NOT IN THE PASS, AND WHY
    tf_test_openmp_adapter, tf_test_libtorch_adapter
            libgomp (and libtorch's OpenMP runtime) is not built with TSan: its
            barriers synchronise with futexes and atomics TSan cannot see, so correct
            parallel regions are reported as races in our own frames (main._omp_fn.N),
            where no suppression of libgomp can match. The adapters' callbacks run on
            the stepping thread inside mall_step(), whose threading the client group
            checks with the pool's callback.
    test_eigen_example, test_linear_example, test_example
            single-process Eigen training runs, several times slower instrumented;
            their threads (the pool, libmall's monitor) are those the pool, client
            and mpi groups check.
    python tests, system tests, find_package
            uninstrumented python3 and Slurm daemons would have to load instrumented
            libraries (TSan's runtime must be loaded first).
    the core's unit tests (node manager, policies, topology, ...)
            single-threaded code: TSan has nothing to check there.

OPTIONS
    -B, --build-dir DIR   the build tree (default \$MALL_TSAN_BUILD_DIR, else <repo>/build-tsan)
    -j, --jobs N          ninja's parallel jobs (default \$MALL_JOBS, else 2)
    --only GROUPS         run only these groups (see GROUPS)
    --no-build            run the programs already built in DIR (no configure, no build)
    --timeout SECONDS     watchdog for the whole pass, build included (default 2400)
    --list                print the tests of each group and exit
    -h, --help            this text

SKIPPED TESTS
    A test program that skipped tests (exit 77 from mall's GoogleTest main, or gtest's
    SKIPPED lines) still passes, and each skipped test is listed with its reason. Under CI
    (CI=true) a skip fails the pass unless tests/expected-skips names it for this machine
    kind ("<program> <Suite.Test glob> <why>" lines).

ENVIRONMENT
    TSAN_OPTIONS          appended to the options above (a later option wins)
    MALL_TSAN_BUILD_DIR, MALL_JOBS   defaults of -B and -j
    CI                    true: skipped tests fail the pass (see SKIPPED TESTS)

TIME
    On the CI machine kind (2 cores, ninja -j2): about 6 minutes from an empty tree, of which
    the build takes about 5.5 (about 9 CPU-minutes) and the tests about 40 seconds (pool 3 s,
    client 25 s, malld 5 s, mpi 10-15 s). With a built tree (--no-build, or nothing changed)
    only the tests' 40 seconds.

EXIT STATUS
    0 pass; 1 a test failed, TSan reported, or TSan cannot run here; 2 bad usage;
    124 the watchdog stopped the pass.

EXAMPLES
    tests/tsan/$program                      # the whole pass, as CI runs it
    tests/tsan/$program --only pool,client   # no root needed
    tests/tsan/$program --no-build --only mpi
EOF
}

# The parking soak's steps under ThreadSanitizer: 960 instead of its 2,400 (each instrumented step
# costs ~10x; 2,400 took 286 s of a CI run). Its mallctl toggler still lands ~100 changes a run.
export MALL_SOAK_STEPS=${MALL_SOAK_STEPS:-960}

# --- the tests: "group program timeout-seconds [arguments]" ---------------------------------------
tests_table() {
  cat <<'EOF'
pool tf_test_pool_parking 300 --gtest_repeat=3
client test_client 300
client tf_test_pool_live_handle 300 --gtest_repeat=3
malld test_restart 300
malld test_usage 300
malld test_two_jobs 300
malld test_control_by_signal 300 --gtest_filter=-*TrainDigits*
malld test_parking_soak_examples 900 --gtest_filter=*cgroup_v1:-*Tf*
malld test_slurm_jobs 120
malld test_slurm_lookup 300
malld test_daemon_floods 300
mpi mpi_test_collective_step 900
EOF
}
# Programs the tests start (besides the test programs themselves), by group.
helpers_of() {
  case $1 in
    malld) echo "malld mallctl mallrun mall_test_client mall_signal_client mall_train_digits mall_train_linear" ;;
    mpi) echo "malld mallctl mallrun mall_test_client mall_train_mpi" ;;
    *) echo "" ;;
  esac
}
all_groups="pool client malld mpi"

# --- arguments ---------------------------------------------------------------------------------------
build=${MALL_TSAN_BUILD_DIR:-$repo/build-tsan}
jobs=${MALL_JOBS:-2}
groups=$all_groups
do_build=1
budget=2400
list_only=0
original_args=("$@")
die_usage() { echo "$program: $1 (see --help)" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
    -h|--help) usage; exit 0 ;;
    -B|--build-dir) [ $# -ge 2 ] || die_usage "$1 needs a folder"; build=$2; shift 2 ;;
    -j|--jobs) [ $# -ge 2 ] || die_usage "$1 needs a number"; jobs=$2; shift 2 ;;
    --only) [ $# -ge 2 ] || die_usage "--only needs groups"; groups=${2//,/ }; shift 2 ;;
    --no-build) do_build=0; shift ;;
    --timeout) [ $# -ge 2 ] || die_usage "--timeout needs seconds"; budget=$2; shift 2 ;;
    --list) list_only=1; shift ;;
    *) die_usage "unknown argument '$1'" ;;
  esac
done
[[ $jobs =~ ^[1-9][0-9]*$ ]] || die_usage "-j wants a whole number >= 1, not '$jobs'"
[[ $budget =~ ^[1-9][0-9]*$ ]] || die_usage "--timeout wants whole seconds >= 1, not '$budget'"
for g in $groups; do
  [[ " $all_groups " == *" $g "* ]] || die_usage "unknown group '$g' (groups: ${all_groups// /, })"
done
[ -n "${groups// /}" ] || die_usage "--only names no group"
case $build in /*) ;; *) build=$PWD/$build ;; esac

if [ $list_only = 1 ]; then
  tests_table | while read -r group name timeout args; do
    if [[ " $groups " == *" $group "* ]]; then
      printf '%-7s %s%s (timeout %s s)\n' "$group" "$name" "${args:+ $args}" "$timeout"
    fi
  done
  exit 0
fi

# --- watchdog and cleanup ------------------------------------------------------------------------------
# shellcheck source=../support/watchdog.sh
. "$repo/tests/support/watchdog.sh"
watchdog_script "$budget" "${original_args[@]}"

logs=$build/tsan-logs
build_real=$build
current_pid=""          # the running test's timeout(1), leader of its process group
restore_rnd_bits=""     # vm.mmap_rnd_bits to put back, when this pass lowered it

# Processes started from this build tree's bin/ that outlived their test (a test killed by its
# timeout cannot clean up after itself): ended by pid.
kill_leftovers() {
  local entry pid exe
  for entry in /proc/[0-9]*; do
    pid=${entry#/proc/}
    [ "$pid" = $$ ] && continue
    exe=$(readlink "$entry/exe" 2>/dev/null) || continue
    case $exe in "$build_real"/bin/*) kill -KILL "$pid" 2>/dev/null || true ;; esac
  done
}

# Stops the running test the way its own watchdog would: SIGALRM to its timeout(1), which passes
# it on to the test program, whose watchdog hook (tests/support/watchdog.h, malld_fixture.cpp)
# kills the processes it started and removes its cgroups and temp dirs; then whatever is left of
# the group is killed.
stop_current_test() {
  [ -n "$current_pid" ] || return 0
  kill -ALRM "$current_pid" 2>/dev/null || true
  local waited=0
  while kill -0 "$current_pid" 2>/dev/null && [ $waited -lt 100 ]; do
    sleep 0.1
    waited=$((waited + 1))
  done
  kill -KILL -- "-$current_pid" 2>/dev/null || true
  wait "$current_pid" 2>/dev/null || true
  current_pid=""
}

cleanup() {
  stop_current_test
  [ -d "$build/bin" ] && kill_leftovers
  if [ -n "$restore_rnd_bits" ]; then
    echo "$restore_rnd_bits" > /proc/sys/vm/mmap_rnd_bits 2>/dev/null ||
      echo "$program: could not restore vm.mmap_rnd_bits=$restore_rnd_bits: run sysctl -w vm.mmap_rnd_bits=$restore_rnd_bits" >&2
    restore_rnd_bits=""
  fi
}
on_term() {
  cleanup
  watchdog_fired "$budget"
  exit 124
}
trap on_term TERM INT
trap cleanup EXIT

started=$(date +%s)
say() { echo "== run-tsan: $*"; }

# --- configure and build ----------------------------------------------------------------------------
selected_tests() {
  tests_table | while read -r group name timeout args; do
    if [[ " $groups " == *" $group "* ]]; then echo "$group $name $timeout $args"; fi
  done
}
targets=""
for g in $groups; do targets="$targets $(helpers_of "$g")"; done
targets="$targets $(selected_tests | awk '{print $2}')"
targets=$(echo "$targets" | tr ' ' '\n' | sed '/^$/d' | sort -u | tr '\n' ' ')

if [ $do_build = 1 ]; then
  say "configure ($build)"
  # Open MPI is required when the mpi group runs (a missing one fails here, not as a skipped
  # test); Slurm stays AUTO (malld's Slurm checks are built when libslurm is there, as in CI).
  with_mpi=AUTO
  [[ " $groups " == *" mpi "* ]] && with_mpi=ON
  cmake -G Ninja -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMALL_SANITIZE=thread \
        -DMALL_BUILD_TESTS=ON -DMALL_BUILD_EXAMPLES=ON -DMALL_BUILD_BENCHMARKS=OFF -DMALL_TEST_CODE_FLAGS=-O0 \
        -DMALL_WITH_SLURM=AUTO -DMALL_WITH_MPI=$with_mpi -DMALL_WITH_LIBTORCH=OFF \
        -DMALL_WITH_TENSORFLOW=OFF >/dev/null
elif [ ! -f "$build/CMakeCache.txt" ]; then
  echo "$program: --no-build, but $build is not a configured tree" >&2
  exit 1
fi
if ! grep -q '^MALL_SANITIZE:STRING=thread$' "$build/CMakeCache.txt"; then
  echo "$program: $build is not a ThreadSanitizer tree (MALL_SANITIZE is not 'thread')" >&2
  exit 1
fi
mkdir -p "$logs"
build_real=$(cd "$build" && pwd -P)  # as /proc/PID/exe names it
chmod 1777 "$logs"  # processes a test runs as another user write their reports here too
rm -f "$logs"/report.* "$logs"/*.log

# --- can TSan run here, and does it report? ------------------------------------------------------------
cxx=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt")
canary=$build/tsan-canary
"${cxx:-c++}" -fsanitize=thread -g -O1 -pthread "$here/canary.cpp" -o "$canary"
launcher=()
canary_reports() {  # the canary's TSan output, with the launcher given
  TSAN_OPTIONS="halt_on_error=1" "$@" "$canary" 2>&1 || true
}
canary_out=$(canary_reports)
if ! grep -q 'WARNING: ThreadSanitizer: data race' <<<"$canary_out"; then
  say "TSan did not run as it should: $(grep -m1 -E 'FATAL|ThreadSanitizer' <<<"$canary_out" || echo "${canary_out:0:200}")"
  arch=$(uname -m)
  if canary_out=$(canary_reports setarch "$arch" -R) && grep -q 'WARNING: ThreadSanitizer: data race' <<<"$canary_out"; then
    launcher=(setarch "$arch" -R)
    say "running every test under 'setarch $arch -R' (address randomisation off for the pass)"
  else
    bits=$(cat /proc/sys/vm/mmap_rnd_bits 2>/dev/null || echo "")
    if [ "$(id -u)" -eq 0 ] && [ -n "$bits" ] && [ "$bits" -gt 28 ] && echo 28 > /proc/sys/vm/mmap_rnd_bits 2>/dev/null; then
      restore_rnd_bits=$bits
      say "vm.mmap_rnd_bits lowered from $bits to 28 for the pass (restored at exit)"
      canary_out=$(canary_reports)
    fi
    if ! grep -q 'WARNING: ThreadSanitizer: data race' <<<"$canary_out"; then
      echo "$program: FAIL: ThreadSanitizer cannot run on this machine; the canary said:" >&2
      echo "$canary_out" | head -20 >&2
      echo "$program: try 'sysctl -w vm.mmap_rnd_bits=28' as root, or a kernel/libtsan pair that agree" >&2
      exit 1
    fi
  fi
fi

if [ $do_build = 1 ]; then
  say "build ($targets)"
  build_start=$(date +%s)
  # shellcheck disable=SC2086
  ninja -C "$build" -j "$jobs" $targets
  build_seconds=$(( $(date +%s) - build_start ))
  say "build took ${build_seconds} s"
fi

# --- the tests --------------------------------------------------------------------------------------
[ "$(id -u)" -eq 0 ] || say "note: not root: the malld and mpi groups' tests will say they skip and why"
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$here/suppressions.txt log_path=$logs/report${TSAN_OPTIONS:+ $TSAN_OPTIONS}"
# tests/expected-skips, when present: "<program> <Suite.Test glob> <why>" lines naming the skips
# this machine kind may have; under CI (CI=true) any other skip fails the pass.
expected_skip() {  # expected_skip PROGRAM SUITE.TEST
  local p glob
  [ -f "$repo/tests/expected-skips" ] || return 1
  while read -r p glob _; do
    { [ -z "$p" ] || [ "${p:0:1}" = "#" ]; } && continue
    # shellcheck disable=SC2053  # a glob match on purpose
    if [ "$p" = "$1" ] && [[ $2 == $glob ]]; then return 0; fi
  done <"$repo/tests/expected-skips"
  return 1
}

failed=()
mapfile -t plan < <(selected_tests)
tests_start=$(date +%s)
for entry in "${plan[@]}"; do
  read -r group name timeout args <<<"$entry"
  exe=$build/bin/$name
  if [ ! -x "$exe" ]; then
    echo "run-tsan: FAIL: $name: $exe was not built" >&2
    failed+=("$name")
    continue
  fi
  log=$logs/$name.log
  t0=$(date +%s)
  rc=0
  # In its own process group (timeout(1) makes one). A hang gets SIGALRM, the signal of the test
  # programs' own watchdog, so their clean-up hook runs; SIGKILL 30 s later if that hangs too.
  # shellcheck disable=SC2086
  "${launcher[@]}" timeout --signal=ALRM --kill-after=30 "$timeout" "$exe" $args </dev/null >"$log" 2>&1 &
  current_pid=$!
  wait "$current_pid" || rc=$?
  current_pid=""
  seconds=$(( $(date +%s) - t0 ))
  reports=$(ls "$logs"/report.* 2>/dev/null || true)
  if { [ "$rc" -eq 0 ] || [ "$rc" -eq 77 ]; } && [ -z "$reports" ]; then
    # 77: the program ran, and skipped some of its tests (mall's GoogleTest main exits so).
    skipped=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) tests\{0,1\}, listed below:$/\1/p' "$log" | tail -n 1)
    say "$group/$name: pass (${seconds} s${skipped:+; $skipped test(s) skipped, see below})"
    if [ -n "$skipped" ]; then
      skip_lines=$(grep -E '^\[  SKIPPED \] [A-Za-z_0-9]+\.' "$log" | sed -E 's/^\[  SKIPPED \] ([^ ]+).*/\1/' | sort -u)
      for test in $skip_lines; do
        # The reason: mall's "SKIPPED <program> <test>: <reason>" line, else gtest's message.
        reason=$(grep -m1 -E "^SKIPPED [^ ]+ $test: " "$log" | sed -E 's/^SKIPPED [^ ]+ [^ ]+: //' || true)
        [ -n "$reason" ] || reason=$(awk -v t="$test" '$0 == "[ RUN      ] " t { inside = 1; next }
            inside && next_is_reason { print; exit } inside && /: Skipped$/ { next_is_reason = 1 }' "$log")
        echo "   skipped: $name $test${reason:+: $reason}"
        if [ "${CI:-}" = true ] && ! expected_skip "$name" "$test"; then
          echo "run-tsan: FAIL: under CI every test of the pass must run; $name $test skipped" \
               "(tests/expected-skips does not name it)" >&2
          failed+=("$name")
        fi
      done
    fi
    continue
  fi
  failed+=("$name")
  if [ "$rc" -eq 124 ]; then
    echo "watchdog: $name still running after $timeout s; failing instead of hanging" >&2
  fi
  echo "run-tsan: FAIL: $group/$name (exit $rc, ${seconds} s); its output ($log), last lines:" >&2
  tail -n 40 "$log" >&2
  for report in $reports; do
    echo "---- ThreadSanitizer report from pid ${report##*.} ($report) ----" >&2
    cat "$report" >&2
    mv "$report" "$logs/$name.${report##*/}"  # kept, under the test's name
  done
  kill_leftovers
done
tests_seconds=$(( $(date +%s) - tests_start ))

total=$(( $(date +%s) - started ))
say "tests took ${tests_seconds} s; the pass ${total} s${build_seconds:+ (build ${build_seconds} s)}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "run-tsan: FAILED: $(printf '%s\n' "${failed[@]}" | sort -u | tr '\n' ' ')(reports and logs in $logs)" >&2
  exit 1
fi
say "no ThreadSanitizer report; all tests passed"
