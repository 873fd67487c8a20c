// SPDX-License-Identifier: BSD-3-Clause
// topology.hpp — the node's hardware topology as malld sees it, loaded with hwloc from the running
// system (including cpus outside malld's own cpuset), an hwloc XML file, or a synthetic description
// ("pack:2 core:16 pu:2"). The unit of allocation is the PU (a Linux cpu number, hwloc os_index).
// Gives policies a locality measure (how deep in the tree two PUs share an ancestor) and the
// Slurm daemon code the cores Slurm's core ids count (cores()).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "../../common/cpuset.hpp"
#include "../../common/slurm_cpu_map.hpp"

struct hwloc_topology;

namespace mall {

class Topology {
public:
    // spec: "" or "system" = this machine; a path to an existing file = hwloc XML; anything else is
    // taken as an hwloc synthetic description. On failure returns nullptr and fills *error.
    static std::unique_ptr<Topology> load(const std::string &spec, std::string *error);
    ~Topology();
    Topology(const Topology &) = delete;
    Topology &operator=(const Topology &) = delete;

    const CpuSet &all_cpus() const { return all_cpus_; }  // every PU's os index
    // PUs in hwloc logical order (siblings adjacent): the order placement walks.
    const std::vector<int> &cpus_in_tree_order() const { return order_; }
    // Depth of the deepest common ancestor of two PUs (larger = closer; root = 0; same PU = pu
    // depth); -1 when either is not in the topology.
    int shared_depth(int cpu_a, int cpu_b) const;
    // Position of a cpu in cpus_in_tree_order(), -1 if unknown.
    int tree_index(int cpu) const;
    // Every core in hwloc logical order with its PUs: the order Slurm's abstract core ids count in
    // (map them with map_slurm_cores() from common/slurm_cpu_map.hpp, as the Slurm plugin does).
    const NodeCores &cores() const { return cores_; }
    std::string description() const;  // e.g. "1 package, 2 cores, 2 PUs"

private:
    Topology() = default;
    hwloc_topology *topo_ = nullptr;
    CpuSet all_cpus_;
    std::vector<int> order_;
    NodeCores cores_;
    std::vector<int> index_of_;                 // cpu -> tree index or -1
    std::vector<std::vector<int>> ancestors_;  // tree index -> ancestor ids from root to PU
};

}  // namespace mall
