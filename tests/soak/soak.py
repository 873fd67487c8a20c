#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
# soak.py — the soak test's driver and sampler; launch_scripts/soak.sh runs it once per backend
# (see its --help for the story). Contract: one private malld (own socket, state dir and cgroup
# parent, all named after --workdir), a plan of job arrivals, kills, admin commands and malld
# restarts drawn from --seed, and a sampler thread that checks all along that no cpu is in two
# jobs' cpusets. Prints its figures and exits 0 only when nothing was violated and nothing was
# left behind; 1 otherwise; 2 on a usage or set-up error. Every process it starts carries
# MALL_SOAK_RUN=<workdir> in its environment, which is how `--sweep` (soak.sh's trap) and the
# leftover check find them. Its parts: soak_system.py (masks, /proc, Status), soak_sampler.py (the
# sampler thread), soak_driver.py (jobs, the plan, the Driver); this file holds the run's shared
# state, its figures, the leftover check, the sweep and the command line.
import argparse
import collections
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

sys.dont_write_bytecode = True  # its modules (soak_system, soak_sampler, soak_driver) leave no __pycache__

from soak_driver import MPI_ENV_AFFINITY, Driver  # noqa: E402 (after the line above)
from soak_sampler import Sampler  # noqa: E402
from soak_system import StatusClient, parse_cpus, proc_stat, processes_marked, read_text  # noqa: E402


# ---------------------------------------------------------------------------------------------
# the run's shared state


class Counters:
    def __init__(self):
        self.c = collections.Counter()
        self.lock = threading.Lock()

    def add(self, key, n=1):
        with self.lock:
            self.c[key] += n

    def __getitem__(self, key):
        with self.lock:
            return self.c[key]


