#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# run-in-vm.sh — runs one command as root inside a throwaway qemu guest whose cgroup v2 has the
# cpuset controller, for testing mall's cgroup-v2 backend on hosts whose cpuset is on cgroup v1.
# Contract: the guest's / is the host's / (read-only 9p, tmpfs overlay on top), so host-built
# binaries run unchanged; the command's stdout and stderr reach ours, its exit status is ours;
# 77 = cannot run here (a skip for ctest), 124 = timeout, 125 = the harness failed. qemu is always
# killed and the per-run temp dir removed; only the initramfs cache in --work-dir stays. The guest's
# kernel is Debian's, downloaded into ~/.cache/mall by guest-kernel.sh, never installed on the host
# (its modules are bind-mounted at /lib/modules/KVER in the guest). --help.
set -euo pipefail

readonly EXIT_SKIP=77 EXIT_TIMEOUT=124 EXIT_HARNESS=125
readonly GUEST_PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin
readonly MODULES=(9p 9pnet_virtio virtio_pci overlay virtio_console)
prog=${0##*/}
# shellcheck source=qemu_launch.sh
. "$(dirname "${BASH_SOURCE[0]}")/qemu_launch.sh"   # kill_and_reap, vm_cleanup, vm_install_traps, vm_qemu_cmd, ...

usage() {
  cat <<EOF
NAME
    $prog - run a command as root in a qemu guest with cgroup v2 (+cpuset)

SYNOPSIS
    $prog [OPTIONS] -- COMMAND [ARGS...]

DESCRIPTION
    Boots qemu-system-x86_64 with software emulation (-accel tcg,thread=multi -cpu max; the host's
    /dev/kvm is not used), Debian's current kernel and a small initramfs made of busybox-static
    and the 9p, virtio and overlay modules. The kernel is not the host's and is never installed
    on it: guest-kernel.sh (beside this script; see its --help) downloads the .deb that
    linux-image-amd64 depends on and unpacks it into \${XDG_CACHE_HOME:-~/.cache}/mall/guest-kernel
    once (MALL_VM_KERNEL_ROOT names another folder with boot/vmlinuz-KVER and lib/modules/KVER);
    its modules appear in the guest at /lib/modules/KVER (modprobe works there). The initramfs,
    and the kernel's ELF vmlinux unpacked from the bzImage, which qemu starts through its PVH
    entry (no decompression under emulation; else the bzImage), are cached in the work dir and
    remade only when the kernel, busybox or this script change.

    The guest's root is the host's / shared read-only over virtio-9p (submounts included:
    multidevs=remap; cached in the guest, so host files changed during the run may look stale)
    under a tmpfs overlay, so writes succeed but stay in the guest's memory and vanish with it. Mounted on top: proc, sysfs, cgroup2 at /sys/fs/cgroup with +cpuset in the
    root's cgroup.subtree_control, devtmpfs on /dev, tmpfs on /dev/shm, /tmp and /run, devpts.
    The host's /tmp, /run and /dev are therefore NOT visible in the guest: the current directory
    and --visible folders under /tmp or /run are shared for that; --share shares any folder.

    COMMAND runs as root (pid 1's child) in the host's current directory, with a clean environment:
    PATH=$GUEST_PATH, HOME=/root, MALL_IN_VM=1, plus every --env.
    Its stdin is /dev/null; its stdout and stderr come out of ours live (separate streams, over
    virtio serial ports); its exit status becomes ours; processes it leaves behind die with the
    guest. Several checks in one boot: make COMMAND a script (e.g. bash -c '...' or a checks
    file): a boot costs 5-10 s on an idle 2-core host (about twice that under load), and the
    command runs at emulation speed (each fork/exec costs milliseconds).

    Facts: TCG emulation makes guest timing meaningless (use no timing assertions inside); the
    guest has 2 cpus and 2 GiB unless told otherwise; /proc/cpuinfo shows qemu's "max" cpu, not
    the host's.

OPTIONS
    --env NAME=VALUE   set NAME in the command's environment (repeatable)
    --share DIR        make host folder DIR writable in the guest at the same path (9p, repeatable);
                       files the guest writes there are written as this script's user
    --visible DIR      DIR must be seen in the guest at its path (repeatable; ctest passes the
                       source and build trees): nothing to do where the read-only root shows it;
                       under /tmp or /run (the guest's own) it is shared as with --share; under
                       /dev, /proc or /sys it is refused (exit 125). The current directory is
                       always one.
    --timeout SECONDS  kill the guest after SECONDS (default 600) and exit 124
    --work-dir DIR     where the cached initramfs and vmlinux live, about 70 MB (default
                       \${TMPDIR:-/tmp}/mall-vm-cache-UID; ctest passes a folder of the build
                       tree); never the source tree
    --cpus N           guest cpus (default 2)
    --memory SIZE      guest memory, qemu syntax (default 2G)
    --boot-timeout S   a guest that has not started the command S seconds after qemu started
                       (default 240; a boot takes 5-20 s) is a stalled boot: qemu is killed
    --boot-retries N   after a stalled boot, boot again up to N times (default 0), saying so on
                       stderr with the stalled guest's serial log; the command itself never runs
                       twice (it had not started)
    --timing           print to stderr: boot to command, command, total seconds (host clock)
    --verbose          kernel messages on the serial log, printed with the full guest kernel log
                       and qemu's output at the end; progress lines on stderr
    -h, --help         this text

EXIT STATUS
    0-255  the command's exit status, passed through (a command killed by signal S: 128+S;
           not found in the guest: 127). When the command fails, what the guest kernel logged
           while it ran is printed to stderr.
    77     cannot run here, the reason on stderr after "SKIP:" (no qemu-system-x86_64, no
           static busybox, no modprobe). ctest reports it as a skip (SKIP_RETURN_CODE 77).
    124    --timeout expired, or the boot stalled (--boot-timeout) and no retry was left: qemu
           was killed.
    125    the harness failed: bad usage, the current directory or a --visible folder cannot be
           seen in the guest (under /dev, /proc or /sys), the guest's kernel could not be
           downloaded (guest-kernel.sh says why and what to do), the initramfs could not be made, or
           the guest never ran the command (boot failure, crash: the serial log and qemu's
           output are printed).
    129, 130, 143  SIGHUP, SIGINT, SIGTERM: qemu is killed, the temp dir removed, and this script
           ends by that signal. qemu also dies should this script be killed by SIGKILL.
    A command may exit 77, 124 or 125 itself; the harness's own cases say so on stderr ("SKIP:",
    "TIMEOUT" or what failed).
    Nothing stays behind but the work dir's cache: the per-run temp dir (in \$TMPDIR) is removed.

EXAMPLES
    $prog -- cat /sys/fs/cgroup/cgroup.subtree_control
    $prog --timing --env MALL_BIN_DIR=\$PWD/build/bin -- tests/vm/check-cgroup2.sh
    $prog --share "\$PWD/out" -- sh -c 'build/bin/mallctl --help > out/help.txt'
EOF
}

die() { echo "$prog: $*" >&2; exit "$EXIT_HARNESS"; }
skip() { echo "$prog: SKIP: $*" >&2; exit "$EXIT_SKIP"; }
say() { if [ "$verbose" = 1 ]; then echo "$prog: $*" >&2; fi; }

envs=() shares=() visible=() timeout=600 work_dir="" cpus=2 memory=2G timing=0 verbose=0
boot_timeout=240 boot_retries=0
orig_args=("$@")  # for booting again after a stalled boot (--boot-retries)
while [ $# -gt 0 ]; do
  case $1 in
    --boot-timeout) [[ ${2-} =~ ^[1-9][0-9]*$ ]] || die "--boot-timeout needs a positive whole number of seconds"
      boot_timeout=$2; shift 2 ;;
    --boot-retries) [[ ${2-} =~ ^[0-9]+$ ]] || die "--boot-retries needs a whole number"
      boot_retries=$2; shift 2 ;;
    --env) [ $# -ge 2 ] || die "--env needs NAME=VALUE"
      [[ $2 =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || die "--env '$2': not NAME=VALUE"
      envs+=("$2"); shift 2 ;;
    --share) [ $# -ge 2 ] || die "--share needs a folder"
      [ -d "$2" ] || die "--share '$2': not a folder"
      shares+=("$(realpath -e -- "$2")"); shift 2 ;;
    --visible) [ $# -ge 2 ] || die "--visible needs a folder"
      [ -d "$2" ] || die "--visible '$2': not a folder"
      visible+=("$(realpath -e -- "$2")"); shift 2 ;;
    --timeout) [[ ${2-} =~ ^[1-9][0-9]*$ ]] || die "--timeout needs a positive whole number of seconds"
      timeout=$2; shift 2 ;;
    --work-dir) [ -n "${2-}" ] || die "--work-dir needs a folder"
      work_dir=$2; shift 2 ;;
    --cpus) [[ ${2-} =~ ^[1-9][0-9]*$ ]] || die "--cpus needs a positive number"
      cpus=$2; shift 2 ;;
    --memory) [[ ${2-} =~ ^[1-9][0-9]*[MG]?$ ]] || die "--memory needs a size such as 2G"
      memory=$2; shift 2 ;;
    --timing) timing=1; shift ;;
    --verbose) verbose=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) die "unknown option '$1' (the command goes after --; see --help)" ;;
  esac
