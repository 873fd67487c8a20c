// SPDX-License-Identifier: BSD-3-Clause
// backend_cgroup.cpp — the job's life in the common cgroup layer (backend_cgroup.hpp): start
// (malld's parent folder with the pool), registration (which pids are enforced in place, which in
// malld's own folder), apply, adoption after a restart, removal at the job's end, stop. Every
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
#include "affinity_backend.hpp"
#include "cgroup_tree.hpp"
#include "log.hpp"
#include "procfs.hpp"
#include "systemd_slice.hpp"

namespace mall {

using cgroup_tree::descendants;
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
    if (jobs_.count(job)) return;
    jobs_[job].mode = mode;
    // A container job's folder is made at its first apply(), empty, for the engine.
    if (is_container_mode(mode)) jobs_[job].any_own = true;
}

void CgroupBackend::set_self_registered(const std::string &job) {
    JobCgroups &state = jobs_[job];
    state.mode = CgroupMode::InPlace;
    state.delegated = true;
}

bool CgroupBackend::add_pids(const std::string &job, const std::vector<pid_t> &pids, std::string *error) {
    JobCgroups &state = jobs_[job];
    const size_t known = state.in_place.size();
    std::vector<pid_t> to_move = classify(job, state, pids);
    // A task that joins in a cgroup of its own (another Slurm step) gets the job's cpus there
    // now: the job's allocation may not change, so no apply() would come for it.
    std::string first_error;
    if (state.enforced && !state.enforced->empty())
        for (size_t i = known; i < state.in_place.size(); ++i) {
            std::string why;
            if (!resize_in_place(state.in_place[i].path, *state.enforced, &why, !state.delegated) &&
                first_error.empty())
                first_error = why;
        }
    const std::string dir = own_dir(job);
    if (!to_move.empty() && is_directory(dir) && !move_pids(dir, to_move, error)) return false;
    // Its threads keep the masks they had (Slurm's task/affinity pins a task to its step's
    // cores before the plugin registers it, and the kernel keeps requested masks across a
    // move): widen them to the job's cpus, which no apply() may come to do.
    if (state.enforced && !state.enforced->empty() && !is_container_mode(state.mode))
        set_tree_affinity(job, pids, *state.enforced, first_error.empty() ? &first_error : nullptr);
    if (!first_error.empty()) return fail(error, first_error);
    return true;  // pids for malld's folder are moved when the folder is made
}

void CgroupBackend::adopt(const std::string &job, const std::vector<pid_t> &pids, const std::vector<JobCgroup> &saved, const CpuSet &enforced) {
    JobCgroups &state = jobs_[job];
    if (!enforced.empty()) state.enforced = enforced;
    // A self-registered job stays in its delegated cgroup, as before the restart.
    if (job.rfind(kSelfJobPrefix, 0) == 0) set_self_registered(job);
    for (const JobCgroup &c : saved)
        if (c.in_place) state.in_place.push_back(c);
    // A container job whose saved folder is its systemd slice (the state file keeps no mode).
    for (const JobCgroup &c : saved)
        if (!c.in_place && state.mode == CgroupMode::Container && c.path == slice_dir(job))
            state.mode = CgroupMode::ContainerSystemd;
    // Where the live pids are now: a cgroup the state file did not name is recorded with its
    // cpus of now as its original (the file was written by a malld before enforcement in place).
    classify(job, state, pids);
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
    std::vector<JobCgroup> list;
    auto it = jobs_.find(job);
    if (it == jobs_.end()) return list;
    list = it->second.in_place;
    if (it->second.any_own) list.push_back(JobCgroup{own_dir(job), false, ""});
    return list;
}

std::string CgroupBackend::engine_cgroup_parent(const std::string &job) const {
    auto it = jobs_.find(job);
    if (it == jobs_.end() || !is_container_mode(it->second.mode)) return "";
    if (it->second.mode == CgroupMode::ContainerSystemd)
        return systemd_slice::job_slice_name(job).value_or("");
    return own_dir(job).substr(mount_.size());
}

void CgroupBackend::tidy() { retry_pending_removals(); }

bool CgroupBackend::apply(const std::string &job, const std::vector<pid_t> &pids, const CpuSet &cpus, bool growing, std::string *error) {
    JobCgroups &state = jobs_[job];
    std::vector<pid_t> own_pids = classify(job, state, pids);
    std::string first_error;
    auto note = [&](const std::string &why) {
        if (first_error.empty()) first_error = why;
    };
    for (const JobCgroup &c : state.in_place) {
        std::string why;
        if (!resize_in_place(c.path, cpus, &why, !state.delegated)) note(why);
    }
    const std::string dir = own_dir(job);
    if (state.mode == CgroupMode::ContainerSystemd) {
        std::string why;
        if (!apply_slice(job, dir, cpus, growing, &why)) note(why);
    } else if (state.any_own || is_directory(dir)) {
        std::string why;
        if (!apply_own(dir, own_pids, cpus, growing, &why)) note(why);
    }
    state.enforced = cpus;
    if (!first_error.empty()) return fail(error, first_error);
    return true;
}

