#!/usr/bin/env bash
# install-deps.sh — installs every build and test dependency of mall from Debian's packages.
# Idempotent: when everything is present it checks with dpkg and returns in well under a second.
# Needs root (or sudo) only when something is missing.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libhwloc-dev hwloc
  libboost-program-options-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libeigen3-dev zlib1g-dev
  procps util-linux psmisc jq
  # Slurm integration (slurm_plugin/, launch_scripts/local-cluster.sh, tests/system/): the daemons,
  # the clients, spank.h/libslurm, munge for auth/munge.
  slurm-wlm slurmctld slurmd slurm-client libslurm-dev munge libmunge-dev
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
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
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
echo "install-deps: done"
