#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# site_docker.sh — the guest script of ctest vm.site_docker: docker
# (Debian 13's docker.io 26, containerd, runc) with its systemd cgroup driver (its default under
# systemd with cgroup v2) runs malleable containers of malld.service through `mallrun --container`:
#   (1) setup: mall from its .deb, malld.service active; dockerd uses the systemd cgroup driver
#       (daemon.json: no bridge, no iptables: the guest has no network); an image imported from a
#       tiny root (`docker import`, no registry), the guest's /usr bind-mounted read-only;
#   (2) `mallrun --container -- docker run -d ...`: the job's cgroup is the slice mall-<job>.slice in
#       mall.slice (--cgroup-parent), the container's init in /mall.slice/mall-<job>.slice/docker-<id>.scope;
#   (3) it follows `mallctl set`: `mallctl status --json`, the slice's AllowedCPUs, the slice's and
#       the container scope's cpuset.cpus.effective and every thread's Cpus_allowed_list agree,
#       through a shrink and a growth; a restarted malld re-adopts the job;
#   (4) the container's init SIGKILLed: the job ends, the container's scope, the slice, mall.slice
#       and the slice's drop-in go;
#   (5) a foreground `mallrun --container -- docker run --rm ...`: its exit status comes back, it ran
#       inside the job's one cpu, and nothing is left;
#   (6) nothing left: no container, scope, slice, drop-in or job.
# Expects run-in-site-vm.sh (MALL_IN_SITE_VM=1, $MALL_SITE_DEB) and a root with docker.io. One
# PASS/FAIL line per check; exit 1 when any fails, 77 outside such a guest. Watchdog:
# MALL_SITE_DOCKER_TIMEOUT_S (default 900 s); each wait at most MALL_SITE_DOCKER_WAIT_S (90 s);
# MALL_SITE_DOCKER_PLAIN=1 keeps dockerd's packaged configuration (bridge, iptables).
set -uo pipefail

if [ "${1:-}" = -h ] || [ "${1:-}" = --help ]; then sed -n '3,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0; fi
limit_s=${MALL_SITE_DOCKER_TIMEOUT_S:-900}
# The shared helpers: in $MALL_SITE_FILES (run-site-tests.sh carries them), else beside this script.
for common in "${MALL_SITE_FILES:-/nonexistent}/site_common.sh" "$(dirname "$0")/site_common.sh" "$(dirname "$0")/../site_common.sh"; do
  [ -r "$common" ] && break
done
# shellcheck source=../site_common.sh
. "$common" || { echo "FAIL: site_common.sh not found (run-in-site-vm.sh --file tests/vm/site/site_common.sh)"; exit 1; }
run_watched "$limit_s" MALL_SITE_DOCKER_WATCHED "$0" "$@"   # TERM after limit_s: the trap cleans up
wait_s=${MALL_SITE_DOCKER_WAIT_S:-90}
out=${MALL_SITE_OUT:+$MALL_SITE_OUT/docker}
prefix=mall-site-docker
image=mall-site-root:1
t_start=$SECONDS

require_site_guest "needs root" "runs only in the site guest (MALL_IN_SITE_VM=1)"
command -v docker >/dev/null && command -v jq >/dev/null || fatal "the site root lacks docker or jq"

