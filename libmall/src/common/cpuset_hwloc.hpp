// SPDX-License-Identifier: BSD-3-Clause
// cpuset_hwloc.hpp — conversions between CpuSet and hwloc bitmaps, for the code that walks hwloc's
// topology or hands sets to hwloc (tests, tools). Header-only: whoever includes it links hwloc
// (mall_common does); libmall never includes it, so a training process does not load hwloc.
#pragma once

#include <hwloc.h>

#include <memory>
#include <new>

#include "cpuset.hpp"

namespace mall {

// The cpus of an hwloc bitmap below CpuSet::kMaxCpus (an infinite bitmap's tail is dropped).
inline CpuSet cpuset_from_hwloc(hwloc_const_bitmap_t bitmap) {
    CpuSet result;
    if (bitmap == nullptr) return result;
    for (int cpu = hwloc_bitmap_first(bitmap); cpu >= 0 && cpu < CpuSet::kMaxCpus; cpu = hwloc_bitmap_next(bitmap, cpu))
        result.add(cpu);
    return result;
}

using HwlocBitmap = std::unique_ptr<hwloc_bitmap_s, void (*)(hwloc_bitmap_t)>;

// A new hwloc bitmap holding the set's cpus (freed with the pointer). Throws std::bad_alloc.
inline HwlocBitmap to_hwloc(const CpuSet &set) {
    HwlocBitmap bitmap(hwloc_bitmap_alloc(), hwloc_bitmap_free);
    if (!bitmap) throw std::bad_alloc();
    for (int cpu = set.first(); cpu >= 0; cpu = set.next_after(cpu)) hwloc_bitmap_set(bitmap.get(), cpu);
    return bitmap;
}

}  // namespace mall
