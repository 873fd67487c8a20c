# SPDX-License-Identifier: BSD-3-Clause
"""mall.tensorflow — TensorFlow's own thread pools follow the job's mall allocation (park, don't
replace), for custom training loops (tf.function or eager); mall.keras wraps it for model.fit.

TensorFlow has no API to resize its pools once made. mall loads a small op library into the
unpatched TensorFlow (libmall_tf_ops.so, built against the TensorFlow it loads into: `pip install`
of mall compiles it against the environment's TensorFlow 2.16 to 2.21) whose op parks workers of
TensorFlow's intra-op and inter-op pools inside tasks that block until released: parked workers
sleep, the others steal their work. Unparked, the pools are TensorFlow's as they were. TensorFlow's
per-thread split (how many pieces Shard() and Eigen cut a kernel into) follows the running count.

    client = mall.Client(required=False)          # MALL_SOCKET / MALL_JOB_ID, as mallrun sets
    malleable = mall.tensorflow.Malleable(client)
    for batch in dataset:
        malleable.step()                          # parks/releases workers when malld changed it
        train_step(batch)                         # a tf.function

Contract: Malleable.step() is one ctypes call when nothing changed. On a change, before malld gets
the ack, both pools run allocation.threads workers (at least one each; never more than TensorFlow
made) and every thread of the process is pinned to the allocation's cpus. threads() reports the
pools. TensorFlow is imported only by these functions (importing mall alone never imports it).
Call them from Python, between steps, not from inside a tf.function. Everything parked is released
at process exit.

Three public names say "threads": threads() is a function that asks the op library for both pools
now; Threads is the class of what it (and set_threads()) returns, a snapshot of both pools;
Malleable.threads is an int attribute, the running intra-op count after the last change, kept
without calling the op. size_pools(threads) takes a count.

tf.data runs a pipeline's functions (map, filter, interleave's) on a private pool of its own per
iterator, sized to the cpus at the iterator's birth, which mall cannot park: on_pools(dataset) moves
them onto the inter-op pool, so that they follow the allocation too.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from . import Allocation, Client, MallError
from ._errors import MALL_ERR_SYSTEM, MALL_ERR_VERSION
from ._follow import AllocationFollower
from ._library import checkout_build_lib

__all__ = ["Malleable", "Threads", "threads", "set_threads", "size_pools", "pools_spin", "on_pools", "op_library_path",
           "build_command"]

_LIBRARY_NAME = "libmall_tf_ops.so"
# The TensorFlow versions the op library is built and tested for (tf_integration/cmake/tensorflow.cmake).
SUPPORTED_TENSORFLOW = "2.16 to 2.21"
_VERSION_SUFFIX = ".tensorflow-version"
_ops = None


@dataclass(frozen=True)
class Threads:
    """TensorFlow's pools as mall sees them, as threads() and set_threads() return them: running
    workers and pool sizes, and the Linux thread ids of each pool's workers and of those parked now
    (for checks in /proc)."""

    intra: int
    intra_size: int
    inter: int
    inter_size: int
    intra_workers: tuple[int, ...] = ()
    intra_parked: tuple[int, ...] = ()
    inter_workers: tuple[int, ...] = ()
    inter_parked: tuple[int, ...] = ()


def _install_facts():
    """_install_paths of an installed package (None in a source checkout)."""
    try:
        from . import _install_paths  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _install_paths


def build_command() -> str:
    """The one command that (re)builds the op library against this Python's TensorFlow, as words
    for a user: how this package was installed decides it."""
    facts = _install_facts()
    python = sys.executable or "python3"
    if facts is not None and getattr(facts, "INSTALLER", "") == "pip":
        source = getattr(facts, "SOURCE", "")
        if not source or not os.path.exists(source):
            source = "<the mall checkout or sdist you installed from>"
        return f"{python} -m pip install --force-reinstall --no-deps --no-cache-dir {source}"
    if facts is not None:
        # `cmake --install` (the Debian package too) puts the sdist under <datadir>/mall/python.
        source = getattr(facts, "SOURCE", "")
        if source and os.path.exists(source):
            return f"{python} -m pip install --force-reinstall --no-deps --no-cache-dir {source}"
        return (f"cmake -DMALL_TENSORFLOW_PYTHON={python} <mall's build folder> && "
                "cmake --build <that folder> && cmake --install <that folder>")
    return (f"{python} -m pip install --force-reinstall --no-deps --no-cache-dir <this mall checkout>, "
            f"or in the checkout: cmake -DMALL_TENSORFLOW_PYTHON={python} build && ninja -C build")


def op_library_path() -> str:
    """Where libmall_tf_ops.so is: $MALL_TF_OPS_LIBRARY, beside this package (installed), or the
    source checkout's build/lib. Raises MallError naming every place looked at and the command that
    builds it."""
    candidates = []
    if os.environ.get("MALL_TF_OPS_LIBRARY"):
        candidates.append(Path(os.environ["MALL_TF_OPS_LIBRARY"]))
    package_dir = Path(__file__).resolve().parent
    candidates.append(package_dir / _LIBRARY_NAME)
    candidates.append(checkout_build_lib(package_dir) / _LIBRARY_NAME)
    for candidate in candidates:
        if candidate.is_file():
            return str(candidate)
    facts = _install_facts()
    why = getattr(facts, "OP_LIBRARY", "") if facts is not None else ""
    raise MallError(MALL_ERR_SYSTEM, "mall.tensorflow: no " + _LIBRARY_NAME + " (looked at " +
                    ", ".join(map(str, candidates)) + ")" + (f"; at install: {why}" if why else "") +
                    ". With TensorFlow " + SUPPORTED_TENSORFLOW + " in this environment, build it "
                    "against that TensorFlow: " + build_command())


def _load():
    global _ops
    if _ops is not None:
        return _ops
    import tensorflow as tf  # only here: `import mall` never imports TensorFlow

    path = op_library_path()
    version_file = Path(path[: -len(".so")] + _VERSION_SUFFIX)
    try:
        built_for = version_file.read_text().strip()
    except OSError:
        built_for = ""
    if built_for and built_for != tf.__version__:
        raise MallError(MALL_ERR_VERSION,
                        f"mall.tensorflow: {path} was built for TensorFlow {built_for}, this process "
                        f"runs TensorFlow {tf.__version__}: build it against this TensorFlow: "
                        f"{build_command()} (or install TensorFlow {built_for})")
    _ops = tf.load_op_library(path)
    return _ops


def _inter_pool_size() -> int:
    """The inter-op pool's size as TensorFlow made it (its config, else the usable cpus)."""
    import tensorflow as tf

    configured = tf.config.threading.get_inter_op_parallelism_threads()
    return configured if configured > 0 else max(1, len(os.sched_getaffinity(0)))


