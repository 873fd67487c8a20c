#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# run-tests.sh — the one test command, for users and CI alike: installs dependencies (apt),
# configures with Ninja into build/, builds with -j2, runs the whole ctest suite (unit,
# integration) and exits non-zero on any failure. Extra arguments go to ctest (e.g. -L unit);
# --configure-only, first, stops after the configure.
# Environment: MALL_BUILD_DIR (default <repo>/build), MALL_JOBS (default 2),
#              MALL_SANITIZE_PASS=1 also builds an ASan/UBSan tree (build-asan/) and runs the suite
#              there (malld, libmall and the tools all instrumented; CI sets it).
#              MALL_TSAN_PASS=1 (default: as MALL_SANITIZE_PASS) runs the thread-heavy tests under
#              ThreadSanitizer (tests/tsan/run-tsan.sh, tree build-tsan/).
#              MALL_FUZZ_PASS=1 (default: as MALL_SANITIZE_PASS) runs every libFuzzer target for
#              MALL_FUZZ_SECONDS (default 20) after the suite (tests/fuzz/run-fuzz.sh).
#              CI=true: a skipped test fails the run unless tests/expected-skips names it.
# A skipped test is never a passed one: ctest reports it "Skipped", and the run ends with the list of
# skipped tests and their reasons; a failed run, with each failed test's FAIL lines and last lines.
# The last lines give each phase's wall time (CI's budget).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${MALL_BUILD_DIR:-$repo/build}
# --configure-only (first argument): install the dependencies and configure the build folder as the
# test run does, then stop (whatever an earlier configure of that folder cached).
configure_only=0
if [ "${1:-}" = --configure-only ]; then configure_only=1; shift; fi
jobs=${MALL_JOBS:-2}

# Phase timing: phase NAME ends the phase before (its seconds kept for the summary) and starts NAME.
phase_names=() phase_seconds=() phase_name="" phase_start=$SECONDS
phase() {
  if [ -n "$phase_name" ]; then phase_names+=("$phase_name"); phase_seconds+=($((SECONDS - phase_start))); fi
  phase_name=$1 phase_start=$SECONDS
}
phase_summary() {
  phase ""
  local i line="== run-tests: times:"
  for i in "${!phase_names[@]}"; do line+=" ${phase_names[$i]} ${phase_seconds[$i]} s,"; done
  echo "$line total $SECONDS s"
}

phase dependencies
echo "== run-tests: dependencies"
"$repo/launch_scripts/install-deps.sh"

phase configure
echo "== run-tests: configure ($build)"
# install-deps.sh brought Slurm, Open MPI, libtorch and TensorFlow's wheel (in <repo>/.venv), so
# their parts are required (ON), not AUTO: a missing one fails here instead of silently dropping
# its tests.
# The venv's python is named outright: a build folder configured before the venv existed (the
# README's first command, demo.sh, on a fresh clone) cached an empty MALL_TENSORFLOW_PYTHON.
parts=(-DMALL_WITH_SLURM=ON -DMALL_WITH_MPI=ON -DMALL_WITH_LIBTORCH=ON -DMALL_WITH_TENSORFLOW=ON
       "-DMALL_TENSORFLOW_PYTHON=${MALL_TF_VENV:-$repo/.venv}/bin/python")
# The Debian 13 site tests run in one guest boot (ctest vm.site: site_malld, site_podman, site_slurm
# in turn), ~90 s less than a boot each (tests/vm/CMakeLists.txt).
cmake -G Ninja -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo "${parts[@]}" \
      -DMALL_SITE_TESTS_ONE_BOOT=ON >/dev/null

if [ "$configure_only" = 1 ]; then
  echo "== run-tests: configured $build (--configure-only)"
  exit 0
fi

phase build
echo "== run-tests: build"
ninja -C "$build" -j "$jobs"

if [ "$(id -u)" -ne 0 ]; then
  echo "run-tests: note: not root — tests that need root or a cpuset controller will say they skip and why"
fi

# Test cgroups present before this run (another run's, or an earlier crash's) are not ours to judge.
test_cgroups() { ls -d /sys/fs/cgroup/cpuset/mall_test_* /sys/fs/cgroup/cpuset/mall_unit_* 2>/dev/null || true; }
cgroups_before=$(test_cgroups)

