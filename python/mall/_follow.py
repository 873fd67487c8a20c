# SPDX-License-Identifier: BSD-3-Clause
"""mall._follow — what every framework adapter of the package shares (mall.torch.Malleable,
mall.tensorflow.Malleable): it registers a resize callback on a mall.Client, and step() is the
client's step (one ctypes call when nothing changed). On a change, inside mall_step() on the
training thread and before malld gets the ack, it pins every thread of the process to the new cpus
(a shrinking job leaves the cpus it loses first) and then has the framework apply the thread count
(the subclass's _apply, which returns the count the framework now runs).
"""

from __future__ import annotations

from . import Allocation, Client, pin_process_threads


class AllocationFollower:
    """`threads`: the framework's running thread count after the last change (its count at start
    before any); `allocation`: the last applied Allocation (None before the first)."""

    def __init__(self, client: Client, threads: int, *, repin: bool = True):
        self._client = client
        self._repin = repin
        self.threads = threads
        self.allocation: Allocation | None = None
        client.on_resize(self._resize)

    def step(self) -> int | None:
        """Call once per training step, between steps. Returns the framework's new thread count
        when the allocation changed, None when it did not."""
        if not self._client.step():
            return None
        return self.threads

    def _apply(self, allocation: Allocation) -> int:  # pragma: no cover - each framework has its own
        raise NotImplementedError

    def _resize(self, allocation: Allocation) -> None:
        if self._repin and allocation.cpus:
            pin_process_threads(allocation.cpus)
        self.threads = self._apply(allocation)
        self.allocation = allocation