done
[ $# -ge 1 ] || die "no command (usage: $prog [OPTIONS] -- COMMAND [ARGS...]; see --help)"

# The current directory and every --visible folder must exist in the guest at their paths: under
# the guest's own /tmp or /run they are shared (a clone or build tree under /tmp works as anywhere
# else); under its own /dev, /proc or /sys nothing can show them.
cwd=$(pwd -P)
for want in "$cwd" "${visible[@]}"; do
  covered=0
  for s in "${shares[@]}"; do case $want/ in "$s"/*) covered=1 ;; esac; done
  [ "$covered" = 1 ] && continue
  case $want/ in
    /tmp/*|/run/*) shares+=("$want") ;;
    /dev/*|/proc/*|/sys/*)
      if [ "$want" = "$cwd" ]; then what="the current directory $cwd"; else what="--visible $want"; fi
      die "$what cannot be seen in the guest (/dev, /proc and /sys are the guest's own): run from,
  or keep the tree in, a folder elsewhere" ;;
  esac
done

# --- What the host must have (else exit 77 with the reason) -------------------------------------
command -v qemu-system-x86_64 >/dev/null || skip "qemu-system-x86_64 not found (apt-get install qemu-system-x86)"
command -v modprobe >/dev/null || [ -x /usr/sbin/modprobe ] || skip "modprobe not found (apt-get install kmod)"
modprobe_cmd=$(command -v modprobe || echo /usr/sbin/modprobe)
busybox=""
for b in /bin/busybox /usr/bin/busybox; do if [ -x "$b" ]; then busybox=$b; break; fi; done
[ -n "$busybox" ] || skip "busybox not found (apt-get install busybox-static)"
if ldd "$busybox" >/dev/null 2>&1; then skip "$busybox is not statically linked (apt-get install busybox-static)"; fi
# The guest's kernel: a folder with boot/vmlinuz-KVER and lib/modules/KVER (guest-kernel.sh).
kernel_root=$("$(dirname "${BASH_SOURCE[0]}")/guest-kernel.sh") ||
  die "no kernel for the guest (guest-kernel.sh above says why and what to do)"
kver=""
while read -r v; do if [ -n "$v" ] && [ -d "$kernel_root/lib/modules/$v/kernel" ]; then kver=$v; fi; done < <(
  for f in "$kernel_root"/boot/vmlinuz-*; do if [ -e "$f" ]; then echo "${f##*/vmlinuz-}"; fi; done | sort -V)
