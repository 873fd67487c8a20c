#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# test_deb_install.sh — proves the Debian package (cmake/Packaging.cmake) the way an admin meets it:
# `cpack -G DEB` gives mall_<version>_<arch>.deb with its Depends and every promised file, lintian
# finds no error in it (and its copyright file is there), and
# `apt-get install ./mall_*.deb` in a clean Debian root of the host's suite (mmdebstrap minbase,
# from the host's own apt sources) pulls what it needs, after which malld, mallctl, the man page,
# the Python module, the unit file, the SPANK plugin in Debian's Slurm plugin folder and a C program
# built there with find_package(mall) all work; `apt-get purge` then removes it.
# Usage: test_deb_install.sh BUILD_DIR SOURCE_DIR. Needs root (exits 77 with the reason in
# $MALL_TEST_SKIP_LOG otherwise), mmdebstrap and dpkg-dev (install-deps.sh), and the network to
# the host's apt sources.
#
# Choices (measured on the 2-cpu CI machine kind, Debian 12):
# - The package is built from a tree of its own, configured as docs/admin-slurm.md "Install from a Debian
#   package" says (-DCMAKE_INSTALL_PREFIX=/usr, no tests, TensorFlow or MPI), kept in
#   BUILD_DIR/deb-package so later runs rebuild only what changed: the tree under test is configured
#   for /usr/local (run-tests.sh, `cmake --install build`), which gives a working package but not
#   Debian's layout (multiarch libdir, python3/dist-packages, slurm-wlm). From that tree it checks
#   only that `cpack` stays sane (no TensorFlow adapter, no libmall_mpi, ExecStart=/usr/bin/malld).
#   The first build costs 153 s with -j1 on a busy machine (MALL_JOBS, default: the cpu count).
# - The C consumer is built inside the root with the root's own cmake and gcc, as a user would
#   (find_package resolves the config the package put in /usr/lib/<multiarch>/cmake/mall), not
#   outside against $root/usr. That adds cmake, gcc, libc6-dev and make (and python3, for the
#   module's check) to the root: mmdebstrap takes 30-45 s instead of 15 s, once: the root is cached
#   as a tarball (~500 MB) in ${XDG_CACHE_HOME:-~/.cache}/mall/, keyed by the suite and the package
#   list, and unpacked in ~6 s. Measured: first run 3 min 16 s, later runs 20 s.
# - The root's apt lists are fetched fresh each run (apt-get update), so Depends resolve against
#   the suite as it is now, not as it was when the tarball was made.
# Cleanup (also on failure, Ctrl-C and the watchdog): /proc in the root unmounted (lazily if busy),
# the root and temporary files removed; the root tarball and BUILD_DIR/deb-package stay.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../support/watchdog.sh"   # watchdog_script, watchdog_fired
timeout_s=${MALL_DEB_TEST_TIMEOUT_S:-900}
watchdog_script "$timeout_s" "$@"
me=$(basename "$0")
build=$(cd "${1:?usage: $me BUILD_DIR SOURCE_DIR}" && pwd)
src=$(cd "${2:?usage: $me BUILD_DIR SOURCE_DIR}" && pwd)

if [ "$(id -u)" -ne 0 ]; then
  why="installing a package into a Debian root needs root (mmdebstrap, chroot, mount); run as root"
  echo "SKIP: $why"
  [ -n "${MALL_TEST_SKIP_LOG:-}" ] && echo "SKIPPED $me $me: $why" >>"$MALL_TEST_SKIP_LOG"
  exit 77
fi
fail() { echo "FAIL: $*" >&2; exit 1; }
for tool in mmdebstrap cpack dpkg-deb dpkg-shlibdeps ninja chroot lintian; do
  command -v "$tool" >/dev/null || fail "$tool not installed: run launch_scripts/install-deps.sh"
done

