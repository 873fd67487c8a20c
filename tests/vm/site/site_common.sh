# SPDX-License-Identifier: BSD-3-Clause
# shellcheck shell=bash disable=SC2154  # wait_s, work, pool: the calling script's globals
# site_common.sh — the helpers the Debian 13 site guest scripts share (site_malld.sh,
# podman/site_podman.sh, docker/site_docker.sh, slurm/site_slurm.sh; issue 29). Sourced, never run:
# run-site-tests.sh carries it into the guest with run-in-site-vm.sh's --file, where it lies in
# $MALL_SITE_FILES; a script run by hand finds it beside itself (or one folder up).
# Contract: defines functions and the counter `failures` (0) only; runs nothing and sets no shell
# options. Some helpers read the caller's globals, named at each: wait_s (seconds a step may wait),
# work (the script's temp folder), pool (malld's cpu pool). Output: "PASS: ...", "FAIL: ...",
# "SKIP: ..." and "  note: ..." lines on stdout, as the site scripts print them.

failures=0
site_poll_s=0.5   # wait_until's poll interval; a script may set its own

# --- Results -----------------------------------------------------------------------------------
pass() { echo "PASS: $*"; }                                    # pass TEXT...
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }        # fail TEXT...: counts, goes on
fatal() { echo "FAIL: $*"; failures=$((failures + 1)); exit 1; } # fatal TEXT...: counts, exit 1
skip() { echo "SKIP: $*"; exit 77; }                           # skip WHY...: exit 77
note() { echo "  note: $*"; }                                  # note TEXT...: neither pass nor fail

# require_site_guest ROOT_WHY GUEST_WHY: skips (77) unless root (ROOT_WHY says why root is needed)
# in the site guest (MALL_IN_SITE_VM=1; GUEST_WHY says why only there); fails (exit 1) unless
# systemd is PID 1 and /sys/fs/cgroup is cgroup v2.
require_site_guest() {
  [ "$(id -u)" -eq 0 ] || skip "$1"
  [ "${MALL_IN_SITE_VM:-}" = 1 ] || skip "$2"
  [ "$(cat /proc/1/comm)" = systemd ] || fatal "PID 1 is $(cat /proc/1/comm), not systemd"
  [ "$(stat -f -c %T /sys/fs/cgroup)" = cgroup2fs ] || fatal "/sys/fs/cgroup is not cgroup v2"
}

# run_watched LIMIT_S FLAG_VAR SCRIPT [ARG...]: the watchdog of tests/support/watchdog.sh's kind
# (which the guest does not have): unless $FLAG_VAR is 1, runs SCRIPT ARGs again with bash under
# timeout(1) (TERM after LIMIT_S, for the script's trap to clean up; KILL 60 s later) with
# FLAG_VAR=1, in place of this shell (exec); returns at once when already so watched.
run_watched() {
  local limit=$1 flag=$2
  shift 2
  [ "${!flag:-}" = 1 ] && return 0
  export "$flag=1"
  exec timeout --kill-after=60 "$limit" bash "$@"
}

# --- Waiting -----------------------------------------------------------------------------------
# wait_until SECONDS WHAT CMD...: polls CMD (output dropped) every $site_poll_s s; 0 when it
# succeeded, else 1 after SECONDS with "  (waited SECONDS s for WHAT)".
wait_until() {
  local limit=$1 what=$2 until=$((SECONDS + $1))
  shift 2
  while ! "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$until" ] || { echo "  (waited $limit s for $what)"; return 1; }
    sleep "$site_poll_s"
  done
}

# --- malld and its jobs ------------------------------------------------------------------------
status_json() { timeout 20 mallctl status --json; }            # malld's status, JSON
malld_answers() { timeout 10 mallctl status >/dev/null; }      # 0 when malld answers
# job_field JOB EXPR: EXPR (a jq path below the job, such as cpus or 'pids | length') of JOB in
# malld's status, raw; nothing when JOB is not listed or the value is null.
job_field() { status_json | jq -r --arg j "$1" ".jobs[] | select(.job == \$j) | .$2 // empty"; }
job_listed() { status_json | jq -e --arg j "$1" 'any(.jobs[]; .job == $j)'; }  # job_listed JOB
job_gone() { ! job_listed "$1"; }                              # job_gone JOB

# install_mall_deb LOG [--pass]: installs $MALL_SITE_DEB with apt (no network: its Depends must be
# in the root) unless mall is installed; apt's output to LOG; --pass prints a PASS line with the
# time. Fatal when neither is there or apt fails.
install_mall_deb() {
  local log=$1 t=$SECONDS
  dpkg -s mall >/dev/null 2>&1 && return 0
  [ -r "${MALL_SITE_DEB:-}" ] || fatal "mall is not installed and no .deb was given (run-in-site-vm.sh --deb mall_*.deb)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$(realpath "$MALL_SITE_DEB")" >"$log" 2>&1 ||
    fatal "apt install $MALL_SITE_DEB: $(tail -n 8 "$log")"
  [ "${2:-}" != --pass ] || pass "apt install ./$(basename "$MALL_SITE_DEB") without network ($((SECONDS - t)) s)"
}

