# SPDX-License-Identifier: BSD-3-Clause
"""Proves mall.tensorflow and mall.keras against the venv's real TensorFlow, without malld:
`import mall` does not import TensorFlow; size_pools() makes TensorFlow's pools as asked;
set_threads() parks and releases workers of both pools (the parked threads exist in /proc and use
no cpu while a model trains); on_pools() moves tf.data's map calls from its private pool onto the
inter-op pool's running workers; the op library refuses, with words, a TensorFlow it was not built for;
mall.keras.Malleable() without malld warns once and model.fit trains on. Run with the venv's python
(ctest unit.python.tf_check_tensorflow_helper), MALL_TF_OPS_LIBRARY naming the built library."""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

sys.dont_write_bytecode = True


def task_cpu_ns(tid: int) -> int:
    with open(f"/proc/self/task/{tid}/schedstat") as f:
        return int(f.read().split()[0])


class TensorFlowHelper(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import mall
        cls.tensorflow_before_mall_tensorflow = "tensorflow" in sys.modules
        import mall.tensorflow as mt
        mt.size_pools(2)
        cls.mt = mt

    def test_import_mall_does_not_import_tensorflow(self):
        self.assertFalse(self.tensorflow_before_mall_tensorflow)

    def test_size_pools_turns_spinning_off(self):
        # TensorFlow made its pools (the fixture's set_threads calls ran ops) from this configuration.
        self.mt.threads()
        self.assertFalse(self.mt.pools_spin())

    def test_set_threads_parks_and_releases_both_pools(self):
        mt = self.mt
        full = mt.threads()
        self.assertEqual((full.intra_size, full.inter_size), (2, 2), full)
        self.assertEqual(len(full.intra_workers), 2, full)
        parked = mt.set_threads(1)
        self.assertEqual((parked.intra, parked.inter), (1, 1), parked)
        self.assertEqual(len(parked.intra_parked), 1, parked)
        self.assertEqual(len(parked.inter_parked), 1, parked)
        # The parked workers use no cpu while TensorFlow works.
        import tensorflow as tf
        tids = parked.intra_parked + parked.inter_parked
        before = [task_cpu_ns(t) for t in tids]
        a = tf.random.uniform((512, 512))
        for _ in range(30):
            a = tf.linalg.matmul(a, a) / 512.0
        _ = a.numpy()
        for tid, was in zip(tids, before):
            self.assertLess(task_cpu_ns(tid) - was, 2_000_000, f"parked worker {tid} used cpu")
        released = mt.set_threads(2)
        self.assertEqual((released.intra, released.inter), (2, 2), released)
        self.assertEqual(released.intra_parked + released.inter_parked, ())
        with self.assertRaises(ValueError):
            mt.set_threads(0)

    def test_on_pools_runs_tf_data_functions_on_the_parked_inter_op_pool(self):
        # Each map call reports the Linux thread that ran it (a py_function runs on the calling
        # thread). By default tf.data runs them on a private pool of its own, which mall cannot
        # park; on_pools() moves them onto the inter-op pool, and only its running workers run them.
        import threading
        import tensorflow as tf
        mt = self.mt

        def thread_of(_):
            sum(range(20000))  # long enough for the calls to overlap
            return tf.constant(threading.get_native_id(), tf.int64)

        dataset = tf.data.Dataset.range(64).map(lambda x: tf.py_function(thread_of, [x], tf.int64),
                                                num_parallel_calls=tf.data.AUTOTUNE)
        ran_on = lambda d: {int(t) for t in d}  # noqa: E731
        pools = mt.set_threads(2)
        inter = set(pools.inter_workers)
        self.assertFalse(ran_on(dataset) & inter, "tf.data's default private pool is gone: revisit on_pools()")
        self.assertLessEqual(ran_on(mt.on_pools(dataset)), inter)
        parked = mt.set_threads(1)
        try:
            self.assertEqual(ran_on(mt.on_pools(dataset)), inter - set(parked.inter_parked))
        finally:
            mt.set_threads(2)
        # A private pool the user sized is kept.
        options = tf.data.Options()
        options.threading.private_threadpool_size = 3
        sized = dataset.with_options(options)
        self.assertEqual(mt.on_pools(sized).options().threading.private_threadpool_size, 3)

    def test_a_library_built_for_another_tensorflow_is_refused_with_words(self):
        folder = tempfile.mkdtemp(prefix="mall-tf-ops-")
        try:
            library = os.path.join(folder, "libmall_tf_ops.so")
            shutil.copy(self.mt.op_library_path(), library)
            with open(os.path.join(folder, "libmall_tf_ops.tensorflow-version"), "w") as f:
                f.write("0.0.1\n")
            env = dict(os.environ, MALL_TF_OPS_LIBRARY=library)
            run = subprocess.run([sys.executable, "-c", "import mall.tensorflow as mt; mt.threads()"],
                                 env=env, capture_output=True, text=True, timeout=120)
            self.assertNotEqual(run.returncode, 0)
            self.assertIn("was built for TensorFlow 0.0.1", run.stderr)
            self.assertIn("build it against this TensorFlow: ", run.stderr)
            self.assertIn("-DMALL_TENSORFLOW_PYTHON=" + sys.executable, run.stderr)  # a source checkout's command
        finally:
            shutil.rmtree(folder)

    def test_a_missing_library_names_the_command_that_builds_it(self):
        env = dict(os.environ, MALL_TF_OPS_LIBRARY="/nonexistent/libmall_tf_ops.so")
        code = ("import mall.tensorflow as mt, pathlib, sys\n"
                "package = pathlib.Path(mt.__file__).parent\n"
                "if (package / 'libmall_tf_ops.so').exists() or (package.parent.parent / 'build/lib/libmall_tf_ops.so').exists():\n"
                "    mt._LIBRARY_NAME = 'libmall_tf_ops-absent.so'\n"
                "mt.threads()\n")
        run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        self.assertNotEqual(run.returncode, 0)
        self.assertIn("no libmall_tf_ops-absent.so (looked at /nonexistent/libmall_tf_ops.so", run.stderr)
        self.assertIn("With TensorFlow 2.16 to 2.21 in this environment, build it against that TensorFlow: ", run.stderr)

    def test_the_supported_versions_are_the_builds(self):
        cmake = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tf_integration", "cmake",
                             "tensorflow.cmake")
        with open(cmake) as f:
            text = f.read()
        oldest = re.search(r"set\(MALL_TENSORFLOW_OLDEST ([0-9.]+)\)", text).group(1)
        newest = re.search(r"set\(MALL_TENSORFLOW_NEWEST ([0-9.]+)\)", text).group(1)
        self.assertEqual(self.mt.SUPPORTED_TENSORFLOW, f"{oldest} to {newest}")

    def test_keras_callback_without_malld_warns_once_and_trains(self):
        code = (
            "import numpy as np, keras, mall.keras\n"
            "cb = mall.keras.Malleable()\n"
            "m = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])\n"
            "m.compile('sgd', 'mse')\n"
            "h = m.fit(np.ones((64, 8)), np.zeros((64, 4)), batch_size=8, epochs=2, verbose=0, callbacks=[cb])\n"
            "print('trained', len(h.history['loss']), cb.changes)\n")
        env = dict(os.environ, MALL_SOCKET=f"/tmp/mall-no-such-dir-{os.getpid()}/malld.sock", MALL_JOB_ID="k")
        run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=200)
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertIn("trained 2 0", run.stdout)
        warnings = [l for l in run.stderr.splitlines() if l.startswith("mall: not malleable")]
        self.assertEqual(len(warnings), 1, run.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
