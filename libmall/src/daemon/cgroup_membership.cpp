// SPDX-License-Identifier: BSD-3-Clause
// cgroup_membership.cpp — membership by cgroup: which processes belong to a job because
// they live in its cgroups. access.cpp asks in_job_cgroups for authorization ("is this peer in the
// job's cgroup", e.g. a process that entered a container with `podman exec`); member_pids lists a
// container job's processes (the engine's cgroups below the job's folder or slice). Reads only.
#include "backend_cgroup.hpp"

#include "cgroup_tree.hpp"

namespace mall {

using cgroup_tree::is_path_prefix;
using cgroup_tree::pids_in_tree;

bool CgroupBackend::in_job_cgroups(const std::string &job, pid_t pid) const {
    auto it = jobs_.find(job);
    if (it == jobs_.end()) return false;
    auto rel = cgroup_of(pid);
    if (!rel) return false;
    const std::string path = mount_ + *rel;
    for (const JobCgroup &c : it->second.in_place)
        if (is_path_prefix(c.path, path)) return true;
    return it->second.any_own && is_path_prefix(own_dir(job), path);
}

std::vector<pid_t> CgroupBackend::member_pids(const std::string &job) const {
    auto it = jobs_.find(job);
    if (it == jobs_.end() || !is_container_mode(it->second.mode)) return {};
    return pids_in_tree(own_dir(job));
}

}  // namespace mall
