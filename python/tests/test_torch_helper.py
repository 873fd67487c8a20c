# SPDX-License-Identifier: BSD-3-Clause
"""test_torch_helper.py — proves mall.torch.Malleable: on a new allocation it sets torch's thread count
to ncpus and pins every thread of the process to the allocation (inside mall_step, before the ack),
returns the new count; on no change it returns None after exactly one mall_step call.
Skipped when torch cannot be imported (Debian: apt install python3-torch).
"""

import os
import unittest

import mall
from test_client import ABSENT_SOCKET, CleanEnvironment, FakeApi, alloc_struct

try:
    import torch
except ImportError:  # pragma: no cover - depends on the machine
    torch = None


class CountingApi(FakeApi):
    def __init__(self, script):
        super().__init__(script)
        self.step_calls = 0

    def mall_step(self, handle):
        self.step_calls += 1
        return super().mall_step(handle)


@unittest.skipIf(torch is None, "torch is not importable (apt install python3-torch)")
class MalleableTest(CleanEnvironment):
    def setUp(self):
        super().setUp()
        import mall.torch  # noqa: F401 — imports torch; only here so the skip above applies
        self.original_threads = torch.get_num_threads()
        self.original_affinity = os.sched_getaffinity(0)
        # Allocations the test process may run on: its own cpus, one of them alone.
        self.all_cpus = sorted(self.original_affinity)
        self.one_cpu = self.all_cpus[:1]

    def tearDown(self):
        torch.set_num_threads(self.original_threads)
        mall.pin_process_threads(self.original_affinity)
        super().tearDown()

    def thread_affinities(self):
        affinities = {}
        for tid in os.listdir("/proc/self/task"):
            try:
                affinities[int(tid)] = os.sched_getaffinity(int(tid))
            except ProcessLookupError:
                pass
        return affinities

    def test_follows_each_allocation(self):
        script = [(mall.MALL_SUCCESS, alloc_struct(1, self.one_cpu)),
                  (mall.MALL_NOUPDT, None),
                  (mall.MALL_SUCCESS, alloc_struct(2, self.all_cpus))]
        api = CountingApi(script)
        with mall.Client(ABSENT_SOCKET, _api=api) as client:
            helper = mall.torch.Malleable(client)
            torch.ones(1000, 1000).sum()  # let torch start its worker threads

            self.assertEqual(helper.step(), 1)
            self.assertEqual(torch.get_num_threads(), 1)
            self.assertEqual(helper.allocation.cpus, tuple(self.one_cpu))
            for tid, cpus in self.thread_affinities().items():
                self.assertEqual(cpus, set(self.one_cpu), f"thread {tid}")

            calls = api.step_calls
            self.assertIsNone(helper.step())
            self.assertEqual(api.step_calls, calls + 1, "no change: one mall_step call")
            self.assertEqual(torch.get_num_threads(), 1)

            self.assertEqual(helper.step(), len(self.all_cpus))
            self.assertEqual(torch.get_num_threads(), len(self.all_cpus))
            self.assertEqual(helper.threads, len(self.all_cpus))
            for tid, cpus in self.thread_affinities().items():
                self.assertEqual(cpus, set(self.all_cpus), f"thread {tid}")

    def test_repin_false_leaves_affinity_alone(self):
        api = CountingApi([(mall.MALL_SUCCESS, alloc_struct(1, self.one_cpu))])
        with mall.Client(ABSENT_SOCKET, _api=api) as client:
            helper = mall.torch.Malleable(client, repin=False)
            self.assertEqual(helper.step(), 1)
        self.assertEqual(os.sched_getaffinity(0), self.original_affinity)

    def test_without_malld_it_never_changes_torch(self):
        client, lines = self.open_quietly(ABSENT_SOCKET)
        with client:
            helper = mall.torch.Malleable(client)
            for _ in range(100):
                self.assertIsNone(helper.step())
        self.assertEqual(len(lines), 1)
        self.assertEqual(torch.get_num_threads(), self.original_threads)
        self.assertIsNone(helper.allocation)


if __name__ == "__main__":
    unittest.main(verbosity=2)