tmp=$(mktemp -d /tmp/mall-deb.XXXXXX)
root=$tmp/root
# The traps write to the script's own stdout and stderr (3, 4): a signal that arrives while a
# redirected function or block runs would otherwise send their lines into that block's log.
exec 3>&1 4>&2
cleanup() {
  local status=$? m
  set +e
  trap '' TERM INT   # a signal during the cleanup must not cut it short
  # Unmount what is mounted under the root (deepest first); remove nothing while anything still is.
  for m in $(awk -v r="$root/" 'index($5, r) == 1 {print $5}' /proc/self/mountinfo | sort -r); do
    umount "$m" 2>/dev/null || umount -l "$m" || echo "FAIL: cleanup: cannot unmount $m" >&4
  done
  if awk -v r="$root/" 'index($5, r) == 1 {found=1} END {exit !found}' /proc/self/mountinfo; then
    echo "FAIL: cleanup: still mounted under $root; $tmp left in place" >&4
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

# --- a. the package: its file name, control fields and contents ---------------------------------
pkgtree=$build/deb-package
step "packaging tree $pkgtree (-DCMAKE_INSTALL_PREFIX=/usr)"
cmake -G Ninja -S "$src" -B "$pkgtree" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_INSTALL_PREFIX=/usr \
  -DMALL_WITH_SLURM=ON -DMALL_WITH_TENSORFLOW=OFF -DMALL_WITH_MPI=OFF -DMALL_WITH_LIBTORCH=OFF \
  -DMALL_BUILD_TESTS=OFF -DMALL_BUILD_EXAMPLES=OFF -DMALL_BUILD_BENCHMARKS=OFF >"$tmp/configure.log" 2>&1 ||
  { cat "$tmp/configure.log" >&2; fail "configuring the packaging tree $pkgtree"; }
ninja -C "$pkgtree" -j "${MALL_JOBS:-$(nproc)}" >"$tmp/build.log" 2>&1 ||
  { tail -n 40 "$tmp/build.log" >&2; fail "building the packaging tree $pkgtree"; }
step "cpack -G DEB"
(cd "$tmp" && cpack -G DEB --config "$pkgtree/CPackConfig.cmake" -B "$tmp/out") >"$tmp/cpack.log" 2>&1 ||
  { cat "$tmp/cpack.log" >&2; fail "cpack -G DEB"; }
version=$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$pkgtree/CMakeCache.txt")
arch=$(dpkg --print-architecture)
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
deb=$tmp/out/mall_${version}_${arch}.deb
[ -f "$deb" ] || fail "cpack made $(cd "$tmp/out" && echo *.deb), not mall_${version}_${arch}.deb"
dpkg-deb -I "$deb"
# Debian's own checker: no error (warnings are printed; docs/admin-slurm.md's package section names them).
step "lintian"
lintian_out=$(lintian --tag-display-limit 0 "$deb" 2>&1) || true
echo "$lintian_out" | grep -E '^[EWIN]: ' || echo "(lintian: nothing to report)"
if grep -q '^E: ' <<<"$lintian_out"; then
  fail "lintian reports errors on the package: $(grep '^E: ' <<<"$lintian_out" | tr '\n' ';')"
fi
[ -n "$(dpkg-deb -c "$deb" | grep -E '\./usr/share/doc/mall/copyright$')" ] || fail "the package has no /usr/share/doc/mall/copyright"
[ "$(dpkg-deb -f "$deb" Package)" = mall ] || fail "Package is not mall"
[ "$(dpkg-deb -f "$deb" Version)" = "$version" ] || fail "Version $(dpkg-deb -f "$deb" Version) is not $version"
depends=$(dpkg-deb -f "$deb" Depends)
for want in 'libc6' 'libstdc\+\+6' 'libhwloc[0-9]+' 'libboost-program-options[0-9.]+' 'libslurm[0-9]+'; do
  grep -Eq "(^|, )$want( |,|$)" <<<"$depends" || fail "Depends lacks $want: $depends"
done

dpkg-deb -c "$deb" | awk '{print $6}' | sed 's|^\./|/|' >"$tmp/contents"
echo "$me: $(grep -vc '/$' "$tmp/contents") files in the package"
for f in /usr/bin/malld /usr/bin/mallctl /usr/bin/mallrun /usr/bin/mallsim /usr/bin/mall-oci-hook \
         "/usr/lib/$multiarch/libmall.so.$version" "/usr/lib/$multiarch/libmall.so" \
         /usr/include/mall/mall.h /usr/include/mall/mall.hpp /usr/include/mall/tf/pool_parking.hpp \
         "/usr/lib/$multiarch/cmake/mall/mallConfig.cmake" "/usr/lib/$multiarch/cmake/mall/mallConfigVersion.cmake" \
         "/usr/lib/$multiarch/cmake/mall/mallTargets.cmake" "/usr/lib/$multiarch/slurm-wlm/mall_spank.so" \
         /usr/share/mall/slurm/cli_filter.lua /usr/lib/systemd/system/malld.service \
         /usr/lib/python3/dist-packages/mall/__init__.py /usr/lib/python3/dist-packages/mall/_install_paths.py; do
  grep -qxF "$f" "$tmp/contents" || fail "the package lacks $f"
done
grep -Eq '^/usr/share/man/man8/malld\.8(\.gz)?$' "$tmp/contents" || fail "the package lacks the man page /usr/share/man/man8/malld.8[.gz]"
# Nothing of the tests, benchmarks or examples; nothing outside /usr but malld's options file, which
# dpkg keeps as a conffile.
grep -qxF /etc/default/malld "$tmp/contents" || fail "the package lacks /etc/default/malld"
dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./conffiles | grep -qxF /etc/default/malld ||
  fail "/etc/default/malld is not a conffile of the package (DEBIAN/conffiles)"
bad=$(grep -Ei '/(test|bench|example)[^/]*$|tests?/|train' "$tmp/contents" || true)
[ -z "$bad" ] || fail "the package holds test, benchmark or example files: $bad"
bad=$(grep -v '^/usr/' "$tmp/contents" | grep -vxE '/|/etc/|/etc/default/|/etc/default/malld' || true)
[ -z "$bad" ] || fail "the package holds files outside /usr: $bad"

# The tree under test (configured for /usr/local, maybe with TensorFlow and MPI) still packages
# sanely: without the TensorFlow adapter and libmall_mpi, its unit naming /usr/bin/malld.
if [ -f "$build/CPackConfig.cmake" ]; then
  step "cpack of the tree under test ($build)"
  (cd "$tmp" && cpack -G DEB --config "$build/CPackConfig.cmake" -B "$tmp/out-tree") >"$tmp/cpack-tree.log" 2>&1 ||
    { cat "$tmp/cpack-tree.log" >&2; fail "cpack -G DEB in $build"; }
  tree_deb=$(echo "$tmp"/out-tree/mall_*.deb)
  bad=$(dpkg-deb -c "$tree_deb" | grep -E 'tensorflow|mall_mpi|libmall_mpi|/test' || true)
  [ -z "$bad" ] || fail "cpack in $build packages what the package must not hold: $bad"
  dpkg-deb --fsys-tarfile "$tree_deb" | tar -xO ./usr/lib/systemd/system/malld.service |
    grep '^ExecStart=/usr/bin/malld ' >/dev/null || fail "cpack in $build: malld.service's ExecStart is not /usr/bin/malld"
fi

# --- b. a clean Debian root of the host's suite ---------------------------------------------------
suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
[ -n "$suite" ] || fail "no VERSION_CODENAME in /etc/os-release: cannot tell which suite the root should be"
root_packages=man-db,cmake,gcc,libc6-dev,make,python3
cache=${XDG_CACHE_HOME:-$HOME/.cache}/mall
tarball=$cache/debian-$suite-$(echo "$root_packages" | md5sum | cut -c1-8)-root.tar
if [ ! -f "$tarball" ]; then
  step "mmdebstrap --variant=minbase $suite (+ $root_packages) into $tarball"
  mkdir -p "$cache"
  # No mirror argument: mmdebstrap takes the host's apt sources (nothing here names a mirror).
  mmdebstrap --quiet --variant=minbase --include="$root_packages" "$suite" "$tmp/root.tar" \
    >"$tmp/mmdebstrap.log" 2>&1 || { tail -n 30 "$tmp/mmdebstrap.log" >&2; fail "mmdebstrap $suite"; }
  mv "$tmp/root.tar" "$tarball"
fi
step "unpacking $tarball"
mkdir "$root"
tar -xpf "$tarball" -C "$root" || fail "unpacking $tarball"
mount -t proc proc "$root/proc" || fail "mounting /proc in the root"
cp /etc/resolv.conf "$root/etc/resolv.conf"
in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LC_ALL=C.UTF-8 \
              DEBIAN_FRONTEND=noninteractive "$@"; }

