#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
# keras_ctrl_c_loss.py — measures how many Ctrl-C (SIGINT) plain Keras loses, without mall: why
# tf_test_keras's Ctrl-C test presses again. It trains a small model with model.fit in a loop; its
# SIGINT handler records the Python stack where it raised KeyboardInterrupt and the loop counts the
# ones that reached it. A raise that never reached the loop was dropped by the code that called
# that Python code (TensorFlow's C++ fast path, numpy's conversions); its stack is printed.
# Usage: keras_ctrl_c_loss.py [--seconds S] [--interval-ms MS]: it sends itself a SIGINT every
# MS ms (from a separate process, as a terminal would) for S seconds, then prints
# "raised N reached M lost K" and the stacks of the lost ones. Exit 0 (a measurement, not a test).
import argparse
import os
import signal
import subprocess
import sys
import time
import traceback


def main() -> int:
    parser = argparse.ArgumentParser(description="Measures how many Ctrl-C (SIGINT) plain Keras loses, without mall.")
    parser.add_argument("--seconds", type=float, default=90)
    parser.add_argument("--interval-ms", type=int, default=400)
    args = parser.parse_args()

    import numpy as np
    import tensorflow as tf
    import keras

    raised = []  # the Python stacks where the handler raised
    state = {"in_fit": False}

    def on_sigint(_sig, frame):
        if not state["in_fit"]:
            return  # between fits: not counted
        raised.append("".join(traceback.format_stack(frame, limit=5)))
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    rng = np.random.default_rng(0)
    x = rng.random((2048, 64), dtype=np.float32)
    y = rng.integers(0, 10, 2048)
    dataset = (tf.data.Dataset.from_tensor_slices((x, y)).shuffle(2048).batch(32, drop_remainder=True)
               .repeat().prefetch(2))
    model = keras.Sequential([keras.Input(shape=(64,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    class EveryBatch(keras.callbacks.Callback):  # a batch-end callback, as mall.keras.Malleable has
        def on_train_batch_end(self, batch, logs=None):
            pass

    sender = subprocess.Popen(["bash", "-c", f"end=$((SECONDS + {int(args.seconds)})); "
                               f"while [ $SECONDS -lt $end ]; do sleep {args.interval_ms / 1000}; "
                               f"kill -INT {os.getpid()} || exit 0; done"])
    reached = set()
    while sender.poll() is None:
        try:
            state["in_fit"] = True
            model.fit(dataset, epochs=1, steps_per_epoch=10**7, verbose=0, callbacks=[EveryBatch()])
        except KeyboardInterrupt:
            state["in_fit"] = False
            reached.add(len(raised) - 1)
        state["in_fit"] = False
    lost = [stack for i, stack in enumerate(raised) if i not in reached]
    print(f"tensorflow {tf.__version__} keras {keras.__version__}: raised {len(raised)} "
          f"reached {len(reached)} lost {len(lost)}")
    for stack in lost:
        print("lost, raised at:\n" + stack)
    return 0


if __name__ == "__main__":
    sys.exit(main())
