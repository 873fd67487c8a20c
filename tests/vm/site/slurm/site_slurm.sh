#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# site_slurm.sh — the guest script of ctest vm.site_slurm: mall from its .deb makes a Slurm 24.11 job
# malleable in place on cgroup v2 under systemd. Checks, as an admin would with systemctl, sbatch,
# scancel, /proc, /sys/fs/cgroup and mallctl:
#   (1) munge, malld (--slurm), slurmctld and slurmd run as systemd services with this folder's
#       configuration (proctrack/cgroup, task/cgroup,task/affinity, cgroup/v2 without
#       IgnoreSystemd, mall's plugin in plugstack.conf) and the node is idle;
#   (2) `sbatch --malleable=1:2 -c 1` registers its task where Slurm put it: Slurm's own step
#       cgroup below <node>_slurmstepd.scope (mallctl status --json: that path, in_place true);
#   (3) alone, the job grows to 0-1 in that cgroup (cpuset.cpus.effective, the task's
#       Cpus_allowed_list, malld's status agree) and is never moved;
#   (4) a plain `sbatch -c 1` job arriving gets its core before its task starts: malld's narrowing
#       of the malleable job (mallctl watch: enforce, growing false) comes before the plain task's
#       first line, which runs on the other cpu;
#   (5) when the plain job is cancelled the malleable job grows back to 0-1;
#   (6) scancel of the malleable job leaves no registration or reservation in malld and no cgroup;
#   (7) slurmd's log and `journalctl -u malld` show no cgroup error, and no plugin release mismatch;
#   (8) the submission filter (CliFilterPlugins=cli_filter/lua with the .deb's cli_filter.lua in
#       /etc/slurm, as docs/admin-slurm.md says for 24.11): `sbatch --malleable=2:2` without -c is
#       held with CPUs/Task=2, and `--malleable=2:2 -c 1` is refused with the fix, queueing nothing;
#   (9) the AdminComment merged by slurmctld (JobSubmitPlugins=lua with the .deb's job_submit.lua,
#       malld --slurm-comment-merge slurmctld): a malleable job that ends by itself has its node's
#       last figures in its AdminComment, merged by the script (no "mall-merge;" request left).
# Expects (tests/vm/site/run-in-site-vm.sh runs it so): root in the Debian 13 site guest
# (MALL_IN_SITE_VM=1) with systemd as PID 1 on cgroup v2, host name "site" with 10.77.0.1, the root
# made by make-site-root.sh (slurmctld, slurmd, slurm-client, munge, python3, jq installed, services
# not started), mall installed from its .deb (`apt install ./mall_*.deb`: malld.service, mallctl,
# mall_spank.so in Slurm's PluginDir, the python module), and this folder's slurm.conf, cgroup.conf,
# plugstack.conf and malld.default in $MALL_SITE_SLURM_CONF (default $MALL_SITE_FILES/slurm, i.e.
# run-in-site-vm.sh --file tests/vm/site/slurm). It installs them into /etc, with the .deb's
# /usr/share/mall/slurm/cli_filter.lua and job_submit.lua in /etc/slurm, (re)starts the
# services, and leaves the logs in $MALL_SITE_OUT/slurm/ when set. One PASS/FAIL line per check;
# exits 1 when any check fails, 77 with the reason when it is not in such a guest. Its own watchdog
# (MALL_SITE_SLURM_TIMEOUT_S, default 600 s: everything is slow under TCG) fails a hang.
set -uo pipefail

