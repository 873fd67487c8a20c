# SPDX-License-Identifier: BSD-3-Clause
"""test_client.py — proves mall.Client's contract without a malld: errors carry the C codes and texts,
a missing malld or libmall degrades to one warning and a client that never changes, bad arguments
are refused, step() maps MALL_SUCCESS/MALL_NOUPDT/errors, allocations decode, installs find libmall.

Run by ctest (label unit) with MALL_LIBRARY=<build>/lib/libmall.so and PYTHONPATH=python/.
"""

import contextlib
import ctypes
import io
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

import mall
from mall import _library

ABSENT_SOCKET = "/nonexistent-mall-python-test/malld.sock"
MALL_VARIABLES = ("MALL_SOCKET", "MALL_JOB_ID", "MALL_MIN", "MALL_MAX")


class CleanEnvironment(unittest.TestCase):
    """Each test starts without the MALL_* variables a launcher would set (restored afterwards)."""

    def setUp(self):
        self.saved = {name: os.environ.pop(name) for name in MALL_VARIABLES if name in os.environ}

    def tearDown(self):
        for name in MALL_VARIABLES:
            os.environ.pop(name, None)
        os.environ.update(self.saved)

    def open_quietly(self, *args, **kwargs):
        """Client(..., required=False) with stderr captured; returns (client, stderr lines)."""
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            client = mall.Client(*args, required=False, **kwargs)
        return client, err.getvalue().splitlines()


