// SPDX-License-Identifier: BSD-3-Clause
// pid_watch.cpp — see pid_watch.hpp. pidfd_open(2) by syscall number (glibc has a wrapper only
// since 2.36); a pidfd names whatever process holds the pid when it is opened, so each new watch
// checks the start time against the recorded one.
#include "pid_watch.hpp"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>
#include <utility>
#include <vector>

#include "connections.hpp"
#include "log.hpp"
#include "procfs.hpp"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

namespace mall {

namespace {

constexpr auto kPidPollInterval = std::chrono::seconds(1);  // only without pidfd_open

}  // namespace

void PidWatcher::stop_watching(Watch &watch) {
    if (watch.pidfd) ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, watch.pidfd.get(), nullptr);
}

std::optional<unsigned long long> PidWatcher::start_time(pid_t pid) const {
    auto it = start_times_.find(pid);
    if (it == start_times_.end()) return std::nullopt;
    return it->second;
}

void PidWatcher::sync(NodeManager &manager) {
    std::set<std::pair<std::string, pid_t>> wanted;
    for (const auto &[name, job] : manager.jobs())
        for (pid_t pid : job.spec.pids) wanted.insert({name, pid});
    std::set<std::pair<std::string, pid_t>> have;
    for (auto it = watches_.begin(); it != watches_.end();) {
        std::pair<std::string, pid_t> key{it->second.job, it->second.pid};
        if (!wanted.count(key)) {
            stop_watching(it->second);
            it = watches_.erase(it);
        } else {
            have.insert(key);
            ++it;
        }
    }
    std::vector<std::pair<std::string, pid_t>> dead;
    for (const auto &key : wanted) {
        if (have.count(key)) continue;
        const pid_t pid = key.second;
        Watch watch;
        watch.job = key.first;
        watch.pid = pid;
        int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
        if (fd < 0 && errno == ESRCH) {
            dead.push_back(key);
            continue;
        }
        if (fd >= 0) {
            watch.pidfd.reset(fd);
            ::fcntl(fd, F_SETFD, FD_CLOEXEC);
        } else {
            log_warn("pidfd_open(" + std::to_string(pid) + ") failed: " + std::strerror(errno) +
                     "; checking that process every " +
                     std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(kPidPollInterval).count()) +
                     " ms instead");
        }
        // The pidfd names whatever process has the pid now: make sure it is the registered one.
        auto start = process_start_time(pid);
        auto known = start_times_.find(pid);
        if (!start || (known != start_times_.end() && known->second != *start)) {
            dead.push_back(key);
            continue;
        }
        if (known == start_times_.end()) start_times_[pid] = *start;
        const uint64_t id = next_id_++;
        if (watch.pidfd) {
            epoll_event ev{};
            ev.events = EPOLLIN;
            ev.data.u64 = epoll_tag(Source::Pid, id);
            if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, watch.pidfd.get(), &ev) != 0) watch.pidfd.reset();
        }
        watches_.emplace(id, std::move(watch));
    }
    for (const auto &[job, pid] : dead) {
        log_info("process " + std::to_string(pid) + " of job " + job + " is gone");
        start_times_.erase(pid);
        if (manager.find(job)) manager.remove_pid(job, pid, Clock::now());
    }
}

void PidWatcher::handle_exit(uint64_t watch_id, NodeManager &manager) {
    auto it = watches_.find(watch_id);
    if (it == watches_.end()) return;
    const std::string job = it->second.job;
    const pid_t pid = it->second.pid;
    stop_watching(it->second);
    watches_.erase(it);
    start_times_.erase(pid);
    log_info("process " + std::to_string(pid) + " of job " + job + " exited");
    if (manager.find(job)) manager.remove_pid(job, pid, Clock::now());
}

std::optional<TimePoint> PidWatcher::next_poll() const {
    for (const auto &[id, w] : watches_)
        if (!w.pidfd) return next_poll_;
    return std::nullopt;
}

void PidWatcher::poll(NodeManager &manager, TimePoint now) {
    if (now < next_poll_) return;
    next_poll_ = Clock::now() + kPidPollInterval;
    std::vector<uint64_t> gone;
    for (const auto &[id, w] : watches_) {
        if (w.pidfd) continue;
        auto start = process_start_time(w.pid);
        auto known = start_times_.find(w.pid);
        if (!process_alive(w.pid) || !start || (known != start_times_.end() && known->second != *start))
            gone.push_back(id);
    }
    for (uint64_t id : gone) handle_exit(id, manager);
}

void PidWatcher::forget_job(const std::string &job) {
    for (auto it = watches_.begin(); it != watches_.end();) {
        if (it->second.job == job) {
            stop_watching(it->second);
            start_times_.erase(it->second.pid);
            it = watches_.erase(it);
        } else {
            ++it;
        }
    }
}

void PidWatcher::clear() { watches_.clear(); }

}  // namespace mall
