# SPDX-License-Identifier: BSD-3-Clause
# watchdog.sh — the shell tests' watchdog (the C and C++ programs have support/watchdog.h), sourced
# by tests/system/*.sh and tests/tools/*.sh: a hang fails with timeout(1)'s status 124 and a line
# saying what hung, instead of stalling CI. ctest's TIMEOUT stays the outer bound.

# watchdog_run SECONDS CMD...: runs CMD bounded by SECONDS; returns its status, or 124 after
# "watchdog: CMD still running after SECONDS s; failing instead of hanging" on stderr.
# (A process the test signals itself must be timeout(1) directly: a function run with & is a
# subshell, and a TERM to it would not reach CMD.)
watchdog_run() {
  local seconds=$1 rc=0
  shift
  timeout "$seconds" "$@" || rc=$?
  if [ "$rc" -eq 124 ]; then
    echo "watchdog: $(basename "$1") still running after $seconds s; failing instead of hanging" >&2
  fi
  return "$rc"
}

# watchdog_script SECONDS "$@": re-runs the calling script ("$0" "$@") once under timeout(1), so it
# gets a SIGTERM after SECONDS (its TERM trap cleans up and calls watchdog_fired) and a SIGKILL 60 s
# later. Call it first; in the re-run it returns at once.
watchdog_script() {
  local seconds=$1
  shift
  if [ "${MALL_UNDER_WATCHDOG:-}" != "$0" ]; then
    MALL_UNDER_WATCHDOG=$0 exec timeout --kill-after=60 "$seconds" "$0" "$@"
  fi
}

# watchdog_fired SECONDS: the FAIL line a script's TERM trap prints (on stdout, with its PASS/FAIL lines).
watchdog_fired() {
  echo "FAIL: watchdog: $(basename "$0") still running after $1 s (or was terminated); failing instead of hanging"
}
