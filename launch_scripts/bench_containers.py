#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""bench_containers.py — the container co-scheduling benchmark (issue 14) behind
launch_scripts/bench-containers.sh: run that wrapper, which sets up the container kit
(tests/containers/container_kit.sh), runs this driver and removes everything afterwards.

Contract: one scenario of training containers (bench_cosched.py's kinds, calibration, mixes and
admission, imported from it) replayed three ways on this node's cpus: static cpusets, cpusets
resized from outside without telling the app, and mall. Prints a table with throughput ratios and
how oversubscribed each way ran (runnable threads per allotted core, sampled from /proc), writes
summary.csv, timeline.csv and timeline.png into --out, and ends with the line
    mall_vs_static=X.XX mall_vs_outside=Y.YY
(when all three ways ran). Besides bench_cosched's kinds it has its own, keras (KerasKind).
It needs the environment the wrapper exports (CTR_DIR, CTR_CGROUP,
CTR_PREFIX, MALL_BENCH_*); everything it starts (containers, malld, cgroups, its temp folder) is
stopped and removed on the way out, also on SIGTERM or ^C; the wrapper's kit clean-up then removes
the engine's storage, the kit's cgroups and its folder.

It stays one file (about 800 lines): the scenario, its three ways and the figures share one run's
state and clean-up, and bench_cosched.py already holds what the two benchmarks share.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_cleanup  # noqa: E402  (run, then always clean up, also on SIGTERM or ^C)
import bench_cosched as cs  # noqa: E402  (the co-scheduling benchmark: kinds, calibration, mixes)

PROG = "bench-containers.sh"
cs.PROG = PROG  # cs.fail() names this program
WAYS = ("static", "outside", "mall")
# This benchmark's own mix (per 2 cpus) beside bench-cosched's two (cs.Bench.scenario reads
# cs.MIXES): the short jobs arrive 14 s apart, later than one of them ends here (6-9 s on one
# core), so a core falls idle after each and the outside way moves cpusets both ways (a growth at
# every departure, a shrink at every arrival) while the apps keep their threads; the long run
# outlasts the last short job in every way, so the makespan is the long run's and measures how
# well the idle cores were used. In bench-cosched's mixes the short jobs queue back to back on
# 2 cpus here, and cpusets move only once, at the end.
# keras: the spaced mix with a long Keras training instead of the dense one.
MIXES = {"spaced": [("dense", 0.0, 60.0), ("small", 0.0, 6.0), ("linear", 14.0, 6.0), ("small", 28.0, 6.0)],
         **cs.MIXES,
         "keras": [("keras", 0.0, 60.0), ("small", 0.0, 6.0), ("linear", 14.0, 6.0), ("small", 28.0, 6.0)]}
