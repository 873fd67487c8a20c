# SPDX-License-Identifier: BSD-3-Clause
# soak_sampler.py — soak.py's sampler thread: every --sample-ms it brackets every job's cpus
# between two Status replies and counts a cpu in two jobs' cpusets (and threads outside their
# job's cpus) as a violation. Contract: reads /proc, cgroup files and Status only; reports through
# the run's Soak object (soak.py).
import json
import threading
import time
from soak_system import (StatusClient, cpus_text, descendants_of, live_threads_mask, parse_cpus,
                         proc_stat, read_text)

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