[ -n "$kver" ] || die "$kernel_root holds no boot/vmlinuz-KVER with a matching lib/modules/KVER"
kernel=$kernel_root/boot/vmlinuz-$kver
[ -r "$kernel" ] || die "$kernel is not readable by $(id -un)"
# Its modules, mounted at /lib/modules/KVER in the guest from where the guest sees this folder.
guest_modules=$(realpath -e -- "$kernel_root/lib/modules/$kver")
case $guest_modules/ in
  /tmp/*|/run/*) shares+=("$guest_modules") ;;
  /dev/*|/proc/*|/sys/*) die "the guest's kernel modules in $guest_modules cannot be seen in the guest" ;;
esac
modprobe_kernel=("$modprobe_cmd" -d "$kernel_root" -S "$kver")

# --- Per-run temp dir, and the cleanup that always runs ----------------------------------------
tmp=$(mktemp -d "${TMPDIR:-/tmp}/run-in-vm.XXXXXX")
vm_install_traps   # qemu and the timers (by pid), the output copiers and $tmp go on every exit and signal

# --- The initramfs (cached) ---------------------------------------------------------------------
# Stage 1 (/init, busybox): modules, the 9p root + tmpfs overlay, the guest's mounts, switch_root.
write_init() {
  cat <<'INIT'
#!/bin/busybox sh
# /init of run-in-vm.sh's initramfs: mounts the host's / (9p) under a tmpfs overlay plus the
# guest's own proc/sys/cgroup2/dev/tmp/run, the control share and --share folders, then
# switch_roots into stage 2 (busybox, pid 1), which runs the command.
/bin/busybox mkdir -p /sbin /usr/bin /usr/sbin
/bin/busybox --install -s
export PATH=/bin:/sbin
fail() {
  echo "mall-vm-init: $*" >/dev/console
  [ -d /newroot/run/mall-vm ] && echo "$*" > /newroot/run/mall-vm/init-error
  reboot -f
}
mount -t proc proc /proc && mount -t sysfs sysfs /sys && mount -t devtmpfs devtmpfs /dev || fail "proc/sys/dev"
while read -r ko; do insmod "/modules/$ko" || fail "insmod $ko"; done < /modules/order
o9p=trans=virtio,version=9p2000.L,msize=262144
mount -t 9p -o "$o9p,ro,cache=loose" hostroot /lower || fail "mount the host's / (9p hostroot)"
mount -t tmpfs -o mode=0755 upper /upper && mkdir /upper/data /upper/work || fail "tmpfs upper"
mount -t overlay -o lowerdir=/lower,upperdir=/upper/data,workdir=/upper/work overlay /newroot \
  || fail "overlay root"
N=/newroot
mount -t proc proc $N/proc || fail "proc"
mount -t sysfs sysfs $N/sys || fail "sysfs"
mount -t cgroup2 cgroup2 $N/sys/fs/cgroup || fail "cgroup2"
echo +cpuset > $N/sys/fs/cgroup/cgroup.subtree_control || fail "+cpuset in cgroup.subtree_control"
mount -t devtmpfs devtmpfs $N/dev || fail "devtmpfs"
mkdir -p $N/dev/shm $N/dev/pts
mount -t tmpfs -o mode=1777 shm $N/dev/shm || fail "/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts $N/dev/pts || fail "devpts"
mount -t tmpfs -o mode=1777 tmp $N/tmp || fail "/tmp"
mount -t tmpfs -o mode=0755 run $N/run || fail "/run"
mkdir -p $N/run/mall-vm $N/run/mall-vm.bin
mount -t 9p -o "$o9p,cache=mmap" mallvmctl $N/run/mall-vm || fail "mount the control share"
# --share folders: "tag path" lines, parents first (sorted by the host).
while read -r tag path; do
  mkdir -p "$N$path" && mount -t 9p -o "$o9p,cache=mmap" "$tag" "$N$path" || fail "share $path"
done < $N/run/mall-vm/shares
# The kernel's modules (not the host's: guest-kernel.sh's folder) at /lib/modules/KVER.
if [ -s $N/run/mall-vm/kernel-modules ]; then
  read -r msrc mdst < $N/run/mall-vm/kernel-modules
  mkdir -p "$N$mdst" && mount -o bind "$N$msrc" "$N$mdst" || fail "kernel modules at $mdst"
fi
out="" err=""
for p in /sys/class/virtio-ports/*; do
  case $(cat "$p/name") in
    mall.stdout) out=/dev/${p##*/} ;;
    mall.stderr) err=/dev/${p##*/} ;;
  esac
done
[ -n "$out" ] && [ -n "$err" ] || fail "virtio ports mall.stdout/mall.stderr not found"
cp /bin/busybox /stage2 $N/run/mall-vm.bin/ || fail "copy stage 2"
umount /proc /sys /dev
exec switch_root $N /run/mall-vm.bin/busybox sh /run/mall-vm.bin/stage2 "$out" "$err"
INIT
}
# Stage 2 (pid 1 in the new root, busybox): runs command.sh, records its status, powers off.
write_stage2() {
  cat <<'STAGE2'
# stage 2 of run-in-vm.sh's guest, pid 1 after switch_root: runs the command made by the host
# (/run/mall-vm/command.sh) with stdout/stderr on the virtio ports $1/$2, writes its exit status
# to /run/mall-vm/status (the host reads it), saves the kernel log (and how many of its lines
# were there before the command) when the command failed or when asked, and powers off.
bb=/run/mall-vm.bin/busybox
ctl=/run/mall-vm
before=$($bb dmesg | $bb wc -l)
$bb touch $ctl/started
/bin/bash $ctl/command.sh < /dev/null > "$1" 2> "$2"
rc=$?
if [ "$rc" != 0 ] || [ -e $ctl/want-dmesg ]; then
  $bb dmesg -r > $ctl/dmesg 2>&1
  echo "$before" > $ctl/dmesg.before
fi
echo "$rc" > $ctl/status.new && $bb mv $ctl/status.new $ctl/status
$bb sync
$bb reboot -f
STAGE2
}