cs.MIXES = MIXES
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The keras kind's Python: a venv with TensorFlow's wheel (launch_scripts/install-deps.sh makes it;
# the wrapper mounts it into the containers).
KERAS_PYTHON = os.environ.get("MALL_BENCH_PYTHON") or os.path.join(REPO, ".venv", "bin", "python")

MANUAL = """\
NAME
    bench-containers.sh - co-scheduling training containers three ways: static cpusets, cpusets
    resized from outside, mall

SYNOPSIS
    launch_scripts/bench-containers.sh [OPTIONS]

DESCRIPTION
    Replays one scenario of training containers arriving on and leaving this node (podman by
    default, docker with --engine docker; run by the container kit: a tiny rootfs in which the
    host's /usr and the build's bin/ and lib/ are mounted read-only, no registry) three ways, one
    after the other, and compares how much work the node finished per second and how
    oversubscribed it ran:

      static   each container gets a fixed cpuset share when it starts (--cpuset-cpus, its MIN
               cores) and as many threads as cores; nothing changes until it ends. A container
               waits while the running ones' MIN cores leave no room for its own.
      outside  the co-scheduling the research starts from: the same decisions as mall's equal
               policy (the cores split evenly among the running containers at every arrival and
               departure) carried out from outside, by `podman update --cpuset-cpus` (`docker
               update`) or, with --resize-by cgroup, by writing the container's cpuset.cpus
               directly. The app is never told: each container is sized for the whole node when
               it starts (--threads = --cpus, Eigen's own fixed pool), as a containerised trainer
               that sizes itself from the host is, and keeps that many threads however its
               cpuset moves. The time of every update is measured and printed.
      mall     each container started through `mallrun --container --malleable=MIN:MAX` against a
               private malld (--policy, default equal); libmall inside the trainer attaches
               through the bind-mounted socket and resizes its thread pool at the next step
               boundary whenever malld moves cores.

    Every way admits containers by the same rule (arrival order, MIN cores free). The jobs are
    bench-cosched.sh's: dense (mall_train_digits, large kernels: compute-bound), small
    (mall_train_digits, small kernels: synchronisation-bound, scales poorly) and linear
    (mall_train_linear: memory-bound); their one-core and all-core step rates are measured first
    (on the host, calibration), and work is counted in one-core seconds. The built-in mixes put 4
    containers per 2 cpus: a long run and three short ones (6 one-core s each). In the default mix,
    spaced, the long run is dense (60) and the short ones arrive at 0, 14 and 28 s (times
    --work-scale), so a core falls idle after each: static leaves it idle, outside and mall lend it
    to the long run and take it back at the next arrival. The long run ends last in every way, so
    the makespan measures how well the idle cores were used.

    Oversubscription: every --sample-ms (100 ms) the driver reads, for each running container, the
    processes of its cgroup (cgroup.procs of the container's own folder, found below the
    --cgroup-parent it was started with), the state of each of their threads
    (/proc/PID/task/TID/stat) and the cpus its cgroup may use (cpuset effective cpus).
    "runnable per core" is the number of threads in state R divided by the container's cores;
    the table gives its mean over all samples of all containers and its peak. 1 means every
    allotted core had one runnable thread; 2 means threads queued for half their time.

OUTPUT
    A table, one row per way: makespan_s (first arrival to last end), mean_job_s (end minus
    arrival, averaged: queueing and container start included), work/s (one-core seconds of work
    finished per second of makespan; at most --cpus), vs_static and vs_outside (work/s ratios),
    rq/core_mean and rq/core_peak (runnable threads per allotted core: the mean over every
    sample of every running container, and the highest single sample, container start-up
    included, so the mean is the figure to compare). Then, in --out:
      summary.csv   way,makespan_s,mean_completion_s,work_per_s,vs_static,vs_outside,
                    runnable_per_core_mean,runnable_per_core_peak,resizes,resize_ms_mean
      timeline.csv  way,time_s,job,kind,cores,cpus,threads,runnable: one row per sample of each
                    running container, and a row with 0 cores when it ended
      timeline.png  per way, the cores each container held over time (stacked) and the runnable
                    threads in all containers (black line, a 1 s mean; gnuplot-nox draws it)
    The last line, when static, outside and mall all ran, is
      mall_vs_static=X.XX mall_vs_outside=Y.YY
    (mall's work/s over the other two ways').

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
{options}

EXIT STATUS
    0 done; 1 a failure (a job failed, a way timed out, not root, no engine, no cpuset
    controller: the reason is printed); 2 a bad option (the message names it); 130 ^C, 143
    SIGTERM (after everything was removed).

ENVIRONMENT
    MALL_BUILD_DIR   the build with malld, mallctl, mallrun, mall_train_digits and
                     mall_train_linear (default build/; built when missing)

NOTES
    Needs root (cgroup cpusets, podman or dockerd as root, a private malld with its cgroup
    backend), podman + runc + conmon (or docker.io), python3, sklearn's digits
    (python3-sklearn), ~1 GiB of memory per memory-bound job (less with --linear-rows) and
    gnuplot for the PNG. All of it is what launch_scripts/install-deps.sh installs. A benchmark,
    not a test: a few minutes on 2 cpus; the figures move with the machine's load.

EXAMPLE
    sudo launch_scripts/bench-containers.sh --out /tmp/ctr && xdg-open /tmp/ctr/timeline.png
"""


@dataclass
class KerasKind(cs.Kind):
    """keras: a Keras model.fit, examples/keras_digits.py, run by python (the venv's) with mall's
    package from the checkout's python/ and the op library from the build's lib/ (all mounted into
    the containers at the same paths). A fixed-size run (static, outside) gets --threads T --no-mall:
    TensorFlow's pools fixed, not malleable. Under mall keras_digits.py takes the most threads as
    --threads MAX (pools of MAX workers, parked down to the allocation at every batch end)."""
    python: str = KERAS_PYTHON
    max_threads_option: str = "--threads"
    on_demand: bool = True   # TensorFlow's start adds seconds to every run

    def command(self, bin_dir: str, steps: int, threads: int | None) -> list[str]:
        lib = os.path.join(os.path.dirname(bin_dir), "lib")
        cmd = ["/usr/bin/env", "PYTHONPATH=" + os.path.join(REPO, "python"),
               "MALL_LIBRARY=" + os.path.join(lib, "libmall.so.0"),
               "MALL_TF_OPS_LIBRARY=" + os.path.join(lib, "libmall_tf_ops.so"), "TF_CPP_MIN_LOG_LEVEL=2",
               self.python, os.path.join(REPO, "examples", self.program), "--steps", str(steps), *self.extra]
        if threads:
            cmd += ["--threads", str(threads), "--no-mall"]
        return cmd

    def check(self, build: str) -> None:
        """Fails with words when the venv's python or the op library is missing."""
        missing = [f for f in (self.python, os.path.join(build, "lib", "libmall_tf_ops.so")) if not os.path.exists(f)]
        if missing:
            cs.fail("the keras kind needs " + " and ".join(missing) + " (launch_scripts/install-deps.sh "
                    "makes the venv; a build with TensorFlow makes the op library: ninja mall_tf_ops; "
                    "MALL_BENCH_PYTHON names another Python)")


@dataclass
class Container:
    """One job's container while it runs."""
    job: cs.Job
    proc: subprocess.Popen   # the engine client (static, outside) or mallrun (mall)
    name: str                # the container's name
    parent: str              # the absolute cpuset folder it is created in (its --cgroup-parent)
    guaranteed: list[int]    # admission's MIN cores
    cpus: list[int] = field(default_factory=list)     # static, outside: the cpus it should have
    applied: list[int] = field(default_factory=list)  # outside: the cpus its cgroup was given
    resize_failures: int = 0
    folder: str | None = None    # its own cgroup folder, once seen
    seen_running: bool = False   # its folder held processes at some sample
    ended: float | None = None   # when its processes were seen gone (scenario clock)


@dataclass
class Way:
    way: str
    ends: dict[str, float] = field(default_factory=dict)
    # (t, job, cores, cpus, threads, runnable), one per sample of a running container; 0s at its end
    samples: list[tuple[float, str, int, str, int, int]] = field(default_factory=list)
    node: list[tuple[float, int]] = field(default_factory=list)  # (t, runnable threads on the node)
    resize_ms: list[float] = field(default_factory=list)         # outside: each update's wall time

    def makespan(self) -> float:
        return max(self.ends.values())

    def ratios(self) -> list[float]:
        return [r / c for _, _, c, _, n, r in self.samples if c > 0 and n > 0]


def cpulist(text: str) -> list[int]:
    cpus = []
    for part in text.strip().split(","):
        if "-" in part:
            a, b = part.split("-")
            cpus += range(int(a), int(b) + 1)
        elif part:
            cpus.append(int(part))
    return cpus


def cpustr(cpus: list[int]) -> str:
    return ",".join(map(str, sorted(cpus)))


def read_text(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def equal_split(order: list[str], mins: dict[str, int], maxs: dict[str, int], ncpu: int) -> dict[str, int]:
    """mall's equal policy in numbers: each job its MIN, then the rest one core at a time to the
    jobs below their MAX, in arrival order."""
    counts = {n: mins[n] for n in order}
    left = ncpu - sum(counts.values())
    while left > 0:
        grown = False
        for n in order:
            if left > 0 and counts[n] < maxs[n]:
                counts[n] += 1
                left -= 1
                grown = True
        if not grown:
            break
    return counts


def place(counts: dict[str, int], current: dict[str, list[int]], ncpu: int) -> dict[str, list[int]]:
    """Cpus for the counts, moving as few as possible: a job keeps its lowest cpus, then takes free ones."""
    new = {n: sorted(current.get(n, []))[:c] for n, c in counts.items()}
    free = sorted(set(range(ncpu)) - {c for cpus in new.values() for c in cpus})
    for n, c in counts.items():
        while len(new[n]) < c:
            new[n].append(free.pop(0))
    return new


class ContainerBench(cs.Bench):
    def __init__(self, args: argparse.Namespace):
        self.kit = os.environ["MALL_BENCH_KIT"]
        self.ctr_dir = os.environ["CTR_DIR"]
        self.ctr_cgroup = os.environ["CTR_CGROUP"]
        self.ctr_prefix = os.environ["CTR_PREFIX"]
        self.engine = os.environ["MALL_BENCH_ENGINE"]
        self.engine_bin = os.environ["MALL_BENCH_ENGINE_BIN"]
        self.cg_kind, self.cg_mount = os.environ["MALL_BENCH_CPUSET"].split(" ", 1)
        with open(os.environ["MALL_BENCH_RUN_ARGS"], "rb") as f:
            self.run_args = [a.decode() for a in f.read().split(b"\0")[:-1]]
        if "--name" not in self.run_args:
            cs.fail(f"MALL_BENCH_RUN_ARGS holds no --name: {self.run_args}")
        super().__init__(args, tempfile.mkdtemp(prefix="bench.", dir=self.ctr_dir))
        self.kinds["keras"] = KerasKind("keras", "keras_digits.py", 512, "images_per_s",
                                        ["--batch", "512", "--hidden", "1024", "--print-every", "0"], 200,
                                        ["#6a1b9a", "#9c4dcc", "#c48be0", "#e3c6f0"])
        self.cgroup_parent = f"mall_bench_containers{os.getpid()}"  # malld's folders (one name)
        self.backend = "auto"   # root and a cpuset controller: the wrapper checked
        self.names: list[str] = []  # every container started, for the clean-up

    def calibrate(self, jobs: list[cs.Job]) -> None:
        """bench-cosched's (keras only when a job uses it), after checking that keras can run then."""
        if any(j.kind.name == "keras" for j in jobs):
            self.kinds["keras"].check(self.args.build)
        super().calibrate(jobs)

    # -- the kit and the engine -----------------------------------------------------------------
    def kit_call(self, *words: str) -> None:
        result = subprocess.run(["bash", "-c", '. "$1" && shift && "$@"', "bash", self.kit, *words],
                                capture_output=True, text=True, timeout=60)
        if result.returncode != 0:
            cs.fail(f"container kit: {' '.join(words)} failed: {result.stderr.strip()}")

    def engine_cmd(self, *words: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """The engine with the kit's private state; a hang is an error (status 124), not a stall."""
        try:
            return subprocess.run([self.engine_bin, *words], capture_output=True, text=True, timeout=timeout,
                                  start_new_session=True)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(words, 124, "", f"timed out after {timeout:.0f} s")

    def container_name(self, way: str, job: cs.Job) -> str:
        return f"{self.ctr_prefix}-{way}-{re.sub('[^a-z0-9_.-]', '-', job.name.lower())}"

    def run_words(self, name: str) -> list[str]:
        words = list(self.run_args)
        words[words.index("--name") + 1] = name
        return words

    def cleanup(self) -> None:
        """Containers first (rm -f: no grace time), then the clients, malld and the temp folder."""
        if self.names:
            force = ["rm", "--force", "--ignore", "--time", "0"] if self.engine == "podman" else ["rm", "--force"]
            try:
                self.engine_cmd(*force, *self.names, timeout=60)
            except OSError:
                pass
        super().cleanup()
        for mount in cgroup_mounts():  # runc makes malld's parent in every hierarchy
            remove_tree(os.path.join(mount, self.cgroup_parent))

    # -- one way --------------------------------------------------------------------------------
    def launch(self, way: str, job: cs.Job, cpus: list[int], sock: str | None) -> Container:
        name = self.container_name(way, job)
        out = os.path.join(self.tmp, f"{way}-{job.name}.out")
        self.names.append(name)
        if way == "mall":
            cmd = [os.path.join(self.bin, "mallrun"), "--socket", sock, "--container",
                   f"--malleable={job.min_cores}:{job.max_cores}", "--job", job.name, "--require", "--",
                   self.engine_bin, "run", "--rm", *self.run_words(name),
                   *job.kind.mall_command(self.bin, job.steps, job.max_cores)]
            parent = os.path.join(self.cg_mount, self.cgroup_parent, f"job_{job.name}")
        else:
            rel = f"{self.ctr_cgroup}/{way}-{re.sub('[^A-Za-z0-9_.-]', '-', job.name)}"
            self.kit_call("ctr_cgroup_make", rel)
            # static: sized to its cores; outside: sized for the node, whatever its cpuset becomes
            threads = len(cpus) if way == "static" else self.ncpu
            cmd = [self.engine_bin, "run", "--rm", f"--cgroup-parent={rel}", f"--cpuset-cpus={cpustr(cpus)}",
                   *self.run_words(name), *job.kind.command(self.bin, job.steps, threads)]
            parent = self.cg_mount + rel
        return Container(job, self.spawn(cmd, out), name, parent, [], list(cpus), list(cpus))

    def resize(self, c: Container, result: Way) -> None:
        """outside: bring a container's cpuset to c.cpus without telling the app. A container that
        is still being created (no cgroup yet) is tried again at the next tick."""
        if set(c.cpus) == set(c.applied):
            return
        started = time.monotonic()
        error = "its cgroup folder is not there yet"
        if self.args.resize_by == "cgroup":
            if self.find_folder(c):
                try:
                    with open(os.path.join(c.folder, "cpuset.cpus"), "w") as f:
                        f.write(cpustr(c.cpus))
                    error = ""
                except OSError as e:
                    error = f"writing {c.folder}/cpuset.cpus: {e}"
        else:
            r = self.engine_cmd("update", f"--cpuset-cpus={cpustr(c.cpus)}", c.name)
            error = "" if r.returncode == 0 else f"{self.engine} update: {r.stderr.strip()}"
        if not error:
            result.resize_ms.append((time.monotonic() - started) * 1000)
            c.applied = list(c.cpus)
        elif c.seen_running and c.proc.poll() is None and self.alive(c):
            c.resize_failures += 1
            if c.resize_failures >= 3:
                cs.fail(f"outside: cannot move {c.name} to cpus {cpustr(c.cpus)}: {error}")

    def find_folder(self, c: Container) -> bool:
        """The container's own cgroup folder: the one below its parent that is not conmon's."""
        if c.folder is None:
            try:
                subs = [d for d in os.listdir(c.parent)
                        if d != "conmon" and os.path.isdir(os.path.join(c.parent, d))]
            except OSError:
                subs = []
            if subs:
                c.folder = os.path.join(c.parent, subs[0])
        return c.folder is not None

    def read_malld_ends(self, path: str) -> None:
        """Jobs malld ended, from the complete lines `mallctl watch --json` wrote since last time."""
        try:
            with open(path, "rb") as f:
                f.seek(self.events_at)
                data = f.read()
        except OSError:
            return
        complete = data[:data.rfind(b"\n") + 1]
        self.events_at += len(complete)
        for line in complete.splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and event.get("event") == "end":
                self.malld_ended.add(event.get("job"))

    def alive(self, c: Container) -> bool:
        """The container's cgroup holds processes."""
        if not self.find_folder(c):
            return False
        procs = read_text(os.path.join(c.folder, "cgroup.procs"))
        return bool(procs and procs.split())

    def observe(self, c: Container) -> tuple[int, str, int, int] | None:
        """(cores, cpus, threads, runnable) of a running container; None before it runs or once
        its processes are gone."""
        if not self.find_folder(c):
            return None
        procs = read_text(os.path.join(c.folder, "cgroup.procs"))
        if not procs or not procs.split():
            return None
        eff = read_text(os.path.join(c.folder, "cpuset.effective_cpus" if self.cg_kind == "v1"
                                     else "cpuset.cpus.effective")) or ""
        threads = runnable = 0
        for pid in procs.split():
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tids:
                stat = read_text(f"/proc/{pid}/task/{tid}/stat")
                if not stat:
                    continue
                threads += 1
                if stat.rsplit(")", 1)[1].split()[0] == "R":
                    runnable += 1
        if threads == 0:
            return None
        return len(cpulist(eff)), eff.strip(), threads, runnable

    def run_way(self, way: str, jobs: list[cs.Job]) -> Way:
        result = Way(way)
        sock = self.start_malld(self.args.policy) if way == "mall" else None
        if sock:  # malld's event stream: a job's cores are free for admission once malld ended it
            events = os.path.join(self.tmp, "watch-mall.jsonl")
            self.spawn([os.path.join(self.bin, "mallctl"), "--socket", sock, "watch", "--json"], events)
            self.events_at, self.malld_ended = 0, set()
            time.sleep(0.2)
        pending = list(jobs)
        running: dict[str, Container] = {}   # admitted, processes not yet seen gone
        finishing: dict[str, Container] = {}  # processes gone; client not yet exited or cores not yet free
        free = list(range(self.ncpu))         # admission: cores not guaranteed to anyone
        step = self.args.sample_ms / 1000
        t0 = time.monotonic()
        deadline = t0 + self.args.timeout
        next_sample = 0.0
        while pending or running or finishing:
            now = time.monotonic() - t0
            if time.monotonic() > deadline:
                cs.fail(f"way {way} did not finish within --timeout {self.args.timeout:.0f} s")
            changed = False
            # Ends: the container's processes are gone (or its client exited).
            for name, c in list(running.items()):
                if c.proc.poll() is None and self.alive(c):
                    c.seen_running = True
                    continue
                if c.proc.poll() is None and not c.seen_running:
                    continue  # still starting
                c.ended = now
                result.ends[name] = now
                result.samples.append((now, name, 0, "", 0, 0))
                finishing[name] = running.pop(name)
                changed = True
            if sock:
                self.read_malld_ends(events)
            for name, c in list(finishing.items()):
                # Its guaranteed cores go back once its owner knows the container ended: at once
                # for static and outside (this driver), when malld ended the job for mall.
                if c.guaranteed and (not sock or name in self.malld_ended):
                    free = sorted(free + c.guaranteed)
                    c.guaranteed = []
                if c.proc.poll() is None or c.guaranteed:
                    if now - c.ended > 60:
                        cs.fail(f"{way}: {c.name} " + ("did not end in malld" if c.guaranteed else
                                                       "(its client) did not exit") + " 60 s after its processes ended")
                    continue
                out = self.read(f"{way}-{name}.out")
                if c.proc.returncode != 0:
                    cs.fail(f"{way}: container {c.name} (job {name}) exited with {c.proc.returncode}:\n{out}")
                cs.parse_done(out, c.job.kind.rate_field)  # it trained to the end
                del finishing[name]
            # Admissions, in arrival order while the guaranteed cores fit.
            admitted = []
            while pending and pending[0].arrival <= now and len(free) >= pending[0].min_cores:
                job = pending.pop(0)
                guaranteed, free = free[:job.min_cores], free[job.min_cores:]
                admitted.append((job, guaranteed))
            if way == "outside" and (admitted or changed):
                # The equal split over running + admitted containers, shrinks before the newcomers
                # start and before anyone grows (a cpu is never given twice).
                order = [n for n in running] + [j.name for j, _ in admitted]
                jobs_by = {**{n: c.job for n, c in running.items()}, **{j.name: j for j, _ in admitted}}
                counts = equal_split(order, {n: jobs_by[n].min_cores for n in order},
                                     {n: jobs_by[n].max_cores for n in order}, self.ncpu)
                target = place(counts, {n: c.cpus for n, c in running.items()}, self.ncpu)
                for n, c in running.items():
                    c.cpus = target[n]
                for c in running.values():
                    if set(c.cpus) < set(c.applied):
                        self.resize(c, result)
                for job, guaranteed in admitted:
                    running[job.name] = self.launch(way, job, target[job.name], sock)
                    running[job.name].guaranteed = guaranteed
            if way == "outside":  # growth, and whatever could not be applied yet
                for c in running.values():
                    self.resize(c, result)
            else:
                for job, guaranteed in admitted:
                    running[job.name] = self.launch(way, job, guaranteed, sock)
                    running[job.name].guaranteed = guaranteed
            for job, _ in admitted:
                result.ends[job.name] = float("inf")
            # Samples: cores, threads and runnable threads of every running container.
            now = time.monotonic() - t0
            if now >= next_sample:
                total = 0
                for name, c in running.items():
                    seen = self.observe(c)
                    if seen is None:
                        continue
                    cores, cpus, threads, runnable = seen
                    result.samples.append((now, name, cores, cpus, threads, runnable))
                    total += runnable
                result.node.append((now, total))
                next_sample = now + step
            time.sleep(max(0.0, min(0.05, next_sample - (time.monotonic() - t0))))
        if sock:
            self.stop_malld()
        return result

    # -- reports --------------------------------------------------------------------------------
    def report(self, jobs: list[cs.Job], results: dict[str, Way]) -> None:
        work = sum(j.work for j in jobs)
        rows = {}
        for way, r in results.items():
            makespan = r.makespan()
            mean = sum(r.ends[j.name] - j.arrival for j in jobs) / len(jobs)
            ratios = r.ratios()
            rows[way] = (makespan, mean, work / makespan, sum(ratios) / len(ratios) if ratios else float("nan"),
                         max(ratios, default=float("nan")))
        base = {w: rows[w][2] for w in ("static", "outside") if w in rows}
        print(f"\n{'way':<8} {'makespan_s':>10} {'mean_job_s':>10} {'work/s':>7} {'vs_static':>9} "
              f"{'vs_outside':>10} {'rq/core_mean':>12} {'rq/core_peak':>12}")
        for way, (makespan, mean, rate, rq_mean, rq_peak) in rows.items():
            vs_static = rate / base["static"] if "static" in base else float("nan")
            vs_outside = rate / base["outside"] if "outside" in base else float("nan")
            print(f"{way:<8} {makespan:10.2f} {mean:10.2f} {rate:7.3f} {vs_static:9.2f} {vs_outside:10.2f} "
                  f"{rq_mean:12.2f} {rq_peak:12.2f}")
        print(f"(work/s: one-core seconds of work finished per second of makespan, at most {self.ncpu}; "
              "rq/core: runnable threads per allotted core, sampled every "
              f"{self.args.sample_ms} ms in each running container)")
        if "outside" in results:
            ms = results["outside"].resize_ms
            how = (f"{self.engine} update --cpuset-cpus" if self.args.resize_by == "update"
                   else "writes of the container's cpuset.cpus")
            if ms:
                print(f"outside: {len(ms)} resize{'' if len(ms) == 1 else 's'} by {how}: "
                      f"{sum(ms) / len(ms):.1f} ms each on average, {max(ms):.1f} ms at most "
                      "(wall time of each; the app was never told)")
            else:
                print(f"outside: no resize was needed (every change of the split came with a start or an end)")
        os.makedirs(self.args.out, exist_ok=True)
        with open(os.path.join(self.args.out, "summary.csv"), "w", newline="") as f:
            w = csv.writer(f, lineterminator="\n")
            w.writerow(["way", "makespan_s", "mean_completion_s", "work_per_s", "vs_static", "vs_outside",
                        "runnable_per_core_mean", "runnable_per_core_peak", "resizes", "resize_ms_mean"])
            for way, (makespan, mean, rate, rq_mean, rq_peak) in rows.items():
                ms = results[way].resize_ms
                w.writerow([way, f"{makespan:.3f}", f"{mean:.3f}", f"{rate:.4f}",
                            f"{rate / base['static']:.4f}" if "static" in base else "",
                            f"{rate / base['outside']:.4f}" if "outside" in base else "",
                            f"{rq_mean:.3f}", f"{rq_peak:.3f}", len(ms),
                            f"{sum(ms) / len(ms):.2f}" if ms else ""])
        with open(os.path.join(self.args.out, "timeline.csv"), "w", newline="") as f:
            w = csv.writer(f, lineterminator="\n")
            w.writerow(["way", "time_s", "job", "kind", "cores", "cpus", "threads", "runnable"])
            kinds = {j.name: j.kind.name for j in jobs}
            for way, r in results.items():
                for t, job, cores, cpus, threads, runnable in sorted(r.samples, key=lambda s: s[0]):
                    w.writerow([way, f"{t:.2f}", job, kinds[job], cores, cpus, threads, runnable])
        self.plot(jobs, results, rows)
        print(f"wrote {self.args.out}/summary.csv and timeline.csv"
              + (" and timeline.png" if os.path.exists(os.path.join(self.args.out, "timeline.png")) else ""))
        if all(w in rows for w in WAYS):
            print(f"mall_vs_static={rows['mall'][2] / rows['static'][2]:.2f} "
                  f"mall_vs_outside={rows['mall'][2] / rows['outside'][2]:.2f}")

    def plot(self, jobs: list[cs.Job], results: dict[str, Way], rows: dict) -> None:
        """Per way: stacked cores per container over time, and the node's runnable threads."""
        gnuplot = shutil.which("gnuplot")
        if not gnuplot:
            print(f"{PROG}: gnuplot not found: no timeline.png (apt-get install gnuplot-nox)")
            return
        names = [j.name for j in jobs]
        colours = cs.job_colours(jobs)
        end = max(r.makespan() for r in results.values())
        # One y range for every panel, so that the ways compare at a glance.
        top = max([self.ncpu] + [n for r in results.values() for _, n in r.node])
        script = [f"set terminal pngcairo size 1100,{260 * len(results) + 60} font ',9'",
                  f"set output '{os.path.join(self.args.out, 'timeline.png')}'",
                  f"set multiplot layout {len(results)},1 title 'mall container benchmark: cores per container "
                  f"(stacked) and runnable threads in them (black), {self.ncpu} cpus, {self.engine}; "
                  "dense = blue, small kernels = green, memory-bound = orange'",
                  f"set xrange [0:{end * 1.02:.2f}]", "set xlabel 'seconds'", "set key outside right",
                  "set style fill solid 0.85 noborder"]
        for way, r in results.items():
            block = f"$cores_{way}"
            # Cores from each sample on; a container's first sample starts its area.
            lines, stacked = cs.stacked_block(block, [(t, job, cores) for t, job, cores, *_ in r.samples], names, end)
            script += lines
            # The node's runnable threads, a trailing mean over 1 s (the raw samples jump by one
            # thread every sample; timeline.csv has them).
            window = max(1, round(1000 / self.args.sample_ms))
            script.append(f"$rq_{way} << EOD")
            script += [f"{t:.3f} {sum(n for _, n in r.node[max(0, i - window + 1):i + 1]) / min(i + 1, window):.2f}"
                       for i, (t, _) in enumerate(r.node)] or ["0 0"]
            script.append("EOD")
            top = max(top, stacked)
            _, _, _, rq_mean, rq_peak = rows[way]
            what = {"static": "fixed cpusets", "outside": f"cpusets moved from outside ({self.args.resize_by})",
                    "mall": f"mall, policy {self.args.policy}"}[way]
            script += [f"set title '{way}: {what}; runnable threads per allotted core: mean {rq_mean:.2f}, "
                       f"peak {rq_peak:.2f}'", "set ylabel 'cores / threads'", f"set yrange [0:{top + 0.5}]",
                       f"set arrow 1 from graph 0, first {self.ncpu} to graph 1, first {self.ncpu} nohead dt 2"]
            plots = [f"{block} using 1:{i + 2}:{i + 3} with filledcurves lc rgb '{colours[n]}' title '{n}'"
                     for i, n in enumerate(names)]
            plots.append(f"$rq_{way} using 1:2 with lines lw 1.5 lc rgb 'black' title 'runnable threads (1 s mean)'")
            script.append("plot " + ", ".join(plots))
        script.append("unset multiplot")
        result = subprocess.run([gnuplot], input="\n".join(script) + "\n", capture_output=True, text=True)
        if result.returncode != 0:
            print(f"{PROG}: gnuplot failed, no timeline.png:\n{result.stderr}")

    def run(self) -> None:
        print(f"{PROG}: {self.ncpu} cpus, {self.engine} containers, cgroup {self.cg_kind} cpusets; "
              f"mall way: policy {self.args.policy}; outside way: "
              f"{'`' + self.engine + ' update --cpuset-cpus`' if self.args.resize_by == 'update' else 'cpuset.cpus writes'}; "
              f"results in {self.args.out}/", flush=True)
        jobs = self.prepared_jobs(", on the host", "containers")
        results = {}
        for way in self.args.ways:
            started = time.monotonic()
            print(f"  {way:<8} running ...", flush=True)
            results[way] = self.run_way(way, jobs)
            r = results[way]
            ratios = r.ratios()
            print(f"  {way:<8} makespan {r.makespan():7.2f} s, runnable per core "
                  f"{sum(ratios) / max(1, len(ratios)):.2f} (ran {time.monotonic() - started:.1f} s)", flush=True)
        self.report(jobs, results)


def cgroup_mounts() -> list[str]:
    mounts = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            before, _, after = line.partition(" - ")
            if after.split(" ", 1)[0] in ("cgroup", "cgroup2"):
                mounts.append(before.split()[4])
    return mounts


def remove_tree(path: str) -> None:
    """rmdir a cgroup folder and its subfolders, deepest first (their processes are gone)."""
    if not os.path.isdir(path):
        return
    for root, dirs, _ in os.walk(path, topdown=False):
        for d in dirs:
            try:
                os.rmdir(os.path.join(root, d))
            except OSError:
                pass
    try:
        os.rmdir(path)
    except OSError:
        pass


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, argparse.ArgumentParser]:
    parser = argparse.ArgumentParser(
        prog=PROG, usage="%(prog)s [OPTIONS]", add_help=False,
        formatter_class=lambda prog: argparse.HelpFormatter(prog, width=100, max_help_position=32))
    parser.add_argument("-h", "--help", action="store_true", help="show this manual and exit")
    parser.add_argument("--build", required=True, help=argparse.SUPPRESS)
    parser.add_argument("--preflight", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ways", metavar="LIST", default=",".join(WAYS),
                        help="comma-separated subset of static,outside,mall, run in that order (default: all)")
    parser.add_argument("--engine", choices=("podman", "docker"), default="podman",
                        help="the container engine: podman (default) or docker (a private dockerd is started "
                        "for the run, ~1 s more)")
    parser.add_argument("--policy", choices=("equal", "throughput"), default="equal",
                        help="malld's policy in the mall way (default equal: the same split the outside way applies)")
    parser.add_argument("--resize-by", choices=("update", "cgroup"), default="update",
                        help="how the outside way moves cpusets: update (default: `podman update --cpuset-cpus` / "
                        "`docker update --cpuset-cpus`, what an operator or the research's co-scheduler runs) or "
                        "cgroup (writes the container's cpuset.cpus directly)")
    parser.add_argument("--cpus", type=int, metavar="N", default=os.cpu_count() or 1,
                        help="cpus of the node to use, 0..N-1 (default: all online, %(default)s)")
    parser.add_argument("--work-scale", type=float, metavar="X", default=1.0,
                        help="multiplies every job's work and arrival time: 0.5 halves the run, 0.05 is a "
                        "smoke run (default 1: about a minute per way on 2 cpus)")
    parser.add_argument("--mix", choices=list(MIXES), default="spaced", metavar="MIX",
                        help="the built-in mix, per 2 cpus: spaced (default: a long dense run, 60 one-core s, "
                        "and short jobs of 6 arriving at 0 s (small), 14 s (linear) and 28 s (small)), or "
                        "bench-cosched.sh's long-dense (short jobs at 0, 8 and 16 s: they queue back to back "
                        "here) or long-small (the long run has small kernels); or keras: spaced with a long "
                        "Keras model.fit (kind keras) instead of the dense run")
    parser.add_argument("--scenario", metavar="CSV", help="a CSV of jobs instead of the mix (--work-scale applies): "
                        "name,kind,arrival_s,work_core_s,min,max (kind dense|small|linear|keras; empty max = all cpus)")
    parser.add_argument("--linear-rows", type=int, metavar="R",
                        help="dataset rows of each memory-bound job, 1 KiB each (default 1048576 = 1 GiB, less "
                        "when two per 2 cpus would not fit in half the available memory)")
    parser.add_argument("--linear-batch", type=int, metavar="R", default=1 << 16,
                        help="rows per step of the memory-bound jobs (default %(default)s)")
    parser.add_argument("--sample-ms", type=int, metavar="MS", default=100,
                        help="how often the running containers' threads are sampled, 20..1000 ms (default 100)")
    parser.add_argument("--out", metavar="DIR", default="bench-containers-out",
                        help="folder for summary.csv, timeline.csv and timeline.png (default %(default)s)")
    parser.add_argument("--timeout", type=float, metavar="S", default=900,
                        help="seconds one way may take before the run fails (default %(default)s)")
    args = parser.parse_args(argv)
    if args.help:
        return args, parser
    args.build = os.path.abspath(args.build)  # the containers see it at the same absolute path
    args.ways = [w.strip() for w in args.ways.split(",") if w.strip()]
    bad = [w for w in args.ways if w not in WAYS]
    if bad or not args.ways or len(set(args.ways)) != len(args.ways):
        parser.error(f"--ways: {'unknown ' + ','.join(bad) if bad else 'empty or repeated'}; "
                     f"choose from {','.join(WAYS)}")
    online = os.cpu_count() or 1
    if not 1 <= args.cpus <= online:
        parser.error(f"--cpus must be 1..{online}")
    if not args.work_scale > 0:
        parser.error("--work-scale must be > 0")
    if args.linear_batch < 64:
        parser.error("--linear-batch must be >= 64")
    if not 20 <= args.sample_ms <= 1000:
        parser.error("--sample-ms must be 20..1000")
    if not args.timeout > 0:
        parser.error("--timeout must be > 0")
    if args.linear_rows is None:
        args.linear_rows = cs.default_linear_rows(args.cpus)
    if args.linear_rows < args.linear_batch * 16 // 15 + 1:
        parser.error("--linear-rows must exceed --linear-batch by the held-out 1/16")
    if args.scenario and not os.path.isfile(args.scenario):
        parser.error(f"--scenario: no file {args.scenario}")
    return args, parser


def manual(parser: argparse.ArgumentParser) -> str:
    options = parser.format_help().split("options:\n", 1)[1].rstrip()
    return MANUAL.format(options=options)


def main() -> int:
    args, parser = parse_args()
    if args.help:
        print(manual(parser), end="")
        return 0
    if args.preflight:  # the wrapper's check before it sets anything up: options done, now the rest
        if os.geteuid() != 0:
            print(f"{PROG}: needs root (cgroup cpusets, {args.engine} as root, a private malld): "
                  "run it with sudo", file=sys.stderr)
            return 1
        print(args.engine)
        return 0
    if "CTR_DIR" not in os.environ:
        print(f"{PROG}: run launch_scripts/bench-containers.sh, not this driver", file=sys.stderr)
        return 1
    # Started in the background by the wrapper: SIGINT was ignored, take ^C again.
    return bench_cleanup.run_with_cleanup(PROG, lambda: ContainerBench(args), restore_sigint=True)


if __name__ == "__main__":
    sys.exit(main())
