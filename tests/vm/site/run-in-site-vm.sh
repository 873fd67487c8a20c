#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# run-in-site-vm.sh — boots the Debian 13 site guest (make-site-root.sh: systemd as PID 1, cgroup v2,
# Slurm 24.11, podman 5) under qemu TCG and runs guest test scripts in it, in order, as root, from a
# systemd unit after multi-user.target. Contract: each script's stdout/stderr reach ours live; one
# "== site: NAME exited RC" line per script; our exit status is the first non-zero status of the
# scripts (0 when all passed), 77 = cannot run here, 124 = timeout, 125 = the harness failed. qemu is
# killed by pid and every temp file (data disk, qemu's snapshot) removed on every exit. --help.
set -euo pipefail

readonly EXIT_SKIP=77 EXIT_TIMEOUT=124 EXIT_HARNESS=125
prog=${0##*/}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../qemu_launch.sh
. "$here/../qemu_launch.sh"   # kill_and_reap, vm_cleanup, vm_install_traps, vm_qemu_cmd, vm_start_qemu, ...

usage() {
  cat <<EOF
NAME
    $prog - run test scripts as root in a Debian 13 guest with systemd as PID 1

SYNOPSIS
    $prog [OPTIONS] SCRIPT [SCRIPT...]

DESCRIPTION
    The guest: the cached Debian 13 root of make-site-root.sh as an ext4 image (made once per root
    with \`mkfs.ext4 -d\`, cached beside the root's tarball; the guest writes to a qemu snapshot
    that is thrown away), booted with the root's own vmlinuz and initrd under
        qemu-system-x86_64 -accel tcg,thread=multi -cpu max -smp CPUS -m MEMORY
    (software emulation: the host's /dev/kvm is not used) with the kernel command line
    "root=/dev/vda rw console=ttyS0 systemd.unified_cgroup_hierarchy=1": systemd is PID 1 and
    owns the unified cgroup v2 hierarchy. The guest has no network card; its host name is "site",
    with 10.77.0.1 on a dummy interface (Slurm needs a non-loopback address).

    A second disk (/dev/vdb, ext4 labelled MALLSITE, mounted at /mnt/mall-site) carries the run:
    the SCRIPTs (scripts/), each --deb (debs/) and --file (files/). The unit mall-site-run.service
    (After=multi-user.target) runs each SCRIPT with bash in /mnt/mall-site, in order, stdin
    /dev/null, with the environment
        PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LC_ALL=C.UTF-8
        MALL_IN_SITE_VM=1 MALL_SITE_DIR=/mnt/mall-site MALL_SITE_FILES=/mnt/mall-site/files
        MALL_SITE_DEB=<the first --deb in the guest> MALL_SITE_OUT=/mnt/mall-site/out
    plus each --env. A script's stdout and stderr come out of ours live (two virtio serial ports);
    after it, a line "== site: NAME exited RC" goes to stdout. Then the guest powers off.
    Files a script leaves in \$MALL_SITE_OUT come back into --collect DIR.

    Timing under TCG: boot to the first script 25-60 s on an idle 2-cpu host; everything in the
    guest runs several times slower than natively (no timing assertions in guest scripts).

OPTIONS
    --deb FILE          put FILE on the data disk (debs/); the first is \$MALL_SITE_DEB (repeatable)
    --file PATH         put PATH (file or folder) on the data disk under files/ (repeatable)
    --env NAME=VALUE    set NAME in every script's environment (repeatable)
    --collect DIR       copy what the scripts left in \$MALL_SITE_OUT into DIR (made if missing)
    --script-timeout S  kill a script after S seconds in the guest (status 124) and go on with
                        the next one (default: none, only --timeout)
    --timeout S         kill the guest after S seconds in all (default 1200) and exit 124
    --boot-timeout S    a guest that has not started the first script S seconds after qemu
                        started is a stalled boot: killed, exit 124 (default 300)
    --cpus N            guest cpus (default 2)
    --memory MB         guest memory in MiB (default 2048)
    --timing            print to stderr: boot to the first script, the scripts, total (host clock)
    --verbose           print the guest's serial console (kernel and systemd) at the end
    -h, --help          this text

EXIT STATUS
    0       every script exited 0
    1-255   the first non-zero exit status of the scripts, in their order (a script killed by
            signal S: 128+S; by --script-timeout: 124)
    77      cannot run here; the reason on stderr after "SKIP:" (not root, no qemu, no mmdebstrap,
            no mkfs.ext4/debugfs)
    124     --timeout expired or the boot stalled: qemu was killed ("TIMEOUT" on stderr)
    125     the harness failed: bad usage, the image could not be made, the guest ended without
            reporting every script (its serial console is printed)
    129, 130, 143  SIGHUP, SIGINT, SIGTERM: qemu is killed, temp files removed, and this script
            ends by that signal; qemu also dies should this script be killed by SIGKILL.
    A script may exit 77, 124 or 125 itself; the harness's own cases say so on stderr.

FILES
    \${XDG_CACHE_HOME:-~/.cache}/mall/debian-trixie-site-KEY-root.{tar,ext4,vmlinuz,initrd}
        the root (make-site-root.sh), its image and boot files; remade when the root changes
    \$TMPDIR/run-in-site-vm.XXXXXX  the per-run folder (data disk, qemu's snapshot), removed

EXAMPLES
    $prog --timing -- /dev/stdin <<<'systemctl is-system-running; cat /proc/self/cgroup'
    $prog --deb mall_0.1.0_amd64.deb tests/vm/site/site_malld.sh
EOF
}

die() { echo "$prog: $*" >&2; exit "$EXIT_HARNESS"; }
skip() { echo "$prog: SKIP: $*" >&2; exit "$EXIT_SKIP"; }

debs=() files=() envs=() collect="" script_timeout=0 timeout=1200 boot_timeout=300 cpus=2 memory=2048
timing=0 verbose=0
while [ $# -gt 0 ]; do
  case $1 in
    --deb) [ -f "${2-}" ] || die "--deb needs a .deb file ('${2-}' is not one)"
      debs+=("$(realpath -e -- "$2")"); shift 2 ;;
    --file) [ -e "${2-}" ] || die "--file needs an existing file or folder ('${2-}' is not)"
      files+=("$(realpath -e -- "$2")"); shift 2 ;;
    --env) [[ ${2-} =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || die "--env '${2-}': not NAME=VALUE"
      envs+=("$2"); shift 2 ;;
    --collect) [ -n "${2-}" ] || die "--collect needs a folder"
      collect=$2; shift 2 ;;
    --script-timeout) [[ ${2-} =~ ^[1-9][0-9]*$ ]] || die "--script-timeout needs a positive whole number of seconds"
      script_timeout=$2; shift 2 ;;
    --timeout) [[ ${2-} =~ ^[1-9][0-9]*$ ]] || die "--timeout needs a positive whole number of seconds"
      timeout=$2; shift 2 ;;
    --boot-timeout) [[ ${2-} =~ ^[1-9][0-9]*$ ]] || die "--boot-timeout needs a positive whole number of seconds"
      boot_timeout=$2; shift 2 ;;
    --cpus) [[ ${2-} =~ ^[1-9][0-9]*$ ]] || die "--cpus needs a positive number"
      cpus=$2; shift 2 ;;
    --memory) [[ ${2-} =~ ^[1-9][0-9]*$ ]] || die "--memory needs a size in MiB, such as 2048"
      memory=$2; shift 2 ;;
    --timing) timing=1; shift ;;
    --verbose) verbose=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    -*) die "unknown option '$1' (see --help)" ;;
    *) break ;;
  esac
done
[ $# -ge 1 ] || die "no guest script (usage: $prog [OPTIONS] SCRIPT [SCRIPT...]; see --help)"
scripts=()
for s in "$@"; do
  [ -r "$s" ] || die "guest script '$s' is not a readable file"
  scripts+=("$s")
done

[ "$(id -u)" -eq 0 ] || skip "the site root and its image are root's (mmdebstrap, mkfs.ext4 -d of root-owned files): run as root"
command -v qemu-system-x86_64 >/dev/null || skip "qemu-system-x86_64 not found (apt-get install qemu-system-x86)"
command -v mkfs.ext4 >/dev/null && command -v debugfs >/dev/null || skip "mkfs.ext4 or debugfs not found (apt-get install e2fsprogs)"

# --- Per-run folder and the cleanup that always runs ----------------------------------------------
tmp=$(mktemp -d "${TMPDIR:-/tmp}/run-in-site-vm.XXXXXX")
vm_install_traps   # qemu (by pid), the output copiers and $tmp go on every exit and signal

# --- The root's image and boot files (cached per root) --------------------------------------------
t_prep=$(date +%s.%N)
tarball=$("$here/make-site-root.sh") || { rc=$?; [ "$rc" = "$EXIT_SKIP" ] && exit "$EXIT_SKIP"; die "make-site-root.sh failed (above)"; }
base=${tarball%.tar}
image=$base.ext4 kernel=$base.vmlinuz initrd=$base.initrd
exec {lock}>"$base.lock"
flock "$lock"   # one maker of the image at a time; readers wait until it is whole
if ! [ -s "$image" ] || ! [ -s "$kernel" ] || ! [ -s "$initrd" ]; then
  echo "$prog: making the guest image $image from $tarball" >&2
  mkdir "$tmp/root"
  tar -xpf "$tarball" -C "$tmp/root" || die "unpacking $tarball"
  k=$(find "$tmp/root/boot" -maxdepth 1 -name 'vmlinuz-*' | sort -V | tail -n 1)
  i=$(find "$tmp/root/boot" -maxdepth 1 -name 'initrd.img-*' | sort -V | tail -n 1)
  [ -n "$k" ] && [ -n "$i" ] || die "the root $tarball has no /boot/vmlinuz-* and /boot/initrd.img-* (linux-image-amd64, initramfs-tools)"
  cp -- "$k" "$tmp/vmlinuz" && cp -- "$i" "$tmp/initrd" || die "copying the boot files"
  # 8 GiB, sparse: room for what the tests install and write (podman's storage, logs).
  mkfs.ext4 -q -F -L mallroot -d "$tmp/root" "$tmp/root.ext4" 8G >"$tmp/mkfs.log" 2>&1 ||
    { cat "$tmp/mkfs.log" >&2; die "mkfs.ext4 -d of the root"; }
  rm -rf --one-file-system -- "$tmp/root"
  mv -f -- "$tmp/vmlinuz" "$kernel" && mv -f -- "$tmp/initrd" "$initrd" && mv -f -- "$tmp/root.ext4" "$image" ||
    die "moving the image into the cache"
fi
exec {lock}>&-

# --- The data disk: scripts, debs, files, the runner ----------------------------------------------
data=$tmp/data
mkdir -p "$data/scripts" "$data/debs" "$data/files" "$data/out"
names=()
n=0
for s in "${scripts[@]}"; do
  n=$((n + 1))
  name=$(printf '%02d-%s' "$n" "$(basename "$s")")
  cat -- "$s" >"$data/scripts/$name" || die "copying the guest script $s"
  names+=("$name")
done
for d in "${debs[@]}"; do cp -- "$d" "$data/debs/" || die "copying $d"; done
for f in "${files[@]}"; do cp -a -- "$f" "$data/files/" || die "copying $f"; done
first_deb=""
[ ${#debs[@]} -gt 0 ] && first_deb=/mnt/mall-site/debs/$(basename "${debs[0]}")
{
  echo '#!/bin/bash'
  echo "# guest-runner.sh, made by $prog: run by mall-site-run.service; runs the scripts in order with"
  echo '# their output on the virtio ports mall.stdout/mall.stderr and reports to mall.control.'
  echo 'port() { local p; for p in /sys/class/virtio-ports/*; do [ "$(cat "$p/name" 2>/dev/null)" = "$1" ] && { echo "/dev/${p##*/}"; return 0; }; done; return 1; }'
  echo 'out=$(port mall.stdout) err=$(port mall.stderr) ctl=$(port mall.control) || { echo "guest-runner: virtio ports missing" >/dev/console; systemctl poweroff -ff; }'
  echo 'exec 3>"$ctl"'
  echo 'echo started >&3'
  echo 'cd /mnt/mall-site'
  printf 'env=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LC_ALL=C.UTF-8 MALL_IN_SITE_VM=1'
  printf ' MALL_SITE_DIR=/mnt/mall-site MALL_SITE_FILES=/mnt/mall-site/files MALL_SITE_OUT=/mnt/mall-site/out'
  printf ' %q' "MALL_SITE_DEB=$first_deb" "${envs[@]}"
  echo ')'
  printf 'limit=(); [ %d -gt 0 ] && limit=(timeout --kill-after=10 %d)\n' "$script_timeout" "$script_timeout"
  echo 'for s in scripts/*; do'
  echo '  name=${s#scripts/??-}'
  echo '  echo "script $name" >&3'
  echo '  "${limit[@]}" /usr/bin/env -i "${env[@]}" /bin/bash "$s" </dev/null >"$out" 2>"$err"'
  echo '  rc=$?'
  echo '  echo "== site: $name exited $rc" >"$out"'
  echo '  echo "status $rc $name" >&3'
  echo 'done'
  echo 'sync'
  echo 'echo done >&3'
  echo 'systemctl poweroff -ff'
} >"$data/guest-runner.sh"
size_mb=$(( $(du -sm "$data" | cut -f1) + 256 ))
mkfs.ext4 -q -F -L MALLSITE -d "$data" "$tmp/data.ext4" "${size_mb}M" >"$tmp/mkfs-data.log" 2>&1 ||
  { cat "$tmp/mkfs-data.log" >&2; die "mkfs.ext4 -d of the data disk"; }

# --- Boot -----------------------------------------------------------------------------------------
vm_output_fifos
: >"$tmp/control"
cmdline="root=/dev/vda rw console=ttyS0 systemd.unified_cgroup_hierarchy=1 panic=-1"
cmdline+=" random.trust_cpu=on mitigations=off nowatchdog i8042.noaux i8042.nokbd i8042.nopnp"
cmdline+=" systemd.show_status=error"
vm_qemu_cmd "$cpus" "$memory" "$kernel" "$initrd" "$cmdline" \
  -drive "file=$image,format=raw,if=virtio,snapshot=on,cache=unsafe" \
  -drive "file=$tmp/data.ext4,format=raw,if=virtio,cache=writeback"
qemu_cmd+=(-chardev "file,id=gctl,path=$tmp/control" -device "virtserialport,chardev=gctl,name=mall.control")
t0=$(date +%s.%N)
vm_start_qemu   # with TMPDIR=$tmp: qemu keeps the snapshot=on overlay there (removed with $tmp)
t_started="" timed_out=0 boot_stalled=0
start_s=$SECONDS
while kill -0 "$qemu_pid" 2>/dev/null; do
  if [ -z "$t_started" ] && grep -qx started "$tmp/control"; then t_started=$(date +%s.%N); fi
  if [ -z "$t_started" ] && [ $((SECONDS - start_s)) -ge "$boot_timeout" ]; then boot_stalled=1; break; fi
  if [ $((SECONDS - start_s)) -ge "$timeout" ]; then timed_out=1; break; fi
  sleep 0.5
done
if [ "$timed_out" = 1 ] || [ "$boot_stalled" = 1 ]; then vm_stop_qemu 1; else vm_stop_qemu 0; fi
t1=$(date +%s.%N)
[ -n "$t_started" ] || ! grep -qx started "$tmp/control" || t_started=$t1
vm_drain_output

print_logs() { vm_print_logs "$1" "serial console"; } # print_logs WHY
if [ "$timing" = 1 ]; then
  awk -v p="$prog" -v pr="$t_prep" -v a="$t0" -v b="${t_started:-$t1}" -v d="$t1" 'BEGIN {
    printf "%s: timing: preparing %.1f s, boot to the first script %.1f s, scripts %.1f s, total %.1f s\n",
      p, a - pr, b - a, d - b, d - pr }' >&2
fi
if [ -n "$collect" ]; then
  mkdir -p -- "$collect" || die "cannot make --collect folder $collect"
  mkdir "$tmp/collect"
  { debugfs -R "rdump /out $tmp/collect" "$tmp/data.ext4" && cp -a -- "$tmp/collect/out/." "$collect/"; } >"$tmp/debugfs.log" 2>&1 ||
    { cat "$tmp/debugfs.log" >&2; echo "$prog: could not copy the guest's \$MALL_SITE_OUT into $collect" >&2; }
fi
if [ "$boot_stalled" = 1 ]; then
  print_logs "boot stalled: no script had started ${boot_timeout}s after qemu started"
  echo "$prog: TIMEOUT: the boot stalled (exit $EXIT_TIMEOUT)" >&2
  exit "$EXIT_TIMEOUT"
fi
if [ "$timed_out" = 1 ]; then
  print_logs "timeout: the guest ran longer than ${timeout}s and was killed (while running: $(sed -n 's/^script //p' "$tmp/control" | tail -n 1))"
  echo "$prog: TIMEOUT after ${timeout}s (exit $EXIT_TIMEOUT)" >&2
  exit "$EXIT_TIMEOUT"
fi
mapfile -t statuses < <(sed -n 's/^status \([0-9]*\) .*/\1/p' "$tmp/control")
if [ ${#statuses[@]} -ne ${#names[@]} ]; then
  print_logs "the guest ended after reporting ${#statuses[@]} of ${#names[@]} scripts"
  exit "$EXIT_HARNESS"
fi
[ "$verbose" = 1 ] && print_logs "verbose"
rc=0
for s in "${statuses[@]}"; do if [ "$rc" = 0 ] && [ "$s" != 0 ]; then rc=$s; fi; done
if [ ${#names[@]} -gt 1 ]; then
  echo "$prog: $(sed -n 's/^status \([0-9]*\) \(.*\)/\2: \1/p' "$tmp/control" | paste -sd, - | sed 's/,/, /g')" >&2
fi
exit "$rc"