class Soak:
    def __init__(self, args):
        self.args = args
        self.bin = os.path.join(args.build_dir, "bin")
        self.wd = args.workdir
        self.backend = args.backend
        self.v1 = args.backend == "cgroup-v1"
        self.socket = os.path.join(self.wd, "malld.sock")
        self.state_dir = os.path.join(self.wd, "state")
        # unique while this program runs; the cleanup file names it for the sweep
        self.cgroup_parent = "mall_soak_%d_%s" % (os.getpid(), "v1" if self.v1 else "aff")
        self.cgroup_dir = "/sys/fs/cgroup/cpuset/" + self.cgroup_parent
        self.marker = "MALL_SOAK_RUN=" + self.wd
        self.rng = random.Random("%s/%s" % (args.seed, args.backend))
        self.counts = Counters()
        self.violations = []  # (time, text)
        self.vlock = threading.Lock()
        self.episodes = set()
        self.notes = []
        self.t0 = time.monotonic()
        self.malld = None  # subprocess.Popen
        self.malld_instance = 0
        self.malld_up = False  # this program believes malld is serving
        self.malld_epoch = 0  # bumps at every kill/stop of malld
        self.start_ticks = proc_stat(os.getpid())[3]  # processes started later may be ours
        self.jobs = {}  # mallrun pid -> Job
        self.jobs_lock = threading.Lock()
        self.ctl = []  # running mallctl commands
        self.watcher = None
        self.stop_requested = False
        self.cleanup_file = open(os.path.join(self.wd, "cleanup"), "a", buffering=1)
        self.cleanup_file.write("socket %s\n" % self.socket)
        if self.v1:
            self.cleanup_file.write("cgroup %s\n" % self.cgroup_dir)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("MALL_")}
        self.env["MALL_SOCKET"] = self.socket  # nothing started here ever talks to another malld
        self.env["MALL_SOAK_RUN"] = self.wd
        os.makedirs(os.path.join(self.wd, "jobs"), exist_ok=True)
        os.makedirs(self.state_dir, exist_ok=True)
        self.log = open(os.path.join(self.wd, "soak.log"), "a", buffering=1)
        self.measures = []  # (label, instance, rss KiB, fd count, fd kinds)
        self.restarts = collections.Counter()
        self.downtime = 0.0

    # --- bookkeeping ---
    def now(self):
        return time.monotonic() - self.t0

    def say(self, text):
        line = "[%7.2f] %s" % (self.now(), text)
        self.log.write(line + "\n")
        if self.args.verbose:
            print(line, flush=True)

    def violation(self, text, episode=None):
        """Records a violation. Samples that see the same `episode` again (the same cpus of the
        same two jobs, say) are counted by the caller, not recorded again. The first 25 are
        printed as they happen, every one goes to soak.log."""
        with self.vlock:
            if episode is not None:
                if episode in self.episodes:
                    return
                self.episodes.add(episode)
            self.violations.append((self.now(), text))
            n = len(self.violations)
        self.say("VIOLATION: " + text)
        if n <= 25:
            print("soak: VIOLATION at %.1f s: %s" % (self.now(), text), flush=True)
        elif n == 26:
            print("soak: more violations: see soak.log (--keep-logs)", flush=True)

    def spawn(self, argv, out_path, err_path=None, extra_env=None, **kw):
        out = open(out_path, "ab")
        err = open(err_path, "ab") if err_path else subprocess.STDOUT
        env = dict(self.env, **extra_env) if extra_env else self.env
        try:
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env,
                                 start_new_session=True, close_fds=True, **kw)
        finally:
            out.close()
            if err_path:
                err.close()
        self.cleanup_file.write("pgid %d\n" % p.pid)
        return p

    # --- malld ---
    def malld_argv(self, first):
        argv = [os.path.join(self.bin, "malld"), "--socket", self.socket, "--state-dir", self.state_dir,
                "--backend", self.backend, "--ack-timeout-ms", str(self.args.ack_timeout_ms),
                "--cgroup-parent", self.cgroup_parent, "--log-level", "info"]
        if first:
            argv += ["--policy", "equal"]  # later starts keep the saved policy, as a restart would
        return argv

    def start_malld(self, first=False):
        self.malld_instance += 1
        log = os.path.join(self.wd, "malld.%d.log" % self.malld_instance)
        self.malld = self.spawn(self.malld_argv(first), log)
        client = StatusClient(self.socket)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.malld.poll() is not None:
                break
            if client.status(timeout=0.5):
                client.close()
                self.malld_up = True
                self.say("malld #%d (pid %d) serves %s" % (self.malld_instance, self.malld.pid, self.socket))
                self.start_watcher()
                return True
            time.sleep(0.05)
        client.close()
        tail = (read_text(log) or "")[-2000:]
        self.violation("malld #%d did not answer within 15 s (exit %s); log tail:\n%s"
                       % (self.malld_instance, self.malld.poll(), tail))
        return False

    def stop_malld(self, how):
        """how: 'kill' (SIGKILL) or 'term' (SIGTERM, must exit 0). Returns malld's exit code."""
        self.malld_up = False
        self.malld_epoch += 1
        p = self.malld
        os.kill(p.pid, signal.SIGKILL if how == "kill" else signal.SIGTERM)
        try:
            rc = p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.violation("malld #%d did not stop within 15 s of SIGTERM; killed" % self.malld_instance)
            os.kill(p.pid, signal.SIGKILL)
            rc = p.wait()
        self.stop_watcher()  # after malld: the watcher reads what malld sent up to its end
        if how == "term" and rc != 0:
            self.violation("malld #%d exited %d after SIGTERM (want 0)" % (self.malld_instance, rc))
        self.say("malld #%d stopped by %s, exit %d" % (self.malld_instance, how, rc))
        return rc


    # --- events ---
    def start_watcher(self):
        self.watcher = Watcher(self)
        self.watcher.start()

    def stop_watcher(self):
        if self.watcher:
            self.watcher.stop()
            self.watcher = None


