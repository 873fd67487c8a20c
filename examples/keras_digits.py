#!/usr/bin/env python3
"""keras_digits.py — a small real Keras training (TensorFlow backend), malleable with mall's callback.

Trains a seeded MLP (64-H-10, ReLU, softmax cross-entropy, plain SGD) with model.fit on the 1797
8x8 handwritten digits that Debian's python3-sklearn ships (examples/digits_data.hpp's
kDefaultDigits, read with numpy; sklearn is not imported), a seeded 1437/360 train/test split like
the C++ examples. Launched under malld (mallrun, or the Slurm plugin: MALL_SOCKET or MALL_JOB_ID
set), model.fit gets mall.keras.Malleable(): at each batch end TensorFlow's own intra-op and
inter-op pools park or release workers to the job's allocation (unpatched TensorFlow: mall's op
library parks workers inside TensorFlow's pools). TensorFlow makes its pools once, at its first
op: mall.tensorflow.size_pools() makes them as large as the job may grow ($MALL_MAX, else the
online cpus) before that. --no-mall trains as a plain Keras program (the baseline).

Run from a checkout with the project's venv (launch_scripts/install-deps.sh makes it):
  .venv/bin/python examples/keras_digits.py [--steps N] [--batch B] [--hidden H] [--lr X]
  mallrun --malleable=1:2 -- .venv/bin/python examples/keras_digits.py

Output (stdout, line-buffered; launch_scripts/bench-keras.sh parses the fit and done lines):
  start pid P cpus LIST                           the affinity mask when TensorFlow's pools are made
  step N loss X threads T cpus LIST               every --print-every steps (T: running intra-op workers)
  resize step N threads A -> B cpus LIST          with --log-changes, each allocation applied, then
  parked step N tids T1,T2|-                      the pools' workers parked now
  ready                                           with --go-file, after the warm-up
  fit start T0 end T1                             wall-clock (time.time()) bounds of the timed fit
  done steps N seconds S images_per_s R intra_op T inter_op U threads K
  thread_names NAME:COUNT,...                     the process's threads by name, after the fit
  final loss X test_loss Y accuracy A           X: mean training loss of the timed fit; Y, A: on the 360 held out
S and R cover the timed fit only: the first --warmup steps (tracing the train step) run in an
untimed fit before it. T and U are tf.config.threading's getters: 0 means TensorFlow's default
(sized from the cpus it saw at start, as the start line shows); K counts /proc/self/task.
Exit status: 0, or 2 for bad options or missing data.
"""

import argparse
import collections
import importlib.util
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep TensorFlow's C++ banner off stderr

DEFAULT_DIGITS = "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz"
TEST_SAMPLES = 360  # as the C++ examples (examples/digits_data.hpp, kTestSamples)


