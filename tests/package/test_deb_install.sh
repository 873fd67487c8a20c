#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# test_deb_install.sh — proves the Debian package (cmake/Packaging.cmake) the way an admin meets it:
# `cpack -G DEB` gives mall_<version>_<arch>.deb with its Depends and every promised file, lintian
# finds no error in it (and its copyright file is there), and
# `apt-get install ./mall_*.deb` in a clean Debian root of the host's suite (mmdebstrap minbase,
# from the host's own apt sources) pulls what it needs, after which malld, mallctl, the man page,
# the Python module, the unit file, the SPANK plugin in Debian's Slurm plugin folder and a C program
# built there with find_package(mall) all work; a Keras user of the node then runs the one
# documented command, `python -m pip install --no-cache-dir /usr/share/mall/python/mall-<version>.tar.gz`
# (the sdist the package ships, python/sdist.cmake) in a venv with TensorFlow 2.21, which must build
# the op library and use the node's libmall, and a model.fit with mall.keras.Malleable() under the
# package's malld (affinity backend: the root has no cgroup of its own) and mallrun follows
# `mallctl set --cpus 0` and `0-1` (its resize lines, every thread's Cpus_allowed_list);
# `apt-get purge` then removes the package.
# Usage: test_deb_install.sh BUILD_DIR SOURCE_DIR. Needs root (exits 77 with the reason in
# $MALL_TEST_SKIP_LOG otherwise), mmdebstrap and dpkg-dev (install-deps.sh), at least 2 cpus, and
# the network to the host's apt sources and to PyPI.
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
# - The Keras user (part e) adds g++, ninja-build and python3-venv to the root (~580 MB, unpacked in
#   ~12 s), a venv with TensorFlow from a wheelhouse in the same cache (~320 MB, `pip download` on
#   the first run), pip's build of the sdist (the op library alone: ~11 s) and a short fit (~3 s).
#   Measured here (2 cpus shared with other builds): +~50 s on a fresh cache (mmdebstrap 41 s;
#   part e 34 s with the download), +~43 s on later runs (63 s in all; TensorFlow from the
#   wheelhouse 26 s, the sdist 10 s, the fit 3 s).
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
  # Whatever still runs inside the root (part e's malld, mallrun and trainer on a failure): ours.
  for m in /proc/[0-9]*; do
    [ "$(readlink "$m/root" 2>/dev/null)" = "$root" ] && kill -KILL "${m#/proc/}" 2>/dev/null
  done
  wait 2>/dev/null
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
# The options are the docs' own: the -D words of the `cmake -G Ninja` line between admin-slurm.md's
# deb-package-recipe markers (continuation lines joined), so the doc cannot drift from what is tested.
doc_options=$(sed -n '/<!-- deb-package-recipe:begin -->/,/<!-- deb-package-recipe:end -->/p' "$src/docs/admin-slurm.md" |
  sed -e ':a' -e '/\\$/N; s/\\\n//; ta' | grep -m1 '^cmake -G Ninja ' | tr -s ' ' '\n' | grep '^-D' || true)
mapfile -t doc_options <<<"$doc_options"
case " ${doc_options[*]} " in *" -DCMAKE_INSTALL_PREFIX=/usr "*) ;;
  *) fail "docs/admin-slurm.md has no deb-package-recipe block with a 'cmake -G Ninja ... -DCMAKE_INSTALL_PREFIX=/usr' line (found: ${doc_options[*]:-nothing})";; esac
step "configure options from docs/admin-slurm.md: ${doc_options[*]}"
cmake -G Ninja -S "$src" -B "$pkgtree" "${doc_options[@]}" >"$tmp/configure.log" 2>&1 ||
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
         /usr/include/mall/tf/detail/pool_parking_detail.hpp /usr/include/mall/adapter/attach.hpp \
         /usr/include/mall/openmp/adapter.hpp /usr/include/mall/libtorch/adapter.hpp \
         "/usr/lib/$multiarch/cmake/mall/mallConfig.cmake" "/usr/lib/$multiarch/cmake/mall/mallConfigVersion.cmake" \
         "/usr/lib/$multiarch/cmake/mall/mallTargets.cmake" "/usr/lib/$multiarch/slurm-wlm/mall_spank.so" \
         /usr/share/mall/slurm/cli_filter.lua /usr/share/mall/slurm/job_submit.lua /usr/lib/systemd/system/malld.service \
         /usr/lib/python3/dist-packages/mall/__init__.py /usr/lib/python3/dist-packages/mall/_install_paths.py \
         /usr/lib/python3/dist-packages/mall/tensorflow.py /usr/lib/python3/dist-packages/mall/keras.py \
         "/usr/share/mall/python/mall-$version.tar.gz"; do
  grep -qxF "$f" "$tmp/contents" || fail "the package lacks $f"
