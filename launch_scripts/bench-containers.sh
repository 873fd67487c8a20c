#!/usr/bin/env bash
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
# The kind keras (a Keras model.fit, examples/keras_digits.py in the project's venv, malleable with
# mall.keras.Malleable) is added to the driver's kinds here, by the Python below that runs the
# driver (--mix keras, or a --scenario row of kind keras; calibrated only when a job uses it).
set -uo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${MALL_BUILD_DIR:-$repo/build}
driver=$repo/launch_scripts/bench_containers.py
kit=$repo/tests/containers/container_kit.sh
me=bench-containers.sh
# The keras kind's Python: a venv with TensorFlow's wheel (launch_scripts/install-deps.sh makes it).
keras_python=${MALL_BENCH_PYTHON:-$repo/.venv/bin/python}

# run_driver ARGS...: the driver with the keras kind added to its kinds (bench_cosched.Kind:
# dense, small, linear). Inside the containers the kind runs
#   /usr/bin/env PYTHONPATH=<repo>/python MALL_LIBRARY=... MALL_TF_OPS_LIBRARY=... PY -c <argv fix> \
#     examples/keras_digits.py --steps N --batch 512 --hidden 1024 --print-every 0 [--threads T --no-mall]
# (the venv, python/ and examples/ are mounted read-only at the same paths): static and outside give
# --threads T (TensorFlow's pools fixed, not malleable), mall gives none and the driver appends
# --max-threads MAX, which the argv fix turns into keras_digits.py's --threads MAX (under malld:
# pools of MAX workers, parked down to the allocation at every batch end).
keras_kind_py=$(cat <<'PY'
import os, sys
driver = sys.argv[1]
sys.argv = [driver] + sys.argv[2:]
sys.path.insert(0, os.path.dirname(driver))
import bench_containers as bc  # noqa: E402
cs = bc.cs
repo = os.environ["MALL_BENCH_REPO"]
python = os.environ["MALL_BENCH_PYTHON"]
trainer = os.path.join(repo, "examples", "keras_digits.py")
# keras_digits.py takes --threads, not the --max-threads the mall way appends.
ARGV_FIX = ("import runpy, sys; a = sys.argv[1:]; "
            "a = ['--threads' if w == '--max-threads' else w for w in a]; "
            "sys.argv = a; runpy.run_path(a[0], run_name='__main__')")


class KerasKind(cs.Kind):
    def command(self, bin_dir, steps, threads):
        lib = os.path.join(os.path.dirname(bin_dir), "lib")
        cmd = ["/usr/bin/env", "PYTHONPATH=" + os.path.join(repo, "python"),
               "MALL_LIBRARY=" + os.path.join(lib, "libmall.so.0"),
               "MALL_TF_OPS_LIBRARY=" + os.path.join(lib, "libmall_tf_ops.so"), "TF_CPP_MIN_LOG_LEVEL=2",
               python, "-c", ARGV_FIX, trainer, "--steps", str(steps), *self.extra]
        if threads:
            cmd += ["--threads", str(threads), "--no-mall"]
        return cmd


# Per 2 cpus, as the driver's spaced mix, with a long Keras training instead of the dense one.
bc.MIXES["keras"] = [("keras", 0.0, 60.0), ("small", 0.0, 6.0), ("linear", 14.0, 6.0), ("small", 28.0, 6.0)]
bc.MANUAL = bc.MANUAL.replace("\nOPTIONS\n", """
THE KERAS KIND
    keras    examples/keras_digits.py: Keras model.fit (TensorFlow backend) of a 64-1024-10 MLP,
             batch 512, run by the venv's python (MALL_BENCH_PYTHON, default <repo>/.venv/bin/python;
             launch_scripts/install-deps.sh makes it), with the venv, the checkout's python/ and
             examples/ mounted read-only at the same paths. static and outside fix TensorFlow's pools
             at --threads T; in the mall way mall.keras.Malleable parks and releases their workers at
             every batch end (the op library <build>/lib/libmall_tf_ops.so: a build with TensorFlow).
             --mix keras is the spaced mix with a long keras run (60) instead of the dense one; a
             --scenario row may name kind keras. Calibrated only when a job uses it (TensorFlow's
             start adds a few seconds to each keras container and calibration run).

OPTIONS
""", 1)


class KerasContainerBench(bc.ContainerBench):
    def __init__(self, args):
        super().__init__(args)
        self.kinds["keras"] = KerasKind("keras", "keras_digits.py", 512, "images_per_s",
                                        ["--batch", "512", "--hidden", "1024", "--print-every", "0"], 200,
                                        ["#6a1b9a", "#9c4dcc", "#c48be0", "#e3c6f0"])

    def calibrate(self):
        """Every kind, as the driver does, but keras only when a job of the scenario uses it."""
        every = self.kinds
        if "keras" not in {j.kind.name for j in self.scenario()}:
            self.kinds = {n: k for n, k in every.items() if n != "keras"}
        else:
            missing = [f for f in (python, os.path.join(self.args.build, "lib", "libmall_tf_ops.so"))
                       if not os.path.exists(f)]
            if missing:
                cs.fail("the keras kind needs " + " and ".join(missing) + " (launch_scripts/install-deps.sh "
                        "makes the venv; a build with TensorFlow makes the op library: ninja mall_tf_ops; "
                        "MALL_BENCH_PYTHON names another Python)")
        try:
            super().calibrate()
        finally:
            self.kinds = every


plain_parse_args = bc.parse_args


def parse_args(argv=None):
    args, parser = plain_parse_args(argv)
    for action in parser._actions:  # the help of --mix and --scenario names the kind too
        if action.dest == "mix":
            action.help += "; or keras: spaced with a long Keras model.fit (kind keras) instead of the dense run"
        elif action.dest == "scenario":
            action.help = action.help.replace("dense|small|linear", "dense|small|linear|keras")
    return args, parser


bc.parse_args = parse_args
bc.ContainerBench = KerasContainerBench
sys.exit(bc.main())
PY
)
run_driver() { MALL_BENCH_REPO=$repo MALL_BENCH_PYTHON=$keras_python python3 -c "$keras_kind_py" "$driver" "$@"; }

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