# --- c. install as a user would: apt resolves the declared Depends -------------------------------
step "apt-get install ./$(basename "$deb") in the root"
cp "$deb" "$root/tmp/"
in_root apt-get update -qq >"$tmp/apt.log" 2>&1 || { cat "$tmp/apt.log" >&2; fail "apt-get update in the root"; }
in_root apt-get install -y "/tmp/$(basename "$deb")" >>"$tmp/apt.log" 2>&1 ||
  { tail -n 30 "$tmp/apt.log" >&2; fail "apt-get install of the package in the root"; }
echo "$me: apt installed$(awk '/^The following NEW packages/ {on=1; next} on && /^  / {printf "%s", $0; next} {on=0}' "$tmp/apt.log" | tr -s ' ')"
in_root dpkg --verify mall || fail "dpkg --verify mall: installed files differ from the package"

# --- d. what an admin and a user do with it ------------------------------------------------------
step "checks in the root"
got=$(in_root malld --version) || fail "malld --version failed in the root"
[ "$got" = "malld (mall) $version" ] || fail "malld --version said '$got', not 'malld (mall) $version'"
got=$(in_root mallctl --version) || fail "mallctl --version failed in the root"
[ "$got" = "mallctl (mall) $version" ] || fail "mallctl --version said '$got'"
for f in /usr/bin/malld /usr/bin/mallctl /usr/bin/mallrun /usr/bin/mallsim /usr/bin/mall-oci-hook \
         "/usr/lib/$multiarch/libmall.so.0" "/usr/lib/$multiarch/slurm-wlm/mall_spank.so"; do
  missing=$(in_root ldd "$f" | grep 'not found' || true)
  [ -z "$missing" ] || fail "ldd $f in the root: $missing"
