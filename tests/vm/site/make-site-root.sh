#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# make-site-root.sh — the Debian 13 (trixie) "site" root for the vm.site_* tests (issue 29): systemd as
# PID 1, Slurm 24.11, podman 5 + crun, trixie's kernel, and what building mall needs. Made with
# mmdebstrap once and cached as a tarball in ${XDG_CACHE_HOME:-~/.cache}/mall/, keyed by the suite,
# the package list, the guest configuration written below and docs/admin-slurm.md's recipe "mall for
# Slurm 24.11 on Debian 13" (slurm_recipe.sh), whose `apt-get install` line names the Slurm and
# build packages (a change of any makes a new one).
# Contract: prints the tarball's path on stdout (progress on stderr); exit 0 made or cached, 1 failed,
# 77 cannot run here (not root, no mmdebstrap). --help.
set -euo pipefail

prog=${0##*/}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=slurm_recipe.sh
. "$here/slurm_recipe.sh"   # slurm_recipe_packages, slurm_recipe_key, SLURM_RECIPE_DOC
readonly SUITE=trixie
# The guest's own packages: the measured list that boots systemd as PID 1 under qemu TCG
# (PLATFORM.md "Debian 13"); python3, jq and psmisc for the guest test scripts; conmon and
# catatonit for podman (--init); docker.io with docker-cli (the client is only Recommended by
# docker.io, and mmdebstrap installs no Recommends) for site_docker.sh.
readonly GUEST_PACKAGES=systemd,systemd-sysv,dbus,udev,kmod,e2fsprogs,linux-image-amd64,iproute2,procps,psmisc,python3,jq,podman,crun,conmon,catatonit,docker.io,docker-cli,containerd,runc,busybox-static
# Slurm 24.11, munge and what building mall's .deb needs, exactly as the recipe's `apt-get install`
# line names them (build-site-deb.sh then runs the whole recipe in this root, where that line
# installs nothing new), with the .deb's runtime libraries (pulled by the -dev packages), so that
# `apt install ./mall_*.deb` in the guest needs no network.
RECIPE_PACKAGES=$(slurm_recipe_packages) || { echo "$prog: cannot read the Slurm 24.11 recipe of $SLURM_RECIPE_DOC (above)" >&2; exit 1; }
RECIPE_KEY=$(slurm_recipe_key) || exit 1
readonly RECIPE_PACKAGES RECIPE_KEY PACKAGES=$GUEST_PACKAGES,$RECIPE_PACKAGES

usage() {
  cat <<EOF
NAME
    $prog - make (or find cached) the Debian 13 root of the site guest

SYNOPSIS
    $prog [--print-packages | --print-packages-key | --print-path | -h | --help]

DESCRIPTION
    Runs \`mmdebstrap --variant=minbase --include=PACKAGES $SUITE\` (Debian's mirror, the network
    needed once: about 45-90 s, ~250 MB download) and keeps the result as an uncompressed tarball
    ${XDG_CACHE_HOME:-~/.cache}/mall/debian-$SUITE-site-KEY-root.tar (about 1.3 GB), where KEY
    hashes the suite, the package list, the guest configuration below and every line of the
    recipe "mall for Slurm 24.11 on Debian 13" in $SLURM_RECIPE_DOC.
    PACKAGES are the guest's own (systemd, the kernel, podman, docker, python3, jq, ...) and those
    of the recipe's \`apt-get install\` line (Slurm 24.11, munge, mall's build dependencies), read
    from the doc at every call. Later calls print the
    cached path at once. Making a new one removes the tarballs of other keys and the images
    run-in-site-vm.sh made from them.

    The guest configuration (made by mmdebstrap's customize hook, so it lives in the tarball):
      - host name "site"; a dummy interface mall0 with 10.77.0.1/24 brought up by
        systemd-networkd (Slurm refuses a loopback-only node address); /etc/hosts names it;
      - /etc/fstab: / on /dev/vda, and the run's data disk (label MALLSITE, made by
        run-in-site-vm.sh) on /mnt/mall-site;
      - mall-site-run.service (WantedBy and After multi-user.target): runs
        /mnt/mall-site/guest-runner.sh, which run-in-site-vm.sh puts on the data disk;
      - timers that would wake up under emulation (apt, man-db, e2scrub, fstrim, dpkg-db-backup)
        masked; slurmd and slurmctld disabled (a test starts them once it has configured them);
        a machine id and /etc/.updated made, so that no boot is a first boot; the root password
        emptied (a login on the serial console, for debugging).

    Everything the packages need at run time is installed (slurmd's, munge's and podman's
    services, the build tools for mall).

OPTIONS
    --print-packages  print the package list (comma-separated) and exit
    --print-packages-key  print a key of the suite, the package list and the recipe only
                      (build-site-deb.sh keys its build tree with it: the guest configuration does
                      not change a build, a new line in the recipe does)
    --print-path      print where the tarball is (or would be) and exit, making nothing
    -h, --help        this text

EXIT STATUS
    0 the tarball's path on stdout; 1 mmdebstrap failed (its log's tail on stderr), or the doc has
    no readable recipe (slurm_recipe.sh's words on stderr); 77 cannot run
    here (not root, or mmdebstrap missing; the reason on stderr after "SKIP:").

ENVIRONMENT
    XDG_CACHE_HOME    the cache's parent (default ~/.cache)
EOF
}

# The customize hook: the guest's configuration, run by mmdebstrap with the root as \$1. Its text
# is part of the cache key.
# shellcheck disable=SC2016  # expanded by the hook's shell, not here
readonly CUSTOMIZE='set -e
r=$1
echo site > "$r/etc/hostname"
printf "127.0.0.1\tlocalhost\n10.77.0.1\tsite\n" > "$r/etc/hosts"
mkdir -p "$r/etc/systemd/network" "$r/mnt/mall-site"
printf "[NetDev]\nName=mall0\nKind=dummy\n" > "$r/etc/systemd/network/10-mall0.netdev"
printf "[Match]\nName=mall0\n\n[Network]\nAddress=10.77.0.1/24\nConfigureWithoutCarrier=yes\n" > "$r/etc/systemd/network/10-mall0.network"
printf "/dev/vda\t/\text4\trw,errors=remount-ro\t0\t1\nLABEL=MALLSITE\t/mnt/mall-site\text4\tnofail,x-systemd.device-timeout=60s\t0\t0\n" > "$r/etc/fstab"
cat > "$r/etc/systemd/system/mall-site-run.service" <<UNIT
# mall-site-run.service: runs the guest scripts that run-in-site-vm.sh put on the data disk.
[Unit]
Description=mall site tests (run-in-site-vm.sh)
After=multi-user.target
RequiresMountsFor=/mnt/mall-site
ConditionPathExists=/mnt/mall-site/guest-runner.sh

[Service]
Type=oneshot
ExecStart=/bin/bash /mnt/mall-site/guest-runner.sh
TimeoutStartSec=infinity
StandardOutput=journal+console
StandardError=journal+console

[Install]
WantedBy=multi-user.target
UNIT
chroot "$r" systemctl enable systemd-networkd.service mall-site-run.service
# slurmd and slurmctld start when a test has configured them: at boot, without a slurm.conf,
# slurmd waits 90 s for a controller and multi-user.target with it.
chroot "$r" systemctl disable slurmd.service slurmctld.service
for t in apt-daily.timer apt-daily-upgrade.timer man-db.timer e2scrub_all.timer fstrim.timer dpkg-db-backup.timer e2scrub_reap.service; do
  chroot "$r" systemctl mask "$t"
done
chroot "$r" passwd -d root >/dev/null
# Not a first boot at every boot (the guest'"'"'s writes are thrown away): a machine id, and /etc and
# /var marked up to date with /usr (ldconfig.service, systemd-update-done.service).
chroot "$r" systemd-machine-id-setup >/dev/null
touch "$r/etc/.updated" "$r/var/.updated"
'

cache=${XDG_CACHE_HOME:-$HOME/.cache}/mall
key=$(printf '%s\n%s\n%s\n%s\n' "$SUITE" "$PACKAGES" "$CUSTOMIZE" "$RECIPE_KEY" | md5sum | cut -c1-8)
tarball=$cache/debian-$SUITE-site-$key-root.tar

case ${1-} in
  -h|--help) usage; exit 0 ;;
  --print-packages) echo "$PACKAGES"; exit 0 ;;
  --print-packages-key) printf '%s\n%s\n%s\n' "$SUITE" "$PACKAGES" "$RECIPE_KEY" | md5sum | cut -c1-8; exit 0 ;;
  --print-path) echo "$tarball"; exit 0 ;;
  "") ;;
  *) echo "$prog: unknown argument '$1' (see --help)" >&2; exit 1 ;;
esac

if [ -f "$tarball" ]; then
  echo "$tarball"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "$prog: SKIP: mmdebstrap needs root to make the site root (run as root)" >&2; exit 77
fi
command -v mmdebstrap >/dev/null || { echo "$prog: SKIP: mmdebstrap not installed (apt-get install mmdebstrap)" >&2; exit 77; }

mkdir -p "$cache"
# One maker at a time; a second caller waits and then finds the tarball.
exec {lock}>"$cache/.site-root.lock"
flock "$lock"
if [ -f "$tarball" ]; then
  echo "$tarball"
  exit 0
fi
tmp=$(mktemp -d "$cache/.site-root.XXXXXX")   # beside the tarball: the final mv is a rename
trap 'rm -rf -- "$tmp"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
t0=$SECONDS
echo "$prog: mmdebstrap --variant=minbase $SUITE (${PACKAGES//,/ }) into $tarball" >&2
# stdin from /dev/null: mmdebstrap would read sources.list lines from a non-terminal stdin.
if ! mmdebstrap --variant=minbase --include="$PACKAGES" --customize-hook="$CUSTOMIZE" \
     "$SUITE" "$tmp/root.tar" </dev/null >"$tmp/mmdebstrap.log" 2>&1; then
  tail -n 40 "$tmp/mmdebstrap.log" >&2
  echo "$prog: mmdebstrap $SUITE failed (log above); is Debian's mirror reachable?" >&2
  exit 1
fi
mv -f -- "$tmp/root.tar" "$tarball"
# Roots of other keys (and the images made from them) are stale now: about 2.5 GB each. A run
# still using one keeps its open files until it ends.
for old in "$cache"/debian-$SUITE-site-*-root.*; do
  case $old in "$cache/debian-$SUITE-site-$key-root."*) ;; *) rm -f -- "$old" ;; esac
done
echo "$prog: made $tarball ($(du -m "$tarball" | cut -f1) MB) in $((SECONDS - t0)) s" >&2
echo "$tarball"
