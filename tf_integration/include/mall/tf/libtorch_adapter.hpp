// SPDX-License-Identifier: BSD-3-Clause
// Kept for code written against 0.3: the libtorch adapter moved to mall/libtorch/adapter.hpp
// (namespace mall::libtorch); its 0.3 names in mall::tf still name it (and, with an OpenMP build of
// libtorch, the OpenMP adapter's, which 0.3's header brought along).
#pragma once

#include <mall/libtorch/adapter.hpp>
#if AT_PARALLEL_OPENMP
#include <mall/tf/openmp_adapter.hpp>
#endif

namespace mall::tf {
using mall::libtorch::apply_allocation_to_libtorch;
using mall::libtorch::apply_allocation_to_libtorch_callback;
using mall::libtorch::attach_libtorch;
using mall::libtorch::LibtorchAdapterOptions;
using mall::libtorch::LibtorchAttachment;
using mall::libtorch::LibtorchResizeResult;
}  // namespace mall::tf
