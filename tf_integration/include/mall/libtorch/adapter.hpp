// SPDX-License-Identifier: BSD-3-Clause
// libtorch adapter: makes libtorch's intra-op parallelism follow mall's allocation. Each allocation
// mall_step() applies calls at::set_num_threads(its thread count: mall_alloc_threads(), the cpu
// count unless an admin set fewer threads), pins the stepping thread's OpenMP pool to the
// allocation's cpus (libtorch's OpenMP builds run intra-op work there), then checks with
// at::get_num_threads() that libtorch took the count, before mall_step() acks. A mismatch is
// reported (result + one stderr line), never fatal. Header-only; includes only ATen/Parallel.h of
// libtorch. Namespace mall::libtorch (0.3's mall/tf/libtorch_adapter.hpp and mall::tf names forward
// here).
#pragma once

#include <ATen/Parallel.h>  // at::set_num_threads, at::get_num_threads; ATen/Config.h's AT_PARALLEL_*

#if AT_PARALLEL_OPENMP
#ifndef _OPENMP
#error "this libtorch is an OpenMP build: compile with -fopenmp (link the CMake target mall::tf_libtorch)"
#endif
#include <mall/openmp/adapter.hpp>
#endif

#include <sched.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>

#include <mall/adapter/allocation_cpus.hpp>
#include <mall/adapter/attach.hpp>
#include <mall/mall.h>

namespace mall::libtorch {

// What the last applied allocation did to libtorch. Written by mall_step() on the stepping thread;
// read it on that thread.
struct LibtorchResizeResult {
  uint64_t generation = 0;   // allocation applied; 0 before the first one
  int requested = 0;         // the allocation's thread count: mall_alloc_threads()
  int torch_threads = 0;     // at::get_num_threads() afterwards
  int omp_threads = 0;       // omp_get_max_threads() afterwards (OpenMP builds; else 0)
  bool matched = false;      // libtorch (and OpenMP) report exactly `requested` threads
  char error[160] = {};      // why not, when libtorch threw or reported another count
#if AT_PARALLEL_OPENMP
  mall::openmp::OpenMPResizeResult openmp;  // the pinning of the OpenMP pool
#endif
};

struct LibtorchAdapterOptions {
  // Where the adapter writes its one-line warnings; nullptr silences them.
  std::FILE* warnings = stderr;
};

// The state behind one attach_libtorch(); lives for the rest of the process (libmall cannot
// remove a callback).
struct LibtorchAttachment {
  LibtorchAdapterOptions options;
  LibtorchResizeResult last;
#if AT_PARALLEL_OPENMP
  mall::openmp::OpenMPAttachment openmp;
#endif
};

// Applies one allocation to libtorch on the calling thread. Never throws, never aborts.
inline LibtorchResizeResult apply_allocation_to_libtorch(const mall_alloc_t& alloc,
                                                         LibtorchAttachment& attachment) {
  LibtorchResizeResult result;
  result.generation = alloc.generation;
  result.requested = mall_alloc_threads(&alloc);
#if AT_PARALLEL_OPENMP
  // Pins the pool and sets OpenMP's count; at::set_num_threads below sets the same count again
  // and also libtorch's own record of it (and its pthreadpool for quantized kernels).
  result.openmp = openmp::apply_allocation_to_openmp(alloc, attachment.openmp);
#else
  // Native/TBB builds: their worker pools are out of reach; pin the calling thread only and let
  // malld's enforcement cover the rest.
  const cpu_set_t cpus = adapter::cpu_set_from_allocation(alloc);
  if (CPU_COUNT(&cpus) > 0) (void)::sched_setaffinity(0, sizeof cpus, &cpus);
#endif
  try {
    at::set_num_threads(mall_alloc_threads(&alloc));
    result.torch_threads = at::get_num_threads();
  } catch (const std::exception& e) {
    std::snprintf(result.error, sizeof result.error, "at::set_num_threads(%d) failed: %s",
                  mall_alloc_threads(&alloc), e.what());
  } catch (...) {
    std::snprintf(result.error, sizeof result.error, "at::set_num_threads(%d) failed", mall_alloc_threads(&alloc));
  }
#if AT_PARALLEL_OPENMP
  result.omp_threads = omp_get_max_threads();
  result.matched = result.torch_threads == mall_alloc_threads(&alloc) && result.omp_threads == mall_alloc_threads(&alloc);
#else
  result.matched = result.torch_threads == mall_alloc_threads(&alloc);
#endif
  if (!result.matched && result.error[0] == '\0') {
    std::snprintf(result.error, sizeof result.error,
                  "asked for %d threads, at::get_num_threads() reports %d, omp_get_max_threads() %d",
                  mall_alloc_threads(&alloc), result.torch_threads, result.omp_threads);
  }
  if (!result.matched && attachment.options.warnings != nullptr) {
    // The error text may be cut at 160 bytes; a newline-free single line either way.
    std::fprintf(attachment.options.warnings, "mall: libtorch adapter: %s (allocation %s)\n",
                 result.error, alloc.cpus);
  }
  attachment.last = result;
  return result;
}

// The mall_resize_fn that attach_libtorch() registers; arg is a LibtorchAttachment*.
inline void apply_allocation_to_libtorch_callback(const mall_alloc_t* alloc, void* arg) {
  if (auto* attachment = adapter::state_to_apply<LibtorchAttachment>(alloc, arg))
    (void)apply_allocation_to_libtorch(*alloc, *attachment);
}

// Makes every mall_step() on m that brings a new allocation set libtorch's intra-op thread count
// to the allocation's thread count (mall_alloc_threads()) and pin its OpenMP threads to the
// allocation, before the ack.
// Call mall_step() on the thread that runs the model (libtorch's intra-op regions are opened by
// the thread that calls the operator), between operators. Do not attach the OpenMP adapter as
// well: this one already drives OpenMP.
// *out (may be null) receives the attachment, whose `last` tells what the latest change did; m owns
// it and mall_close(m) frees it.
// Returns what adapter::attach_state() returns: MALL_SUCCESS, MALL_ERR_INVAL (null handle),
// MALL_ERR_NOMEM, MALL_ERR_FULL (16 callbacks already registered on m) or MALL_ERR_SYSTEM.
inline int attach_libtorch(mall_t* m, LibtorchAttachment** out = nullptr,
                           const LibtorchAdapterOptions& options = {}) {
  const int rc = adapter::attach_state<LibtorchAttachment>(
      m, &apply_allocation_to_libtorch_callback,
      [&](LibtorchAttachment& attachment) {
        attachment.options = options;
#if AT_PARALLEL_OPENMP
        attachment.openmp.options.warnings = options.warnings;
        int torch_threads = 1;
        try {
          torch_threads = at::get_num_threads();  // libtorch's default may exceed OpenMP's
        } catch (...) {
        }
        attachment.openmp.pool_high_water = std::max(omp_get_max_threads(), torch_threads);
#endif
      },
      out);
#if AT_PARALLEL_OPENMP
  if (rc == MALL_SUCCESS) openmp::warn_if_openmp_binds(options.warnings);
#endif
  return rc;
}

}  // namespace mall::libtorch
