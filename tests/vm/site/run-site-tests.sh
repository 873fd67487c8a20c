#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# run-site-tests.sh — ctest's driver for the Debian 13 site tests (vm.site_malld, vm.site_slurm,
# vm.site_podman; issue 29): builds mall's .deb in the site root (build-site-deb.sh, cached build
# tree), then boots the site guest once (run-in-site-vm.sh) and runs the named tests' guest scripts
# in it, in the order given. Contract: exit 0 when every script passed, else the first failing
# script's status (77 only when the host cannot run the guest at all: not root, no qemu, no
# mmdebstrap); a watchdog bounds the whole run; nothing is left but the caches. --help.
set -euo pipefail

prog=${0##*/}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

usage() {
  cat <<EOF
NAME
    $prog - build mall's .deb for Debian 13 and run site tests in one guest boot

SYNOPSIS
    $prog [--source DIR] [--work-dir DIR] [--timeout S] TEST [TEST...]

DESCRIPTION
    TEST is malld, slurm, podman or docker:
      malld   site_malld.sh            malld.service from the .deb (vm.site_malld)
      slurm   slurm/site_slurm.sh      Slurm 24.11, cgroup/v2 under systemd (vm.site_slurm);
                                       the slurm/ folder goes along (--file)
      podman  podman/site_podman.sh    podman 5, crun, systemd cgroup manager (vm.site_podman)
      docker  docker/site_docker.sh    docker 26, runc, systemd cgroup driver (vm.site_docker)
    site_common.sh, the scripts' shared helpers, always goes along (--file; \$MALL_SITE_FILES).
    Steps: make-site-root.sh (cached root; ~75 s the first time), build-site-deb.sh (the .deb;
    ~3 min the first time on 2 cpus, ~15 s when the sources did not change), run-in-site-vm.sh
    --deb mall_*.deb with the scripts (boot ~30 s on an idle host, 2-3 min on a busy one). The
    scripts' logs (journals, status files) are copied to WORK_DIR/out-<tests>/.

OPTIONS
    --source DIR    mall's source tree (default: the one this script is in)
    --work-dir DIR  where the .deb and the scripts' logs go (default: \${TMPDIR:-/tmp}/mall-site-UID)
    --timeout S     the whole run's limit in seconds (default 1500); the guest gets what is left
                    after the build, less 30 s
    -h, --help      this text

EXIT STATUS
    0 all passed; 1-255 the first failing script's status (or 1 when the build failed); 77 the
    host cannot run the guest (the reason after "SKIP:"); 124 the guest timed out; 125 the
    harness failed.
EOF
}

orig_args=("$@")   # for the watchdog's re-run
source_dir=$(cd "$here/../../.." && pwd) work="" timeout_s=1500
tests=()
while [ $# -gt 0 ]; do
  case $1 in
    --source) source_dir=$(cd "${2:?--source needs a folder}" && pwd); shift 2 ;;
    --work-dir) work=${2:?--work-dir needs a folder}; shift 2 ;;
    --timeout) [[ ${2-} =~ ^[1-9][0-9]*$ ]] || { echo "$prog: --timeout needs seconds" >&2; exit 2; }
      timeout_s=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    malld|slurm|podman|docker) tests+=("$1"); shift ;;
    *) echo "$prog: unknown test or option '$1' (tests: malld, slurm, podman, docker; see --help)" >&2; exit 2 ;;
  esac
done
[ ${#tests[@]} -gt 0 ] || { echo "$prog: name at least one test: malld, slurm, podman or docker (see --help)" >&2; exit 2; }

. "$here/../../support/watchdog.sh"   # watchdog_script, watchdog_fired
watchdog_script "$timeout_s" "${orig_args[@]}"
trap 'watchdog_fired "$timeout_s"; exit 124' TERM

[ -n "$work" ] || work=${TMPDIR:-/tmp}/mall-site-$(id -u)
mkdir -p "$work"
work=$(cd "$work" && pwd)
scripts=() files=(--file "$here/site_common.sh")   # the scripts' shared helpers, in $MALL_SITE_FILES
for t in "${tests[@]}"; do
  case $t in
    malld) scripts+=("$here/site_malld.sh") ;;
    slurm) scripts+=("$here/slurm/site_slurm.sh"); files+=(--file "$here/slurm") ;;
    podman) scripts+=("$here/podman/site_podman.sh") ;;
    docker) scripts+=("$here/docker/site_docker.sh") ;;
  esac
done
for s in "${scripts[@]}"; do [ -r "$s" ] || { echo "$prog: FAIL: guest script $s is missing" >&2; exit 1; }; done

t0=$SECONDS
deb=$("$here/build-site-deb.sh" --source "$source_dir" --out "$work") || exit $?
build_s=$((SECONDS - t0))
echo "== $prog: $(basename "$deb") built for Debian 13 in $build_s s"
guest_timeout=$((timeout_s - build_s - 30))
[ "$guest_timeout" -ge 120 ] || { echo "$prog: FAIL: only $guest_timeout s left for the guest after the build" >&2; exit 124; }
label=$(IFS=-; echo "${tests[*]}")
collect=$work/out-$label
rm -rf -- "$collect"
rc=0
"$here/run-in-site-vm.sh" --timing --timeout "$guest_timeout" --deb "$deb" "${files[@]}" --collect "$collect" \
  "${scripts[@]}" || rc=$?
echo "== $prog: ${tests[*]}: exit $rc after $((SECONDS - t0)) s (logs in $collect)"
exit "$rc"
