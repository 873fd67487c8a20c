#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# test_install_deps_host_safety.sh — launch_scripts/install-deps.sh never harms a booted Debian 12
# host (issue 38): for each profile (build, keras, full), `apt-get -s install --no-install-recommends`
# of the profile's packages (install-deps.sh --profile P --print-packages) in a Debian 12 root that
# looks booted (initramfs-tools, systemd-sysv and linux-image-amd64 installed, apt lists present)
# removes nothing ("Remv"/"Purg" lines) and names no kernel, initramfs or bootloader package
# (linux-image-*, tiny-initramfs, initramfs-tools, dracut, grub*, systemd-boot, shim, lilo), neither
# in the list nor in what apt would install; each profile contains the one before it. Then the
# script itself installs munge in that root as on a systemd host (/run/systemd/system, a logging
# systemctl stand-in): nothing asks to start munge.service, it ends disabled, the temporary
# policy-rc.d is gone, the host's other units saw no call, and a policy-rc.d of the host's own is
# left as it was. Bugs it pins: tiny-initramfs in the list made apt remove initramfs-tools; the
# install started munge (slurmd, dockerd, ...) and left them enabled.
# Usage: test_install_deps_host_safety.sh SOURCE_DIR [INSTALL_DEPS_SCRIPT]. The second argument
# checks another copy of the script (e.g. `git show HEAD~:launch_scripts/install-deps.sh`); one
# without --print-packages (the script before profiles) is read, not run as it is: its one
# packages=(...) list stands for every profile, and is cut to munge for the install check.
# Needs root (chroot; exits 77 with the reason in $MALL_TEST_SKIP_LOG otherwise), mmdebstrap, and
# Debian's mirror (the root the first time; munge's two small packages each time).
#
# Choices (measured on the 2-cpu CI machine kind):
# - The root: mmdebstrap --variant=important bookworm (+ initramfs-tools, linux-image-amd64,
#   systemd-sysv) from deb.debian.org with bookworm-updates and bookworm-security, apt lists kept
#   (--skip=cleanup/apt/lists). Only dpkg's database and apt's lists matter to `apt-get -s`, so the
#   root leaves out the kernel's modules, docs, man pages and locales (dpkg path-exclude) and does
#   not build an initramfs (update-initramfs diverted to a stub while mmdebstrap runs, then
#   restored): dpkg still records every package as installed, which is all apt's resolver sees.
#   Cached as an uncompressed tarball (~250 MB) in ${XDG_CACHE_HOME:-~/.cache}/mall/, keyed by
#   this recipe, remade when older than 7 days (its apt lists are those of the day it was made).
#   Measured: cold 49 s on a quiet machine (mmdebstrap 36 s), 156 s with the machine loaded
#   (load 7 on 2 cpus); warm 10-26 s (unpacking 4-11 s, three simulations, two munge installs).
# Cleanup (also on failure, Ctrl-C and the watchdog): the unpacked root and temporary files; the
# tarball stays.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../support/watchdog.sh"   # watchdog_script, watchdog_fired
timeout_s=${MALL_INSTALL_DEPS_TEST_TIMEOUT_S:-540}
watchdog_script "$timeout_s" "$@"
me=$(basename "$0")
src=$(cd "${1:?usage: $me SOURCE_DIR [INSTALL_DEPS_SCRIPT]}" && pwd)
script=${2:-$src/launch_scripts/install-deps.sh}
[ -f "$script" ] || { echo "FAIL: $script: no such file" >&2; exit 1; }

if [ "$(id -u)" -ne 0 ]; then
  why="simulating apt in a Debian root needs root (mmdebstrap, chroot); run as root"
  echo "SKIP: $why"
  [ -n "${MALL_TEST_SKIP_LOG:-}" ] && echo "SKIPPED $me $me: $why" >>"$MALL_TEST_SKIP_LOG"
  exit 77
fi
fail() { echo "FAIL: $*" >&2; exit 1; }
for tool in mmdebstrap chroot tar; do
  command -v "$tool" >/dev/null || fail "$tool not installed: run launch_scripts/install-deps.sh"
done

tmp=$(mktemp -d /tmp/mall-install-deps.XXXXXX)
root=$tmp/root
exec 3>&1 4>&2   # the traps' own stdout and stderr
cleanup() {
  local status=$?
  set +e
  trap '' TERM INT
  if awk -v r="$root/" 'index($5, r) == 1 {found=1} END {exit !found}' /proc/self/mountinfo; then
    echo "FAIL: cleanup: something is mounted under $root; $tmp left in place" >&4
    status=1
  else
    rm -rf --one-file-system "$tmp"
  fi
  exit "$status"
}
trap cleanup EXIT
trap 'watchdog_fired "$timeout_s" >&3; exit 1' TERM
trap 'exit 130' INT
t0=$SECONDS
step() { echo "== $me [$((SECONDS - t0)) s]: $*"; }

