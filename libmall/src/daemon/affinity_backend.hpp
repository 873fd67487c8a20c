// SPDX-License-Identifier: BSD-3-Clause
// affinity_backend.hpp — the backend without cgroups: sched_setaffinity on every thread of a job's
// processes and their descendants. A process may undo it itself, which is why make_backend picks it
// last. The cgroup backends use set_tree_affinity too: the kernel keeps each thread's own mask
// (effective = cpuset ∩ mask), so a grown job's threads are widened as well.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "backend.hpp"

namespace mall {

std::unique_ptr<CpusetBackend> make_affinity_backend();

// Sets every thread of each pid and of its descendants to `cpus`. A thread that is gone is fine;
// the first other failure goes to *first_error (when given and still empty).
void set_tree_affinity(const std::string &job, const std::vector<pid_t> &pids, const CpuSet &cpus,
                       std::string *first_error);

}  // namespace mall
