#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""bench_share_idle.py — the measurement behind issue 41's choice of how to give the idle time
inside a job's steps to its neighbours: J copies of examples/keras_digits.py (plain Keras,
TensorFlow's pools sized for the whole node) trained at once under each thread placement below,
set from outside on every thread of each copy once all copies are ready (as root: SCHED_IDLE may be
set on another process's threads, never taken back by an unprivileged one).

  oversubscribed  nothing: every thread may run on every cpu (what sites do without mall)
  static          copy i's threads on cpu i only (a static partition; mall's two-phase promise)
  idle-borrow     copy i's threads on cpu i, except every other TensorFlow worker (tf_Compute,
                  by thread id), which runs on the other copies' cpus at SCHED_IDLE: it gets
                  only the time those copies leave idle, and a copy's own cpu is never slowed
                  by a neighbour's borrowed work (the kernel preempts an idle-class thread as
                  soon as a normal one wakes)
  float-python    copy i's TensorFlow workers (tf_Compute) on cpu i, its other threads (Python,
                  Keras, tf.data, the graph runner) on every cpu at normal priority: how much of
                  the gain is the time between kernels (this one may slow a neighbour's cpu)
  static-sized    as static, with each copy's pools sized to its share of the cpus (keras_digits.py
                  --threads): what mall's confinement gives, a running worker per cpu
  shared-sized    every thread on every cpu (overlapping cpusets), each copy's pools sized to its
                  share: as many workers as cpus in all, so no worker waits for another copy's
                  worker, and a copy's Python and tf.data time between kernels is the gap the
                  other copy's workers fill

Usage: launch_scripts/bench_share_idle.py [--model M] [--steps N] [--rounds R] [--jobs J]
                                          [--placements P1,P2,...] [--python PY]
                                          [--first-copy-args "ARGS"]