if [ "${1:-}" = -h ] || [ "${1:-}" = --help ]; then sed -n '3,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0; fi
conf=${MALL_SITE_SLURM_CONF:-${MALL_SITE_FILES:-/nonexistent}/slurm}
out=${MALL_SITE_OUT:+$MALL_SITE_OUT/slurm}
limit_s=${MALL_SITE_SLURM_TIMEOUT_S:-600}
wait_s=${MALL_SITE_SLURM_WAIT_S:-120}   # each wait: seconds natively, tens of seconds under TCG
# The shared helpers: in $MALL_SITE_FILES (run-site-tests.sh carries them), else beside this script.
for common in "${MALL_SITE_FILES:-/nonexistent}/site_common.sh" "$(dirname "$0")/site_common.sh" "$(dirname "$0")/../site_common.sh"; do
  [ -r "$common" ] && break
done
# shellcheck source=../site_common.sh
. "$common" || { echo "FAIL: site_common.sh not found (run-in-site-vm.sh --file tests/vm/site/site_common.sh)"; exit 1; }
site_poll_s=0.2   # wait_until's polls

require_site_guest "needs root (it configures and starts Slurm's and mall's services)" \
  "runs only in the site guest (MALL_IN_SITE_VM=1, tests/vm/site/run-in-site-vm.sh): it rewrites /etc/slurm and starts services"
for f in slurm.conf cgroup.conf plugstack.conf malld.default; do
  [ -r "$conf/$f" ] || fatal "$conf/$f missing: pass --file tests/vm/site/slurm to run-in-site-vm.sh or set MALL_SITE_SLURM_CONF"
done
# mall from its .deb: the harness's step before this script; done here when it was not.
install_mall_deb /tmp/site_slurm.apt.log
for tool in mallctl sbatch scontrol scancel sinfo jq python3 systemctl journalctl; do
  command -v "$tool" >/dev/null || fatal "$tool is not installed in the guest (make-site-root.sh's package list, or the mall .deb)"
done

work=$(mktemp -d /tmp/site_slurm.XXXXXX)
chmod 0755 "$work"
jobs_started=()
watch_pid=''
cleanup() {
  trap - EXIT INT TERM
  [ ${#jobs_started[@]} -eq 0 ] || scancel "${jobs_started[@]}" 2>/dev/null
  [ -z "$watch_pid" ] || kill "$watch_pid" 2>/dev/null
  if [ -n "$out" ]; then
    mkdir -p "$out"
    cp /var/log/slurm/slurmd.log /var/log/slurm/slurmctld.log "$work"/*.out "$work"/events.jsonl "$out"/ 2>/dev/null
    journalctl -u malld --no-pager >"$out/malld.journal" 2>&1
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'echo "FAIL: interrupted"; exit 1' INT
trap 'echo "FAIL: watchdog: site_slurm.sh ran longer than ${limit_s}s (MALL_SITE_SLURM_TIMEOUT_S)"; exit 1' TERM
( sleep "$limit_s"; kill -TERM $$ 2>/dev/null ) </dev/null >/dev/null 2>&1 &
watchdog_pid=$!

job_settled_on() { [ "$(status_json | jq -r --arg j "$1" '.jobs[] | select(.job == $j) | "\(.cpus) \(.cpuset) \(.state)"')" = "$2 $2 settled" ]; }
job_gone_and_released() { ! job_listed "$1" && [ -z "$(status_json | jq -r --arg j "$1" '.reserved[$j] // ""')" ]; }
job_state() { scontrol show job "$1" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p'; }
job_final() { case $(job_state "$1") in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|'') return 0 ;; *) return 1 ;; esac; }
proc_cgroup() { sed -n 's/^0:://p' "/proc/$1/cgroup" 2>/dev/null; }
effective() { cat "/sys/fs/cgroup$1/cpuset.cpus.effective" 2>/dev/null; }
masks() { local t; for t in /proc/"$1"/task/*/status; do printf '%s ' "$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' "$t")"; done; }
earlier() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a + 0 < b + 0) }'; }
submit() { # submit NAME SBATCH_ARGS...: the job id; its output in $work/NAME.out
  local name=$1 id; shift
  id=$(sbatch --parsable -o "$work/$name.out" "$@" 2>"$work/$name.sbatch.err") || return 1
  id=${id%%;*}; jobs_started+=("$id"); echo "$id"
}
# Slurm's step cgroup of a batch task: below <node>_slurmstepd.scope, a job folder whatever its
# name (job_<id> in 24.11, the SLUID from 26.05), then step_batch.
slurm_batch_cgroup='^/system\.slice/[^/]*_slurmstepd\.scope/[^/]+/step_batch(/|$)'

