#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# run-programs.sh — runs test programs one after another inside the cgroup-v2 guest (one boot for
# all of them) and fails when any fails. Each word is a program path, optionally followed by its
# arguments after a ':' (e.g. "/b/test_backend:--gtest_filter=-*CgroupV1*"). A program that skips
# (exit 77) counts as a failure here: the guest exists so that the cgroup-v2 cases run, and a skip
# inside it means they did not. Prints one summary line per program.
set -uo pipefail

failed=()
for spec in "$@"; do
  program=${spec%%:*}
  args=()
  if [ "$spec" != "$program" ]; then
    IFS=' ' read -r -a args <<<"${spec#*:}"
  fi
  name=$(basename "$program")
  echo "== vm: $name ${args[*]:-}"
  "$program" "${args[@]}"
  rc=$?
  case $rc in
    0) echo "== vm: $name passed" ;;
    77) echo "== vm: $name SKIPPED inside the guest (counted as a failure: the guest has cgroup v2 + cpuset, so nothing may skip)"; failed+=("$name(skipped)") ;;
    *) echo "== vm: $name FAILED (exit $rc)"; failed+=("$name(exit $rc)") ;;
  esac
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "== vm: failed: ${failed[*]}"
  exit 1
fi
echo "== vm: all ${#} programs passed"
