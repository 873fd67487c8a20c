// SPDX-License-Identifier: BSD-3-Clause
// kernel_effects.hpp — carries out what the core decides (NodeManager's Effects) on the real
// system: a job's cpus go to the cpuset backend (cgroup or affinity), a new allocation goes to the
// job's shared page (a sealed memfd each attached process maps read-only) and a Notify to its
// connections, events go to the log and to watchers, and a job's end removes its cgroup, page,
// pid watches and connections. Runs on the loop thread only.
#pragma once

#include <sys/types.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../common/shared_page.hpp"
#include "../common/unix_socket.hpp"
#include "backend.hpp"
#include "connections.hpp"
#include "core/node_manager.hpp"
#include "pid_watch.hpp"

namespace mall {

class KernelEffects final : public Effects {
public:
    KernelEffects(CpusetBackend &backend, Connections &connections, PidWatcher &pids)
        : backend_(backend), connections_(connections), pids_(pids) {}
    ~KernelEffects() override;
    KernelEffects(const KernelEffects &) = delete;
    KernelEffects &operator=(const KernelEffects &) = delete;

    // The core whose jobs' pids enforce() acts on; set once the core exists.
    void set_manager(const NodeManager *manager) { manager_ = manager; }
    // Called with every "end" event (stamped with its time) after watchers got it: malld's
    // history file.
    void set_end_observer(std::function<void(const nlohmann::json &)> observer) { end_observer_ = std::move(observer); }

    // --- Effects ---
    bool enforce(const std::string &job, const CpuSet &cpus, bool growing, std::string *error) override;
    void publish(const std::string &job, uint64_t generation, const CpuSet &cpus, int threads,
                 bool signal_control) override;
    void job_removed(const std::string &job) override;
    // Stamps the event's wall-clock "time" (seconds since the epoch) when the core left it out.
    void event(const nlohmann::json &event) override;
    TimePoint clock_now(TimePoint) override { return Clock::now(); }
    // The backend's readings of the job's counters into its account (cpu_time_), taken with the
    // boot clock read first; none when nothing could be read.
    std::optional<CpuTimeSample> cpu_time(const std::string &job) override;

    // --- the job's shared page ---
    struct JobPage {
        UniqueFd memfd;
        SharedPage *page = nullptr;
    };
    // The job's page, created (sealed, zeroed) on first use; null with *error when the kernel
    // refuses a step (memfd_create, ftruncate, mmap, sealing).
    JobPage *ensure_page(const std::string &job, std::string *error);
    // threads: 0 = one per cpu (Job::published_threads); signal_control sets the page's
    // kPageFlagSignalControl (Job::published_signal_control).
    void write_page(JobPage &page, uint64_t generation, const CpuSet &cpus, int threads, bool signal_control);

    // A job's registered pids (the core lists a job, and a joining task's pids, before it asks
    // for any enforcement); empty for an unknown job.
    std::vector<pid_t> pids_of(const std::string &job) const;

private:
    CpusetBackend &backend_;
    Connections &connections_;
    PidWatcher &pids_;
    const NodeManager *manager_ = nullptr;
    std::map<std::string, JobPage> pages_;
    std::map<std::string, CpuTimeAccount> cpu_time_;  // each job's cpu time (cpu_time()), erased at its removal
    std::function<void(const nlohmann::json &)> end_observer_;
};

}  // namespace mall
