// SPDX-License-Identifier: BSD-3-Clause
// cgroup_modes.cpp — what every cgroup mode shares (JobEnforcement: classifying a job's processes,
// resizing the in-place cgroups they were found in, the folder's life) and the modes but
// container-systemd (backend_slice_mode.cpp): HostJob (auto, in-place), OwnFolderJob (own),
// DelegatedJob (self-registered) and ContainerFolderJob (container). See cgroup_modes.hpp.
#include "cgroup_modes.hpp"

#include "../common/files.hpp"
#include "../common/text.hpp"
#include "affinity_backend.hpp"
#include "backend_cgroup.hpp"
#include "cgroup_tree.hpp"
#include "log.hpp"

namespace mall {

using cgroup_tree::is_directory;
using cgroup_tree::is_path_prefix;
using cgroup_tree::pids_in_tree;

std::string JobEnforcement::registration_problem(pid_t pid, const std::string &rel) const {
    if (place(rel) != Placement::InPlace) return "";
    if (auto why = cgroups_.cannot_write_in_place(cgroups_.mount() + rel))
        return "pid " + std::to_string(pid) + " lives in cgroup " + rel +
               ", which malld cannot resize in place: " + *why;
    return "";
}

std::string JobEnforcement::folder() const { return cgroups_.own_folder(job_); }

bool JobEnforcement::apply_folder(const std::vector<pid_t> &to_move, const CpuSet &cpus, bool growing,
                                  std::string *error) {
    return cgroups_.apply_job_folder(folder(), to_move, cpus, growing, error);
}

void JobEnforcement::remove_folder() { cgroups_.remove_job_folder(folder()); }

std::vector<pid_t> JobEnforcement::classify(const std::vector<pid_t> &pids) {
    std::vector<pid_t> to_folder;
    for (pid_t pid : pids) {
        auto rel = cgroups_.cgroup_of(pid);
        const bool first = seen_.insert(pid).second;
        if (!rel) continue;
        const Placement where = place(*rel);
        if (where == Placement::LeftAlone) continue;
        if (where == Placement::OwnFolder) {
            to_folder.push_back(pid);
            has_folder_ = true;
            continue;
        }
        if (!first) continue;
        const std::string dir = cgroups_.mount() + *rel;
        bool known = false;
        for (const JobCgroup &c : in_place_) known = known || c.path == dir;
        if (known) continue;
        std::string original;
        read_text_file(dir + "/cpuset.cpus", &original, nullptr);
        in_place_.push_back(JobCgroup{dir, true, trim(original)});
        if (in_place_.size() == 2)
            log_line(LogLevel::Info, "job " + job_ + "'s processes live in several cgroups (" + in_place_[0].path +
                                         ", " + dir + "); malld resizes each of them in place");
    }
    return to_folder;
}

bool JobEnforcement::add_pids(const std::vector<pid_t> &pids, std::string *error) {
    const size_t known = in_place_.size();
    std::vector<pid_t> to_move = classify(pids);
    // A task that joins in a cgroup of its own (another Slurm step) gets the job's cpus there
    // now: the job's allocation may not change, so no apply() would come for it.
    std::string first_error;
    if (enforced_ && !enforced_->empty())
        for (size_t i = known; i < in_place_.size(); ++i) {
            std::string why;
            if (!cgroups_.resize_in_place(in_place_[i].path, *enforced_, &why, widens_parents()) &&
                first_error.empty())
                first_error = why;
        }
    const std::string dir = folder();
    if (!to_move.empty() && is_directory(dir) && !cgroups_.move_pids(dir, to_move, error)) return false;
    // Its threads keep the masks they had (Slurm's task/affinity pins a task to its step's
    // cores before the plugin registers it, and the kernel keeps requested masks across a
    // move): widen them to the job's cpus, which no apply() may come to do.
    if (enforced_ && !enforced_->empty() && masks_registered_pids())
        set_tree_affinity(job_, pids, *enforced_, first_error.empty() ? &first_error : nullptr);
    if (!first_error.empty()) return CgroupBackend::fail(error, first_error);
    return true;  // pids for malld's folder are moved when the folder is made
}

void JobEnforcement::adopt(const std::vector<pid_t> &pids, const std::vector<JobCgroup> &saved,
                           const CpuSet &enforced) {
    if (!enforced.empty()) enforced_ = enforced;
    for (const JobCgroup &c : saved)
        if (c.in_place) in_place_.push_back(c);
    // Where the live pids are now: a cgroup the state file did not name is recorded with its
    // cpus of now as its original (the file was written by a malld before enforcement in place).
    classify(pids);
}

bool JobEnforcement::apply(const std::vector<pid_t> &pids, const CpuSet &cpus, bool growing, std::string *error) {
    std::vector<pid_t> to_folder = classify(pids);
    std::string first_error;
    auto note = [&](const std::string &why) {
        if (first_error.empty()) first_error = why;
    };
    for (const JobCgroup &c : in_place_) {
        std::string why;
        if (!cgroups_.resize_in_place(c.path, cpus, &why, widens_parents())) note(why);
    }
    if (has_folder_ || is_directory(folder())) {
        std::string why;
        if (!apply_folder(to_folder, cpus, growing, &why)) note(why);
    }
    enforced_ = cpus;
    if (!first_error.empty()) return CgroupBackend::fail(error, first_error);
    return true;
}

void JobEnforcement::remove() {
    for (const JobCgroup &c : in_place_) cgroups_.give_back(c, widens_parents());
    remove_folder();
}

std::vector<JobCgroup> JobEnforcement::cgroups() const {
    std::vector<JobCgroup> list = in_place_;
    if (has_folder_) list.push_back(JobCgroup{folder(), false, ""});
    return list;
}

std::vector<std::string> JobEnforcement::cgroup_paths() const {
    std::vector<std::string> paths;
    for (const JobCgroup &c : in_place_) paths.push_back(c.path);
    if (has_folder_ || is_directory(folder())) paths.push_back(folder());
    return paths;
}

bool JobEnforcement::holds(const std::string &path) const {
    for (const JobCgroup &c : in_place_)
        if (is_path_prefix(c.path, path)) return true;
    return has_folder_ && is_path_prefix(folder(), path);
}

std::string JobEnforcement::main_path() const { return in_place_.empty() ? folder() : in_place_.front().path; }

std::optional<CpuSet> JobEnforcement::current() const {
    if (!in_place_.empty()) return cgroups_.effective_cpus(in_place_.front().path);
    return cgroups_.written_cpus(folder());
}

std::vector<pid_t> ContainerJob::member_pids() const { return pids_in_tree(folder()); }

namespace {

// auto and in-place: in place where a cgroup was made for the process, else malld's folder. Mode
// in-place refuses at registration a process that would need the folder (one that shows up later,
// a child forked into the root cgroup, still goes there).
class HostJob final : public JobEnforcement {
public:
    HostJob(CgroupBackend &cgroups, std::string job, bool strict)
        : JobEnforcement(cgroups, std::move(job)), strict_(strict) {}
    CgroupMode mode() const override { return strict_ ? CgroupMode::InPlace : CgroupMode::Auto; }
    Placement place(const std::string &rel) const override {
        return cgroups_.own_reason(rel).empty() ? Placement::InPlace : Placement::OwnFolder;
    }
    std::string registration_problem(pid_t pid, const std::string &rel) const override {
        if (!strict_ || place(rel) != Placement::OwnFolder) return JobEnforcement::registration_problem(pid, rel);
        return "pid " + std::to_string(pid) + " lives in cgroup " + rel + ", " + cgroups_.own_reason(rel) +
               ": there is no cgroup of its own to resize in place; register it with cgroup mode auto or own";
    }

private:
    bool strict_;
};

// own: every process moves into malld's folder.
class OwnFolderJob final : public JobEnforcement {
public:
    using JobEnforcement::JobEnforcement;
    CgroupMode mode() const override { return CgroupMode::Own; }
    Placement place(const std::string &) const override { return Placement::OwnFolder; }
};

// Self-registered: its cgroup was checked as delegated to its user (which a v2 login session's
// folders may be): resized where it is, its parents never written; a process found in a cgroup no
// job is ever resized in is left alone, never moved.
class DelegatedJob final : public JobEnforcement {
public:
    using JobEnforcement::JobEnforcement;
    CgroupMode mode() const override { return CgroupMode::InPlace; }
    Placement place(const std::string &rel) const override {
        return cgroups_.never_delegated_reason(rel).empty() ? Placement::InPlace : Placement::LeftAlone;
    }
    bool widens_parents() const override { return false; }
};

// container (the cgroupfs driver): the engine creates the container's cgroups below malld's folder
// (--cgroup-parent); processes are never moved out of them, so at the job's end a folder that still
// holds some keeps the whole pool until it is empty.
class ContainerFolderJob final : public ContainerJob {
public:
    using ContainerJob::ContainerJob;
    CgroupMode mode() const override { return CgroupMode::Container; }
    void remove_folder() override { cgroups_.remove_container_folders(folder()); }
    std::string engine_cgroup_parent() const override { return folder().substr(cgroups_.mount().size()); }
};

}  // namespace

std::unique_ptr<JobEnforcement> make_job_enforcement(CgroupBackend &cgroups, const std::string &job, CgroupMode mode,
                                                     bool self_registered) {
    if (self_registered) return std::make_unique<DelegatedJob>(cgroups, job);
    switch (mode) {
        case CgroupMode::Auto: return std::make_unique<HostJob>(cgroups, job, false);
        case CgroupMode::InPlace: return std::make_unique<HostJob>(cgroups, job, true);
        case CgroupMode::Own: return std::make_unique<OwnFolderJob>(cgroups, job);
        case CgroupMode::Container: return std::make_unique<ContainerFolderJob>(cgroups, job);
        case CgroupMode::ContainerSystemd: return make_systemd_slice_job(cgroups, job);
    }
    return std::make_unique<HostJob>(cgroups, job, false);
}

std::unique_ptr<JobEnforcement> make_leftover_enforcement(CgroupBackend &cgroups, const std::string &job) {
    if (cgroups.has_systemd_slices() && is_directory(cgroups.slice_dir(job))) return make_systemd_slice_job(cgroups, job);
    return std::make_unique<OwnFolderJob>(cgroups, job);  // remove_job_folder: plain or an engine's
}

}  // namespace mall