# The modules stage 1 loads, in modprobe's order, each once (file names prefixed by their order).
module_paths() {
  local m line
  for m in "${MODULES[@]}"; do
    "${modprobe_kernel[@]}" --show-depends "$m" || return 1
  done | while read -r line; do
    case $line in insmod\ *) line=${line#insmod }; echo "${line%% *}" ;; esac
  done | awk '!seen[$0]++'
}

# Makes the image in $1 from the module files listed in $2. Called under `||`, where set -e does
# not act: every step checks its own status.
build_initramfs() {
  local stage=$tmp/initramfs n=0 ko base
  mkdir -p "$stage"/{bin,dev,proc,sys,lower,upper,newroot,modules} || return 1
  cp "$busybox" "$stage/bin/busybox" || return 1
  while read -r ko; do
    n=$((n + 1)) base=$(printf '%02d-%s' "$n" "${ko##*/}")
    case $ko in
      *.ko) cp "$ko" "$stage/modules/$base" ;;
      *.ko.xz) base=${base%.xz}; xz -dc "$ko" > "$stage/modules/$base" ;;
      *.ko.zst) base=${base%.zst}; zstd -qdc "$ko" > "$stage/modules/$base" ;;
      *.ko.gz) base=${base%.gz}; gzip -dc "$ko" > "$stage/modules/$base" ;;
      *) echo "$prog: unexpected module file $ko" >&2; false ;;
    esac || return 1
    echo "$base" >> "$stage/modules/order" || return 1
  done < "$2"
  write_init > "$stage/init" && write_stage2 > "$stage/stage2" && chmod 755 "$stage/init" || return 1
  if command -v cpio >/dev/null; then
    (cd "$stage" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet -R 0:0) > "$1"
  else
    (cd "$stage" && find . | LC_ALL=C sort | "$busybox" cpio -o -H newc 2>/dev/null) > "$1"
  fi || return 1
  rm -rf -- "$stage"
}

