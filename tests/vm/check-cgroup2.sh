#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# check-cgroup2.sh — asserts, as root inside run-in-vm.sh's guest, what mall's cgroup-v2 backend
# needs from the system: cgroup2 at /sys/fs/cgroup with cpuset enabled, a parent/child folder
# layout like malld's (<mount>/<parent>/job_<id>) whose cpuset.cpus narrow and widen a process's
# affinity, the expected cpu count, and that a host-built binary runs.
# Contract: every check prints "ok   <what>" or "FAIL <what>: <found> (expected <wanted>)" on
# stdout (facts worth knowing but not judged: "info ..."); exit 0 when all pass, 1 when any
# fails (the failed ones named on stderr), 2 on bad usage.
# It leaves nothing behind: its folders under /sys/fs/cgroup and its sleep are removed on exit.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: check-cgroup2.sh [--cpus N] [--bin-dir DIR]
  --cpus N       the cpu count expected (nproc, cpus online; default 2)
  --bin-dir DIR  mall's build bin folder, whose mallctl --help must exit 0 (default $MALL_BIN_DIR)
Run it as root inside the guest: tests/vm/run-in-vm.sh -- tests/vm/check-cgroup2.sh
Exit: 0 all checks pass, 1 some failed (named on stderr), 2 bad usage.
EOF
}

cpus=2 bin_dir=${MALL_BIN_DIR:-}
while [ $# -gt 0 ]; do
  case $1 in
    --cpus) [[ ${2-} =~ ^[1-9][0-9]*$ ]] || { usage >&2; exit 2; }; cpus=$2; shift 2 ;;
    --bin-dir) [ -n "${2-}" ] || { usage >&2; exit 2; }; bin_dir=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
  esac
done

cg=/sys/fs/cgroup
parent=$cg/mall-vm-check.$$
job=$parent/job_1 job2=$parent/job_2
sleep_pid=""
failed=() passed=0
# shellcheck disable=SC2317 # called from the EXIT trap
cleanup() {
  if [ -n "$sleep_pid" ]; then
    kill "$sleep_pid" 2>/dev/null || true
    wait "$sleep_pid" 2>/dev/null || true
  fi
  rmdir "$job" "$job2" 2>/dev/null || true
  rmdir "$parent" 2>/dev/null || true
}
trap cleanup EXIT

ok() { echo "ok   $1"; passed=$((passed + 1)); }
bad() { echo "FAIL $1: $2"; failed+=("$1"); }
# expect WHAT FOUND WANTED: equal strings pass.
expect() { if [ "$2" = "$3" ]; then ok "$1 = '$3'"; else bad "$1" "'$2' (expected '$3')"; fi; }
# has_word WHAT TEXT WORD
has_word() { if [[ " $2 " == *" $3 "* ]]; then ok "$1 has $3"; else bad "$1" "'$2' (expected to hold $3)"; fi; }
# Values land in $v without forking (a fork costs milliseconds under emulation).
# val FILE: its first line ("<unreadable FILE>" when it cannot be read).
val() { v="<unreadable $1>"; { IFS= read -r v || true; } 2>/dev/null < "$1" || true; }
# allowed PID: its Cpus_allowed_list from /proc/PID/status.
allowed() {
  local k rest
  v="<no process $1>"
  while IFS=$'\t' read -r k rest; do
    if [ "$k" = Cpus_allowed_list: ]; then v=$rest; break; fi
  done 2>/dev/null < "/proc/$1/status" || true
}
# mount_rw MOUNTPOINT: the first mount option of the cgroup2 mount there (rw or ro).
mount_rw() {
  local _id _parent _dev _root mp opts rest
  v="<no cgroup2 at $1>"
  while read -r _id _parent _dev _root mp opts rest; do
    if [ "$mp" = "$1" ] && [[ " $rest " == *" - cgroup2 "* ]]; then v=${opts%%,*}; fi
  done < /proc/self/mountinfo
}
all_cpus=0
if [ "$cpus" -gt 1 ]; then all_cpus=0-$((cpus - 1)); fi

# 1. The mount malld's probe looks for: cgroup2, read-write, cpuset available and enabled.
expect "filesystem type of $cg" "$(stat -f -c %T "$cg" 2>&1)" cgroup2fs
mount_rw "$cg"; expect "mount options of $cg (rw)" "$v" rw
val "$cg/cgroup.controllers"; has_word "$cg/cgroup.controllers" "$v" cpuset
val "$cg/cgroup.subtree_control"; has_word "$cg/cgroup.subtree_control" "$v" cpuset