# ---- (1) the services ---------------------------------------------------------------------------
install -d -m 0755 /etc/slurm /var/log/slurm
install -m 0644 "$conf/slurm.conf" "$conf/cgroup.conf" "$conf/plugstack.conf" /etc/slurm/
install -m 0644 "$conf/malld.default" /etc/default/malld
# The submission filter slurm.conf's CliFilterPlugins=cli_filter/lua loads, from the .deb.
install -m 0644 /usr/share/mall/slurm/cli_filter.lua /etc/slurm/cli_filter.lua ||
  fatal "(1) the .deb has no /usr/share/mall/slurm/cli_filter.lua to install as /etc/slurm/cli_filter.lua"
# The AdminComment merge slurm.conf's JobSubmitPlugins=lua loads (malld --slurm-comment-merge slurmctld).
install -m 0644 /usr/share/mall/slurm/job_submit.lua /etc/slurm/job_submit.lua ||
  fatal "(1) the .deb has no /usr/share/mall/slurm/job_submit.lua to install as /etc/slurm/job_submit.lua"
install -d -o slurm -g slurm -m 0755 /var/lib/slurm/slurmctld
install -d -m 0755 /var/lib/slurm/slurmd
chown slurm:slurm /var/log/slurm
# munge: trixie's package makes /etc/munge/munge.key at install; a root made without it gets one.
if [ ! -s /etc/munge/munge.key ]; then
  mungekey --create --keyfile /etc/munge/munge.key && chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key ||
    fatal "no munge key and mungekey --create failed"
fi
plugin=$(dpkg -L mall 2>/dev/null | grep '/mall_spank\.so$' | head -n1)
plugindir=$(sed -n 's/^PluginDir=//p' /etc/slurm/slurm.conf); plugindir=${plugindir:-/usr/lib/x86_64-linux-gnu/slurm-wlm}
[ "$(dirname "${plugin:-/none}")" = "$plugindir" ] || fail "(1) the .deb put mall_spank.so at '${plugin:-nowhere}', not in Slurm's PluginDir $plugindir (plugstack.conf names it without a path)"
systemctl restart munge malld && systemctl restart slurmctld && systemctl restart slurmd
node_idle() { [ "$(sinfo -h -n site -o %t 2>/dev/null)" = idle ]; }
if systemctl is-active -q munge malld slurmctld slurmd && wait_until "$wait_s" "node site to be idle" node_idle && wait_until "$wait_s" "malld to answer" status_json; then
  pass "(1) munge, malld ($(systemctl show -p MainPID --value malld), $(tr '\0' ' ' </proc/"$(systemctl show -p MainPID --value malld)"/cmdline)), slurmctld and slurmd (Slurm $(scontrol version | awk '{print $2}')) run under systemd; node site idle; cgroup.conf: $(grep -v '^#' /etc/slurm/cgroup.conf | tr '\n' ' ')"
else
  fail "(1) services: $(for s in munge malld slurmctld slurmd; do printf '%s=%s ' $s "$(systemctl is-active $s)"; done) node state '$(sinfo -h -n site -o %t 2>&1)'"
  systemctl status --no-pager munge malld slurmctld slurmd 2>&1 | tail -n 40
  tail -n 30 /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log 2>/dev/null
  exit 1
fi
mallctl watch --json --timeout-s "$limit_s" >"$work/events.jsonl" 2>"$work/watch.err" &
watch_pid=$!

