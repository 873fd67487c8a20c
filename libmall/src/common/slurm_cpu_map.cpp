// SPDX-License-Identifier: BSD-3-Clause
// slurm_cpu_map.cpp — see slurm_cpu_map.hpp. Slurm 22.05 facts it relies on (src/slurmd/common/
// xcpuinfo.c): slurmd's block map sends abstract cpu (core_index * threads + thread) to the os
// index of that PU in hwloc's socket/core/PU walk; xcpuinfo_abs_to_mac expands abstract core c to
// the abstract cpus c*T+t with T = the threads per core slurmd runs with, which is slurm.conf's
// value unless slurm.conf describes more cpus than the hardware has (then slurmd takes hwloc's
// values; with SlurmdParameters=config_overrides it wraps ids instead, which we do not copy).
#include "slurm_cpu_map.hpp"

#include <hwloc.h>

namespace mall {

namespace {

std::string plural(unsigned n, const char *word) {
    return std::to_string(n) + " " + word + (n == 1 ? "" : "s");
}

// hwloc's PUs per core when every core has the same number, else 0.
unsigned uniform_threads(const NodeCores &node) {
    if (node.empty()) return 0;
    const size_t first = node.front().size();
    for (const auto &core : node)
        if (core.size() != first) return 0;
    return static_cast<unsigned>(first);
}

std::string describe(const NodeCores &node) {
    size_t pus = 0;
    for (const auto &core : node) pus += core.size();
    const unsigned threads = uniform_threads(node);
    return plural(static_cast<unsigned>(node.size()), "core") + " x " +
           (threads ? plural(threads, "thread") : std::string("mixed threads")) + " (" +
           plural(static_cast<unsigned>(pus), "cpu") + ")";
}

}  // namespace

std::string SlurmNodeShape::to_string() const {
    if (!known()) return "unknown";
    return plural(sockets, "socket") + " x " + plural(cores_per_socket, "core") + " x " +
           plural(threads_per_core, "thread") + " (" + plural(cpus(), "cpu") + ")";
}

NodeCores node_cores_in_slurm_order(hwloc_topology_t topology) {
    NodeCores node;
    if (topology == nullptr) return node;
    hwloc_obj_t last_core = nullptr;
    const int pus = hwloc_get_nbobjs_by_type(topology, HWLOC_OBJ_PU);
    for (int i = 0; i < pus; ++i) {  // logical PU order = tree order: cores come out in order
        hwloc_obj_t pu = hwloc_get_obj_by_type(topology, HWLOC_OBJ_PU, static_cast<unsigned>(i));
        if (pu == nullptr || pu->os_index >= static_cast<unsigned>(CpuSet::kMaxCpus)) continue;
        hwloc_obj_t core = hwloc_get_ancestor_obj_by_type(topology, HWLOC_OBJ_CORE, pu);
        if (core == nullptr || core != last_core) node.emplace_back();
        last_core = core;
        node.back().push_back(static_cast<int>(pu->os_index));
    }
    return node;
}

SlurmCpuMapping map_slurm_cores(const CpuSet &slurm_cores, const NodeCores &node, const SlurmNodeShape &slurm) {
    SlurmCpuMapping out;
    const unsigned hw_cores = static_cast<unsigned>(node.size());
    std::vector<int> pus;  // every PU in Slurm's order: abstract cpu a is pus[a]
    for (const auto &core : node) pus.insert(pus.end(), core.begin(), core.end());
    const unsigned hw_cpus = static_cast<unsigned>(pus.size());

    const bool agree = !slurm.known() ||
                       (slurm.cores() == hw_cores && slurm.threads_per_core == uniform_threads(node));
    // Slurm's layout is what slurmd maps with unless it claims more cpus than there are.
    const bool by_slurm_threads = !agree && slurm.cpus() <= hw_cpus;
    if (!agree) {
        out.disagreement = "Slurm describes this node as " + slurm.to_string() + " but hwloc finds " +
                           describe(node) + "; Slurm's core ids are mapped as slurmd maps them (" +
                           (by_slurm_threads ? "Slurm's layout over hwloc's cpus in order"
                                             : "hwloc's layout, since Slurm's has more cpus") +
                           "); correct the node's line in slurm.conf from `slurmd -C`";
    }

    CpuSet cpus;
    for (int id : slurm_cores.to_vector()) {
        const unsigned c = static_cast<unsigned>(id);
        if (by_slurm_threads) {
            if (c >= slurm.cores()) {
                out.error = "Slurm core id " + std::to_string(id) + " is beyond the " +
                            plural(slurm.cores(), "core") + " Slurm describes for this node";
                return out;
            }
            for (unsigned t = 0; t < slurm.threads_per_core; ++t) cpus.add(pus[c * slurm.threads_per_core + t]);
        } else {
            if (c >= hw_cores) {
                out.error = "Slurm core id " + std::to_string(id) + " is beyond this node's " +
                            plural(hw_cores, "core") + " (hwloc)" +
                            (slurm.known() ? "; Slurm describes it as " + slurm.to_string() : std::string()) +
                            "; correct the node's line in slurm.conf from `slurmd -C`";
                return out;
            }
            for (int cpu : node[c]) cpus.add(cpu);
        }
    }
    out.cpus = std::move(cpus);
    return out;
}

}  // namespace mall
