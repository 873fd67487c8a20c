// SPDX-License-Identifier: BSD-3-Clause
// backend_cgroup.hpp — the common layer of the two cgroup backends (internal to the daemon; malld
// sees only backend.hpp's CpusetBackend). CgroupBackend keeps one JobEnforcement per job, the
// type of its cgroup mode (cgroup_modes.hpp), and holds the kernel rules every mode uses, each
// written once; the kernel interface that differs between cgroup v1 and v2 is a set of hooks that
// backend_cgroup_v1.cpp and backend_cgroup_v2.cpp implement, so nothing here branches on the
// version, nor on the mode (but adopt, which picks the type the state file implies). Each concern
// has its own file:
//   backend_cgroup.cpp     start, stop, the jobs' map and what the daemon asks of a job (its cpus,
//                          its cpu time);
//   cgroup_modes.cpp       the modes but container-systemd, and what every mode shares;
//   backend_in_place.cpp   resizing a cgroup someone else made (Slurm's step, a container's, a
//                          systemd scope) where it is, giving it back its cpus at the end, and
//                          the registration checks (check_pids, check_self_registration);
//   backend_own_folder.cpp malld's own folder per job, <mount>/<parent>/job_<job> (also the
//                          folder a container engine of the cgroupfs driver creates its cgroups in);
//   backend_slice_mode.cpp the container-systemd mode: the job's systemd slice, resized by systemd.
// Contract: one thread (malld's event loop) calls every member; no member throws.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "backend.hpp"
#include "cgroup_modes.hpp"
#include "job_cpu_time.hpp"

namespace mall {

class CgroupBackend : public CpusetBackend {
public:
    // `self_rel`: the cgroup malld runs in, relative to the mount (the version knows which line of
    // /proc/self/cgroup to read).
    CgroupBackend(std::string mount, std::string parent, std::string self_rel);

    // --- CpusetBackend (backend_cgroup.cpp unless said)
    bool start(const CpuSet &pool, std::string *error) override;
    void set_mode(const std::string &job, CgroupMode mode) override;
    void set_self_registered(const std::string &job) override;
    bool add_pids(const std::string &job, const std::vector<pid_t> &pids, std::string *error) override;
    void adopt(const std::string &job, const std::vector<pid_t> &pids, const std::vector<JobCgroup> &saved,
               const CpuSet &enforced) override;
    std::string saved_cgroup_problem(const std::string &job, const JobCgroup &saved) const override;
    std::vector<JobCgroup> cgroups_of(const std::string &job) const override;
    bool in_job_cgroups(const std::string &job, pid_t pid) const override;
    std::vector<pid_t> member_pids(const std::string &job) const override;
    std::string engine_cgroup_parent(const std::string &job) const override;
    void tidy() override;
    bool apply(const std::string &job, const std::vector<pid_t> &pids, const CpuSet &cpus, bool growing,
               std::string *error) override;
    std::optional<CpuSet> current(const std::string &job, const std::vector<pid_t> &pids) const override;
    std::vector<CpuTimeReading> cpu_time_readings(const std::string &job,
                                                  const std::vector<pid_t> &pids) const override;
    void remove(const std::string &job) override;
    void stop() override;
    std::string cgroup_path(const std::string &job) const override;
    std::vector<std::string> jobs_with_cgroups() const override;
    std::string describe() const override;
    // backend_in_place.cpp
    bool check_pids(const std::vector<pid_t> &pids, CgroupMode mode, std::string *error) const override;
    bool check_self_registration(pid_t pid, uid_t uid, std::string *error) const override;
    std::optional<std::string> cgroup_resized_in_place(const std::string &job, pid_t pid,
                                                       CgroupMode mode) const override;

