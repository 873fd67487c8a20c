#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""tf_function_digits.py — a custom training loop of tf.function steps, malleable with mall.

The same seeded model and data as keras_digits.py (whose helpers it imports: the digits of Debian's
python3-sklearn, --model mlp|conv|gru), trained without model.fit: a tf.function train step
(GradientTape, plain SGD) called from a Python loop over a tf.data iterator. Launched under malld
(mallrun, or the Slurm plugin: MALL_SOCKET or MALL_JOB_ID set), the loop calls
mall.tensorflow.Malleable.step() before each train step: when malld changed the job's allocation,
TensorFlow's own intra-op and inter-op pools park or release workers to the new thread count and
every thread is pinned to the new cpus before malld gets the ack. The lines a program adds:

    mall.tensorflow.size_pools()                        # before TensorFlow's first op
    client = mall.Client(required=False)
    malleable = mall.tensorflow.Malleable(client)
    dataset = mall.tensorflow.on_pools(dataset)         # tf.data's functions on the parked pools
    malleable.step()                                    # in the loop, outside the tf.function
    client.report_progress(1)                           # after each step: for --policy throughput

Run from a checkout with the project's venv (launch_scripts/install-deps.sh makes it):
  .venv/bin/python examples/tf_function_digits.py [--steps N] [--model mlp|conv|gru] ...
  mallrun --malleable=1:2 -- .venv/bin/python examples/tf_function_digits.py --log-changes

Output (stdout, line-buffered), as keras_digits.py's:
  start pid P cpus LIST                           the affinity mask when TensorFlow's pools are made
  step N loss X threads T cpus LIST               every --print-every steps (X: that step's loss)
  resize step N threads A -> B cpus LIST          with --log-changes, each allocation applied, then
  parked step N tids T1,T2|-                      the pools' workers parked now
  done steps N seconds S images_per_s R threads K
  final loss X test_loss Y accuracy A
Exit status: 0, or 2 for bad options or missing data.
"""

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # keras_digits.py, beside this file
import keras_digits  # noqa: E402  (sets TF_CPP_MIN_LOG_LEVEL before TensorFlow is imported)


def parse_args():
    parser = argparse.ArgumentParser(
        prog="tf_function_digits.py",
        description="keras_digits.py's model and data trained by a custom loop of tf.function "
                    "steps; malleable under malld through mall.tensorflow.Malleable.",
        epilog="Last lines: 'done steps N seconds S images_per_s R threads K', "
               "'final loss X test_loss Y accuracy A'. Bad options: exit 2.")
    parser.add_argument("--steps", type=int, default=2000, help="training steps, default %(default)s")
    parser.add_argument("--batch", type=int, default=128, help="images per step, default %(default)s")
    parser.add_argument("--hidden", type=int, default=128, help="hidden units, default %(default)s")
    parser.add_argument("--model", choices=keras_digits.MODELS, default="mlp",
                        help="as keras_digits.py's --model, default %(default)s")
    parser.add_argument("--lr", type=float, default=0.5, help="SGD learning rate, default %(default)s")
    parser.add_argument("--seed", type=int, default=1,
                        help="seed of the split, the shuffling and the initial weights, default %(default)s")
    parser.add_argument("--threads", type=int, default=0, metavar="N",
                        help="TensorFlow's pools of N workers each (as keras_digits.py's --threads)")
    parser.add_argument("--print-every", type=int, default=0,
                        help="print the loss every K steps (0: never), default %(default)s")
    parser.add_argument("--log-changes", action="store_true",
                        help="print a line for each allocation applied (under malld)")
    parser.add_argument("--no-mall", action="store_true",
                        help="no mall, even under malld (the baseline)")
    parser.add_argument("--data", default=keras_digits.default_digits_path(),
                        help="sklearn's digits.csv.gz (default: %(default)s, from python3-sklearn)")
    args = parser.parse_args()
    keras_digits.check_common_args(parser, args)
    return args


def main() -> int:
    args = parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    train_x, train_y, test_x, test_y = keras_digits.load_digits(args.data, args.seed)

    under_malld = keras_digits.under_malld_or_warn(args.no_mall, "tf_function_digits.py")
    import tensorflow as tf
    import keras
    keras_digits.size_tensorflow_pools(args.threads, under_malld)
    client = malleable = None
    if under_malld:
        import mall
        import mall.tensorflow
        client = mall.Client(required=False)
        malleable = mall.tensorflow.Malleable(client)

    print(f"start pid {os.getpid()} cpus {keras_digits.cpu_list(os.sched_getaffinity(0))}")
    model = keras_digits.build_model(args.model, args.hidden, args.seed)
    optimizer = keras.optimizers.SGD(learning_rate=args.lr)
    loss_of = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function(jit_compile=False)  # no XLA: TensorFlow's own kernels and pools
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_of(y, model(x, training=True))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    batches = iter(keras_digits.training_dataset(train_x, train_y, args, under_malld))
    log = keras_digits.ChangeLog(under_malld, args.log_changes)
    loss = None
    start = time.time()
    for step in range(1, args.steps + 1):
        if malleable is not None and malleable.step() is not None:
            log.changed(step, malleable.allocation.text)
        x, y = next(batches)
        loss = train_step(x, y)
        if client is not None:
            client.report_progress(1)  # one step done: malld's throughput policy measures steps/s
        if args.print_every and (step % args.print_every == 0 or step == 1):
            print(log.step_line(step, float(loss)))
    seconds = time.time() - start

    names = keras_digits.thread_names()
    print(f"done steps {args.steps} seconds {seconds:.3f} images_per_s {args.steps * args.batch / seconds:.1f} "
          f"threads {sum(names.values())}")
    logits = model(test_x, training=False)
    test_loss = float(loss_of(test_y, logits))
    accuracy = float(tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, axis=1, output_type=tf.int32), test_y),
                                            tf.float32)))
    print(f"final loss {float(loss):.4f} test_loss {test_loss:.4f} accuracy {accuracy:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