# The kernel as qemu boots it fastest: the ELF vmlinux inside the bzImage, started through its PVH
# entry (no decompression under emulation: boot to command 6-7 s instead of 11-12 s on the
# project's machines). Any failure (unknown compression, no PVH note, no readelf): the bzImage.
extract_vmlinux() { # $1 = bzImage, $2 = output
  local magic unpack off
  command -v readelf >/dev/null || return 1
  for magic in 'xz:\xfd7zXZ\x00' 'zstd:\x28\xb5\x2f\xfd' 'gzip:\x1f\x8b\x08'; do
    unpack=${magic%%:*}
    command -v "$unpack" >/dev/null || continue
    while read -r off; do
      case $unpack in
        xz) tail -c +$((off + 1)) "$1" | xz -dc --single-stream > "$2" 2>/dev/null || true ;;
        zstd) tail -c +$((off + 1)) "$1" | zstd -qdc > "$2" 2>/dev/null || true ;;
        gzip) tail -c +$((off + 1)) "$1" | gzip -dc > "$2" 2>/dev/null || true ;;
      esac
      # An ELF with XEN_ELFNOTE_PHYS32_ENTRY (18), the PVH entry qemu needs.
      if [ "$(head -c 4 "$2" | tr -d '\0')" = $'\x7fELF' ] &&
         readelf -n "$2" 2>/dev/null | grep -q 'Unknown note type: (0x00000012)'; then
        return 0
      fi
    done < <(LC_ALL=C grep -aboP "${magic#*:}" "$1" | cut -d: -f1 | head -5)
  done
  return 1
}

