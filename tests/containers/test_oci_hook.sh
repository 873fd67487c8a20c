#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# test_oci_hook.sh — ctest containers.oci_hook: podman containers become malleable jobs through the
# OCI hook (mall-oci-hook, with the hooks.d files and the containers.conf lines this repository
# ships in launch_scripts/examples), checked as a user sees them: mallctl status lists the container
# as a job enforced in place in its own cgroup, mallctl set moves its cores (nproc inside, the
# init's affinity on the host), libmall inside attaches and follows, removal ends the job and the
# cgroup, containers without the annotation are left alone, bad annotations and io.mall.require
# stop a start with words, and nothing is left behind.
# Exit 0 pass, 1 fail, 2 usage, 77 skip (not root, or podman not installed: printed, and logged to
# $MALL_TEST_SKIP_LOG); --help for the manual.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source=container_kit.sh
. "$here/container_kit.sh"

usage() {
  cat <<'EOF'
NAME
    test_oci_hook.sh - the mall OCI hook with podman (ctest containers.oci_hook, label containers)

SYNOPSIS
    test_oci_hook.sh --bin-dir DIR [--timeout SECONDS]
    test_oci_hook.sh --help

DESCRIPTION
    Starts a private malld with the cgroup backend (--backend auto, a unique --cgroup-parent) on a
    socket in the container kit's folder, installs the shipped hooks.d files
    (launch_scripts/examples/mall-hooks.d, with this build's mall-oci-hook, the private socket and
    a --log file) in the kit's private podman, and the shipped containers.conf lines
    (launch_scripts/examples/containers.conf.mall, with the private socket folder). Then:
      0. a container without io.mall.* annotations sees MALL_SOCKET and the socket (from the
         containers.conf lines alone), reaches malld with mallctl, cannot write in the socket's
         folder (mounted read-only), and is not registered;
      1. a container run with io.mall.malleable=1:2 and io.mall.job=hookjob is job ctr-hookjob in
         `mallctl status --json`: its init's pid, its container cgroup in "cgroups" with in_place
         true, uid 0, min 1, max 2; its init started on the job's cpus;
      2. `mallctl set ctr-hookjob --cpus C` narrows the container: nproc inside is 1, the init's
         Cpus_allowed_list on the host is C, its cgroup's cpuset.cpus is C; `--cpus auto` brings
         back the pool;
      3. mall_test_client (libmall) exec'd inside with MALL_JOB_ID attaches (status: attached)
         and follows a move to C and back; a container started as --user 1234 with only the
         annotation io.mall.malleable=1 (no MALL_JOB_ID, no mall run options: the default job
         name ctr-<id>, the whole pool as MAX, uid 1234) runs mall_test_client, which attaches
         without a job name (malld finds a container job's processes by their cgroup); a second
         container naming the same job runs unregistered, and its poststop leaves the job alone;
         the hook run by hand maps a container uid through linux.uidMappings, and its poststop
         deregisters a job that is still there;
      4. podman rm -f runs poststop: the job is gone from status, the container's cgroup folder
         is gone, the hook's log shows the poststop;
      5. io.mall.malleable=3:1 fails the start with the hook's line naming the annotation, also
         without io.mall.require; io.mall.malleable=3 (more than the pool) with
         io.mall.require=true does not start, without it the container runs unregistered;
         io.mall.job=slurm-5 is job ctr-slurm-5 (the hooks.d file's --job-prefix);
      6. after malld stops and the kit cleans up: no job left, malld's --cgroup-parent folder
         gone in every hierarchy, and the kit's leak check finds nothing.
    Every engine command has a watchdog (CTR_STEP_TIMEOUT_S, here 30 s), the whole run --timeout.
    Timings are printed.

OPTIONS
    --bin-dir DIR     the build's runtime output folder: malld, mallctl, mall-oci-hook and
                      mall_test_client are taken from there (and mounted read-only inside)
    --timeout S       the whole run's watchdog (default 180)

EXIT STATUS
    0 every check passed; 1 a check failed (FAIL lines say which); 2 usage; 77 skipped: not root,
    or podman (or runc, conmon) is not installed.
EOF
}

bin="" timeout_s=180
while [ $# -gt 0 ]; do
  case $1 in
    --bin-dir) bin=${2-}; shift 2 || { usage >&2; exit 2; } ;;
    --timeout) timeout_s=${2-}; shift 2 || { usage >&2; exit 2; } ;;
    -h|--help) usage; exit 0 ;;
    *) echo "test_oci_hook.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
