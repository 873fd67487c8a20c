# SPDX-License-Identifier: BSD-3-Clause
"""mall — the training-process side of mall in Python: ctypes over libmall's C API (mall.h).

A training loop opens a Client once and calls client.step() at every step boundary; step() returns
True when malld's new CPU allocation was applied (resize callbacks ran before the ack), False when
nothing changed, which costs one ctypes call into mall_step() (two atomic loads in C).
With required=False a missing malld (or libmall) gives one warning on stderr and a client that
never changes, so training runs non-malleable; the C library keeps trying to attach in the
background and changes apply from then on.

libmall.so is looked for in: $MALL_LIBRARY; the library folder of the install this package came
with; ctypes.util.find_library("mall"); <checkout>/build/lib for a source checkout.
The framework helpers, each importing its framework only when it is imported: mall.torch.Malleable
(PyTorch's thread count), mall.tensorflow (TensorFlow's own pools parked through the op library
libmall_tf_ops.so; mall.tensorflow.Malleable for custom loops) and mall.keras.Malleable (a
model.fit callback over mall.tensorflow).

A Client belongs to the process that opened it: in a forked child (DataLoader workers,
multiprocessing) it never changes, and closing it there (or the child's exit) leaves the parent's
client following malld.
"""

from __future__ import annotations

import ctypes
import os
import sys
import weakref
from dataclasses import dataclass

from ._errors import (
    MALL_ERR_DENIED,
    MALL_ERR_DETACHED,
    MALL_ERR_FULL,
    MALL_ERR_INVAL,
    MALL_ERR_NODAEMON,
    MALL_ERR_NOJOB,
    MALL_ERR_NOMEM,
    MALL_ERR_PROTOCOL,
    MALL_ERR_SYSTEM,
    MALL_ERR_VERSION,
    MALL_NOUPDT,
    MALL_SUCCESS,
    MallError,
)
from . import _library
from ._library import MallAllocStruct, MallErrorStruct, RESIZE_FN

__all__ = [
    "Allocation", "Client", "MallError", "api_version", "pin_process_threads",
    "MALL_SUCCESS", "MALL_NOUPDT", "MALL_ERR_INVAL", "MALL_ERR_NODAEMON", "MALL_ERR_DENIED",
    "MALL_ERR_NOJOB", "MALL_ERR_PROTOCOL", "MALL_ERR_NOMEM", "MALL_ERR_SYSTEM",
    "MALL_ERR_DETACHED", "MALL_ERR_VERSION", "MALL_ERR_FULL",
]

_UINT64_LIMIT = 1 << 64


@dataclass(frozen=True)
class Allocation:
    """A CPU allocation: `generation` grows with every change malld publishes for the job;
    `cpus` are the cpu numbers (sorted), `ncpus` their count, `text` the Linux list form ("0-3,8"),
    `threads` the threads to run on them (ncpus unless an admin chose fewer with
    `mallctl set JOB --threads N`). Generation 0 with no cpus means "no allocation applied yet"."""

    generation: int
    ncpus: int
    cpus: tuple[int, ...]
    text: str
    threads: int = 0

    @classmethod
    def from_struct(cls, raw: MallAllocStruct) -> "Allocation":
        cpus = []
        for word_index, word in enumerate(raw.mask):
            while word:
                low_bit = word & -word
                cpus.append(word_index * 64 + low_bit.bit_length() - 1)
                word ^= low_bit
        return cls(
            generation=int(raw.generation),
            ncpus=int(raw.ncpus),
            cpus=tuple(cpus),
            text=raw.cpus.decode("ascii", "replace"),
            # mall_alloc_threads(): nthreads when 1..ncpus, else ncpus (a libmall before 0.3.0).
            threads=int(raw.nthreads) if 0 < raw.nthreads <= raw.ncpus else int(raw.ncpus),
        )


NO_ALLOCATION = Allocation(generation=0, ncpus=0, cpus=(), text="")


def api_version(library: str | os.PathLike | None = None) -> int:
    """The loaded libmall's mall_get_api_version() (major*10000 + minor*100 + patch)."""
    return _library.load(library).version


