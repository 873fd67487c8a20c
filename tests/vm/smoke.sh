#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# smoke.sh — ctest's driver for run-in-vm.sh itself (tests vm.smoke and vm.cleanup).
#   smoke:   one boot runs check-cgroup2.sh (must pass), then again with a wrong expectation
#            (must fail naming it), writes to stdout and stderr and exits 3: run-in-vm.sh must
#            exit 3 with each stream on its own side, no kernel noise, no temp files left. It runs
#            from a folder under /tmp (the guest's own /tmp), which must be seen and written
#            through (a clone under /tmp once failed every vm test), and --visible /proc/1 must be
#            refused with words before any boot.
#   cleanup: --timeout 5 on a command that sleeps must exit 124 saying TIMEOUT; SIGTERM during a
#            boot must end the run with 143; neither may leave qemu or temp files behind.
# Usage: smoke.sh smoke|cleanup --work-dir DIR [--bin-dir DIR]. Exit 0 pass, 1 fail, 77 skip
# (run-in-vm.sh cannot run here: its reason is printed).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
run=$here/run-in-vm.sh
mode=${1-}
shift || true
work="" bin=""
while [ $# -gt 0 ]; do
  case $1 in
    --work-dir) work=$2; shift 2 ;;
    --bin-dir) bin=$2; shift 2 ;;
    *) echo "usage: smoke.sh smoke|cleanup --work-dir DIR [--bin-dir DIR]" >&2; exit 2 ;;
  esac
done
[ -n "$work" ] || { echo "smoke.sh: --work-dir is required" >&2; exit 2; }

priv=$(mktemp -d "${TMPDIR:-/tmp}/vm-smoke.XXXXXX")
trap 'rm -rf -- "$priv"' EXIT
runtmp=$priv/tmp   # run-in-vm.sh's TMPDIR: must be empty after each run
mkdir "$runtmp"
failures=0
pass() { echo "smoke: ok   $*"; }
fail() { echo "smoke: FAIL $*" >&2; failures=$((failures + 1)); }
show() { # $1 = label, $2 = file
  echo "----- $1 -----"; cat "$2"; echo "----- end of $1 -----"
}
nothing_left() { # no temp file and no process of the run (qemu's arguments name its temp dir)
  local left procs
  left=$(find "$runtmp" -mindepth 1 -maxdepth 1 2>/dev/null | head -5)
  if [ -z "$left" ]; then pass "no temp files left"; else fail "temp files left: $left"; fi
  procs=$(pgrep -af -- "$runtmp" || true)
  if [ -z "$procs" ]; then pass "no process of the run left"; else fail "processes left: $procs"; fi
}
skip_if_77() { # $1 = rc, $2 = stderr file
  if [ "$1" = 77 ] && grep -q 'SKIP:' "$2"; then cat "$2" >&2; exit 77; fi
}

case $mode in
smoke)
  [ -n "$bin" ] || { echo "smoke.sh: smoke needs --bin-dir" >&2; exit 2; }
  # shellcheck disable=SC2016 # expanded by the guest's bash
  guest='check=$1
"$check" || { echo "vm-smoke: check-cgroup2.sh failed (above)" >&2; exit 10; }
if "$check" --cpus 3 > /tmp/neg.out 2>&1; then
  echo "vm-smoke: check-cgroup2.sh --cpus 3 passed: it cannot fail" >&2; exit 11
fi
if ! grep -q "^FAIL nproc" /tmp/neg.out; then
  echo "vm-smoke: check-cgroup2.sh --cpus 3 failed without naming nproc:" >&2; cat /tmp/neg.out >&2; exit 12
