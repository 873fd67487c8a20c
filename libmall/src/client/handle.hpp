// SPDX-License-Identifier: BSD-3-Clause
// handle.hpp — struct mall_handle (the mall_t of mall.h) and what every file of the client shares:
// its limits and timings, and the few helpers the mall_step() fast path inlines.
// Contract: mall_step() reads only `page` and `seen_generation` when nothing changed; `page` points
// at a readable mapping (a private zero page until the first attach) at one fixed address for the
// handle's whole life, so page_generation() is one acquire load and never faults. Each field says
// which lock guards it. Lock order: step_mu before any other; control_by_signal's record lock before
// state_mu; threads_mu before state_mu; conn_mu, notify_mu and callbacks_mu are innermost (nothing
// is locked under them). Internal to libmall: nothing here is exported (libmall.map: mall_* only).
#pragma once

#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <forward_list>
#include <mutex>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/shared_page.hpp"
#include "mall/mall.h"

namespace mall::client {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr int kMaxCallbacks = 16;
constexpr int kMaxBoundThreads = 1024;
// mall_open() waits at most this long for malld's attach reply by default ($MALL_ATTACH_TIMEOUT_MS
// changes it, 0 to 60000; the connect itself never waits: a full backlog fails at once).
constexpr milliseconds kDefaultAttachTimeout{2000};
// The monitor's first wait before it retries an attach (monitor.cpp has the rest of its backoff).
constexpr milliseconds kFirstBackoff{50};
// A "seen generation" no page ever holds: the next mall_step() applies whatever the page says.
constexpr uint64_t kForceApply = UINT64_MAX;

// The page's generation, read without any lock. ThreadSanitizer models the monitor's
// mmap(MAP_FIXED) over the page as a plain write to it; the kernel swaps the mapping atomically, so
// a concurrent reader sees the old page or the new one, both valid. TSan builds skip that read.
#if defined(__SANITIZE_THREAD__)
extern "C" void AnnotateIgnoreReadsBegin(const char *file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char *file, int line);
inline uint64_t page_generation(const mall::SharedPage *page) {
    AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
    uint64_t generation = page->generation.load(std::memory_order_acquire);
    AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
    return generation;
}
#else
inline uint64_t page_generation(const mall::SharedPage *page) {
    return page->generation.load(std::memory_order_acquire);
}
#endif

struct ResizeCallback {
    mall_resize_fn fn;
    void *arg;
    mall_release_fn release;  // called with arg by mall_close(); may be null
};

inline void eventfd_signal(int fd) {
    uint64_t one = 1;
    ssize_t n = ::write(fd, &one, sizeof one);
    (void)n;  // EAGAIN means it is readable already
}

inline void eventfd_drain(int fd) {
    uint64_t value;
    ssize_t n = ::read(fd, &value, sizeof value);
    (void)n;  // EAGAIN means it was not readable
}

inline cpu_set_t cpu_set_of(const uint64_t mask[MALL_MAX_CPUS / 64]) {
    cpu_set_t set;
    CPU_ZERO(&set);
    // glibc keeps cpu i at bit i % 64 of word i / 64, as the page's mask does.
    static_assert(sizeof(set.__bits[0]) == sizeof(uint64_t) && CPU_SETSIZE == MALL_MAX_CPUS,
                  "cpu_set_t and the allocation mask share their layout");
    std::memcpy(set.__bits, mask, sizeof(uint64_t) * (MALL_MAX_CPUS / 64));
    return set;
}

inline pid_t current_tid() { return static_cast<pid_t>(::syscall(SYS_gettid)); }

}  // namespace mall::client

struct mall_handle {
    // --- the mall_step() fast path reads only these two words ---
    const mall::SharedPage *page = nullptr;  // fixed address for the handle's whole life
    std::atomic<uint64_t> seen_generation{0};

    // --- progress counters, bumped by mall_report_progress() (lock-free, relaxed) ---
    // mall_set_usage(): the cap, re-sent after every (re)attach; 0 = none.
    std::atomic<int> usage_cap{0};
    alignas(64) std::atomic<uint64_t> work_units{0};
    std::atomic<uint64_t> progress_calls{0};

