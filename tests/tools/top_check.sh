#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# top_check.sh — proves `mallctl top` in a real terminal: a private tmux server runs it against a
# private malld (affinity backend, cpus 0-1, no root) with two jobs under mallrun; each frame's
# header, cpu counts and core bars are compared with `mallctl status --json`; the keys sort,
# reverse and show help; a thread count set by the admin, a job that ends and a malld that dies
# show up while top keeps running; q, Ctrl-C, SIGTERM and a crash give the terminal back (canonical mode,
# main screen, cursor shown). Without a tty: --once/--batch print plain frames (no escape byte);
# bad options exit 2 with words; a dead socket exits 3.
# Usage: top_check.sh BIN_DIR     (exit 0 pass, 1 fail, 77 skip: tmux or jq missing)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/../support/watchdog.sh"
timeout_s=240
watchdog_script "$timeout_s" "$@"   # a hang anywhere fails the test (the TERM trap below cleans up)

BIN=$(cd "${1:?usage: top_check.sh BIN_DIR}" && pwd)
for tool in tmux jq; do
  if ! command -v "$tool" >/dev/null; then
    why="$tool is missing; install it (apt-get install $tool)"
    [ -n "${MALL_TEST_SKIP_LOG:-}" ] && echo "SKIPPED top_check $why" >>"$MALL_TEST_SKIP_LOG"
    echo "top_check: SKIP: $why" >&2
    exit 77
  fi
done

for v in $(compgen -e); do case $v in MALL_*) unset "$v" ;; esac; done
export LC_ALL=C.UTF-8
tmp=$(mktemp -d /tmp/mall-top-check.XXXXXX)
SOCK=$tmp/malld.sock
TMUX_CMD=(tmux -u -S "$tmp/tmux.sock" -f /dev/null)  # a private server; its socket goes with $tmp
malld_pid="" alpha_pid="" beta_pid=""

