#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
# soak.py — the soak test's driver and sampler; launch_scripts/soak.sh runs it once per backend
# (see its --help for the story). Contract: one private malld (own socket, state dir and cgroup
# parent, all named after --workdir), a plan of job arrivals, kills, admin commands and malld
# restarts drawn from --seed, and a sampler thread that checks all along that no cpu is in two
# jobs' cpusets. Prints its figures and exits 0 only when nothing was violated and nothing was
# left behind; 1 otherwise; 2 on a usage or set-up error. Every process it starts carries
# MALL_SOAK_RUN=<workdir> in its environment, which is how `--sweep` (soak.sh's trap) and the
# leftover check find them.
import argparse
import collections
import json
import os
import random
import re
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

# ---------------------------------------------------------------------------------------------
# cpu lists as bit masks


def parse_cpus(text):
    """Linux list text ("0-1,3") to a bit mask; "" is 0."""
    mask = 0
    text = text.strip()
    if not text:
        return 0
    for part in text.split(","):
        if "-" in part:
            lo, hi = part.split("-")
            for c in range(int(lo), int(hi) + 1):
                mask |= 1 << c
        else:
            mask |= 1 << int(part)
    return mask


def cpus_text(mask):
    out, c = [], 0
    while mask >> c:
        if mask >> c & 1:
            start = c
            while mask >> (c + 1) & 1:
                c += 1
            out.append(str(start) if start == c else "%d-%d" % (start, c))
        c += 1
    return ",".join(out)


def fnv_steps(n):
    """mall_test_client's checksum: FNV-1a 64 over the step numbers 1..n as 8 LE bytes."""
    h = 0xCBF29CE484222325
    for s in range(1, n + 1):
        for i in range(8):
            h ^= (s >> (8 * i)) & 0xFF
            h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


# ---------------------------------------------------------------------------------------------
# /proc readers (everything tolerates a process that is gone)


