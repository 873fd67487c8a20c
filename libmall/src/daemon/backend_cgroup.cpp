// SPDX-License-Identifier: BSD-3-Clause
// backend_cgroup.cpp — the job's life in the common cgroup layer (backend_cgroup.hpp): start
// (malld's parent folder with the pool), the jobs' map (each job's JobEnforcement, made for its mode
// at registration or adoption) and what malld asks of a job, which the job's mode answers (its cpu
// time's counters too); stop; the checks every mode shares (effective cpus, an empty cpu list, a
// folder left running). Every
// failure message names the path, the errno text and a fix; growing always re-widens every
// thread's own mask too (the kernel keeps requested masks).
#include "backend_cgroup.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "../common/files.hpp"
#include "../common/text.hpp"
#include "cgroup_tree.hpp"
#include "log.hpp"
#include "procfs.hpp"

namespace mall {

using cgroup_tree::errno_text;
using cgroup_tree::is_directory;
using cgroup_tree::is_path_prefix;
using cgroup_tree::pids_in_tree;

CgroupBackend::CgroupBackend(std::string mount, std::string parent, std::string self_rel)
    : mount_(std::move(mount)),
      parent_name_(std::move(parent)),
      parent_rel_("/" + parent_name_),
      parent_dir_(mount_ + parent_rel_),
      self_rel_(std::move(self_rel)) {}

bool CgroupBackend::start(const CpuSet &pool, std::string *error) {
    pool_ = pool;
    if (!prepare_hierarchy(error)) return false;
    bool created = false;
    if (::mkdir(parent_dir_.c_str(), 0755) == 0) {
        created = true;
    } else if (errno != EEXIST) {
        return fail(error, "cannot create the parent cgroup " + parent_dir_ + ": " +
                               errno_text(errno) +
                               "; run malld as root or choose --backend affinity");
    }
    // The parent must hold every cpu a child holds: a restarted malld finds its adopted jobs'
    // folders there, so widen to the pool plus whatever the children still have.
    int err = write_file_once(parent_dir_ + "/cpuset.cpus", pool.to_string());
    if (err != 0) {
        CpuSet wider = pool | children_cpus();
        err = write_file_once(parent_dir_ + "/cpuset.cpus", wider.to_string());
    }
    if (err != 0) {
        if (created) ::rmdir(parent_dir_.c_str());
        return fail(error, "cannot write '" + pool.to_string() + "' to " + parent_dir_ +
                               "/cpuset.cpus: " + errno_text(err) +
                               "; check that --cpus lists cpus the system has online");
    }
    if (!prepare_parent(error)) return false;
    retry_pending_removals();
    return true;
}

void CgroupBackend::set_mode(const std::string &job, CgroupMode mode) {
    if (!jobs_.count(job)) jobs_[job] = make_job_enforcement(*this, job, mode);
}

void CgroupBackend::set_self_registered(const std::string &job) {
    jobs_[job] = make_job_enforcement(*this, job, CgroupMode::InPlace, true);
}

JobEnforcement &CgroupBackend::enforcement(const std::string &job) {
    auto &slot = jobs_[job];
    if (!slot) slot = make_job_enforcement(*this, job, CgroupMode::Auto);
    return *slot;
}

const JobEnforcement *CgroupBackend::find(const std::string &job) const {
    auto it = jobs_.find(job);
    return it == jobs_.end() ? nullptr : it->second.get();
}

bool CgroupBackend::add_pids(const std::string &job, const std::vector<pid_t> &pids, std::string *error) {
    return enforcement(job).add_pids(pids, error);
}

void CgroupBackend::adopt(const std::string &job, const std::vector<pid_t> &pids, const std::vector<JobCgroup> &saved, const CpuSet &enforced) {
    // The state file keeps no mode: a self-registered job is known by its name and stays in its
    // delegated cgroup, as before the restart; a container job whose saved folder is its systemd
    // slice is of the systemd driver.
    if (job.rfind(kSelfJobPrefix, 0) == 0) {
        set_self_registered(job);
    } else if (const JobEnforcement *known = find(job); known && known->mode() == CgroupMode::Container) {
        for (const JobCgroup &c : saved)
            if (!c.in_place && c.path == slice_dir(job))
                jobs_[job] = make_job_enforcement(*this, job, CgroupMode::ContainerSystemd);
    }
    enforcement(job).adopt(pids, saved, enforced);
}

// A saved path must name a folder below the mount as classify() would have recorded it; a crafted
// one (outside the mount, "..", shorter than the mount) is refused before any write to it, and an
// in-place one must be a cgroup classify() could have resized in place: never one that
// never_delegated_reason() names (malld's own folders, the cgroup malld runs in and its
// ancestors, e.g. /system.slice), whatever the job.
std::string CgroupBackend::saved_cgroup_problem(const std::string &job, const JobCgroup &saved) const {
    (void)job;
    if (auto why = absolute_path_problem(saved.path); !why.empty()) return why;
    if (saved.path == mount_ || !is_path_prefix(mount_, saved.path))
        return "does not lie below the cgroup hierarchy malld uses (" + mount_ + ")";
    if (!saved.in_place) return "";
    if (std::string never = never_delegated_reason(saved.path.substr(mount_.size())); !never.empty())
        return "is " + never + ", never a cgroup resized in place";
    return "";
}

std::vector<JobCgroup> CgroupBackend::cgroups_of(const std::string &job) const {
    // No file system access: malld saves this after every batch of events.
    const JobEnforcement *known = find(job);
    return known ? known->cgroups() : std::vector<JobCgroup>();
}

// Membership by cgroup: access.cpp asks whether a peer lives in the job's cgroups (e.g. a process
// that entered a container with `podman exec`). Reads only.
bool CgroupBackend::in_job_cgroups(const std::string &job, pid_t pid) const {
    const JobEnforcement *known = find(job);
    if (!known) return false;
    auto rel = cgroup_of(pid);
    return rel && known->holds(mount_ + *rel);
}

std::vector<pid_t> CgroupBackend::member_pids(const std::string &job) const {
    const JobEnforcement *known = find(job);
    return known ? known->member_pids() : std::vector<pid_t>();
}

std::string CgroupBackend::engine_cgroup_parent(const std::string &job) const {
    const JobEnforcement *known = find(job);
    return known ? known->engine_cgroup_parent() : "";
}

void CgroupBackend::tidy() { retry_pending_removals(); }

bool CgroupBackend::apply(const std::string &job, const std::vector<pid_t> &pids, const CpuSet &cpus, bool growing, std::string *error) {
    return enforcement(job).apply(pids, cpus, growing, error);
}

std::optional<CpuSet> CgroupBackend::current(const std::string &job, const std::vector<pid_t> &) const {
    if (const JobEnforcement *known = find(job)) return known->current();
    return written_cpus(own_folder(job));
}

// v2: the job's cgroups (in place and malld's folder or slice), each counted once; v1: the /proc
// times of the job's processes and their descendants, and a container job's cgroup members.
std::vector<CpuTimeReading> CgroupBackend::cpu_time_readings(const std::string &job,
                                                             const std::vector<pid_t> &pids) const {
    const JobEnforcement *known = find(job);
    if (cgroups_count_cpu_time()) return known ? cgroup_cpu_readings(known->cgroup_paths()) : std::vector<CpuTimeReading>();
    std::vector<pid_t> processes = pids;
    if (known)
        for (pid_t pid : known->member_pids()) processes.push_back(pid);
    return process_tree_cpu_readings(processes);
}

// A job malld knows gives back its in-place cgroups and removes its folder as its mode says; one
// it does not know (remove_stale_job_cgroups) loses whatever folder or slice is left of it.
void CgroupBackend::remove(const std::string &job) {
    retry_pending_removals();
    std::unique_ptr<JobEnforcement> ending;
    if (auto it = jobs_.find(job); it != jobs_.end()) {
        ending = std::move(it->second);
        jobs_.erase(it);
    } else {
        ending = make_leftover_enforcement(*this, job);
    }
    ending->remove();
}

void CgroupBackend::stop() {
    retry_pending_removals();
    stop_parent_slice_if_empty();
    if (!is_directory(parent_dir_)) return;
    if (!job_folders().empty()) return;  // running jobs keep their folders for re-adoption
    remove_folder(parent_dir_);
    // Container engines (runc) make the --cgroup-parent path in every hierarchy: malld's
    // parent folder there goes too, when empty.
    for (const std::string &mount : other_cgroup_mounts()) ::rmdir((mount + parent_rel_).c_str());
}

std::string CgroupBackend::cgroup_path(const std::string &job) const {
    const JobEnforcement *known = find(job);
    return known ? known->main_path() : own_folder(job);
}

std::vector<std::string> CgroupBackend::jobs_with_cgroups() const {
    std::vector<std::string> jobs;
    for (const auto &folder : job_folders()) jobs.push_back(folder.substr(std::strlen(kJobFolderPrefix)));
    for (const auto &job : slice_jobs())
        if (std::find(jobs.begin(), jobs.end(), job) == jobs.end()) jobs.push_back(job);
    return jobs;
}

std::string CgroupBackend::describe() const {
    return std::string(version_name()) + " cpuset at " + mount_ +
           " (jobs in place in their own cgroups; malld's folders under " + parent_dir_ + ")";
}

std::string CgroupBackend::own_reason(const std::string &rel) const {
    std::string reason = never_delegated_reason(rel);
    return reason.empty() ? session_reason(rel) : reason;
}

// The cgroups no job may be resized in: the root, malld's own folders, the cgroup malld runs in
// and its ancestors ("" for any other).
std::string CgroupBackend::never_delegated_reason(const std::string &rel) const {
    if (rel == "/") return "the hierarchy's root";
    if (is_path_prefix(parent_rel_, rel)) return "a folder of malld's own (" + parent_rel_ + ")";
    if (is_path_prefix(rel, self_rel_)) return "the cgroup malld runs in or one of its ancestors";
    return "";
}

// The cpus that apply to the processes of `dir` (v1 cpuset.cpus; v2 cpuset.cpus.effective).
std::optional<CpuSet> CgroupBackend::effective_cpus(const std::string &dir) const {
    std::string text;
    if (!read_text_file(dir + effective_cpus_file(), &text, nullptr))
        return std::nullopt;
    return CpuSet::parse(trim(text));
}

bool CgroupBackend::check_effective(const std::string &dir, const CpuSet &target, const std::string &hint,
                                    std::string *error) const {
    auto effective = effective_cpus(dir);
    if (effective && *effective == target) return true;
    return fail(error, effective_mismatch(dir, target, effective, hint));
}

std::string CgroupBackend::effective_mismatch(const std::string &dir, const CpuSet &target,
                                              const std::optional<CpuSet> &effective, const std::string &hint) const {
    return dir + "/cpuset.cpus is '" + target.to_string() + "' but the kernel applies '" +
           (effective ? effective->to_string() : std::string("?")) + "' (" + (effective_cpus_file() + 1) + "): " + hint;
}

bool CgroupBackend::allow_no_cpus(const std::string &what, bool holds_processes, const std::string &why,
                                  std::string *error) {
    if (!holds_processes) return true;
    return fail(error, "cannot narrow " + what + " to no cpus while it holds processes (" + why +
                           "); the job keeps its cpus until some are free");
}

void CgroupBackend::keep_running_with_pool(const std::string &what, const std::string &path,
                                           const std::function<bool(std::string *)> &widen) const {
    std::string why;
    if (!pool_.empty() && !widen(&why)) log_line(LogLevel::Warn, "cannot widen " + what + " to the pool: " + why);
    log_line(LogLevel::Info, path + " still holds processes (a container the job no longer manages): it "
                                    "keeps the whole pool and goes once empty");
}

// What is written in a folder's cpuset.cpus (v2: may be empty = the parent's).
std::optional<CpuSet> CgroupBackend::written_cpus(const std::string &dir) const {
    std::string text;
    if (!read_text_file(dir + "/cpuset.cpus", &text, nullptr)) return std::nullopt;
    return CpuSet::parse(trim(text));
}

void CgroupBackend::retry_pending_removals() {
    // Slices that held a container the job no longer manages: stopped once empty.
    for (auto it = pending_slices_.begin(); it != pending_slices_.end();) {
        if (pids_in_tree(slice_dir(*it)).empty()) {
            release_slice(*it);
            it = pending_slices_.erase(it);
        } else {
            ++it;
        }
    }
    // Container folders: plain rmdir, deepest first, never moving a process.
    std::vector<std::string> rmdirs(pending_rmdirs_.begin(), pending_rmdirs_.end());
    std::sort(rmdirs.begin(), rmdirs.end(),
              [](const std::string &a, const std::string &b) { return a.size() > b.size(); });
    for (const std::string &f : rmdirs)
        if (::rmdir(f.c_str()) == 0 || errno == ENOENT) pending_rmdirs_.erase(f);
    for (auto it = pending_removals_.begin(); it != pending_removals_.end();) {
        if (!is_directory(*it) || remove_folder(*it))
            it = pending_removals_.erase(it);
        else
            ++it;
    }
}

}  // namespace mall
