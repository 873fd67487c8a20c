// SPDX-License-Identifier: BSD-3-Clause
// backend_slice_mode.cpp — the container-systemd mode's type (cgroup_modes.hpp): a container job
// whose engine uses the systemd cgroup driver lives in the systemd slice mall-<job>.slice
// (systemd_slice.hpp). malld resizes it with systemd's AllowedCPUs (and, once the slice's cgroup
// exists, the same cpus written and checked there), never by writing systemd's files alone, and
// stops it at the job's end; the backend's slice helpers (a slice's folder, stopping slices left
// busy, mall.slice once empty, the slices there now) are here too.
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

namespace {

// container-systemd: the slice gets the job's cpus as AllowedCPUs (systemd keeps and re-applies
// them); once systemd has made the slice's cgroup, the same cpus are written there at once
// (systemd writes the same value from its own loop; up to 2 s for it to enable cpuset there),
// checked in cpuset.cpus.effective, and on growth every thread's own mask is widened. Before the
// engine started anything in the slice there is no cgroup yet: systemd applies the cpus when it
// makes it. At the job's end the slice is stopped and forgotten once empty; a container still
// running there (the job was deregistered) gets the whole pool and goes later (tidy).
class SystemdSliceJob final : public ContainerJob {
public:
    using ContainerJob::ContainerJob;
    CgroupMode mode() const override { return CgroupMode::ContainerSystemd; }
    std::string folder() const override { return cgroups_.slice_dir(job_); }
    std::string engine_cgroup_parent() const override { return systemd_slice::job_slice_name(job_).value_or(""); }

    std::string unavailable() const override {
        if (!cgroups_.has_systemd_slices())
            return "the container engine uses the systemd cgroup driver, but malld runs the cgroup-v1 backend "
                   "(systemd sets cpusets on cgroup v2 only); configure the engine with the cgroupfs driver "
                   "(podman --cgroup-manager=cgroupfs)";
        if (!systemd_slice::systemd_booted())
            return "the container engine uses the systemd cgroup driver, but systemd does not run here (no "
                   "/run/systemd/system); use the cgroupfs driver";
        return "";
    }

    bool apply_folder(const std::vector<pid_t> &, const CpuSet &cpus, bool growing, std::string *error) override {
        auto slice = systemd_slice::job_slice_name(job_);
        if (!slice) return CgroupBackend::fail(error, "job " + job_ + "'s name is too long for a systemd slice name");
        const std::string dir = folder();
        if (cpus.empty())
            return CgroupBackend::allow_no_cpus(*slice, !pids_in_tree(dir).empty(),
                                                "AllowedCPUs= empty means every cpu", error);
        if (!systemd_slice::set_allowed_cpus(*slice, cpus, error)) return false;
        if (!is_directory(dir)) return true;
        // systemd may enable cpuset for the slice from its loop a moment after set-property.
        // The cpus read after the last write that succeeded decide ('?' when none did).
        std::optional<CpuSet> effective;
        for (int attempt = 0; attempt < 100; ++attempt) {
            if (write_file_once(dir + "/cpuset.cpus", cpus.to_string()) == 0 &&
                (effective = cgroups_.effective_cpus(dir)) && *effective == cpus)
                break;
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        if (!effective || *effective != cpus)
            return CgroupBackend::fail(
                error, cgroups_.effective_mismatch(dir, cpus, effective, "does an ancestor slice have AllowedCPUs?"));
        if (growing) cgroups_.widen_thread_masks(dir, descendants(dir), cpus);
        return true;
    }

    void remove_folder() override {
        const std::string dir = folder();
        if (pids_in_tree(dir).empty()) {
            cgroups_.release_slice(job_);
            return;
        }
        auto slice = systemd_slice::job_slice_name(job_);
        cgroups_.keep_running_with_pool(slice.value_or(job_), dir, [&](std::string *why) {
            return !slice || systemd_slice::set_allowed_cpus(*slice, cgroups_.pool(), why);
        });
        cgroups_.release_slice_when_empty(job_);
    }
};

}  // namespace

std::unique_ptr<JobEnforcement> make_systemd_slice_job(CgroupBackend &cgroups, const std::string &job) {
    return std::make_unique<SystemdSliceJob>(cgroups, job);
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