# --- a. each profile's package list -------------------------------------------------------------
profiles=(build keras full)
if grep -q -- '--print-packages' "$script"; then
  for p in "${profiles[@]}"; do
    bash "$script" --profile "$p" --print-packages >"$tmp/$p.list" ||
      fail "$script --profile $p --print-packages failed"
  done
else
  # The script before profiles: read its one list (a bash array), never run it (it would install).
  step "$script has no --print-packages: reading its packages=(...) list for every profile"
  bash -c 'eval "$(sed -n "/^packages=(/,/^)/p" "$1")"; printf "%s\n" "${packages[@]}"' _ "$script" >"$tmp/build.list"
  cp "$tmp/build.list" "$tmp/keras.list" && cp "$tmp/build.list" "$tmp/full.list"
fi
for p in "${profiles[@]}"; do
  [ -s "$tmp/$p.list" ] || fail "profile $p lists no package"
  bad=$(grep -vE '^[a-z0-9][a-z0-9.+-]+$' "$tmp/$p.list" || true)
  [ -z "$bad" ] || fail "profile $p: not one Debian package name a line: $bad"
done
# Each profile contains the one before it (keras = build + ..., full = keras + ...).
for pair in build:keras keras:full; do
  lacks=$(LC_ALL=C comm -23 <(LC_ALL=C sort -u "$tmp/${pair%:*}.list") <(LC_ALL=C sort -u "$tmp/${pair#*:}.list"))
  [ -z "$lacks" ] || fail "profile ${pair#*:} lacks packages of profile ${pair%:*}: $lacks"
done

# --- b. a Debian 12 root that looks booted (cached) ---------------------------------------------
readonly SUITE=bookworm MIRROR=http://deb.debian.org/debian SECURITY=http://deb.debian.org/debian-security
readonly ROOT_PACKAGES=initramfs-tools,linux-image-amd64,systemd-sysv
# shellcheck disable=SC2016  # expanded by mmdebstrap's hook shell
readonly ESSENTIAL_HOOK='chroot "$1" dpkg-divert --quiet --local --rename --add /usr/sbin/update-initramfs && printf "#!/bin/sh\nexit 0\n" >"$1/usr/sbin/update-initramfs" && chmod 755 "$1/usr/sbin/update-initramfs"'
# shellcheck disable=SC2016
readonly CUSTOMIZE_HOOK='rm -f "$1/usr/sbin/update-initramfs" && chroot "$1" dpkg-divert --quiet --local --rename --remove /usr/sbin/update-initramfs'
excludes=('/lib/modules/*/kernel/*' '/usr/lib/modules/*/kernel/*' '/usr/share/doc/*' '/usr/share/man/*' '/usr/share/locale/*')
dpkgopts=()
for e in "${excludes[@]}"; do dpkgopts+=(--dpkgopt="path-exclude=$e"); done
cache=${XDG_CACHE_HOME:-$HOME/.cache}/mall
key=$(printf '%s\n' "$SUITE" "$MIRROR" "$SECURITY" "$ROOT_PACKAGES" "$ESSENTIAL_HOOK" "$CUSTOMIZE_HOOK" "${excludes[@]}" |
        md5sum | cut -c1-8)
tarball=$cache/debian-$SUITE-booted-$key-root.tar
mkdir -p "$cache"
exec {lock}>"$cache/.booted-root.lock"
flock "$lock"   # one maker at a time
if [ -f "$tarball" ] && [ -n "$(find "$tarball" -mtime +7)" ]; then
  step "$tarball is older than 7 days (its apt lists too): making it again"
  rm -f -- "$tarball"
fi
if ! [ -f "$tarball" ]; then
  step "mmdebstrap --variant=important $SUITE (+ $ROOT_PACKAGES) into $tarball"
  # stdin from /dev/null: mmdebstrap would read sources.list lines from a non-terminal stdin.
  timeout 420 mmdebstrap --variant=important --include="$ROOT_PACKAGES" --skip=cleanup/apt/lists \
    "${dpkgopts[@]}" --essential-hook="$ESSENTIAL_HOOK" --customize-hook="$CUSTOMIZE_HOOK" \
    "$SUITE" "$tmp/root.tar" "deb $MIRROR $SUITE main" "deb $MIRROR $SUITE-updates main" \
    "deb $SECURITY $SUITE-security main" </dev/null >"$tmp/mmdebstrap.log" 2>&1 ||
    { tail -n 30 "$tmp/mmdebstrap.log" >&2; fail "mmdebstrap $SUITE (is Debian's mirror reachable?)"; }
  for old in "$cache/debian-$SUITE-booted-"*-root.tar; do rm -f -- "$old"; done
  mv -- "$tmp/root.tar" "$tarball"