# ---- (2) a malleable job registers in Slurm's step cgroup ----------------------------------------
# The task: python with mall's module, a step boundary every 20 ms (MALL_SOCKET and MALL_JOB_ID come
# from the plugin's task_init).
task_py='import mall, time
c = mall.Client()
while True:
    c.step()
    time.sleep(0.02)'
ja=$(submit malleable --malleable=1:2 -c 1 --wrap "exec python3 -c '$task_py'") || { fail "(2) sbatch refused the malleable job: $(cat "$work/malleable.sbatch.err")"; exit 1; }
if ! wait_until "$wait_s" "job $ja to register" job_listed "slurm-$ja"; then
  fail "(2) job $ja ($(job_state "$ja")) was not registered with malld within ${wait_s}s: $(cat "$work/malleable.out" 2>/dev/null | tail -n 5 | tr '\n' '|')"
  exit 1
fi
a_pid=$(job_field "slurm-$ja" pids | jq -r '.[0]')
a_cg=$(proc_cgroup "$a_pid")
a_status=$(status_json | jq -c --arg j "slurm-$ja" '.jobs[] | select(.job == $j) | {cgroup, cgroups}')
if [[ $a_cg =~ $slurm_batch_cgroup ]] && [ "$a_status" = "$(jq -nc --arg p "/sys/fs/cgroup$a_cg" '{cgroup: $p, cgroups: [{in_place: true, path: $p}]}')" ]; then
  pass "(2) job $ja's task (pid $a_pid) lives in Slurm's step cgroup $a_cg; mallctl status --json: $a_status"
else
  fail "(2) job $ja's task (pid $a_pid) is in '$a_cg' (want Slurm's step cgroup, $slurm_batch_cgroup); mallctl status --json: $a_status"
fi

# ---- (3) alone, it grows to 0-1 in place ---------------------------------------------------------
if wait_until "$wait_s" "job $ja to settle on 0-1" job_settled_on "slurm-$ja" 0-1 && wait_until 30 "its threads on 0-1" threads_on "$a_pid" 0-1 &&
   [ "$(effective "$a_cg")" = 0-1 ] && [ "$(proc_cgroup "$a_pid")" = "$a_cg" ]; then
  pass "(3) job $ja grew to 0-1 in place: $a_cg's cpuset.cpus.effective $(effective "$a_cg"), threads $(masks "$a_pid"), the task still there"
else
  fail "(3) job $ja did not grow to 0-1 in Slurm's cgroup: malld $(job_field "slurm-$ja" cpuset) ($(job_field "slurm-$ja" state)), $a_cg holds '$(effective "$a_cg")', threads $(masks "$a_pid"), task in '$(proc_cgroup "$a_pid")'"
fi
own=$(job_field "slurm-$ja" guaranteed)
case $own in 0) other=1 ;; 1) other=0 ;; *) fail "(3) job $ja's guaranteed cpus in malld are '$own', not cpu 0 or 1"; exit 1 ;; esac

# ---- (4) a plain job gets its core before its task starts ----------------------------------------
jp=$(submit plain -c 1 --wrap "date +%s.%N; grep Cpus_allowed_list /proc/self/status; sed 's/^/cgroup-line /' /proc/self/cgroup; exec sleep 600") ||
  { fail "(4) sbatch refused the plain job: $(cat "$work/plain.sbatch.err")"; exit 1; }