--first-copy-args adds keras_digits.py options to the first copy only, for a mix: e.g.
"--input-wait-ms 30 --steps 150" makes it a job whose cores idle while its input arrives (given
fewer steps so that both copies train for about as long).
Output: per round and placement each copy's images/s and busy fraction (its cpu seconds over
its cpu share times the fit's wall time), the total; then the medians per placement and the
ratios of oversubscribed to static and of each sharing placement to the better of those two,
and of shared-sized to static-sized (sharing against mall's confinement) when both ran.
Needs root, TensorFlow in $MALL_TF_VENV or <repo>/.venv (launch_scripts/install-deps.sh) and
python3-sklearn's digits. Exit 0, 1 when a copy failed, 2 for bad options.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PLACEMENTS = ("oversubscribed", "static", "idle-borrow", "float-python", "static-sized", "shared-sized")
SIZED = ("static-sized", "shared-sized")  # pools sized to the copy's share (--threads)


def parse_args():
    parser = argparse.ArgumentParser(prog="bench_share_idle.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="convnet", help="keras_digits.py's --model, default %(default)s")
    parser.add_argument("--steps", type=int, default=2000, help="timed steps per copy, default %(default)s")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of all placements, alternating, default %(default)s")
    parser.add_argument("--jobs", type=int, default=0, help="copies (default: the online cpus)")
    parser.add_argument("--placements", default=",".join(PLACEMENTS),
                        help="which placements, comma-separated, default %(default)s")
    parser.add_argument("--first-copy-args", default="", metavar="ARGS",
                        help="keras_digits.py options for the first copy only (a mix), e.g. \"--input-wait-ms 30 --steps 150\"")
    venv = Path(os.environ.get("MALL_TF_VENV", REPO / ".venv"))
    parser.add_argument("--python", default=str(venv / "bin/python"),
                        help="the python of a venv with TensorFlow (default: $MALL_TF_VENV's, else <repo>/.venv's)")
    args = parser.parse_args()
    args.placements = [p for p in args.placements.split(",") if p]
    if any(p not in PLACEMENTS for p in args.placements) or not args.placements:
        parser.error(f"--placements takes some of {','.join(PLACEMENTS)}")
    cpus = sorted(os.sched_getaffinity(0))
    args.jobs = args.jobs or len(cpus)
    if args.steps < 1 or args.rounds < 1 or not 2 <= args.jobs <= len(cpus):
        parser.error(f"--steps and --rounds must be positive, --jobs 2..{len(cpus)}")
    if os.geteuid() != 0:
        parser.error("needs root (SCHED_IDLE on other processes' threads)")
    args.cpus = cpus
    return args


def threads_of(pid: int) -> list[tuple[int, str]]:
    """(tid, name) of every thread of pid, in tid order."""
    out = []
    for tid in sorted(int(t) for t in os.listdir(f"/proc/{pid}/task")):
        try:
            out.append((tid, Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()))
        except OSError:
            pass
    return out


def place(placement: str, pids: list[int], cpus: list[int]) -> None:
    """Sets every thread's cpus (and the borrowed workers' SCHED_IDLE) as `placement` says."""
    for i, pid in enumerate(pids):
        own, others = {cpus[i]}, set(cpus[:len(pids)]) - {cpus[i]}
        workers = 0
        for tid, name in threads_of(pid):
            try:
                if placement in ("static", "static-sized"):
                    os.sched_setaffinity(tid, own)
                elif placement == "float-python":
                    os.sched_setaffinity(tid, own if name.startswith("tf_Compute") else own | others)
                elif placement == "idle-borrow":
                    borrowed = name.startswith("tf_Compute") and workers % 2 == 1
                    workers += name.startswith("tf_Compute")
                    os.sched_setaffinity(tid, others if borrowed else own)
                    if borrowed:
                        os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
            except ProcessLookupError:
                pass


def run_round(args, placement: str) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="mall-share-idle.") as tmp:
        go = Path(tmp, "go")
        command = [args.python, str(REPO / "examples/keras_digits.py"), "--no-mall", "--model", args.model,
                   "--steps", str(args.steps), "--go-file", str(go)]
        if placement in SIZED:  # shared-sized: nothing to place, every thread may run on every cpu
            command += ["--threads", str(max(1, len(args.cpus) // args.jobs))]
        env = dict(os.environ, MALL_SOCKET="", MALL_JOB_ID="", TF_CPP_MIN_LOG_LEVEL="2")
        outs = [Path(tmp, f"copy{i}.out") for i in range(args.jobs)]
        first = command + args.first_copy_args.split()  # argparse: a later --steps wins
        procs = [subprocess.Popen(first if i == 0 else command, stdout=out.open("w"), stderr=subprocess.DEVNULL,
                                  env=env) for i, out in enumerate(outs)]
        try:
            while not all("ready" in out.read_text().split("\n") for out in outs):
                if any(p.poll() is not None for p in procs):
                    raise RuntimeError(f"a copy ended before it was ready: {[o.read_text()[-300:] for o in outs]}")
                time.sleep(0.05)
            place(placement, [p.pid for p in procs], args.cpus)
            go.touch()
            for p in procs:
                p.wait(timeout=1800)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        copies = []
        for out in outs:
            text = out.read_text()
            fit = re.search(r"^fit start (\S+) end (\S+) cpu (\S+)", text, re.M)
            done = re.search(r"images_per_s (\S+)", text)
            if not fit or not done:
                raise RuntimeError(f"a copy printed no result: {text[-400:]}")
            seconds = float(fit.group(2)) - float(fit.group(1))
            share = len(args.cpus) / args.jobs
            copies.append({"rate": float(done.group(1)), "busy": float(fit.group(3)) / (seconds * share)})
        return copies


def main() -> int:
    args = parse_args()
    totals: dict[str, list[float]] = {p: [] for p in args.placements}
    print(f"bench_share_idle: {args.jobs} copies of keras_digits.py --model {args.model} --steps {args.steps}, "
          f"cpus {','.join(map(str, args.cpus))}, {args.rounds} round(s)"
          + (f"; the first copy with {args.first_copy_args}" if args.first_copy_args else ""))
    for r in range(args.rounds):
        for placement in args.placements:
            copies = run_round(args, placement)
            total = sum(c["rate"] for c in copies)
            totals[placement].append(total)
            each = "  ".join(f"{c['rate']:9.1f} (busy {c['busy']:.2f})" for c in copies)
            print(f"round {r + 1} {placement:15s} total {total:9.1f} images/s   copies {each}")
    print("\nplacement        images/s (median)")
    medians = {p: statistics.median(v) for p, v in totals.items()}
    for p, m in medians.items():
        print(f"{p:15s} {m:12.1f}")
    if {"static", "oversubscribed"} <= medians.keys():
        best = max(medians["static"], medians["oversubscribed"])
        print(f"oversubscribed_vs_static={medians['oversubscribed'] / medians['static']:.2f}", end="")
        for p in ("idle-borrow", "float-python", "static-sized", "shared-sized"):
            if p in medians:
                print(f" {p.replace('-', '_')}_vs_best={medians[p] / best:.2f}", end="")
        print()
    if {"static-sized", "shared-sized"} <= medians.keys():
        print(f"shared_sized_vs_static_sized={medians['shared-sized'] / medians['static-sized']:.2f}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("bench_share_idle.py: interrupted", file=sys.stderr)
        sys.exit(130)
    except RuntimeError as error:
        print(f"bench_share_idle.py: {error}", file=sys.stderr)
        sys.exit(1)
