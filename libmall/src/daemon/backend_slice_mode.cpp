// SPDX-License-Identifier: BSD-3-Clause
// backend_slice_mode.cpp — the container-systemd mode: a container job whose engine uses
// the systemd cgroup driver lives in the systemd slice mall-<job>.slice (systemd_slice.hpp). malld
// resizes it with systemd's AllowedCPUs (and, once the slice's cgroup exists, the same cpus written
// and checked there), never by writing systemd's files alone, and stops it at the job's end.
#include "backend_cgroup.hpp"

#include <dirent.h>

#include <chrono>
#include <thread>

#include "../common/files.hpp"
#include "cgroup_tree.hpp"
#include "log.hpp"
#include "systemd_slice.hpp"

namespace mall {

using cgroup_tree::descendants;
using cgroup_tree::is_directory;
using cgroup_tree::pids_in_tree;

// Where systemd puts the job's slice (systemd driver), "" when the name cannot be a unit's.
std::string CgroupBackend::slice_dir(const std::string &job) const {
    auto name = systemd_slice::job_slice_name(job);
    return name ? mount_ + systemd_slice::cgroup_path_of(*name) : std::string();
}

// The systemd driver: the slice gets the job's cpus as AllowedCPUs (systemd keeps and re-applies
// them); once systemd has made the slice's cgroup, the same cpus are written there at once
// (systemd writes the same value from its own loop; up to 2 s for it to enable cpuset there),
// checked in cpuset.cpus.effective, and on growth every thread's own mask is widened. Before the engine started anything in the slice
// there is no cgroup yet: systemd applies the cpus when it makes it.
bool CgroupBackend::apply_slice(const std::string &job, const std::string &dir, const CpuSet &cpus, bool growing, std::string *error) {
    auto slice = systemd_slice::job_slice_name(job);
    if (!slice) return fail(error, "job " + job + "'s name is too long for a systemd slice name");
    if (cpus.empty()) {
        if (pids_in_tree(dir).empty()) return true;
        return fail(error, "cannot narrow " + *slice + " to no cpus while it holds processes (AllowedCPUs= "
                           "empty means every cpu); the job keeps its cpus until some are free");
    }
    if (!systemd_slice::set_allowed_cpus(*slice, cpus, error)) return false;
    if (!is_directory(dir)) return true;
    // systemd may enable cpuset for the slice from its loop a moment after set-property.
    std::optional<CpuSet> effective;
    for (int attempt = 0; attempt < 100; ++attempt) {
        if (write_file_once(dir + "/cpuset.cpus", cpus.to_string()) == 0 && (effective = effective_cpus(dir)) &&
            *effective == cpus)
            break;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (!effective || *effective != cpus)
        return fail(error, dir + "/cpuset.cpus is '" + cpus.to_string() + "' but the kernel applies '" +
                               (effective ? effective->to_string() : std::string("?")) +
                               "' (cpuset.cpus.effective): does an ancestor slice have AllowedCPUs?");
    if (growing) widen_thread_masks(dir, descendants(dir), cpus);
    return true;
}

// The job ended: its slice is stopped and forgotten once empty. A container still running
// there (the job was deregistered) gets the whole pool and goes later (tidy).
void CgroupBackend::remove_slice(const std::string &job) {
    if (!pids_in_tree(slice_dir(job)).empty()) {
        std::string why;
        if (auto slice = systemd_slice::job_slice_name(job);
            slice && !pool_.empty() && !systemd_slice::set_allowed_cpus(*slice, pool_, &why))
            log_line(LogLevel::Warn, "cannot widen " + *slice + " to the pool: " + why);
        log_line(LogLevel::Info, slice_dir(job) + " still holds processes (a container the job no "
                                                  "longer manages): it keeps the whole pool and goes once empty");
        pending_slices_.insert(job);
        return;
    }
    release_slice(job);
}

void CgroupBackend::release_slice(const std::string &job) {
    auto slice = systemd_slice::job_slice_name(job);
    if (!slice) return;
    std::string why;
    if (!systemd_slice::stop_and_forget(*slice, &why))
        log_line(LogLevel::Warn, "cannot stop the systemd slice " + *slice + " of ended job " + job + ": " + why);
    stop_parent_slice_if_empty();
}

// mall.slice, once it holds no job's slice (systemd starts it again with the next one).
void CgroupBackend::stop_parent_slice_if_empty() {
    const std::string parent = mount_ + systemd_slice::parent_cgroup_path();
    if (!has_systemd_slices() || !is_directory(parent) || !descendants(parent).empty()) return;
    std::string why;
    if (!systemd_slice::run_systemctl({"stop", "--", systemd_slice::kParentSlice}, &why))
        log_line(LogLevel::Warn, "cannot stop " + std::string(systemd_slice::kParentSlice) + ": " + why);
}

// Jobs whose slice exists in mall.slice now (systemd driver).
std::vector<std::string> CgroupBackend::slice_jobs() const {
    std::vector<std::string> jobs;
    if (!has_systemd_slices()) return jobs;
    const std::string parent = mount_ + systemd_slice::parent_cgroup_path();
    DIR *d = ::opendir(parent.c_str());
    if (!d) return jobs;
    while (dirent *e = ::readdir(d))
        if (e->d_type == DT_DIR)
            if (auto job = systemd_slice::job_of_slice(e->d_name)) jobs.push_back(*job);
    ::closedir(d);
    return jobs;
}

}  // namespace mall
