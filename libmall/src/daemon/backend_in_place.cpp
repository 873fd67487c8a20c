// SPDX-License-Identifier: BSD-3-Clause
// backend_in_place.cpp — enforcement in place: a job's processes stay in the cgroup a
// resource manager or runtime made for them (Slurm's step, a container's, a systemd scope) and malld
// resizes that cgroup without moving any process: ancestors widened first, descendants narrowed
// first, and at the job's end the cgroup gets back the cpus it had at registration. check_pids
// says beforehand, without writing, whether a registration's processes can be enforced so.
#include "backend_cgroup.hpp"

#include <unistd.h>

#include <cerrno>

#include "../common/files.hpp"
#include "cgroup_tree.hpp"
#include "log.hpp"
#include "procfs.hpp"
#include "systemd_slice.hpp"

namespace mall {

using cgroup_tree::descendants;
using cgroup_tree::errno_text;
using cgroup_tree::is_directory;
using cgroup_tree::read_pid_list;

bool CgroupBackend::check_pids(const std::vector<pid_t> &pids, CgroupMode mode, std::string *error) const {
    if (mode == CgroupMode::ContainerSystemd && !has_systemd_slices())
        return fail(error, "the container engine uses the systemd cgroup driver, but malld runs the "
                           "cgroup-v1 backend (systemd sets cpusets on cgroup v2 only); configure the "
                           "engine with the cgroupfs driver (podman --cgroup-manager=cgroupfs)");
    if (mode == CgroupMode::ContainerSystemd && !systemd_slice::systemd_booted())
        return fail(error, "the container engine uses the systemd cgroup driver, but systemd does not "
                           "run here (no /run/systemd/system); use the cgroupfs driver");
    for (pid_t pid : pids) {
        auto rel = cgroup_of(pid);
        if (!rel) continue;  // gone (registration refuses dead pids itself) or no cpuset line
        const bool own = needs_own_folder(*rel);
        if (mode == CgroupMode::Own || is_container_mode(mode) ||
            (mode == CgroupMode::Auto && own))
            continue;
        if (own)
            return fail(error, "pid " + std::to_string(pid) + " lives in cgroup " + *rel + ", " +
                                   own_reason(*rel) +
                                   ": there is no cgroup of its own to resize in place; register "
                                   "it with cgroup mode auto or own");
        if (auto why = cannot_write_in_place(mount_ + *rel))
            return fail(error, "pid " + std::to_string(pid) + " lives in cgroup " + *rel +
                                   ", which malld cannot resize in place: " + *why);
    }
    return true;
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
bool CgroupBackend::resize_in_place(const std::string &dir, const CpuSet &target, std::string *error) {
    if (!is_directory(dir)) return true;  // the resource manager removed it: the job is ending
    if (target.empty()) {
        if (read_pid_list(dir + "/cgroup.procs").empty()) return true;
        return fail(error, "cannot narrow " + dir +
                               " to no cpus while it holds processes (the kernel refuses an "
                               "empty cpuset); the job keeps its cpus until some are free");
    }
    auto now = written_cpus(dir);
    if (!now) return fail(error, "cannot read " + dir + "/cpuset.cpus: " + errno_text(errno));
    if (now->empty()) now = effective_cpus(dir);  // v2: inherited
    const std::vector<std::string> below = descendants(dir);
    CpuSet wide = (now ? *now : CpuSet()) | target;
    bool grew = false;
    if (!(target - (now ? *now : CpuSet())).empty()) {
        grew = true;
        for (const std::string &a : ancestors(dir)) {
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
    if (!check_applied(dir, target, error)) return false;
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
void CgroupBackend::give_back(const JobCgroup &c) {
    if (!is_directory(c.path)) return;
    if (c.original.empty()) {
        restore_inherited(c.path);
        return;
    }
    auto original = CpuSet::parse(c.original);
    std::string why;
    if (original && !resize_in_place(c.path, *original, &why) && is_directory(c.path))
        log_line(LogLevel::Warn, "cannot give " + c.path + " back its cpus '" + c.original + "': " + why);
}

}  // namespace mall