done
got=$(in_root man -w malld) || fail "man -w malld found no page in the root"
[[ $got =~ ^/usr/share/man/man8/malld\.8(\.gz)?$ ]] || fail "man -w malld gave '$got'"
# The plugin where Debian's slurm-wlm keeps its plugins (its PluginDir, when the host has them).
if dpkg -L slurm-wlm-basic-plugins >/dev/null 2>&1; then
  dpkg -L slurm-wlm-basic-plugins | grep "^/usr/lib/$multiarch/slurm-wlm/[^/]*\.so$" >/dev/null ||
    fail "Debian's slurm-wlm-basic-plugins keeps no plugin in /usr/lib/$multiarch/slurm-wlm"
fi
unit=$root/usr/lib/systemd/system/malld.service
grep -q '^ExecStart=/usr/bin/malld .* \$MALLD_OPTIONS$' "$unit" ||
  fail "malld.service's ExecStart is not /usr/bin/malld ... \$MALLD_OPTIONS: $(grep ExecStart= "$unit")"
grep -qx 'EnvironmentFile=-/etc/default/malld' "$unit" || fail "malld.service does not read /etc/default/malld: $(grep EnvironmentFile "$unit")"
# systemd's own check of the unit (on the host, against this build's malld: the root has no systemd).
if command -v systemd-analyze >/dev/null; then
  sed "s|^ExecStart=/usr/bin/malld |ExecStart=$root/usr/bin/malld |" "$unit" >"$tmp/malld.service"
  out=$(systemd-analyze verify "$tmp/malld.service" 2>&1) || fail "systemd-analyze verify malld.service: $out"
