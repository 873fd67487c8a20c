# SPDX-License-Identifier: BSD-3-Clause
# shellcheck shell=bash disable=SC2154  # prog, tmp: the caller's
# qemu_launch.sh — the qemu launch that tests/vm/run-in-vm.sh (the host's / over 9p) and
# tests/vm/site/run-in-site-vm.sh (the Debian 13 site root on a disk) share: the TCG command line
# with the serial console in a file and the guest's stdout/stderr on virtio serial ports, qemu
# started by pid (dying with its caller even by SIGKILL), killed by pid, the temp dir removed on
# every exit and signal. Sourced, never run. Contract: the caller has set `prog` (its name, for
# messages) and `tmp` (its per-run temp dir, removed by vm_cleanup) before vm_install_traps; it
# may set sleep_pid and boot_pid (its watchdog timers), which vm_cleanup kills too. What differs
# stays with the callers: the guest (initramfs or disk image), how it reports, the wait for it.

qemu_pid="" sleep_pid="" boot_pid="" cat_pids=() orphan_guard=() qemu_cmd=()

# kill_and_reap PID...: TERM, up to 5 s, then KILL; each reaped.
kill_and_reap() {
  local p i
  for p in "$@"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "$@"; do
    for ((i = 0; i < 50; i++)); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
}

# vm_cleanup: kills qemu, the timers and the output copiers that are still there; removes $tmp.
# shellcheck disable=SC2317 # called from traps
vm_cleanup() {
  trap - EXIT INT TERM HUP
  local pids=()
  [ -n "$qemu_pid" ] && pids+=("$qemu_pid")
  [ -n "$sleep_pid" ] && pids+=("$sleep_pid")
  [ -n "$boot_pid" ] && pids+=("$boot_pid")
  pids+=("${cat_pids[@]}")
  [ ${#pids[@]} -eq 0 ] || kill_and_reap "${pids[@]}"
  rm -rf -- "$tmp"
}

# vm_install_traps: vm_cleanup on exit; on SIGINT, SIGTERM and SIGHUP it says so on stderr, cleans
# up and ends this shell by the same signal.
vm_install_traps() {
  local sig
  trap vm_cleanup EXIT
  for sig in INT TERM HUP; do
    # shellcheck disable=SC2064 # the signal's name is meant to be expanded now
    trap "echo '$prog: SIG$sig: killing the guest' >&2; vm_cleanup; trap - $sig; kill -$sig \$\$" "$sig"
  done
}

# vm_output_fifos: the fifos $tmp/stdout and $tmp/stderr, which qemu's mall.stdout and mall.stderr
# ports write into, copied by cat to our stdout and stderr: works whatever our stdout is (pipe,
# file, tty, socket) and keeps our own file offsets right.
vm_output_fifos() {
  mkfifo "$tmp/stdout" "$tmp/stderr"
  cat "$tmp/stdout" & cat_pids+=($!)
  cat "$tmp/stderr" >&2 & cat_pids+=($!)
}

# vm_qemu_cmd CPUS MEMORY KERNEL INITRD CMDLINE [QEMU_ARG...]: sets the array qemu_cmd:
#   qemu-system-x86_64 under TCG (-accel tcg,thread=multi -cpu max; /dev/kvm is not used), no
#   default devices, no display, no reboot (a guest's reboot ends qemu), -smp CPUS -m MEMORY
#   (qemu syntax), the KERNEL with the INITRD and CMDLINE, the serial console into
#   $tmp/serial.log, the QEMU_ARGs (disks, 9p shares), then a virtio-serial bus with the ports
#   mall.stdout and mall.stderr into $tmp/stdout and $tmp/stderr. More ports may be appended.
vm_qemu_cmd() {
  local cpus=$1 memory=$2 kernel=$3 initrd=$4 cmdline=$5
  shift 5
  qemu_cmd=(qemu-system-x86_64 -nodefaults -no-user-config -display none -no-reboot
    -accel "tcg,thread=multi" -cpu max -smp "$cpus" -m "$memory"
    -kernel "$kernel" -initrd "$initrd" -append "$cmdline"
    -chardev "file,id=serial,path=$tmp/serial.log" -serial chardev:serial
    "$@"
    -device virtio-serial-pci
    -chardev "file,id=gout,path=$tmp/stdout" -device "virtserialport,chardev=gout,name=mall.stdout"
    -chardev "file,id=gerr,path=$tmp/stderr" -device "virtserialport,chardev=gerr,name=mall.stderr")
}

# vm_start_qemu: starts qemu_cmd in the background (qemu_pid), its output into $tmp/qemu.log,
# stdin /dev/null, TMPDIR=$tmp (where a snapshot=on overlay goes). Sets orphan_guard, the prefix
# that makes a process die should this shell be SIGKILLed (no trap runs then: e.g. an outer
# watchdog): PR_SET_PDEATHSIG through setpriv, when util-linux has it; callers put it before
# their timers too.
vm_start_qemu() {
  orphan_guard=()
  if setpriv --help 2>/dev/null | grep -q -- --pdeathsig; then orphan_guard=(setpriv --pdeathsig KILL --); fi
  TMPDIR=$tmp "${orphan_guard[@]}" "${qemu_cmd[@]}" >"$tmp/qemu.log" 2>&1 </dev/null &
  qemu_pid=$!
}

# vm_stop_qemu KILL: KILL 1: qemu is killed by pid (a timeout); 0: it ended, reaped. qemu_pid="".
vm_stop_qemu() {
  if [ "$1" = 1 ]; then kill_and_reap "$qemu_pid"; else wait "$qemu_pid" 2>/dev/null || true; fi
  qemu_pid=""
}

# vm_drain_output: after qemu ended: unblocks a cat whose fifo qemu never opened (an open O_RDWR
# never blocks), then waits until both copied everything.
vm_drain_output() {
  local f p fd
  for f in "$tmp/stdout" "$tmp/stderr"; do exec {fd}<>"$f"; exec {fd}>&-; done
  for p in "${cat_pids[@]}"; do wait "$p" 2>/dev/null || true; done
  cat_pids=()
}

# vm_print_logs WHY [SERIAL_NAME]: on stderr: "$prog: WHY; the guest's SERIAL_NAME (default
# 'serial log'):", the serial console's lines, then qemu's own output when it said anything.
vm_print_logs() {
  echo "$prog: $1; the guest's ${2:-serial log}:" >&2
  sed 's/^/  serial| /' "$tmp/serial.log" >&2 2>/dev/null || true
  if [ -s "$tmp/qemu.log" ]; then echo "$prog: qemu's output:" >&2; sed 's/^/  qemu| /' "$tmp/qemu.log" >&2; fi
}
