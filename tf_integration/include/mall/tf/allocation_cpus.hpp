// SPDX-License-Identifier: BSD-3-Clause
// Kept for code written against 0.3: the conversion moved to mall/adapter/allocation_cpus.hpp
// (namespace mall::adapter), shared by every adapter; mall::tf::cpu_set_from_allocation still names it.
#pragma once

#include <mall/adapter/allocation_cpus.hpp>

namespace mall::tf {
using mall::adapter::cpu_set_from_allocation;
}  // namespace mall::tf