done
# The op library is built per TensorFlow, by pip in the user's venv: never in the package.
bad=$(grep -E 'libmall_tf_ops|tensorflow-version|tensorflow_session|mallTensorflowTargets' "$tmp/contents" || true)
[ -z "$bad" ] || fail "the package holds what is built against one TensorFlow: $bad"
# The sdist (python/sdist.cmake): mall-<version>/ with PKG-INFO, pyproject.toml and what
# python/package.cmake builds from; none of the tests, docs or examples (pyproject.toml's sdist.exclude).
sdist_list=$(dpkg-deb --fsys-tarfile "$deb" | tar -xO "./usr/share/mall/python/mall-$version.tar.gz" | tar -tz) ||
  fail "cannot list /usr/share/mall/python/mall-$version.tar.gz of the package"
for f in PKG-INFO pyproject.toml CMakeLists.txt LICENSE python/package.cmake python/mall/__init__.py \
         python/mall/_install_paths.py.in libmall/cmake/client_library.cmake tf_integration/cmake/tensorflow.cmake \
         tf_integration/python_ops/mall_pool_ops.cpp; do
  grep -qxF "mall-$version/$f" <<<"$sdist_list" || fail "the sdist lacks mall-$version/$f"
done
bad=$(grep -vE "^mall-$version/" <<<"$sdist_list" || true)
[ -z "$bad" ] || fail "the sdist holds files outside mall-$version/: $bad"
bad=$(grep -E "^mall-$version/(tests|docs|examples|python/tests|build[^/]*|\.venv|\.git)/" <<<"$sdist_list" || true)
[ -z "$bad" ] || fail "the sdist holds what pyproject.toml's sdist.exclude leaves out: $bad"
pkg_info=$(dpkg-deb --fsys-tarfile "$deb" | tar -xO "./usr/share/mall/python/mall-$version.tar.gz" | tar -xzO "mall-$version/PKG-INFO")
for want in 'Metadata-Version: 2.1' 'Name: mall' "Version: $version"; do
  grep -qxF "$want" <<<"$pkg_info" || fail "the sdist's PKG-INFO lacks '$want': $pkg_info"
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
  bad=$(dpkg-deb -c "$tree_deb" | grep -E 'libmall_tf_ops|tensorflow-version|tensorflow_session|mallTensorflowTargets|mall_mpi|libmall_mpi|/test' || true)
  [ -z "$bad" ] || fail "cpack in $build packages what the package must not hold: $bad"
  dpkg-deb --fsys-tarfile "$tree_deb" | tar -xO ./usr/lib/systemd/system/malld.service |
    grep '^ExecStart=/usr/bin/malld ' >/dev/null || fail "cpack in $build: malld.service's ExecStart is not /usr/bin/malld"
fi

# --- b. a clean Debian root of the host's suite ---------------------------------------------------
suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
[ -n "$suite" ] || fail "no VERSION_CODENAME in /etc/os-release: cannot tell which suite the root should be"
# What a user's node has besides the package: a C toolchain and CMake (the consumer), python3-venv,
# g++ and Ninja (a Keras user's venv and `pip install` of the package's sdist, part e).
root_packages=man-db,cmake,gcc,g++,libc6-dev,make,ninja-build,python3,python3-venv
cache=${XDG_CACHE_HOME:-$HOME/.cache}/mall
tarball=$cache/debian-$suite-$(echo "$root_packages" | md5sum | cut -c1-8)-root.tar
if [ ! -f "$tarball" ]; then
  step "mmdebstrap --variant=minbase $suite (+ $root_packages) into $tarball"
  mkdir -p "$cache"
  # Roots of this test made for another package list (~500 MB each) go.
  for old in "$cache/debian-$suite-"????????"-root.tar"; do
    [[ $old =~ /debian-$suite-[0-9a-f]{8}-root\.tar$ ]] && [ "$old" != "$tarball" ] && rm -f -- "$old"
  done
  # No mirror argument: mmdebstrap takes the host's apt sources (nothing here names a mirror).
  mmdebstrap --quiet --variant=minbase --include="$root_packages" "$suite" "$tmp/root.tar" \
    >"$tmp/mmdebstrap.log" 2>&1 || { tail -n 30 "$tmp/mmdebstrap.log" >&2; fail "mmdebstrap $suite"; }
  mv "$tmp/root.tar" "$tarball"
