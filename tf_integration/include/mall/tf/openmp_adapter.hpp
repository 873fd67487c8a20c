// SPDX-License-Identifier: BSD-3-Clause
// Kept for code written against 0.3: the OpenMP adapter moved to mall/openmp/adapter.hpp (namespace
// mall::openmp); its 0.3 names in mall::tf still name it. Needs -fopenmp, as before.
#pragma once

#include <mall/openmp/adapter.hpp>
#include <mall/tf/allocation_cpus.hpp>  // 0.3's openmp_adapter.hpp included it

namespace mall::tf {
using mall::openmp::apply_allocation_to_openmp;
using mall::openmp::apply_allocation_to_openmp_callback;
using mall::openmp::attach_openmp;
using mall::openmp::OpenMPAdapterOptions;
using mall::openmp::OpenMPAttachment;
using mall::openmp::OpenMPResizeResult;
using mall::openmp::pin_openmp_pool;
using mall::openmp::warn_if_openmp_binds;
}  // namespace mall::tf
