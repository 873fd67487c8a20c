// SPDX-License-Identifier: BSD-3-Clause
// registration_order.hpp — the one order in which the core serves jobs and breaks ties: earlier
// registration first, then the job id (so equal orders, e.g. of jobs a caller built by hand, still
// give one deterministic order). Used by the policies and by the node manager.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

namespace mall {

inline bool registered_before(uint64_t order_a, const std::string &id_a, uint64_t order_b,
                              const std::string &id_b) {
    return order_a != order_b ? order_a < order_b : id_a < id_b;
}

// Indices of `jobs` (anything with `order` and `id`) in registration order.
template <typename Job>
std::vector<size_t> registration_order(const std::vector<Job> &jobs) {
    std::vector<size_t> idx(jobs.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
        return registered_before(jobs[a].order, jobs[a].id, jobs[b].order, jobs[b].id);
    });
    return idx;
}

// The jobs of a map (id -> Job) in registration order, as pointers.
template <typename JobPtr, typename Jobs>
std::vector<JobPtr> in_registration_order(Jobs &jobs) {
    std::vector<JobPtr> ordered;
    ordered.reserve(jobs.size());
    for (auto &entry : jobs) ordered.push_back(&entry.second);
    std::sort(ordered.begin(), ordered.end(), [](JobPtr a, JobPtr b) {
        return registered_before(a->order, a->spec.id, b->order, b->spec.id);
    });
    return ordered;
}

}  // namespace mall
