#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# site_podman.sh — the guest script of ctest vm.site_podman: podman 5 with crun and the systemd cgroup
# manager (Debian 13's defaults) runs malleable containers of malld.service, both ways mall offers:
#   (1) setup: mall from its .deb, malld.service active; podman uses crun and the systemd manager;
#   (2) `mallrun --container -- podman run -d ...` (run from no unit, as from a login shell): the
#       job's cgroup is the slice mall-<job>.slice in mall.slice (the engine's --cgroup-parent), the
#       container's init in /mall.slice/mall-<job>.slice/libpod-<id>.scope/container;
#   (3) it follows `mallctl set`: `mallctl status --json`, systemd's AllowedCPUs of the slice, the
#       slice's cpuset.cpus.effective and every thread's Cpus_allowed_list of the container's init
#       agree, through a shrink and a growth;
#       a `systemctl restart malld` re-adopts the job in its slice, and a resize after it works;
#   (4) the container's init SIGKILLed: the job ends, the container's and conmon's scopes, the
#       slice, mall.slice and the slice's set-property drop-in go;
#   (5) a foreground `mallrun --container -- podman run --rm ...`: its exit status comes back, the
#       container ran inside the job's cpus, and nothing is left;
#   (6) the OCI hook (`podman --hooks-dir` with mall's hooks.d files, --annotation io.mall.job=...):
#       the job is registered in place in crun's /machine.slice/libpod-<id>.scope/container and
#       follows `mallctl set` the same way (that cgroup's cpuset.cpus.effective, the threads);
#   (7) that container SIGKILLed: the job ends, poststop ran, its scope goes;
#   (8) nothing left: no container, no libpod or mall scope or slice, no drop-in, no job folder.
# Expects (run-in-site-vm.sh runs it so): root in the site guest (MALL_IN_SITE_VM=1), mall installed
# or its .deb in $MALL_SITE_DEB. No registry: `podman run --rootfs DIR`, a tiny root with the guest's
# /usr bind-mounted read-only. One PASS/FAIL line per check; exit 1 when any fails, 77 with the reason
# outside such a guest. Logs go to $MALL_SITE_OUT/podman/ when set. Its own watchdog
# (MALL_SITE_PODMAN_TIMEOUT_S, default 600 s) fails a hang; every step waits at most
# MALL_SITE_PODMAN_WAIT_S (default 90 s: podman under TCG takes seconds per command).
set -uo pipefail

if [ "${1:-}" = -h ] || [ "${1:-}" = --help ]; then sed -n '3,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0; fi
limit_s=${MALL_SITE_PODMAN_TIMEOUT_S:-600}
# The shared helpers: in $MALL_SITE_FILES (run-site-tests.sh carries them), else beside this script.
for common in "${MALL_SITE_FILES:-/nonexistent}/site_common.sh" "$(dirname "$0")/site_common.sh" "$(dirname "$0")/../site_common.sh"; do
  [ -r "$common" ] && break
done
# shellcheck source=../site_common.sh
. "$common" || { echo "FAIL: site_common.sh not found (run-in-site-vm.sh --file tests/vm/site/site_common.sh)"; exit 1; }
# The watchdog: this script runs again under timeout(1), TERM after limit_s (the trap cleans up).
run_watched "$limit_s" MALL_SITE_PODMAN_WATCHED "$0" "$@"
wait_s=${MALL_SITE_PODMAN_WAIT_S:-90}
out=${MALL_SITE_OUT:+$MALL_SITE_OUT/podman}
prefix=mall-site-podman

require_site_guest "needs root (installs a package, runs rootful podman, starts services)" \
  "runs only in the site guest (MALL_IN_SITE_VM=1, tests/vm/site/run-in-site-vm.sh): it installs mall and starts malld.service"
command -v podman >/dev/null && command -v crun >/dev/null && command -v jq >/dev/null ||
  fatal "the site root lacks podman, crun or jq (make-site-root.sh's package list)"