def pin_process_threads(cpus) -> int:
    """Sets the affinity of every thread of this process (each tid in /proc/self/task) to `cpus`.

    Threads that exit meanwhile are skipped. Returns how many threads were pinned. Threads created
    later inherit their creator's mask, so pinning the existing ones is enough for pools (OpenMP,
    torch) that start workers from already pinned threads.
    """
    cpu_set = set(cpus)
    if not cpu_set:
        raise ValueError("pin_process_threads needs at least one cpu")
    pinned = 0
    for entry in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(entry), cpu_set)
            pinned += 1
        except ProcessLookupError:
            continue  # the thread exited after the listing
    return pinned


class _ResizeDispatch:
    """Runs the Python resize callbacks from inside mall_step(), before the ack.

    An exception from a callback cannot cross the C frames, so the first one is kept and re-raised
    by Client.step() once mall_step() has returned. Kept apart from Client so that the C trampoline
    (which libmall holds until mall_close) does not keep the Client alive.
    """

    def __init__(self):
        self.callbacks = []
        self.error: BaseException | None = None
        self.trampoline = RESIZE_FN(self._on_resize)

    def _on_resize(self, raw, _arg):
        try:
            allocation = Allocation.from_struct(raw.contents)
            for callback in list(self.callbacks):
                callback(allocation)
        except BaseException as exc:  # noqa: B902 — also KeyboardInterrupt, re-raised by step()
            if self.error is None:
                self.error = exc


def _close_handle(api, handle, _keepalive, opener_pid):
    # Runs at close() or when the Client is collected / at interpreter exit. _keepalive holds the
    # ctypes trampoline until libmall no longer can call it. In a forked child (a DataLoader worker,
    # a multiprocessing process) the handle is the parent's: nothing is closed there, so the
    # child's exit never touches what it shares with the parent (libmall also detaches the child's
    # copy at the fork; a copy left open costs the child nothing).
    if os.getpid() != opener_pid:
        return
    api.mall_close(handle)


def _never_changes(_handle):
    return MALL_NOUPDT


def _closed_step(_handle):
    return MALL_ERR_INVAL


