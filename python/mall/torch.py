# SPDX-License-Identifier: BSD-3-Clause
"""mall.torch — keeps PyTorch's intra-op thread count and threads on the job's mall allocation.

A training loop makes one Malleable(client) and calls its step() at every step boundary. When
nothing changed, step() is one ctypes call (mall_step) and returns None. When malld published a new
allocation, inside mall_step() and before malld gets the ack:
  1. every thread of the process (each tid of /proc/self/task) is pinned to the allocation, so the
     process leaves cores it is losing before malld is told it has (two-phase), and new OpenMP
     workers inherit the right mask from the thread that starts them. (mall_bind_thread would need
     a call from each worker thread, which Python cannot make on libgomp's threads.)
  2. torch.set_num_threads(allocation.threads) (ncpus unless an admin chose fewer with
     `mallctl set --threads`) — Debian's torch runs its intra-op work on OpenMP (libgomp), so
     this sets the OpenMP team size of the next parallel region;
  3. torch.get_num_threads() is checked against that count;
then step() returns the new thread count.
"""

from __future__ import annotations

import torch

from . import Allocation, Client
from ._follow import AllocationFollower

__all__ = ["Malleable"]


class Malleable(AllocationFollower):
    """Follows `client`'s allocation with torch's thread count (and the process's affinity when
    `repin` is True). `threads` is torch's thread count after the last change, `allocation` the
    last applied Allocation (None before the first). step() returns torch's new thread count when
    the allocation changed, None when it did not."""

    def __init__(self, client: Client, *, repin: bool = True):
        super().__init__(client, torch.get_num_threads(), repin=repin)

    def _apply(self, allocation: Allocation) -> int:
        torch.set_num_threads(allocation.threads)
        threads = torch.get_num_threads()
        if threads != allocation.threads:
            raise RuntimeError(f"torch.get_num_threads() is {threads} after "
                               f"torch.set_num_threads({allocation.threads})")
        return threads
