#!/usr/bin/env bash
# run-tests.sh — the one test command, for users and CI alike: installs dependencies (apt),
# configures with Ninja into build/, builds with -j2, runs the whole ctest suite (unit,
# integration) and exits non-zero on any failure. Extra arguments go to ctest (e.g. -L unit).
# Environment: MALL_BUILD_DIR (default <repo>/build), MALL_JOBS (default 2),
#              MALL_SANITIZE_PASS=1 also builds an ASan/UBSan tree (build-asan/) and runs the suite
#              there (malld, libmall and the tools all instrumented; CI sets it).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${MALL_BUILD_DIR:-$repo/build}
jobs=${MALL_JOBS:-2}

echo "== run-tests: dependencies"
"$repo/launch_scripts/install-deps.sh"

echo "== run-tests: configure ($build)"
# install-deps.sh brought Slurm, Open MPI and libtorch, so their parts are required (ON), not AUTO:
# a missing one fails here instead of silently dropping its tests.
parts=(-DMALL_WITH_SLURM=ON -DMALL_WITH_MPI=ON -DMALL_WITH_LIBTORCH=ON)
cmake -G Ninja -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo "${parts[@]}" >/dev/null

echo "== run-tests: build"
ninja -C "$build" -j "$jobs"

if [ "$(id -u)" -ne 0 ]; then
  echo "run-tests: note: not root — tests that need root or a cpuset controller will say they skip and why"
fi

# Test cgroups present before this run (another run's, or an earlier crash's) are not ours to judge.
test_cgroups() { ls -d /sys/fs/cgroup/cpuset/mall_test_* /sys/fs/cgroup/cpuset/mall_unit_* 2>/dev/null || true; }
cgroups_before=$(test_cgroups)

echo "== run-tests: ctest"
status=0
(cd "$build" && ctest --output-on-failure --timeout 600 "$@") || status=$?

if [ "${MALL_SANITIZE_PASS:-0}" = 1 ] && [ $status -eq 0 ]; then
  echo "== run-tests: the suite under ASan/UBSan (build-asan)"
  # Optimised (-O2 -g): the Eigen kernels of the examples are ~50x slower at -O0, and ASan/UBSan
  # find the same defects at -O2 (stack traces keep their lines with -g).
  cmake -G Ninja -S "$repo" -B "$repo/build-asan" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DMALL_SANITIZE='address;undefined' -DMALL_BUILD_BENCHMARKS=OFF "${parts[@]}" >/dev/null
  ninja -C "$repo/build-asan" -j "$jobs"
  # Left out there: find_package (it links an uninstrumented consumer against the instrumented
  # library), the Python tests (an uninstrumented python3 cannot dlopen an instrumented libmall:
  # the ASan runtime must come first) and the system tests (Slurm's uninstrumented daemons would
  # load the instrumented plugin).
  (cd "$repo/build-asan" && ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
     UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
     ctest --output-on-failure --timeout 600 -E 'find_package|python' -LE system) || status=$?
fi

leftover=$(comm -13 <(echo "$cgroups_before" | sort) <(test_cgroups | sort) | tr '\n' ' ')
if [ -n "$leftover" ]; then
  echo "run-tests: FAIL: tests left cgroups behind: $leftover" >&2
  status=1
fi

if [ $status -eq 0 ]; then echo "== run-tests: all tests passed"; else echo "== run-tests: FAILED (status $status)" >&2; fi
exit $status
