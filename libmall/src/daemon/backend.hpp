// backend.hpp — how malld enforces a job's cpus on the kernel. Three backends:
//   cgroup-v1: a cpuset folder per job under <mount>/<parent> (parent created with the pool's
//              cpus and the root's mems; job folders created on first enforce, removed at the end);
//   cgroup-v2: the same on the unified hierarchy where the cpuset controller is enabled;
//   affinity:  sched_setaffinity on every thread of the job's processes (and their descendants).
// Both cgroup backends also call sched_setaffinity on every thread when a job grows, because the
// kernel keeps each thread's own requested mask (effective = cpuset ∩ requested).
#pragma once

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "../common/cpuset.hpp"
#include "procfs.hpp"

namespace mall {

enum class BackendKind { Auto, CgroupV1, CgroupV2, Affinity };
std::optional<BackendKind> parse_backend(const std::string &name);
const char *backend_name(BackendKind kind);

class CpusetBackend {
public:
    virtual ~CpusetBackend() = default;
    virtual BackendKind kind() const = 0;
    // Prepares the backend (creates the parent cgroup with `pool`). False with *error on failure.
    virtual bool start(const CpuSet &pool, std::string *error) = 0;
    // Moves pids of the job under its control (cgroup.procs), if the backend has such a notion.
    virtual bool add_pids(const std::string &job, const std::vector<pid_t> &pids,
                          std::string *error) = 0;
    // Applies `cpus` to the job (see Effects::enforce). `pids`: the job's registered processes.
    virtual bool apply(const std::string &job, const std::vector<pid_t> &pids, const CpuSet &cpus,
                       bool growing, std::string *error) = 0;
    // The cpus currently enforced for the job as the kernel reports them (cpuset.cpus for cgroups;
    // for affinity, the first registered pid's mask); nullopt when unknown.
    virtual std::optional<CpuSet> current(const std::string &job,
                                          const std::vector<pid_t> &pids) const = 0;
    // Removes the job's cgroup (moving any leftover processes to the parent's parent).
    virtual void remove(const std::string &job) = 0;
    // Removes the parent cgroup if it holds no job; called at clean shutdown.
    virtual void stop() = 0;
    // The cgroup folder of a job ("" for affinity): reported in status for admins and tests.
    virtual std::string cgroup_path(const std::string &job) const = 0;
    // The jobs that have a cgroup folder of this backend now (none for affinity).
    virtual std::vector<std::string> jobs_with_cgroups() const = 0;
    virtual std::string describe() const = 0;  // e.g. "cgroup-v1 cpuset at /sys/fs/cgroup/cpuset/mall"
};

// Creates the backend. Auto picks cgroup-v1, then cgroup-v2, then affinity, and *why tells which
// and why the better ones were not usable. `parent` is the cgroup folder name (e.g. "mall").
std::unique_ptr<CpusetBackend> make_backend(BackendKind kind, const std::string &parent,
                                            std::string *why, std::string *error);

// sched_setaffinity on one thread; false on error. (The /proc readers the backends and tests use,
// threads_of, descendants_of, process_start_time..., are in procfs.hpp.)
bool set_thread_affinity(pid_t tid, const CpuSet &cpus);
// Mount point of the cgroup v1 hierarchy holding the cpuset controller, "" when there is none.
std::string cgroup_v1_cpuset_mount();

}  // namespace mall
