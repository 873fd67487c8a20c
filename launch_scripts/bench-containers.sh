#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# bench-containers.sh — the container benchmark of issue 14: one scenario of training containers
# run three ways — static cpusets, cpusets resized from outside without telling the app, mall —
# printing throughput ratios and how oversubscribed each way ran (runnable threads per core), with
# summary.csv, timeline.csv and timeline.png in --out. Last line:
#   mall_vs_static=X.XX mall_vs_outside=Y.YY
# Contract: root only (exit 1 with the reason otherwise); bad options exit 2 naming the option.
# This wrapper owns the container kit (tests/containers/container_kit.sh: private podman state or a
# private dockerd, the tiny rootfs, the kit's cgroup subtree), builds what is missing and runs the
# driver bench_containers.py (same folder) with the kit's environment. On any exit — success,
# failure, SIGTERM (twice, as timeout(1) sends it), ^C — the driver removes its containers, malld
# and temp folder, then the kit's clean-up removes the rest; further signals are ignored meanwhile.
# --help prints the manual.
# The driver's kinds include keras (a Keras model.fit, examples/keras_digits.py in the project's
# venv, malleable with mall.keras.Malleable: --mix keras, or a --scenario row of kind keras); the
# wrapper mounts that venv, the checkout's python/ and examples/ into the containers.
set -uo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${MALL_BUILD_DIR:-$repo/build}
driver=$repo/launch_scripts/bench_containers.py
kit=$repo/tests/containers/container_kit.sh
me=bench-containers.sh
# The keras kind's Python (the driver runs it from the same variable and default): a venv with
# TensorFlow's wheel (launch_scripts/install-deps.sh makes it).
keras_python=${MALL_BENCH_PYTHON:-$repo/.venv/bin/python}
run_driver() { python3 "$driver" "$@"; }

command -v python3 >/dev/null || { echo "$me: needs python3" >&2; exit 1; }
for arg in "$@"; do
  case $arg in -h|--help) run_driver --build "$build" --help; exit $? ;; esac
done
# Options first (exit 2 with words), then root (exit 1): nothing is set up before both.
engine=$(run_driver --build "$build" --preflight "$@") || exit $?

# shellcheck source=../tests/containers/container_kit.sh
. "$kit"
ctr_have "$engine" || { echo "$me: $CTR_WHY" >&2; exit 1; }
read -r cg_kind cg_mount < <(ctr__cpuset_mount) ||
  { echo "$me: no cgroup cpuset controller (cgroup v1 cpuset, or cgroup2 offering cpuset): containers cannot be given cpus" >&2; exit 1; }

programs=(mall_train_digits mall_train_linear malld mallrun mallctl)
for program in "${programs[@]}"; do
  if [ ! -x "$build/bin/$program" ]; then
    echo "$me: building ($build)"
    [ -f "$build/build.ninja" ] || cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null || exit 1
    ninja -C "$build" -j2 "${programs[@]}" >/dev/null || exit 1
    break
  fi
done

driver_pid="" malld_parent=""
# shellcheck disable=SC2317  # run by the EXIT trap
finish() { # EXIT: the driver's own clean-up first (it gets SIGTERM if it still runs), then the kit's
  local rc=$? m
  trap '' TERM INT HUP
  if [ -n "$driver_pid" ]; then
    kill -TERM "$driver_pid" 2>/dev/null
    wait "$driver_pid" 2>/dev/null
  fi
  ctr_cleanup || { echo "$me: the container kit could not remove everything (see above)" >&2; rc=1; }
  # malld's folders, if the driver died before it could stop malld (its processes are gone now).
  if [ -n "$malld_parent" ]; then
    for m in $(ctr__cgroup_mounts); do
      [ -d "$m/$malld_parent" ] && find "$m/$malld_parent" -depth -type d -exec rmdir {} + 2>/dev/null
    done
  fi
  exit "$rc"
}

ctr_sweep                       # kits of runs that were killed before they could clean up
ctr_init bench || exit 1
trap finish EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
trap 'exit 129' HUP
echo "$me: the container kit's folder is $CTR_DIR (cgroup $CTR_CGROUP, $engine)"
ctr_bind_ro "$build/bin" || exit 1
[ -d "$build/lib" ] && { ctr_bind_ro "$build/lib" || exit 1; }
# The keras kind: the checkout's python/ (mall's package), examples/ and the venv (its python is a
# link into the host's /usr, which the kit mounts; pyvenv.cfg and site-packages are beside bin/).
ctr_bind_ro "$repo/python" "$repo/examples" || exit 1
keras_venv=$(dirname "$(dirname "$keras_python")")
[ -f "$keras_venv/pyvenv.cfg" ] && { ctr_bind_ro "$keras_venv" || exit 1; }
engine_bin=$(ctr_engine_bin "$engine") || exit 1
if [ "$engine" = docker ]; then
  ctr_docker_start || exit 1
  echo "$me: a private dockerd answered in ${CTR_DOCKERD_START_MS} ms"
fi
ctr_run_args "$engine" NAME || exit 1
printf '%s\0' "${CTR_RUN_ARGS[@]}" >"$CTR_DIR/run-args"

export CTR_DIR CTR_CGROUP CTR_PREFIX
export MALL_BENCH_KIT=$kit MALL_BENCH_ENGINE=$engine MALL_BENCH_ENGINE_BIN=$engine_bin
export MALL_BENCH_RUN_ARGS=$CTR_DIR/run-args MALL_BENCH_CPUSET="$cg_kind $cg_mount"
run_driver --build "$build" "$@" &
driver_pid=$!
malld_parent=mall_bench_containers$driver_pid
wait "$driver_pid"
rc=$?
driver_pid=""
exit "$rc"