    // --- set at open, constant afterwards ---
    alignas(64) std::string socket_path;
    nlohmann::json attach_body;  // {"job": $MALL_JOB_ID} or the self-registration {"min", "max"}
    int user_event_fd = -1;  // mall_fd(): readable while a published change is not applied yet
    int stop_event_fd = -1;  // written by mall_close() to stop the monitor

    // conn_mu guards the socket descriptor and the replacement of the page mapping, so that the
    // change path never reads a page while it is swapped and never sends on a closed descriptor.
    std::mutex conn_mu;
    int sock = -1;                      // written by the monitor (and open) only, under conn_mu
    std::atomic<bool> attached{false};
    // mall_job_id()'s text: every distinct name the handle was attached under, kept until
    // mall_close() so that a pointer handed out never changes or dangles; job_name points at the
    // current one. A new entry only when a re-attach names a job never seen before (malld lost its
    // state and self-registered the process anew): a handful per handle at most.
    std::forward_list<std::string> job_names;  // written by the monitor (and open), under conn_mu
    std::atomic<const char *> job_name{""};

    // --- the change path ---
    std::mutex step_mu;     // one change path at a time; guards scratch
    mall_alloc_t scratch{};  // the snapshot being applied (kept off the caller's stack)
    std::mutex state_mu;    // guards applied
    mall_alloc_t applied{};
    std::mutex callbacks_mu;
    mall::client::ResizeCallback callbacks[mall::client::kMaxCallbacks] = {};
    int ncallbacks = 0;
    std::mutex threads_mu;
    pid_t threads[mall::client::kMaxBoundThreads] = {};
    int nthreads = 0;
    // notify_mu makes "user_event_fd is readable" match "the page holds an unapplied generation":
    // the monitor signals and the change path drains under it.
    std::mutex notify_mu;
    bool user_fd_signaled = false;  // under notify_mu: false = surely not readable (saves a read())
    // Notification by signal (mall_open_ex's notify_signal, $MALL_NOTIFY_SIGNAL): 0 = none. Under
    // notify_mu: the last generation signalled, and whether the "no handler" warning was given.
    int notify_signal = 0;
    uint64_t notified_generation = 0;
    bool notify_warned = false;
    // Control by signal: the cpus the process had at mall_open() (requests stay within them).
    bool signal_control = false;
    uint64_t control_bound[MALL_MAX_CPUS / 64] = {};
    // Under state_mu: the cpus of malld's last applied generation (a signal request never widens
    // past them) and that page's flags (kPageFlagSignalControl: malld lets the job take requests).
    bool has_malld_cpus = false;
    uint64_t malld_cpus[MALL_MAX_CPUS / 64] = {};
    int malld_threads = 0;  // the thread count of that generation
    uint32_t page_flags = 0;
    // Under step_mu: a signal request pinned every thread; malld's next allocation re-pins them all.
    bool control_overrode = false;

    // --- fork: a handle belongs to the process that opened it ---
    // The open handles of the process, linked under lifecycle.cpp's registry lock, so that its
    // pthread_atfork child handler finds every handle a forked child inherited.
    mall_handle *prev_open = nullptr;
    mall_handle *next_open = nullptr;
    pid_t opener_pid = 0;      // getpid() at open; set once
    bool forked_copy = false;  // this is a forked child's copy (set there while single-threaded)

    // --- the monitor thread and its private state ---
    std::thread monitor;
    uint32_t next_request_id = 1;
    // The job a self-registration created: later attaches (after a malld restart that re-adopted
    // it) name it, since malld refuses to self-register a process that already has a job.
    std::string self_job;
    std::chrono::milliseconds first_retry{mall::client::kFirstBackoff};             // after mall_open's own attempt
    std::chrono::milliseconds attach_timeout{mall::client::kDefaultAttachTimeout};  // $MALL_ATTACH_TIMEOUT_MS
    uint64_t progress_base_units = 0, progress_base_calls = 0;
    uint64_t progress_sent_units = 0, progress_sent_calls = 0;
};
