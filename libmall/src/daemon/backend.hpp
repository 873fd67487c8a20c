// SPDX-License-Identifier: BSD-3-Clause
// backend.hpp — how malld enforces a job's cpus on the kernel. Three backends:
//   cgroup-v1: the cpuset hierarchy of cgroup v1;
//   cgroup-v2: the unified hierarchy where the cpuset controller is enabled;
//   affinity:  sched_setaffinity on every thread of the job's processes (and their descendants).
// The cgroup backends enforce a job where its processes live (enforcement in place): a process in
// a cgroup that a resource manager or runtime made for it (Slurm's step cgroup, a container's, a
// systemd scope) stays there and malld resizes that cgroup (v1: ancestors widened first,
// descendants narrowed first; v2: cpuset.cpus written, cpuset.cpus.effective read back). Only a
// process in no such cgroup (the root, malld's own cgroup or an ancestor of it, a systemd login
// session) moves into a folder of malld's own, <mount>/<parent>/job_<job>, created on the first
// enforcement and removed at the job's end; an in-place cgroup gets back the cpus it had at
// registration instead. Both cgroup backends also call sched_setaffinity on every thread when a
// job grows, because the kernel keeps each thread's own requested mask (effective = cpuset ∩ mask).
// Where each part lives (one file per kernel interface and per mode, a common layer above, as
// Slurm keeps cgroup/v1, cgroup/v2 and task/cgroup apart): backend_probe (what the host has),
// backend_cgroup (the common cgroup layer) with backend_cgroup_v1 and backend_cgroup_v2,
// cgroup_modes (one type per CgroupMode, what a mode decides), backend_in_place,
// backend_own_folder, backend_slice_mode (container-systemd), systemd_slice (a container job's
// systemd slice: its name and systemd's calls), cgroup_tree (reading a cgroup hierarchy as a tree
// of folders), job_cpu_time (a job's cpu-time counters) and affinity_backend; backend.cpp picks one.
#pragma once

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "../common/cpuset.hpp"
#include "../common/rules.hpp"
#include "job_cpu_time.hpp"
#include "procfs.hpp"

