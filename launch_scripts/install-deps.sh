#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# install-deps.sh — installs mall's build and test dependencies for one profile (build, keras or
# full, the default, which run-tests.sh and CI use): Debian's packages, and for keras and full the
# one thing Debian does not package, TensorFlow's CPU wheel (launch_scripts/requirements-tensorflow.txt,
# pinned), in the project's own virtual environment <repo>/.venv (MALL_TF_VENV, MALL_SKIP_TENSORFLOW).
# Contract: it never harms its host: no kernel, initramfs or bootloader package in any profile (the
# cgroup-v2 guest's kernel is downloaded into a cache by tests/vm/guest-kernel.sh, never installed);
# apt may remove nothing (--no-remove); no service of a package it installs is started during the
# install (a temporary policy-rc.d) or left enabled on a systemd host; services the host already had
# stay as they were. Idempotent: when everything is present it returns in well under a second.
# Needs root (or sudo) only when a Debian package is missing; the venv belongs to whoever runs it.
# --help; --print-packages lists a profile's packages (tests/package/test_install_deps_host_safety.sh).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
prog=${0##*/}

# --- The profiles' Debian packages (each profile adds to the one before) -------------------------
# build: compile mall and run its unit tests (ctest -L unit).
build_packages=(
  build-essential cmake ninja-build pkg-config git
  libhwloc-dev hwloc
  libboost-program-options-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libeigen3-dev zlib1g-dev
  procps util-linux psmisc jq python3
  # tests/man renders the man pages as a reader does: man (man-db), groff, col (bsdextrautils).
  man-db groff-base bsdextrautils
)
# keras: the build, plus what makes the project's virtual environment for TensorFlow's wheel.
keras_packages=(
  python3-venv python3-pip
)
# full: everything the whole suite needs (run-tests.sh, CI).
full_packages=(
  # Slurm integration (slurm_plugin/, launch_scripts/local-cluster.sh, tests/system/): the daemons,
  # the clients, spank.h/libslurm, munge for auth/munge. Their services are neither started nor
  # left enabled here: the tests start private daemons of their own.
  slurm-wlm slurmctld slurmd slurm-client libslurm-dev munge libmunge-dev
  # local-cluster.sh up --nodes N: the nodes' network namespaces, bridge and veth pairs (ip).
  iproute2
  # MPI under Slurm: Open MPI brings PMIx, which `srun --mpi=pmix` (MpiDefault=pmix) needs.
  openmpi-bin libopenmpi-dev
  # gdb: the Slurm system tests print the backtrace of a rank's core dump when one crashes.
  gdb
  # The Python module's tests and examples/train_torch.py: Debian's PyTorch (OpenMP build), numpy,
  # and scikit-learn for the digits data it ships.
  python3-torch python3-numpy python3-sklearn
  # The libtorch adapter and its test (tf_integration/, MALL_WITH_LIBTORCH): headers and CMake files.
  # Named here because --no-install-recommends leaves out python3-torch's recommendation of it.
  libtorch-dev
  # launch_scripts/bench-cosched.sh draws its timeline plot (PNG) with gnuplot.
  gnuplot-nox
  # tests/fuzz (libFuzzer): clang, its fuzzer/sanitizer runtimes (only a Recommends of clang, hence
  # named), and llvm-symbolizer for file:line in the reports.
  clang libclang-rt-14-dev llvm
  # tests/vm (label vm): a qemu guest with cgroup v2 for the cgroup-v2 backend; busybox for its
  # hand-made initramfs, kmod (depmod, modprobe) for its modules. The guest's kernel is no package
  # of this host: tests/vm/guest-kernel.sh downloads Debian's into ~/.cache/mall (below).
  qemu-system-x86 busybox-static kmod
  # tests/containers (label containers): podman with runc (crun refuses the hybrid cgroup layout),
  # conmon and catatonit, and docker.io (dockerd, its containerd, the shim). Pulls containerd, tini,
  # iptables and a few libraries, upgrades login and passwd to the point release libsubid4 needs;
  # no init system, systemd untouched (checked with apt-get install -s --no-install-recommends).
  podman runc conmon catatonit docker.io
  # tests/tools/metrics_check.py parses `mallctl metrics` and malld's --metrics-file with
  # Prometheus' own parser; tests/tools/top_check.sh drives `mallctl top` in a real terminal.
  python3-prometheus-client tmux
  # tests/package/test_deb_install.sh: cpack's Depends come from dpkg-shlibdeps (dpkg-dev), and
  # mmdebstrap makes the clean Debian root the package is installed into; lintian checks the package.
  dpkg-dev mmdebstrap lintian
)

usage() {
  cat <<EOF
NAME
    $prog - install mall's build and test dependencies on Debian 12, by profile

SYNOPSIS
    $prog [--profile build|keras|full] [--print-packages]
    $prog -h | --help

DESCRIPTION
    Installs with apt (apt-get install --no-install-recommends) the Debian packages of one profile
    that are missing, then what the profile needs beyond Debian. Each profile includes the one
    before it:

    build   compile mall and run its unit tests (ctest -L unit): the compiler, cmake, ninja,
            pkg-config, hwloc, Boost.program_options, nlohmann-json, GoogleTest/GoogleMock,
            Google Benchmark, Eigen, zlib, python3, jq, and man/groff for the man-page test.
    keras   build, plus python3-venv and pip, and TensorFlow's pinned CPU wheel
            (launch_scripts/requirements-tensorflow.txt: a ~260 MB download, ~1.6 GB installed)
            in the project's own virtual environment <repo>/.venv, made with /usr/bin/python3.
    full    (the default; what launch_scripts/run-tests.sh and CI use) everything the whole suite
            needs: keras, plus Slurm (slurmctld, slurmd, munge, libslurm-dev), Open MPI, gdb, Debian's
            PyTorch and libtorch, clang and LLVM for the fuzzers, qemu and busybox for the
            cgroup-v2 guest, podman and docker.io for the container tests, mmdebstrap, dpkg-dev
            and lintian for the package tests, gnuplot, tmux and the Prometheus client. It also
            downloads the guest's Debian kernel into ~/.cache/mall/guest-kernel
            (tests/vm/guest-kernel.sh; about 70 MB once, nothing installed).

    What it never does to its host, in any profile:
      - install a kernel, initramfs generator or bootloader (the qemu guest's kernel is unpacked
        into a cache folder, never installed);
      - remove a package: apt runs with --no-remove and stops instead;
      - start a service: while apt runs, a temporary /usr/sbin/policy-rc.d (made only when there
        is none, removed at the end, also on failure or Ctrl-C) refuses every start; on a host
        where systemd runs (/run/systemd/system), the units of the packages this run newly
        installed (slurmd, slurmctld, munge, docker, containerd, ...) are disabled afterwards.
        A service the host had before is left as it was. The tests start private daemons of
        their own.

    When everything is present it checks with dpkg (and the venv's metadata) and returns in well
    under a second, without root. Root (or sudo) is needed only when a package is missing.

OPTIONS
    --profile NAME    build, keras or full (default full)
    --print-packages  print the profile's Debian packages, one a line, and exit (installs nothing,
                      needs no root)
    -h, --help        this text

ENVIRONMENT
    MALL_SKIP_TENSORFLOW=1  leave TensorFlow's wheel out (keras and full)
    MALL_TF_VENV=DIR        the virtual environment for TensorFlow (default <repo>/.venv)
    XDG_CACHE_HOME          the guest kernel's cache parent (default ~/.cache; full)

EXIT STATUS
    0 everything of the profile present; 1 bad usage, not root without sudo while packages are
    missing, or apt failed (apt's words above; a transaction that would remove a package ends here
    too, having changed nothing).

EXAMPLES
    $prog --profile build          # enough for cmake -B build && ctest -L unit
    $prog --profile keras --print-packages
    sudo $prog                     # the full set, as run-tests.sh does
EOF
}

profile=full print_only=0
while [ $# -gt 0 ]; do
  case $1 in
    --profile) [ $# -ge 2 ] || { echo "$prog: --profile needs build, keras or full" >&2; exit 1; }
      profile=$2; shift 2 ;;
    --profile=*) profile=${1#--profile=}; shift ;;
    --print-packages) print_only=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "$prog: unknown argument '$1' (see --help)" >&2; exit 1 ;;
  esac
done
case $profile in
  build) packages=("${build_packages[@]}") ;;
  keras) packages=("${build_packages[@]}" "${keras_packages[@]}") ;;
  full) packages=("${build_packages[@]}" "${keras_packages[@]}" "${full_packages[@]}") ;;
  *) echo "$prog: unknown profile '$profile': build, keras or full (see --help)" >&2; exit 1 ;;
