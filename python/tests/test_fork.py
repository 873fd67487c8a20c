# SPDX-License-Identifier: BSD-3-Clause
"""test_fork.py — a forked child cannot stop its parent's mall.Client (issue 37, defect 6).

A child made with os.fork() or multiprocessing (DataLoader workers) inherits the parent's Client.
Its close() or its normal exit (weakref.finalize's atexit hook) once ran mall_close() on the parent's
handle and stopped the parent's background thread: the parent never reattached after a malld
restart. Now the child closes nothing of the parent's, and the parent keeps following malld.

Run by ctest (label unit) with MALL_LIBRARY=<build>/lib/libmall.so, PYTHONPATH=python/ and
MALL_FAKE_DAEMON=<build>/bin/mall_fake_daemon (tests/support/fake_daemon_main.cpp), which plays
malld: it serves generation 1 and restarts with a new page on request.
"""

import atexit
import ctypes
import multiprocessing
import os
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

import mall

FAKE_DAEMON = os.environ.get("MALL_FAKE_DAEMON", "")
TIMEOUT_S = 10


class FakeMalld:
    """mall_fake_daemon on a socket of its own, driven one line at a time."""

    def __init__(self, socket_path):
        self.proc = subprocess.Popen([FAKE_DAEMON, socket_path], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        ready = self.proc.stdout.readline().strip()
        if ready != "ready":
            self.close()
            raise RuntimeError(f"mall_fake_daemon did not start (said {ready!r})")

    def command(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def restart(self, generation):
        """Hangs up on every client and serves a new page at `generation`, as a restarted malld."""
        answer = self.command(f"restart {generation} 0")
        if answer != f"generation {generation}":
            raise RuntimeError(f"mall_fake_daemon could not restart: {answer!r}")

    def close(self):
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()


def wait_for_child(pid):
    """The child's exit code; a child still running after TIMEOUT_S is killed (-SIGKILL)."""
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def step_until_generation(client, generation):
    """Steps until the applied allocation has `generation` (bounded); True when it came."""
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        client.step()
        if client.allocation.generation == generation:
            return True
        time.sleep(0.005)
    return False


# multiprocessing workers (fork start method): they inherit the module's client, as DataLoader
# workers inherit the training loop's.
_inherited_client = None


def _worker_steps_and_closes():
    assert _inherited_client.step() is False, "the parent's malld drove the child"
    _inherited_client.close()


@unittest.skipUnless(FAKE_DAEMON and os.access(FAKE_DAEMON, os.X_OK),
                     "MALL_FAKE_DAEMON (build target mall_fake_daemon) is not set")
class ForkedChildTest(unittest.TestCase):
    def setUp(self):
        for name in ("MALL_SOCKET", "MALL_JOB_ID", "MALL_MIN", "MALL_MAX"):
            os.environ.pop(name, None)
        self.dir = tempfile.mkdtemp(prefix="mall-python-fork-")
        self.socket = os.path.join(self.dir, "malld.sock")
        self.malld = FakeMalld(self.socket)
        self.client = mall.Client(self.socket)
        self.assertTrue(self.client.attached)
        self.assertTrue(self.client.step())
        self.assertEqual(self.client.allocation.generation, 1)

    def tearDown(self):
        global _inherited_client
        _inherited_client = None
        self.client.close()
        self.malld.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def assert_parent_follows_malld(self):
        # Only a running background thread reattaches to the restarted malld's new page.
        self.malld.restart(5)
        self.assertTrue(step_until_generation(self.client, 5),
                        "the parent no longer follows malld after its child ended")
        self.assertTrue(self.client.attached)

    def test_os_fork_child_exiting_normally_leaves_the_parent_following_malld(self):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = 0 if self.client.step() is False else 2
                atexit._run_exitfuncs()  # the interpreter's normal exit: weakref.finalize's hook
            finally:
                os._exit(code)
        self.assertEqual(wait_for_child(pid), 0)
        self.assert_parent_follows_malld()

    def test_os_fork_child_closing_the_client_leaves_the_parent_following_malld(self):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                self.client.close()
                code = 0 if self.client.closed else 3
            finally:
                os._exit(code)
        self.assertEqual(wait_for_child(pid), 0)
        self.assertFalse(self.client.closed)
        self.assert_parent_follows_malld()

    def test_multiprocessing_workers_closing_the_client_leave_the_parent_following_malld(self):
        global _inherited_client
        _inherited_client = self.client
        context = multiprocessing.get_context("fork")
        workers = [context.Process(target=_worker_steps_and_closes) for _ in range(2)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(TIMEOUT_S)
            if worker.exitcode is None:
                worker.kill()
                worker.join()
            self.assertEqual(worker.exitcode, 0)
        self.assert_parent_follows_malld()


class RecordingApi:
    """Stands in for libmall: counts mall_close calls in a shared counter (seen across fork)."""

    def __init__(self):
        self.version = 100
        self.closes = multiprocessing.get_context("fork").Value(ctypes.c_int, 0)

    def mall_open(self, path, handle, error):
        handle.value = 0x1234
        return mall.MALL_SUCCESS

    def mall_step(self, handle):
        return mall.MALL_NOUPDT

    def mall_close(self, handle):
        with self.closes.get_lock():
            self.closes.value += 1

    def strerror(self, rc):
        return f"text for {rc}"


class FinalizerTest(unittest.TestCase):
    def test_the_finalizer_does_not_call_mall_close_in_a_forked_child(self):
        api = RecordingApi()
        client = mall.Client("/nonexistent-mall-python-test/malld.sock", _api=api)
        for child_ends in (atexit._run_exitfuncs, client.close):  # a normal exit; an explicit close
            pid = os.fork()
            if pid == 0:
                try:
                    child_ends()
                finally:
                    os._exit(0)
            self.assertEqual(wait_for_child(pid), 0)
            self.assertEqual(api.closes.value, 0, f"the child's {child_ends.__name__} called mall_close "
                                                  "on the parent's handle")
        client.close()
        self.assertEqual(api.closes.value, 1, "the opener's close calls mall_close once")


if __name__ == "__main__":
    unittest.main(verbosity=2)