namespace mall {

enum class BackendKind { Auto, CgroupV1, CgroupV2, Affinity };
std::optional<BackendKind> parse_backend(const std::string &name);
const char *backend_name(BackendKind kind);

// Where a registering job's processes are enforced (the Register request's "cgroup" field):
//   Auto:    in place when a process lives in a cgroup made for it, else in malld's own folder;
//   Own:     always malld's own folder (the process is moved there);
//   InPlace: always in place; refused when a process lives in no cgroup of its own.
//   Container: a container job (mallrun --container). malld makes its own folder at registration,
//            empty, and the container engine creates the container below it (--cgroup-parent);
//            the registered pid (the launcher) is never moved or resized. The processes found in
//            the folder's subtree are the job's (member_pids), resized with it.
//   ContainerSystemd: the same for an engine with the systemd cgroup driver (cgroup v2 only): the
//            job's cgroup is the systemd slice mall-<job>.slice in mall.slice (systemd_slice.hpp),
//            which the engine takes as --cgroup-parent and systemd makes when the engine starts
//            its scopes in it; malld resizes it with systemd's AllowedCPUs, never by writing
//            systemd's files alone, and stops it at the job's end.
enum class CgroupMode { Auto, Own, InPlace, Container, ContainerSystemd };
// Container or ContainerSystemd.
inline bool is_container_mode(CgroupMode mode) {
    return mode == CgroupMode::Container || mode == CgroupMode::ContainerSystemd;
}
std::optional<CgroupMode> parse_cgroup_mode(const std::string &name);
const char *cgroup_mode_name(CgroupMode mode);

// One cgroup a job's cpus are enforced on.
struct JobCgroup {
    std::string path;       // the folder, e.g. /sys/fs/cgroup/cpuset/slurm/uid_0/job_5/step_0
    bool in_place = false;  // made by someone else and resized where it is; false: malld's own
    std::string original;   // in place: its cpuset.cpus at registration, given back at the end
    bool operator==(const JobCgroup &o) const {
        return path == o.path && in_place == o.in_place && original == o.original;
    }
};

class CpusetBackend {
public:
    virtual ~CpusetBackend() = default;
    virtual BackendKind kind() const = 0;
    // Prepares the backend (creates the parent cgroup with `pool`). False with *error on failure.
    virtual bool start(const CpuSet &pool, std::string *error) = 0;
    // Reads where `pids` live and says, without writing anything, whether the backend can enforce
    // them under `mode` (e.g. an in-place cgroup malld may not write). False with *error.
    virtual bool check_pids(const std::vector<pid_t> &pids, CgroupMode mode,
                            std::string *error) const = 0;
    // Records the mode of a job about to register (before its first apply()).
    virtual void set_mode(const std::string &job, CgroupMode mode) = 0;
    // Self-registration (malld --allow-self-register) of process `pid`, which runs as `uid`: says,
    // without writing anything, whether it may become a job of its own. The cgroup backends accept
    // it only where its cgroup is delegated to uid (the folder and its cgroup.procs owned by uid),
    // holds only uid's processes, overlaps no job's cgroup, and lies in parents that allow malld's
    // whole pool: such a job is resized in place, nothing is moved and no parent is widened. Else
    // false with *error in words. Affinity accepts it (a process may set its own threads' masks).
    virtual bool check_self_registration(pid_t pid, uid_t uid, std::string *error) const {
        (void)pid, (void)uid, (void)error;
        return true;
    }
    // The cgroup folder a Register of `pid` for `job` would resize in place (under the job's mode
    // when it exists, else `mode`), read without writing anything; nullopt when the process would
    // be moved into malld's own folder, is left where it is (a container mode's launcher), or the
    // backend keeps no cgroups (affinity). Authorization asks it which processes such a resize
    // would confine (every process in that folder and below it).
    virtual std::optional<std::string> cgroup_resized_in_place(const std::string &job, pid_t pid,
                                                               CgroupMode mode) const {
        (void)job, (void)pid, (void)mode;
        return std::nullopt;
    }
    // Records a job about to be self-registered (after check_self_registration): enforced in place
    // in its delegated cgroup only, never moved, its cgroup's parents never widened. Call it before
    // anything else is recorded for the job (it starts the job's record afresh).
    virtual void set_self_registered(const std::string &job) { (void)job; }
    // Takes a registered job's pids under control: records the cgroups they live in and moves
    // those that need malld's own folder into it (once it exists).
    virtual bool add_pids(const std::string &job, const std::vector<pid_t> &pids,
                          std::string *error) = 0;
    // A re-adopted job's cgroups, as the state file saved them, and the cpus it was enforced on:
    // recorded without any write.
    virtual void adopt(const std::string &job, const std::vector<pid_t> &pids,
                       const std::vector<JobCgroup> &saved, const CpuSet &enforced) = 0;
    // Why a cgroup the state file saved for `job` is not one this backend could have saved (the
    // cgroup backends: not strictly below their cgroup mount, not a plain path, an in-place one
    // that no job is ever resized in: never_delegated_reason's malld's own folders, the cgroup
    // malld runs in and its ancestors), or "" when it may be adopted. A crafted file must not steer root's
    // cgroup writes. Affinity keeps no cgroups and adopts none: "".
    virtual std::string saved_cgroup_problem(const std::string &job, const JobCgroup &saved) const {
        (void)job, (void)saved;
        return "";
    }
    // The cgroups the job is enforced on now (empty for affinity or before the first apply).
    virtual std::vector<JobCgroup> cgroups_of(const std::string &job) const = 0;
    // True when pid lives in one of the job's cgroups or below one (membership by cgroup: a
    // process that entered the job's cgroup from the side, e.g. with `podman exec`). Always false
    // for affinity, which has no cgroups.
    virtual bool in_job_cgroups(const std::string &job, pid_t pid) const = 0;
    // Container jobs: every process in the job's folder and below it now (the container's init,
    // its exec'd processes, podman's conmon); empty for other jobs and for affinity.
    virtual std::vector<pid_t> member_pids(const std::string &job) const { (void)job; return {}; }
    // Container jobs: what a container engine takes as --cgroup-parent: the job's folder relative
    // to the hierarchy's root (e.g. /mall/job_train), or for ContainerSystemd the slice's name
    // (mall-train.slice); "" when there is none.
    virtual std::string engine_cgroup_parent(const std::string &job) const { (void)job; return ""; }
    // Retries removing folders of ended jobs that were still busy (called about once a second).
    virtual void tidy() {}
    // Applies `cpus` to the job (see Effects::enforce). `pids`: the job's registered processes.
    virtual bool apply(const std::string &job, const std::vector<pid_t> &pids, const CpuSet &cpus,
                       bool growing, std::string *error) = 0;
    // The cpus currently enforced for the job as the kernel reports them (cpuset.cpus for cgroups;
    // for affinity, the first registered pid's mask); nullopt when unknown.
    virtual std::optional<CpuSet> current(const std::string &job,
                                          const std::vector<pid_t> &pids) const = 0;
    // The job's cpu-time counters now (job_cpu_time.hpp; KernelEffects keeps their account), read
    // without writing: cgroup v2 reads usage_usec of cpu.stat in each of the job's cgroups
    // (exited processes' time included); cgroup v1 and affinity read the /proc times of `pids`
    // (the job's registered processes), their descendants and, for a container job (v1), the
    // processes in its cgroups. Empty when there is nothing to read (yet).
    virtual std::vector<CpuTimeReading> cpu_time_readings(const std::string &job,
                                                          const std::vector<pid_t> &pids) const = 0;
    // The job ended: removes its own folder (moving any leftover processes to the root) and gives
    // each in-place cgroup back the cpus it had at registration.
    virtual void remove(const std::string &job) = 0;
    // Removes the parent cgroup if it holds no job; called at clean shutdown.
    virtual void stop() = 0;
    // The job's main cgroup folder ("" for affinity): its first in-place cgroup, else malld's own
    // folder for it. Reported in status for admins and tests.
    virtual std::string cgroup_path(const std::string &job) const = 0;
    // The jobs that have a folder of malld's own now (none for affinity).
    virtual std::vector<std::string> jobs_with_cgroups() const = 0;
    virtual std::string describe() const = 0;  // e.g. "cgroup-v1 cpuset at /sys/fs/cgroup/cpuset/mall"
};

// Self-registered jobs are named kSelfJobPrefix + pid (common/rules.hpp, which Register refuses
// for other jobs): a re-adopted job of that name is enforced as a self-registered one
// (set_self_registered).

// Creates the backend. Auto picks cgroup-v1, then cgroup-v2, then affinity, and *why tells which
// and why the better ones were not usable. `parent` is the cgroup folder name (e.g. "mall").
std::unique_ptr<CpusetBackend> make_backend(BackendKind kind, const std::string &parent,
                                            std::string *why, std::string *error);

// sched_setaffinity on one thread; false on error. (The /proc readers the backends and tests use,
// threads_of, descendants_of, process_start_time..., are in procfs.hpp.)
bool set_thread_affinity(pid_t tid, const CpuSet &cpus);
// Mount point of the cgroup v1 hierarchy holding the cpuset controller, "" when there is none
// (what probe_v1 finds first; the tests ask it where to make their own cgroups).
std::string cgroup_v1_cpuset_mount();

}  // namespace mall