class Watcher:
    """`mallctl watch --json` for one malld instance: counts events and keeps them in events.jsonl."""

    def __init__(self, soak):
        self.soak = soak
        path = os.path.join(soak.wd, "events.jsonl")
        self.out = open(path, "a", buffering=1)
        argv = [os.path.join(soak.bin, "mallctl"), "--socket", soak.socket, "watch", "--json"]
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, env=soak.env, start_new_session=True,
                                     close_fds=True)
        soak.cleanup_file.write("pgid %d\n" % self.proc.pid)
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def start(self):
        self.thread.start()

    def loop(self):
        c = self.soak.counts
        for line in self.proc.stdout:
            self.out.write(line.decode(errors="replace"))
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            kind = ev.get("event", "?")
            c.add("event." + kind)
            if kind == "enforce" and "error" in ev:
                c.add("event.enforce_error")
                self.soak.say("enforce error: %s" % json.dumps(ev))
            if kind == "end":
                c.add("event.end." + str(ev.get("reason")))

    def stop(self):
        try:
            self.proc.terminate()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.thread.join(timeout=5)
        self.proc.stdout.close()
        self.out.close()


# ---------------------------------------------------------------------------------------------
# the run


def leftovers(soak):
    """What is left once malld stopped: cgroups, socket, processes, fds of this program."""
    found = []
    if os.path.exists(soak.cgroup_dir):
        found.append("cgroup folder %s (job folders %s)" % (
            soak.cgroup_dir, [d for d in os.listdir(soak.cgroup_dir) if d.startswith("job_")]))
    if os.path.exists(soak.socket):
        found.append("socket %s" % soak.socket)
    procs = processes_marked(soak.marker)
    for pid in procs:
        found.append("process %d (%s)" % (pid, (read_text("/proc/%d/cmdline" % pid) or "").replace("\0", " ")[:120]))
    groups = set()
    with open(os.path.join(soak.wd, "cleanup")) as f:
        for line in f:
            if line.startswith("pgid "):
                groups.add(int(line.split()[1]))
    for name in os.listdir("/proc"):  # a process of ours in our groups that shed the marker
        if name.isdigit() and int(name) not in procs and int(name) != os.getpid():
            st = proc_stat(int(name))
            if st and st[2] in groups and st[0] not in "ZX" and st[3] >= soak.start_ticks:
                cmdline = (read_text("/proc/%s/cmdline" % name) or "").replace("\0", " ")
                if soak.bin in cmdline or soak.wd in cmdline:  # a recycled group id is not ours
                    found.append("process %s in group %d (%s)" % (name, st[2], cmdline[:120]))
    return found


