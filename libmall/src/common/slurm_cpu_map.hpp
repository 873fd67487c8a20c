// SPDX-License-Identifier: BSD-3-Clause
// slurm_cpu_map.hpp — the one translation from Slurm's abstract core ids to this node's Linux cpus,
// used by the SPANK plugin (S_JOB_ALLOC_CORES in slurmstepd) and by malld (the prolog's Reclaim by
// owner, looked up in slurmctld). It does what slurmd 22.05 does for task/cgroup and task/affinity
// (xcpuinfo_abs_to_mac over the block map slurmd builds from hwloc), so mall and Slurm agree on
// which cpus a job holds. Pure: the node comes in as its hwloc cores; no I/O, no logging.
#pragma once

#include <hwloc.h>

#include <optional>
#include <string>
#include <vector>

#include "cpuset.hpp"

namespace mall {

// Slurm's description of this node (slurm.conf's NodeName line, as slurmctld schedules with it).
// All zero = not known (the plugin in slurmstepd cannot see it).
struct SlurmNodeShape {
    unsigned sockets = 0;            // sockets of the node (all boards)
    unsigned cores_per_socket = 0;
    unsigned threads_per_core = 0;

    bool known() const { return sockets > 0 && cores_per_socket > 0 && threads_per_core > 0; }
    unsigned cores() const { return sockets * cores_per_socket; }
    unsigned cpus() const { return cores() * threads_per_core; }
    std::string to_string() const;  // "2 sockets x 4 cores x 2 threads (16 cpus)" or "unknown"
};

// The node's cores in Slurm's abstract order: hwloc's cores in logical order (package by package,
// the walk slurmd's block map makes), each holding its PUs' Linux cpu numbers (os indexes) in hwloc
// logical order. A PU outside any core counts as a core of its own; PUs numbered at or above
// CpuSet::kMaxCpus are left out.
using NodeCores = std::vector<std::vector<int>>;
NodeCores node_cores_in_slurm_order(hwloc_topology_t topology);

struct SlurmCpuMapping {
    std::optional<CpuSet> cpus;  // the Linux cpus; nullopt when the ids cannot be mapped (see error)
    std::string error;           // why cpus is nullopt
    std::string disagreement;    // set when Slurm's description of the node differs from hwloc's:
                                 // the caller logs it (the mapping still follows slurmd)
};

// Maps Slurm's abstract core ids on this node (S_JOB_ALLOC_CORES, or malld's libslurm query) to
// Linux cpus. Abstract core c holds Slurm's abstract cpus c*T .. c*T+T-1 (T = Slurm's threads per
// core; `scontrol show job -d` prints these as CPU_IDs), and abstract cpu a is the a-th PU in the
// order above. Hence:
// - slurm unknown, or Slurm's cores and threads per core equal hwloc's: core c -> every PU of
//   hwloc's core c. With one PU per core numbered in tree order (most small machines) that is the
//   identity: core c -> cpu c.
// - Slurm describes no more cpus than hwloc has, but a different layout (e.g. ThreadsPerCore=1
//   with CPUs counting hardware threads): abstract cpu a -> the a-th PU, as slurmd maps it, and
//   `disagreement` says so.
// - Slurm describes more cpus than hwloc has: slurmd then uses hwloc's own layout, and so does
//   this (core c -> hwloc core c), with `disagreement` set.
// An id beyond what the node has gives no cpus at all and `error` (the caller changes nothing:
// guessing the cores is what puts two jobs on one core). No ids: the empty set.
SlurmCpuMapping map_slurm_cores(const CpuSet &slurm_cores, const NodeCores &node, const SlurmNodeShape &slurm);

}  // namespace mall