fi
step "unpacking $tarball"
mkdir "$root"
tar -xpf "$tarball" -C "$root" || fail "unpacking $tarball"
mount -t proc proc "$root/proc" || fail "mounting /proc in the root"
# /sys for malld's topology (hwloc) and TensorFlow's cpu count in part e; read-only.
mount -t sysfs -o ro sysfs "$root/sys" || fail "mounting /sys in the root"
cp /etc/resolv.conf "$root/etc/resolv.conf"
# A command in the root with a clean environment (an array too: `"${root_env[@]}" CMD &` gives $! = CMD's
# pid, chroot and env exec it; a function run with & would be a subshell).
root_env=(chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LC_ALL=C.UTF-8
          DEBIAN_FRONTEND=noninteractive)
in_root() { "${root_env[@]}" "$@"; }

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
# --slurm reads the cluster's slurm.conf (libslurm's default path): a node's minimal one, with the
# job_submit/lua that --slurm-comment-merge slurmctld needs (malld refuses it otherwise).
mkdir -p "$root/etc/slurm"
printf 'ClusterName=check\nSlurmctldHost=localhost\nJobSubmitPlugins=lua\n' >"$root/etc/slurm/slurm.conf"
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
for script in cli_filter.lua job_submit.lua; do
  [ -s "$root/usr/share/mall/slurm/$script" ] || fail "$script is not in /usr/share/mall/slurm"
done
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

# --- e. a Keras user on the node: the one documented command, then a fit that follows mallctl set -
# docs/admin-slurm.md, docs/frameworks.md: in a venv with their TensorFlow, a user runs
#   python -m pip install --no-cache-dir /usr/share/mall/python/mall-<version>.tar.gz
# which builds the op library against that TensorFlow and uses the node's libmall (no
# nlohmann-json; g++, CMake and Ninja from the node). TensorFlow and its dependencies come from a
# wheelhouse in $cache (bind-mounted at /wheelhouse): `pip download` fills it on the first run, later
# runs install from it with --no-index. Not pip's own cache: PyPI's answers here are not stored in it
# (after a download ~/.cache/pip stayed empty), so each run would download the ~260 MB again.
sdist=/usr/share/mall/python/mall-$version.tar.gz
venv=/root/keras-venv
requirements=$src/launch_scripts/requirements-tensorflow.txt
wheelhouse=$cache/wheels-$suite-$(md5sum <"$requirements" | cut -c1-8)
mkdir -p "$wheelhouse" "$root/wheelhouse"
for old in "$cache/wheels-$suite-"????????; do  # wheelhouses of another TensorFlow pin
  [[ $old =~ /wheels-$suite-[0-9a-f]{8}$ ]] && [ "$old" != "$wheelhouse" ] && rm -rf -- "$old"
done
mount --bind "$wheelhouse" "$root/wheelhouse" || fail "bind-mounting the wheelhouse $wheelhouse into the root"
# The host's way to PyPI (a proxy, an index, a CA bundle), as pip in the root needs it.
pip_env=(PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_DEFAULT_TIMEOUT="${PIP_DEFAULT_TIMEOUT:-180}" TF_CPP_MIN_LOG_LEVEL=2)
for var in PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_TRUSTED_HOST http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY; do
  [ -n "${!var:-}" ] && pip_env+=("$var=${!var}")
done
if [ -n "${PIP_CERT:-}" ] && [ -f "$PIP_CERT" ]; then
  cp "$PIP_CERT" "$root/tmp/pip-cert.pem" && pip_env+=(PIP_CERT=/tmp/pip-cert.pem)
fi
in_user_env() { in_root "${pip_env[@]}" "$@"; }

