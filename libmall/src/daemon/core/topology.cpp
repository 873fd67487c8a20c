// SPDX-License-Identifier: BSD-3-Clause
// topology.cpp — loads the node's hwloc topology (system, XML file or synthetic description) and
// precomputes, per PU, its ancestors from the root, so shared_depth() is a short prefix compare.
// Contract (topology.hpp): cpus are PU os indexes below CpuSet::kMaxCpus; tree order = hwloc
// logical PU order; the system topology includes PUs outside malld's own cpuset; cores() is
// node_cores_in_slurm_order() of the same hwloc topology.
#include "topology.hpp"

#include <hwloc.h>
#include <sys/stat.h>

#include <algorithm>

namespace mall {

namespace {

bool is_regular_file(const std::string &path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string plural(int n, const char *word) {
    return std::to_string(n) + " " + word + (n == 1 ? "" : "s");
}

// hwloc insists that a synthetic description ends with PUs; "pack:2 core:16" means one PU per
// core, so we accept it by adding the level ourselves.
bool ends_with_pu_level(const std::string &spec) {
    size_t start = spec.find_last_not_of(' ');
    if (start == std::string::npos) return false;
    size_t word = spec.find_last_of(' ', start);
    std::string last = spec.substr(word == std::string::npos ? 0 : word + 1);
    return last.rfind("pu", 0) == 0 || last.rfind("PU", 0) == 0;
}

}  // namespace

std::unique_ptr<Topology> Topology::load(const std::string &spec, std::string *error) {
    auto set_error = [&](const std::string &text) {
        if (error != nullptr) *error = text;
    };
    std::unique_ptr<Topology> topology(new Topology());
    if (hwloc_topology_init(&topology->topo_) != 0) {
        topology->topo_ = nullptr;
        set_error("cannot initialize hwloc (out of memory?)");
        return nullptr;
    }
    hwloc_topology_t topo = topology->topo_;

    const bool system = spec.empty() || spec == "system";
    if (system) {
        // malld may itself run inside a restricted cpuset: it must still see (and manage) every PU.
        hwloc_topology_set_flags(topo, HWLOC_TOPOLOGY_FLAG_INCLUDE_DISALLOWED);
    } else if (is_regular_file(spec)) {
        if (hwloc_topology_set_xml(topo, spec.c_str()) != 0) {
            set_error("cannot read hwloc XML topology \"" + spec +
                      "\": not a valid hwloc XML file (create one with `lstopo " + spec + "`)");
            return nullptr;
        }
    } else {
        std::string synthetic = spec;
        if (!ends_with_pu_level(synthetic)) synthetic += " pu:1";
        if (hwloc_topology_set_synthetic(topo, synthetic.c_str()) != 0) {
            set_error("bad topology \"" + spec +
                      "\": it is not \"system\", not an existing hwloc XML file, and not a valid "
                      "hwloc synthetic description such as \"pack:2 core:16 pu:2\"");
            return nullptr;
        }
    }
    if (hwloc_topology_load(topo) != 0) {
        set_error("hwloc could not load the topology \"" + (system ? std::string("system") : spec) +
                  "\"");
        return nullptr;
    }

    const int pu_count = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU);
    topology->index_of_.assign(CpuSet::kMaxCpus, -1);
    for (int i = 0; i < pu_count; ++i) {
        hwloc_obj_t pu = hwloc_get_obj_by_type(topo, HWLOC_OBJ_PU, static_cast<unsigned>(i));
        if (pu == nullptr || pu->os_index >= static_cast<unsigned>(CpuSet::kMaxCpus)) continue;
        const int cpu = static_cast<int>(pu->os_index);
        if (topology->index_of_[cpu] >= 0) continue;  // duplicate os index: keep the first
        std::vector<int> ancestors;
        for (hwloc_obj_t obj = pu; obj != nullptr; obj = obj->parent) {
            ancestors.push_back(static_cast<int>(obj->gp_index));
        }
        std::reverse(ancestors.begin(), ancestors.end());
        topology->index_of_[cpu] = static_cast<int>(topology->order_.size());
        topology->order_.push_back(cpu);
        topology->ancestors_.push_back(std::move(ancestors));
        topology->all_cpus_.add(cpu);
    }
    topology->cores_ = node_cores_in_slurm_order(topo);
    if (topology->order_.empty()) {
        set_error("the topology \"" + (system ? std::string("system") : spec) +
                  "\" has no usable PU (cpu numbers must be below " +
                  std::to_string(CpuSet::kMaxCpus) + ")");
        return nullptr;
    }
    return topology;
}

Topology::~Topology() {
    if (topo_ != nullptr) hwloc_topology_destroy(topo_);
}

int Topology::tree_index(int cpu) const {
    if (cpu < 0 || cpu >= static_cast<int>(index_of_.size())) return -1;
    return index_of_[cpu];
}

int Topology::shared_depth(int cpu_a, int cpu_b) const {
    const int a = tree_index(cpu_a);
    const int b = tree_index(cpu_b);
    if (a < 0 || b < 0) return -1;
    const auto &path_a = ancestors_[a];
    const auto &path_b = ancestors_[b];
    const size_t n = std::min(path_a.size(), path_b.size());
    size_t common = 0;
    while (common < n && path_a[common] == path_b[common]) ++common;
    return static_cast<int>(common) - 1;  // root is depth 0
}

std::string Topology::description() const {
    const int packages = hwloc_get_nbobjs_by_type(topo_, HWLOC_OBJ_PACKAGE);
    const int cores = hwloc_get_nbobjs_by_type(topo_, HWLOC_OBJ_CORE);
    const int pus = static_cast<int>(order_.size());
    return plural(packages, "package") + ", " + plural(cores, "core") + ", " + plural(pus, "PU");
}

}  // namespace mall