work=$(mktemp -d /tmp/site_podman.XXXXXX)
# Podman commands are bounded too: a hung podman fails its step, never the whole boot.
pm() { timeout "$wait_s" podman "$@"; }
# shellcheck disable=SC2317  # called from the trap
cleanup() {
  local rc=$? c
  trap - EXIT TERM INT
  if [ -n "$out" ]; then
    mkdir -p "$out"
    journalctl -u malld --no-pager -o short-precise >"$out/journal-malld.txt" 2>&1
    cp -f "$work"/*.txt "$work"/*.json "$work"/*.log "$out/" 2>/dev/null
  fi
  # Our containers (by name), then whatever of ours systemd still holds.
  for c in $(timeout 60 podman ps -a --format '{{.Names}}' 2>/dev/null | grep "^$prefix-"); do
    timeout 60 podman rm -f -t 0 "$c" >/dev/null 2>&1
  done
  stop_mall_slices
  rm -rf "$work"
  if [ "$rc" = 0 ] && [ "$failures" -gt 0 ]; then rc=1; fi
  echo "site_podman: $failures failure(s)"
  exit "$rc"
}
trap cleanup EXIT
trap 'echo "FAIL: watchdog: site_podman.sh still running after $limit_s s (or was terminated)"; exit 1' TERM
trap 'exit 130' INT


# --- (1) mall and podman ----------------------------------------------------------------------------
install_mall_deb "$work/apt.txt"
start_malld
pool=$(status_json | jq -r .pool)
manager=$(pm info --format '{{.Host.CgroupManager}}' 2>"$work/info.txt")
runtime=$(pm info --format '{{.Host.OCIRuntime.Name}}' 2>>"$work/info.txt")
[ "$manager" = systemd ] && [ "$runtime" = crun ] &&
  pass "podman $(pm version --format '{{.Client.Version}}' 2>/dev/null) uses crun ($(crun --version | head -n 1)) and the systemd cgroup manager; malld $(dpkg-query -W -f='${Version}' mall), pool $pool" ||
  fatal "podman uses runtime '$runtime' and cgroup manager '$manager', not crun and systemd: $(cat "$work/info.txt")"
[ "$pool" = 0-1 ] || note "the pool is $pool (the checks below expect a 2-cpu guest: 0-1)"

# The tiny root, with the guest's /usr coming in read-only; the training-like program.
rootfs=$work/rootfs
make_tiny_root "$rootfs"
write_train_py "$work/train.py"
run_opts=(--network=none --volume=/usr:/usr:ro --volume=/etc/ld.so.cache:/etc/ld.so.cache:ro
          --volume="$work:$work:ro" --rootfs "$rootfs")

# --- (2) mallrun --container: the job's slice -------------------------------------------------------
job=pc-1   # a '-' in the name: the slice name escapes it (mall-pc\x2d1.slice)
slice='mall-pc\x2d1.slice'
name=$prefix-pc1
t=$SECONDS
# No INVOCATION_ID: podman then gives conmon a scope of its own in the slice, as from a login shell.
env -u INVOCATION_ID mallrun --container --malleable=1:2 --job "$job" --require --verbose -- \
  podman run -d --name "$name" "${run_opts[@]}" /usr/bin/python3 "$work/train.py" \
  >"$work/mallrun-pc1.txt" 2>&1 </dev/null
rc=$?
[ "$rc" = 0 ] && pass "mallrun --container -- podman run -d: exit 0 after $((SECONDS - t)) s" ||
  fatal "mallrun --container -- podman run -d exited $rc: $(cat "$work/mallrun-pc1.txt")"
grep -F -- "--cgroup-manager=systemd run" "$work/mallrun-pc1.txt" | grep -qF -- "--cgroup-parent=$slice" &&
  pass "mallrun ran podman with --cgroup-manager=systemd and --cgroup-parent=$slice" ||
  fail "mallrun's podman command lacks the systemd manager and the slice: $(grep 'running' "$work/mallrun-pc1.txt")"
cid=$(pm inspect --format '{{.Id}}' "$name")
cpid=$(pm inspect --format '{{.State.Pid}}' "$name")
[ -n "$cpid" ] && [ "$cpid" != 0 ] || fatal "podman inspect gives no pid for $name"
want_cg="/mall.slice/$slice/libpod-$cid.scope/container"
got_cg=$(cut -d: -f3 "/proc/$cpid/cgroup")
[ "$got_cg" = "$want_cg" ] && pass "the container's init (pid $cpid) is in $got_cg" ||
  fail "the container's init is in '$got_cg', not $want_cg"
slice_dir=/sys/fs/cgroup/mall.slice/$slice
[ "$(job_field "$job" cgroup)" = "$slice_dir" ] && pass "mallctl status names the job's cgroup: $slice_dir" ||
  fail "mallctl status names the cgroup '$(job_field "$job" cgroup)', not $slice_dir"
[ "$(job_field "$job" container)" = true ] || fail "mallctl status does not mark $job as a container job"
wait_until "$wait_s" "the container's init to join the job" sh -c "mallctl status --json | jq -e --arg j '$job' '.jobs[] | select(.job == \$j) | .pids | index($cpid)'" &&
  pass "the container's init joined the job from its slice (pids $(job_field "$job" 'pids | map(tostring) | join(",")'))" ||
  fail "the job's pids $(job_field "$job" 'pids | map(tostring) | join(",")') lack the container's init $cpid"
conmon_cg=$(systemctl show -p ControlGroup --value "libpod-conmon-$cid.scope" 2>/dev/null)
[ "$conmon_cg" = "/mall.slice/$slice/libpod-conmon-$cid.scope" ] && pass "conmon has its scope in the job's slice" ||
  note "conmon's scope is '$conmon_cg' (podman moves conmon only when it runs outside a systemd unit)"

# --- (3) it follows mallctl set --------------------------------------------------------------------
follow_set "$job" "$cpid" "$slice" "$(basename "$slice_dir")" "$slice_dir"
[ -f "/run/systemd/system.control/$slice.d/50-AllowedCPUs.conf" ] &&
  pass "malld resized the slice through systemd (set-property --runtime: /run/systemd/system.control/$slice.d)" ||
  fail "no set-property drop-in for $slice in /run/systemd/system.control"
# A restarted malld re-adopts the job as a slice job: its status names the slice, and a resize
# still goes through systemd to the slice.
restart_readopts "$slice_dir" "$job" "$cpid" "$slice" "$(basename "$slice_dir")" "$slice_dir"

# --- (4) the container SIGKILLed ends the job and its slice -----------------------------------------
kill -KILL "$cpid"
wait_until "$wait_s" "job $job to end" job_gone "$job" && pass "SIGKILL of the container's init: job $job ended" ||
  fail "job $job is still listed after its container was SIGKILLed: $(status_json | jq -c .jobs)"
pm rm -f -t 0 "$name" >/dev/null 2>&1
wait_until "$wait_s" "the slice to go" no_slice "$slice" && pass "$slice is stopped and its cgroup gone" ||
  fail "$slice is left: $(systemctl show -p ActiveState --value "$slice"), $(ls -d "$slice_dir" 2>&1)"
wait_until "$wait_s" "the scopes to go" sh -c "! systemctl list-units --plain --no-legend '*$cid*' | grep -q ." &&
  pass "the container's scopes are gone" || fail "scopes left: $(systemctl list-units --plain --no-legend "*$cid*")"
[ ! -e "/run/systemd/system.control/$slice.d" ] && pass "the slice's set-property drop-in is gone (systemctl revert)" ||
  fail "/run/systemd/system.control/$slice.d is left: $(ls "/run/systemd/system.control/$slice.d" 2>&1)"
check_mall_slice_gone

# --- (5) a foreground run: its status comes back, inside the job's cpus ----------------------------
check_foreground_run pc2 podman --name "$prefix-pc2" "${run_opts[@]}"

# --- (6) the OCI hook with crun and systemd: in place in crun's container cgroup -------------------
hooks=$work/hooks.d
mkdir -p "$hooks"
for stage in createRuntime poststop; do
  cat >"$hooks/mall-$stage.json" <<EOF
{
  "version": "1.0.0",
  "hook": {
    "path": "$(command -v mall-oci-hook)",
    "args": ["mall-oci-hook", "--socket", "/run/mall/malld.sock", "--log", "$work/hook.log", "$stage"],
    "timeout": 30
  },
  "when": { "annotations": { "^io\\\\.mall\\\\.malleable\$": ".+" } },
  "stages": ["$stage"]
}
EOF
done
# The hook names the job under its --job-prefix (default ctr-): io.mall.job=hk-1 is job ctr-hk-1.
annotation_job=hk-1 job=ctr-hk-1 name=$prefix-hk
t=$SECONDS
pm --hooks-dir "$hooks" run -d --name "$name" --annotation io.mall.malleable=1:2 --annotation "io.mall.job=$annotation_job" \
  "${run_opts[@]}" /usr/bin/python3 "$work/train.py" >"$work/hook-run.txt" 2>&1 ||
  fatal "podman --hooks-dir run with io.mall.job=$annotation_job failed: $(cat "$work/hook-run.txt")"
pass "podman --hooks-dir ... run -d --annotation io.mall.job=$annotation_job (job $job): started in $((SECONDS - t)) s"
cid=$(pm inspect --format '{{.Id}}' "$name")
cpid=$(pm inspect --format '{{.State.Pid}}' "$name")
want_cg="/machine.slice/libpod-$cid.scope/container"
got_cg=$(cut -d: -f3 "/proc/$cpid/cgroup")
[ "$got_cg" = "$want_cg" ] && pass "the container's init (pid $cpid) is in crun's $got_cg" ||
  fail "the container's init is in '$got_cg', not $want_cg"
hook_dir=/sys/fs/cgroup$got_cg
[ "$(job_field "$job" cgroup)" = "$hook_dir" ] && pass "job $job is enforced in place there (mallctl status)" ||
  fail "job $job's cgroup is '$(job_field "$job" cgroup)', not $hook_dir: $(status_json | jq -c .jobs)"
grep -q "is job $job" "$work/hook.log" && pass "createRuntime registered it: $(grep "is job $job" "$work/hook.log" | tail -n 1 | cut -c1-160)" ||
  fail "the hook's log has no registration: $(cat "$work/hook.log" 2>&1)"
follow_set "$job" "$cpid" '' "$(basename "$hook_dir")" "$hook_dir"
scope=/sys/fs/cgroup/machine.slice/libpod-$cid.scope
[ -z "$(cat "$scope/cpuset.cpus")" ] && pass "systemd's scope itself was not written (cpuset.cpus empty: malld wrote only crun's delegated 'container' cgroup)" ||
  fail "the scope's own cpuset.cpus is '$(cat "$scope/cpuset.cpus")': malld wrote a file systemd owns"

# --- (7) that container SIGKILLed -------------------------------------------------------------------
kill -KILL "$cpid"
wait_until "$wait_s" "job $job to end" job_gone "$job" && pass "SIGKILL of the hooked container's init: job $job ended" ||
  fail "job $job is still listed: $(status_json | jq -c .jobs)"
pm rm -f -t 0 "$name" >/dev/null 2>&1
wait_until "$wait_s" "poststop" grep -qE "deregistered job $job|job $job had already ended" "$work/hook.log" &&
  pass "poststop ran: $(grep -E "job $job" "$work/hook.log" | tail -n 1 | cut -c1-160)" || fail "no poststop line in the hook's log: $(tail -n 5 "$work/hook.log")"
wait_until "$wait_s" "the scope to go" sh -c "[ ! -d '$scope' ]" && pass "libpod-$cid.scope is gone" || fail "$scope is left"

# --- (8) nothing left ------------------------------------------------------------------------------
left=$(
  pm ps -a --format '{{.Names}}' | grep "^$prefix-"
  systemctl list-units --all --plain --no-legend 'mall*.slice' 'libpod-*' | awk '$3 != "inactive" {print $1}'
  ls -d /run/systemd/system.control/mall* /sys/fs/cgroup/mall.slice /sys/fs/cgroup/system.slice/malld.service/mall/job_* 2>/dev/null
  status_json | jq -r '.jobs[].job'
)
[ -z "$left" ] && pass "nothing left: no container, scope, slice, drop-in, job folder or job" || fail "left behind: $(echo "$left" | tr '\n' ' ')"
