// SPDX-License-Identifier: BSD-3-Clause
// cgroup_modes.hpp — one type per cgroup mode (backend.hpp's CgroupMode): where a job's processes
// are enforced and what malld makes, resizes and removes for it. CgroupBackend keeps one
// JobEnforcement per job and asks it; nothing else branches on the mode (but adoption, which picks
// the type the state file implies: it keeps no mode). The types:
//   HostJob            auto and in-place: each process's own cgroup (Slurm's step, a container's,
//                      a systemd scope) is resized in place; a process in no cgroup made for it
//                      (the root, malld's own cgroup, a login session) moves into malld's folder.
//   OwnFolderJob       own: every process moves into malld's folder, <mount>/<parent>/job_<job>.
//   DelegatedJob       self-registered (malld --allow-self-register): the cgroup delegated to its
//                      user is resized in place, its parents never widened, nothing ever moved.
//   ContainerFolderJob container: malld's folder, made empty for an engine of the cgroupfs driver,
//                      whose cgroups below it are the job's; no process is ever moved.
//   SystemdSliceJob    container-systemd: the systemd slice mall-<job>.slice, resized through
//                      systemd (backend_slice_mode.cpp).
// What every mode shares (the in-place cgroups a job's processes were found in, resizing them,
// the folder's life) is JobEnforcement's; the kernel rules under it (resizing a cgroup in place,
// making and removing malld's folder) are CgroupBackend's, written once.
// Contract: malld's event loop calls every member; no member throws.
#pragma once

#include <sys/types.h>

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "backend.hpp"

namespace mall {

class CgroupBackend;

// Where a process is enforced under a job's mode.
enum class Placement {
    InPlace,    // its own cgroup is resized where it is
    OwnFolder,  // it moves into malld's folder for the job
    LeftAlone,  // neither (a container job's launcher; a self-registered job's process that left
                // its delegated cgroup)
};

class JobEnforcement {
public:
    JobEnforcement(CgroupBackend &cgroups, std::string job) : cgroups_(cgroups), job_(std::move(job)) {}
    virtual ~JobEnforcement() = default;
    JobEnforcement(const JobEnforcement &) = delete;
    JobEnforcement &operator=(const JobEnforcement &) = delete;

    // --- what each mode decides
    virtual CgroupMode mode() const = 0;
    // Where a process living in cgroup `rel` (relative to the mount) is enforced.
    virtual Placement place(const std::string &rel) const = 0;
    // Why process `pid`, in cgroup `rel`, cannot register under this mode ("" when it can); reads
    // only. By default: a process enforced in place needs a cgroup malld may write.
    virtual std::string registration_problem(pid_t pid, const std::string &rel) const;
    // The folder malld keeps for the job: <mount>/<parent>/job_<job>, or the slice's cgroup.
    virtual std::string folder() const;
    // Applies `cpus` to the folder (`to_move`: processes that belong in it, moved when it is made).
    virtual bool apply_folder(const std::vector<pid_t> &to_move, const CpuSet &cpus, bool growing,
                              std::string *error);
    // The job ended: the folder goes (a busy one later, tidy()).
    virtual void remove_folder();
    // Whether growing an in-place cgroup may widen the cgroups above it.
    virtual bool widens_parents() const { return true; }
    // Container modes: every process in the folder and below it now; else none.
    virtual std::vector<pid_t> member_pids() const { return {}; }
    // Container modes: what the engine takes as --cgroup-parent; else "".
    virtual std::string engine_cgroup_parent() const { return ""; }
    // Whether the registered processes' threads get the job's cpus as their own masks (false for
    // the container modes, whose registered process is the launcher, outside the job's cpus).
    virtual bool masks_registered_pids() const { return true; }
    // Why no job can register under this mode on this host ("" when it can); reads only.
    virtual std::string unavailable() const { return ""; }

    // --- the same for every mode
    // Takes a registered job's pids under control (CpusetBackend::add_pids).
    bool add_pids(const std::vector<pid_t> &pids, std::string *error);
    // The cgroups the state file saved (the in-place ones are kept) and the cpus enforced then;
    // the live pids are classified as at registration.
    void adopt(const std::vector<pid_t> &pids, const std::vector<JobCgroup> &saved, const CpuSet &enforced);
    bool apply(const std::vector<pid_t> &pids, const CpuSet &cpus, bool growing, std::string *error);
    // The job ended: every in-place cgroup gets back its cpus of registration, the folder goes.
    void remove();
    std::vector<JobCgroup> cgroups() const;           // no file system access
    std::vector<std::string> cgroup_paths() const;    // in place, and the folder when it exists
    bool holds(const std::string &path) const;        // path is one of the job's cgroups or below one
    std::string main_path() const;                    // the first in-place cgroup, else the folder
    std::optional<CpuSet> current() const;            // what the kernel applies there now
    // The job's folder is made at its first apply, before any process is in it (container modes).
    void expect_folder() { has_folder_ = true; }

protected:
    // Sorts pids not seen before (in place: records the cgroup) and returns every pid that belongs
    // in the folder.
    std::vector<pid_t> classify(const std::vector<pid_t> &pids);

    CgroupBackend &cgroups_;
    const std::string job_;
    std::vector<JobCgroup> in_place_;  // in the order first seen
    std::set<pid_t> seen_;             // pids already classified
    bool has_folder_ = false;          // some process needs the folder (or the mode makes it empty)
    std::optional<CpuSet> enforced_;   // the cpus last applied (for cgroups that join later)
};

// What both container modes share: the registered process (the launcher) is left alone, the
// folder is made empty at the first apply, and the processes found in its subtree are the job's.
class ContainerJob : public JobEnforcement {
public:
    ContainerJob(CgroupBackend &cgroups, std::string job) : JobEnforcement(cgroups, std::move(job)) {
        expect_folder();
    }
    Placement place(const std::string &) const override { return Placement::LeftAlone; }
    std::vector<pid_t> member_pids() const override;
    bool masks_registered_pids() const override { return false; }
};

// The type for `mode` (self_registered: DelegatedJob, whatever the mode).
std::unique_ptr<JobEnforcement> make_job_enforcement(CgroupBackend &cgroups, const std::string &job, CgroupMode mode,
                                                     bool self_registered = false);
// A job malld no longer knows whose folders remain (remove_stale_job_cgroups): the type that
// removes what is there (a slice, a folder with cgroups below it, a plain folder).
std::unique_ptr<JobEnforcement> make_leftover_enforcement(CgroupBackend &cgroups, const std::string &job);
// container-systemd (backend_slice_mode.cpp).
std::unique_ptr<JobEnforcement> make_systemd_slice_job(CgroupBackend &cgroups, const std::string &job);

}  // namespace mall
