#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# site_malld.sh — the guest script of ctest vm.site_malld: mall installed from its .deb runs as a
# systemd service on Debian 13 (systemd as PID 1, cgroup v2), as an admin deploys it. Checks:
#   (1) `apt install ./mall_*.deb` installs it without network; the unit has Delegate=yes and
#       DelegateSubgroup=malld and reads /etc/default/malld (an option put there reaches malld);
#   (2) `systemctl enable --now malld`: malld runs in its own delegated cgroup
#       (/system.slice/malld.service/malld), with cpuset enabled in the unit's subtree;
#   (3) a `mallrun --malleable=1:2` job (python3 with four threads) grows and shrinks with
#       `mallctl set JOB --cpus ...`: every thread's Cpus_allowed_list, the job cgroup's
#       cpuset.cpus.effective and `mallctl status --json` agree, the cgroup inside malld's subtree;
#   (3b) the state folder is root's (0700) and its file 0600; another uid's status shows the job
#       only as cpus (no name, no pid) and cannot write /run/mall (issue 37);
#   (4) `systemctl restart malld` re-adopts the job without a write (journal: "re-adopted ...
#       without touching its cpuset", no enforce event of the job): same cpus, the job runs on;
#   (5) malld SIGKILLed: systemd restarts it (Restart=on-failure) and it re-adopts the job;
#   (6) the job ends: its registration and cgroup folder go; `systemctl stop malld` is a clean
#       stop (exit 0, "stopped"), leaves no job folder and keeps the state file;
#   (7) `journalctl -u malld` shows malld's lines (start, registration, stop).
# Expects (run-in-site-vm.sh runs it so): root in the site guest (MALL_IN_SITE_VM=1), the .deb in
# $MALL_SITE_DEB (or mall already installed). One PASS/FAIL line per check; exit 1 when any fails,
# 77 with the reason outside such a guest. Logs (journal, status) go to $MALL_SITE_OUT/malld/ when
# set. Its own watchdog (MALL_SITE_MALLD_TIMEOUT_S, default 480 s) fails a hang.
set -uo pipefail

if [ "${1:-}" = -h ] || [ "${1:-}" = --help ]; then sed -n '3,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0; fi
limit_s=${MALL_SITE_MALLD_TIMEOUT_S:-480}
wait_s=${MALL_SITE_MALLD_WAIT_S:-60}   # each wait: well under a second natively, seconds under TCG
out=${MALL_SITE_OUT:+$MALL_SITE_OUT/malld}
job=sitejob
# The shared helpers: in $MALL_SITE_FILES (run-site-tests.sh carries them), else beside this script.
for common in "${MALL_SITE_FILES:-/nonexistent}/site_common.sh" "$(dirname "$0")/site_common.sh" "$(dirname "$0")/../site_common.sh"; do
  [ -r "$common" ] && break
done
# shellcheck source=site_common.sh
. "$common" || { echo "FAIL: site_common.sh not found (run-in-site-vm.sh --file tests/vm/site/site_common.sh)"; exit 1; }

require_site_guest "needs root (installs a package, starts services)" \
  "runs only in the site guest (MALL_IN_SITE_VM=1, tests/vm/site/run-in-site-vm.sh): it installs mall and starts malld.service"