def _call(intra: int, inter: int) -> Threads:
    ops = _load()
    counts, intra_workers, intra_parked, inter_workers, inter_parked = ops.mall_pool_threads(
        intra=intra, inter=inter, inter_pool_size=_inter_pool_size())
    c = [int(v) for v in counts.numpy()]
    as_tuple = lambda t: tuple(int(v) for v in t.numpy())  # noqa: E731
    return Threads(c[0], c[1], c[2], c[3], as_tuple(intra_workers), as_tuple(intra_parked),
                   as_tuple(inter_workers), as_tuple(inter_parked))


def size_pools(threads: int | None = None, *, spinning: bool = False) -> int:
    """Makes TensorFlow create its intra-op and inter-op pools with `threads` workers each (default:
    $MALL_MAX, the most the job may grow to, else the online cpus), so that mall can later release
    workers up to that many: TensorFlow sizes its pools once, at its first op, from the cpus it may
    use then (a malleable job often starts small). Must run before TensorFlow's first op; later it
    only warns (once, on stderr) and the job can grow to the pools TensorFlow made. Returns the
    count asked for.

    Unless `spinning` is True it also turns off the pools' spinning (ConfigProto.experimental.
    disable_thread_spinning): a worker that runs out of work then sleeps at once instead of trying
    to steal for a while. On the cores mall gives a job, that spin takes cpu from the job's own
    busy threads: a pool of two shrunk to one running worker on one cpu trained an MLP 7-10%
    slower than a pool made with one thread, and as fast once spinning was off (docs/frameworks.md).
    """
    import tensorflow as tf

    if threads is None:
        from_env = os.environ.get("MALL_MAX", "")
        threads = int(from_env) if from_env.isdigit() and int(from_env) > 0 else (os.cpu_count() or 1)
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    except RuntimeError as exc:
        print(f"mall.tensorflow: TensorFlow made its pools before size_pools() ({exc}); the job "
              f"grows to {tf.config.threading.get_intra_op_parallelism_threads() or 'the cpus it had then'} "
              "threads at most: call mall.tensorflow.size_pools() before the first op", file=sys.stderr)
        return threads
    if not spinning:
        _disable_pool_spinning()
    return threads