esac
if [ "$print_only" = 1 ]; then printf '%s\n' "${packages[@]}"; exit 0; fi

# TensorFlow's wheel in <repo>/.venv, made with Debian's python3 (not whatever python3 comes first
# on PATH). Present when the venv's metadata names the pinned version.
install_tensorflow() {
  [ "${MALL_SKIP_TENSORFLOW:-0}" = 1 ] && { echo "install-deps: TensorFlow left out (MALL_SKIP_TENSORFLOW=1)"; return 0; }
  local venv=${MALL_TF_VENV:-$repo/.venv} requirements=$repo/launch_scripts/requirements-tensorflow.txt want
  want=$(sed -n 's/^tensorflow-cpu==//p' "$requirements")
  if [ -x "$venv/bin/python" ] &&
     [ "$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("tensorflow-cpu"))' 2>/dev/null)" = "$want" ]; then
    echo "install-deps: TensorFlow $want present in $venv"
    return 0
  fi
  echo "install-deps: installing tensorflow-cpu==$want into $venv (a ~260 MB wheel, ~1.6 GB installed)"
  [ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements"
  "$venv/bin/python" -c 'import importlib.metadata as m; print("install-deps: TensorFlow", m.version("tensorflow-cpu"), "installed")'
}

# What the profile needs beyond Debian's packages.
finish_profile() {
  case $profile in
    build) ;;
    keras) install_tensorflow ;;
    full)
      install_tensorflow
      local kernel
      kernel=$("$repo/tests/vm/guest-kernel.sh") ||
        { echo "install-deps: the qemu guest's kernel could not be fetched (above)" >&2; exit 1; }
      echo "install-deps: the qemu guest's kernel is in $kernel (not installed on this host)" ;;
  esac
}

