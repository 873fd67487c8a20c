#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""bench_share_idle_digits.py — issue 41's question asked of C++ Eigen pools instead of Keras: can
the time a job leaves idle inside its steps be given to a neighbour without oversubscription's
costs? Two copies of mall_train_digits (no malld) share a 2-cpu node: "dense" (batch 512, 1024
hidden units: compute-bound) and "waiting" (the same, but each step first waits --wait-us for its
batch, as for an input pipeline: its cpu idles meanwhile). Each round runs them together under
each placement, set from outside on the copies' threads:

  static          dense on cpu 0, waiting on cpu 1, one thread each (a static split; mall's
                  exclusive cores, the two-phase promise)
  oversub         both unpinned, each pool sized for the node (what sites do without mall)
  idle-borrow     dense sized for the node: its main thread and first worker on cpu 0, its second
                  worker on cpu 1 at SCHED_IDLE (only the time waiting leaves idle); waiting on cpu 1
  shared-sized    both unpinned (overlapping cpusets), one thread each
  overlap-normal  dense sized for the node and unpinned at normal priority; waiting on cpu 1 (its
                  cpu is no longer its own)

Output per round and placement: each copy's images/s and the total work rate (each copy's rate over
its own one-core rate, measured alone first: 2.0 at most on 2 cpus); then the medians and each
placement's ratio to the better of static and oversub, and what it did to the waiting copy (its
rate over its static rate: below 1, its own cpu was slowed by the neighbour).
Usage: launch_scripts/bench_share_idle_digits.py [--rounds R] [--wait-us U] [--placements P,...]
Needs a build (MALL_BUILD_DIR, default build/) and python3-sklearn's digits; runs on cpus 0 and 1.
Everything it starts is killed at the end. Exit 0, 1 when a copy failed, 2 for bad options.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time

PLACEMENTS = ("static", "oversub", "idle-borrow", "shared-sized", "overlap-normal")
MODEL = ["--pool", "eigen", "--quiet", "--print-every", "0", "--batch", "512", "--hidden", "1024"]
children: list[subprocess.Popen] = []


def parse_args():
    parser = argparse.ArgumentParser(prog="bench_share_idle_digits.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every placement, default %(default)s")
    parser.add_argument("--wait-us", type=int, default=4000, help="the waiting copy's wait per step, default %(default)s")
    parser.add_argument("--placements", default=",".join(PLACEMENTS), help="comma-separated, default all")
    args = parser.parse_args()
    args.placements = [p for p in args.placements.split(",") if p]
    bad = [p for p in args.placements if p not in PLACEMENTS]
    if bad or not args.placements or args.rounds < 1 or not 0 < args.wait_us <= 1000000:
        parser.error(f"--placements from {', '.join(PLACEMENTS)}; --rounds >= 1; 0 < --wait-us <= 1000000"
                     + (f" (unknown: {', '.join(bad)})" if bad else ""))
    return args


def start(program: str, threads: int, steps: int, wait_us: int = 0, cpu: int | None = None) -> subprocess.Popen:
    cmd = [program, "--threads", str(threads), "--steps", str(steps), *MODEL]
    if wait_us:
        cmd += ["--input-wait-us", str(wait_us)]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         preexec_fn=(lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None)
    children.append(p)
    return p


def images_per_s(p: subprocess.Popen) -> float:
    out = p.communicate()[0]
    children.remove(p)
    m = re.search(r"images_per_s ([0-9.]+)", out)
    if p.returncode != 0 or not m:
        sys.exit(f"bench_share_idle_digits.py: a copy failed (exit {p.returncode}): {out[-400:]}")
    return float(m.group(1))


def threads_of(p: subprocess.Popen, count: int) -> list[int]:
    """The copy's thread ids once its pool is up (main thread first)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        tids = sorted(int(t) for t in os.listdir(f"/proc/{p.pid}/task"))
        if len(tids) >= count:
            return tids
        time.sleep(0.01)
    sys.exit(f"bench_share_idle_digits.py: the copy never started {count} threads")


def main() -> int:
    args = parse_args()
    if (os.cpu_count() or 1) < 2:
        sys.exit("bench_share_idle_digits.py: needs 2 cpus")
    build = os.environ.get("MALL_BUILD_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build"))
    program = os.path.join(build, "bin", "mall_train_digits")
    if not os.access(program, os.X_OK):
        sys.exit(f"bench_share_idle_digits.py: {program} is not built (ninja -C {build} mall_train_digits)")
    dense_1 = images_per_s(start(program, 1, 600, cpu=0))
    waiting_1 = images_per_s(start(program, 1, 400, args.wait_us, cpu=1))
    print(f"alone on one cpu: dense {dense_1:.0f} images/s, waiting {waiting_1:.0f} images/s "
          f"(--wait-us {args.wait_us})")
    # Steps so that each copy runs about 8-10 s together.
    dense_steps, waiting_steps = int(dense_1 * 9 / 512), int(waiting_1 * 10 / 512)

    def run(place: str) -> tuple[float, float]:
        if place == "static":
            d, w = start(program, 1, dense_steps, cpu=0), start(program, 1, waiting_steps, args.wait_us, cpu=1)
        elif place == "oversub":
            d, w = start(program, 2, dense_steps), start(program, 2, waiting_steps, args.wait_us)
        elif place == "shared-sized":
            d, w = start(program, 1, dense_steps), start(program, 1, waiting_steps, args.wait_us)
        else:  # dense sized for the node beside waiting on cpu 1
            d, w = start(program, 2, dense_steps), start(program, 1, waiting_steps, args.wait_us, cpu=1)
            if place == "idle-borrow":
                main_thread, first_worker, second_worker = threads_of(d, 3)[:3]
                for tid in (main_thread, first_worker):
                    os.sched_setaffinity(tid, {0})
                os.sched_setaffinity(second_worker, {1})
                os.sched_setscheduler(second_worker, os.SCHED_IDLE, os.sched_param(0))
        return images_per_s(d), images_per_s(w)

    results: dict[str, list[tuple[float, float, float]]] = {p: [] for p in args.placements}
    for r in range(args.rounds):
        for place in args.placements:
            dense, waiting = run(place)
            work = dense / dense_1 + waiting / waiting_1
            results[place].append((dense, waiting, work))
            print(f"round {r + 1} {place:<15} dense {dense:8.0f} waiting {waiting:8.0f} work/s {work:.3f}", flush=True)
    med = {p: tuple(statistics.median(x[i] for x in v) for i in range(3)) for p, v in results.items()}
    print("\nmedians:")
    for place, (dense, waiting, work) in med.items():
        print(f"  {place:<15} dense {dense:8.0f} waiting {waiting:8.0f} work/s {work:.3f}")
    best = max((med[p][2] for p in ("static", "oversub") if p in med), default=None)
    if best:
        line = " ".join(f"{p.replace('-', '_')}_vs_best={med[p][2] / best:.2f}" for p in med)
        if "static" in med:
            line += " " + " ".join(f"{p.replace('-', '_')}_waiting_vs_static={med[p][1] / med['static'][1]:.2f}"
                                   for p in med if p != "static")
        print(line)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        for child in children:
            child.kill()
            child.wait()