def _disable_pool_spinning() -> None:
    """Sets disable_thread_spinning in the eager context's configuration, which TensorFlow reads
    when it makes its pools (the context is not initialized yet: size_pools() checked). TensorFlow
    has no public setter for it, so this uses the context's private _config; a TensorFlow without
    it keeps spinning, with one warning."""
    try:
        from tensorflow.core.protobuf import config_pb2
        from tensorflow.python.eager import context

        ctx = context.context()
        config = config_pb2.ConfigProto()
        if ctx._config is not None:
            config.CopyFrom(ctx._config)
        config.experimental.disable_thread_spinning = True
        ctx._config = config
    except (ImportError, AttributeError) as exc:
        print(f"mall.tensorflow: cannot turn off the spinning of TensorFlow's pools ({exc}); "
              "they keep spinning (a shrunk job runs a few percent slower)", file=sys.stderr)


def pools_spin() -> bool:
    """Whether TensorFlow's pools spin (look for work for a while before sleeping): False after
    size_pools() with its default spinning=False. Reads the configuration TensorFlow made them with."""
    from tensorflow.python.eager import context

    return not context.context().config.experimental.disable_thread_spinning


def threads() -> Threads:
    """TensorFlow's pools now, as a Threads (running and total workers of each, their thread ids);
    one call into the op library."""
    return _call(0, 0)


def set_threads(count: int) -> Threads:
    """Leaves `count` workers of each pool running (clamped to 1..its size) and parks the rest;
    returns once they are parked."""
    if not isinstance(count, int) or count < 1:
        raise ValueError(f"set_threads needs a count >= 1, not {count!r}")
    return _call(count, count)


# tf.data's RootDataset gives every iterator a private pool unless its size is below 0
# (tensorflow/core/data/root_dataset.h, Params::private_threadpool_size; root_dataset.cc makes the
# pool only for a size >= 0); the functions then run on the runner the iterator op got: the
# inter-op pool. -1 is not in tf.data's documentation (0 and sizes above 0 are):
# unit.python.tf_check_tensorflow_helper pins the behaviour for the TensorFlow mall is built for.
_NO_PRIVATE_POOL = -1


def on_pools(dataset):
    """Returns `dataset` (a tf.data.Dataset) set to run its functions (map, with num_parallel_calls
    AUTOTUNE or a number, filter, interleave's) on TensorFlow's inter-op pool, whose running
    workers mall sets, instead of the private pool tf.data gives each iterator by default (one
    thread per cpu when the iterator was made; never parked, never grown). Apply it to the dataset
    given to fit() or iter(). A private pool the user sized (options.threading.
    private_threadpool_size) is kept: mall cannot park it. With AUTOTUNE at most as many calls run
    at once as the process had cpus at its first tf.data iterator: a job that may grow beyond its
    first cpus should give num_parallel_calls its largest thread count ($MALL_MAX)."""
    import tensorflow as tf

    if dataset.options().threading.private_threadpool_size is not None:
        return dataset
    options = tf.data.Options()
    options.threading.private_threadpool_size = _NO_PRIVATE_POOL
    return dataset.with_options(options)


class Malleable(AllocationFollower):
    """Follows `client`'s allocation with TensorFlow's own pools (and every thread's affinity when
    `repin` is True). `threads` (an int attribute, not the module's threads() function) is the
    running intra-op count after the last change, `allocation` the last applied Allocation (None
    before the first). step() returns the new running count when the allocation changed, None when
    it did not."""

    def __init__(self, client: Client, *, repin: bool = True):
        super().__init__(client, threads().intra, repin=repin)  # the function: the pools at start

    def _apply(self, allocation: Allocation) -> int:
        # After the pinning (a shrinking job leaves the cpus it loses), park or release.
        return set_threads(max(1, allocation.threads)).intra
