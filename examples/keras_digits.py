#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
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
  resize step N threads A -> B cpus LIST          with --log-changes, each allocation applied (step
                                                  0: in the warm-up or waiting for --go-file), then
  parked step N tids T1,T2|-                      the pools' workers parked now
  ready                                           with --go-file, after the warm-up
  fit start T0 end T1 cpu C                       wall-clock (time.time()) bounds of the timed
                                                  steps, and the cpu seconds all threads used meanwhile
  done steps N seconds S images_per_s R intra_op T inter_op U threads K
  thread_names NAME:COUNT,...                     the process's threads by name, after the fit
  final loss X test_loss Y accuracy A           X: mean training loss of the timed fit (of its last
                                                  epoch with --validate-every); Y, A: on the 360 held out
S and R cover the timed fit's steps 2..N, from the end of its first step to the end of its last
(both waited for): the first --warmup steps (tracing the train step) run in an untimed fit before
it, and Keras's own start and end of a fit are left out (its end alone took 0-2 s here, whatever
the steps did). T and U are tf.config.threading's getters: 0 means TensorFlow's default
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
MODELS = ("mlp", "conv", "gru")  # the models tf_function_digits.py's own loop trains too
FIT_MODELS = MODELS + ("convnet",)  # model.fit's: convnet's dropout and validation need Keras's fit


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
    parser.add_argument("--model", choices=FIT_MODELS, default="mlp",
                        help="mlp: 64-H-10 dense; conv: Conv2D(H/8 filters, 3x3) on the 8x8 image, then "
                             "dense; gru: a GRU of H units over the image's 8 rows (kernels that nest "
                             "parallel regions); convnet: two conv blocks with dropout and a dense layer "
                             "of H, trained with Adam (--lr unused) and validated every --validate-every "
                             "steps, a step with idle time in it (Python, callbacks, metrics, the "
                             "validation pass), default %(default)s")
    parser.add_argument("--validate-every", type=int, default=None, metavar="K",
                        help="validate on 10%% of the training images every K timed steps (K must "
                             "divide --steps; 0: never); default 50 for convnet, 0 for the others")
    parser.add_argument("--input-wait-ms", type=float, default=0, metavar="MS",
                        help="each batch's input waits MS ms without using a cpu (a slow file "
                             "system or network read, in tf.data, overlapped with the steps by the "
                             "prefetch): a job whose cores idle while its input arrives; default 0")
    parser.add_argument("--threads", type=int, default=0, metavar="N",
                        help="make TensorFlow's pools N workers each (what a user who fixes "
                             "TensorFlow's threads gets: under malld they are pinned to the allocation "
                             "but never more than N run); default: as large as the job may grow")
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
    check_common_args(parser, args)
    if args.warmup < 0:
        parser.error("--warmup must be at least 0")
    if args.validate_every is None:
        args.validate_every = 50 if args.model == "convnet" else 0
    if args.validate_every < 0 or (args.validate_every and args.steps % args.validate_every):
        parser.error(f"--validate-every must be 0 or divide --steps ({args.steps})")
    return args