done
[ -n "$bin" ] || { echo "test_oci_hook.sh: --bin-dir is required" >&2; exit 2; }
watchdog_script "$timeout_s" --bin-dir "$bin" --timeout "$timeout_s"
export CTR_STEP_TIMEOUT_S=${CTR_STEP_TIMEOUT_S:-30}

ctr_test_reporting containers.oci_hook   # pass, fail, note, skip
t_start=$(ctr__now_ms)
skip_all() { skip "$1"; exit 77; }

[ "$(id -u)" -eq 0 ] || skip_all "needs root (cgroup folders, malld's cgroup backend, podman as root); run as root"
ctr_have podman || skip_all "$CTR_WHY"
for p in malld mallctl mall-oci-hook mall_test_client; do
  [ -x "$bin/$p" ] || { fail "$bin/$p is missing: build it first (ninja malld mallctl mall-oci-hook mall_test_client)"; exit 1; }
done
command -v jq >/dev/null || { fail "jq is not installed (launch_scripts/install-deps.sh installs it)"; exit 1; }
bin=$(cd "$bin" && pwd)
examples=$repo/launch_scripts/examples

ctr_sweep
ctr_init ocihook || { fail "ctr_init"; exit 1; }
sock=$CTR_DIR/sock/malld.sock
hook_log=$CTR_DIR/hook.log
# malld's --cgroup-parent: one folder name (no '/'), unique to this run, removed by malld at stop.
mparent=${CTR_CGROUP#/}-malld
mparent_dirs() { ctr_malld_parent_dirs "$mparent"; }
remove_mparent() { ctr_malld_parent_remove "$mparent"; }
cleanup() {
  trap - EXIT
  ctr_malld_stop
  ctr_cleanup
  remove_mparent
}
trap cleanup EXIT
trap 'watchdog_fired "$timeout_s"; exit 1' TERM
trap 'echo "FAIL: interrupted"; exit 130' INT
note "kit folder $CTR_DIR, cgroup $CTR_CGROUP, malld's --cgroup-parent $mparent"

# ---- helpers -------------------------------------------------------------------------------------
mstatus() { ctr_malld_status "$bin" "$sock"; }
job_json() { mstatus | jq -c --arg j "$1" '.jobs[] | select(.job == $j)'; }
job_cpus_are() { [ "$(job_json "$1" | jq -r 'select(.state == "settled") | .cpus')" = "$2" ]; }
job_absent() { mstatus >/dev/null && [ -z "$(job_json "$1")" ]; }
cpus_allowed() { awk '/^Cpus_allowed_list:/ { print $2 }' "/proc/$1/status"; }
norm_cpus() { ctr__cpulist_expand "$1" | paste -sd, -; }
times=()

# ---- a private malld with the cgroup backend -------------------------------------------------------
ctr_malld_start "$bin" "$sock" --cgroup-parent "$mparent" --log-level info || { fail "private malld (log above)"; exit 1; }
backend=$(mstatus | jq -r .backend) pool=$(mstatus | jq -r .pool)
case $backend in
  cgroup-v1|cgroup-v2) pass "private malld answers on $sock (backend $backend, pool $pool)" ;;
  *) fail "malld chose backend '$backend': a container job is enforced in its cgroup, which needs cgroup-v1 or cgroup-v2"
     sed 's/^/      /' "$CTR_DIR/malld.log"; exit 1 ;;
esac
npool=$(ctr__cpulist_expand "$pool" | wc -l)
cpu_last=$(ctr__cpulist_expand "$pool" | tail -n 1)

