#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""bench_cosched.py — the co-scheduling benchmark behind launch_scripts/bench-cosched.sh (run that).

Replays one scenario of real training jobs arriving on this node four ways, one after the other.
The jobs are of three kinds: `dense` (mall_train_digits with large kernels: compute-bound),
`small` (mall_train_digits with small kernels: many short parallel regions, bound by their
synchronisation, so it scales poorly) and `linear` (mall_train_linear: memory-bound). The ways:
  static      each job pinned (taskset) to its guaranteed cores only, sized to them
  oversub     no mall: every job sized for the whole node, unpinned (Eigen's stock pool)
  equal       mall: a private malld with --policy equal, jobs under mallrun --malleable=MIN:NCPU
  throughput  the same with --policy throughput
Every way admits jobs by the same rule a batch scheduler would: a job starts when it arrives and
the running jobs' guaranteed (MIN) cores leave room for its own. Work is counted in core-seconds:
a job's steps divided by its kind's one-core step rate, measured first (calibration).

Prints a table (makespan, mean completion, work per second, ratios), writes timeline.csv (cores
or threads per job over time, for each way), summary.csv and, when gnuplot is present,
timeline.png. Last line: throughput_vs_static=X.XX throughput_vs_oversub=Y.YY.
Everything it starts (malld, jobs, cgroups, temp folder) is stopped and removed, also on Ctrl-C.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import bench_cleanup  # run, then always clean up, also on SIGTERM or ^C (beside this file)

PROG = "bench-cosched.sh"
# Built-in mixes, per 2 cpus: (kind, arrival s, work in one-core s). In both a long training run
# shares the node with short jobs that come and go, so cores fall idle between and after them.
MIXES = {
    # The long run scales (dense): lending it the idle cores pays.
    "long-dense": [("dense", 0.0, 40.0), ("small", 0.0, 6.0), ("linear", 8.0, 6.0), ("small", 16.0, 6.0)],
    # The long run scales poorly (small kernels): lending it cores slows it down; the short ones scale.
    "long-small": [("small", 0.0, 40.0), ("dense", 0.0, 6.0), ("linear", 8.0, 6.0), ("dense", 16.0, 6.0)],
    # The long run leaves its cores idle inside each step (it waits for its input): a static split
    # and mall's exclusive cores leave that time unused, oversubscription gives it to the others.
    "long-waiting": [("waiting", 0.0, 40.0), ("dense", 0.0, 6.0), ("waiting", 8.0, 6.0), ("dense", 16.0, 6.0)],
}
WAYS = ("static", "oversub", "equal", "throughput")


def fail(message: str) -> None:
    raise SystemExit(f"{PROG}: {message}")


@dataclass
class Kind:
    name: str            # dense | small | linear
    program: str         # executable name under bin/
    batch: int           # items per step (images, rows)
    rate_field: str      # the "done" line's items-per-second field
    extra: list[str]     # options every run of the kind gets
    calibration_steps: int        # about 2 s on one core here
    shades: list[str]    # plot colours, one per job of the kind in turn
    stock_pool: bool = False      # outside mall it runs on Eigen's own ThreadPool (--pool eigen)
    max_threads_option: str = "--max-threads"  # how a run under mall takes the most threads it may get
    on_demand: bool = False       # calibrated only when a job of the scenario uses it
    steps_per_s_1: float = 0.0    # measured: one core
    steps_per_s_n: float = 0.0    # measured: every core

    def command(self, bin_dir: str, steps: int, threads: int | None) -> list[str]:
        """threads None: under mall (the parked pool follows malld); else a fixed-size run."""
        cmd = [os.path.join(bin_dir, self.program), "--steps", str(steps), "--quiet", *self.extra]
        if threads:
            cmd += ["--threads", str(threads)] + (["--pool", "eigen"] if self.stock_pool else [])
        return cmd

    def mall_command(self, bin_dir: str, steps: int, max_threads: int) -> list[str]:
        """A run under mall that may grow to max_threads (its pool sized so, parked down to the allocation)."""
        return self.command(bin_dir, steps, None) + [self.max_threads_option, str(max_threads)]


@dataclass
class Job:
    name: str
    kind: Kind
    arrival: float       # seconds after the scenario starts
    work: float          # core-seconds (steps / one-core step rate)
    min_cores: int
    max_cores: int
    steps: int = 0


@dataclass
class WayResult:
    way: str
    ends: dict[str, float] = field(default_factory=dict)  # job -> when it ended (s); started jobs only
    samples: list[tuple[float, str, int, str]] = field(default_factory=list)  # t, job, cores, cpus

    def makespan(self) -> float:
        return max(self.ends.values())


def parse_done(text: str, field_name: str) -> float:
    for line in text.splitlines():
        words = line.split()
        if words[:1] == ["done"] and field_name in words:
            return float(words[words.index(field_name) + 1])
    raise ValueError(f"no 'done ... {field_name} <value>' line in:\n{text}")


class Bench:
    def __init__(self, args: argparse.Namespace, tmp: str | None = None):
        """tmp: an existing folder to work in (removed by cleanup); default a new one in /tmp."""
        self.args = args
        self.bin = os.path.join(args.build, "bin")
        self.ncpu = args.cpus
        self.tmp = tmp or tempfile.mkdtemp(prefix="mall-bench-cosched.")
        self.procs: list[subprocess.Popen] = []
        self.malld: subprocess.Popen | None = None
        self.cgroup_parent = f"mall_bench_cosched{os.getpid()}"
        # As root malld decides (--backend auto: a cgroup-v1 or cgroup-v2 cpuset where one is
        # usable, else thread affinity) and says which in its status; without root, affinity.
        self.backend = "auto" if os.geteuid() == 0 else "affinity"
        self.enforcement: str | None = None  # what malld reported it uses
        self.kinds = {
            "dense": Kind("dense", "mall_train_digits", 512, "images_per_s",
                          ["--batch", "512", "--hidden", "1024", "--print-every", "0"], 250,
                          ["#1f4e9c", "#3b7dd8", "#6fa8f0", "#a9cdf7"], stock_pool=True),
            "small": Kind("small", "mall_train_digits", 128, "images_per_s",
                          ["--batch", "128", "--hidden", "256", "--print-every", "0"], 4000,
                          ["#2e7d32", "#5fae55", "#97d18b", "#c8e9bf"], stock_pool=True),
            # dense, but each step first waits 4 ms for its batch (--input-wait-us): about a third of
            # its step on one core, two thirds on two, its cores idle meanwhile.
            "waiting": Kind("waiting", "mall_train_digits", 512, "images_per_s",
                            ["--batch", "512", "--hidden", "1024", "--print-every", "0",
                             "--input-wait-us", "4000"], 170,
                            ["#6a1b9a", "#9c4dcc", "#c58af0", "#e4c4fa"], stock_pool=True, on_demand=True),
            "linear": Kind("linear", "mall_train_linear", args.linear_batch, "rows_per_s",
                           ["--rows", str(args.linear_rows), "--batch", str(args.linear_batch),
                            "--print-every", "0"], 150,
                           ["#b34700", "#e6761a", "#f5a25d", "#f9c99a"]),
        }

    # -- processes ---------------------------------------------------------------------------
    def spawn(self, cmd: list[str], out_path: str) -> subprocess.Popen:
        out = open(out_path, "w")
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        out.close()
        self.procs.append(proc)
        return proc

    def cleanup(self) -> None:
        """Jobs first (SIGTERM: mallrun deregisters and passes it on; SIGKILL after 5 s), then malld."""
        alive = [p for p in self.procs if p.poll() is None]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for proc in alive:
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 5
            while any(p.poll() is None for p in alive) and time.monotonic() < deadline:
                time.sleep(0.05)
            alive = [p for p in alive if p.poll() is None]
        self.stop_malld()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def start_malld(self, policy: str) -> str:
        sock = os.path.join(self.tmp, f"malld-{policy}.sock")
        state = os.path.join(self.tmp, f"state-{policy}")
        os.makedirs(state, exist_ok=True)
        log = open(os.path.join(self.tmp, f"malld-{policy}.log"), "w")
        self.malld = subprocess.Popen(
            [os.path.join(self.bin, "malld"), "--socket", sock, "--state-dir", state,
             "--cgroup-parent", self.cgroup_parent, "--backend", self.backend, "--policy", policy,
             "--cpus", f"0-{self.ncpu - 1}", "--log-level", "warn"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        for _ in range(100):
            if self.malld.poll() is not None:
                fail(f"malld exited: {self.read(f'malld-{policy}.log')}")
            status = self.mallctl_status(sock)
            if status is not None:
                if self.enforcement is None:
                    self.enforcement = str(status.get("backend", "unknown"))
                    print(f"{PROG}: malld --backend {self.backend} enforces with {self.enforcement}", flush=True)
                return sock
            time.sleep(0.1)
        fail("malld did not answer within 10 s")
        return sock

    def stop_malld(self) -> None:
        if self.malld is not None and self.malld.poll() is None:
            self.malld.send_signal(signal.SIGTERM)
            try:
                self.malld.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.malld.kill()
                self.malld.wait()
        self.malld = None
        # The cgroup parent, and any job folder malld kept: a job whose processes were still ending
        # when malld stopped keeps its folder (malld keeps it for a restart to re-adopt); once its
        # processes are gone the folder is empty. Retried for a few seconds while they finish.
        deadline = time.monotonic() + 5
        for path in (f"/sys/fs/cgroup/cpuset/{self.cgroup_parent}", f"/sys/fs/cgroup/{self.cgroup_parent}"):
            while os.path.isdir(path):  # cgroup v1's cpuset tree, or the v2 tree
                for folder, subfolders, _files in os.walk(path, topdown=False):
                    try:
                        os.rmdir(folder)
                    except OSError:
                        pass
                if not os.path.isdir(path) or time.monotonic() > deadline:
                    break
                time.sleep(0.1)

    def mallctl_status(self, sock: str) -> dict | None:
        result = subprocess.run([os.path.join(self.bin, "mallctl"), "--socket", sock, "status", "--json"],
                                capture_output=True, text=True, timeout=10)
        if result.returncode != 0:
            return None
        try:
            return json.loads(result.stdout)
        except json.JSONDecodeError:
            return None

    def read(self, name: str) -> str:
        try:
            with open(os.path.join(self.tmp, name)) as f:
                return f.read()
        except OSError:
            return ""

    # -- calibration -------------------------------------------------------------------------
    def calibrate(self, jobs: list[Job]) -> None:
        """One-core and all-core step rates of each kind (Eigen's stock pool / fixed threads); an
        on-demand kind only when one of jobs uses it."""
        used = {j.kind.name for j in jobs}
        for kind in self.kinds.values():
            if kind.on_demand and kind.name not in used:
                continue
            rates = []
            steps = max(10, round(kind.calibration_steps * min(1.0, self.args.work_scale)))
            for threads in (1, self.ncpu):
                cmd = ["taskset", "-c", f"0-{threads - 1}", *kind.command(self.bin, steps, threads)]
                result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
                if result.returncode != 0:
                    fail(f"calibration of {kind.program} failed ({result.returncode}):\n{result.stdout}{result.stderr}")
                rates.append(parse_done(result.stdout, kind.rate_field) / kind.batch)
            kind.steps_per_s_1, kind.steps_per_s_n = rates
            print(f"  {kind.name:<7} {kind.program:<18} {kind.steps_per_s_1:9.1f} steps/s on 1 core, "
                  f"{kind.steps_per_s_n:9.1f} on {self.ncpu}: speedup {kind.steps_per_s_n / kind.steps_per_s_1:.2f}",
                  flush=True)

    # -- the scenario ------------------------------------------------------------------------
    def scenario(self) -> list[Job]:
        if self.args.scenario:
            jobs = self.read_scenario(self.args.scenario)
        else:
            # A template for 2 cores, repeated once per 2 cores (offset 1 s each).
            template = MIXES[self.args.mix]
            jobs = []
            for replica in range(max(1, self.ncpu // 2)):
                for index, (kind, arrival, work) in enumerate(template):
                    jobs.append(Job(f"j{replica}{index}-{kind}", self.kinds[kind],
                                    (arrival + replica) * self.args.work_scale, work * self.args.work_scale,
                                    1, self.ncpu))
        for job in jobs:
            if job.min_cores > self.ncpu or job.min_cores > job.max_cores:
                fail(f"job {job.name}: min {job.min_cores} max {job.max_cores} does not fit {self.ncpu} cpus")
        return sorted(jobs, key=lambda j: (j.arrival, j.name))

    def read_scenario(self, path: str) -> list[Job]:
        jobs = []
        try:
            with open(path, newline="") as f:
                for row in csv.DictReader(f):
                    kind = row.get("kind", "").strip()
                    if kind not in self.kinds:
                        fail(f"{path}: kind '{kind}' is not one of {', '.join(self.kinds)}")
                    scale = self.args.work_scale
                    jobs.append(Job(row["name"].strip(), self.kinds[kind], float(row["arrival_s"]) * scale,
                                    float(row["work_core_s"]) * scale, int(row["min"]),
                                    int(row["max"]) if row.get("max", "").strip() else self.ncpu))
        except (OSError, KeyError, ValueError, TypeError, AttributeError) as e:
            fail(f"cannot read the scenario {path}: {e} "
                 "(columns: name,kind,arrival_s,work_core_s,min,max; kind dense|small|waiting|linear)")
        if not jobs:
            fail(f"{path}: no jobs")
        names = [j.name for j in jobs]
        for j in jobs:
            if not re.fullmatch(r"[A-Za-z0-9._:-]{1,64}", j.name) or names.count(j.name) > 1:
                fail(f"{path}: job name '{j.name}' must be unique, 1-64 characters from A-Z a-z 0-9 . _ : -")
            if j.arrival < 0 or not j.work > 0 or j.min_cores < 1:
                fail(f"{path}: job {j.name}: need arrival_s >= 0, work_core_s > 0 and min >= 1")
        return jobs

    # -- one way -----------------------------------------------------------------------------
    def run_way(self, way: str, jobs: list[Job]) -> WayResult:
        result = WayResult(way)
        sock = self.start_malld(way) if way in ("equal", "throughput") else None
        watch = None
        if sock:  # malld's own event stream: every allocation it publishes, with its time
            watch = self.spawn([os.path.join(self.bin, "mallctl"), "--socket", sock, "watch", "--json"],
                               os.path.join(self.tmp, f"watch-{way}.jsonl"))
            time.sleep(0.2)
        wall_t0 = time.time()
        pending = list(jobs)
        running: dict[str, tuple[Job, subprocess.Popen, list[int]]] = {}
        free = list(range(self.ncpu))
        deadline = time.monotonic() + self.args.timeout
        t0 = time.monotonic()
        while pending or running:
            now = time.monotonic() - t0
            if time.monotonic() > deadline:
                fail(f"way {way} did not finish within --timeout {self.args.timeout:.0f} s")
            # Finished jobs give back their guaranteed cores.
            for name, (job, proc, cores) in list(running.items()):
                if proc.poll() is None:
                    continue
                out = self.read(f"{way}-{name}.out")
                if proc.returncode != 0:
                    fail(f"{way}: job {name} exited with {proc.returncode}:\n{out}")
                parse_done(out, job.kind.rate_field)  # it must have trained to the end
                result.ends[name] = now
                result.samples.append((now, name, 0, ""))
                free = sorted(free + cores)
                del running[name]
            # Admission: in arrival order, while the guaranteed cores fit.
            while pending and pending[0].arrival <= now and len(free) >= pending[0].min_cores:
                job = pending.pop(0)
                cores, free = free[:job.min_cores], free[job.min_cores:]
                proc, threads, cpus = self.launch(way, job, cores, sock)
                running[job.name] = (job, proc, cores)
                result.ends[job.name] = float("inf")
                if threads:
                    result.samples.append((now, job.name, threads, cpus))
            time.sleep(0.05)
        if sock:
            self.stop_malld()
            watch.wait(timeout=10)
            self.read_events(f"watch-{way}.jsonl", wall_t0, result)
        return result

    def launch(self, way: str, job: Job, cores: list[int], sock: str | None):
        out = os.path.join(self.tmp, f"{way}-{job.name}.out")
        kind = job.kind
        if way == "static":
            cpus = ",".join(map(str, cores))
            cmd = ["taskset", "-c", cpus, *kind.command(self.bin, job.steps, len(cores))]
            return self.spawn(cmd, out), len(cores), cpus
        if way == "oversub":  # unpinned within the node's cpus (all of them unless --cpus is given)
            cpus = f"0-{self.ncpu - 1}"
            cmd = ["taskset", "-c", cpus, *kind.command(self.bin, job.steps, self.ncpu)]
            return self.spawn(cmd, out), self.ncpu, cpus
        cmd = [os.path.join(self.bin, "mallrun"), "--socket", sock, f"--malleable={job.min_cores}:{job.max_cores}",
               "--job", job.name, "--require", "--",
               *kind.mall_command(self.bin, job.steps, job.max_cores)]
        return self.spawn(cmd, out), 0, ""  # its cores come from malld's events

    def read_events(self, name: str, wall_t0: float, result: WayResult) -> None:
        """Each allocation malld published to a job (cores, cpus) and the moment it saw the job end
        (0 cores: before the cores it freed were published to others), on the scenario's clock."""
        for line in self.read(name).splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue  # the line mallctl prints when malld stops
            job, t = event.get("job"), event.get("time", 0.0) - wall_t0
            if job not in result.ends or t >= result.ends[job]:  # not ours, or after the job ended
                continue
            if event.get("event") == "publish":
                result.samples.append((max(0.0, t), job, int(event.get("ncpus", 0)), event.get("cpus", "")))
            elif event.get("event") == "end":
                result.samples.append((max(0.0, t), job, 0, ""))

    # -- reports -----------------------------------------------------------------------------
    def report(self, jobs: list[Job], results: dict[str, WayResult]) -> None:
        work = sum(j.work for j in jobs)
        rows = {}
        for way, r in results.items():
            makespan = r.makespan()
            mean = sum(r.ends[j.name] - j.arrival for j in jobs) / len(jobs)
            rows[way] = (makespan, mean, work / makespan)
        print(f"\n{'way':<11} {'makespan_s':>10} {'mean_job_s':>10} {'work/s':>8} {'vs_static':>9} {'vs_oversub':>10}")
        for way, (makespan, mean, rate) in rows.items():
            vs_static = rate / rows["static"][2] if "static" in rows else float("nan")
            vs_oversub = rate / rows["oversub"][2] if "oversub" in rows else float("nan")
            print(f"{way:<11} {makespan:10.2f} {mean:10.2f} {rate:8.3f} {vs_static:9.2f} {vs_oversub:10.2f}")
        print("(work/s: core-seconds of one-core work finished per second of makespan; at most "
              f"{self.ncpu} with perfect scaling)")
        os.makedirs(self.args.out, exist_ok=True)
        with open(os.path.join(self.args.out, "summary.csv"), "w", newline="") as f:
            w = csv.writer(f, lineterminator="\n")
            w.writerow(["way", "makespan_s", "mean_completion_s", "work_per_s", "vs_static", "vs_oversub"])
            for way, (makespan, mean, rate) in rows.items():
                w.writerow([way, f"{makespan:.3f}", f"{mean:.3f}", f"{rate:.4f}",
                            f"{rate / rows['static'][2]:.4f}" if "static" in rows else "",
                            f"{rate / rows['oversub'][2]:.4f}" if "oversub" in rows else ""])
        with open(os.path.join(self.args.out, "timeline.csv"), "w", newline="") as f:
            w = csv.writer(f, lineterminator="\n")
            w.writerow(["way", "time_s", "job", "kind", "cores", "cpus"])
            kinds = {j.name: j.kind.name for j in jobs}
            for way, r in results.items():
                for t, job, cores, cpus in sorted(r.samples):
                    w.writerow([way, f"{t:.2f}", job, kinds[job], cores, cpus])
        self.plot(jobs, results)
        print(f"wrote {self.args.out}/summary.csv and timeline.csv"
              + (" and timeline.png" if os.path.exists(os.path.join(self.args.out, "timeline.png")) else ""))
        if "throughput" in rows and "static" in rows and "oversub" in rows:
            print(f"throughput_vs_static={rows['throughput'][2] / rows['static'][2]:.2f} "
                  f"throughput_vs_oversub={rows['throughput'][2] / rows['oversub'][2]:.2f}")

    def plot(self, jobs: list[Job], results: dict[str, WayResult]) -> None:
        """Stacked cores (threads, for oversub) per job over time, one panel per way."""
        gnuplot = shutil.which("gnuplot")
        if not gnuplot:
            print(f"{PROG}: gnuplot not found: no timeline.png (apt-get install gnuplot-nox)")
            return
        names = [j.name for j in jobs]
        colours = job_colours(jobs)
        end = max(r.makespan() for r in results.values())
        script = [f"set terminal pngcairo size 1100,{260 * len(results) + 60} font ',9'",
                  f"set output '{os.path.join(self.args.out, 'timeline.png')}'",
                  f"set multiplot layout {len(results)},1 title 'mall co-scheduling benchmark: cores per job "
                  f"over time ({self.ncpu} cpus; dense = blue, small kernels = green, memory-bound = orange)'",
                  f"set xrange [0:{end * 1.02:.2f}]", "set xlabel 'seconds'", "set key outside right",
                  "set style fill solid 0.85 noborder"]
        for way, r in results.items():
            block = f"$way_{way}"
            lines, top = stacked_block(block, [(t, job, cores) for t, job, cores, _ in r.samples], names, end)
            script += lines
            label = "threads" if way == "oversub" else "cores"
            top = max(self.ncpu, top)
            script += [f"set title '{way}'", f"set ylabel '{label}'", f"set yrange [0:{top + 0.5}]",
                       f"set arrow 1 from graph 0, first {self.ncpu} to graph 1, first {self.ncpu} nohead dt 2"]
            plots = [f"{block} using 1:{i + 2}:{i + 3} with filledcurves lc rgb '{colours[n]}' title '{n}'"
                     for i, n in enumerate(names)]
            script.append("plot " + ", ".join(plots))
        script.append("unset multiplot")
        result = subprocess.run([gnuplot], input="\n".join(script) + "\n", capture_output=True, text=True)
        if result.returncode != 0:
            print(f"{PROG}: gnuplot failed, no timeline.png:\n{result.stderr}")

    def prepared_jobs(self, calibration_where: str = "", what: str = "jobs") -> list[Job]:
        """The scenario (checked before anything runs), calibrated: each job's steps for its work,
        printed with the calibration."""
        jobs = self.scenario()
        print(f"calibration (each kind alone{calibration_where}):", flush=True)
        self.calibrate(jobs)
        for job in jobs:
            job.steps = max(1, round(job.work * job.kind.steps_per_s_1))
        print(f"scenario: {len(jobs)} {what} (work in one-core seconds; MIN:MAX cores)", flush=True)
        for j in jobs:
            print(f"  {j.name:<16} {j.kind.name:<7} arrives {j.arrival:6.1f} s  work {j.work:6.1f}  "
                  f"{j.steps:7d} steps  {j.min_cores}:{j.max_cores}", flush=True)
        return jobs

    def run(self) -> None:
        print(f"{PROG}: {self.ncpu} cpus, malld --backend {self.backend} "
              f"({'malld picks cgroup-v1, cgroup-v2 or affinity and says which' if self.backend == 'auto' else 'not root'}); "
              f"results in {self.args.out}/", flush=True)
        jobs = self.prepared_jobs()
        results = {}
        for way in self.args.ways:
            started = time.monotonic()
            results[way] = self.run_way(way, jobs)
            r = results[way]
            print(f"  {way:<11} makespan {r.makespan():7.2f} s  (ran {time.monotonic() - started:.1f} s)", flush=True)
        self.report(jobs, results)


def job_colours(jobs: list[Job]) -> dict[str, str]:
    """A plot colour per job: its kind's shades in turn."""
    colours, counters = {}, {}
    for j in jobs:
        n = counters.get(j.kind.name, 0)
        colours[j.name] = j.kind.shades[n % len(j.kind.shades)]
        counters[j.kind.name] = n + 1
    return colours


def stacked_block(block: str, samples: list[tuple[float, str, int]], names: list[str],
                  end: float) -> tuple[list[str], int]:
    """A gnuplot data block (lines) of step-shaped stacked series from samples (time, job, value:
    the value a job holds from that time on): per row the time, then each job's lower edge, then
    the top of the stack, so column i+2..i+3 fills job i. Also returns the stack's highest top."""
    current = {n: 0 for n in names}
    rows = []
    for t, job, value in sorted(samples):
        rows.append([t] + [current[n] for n in names])
        current[job] = value
        rows.append([t] + [current[n] for n in names])
    rows.append([end] + [current[n] for n in names])
    lines = [f"{block} << EOD"]
    for row in rows:
        cumulative, line = 0, [f"{row[0]:.3f}"]
        for value in row[1:]:
            line.append(str(cumulative))
            cumulative += value
        line.append(str(cumulative))
        lines.append(" ".join(line))
    lines.append("EOD")
    return lines, max((sum(row[1:]) for row in rows), default=0)


def default_linear_rows(cpus: int) -> int:
    """1 GiB per memory-bound job, unless the built-in mix's (one per 2 cpus, at most two at a time
    per 2 cpus) would take more than half of MemAvailable; then less, in steps of 64 Ki rows."""
    available = 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
    except OSError:
        pass
    at_once = 2 * max(1, cpus // 2)
    rows = 1 << 20
    if available:
        rows = min(rows, available // 2 // at_once // 1024 // 65536 * 65536)
    return max(rows, 1 << 17)


def main() -> int:
    parser = argparse.ArgumentParser(prog=PROG, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     description=__doc__.split("\n\n", 1)[1].split("\nEverything")[0])
    parser.add_argument("--build", required=True, help=argparse.SUPPRESS)
    parser.add_argument("--cpus", type=int, metavar="N", default=os.cpu_count() or 1,
                        help="cpus of the node to use, 0..N-1 (default: all online, %(default)s)")
    parser.add_argument("--ways", metavar="LIST", default=",".join(WAYS),
                        help="comma-separated subset of static,oversub,equal,throughput (default: all)")
    parser.add_argument("--work-scale", type=float, metavar="X", default=1.0,
                        help="multiplies every job's work and arrival time: 0.5 halves the run (default 1)")
    parser.add_argument("--mix", choices=sorted(MIXES), default="long-dense",
                        help="the built-in mix: long-dense (a long dense run among short small and linear "
                        "jobs; default), long-small (a long small-kernel run among short dense and linear jobs) "
                        "or long-waiting (a long run whose steps wait for input, among short dense and waiting jobs)")
    parser.add_argument("--scenario", metavar="CSV", help="a CSV of jobs instead of the built-in mix (--work-scale applies): "
                        "name,kind,arrival_s,work_core_s,min,max (kind dense|small|linear; empty max = all cpus)")
    parser.add_argument("--linear-rows", type=int, metavar="R",
                        help="dataset rows of each memory-bound job, 1 KiB each (default 1048576 = 1 GiB, "
                        "less when the memory-bound jobs of the built-in mix would not fit in half the "
                        "available memory at once)")
    parser.add_argument("--linear-batch", type=int, metavar="R", default=1 << 16, help="rows per step of the memory-bound jobs")
    parser.add_argument("--out", metavar="DIR", default="bench-cosched-out", help="folder for the CSVs and the PNG (default %(default)s)")
    parser.add_argument("--timeout", type=float, metavar="S", default=900, help="seconds one way may take before the run fails")
    args = parser.parse_args()
    args.ways = [w.strip() for w in args.ways.split(",") if w.strip()]
    bad = [w for w in args.ways if w not in WAYS]
    if bad or not args.ways:
        parser.error(f"--ways: unknown {','.join(bad) or '(none given)'}; choose from {','.join(WAYS)}")
    online = os.cpu_count() or 1
    if not 1 <= args.cpus <= online:
        parser.error(f"--cpus must be 1..{online}")
    if not args.work_scale > 0 or args.linear_batch < 64:
        parser.error("--work-scale must be > 0 and --linear-batch >= 64")
    if args.linear_rows is None:
        args.linear_rows = default_linear_rows(args.cpus)
    if args.linear_rows < args.linear_batch * 16 // 15 + 1:
        parser.error("--linear-rows must exceed --linear-batch by the held-out 1/16")
    return bench_cleanup.run_with_cleanup(PROG, lambda: Bench(args))


if __name__ == "__main__":
    sys.exit(main())