fi
exec {lock}>&-
step "unpacking $tarball"
mkdir "$root"
tar -xpf "$tarball" -C "$root" || fail "unpacking $tarball"
in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LC_ALL=C.UTF-8 "$@"; }
# The root is what the test says it is: a booted-style Debian 12 with the packages that matter.
for p in initramfs-tools linux-image-amd64 systemd-sysv; do
  in_root dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -qx 'install ok installed' ||
    fail "the root lacks $p: remove $tarball and run again"
done
grep -qx "VERSION_CODENAME=$SUITE" "$root/etc/os-release" || fail "the root is not Debian $SUITE"

# --- c. apt's plan for each profile --------------------------------------------------------------
# Kernel, initramfs and bootloader packages: none may be named, installed or touched.
readonly FORBIDDEN='^(linux-image-.*|tiny-initramfs.*|initramfs-tools.*|dracut.*|grub.*|systemd-boot.*|shim-signed.*|shim-unsigned|lilo|extlinux)$'
failures=()
for p in "${profiles[@]}"; do
  mapfile -t list <"$tmp/$p.list"
  named=$(grep -E "$FORBIDDEN" "$tmp/$p.list" | tr '\n' ' ' || true)
  [ -z "$named" ] || failures+=("profile $p names kernel/initramfs/bootloader packages: $named")
  rc=0
  timeout 120 chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LC_ALL=C.UTF-8 \
    apt-get -s install --no-install-recommends "${list[@]}" >"$tmp/$p.plan" 2>&1 || rc=$?
  if [ "$rc" -ne 0 ]; then
    tail -n 20 "$tmp/$p.plan" >&2
    failures+=("profile $p: apt-get -s install failed (exit $rc, above)")
    continue
  fi
  removed=$(grep -E '^(Remv|Purg) ' "$tmp/$p.plan" || true)
  [ -z "$removed" ] || failures+=("profile $p: apt would remove packages: $(tr '\n' ';' <<<"$removed")")
  touched=$(awk '$1 == "Inst" || $1 == "Conf" || $1 == "Remv" || $1 == "Purg" { print $2 }' "$tmp/$p.plan" |
              sed 's/:.*//' | grep -E "$FORBIDDEN" | LC_ALL=C sort -u | tr '\n' ' ' || true)
  [ -z "$touched" ] || failures+=("profile $p: apt would install or change kernel/initramfs/bootloader packages: $touched")
  step "profile $p: ${#list[@]} packages named, apt would install $(grep -c '^Inst ' "$tmp/$p.plan" || true), remove $(grep -cE '^(Remv|Purg) ' "$tmp/$p.plan" || true)"
done
# --- d. the install itself on a systemd host: no service started, none left enabled -------------
# The script for real in the root, its list cut to munge (a package whose maintainer scripts enable
# and start munge.service), as on a host where systemd runs: /run/systemd/system exists, and
# systemctl is a stand-in that logs each call and keeps the [Install] links as systemctl would
# (the root has no running systemd). Passes when nothing asked to start munge.service, it ends
# disabled, the temporary policy-rc.d is gone, and the host's units (cron, ...) saw no call.
# Then again with a policy-rc.d of the host's own that allows starts (munge starts then, by the
# host's choice): that file is left as it was, and munge.service still ends disabled and stopped.
step "the install on a systemd host (munge only)"
if grep -q -- '--print-packages' "$script"; then
  sed 's/^  build) packages=.*/  build) packages=(munge) ;;/' "$script" >"$root/tmp/install-deps.sh"
else
  sed '/^packages=(/,/^)/c\packages=(munge)' "$script" >"$root/tmp/install-deps.sh"