class LibraryTest(CleanEnvironment):
    def test_loads_the_library_named_by_mall_library(self):
        api = _library.load()
        if "MALL_LIBRARY" in os.environ:
            self.assertEqual(api.path, os.environ["MALL_LIBRARY"])
        version = mall.api_version()
        self.assertEqual(version // 10000, _library.EXPECTED_API_MAJOR)
        self.assertGreaterEqual(version, _library.MINIMUM_API_VERSION)

    def test_struct_layout_matches_mall_h(self):
        s = _library.MallAllocStruct
        self.assertEqual(s.generation.offset, 0)
        self.assertEqual(s.ncpus.offset, 8)
        self.assertEqual(s.mask.offset, 16)  # uint64_t alignment after the int
        self.assertEqual(s.cpus.offset, 16 + 1024 // 8)
        self.assertEqual(ctypes.sizeof(s), 16 + 128 + 4096)
        self.assertEqual(ctypes.sizeof(_library.MallErrorStruct), 160)

    def test_strerror_text_comes_from_the_library(self):
        api = _library.load()
        self.assertIn("malld", api.strerror(mall.MALL_ERR_NODAEMON))
        self.assertEqual(api.strerror(12345), "unknown mall error")

    def test_missing_library_is_an_error_naming_the_path(self):
        with self.assertRaises(mall.MallError) as caught:
            mall.Client(ABSENT_SOCKET, library="/nonexistent-mall/libmall.so.0")
        self.assertEqual(caught.exception.code, mall.MALL_ERR_SYSTEM)
        self.assertIn("/nonexistent-mall/libmall.so.0", str(caught.exception))
        self.assertIn("MALL_LIBRARY", str(caught.exception))

    def test_missing_library_optional_gives_a_client_that_never_changes(self):
        client, lines = self.open_quietly(ABSENT_SOCKET, library="/nonexistent-mall/libmall.so.0")
        self.assertEqual(len(lines), 1, lines)
        self.assertTrue(lines[0].startswith("mall: not malleable"), lines)
        self.assertFalse(client.malleable)
        self.assertFalse(client.attached)
        self.assertFalse(client.step())
        self.assertEqual(client.allocation, mall.Allocation(0, 0, (), ""))
        client.report_progress(5)
        self.assertEqual(client.job_id, "")
        client.close()
        with self.assertRaises(mall.MallError):
            client.step()


class WithoutMalldTest(CleanEnvironment):
    def test_required_client_raises_nodaemon_with_the_socket(self):
        with self.assertRaises(mall.MallError) as caught:
            mall.Client(ABSENT_SOCKET)
        error = caught.exception
        self.assertEqual(error.code, mall.MALL_ERR_NODAEMON)
        self.assertEqual(error.name, "MALL_ERR_NODAEMON")
        self.assertIn(ABSENT_SOCKET, error.text)
        self.assertIn("MALL_ERR_NODAEMON", str(error))

    def test_socket_defaults_to_mall_socket(self):
        os.environ["MALL_SOCKET"] = ABSENT_SOCKET
        with self.assertRaises(mall.MallError) as caught:
            mall.Client()
        self.assertIn(ABSENT_SOCKET, caught.exception.text)

    def test_optional_client_warns_once_and_steps_as_unchanged(self):
        client, lines = self.open_quietly(ABSENT_SOCKET)
        self.assertEqual(len(lines), 1, lines)
        self.assertTrue(lines[0].startswith("mall: not malleable"), lines)
        self.assertIn(ABSENT_SOCKET, lines[0])
        self.assertEqual(client.open_error.code, mall.MALL_ERR_NODAEMON)
        # The handle is kept (libmall retries in the background) and says "nothing changes".
        self.assertTrue(client.malleable)
        self.assertFalse(client.attached)
        err = io.StringIO()
        with contextlib.redirect_stderr(err), client:
            for _ in range(1000):
                self.assertFalse(client.step())
            client.report_progress(64)
            self.assertEqual(client.allocation, mall.Allocation(0, 0, (), ""))
            self.assertEqual(client.job_id, "")
            self.assertGreaterEqual(client.fileno(), 0)
            self.assertIn("detached", repr(client))
        self.assertEqual(err.getvalue(), "", "only one warning, at open")
        self.assertTrue(client.closed)

    def test_bad_job_id_from_the_environment(self):
        os.environ["MALL_JOB_ID"] = "no spaces allowed"
        with self.assertRaises(mall.MallError) as caught:
            mall.Client(ABSENT_SOCKET)
        self.assertEqual(caught.exception.code, mall.MALL_ERR_INVAL)
        self.assertIn("MALL_JOB_ID", caught.exception.text)
        client, lines = self.open_quietly(ABSENT_SOCKET)
        self.assertEqual(len(lines), 1, lines)
        self.assertIn("MALL_JOB_ID", lines[0])
        self.assertFalse(client.malleable)  # mall_open gives no handle for a bad argument
        self.assertFalse(client.step())

    def test_bad_min_from_the_environment(self):
        os.environ["MALL_MIN"] = "0"
        with self.assertRaises(mall.MallError) as caught:
            mall.Client(ABSENT_SOCKET)
        self.assertEqual(caught.exception.code, mall.MALL_ERR_INVAL)
        self.assertIn("MALL_MIN", caught.exception.text)


class ArgumentsTest(CleanEnvironment):
    def setUp(self):
        super().setUp()
        self.client, _ = self.open_quietly(ABSENT_SOCKET)

    def tearDown(self):
        self.client.close()
        super().tearDown()

    def test_socket_must_be_a_path(self):
        with self.assertRaises(TypeError):
            mall.Client(42)

    def test_socket_accepts_pathlike_and_bytes(self):
        for socket in (Path(ABSENT_SOCKET), ABSENT_SOCKET.encode()):
            with self.assertRaises(mall.MallError) as caught:
                mall.Client(socket)
            self.assertIn(ABSENT_SOCKET, caught.exception.text)

    def test_report_progress_refuses_bad_values(self):
        for bad in (-1, 1 << 64):
            with self.assertRaises(ValueError):
                self.client.report_progress(bad)
        for bad in ("3", 1.5, True, None):
            with self.assertRaises(TypeError):
                self.client.report_progress(bad)
        self.client.report_progress(0)
        self.client.report_progress((1 << 64) - 1)

    def test_on_resize_needs_a_callable(self):
        with self.assertRaises(TypeError):
            self.client.on_resize(5)

    def test_a_closed_client_refuses_every_call(self):
        self.client.close()
        self.client.close()  # idempotent
        for call in (self.client.step, lambda: self.client.allocation,
                     lambda: self.client.report_progress(1), self.client.fileno,
                     lambda: self.client.on_resize(print)):
            with self.assertRaises(mall.MallError) as caught:
                call()
            self.assertEqual(caught.exception.code, mall.MALL_ERR_INVAL)
            self.assertIn("closed", caught.exception.text)
        self.assertFalse(self.client.attached)
        self.assertIn("closed", repr(self.client))


def alloc_struct(generation, cpus, text=None):
    raw = _library.MallAllocStruct()
    raw.generation = generation
    raw.ncpus = len(cpus)
    for cpu in cpus:
        raw.mask[cpu // 64] |= 1 << (cpu % 64)
    raw.cpus = (text if text is not None else ",".join(map(str, cpus))).encode()
    return raw


class FakeApi:
    """Stands in for the loaded libmall: mall_step returns scripted codes and, for MALL_SUCCESS,
    calls the registered resize trampoline first, as libmall does."""

    def __init__(self, script):
        self.script = list(script)  # (rc, MallAllocStruct or None) per mall_step call
        self.trampoline = None
        self.closed = 0
        self.applied = _library.MallAllocStruct()
        self.version = 100

    def mall_open(self, path, handle, error):
        handle.value = 0x1234
        return mall.MALL_SUCCESS

    def mall_on_resize(self, handle, trampoline, arg):
        self.trampoline = trampoline
        return mall.MALL_SUCCESS

    def mall_step(self, handle):
        if handle is None:
            return mall.MALL_ERR_INVAL
        rc, raw = self.script.pop(0)
        if rc == mall.MALL_SUCCESS:
            ctypes.memmove(ctypes.addressof(self.applied), ctypes.addressof(raw), ctypes.sizeof(raw))
            if self.trampoline is not None:
                self.trampoline(ctypes.pointer(raw), None)
        return rc

    def mall_get_allocation(self, handle, out):
        ctypes.memmove(ctypes.addressof(out), ctypes.addressof(self.applied), ctypes.sizeof(out))
        return mall.MALL_SUCCESS

    def mall_close(self, handle):
        self.closed += 1

    def strerror(self, rc):
        return f"text for {rc}"


class StepMappingTest(CleanEnvironment):
    def test_success_noupdt_and_errors(self):
        raw = alloc_struct(3, [0, 1], "0-1")
        api = FakeApi([(mall.MALL_NOUPDT, None), (mall.MALL_SUCCESS, raw), (mall.MALL_NOUPDT, None),
                       (mall.MALL_ERR_INVAL, None)])
        seen = []
        with mall.Client(ABSENT_SOCKET, _api=api) as client:
            client.on_resize(seen.append)
            self.assertFalse(client.step())
            self.assertEqual(seen, [])
            self.assertTrue(client.step())
            self.assertEqual(seen, [mall.Allocation(3, 2, (0, 1), "0-1", threads=2)])
            self.assertEqual(client.allocation, seen[0])
            self.assertFalse(client.step())
            with self.assertRaises(mall.MallError) as caught:
                client.step()
            self.assertEqual(caught.exception.code, mall.MALL_ERR_INVAL)
            self.assertEqual(caught.exception.text, "text for -1")
        self.assertEqual(api.closed, 1)

    def test_a_callback_error_is_raised_by_step_after_the_c_call(self):
        api = FakeApi([(mall.MALL_SUCCESS, alloc_struct(1, [0])), (mall.MALL_SUCCESS, alloc_struct(2, [1])),
                       (mall.MALL_NOUPDT, None)])
        later = []

        def failing(allocation):
            if allocation.generation == 1:
                raise RuntimeError("pool refused")

        with mall.Client(ABSENT_SOCKET, _api=api) as client:
            client.on_resize(failing)
            client.on_resize(later.append)
            with self.assertRaisesRegex(RuntimeError, "pool refused"):
                client.step()
            self.assertTrue(client.step())  # the error is reported once
            self.assertEqual([a.generation for a in later], [2])
            self.assertFalse(client.step())

    def test_keyboard_interrupt_in_a_callback_reaches_the_loop(self):
        api = FakeApi([(mall.MALL_SUCCESS, alloc_struct(1, [0]))])

        def interrupted(_allocation):
            raise KeyboardInterrupt

        with mall.Client(ABSENT_SOCKET, _api=api) as client:
            client.on_resize(interrupted)
            with self.assertRaises(KeyboardInterrupt):
                client.step()


SIGNAL_CHILD = r"""
import sys, time, mall
client = mall.Client(required=False)   # no malld: kept, and it takes mallctl signal requests
client.on_resize(lambda a: print(f"change threads={a.threads} cpus={a.text}", flush=True))
print("ready", flush=True)
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    client.step()
    time.sleep(0.005)
"""


class SignalControlTest(CleanEnvironment):
    """A Python training loop with MALL_SIGNAL_CONTROL=1 is resized by `mallctl signal`, no malld."""

    def test_mallctl_signal_reaches_the_python_callbacks(self):
        mallctl = os.environ.get("MALL_MALLCTL")
        if not mallctl:
            self.skipTest("MALL_MALLCTL is not set (ctest sets it to the build's mallctl)")
        if not {0, 1} <= os.sched_getaffinity(0):
            self.skipTest("needs cpus 0 and 1")
        env = dict(os.environ, MALL_SIGNAL_CONTROL="1", MALL_SOCKET=ABSENT_SOCKET, MALL_QUIET="1")
        child = subprocess.Popen([sys.executable, "-c", SIGNAL_CHILD], env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, text=True)
        try:
            self.assertEqual(child.stdout.readline().strip(), "ready")
            done = subprocess.run([mallctl, "signal", str(child.pid), "--threads", "1"], capture_output=True,
                                  text=True, timeout=30)
            self.assertEqual(done.returncode, 0, done.stderr)
            self.assertIn("1 thread on cpus", done.stdout)
            self.assertEqual(child.stdout.readline().strip(), "change threads=1 cpus=0-1")
            done = subprocess.run([mallctl, "signal", str(child.pid), "--cpus", "0"], capture_output=True,
                                  text=True, timeout=30)
            self.assertEqual(done.returncode, 0, done.stderr)
            self.assertEqual(child.stdout.readline().strip(), "change threads=1 cpus=0")
            self.assertEqual(os.sched_getaffinity(child.pid), {0})
        finally:
            child.kill()
            child.wait()
            child.stdout.close()


class AllocationTest(unittest.TestCase):
    def test_decodes_mask_across_words(self):
        cpus = [0, 1, 63, 64, 130, 1023]
        allocation = mall.Allocation.from_struct(alloc_struct(7, cpus, "0-1,63-64,130,1023"))
        self.assertEqual(allocation.generation, 7)
        self.assertEqual(allocation.ncpus, 6)
        self.assertEqual(allocation.cpus, tuple(cpus))
        self.assertEqual(allocation.text, "0-1,63-64,130,1023")

    def test_empty_allocation(self):
        self.assertEqual(mall.Allocation.from_struct(_library.MallAllocStruct()),
                         mall.Allocation(0, 0, (), ""))

    def test_pin_process_threads_keeps_the_current_cpus(self):
        current = os.sched_getaffinity(0)
        self.assertGreaterEqual(mall.pin_process_threads(sorted(current)), 1)
        self.assertEqual(os.sched_getaffinity(0), current)
        with self.assertRaises(ValueError):
            mall.pin_process_threads([])


class InstalledLayoutTest(unittest.TestCase):
    """An install (prefix/lib/libmall.so.0 + prefix/lib/pythonX.Y/dist-packages/mall with the
    generated _install_paths.py) finds its own libmall without MALL_LIBRARY."""

    def test_installed_package_finds_its_library(self):
        source_library = _library.load().path
        if os.sep not in source_library:
            self.skipTest("libmall was found by soname; no file to copy")
        package = Path(mall.__file__).resolve().parent
        with tempfile.TemporaryDirectory() as prefix:
            libdir = Path(prefix, "lib")
            site = libdir / "python3.11" / "dist-packages"
            shutil.copytree(package, site / "mall", ignore=shutil.ignore_patterns("__pycache__", "*.in"))
            shutil.copy(source_library, libdir / "libmall.so.0")
            template = (package / "_install_paths.py.in").read_text()
            (site / "mall" / "_install_paths.py").write_text(
                template.replace("@MALL_LIBRARY_DIR_RELATIVE@", "../../..")
                        .replace("@MALL_LIBRARY_DIR_ABSOLUTE@", "/nonexistent-mall-prefix/lib"))
            env = {k: v for k, v in os.environ.items() if k not in ("MALL_LIBRARY", "PYTHONPATH")}
            env["PYTHONPATH"] = str(site)
            env["PYTHONDONTWRITEBYTECODE"] = "1"
            done = subprocess.run(
                [sys.executable, "-c", "import mall, mall._library as l; print(l.load().path); "
                                       "print(mall.__file__); print(mall.api_version())"],
                cwd=prefix, env=env, capture_output=True, text=True, timeout=60)
            self.assertEqual(done.returncode, 0, done.stderr)
            library_path, module_path, _version = done.stdout.splitlines()
            self.assertEqual(Path(library_path).resolve(), (libdir / "libmall.so.0").resolve())
            self.assertTrue(module_path.startswith(str(site)), module_path)


if __name__ == "__main__":
    unittest.main(verbosity=2)
