// SPDX-License-Identifier: BSD-3-Clause
// affinity_backend.cpp — no cgroups: a job's cpus are every thread's sched_setaffinity mask, set on
// its registered processes and all their descendants (see affinity_backend.hpp). A job cannot be
// given no cpus (a thread needs one); what a job has now is its first live pid's mask.
#include "affinity_backend.hpp"

#include <sched.h>

#include <cerrno>
#include <map>

#include "cgroup_tree.hpp"
#include "job_cpu_time.hpp"
#include "procfs.hpp"

namespace mall {

using cgroup_tree::errno_text;

void set_tree_affinity(const std::string &job, const std::vector<pid_t> &pids, const CpuSet &cpus,
                       std::string *first_error) {
    for (pid_t pid : pids) {
        std::vector<pid_t> tree{pid};
        for (pid_t d : descendants_of(pid)) tree.push_back(d);
        for (pid_t p : tree)
            for (pid_t tid : threads_of(p))
                if (!set_thread_affinity(tid, cpus) && errno != ESRCH && first_error && first_error->empty())
                    *first_error = "sched_setaffinity(" + std::to_string(tid) + ", " + cpus.to_string() +
                                   ") failed: " + errno_text(errno) + "; malld needs root or the same uid as job " + job;
    }
}

namespace {

class AffinityBackend final : public CpusetBackend {
public:
    BackendKind kind() const override { return BackendKind::Affinity; }
    bool start(const CpuSet &, std::string *) override { return true; }
    bool check_pids(const std::vector<pid_t> &, CgroupMode, std::string *) const override {
        return true;  // no cgroups: every mode means "the threads' masks"
    }
    void set_mode(const std::string &, CgroupMode) override {}
    // A task joining a job that already holds cpus gets them now: the allocation may not change,
    // so no apply() would come for it.
    bool add_pids(const std::string &job, const std::vector<pid_t> &pids, std::string *error) override {
        auto it = applied_.find(job);
        if (it == applied_.end()) return true;
        std::string first_error;
        set_tree_affinity(job, pids, it->second, &first_error);
        if (first_error.empty()) return true;
        if (error) *error = first_error;
        return false;
    }
    void adopt(const std::string &, const std::vector<pid_t> &, const std::vector<JobCgroup> &,
               const CpuSet &) override {}
    std::vector<JobCgroup> cgroups_of(const std::string &) const override { return {}; }
    bool in_job_cgroups(const std::string &, pid_t) const override { return false; }

    bool apply(const std::string &job, const std::vector<pid_t> &pids, const CpuSet &cpus,
               bool, std::string *error) override {
        if (cpus.empty()) {
            if (error)
                *error = "cannot give job " + job +
                         " no cpus with the affinity backend (a thread needs at least one cpu); "
                         "it keeps its cpus until some are free";
            return false;
        }
        std::string first_error;
        set_tree_affinity(job, pids, cpus, &first_error);
        applied_[job] = cpus;
        if (!first_error.empty()) {
            if (error) *error = first_error;
            return false;
        }
        return true;
    }

    std::optional<CpuSet> current(const std::string &,
                                  const std::vector<pid_t> &pids) const override {
        for (pid_t pid : pids) {
            cpu_set_t set;
            CPU_ZERO(&set);
            if (::sched_getaffinity(pid, sizeof set, &set) != 0) continue;
            std::vector<int> cpus;
            for (int c = 0; c < CPU_SETSIZE && c < CpuSet::kMaxCpus; ++c)
                if (CPU_ISSET(c, &set)) cpus.push_back(c);
            return CpuSet::from_list(cpus);
        }
        return std::nullopt;
    }

    // The /proc times of the job's processes and their descendants (job_cpu_time.hpp).
    std::vector<CpuTimeReading> cpu_time_readings(const std::string &,
                                                  const std::vector<pid_t> &pids) const override {
        return process_tree_cpu_readings(pids);
    }

    void remove(const std::string &job) override { applied_.erase(job); }
    void stop() override {}
    std::string cgroup_path(const std::string &) const override { return ""; }
    std::vector<std::string> jobs_with_cgroups() const override { return {}; }
    std::string describe() const override {
        return "affinity (sched_setaffinity on every thread, no cgroups)";
    }

private:
    std::map<std::string, CpuSet> applied_;  // the cpus last applied to each job
};

}  // namespace

std::unique_ptr<CpusetBackend> make_affinity_backend() { return std::make_unique<AffinityBackend>(); }

bool set_thread_affinity(pid_t tid, const CpuSet &cpus) {
    cpu_set_t set = cpus.to_cpu_set();
    return ::sched_setaffinity(tid, sizeof set, &set) == 0;
}

}  // namespace mall