fi
# The options file: the empty default and every example pass `malld --check` as systemd splits them
# (\$MALLD_OPTIONS: at spaces), on a modelled 64-core node (the examples name cores 2-63) with
# node_exporter's textfile folder made as its package would, and a slurm.conf as a Slurm node has.
defaults=$root/etc/default/malld
[ -s "$defaults" ] || fail "/etc/default/malld is missing or empty in the root"
mkdir -p "$root/var/lib/prometheus/node-exporter"
# --slurm reads the cluster's slurm.conf (libslurm's default path): a node's minimal one.
mkdir -p "$root/etc/slurm"
printf 'ClusterName=check\nSlurmctldHost=localhost\n' >"$root/etc/slurm/slurm.conf"
n=0
while IFS= read -r line; do
  opts=$(sed -E 's/^#?MALLD_OPTIONS="(.*)"$/\1/' <<<"$line")
  # shellcheck disable=SC2086  # split at spaces, as systemd does
  out=$(in_root malld $opts --check --topology 'pack:1 core:64 pu:1' 2>&1) ||
    fail "/etc/default/malld: malld --check refuses '$opts': $out"
  n=$((n + 1))
done < <(grep -E '^#?MALLD_OPTIONS="[^"]*"$' "$defaults")
[ "$n" -ge 2 ] || fail "/etc/default/malld has no MALLD_OPTIONS examples"
# Uncommenting an example must take effect: the empty default comes before them (the last wins).
[ "$(grep -E '^#?MALLD_OPTIONS=' "$defaults" | head -n 1)" = 'MALLD_OPTIONS=""' ] ||
  fail "/etc/default/malld: the empty default is not the first MALLD_OPTIONS line"
[ -s "$root/usr/share/mall/slurm/cli_filter.lua" ] || fail "cli_filter.lua is not in /usr/share/mall/slurm"
want_api=$(awk -F. '{print $1 * 10000 + $2 * 100 + $3}' <<<"$version")
got=$(in_root python3 -c 'import mall; print(mall.api_version())') || fail "python3 -c 'import mall' failed in the root"
[ "$got" = "$want_api" ] || fail "the Python module's mall.api_version() gave $got, not $want_api"
cp -r "$src/tests/package/consumer" "$root/tmp/consumer"
in_root cmake -S /tmp/consumer -B /tmp/consumer-build -DMALL_CONSUMER_C_ONLY=ON >"$tmp/consumer.log" 2>&1 &&
  in_root cmake --build /tmp/consumer-build >>"$tmp/consumer.log" 2>&1 ||
  { cat "$tmp/consumer.log" >&2; fail "building the C consumer with find_package(mall) in the root"; }
got=$(in_root /tmp/consumer-build/consumer) || fail "the C consumer failed in the root: $got"
[ "$got" = "consumer: ok, mall API $want_api" ] || fail "the C consumer said '$got'"
echo "$me: malld --version, mallctl --version, ldd, man -w malld, the unit and its options file ($n MALLD_OPTIONS lines), the plugin, import mall, consumer: ok"

step "an admin's options survive a reinstall"
echo 'MALLD_OPTIONS="--slurm --metrics-interval 30"' >>"$defaults"
in_root dpkg -i --force-confold "/tmp/$(basename "$deb")" >"$tmp/reinstall.log" 2>&1 ||
  { cat "$tmp/reinstall.log" >&2; fail "dpkg -i of the package over itself"; }
grep -qx 'MALLD_OPTIONS="--slurm --metrics-interval 30"' "$defaults" || fail "reinstalling the package lost the edit of /etc/default/malld"

step "apt-get purge mall"
in_root apt-get purge -y mall >"$tmp/purge.log" 2>&1 || { cat "$tmp/purge.log" >&2; fail "apt-get purge mall"; }
left=$(cd "$root" && ls -d usr/bin/malld "usr/lib/$multiarch/libmall.so.0" usr/lib/python3/dist-packages/mall etc/default/malld 2>/dev/null || true)
[ -z "$left" ] || fail "apt-get purge mall left $left"

step "PASS (package $(basename "$deb"), $(du -k "$deb" | cut -f1) KiB)"