def figures(soak, drv):
    c = soak.counts
    m = soak.measures
    out = []
    kinds = ", ".join("%s %d" % (k, c["jobs.started." + k]) for k in ("client", "slow", "noack", "sgd", "digits",
                                                                       "linear", "mpi", "resident"))
    out.append("jobs: %d started (%s)" % (c["jobs.started"], kinds))
    out.append("      %d finished ok, %d stopped by SIGTERM (exit 0, checksum of the steps done), %d SIGKILLed "
               "(%d the process, %d with mallrun), %d refused by malld, %d lost their registration to a malld "
               "kill, %d ran unmanaged while malld was down, %d arrivals dropped for want of room"
               % (c["jobs.ok"], c["jobs.terminated"], c["jobs.killed"], c["fate.kill_child"], c["fate.kill_group"],
                  c["jobs.refused"], c["jobs.registration_lost"], c["jobs.unmanaged"], c["arrivals.dropped"]))
    out.append("      wrong exit or result: %d; refused although this program saw room: %d (pins, reclaims "
               "and timing it does not model)" % (c["jobs.bad_exit"] + c["jobs.bad_result"], c["jobs.refused_with_room"]))
    refusals = sorted(((k[len("refusal."):], v) for k, v in c.c.items() if k.startswith("refusal.")), key=lambda x: -x[1])
    for reason, n in refusals[:4]:
        out.append("      refused %dx: %s" % (n, reason))
    out.append("transitions: %d publishes, %d acks, %d ack timeouts, %d enforce errors; ends %s"
               % (c["event.publish"], c["event.ack"], c["event.ack_timeout"], c["event.enforce_error"],
                  {k[len("event.end."):]: v for k, v in c.c.items() if k.startswith("event.end.")}))
    status_transitions = sum(e.get("transitions", 0) for e in drv.soak_sampler.last_seen.values())
    status_timeouts = sum(e.get("ack_timeouts", 0) for e in drv.soak_sampler.last_seen.values())
    out.append("             (status counters at each job's last sighting: %d transitions, %d ack timeouts)"
               % (status_transitions, status_timeouts))
    out.append("malld: %d restarts (%d SIGKILL, %d SIGTERM), down %.1f s in all; event watcher lost %d times"
               % (sum(soak.restarts.values()), soak.restarts["kill"], soak.restarts["term"], soak.downtime,
                  c["watcher.lost"]))
    admin = []
    for what in ("set_cpus", "set_auto", "set_weight", "policy", "reclaim", "release"):
        admin.append("%s %d/%d/%d" % (what, c["admin.%s.ok" % what], c["admin.%s.refused" % what],
                                      c["admin.%s.unreachable" % what]))
    out.append("admin (ok/refused/malld away): " + ", ".join(admin))
    out.append("sampler: %d samples every %d ms (%d while malld was down, %d inside an ack window)"
               % (c["samples"], soak.args.sample_ms, c["samples.malld_down"], c["samples.in_ack_window"]))
    out.append("ack-timeout windows: %d (ack_timeout events); overlaps inside them: %d threads, %d cgroup"
               % (c["event.ack_timeout"], c["overlap.in_ack_window.threads"], c["overlap.in_ack_window.cgroup"]))
    out.append("overlaps outside an ack window: %d threads, %d cgroup, %d in malld's status; kernel/status "
               "disagreements: %d cgroup, %d threads (seen once: %d, %d)"
               % (c["overlap.violation.threads"], c["overlap.violation.cgroup"], c["overlap.violation.status"],
                  c["disagreement.confirmed.cgroup"], c["disagreement.confirmed.threads"],
                  c["disagreement.seen.cgroup"], c["disagreement.seen.threads"]))
    res = getattr(drv, "resident", None)
    if res is not None and res.fd_first and res.fd_last:
        out.append("resident job %s (through every restart): RSS %d -> %d KiB, fds %s -> %s, outcome %s"
                   % (res.name, res.fd_first[1], res.fd_last[1], res.fd_first[0], res.fd_last[0], res.outcome))
    for label, inst, rss, nfd, kinds_ in m:
        out.append("malld #%d at %-14s RSS %6d KiB, %2d fds %s" % (inst, label + ":", rss, nfd,
                                                                  " ".join("%s:%d" % kv for kv in sorted(kinds_.items()))))
    return out


def run(args):
    soak = Soak(args)
    soak.have_digits = os.path.exists("/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz")
    soak.mpirun = shutil.which("mpirun") if os.path.exists(os.path.join(soak.bin, "mall_train_mpi")) else None
    if not soak.mpirun:
        soak.notes.append("no mpirun or mall_train_mpi: MPI jobs left out")
    elif not soak.v1:
        soak.notes.append("MPI jobs run with %s: on the affinity backend Open MPI's start would move "
                          "their threads onto other jobs' cpus" % " ".join("%s=%s" % kv for kv in MPI_ENV_AFFINITY.items()))
    if not soak.have_digits:
        soak.notes.append("no sklearn digits file: mall_train_digits left out")
    drv = Driver(soak)

    def on_signal(signum, frame):
        soak.stop_requested = True
        soak.violation("interrupted by signal %d" % signum, episode=("interrupted",))

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print("soak: backend %s, seed %s, %.1f min, ack timeout %d ms, work dir %s"
          % (args.backend, args.seed, args.minutes, args.ack_timeout_ms, args.workdir), flush=True)
    drv.compute_references()
    own_fds = len(os.listdir("/proc/self/fd"))
    if not soak.start_malld(first=True):
        return finish(soak, drv, None)
    probe = StatusClient(soak.socket)
    soak.pool_count = bin(parse_cpus(probe.status()["pool"])).count("1")
    probe.close()
    sampler = Sampler(soak)
    drv.soak_sampler = sampler
    sampler.start()
    total = args.minutes * 60
    warm = max(6.0, 0.1 * total)
    chaos1 = 0.5 * total
    chaos2 = max(5.0, total - warm - chaos1)
    restarts = args.restarts if args.restarts >= 0 else max(2, round(total / 100))
    ok = True
    for step in (lambda: drv.run_phase("warm-up", warm, 0), lambda: drv.drain("warm-up"),
                 lambda: drv.run_phase("chaos", chaos1, restarts), lambda: drv.drain("after restarts"),
                 lambda: drv.run_phase("steady", chaos2, 0), lambda: drv.drain("end")):
        if not ok or soak.stop_requested:  # a failed start of malld, or SIGTERM/SIGINT: straight to the end
            ok = False
            break
        try:
            ok = step() not in (False, None)
        except Exception:  # a bug here must still end in the figures, the checks and the cleanup
            import traceback
            traceback.print_exc()
            soak.violation("the driver crashed (traceback above)")
            ok = False
    sampler.stop()
    if ok and not soak.stop_requested:
        soak.stop_malld("term")
    return finish(soak, drv, own_fds)


