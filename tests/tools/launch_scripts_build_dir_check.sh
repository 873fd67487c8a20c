#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# launch_scripts_build_dir_check.sh — one convention for naming the build tree in every launch
# script (issue 30): each script that uses a build tree reads $MALL_BUILD_DIR (default <repo>/build),
# and the scripts that also take --build-dir let the option win. Checks the sources for the first
# and, as a user runs them, soak.sh (which once read only --build-dir) and bench-pool.sh: a missing
# folder named either way is refused with words that name it, before anything starts.
# Usage: launch_scripts_build_dir_check.sh REPO
set -euo pipefail
repo=${1:?usage: launch_scripts_build_dir_check.sh REPO}
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

checked=0
for script in "$repo"/launch_scripts/*.sh; do
  grep -q -E '\$\{?build\b' "$script" || continue
  checked=$((checked + 1))
  grep -q -E '^build=\$\{MALL_BUILD_DIR:-' "$script" ||
    fail "$(basename "$script") uses a build tree but does not read \$MALL_BUILD_DIR (build=\${MALL_BUILD_DIR:-\$repo/build})"
done
[ "$checked" -ge 10 ] || fail "only $checked launch scripts use a build tree: the check no longer sees them"
echo "$checked launch scripts read \$MALL_BUILD_DIR"

missing=$(mktemp -u /tmp/mall-no-build.XXXXXX)
expect_refused() { # expect_refused WHAT STATUS TEXT ENV... : exit STATUS, TEXT in its words
  local what=$1 want=$2 text=$3 out status; shift 3
  set +e
  out=$(env "$@" 2>&1 </dev/null)
  status=$?
  set -e
  [ "$status" -eq "$want" ] || fail "$what: exit $status, not $want: $out"
  grep -q -F -- "$text" <<<"$out" || fail "$what: the words do not say \"$text\": $out"
}
expect_refused "soak.sh with MALL_BUILD_DIR" 2 "'$missing' does not exist" MALL_BUILD_DIR="$missing" \
  "$repo/launch_scripts/soak.sh" --minutes 0.1
expect_refused "soak.sh --build-dir over MALL_BUILD_DIR" 2 "'$missing-option' does not exist" MALL_BUILD_DIR="$repo" \
  "$repo/launch_scripts/soak.sh" --build-dir "$missing-option" --minutes 0.1
expect_refused "bench-pool.sh --build-dir over MALL_BUILD_DIR" 1 "$missing/bin/tf_bench_pool is missing" \
  MALL_BUILD_DIR="$repo" "$repo/launch_scripts/bench-pool.sh" --build-dir "$missing"
expect_refused "bench-pool.sh with MALL_BUILD_DIR" 1 "$missing/bin/tf_bench_pool is missing" \
  MALL_BUILD_DIR="$missing" "$repo/launch_scripts/bench-pool.sh"

if [ "$failures" -ne 0 ]; then echo "launch_scripts_build_dir_check: $failures failure(s)" >&2; exit 1; fi
echo "launch_scripts_build_dir_check: passed"