# alive PID: the process exists and is not a zombie waiting to be reaped.
alive() { [ -e "/proc/$1" ] && ! grep -qE '^[0-9]+ \(.*\) Z' "/proc/$1/stat" 2>/dev/null; }
cleanup() {
  "${TMUX_CMD[@]}" kill-server 2>/dev/null || true
  local pid
  for pid in $alpha_pid $beta_pid $malld_pid; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in $alpha_pid $beta_pid $malld_pid; do
    for _ in $(seq 50); do alive "$pid" || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'watchdog_fired "$timeout_s"; exit 1' TERM

fail() {
  echo "top_check: FAIL: $*" >&2
  if "${TMUX_CMD[@]}" has-session 2>/dev/null; then
    echo "--- the pane:" >&2
    "${TMUX_CMD[@]}" capture-pane -p -t top >&2 || true
  fi
  exit 1
}
mallctl() { watchdog_run 30 "$BIN/mallctl" --socket "$SOCK" "$@"; }
status_json() { mallctl status --json; }
pane() { "${TMUX_CMD[@]}" capture-pane -p -t top; }
show_pane() { pane | cat -s; }  # for the log: runs of blank lines squeezed
pane_format() { "${TMUX_CMD[@]}" display-message -p -t top "$1"; }
keys() { "${TMUX_CMD[@]}" send-keys -t top "$@"; }

# wait_for SECONDS WHAT CMD...: runs CMD every 0.2 s until it succeeds; fails with WHAT after SECONDS.
wait_for() {
  local seconds=$1 what=$2 deadline
  shift 2
  deadline=$((SECONDS + seconds))
  until "$@"; do
    [ "$SECONDS" -lt "$deadline" ] || fail "timed out after ${seconds}s waiting for $what$(cat "$tmp/why" 2>/dev/null)"
    sleep 0.2
  done
}
pane_has() { pane | grep -qE -- "$1"; }
pane_lacks() { ! pane | grep -qE -- "$1"; }
# The pane's line number of a job's row (0 when absent).
row_of() { pane | awk -v job="$1" '$1 == job {print NR; found = 1; exit} END {if (!found) print 0}'; }

# "0-2,5" -> "0 1 2 5"
expand_cpus() {
  local item out=() items
  IFS=, read -ra items <<<"$1"
  for item in "${items[@]}"; do
    if [[ $item == *-* ]]; then out+=($(seq "${item%-*}" "${item#*-}")); else out+=("$item"); fi
  done
  echo "${out[*]}"
}

# mismatch WORDS: why a check failed, for wait_for's message.
mismatch() { echo " (last seen: $*)" >"$tmp/why"; return 1; }
# Every job's row agrees with malld's status: its count/min-max, a bar with '#' exactly at its cpus
# (one cell per cpu of the pool), its threads, an ack latency, a lent figure. Else mismatch says how.
rows_match_status() {
  local status screen pool job ncpus min max cpus threads row bar want cpu held
  rm -f "$tmp/why"
  status=$(status_json) || { mismatch "mallctl status --json failed"; return 1; }
  screen=$(pane)
  pool=$(jq -r .pool <<<"$status")
  while IFS=$'\t' read -r job ncpus min max cpus threads; do
    row=$(awk -v job="$job" '$1 == job' <<<"$screen")
    [ -n "$row" ] || { mismatch "no row for $job"; return 1; }
    set -- $row
    [ "$3" = "$ncpus/$min-$max" ] || { mismatch "$job: CPUS '$3', status says $ncpus/$min-$max"; return 1; }
    want=""
    for cpu in $(expand_cpus "$pool"); do
      held=.
      for c in $(expand_cpus "$cpus"); do [ "$c" = "$cpu" ] && held='#'; done
      want+=$held
    done
    [ "$4" = "$want" ] || { mismatch "$job: bar '$4', cpus $cpus of pool $pool want '$want'"; return 1; }
    [ "$5" = "$threads" ] || { mismatch "$job: THREADS '$5', status says $threads"; return 1; }
    [[ $6 =~ ^(-|[0-9.]+(µs|ms|s))$ ]] || { mismatch "$job: ACK '$6' is not a latency"; return 1; }
    [[ $7 =~ ^[0-9]+\.[0-9]$ ]] || { mismatch "$job: LENT-S '$7' is not a figure"; return 1; }
  done < <(jq -r '.jobs[] | [.job, .ncpus, .min, .max, .cpus, .active_threads] | @tsv' <<<"$status")
  return 0
}
settled() {
  status_json | jq -e --argjson n "$1" '(.jobs | length) == $n and all(.jobs[]; .state == "settled")' >/dev/null
}

# --- without a terminal: usage errors and a dead socket, before any malld exists --------------
expect_exit() {  # expect_exit CODE WORDS ARGS...: exits CODE with WORDS on stderr, nothing on stdout
  local code=$1 words=$2 rc=0
  shift 2
  mallctl top "$@" >"$tmp/out" 2>"$tmp/err" || rc=$?
  [ "$rc" -eq "$code" ] || fail "mallctl top $*: exit $rc, expected $code (stderr: $(cat "$tmp/err"))"
  grep -q -- "$words" "$tmp/err" || fail "mallctl top $*: stderr lacks '$words': $(cat "$tmp/err")"
  [ ! -s "$tmp/out" ] || fail "mallctl top $*: printed on stdout: $(cat "$tmp/out")"
}
expect_exit 2 "--interval must be" --interval 0
expect_exit 2 "--interval must be" --interval 61
expect_exit 2 "--interval must be" --interval abc
expect_exit 2 "--batch must be" --batch 0
expect_exit 2 "--sort takes" --sort size
expect_exit 2 "not both" --once --batch 2
expect_exit 2 "unrecognised option\|unrecognized option" --bogus
expect_exit 3 "cannot connect to malld" --once
expect_exit 3 "cannot connect to malld" --batch 2 --interval 0.2
echo "top_check: ok: bad options exit 2 with words, a dead socket exits 3"

# --- a private malld and two jobs ------------------------------------------------------------
"$BIN/malld" --socket "$SOCK" --state-dir "$tmp" --backend affinity --cpus 0-1 --log-level warn >"$tmp/malld.log" 2>&1 &
malld_pid=$!
wait_for 20 "malld to serve at $SOCK" eval 'mallctl status >/dev/null 2>&1'
client=("$BIN/mall_test_client" --threads 2 --step-us 2000 --duration-s 120)
"$BIN/mallrun" --socket "$SOCK" --malleable=1:2 --job alpha -- "${client[@]}" >"$tmp/alpha.log" 2>&1 &
alpha_pid=$!
"$BIN/mallrun" --socket "$SOCK" --malleable=1:2 --job beta -- "${client[@]}" >"$tmp/beta.log" 2>&1 &
beta_pid=$!
wait_for 30 "both jobs registered and settled" settled 2
client_pids=$(status_json | jq -r '.jobs[].pids[]')  # the teardown checks they are gone

# --- plain frames (stdout is a file here) ----------------------------------------------------
mallctl top --once >"$tmp/once" 2>"$tmp/err" || fail "top --once exited $?: $(cat "$tmp/err")"
! grep -qP '\x1b' "$tmp/once" || fail "top --once wrote escape bytes: $(od -c "$tmp/once" | head)"
grep -qE '^mall top — .* — [0-9]{2}:[0-9]{2}:[0-9]{2} +malld [0-9.]+, policy equal, backend affinity$' "$tmp/once" ||
  fail "top --once: no header line: $(cat "$tmp/once")"
grep -qE '^POOL 0-1 \(2 cpus\)  FREE [0-9]+  RECLAIMED [0-9]+  JOBS 2  ENDED 0  LENT core-s total [0-9]+\.[0-9]$' "$tmp/once" ||
  fail "top --once: no pool line: $(cat "$tmp/once")"
grep -qE '^JOB +UID +CPUS +CORES +THREADS +ACK +LENT-S +STATE$' "$tmp/once" || fail "top --once: no table header: $(cat "$tmp/once")"
[ "$(awk '$1 == "alpha" || $1 == "beta"' "$tmp/once" | wc -l)" -eq 2 ] || fail "top --once: not one row per job: $(cat "$tmp/once")"
mallctl top >"$tmp/piped" 2>&1 || fail "top with stdout not a terminal exited $?"
[ "$(grep -c '^mall top' "$tmp/piped")" -eq 1 ] && ! grep -qP '\x1b' "$tmp/piped" ||
  fail "top with stdout not a terminal: expected one plain frame: $(cat "$tmp/piped")"
mallctl top --batch 3 --interval 0.2 >"$tmp/batch" || fail "top --batch 3 exited $?"
[ "$(grep -c '^mall top' "$tmp/batch")" -eq 3 ] && [ "$(grep -c '^$' "$tmp/batch")" -eq 5 ] && ! grep -qP '\x1b' "$tmp/batch" ||
  fail "top --batch 3: expected 3 plain frames separated by blank lines: $(cat "$tmp/batch")"
echo "top_check: ok: --once, a pipe and --batch print plain frames"
cat "$tmp/once"

# --- the live view in a real terminal --------------------------------------------------------
# The pane runs top, then shows how it left the terminal; sh's INT trap keeps it alive for Ctrl-C.
cat >"$tmp/pane.sh" <<EOF
#!/bin/sh
trap : INT
ulimit -c 0  # the crash check leaves no core file
"$BIN/mallctl" --socket "$SOCK" top
echo "EXITED:\$?"
stty -a | tr ' ;' '\n\n' | grep -x -- '-\{0,1\}icanon' | sed 's/^/MODE:/'
sleep 120
EOF
chmod +x "$tmp/pane.sh"
start_pane() {  # start_pane WHAT CMD...: a new session "top" running pane.sh; waits for CMD
  "${TMUX_CMD[@]}" new-session -d -s top -x 120 -y 30 "$tmp/pane.sh"
  wait_for 10 "$@"
}
start_pane "top to show both jobs" eval 'pane_has "^alpha " && pane_has "^beta "'
[ "$(pane_format '#{alternate_on}#{cursor_flag}')" = 10 ] || fail "while running: expected the alternate screen, cursor hidden"
pane | head -1 | grep -qE '^mall top — .* malld [0-9.]+, policy equal, backend affinity$' || fail "live header"
pane_has '^POOL 0-1 \(2 cpus\)  FREE [0-9]+  RECLAIMED [0-9]+  JOBS 2  ENDED 0  LENT core-s total [0-9.]+$' || fail "live pool line"
wait_for 10 "every row to agree with mallctl status --json" rows_match_status
pane | tail -1 | grep -q '^sort: name   (s sort, r reverse, h keys, q quit)' || fail "footer: sort by name and the keys"
[ "$(row_of alpha)" -lt "$(row_of beta)" ] || fail "sort by name: alpha should come before beta"
echo "top_check: ok: the live frame agrees with status --json"
show_pane

# Keys: r reverses, s cycles the sort, h shows the keys.
keys r
wait_for 5 "the footer to say reversed" eval 'pane | tail -1 | grep -q "^sort: name, reversed"'
[ "$(row_of beta)" -lt "$(row_of alpha)" ] || fail "reversed sort by name: beta should come before alpha"
keys r
wait_for 5 "the footer to drop reversed" eval 'pane | tail -1 | grep -q "^sort: name  "'
[ "$(row_of alpha)" -lt "$(row_of beta)" ] || fail "sort by name again: alpha should come before beta"
for key in cpus lent ack name; do
  keys s
  wait_for 5 "s to sort by $key" eval "pane | tail -1 | grep -q '^sort: $key  '"
done
keys h
wait_for 5 "h to show the keys" eval 'pane | tail -1 | grep -q "^keys: q or Ctrl-C quit, s next sort"'
keys h
wait_for 5 "h again to hide the keys" eval 'pane | tail -1 | grep -q "^sort: name  "'
echo "top_check: ok: keys r, s and h"

# A smaller terminal (SIGWINCH): lines cut at its width (the footer, 47 columns, would wrap on the
# last row and scroll the header away), the rows that do not fit counted.
"${TMUX_CMD[@]}" resize-window -t top -x 40 -y 6
wait_for 5 "a 6-line terminal to show '… 2 more'" pane_has '^… 2 more$'
while IFS= read -r line; do  # ${#line} counts characters (a UTF-8 locale), as the terminal does
  [ "${#line}" -le 40 ] || fail "a line is wider than the 40-column terminal: $line"
done < <(pane)
pane | head -1 | grep -qE '^mall top — .{25,}$' || fail "the first line should be the header, cut at 40 columns"
pane | tail -1 | grep -q '^sort: name  ' || fail "the last line should be the footer, cut at 40 columns"
show_pane
"${TMUX_CMD[@]}" resize-window -t top -x 120 -y 30
wait_for 5 "both rows back in a 30-line terminal" eval 'pane_has "^alpha " && pane_has "^beta " && pane_lacks "more\$"'
echo "top_check: ok: a resize cuts the lines and counts the rows left out"

# A job that ends vanishes; alpha grows to both cpus and lends; the admin's thread count shows.
kill -TERM "$beta_pid"
wait "$beta_pid" 2>/dev/null || true
beta_pid=""
wait_for 10 "beta's row to vanish" pane_lacks '^beta '
wait_for 10 "JOBS 1 and ENDED 1" pane_has 'JOBS 1  ENDED 1'
wait_for 15 "alpha to settle on both cpus" eval 'settled 1 && status_json | jq -e ".jobs[0].ncpus == 2" >/dev/null'
wait_for 10 "alpha's row to show 2/1-2 ##" eval 'rows_match_status && pane | grep -qE "^alpha +[0-9]+ +2/1-2 +## +2 "'
wait_for 10 "alpha's lent core-seconds to grow" eval 'pane | awk '\''$1 == "alpha" {exit !($7 > 0)}'\'''
mallctl set alpha --threads 1 >/dev/null || fail "mallctl set alpha --threads 1"
wait_for 5 "THREADS 1 for alpha" eval 'pane | grep -qE "^alpha +[0-9]+ +2/1-2 +## +1 "'
echo "top_check: ok: a job's end, a grow and a thread count show up"
show_pane

# malld dies: the header says so and top keeps going.
kill -TERM "$malld_pid"
wait "$malld_pid" 2>/dev/null || true
malld_pid=""
wait_for 5 "the header to say malld is unreachable" eval 'pane | head -1 | grep -q "malld unreachable: cannot connect to malld at"'
before=$(pane | head -1 | grep -oE '[0-9]{2}:[0-9]{2}:[0-9]{2}')
wait_for 5 "the clock to move on (top still running)" eval '[ "$(pane | head -1 | grep -oE "[0-9]{2}:[0-9]{2}:[0-9]{2}")" != "$before" ]'
pane_lacks '^EXITED' || fail "top exited when malld went away"
echo "top_check: ok: malld unreachable shows in the header; top keeps running"
pane | head -2

# q quits and gives the terminal back: exit 0, canonical mode, the main screen, the cursor shown.
check_restored() {  # check_restored HOW CODE
  local shell_pid
  shell_pid=$(pane_format '#{pane_pid}')
  wait_for 5 "mallctl to exit after $1" eval "! pgrep -P $shell_pid -x mallctl >/dev/null"
  wait_for 5 "the shell to print top's exit status after $1 (on the main screen)" pane_has "^EXITED:"
  pane_has "^EXITED:$2\$" || fail "after $1 top should exit $2"
  wait_for 5 "the pane to report the terminal's mode" pane_has '^MODE:'
  pane_has '^MODE:icanon$' || fail "after $1 the terminal is left without canonical mode (-icanon)"
  pane_lacks '^mall top' || fail "after $1 top's frame is still on the screen (alternate screen not left)"
  [ "$(pane_format '#{alternate_on}#{cursor_flag}')" = 01 ] || fail "after $1: alternate screen still on or cursor hidden"
}
keys q
check_restored q 0
"${TMUX_CMD[@]}" kill-session -t top
start_pane "top to start" pane_has '^mall top'
keys C-c
check_restored Ctrl-C 0
"${TMUX_CMD[@]}" kill-session -t top
start_pane "top to start" pane_has '^mall top'
top_pid=$(pgrep -P "$(pane_format '#{pane_pid}')" -x mallctl) || fail "no mallctl process under the pane"
kill -TERM "$top_pid"
check_restored SIGTERM 143
"${TMUX_CMD[@]}" kill-session -t top
# A crash gives the terminal back too, and top still dies of it (128 + SIGSEGV).
start_pane "top to start" pane_has '^mall top'
top_pid=$(pgrep -P "$(pane_format '#{pane_pid}')" -x mallctl) || fail "no mallctl process under the pane"
kill -SEGV "$top_pid"
check_restored SIGSEGV 139
echo "top_check: ok: q, Ctrl-C, SIGTERM and a crash (SIGSEGV) give the terminal back"

# Teardown, checked: the tmux server, the jobs and their processes are gone.
cleanup_pids=$alpha_pid
cleanup
trap - EXIT
! pgrep -f -- "$tmp/tmux.sock" >/dev/null || fail "the private tmux server is still running"
for pid in $cleanup_pids $client_pids; do
  ! alive "$pid" || fail "process $pid ($(cat /proc/"$pid"/comm 2>/dev/null)) outlived the test"
done
echo "top_check: ok"