def check_common_args(parser, args) -> None:
    """The checks of the options this program shares with tf_function_digits.py (exit 2 on a bad one)."""
    if args.threads < 0:
        parser.error("--threads must be at least 1 (or 0: the default)")
    for name in ("steps", "batch", "hidden"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if not args.lr > 0:
        parser.error("--lr must be positive")
    if not os.path.exists(args.data):
        parser.error(f"no digits data at {args.data!r}: install python3-sklearn (Debian) or pass --data FILE")


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


def build_model(kind: str, hidden: int, seed: int):
    """The seeded model --model names, its logits unscaled (10 classes); input: 64 pixels."""
    import keras
    keras.utils.set_random_seed(seed)
    if kind == "convnet":
        filters = max(4, hidden // 8)
        body = [keras.layers.Reshape((8, 8, 1)),
                keras.layers.Conv2D(filters, 3, padding="same", activation="relu"),
                keras.layers.Conv2D(filters, 3, padding="same", activation="relu"),
                keras.layers.MaxPooling2D(2), keras.layers.Dropout(0.25),
                keras.layers.Conv2D(2 * filters, 3, padding="same", activation="relu"),
                keras.layers.MaxPooling2D(2), keras.layers.Dropout(0.25),
                keras.layers.Flatten(), keras.layers.Dense(hidden, activation="relu"), keras.layers.Dropout(0.5)]
    elif kind == "conv":
        body = [keras.layers.Reshape((8, 8, 1)),
                keras.layers.Conv2D(max(1, hidden // 8), 3, padding="same", activation="relu"),
                keras.layers.Flatten()]
    elif kind == "gru":
        body = [keras.layers.Reshape((8, 8)), keras.layers.GRU(hidden)]
    else:
        body = [keras.layers.Dense(hidden, activation="relu")]
    return keras.Sequential([keras.Input(shape=(64,)), *body, keras.layers.Dense(10)])


def training_dataset(train_x, train_y, args, under_malld: bool, input_wait_ms: float = 0):
    """The seeded, reshuffled, endless batches; under malld on TensorFlow's inter-op pool
    (mall.tensorflow.on_pools: tf.data's functions then follow the allocation too); with
    input_wait_ms, each batch first waits that long (keras_digits.py --input-wait-ms)."""
    import tensorflow as tf
    dataset = (tf.data.Dataset.from_tensor_slices((train_x, train_y))
               .shuffle(len(train_x), seed=args.seed, reshuffle_each_iteration=True)
               .batch(args.batch, drop_remainder=True)
               .repeat())
    if input_wait_ms > 0:  # a blocking read per batch: time.sleep releases the GIL and the cpu
        seconds = input_wait_ms / 1000

        def read_slowly(x, y):
            time.sleep(seconds)
            return x, y

        dataset = dataset.map(lambda x, y: tf.numpy_function(read_slowly, [x, y], [x.dtype, y.dtype],
                                                            stateful=True))
        dataset = dataset.map(lambda x, y: (tf.ensure_shape(x, [args.batch, 64]), tf.ensure_shape(y, [args.batch])))
    dataset = dataset.prefetch(2)
    if under_malld:
        import mall.tensorflow
        dataset = mall.tensorflow.on_pools(dataset)
    return dataset


def size_tensorflow_pools(threads: int, under_malld: bool) -> None:
    """Before TensorFlow's first op: under malld, pools as large as the job may grow (or --threads);
    a plain run with --threads fixes TensorFlow's pools the usual way."""
    import tensorflow as tf
    if under_malld:
        import mall.tensorflow
        mall.tensorflow.size_pools(threads or None)
    elif threads:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)


class ChangeLog:
    """The resize and parked lines (--log-changes) and the running count for the step lines."""

    def __init__(self, under_malld: bool, log_changes: bool):
        self.under_malld = under_malld
        self.log_changes = log_changes
        self.threads = self.running() if under_malld else 0
        self.seen = 0  # the Keras callback's changes already logged

    def running(self) -> int:
        if not self.under_malld:
            return os.cpu_count() or 1
        import mall.tensorflow
        return mall.tensorflow.threads().intra

    def changed(self, step: int, allocation_text: str) -> None:
        """After an allocation was applied at `step`."""
        if not self.log_changes:
            return
        import mall.tensorflow
        pools = mall.tensorflow.threads()
        print(f"resize step {step} threads {self.threads} -> {pools.intra} cpus {allocation_text}")
        self.threads = pools.intra
        parked = pools.intra_parked + pools.inter_parked
        print(f"parked step {step} tids {','.join(map(str, parked)) or '-'}")

    def after(self, step: int, callback) -> None:
        """After a batch end (or a step between fits) of mall.keras.Malleable `callback`: logs the
        allocations it applied since the last call."""
        if callback.changes != self.seen:
            self.seen = callback.changes
            self.changed(step, callback.client.allocation.text)

    def step_line(self, step: int, loss: float) -> str:
        return f"step {step} loss {loss:.6f} threads {self.running()} cpus {cpu_list(os.sched_getaffinity(0))}"


def under_malld_or_warn(no_mall: bool, program: str) -> bool:
    """Launched under malld (mallrun, the Slurm plugin) and mall's Python package importable."""
    if no_mall or not (os.environ.get("MALL_SOCKET") or os.environ.get("MALL_JOB_ID")):
        return False
    try:
        import mall.tensorflow  # noqa: F401
    except ImportError as exc:  # mall's Python package is not on the path
        print(f"{program}: warning: not malleable, mall's Python package cannot be imported "
              f"({exc}): install mall, or set PYTHONPATH=<repo>/python", file=sys.stderr)
        return False
    return True


def main() -> int:
    args = parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    train_x, train_y, test_x, test_y = load_digits(args.data, args.seed)

    under_malld = under_malld_or_warn(args.no_mall, "keras_digits.py")
    import tensorflow as tf
    import keras
    size_tensorflow_pools(args.threads, under_malld)
    callbacks = []
    if under_malld:
        import mall.keras
        import mall.tensorflow
        malleable = mall.keras.Malleable()
        callbacks.append(malleable)

    # TensorFlow makes its pools with the first op below, from this affinity mask.
    print(f"start pid {os.getpid()} cpus {cpu_list(os.sched_getaffinity(0))}")
    model = build_model(args.model, args.hidden, args.seed)
    optimizer = (keras.optimizers.Adam(learning_rate=1e-3) if args.model == "convnet"
                 else keras.optimizers.SGD(learning_rate=args.lr))
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], jit_compile=False)  # no XLA: TensorFlow's own kernels and pools

    validation = {}
    if args.validate_every:  # the last tenth of the (shuffled) training images, held out
        cut = len(train_x) - len(train_x) // 10
        validation = {"validation_data": (train_x[cut:], train_y[cut:])}
        train_x, train_y = train_x[:cut], train_y[:cut]
    dataset = training_dataset(train_x, train_y, args, under_malld, args.input_wait_ms)
    change_log = ChangeLog(under_malld, args.log_changes)

    if args.warmup > 0:  # under malld the warm-up follows the allocation too: its changes log as step 0
        warmup_log = keras.callbacks.LambdaCallback(
            on_train_batch_end=lambda batch, logs: change_log.after(0, malleable))
        model.fit(dataset, epochs=1, steps_per_epoch=args.warmup, shuffle=False, verbose=0,
                  callbacks=[malleable, warmup_log] if under_malld else [])
    if args.go_file:
        print("ready")
        while not os.path.exists(args.go_file):
            # Between fits is a step boundary too: a change made while it waits is applied now.
            if under_malld:
                malleable.step()
                change_log.after(0, malleable)
            time.sleep(0.01)

    class Report(keras.callbacks.Callback):
        """The step lines, and the change lines under malld (after mall's callback ran)."""

        def __init__(self):
            super().__init__()
            self.step = 0
            self.log = change_log
            self.marks = []  # (wall, cpu) at the end of the first and of the last step

        def on_train_batch_end(self, batch, logs=None):
            self.step += 1
            if self.step in (1, args.steps):  # the timed window's ends, once the step has run
                float(logs["loss"])
                self.marks.append((time.time(), time.process_time()))
            if under_malld:
                self.log.after(self.step, malleable)
            if args.print_every and (self.step % args.print_every == 0 or self.step == 1):
                print(self.log.step_line(self.step, float(logs["loss"])))

    report = Report()
    callbacks.append(report)
    fit_start, fit_cpu = time.time(), time.process_time()
    # With validation, the timed fit is --steps / K epochs of K steps, each followed by a
    # validation pass (Keras validates at an epoch's end).
    per_epoch = args.validate_every or args.steps
    history = model.fit(dataset, epochs=args.steps // per_epoch, steps_per_epoch=per_epoch, shuffle=False,
                        verbose=0, callbacks=callbacks, **validation)
    if args.steps > 1:
        (start, cpu_start), (end, cpu_end) = report.marks[0], report.marks[-1]
        timed_steps = args.steps - 1
    else:  # one step: the whole fit
        (start, cpu_start), (end, cpu_end), timed_steps = (fit_start, fit_cpu), (time.time(), time.process_time()), 1
    seconds = end - start

    names = thread_names()
    print(f"fit start {start:.6f} end {end:.6f} cpu {cpu_end - cpu_start:.3f}")
    print(f"done steps {args.steps} seconds {seconds:.3f} images_per_s {timed_steps * args.batch / seconds:.1f} "
          f"intra_op {tf.config.threading.get_intra_op_parallelism_threads()} "
          f"inter_op {tf.config.threading.get_inter_op_parallelism_threads()} "
          f"threads {sum(names.values())}")
    print("thread_names " + ",".join(f"{n}:{c}" for n, c in sorted(names.items())))
    test_loss, accuracy = model.evaluate(test_x, test_y, batch_size=len(test_x), verbose=0)
    print(f"final loss {history.history['loss'][-1]:.4f} test_loss {test_loss:.4f} accuracy {accuracy:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