# Skips: a GoogleTest program with a skipped test exits 77 and the shell tests exit 77 when they
# cannot run; ctest reports them "Skipped", never "Passed". Each writes its reasons to the skip log.
# report_skips lists every skipped test with its reasons; under CI (CI=true) a skip that
# tests/expected-skips does not name for this machine kind fails the run.
report_skips() { # report_skips CTEST_OUTPUT SKIP_LOG PASS_NAME: 0 unless CI must fail
  local output=$1 log=$2 pass=$3 name program reasons bad=0
  local skipped
  skipped=$(sed -n -E 's/.*Test +#[0-9]+: ([^ ]+) .*(\*\*\*Skipped|Not Run).*/\1/p' "$output")
  [ -z "$skipped" ] && return 0
  echo "== run-tests: skipped tests ($pass) — these did not run, or did not fully run:"
  for name in $skipped; do
    program=${name#*.}
    reasons=$(grep -E "^SKIPPED ($program|$name|test_$program\.sh) " "$log" 2>/dev/null | sed -E 's/^SKIPPED [^ ]+ //')
    [ -n "$reasons" ] || reasons="(no reason recorded; see the test's output in Testing/Temporary/LastTest.log)"
    echo "  $name"
    while IFS= read -r line; do
      if expected_skip "$program" "$line"; then
        echo "    $line   [expected on this machine kind: $(expected_skip_reason "$program" "$line")]"
      else
        echo "    $line"
        bad=1
      fi
    done <<<"$reasons"
  done
  if [ "${CI:-}" = true ] && [ $bad -ne 0 ]; then
    echo "run-tests: FAIL: under CI every test must run on this machine kind; the skips above that" \
         "tests/expected-skips does not name are failures" >&2
    return 1
  fi
  return 0
}
# tests/expected-skips: "<program> <Suite.Test glob> <why>" lines; a skip line "Suite.Test: reason".
expected_skip_entry() { # expected_skip_entry PROGRAM LINE: the matching entry, if any
  local program=$1 test=${2%%:*} p glob why
  while read -r p glob why; do
    [ -z "$p" ] || [ "${p:0:1}" = "#" ] && continue
    # shellcheck disable=SC2053  # glob match on purpose
    if [ "$p" = "$program" ] && [[ $test == $glob ]]; then echo "$why"; return 0; fi
  done <"$repo/tests/expected-skips"
  return 1
}
expected_skip() { expected_skip_entry "$1" "$2" >/dev/null; }
expected_skip_reason() { expected_skip_entry "$1" "$2"; }

phase ctest
echo "== run-tests: ctest"
status=0
skip_log=$build/Testing/mall-skips.log
mkdir -p "$build/Testing" && : >"$skip_log"
set +o pipefail
(cd "$build" && MALL_TEST_SKIP_LOG=$skip_log ctest --output-on-failure --timeout 600 "$@") | tee "$build/Testing/mall-ctest.log"
status=${PIPESTATUS[0]}
set -o pipefail
report_skips "$build/Testing/mall-ctest.log" "$skip_log" "main build" || status=1

if [ "${MALL_SANITIZE_PASS:-0}" = 1 ] && [ $status -eq 0 ]; then
  phase asan
  echo "== run-tests: the suite under ASan/UBSan (build-asan)"
  # What is tested is optimised (-O2 -g: ASan/UBSan find the same defects there, and stack traces
  # keep their lines with -g); the tests' own code is built at -O0 (MALL_TEST_CODE_FLAGS): at -O2,
  # GoogleTest's macros under ASan were two thirds of this tree's compile time.
  # Without TensorFlow there: g++'s UBSan rejects TensorFlow's headers and its libraries are not
  # instrumented (the TensorFlow tests run in the main pass).
  asan_parts=("${parts[@]/-DMALL_WITH_TENSORFLOW=ON/-DMALL_WITH_TENSORFLOW=OFF}")
  cmake -G Ninja -S "$repo" -B "$repo/build-asan" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DMALL_SANITIZE='address;undefined' -DMALL_BUILD_BENCHMARKS=OFF -DMALL_BUILD_EXAMPLES=OFF \
        -DMALL_TEST_CODE_FLAGS=-O0 \
        -DMALL_BUILD_MAN_PAGES=OFF \
        "${asan_parts[@]}" >/dev/null
  ninja -C "$repo/build-asan" -j "$jobs"
  # No man pages there (they come from the tools' --help, checked in the main pass; an instrumented
  # tool at build time would only add its exit-time leak check to the build).
  # Left out there: find_package (it links an uninstrumented consumer against the instrumented
  # library), the Python tests (an uninstrumented python3 cannot dlopen an instrumented libmall:
  # the ASan runtime must come first) and the system tests (Slurm's uninstrumented daemons would
  # load the instrumented plugin), soak, containers, and the vm tests (a second emulated boot would add
  # minutes for backend code the cgroup-v1 tests already run under ASan here), and the Debian
  # package's (label package: it builds a tree of its own, uninstrumented). The example trainers
  # are not built there (their Eigen kernels are the slowest part of the build), so the tests that
  # drive them (the examples', the MPI collective step's, bench_cosched, test_threads and the
  # trainer case of test_control_by_signal, named *TrainDigits*, left out by GTEST_FILTER) and the
  # mallsim run stay in the main pass: what they reach of libmall and malld runs under ASan in the
  # other tests. Eigen's own thread-pool test with parked pools (eigen_thread_pool_parked) builds
  # with plain g++ outside CMake, so it runs once, in the main pass.
  asan_skip_log=$repo/build-asan/Testing/mall-skips.log
  mkdir -p "$repo/build-asan/Testing" && : >"$asan_skip_log"
  set +o pipefail
  (cd "$repo/build-asan" && ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
     UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 MALL_TEST_SKIP_LOG=$asan_skip_log \
     GTEST_FILTER='-*TrainDigits*' \
     ctest --output-on-failure --timeout 600 -E 'find_package|python|example|collective_step|bench_cosched|mallsim|test_threads|eigen_thread_pool_parked' \
       -LE 'system|soak|vm|containers|package') |
    tee "$repo/build-asan/Testing/mall-ctest.log"
  asan_status=${PIPESTATUS[0]}
  set -o pipefail
  [ "$asan_status" -eq 0 ] || status=$asan_status
  report_skips "$repo/build-asan/Testing/mall-ctest.log" "$asan_skip_log" "ASan/UBSan" || status=1
fi

if [ "${MALL_TSAN_PASS:-${MALL_SANITIZE_PASS:-0}}" = 1 ]; then
  phase tsan
  echo "== run-tests: ThreadSanitizer (tests/tsan/run-tsan.sh: the pool, libmall's client threads, malld, the MPI step; tree build-tsan/)"
  "$repo/tests/tsan/run-tsan.sh" -j "$jobs" || status=1
fi

if [ "${MALL_FUZZ_PASS:-${MALL_SANITIZE_PASS:-0}}" = 1 ]; then
  phase fuzz
  echo "== run-tests: fuzzing (tests/fuzz/run-fuzz.sh: each parser ${MALL_FUZZ_SECONDS:-20} s under ASan/UBSan, clang tree build-fuzz/)"
  "$repo/tests/fuzz/run-fuzz.sh" --seconds "${MALL_FUZZ_SECONDS:-20}" --jobs "$jobs" || status=1
fi

leftover=$(comm -13 <(echo "$cgroups_before" | sort) <(test_cgroups | sort) | tr '\n' ' ')
if [ -n "$leftover" ]; then
  echo "run-tests: FAIL: tests left cgroups behind: $leftover" >&2
  status=1
fi

# The failed tests' own words last, where a CI log's tail shows them: ctest printed each failed
# test's whole output in the middle of the run; here its FAIL lines and its last lines again.
report_failures() { # report_failures CTEST_OUTPUT LAST_TEST_LOG
  local name
  for name in $(sed -n -E 's/^[[:space:]]*[0-9]+ - ([^ ]+) \((Failed|Timeout|SEGFAULT|Subprocess aborted|Exception|Child aborted)\).*/\1/p' "$1" 2>/dev/null); do
    echo "== run-tests: why $name failed (its FAIL lines, then its last lines; all of it in $2):"
    awk -v name="$name" '
      $0 ~ "^[0-9]+/[0-9]+ Testing: " name "$" { inside = 1; next }
      inside && $0 ~ "^\"" name "\" end time" { exit }
      inside { lines[n++] = $0 }
      END {
        shown = 0
        for (i = 0; i < n && shown < 20; i++) if (lines[i] ~ /FAIL|[Ff]ailure|Timeout|timed out/) { print "  " lines[i]; shown++ }
        print "  ..."
        for (i = (n > 15 ? n - 15 : 0); i < n; i++) print "  " lines[i]
      }' "$2"
  done
}
[ $status -eq 0 ] || report_failures "$build/Testing/mall-ctest.log" "$build/Testing/Temporary/LastTest.log"

phase_summary
if [ $status -eq 0 ]; then echo "== run-tests: all tests passed"; else echo "== run-tests: FAILED (status $status)" >&2; fi
exit $status