# ---- the shipped hooks.d files and containers.conf lines in the kit's private podman --------------
ctr_podman version >/dev/null || { fail "podman version (private podman setup)"; exit 1; }
hooks_dir=$CTR_DIR/podman/hooks.d
for f in "$examples"/mall-hooks.d/*.json; do
  # This build's hook, the private socket, and a log of what it did (its stderr reaches podman's
  # output only when it fails).
  sed -e "s#\"/usr/local/bin/mall-oci-hook\"#\"$bin/mall-oci-hook\"#" \
      -e "s#\"--socket\", \"/run/mall/malld.sock\"#\"--log\", \"$hook_log\", \"--socket\", \"$sock\"#" \
      "$f" >"$hooks_dir/$(basename "$f")"
  if ! grep -qF "$bin/mall-oci-hook" "$hooks_dir/$(basename "$f")" || ! grep -qF "$sock" "$hooks_dir/$(basename "$f")"; then
    fail "$f: its path or --socket is not the one this test rewrites (\"/usr/local/bin/mall-oci-hook\", \"--socket\", \"/run/mall/malld.sock\")"
    exit 1
  fi
done
note "hooks: $(cd "$hooks_dir" && echo *.json)"
# containers.conf(5): the [containers] lines of the shipped snippet, socket folder made private.
conf_lines=$(grep -E '^(volumes|env) *=' "$examples/containers.conf.mall" | sed "s#/run/mall#$CTR_DIR/sock#g")
if [ "$(wc -l <<<"$conf_lines")" != 2 ]; then fail "containers.conf.mall: expected a volumes and an env line"; exit 1; fi
awk -v lines="$conf_lines" '{ print } /^\[containers\]$/ { print lines }' "$CTR_DIR/podman/containers.conf" >"$CTR_DIR/podman/containers.conf.new" &&
  mv "$CTR_DIR/podman/containers.conf.new" "$CTR_DIR/podman/containers.conf"
ctr_bind_ro "$bin"
# libmall, where this build's mall_test_client finds it (the build tree's lib folder).
libmall_dir=$(ldd "$bin/mall_test_client" | awk '$1 ~ /^libmall\.so/ && $3 ~ /^\// { print $3 }' | xargs -r dirname)
case $libmall_dir in
  ""|/usr/lib*|/lib*) ;;
  *) ctr_bind_ro "$libmall_dir" ;;
esac

# ---- 0. a container without annotations: the socket from containers.conf, no job ------------------
ctr_ms t ctr_run podman plain -d -- /usr/bin/sleep 600 >/dev/null || fail "podman run -d of a container without annotations"
times+=("podman run -d without the hook $t ms")
# shellcheck disable=SC2016  # expanded inside the container
out=$(ctr_exec podman plain /usr/bin/sh -c 'echo "$MALL_SOCKET"; test -S "$MALL_SOCKET" && echo socket')
if [ "$out" = "$sock"$'\n'socket ]; then pass "a container with the containers.conf.mall lines sees MALL_SOCKET=$sock and the socket"
else fail "inside a container with the containers.conf.mall lines: '$out' (expected $sock and a socket)"; fi
out=$(ctr_exec podman plain "$bin/mallctl" status --json 2>&1)
if [ "$(jq -r '.jobs | length' <<<"$out" 2>/dev/null)" = 0 ]; then
  pass "mallctl status inside it (MALL_SOCKET only) reaches malld, and the container is not registered (no jobs)"
else fail "mallctl status inside the unannotated container: $out"; fi
# Read-only (issue 37.1): root in a container connects to the socket (above) but cannot plant a file
# in malld's folder, e.g. a symlink for malld to follow.
out=$(ctr_exec podman plain /usr/bin/sh -c "ln -s /etc/passwd '$CTR_DIR/sock/planted' 2>&1; touch '$CTR_DIR/sock/planted2' 2>&1; echo end")
if [ ! -L "$CTR_DIR/sock/planted" ] && [ ! -e "$CTR_DIR/sock/planted2" ] && grep -q "Read-only file system" <<<"$out"; then
  pass "root in the container cannot write in the socket folder: $(head -n 1 <<<"$out")"
else
  fail "root in the container wrote in the socket folder (containers.conf.mall's volume must be :ro): $out"
  rm -f "$CTR_DIR/sock/planted" "$CTR_DIR/sock/planted2"
fi
plain_id=$(ctr_id podman plain)
if [ -e "$hook_log" ] && grep -q "container ${plain_id:0:12}" "$hook_log"; then
  fail "the hook ran for a container without io.mall.malleable:"; sed 's/^/      /' "$hook_log"
else pass "the hook did not run for it (hooks.d when.annotations)"; fi
ctr_rm podman plain || fail "rm -f of the unannotated container"

# ---- 1. a container with the annotations is job ctr-hookjob, in place ----------------------------------------
ctr_mall_opts "$sock" ctr-hookjob "$CTR_CGROUP/hookjob" || { fail "ctr_mall_opts"; exit 1; }
rc=0
ctr_ms t ctr_run podman job -d --annotation io.mall.malleable=1:2 --annotation io.mall.job=hookjob \
  "${CTR_MALL_OPTS[@]}" -- /usr/bin/sleep 600 >"$CTR_DIR/run.out" 2>&1 || rc=$?
times+=("podman run -d with the hook $t ms")
if [ "$rc" != 0 ]; then
  fail "podman run of the annotated container exited $rc:"; sed 's/^/      /' "$CTR_DIR/run.out"
  sed 's/^/      malld: /' "$CTR_DIR/malld.log"; exit 1
fi
pid=$(ctr_pid podman job) cg=$(ctr_cgroup_of "$pid") cid=$(ctr_id podman job)
note "container ${cid:0:12}: init host pid $pid, cgroup $cg; podman run -d took $t ms"
j=$(job_json ctr-hookjob)
if [ -z "$j" ]; then
  fail "mallctl status --json lists no job ctr-hookjob: $(mstatus)"; sed 's/^/      hook: /' "$hook_log" 2>/dev/null
else
  note "status: $(jq -c '{job, uid, min, max, cpus, pids, cgroups, container, attached}' <<<"$j")"
  if jq -e --arg cg "$cg" '[.cgroups[] | select((.path | endswith($cg)) and .in_place == true)] | length == 1' <<<"$j" >/dev/null; then
    pass "job ctr-hookjob is in mallctl status with the container's cgroup $cg in place"
  else fail "job ctr-hookjob's cgroups are $(jq -c .cgroups <<<"$j"), not the container's $cg in place"; fi
  if jq -e --argjson p "$pid" '(.pids | index($p)) != null and .uid == 0 and .min == 1 and .max == 2' <<<"$j" >/dev/null; then
    pass "its pids hold the init ($pid), uid 0 (root in the container, no uid map), min 1, max 2"
  else fail "job ctr-hookjob: pids/uid/min/max are $(jq -c '{pids, uid, min, max}' <<<"$j")"; fi
  # A container job: its processes are found by cgroup and attach without a job name.
  if [ "$(jq -r '.container // false' <<<"$j")" = true ]; then pass "malld lists it as a container job (\"container\": true)"
  else fail "malld does not list ctr-hookjob as a container job (no \"container\": true)"; fi
  job_cpus=$(jq -r .cpus <<<"$j")
  if [ "$(norm_cpus "$(cpus_allowed "$pid")")" = "$(norm_cpus "$job_cpus")" ]; then
    pass "the container's init runs on the job's cpus ($job_cpus)"
  else fail "the init's Cpus_allowed_list is $(cpus_allowed "$pid"), the job holds $job_cpus"; fi
fi
if grep -q "container ${cid:0:12}.* is job ctr-hookjob" "$hook_log" 2>/dev/null; then
  note "hook log: $(grep "is job ctr-hookjob" "$hook_log" | tail -n 1)"
else fail "the hook's log has no registration line for ${cid:0:12}"; fi

# ---- 2. mallctl set narrows the container and hands it back --------------------------------------------
if [ "$npool" -lt 2 ]; then
  note "the pool has one cpu: narrowing cannot be shown on this machine"
else
  ctr_ms t timeout 15 "$bin/mallctl" --socket "$sock" set ctr-hookjob --cpus "$cpu_last" >/dev/null ||
    fail "mallctl set ctr-hookjob --cpus $cpu_last"
  if ctr_wait_until 5000 "" job_cpus_are ctr-hookjob "$cpu_last"; then
    n=$(ctr_exec podman job nproc) allowed=$(cpus_allowed "$pid")
    cs=$(cat "$(ctr_cgroup_path "$cg")/cpuset.cpus" 2>/dev/null)
    if [ "$n" = 1 ] && [ "$allowed" = "$cpu_last" ] && [ "$cs" = "$cpu_last" ]; then
      pass "mallctl set ctr-hookjob --cpus $cpu_last ($t ms): nproc inside 1, init's Cpus_allowed_list $allowed, cgroup cpuset.cpus $cs"
    else fail "after set --cpus $cpu_last: nproc inside '$n', init's Cpus_allowed_list '$allowed', cgroup cpuset.cpus '$cs'"; fi
  else fail "job ctr-hookjob did not settle on cpu $cpu_last: $(job_json ctr-hookjob)"; fi
  timeout 15 "$bin/mallctl" --socket "$sock" set ctr-hookjob --cpus auto >/dev/null || fail "mallctl set ctr-hookjob --cpus auto"
  if ctr_wait_until 5000 "" job_cpus_are ctr-hookjob "$pool"; then
    n=$(ctr_exec podman job nproc) allowed=$(cpus_allowed "$pid")
    if [ "$n" = "$npool" ] && [ "$(norm_cpus "$allowed")" = "$(norm_cpus "$pool")" ]; then
      pass "mallctl set ctr-hookjob --cpus auto: back to $pool (nproc inside $n, init's Cpus_allowed_list $allowed)"
    else fail "after set --cpus auto: nproc inside '$n', init's Cpus_allowed_list '$allowed' (pool $pool)"; fi
  else fail "job ctr-hookjob did not come back to the pool $pool: $(job_json ctr-hookjob)"; fi
fi

# ---- 3. libmall inside attaches and follows --------------------------------------------------------------
last_change_is() { grep change "$client_out" | tail -n 1 | grep -q "$1\$"; }  # the client's last "change" line
attached_at_least() { [ "$(job_json "$1" | jq -r .attached)" -ge "$2" ] 2>/dev/null; }
client_out=$CTR_DIR/client.out
ctr_exec podman job "$bin/mall_test_client" --duration-s 6 --step-us 2000 >"$client_out" 2>&1 &
client=$!
if ctr_wait_until 8000 "" attached_at_least ctr-hookjob 1; then
  pass "mall_test_client exec'd in the container (MALL_JOB_ID=ctr-hookjob) is attached (status: attached $(job_json ctr-hookjob | jq -r .attached))"
  if [ "$npool" -ge 2 ]; then
    timeout 15 "$bin/mallctl" --socket "$sock" set ctr-hookjob --cpus "$cpu_last" >/dev/null
    if ctr_wait_until 5000 "" grep -q "ncpus=1 cpus=$cpu_last\$" "$client_out"; then
      timeout 15 "$bin/mallctl" --socket "$sock" set ctr-hookjob --cpus auto >/dev/null
      if ctr_wait_until 5000 "" last_change_is "ncpus=$npool cpus=$pool"; then
        pass "it follows a move to cpu $cpu_last and back to $pool at its steps ($(grep -c change "$client_out") changes seen)"
      else fail "mall_test_client did not see the move back to $pool:"; sed 's/^/      /' "$client_out"; fi
    else fail "mall_test_client did not see the move to cpu $cpu_last:"; sed 's/^/      /' "$client_out"; fi
    timeout 15 "$bin/mallctl" --socket "$sock" set ctr-hookjob --cpus auto >/dev/null
  fi
else
  fail "mall_test_client in the container did not attach: $(job_json ctr-hookjob | jq -c '{attached}')"; sed 's/^/      /' "$client_out"
fi
wait "$client" || fail "mall_test_client exited non-zero"
note "client: $(head -n 1 "$client_out")"

# The env-free way: only the annotation and the containers.conf lines (no MALL_JOB_ID, no mall
# run options); the default job name; MIN alone (MAX: the whole pool); a user other than root.
rc=0
ctr_run podman free -d --user 1234:1234 --annotation io.mall.malleable=1 -- "$bin/mall_test_client" --duration-s 60 \
  >"$CTR_DIR/run.out" 2>&1 || rc=$?
if [ "$rc" != 0 ]; then fail "podman run of the annotation-only container exited $rc:"; sed 's/^/      /' "$CTR_DIR/run.out"
else
  free_id=$(ctr_id podman free) free_job=ctr-$(ctr_id podman free | cut -c1-12)
  j=$(job_json "$free_job")
  if [ -n "$j" ] && jq -e --argjson n "$npool" '.min == 1 and .max == $n and .uid == 1234' <<<"$j" >/dev/null; then
    pass "a container with only io.mall.malleable=1, run as --user 1234, is job $free_job (the default name) of uid 1234, cores 1..$npool (the pool)"
  else fail "no job $free_job with uid 1234, min 1 and max $npool for the annotation-only container: $(mstatus | jq -c '[.jobs[] | {job, uid, min, max}]')"; fi
  if ctr_wait_until 5000 "" attached_at_least "$free_job" 1; then
    pass "its process (MALL_SOCKET from containers.conf only, no MALL_JOB_ID) is attached to $free_job"
  else
    fail "its process did not attach to $free_job without MALL_JOB_ID: $(ctr_podman logs "$CTR_PREFIX-free" 2>&1 | head -n 3 | tr '\n' ' ')"
  fi
  ctr_rm podman free || fail "rm -f of the annotation-only container"
  if ctr_wait_until 5000 "" job_absent "$free_job"; then pass "after rm -f, job $free_job is gone"
  else fail "job $free_job still listed after rm -f"; fi
  : "$free_id"
fi

# Another container that names the same job while ctr-hookjob runs: refused (without io.mall.require it
# runs unregistered), and its poststop leaves ctr-hookjob alone (it deregisters only what it registered).
rc=0
ctr_run podman dup -d --annotation io.mall.malleable=1 --annotation io.mall.job=hookjob -- /usr/bin/sleep 600 \
  >"$CTR_DIR/run.out" 2>&1 || rc=$?
dup_id=$(ctr_id podman dup 2>/dev/null)
if [ "$rc" = 0 ] && grep -q "container ${dup_id:0:12}: warning: malld refused job ctr-hookjob" "$hook_log" &&
   [ "$(job_json ctr-hookjob | jq -c .pids)" = "[$pid]" ]; then
  pass "a second container naming job ctr-hookjob runs unregistered (the hook's log: malld refused it); ctr-hookjob keeps pid $pid"
else fail "a second container naming job ctr-hookjob: podman exit $rc, ctr-hookjob $(job_json ctr-hookjob | jq -c '{pids}')"; sed 's/^/      /' "$CTR_DIR/run.out"; fi
ctr_rm podman dup || fail "rm -f of the second container"
if [ -n "$(job_json ctr-hookjob)" ]; then pass "its removal (poststop) left job ctr-hookjob registered"
else fail "removing the second container ended job ctr-hookjob"; fi

# The hook run by hand as a runtime runs it, for what podman cannot show with this kit's rootfs: a
# user namespace (container uid 5 mapped to host uid 200005), and a poststop that finds its job
# still registered (with podman, malld has always seen the init exit first).
ctr_cgroup_make "$CTR_CGROUP/byhand" || fail "making $CTR_CGROUP/byhand"
sleep 600 &
byhand_pid=$!
echo "$byhand_pid" >"$(ctr_cgroup_path "$CTR_CGROUP/byhand")/cgroup.procs" || fail "moving pid $byhand_pid into $CTR_CGROUP/byhand"
bundle=$CTR_DIR/bundle-byhand
mkdir -p "$bundle"
echo '{"ociVersion":"1.0.2","process":{"user":{"uid":5,"gid":5}},"linux":{"uidMappings":[{"containerID":0,"hostID":200000,"size":65536}]}}' >"$bundle/config.json"
state=$(jq -nc --argjson p "$byhand_pid" --arg b "$bundle" \
  '{ociVersion:"1.0.2", id:"b0b0b0b0b0b0b0b0", status:"creating", pid:$p, bundle:$b,
    annotations:{"io.mall.malleable":"1:1", "io.mall.job":"byhand"}}')
rc=0
out=$(timeout 30 "$bin/mall-oci-hook" --socket "$sock" createRuntime <<<"$state" 2>&1) || rc=$?
j=$(job_json ctr-byhand)
if [ "$rc" = 0 ] && jq -e --argjson p "$byhand_pid" '.uid == 200005 and .pids == [$p]' <<<"$j" >/dev/null &&
   [ "$(cat "$bundle/mall-oci-hook.job" 2>/dev/null)" = ctr-byhand ]; then
  pass "by hand, createRuntime: container uid 5 through uidMappings 0->200000 is job ctr-byhand of host uid 200005"
else fail "by hand, createRuntime: exit $rc, '$out', job $j"; fi
rc=0
out=$(timeout 30 "$bin/mall-oci-hook" --socket "$sock" poststop <<<"$(jq -c 'del(.pid) | .status = "stopped"' <<<"$state")" 2>&1) || rc=$?
if [ "$rc" = 0 ] && job_absent ctr-byhand && [ ! -e "$bundle/mall-oci-hook.job" ] && [ "$out" = "mall-oci-hook: deregistered job ctr-byhand" ]; then
  pass "by hand, poststop: '$out' (exit 0), and its note in the bundle is gone"
else fail "by hand, poststop: exit $rc, '$out', job $(job_json ctr-byhand)"; fi
kill "$byhand_pid" 2>/dev/null; wait "$byhand_pid" 2>/dev/null

# ---- 4. removal: poststop, no job, no cgroup ------------------------------------------------------------------
cg_dir=$(ctr_cgroup_path "$cg")
ctr_ms t ctr_rm podman job || fail "rm -f of the job container"
times+=("podman rm -f with the hook $t ms")
if ctr_wait_until 5000 "" job_absent ctr-hookjob; then pass "after podman rm -f ($t ms) job ctr-hookjob is gone from mallctl status"
else fail "job ctr-hookjob still listed after rm -f: $(job_json ctr-hookjob)"; fi
if [ ! -d "$cg_dir" ]; then pass "the container's cgroup $cg is gone"
else fail "the container's cgroup $cg_dir is still there"; fi
if grep -q "poststop container ${cid:0:12}: .*job ctr-hookjob" "$hook_log" 2>/dev/null; then
  pass "poststop ran; the hook's log: $(grep "poststop container ${cid:0:12}" "$hook_log" | tail -n 1 | sed "s/^.* container ${cid:0:12}: //")"
else fail "the hook's log shows no poststop for ${cid:0:12}:"; sed 's/^/      /' "$hook_log" 2>/dev/null; fi

# ---- 5. bad annotations and io.mall.require -----------------------------------------------------------------
jobs_now() { mstatus | jq -r '[.jobs[].job] | join(",")'; }
running() { [ "$(ctr_podman inspect --format '{{.State.Running}}' "$CTR_PREFIX-$1" 2>/dev/null)" = true ]; }
rc=0
ctr_run podman bad -d --annotation io.mall.malleable=3:1 -- /usr/bin/sleep 600 >"$CTR_DIR/run.out" 2>&1 || rc=$?
if [ "$rc" != 0 ] && grep -q "bad annotation io.mall.malleable='3:1': MIN (3) is larger than MAX (1)" "$CTR_DIR/run.out" && ! running bad; then
  pass "io.mall.malleable=3:1: podman run exits $rc, the container does not run, and podman prints the hook's line:"
  note "$(grep -o "mall-oci-hook: bad annotation.*" "$CTR_DIR/run.out" | head -n 1)"
else fail "io.mall.malleable=3:1: podman run exited $rc (running: $(running bad && echo yes || echo no)):"; sed 's/^/      /' "$CTR_DIR/run.out"; fi
ctr_rm podman bad 2>/dev/null
rc=0
ctr_run podman req -d --annotation io.mall.malleable="$((npool + 1))" --annotation io.mall.require=true \
  -- /usr/bin/sleep 600 >"$CTR_DIR/run.out" 2>&1 || rc=$?
if [ "$rc" != 0 ] && grep -q "asks for at least $((npool + 1)) cores.*io.mall.require=true: the container does not start" "$CTR_DIR/run.out" && ! running req; then
  pass "io.mall.malleable=$((npool + 1)) (more than the pool) with io.mall.require=true: not started (podman exit $rc), with the reason"
else fail "io.mall.malleable=$((npool + 1)) with io.mall.require=true: podman run exited $rc:"; sed 's/^/      /' "$CTR_DIR/run.out"; fi
ctr_rm podman req 2>/dev/null
rc=0
ctr_run podman opt -d --annotation io.mall.malleable="$((npool + 1))" -- /usr/bin/sleep 600 >"$CTR_DIR/run.out" 2>&1 || rc=$?
opt_id=$(ctr_id podman opt 2>/dev/null)
if [ "$rc" = 0 ] && running opt && [ -z "$(jobs_now)" ] &&
   grep -q "container ${opt_id:0:12}: warning: .*runs without malleability" "$hook_log"; then
  pass "the same without io.mall.require: the container runs, unregistered, and the hook's log says why"
else fail "io.mall.malleable=$((npool + 1)) without io.mall.require: podman exit $rc, running $(running opt && echo yes || echo no), jobs '$(jobs_now)'"
     sed 's/^/      /' "$CTR_DIR/run.out"; fi
ctr_rm podman opt 2>/dev/null
# A container cannot take a Slurm job's name (issue 37.11): a Slurm epilog's release would end it.
rc=0
ctr_run podman slurmname -d --annotation io.mall.malleable=1 --annotation io.mall.job=slurm-5 -- /usr/bin/sleep 600 \
  >"$CTR_DIR/run.out" 2>&1 || rc=$?
if [ "$rc" = 0 ] && [ -n "$(job_json ctr-slurm-5)" ] && [ -z "$(job_json slurm-5)" ]; then
  pass "io.mall.job=slurm-5 is job ctr-slurm-5 (the hooks.d file's --job-prefix ctr-), never Slurm's slurm-5"
else fail "io.mall.job=slurm-5: podman exit $rc, jobs '$(jobs_now)'"; sed 's/^/      /' "$CTR_DIR/run.out"; fi
ctr_rm podman slurmname 2>/dev/null
ctr_wait_until 5000 "" job_absent ctr-slurm-5 || fail "job ctr-slurm-5 still listed after rm -f"

# ---- 6. nothing left -----------------------------------------------------------------------------------------
out=$(jobs_now)
if [ -z "$out" ]; then pass "no job left in malld"; else fail "jobs left in malld: $out"; fi
ctr_malld_stop
mleft=$(mparent_dirs)
if [ -z "$mleft" ]; then pass "malld stopped and removed its --cgroup-parent folder $mparent"
else fail "malld's folders left after it stopped: $mleft"; fi
remove_mparent
ctr_ms t ctr_check_nothing_left
times+=("cleanup and leak check $t ms")
trap - EXIT

times+=("total $(( $(ctr__now_ms) - t_start )) ms")
summary=$(printf '%s; ' "${times[@]}")
note "times: ${summary%; }"
if [ "$failures" -gt 0 ]; then echo "oci_hook: $failures check(s) failed"; exit 1; fi
echo "oci_hook: all checks passed"
