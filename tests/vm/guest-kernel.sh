#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# guest-kernel.sh — the kernel of run-in-vm.sh's cgroup-v2 guest, never installed on the host:
# Debian's current linux-image-*-amd64 package (the one linux-image-amd64 depends on, resolved with
# apt-cache against the host's apt sources) fetched with `apt-get download`, unpacked with
# `dpkg-deb -x` into a cache folder and indexed with `depmod -b`, as the Debian 13 site guest
# (tests/vm/site/) takes its kernel from its own root. Contract: prints that folder (it holds
# boot/vmlinuz-KVER and lib/modules/KVER with modules.dep) on stdout, progress on stderr; exit 0
# found or made, 1 failed (what to do on stderr, never a silent skip). A second call downloads
# nothing: the resolution is remembered until the host's apt lists change. --help.
set -euo pipefail

prog=${0##*/}
readonly META=linux-image-amd64
cache=${XDG_CACHE_HOME:-$HOME/.cache}/mall/guest-kernel

usage() {
  cat <<EOF
NAME
    $prog - fetch (or find cached) the Debian kernel of the tests/vm guest

SYNOPSIS
    $prog [-h | --help]

DESCRIPTION
    Prints a folder that holds boot/vmlinuz-KVER and lib/modules/KVER (with depmod's modules.dep)
    of Debian's current $META kernel, without installing any package on this machine:
      1. apt-cache resolves $META to the versioned package it depends on (for example
         linux-image-6.1.0-56-amd64) and that package's candidate version, from this machine's
         apt lists (so the kernel follows \`apt-get update\`);
      2. \`apt-get download\` fetches that .deb (about 70 MB) from this machine's apt sources,
         \`dpkg-deb -x\` unpacks it (about 400 MB) into
         $cache/PACKAGE_VERSION, and \`depmod -b\` indexes its modules;
      3. the folders of older versions are removed.
    Later calls print the cached folder at once: the resolution is remembered with the time stamp
    of /var/lib/apt/lists and redone only when that changes. run-in-vm.sh calls this at every run;
    launch_scripts/install-deps.sh --profile full calls it once so that the tests need no download.

    A download that fails is an error (exit 1) that says what to do; as root it first runs
    \`apt-get update\` and tries once more (a security update may have replaced the package).

ENVIRONMENT
    MALL_VM_KERNEL_ROOT  use this folder instead (it must hold boot/vmlinuz-KVER and
                         lib/modules/KVER); nothing is downloaded
    XDG_CACHE_HOME       the cache's parent (default ~/.cache)

EXIT STATUS
    0 the folder on stdout; 1 failed (the reason and what to do on stderr).
EOF
}
case ${1-} in
  -h|--help) usage; exit 0 ;;
  "") ;;
  *) echo "$prog: unknown argument '$1' (see --help)" >&2; exit 1 ;;
esac

fail() { echo "$prog: $*" >&2; exit 1; }
say() { echo "$prog: $*" >&2; }
# kernel_version ROOT: the KVER of ROOT/boot/vmlinuz-KVER that has ROOT/lib/modules/KVER (the newest).
kernel_version() {
  local f v found=""
  for f in "$1"/boot/vmlinuz-*; do
    [ -e "$f" ] || continue
    v=${f##*/vmlinuz-}
    [ -d "$1/lib/modules/$v/kernel" ] && found+="$v"$'\n'
  done
  printf '%s' "$found" | sort -V | tail -n 1
}

if [ -n "${MALL_VM_KERNEL_ROOT:-}" ]; then
  [ -n "$(kernel_version "$MALL_VM_KERNEL_ROOT")" ] ||
    fail "MALL_VM_KERNEL_ROOT=$MALL_VM_KERNEL_ROOT holds no boot/vmlinuz-KVER with a matching lib/modules/KVER/kernel"
  realpath -e -- "$MALL_VM_KERNEL_ROOT"
  exit 0
fi

lists=/var/lib/apt/lists
stamp="$(stat -c %Y "$lists" 2>/dev/null || echo none) $(dpkg --print-architecture 2>/dev/null || echo none)"
# The fast path: the apt lists have not changed since the last resolution, whose folder is complete.
if [ -r "$cache/resolved" ]; then
  read -r r_stamp r_arch r_dir < "$cache/resolved" || true
  if [ "$r_stamp $r_arch" = "$stamp" ] && [ -n "${r_dir:-}" ] && [ -e "$cache/$r_dir/.complete" ]; then
    echo "$cache/$r_dir"
    exit 0
  fi
fi

for tool in apt-cache apt-get dpkg-deb; do command -v "$tool" >/dev/null && continue
  fail "apt-cache, apt-get and dpkg-deb are needed to fetch the guest's Debian kernel (this is not a
  Debian machine?); or set MALL_VM_KERNEL_ROOT to a folder with boot/vmlinuz-KVER and lib/modules/KVER"
done
depmod=$(command -v depmod || echo /usr/sbin/depmod)
[ -x "$depmod" ] || fail "depmod not found (apt-get install kmod)"
[ "${stamp#* }" = amd64 ] || fail "the guest boots an amd64 kernel under qemu-system-x86_64; this machine's
  Debian architecture is '${stamp#* }'; set MALL_VM_KERNEL_ROOT to an amd64 kernel's folder"

# resolve: sets package and version from the apt lists (empty when they do not know $META).
resolve() {
  package=$(apt-cache depends --important "$META" 2>/dev/null |
              awk '$1 ~ /Depends:/ && $2 ~ /^linux-image-[0-9]/ { print $2; exit }')
  version=""
  if [ -n "$package" ]; then
    version=$(apt-cache policy "$package" 2>/dev/null | awk '$1 == "Candidate:" { print $2; exit }')
    if [ "$version" = "(none)" ]; then version=""; fi
  fi
}
newest_cached() { # the newest complete folder in the cache, or nothing
  local d
  for d in "$cache"/linux-image-*; do [ -e "$d/.complete" ] && echo "${d##*/}"; done | sort -V | tail -n 1
}
resolve
if [ -z "$package" ] || [ -z "$version" ]; then
  cached=$(newest_cached)
  if [ -n "$cached" ]; then
    say "note: the apt lists do not name $META's kernel; using the cached $cached"
    echo "$cache/$cached"
    exit 0
  fi
  fail "cannot resolve Debian's kernel package: \`apt-cache depends $META\` names no linux-image-KVER
  with a candidate version. Run \`apt-get update\` as root (Debian 12's apt sources, main) and try
  again, or set MALL_VM_KERNEL_ROOT to a folder with boot/vmlinuz-KVER and lib/modules/KVER."
fi

mkdir -p -- "$cache" || fail "cannot create the cache folder $cache"
exec {lock}>"$cache/.lock"
flock "$lock"   # one download at a time; a second caller then finds the folder complete
dir=${package}_${version//:/%}
if ! [ -e "$cache/$dir/.complete" ]; then
  tmp=$(mktemp -d "$cache/.fetch.XXXXXX")   # beside the result: the final mv is a rename
  trap 'rm -rf -- "$tmp"' EXIT
  say "downloading $package=$version (about 70 MB) for the qemu guest into $cache/$dir"
  # As root, apt would drop to _apt, which cannot enter a cache under /root: it downloads as root
  # (the .deb is checked against the signed lists all the same).
  sandbox=(); if [ "$(id -u)" -eq 0 ]; then sandbox=(-o APT::Sandbox::User=root); fi
  fetch() { (cd "$tmp" && apt-get download -q=2 "${sandbox[@]}" "$package=$version") >&2; }
  if ! fetch; then
    if [ "$(id -u)" -eq 0 ]; then
      say "the download failed; running apt-get update and trying again"
      apt-get update -qq >&2 || true
      resolve
      dir=${package}_${version//:/%}
      if [ -z "$package" ] || [ -z "$version" ] || ! fetch; then
        fail "\`apt-get download $package=$version\` failed (above) after apt-get update: is Debian's
  mirror reachable? Or set MALL_VM_KERNEL_ROOT to a folder with boot/vmlinuz-KVER and lib/modules/KVER."
      fi
    else
      fail "\`apt-get download $package=$version\` failed (above): run \`apt-get update\` as root (the
  package may have been replaced by a security update) and try again, check that Debian's mirror is
  reachable, or set MALL_VM_KERNEL_ROOT to a folder with boot/vmlinuz-KVER and lib/modules/KVER."
    fi
  fi
  deb=$(echo "$tmp"/*.deb)
  [ -f "$deb" ] || fail "apt-get download left no .deb in $tmp"
  mkdir "$tmp/root"
  dpkg-deb -x "$deb" "$tmp/root" || fail "dpkg-deb -x $deb failed"
  rm -f -- "$deb"
  # Debian 13's packages put the modules under usr/lib; the guest and modprobe -d want lib/modules.
  if ! [ -d "$tmp/root/lib/modules" ] && [ -d "$tmp/root/usr/lib/modules" ]; then
    ln -s usr/lib "$tmp/root/lib"
  fi
  kver=$(kernel_version "$tmp/root")
  [ -n "$kver" ] || fail "$package=$version holds no boot/vmlinuz-KVER with lib/modules/KVER"
  "$depmod" -b "$tmp/root" "$kver" || fail "depmod -b $tmp/root $kver failed"
  touch "$tmp/root/.complete"
  rm -rf -- "${cache:?}/$dir"
  mv -- "$tmp/root" "$cache/$dir"
  # Older kernels (about 400 MB each): a run still booting one keeps the files it opened.
  for old in "$cache"/linux-image-*; do
    [ "$old" = "$cache/$dir" ] || rm -rf -- "$old"
  done
  say "made $cache/$dir ($kver, $(du -sm "$cache/$dir" | cut -f1) MB)"
fi
printf '%s %s\n' "$stamp" "$dir" > "$cache/resolved.new.$$" && mv -f -- "$cache/resolved.new.$$" "$cache/resolved"
echo "$cache/$dir"