std::optional<CpuSet> CgroupBackend::current(const std::string &job, const std::vector<pid_t> &) const {
    auto it = jobs_.find(job);
    if (it != jobs_.end() && !it->second.in_place.empty())
        return effective_cpus(it->second.in_place.front().path);
    std::string text;
    if (!read_text_file(own_dir(job) + "/cpuset.cpus", &text, nullptr)) return std::nullopt;
    return CpuSet::parse(trim(text));
}

void CgroupBackend::remove(const std::string &job) {
    retry_pending_removals();
    auto it = jobs_.find(job);
    bool container = false;
    // A job of the systemd driver, or a stale slice of one (remove_stale_job_cgroups).
    bool slice = it == jobs_.end() && has_systemd_slices() && is_directory(slice_dir(job));
    std::string dir = own_dir(job);
    if (it != jobs_.end()) {
        for (const JobCgroup &c : it->second.in_place) give_back(c, !it->second.delegated);
        container = is_container_mode(it->second.mode);
        slice = it->second.mode == CgroupMode::ContainerSystemd;
        jobs_.erase(it);
    }
    if (slice) {
        remove_slice(job);
        return;
    }
    if (container || (is_directory(dir) && !descendants(dir).empty())) {
        remove_container_folders(dir);
        return;
    }
    if (!is_directory(dir)) return;
    if (!remove_folder(dir)) pending_removals_.insert(dir);
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
    auto it = jobs_.find(job);
    if (it != jobs_.end() && !it->second.in_place.empty()) return it->second.in_place.front().path;
    return own_dir(job);
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

std::string CgroupBackend::own_dir(const std::string &job) const {
    auto it = jobs_.find(job);
    if (it != jobs_.end() && it->second.mode == CgroupMode::ContainerSystemd) return slice_dir(job);
    return parent_dir_ + "/" + kJobFolderPrefix + job;
}

// True for a cgroup that was not made for one job: the root, malld's own folders, the cgroup
// malld itself runs in and its ancestors, and (v2) systemd's user slices (login sessions).
bool CgroupBackend::needs_own_folder(const std::string &rel) const {
    return !own_reason(rel).empty();
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

// Sorts pids not seen before: a pid in a cgroup made for it records that cgroup (in place),
// any other needs malld's own folder. Returns the pids (of all seen) that belong in malld's
// folder, so the caller can move them.
std::vector<pid_t> CgroupBackend::classify(const std::string &job, JobCgroups &state, const std::vector<pid_t> &pids) {
    std::vector<pid_t> own;
    for (pid_t pid : pids) {
        auto rel = cgroup_of(pid);
        const bool first = state.seen.insert(pid).second;
        if (!rel) continue;
        // A container job: its processes live in the engine's cgroups below the job's folder,
        // which apply() resizes with them; the launcher (mallrun, the engine's client) stays
        // where it is, outside the job's cpus.
        if (is_container_mode(state.mode)) continue;
        // A self-registered job's cgroup was checked as delegated to its user (which a v2 login
        // session's folders may be): it is resized where it is, never left for malld's folder.
        if (state.delegated && !never_delegated_reason(*rel).empty()) continue;
        const bool in_own = !state.delegated && needs_own_folder(*rel);
        if (state.mode == CgroupMode::Own || in_own) {
            own.push_back(pid);
            state.any_own = true;
            continue;
        }
        if (!first) continue;
        const std::string dir = mount_ + *rel;
        bool known = false;
        for (const JobCgroup &c : state.in_place) known = known || c.path == dir;
        if (known) continue;
        std::string original;
        read_text_file(dir + "/cpuset.cpus", &original, nullptr);
        state.in_place.push_back(JobCgroup{dir, true, trim(original)});
        if (state.in_place.size() == 2)
            log_line(LogLevel::Info,
                     "job " + job + "'s processes live in several cgroups (" + state.in_place[0].path +
                         ", " + dir + "); malld resizes each of them in place");
    }
    return own;
}

// The cpus that apply to the processes of `dir` (v1 cpuset.cpus; v2 cpuset.cpus.effective).
std::optional<CpuSet> CgroupBackend::effective_cpus(const std::string &dir) const {
    std::string text;
    if (!read_text_file(dir + effective_cpus_file(), &text, nullptr))
        return std::nullopt;
    return CpuSet::parse(trim(text));
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