# installed_packages: every installed package's name, one a line (dpkg's view, architecture-less).
installed_packages() {
  dpkg-query -W -f='${db:Status-Abbrev} ${binary:Package}\n' 2>/dev/null |
    awk '$1 ~ /^.i/ { sub(/:.*/, "", $2); print $2 }' | LC_ALL=C sort -u
}

# One dpkg-query for the whole list (it names only the packages it knows): a missing package is
# one it does not report "install ok installed".
# (dpkg-query exits 1 when it knows one of them not: that is the answer, not a failure.)
present=" $( { dpkg-query -W -f='${Package} ${Status}\n' "${packages[@]}" 2>/dev/null || true; } |
              awk '$2 " " $3 " " $4 == "install ok installed" { printf "%s ", $1 }') "
missing=()
for p in "${packages[@]}"; do
  [[ $present == *" $p "* ]] || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages of profile $profile present"
  finish_profile
  exit 0
fi

echo "install-deps: installing (profile $profile) ${missing[*]}"
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then sudo_cmd=(sudo); else
    echo "install-deps: missing packages (${missing[*]}) and not root; run as root or install them" >&2
    exit 1
  fi
fi

# No service starts while apt runs: invoke-rc.d and deb-systemd-invoke ask /usr/sbin/policy-rc.d,
# and 101 means "action forbidden". Ours is made only when the host has none (the host's own
# policy stays in charge otherwise) and removed on every exit; the marker line tells it apart.
readonly POLICY=/usr/sbin/policy-rc.d POLICY_MARKER="# made by mall's install-deps.sh"
policy_made=0
remove_policy() {
  if [ "$policy_made" = 1 ] && grep -qF "$POLICY_MARKER" "$POLICY" 2>/dev/null; then
    "${sudo_cmd[@]}" rm -f -- "$POLICY"
  fi
  policy_made=0
}
# A file with our marker is a leftover of a run that was killed (SIGKILL): ours to remove.
if ! [ -e "$POLICY" ] || grep -qF "$POLICY_MARKER" "$POLICY" 2>/dev/null; then
  trap remove_policy EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  policy_made=1
  printf '#!/bin/sh\n%s while it installs packages: no service starts (exit 101).\n# It removes this file when it ends.\nexit 101\n' \
    "$POLICY_MARKER" | "${sudo_cmd[@]}" sh -c "cat > $POLICY.mall-new && chmod 755 $POLICY.mall-new && mv -f $POLICY.mall-new $POLICY"
else
  echo "install-deps: note: $POLICY exists; its policy decides whether services start during the install"
fi

before=$(installed_packages)
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
# --no-remove: a transaction that would remove any package stops here, with apt's reason.
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends --no-remove "${missing[@]}"
remove_policy

# On a host where systemd runs, the units of packages this run newly installed (the ones named
# and what they pulled in) that their maintainer scripts enabled are disabled and stopped.
# (Plain pipes and variables, no <(...): it works where /dev/fd is missing, e.g. in a chroot.)
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
  new_packages=$(installed_packages | awk -v before="$before" '
    BEGIN { n = split(before, b, "\n"); for (i = 1; i <= n; i++) had[b[i]] = 1 } !($0 in had)')
  unit_files=$(for p in $new_packages; do dpkg-query -L "$p" 2>/dev/null || true; done |
                 grep -E '^(/usr)?/lib/systemd/system/[^/@]+\.(service|socket|timer|path)$' |
                 sed 's|.*/||' | LC_ALL=C sort -u || true)
  units=()
  for unit in $unit_files; do
    case $(systemctl is-enabled "$unit" 2>/dev/null || true) in
      enabled|enabled-runtime) units+=("$unit") ;;
    esac
  done
  if [ ${#units[@]} -gt 0 ]; then
    echo "install-deps: disabling the services this install brought (the tests start their own): ${units[*]}"
    "${sudo_cmd[@]}" systemctl disable --now --quiet "${units[@]}"
  fi
fi
finish_profile
echo "install-deps: done"