    // --- the rules the modes share (cgroup_modes.hpp), each written once
    const std::string &mount() const { return mount_; }
    const CpuSet &pool() const { return pool_; }
    // The process's cgroup in this hierarchy, relative to the mount; nullopt when gone.
    virtual std::optional<std::string> cgroup_of(pid_t pid) const = 0;
    // True where the container-systemd mode can work (systemd sets cpusets on cgroup v2 only).
    virtual bool has_systemd_slices() const = 0;
    // backend_cgroup.cpp: why a process in cgroup `rel` needs malld's own folder ("" when `rel` was
    // made for it): never_delegated_reason, or (v2) a systemd login session.
    std::string own_reason(const std::string &rel) const;
    // The cgroups no job may be resized in: the root, malld's own folders, the cgroup malld runs
    // in and its ancestors ("" for any other).
    std::string never_delegated_reason(const std::string &rel) const;
    // The cpus that apply to the processes of `dir` (effective_cpus_file()).
    std::optional<CpuSet> effective_cpus(const std::string &dir) const;
    // What is written in a folder's cpuset.cpus (v2: may be empty, the parent's).
    std::optional<CpuSet> written_cpus(const std::string &dir) const;
    // False with *error when the kernel applies other cpus than `target` to `dir`; `hint` says
    // what may be in the way.
    bool check_effective(const std::string &dir, const CpuSet &target, const std::string &hint,
                         std::string *error) const;
    // check_effective's words for `effective` (nullopt: unread) applied where `target` was written.
    std::string effective_mismatch(const std::string &dir, const CpuSet &target,
                                   const std::optional<CpuSet> &effective, const std::string &hint) const;
    // An empty cpu list asked for `what`: fine when it holds no process; else false with *error
    // (`why`: why the kernel or systemd cannot take an empty list).
    static bool allow_no_cpus(const std::string &what, bool holds_processes, const std::string &why,
                              std::string *error);
    // A job's folder that outlives the job because it still holds processes (a container the job
    // no longer manages): `widen` gives it the whole pool (false with its error), and the log says
    // `what` keeps the pool and goes once empty.
    void keep_running_with_pool(const std::string &what, const std::string &path,
                                const std::function<bool(std::string *)> &widen) const;
    // backend_in_place.cpp
    // Why malld may not resize `dir` in place, or nullopt when it may.
    std::optional<std::string> cannot_write_in_place(const std::string &dir) const;
    // widen_parents false (a self-registered job's delegated cgroup): the cgroups above dir are
    // never written, so cpus outside its parent's are refused instead of taken.
    bool resize_in_place(const std::string &dir, const CpuSet &target, std::string *error,
                         bool widen_parents = true);
    void widen_thread_masks(const std::string &dir, const std::vector<std::string> &below, const CpuSet &cpus) const;
    void give_back(const JobCgroup &c, bool widen_parents);
    // backend_own_folder.cpp
    std::string own_folder(const std::string &job) const;  // <mount>/<parent>/job_<job>
    // Applies cpus to malld's folder `dir`, making it (and moving `to_move` in) when it is not there.
    bool apply_job_folder(const std::string &dir, const std::vector<pid_t> &to_move, const CpuSet &cpus, bool growing,
                          std::string *error);
    bool move_pids(const std::string &dir, const std::vector<pid_t> &pids, std::string *error);
    // A plain folder's processes go to the root and it goes (retried by tidy while busy); one with
    // cgroups below it (an engine's) goes as remove_container_folders says.
    void remove_job_folder(const std::string &dir);
    void remove_container_folders(const std::string &dir);
    // backend_slice_mode.cpp
    std::string slice_dir(const std::string &job) const;  // "" when the name cannot be a unit's
    void release_slice_when_empty(const std::string &job) { pending_slices_.insert(job); }
    void release_slice(const std::string &job);