if wait_until "$wait_s" "plain job $jp to start" grep -q Cpus_allowed_list "$work/plain.out" && wait_until "$wait_s" "job $ja to settle on $own" job_settled_on "slurm-$ja" "$own"; then
  p_start=$(grep -m1 -E '^[0-9]+\.[0-9]+$' "$work/plain.out")
  narrowed=$(jq -r --arg j "slurm-$ja" 'select(.event == "enforce" and .job == $j and .growing == false) | .time' "$work/events.jsonl" 2>/dev/null | head -n1)
  if [ -n "$narrowed" ] && earlier "$narrowed" "$p_start" && [ "$(effective "$a_cg")" = "$own" ] && threads_on "$a_pid" "$own" &&
     [ "$(proc_cgroup "$a_pid")" = "$a_cg" ] && grep -qx "Cpus_allowed_list:[[:space:]]*$other" "$work/plain.out"; then
    pass "(4) job $ja narrowed to cpu $own at $narrowed, before plain job $jp's task started at $p_start on cpu $other ($(sed -n 's/^cgroup-line 0:://p' "$work/plain.out")); $a_cg holds $own"
  else
    fail "(4) job $ja's narrowing (enforce at ${narrowed:-never}) vs plain job $jp's start (${p_start:-?}): $a_cg holds '$(effective "$a_cg")', threads $(masks "$a_pid"); plain task: $(tr '\n' '|' <"$work/plain.out")"
  fi
else
  fail "(4) plain job $jp ($(job_state "$jp")) did not start, or job $ja did not settle on cpu $own, within ${wait_s}s: malld $(job_field "slurm-$ja" cpuset)"
fi

# ---- (5) the plain job ends: the malleable job grows back ---------------------------------------
scancel "$jp"
if wait_until "$wait_s" "job $jp to end" job_final "$jp" && wait_until "$wait_s" "job $ja to settle on 0-1" job_settled_on "slurm-$ja" 0-1 && wait_until 30 "its threads on 0-1" threads_on "$a_pid" 0-1 &&
   [ "$(effective "$a_cg")" = 0-1 ] && [ "$(proc_cgroup "$a_pid")" = "$a_cg" ]; then
  pass "(5) plain job $jp cancelled: job $ja grew back to 0-1 in $a_cg"
else
  fail "(5) after scancel $jp ($(job_state "$jp")): job $ja on '$(job_field "slurm-$ja" cpuset)', $a_cg holds '$(effective "$a_cg")', threads $(masks "$a_pid")"
fi

# ---- (6) scancel: no registration, no cgroup ------------------------------------------------------
scancel "$ja"
a_job_dir=/sys/fs/cgroup$(echo "$a_cg" | sed -E 's#^(/system\.slice/[^/]*_slurmstepd\.scope/[^/]+).*#\1#')
gone() { [ ! -e "$a_job_dir" ]; }
if wait_until "$wait_s" "job $ja to end" job_final "$ja" && wait_until "$wait_s" "malld to forget job $ja" job_gone_and_released "slurm-$ja" && wait_until "$wait_s" "$a_job_dir to go" gone; then
  pass "(6) scancel $ja: malld lists and reserves nothing for slurm-$ja, and $a_job_dir is gone"
else
  fail "(6) after scancel $ja ($(job_state "$ja")): malld $(status_json | jq -c '{reserved, jobs: [.jobs[].job]}'), $a_job_dir $( [ -e "$a_job_dir" ] && echo exists || echo gone)"
fi
jobs_started=()