[ -n "$work_dir" ] || work_dir=${TMPDIR:-/tmp}/mall-vm-cache-$(id -u)
mkdir -p -- "$work_dir" || die "cannot create the work dir $work_dir"
work_dir=$(realpath -e -- "$work_dir")
image=$work_dir/initramfs-$kver.cpio
key=$( { echo "$kver"; stat -L -c '%n %s %Y' "$kernel" "$busybox"; sha256sum < "${BASH_SOURCE[0]}"
         for m in "${MODULES[@]}"; do "${modprobe_kernel[@]}" --show-depends "$m" 2>&1; done
       } | sha256sum | cut -d' ' -f1)
if [ -s "$image" ] && [ "$(cat "$image.key" 2>/dev/null)" = "$key" ]; then
  say "initramfs: cached $image"
else
  say "initramfs: building $image for $kver"
  if ! module_paths > "$tmp/modules" || ! [ -s "$tmp/modules" ]; then
    die "kernel $kver in $kernel_root lacks modules the guest needs (modprobe -d $kernel_root -S $kver --show-depends ${MODULES[*]})"
  fi
  build_initramfs "$tmp/image" "$tmp/modules" || die "could not build the initramfs (above)"
  # Atomic replacement: a concurrent run keeps reading the image it opened.
  mv -f -- "$tmp/image" "$image.new.$$" && mv -f -- "$image.new.$$" "$image"
  echo "$key" > "$image.key.new.$$" && mv -f -- "$image.key.new.$$" "$image.key"
fi

boot_kernel=$kernel
vmlinux=$work_dir/vmlinux-$kver
kernel_key=$(stat -L -c '%n %s %Y' "$kernel")
if [ -s "$vmlinux" ] && [ "$(cat "$vmlinux.key" 2>/dev/null)" = "$kernel_key" ]; then
  boot_kernel=$vmlinux