fi
! cmp -s "$script" "$root/tmp/install-deps.sh" || fail "cannot cut $script's package list to munge (the test's sed no longer matches it)"
mkdir -p "$root/run/systemd/system"
cat >"$root/usr/bin/systemctl" <<'STUB'
#!/bin/sh
# systemctl stand-in: logs each call; enable/preset make the [Install] WantedBy= links, disable
# removes them, is-enabled answers from them; start/stop/daemon-reload do nothing.
echo "$*" >>/tmp/systemctl.log
verb="" units=""
for a; do case $a in -*) ;; *) if [ -z "$verb" ]; then verb=$a; else units="$units $a"; fi ;; esac; done
for u in $units; do
  case $verb in
    enable|preset)
      for t in $(sed -n 's/^WantedBy=//p' "/lib/systemd/system/$u" 2>/dev/null); do
        mkdir -p "/etc/systemd/system/$t.wants" && ln -sf "/lib/systemd/system/$u" "/etc/systemd/system/$t.wants/$u"
      done ;;
    disable) rm -f /etc/systemd/system/*.wants/"$u" ;;
    is-enabled)
      for l in /etc/systemd/system/*.wants/"$u"; do if [ -L "$l" ]; then echo enabled; exit 0; fi; done
      echo disabled; exit 1 ;;
  esac
done
exit 0
STUB
chmod 755 "$root/usr/bin/systemctl"
cp /etc/resolv.conf "$root/etc/resolv.conf"
host_units() { (cd "$root/etc/systemd/system" && find . -mindepth 2 -maxdepth 2 -path './*.wants/*' ! -name munge.service | LC_ALL=C sort); }
units_before=$(host_units)
install_munge() { # install_munge LABEL STARTS_FORBIDDEN(0|1): runs the cut script in the root; log $tmp/LABEL.log
  rm -f "$root/tmp/systemctl.log"
  timeout 300 chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LC_ALL=C.UTF-8 \
    MALL_SKIP_TENSORFLOW=1 bash /tmp/install-deps.sh --profile build >"$tmp/$1.log" 2>&1 ||
    { tail -n 20 "$tmp/$1.log" >&2; failures+=("$1: install-deps.sh (cut to munge) failed in the root (above)"); return 1; }
  in_root dpkg-query -W -f='${Status}' munge 2>/dev/null | grep -qx 'install ok installed' ||
    { failures+=("$1: munge is not installed after install-deps.sh"); return 1; }
  touch "$root/tmp/systemctl.log"
  started=$(grep -E '(^| )(start|restart|reload-or-restart|try-restart) ' "$root/tmp/systemctl.log" || true)
  [ "$2" = 0 ] || [ -z "$started" ] || failures+=("$1: a service was started during the install: systemctl $(tr '\n' ';' <<<"$started")")
  [ -z "$(ls "$root"/etc/systemd/system/*.wants/munge.service 2>/dev/null)" ] ||
    failures+=("$1: munge.service is left enabled: $(cd "$root" && ls etc/systemd/system/*.wants/munge.service)")
  grep -Eq '^disable (--now )?(--quiet )?munge\.service$' "$root/tmp/systemctl.log" ||
    failures+=("$1: munge.service was not disabled and stopped (systemctl disable --now)")
  other=$(grep -vE '(^| )munge\.service$|^daemon-reload$|^$' "$root/tmp/systemctl.log" || true)
  [ -z "$other" ] || failures+=("$1: systemctl calls about units the host already had: $(tr '\n' ';' <<<"$other")")
  [ "$(host_units)" = "$units_before" ] || failures+=("$1: the host's other enabled units changed")
}
if install_munge no-policy 1; then
  [ ! -e "$root/usr/sbin/policy-rc.d" ] || failures+=("no-policy: /usr/sbin/policy-rc.d is left behind: $(cat "$root/usr/sbin/policy-rc.d")")
  grep -q 'policy-rc.d denied execution of start' "$tmp/no-policy.log" ||
    failures+=("no-policy: invoke-rc.d was not denied the start of munge (no policy-rc.d during the install)")
fi
in_root dpkg --purge munge libmunge2 >/dev/null 2>&1 || true
rm -f "$root"/etc/systemd/system/*.wants/munge.service
printf '#!/bin/sh\n# the host'"'"'s own policy\nexit 0\n' >"$root/usr/sbin/policy-rc.d"
chmod 755 "$root/usr/sbin/policy-rc.d"
policy_sum=$(md5sum <"$root/usr/sbin/policy-rc.d")
if install_munge host-policy 0; then
  [ "$(md5sum <"$root/usr/sbin/policy-rc.d" 2>/dev/null)" = "$policy_sum" ] ||
    failures+=("host-policy: the host's /usr/sbin/policy-rc.d was changed or removed")
fi
step "the install: $(grep -c . "$root/tmp/systemctl.log" || true) systemctl calls in the last run, $(grep -h '^install-deps: disabling' "$tmp"/*-policy.log | head -n 1)"

if [ ${#failures[@]} -gt 0 ]; then
  printf 'FAIL: %s\n' "${failures[@]}" >&2
  exit 1
fi
step "PASS: no profile removes a package or touches a kernel, initramfs or bootloader; the install starts no service and leaves none enabled"