step "the system package's mall.tensorflow names the pip command"
words=$(in_root python3 -c 'import mall, mall.tensorflow as t
try:
    t.op_library_path()
except mall.MallError as e:
    print(e)') || fail "python3 -c 'import mall.tensorflow' failed in the root"
want="/usr/bin/python3 -m pip install --force-reinstall --no-deps --no-cache-dir $sdist"
[[ $words == *"$want"* ]] || fail "mall.tensorflow of the package said: $words (expected it to name: $want)"

step "python3 -m venv $venv; pip install -r requirements-tensorflow.txt (wheelhouse $wheelhouse)"
started=$SECONDS
cp "$requirements" "$root/tmp/requirements-tensorflow.txt"
in_root python3 -m venv "$venv" >"$tmp/venv.log" 2>&1 || { cat "$tmp/venv.log" >&2; fail "python3 -m venv in the root"; }
if [ ! -f "$wheelhouse/complete" ]; then
  in_user_env "$venv/bin/python" -m pip download --quiet -d /wheelhouse -r /tmp/requirements-tensorflow.txt \
    >"$tmp/pip-download.log" 2>&1 || { tail -n 30 "$tmp/pip-download.log" >&2; fail "pip download of TensorFlow into $wheelhouse"; }
  touch "$wheelhouse/complete"
  echo "$me: downloaded $(du -sh "$wheelhouse" | cut -f1) of wheels in $((SECONDS - started)) s"
fi
in_user_env "$venv/bin/python" -m pip install --quiet --no-index --find-links /wheelhouse -r /tmp/requirements-tensorflow.txt \
  >"$tmp/pip-tf.log" 2>&1 || { tail -n 30 "$tmp/pip-tf.log" >&2; fail "pip install of TensorFlow in the root's venv"; }
echo "$me: TensorFlow in the venv in $((SECONDS - started)) s"
step "the documented command: $venv/bin/python -m pip install --no-cache-dir $sdist"
started=$SECONDS
in_user_env "$venv/bin/python" -m pip install --no-cache-dir --verbose "$sdist" >"$tmp/pip-mall.log" 2>&1 ||
  { tail -n 60 "$tmp/pip-mall.log" >&2; fail "pip install $sdist in the root's venv"; }
echo "$me: pip install of the sdist in $((SECONDS - started)) s"
facts=$(in_user_env "$venv/bin/python" -c '
import mall, mall._install_paths as p, mall._library as l
print(mall.__file__); print(p.LIBRARY_DIR_ABSOLUTE); print(p.SOURCE); print(p.OP_LIBRARY); print(l.load().path)') ||
  fail "the pip-installed mall does not import in the venv"
echo "$facts" | sed "s/^/$me: installed: /"
{ read -r package_file; read -r libdir; read -r source; read -r op_state; read -r libmall; } <<<"$facts"
case $package_file in "$venv"/lib/python3*/site-packages/mall/__init__.py) ;; *) fail "import mall in the venv found $package_file";; esac
[ "$libdir" = "/usr/lib/$multiarch" ] || fail "the wheel did not use the node's libmall: LIBRARY_DIR_ABSOLUTE='$libdir'"
[ "$libmall" = "/usr/lib/$multiarch/libmall.so.0" ] || fail "mall._library.load() loaded $libmall, not the node's /usr/lib/$multiarch/libmall.so.0"
[ ! -e "$root$(dirname "$package_file")/libmall.so.0" ] || fail "the wheel carries a libmall.so.0 of its own beside the node's"
[ "$source" = "$sdist" ] || fail "_install_paths.SOURCE is '$source', not $sdist"
tf_version=$(sed -n 's/^tensorflow[-a-z]*==//p' "$requirements")
[[ $op_state == "built for tensorflow"[-_]"cpu $tf_version" ]] || fail "op library: '$op_state', expected built for tensorflow-cpu $tf_version"
[ -f "$root$(dirname "$package_file")/libmall_tf_ops.so" ] || fail "no libmall_tf_ops.so beside $package_file"

step "a Keras fit under the package's malld (affinity backend) and mallrun follows mallctl set"
[ "$(nproc)" -ge 2 ] || fail "the Keras check needs cpus 0 and 1 (this machine has $(nproc))"
# The trainer: a seeded tiny MLP on random data, mall.keras.Malleable() in model.fit; after each batch
# a 'resize step N threads T cpus LIST' line for each allocation applied (T: TensorFlow's running
# intra-op workers, mall.tensorflow.threads()); stops at the end of the batch after /tmp/stop exists.
cat >"$root/tmp/keras_follow.py" <<'PY'
import os
import sys
import numpy as np
import keras
import tensorflow as tf
import mall.keras
import mall.tensorflow