elif [ "$(cat "$vmlinux.key" 2>/dev/null)" = "none: $kernel_key" ]; then
  : # known not to work for this kernel: the bzImage
elif extract_vmlinux "$kernel" "$tmp/vmlinux"; then
  say "vmlinux: extracted $vmlinux (PVH boot)"
  mv -f -- "$tmp/vmlinux" "$vmlinux.new.$$" && mv -f -- "$vmlinux.new.$$" "$vmlinux"
  echo "$kernel_key" > "$vmlinux.key.new.$$" && mv -f -- "$vmlinux.key.new.$$" "$vmlinux.key"
  boot_kernel=$vmlinux
else
  say "vmlinux: cannot extract a PVH-bootable vmlinux from $kernel; booting the bzImage (slower)"
  rm -f -- "$tmp/vmlinux" "$vmlinux"
  echo "none: $kernel_key" > "$vmlinux.key"
fi

# --- The control share: the command to run, the --share list; the guest writes status there ----
ctl=$tmp/ctl
mkdir -p "$ctl"
{
  echo "# made by $prog: the guest's stage 2 runs this with bash"
  printf 'cd -- %q || { echo %q >&2; exit %d; }\n' "$cwd" \
    "$prog: cannot cd to $cwd in the guest" "$EXIT_HARNESS"
  printf 'exec /usr/bin/env -i PATH=%q HOME=/root MALL_IN_VM=1' "$GUEST_PATH"
  for e in "${envs[@]}"; do printf ' %q' "$e"; done
  for a in "$@"; do printf ' %q' "$a"; done
  echo
} > "$ctl/command.sh"
share_args=()
: > "$ctl/shares"
if [ ${#shares[@]} -gt 0 ]; then
  i=0
  while read -r s; do
    share_args+=(-virtfs "local,path=$s,mount_tag=mallvmshare$i,security_model=none,multidevs=remap")
    echo "mallvmshare$i $s" >> "$ctl/shares"
    i=$((i + 1))
  done < <(printf '%s\n' "${shares[@]}" | LC_ALL=C sort -u |
             awk '{ for (i = 1; i <= n; i++) if (index($0 "/", kept[i] "/") == 1) next; kept[++n] = $0; print }')
fi
printf '%s %s\n' "$guest_modules" "/lib/modules/$kver" > "$ctl/kernel-modules"
if [ "$verbose" = 1 ]; then touch "$ctl/want-dmesg"; fi

# --- Boot ---------------------------------------------------------------------------------------
# The guest's stdout/stderr ports write into fifos that cat copies to our stdout/stderr.
vm_output_fifos

cmdline="console=ttyS0 panic=-1 rdinit=/init i8042.noaux i8042.nokbd i8042.nopnp"
cmdline+=" random.trust_cpu=on mitigations=off nowatchdog trace_clock=global"
if [ "$verbose" = 1 ]; then cmdline+=" loglevel=7"; else cmdline+=" quiet loglevel=0"; fi
vm_qemu_cmd "$cpus" "$memory" "$boot_kernel" "$image" "$cmdline" \
  -virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap" \
  -virtfs "local,path=$ctl,mount_tag=mallvmctl,security_model=none,multidevs=remap" \
  "${share_args[@]}"
say "booting $boot_kernel (${cpus} cpus, $memory, TCG), timeout ${timeout}s"
t0=$(date +%s.%N)
vm_start_qemu
# The timers die with this script too, should it be SIGKILLed (orphan_guard: vm_start_qemu's).
"${orphan_guard[@]}" sleep "$timeout" &
sleep_pid=$!
# The boot watcher: a plain sleep (no shell whose child could outlive it and hold the caller's
# output open). When it ends before the guest started the command, the boot stalled.
"${orphan_guard[@]}" sleep "$boot_timeout" &
boot_pid=$!
finished=""
boot_stalled=0
wait -n -p finished "$qemu_pid" "$sleep_pid" "$boot_pid" || true
if [ "$finished" = "$boot_pid" ]; then
  boot_pid=""
  if [ -e "$ctl/started" ]; then
    finished=""
    wait -n -p finished "$qemu_pid" "$sleep_pid" || true
  else
    boot_stalled=1
  fi
fi
timed_out=0
[ "$finished" = "$qemu_pid" ] || timed_out=1
vm_stop_qemu "$timed_out"
kill_and_reap "$sleep_pid" ${boot_pid:+"$boot_pid"}; sleep_pid="" boot_pid=""
t1=$(date +%s.%N)
vm_drain_output

print_logs() { vm_print_logs "$1"; } # print_logs WHY
if [ "$timing" = 1 ] && [ -e "$ctl/started" ]; then
  started=$(stat -c %.9Y "$ctl/started")
  done_at=$(stat -c %.9Y "$ctl/status" 2>/dev/null || echo "$t1")
  awk -v a="$t0" -v b="$started" -v c="$done_at" -v d="$t1" -v p="$prog" 'BEGIN {
    printf "%s: timing: boot to command %.1f s, command %.1f s, total %.1f s\n", p, b - a, c - b, d - a }' >&2
fi
if [ "$boot_stalled" = 1 ]; then
  print_logs "boot stalled: the guest had not started the command ${boot_timeout}s after qemu started"
  if [ "$boot_retries" -gt 0 ]; then
    again=() skip_next=0
    for a in "${orig_args[@]}"; do
      if [ "$skip_next" = 1 ]; then skip_next=0; continue; fi
      if [ "$a" = --boot-retries ]; then skip_next=1; continue; fi
      again+=("$a")
    done
    echo "$prog: booting again ($((boot_retries - 1)) more retries after this one)" >&2
    vm_cleanup
    exec "$0" --boot-retries "$((boot_retries - 1))" "${again[@]}"
  fi
  echo "$prog: TIMEOUT: the boot stalled (exit $EXIT_TIMEOUT)" >&2
  exit "$EXIT_TIMEOUT"
fi
if [ "$timed_out" = 1 ]; then
  print_logs "timeout: the guest ran longer than ${timeout}s and was killed"
  echo "$prog: TIMEOUT after ${timeout}s (exit $EXIT_TIMEOUT)" >&2
  exit "$EXIT_TIMEOUT"
fi
if [ -e "$ctl/init-error" ]; then
  print_logs "the guest's init failed: $(cat "$ctl/init-error")"
  exit "$EXIT_HARNESS"
fi
if ! [ -s "$ctl/status" ]; then
  print_logs "the guest ended without running the command to its end (no exit status)"
  exit "$EXIT_HARNESS"
fi
rc=$(cat "$ctl/status")
[[ $rc =~ ^[0-9]+$ ]] || { print_logs "bad exit status '$rc' from the guest"; exit "$EXIT_HARNESS"; }
if [ "$verbose" = 1 ]; then
  print_logs "verbose"
  if [ -s "$ctl/dmesg" ]; then echo "$prog: the guest's kernel log:" >&2; sed 's/^/  dmesg| /' "$ctl/dmesg" >&2; fi
elif [ "$rc" != 0 ] && [ -s "$ctl/dmesg" ]; then
  # What the kernel said while the command ran (an OOM kill, a segfault, a hung task...).
  before=$(cat "$ctl/dmesg.before" 2>/dev/null || echo 0)
  mapfile -t news < <(tail -n +$((before + 1)) "$ctl/dmesg")
  if [ ${#news[@]} -gt 0 ]; then
    echo "$prog: the command exited $rc; the guest kernel said meanwhile (all: --verbose):" >&2
    printf '  dmesg| %s\n' "${news[@]}" >&2
  fi
fi
say "the command exited $rc"
exit "$rc"