    static bool fail(std::string *error, const std::string &text) {
        if (error) *error = text;
        return false;
    }

protected:
    // The kernel interface of one cgroup version (backend_cgroup_v1.cpp, backend_cgroup_v2.cpp).
    // "cgroup-v1" or "cgroup-v2", for describe().
    virtual const char *version_name() const = 0;
    // Before malld's parent folder is made: v2 enables cpuset where its folders go (the root, or
    // the subtree delegated to malld, which may move parent_rel_ and parent_dir_).
    virtual bool prepare_hierarchy(std::string *error) = 0;
    // After the parent folder holds the pool: v1 gives it memory nodes, v2 enables cpuset below it.
    virtual bool prepare_parent(std::string *error) = 0;
    // A job folder malld just made (its cpus written, `pids` about to move in): v1 gives it memory
    // nodes (removing it again on failure), v2 enables cpuset below an empty one for an engine.
    virtual bool prepare_job_folder(const std::string &dir, const std::vector<pid_t> &pids,
                                    std::string *error) = 0;
    // The file whose cpus apply to a folder's processes ("/cpuset.cpus" or "/cpuset.cpus.effective").
    virtual const char *effective_cpus_file() const = 0;
    // True when an empty cpuset.cpus means "the parent's cpus" (v2) rather than none (v1).
    virtual bool empty_cpus_inherit() const = 0;
    // True when the kernel may apply other cpus than a folder's cpuset.cpus (v2's
    // cpuset.cpus.effective, checked after every resize in place); v1 applies what was written.
    virtual bool applies_other_cpus() const = 0;
    // At a job's end, an in-place cgroup whose cpuset.cpus was empty at registration gets that back.
    virtual void restore_inherited(const std::string &dir) = 0;
    // Non-empty when `rel` is a cgroup shared by unrelated processes that the version knows of
    // (v2: a systemd login session), so a process there needs malld's own folder.
    virtual std::string session_reason(const std::string &rel) const = 0;
    // True when each cgroup counts its processes' cpu time in this hierarchy (v2's cpu.stat), so a
    // job's time is its cgroups'; false (v1) when it comes from /proc instead (cpu_time_readings).
    virtual bool cgroups_count_cpu_time() const = 0;

    std::string mount_;
    std::string parent_name_;  // --cgroup-parent
    std::string parent_rel_;   // "/mall" (or "<delegated subtree>/mall"): malld's folders, relative to the mount
    std::string parent_dir_;
    std::string self_rel_;     // the cgroup malld runs in, relative to the mount

private:
    // --- backend_cgroup.cpp
    // The job's enforcement, made under mode auto when the job has none yet.
    JobEnforcement &enforcement(const std::string &job);
    const JobEnforcement *find(const std::string &job) const;
    void retry_pending_removals();
    // --- backend_in_place.cpp
    bool write_cpus(const std::string &dir, const CpuSet &cpus, std::string *error) const;
    std::vector<std::string> ancestors(const std::string &dir) const;
    // --- backend_own_folder.cpp
    std::vector<std::string> other_cgroup_mounts() const;
    std::vector<std::string> job_folders() const;
    CpuSet children_cpus() const;
    bool remove_folder(const std::string &dir);
    // --- backend_slice_mode.cpp
    void stop_parent_slice_if_empty();
    std::vector<std::string> slice_jobs() const;

    CpuSet pool_;  // malld's pool (a container folder left running gets all of it)
    std::map<std::string, std::unique_ptr<JobEnforcement>> jobs_;
    std::set<std::string> pending_removals_;
    std::set<std::string> pending_rmdirs_;  // container folders: removed with rmdir only
    std::set<std::string> pending_slices_;  // jobs whose slice still holds processes
};

// The two versions (make_backend calls them once the probe found the mount).
std::unique_ptr<CpusetBackend> make_cgroup_v1_backend(const std::string &mount, const std::string &parent);
std::unique_ptr<CpusetBackend> make_cgroup_v2_backend(const std::string &mount, const std::string &parent);

// The prefix of malld's own job folders: <mount>/<parent>/job_<job>.
constexpr const char *kJobFolderPrefix = "job_";

}  // namespace mall
