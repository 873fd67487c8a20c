// SPDX-License-Identifier: BSD-3-Clause
// Glue from libmall to a framework's pools: each allocation mall_step() applies pins the pools'
// workers to its cpus and parks or releases workers (PoolParking, pool_parking.hpp) to its thread
// count (clamped to 1..max), before mall_step() acks: the job runs no more threads than it holds
// once it acks. Header-only; uses only the public C API in mall/mall.h. Attaches the way every
// adapter does (mall/adapter/attach.hpp).
#pragma once

#include <sched.h>

#include <mall/adapter/allocation_cpus.hpp>
#include <mall/adapter/attach.hpp>
#include <mall/mall.h>
#include <mall/tf/allocation_cpus.hpp>  // kept for code written against 0.3: mall::tf::cpu_set_from_allocation
#include <mall/tf/pool_parking.hpp>

namespace mall::tf {

// The pools one mall_on_resize callback drives. inter_op may be null.
struct PoolAttachment {
  ResizablePool* intra_op = nullptr;
  ResizablePool* inter_op = nullptr;
};

// The mall_resize_fn that attach_pool() registers; arg is a PoolAttachment*. An allocation with no
// cpus (ncpus <= 0: never attached) leaves the pools as they are. Each pool is pinned before it is
// resized, so workers that wake for the new size already run on the allocation's cpus.
inline void apply_allocation_to_pools(const mall_alloc_t* alloc, void* arg) {
  auto* attachment = adapter::state_to_apply<PoolAttachment>(alloc, arg);
  if (attachment == nullptr) return;
  const cpu_set_t cpus = adapter::cpu_set_from_allocation(*alloc);
  for (ResizablePool* pool : {attachment->intra_op, attachment->inter_op}) {
    if (pool == nullptr) continue;
    if (CPU_COUNT(&cpus) > 0) (void)pool->set_affinity(cpus);  // EINVAL only if no cpu is online
    pool->resize(mall_alloc_threads(alloc));  // clamps to 1..max_threads()
  }
}

// Makes every mall_step() on m that brings a new allocation resize intra_op (and inter_op, when
// given) before it acks. The pools must outlive every later mall_step() on m; the small
// PoolAttachment is owned by the handle and freed by mall_close(m).
// Returns what adapter::attach_state() returns: MALL_SUCCESS, MALL_ERR_INVAL (null handle),
// MALL_ERR_NOMEM, MALL_ERR_FULL (16 callbacks already registered on m) or MALL_ERR_SYSTEM.
inline int attach_pool(mall_t* m, ResizablePool& intra_op, ResizablePool* inter_op = nullptr) {
  return adapter::attach_state<PoolAttachment>(m, &apply_allocation_to_pools,
                                               [&](PoolAttachment& attachment) {
                                                 attachment.intra_op = &intra_op;
                                                 attachment.inter_op = inter_op;
                                               });
}

}  // namespace mall::tf
