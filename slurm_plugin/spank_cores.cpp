// SPDX-License-Identifier: BSD-3-Clause
// spank_cores.cpp — what Slurm says about the job on this node, in the node's terms: its id, and
// its cores (Slurm's abstract core ids from S_JOB_ALLOC_CORES) as Linux cpus, mapped as slurmd maps
// them (common/slurm_cpu_map.hpp, the code malld uses for the prolog's lookup); and the cpu counts
// the option is checked against (this node's, or the cluster's largest). Contract: ids the node
// does not have map to nothing (logged) — the job then runs non-malleable rather than mall
// guessing its cores; unknown counts are 0.
#include <dlfcn.h>
#include <unistd.h>

#include <hwloc.h>

#include <algorithm>
#include <cstdlib>

#include "common/slurm_cpu_map.hpp"
#include "spank_plugin.hpp"

namespace mall::spank {
namespace {

using mall::CpuSet;

// The node's topology, loaded once per process, including cpus outside our own cpuset (slurmstepd
// may already sit in a restricted one).
hwloc_topology_t node_topology() {
    static hwloc_topology_t topology = [] {
        hwloc_topology_t t = nullptr;
        if (hwloc_topology_init(&t) != 0) return static_cast<hwloc_topology_t>(nullptr);
        hwloc_topology_set_flags(t, HWLOC_TOPOLOGY_FLAG_INCLUDE_DISALLOWED);
        if (hwloc_topology_load(t) != 0) {
            hwloc_topology_destroy(t);
            return static_cast<hwloc_topology_t>(nullptr);
        }
        return t;
    }();
    return topology;
}

// Slurm's abstract core ids -> Linux cpus, by the mapping malld uses for the prolog's lookup
// (common/slurm_cpu_map.hpp). slurmstepd does not tell a plugin how slurm.conf describes the node,
// so it is taken to match hwloc (as `slurmd -C` prints it); malld, which asks slurmctld, logs it
// when they differ. Ids the node does not have map to nothing: no Reclaim from here, and the job
// runs non-malleable, rather than mall guessing the cores.
std::optional<CpuSet> slurm_cores_to_cpus(const CpuSet &cores) {
    static const mall::NodeCores node = mall::node_cores_in_slurm_order(node_topology());
    mall::SlurmCpuMapping mapped = mall::map_slurm_cores(cores, node, mall::SlurmNodeShape{});
    if (!mapped.cpus)
        log_info("cannot map Slurm's core ids %s to this node's cpus: %s", cores.to_string().c_str(),
                 mapped.error.c_str());
    return mapped.cpus;
}

}  // namespace

unsigned node_cpu_count() {
    if (hwloc_topology_t t = node_topology()) {
        int n = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_PU);
        if (n > 0) return static_cast<unsigned>(n);
    }
    long n = sysconf(_SC_NPROCESSORS_CONF);
    return n > 0 ? static_cast<unsigned>(n) : 0;
}

std::optional<CpuSet> job_cpus_on_node(spank_t sp) {
    char *cores_text = nullptr;
    if (spank_get_item(sp, S_JOB_ALLOC_CORES, &cores_text) != ESPANK_SUCCESS || !cores_text) return std::nullopt;
    std::string error;
    auto cores = CpuSet::parse(cores_text, &error);
    if (!cores || cores->empty()) {
        log_info("cannot read Slurm's core list \"%s\": %s", cores_text, error.c_str());
        return std::nullopt;
    }
    return slurm_cores_to_cpus(*cores);
}

std::optional<uint32_t> job_id(spank_t sp) {
    uint32_t id = 0;
    if (spank_get_item(sp, S_JOB_ID, &id) == ESPANK_SUCCESS && id != 0) return id;
    char buf[32];
    if (spank_getenv(sp, "SLURM_JOB_ID", buf, sizeof buf) == ESPANK_SUCCESS) {
        char *end = nullptr;
        unsigned long v = strtoul(buf, &end, 10);
        if (end != buf && *end == '\0' && v != 0) return static_cast<uint32_t>(v);
    }
    return std::nullopt;
}

// Used in sbatch/salloc/srun, where the job's node is not chosen yet: a MIN or MAX above every node
// can never be served. The plugin does not link libslurm (it would be a second copy beside the one
// the host program uses): the functions are looked up in the host process, and skipped if absent.
unsigned largest_node_cpus() {
    using load_fn = int (*)(time_t, node_info_msg_t **, uint16_t);
    using free_fn = void (*)(node_info_msg_t *);
    auto load = reinterpret_cast<load_fn>(::dlsym(RTLD_DEFAULT, "slurm_load_node"));
    auto release = reinterpret_cast<free_fn>(::dlsym(RTLD_DEFAULT, "slurm_free_node_info_msg"));
    if (load == nullptr || release == nullptr) return 0;
    node_info_msg_t *nodes = nullptr;
    if (load(static_cast<time_t>(0), &nodes, SHOW_ALL) != 0 || nodes == nullptr) return 0;
    unsigned largest = 0;
    for (uint32_t i = 0; i < nodes->record_count; ++i)
        largest = std::max<unsigned>(largest, nodes->node_array[i].cpus);
    release(nodes);
    return largest;
}

}  // namespace mall::spank
