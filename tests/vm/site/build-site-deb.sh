#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# build-site-deb.sh — builds mall's Debian package for the site guest INSIDE the Debian 13 root
# (make-site-root.sh), so that the SPANK plugin is compiled against trixie's libslurm-dev 24.11 and
# everything against trixie's libraries, by running docs/admin-slurm.md's recipe "mall for Slurm
# 24.11 on Debian 13" itself (read by slurm_recipe.sh, never copied here; issue 38) in a chroot:
# the source tree under a throwaway overlay (the host's tree is never written), the recipe's
# build-deb folder kept in a cache folder (a rerun rebuilds only what changed).
# Contract: prints the .deb's path on stdout (progress on stderr); exit 0 built, 1 failed, 77 cannot
# run here (not root, no mmdebstrap). Cleans up its chroot (mounts, temp root) on every exit. --help.
set -euo pipefail

prog=${0##*/}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
src_default=$(cd "$here/../../.." && pwd)
# shellcheck source=slurm_recipe.sh
. "$here/slurm_recipe.sh"   # slurm_recipe_text, SLURM_RECIPE_DOC

usage() {
  cat <<EOF
NAME
    $prog - build mall_<version>_amd64.deb for Debian 13 inside the site root

SYNOPSIS
    $prog [--source DIR] [--out DIR] [--jobs N]
    $prog --print-recipe

DESCRIPTION
    Unpacks the cached Debian 13 root (make-site-root.sh; made first when missing) into a temp
    folder and runs, in a chroot, with bash -e as root in /mall (the source tree under an overlay
    whose writes are thrown away; its build-deb folder bind-mounted from the cache), the recipe
    of $SLURM_RECIPE_DOC
    between <!-- slurm-24.11-recipe:begin --> and <!-- slurm-24.11-recipe:end -->, line for line:
    its apt-get install of Slurm 24.11 and the build dependencies (installed already: the root
    is made with exactly those packages), cmake's configure line, \`cmake --build build-deb\`,
    \`cpack -G DEB\` and apt-get install of the .deb (into the throwaway root: the package
    installs from trixie's packages alone). The environment: PATH, HOME=/root, LC_ALL=C.UTF-8,
    DEBIAN_FRONTEND=noninteractive and CMAKE_BUILD_PARALLEL_LEVEL (--jobs). The recipe's .deb,
    build-deb/package/mall_<version>_amd64.deb, is copied to --out and its path printed. Its
    Depends name trixie's libraries (libslurm of Slurm 24.11, libhwloc15, Boost 1.83), all of
    which the site root has installed. Without overlayfs (an overlay upper folder on overlayfs,
    say) the tree is copied instead, without .git, .venv and build*.

    The build tree stays in ${XDG_CACHE_HOME:-~/.cache}/mall/site-deb-build-KEY (KEY: the root's
    suite, package list and the recipe's lines; the last run's output of the recipe, with bash -x's
    "+ command" lines, in its recipe.log),
    so a second run rebuilds only what changed in the sources. First build: about 3-4 minutes on
    2 cpus (6.5 measured with other builds running); unchanged sources: about 10-20 s
    (unpacking the root, the recipe's no-op apt-get and build, cpack, the .deb's install).

OPTIONS
    --source DIR  mall's source tree (default: $src_default)
    --out DIR     where the .deb goes (default: the cache folder ${XDG_CACHE_HOME:-~/.cache}/mall)
    --jobs N      ninja's parallel jobs (default: the cpu count, or MALL_JOBS)
    --print-recipe  print the script the chroot would run (the doc's recipe) and exit, building
                  nothing (tests/vm/site/test_recipe_tied.sh compares it with the doc)
    -h, --help    this text

EXIT STATUS
    0 the .deb's path on stdout; 1 the build failed, or the doc has no readable recipe (the log's
    tail on stderr); 77 cannot run here
    (not root, no mmdebstrap: "SKIP:" and the reason on stderr).
EOF
}

source_dir=$src_default out="" jobs=${MALL_JOBS:-$(nproc)} print_recipe=0
while [ $# -gt 0 ]; do
  case $1 in
    --source) [ -d "${2-}" ] || { echo "$prog: --source needs mall's source folder" >&2; exit 1; }
      source_dir=$(cd "$2" && pwd); shift 2 ;;
    --out) [ -n "${2-}" ] || { echo "$prog: --out needs a folder" >&2; exit 1; }
      out=$2; shift 2 ;;
    --jobs) [[ ${2-} =~ ^[1-9][0-9]*$ ]] || { echo "$prog: --jobs needs a positive number" >&2; exit 1; }
      jobs=$2; shift 2 ;;
    --print-recipe) print_recipe=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "$prog: unknown argument '$1' (see --help)" >&2; exit 1 ;;
  esac
done
# The recipe, line for line as the doc has it: what the chroot runs (and --print-recipe shows).
recipe=$(slurm_recipe_text) || { echo "$prog: no Slurm 24.11 recipe to run (above)" >&2; exit 1; }
if [ "$print_recipe" = 1 ]; then printf '%s\n' "$recipe"; exit 0; fi
[ -f "$source_dir/CMakeLists.txt" ] && [ -d "$source_dir/libmall" ] ||
  { echo "$prog: $source_dir is not mall's source tree (no CMakeLists.txt and libmall/)" >&2; exit 1; }
if [ "$(id -u)" -ne 0 ]; then
  echo "$prog: SKIP: building in a chroot needs root (mount, chroot); run as root" >&2; exit 77
fi

tarball=$("$here/make-site-root.sh")   # exit 77/1 pass through (set -e)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/mall
key=$("$here/make-site-root.sh" --print-packages-key)   # the compilers, libraries and recipe, not the guest's configuration
build=$cache/site-deb-build-$key
[ -n "$out" ] || out=$cache
if [ ! -d "$build" ]; then
  # A new key (new packages or recipe): the build trees of other keys are stale (~0.5 GB each);
  # one that a build holds (its lock) stays.
  for old in "$cache"/site-deb-build-*; do
    case $old in *.lock|"$build") continue ;; esac
    [ -d "$old" ] || continue
    ( flock -n 9 || exit 0; rm -rf --one-file-system -- "$old" "$old.lock" ) 9>"$old.lock"
  done
fi
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
mkdir -p "$root/mall" "$tmp/upper" "$tmp/overlay-work"
mount -t proc proc "$root/proc"
mount --bind /dev "$root/dev"
# The recipe runs in mall's source tree and writes build-deb there: the host's tree, read through
# an overlay, takes no write; build-deb is the cached build tree.
if mount -t overlay overlay -o "lowerdir=$source_dir,upperdir=$tmp/upper,workdir=$tmp/overlay-work" "$root/mall" 2>"$tmp/overlay.err"; then
  how="an overlay of $source_dir"
else
  tar -C "$source_dir" --exclude=./.git --exclude='./build*' --exclude=./.venv -cf - . | tar -C "$root/mall" -xf -
  how="a copy of $source_dir (no overlay: $(cat "$tmp/overlay.err"))"
fi
mkdir -p "$root/mall/build-deb"
mount --bind "$build" "$root/mall/build-deb"
printf '%s\n' "$recipe" >"$root/tmp/slurm-24.11-recipe.sh"
rm -rf -- "$build/package"   # the recipe's cpack output: only this run's .deb
echo "$prog: root unpacked in $((SECONDS - t0)) s; running $(basename "$SLURM_RECIPE_DOC")'s Slurm 24.11 recipe in $how, build-deb in $build" >&2

t1=$SECONDS
if ! chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LC_ALL=C.UTF-8 \
     DEBIAN_FRONTEND=noninteractive CMAKE_BUILD_PARALLEL_LEVEL="$jobs" \
     /bin/bash -c 'cd /mall && exec /bin/bash -e -x /tmp/slurm-24.11-recipe.sh' >"$build/recipe.log" 2>&1; then
  tail -n 60 "$build/recipe.log" >&2
  echo "$prog: the Slurm 24.11 recipe of $SLURM_RECIPE_DOC failed in the site root (its last lines above; bash -x marks each command with +)" >&2
  exit 1
fi
grep -E '^-- mall: .*Slurm' "$build/recipe.log" >&2 || true
echo "$prog: recipe run in $((SECONDS - t1)) s ($(grep -c '^\[[0-9]*/[0-9]*\]' "$build/recipe.log" || true) build steps)" >&2
version=$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$build/CMakeCache.txt")
deb=$build/package/mall_${version}_amd64.deb
[ -f "$deb" ] || { tail -n 30 "$build/recipe.log" >&2; echo "$prog: the recipe made no $deb" >&2; exit 1; }
cp -f -- "$deb" "$out/"
echo "$prog: $(basename "$deb") (Depends: $(dpkg-deb -f "$deb" Depends)) in $((SECONDS - t0)) s" >&2
echo "$out/$(basename "$deb")"
