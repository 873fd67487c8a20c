// policy.hpp — co-scheduling policies as pure functions: from the pool, the topology and the jobs
// (limits, guaranteed cpus, pins, what each holds now) to the cpus each job should hold. No I/O,
// no clock. Guarantees of every policy: targets are disjoint subsets of the pool. A pinned job's
// target is its pin, less cpus outside the pool, guaranteed to another job or pinned by an earlier
// job. An unpinned job's target holds its guaranteed cpus (those Slurm gave it, when in the pool
// and not guaranteed to an earlier job too), reaches its min while the pool lasts (earlier jobs
// first), and never exceeds its max (or its guaranteed count, when that is larger). Placement
// keeps a job's cpus close in the hwloc tree and moves as few cpus as possible from what it holds.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "../../common/cpuset.hpp"
#include "../../common/rules.hpp"
#include "throughput_policy.hpp"
#include "topology.hpp"

namespace mall {

struct PolicyJob {
    std::string id;
    int min = 1;
    int max = 1;
    double weight = mall::kDefaultWeight;
    CpuSet guaranteed;              // must stay in the target
    CpuSet current;                 // what the job holds now (for minimal moves)
    std::optional<CpuSet> pinned;   // admin override: the target is this, less what is cut (above)
    uint64_t order = 0;             // registration order: earlier jobs win ties
    // throughput policy only (see throughput_policy.hpp):
    std::vector<RateSample> samples;  // measured work rates at the core counts it ran on
    bool in_dwell = false;            // changed too recently to be shrunk or probed
};

// static: each job gets its guaranteed cpus, raised to its min; nothing is lent.
// equal: idle cpus lent evenly within min..max.
// weighted: idle cpus lent in proportion to each job's weight within min..max.
// throughput: idle cpus to the jobs whose measured speedup gains most (throughput_policy.hpp).
enum class PolicyKind { Static, Equal, Weighted, Throughput };

std::optional<PolicyKind> parse_policy(const std::string &name);
const char *policy_name(PolicyKind kind);
std::vector<std::string> policy_names();

// Returns the target cpus per job id. Every job in `jobs` appears in the result.
std::map<std::string, CpuSet> compute_allocation(PolicyKind kind, const Topology &topology,
                                                 const CpuSet &pool,
                                                 const std::vector<PolicyJob> &jobs);

// How many cpus each job's target in compute_allocation(kind, *, pool, jobs) holds: the same
// counting, without placement (for tests).
std::map<std::string, int> compute_counts(PolicyKind kind, const CpuSet &pool,
                                          const std::vector<PolicyJob> &jobs);

}  // namespace mall