# start_malld: malld.service enabled and started unless active, then answering within $wait_s s
# (globals wait_s, work: systemctl's output goes to $work/enable.txt); fatal otherwise.
start_malld() {
  systemctl is-active --quiet malld || systemctl enable --now malld >"$work/enable.txt" 2>&1 ||
    fatal "systemctl enable --now malld: $(cat "$work/enable.txt")"
  wait_until "$wait_s" "malld to answer" malld_answers ||
    fatal "malld does not answer: $(systemctl status malld --no-pager 2>&1 | tail -n 20)"
}

# --- Cpus: what a job holds, seen from every side ----------------------------------------------
# threads_cpus PID: the distinct Cpus_allowed_list of PID's threads, space-separated.
threads_cpus() {
  local t
  for t in /proc/"$1"/task/*; do awk '/^Cpus_allowed_list/ {print $2}' "$t/status"; done | sort -u | paste -sd' ' -
}
threads_on() { [ "$(threads_cpus "$1")" = "$2" ]; }            # threads_on PID LIST: every thread allows LIST

# A job's cpus are checked at a WHERE, the arguments JOB PID SLICE [LABEL DIR]...: the job in
# malld's status, the process PID (its threads), the systemd slice unit SLICE ('' for none: its
# AllowedCPUs are not checked) and each cgroup folder DIR (its cpuset.cpus.effective; LABEL names it
# in show_cpus: '' for none).
# cpus_agree WANT WHERE...: 0 when every side of WHERE says WANT.
cpus_agree() {
  local want=$1 job=$2 pid=$3 slice=$4
  shift 4
  [ "$(job_field "$job" cpus)" = "$want" ] || return 1
  while [ $# -ge 2 ]; do
    [ "$(cat "$2/cpuset.cpus.effective")" = "$want" ] || return 1
    shift 2
  done
  threads_on "$pid" "$want" && { [ -z "$slice" ] || [ "$(systemctl show -p AllowedCPUs --value "$slice")" = "$want" ]; }
}
# show_cpus WHERE...: "status 'S', [LABEL ]cpuset.cpus.effective 'E'[, LABEL 'E']..., threads 'T'
# [, AllowedCPUs 'A']": what each side says, for PASS and FAIL lines.
show_cpus() {
  local job=$1 pid=$2 slice=$3 text first=1
  shift 3
  text="status '$(job_field "$job" cpus)'"
  while [ $# -ge 2 ]; do
    if [ "$first" = 1 ]; then
      text+=", ${1:+$1 }cpuset.cpus.effective '$(cat "$2/cpuset.cpus.effective" 2>&1)'"
      first=0
    else
      text+=", $1 '$(cat "$2/cpuset.cpus.effective" 2>&1)'"
    fi
    shift 2
  done
  text+=", threads '$(threads_cpus "$pid")'"
  [ -z "$slice" ] || text+=", AllowedCPUs '$(systemctl show -p AllowedCPUs --value "$slice")'"
  echo "$text"
}
# follow_set WHERE...: the job (JOB, the first of WHERE) alone grows to $pool, then follows
# `mallctl set JOB --cpus` 1, 0 and $pool (a PASS or FAIL line each), then is set back to auto.
# Globals: pool, wait_s, work.
follow_set() {
  local job=$1 want
  if wait_until "$wait_s" "$job to hold $pool" cpus_agree "$pool" "$@"; then
    pass "alone, $job holds $pool: $(show_cpus "$@")"
  else
    fail "alone, $job does not hold $pool: $(show_cpus "$@")"
  fi
  for want in 1 0 "$pool"; do
    mallctl set "$job" --cpus "$want" >"$work/set.txt" 2>&1 || fail "mallctl set $job --cpus $want: $(cat "$work/set.txt")"
    if wait_until "$wait_s" "$job on $want" cpus_agree "$want" "$@"; then
      pass "mallctl set $job --cpus $want: $(show_cpus "$@")"
    else
      fail "mallctl set $job --cpus $want: they disagree: $(show_cpus "$@")"
    fi
  done
  mallctl set "$job" --cpus auto >/dev/null 2>&1
}
# restart_readopts JOB_DIR WHERE...: `systemctl restart malld` re-adopts JOB (the first of WHERE)
# with its cgroup JOB_DIR, and `mallctl set JOB --cpus 1` then reaches every side of WHERE; a PASS
# or FAIL line each; JOB is set back to auto. Globals: wait_s, work.
restart_readopts() {
  local dir=$1 job=$2
  shift
  systemctl restart malld >"$work/restart.txt" 2>&1 || fail "systemctl restart malld: $(cat "$work/restart.txt")"
  if wait_until "$wait_s" "malld to answer after its restart" malld_answers &&
     wait_until "$wait_s" "$job to be re-adopted" job_listed "$job" &&
     [ "$(job_field "$job" cgroup)" = "$dir" ]; then
    pass "systemctl restart malld: job $job re-adopted in $dir"
  else
    fail "after systemctl restart malld, job $job is not re-adopted in $dir: $(status_json | jq -c .jobs)"
  fi
  mallctl set "$job" --cpus 1 >"$work/set.txt" 2>&1 || fail "mallctl set $job --cpus 1 after the restart: $(cat "$work/set.txt")"
  wait_until "$wait_s" "$job on 1 after the restart" cpus_agree 1 "$@" &&
    pass "after the restart, mallctl set $job --cpus 1: $(show_cpus "$@")" ||
    fail "after the restart, mallctl set $job --cpus 1: $(show_cpus "$@")"
  mallctl set "$job" --cpus auto >/dev/null 2>&1
}

# --- systemd slices of container jobs ----------------------------------------------------------
slice_exists() { [ -d "/sys/fs/cgroup/mall.slice/$1" ]; }      # slice_exists SLICE
no_slice() { ! slice_exists "$1" && [ "$(systemctl show -p ActiveState --value "$1")" = inactive ]; }  # no_slice SLICE
# stop_mall_slices: stops and reverts (drops set-property drop-ins of) every mall-*.slice and
# mall.slice: a cleanup's last word.
stop_mall_slices() {
  local u
  for u in $(systemctl list-units --all --plain --no-legend 'mall-*.slice' 2>/dev/null | awk '{print $1}') mall.slice; do
    systemctl stop "$u" 2>/dev/null
    systemctl revert "$u" >/dev/null 2>&1
  done
}

# check_mall_slice_gone: mall.slice goes with its last job (a container scenario's end).
check_mall_slice_gone() {
  wait_until "$wait_s" "mall.slice to go" sh -c '[ ! -d /sys/fs/cgroup/mall.slice ]' && pass "mall.slice is gone with its last job" ||
    fail "mall.slice is left: $(ls /sys/fs/cgroup/mall.slice 2>&1)"
}
# check_foreground_run JOB ENGINE RUN_ARGS...: `mallrun --container --malleable=1:1 --job JOB --
# ENGINE run --rm RUN_ARGS... /usr/bin/sh -c '...; exit 7'` in the foreground: exit status 7 comes
# back, the container ran on one core, and the job and its slice mall-JOB.slice are gone after.
check_foreground_run() {
  local job=$1 engine=$2 slice=mall-$1.slice out=$work/mallrun-$1.txt t=$SECONDS rc=0 allowed
  shift 2
  env -u INVOCATION_ID mallrun --container --malleable=1:1 --job "$job" --require -- \
    "$engine" run --rm "$@" /usr/bin/sh -c \
    'grep Cpus_allowed_list /proc/self/status; cat /proc/self/cgroup; exit 7' >"$out" 2>&1 </dev/null || rc=$?
  allowed=$(awk '/^Cpus_allowed_list/ {print $2}' "$out")
  [ "$rc" = 7 ] && pass "a foreground mallrun --container -- $engine run --rm: exit status 7 comes back ($((SECONDS - t)) s)" ||
    fail "the foreground run exited $rc, not 7: $(cat "$out")"
  case $allowed in
    0|1) pass "the container ran on its one core ($allowed, cgroup $(grep '^0::' "$out"))" ;;
    *) fail "the container ran on '$allowed', not on one core: $(cat "$out")" ;;
  esac
  wait_until "$wait_s" "job $job to end" job_gone "$job" && wait_until "$wait_s" "$slice to go" no_slice "$slice" &&
    pass "job $job and $slice are gone after the run" ||
    fail "job $job or $slice is left: $(status_json | jq -c .jobs), $(systemctl show -p ActiveState --value "$slice")"
}

# --- Workloads -----------------------------------------------------------------------------------
# make_tiny_root DIR: a container root without a registry: a few folders, root in passwd and
# group, the guest's merged-/usr links; the container gets /usr (read-only) by a bind mount.
make_tiny_root() {
  local l
  mkdir -p "$1"/{etc,proc,sys,dev,tmp,run,root,usr,var/tmp}
  chmod 1777 "$1/tmp" "$1/var/tmp"
  printf '%s\n' 'root:x:0:0:root:/root:/bin/sh' >"$1/etc/passwd"
  printf '%s\n' 'root:x:0:' >"$1/etc/group"
  for l in bin sbin lib lib64; do [ -L "/$l" ] && ln -s "$(readlink "/$l")" "$1/$l"; done
  return 0
}
# write_train_py FILE: a training-like python program: four threads that work and sleep in turn;
# `python3 FILE [BEAT]` also writes a counter, one more every 0.5 s, to the file BEAT (a heartbeat).
write_train_py() {
  cat >"$1" <<'PY'
import os, sys, threading, time
beat = sys.argv[1] if len(sys.argv) > 1 else None
def work():
    x = 0
    while True:
        for i in range(20000):
            x += i
        time.sleep(0.05)
for _ in range(4):
    threading.Thread(target=work, daemon=True).start()
n = 0
while True:
    n += 1
    if beat:
        with open(beat + ".tmp", "w") as f:
            f.write(str(n))
        os.replace(beat + ".tmp", beat)
    time.sleep(0.5)
PY
}
