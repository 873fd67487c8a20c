// SPDX-License-Identifier: BSD-3-Clause
// allocation_cpus.hpp — an allocation's cpus (mall_alloc_t::mask) as a cpu_set_t for
// sched_setaffinity / pthread_setaffinity_np: the one conversion every adapter (the Eigen pool's
// glue, OpenMP, libtorch) pins with. Header-only; needs only mall/mall.h (no Eigen, no OpenMP).
#pragma once

#include <sched.h>

#include <mall/mall.h>

namespace mall::adapter {

// The allocation's cpus as a cpu_set_t (cpus at or beyond CPU_SETSIZE are dropped).
inline cpu_set_t cpu_set_from_allocation(const mall_alloc_t& alloc) {
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  for (int cpu = 0; cpu < MALL_MAX_CPUS && cpu < CPU_SETSIZE; ++cpu) {
    if ((alloc.mask[cpu / 64] >> (cpu % 64)) & 1u) CPU_SET(cpu, &cpus);
  }
  return cpus;
}

}  // namespace mall::adapter