work=$(mktemp -d /tmp/site_malld.XXXXXX)
mallrun_pid='' watchdog_pid=''
# shellcheck disable=SC2317  # called from the trap
cleanup() {
  local rc=$?
  trap - EXIT TERM INT
  [ -n "$watchdog_pid" ] && kill "$watchdog_pid" 2>/dev/null
  if [ -n "$mallrun_pid" ] && kill -0 "$mallrun_pid" 2>/dev/null; then
    kill -TERM "$mallrun_pid" 2>/dev/null; sleep 2; kill -KILL -- "-$mallrun_pid" 2>/dev/null
  fi
  if [ -n "$out" ]; then
    mkdir -p "$out"
    journalctl -u malld --no-pager -o short-precise >"$out/journal-malld.txt" 2>&1
    cp -f "$work"/*.txt "$work"/*.json "$out/" 2>/dev/null
  fi
  # The options file as the package left it, for the next script in the same boot.
  [ -f "$work/malld.default.orig" ] && cp -f "$work/malld.default.orig" /etc/default/malld
  rm -rf "$work"
  if [ "$rc" = 0 ] && [ "$failures" -gt 0 ]; then rc=1; fi
  echo "site_malld: $failures failure(s)"
  exit "$rc"
}
trap cleanup EXIT
trap 'echo "FAIL: watchdog: site_malld.sh still running after $limit_s s"; exit 1' TERM
trap 'exit 130' INT
# The timer's sleep is a background child, so that ending the timer (TERM) says no "Terminated".
{ trap 'kill "$s" 2>/dev/null; exit 0' TERM; sleep "$limit_s" & s=$!; wait "$s" && kill -TERM $$; } &
watchdog_pid=$!
disown "$watchdog_pid"   # no "Terminated" line when the cleanup ends it

main_pid() { systemctl show -p MainPID --value malld; }
invocation() { systemctl show -p InvocationID --value malld; }

# --- (1) the package ------------------------------------------------------------------------------
install_mall_deb "$work/apt.txt" --pass
version=$(dpkg-query -W -f='${Version}' mall)
unit_text=$(systemctl cat malld 2>&1) || fatal "systemctl cat malld: $unit_text"
unit_file=$(systemctl show -p FragmentPath --value malld)
[ "$unit_file" = /usr/lib/systemd/system/malld.service ] && dpkg -S "$unit_file" >/dev/null 2>&1 &&
  pass "malld.service is the package's ($unit_file)" || fail "malld.service comes from '$unit_file', not the package's /usr/lib/systemd/system/malld.service"
if [ "$(systemctl show -p Delegate --value malld)" = yes ] && grep -qx 'DelegateSubgroup=malld' <<<"$unit_text"; then
  pass "the unit has Delegate=yes and DelegateSubgroup=malld"
else
  fail "the unit lacks Delegate=yes / DelegateSubgroup=malld (the .deb must be built with -DMALL_SYSTEMD_DELEGATE=ON for systemd >= 254): $(grep -i delegate <<<"$unit_text" | tr '\n' ' ')"
fi
grep -qx 'EnvironmentFile=-/etc/default/malld' <<<"$unit_text" && dpkg-query -W -f='${Conffiles}' mall | grep -q ' /etc/default/malld ' &&
  pass "the unit reads /etc/default/malld, a conffile of the package" || fail "the unit does not read /etc/default/malld or it is no conffile"
# An admin's option in the options file (the last MALLD_OPTIONS line wins): a metrics file.
cp -f /etc/default/malld "$work/malld.default.orig"
echo 'MALLD_OPTIONS="--metrics-file /run/mall/site.prom --metrics-interval 1"' >>/etc/default/malld

# --- (2) malld as a service in its own delegated cgroup ------------------------------------------
t=$SECONDS
systemctl enable --now malld >"$work/enable.txt" 2>&1 || fatal "systemctl enable --now malld: $(cat "$work/enable.txt"); $(journalctl -u malld --no-pager | tail -n 20)"
wait_until "$wait_s" "malld to answer on /run/mall/malld.sock" malld_answers ||
  fatal "malld does not answer: $(systemctl status malld --no-pager 2>&1 | tail -n 20)"
pass "systemctl enable --now malld: active, answering after $((SECONDS - t)) s ($(systemctl is-enabled malld))"
pid=$(main_pid)
unit_cg=/sys/fs/cgroup/system.slice/malld.service
got=$(cat "/proc/$pid/cgroup")
[ "$got" = 0::/system.slice/malld.service/malld ] && pass "malld (pid $pid) runs in its delegated leaf: $got" ||
  fail "malld (pid $pid) is in '$got', not 0::/system.slice/malld.service/malld"
grep -qw cpuset "$unit_cg/cgroup.subtree_control" && pass "cpuset is enabled in malld's subtree ($(cat "$unit_cg/cgroup.subtree_control"))" ||
  fail "cpuset is not enabled below $unit_cg (subtree_control: $(cat "$unit_cg/cgroup.subtree_control" 2>&1))"
tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- '--metrics-file /run/mall/site.prom' &&
  wait_until "$wait_s" "the metrics file" test -s /run/mall/site.prom &&
  pass "/etc/default/malld's MALLD_OPTIONS reach malld (its metrics file is written)" ||
  fail "/etc/default/malld's options did not reach malld: $(tr '\0' ' ' <"/proc/$pid/cmdline")"

# --- (3) a malleable job follows mallctl set -----------------------------------------------------
# A training-like program (four threads that work and sleep in turn) with a heartbeat file.
write_train_py "$work/train.py"
# setsid: the job and mallrun in a process group of their own, killed as one by the cleanup.
setsid mallrun --malleable=1:2 --job "$job" --cgroup own --require -- python3 "$work/train.py" "$work/beat" \
  >"$work/mallrun.txt" 2>&1 </dev/null &
mallrun_pid=$!
job_pid() { status_json | jq -r --arg j "$job" '.jobs[] | select(.job == $j) | .pids[0] // empty'; }
wait_until "$wait_s" "the job to register and run" sh -c "test -s '$work/beat'" ||
  fatal "the job did not start: $(cat "$work/mallrun.txt")"
jpid=$(job_pid)
[ -n "$jpid" ] || fatal "mallctl status lists no pid for $job: $(status_json | jq -c .jobs)"
cgroup_rel=$(job_field "$job" cgroup)
case $cgroup_rel in
  /sys/fs/cgroup/*) cgroup_dir=$cgroup_rel ;;
  *) cgroup_dir=/sys/fs/cgroup/${cgroup_rel#/} ;;
esac
[ -f "$cgroup_dir/cpuset.cpus.effective" ] || fatal "the job's cgroup '$cgroup_rel' has no cpuset.cpus.effective"
case $cgroup_dir in
  "$unit_cg"/*) pass "the job's cgroup is inside malld's delegated subtree: ${cgroup_dir#/sys/fs/cgroup}" ;;
  *) fail "the job's cgroup ${cgroup_dir} is outside malld's subtree $unit_cg" ;;
esac
[ "$(cut -d: -f3 "/proc/$jpid/cgroup")" = "${cgroup_dir#/sys/fs/cgroup}" ] ||
  fail "the job's process $jpid is in $(cat "/proc/$jpid/cgroup"), not ${cgroup_dir#/sys/fs/cgroup}"

# Where the job's cpus show (site_common.sh's cpus_agree, show_cpus): malld's status, every thread
# of the job, the job cgroup's effective cpus.
where=("$job" "$jpid" '' '' "$cgroup_dir")
nthreads=$(ls "/proc/$jpid/task" | wc -l)
[ "$nthreads" -ge 5 ] || fail "the job runs $nthreads threads, not 5 (python's main and four workers)"
if wait_until "$wait_s" "the lone job to grow to 0-1" cpus_agree 0-1 "${where[@]}"; then
  pass "alone, the job grows to 0-1: $(show_cpus "${where[@]}") ($nthreads threads)"
else
  fail "alone, the job does not hold 0-1: $(show_cpus "${where[@]}")"
fi
for want in 1 0 0-1 1; do
  mallctl set "$job" --cpus "$want" >"$work/set.txt" 2>&1 || fail "mallctl set $job --cpus $want: $(cat "$work/set.txt")"
  if wait_until "$wait_s" "cpus $want" cpus_agree "$want" "${where[@]}"; then
    pass "mallctl set $job --cpus $want: $(show_cpus "${where[@]}")"
  else
    fail "mallctl set $job --cpus $want: they disagree: $(show_cpus "${where[@]}")"
  fi
done
status_json >"$work/status-before-restart.json"

# --- (3b) the boundaries on cgroup v2 (issue 37, docs/security.md) ---------------------------------
# State in a folder of root's alone, files 0600; another user sees the node, not the job's pids.
st=$(stat -c '%U %a' /var/lib/mall 2>&1)
[ "$st" = "root 700" ] && pass "/var/lib/mall is root's, mode 0700" || fail "/var/lib/mall is '$st', not 'root 700'"
wait_until "$wait_s" "malld to save its state" test -s /var/lib/mall/malld.state.json || true
st=$(stat -c '%U %a' /var/lib/mall/malld.state.json 2>&1)
[ "$st" = "root 600" ] && pass "malld.state.json is root's, mode 0600" || fail "malld.state.json is '$st', not 'root 600'"
other=$(setpriv --reuid=61001 --regid=61001 --clear-groups mallctl status --json 2>&1) ||
  fail "mallctl status as uid 61001 failed: $other"
if [ "$(jq -r .view <<<"$other" 2>/dev/null)" = own ] && [ "$(jq '.other_jobs | length' <<<"$other")" = 1 ] &&
   [ "$(jq '.jobs | length' <<<"$other")" = 0 ] && ! grep -qw "$jpid" <<<"$other"; then
  pass "uid 61001 sees the node and one other job's cpus, not its name or pid $jpid"
else
  fail "uid 61001's status shows more than the summary: $other"
fi
setpriv --reuid=61001 --regid=61001 --clear-groups ln -s /etc/passwd /run/mall/planted 2>/dev/null &&
  fail "uid 61001 could plant a link in /run/mall" || pass "uid 61001 cannot write /run/mall ($(stat -c '%U %a' /run/mall))"
rm -f /run/mall/planted

# --- (4) systemctl restart re-adopts the job without a write -------------------------------------
beat_before=$(cat "$work/beat")
old_pid=$(main_pid)
t=$SECONDS
systemctl restart malld >"$work/restart.txt" 2>&1 || fail "systemctl restart malld: $(cat "$work/restart.txt")"
wait_until "$wait_s" "the restarted malld to answer" malld_answers || fail "malld does not answer after systemctl restart"
new_pid=$(main_pid)
[ "$new_pid" != "$old_pid" ] && [ "$(cat "/proc/$new_pid/cgroup")" = 0::/system.slice/malld.service/malld ] &&
  pass "systemctl restart malld: a new malld (pid $old_pid -> $new_pid, $((SECONDS - t)) s) in the delegated leaf" ||
  fail "after systemctl restart: malld pid $old_pid -> $new_pid, cgroup $(cat "/proc/$new_pid/cgroup" 2>&1)"
kill -0 "$jpid" 2>/dev/null && pass "the job (pid $jpid) survived the restart" || fail "the job (pid $jpid) died with malld's restart"
if cpus_agree 1 "${where[@]}"; then pass "after the restart the job keeps its cpus: $(show_cpus "${where[@]}")"; else fail "after the restart: $(show_cpus "${where[@]}")"; fi
wait_until "$wait_s" "the job's heartbeat to go on" sh -c "[ \"\$(cat '$work/beat')\" -gt $beat_before ]" &&
  pass "the job keeps running (heartbeat $beat_before -> $(cat "$work/beat"))" || fail "the job's heartbeat stopped at $(cat "$work/beat")"
inv=$(invocation)
journalctl -u malld --no-pager -o cat "_SYSTEMD_INVOCATION_ID=$inv" >"$work/journal-restart.txt" 2>&1
if grep -q "re-adopted job $job .*without touching its cpuset" "$work/journal-restart.txt"; then
  pass "journal: $(grep -o "re-adopted job $job .*without touching its cpuset" "$work/journal-restart.txt")"
else
  fail "the restarted malld's journal does not say it re-adopted $job without touching its cpuset: $(tail -n 15 "$work/journal-restart.txt")"
fi
if grep -q "\"event\":\"enforce\".*\"job\":\"$job\"" "$work/journal-restart.txt"; then
  fail "the restarted malld wrote the job's cpuset: $(grep "\"event\":\"enforce\"" "$work/journal-restart.txt" | head -n 3)"
else
  pass "the restarted malld did not write the job's cpuset (no enforce event)"
fi

# --- (5) a killed malld is restarted by systemd and re-adopts --------------------------------------
old_pid=$(main_pid)
kill -KILL "$old_pid"
wait_until "$wait_s" "systemd to restart the killed malld" sh -c "p=\$(systemctl show -p MainPID --value malld); [ \"\$p\" != 0 ] && [ \"\$p\" != $old_pid ] && timeout 10 mallctl status" &&
  pass "malld SIGKILLed: systemd restarted it (Restart=on-failure; pid $old_pid -> $(main_pid), NRestarts=$(systemctl show -p NRestarts --value malld))" ||
  fail "malld SIGKILLed: not restarted ($(systemctl show -p ActiveState -p SubState -p NRestarts malld | tr '\n' ' '))"
if cpus_agree 1 "${where[@]}" && kill -0 "$jpid" 2>/dev/null; then pass "after the kill the job is re-adopted with its cpus: $(show_cpus "${where[@]}")"; else fail "after malld's kill: $(show_cpus "${where[@]}")"; fi
mallctl set "$job" --cpus auto >"$work/set.txt" 2>&1 || fail "mallctl set $job --cpus auto: $(cat "$work/set.txt")"
wait_until "$wait_s" "cpus auto (0-1)" cpus_agree 0-1 "${where[@]}" && pass "mallctl set $job --cpus auto: back to 0-1: $(show_cpus "${where[@]}")" ||
  fail "mallctl set $job --cpus auto: $(show_cpus "${where[@]}")"

# --- (6) the job ends; systemctl stop is clean, keeps the state, leaves no job folder -------------
kill -TERM "$mallrun_pid"
wait "$mallrun_pid"
rc=$?
mallrun_pid=''
[ "$rc" = 143 ] || [ "$rc" = 0 ] || fail "mallrun exited $rc after SIGTERM: $(tail -n 5 "$work/mallrun.txt")"
wait_until "$wait_s" "the job to leave malld's status" sh -c "[ -z \"\$(timeout 10 mallctl status --json | jq -r '.jobs[] | select(.job == \"$job\") | .job')\" ]" &&
  pass "the ended job left malld's status" || fail "malld still lists $job after it ended"
wait_until "$wait_s" "the job's cgroup to go" sh -c "! test -d '$cgroup_dir'" &&
  pass "the ended job's cgroup folder is gone" || fail "the ended job's cgroup $cgroup_dir is still there"
systemctl stop malld >"$work/stop.txt" 2>&1 || fail "systemctl stop malld: $(cat "$work/stop.txt")"
state=$(systemctl show -p ActiveState --value malld) result=$(systemctl show -p Result --value malld)
[ "$state" = inactive ] && [ "$result" = success ] && pass "systemctl stop malld: inactive, result success" ||
  fail "systemctl stop malld: ActiveState $state, Result $result"
left=$(find /sys/fs/cgroup -name 'job_*' -type d 2>/dev/null | grep -v -e '_slurmstepd' || true)
[ -z "$left" ] && pass "no job folder left in /sys/fs/cgroup" || fail "job folders left after the stop: $left"
[ -s /var/lib/mall/malld.state.json ] && pass "the state file is kept: /var/lib/mall/malld.state.json ($(jq -r '.jobs | length' /var/lib/mall/malld.state.json 2>/dev/null) job(s))" ||
  fail "no state file /var/lib/mall/malld.state.json after the stop: $(ls -la /var/lib/mall 2>&1)"

# --- (7) the journal -------------------------------------------------------------------------------
journalctl -u malld --no-pager -o cat >"$work/journal.txt" 2>&1
for want in "malld (mall) $version starting" "\"event\":\"register\".*\"job\":\"$job\"" "\"event\":\"end\".*\"job\":\"$job\"" "stopping: the state file keeps" "stopped"; do
  grep -q -- "$want" "$work/journal.txt" && pass "journalctl -u malld shows: $(grep -m1 -o -- "$want" "$work/journal.txt")" ||
    fail "journalctl -u malld lacks '$want'"
done
bad=$(grep -iE ' (error|warn[a-z]*):' "$work/journal.txt" || true)
[ -z "$bad" ] && pass "no error or warning in malld's journal" || fail "malld's journal has errors or warnings: $bad"
