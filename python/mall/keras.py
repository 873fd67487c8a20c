# SPDX-License-Identifier: BSD-3-Clause
"""mall.keras — a Keras callback that makes model.fit follow the job's mall allocation.

    model.fit(x, y, callbacks=[mall.keras.Malleable()])

At the end of each training batch it calls the step of mall.tensorflow.Malleable: when malld
changed the job's allocation, TensorFlow's own intra-op and inter-op pools park or release workers
to the new thread count (and every thread is pinned to the new cpus) before malld gets the ack;
otherwise it costs one ctypes call. It also reports each batch as one unit of work
(mall.Client.report_progress: one more ctypes call, an atomic add in libmall, no system call),
which malld's throughput policy (`malld --policy throughput`, `mallctl policy throughput`)
measures at each core count the job runs on, to give cores where they add speed; `mallctl status
--json` shows the job's work_units. report_progress=False leaves that to the program. client=None
opens a mall.Client the usual way ($MALL_SOCKET, $MALL_JOB_ID, as mallrun and the Slurm plugin set
them) with required=False: without malld it prints one warning and training runs on, unchanged.
Keras and TensorFlow are imported only when this module is.
"""

from __future__ import annotations

from tensorflow import keras

from . import Client
from . import tensorflow as mall_tensorflow

__all__ = ["Malleable"]


class Malleable(keras.callbacks.Callback):
    """Follows the allocation at every batch end of fit(). `changes` counts the allocations
    applied; `threads` (an int property: mall.tensorflow.Malleable's attribute of that name) is the
    running intra-op count after the last one."""

    def __init__(self, client: Client | None = None, *, report_progress: bool = True):
        super().__init__()
        self.client = client if client is not None else Client(required=False)
        self._malleable = mall_tensorflow.Malleable(self.client)
        self._report_progress = report_progress
        self.changes = 0

    @property
    def threads(self) -> int:
        return self._malleable.threads

    def step(self) -> int | None:
        """What each batch end does; call it between fits too (e.g. while waiting), where nothing
        else would apply a change. Returns the new running count when the allocation changed."""
        running = self._malleable.step()
        if running is not None:
            self.changes += 1
        return running

    def on_train_batch_end(self, batch, logs=None):
        if self._report_progress:
            self.client.report_progress(1)  # one training step: the unit malld measures rates in
        self.step()