fi
echo "vm-smoke: check-cgroup2.sh --cpus 3 fails as it must: $(grep "^FAIL nproc" /tmp/neg.out)"
[ "$(cat marker 2>/dev/null)" = host-wrote-this ] || { echo "vm-smoke: the current directory $PWD is not the one on the host" >&2; exit 13; }
echo guest-wrote-this > from-guest || exit 14
echo "vm-smoke: the host folder $PWD (under /tmp) is seen and written in the guest"
echo "vm-smoke: in $PWD as $(id -un), /work on $(stat -f -c %T /work), cpu: $(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2)"
echo "vm-smoke: this line goes to stderr" >&2
exit 3'
  # A folder under /tmp as the current directory (priv is under ${TMPDIR:-/tmp}).
  mkdir "$priv/cwd" && echo host-wrote-this > "$priv/cwd/marker"
  set +e
  TMPDIR=$runtmp "$run" --visible /proc/1 --work-dir "$work" -- true > "$priv/refused.out" 2>&1
  refused_rc=$?
  # --timeout below ctest's TIMEOUT (300): a hung guest ends here with 124 and its serial log.
  (cd "$priv/cwd" && TMPDIR=$runtmp "$run" --timing --timeout 240 --work-dir "$work" --env "MALL_BIN_DIR=$bin" \
     --visible "$here" --visible "$bin" -- bash -c "$guest" vm-smoke "$here/check-cgroup2.sh") > "$priv/out" 2> "$priv/err"
  rc=$?
  set -e
  if [ "$refused_rc" = 125 ] && grep -q -- '--visible /proc/1 cannot be seen in the guest' "$priv/refused.out"; then
    pass "--visible /proc/1 is refused before a boot: $(head -n1 "$priv/refused.out")"
  else fail "--visible /proc/1: exit $refused_rc, $(cat "$priv/refused.out")"; fi
  skip_if_77 "$rc" "$priv/err"
  show "the guest's stdout" "$priv/out"
  show "stderr (the guest's, then run-in-vm.sh's)" "$priv/err"
  if [ "$rc" = 3 ]; then pass "run-in-vm.sh exits with the command's status (3)"; else fail "run-in-vm.sh exited $rc, not 3"; fi
  if grep -q '^check-cgroup2: all [0-9]* checks passed' "$priv/out"; then pass "check-cgroup2.sh passed in the guest"
  else fail "check-cgroup2.sh did not pass in the guest"; fi
  if grep -q '^vm-smoke: check-cgroup2.sh --cpus 3 fails as it must' "$priv/out"; then
    pass "check-cgroup2.sh fails on a wrong expectation"
  else fail "the negative run of check-cgroup2.sh did not behave"; fi
  if grep -q '^vm-smoke: this line goes to stderr$' "$priv/err" && ! grep -q 'goes to stderr' "$priv/out"; then
    pass "the guest's stderr arrives on stderr, not on stdout"
  else fail "the guest's stderr did not arrive apart from stdout"; fi
  if grep -qE '^\[ *[0-9]+\.[0-9]+\]|Linux version|Kernel panic' "$priv/out"; then
    fail "kernel messages in the command's stdout"
  else pass "no kernel messages in the command's stdout"; fi
  if grep -q "^vm-smoke: the host folder .* is seen and written in the guest" "$priv/out" &&
     [ "$(cat "$priv/cwd/from-guest" 2>/dev/null)" = guest-wrote-this ]; then
    pass "a current directory under /tmp is the host's in the guest, both ways"
  else fail "the current directory under /tmp ($priv/cwd) was not shared with the guest"; fi
  if grep -q '^run-in-vm.sh: timing:' "$priv/err"; then pass "timing: $(grep '^run-in-vm.sh: timing:' "$priv/err" | cut -d: -f3-)"
  else fail "no timing line"; fi
  nothing_left
  ;;
cleanup)
  set +e
  start=$SECONDS
  TMPDIR=$runtmp "$run" --timeout 5 --work-dir "$work" -- sleep 600 > "$priv/out" 2> "$priv/err"
  rc=$?
  set -e
  skip_if_77 "$rc" "$priv/err"
  if [ "$rc" = 124 ]; then pass "--timeout 5: exit 124 after $((SECONDS - start)) s"; else show stderr "$priv/err"; fail "--timeout 5 exited $rc, not 124"; fi
  if grep -q 'TIMEOUT after 5s' "$priv/err"; then pass "--timeout says TIMEOUT"; else fail "no TIMEOUT message"; fi
  nothing_left
  # SIGTERM while the guest boots: qemu killed, temp dir removed, the script ends by SIGTERM.
  TMPDIR=$runtmp "$run" --timeout 60 --work-dir "$work" -- sleep 600 > "$priv/out" 2> "$priv/err" &
  pid=$!
  for _ in $(seq 50); do pgrep -f -- "$runtmp" | grep -qv "^$pid\$" && break; sleep 0.1; done
  sleep 2
  kill -TERM "$pid"
  set +e; wait "$pid"; rc=$?; set -e
  if [ "$rc" = 143 ]; then pass "SIGTERM: exit 143"; else show stderr "$priv/err"; fail "SIGTERM: exit $rc, not 143"; fi
  if grep -q 'SIGTERM: killing the guest' "$priv/err"; then pass "SIGTERM says so"; else fail "no SIGTERM message"; fi
  nothing_left
  ;;
*) echo "usage: smoke.sh smoke|cleanup --work-dir DIR [--bin-dir DIR]" >&2; exit 2 ;;
esac

if [ "$failures" -gt 0 ]; then echo "smoke: $failures check(s) failed" >&2; exit 1; fi
echo "smoke: all passed"
