#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# build-site-deb.sh — builds mall's Debian package for the site guest INSIDE the Debian 13 root
# (make-site-root.sh), so that the SPANK plugin is compiled against trixie's libslurm-dev 24.11 and
# everything against trixie's libraries: a chroot with the source tree bind-mounted read-only and
# the build tree kept in a cache folder (a rerun rebuilds only what changed), then `cpack -G DEB`.
# Contract: prints the .deb's path on stdout (progress on stderr); exit 0 built, 1 failed, 77 cannot
# run here (not root, no mmdebstrap). Cleans up its chroot (mounts, temp root) on every exit. --help.
set -euo pipefail

prog=${0##*/}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
src_default=$(cd "$here/../../.." && pwd)

usage() {
  cat <<EOF
NAME
    $prog - build mall_<version>_amd64.deb for Debian 13 inside the site root

SYNOPSIS
    $prog [--source DIR] [--out DIR] [--jobs N]

DESCRIPTION
    Unpacks the cached Debian 13 root (make-site-root.sh; made first when missing) into a temp
    folder, bind-mounts the source tree read-only at /src and a cached build tree at /build, and
    in a chroot configures it as the package is built for Debian (docs/admin-slurm.md "Install from a Debian
    package"):
        cmake -G Ninja -S /src -B /build -DCMAKE_BUILD_TYPE=RelWithDebInfo
              -DCMAKE_INSTALL_PREFIX=/usr -DMALL_WITH_SLURM=ON -DMALL_SYSTEMD_DELEGATE=ON
              -DMALL_WITH_TENSORFLOW=OFF -DMALL_WITH_MPI=OFF -DMALL_WITH_LIBTORCH=OFF
              -DMALL_BUILD_TESTS=OFF -DMALL_BUILD_EXAMPLES=OFF -DMALL_BUILD_BENCHMARKS=OFF
    (-DMALL_SYSTEMD_DELEGATE=ON: trixie's systemd 257 has DelegateSubgroup=, so the unit
    delegates malld's cgroup), builds it with ninja and runs \`cpack -G DEB\`. The .deb is copied
    to --out and its path printed. Its Depends name trixie's libraries (libslurm of Slurm 24.11,
    libhwloc15, Boost 1.83), all of which the site root has installed.

    The build tree stays in ${XDG_CACHE_HOME:-~/.cache}/mall/site-deb-build-KEY (KEY: the root's
    suite and package list),
    so a second run rebuilds only what changed in the sources. First build: about 3-4 minutes on
    2 cpus; unchanged sources: about 20 s (unpacking the root, ninja's check, cpack).

OPTIONS
    --source DIR  mall's source tree (default: $src_default)
    --out DIR     where the .deb goes (default: the cache folder ${XDG_CACHE_HOME:-~/.cache}/mall)
    --jobs N      ninja's parallel jobs (default: the cpu count, or MALL_JOBS)
    -h, --help    this text

EXIT STATUS
    0 the .deb's path on stdout; 1 the build failed (the log's tail on stderr); 77 cannot run here
    (not root, no mmdebstrap: "SKIP:" and the reason on stderr).
EOF
}

source_dir=$src_default out="" jobs=${MALL_JOBS:-$(nproc)}
while [ $# -gt 0 ]; do
  case $1 in
    --source) [ -d "${2-}" ] || { echo "$prog: --source needs mall's source folder" >&2; exit 1; }
      source_dir=$(cd "$2" && pwd); shift 2 ;;
    --out) [ -n "${2-}" ] || { echo "$prog: --out needs a folder" >&2; exit 1; }
      out=$2; shift 2 ;;
    --jobs) [[ ${2-} =~ ^[1-9][0-9]*$ ]] || { echo "$prog: --jobs needs a positive number" >&2; exit 1; }
      jobs=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "$prog: unknown argument '$1' (see --help)" >&2; exit 1 ;;
  esac
done
[ -f "$source_dir/CMakeLists.txt" ] && [ -d "$source_dir/libmall" ] ||
  { echo "$prog: $source_dir is not mall's source tree (no CMakeLists.txt and libmall/)" >&2; exit 1; }