def default_digits_path() -> str:
    if os.path.exists(DEFAULT_DIGITS):
        return DEFAULT_DIGITS
    spec = importlib.util.find_spec("sklearn")  # another sklearn's copy, found without importing it
    if spec is not None and spec.origin is not None:
        return str(Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz")
    return DEFAULT_DIGITS


def parse_args():
    parser = argparse.ArgumentParser(
        prog="keras_digits.py",
        description="A seeded 64-H-10 MLP trained with Keras model.fit (TensorFlow backend) on "
                    "sklearn's digits; prints its training throughput and its thread counts.",
        epilog="Last lines: 'done steps N seconds S images_per_s R intra_op T inter_op U threads K', "
               "'thread_names ...', 'final loss X test_loss Y accuracy A'. Bad options: exit 2.")
    parser.add_argument("--steps", type=int, default=2000,
                        help="timed training steps (batches), default %(default)s")
    parser.add_argument("--warmup", type=int, default=20,
                        help="untimed steps run first (tracing, first allocations), default %(default)s")
    parser.add_argument("--batch", type=int, default=128, help="images per step, default %(default)s")
    parser.add_argument("--hidden", type=int, default=128, help="hidden units, default %(default)s")
    parser.add_argument("--lr", type=float, default=0.5, help="SGD learning rate, default %(default)s")
    parser.add_argument("--seed", type=int, default=1,
                        help="seed of the split, the shuffling and the initial weights, default %(default)s")
    parser.add_argument("--go-file", default=None, metavar="PATH",
                        help="after the warm-up, print 'ready' and wait until PATH exists before the "
                             "timed fit (lets copies run at once start their timed fits together)")
    parser.add_argument("--print-every", type=int, default=0,
                        help="print the loss every K steps of the timed fit (0: never), default %(default)s")
    parser.add_argument("--log-changes", action="store_true",
                        help="print a line for each allocation applied (under malld)")
    parser.add_argument("--no-mall", action="store_true",
                        help="plain Keras, even under malld (the baseline)")
    parser.add_argument("--data", default=default_digits_path(),
                        help="sklearn's digits.csv.gz (default: %(default)s, from python3-sklearn)")
    args = parser.parse_args()
    for name in ("steps", "batch", "hidden"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.warmup < 0:
        parser.error("--warmup must be at least 0")
    if not args.lr > 0:
        parser.error("--lr must be positive")
    if not os.path.exists(args.data):
        parser.error(f"no digits data at {args.data!r}: install python3-sklearn (Debian) or pass --data FILE")
    return args


def load_digits(path: str, seed: int):
    """The pixels scaled to 0..1 and the labels; a seeded shuffle, the last TEST_SAMPLES held out."""
    import numpy as np
    data = np.loadtxt(path, delimiter=",", dtype=np.float32)  # 65 integers a line, the label last
    if data.ndim != 2 or data.shape[1] != 65 or len(data) <= TEST_SAMPLES:
        raise SystemExit(f"keras_digits.py: {path}: expected rows of 64 pixels and a label, "
                         f"more than {TEST_SAMPLES} of them")
    data = data[np.random.default_rng(seed).permutation(len(data))]
    x = data[:, :64] / 16.0
    y = data[:, 64].astype(np.int32)
    cut = len(data) - TEST_SAMPLES
    return x[:cut], y[:cut], x[cut:], y[cut:]


def cpu_list(cpus) -> str:
    """A sorted cpu set as a Linux cpu list, e.g. 0-1,4."""
    ranges, cpus = [], sorted(cpus)
    for c in cpus:
        if ranges and c == ranges[-1][1] + 1:
            ranges[-1][1] = c
        else:
            ranges.append([c, c])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in ranges)


def thread_names() -> collections.Counter:
    names = collections.Counter()
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names[f.read().strip()] += 1
        except OSError:  # the thread ended meanwhile
            pass
    return names


def main() -> int:
    args = parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    train_x, train_y, test_x, test_y = load_digits(args.data, args.seed)

    under_malld = bool(os.environ.get("MALL_SOCKET") or os.environ.get("MALL_JOB_ID")) and not args.no_mall
    import tensorflow as tf
    import keras
    callbacks = []
    if under_malld:
        try:
            import mall.keras
            import mall.tensorflow
        except ImportError as exc:  # mall's Python package is not on the path
            print(f"keras_digits.py: warning: not malleable, mall's Python package cannot be imported "
                  f"({exc}): install mall, or set PYTHONPATH=<repo>/python", file=sys.stderr)
            under_malld = False
    if under_malld:
        mall.tensorflow.size_pools()  # before TensorFlow's first op: pools as large as the job may grow
        malleable = mall.keras.Malleable()
        callbacks.append(malleable)

    # TensorFlow makes its pools with the first op below, from this affinity mask.
    print(f"start pid {os.getpid()} cpus {cpu_list(os.sched_getaffinity(0))}")
    keras.utils.set_random_seed(args.seed)
    model = keras.Sequential([
        keras.Input(shape=(64,)),
        keras.layers.Dense(args.hidden, activation="relu"),
        keras.layers.Dense(10),
    ])
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=args.lr),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], jit_compile=False)  # no XLA: TensorFlow's own kernels and pools

    dataset = (tf.data.Dataset.from_tensor_slices((train_x, train_y))
               .shuffle(len(train_x), seed=args.seed, reshuffle_each_iteration=True)
               .batch(args.batch, drop_remainder=True)
               .repeat()
               .prefetch(2))
    if args.warmup > 0:
        model.fit(dataset, epochs=1, steps_per_epoch=args.warmup, shuffle=False, verbose=0)
    if args.go_file:
        print("ready")
        while not os.path.exists(args.go_file):
            time.sleep(0.01)
    class Report(keras.callbacks.Callback):
        """The step lines, and the change lines under malld (after mall's callback ran)."""

        def __init__(self):
            super().__init__()
            self.step = 0
            self.changes = 0
            self.threads = mall.tensorflow.threads().intra if under_malld else 0

        def on_train_batch_end(self, batch, logs=None):
            self.step += 1
            if under_malld and malleable.changes != self.changes:
                self.changes = malleable.changes
                if args.log_changes:
                    pools = mall.tensorflow.threads()
                    allocation = malleable.client.allocation
                    print(f"resize step {self.step} threads {self.threads} -> {pools.intra} cpus {allocation.text}")
                    self.threads = pools.intra
                    parked = pools.intra_parked + pools.inter_parked
                    print(f"parked step {self.step} tids {','.join(map(str, parked)) or '-'}")
            if args.print_every and (self.step % args.print_every == 0 or self.step == 1):
                running = mall.tensorflow.threads().intra if under_malld else os.cpu_count()
                print(f"step {self.step} loss {float(logs['loss']):.6f} threads {running} "
                      f"cpus {cpu_list(os.sched_getaffinity(0))}")

    callbacks.append(Report())
    start = time.time()
    history = model.fit(dataset, epochs=1, steps_per_epoch=args.steps, shuffle=False, verbose=0,
                        callbacks=callbacks)
    end = time.time()
    seconds = end - start

    names = thread_names()
    print(f"fit start {start:.6f} end {end:.6f}")
    print(f"done steps {args.steps} seconds {seconds:.3f} images_per_s {args.steps * args.batch / seconds:.1f} "
          f"intra_op {tf.config.threading.get_intra_op_parallelism_threads()} "
          f"inter_op {tf.config.threading.get_inter_op_parallelism_threads()} "
          f"threads {sum(names.values())}")
    print("thread_names " + ",".join(f"{n}:{c}" for n, c in sorted(names.items())))
    test_loss, accuracy = model.evaluate(test_x, test_y, batch_size=len(test_x), verbose=0)
    print(f"final loss {history.history['loss'][-1]:.4f} test_loss {test_loss:.4f} accuracy {accuracy:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
