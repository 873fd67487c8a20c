#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# run-eigen-pool-test.sh — Eigen's own thread-pool test (cxx11_tensor_thread_pool) with mall's
# parking under every pool it makes (eigen_thread_pool_parked.cpp says how). Eigen's test files
# come from Debian's eigen3 source package of the installed libeigen3-dev version, fetched with
# apt-get into BUILD_DIR/eigen-test (private package lists: the host's apt state is untouched) and
# kept there for later runs; the test is compiled with g++ and run with 3 repetitions. Fails (never
# skips) when the source cannot be fetched, the test does not build, or it fails.
# Usage: run-eigen-pool-test.sh REPO BUILD_DIR
set -euo pipefail
repo=$1
build=$2
. "$repo/tests/support/watchdog.sh"
fail() { echo "run-eigen-pool-test: FAIL: $*" >&2; exit 1; }

work=$build/eigen-test
version=$(dpkg-query -W -f='${Version}' libeigen3-dev 2>/dev/null) || fail "libeigen3-dev is not installed (launch_scripts/install-deps.sh)"
upstream=${version%-*}
source_dir=$work/eigen-$upstream
mkdir -p "$work"
if [ ! -f "$source_dir/unsupported/test/cxx11_tensor_thread_pool.cpp" ]; then
  echo "run-eigen-pool-test: fetching Debian's eigen3 $version source (Eigen's tests)"
  mkdir -p "$work/apt/lists/partial" "$work/apt/sources"
  suite=$(. /etc/os-release && echo "$VERSION_CODENAME")
  cat >"$work/apt/sources/eigen3-src.sources" <<SOURCES
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: $suite
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
  apt_options=(-q -o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$work/apt/sources"
               -o "Dir::State::Lists=$work/apt/lists" -o APT::Sandbox::User=root)
  watchdog_run 300 apt-get "${apt_options[@]}" update >"$work/apt/update.log" 2>&1 ||
    fail "apt-get update of the deb-src list failed: $(tail -n 3 "$work/apt/update.log")"
  (cd "$work" && watchdog_run 300 apt-get "${apt_options[@]}" source --download-only "eigen3=$version") \
    >"$work/apt/source.log" 2>&1 || fail "apt-get source eigen3=$version failed: $(tail -n 3 "$work/apt/source.log")"
  tar -xjf "$work/eigen3_$upstream.orig.tar.bz2" -C "$work" ||
    tar -xf "$work"/eigen3_"$upstream".orig.tar.* -C "$work" || fail "cannot unpack Eigen's source"
  [ -f "$source_dir/unsupported/test/cxx11_tensor_thread_pool.cpp" ] || fail "no cxx11_tensor_thread_pool.cpp in $source_dir"
fi

binary=$work/eigen_thread_pool_parked
sources=("$repo/tests/eigen/eigen_thread_pool_parked.cpp" "$repo/tests/eigen/once/main.h"
         "$repo/tf_integration/include/mall/tf/pool_parking.hpp"
         "$repo/tf_integration/include/mall/tf/detail/pool_parking_detail.hpp")
stale=0
[ -x "$binary" ] || stale=1
for f in "${sources[@]}"; do [ "$f" -nt "$binary" ] && stale=1; done
if [ $stale -eq 1 ]; then
  echo "run-eigen-pool-test: compiling Eigen's cxx11_tensor_thread_pool with parked pools (about 2 minutes)"
  watchdog_run 900 g++ -std=c++17 -O1 -DEIGEN_TEST_PART_ALL=1 -DEIGEN_TEST_MAX_SIZE=320 \
    -I "$repo/tests/eigen/once" -I "$source_dir" -I "$source_dir/unsupported" -I "$source_dir/test" \
    -I "$source_dir/unsupported/test" -I "$repo/tf_integration/include" \
    "$repo/tests/eigen/eigen_thread_pool_parked.cpp" -pthread -o "$binary.tmp" 2>"$work/compile.log" ||
    fail "the test did not build: $(grep -m 5 error "$work/compile.log")"
  mv "$binary.tmp" "$binary"
fi

out=$(watchdog_run 600 "$binary" r3 2>&1) || fail "Eigen's test failed (exit $?):
$out"
echo "$out"
pools=$(sed -n 's/^mall: \([0-9]*\) pools made, up to \([0-9]*\) workers parked in one$/\1 \2/p' <<<"$out")
read -r made parked <<<"$pools"
[ -n "$made" ] && [ "$made" -gt 0 ] && [ "$parked" -gt 0 ] || fail "the test made no parked pool: '$pools'"
echo "run-eigen-pool-test: PASS (Eigen's cxx11_tensor_thread_pool, $made pools, up to $parked workers parked)"