if [ "$(id -u)" -ne 0 ]; then
  echo "$prog: SKIP: building in a chroot needs root (mount, chroot); run as root" >&2; exit 77
fi

tarball=$("$here/make-site-root.sh")   # exit 77/1 pass through (set -e)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/mall
key=$("$here/make-site-root.sh" --print-packages-key)   # the compilers and libraries, not the guest's configuration
build=$cache/site-deb-build-$key
[ -n "$out" ] || out=$cache
mkdir -p "$build" "$out"
out=$(cd "$out" && pwd)

tmp=$(mktemp -d "${TMPDIR:-/tmp}/mall-site-deb.XXXXXX")
root=$tmp/root
cleanup() {
  local status=$? m
  set +e
  trap '' INT TERM
  for m in $(awk -v r="$root/" 'index($5, r) == 1 {print $5}' /proc/self/mountinfo | sort -r); do
    umount "$m" 2>/dev/null || umount -l "$m" || echo "$prog: cleanup: cannot unmount $m" >&2
  done
  if awk -v r="$root/" 'index($5, r) == 1 {found=1} END {exit !found}' /proc/self/mountinfo; then
    echo "$prog: cleanup: still mounted under $root; $tmp left in place" >&2
    [ "$status" = 0 ] && status=1
  else
    rm -rf --one-file-system -- "$tmp"
  fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
# Two builds of the same tree at once would trample each other: one at a time.
exec {lock}>"$build.lock"
flock "$lock"

t0=$SECONDS
mkdir "$root"
tar -xpf "$tarball" -C "$root"
mkdir -p "$root/src" "$root/build"
mount -t proc proc "$root/proc"
mount --bind /dev "$root/dev"
mount --bind "$source_dir" "$root/src"
mount -o remount,bind,ro "$root/src"
mount --bind "$build" "$root/build"
in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LC_ALL=C.UTF-8 "$@"; }
echo "$prog: root unpacked in $((SECONDS - t0)) s; building $source_dir in $build" >&2

t1=$SECONDS
if ! in_root cmake -G Ninja -S /src -B /build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_INSTALL_PREFIX=/usr \
     -DMALL_WITH_SLURM=ON -DMALL_SYSTEMD_DELEGATE=ON -DMALL_WITH_TENSORFLOW=OFF -DMALL_WITH_MPI=OFF \
     -DMALL_WITH_LIBTORCH=OFF -DMALL_BUILD_TESTS=OFF -DMALL_BUILD_EXAMPLES=OFF -DMALL_BUILD_BENCHMARKS=OFF \
     >"$tmp/configure.log" 2>&1; then
  cat "$tmp/configure.log" >&2
  echo "$prog: configuring mall in the site root failed (above)" >&2; exit 1
fi
grep -E '^-- mall: Slurm' "$tmp/configure.log" >&2 || true
if ! in_root ninja -C /build -j "$jobs" >"$tmp/build.log" 2>&1; then
  tail -n 60 "$tmp/build.log" >&2
  echo "$prog: building mall in the site root failed (above)" >&2; exit 1
fi
echo "$prog: configured and built in $((SECONDS - t1)) s ($(grep -c '^\[' "$tmp/build.log" || true) ninja steps)" >&2
rm -rf -- "$build/_cpack"
if ! in_root sh -c 'cd /build && cpack -G DEB -B /build/_cpack' >"$tmp/cpack.log" 2>&1; then
  cat "$tmp/cpack.log" >&2
  echo "$prog: cpack -G DEB in the site root failed (above)" >&2; exit 1
fi
version=$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$build/CMakeCache.txt")
deb=$build/_cpack/mall_${version}_amd64.deb
[ -f "$deb" ] || { cat "$tmp/cpack.log" >&2; echo "$prog: cpack made no $deb" >&2; exit 1; }
cp -f -- "$deb" "$out/"
echo "$prog: $(basename "$deb") (Depends: $(dpkg-deb -f "$deb" Depends)) in $((SECONDS - t0)) s" >&2
echo "$out/$(basename "$deb")"