def finish(soak, drv, own_fds):
    # Whatever is still running is ours to end (a failed run); the leftover check comes first.
    if soak.malld and soak.malld.poll() is None:
        soak.stop_malld("kill")
    soak.stop_watcher()
    left = leftovers(soak)
    for pid in processes_marked(soak.marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    if own_fds is not None:
        now_fds = len(os.listdir("/proc/self/fd"))
        if now_fds > own_fds:
            left.append("%d fds in soak.py (%d at the start)" % (now_fds, own_fds))
    for item in left:
        soak.violation("left behind: " + item)
    # RSS and fds of the instance that lived through the last phase: its two drains compare
    m = {x[0]: x for x in soak.measures}
    if "after restarts" in m and "end" in m:
        b, e = m["after restarts"], m["end"]
        tol = max(args_tol_kib(soak), int(b[2] * soak.args.rss_tolerance_pct / 100))
        if e[1] == b[1]:
            if e[2] > b[2] + tol:
                soak.violation("malld's RSS grew from %d to %d KiB (tolerance %d KiB)" % (b[2], e[2], tol))
            if e[3] > b[3]:
                soak.violation("malld's fd count grew from %d to %d (%s -> %s)" % (b[3], e[3], b[4], e[4]))
    res = getattr(drv, "resident", None)
    if res is not None:
        if res.fd_first is None or res.fd_last is None:
            soak.violation("the resident job %s was never seen attached (see %s)" % (res.name, res.out))
        else:
            (k1, r1), (k2, r2) = res.fd_first, res.fd_last
            tol = max(args_tol_kib(soak), int(r1 * soak.args.rss_tolerance_pct / 100))
            if sum(k2.values()) > sum(k1.values()):
                soak.violation("the resident job's fds grew over %d malld restarts: %s -> %s"
                               % (sum(soak.restarts.values()), k1, k2))
            if r2 > r1 + tol:
                soak.violation("the resident job's RSS grew from %d to %d KiB (tolerance %d KiB)" % (r1, r2, tol))
    # With no job, malld holds no job page (memfd) and a pidfd only per connection (its peer's):
    # the listening socket, the sampler's and the watcher's connections.
    for label, inst, rss, nfd, kinds in soak.measures:
        memfds = sum(v for key, v in kinds.items() if "memfd" in key)
        if memfds or kinds.get("pidfd", 0) > kinds.get("socket", 0) - 1:
            soak.violation("malld #%d holds fds of no job at the drain %s: %s" % (inst, label, kinds))
    lines = figures(soak, drv) if hasattr(drv, "soak_sampler") else []
    lines += malld_log_summary(soak)
    lines.append("leftovers: %s" % ("none" if not left else "; ".join(left)))
    lines.append("violations: %d" % len(soak.violations))
    print("soak: ---- %s, seed %s: figures ----" % (soak.backend, soak.args.seed))
    for line in lines:
        print("soak:   " + line)
    for note in soak.notes:
        print("soak: note: " + note)
    with open(os.path.join(soak.wd, "report-%s.json" % soak.backend), "w") as f:
        json.dump({"backend": soak.backend, "seed": soak.args.seed, "minutes": soak.args.minutes,
                   "counts": dict(soak.counts.c), "measures": soak.measures,
                   "restarts": dict(soak.restarts), "violations": soak.violations, "leftovers": left}, f, indent=1)
    soak.log.close()
    soak.cleanup_file.close()
    return 0 if not soak.violations else 1


def malld_log_summary(soak):
    """malld's warn and error lines over every instance, numbers folded, most frequent first."""
    seen = collections.Counter()
    for i in range(1, soak.malld_instance + 1):
        for line in (read_text(os.path.join(soak.wd, "malld.%d.log" % i)) or "").splitlines():
            m = re.search(r" (warn|error): (.*)", line)
            if m:
                seen["%s: %s" % (m.group(1), re.sub(r"[0-9]+", "N", m.group(2))[:150])] += 1
    out = ["malld warn/error lines: %d" % sum(seen.values())]
    for text, n in seen.most_common(6):
        out.append("      %dx %s" % (n, text))
    return out


def args_tol_kib(soak):
    return soak.args.rss_tolerance_kib


# ---------------------------------------------------------------------------------------------
# --sweep: the last resort of soak.sh's trap when this program died


def sweep(workdir):
    marker = "MALL_SOAK_RUN=" + workdir
    for _ in range(3):
        pids = processes_marked(marker)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.2)
    path = os.path.join(workdir, "cleanup")
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                kind, _, value = line.strip().partition(" ")
                if kind == "cgroup" and os.path.isdir(value):
                    remove_cgroup_tree(value)
                elif kind == "socket" and os.path.exists(value):
                    os.unlink(value)
    return 0


