// SPDX-License-Identifier: BSD-3-Clause
// pid_watch.hpp — notices at once when a registered process ends: one pidfd per (job, pid) in
// malld's epoll set, or, on kernels without pidfd_open, a poll every second. Also the start time
// of every registered pid (/proc/PID/stat field 22), so that a pid the kernel reuses for another
// process — after an exit malld has not seen yet, or while malld was down — is never taken for
// the job's process. An ended process is removed from its job in the core (the job ends with its
// last process).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "../common/unix_socket.hpp"
#include "core/node_manager.hpp"

namespace mall {

class PidWatcher {
public:
    explicit PidWatcher(int epoll_fd) : epoll_fd_(epoll_fd) {}
    PidWatcher(const PidWatcher &) = delete;
    PidWatcher &operator=(const PidWatcher &) = delete;

    // Watches every pid of every job in the core and stops watching pids no job has; a pid that
    // is gone already (or whose start time differs from the one recorded) leaves its job.
    void sync(NodeManager &manager);
    // A watched process ended (its pidfd became readable): it leaves its job.
    void handle_exit(uint64_t watch_id, NodeManager &manager);
    // Without pidfds: checks the unwatched pids when their time has come (see next_poll()).
    void poll(NodeManager &manager, TimePoint now);
    // When poll() has work next; nullopt when every pid has a pidfd.
    std::optional<TimePoint> next_poll() const;
    // The job is gone: its watches and start times go too.
    void forget_job(const std::string &job);

    // Start times of registered pids: recorded at registration, kept in the state file.
    void remember_start(pid_t pid, unsigned long long start_time) { start_times_[pid] = start_time; }
    void forget_start(pid_t pid) { start_times_.erase(pid); }
    std::optional<unsigned long long> start_time(pid_t pid) const;

    void clear();  // malld is stopping

private:
    struct Watch {
        std::string job;
        pid_t pid = 0;
        UniqueFd pidfd;  // empty when pidfd_open is unavailable: polled instead
    };
    void stop_watching(Watch &watch);

    int epoll_fd_;
    uint64_t next_id_ = 1;
    std::map<uint64_t, Watch> watches_;
    std::map<pid_t, unsigned long long> start_times_;
    TimePoint next_poll_{};
};

}  // namespace mall