sys.stdout.reconfigure(line_buffering=True)
mall.tensorflow.size_pools()  # before TensorFlow's first op: pools as large as the job may grow
malleable = mall.keras.Malleable()
print(f"start pid {os.getpid()}")
keras.utils.set_random_seed(1)
x = np.random.default_rng(1).random((512, 32), dtype=np.float32)
y = (x.sum(axis=1) * 3).astype(np.int32) % 10
model = keras.Sequential([keras.Input(shape=(32,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])
model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(64, drop_remainder=True).repeat()


class Log(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.step, self.seen = 0, 0

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1
        if self.step == 1:
            print("training")
        if malleable.changes != self.seen:
            self.seen = malleable.changes
            print(f"resize step {self.step} threads {mall.tensorflow.threads().intra} "
                  f"cpus {malleable.client.allocation.text}")
        if os.path.exists("/tmp/stop"):
            self.model.stop_training = True


log = Log()
model.fit(data, epochs=1, steps_per_epoch=10**7, verbose=0, callbacks=[malleable, log])
print(f"done steps {log.step}")
PY
rm -f "$root/tmp/stop"
"${root_env[@]}" malld --backend affinity --cpus 0-1 --ack-timeout-ms 20000 --socket /run/mall/malld.sock \
  --state-dir /var/lib/mall >"$tmp/malld.log" 2>&1 &
malld_pid=$!
for _ in $(seq 100); do [ -S "$root/run/mall/malld.sock" ] && break; sleep 0.1; done
[ -S "$root/run/mall/malld.sock" ] || { cat "$tmp/malld.log" >&2; fail "malld in the root made no socket in 10 s"; }
"${root_env[@]}" "${pip_env[@]}" mallrun --socket /run/mall/malld.sock --malleable=1:2 --job keras -- \
  "$venv/bin/python" /tmp/keras_follow.py >"$tmp/trainer.log" 2>&1 &
trainer_pid=$!
# wait_line REGEX SECONDS [AFTER]: until a line of the trainer's log after its first AFTER lines
# matches REGEX.
trainer_has() { tail -n +"$((${2:-0} + 1))" "$tmp/trainer.log" | grep -Eq "$1"; }
wait_line() {
  local i
  for ((i = 0; i < $2 * 10; i++)); do
    trainer_has "$1" "${3:-0}" && return 0
    kill -0 "$trainer_pid" 2>/dev/null || break
    sleep 0.1
  done
  trainer_has "$1" "${3:-0}" && return 0
  cat "$tmp/trainer.log" >&2; echo "--- malld's log:" >&2; tail -n 30 "$tmp/malld.log" >&2
  fail "no line matching '$1' from the Keras trainer in $2 s"
}
# threads_on PID LIST: every thread of PID may run on exactly LIST (the affinity backend pins them).
threads_on() {
  local task
  for task in /proc/"$1"/task/*; do
    [ "$(awk '/^Cpus_allowed_list:/ {print $2}' "$task/status" 2>/dev/null || echo "$2")" = "$2" ] || return 1
  done
}
started=$SECONDS
wait_line '^training$' 180
trainer_python=$(sed -n 's/^start pid //p' "$tmp/trainer.log")
for set in "0 1 0" "0-1 2 0-1"; do
  read -r cpus threads expected <<<"$set"
  lines_before=$(wc -l <"$tmp/trainer.log")
  out=$(in_root mallctl --socket /run/mall/malld.sock set keras --cpus "$cpus" 2>&1) || fail "mallctl set keras --cpus $cpus: $out"
  wait_line "^resize step [0-9]+ threads $threads cpus $expected\$" 60 "$lines_before"
  for _ in $(seq 50); do threads_on "$trainer_python" "$expected" && break; sleep 0.1; done
  threads_on "$trainer_python" "$expected" ||
    fail "after mallctl set --cpus $cpus the trainer's threads are not all on $expected: $(grep -h Cpus_allowed_list: /proc/"$trainer_python"/task/*/status | sort | uniq -c | tr '\n' ';')"
  echo "$me: mallctl set keras --cpus $cpus: $(grep -E "threads $threads cpus $expected\$" "$tmp/trainer.log" | tail -n 1), every thread on $expected"
done
touch "$root/tmp/stop"
trainer_status=0
wait "$trainer_pid" || trainer_status=$?
trainer_pid=
[ "$trainer_status" -eq 0 ] || { cat "$tmp/trainer.log" >&2; fail "mallrun of the Keras trainer exited $trainer_status"; }
grep -q '^done steps ' "$tmp/trainer.log" || { cat "$tmp/trainer.log" >&2; fail "the Keras trainer did not finish its fit"; }
kill -TERM "$malld_pid"; wait "$malld_pid" || true
malld_pid=
echo "$me: Keras fit under malld in $((SECONDS - started)) s: $(grep '^done steps' "$tmp/trainer.log")"

step "apt-get purge mall"
in_root apt-get purge -y mall >"$tmp/purge.log" 2>&1 || { cat "$tmp/purge.log" >&2; fail "apt-get purge mall"; }
left=$(cd "$root" && ls -d usr/bin/malld "usr/lib/$multiarch/libmall.so.0" usr/lib/python3/dist-packages/mall etc/default/malld \
         usr/share/mall 2>/dev/null || true)
[ -z "$left" ] || fail "apt-get purge mall left $left"

step "PASS (package $(basename "$deb"), $(du -k "$deb" | cut -f1) KiB)"