work=$(mktemp -d /tmp/site_docker.XXXXXX)
dk() { timeout "$wait_s" docker "$@"; }
# shellcheck disable=SC2317
cleanup() {
  local rc=$? c
  trap - EXIT TERM INT
  if [ -n "$out" ]; then
    mkdir -p "$out"
    journalctl -u malld --no-pager -o short-precise >"$out/journal-malld.txt" 2>&1
    journalctl -u docker -u containerd --no-pager -o short-precise >"$out/journal-docker.txt" 2>&1
    cp -f "$work"/*.txt "$work"/*.json "$work"/*.log "$out/" 2>/dev/null
  fi
  for c in $(timeout 60 docker ps -a --format '{{.Names}}' 2>/dev/null | grep "^$prefix-"); do
    timeout 60 docker rm -f "$c" >/dev/null 2>&1
  done
  timeout 60 docker rmi -f "$image" >/dev/null 2>&1
  stop_mall_slices
  rm -rf "$work"
  if [ "$rc" = 0 ] && [ "$failures" -gt 0 ]; then rc=1; fi
  echo "site_docker: $failures failure(s) in $((SECONDS - t_start)) s"
  exit "$rc"
}
trap cleanup EXIT
trap 'echo "FAIL: watchdog: site_docker.sh still running after $limit_s s (or was terminated)"; exit 1' TERM
trap 'exit 130' INT


# --- (1) mall and docker ----------------------------------------------------------------------------
t=$SECONDS
install_mall_deb "$work/apt.txt"
start_malld
pool=$(status_json | jq -r .pool)
note "mall installed, malld up in $((SECONDS - t)) s; docker.service at boot: $(systemctl is-active docker)"
t=$SECONDS
# MALL_SITE_DOCKER_PLAIN=1: dockerd as the package starts it (its docker0 bridge and iptables rules);
# else no bridge and no iptables (the guest has no network, the containers use --network=none).
if [ "${MALL_SITE_DOCKER_PLAIN:-}" = 1 ]; then
  systemctl start docker >"$work/docker-start.txt" 2>&1 || fatal "systemctl start docker: $(cat "$work/docker-start.txt"; journalctl -u docker --no-pager | tail -n 30)"
else
  mkdir -p /etc/docker
  printf '{ "bridge": "none", "iptables": false, "ip6tables": false }\n' >/etc/docker/daemon.json
  systemctl restart docker >"$work/docker-start.txt" 2>&1 || fatal "systemctl restart docker: $(cat "$work/docker-start.txt"; journalctl -u docker --no-pager | tail -n 30)"
fi
wait_until "$wait_s" "dockerd to answer" dk info || fatal "dockerd does not answer: $(journalctl -u docker --no-pager | tail -n 30)"
driver=$(dk info --format '{{.CgroupDriver}}')
cgver=$(dk info --format '{{.CgroupVersion}}')
runtime=$(dk info --format '{{.DefaultRuntime}}')
[ "$driver" = systemd ] && [ "$cgver" = 2 ] &&
  pass "docker $(dk version --format '{{.Server.Version}}') (runtime $runtime, $(runc --version | head -n 1)) uses the systemd cgroup driver on cgroup v$cgver (up in $((SECONDS - t)) s); malld $(dpkg-query -W -f='${Version}' mall), pool $pool" ||
  fatal "docker uses cgroup driver '$driver' on cgroup v'$cgver', not systemd on v2"

t=$SECONDS
rootfs=$work/rootfs
make_tiny_root "$rootfs"
tar -C "$rootfs" -cf "$work/rootfs.tar" . && dk import "$work/rootfs.tar" "$image" >"$work/import.txt" 2>&1 &&
  pass "docker import of a tiny root as $image ($((SECONDS - t)) s)" || fatal "docker import: $(cat "$work/import.txt")"
write_train_py "$work/train.py"
run_opts=(--network=none --volume=/usr:/usr:ro --volume=/etc/ld.so.cache:/etc/ld.so.cache:ro
          --volume="$work:$work:ro")

# --- (2) mallrun --container -- docker run -d --------------------------------------------------------
job=dk-1
slice='mall-dk\x2d1.slice'
name=$prefix-dk1
t=$SECONDS
env -u INVOCATION_ID mallrun --container --malleable=1:2 --job "$job" --require --verbose -- \
  docker run -d --name "$name" "${run_opts[@]}" "$image" /usr/bin/python3 "$work/train.py" \
  >"$work/mallrun-dk1.txt" 2>&1 </dev/null
rc=$?
cat "$work/mallrun-dk1.txt" | sed 's/^/  | /'
[ "$rc" = 0 ] && pass "mallrun --container -- docker run -d: exit 0 after $((SECONDS - t)) s" ||
  fatal "mallrun --container -- docker run -d exited $rc"
# As root mallrun runs the engine from the system folders, by its full path (issue 37).
grep -E "mallrun: running (/usr/s?bin/|/s?bin/)?docker run" "$work/mallrun-dk1.txt" | grep -qF -- "--cgroup-parent=$slice" &&
  pass "mallrun ran docker with --cgroup-parent=$slice" || fail "mallrun's docker command lacks --cgroup-parent=$slice"
cid=$(dk inspect --format '{{.Id}}' "$name")
cpid=$(dk inspect --format '{{.State.Pid}}' "$name")
note "docker inspect: CgroupParent '$(dk inspect --format '{{.HostConfig.CgroupParent}}' "$name")', pid $cpid"
[ -n "$cpid" ] && [ "$cpid" != 0 ] || fatal "docker inspect gives no pid for $name"
want_cg="/mall.slice/$slice/docker-$cid.scope"
got_cg=$(cut -d: -f3 "/proc/$cpid/cgroup")
[ "$got_cg" = "$want_cg" ] && pass "the container's init (pid $cpid) is in $got_cg" ||
  fail "the container's init is in '$got_cg', not $want_cg"
slice_dir=/sys/fs/cgroup/mall.slice/$slice
scope_dir=/sys/fs/cgroup$got_cg
[ "$(job_field "$job" cgroup)" = "$slice_dir" ] && pass "mallctl status names the job's cgroup: $slice_dir" ||
  fail "mallctl status names the cgroup '$(job_field "$job" cgroup)', not $slice_dir"
[ "$(job_field "$job" container)" = true ] || fail "mallctl status does not mark $job as a container job"
wait_until "$wait_s" "the container's init to join the job" sh -c "mallctl status --json | jq -e --arg j '$job' '.jobs[] | select(.job == \$j) | .pids | index($cpid)'" &&
  pass "the container's init joined the job (pids $(job_field "$job" 'pids | map(tostring) | join(",")'))" ||
  fail "the job's pids $(job_field "$job" 'pids | map(tostring) | join(",")') lack the container's init $cpid"
note "scope unit: $(systemctl show -p Slice -p Delegate -p ControlGroup --value "docker-$cid.scope" | paste -sd' ' -)"

# --- (3) it follows mallctl set --------------------------------------------------------------------
# Where the job's cpus show: malld's status, the container init's threads, the slice's AllowedCPUs
# and cpuset.cpus.effective of the slice and the container's scope.
where=("$job" "$cpid" "$slice" slice "$slice_dir" scope "$scope_dir")
follow_set "${where[@]}"
[ -f "/run/systemd/system.control/$slice.d/50-AllowedCPUs.conf" ] &&
  pass "malld resized the slice through systemd (set-property drop-in in /run/systemd/system.control/$slice.d)" ||
  fail "no set-property drop-in for $slice"
restart_readopts "$slice_dir" "${where[@]}"

# --- (4) SIGKILL ------------------------------------------------------------------------------------
t=$SECONDS
kill -KILL "$cpid"
wait_until "$wait_s" "job $job to end" job_gone "$job" && pass "SIGKILL of the container's init: job $job ended ($((SECONDS - t)) s)" ||
  fail "job $job is still listed after its container was SIGKILLed: $(status_json | jq -c .jobs)"
wait_until "$wait_s" "the scope to go" sh -c "! systemctl list-units --plain --no-legend 'docker-$cid.scope' | grep -q ." &&
  pass "docker-$cid.scope is gone (before docker rm)" || fail "scope left: $(systemctl list-units --plain --no-legend "docker-$cid.scope")"
wait_until "$wait_s" "the slice to go" no_slice "$slice" && pass "$slice is stopped and its cgroup gone (before docker rm, $((SECONDS - t)) s)" ||
  fail "$slice is left: $(systemctl show -p ActiveState --value "$slice"), $(ls -d "$slice_dir" 2>&1)"
note "docker ps -a after the kill: $(dk ps -a --filter "name=$name" --format '{{.Status}}')"
dk rm -f "$name" >/dev/null 2>&1
[ ! -e "/run/systemd/system.control/$slice.d" ] && pass "the slice's set-property drop-in is gone" ||
  fail "/run/systemd/system.control/$slice.d is left"
check_mall_slice_gone

# --- (5) a foreground run ---------------------------------------------------------------------------
check_foreground_run dk2 docker --name "$prefix-dk2" "${run_opts[@]}" "$image"

# --- (6) nothing left ------------------------------------------------------------------------------
left=$(
  dk ps -a --format '{{.Names}}' | grep "^$prefix-"
  systemctl list-units --all --plain --no-legend 'mall*.slice' 'docker-*.scope' | awk '$3 != "inactive" {print $1}'
  ls -d /run/systemd/system.control/mall* /sys/fs/cgroup/mall.slice 2>/dev/null
  status_json | jq -r '.jobs[].job'
)
[ -z "$left" ] && pass "nothing left: no container, scope, slice, drop-in or job" || fail "left behind: $(echo "$left" | tr '\n' ' ')"
