// SPDX-License-Identifier: BSD-3-Clause
// backend_in_place.cpp — enforcement in place: a job's processes stay in the cgroup a
// resource manager or runtime made for them (Slurm's step, a container's, a systemd scope) and malld
// resizes that cgroup without moving any process: ancestors widened first, descendants narrowed
// first, and at the job's end the cgroup gets back the cpus it had at registration. check_pids
// says beforehand, without writing, whether a registration's processes can be enforced under its
// mode (the mode's type decides), check_self_registration whether a self-registering process
// lives in a cgroup delegated to it, and cgroup_resized_in_place tells authorization which cgroup
// a Register would resize.
#include "backend_cgroup.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "../common/files.hpp"
#include "cgroup_tree.hpp"
#include "log.hpp"
#include "procfs.hpp"

namespace mall {

using cgroup_tree::descendants;
using cgroup_tree::errno_text;
using cgroup_tree::is_directory;
using cgroup_tree::is_path_prefix;
using cgroup_tree::pids_in_tree;
using cgroup_tree::read_pid_list;

bool CgroupBackend::check_pids(const std::vector<pid_t> &pids, CgroupMode mode, std::string *error) const {
    // The mode's type, made for no job and asked only its const questions: nothing is recorded
    // or written (hence the const_cast).
    auto would_be = make_job_enforcement(const_cast<CgroupBackend &>(*this), "", mode);
    if (std::string why = would_be->unavailable(); !why.empty()) return fail(error, why);
    for (pid_t pid : pids) {
        auto rel = cgroup_of(pid);
        if (!rel) continue;  // gone (registration refuses dead pids itself) or no cpuset line
        if (std::string why = would_be->registration_problem(pid, *rel); !why.empty()) return fail(error, why);
    }
    return true;
}

// A self-registration: the process's cgroup must be one its user was delegated (as systemd's
// Delegate= or an admin's chown hands a cgroup to a user: the folder and its cgroup.procs owned by
// the uid), hold only that uid's processes, overlap no job's cgroup (a daemon started inside a
// Slurm step lives in the step's cgroup although it left the step's process tree), and lie where
// its parent allows malld's whole pool: malld then resizes it in place and never moves a process
// out of a cgroup that limits it, nor widens one.
bool CgroupBackend::check_self_registration(pid_t pid, uid_t uid, std::string *error) const {
    const std::string p = std::to_string(pid), u = std::to_string(uid);
    auto rel = cgroup_of(pid);
    if (!rel) return fail(error, "cannot self-register: cannot read /proc/" + p + "/cgroup");
    const std::string dir = mount_ + *rel;
    auto refuse = [&](const std::string &why) {
        return fail(error, "cannot self-register: " + why +
                               "; ask an admin to register the job or run it under mallrun/Slurm");
    };
    const std::string not_delegated = "process " + p + "'s cgroup " + *rel + " is not delegated to uid " + u;
    if (std::string shared = never_delegated_reason(*rel); !shared.empty())
        return refuse(not_delegated + " (it is " + shared + ")");
    for (const auto &[name, job] : jobs_) {
        for (const std::string &path : job->cgroup_paths()) {
            if (is_path_prefix(path, dir))
                return refuse("process " + p + " is in cgroup " + *rel + " of job " + name +
                              " (it belongs to that job although it left its process tree); attach "
                              "to it with MALL_JOB_ID=" + name);
            if (is_path_prefix(dir, path))
                return refuse("process " + p + "'s cgroup " + *rel + " holds job " + name + "'s cgroup " +
                              path.substr(mount_.size()));
        }
    }
    struct stat folder {}, procs {};
    if (::stat(dir.c_str(), &folder) != 0 || ::stat((dir + "/cgroup.procs").c_str(), &procs) != 0)
        return refuse("cannot read " + dir + ": " + errno_text(errno));
    if (folder.st_uid != uid || procs.st_uid != uid)
        return refuse(not_delegated + " (" + dir + " and its cgroup.procs belong to uid " +
                      std::to_string(folder.st_uid) + " and " + std::to_string(procs.st_uid) + ")");
    for (pid_t other : pids_in_tree(dir)) {
        auto other_uid = process_real_uid(other);
        if (other_uid && *other_uid != uid)
            return refuse("process " + p + "'s cgroup " + *rel + " (delegated to uid " + u + ") also holds "
                          "process " + std::to_string(other) + " of uid " + std::to_string(*other_uid) +
                          ", which resizing it would confine too");
    }
    if (auto why = cannot_write_in_place(dir)) return refuse("malld cannot resize cgroup " + *rel + ": " + *why);
    const std::string parent = dir.substr(0, dir.rfind('/'));
    if (parent.size() > mount_.size()) {
        auto allowed = effective_cpus(parent);
        if (!allowed || !(pool_ - *allowed).empty())
            return refuse("cgroup " + *rel + "'s parent " + parent.substr(mount_.size()) + " allows cpus " +
                          (allowed ? allowed->to_string() : std::string("?")) + ", not all of malld's pool " +
                          pool_.to_string() + ", and malld never widens a cgroup that limits a user");
    }
    return true;
}

// The job's mode's decision for one process (its type's place()), read ahead without recording or
// writing anything.
std::optional<std::string> CgroupBackend::cgroup_resized_in_place(const std::string &job, pid_t pid,
                                                                  CgroupMode mode) const {
    auto rel = cgroup_of(pid);
    if (!rel) return std::nullopt;
    const JobEnforcement *known = find(job);
    std::unique_ptr<JobEnforcement> would_be;
    if (!known) {  // the mode's type, asked without recording anything (as in check_pids)
        would_be = make_job_enforcement(const_cast<CgroupBackend &>(*this), job, mode);
        known = would_be.get();
    }
    if (known->place(*rel) != Placement::InPlace) return std::nullopt;
    return mount_ + *rel;
}

// Why malld may not resize `dir` in place, or nullopt when it may.
std::optional<std::string> CgroupBackend::cannot_write_in_place(const std::string &dir) const {
    const std::string file = dir + "/cpuset.cpus";
    if (!is_directory(dir)) return dir + " does not exist";
    if (::access(file.c_str(), F_OK) != 0)
        return "it has no cpuset.cpus (the cpuset controller is not enabled for it: its parent's "
               "cgroup.subtree_control lacks cpuset; the resource manager must enable it, e.g. "
               "Slurm's cgroup/v2 plugin with ConstrainCores=yes, or systemd's Delegate=cpuset)";
    if (::access(file.c_str(), W_OK) != 0)
        return "cannot write " + file + ": " + errno_text(errno) +
               " (malld needs root, or the cgroup delegated to malld's user)";
    return std::nullopt;
}

bool CgroupBackend::write_cpus(const std::string &dir, const CpuSet &cpus, std::string *error) const {
    int err = write_file_once(dir + "/cpuset.cpus", cpus.to_string());
    if (err == 0) return true;
    return fail(error, "cannot write '" + cpus.to_string() + "' to " + dir + "/cpuset.cpus: " +
                           errno_text(err) +
                           (err == EACCES || err == EPERM
                                ? " (malld needs root, or the cgroup delegated to its user)"
                                : err == EINVAL ? " (cpus outside the parent's, or offline)"
                                                : ""));
}

// The folders between the mount (excluded) and dir (excluded), outermost first.
std::vector<std::string> CgroupBackend::ancestors(const std::string &dir) const {
    std::vector<std::string> out;
    // A path not below the mount (a crafted state file's; adoption refuses those) has none here.
    if (dir.size() <= mount_.size() || !cgroup_tree::is_path_prefix(mount_, dir)) return out;
    std::string rel = dir.substr(mount_.size());
    for (size_t slash = rel.find('/', 1); slash != std::string::npos; slash = rel.find('/', slash + 1))
        out.push_back(mount_ + rel.substr(0, slash));
    return out;
}

// Resizes a cgroup someone else made, and its descendants, to `target`, without moving any
// process. Growth: every ancestor that lacks a target cpu is widened first (outermost first),
// then the cgroup, then its descendants (v1 growth does not flow down; v2 descendants with
// cpus of their own keep them). Narrowing: descendants first (deepest first), then the cgroup;
// ancestors keep their cpus. A move (some cpus out, some in) is a growth to the union followed
// by a narrowing, so no write ever asks for a child wider than its parent.
bool CgroupBackend::resize_in_place(const std::string &dir, const CpuSet &target, std::string *error,
                                    bool widen_parents) {
    if (!is_directory(dir)) return true;  // the resource manager removed it: the job is ending
    if (target.empty())
        return allow_no_cpus(dir, !read_pid_list(dir + "/cgroup.procs").empty(), "the kernel refuses an empty cpuset",
                             error);
    auto now = written_cpus(dir);
    if (!now) return fail(error, "cannot read " + dir + "/cpuset.cpus: " + errno_text(errno));
    if (now->empty()) now = effective_cpus(dir);  // v2: inherited
    const std::vector<std::string> below = descendants(dir);
    CpuSet wide = (now ? *now : CpuSet()) | target;
    bool grew = false;
    if (!(target - (now ? *now : CpuSet())).empty()) {
        grew = true;
        for (const std::string &a : widen_parents ? ancestors(dir) : std::vector<std::string>()) {
            auto held = written_cpus(a);
            if (!held) return fail(error, "cannot read " + a + "/cpuset.cpus (an ancestor of " + dir + ")");
            if (held->empty() && empty_cpus_inherit()) continue;  // inherits: nothing to widen here
            if ((wide - *held).empty()) continue;
            if (!write_cpus(a, *held | wide, error)) return false;
        }
        if (!write_cpus(dir, wide, error)) return false;
        for (const std::string &d : below) {
            auto held = written_cpus(d);
            if (!held || (empty_cpus_inherit() && held->empty())) continue;
            if (!write_cpus(d, wide, error)) return false;
        }
    }
    if (wide != target) {
        for (auto it = below.rbegin(); it != below.rend(); ++it) {
            auto held = written_cpus(*it);
            if (!held || (empty_cpus_inherit() && held->empty())) continue;
            if (*held != target && !write_cpus(*it, target, error)) return false;
        }
        if (!write_cpus(dir, target, error)) return false;
    }
    if (applies_other_cpus() && !check_effective(dir, target, "an ancestor's cpus do not hold them", error))
        return false;
    if (grew) widen_thread_masks(dir, below, target);
    return true;
}

// The kernel keeps each thread's own mask (effective = cpuset ∩ mask): after a growth every
// thread of the cgroup and its descendants is widened to the job's cpus.
void CgroupBackend::widen_thread_masks(const std::string &dir, const std::vector<std::string> &below, const CpuSet &cpus) const {
    std::vector<std::string> all{dir};
    all.insert(all.end(), below.begin(), below.end());
    for (const auto &d : all)
        for (pid_t pid : read_pid_list(d + "/cgroup.procs"))
            for (pid_t tid : threads_of(pid)) set_thread_affinity(tid, cpus);
}

// At the job's end an in-place cgroup gets back the cpus it had at registration (its resource
// manager may be removing it at the same moment: a folder that is gone is fine).
void CgroupBackend::give_back(const JobCgroup &c, bool widen_parents) {
    if (!is_directory(c.path)) return;
    if (c.original.empty()) {
        restore_inherited(c.path);
        return;
    }
    auto original = CpuSet::parse(c.original);
    std::string why;
    if (original && !resize_in_place(c.path, *original, &why, widen_parents) && is_directory(c.path))
        log_line(LogLevel::Warn, "cannot give " + c.path + " back its cpus '" + c.original + "': " + why);
}

}  // namespace mall