class Client:
    """A libmall handle: mall_open() at construction, mall_close() at close() / end of `with`.

    socket: malld's socket path; None means $MALL_SOCKET, then /run/mall/malld.sock.
    required: when True (default), a failed attach raises MallError. When False, a failure prints
        one line on stderr and the client behaves as "nothing changes" (step() returns False);
        libmall keeps trying to attach in the background.
    library: path of libmall.so to load instead of searching for it.
    """

    def __init__(self, socket: str | bytes | os.PathLike | None = None, *, required: bool = True,
                 library: str | os.PathLike | None = None, _api=None):
        if socket is not None and not isinstance(socket, (str, bytes, os.PathLike)):
            raise TypeError(f"socket must be a path or None, not {type(socket).__name__}")
        self._api = None
        self._handle = None
        self._step_fn = _never_changes
        self._dispatch = _ResizeDispatch()
        self._callback_registered = False
        self._finalizer = None
        self._closed = False
        self.open_error: MallError | None = None  # why the client is not malleable, if it is not

        try:
            api = _api if _api is not None else _library.load(library)
        except MallError as exc:
            self._fail(exc, required)
            return
        self._api = api

        raw_handle = ctypes.c_void_p()
        error = MallErrorStruct()
        path_arg = None if socket is None else os.fsencode(socket)
        # POINTER arguments take the pointed-to objects; ctypes passes them by reference.
        rc = api.mall_open(path_arg, raw_handle, error)
        if raw_handle.value:
            self._handle = ctypes.c_void_p(raw_handle.value)
            self._step_fn = api.mall_step
            self._finalizer = weakref.finalize(self, _close_handle, api, self._handle,
                                               self._dispatch.trampoline, os.getpid())
        if rc != MALL_SUCCESS:
            detail = error.text.decode("utf-8", "replace")
            text = api.strerror(rc) + (f": {detail}" if detail else "")
            if required:
                self.close()
            self._fail(MallError(rc, text), required)

    def _fail(self, exc: MallError, required: bool):
        if required:
            raise exc
        self.open_error = exc
        print(f"mall: not malleable, training continues on its current cpus: {exc}",
              file=sys.stderr, flush=True)

    # -- the step boundary ----------------------------------------------------------------------

    def step(self) -> bool:
        """Applies a newly published allocation, if any: True when one was applied (the resize
        callbacks ran and malld got the ack), False when nothing changed."""
        rc = self._step_fn(self._handle)
        if rc == MALL_NOUPDT:
            return False
        return self._after_step(rc)

    def _after_step(self, rc: int) -> bool:
        if rc == MALL_SUCCESS:
            error, self._dispatch.error = self._dispatch.error, None
            if error is not None:
                raise error
            return True
        raise self._error(rc)

    def _error(self, rc: int) -> MallError:
        if self._closed:
            return MallError(rc, "the client is closed")
        text = self._api.strerror(rc) if self._api is not None else "unknown mall error"
        return MallError(rc, text)

    def on_resize(self, callback) -> None:
        """Registers callback(Allocation), run by step() when a new allocation arrives, before
        malld is told it was applied (so a pool shrinks before its cores are taken away)."""
        if not callable(callback):
            raise TypeError("on_resize needs a callable taking an Allocation")
        self._dispatch.callbacks.append(callback)
        if self._closed:
            raise self._error(MALL_ERR_INVAL)
        if self._handle is not None and not self._callback_registered:
            rc = self._api.mall_on_resize(self._handle, self._dispatch.trampoline, None)
            if rc != MALL_SUCCESS:
                self._dispatch.callbacks.remove(callback)
                raise self._error(rc)
            self._callback_registered = True

    # -- queries and reports --------------------------------------------------------------------

    @property
    def allocation(self) -> Allocation:
        """The allocation last applied by step() (generation 0 and no cpus before the first)."""
        if self._closed:
            raise self._error(MALL_ERR_INVAL)
        if self._handle is None:
            return NO_ALLOCATION
        raw = MallAllocStruct()
        rc = self._api.mall_get_allocation(self._handle, raw)
        if rc != MALL_SUCCESS:
            raise self._error(rc)
        return Allocation.from_struct(raw)

    def report_progress(self, work_units: int = 1) -> None:
        """Adds work units (samples, steps: one unit, consistently) done since the last call."""
        if isinstance(work_units, bool) or not isinstance(work_units, int):
            raise TypeError(f"work_units must be an int, not {type(work_units).__name__}")
        if not 0 <= work_units < _UINT64_LIMIT:
            raise ValueError(f"work_units must be from 0 to 2**64-1, not {work_units}")
        if self._closed:
            raise self._error(MALL_ERR_INVAL)
        if self._handle is None:
            return
        rc = self._api.mall_report_progress(self._handle, work_units)
        if rc != MALL_SUCCESS:
            raise self._error(rc)

    @property
    def attached(self) -> bool:
        """True while connected to malld."""
        if self._handle is None:
            return False
        return self._api.mall_attached(self._handle) == MALL_SUCCESS

    @property
    def job_id(self) -> str:
        """The job the handle is attached to ("" when detached)."""
        if self._handle is None:
            return ""
        return (self._api.mall_job_id(self._handle) or b"").decode("utf-8", "replace")

    @property
    def malleable(self) -> bool:
        """False for a client that can never change (no library, or no handle)."""
        return self._handle is not None

    def fileno(self) -> int:
        """A descriptor that becomes readable when a change is published (for select/poll)."""
        if self._closed:
            raise self._error(MALL_ERR_INVAL)
        if self._handle is None:
            raise MallError(MALL_ERR_DETACHED, f"no libmall handle ({self.open_error})")
        rc = self._api.mall_fd(self._handle)
        if rc < 0:
            raise self._error(rc)
        return rc

    # -- lifetime -------------------------------------------------------------------------------

    def close(self) -> None:
        """Closes the handle (idempotent). Threads keep their last cpus. In a forked child the
        client only becomes closed there: the parent's handle is left alone."""
        self._closed = True
        self._step_fn = _closed_step
        self._handle = None
        if self._finalizer is not None:
            self._finalizer()
            self._finalizer = None

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("attached" if self.attached else "detached")
        return f"<mall.Client {state} job={self.job_id!r}>"
