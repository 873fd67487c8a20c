#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# install-deps.sh — installs every build and test dependency of mall: Debian's packages, and the one
# thing Debian does not package, TensorFlow's CPU wheel (launch_scripts/requirements-tensorflow.txt,
# pinned), into the project's own virtual environment <repo>/.venv (MALL_TF_VENV to put it
# elsewhere; MALL_SKIP_TENSORFLOW=1 to leave it out). Idempotent: when everything is present it
# checks with dpkg and the venv's metadata and returns in well under a second. Needs root (or sudo)
# only when a Debian package is missing; the venv belongs to whoever runs it.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

packages=(
  build-essential cmake ninja-build pkg-config git
  libhwloc-dev hwloc
  libboost-program-options-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libeigen3-dev zlib1g-dev
  procps util-linux psmisc jq
  # tests/man renders the man pages as a reader does: man (man-db), groff, col (bsdextrautils).
  man-db groff-base bsdextrautils
  # Slurm integration (slurm_plugin/, launch_scripts/local-cluster.sh, tests/system/): the daemons,
  # the clients, spank.h/libslurm, munge for auth/munge.
  slurm-wlm slurmctld slurmd slurm-client libslurm-dev munge libmunge-dev
  # local-cluster.sh up --nodes N: the nodes' network namespaces, bridge and veth pairs (ip).
  iproute2
  # MPI under Slurm: Open MPI brings PMIx, which `srun --mpi=pmix` (MpiDefault=pmix) needs.
  openmpi-bin libopenmpi-dev
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
  # tests/vm (label vm): a qemu guest with cgroup v2 for the cgroup-v2 backend. Debian's kernel for
  # the guest, busybox for its hand-made initramfs; tiny-initramfs satisfies the kernel's initramfs
  # dependency, so apt pulls neither initramfs-tools nor udev and leaves systemd alone.
  qemu-system-x86 linux-image-amd64 busybox-static tiny-initramfs
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
  # The project's virtual environment for TensorFlow's wheel (below).
  python3-venv python3-pip
)

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

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  install_tensorflow
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then sudo_cmd=(sudo); else
    echo "install-deps: missing packages (${missing[*]}) and not root; run as root or install them" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
install_tensorflow
echo "install-deps: done"