def remove_cgroup_tree(folder):
    for name in os.listdir(folder):
        sub = os.path.join(folder, name)
        if os.path.isdir(sub):
            remove_cgroup_tree(sub)
    for _ in range(40):
        for pid in (read_text(folder + "/cgroup.procs") or "").split():
            try:
                with open("/sys/fs/cgroup/cpuset/cgroup.procs", "w") as f:
                    f.write(pid)
            except OSError:
                pass
        try:
            os.rmdir(folder)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.05)


def main():
    ap = argparse.ArgumentParser(description="mall soak test: driver and sampler (run by launch_scripts/soak.sh)")
    ap.add_argument("--build-dir", required=True)
    ap.add_argument("--workdir", required=True, help="a fresh folder of this run (soak.sh makes it)")
    ap.add_argument("--backend", choices=["cgroup-v1", "affinity"], default="cgroup-v1")
    ap.add_argument("--minutes", type=float, default=1.0)
    ap.add_argument("--seed", default="1")
    ap.add_argument("--ack-timeout-ms", type=int, default=500)
    ap.add_argument("--sample-ms", type=int, default=25)
    ap.add_argument("--restarts", type=int, default=-1, help="malld restarts (default: max(2, seconds/100))")
    ap.add_argument("--mean-arrival-s", type=float, default=1.5)
    ap.add_argument("--mean-admin-s", type=float, default=1.2)
    ap.add_argument("--rss-tolerance-kib", type=int, default=1024)
    ap.add_argument("--rss-tolerance-pct", type=float, default=10.0)
    ap.add_argument("--references", help="a file caching the examples' reference results (made if missing)")
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--sweep", action="store_true", help="kill what a dead run left and remove its cgroups")
    args = ap.parse_args()
    args.workdir = os.path.abspath(args.workdir)
    args.build_dir = os.path.abspath(args.build_dir)
    if args.sweep:
        return sweep(args.workdir)
    if not (0 < args.minutes <= 24 * 60) or args.ack_timeout_ms < 1 or args.sample_ms < 1:
        ap.error("need 0 < --minutes <= 1440, --ack-timeout-ms >= 1, --sample-ms >= 1")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