def read_text(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def proc_stat(pid):
    """(state, ppid, pgid, starttime) or None."""
    text = read_text("/proc/%d/stat" % pid)
    if not text:
        return None
    rest = text[text.rfind(")") + 2:].split()
    return rest[0], int(rest[1]), int(rest[2]), int(rest[19])


def live_threads_mask(pid):
    """Union of Cpus_allowed_list over the pid's threads that are not zombies or dead."""
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return 0
    mask = 0
    for tid in tids:
        text = read_text("/proc/%d/task/%s/status" % (pid, tid))
        if not text:
            continue
        i = text.find("\nState:\t")
        if i >= 0 and text[i + 8] in "ZX":
            continue
        j = text.find("\nCpus_allowed_list:\t")
        if j < 0:
            continue
        k = text.find("\n", j + 20)
        mask |= parse_cpus(text[j + 20:k])
    return mask


def children_of(pid):
    out = []
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return out
    for tid in tids:
        text = read_text("/proc/%d/task/%s/children" % (pid, tid))
        if text:
            out.extend(int(p) for p in text.split())
    return out


def descendants_of(pid):
    out, todo = [], children_of(pid)
    while todo and len(out) < 256:
        p = todo.pop()
        out.append(p)
        todo.extend(children_of(p))
    return out


def rss_kib(pid):
    text = read_text("/proc/%d/status" % pid) or ""
    m = re.search(r"^VmRSS:\s+(\d+) kB", text, re.M)
    return int(m.group(1)) if m else -1


def fd_targets(pid):
    out = []
    try:
        for fd in sorted(os.listdir("/proc/%d/fd" % pid), key=int):
            try:
                out.append(os.readlink("/proc/%d/fd/%s" % (pid, fd)))
            except OSError:
                pass
    except OSError:
        pass
    return out


def fd_kind(target):
    """socket:[123] -> socket, anon_inode:[eventpoll] -> eventpoll, /path -> the path."""
    if target.startswith("socket:"):
        return "socket"
    if target.startswith("pipe:"):
        return "pipe"
    if target.startswith("anon_inode:"):
        return target[len("anon_inode:"):].strip("[]")
    return target


def processes_marked(marker):
    """Pids (other than this process and its ancestors) whose environment holds marker."""
    mine = set()
    p = os.getpid()
    while p > 1:
        mine.add(p)
        st = proc_stat(p)
        if not st:
            break
        p = st[1]
    needle = marker.encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in mine:
            continue
        try:
            with open("/proc/%s/environ" % name, "rb") as f:
                env = f.read()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            st = proc_stat(int(name))
            if st and st[0] not in "ZX":
                found.append(int(name))
    return found


# ---------------------------------------------------------------------------------------------
# malld's wire protocol, just enough for Status (what `mallctl status --json` prints): a Unix
# SOCK_SEQPACKET socket, a 16-byte header (magic "MALL", version 1, type, length, request id)
# and a JSON object. The sampler asks twice per sample; a process per ask would cost more than
# the sampling itself.

MAGIC, VERSION, T_STATUS, T_REPLY = 0x4C4C414D, 1, 6, 64
HEADER = struct.Struct("<IHHII")


class StatusClient:
    def __init__(self, path):
        self.path = path
        self.sock = None
        self.request_id = 0

    def close(self):
        if self.sock:
            self.sock.close()
            self.sock = None

    def status(self, timeout=1.0):
        """The status object, or None when malld does not answer."""
        try:
            if not self.sock:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
                s.settimeout(timeout)
                s.connect(self.path)
                self.sock = s
            self.request_id += 1
            payload = b"{}"
            self.sock.send(HEADER.pack(MAGIC, VERSION, T_STATUS, len(payload), self.request_id) + payload)
            while True:
                packet = self.sock.recv(HEADER.size + 65536)
                if len(packet) < HEADER.size:
                    raise OSError("malld closed the connection")
                magic, version, kind, length, rid = HEADER.unpack_from(packet)
                if magic != MAGIC or version != VERSION:
                    raise SystemExit("soak: malld speaks protocol version %d, this sampler %d" % (version, VERSION))
                if kind == T_REPLY and rid == self.request_id:
                    body = json.loads(packet[HEADER.size:HEADER.size + length])
                    return body if body.get("ok") else None
        except (OSError, ValueError):
            self.close()
            return None


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
# jobs

EXAMPLE_PRESETS = {
    # name: (program, arguments); references are computed once, without malld, on one thread
    "sgd-a": ("mall_train_sgd", ["--steps", "60", "--seed", "1", "--hidden", "128", "--batch", "1024", "-q"]),
    "sgd-b": ("mall_train_sgd", ["--steps", "150", "--seed", "2", "--hidden", "64", "--batch", "512", "-q"]),
    "digits-a": ("mall_train_digits", ["--steps", "1500", "--batch", "128", "--hidden", "256", "--seed", "1", "-q"]),
    "digits-b": ("mall_train_digits", ["--steps", "500", "--batch", "256", "--hidden", "512", "--seed", "2", "-q"]),
    "linear-a": ("mall_train_linear", ["--rows", "131072", "--features", "64", "--batch", "16384",
                                       "--steps", "1200", "--seed", "1", "-q"]),
    "linear-b": ("mall_train_linear", ["--rows", "65536", "--features", "128", "--batch", "8192",
                                       "--steps", "1500", "--seed", "3", "-q"]),
    "mpi-a": ("mall_train_mpi", ["--steps", "300", "--seed", "1", "--print-every", "0"]),
    "mpi-b": ("mall_train_mpi", ["--steps", "150", "--seed", "2", "--hidden", "512", "--print-every", "0"]),
}
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_mpi_yield_when_idle": "1"}  # ranks share the cpus: do not spin
# With the affinity backend nothing stops a process from moving its own threads, and Open MPI's
# start does: the constructors of libpsm2 and libinfinipath (loaded with the ofi, psm and psm2
# components) pin the loading thread to cpu 0 for ~100 ms, and hwloc's x86 discovery binds it to
# each cpu in turn. A cgroup confines both; the affinity backend cannot (found by this soak).
MPI_ENV_AFFINITY = {"OMPI_MCA_mtl": "^ofi,psm,psm2", "OMPI_MCA_btl": "^ofi", "HWLOC_COMPONENTS": "-x86"}


def mpirun_argv(mpirun, ranks, inner):
    return [mpirun, "--bind-to", "none", "-np", str(ranks)] + inner



def example_result(text):
    """(loss, test_accuracy or None, checksum or None) of an example's final line, or None."""
    lines = [re.sub(r"^rank \d+ ", "", l) for l in text.splitlines()]
    lines = [l for l in lines if l.startswith("final loss ")]
    if not lines or len(set(lines)) != 1:
        return None  # none, or ranks that disagree
    line = lines[-1]
    loss = float(line.split()[2])
    acc = re.search(r"(?:test_accuracy|accuracy) ([0-9.]+)", line)
    chk = re.search(r"checksum ([0-9a-f]+)", line)
    return loss, float(acc.group(1)) if acc else None, chk.group(1) if chk else None


class Job:
    def __init__(self, n, kind, preset, cmd, minmax, weight, fate, fate_at, ranks=1):
        self.n, self.kind, self.preset, self.cmd = n, kind, preset, cmd
        self.ranks = ranks  # > 1: mpirun -np ranks, each rank its own mallrun and malld job
        self.minmax, self.weight, self.fate, self.fate_at = minmax, weight, fate, fate_at
        self.name = "soak-%d-%s" % (n, kind)
        self.proc = None
        self.started = self.ended = None
        self.epoch = 0  # malld_epoch at launch
        self.up_at_launch = True  # malld served when the job was launched
        self.room = True  # the soak saw room for it at launch (room_for)
        self.done_fate = None  # the fate carried out ("kill_child", "kill_group", "term")
        self.outcome = None
        self.out = self.err = None
        self.many_sockets = False  # the last fd scan saw more than one socket
        self.fd_first = self.fd_last = None  # resident job: (fd kinds, RSS KiB) first and last

    @property
    def min(self):
        return int(self.minmax.split(":")[0]) * self.ranks


# ---------------------------------------------------------------------------------------------
# the sampler


class Sampler(threading.Thread):
    """Every --sample-ms: status (S1), every job's cpus read forward then backward, status (S2).
    A cpu counts as in two jobs A and B when both reads of A (which bracket B's) and one read of
    B hold it: a legal move from A to B between two reads cannot look like that, since A would
    have had to get the cpu back within the same sample."""

    def __init__(self, soak):
        super().__init__(daemon=True)
        self.soak = soak
        self.client = StatusClient(soak.socket)
        self.stopping = False
        self.last_jobs = []  # job entries of the last status, for samples while malld is down
        self.pid_ok = {}  # (pid, starttime) -> True when its parent is one of our mallruns
        self.candidates = {}  # (check, job) -> (sample index, detail)
        self.confirmed = set()
        self.index = 0
        self.last_seen = {}  # job -> its last status entry (for transition counters)
        self.reported_pairs = set()

    def stop(self):
        self.stopping = True
        self.join(timeout=10)
        self.client.close()

    def run(self):
        period = self.soak.args.sample_ms / 1000.0
        next_t = time.monotonic()
        while not self.stopping:
            try:
                self.sample_once()
            except Exception as e:  # a sampler bug must fail the run, not hang it silently
                self.soak.violation("sampler crashed: %r" % e)
                import traceback
                traceback.print_exc()
                return
            next_t += period
            delay = next_t - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:
                next_t = time.monotonic()

    def job_pids(self, entry, mallruns):
        pids = []
        for pid in entry.get("pids", []):
            st = proc_stat(pid)
            if not st or st[0] in "ZX":
                continue
            key = (pid, st[3])
            ok = self.pid_ok.get(key)
            if ok is None:  # a descendant (within 4 generations) of a process this run started
                ok, parent = False, st[1]
                for _ in range(4):
                    if parent in mallruns:
                        ok = True
                        break
                    pst = proc_stat(parent) if parent > 1 else None
                    if not pst:
                        break
                    parent = pst[1]
                if len(self.pid_ok) > 20000:
                    self.pid_ok.clear()
                self.pid_ok[key] = ok
            if ok:
                pids.append(pid)
                pids.extend(descendants_of(pid))
        return pids

    def read_job(self, entry, mallruns):
        """(E, C): the union of the job's live threads' allowed cpus, and (cgroup-v1) the
        cpuset.cpus of its folder when a live process is in it (else None)."""
        pids = self.job_pids(entry, mallruns)
        c = None
        if self.soak.v1:
            folder = entry.get("cgroup") or "%s/job_%s" % (self.soak.cgroup_dir, entry["job"])
            procs = read_text(folder + "/cgroup.procs")
            cpus = read_text(folder + "/cpuset.cpus")
            if procs is not None and cpus is not None:
                live = []
                for p in procs.split():
                    st = proc_stat(int(p))
                    if st and st[0] not in "ZX":
                        live.append(int(p))
                if live:
                    c = parse_cpus(cpus)
                    pids = pids + [p for p in live if p not in pids]
        e = 0
        for pid in pids:
            e |= live_threads_mask(pid)
        return e, c

    @staticmethod
    def in_ack_window(entry):
        return entry.get("attached", 0) > 0 and entry.get("acked_generation", 0) < entry.get("generation", 0)

    def sample_once(self):
        soak = self.soak
        self.index += 1
        s1 = self.client.status()
        with soak.jobs_lock:
            mallruns = set(soak.jobs.keys())
        if s1 is not None:
            jobs = [j for j in s1.get("jobs", [])]
            self.last_jobs = jobs
        else:
            jobs = self.last_jobs
        # A job without cpus yet is held at mallrun's gate (it runs nothing): not sampled.
        jobs = [j for j in jobs if j.get("cpuset")]
        fwd = [self.read_job(j, mallruns) for j in jobs]
        rev = [self.read_job(j, mallruns) for j in reversed(jobs)][::-1]
        s2 = self.client.status() if s1 is not None else None
        soak.counts.add("samples")
        if s1 is None:
            soak.counts.add("samples.malld_down")
        by1 = {j["job"]: j for j in (s1 or {}).get("jobs", [])}
        by2 = {j["job"]: j for j in (s2 or {}).get("jobs", [])}
        window = any(self.in_ack_window(j) for j in list(by1.values()) + list(by2.values()))
        if window:
            soak.counts.add("samples.in_ack_window")
        for name, entry in by2.items():
            self.last_seen[name] = entry
        for s in (s1, s2):
            if s is not None:
                self.check_status(s)
        # kernel: cpus in two jobs
        for i in range(len(jobs)):
            for k in range(i + 1, len(jobs)):
                for what, idx in (("threads", 0), ("cgroup", 1)):
                    a1, a2 = fwd[i][idx], rev[i][idx]
                    b1, b2 = fwd[k][idx], rev[k][idx]
                    if a1 is None or a2 is None or (b1 is None and b2 is None):
                        continue
                    both = a1 & a2 & ((b1 or 0) | (b2 or 0))
                    if not both:
                        continue
                    a, b = jobs[i]["job"], jobs[k]["job"]
                    pair_window = any(self.in_ack_window(x) for x in
                                      (by1.get(a, {}), by1.get(b, {}), by2.get(a, {}), by2.get(b, {})))
                    detail = ("cpu %s in jobs %s and %s (%s: %s=%s/%s %s=%s/%s)" %
                              (cpus_text(both), a, b, what, a, cpus_text(a1), cpus_text(a2), b,
                               cpus_text(b1 or 0), cpus_text(b2 or 0)))
                    if pair_window:
                        soak.counts.add("overlap.in_ack_window." + what)
                        soak.say("overlap inside an ack window: " + detail)
                    else:
                        soak.counts.add("overlap.violation." + what)
                        state = "malld down" if s1 is None else "status %s" % json.dumps(
                            [{k2: by1.get(x, {}).get(k2) for k2 in ("job", "cpus", "cpuset", "generation",
                                                                      "acked_generation", "attached")}
                             for x in (a, b)])
                        soak.violation("%s; %s" % (detail, state), episode=("overlap", what, a, b, both))
        # kernel against status, for jobs that are steady in both statuses
        if s1 is None or s2 is None:
            return
        for i, entry in enumerate(jobs):
            name = entry["job"]
            e1, e2 = by1.get(name), by2.get(name)
            if not e1 or not e2:
                continue
            keys = ("cpus", "cpuset", "generation", "acked_generation")
            if any(e1.get(k) != e2.get(k) for k in keys) or e1["cpus"] != e1["cpuset"]:
                continue
            if e1.get("acked_generation") != e1.get("generation") or not e1["cpuset"]:
                continue
            want = parse_cpus(e1["cpuset"])
            (ef, cf), (er, cr) = fwd[i], rev[i]
            if self.soak.v1 and cf is not None and cr is not None and cf == cr and cf != want:
                self.candidate("cgroup", name, "job %s: cgroup cpuset.cpus %s, malld says %s (generation %s)"
                               % (name, cpus_text(cf), e1["cpuset"], e1["generation"]))
            if (ef | er) & ~want:
                self.candidate("threads", name, "job %s: threads may run on %s, outside the %s malld enforces "
                               "(generation %s)" % (name, cpus_text(ef | er), e1["cpuset"], e1["generation"]))

    def candidate(self, check, job, detail):
        """A disagreement between kernel and status counts when two samples in a row see it."""
        key = (check, job)
        prev = self.candidates.get(key)
        self.candidates[key] = (self.index, detail)
        self.soak.counts.add("disagreement.seen." + check)
        if prev and prev[0] == self.index - 1 and prev[1] == detail and (key, detail) not in self.confirmed:
            self.confirmed.add((key, detail))
            self.soak.counts.add("disagreement.confirmed." + check)
            self.soak.violation("kernel and malld disagree: " + detail)

    def check_status(self, s):
        held = []
        for j in s.get("jobs", []):
            held.append((j["job"], parse_cpus(j.get("cpuset", "")) | parse_cpus(j.get("cpus", ""))))
        for i in range(len(held)):
            for k in range(i + 1, len(held)):
                both = held[i][1] & held[k][1]
                if both:
                    key = (held[i][0], held[k][0], both)
                    self.soak.counts.add("overlap.violation.status")
                    if key not in self.reported_pairs:
                        self.reported_pairs.add(key)
                        self.soak.violation("malld's status has cpu %s held by jobs %s and %s"
                                            % (cpus_text(both), held[i][0], held[k][0]))


# ---------------------------------------------------------------------------------------------
# the plan: what happens when, drawn from the seed before anything runs


def draw_job(rng, n, soak):
    kinds = [("client", 30), ("slow", 10), ("noack", 14), ("sgd", 14), ("digits", 14), ("linear", 14), ("mpi", 6)]
    if not soak.have_digits:
        kinds = [k for k in kinds if k[0] not in ("digits", "mpi")]
    if not soak.mpirun:
        kinds = [k for k in kinds if k[0] != "mpi"]
    kind = rng.choices([k for k, _ in kinds], [w for _, w in kinds])[0]
    b = soak.bin
    preset = None
    if kind == "client":
        step_us = rng.choice([200, 500, 1000, 2000, 5000])
        steps = int(rng.uniform(1.5, 8.0) * 1e6 / step_us)
        cmd = [os.path.join(b, "mall_test_client"), "--steps", str(steps), "--step-us", str(step_us),
               "--duration-s", "86400", "--threads", str(rng.choice([1, 2, 3]))] + (["--spin"] if rng.random() < 0.3 else [])
    elif kind == "slow":  # steps slower than the ack timeout: acks come late
        cmd = [os.path.join(b, "mall_test_client"), "--steps", str(rng.randint(3, 8)), "--duration-s", "86400",
               "--step-us", str(rng.choice([700000, 1000000, 1500000])), "--threads", "2"]
    elif kind == "noack":  # attaches and never steps: every shrink of it times out
        cmd = [os.path.join(b, "mall_test_client"), "--no-step", "--duration-s",
               "%.1f" % rng.uniform(2, 9), "--threads", str(rng.choice([1, 2]))]
    else:
        preset = rng.choice([p for p in EXAMPLE_PRESETS if p.startswith(kind)])
        prog, pargs = EXAMPLE_PRESETS[preset]
        cmd = [os.path.join(b, prog)] + pargs
    minmax = rng.choices(["1:2", "1:1", "2:2", "1"], [60, 15, 10, 15])[0]
    weight = rng.choice([1, 1, 2, 0.5, 3])
    fate = rng.choices(["natural", "kill_child", "kill_group", "term"], [68, 10, 8, 14])[0]
    if fate == "term" and kind not in ("client", "slow", "noack"):
        fate = "natural"  # the examples die of SIGTERM (143): only the test clients stop cleanly on it
    if kind == "mpi":  # two ranks on this node's two cpus, one cpu each; ranks have their own groups
        minmax = "1:1"
        if fate == "kill_group":
            fate = "kill_child"  # SIGKILL one rank: mpirun ends the other and fails
    return Job(n, kind, preset, cmd, minmax, weight, fate, rng.uniform(0.3, 5.0), 2 if kind == "mpi" else 1)


def draw_plan(rng, soak, start, end, restarts):
    """[(time, action, params)] between start and end (seconds since the run began)."""
    plan = []
    t = start
    while True:
        t += rng.expovariate(1 / soak.args.mean_arrival_s)
        if t >= end:
            break
        plan.append((t, "arrive", {"push": rng.random() < 0.12}))
    t = start
    while True:
        t += rng.expovariate(1 / soak.args.mean_admin_s)
        if t >= end:
            break
        what = rng.choices(["set_cpus", "set_auto", "set_weight", "policy", "reclaim", "release"],
                           [26, 18, 10, 16, 16, 14])[0]
        plan.append((t, what, {"pick": rng.random(), "late": rng.random() < 0.5,
                               "cpus": rng.choice(["0", "1", "0-1"]),
                               "weight": rng.choice([0.5, 1, 2, 4]),
                               "policy": rng.choice(["equal", "weighted", "static", "throughput"]),
                               "owner": rng.random() < 0.5}))
    if restarts:  # one in each of `restarts` equal slots of the first 80% of the phase
        slot = 0.8 * (end - start) / restarts
        times = [start + slot * (i + rng.uniform(0.2, 0.8)) for i in range(restarts)]
        for rt in times:
            plan.append((rt, "restart", {"how": "term" if rng.random() < 0.2 else "kill",
                                         "down": rng.uniform(0.2, 2.0)}))
    plan.sort(key=lambda x: x[0])
    return plan


# ---------------------------------------------------------------------------------------------
# the driver


class Driver:
    def __init__(self, soak):
        self.soak = soak
        self.next_job = 1
        self.waiting = []  # arrivals deferred for room: (deadline, Job)
        self.reclaims = []  # (cpus, owner or None) that may be reclaimed
        self.references = {}
        self.next_fd_scan = 0.0
        self.resident = None  # the job that lives through every restart of the chaos phase
        self.restart_at = None  # when malld, stopped by a planned restart, starts again
        self.went_down = 0.0

    # --- references ---
    def compute_references(self):
        soak = self.soak
        cache = soak.args.references
        if cache and os.path.exists(cache):
            with open(cache) as f:
                self.references = {k: tuple(v) for k, v in json.load(f).items()}
            return
        env = {k: v for k, v in soak.env.items() if k != "MALL_SOCKET"}
        for name, (prog, pargs) in EXAMPLE_PRESETS.items():
            if name.startswith("digits") and not soak.have_digits:
                continue
            if name.startswith("mpi") and not soak.mpirun:
                continue
            argv = [os.path.join(soak.bin, prog)] + pargs + ["--threads", "1"]
            if name.startswith("mpi"):
                argv = mpirun_argv(soak.mpirun, 2, argv)
            r = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, env=dict(env, **MPI_ENV),
                               timeout=300)
            res = example_result(r.stdout.decode(errors="replace"))
            if r.returncode != 0 or res is None:
                raise SystemExit("soak: the reference run of %s failed (exit %d): %s"
                                 % (" ".join(argv), r.returncode, r.stderr.decode(errors="replace")[-500:]))
            self.references[name] = res
            soak.say("reference %s: %s" % (name, res))
        if cache:
            with open(cache, "w") as f:
                json.dump(self.references, f)

    # --- room: the soak's own guess whether malld can take a job of this min now ---
    def room_for(self, job):
        """The pool less what this program reclaimed must hold every job's claim and the new
        job's min: a job pinned by `mallctl set --cpus` claims its pin, others their min (jobs
        malld does not list yet count with their min)."""
        soak = self.soak
        listed = {j.get("job"): j for j in getattr(self, "soak_sampler", None).last_jobs} if hasattr(
            self, "soak_sampler") else {}
        claimed = 0
        for j in self.live_jobs():
            if not j.up_at_launch:
                continue
            names = [j.name] if j.ranks == 1 else ["%s-r%d" % (j.name, r) for r in range(j.ranks)]
            for name in names:
                entry = listed.get(name)
                if entry and entry.get("pinned"):
                    claimed += max(entry.get("ncpus", 0), entry.get("min", 1))
                else:
                    claimed += j.min // j.ranks
        return claimed + job.min <= soak.pool_count - len(self.reclaims)

    def live_jobs(self):
        with self.soak.jobs_lock:
            return [j for j in self.soak.jobs.values() if j.ended is None]

    # --- jobs ---
    def launch(self, job):
        soak = self.soak
        mallrun = [os.path.join(soak.bin, "mallrun"), "--socket", soak.socket, "--malleable=" + job.minmax,
                   "--weight", str(job.weight)]
        if job.ranks > 1:  # each rank registers as <name>-r<rank>
            inner = ["sh", "-c", 'exec "$@" --job %s-r$OMPI_COMM_WORLD_RANK -- %s' % (
                job.name, shlex.join(job.cmd)), "sh"] + mallrun
            argv = mpirun_argv(soak.mpirun, job.ranks, inner)
        else:
            argv = mallrun + ["--job", job.name, "--"] + job.cmd
        base = os.path.join(soak.wd, "jobs", "%04d-%s" % (job.n, job.kind))
        job.out, job.err = base + ".out", base + ".err"
        with open(job.out, "w") as f:
            f.write("# " + " ".join(argv) + "\n")
        job.epoch = soak.malld_epoch
        job.up_at_launch = soak.malld_up
        job.room = self.room_for(job)
        job.started = time.monotonic()
        env = None
        if job.ranks > 1:
            env = dict(MPI_ENV, **(MPI_ENV_AFFINITY if not soak.v1 else {}))
        job.proc = soak.spawn(argv, job.out, job.err, extra_env=env)
        with soak.jobs_lock:
            soak.jobs[job.proc.pid] = job
        soak.counts.add("jobs.started")
        soak.counts.add("jobs.started." + job.kind)
        soak.say("start %s (%s, %s, fate %s at +%.1fs): %s" % (job.name, job.minmax, job.preset or job.kind,
                                                              job.fate, job.fate_at, " ".join(job.cmd[1:])))

    def child_of(self, job):
        """A process running the command once one runs it, else None: mallrun's child (the
        registered pid), mallrun itself when it ran the command unmanaged (malld away), or for
        an MPI job the first rank found."""
        for pid in [job.proc.pid] + descendants_of(job.proc.pid):
            try:
                if os.readlink("/proc/%d/exe" % pid) == os.path.realpath(job.cmd[0]):
                    return pid
            except OSError:
                pass
        return None

    def carry_out_fate(self, job):
        if job.done_fate or job.fate == "natural" or job.ended is not None:
            return
        if time.monotonic() - job.started < job.fate_at:
            return
        child = self.child_of(job)
        if child is None:
            return  # not running the command yet (registration under way): try again later
        if job.fate == "term" and "open rc=" not in (read_text(job.out) or ""):
            return  # the client installs its SIGTERM handler before it prints that line
        try:
            if job.fate == "kill_child":
                os.kill(child, signal.SIGKILL)
            elif job.fate == "kill_group":
                os.killpg(job.proc.pid, signal.SIGKILL)
            elif job.fate == "term":
                os.kill(job.proc.pid, signal.SIGTERM)  # mallrun passes it on
        except ProcessLookupError:
            return
        job.done_fate = job.fate
        self.soak.counts.add("fate." + job.fate)
        self.soak.say("%s %s (child %d)" % (job.fate, job.name, child))

    def reap(self):
        for job in self.live_jobs():
            rc = job.proc.poll()
            if rc is None:
                self.carry_out_fate(job)
                continue
            job.ended = time.monotonic()
            self.judge(job, rc)

    def judge(self, job, rc):
        soak = self.soak
        out = read_text(job.out) or ""
        err = read_text(job.err) or ""
        job.unmanaged_flag = "without malleability" in err
        killed_malld = soak.malld_epoch != job.epoch or not job.up_at_launch
        why = None
        if job.done_fate in ("kill_child", "kill_group") and rc in (-signal.SIGKILL, 128 + signal.SIGKILL):
            outcome = "killed"  # 137 from mallrun for its child; -9 for mallrun (or an unmanaged run)
        elif job.ranks > 1 and job.done_fate == "kill_child" and rc != 0:
            outcome = "killed"  # a rank SIGKILLed: mpirun ends the others and fails
        elif "malld refused job" in err and (rc == 1 or job.ranks > 1 and rc != 0):
            outcome = "refused"
            reason = err.split("malld refused job", 1)[1].strip().splitlines()[0]
            if job.room and job.up_at_launch:
                soak.counts.add("jobs.refused_with_room")
                seen = [(j.get("job"), j.get("min"), j.get("cpus"), j.get("pinned"))
                        for j in self.soak_sampler.last_jobs]
                soak.say("refused although room was seen: %s; malld's jobs then: %s; reclaimed by this "
                         "program: %s" % (reason, seen, self.reclaims))
            soak.counts.add("refusal." + re.sub(r'"soak-[^"]*"', "JOB", re.sub(r"[0-9]+", "N", reason))[:120])
        elif (rc == 3 or job.ranks > 1 and rc != 0) and "did not answer the registration" in err and killed_malld:
            outcome = "registration_lost"
        elif rc != 0:
            outcome = "bad_exit"
            why = "exit %d" % rc
        else:
            outcome, why = self.check_output(job, out)
        job.outcome = outcome
        soak.counts.add("jobs." + outcome)
        if job.unmanaged_flag:
            soak.counts.add("jobs.unmanaged")
        soak.say("end %s: exit %d, %s%s" % (job.name, rc, outcome, " (" + why + ")" if why else ""))
        if outcome in ("bad_exit", "bad_result"):
            soak.violation("job %s (%s, fate %s%s) ended with %s: %s; stdout %s, stderr %s: %s" %
                           (job.name, " ".join(job.cmd[1:]), job.fate, " done" if job.done_fate else "",
                            outcome, why, job.out, job.err, err.strip()[-400:]))

    def check_output(self, job, out):
        if job.kind in ("client", "slow", "resident"):
            m = re.search(r"^done steps=(\d+) changes=(\d+) checksum=([0-9a-f]+)$", out, re.M)
            if not m:
                return "bad_result", "no done line"
            steps, checksum = int(m.group(1)), m.group(3)
            wanted = int(job.cmd[job.cmd.index("--steps") + 1])
            if checksum != fnv_steps(steps):
                return "bad_result", "checksum %s for %d steps, want %s" % (checksum, steps, fnv_steps(steps))
            if steps != wanted and job.done_fate != "term":
                return "bad_result", "%d steps of %d without a SIGTERM" % (steps, wanted)
            return ("terminated" if steps != wanted else "ok"), None
        if job.kind == "noack":
            if "open rc=" not in out:
                return "bad_result", "no open line"
            return ("terminated" if job.done_fate == "term" else "ok"), None
        got = example_result(out)
        ref = self.references[job.preset]
        if got is None:
            return "bad_result", "no final line"
        if ref[2] is not None:
            if got[2] != ref[2]:
                return "bad_result", "checksum %s, want %s (reference run)" % (got[2], ref[2])
        elif abs(got[0] - ref[0]) > 1e-4 * max(1.0, ref[0]) or abs((got[1] or 0) - (ref[1] or 0)) > 0.003:
            return "bad_result", "final loss %s accuracy %s, want %s %s (reference run)" % (got[0], got[1], ref[0], ref[1])
        return "ok", None

    # --- the jobs' own fds: what libmall and mallrun leave in the training process ---
    def scan_fds(self):
        """A job's process may hold its stdio, libmall's one connection (a socket) and anonymous
        inodes and memfds; a pipe or a file there leaked from mallrun or this program, and two
        sockets in two scans a second apart are a connection libmall did not close."""
        soak = self.soak
        for job in self.live_jobs():
            if job.ranks > 1:
                continue  # MPI ranks hold Open MPI's pipes and sockets
            pid = self.child_of(job)
            if pid is None:
                continue
            targets = fd_targets(pid)
            if job.proc.poll() is not None or not targets:
                continue  # ended while we looked
            kinds = collections.Counter(fd_kind(t) for t in targets[3:])
            for t in targets[3:]:
                k = fd_kind(t)
                if k == "pipe" or k.startswith("/") and not k.startswith("/memfd:"):
                    soak.counts.add("fd.unexpected")
                    soak.violation("job %s's process %d holds fd %s (leaked into it)" % (job.name, pid, t),
                                   episode=("fd", job.name, t))
            if kinds["socket"] > 1:
                if job.many_sockets:
                    soak.counts.add("fd.sockets")
                    soak.violation("job %s's process %d holds %d sockets (libmall keeps one connection)"
                                   % (job.name, pid, kinds["socket"]), episode=("sockets", job.name))
                job.many_sockets = True
            else:
                job.many_sockets = False
            if job is self.resident and "open rc=0" in (read_text(job.out) or ""):
                sample = (dict(kinds), rss_kib(pid))
                if job.fd_first is None and time.monotonic() - job.started > 2:
                    job.fd_first = sample
                job.fd_last = sample

    # --- admin commands (asynchronous; judged when they end) ---
    def mallctl(self, args, what):
        soak = self.soak
        path = os.path.join(soak.wd, "mallctl.log")
        with open(path, "a") as f:
            f.write("[%7.2f] mallctl %s\n" % (soak.now(), " ".join(args)))
        p = soak.spawn([os.path.join(soak.bin, "mallctl"), "--socket", soak.socket] + args, path)
        epoch = soak.malld_epoch if soak.malld_up else -1  # -1: malld was away at launch
        soak.ctl.append((p, what, epoch, time.monotonic(), args))
        soak.counts.add("admin." + what)

    def reap_ctl(self, wait=False):
        soak = self.soak
        still = []
        for p, what, epoch, started, args in soak.ctl:
            if wait:
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
            rc = p.poll()
            if rc is None:
                if time.monotonic() - started > 60:
                    soak.violation("mallctl %s still running after 60 s" % " ".join(args))
                    p.kill()
                    p.wait()
                else:
                    still.append((p, what, epoch, started, args))
                continue
            if rc == 0:
                soak.counts.add("admin.%s.ok" % what)
            elif rc == 1:
                soak.counts.add("admin.%s.refused" % what)
            elif rc == 3 and (epoch != soak.malld_epoch or not soak.malld_up):
                soak.counts.add("admin.%s.unreachable" % what)
            else:
                soak.violation("mallctl %s exited %d (see %s/mallctl.log)" % (" ".join(args), rc, soak.wd))
        soak.ctl = still

    def admin(self, what, params, status):
        soak = self.soak
        names = [j["job"] for j in (status or {}).get("jobs", [])]
        late = [n for n in names if "-noack" in n or "-slow" in n]
        if params["late"] and late:
            names = late  # half of the moves go to a job that acks late or never: ack windows
        pick = names[int(params["pick"] * len(names))] if names else None
        if what == "set_cpus" and pick:
            self.mallctl(["set", pick, "--cpus", params["cpus"]], what)
        elif what == "set_auto" and pick:
            self.mallctl(["set", pick, "--cpus", "auto"], what)
        elif what == "set_weight" and pick:
            self.mallctl(["set", pick, "--weight", str(params["weight"])], what)
        elif what == "policy":
            self.mallctl(["policy", params["policy"]], what)
        elif what == "reclaim" and not self.reclaims:
            cpu = params["cpus"].split("-")[0]
            owner = "soak-owner-%d" % self.next_job if params["owner"] else None
            self.reclaims.append((cpu, owner))
            self.mallctl(["reclaim", cpu, "--timeout-ms", "4000"] + (["--owner", owner] if owner else []), what)
        elif what == "release" and self.reclaims:
            cpu, owner = self.reclaims.pop()
            self.mallctl(["release", "--owner", owner] if owner else ["release", cpu], what)

    # --- phases ---
    def run_phase(self, name, seconds, restarts):
        soak = self.soak
        start = soak.now()
        end = start + seconds
        plan = draw_plan(soak.rng, soak, start, end, restarts)
        with open(os.path.join(soak.wd, "plan.txt"), "a") as f:
            for t, what, params in plan:
                f.write("%8.2f %-10s %s %s\n" % (t, what, name, json.dumps(params, sort_keys=True)))
        soak.say("phase %s: %.0f s, %d planned actions, %d malld restarts" % (name, seconds, len(plan), restarts))
        status_client = StatusClient(soak.socket)
        next_progress = soak.now() + 30
        if restarts:  # a long job that lives through every restart (its fds and RSS are compared)
            job = Job(self.next_job, "resident", None, [os.path.join(soak.bin, "mall_test_client"), "--steps",
                                                         "1000000000", "--duration-s", "86400", "--step-us",
                                                         "1000", "--threads", "2"],
                      "1:2", 1, "natural", 0)
            self.next_job += 1
            self.resident = job
            self.launch(job)
        i = 0
        while soak.now() < end and not soak.stop_requested:
            now = soak.now()
            while i < len(plan) and plan[i][0] <= now:
                t, what, params = plan[i]
                i += 1
                if what == "arrive":
                    job = draw_job(soak.rng, self.next_job, soak)
                    self.next_job += 1
                    if params["push"] or self.room_for(job):
                        self.launch(job)
                    else:
                        # an MPI job needs the whole node: it waits longer for the node to empty
                        self.waiting.append((time.monotonic() + (15 if job.ranks > 1 else 6), job))
                elif what == "restart":
                    if self.restart_at is None and soak.malld_up:
                        self.went_down = time.monotonic()
                        soak.stop_malld(params["how"])
                        soak.restarts[params["how"]] += 1
                        self.restart_at = time.monotonic() + params["down"]
                        status_client.close()
                else:
                    self.admin(what, params, status_client.status() if soak.malld_up else None)
            if self.restart_at is not None and time.monotonic() >= self.restart_at:
                self.restart_at = None
                if not soak.start_malld():
                    return False
                soak.downtime += time.monotonic() - self.went_down
            self.tick()
            if soak.now() >= next_progress:
                next_progress += 30
                self.progress()
            time.sleep(0.03)
        status_client.close()
        if self.restart_at is not None:  # the phase ended while malld was down
            self.restart_at = None
            if not soak.start_malld():
                return False
            soak.downtime += time.monotonic() - self.went_down
        return True

    def tick(self):
        self.reap()
        self.reap_ctl()
        soak = self.soak
        if soak.malld_up and soak.watcher and soak.watcher.proc.poll() is not None:
            soak.counts.add("watcher.lost")  # malld closed a watch connection: events would go uncounted
            soak.say("the event watcher ended (exit %d) while malld serves; restarted" % soak.watcher.proc.returncode)
            soak.stop_watcher()
            soak.start_watcher()
        if time.monotonic() >= self.next_fd_scan:
            self.next_fd_scan = time.monotonic() + 1.0
            self.scan_fds()
        still = []
        for deadline, job in self.waiting:
            if self.room_for(job):
                self.launch(job)
            elif time.monotonic() < deadline:
                still.append((deadline, job))
            else:
                self.soak.counts.add("arrivals.dropped")
        self.waiting = still

    def progress(self):
        c = self.soak.counts
        print("soak: %s %5.0f s: jobs %d started, %d live; %d publishes, %d ack timeouts; malld restarts %d; "
              "samples %d; violations %d" % (self.soak.backend, self.soak.now(), c["jobs.started"],
                                              len(self.live_jobs()), c["event.publish"], c["event.ack_timeout"],
                                              sum(self.soak.restarts.values()), c["samples"],
                                              len(self.soak.violations)), flush=True)

    def drain(self, label):
        """No new work; the test clients are stopped, the examples finish; then malld must be
        empty (no job, nothing reclaimed, no job cgroup) and its RSS and fds are taken."""
        soak = self.soak
        soak.say("drain %s" % label)
        for _, job in self.waiting:
            soak.counts.add("arrivals.dropped")
        self.waiting = []
        self.reap_ctl(wait=True)
        client = StatusClient(soak.socket)
        st = client.status()
        if st:
            for owner in (st.get("reserved") or {}):
                self.mallctl(["release", "--owner", owner], "release")
            self.reap_ctl(wait=True)
            st = client.status()
            if st and st.get("reclaimed"):
                self.mallctl(["release", st["reclaimed"]], "release")
                self.reap_ctl(wait=True)
        self.reclaims = []
        self.scan_fds()  # the resident job's last fds and RSS, before it is stopped
        for job in self.live_jobs():
            if job.kind in ("client", "slow", "noack", "resident") and job.fate != "kill_group":
                job.fate, job.fate_at = "term", 0
        deadline = time.monotonic() + 120
        while self.live_jobs() and time.monotonic() < deadline:
            self.reap()
            time.sleep(0.05)
        for job in self.live_jobs():
            soak.violation("job %s still running 120 s into the drain; killed" % job.name)
            os.killpg(job.proc.pid, signal.SIGKILL)
            job.proc.wait()
            self.reap()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            st = client.status()
            if st and not st.get("jobs") and not st.get("reclaimed"):
                break
            time.sleep(0.1)
        else:
            soak.violation("malld is not empty after the drain %s: %s" % (label, json.dumps(st)[:600]))
        client.close()
        time.sleep(1.0)  # let malld finish what the last exits started (state file, connections)
        pid = soak.malld.pid
        fds = fd_targets(pid)
        kinds = collections.Counter(fd_kind(t) for t in fds)
        m = (label, soak.malld_instance, rss_kib(pid), len(fds), dict(kinds))
        soak.measures.append(m)
        soak.say("malld #%d at %s: RSS %d KiB, %d fds %s" % (m[1], label, m[2], m[3], dict(kinds)))
        if soak.v1:
            left = [d for d in os.listdir(soak.cgroup_dir) if d.startswith("job_")] if os.path.isdir(
                soak.cgroup_dir) else []
            if left:
                soak.violation("job cgroups left after the drain %s: %s" % (label, left))
        return m


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
