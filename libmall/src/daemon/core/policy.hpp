// SPDX-License-Identifier: BSD-3-Clause
// policy.hpp — co-scheduling policies as pure functions: from the pool, the topology and the jobs
// (limits, guaranteed cpus, pins, what each holds now) to the cpus each job should hold. No I/O,
// no clock. Guarantees of every policy: targets are disjoint subsets of the pool. A pinned job's
// target is its pin, less cpus outside the pool, guaranteed to another job or pinned by an earlier
// job. An unpinned job's target holds its guaranteed cpus (those Slurm gave it, when in the pool
// and not guaranteed to an earlier job too), reaches its min while the pool lasts (earlier jobs
// first), and never exceeds its max (or its guaranteed count, when that is larger). Placement
// keeps a job's cpus close in the hwloc tree and moves as few cpus as possible from what it holds.
//
// SMT (cores of several PUs, e.g. "pack:2 core:16 pu:2"; issue 13): placement hands out whole
// cores, after minimal movement (a job keeps what it may keep and grows around it) and before
// locality (a whole core in the other package beats half a core beside the job). Counting is not
// affected: only which PUs a job gets.
// - Growing, a job takes the free PUs of cores it is on, then whole free cores. A job that holds
//   whole cores (or nothing) and grows to an even count holds only whole cores while free whole
//   cores last.
// - Odd counts: whole cores plus one PU. That PU is taken after every job of the generation took
//   its whole cores, and goes (nearest first within each) to a PU whose sibling is outside the
//   pool, else to a free core of its own (the sibling stays idle, or takes a later odd PU), and
//   only when no free PU is left on a core without another job, beside another job's odd PU.
//   So on a full node with k jobs of odd count about k/2 cores are shared, each by two odd PUs.
// - Shrinking, a job gives back the cores it holds half of (those shared with another job first)
//   before whole ones; to an odd count it keeps one half core it had rather than split a whole one.
// - Sharing that remains beyond those pairs: cores split by guaranteed or pinned cpus, and cores
//   split because moves are minimal: jobs that give back an odd number of PUs give back halves
//   of their cores, and whoever grows gets those (4 + 4 PUs on 4 cores becoming 3 + 3 + 2: the
//   newcomer gets a PU beside each of the others, until a later change lets them move).
// With one PU per core all of this reduces to the locality rule above.
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
