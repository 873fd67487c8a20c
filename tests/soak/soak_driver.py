# SPDX-License-Identifier: BSD-3-Clause
# soak_driver.py — soak.py's driver: the jobs it can start (example presets, mpirun), the plan drawn
# from the seed before anything runs (arrivals, kills, admin commands, malld restarts) and the
# Driver that carries it out and checks each job's result. Contract: every process it starts
# carries MALL_SOAK_RUN=<workdir> and is ended by the Driver or by soak.py's sweep.
# Why one file of ~600 lines: it is the soak's one acting part, and its pieces share one state. A
# Job is drawn by the plan, launched (with the guess room_for made then and malld's epoch), given
# its fate and judged on the same record, and what judge() excuses (a refusal, a lost registration)
# depends on the restarts and reclaims run_phase and admin() carried out meanwhile; split, each
# piece would reach back into the Driver. What only reads stays apart: soak_system.py (the machine,
# malld's status) and soak_sampler.py (the sampler thread).
import collections
import json
import os
import re
import shlex
import signal
import subprocess
import time
from soak_system import StatusClient, descendants_of, fd_kind, fd_targets, fnv_steps, read_text, rss_kib

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
