// SPDX-License-Identifier: BSD-3-Clause
// OpenMP adapter: makes the OpenMP runtime of the training thread follow mall's allocation. Each
// allocation mall_step() applies sets the stepping thread's OpenMP thread count to the allocation's
// thread count (mall_alloc_threads(): its cpu count unless an admin set fewer threads) and pins
// that thread and every worker of its OpenMP thread pool to the allocation's cpus, before
// mall_step() acks. Header-only, needs -fopenmp (CMake target mall::tf_openmp); adds nothing to a
// mall_step() that finds no change. Namespace mall::openmp (0.3's mall/tf/openmp_adapter.hpp and
// mall::tf names forward here).
#pragma once

// Checked before any include, so a build without OpenMP gets this one clear line first.
#ifndef _OPENMP
#error "mall/openmp/adapter.hpp needs OpenMP: compile with -fopenmp (link the CMake target mall::tf_openmp)"
#endif

#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include <mall/adapter/allocation_cpus.hpp>
#include <mall/adapter/attach.hpp>
#include <mall/mall.h>

namespace mall::openmp {

// What the last applied allocation did to the OpenMP runtime. Written by mall_step() on the
// stepping thread; read it on that thread (e.g. after mall_step() returned MALL_SUCCESS).
struct OpenMPResizeResult {
  uint64_t generation = 0;      // allocation applied; 0 before the first one
  int requested = 0;            // the allocation's thread count: mall_alloc_threads()
  int max_threads = 0;          // omp_get_max_threads() afterwards: the size of the next team
  int pinned = 0;               // OpenMP threads (the stepping thread included) now on the allocation
  int pin_failures = 0;         // threads whose sched_setaffinity failed
  int pin_errno = 0;            // errno of the first failure
  bool in_parallel = false;     // mall_step() ran inside a parallel region: workers not reached
  bool other_thread = false;    // mall_step() ran on another thread than for the first allocation
};

struct OpenMPAdapterOptions {
  // Where the adapter writes its one-line warnings; nullptr silences them.
  std::FILE* warnings = stderr;
  // Largest team the program opens with an explicit num_threads(k) clause, if it does (0: none).
  // The adapter re-pins at least this many pool threads on each change (see pin_openmp_pool).
  int largest_explicit_team = 0;
};

// The state behind one attach_openmp(). libmall cannot remove a callback, so it lives for the
// rest of the process.
struct OpenMPAttachment {
  OpenMPAdapterOptions options;
  OpenMPResizeResult last;
  int pool_high_water = 0;      // largest team the stepping thread's pool may hold
  pid_t stepping_tid = 0;       // thread that applied the first allocation
  bool warned_other_thread = false;
};

namespace detail {

inline void openmp_warn(std::FILE* to, const char* what, const mall_alloc_t& alloc) {
  if (to != nullptr) std::fprintf(to, "mall: OpenMP adapter: %s (allocation %s)\n", what, alloc.cpus);
}

}  // namespace detail

// Pins the calling thread, then every thread of a team of `team` threads it opens, to `cpus`.
// With libgomp the team's threads are the pool's first team-1 workers, so a team as large as the
// pool has ever been reaches every idle worker too (libgomp keeps the workers of its largest
// recent team idle when later teams are smaller, including teams of 1, and lets them exit only
// when a team of 2 or more smaller than the pool starts). Workers created later inherit the
// calling thread's mask. Adds the results to *result.
inline void pin_openmp_pool(const cpu_set_t& cpus, int team, OpenMPResizeResult* result) {
  std::atomic<int> pinned{0}, failures{0}, first_errno{0};
  auto pin_self = [&] {
    if (::sched_setaffinity(0, sizeof cpus, &cpus) == 0) {
      pinned.fetch_add(1, std::memory_order_relaxed);
    } else {
      const int e = errno;
      failures.fetch_add(1, std::memory_order_relaxed);
      int none = 0;
      first_errno.compare_exchange_strong(none, e);
    }
  };
  pin_self();  // first, so workers libgomp creates for the team below start on the allocation
  if (team > 1 && !omp_in_parallel()) {
    pinned.store(0);  // the team counts the calling thread again, as thread 0
    const int dynamic = omp_get_dynamic();
    omp_set_dynamic(0);  // the full team, not fewer threads
#pragma omp parallel num_threads(team)
    pin_self();
    omp_set_dynamic(dynamic);
  }
  result->pinned += pinned.load();
  result->pin_failures += failures.load();
  if (result->pin_errno == 0) result->pin_errno = first_errno.load();
}

// Applies one allocation to the calling thread's OpenMP runtime: pins the pool (at least
// attachment->pool_high_water threads) and sets the thread count. Used by the OpenMP and the
// libtorch adapters. Never throws, never aborts; problems go to the result and the warnings.
inline OpenMPResizeResult apply_allocation_to_openmp(const mall_alloc_t& alloc,
                                                     OpenMPAttachment& attachment) {
  OpenMPResizeResult result;
  result.generation = alloc.generation;
  result.requested = mall_alloc_threads(&alloc);
  std::FILE* warnings = attachment.options.warnings;

  const pid_t tid = ::gettid();
  if (attachment.stepping_tid == 0) attachment.stepping_tid = tid;
  if (tid != attachment.stepping_tid) {
    result.other_thread = true;  // OpenMP thread counts are per thread: this one may not train
    if (!attachment.warned_other_thread) {
      attachment.warned_other_thread = true;
      detail::openmp_warn(warnings,
                          "mall_step() ran on another thread than before; the thread count and "
                          "pinning apply to the thread that calls mall_step()",
                          alloc);
    }
  }

  result.in_parallel = omp_in_parallel() != 0;
  if (result.in_parallel) {
    detail::openmp_warn(warnings,
                        "mall_step() ran inside a parallel region: only the calling thread was "
                        "pinned and the outer thread count is unchanged; call it between regions",
                        alloc);
  }

  // Every thread that may sit in the pool: the largest count set so far, the current setting
  // (the program may have changed it) and the largest explicit team the program declared.
  const int team = std::max({attachment.pool_high_water, omp_get_max_threads(),
                             attachment.options.largest_explicit_team, mall_alloc_threads(&alloc)});
  const cpu_set_t cpus = adapter::cpu_set_from_allocation(alloc);
  if (CPU_COUNT(&cpus) > 0) pin_openmp_pool(cpus, result.in_parallel ? 1 : team, &result);
  if (!result.in_parallel) attachment.pool_high_water = team;

  if (mall_alloc_threads(&alloc) > 0) omp_set_num_threads(mall_alloc_threads(&alloc));
  result.max_threads = omp_get_max_threads();

  if (result.pin_failures > 0 && warnings != nullptr) {
    std::fprintf(warnings, "mall: OpenMP adapter: %d of %d threads could not be pinned to %s: %s\n",
                 result.pin_failures, result.pin_failures + result.pinned, alloc.cpus,
                 std::strerror(result.pin_errno));
  }
  if (!result.in_parallel && result.max_threads != mall_alloc_threads(&alloc)) {
    detail::openmp_warn(warnings,
                        "omp_get_max_threads() differs from the allocation's size "
                        "(OMP_THREAD_LIMIT?)",
                        alloc);
  }
  attachment.last = result;
  return result;
}

// The mall_resize_fn that attach_openmp() registers; arg is an OpenMPAttachment*.
inline void apply_allocation_to_openmp_callback(const mall_alloc_t* alloc, void* arg) {
  if (auto* attachment = adapter::state_to_apply<OpenMPAttachment>(alloc, arg))
    (void)apply_allocation_to_openmp(*alloc, *attachment);
}

// Warns once when OMP_PROC_BIND / OMP_PLACES bind threads: libgomp pins the threads it creates
// to places computed at start-up, which may lie outside a later allocation.
inline void warn_if_openmp_binds(std::FILE* warnings) {
  if (warnings != nullptr && omp_get_proc_bind() != omp_proc_bind_false) {
    std::fprintf(warnings,
                 "mall: OpenMP adapter: OMP_PROC_BIND/OMP_PLACES bind threads to places fixed at "
                 "start-up; unset them for a malleable job (the adapter re-pins on each change, "
                 "but threads created later go to the old places)\n");
  }
}

// Makes every mall_step() on m that brings a new allocation set the stepping thread's OpenMP
// thread count to the allocation's thread count (mall_alloc_threads()) and pin its OpenMP threads
// to the allocation, before the ack. Call mall_step() on the thread that opens the parallel
// regions, outside any region.
// *out (may be null) receives the attachment, whose `last` tells what the latest change did; m owns
// it and mall_close(m) frees it.
// Returns what adapter::attach_state() returns: MALL_SUCCESS, MALL_ERR_INVAL (null handle),
// MALL_ERR_NOMEM, MALL_ERR_FULL (16 callbacks already registered on m) or MALL_ERR_SYSTEM.
inline int attach_openmp(mall_t* m, OpenMPAttachment** out = nullptr,
                         const OpenMPAdapterOptions& options = {}) {
  const int rc = adapter::attach_state<OpenMPAttachment>(
      m, &apply_allocation_to_openmp_callback,
      [&](OpenMPAttachment& attachment) {
        attachment.options = options;
        attachment.pool_high_water = omp_get_max_threads();
      },
      out);
  if (rc == MALL_SUCCESS) warn_if_openmp_binds(options.warnings);
  return rc;
}

}  // namespace mall::openmp