# 2. The cpus: what the tests' expectations assume.
expect "nproc" "$(nproc)" "$cpus"
val /sys/devices/system/cpu/online; expect "/sys/devices/system/cpu/online" "$v" "$all_cpus"
val "$cg/cpuset.cpus.effective"; expect "$cg/cpuset.cpus.effective" "$v" "$all_cpus"

# 3. malld's layout: a parent holding the pool with +cpuset for its children, a job folder under it.
if mkdir "$parent" 2>/dev/null; then ok "mkdir $parent"; else bad "mkdir $parent" "failed"; fi
for f in cpuset.cpus cpuset.cpus.effective cpuset.mems cgroup.procs; do
  if [ -e "$parent/$f" ]; then ok "$parent has $f"; else bad "$parent/$f" "missing"; fi
done
echo "$all_cpus" > "$parent/cpuset.cpus" 2>/dev/null || true
val "$parent/cpuset.cpus"; expect "parent cpuset.cpus after writing $all_cpus" "$v" "$all_cpus"
if echo +cpuset > "$parent/cgroup.subtree_control" 2>/dev/null; then
  ok "+cpuset in the parent's cgroup.subtree_control"
else
  bad "+cpuset in the parent's cgroup.subtree_control" "write refused"
fi
mkdir "$job" 2>/dev/null || true
val "$job/cpuset.cpus"; expect "a new job folder's cpuset.cpus (empty: the parent's)" "$v" ""
val "$job/cpuset.cpus.effective"; expect "a new job folder's cpuset.cpus.effective" "$v" "$all_cpus"

# 4. Narrow the job to cpu 1, move a process in: its affinity follows.
echo 1 > "$job/cpuset.cpus" 2>/dev/null || true
val "$job/cpuset.cpus"; expect "job cpuset.cpus after writing 1" "$v" 1
val "$job/cpuset.cpus.effective"; expect "job cpuset.cpus.effective after writing 1" "$v" 1
sleep 600 &
sleep_pid=$!
echo "$sleep_pid" > "$job/cgroup.procs" 2>/dev/null || true
val "/proc/$sleep_pid/cgroup"
expect "/proc/$sleep_pid/cgroup (the sleep moved in)" "$v" "0::/${job#"$cg"/}"
allowed "$sleep_pid"; expect "the sleep's Cpus_allowed_list in the job at 1" "$v" 1

# 5. Widen back: effective and the process's affinity follow; empty = the parent's again.
echo "$all_cpus" > "$job/cpuset.cpus" 2>/dev/null || true
val "$job/cpuset.cpus.effective"
expect "job cpuset.cpus.effective after widening to $all_cpus" "$v" "$all_cpus"
allowed "$sleep_pid"; expect "the sleep's Cpus_allowed_list after widening" "$v" "$all_cpus"
# An empty cpuset.cpus (v2: "the parent's") is accepted for a folder without processes; with
# processes in it, kernel 6.1 refuses it (ENOSPC), newer ones may not: reported, not judged.
mkdir "$job2" 2>/dev/null || true
echo 0 > "$job2/cpuset.cpus" 2>/dev/null || true
echo "" > "$job2/cpuset.cpus" 2>/dev/null || true
val "$job2/cpuset.cpus.effective"
expect "an empty job folder's cpuset.cpus.effective after writing 0 then '' (the parent's)" \
  "$v" "$all_cpus"
echo 0 > "$job/cpuset.cpus" 2>/dev/null || true
if err=$( { echo "" > "$job/cpuset.cpus"; } 2>&1); then
  val "$job/cpuset.cpus.effective"
  echo "info writing '' to a job folder holding a process: accepted (effective now $v)"
else
  echo "info writing '' to a job folder holding a process: refused on kernel $(uname -r) (${err##*: })"
fi

# 6. A host-built binary runs in the guest (the build tree is visible through the 9p root).
if [ -z "$bin_dir" ]; then
  bad "mallctl --help" "no --bin-dir and no MALL_BIN_DIR"
elif "$bin_dir/mallctl" --help > /dev/null 2>&1; then
  ok "$bin_dir/mallctl --help exits 0"
else
  bad "$bin_dir/mallctl --help" "exit $? ($(ls -ld "$bin_dir/mallctl" 2>&1))"
fi

total=$((passed + ${#failed[@]}))
if [ ${#failed[@]} -eq 0 ]; then
  echo "check-cgroup2: all $total checks passed"
  exit 0
fi
echo "check-cgroup2: ${#failed[@]} of $total checks failed:" >&2
printf '  %s\n' "${failed[@]}" >&2
exit 1