# ---- (7) the logs ---------------------------------------------------------------------------------
cgroup_errors=$( { grep -iE 'error' /var/log/slurm/slurmd.log | grep -iE 'cgroup|cpuset|scope|dbus'; journalctl -u malld --no-pager -o cat | grep -iE 'error|warn' | grep -iE 'cgroup|cpuset'; } 2>/dev/null | head -n 10)
mismatch=$(grep -hE 'was built for Slurm|Incompatible Slurm plugin' /var/log/slurm/slurmd.log "$work"/*.out 2>/dev/null | head -n 1)
malld_lines=$(journalctl -u malld --no-pager -o cat 2>/dev/null | grep -c 'slurm-')
if [ -z "$cgroup_errors" ] && [ -z "$mismatch" ] && [ "$malld_lines" -gt 0 ]; then
  pass "(7) slurmd's log and journalctl -u malld show no cgroup error and no plugin release mismatch ($malld_lines malld lines name the jobs)"
else
  fail "(7) logs: cgroup errors: ${cgroup_errors:-none} | release: ${mismatch:-ok} | malld journal lines naming jobs: $malld_lines"
fi

# ---- (8) the submission filter: MIN is the job's cpus per task ------------------------------------
# A held job is only looked at, never run. Without the filter the held job has CPUs/Task=1 and the
# -c 1 job is queued (to run non-malleable).
queued() { squeue -h -o %A | sort | paste -sd' ' -; }
held=$(sbatch --parsable --hold --malleable=2:2 --wrap true 2>"$work/held.sbatch.err"); held=${held%%;*}
per_task=$( [ -n "$held" ] && scontrol show job "$held" | grep -o 'CPUs/Task=[0-9]*' | head -n1)
if [ "$per_task" = CPUs/Task=2 ]; then
  pass "(8) sbatch --hold --malleable=2:2 without -c: job $held got $per_task from cli_filter.lua"
else
  fail "(8) sbatch --hold --malleable=2:2 without -c: job '${held}' has '${per_task}', not CPUs/Task=2 (CliFilterPlugins, /etc/slurm/cli_filter.lua?): $(cat "$work/held.sbatch.err")"
fi
[ -z "$held" ] || { scancel "$held"; wait_until "$wait_s" "held job $held to end" job_final "$held"; }
before=$(queued)
rc=0; refused=$(sbatch --parsable --malleable=2:2 -c 1 --wrap true 2>&1) || rc=$?
if [ "$rc" -ne 0 ] && grep -qF 'guarantees 2 cpus per task, but -c 1' <<<"$refused" && [ "$(queued)" = "$before" ]; then
  pass "(8) sbatch --malleable=2:2 -c 1 refused at submission, nothing queued: $(grep -m1 -F guarantees <<<"$refused")"
else
  fail "(8) sbatch --malleable=2:2 -c 1: exit $rc, queue '$before' -> '$(queued)', output: $refused"
  [ "$rc" -ne 0 ] || scancel "${refused%%;*}" 2>/dev/null
fi

# ---- (9) the AdminComment, merged by slurmctld's job_submit.lua ------------------------------------
# A job that ends by itself (scancel ends it in Slurm first, which then refuses updates).
short_py='import mall, time
c = mall.Client()
end = time.time() + 3
while time.time() < end:
    c.step()
    time.sleep(0.02)'
if jc=$(submit ending --malleable=1:2 -c 1 --wrap "exec python3 -c '$short_py'") &&
   wait_until "$wait_s" "job $jc to end" job_final "$jc" && wait_until "$wait_s" "malld to forget job $jc" job_gone_and_released "slurm-$jc"; then
  comment=$(scontrol show job "$jc" | sed -n 's/^ *AdminComment=//p')
  if [[ $comment == mall:site:*ended_at=* ]] && [[ $comment != *mall-merge* ]] &&
     journalctl -u malld --no-pager -o cat | grep -q 'AdminComment segments merged by slurmctld'; then
    pass "(9) job $jc ($(job_state "$jc")) ended with its AdminComment merged by job_submit.lua: $comment"
  else
    fail "(9) job $jc's AdminComment is '$comment' (want mall:site:...ended_at=..., merged by /etc/slurm/job_submit.lua); malld: $(journalctl -u malld --no-pager -o cat | grep -m1 'checking Slurm')"
  fi
else
  fail "(9) the short malleable job '${jc:-}' did not end and leave malld within ${wait_s}s ($(job_state "${jc:-0}")): $(tail -n 5 "$work/ending.out" 2>/dev/null | tr '\n' '|')"
fi
jobs_started=()

kill "$watchdog_pid" 2>/dev/null
[ "$failures" -eq 0 ] || { echo "site_slurm.sh: $failures check(s) failed"; exit 1; }
echo "site_slurm.sh: all checks passed"
