// SPDX-License-Identifier: BSD-3-Clause
// control_by_signal.cpp — see control_by_signal.hpp. The handler is async-signal-safe: atomics and
// one write(2) to the handle's eventfd; everything else (the record, the decision) runs on the
// change path or in mall_open/mall_close.
#include "control_by_signal.hpp"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <new>

#include "common/cpuset.hpp"
#include "common/signal_control.hpp"
#include "error_text.hpp"
#include "process_effects.hpp"

namespace mall::client {

namespace {

struct SignalControlBlock {
    std::atomic<mall_handle *> owner{nullptr};
    std::atomic<uint64_t> request{0};  // (sender pid << 32) | value; 0 = none
    std::atomic<int> in_handler{0};
    std::atomic<uint64_t> received{0};
    int signal = 0;
    struct sigaction previous {};
    // The status record `mallctl signal` reads (signal_control.hpp), under record_mu: the decided
    // requests and the last one's outcome. Written on the change path and at (de)attach only.
    std::mutex record_mu;
    int record_fd = -1;
    uint64_t record_seq = 0, handled = 0;
    uint32_t last_value = 0;
    pid_t last_from = 0;
    const char *last_result = "none";
    char last_why[512] = "";
    char record[mall::signal_control::kRecordSize];
};
SignalControlBlock g_control;  // never destroyed: a late signal finds it

// A forked child (a data-loader worker, say) is not the process that opted in: it drops the
// handle and its copy of the record, so `mallctl signal` refuses it ("not enabled"); the handler
// it inherits ignores requests. Runs in the child only (no lock: another thread may have held one).
void control_after_fork_in_child() {
    new (&g_control.record_mu) std::mutex();  // another thread may have held it at the fork
    g_control.owner.store(nullptr);
    g_control.request.store(0);
    if (g_control.record_fd >= 0) ::close(g_control.record_fd);
    g_control.record_fd = -1;
}

void control_handler(int, siginfo_t *info, void *) {
    const int saved_errno = errno;
    g_control.in_handler.fetch_add(1);
    if (info != nullptr && info->si_code == SI_QUEUE) {
        const auto value = static_cast<uint32_t>(info->si_value.sival_int);
        mall_handle *h = g_control.owner.load();
        if (h != nullptr && mall::signal_control::decode(value)) {
            g_control.request.store((static_cast<uint64_t>(static_cast<uint32_t>(info->si_pid)) << 32) | value);
            g_control.received.fetch_add(1);
            h->seen_generation.store(kForceApply);
            // Wake mall_fd() users too (write(2) is async-signal-safe; the change path drains it).
            const uint64_t one = 1;
            if (h->user_event_fd >= 0) (void)!::write(h->user_event_fd, &one, sizeof one);
        }
    }
    g_control.in_handler.fetch_sub(1);
    errno = saved_errno;
}

// What a control request is judged against, read once under state_mu: the applied allocation,
// the cpus requests stay within (malld's last, else the opening affinity), whether malld's page
// allows requests, and malld's thread count (0 when malld never gave one).
struct ControlView {
    mall_alloc_t current;
    mall::CpuSet bound;
    bool allowed = false;
    int malld_threads = 0;
};

ControlView control_view(mall_handle *m) {
    ControlView v;
    std::lock_guard<std::mutex> lock(m->state_mu);
    v.current = m->applied;
    v.bound = mall::CpuSet::from_mask(m->has_malld_cpus ? m->malld_cpus : m->control_bound);
    v.allowed = (m->page_flags & mall::kPageFlagSignalControl) != 0;
    v.malld_threads = m->has_malld_cpus ? m->malld_threads : 0;
    return v;
}

// Rewrites the status record (under record_mu; the caller holds no lock of the handle's but
// possibly step_mu). One pwrite of the whole record: a reader compares seq with end.
void write_record_locked(mall_handle *m) {
    namespace sc = mall::signal_control;
    if (g_control.record_fd < 0) return;
    const ControlView view = control_view(m);
    const mall_alloc_t &current = view.current;
    const bool attached = m->attached.load(std::memory_order_acquire);
    const bool allowed = view.allowed;
    const mall::CpuSet bound = attached && !allowed ? mall::CpuSet() : view.bound;
    const mall::CpuSet cpus = current.ncpus > 0 ? mall::CpuSet::from_mask(current.mask)
                                                : mall::CpuSet::from_mask(m->control_bound);
    const int threads = current.ncpus > 0 ? mall_alloc_threads(&current) : cpus.count();
    const uint64_t seq = ++g_control.record_seq;
    std::memset(g_control.record, 0, sizeof g_control.record);
    std::snprintf(g_control.record, sizeof g_control.record,
                  "%s %d\nseq %llu\npid %ld\nsignal %d\napi %d.%d.%d\nmode %s\njob %s\nallowed %d\nbound %s\n"
                  "cpus %s\nthreads %d\nreceived %llu\nhandled %llu\nlast %x\nfrom %ld\nresult %s\nwhy %s\nend %llu\n",
                  sc::kRecordName, sc::kRecordFormat, static_cast<unsigned long long>(seq),
                  static_cast<long>(::getpid()), g_control.signal, MALL_API_VERSION_MAJOR, MALL_API_VERSION_MINOR,
                  MALL_API_VERSION_PATCH, attached ? "attached" : "detached",
                  attached ? m->job_name.load(std::memory_order_acquire) : "", allowed ? 1 : 0,
                  bound.to_string().c_str(), cpus.to_string().c_str(), threads,
                  static_cast<unsigned long long>(g_control.received.load()),
                  static_cast<unsigned long long>(g_control.handled), g_control.last_value,
                  static_cast<long>(g_control.last_from), g_control.last_result, g_control.last_why,
                  static_cast<unsigned long long>(seq));
    (void)!::pwrite(g_control.record_fd, g_control.record, sizeof g_control.record, 0);
}

// Records how a request ended and why (printf-style words), then rewrites the record.
void decide_request(mall_handle *m, uint64_t request, const char *result, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void decide_request(mall_handle *m, uint64_t request, const char *result, const char *fmt, ...) {
    try {
        std::lock_guard<std::mutex> lock(g_control.record_mu);
        ++g_control.handled;
        g_control.last_value = static_cast<uint32_t>(request & 0xffffffffu);
        g_control.last_from = static_cast<pid_t>(request >> 32);
        g_control.last_result = result;
        va_list ap;
        va_start(ap, fmt);
        std::vsnprintf(g_control.last_why, sizeof g_control.last_why, fmt, ap);
        va_end(ap);
        for (char *c = g_control.last_why; *c; ++c)
            if (*c == '\n') *c = ' ';
        write_record_locked(m);
    } catch (...) {
    }
}

}  // namespace

int control_enable(mall_handle *m, int control_signal, mall_error_t *err) {
    // One handle per process; a signal that already has a handler is someone else's.
    mall_handle *expected = nullptr;
    if (!g_control.owner.compare_exchange_strong(expected, m)) {
        set_error(err, "control by signal is already enabled by another mall handle of this process");
        return MALL_ERR_INVAL;
    }
    struct sigaction current {};
    ::sigaction(control_signal, nullptr, &current);
    const bool ours = (current.sa_flags & SA_SIGINFO) && current.sa_sigaction == control_handler;
    if (!ours && ((current.sa_flags & SA_SIGINFO) || (current.sa_handler != SIG_DFL && current.sa_handler != SIG_IGN))) {
        g_control.owner.store(nullptr);
        set_error(err, "signal %d already has a handler in this process; choose another real-time signal "
                       "(MALL_SIGNAL_CONTROL=SIGRTMAX-N)", control_signal);
        return MALL_ERR_INVAL;
    }
    cpu_set_t bound;
    CPU_ZERO(&bound);
    (void)::sched_getaffinity(0, sizeof bound, &bound);
    // Nothing from the claim above to signal_control = true may throw (destroy() would
    // then leave the claim behind): the mask is built in place, without allocating.
    for (int c = 0; c < CPU_SETSIZE && c < MALL_MAX_CPUS; ++c)
        if (CPU_ISSET(c, &bound)) m->control_bound[c / 64] |= uint64_t{1} << (c % 64);
    g_control.request.store(0);
    if (!ours) g_control.previous = current;
    g_control.signal = control_signal;
    struct sigaction sa {};
    sa.sa_sigaction = control_handler;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    ::sigaction(control_signal, &sa, nullptr);
    m->signal_control = true;
    static std::once_flag fork_hook;
    std::call_once(fork_hook, [] { (void)::pthread_atfork(nullptr, nullptr, control_after_fork_in_child); });
    std::lock_guard<std::mutex> lock(g_control.record_mu);
    if (g_control.record_fd < 0) {
        g_control.record_fd = static_cast<int>(::syscall(SYS_memfd_create, mall::signal_control::kRecordName, MFD_CLOEXEC));
        if (g_control.record_fd >= 0 &&
            ::ftruncate(g_control.record_fd, static_cast<off_t>(mall::signal_control::kRecordSize)) != 0) {
            ::close(g_control.record_fd);
            g_control.record_fd = -1;
        }
    }
    g_control.handled = 0;
    g_control.last_value = 0;
    g_control.last_from = 0;
    g_control.last_result = "none";
    g_control.last_why[0] = '\0';
    write_record_locked(m);
    return MALL_SUCCESS;
}

bool control_release(mall_handle *m) {
    if (!m->signal_control || g_control.owner.load() != m) return false;
    // No handler may still use this handle: unhook it, wait for a running one (bounded), and
    // leave the signal ignored rather than at its default, which would end the process.
    g_control.owner.store(nullptr);
    for (int i = 0; i < 100000 && g_control.in_handler.load() != 0; ++i) sched_yield();
    // A handler still inside (its thread descheduled for long) may yet touch the handle and
    // write to its eventfd: leak both rather than free them under it.
    const bool leak = g_control.in_handler.load() != 0;
    struct sigaction restore = g_control.previous;
    if (!(restore.sa_flags & SA_SIGINFO) && restore.sa_handler == SIG_DFL) restore.sa_handler = SIG_IGN;
    ::sigaction(g_control.signal, &restore, nullptr);
    g_control.request.store(0);
    std::lock_guard<std::mutex> lock(g_control.record_mu);
    if (g_control.record_fd >= 0) ::close(g_control.record_fd);  // mallctl: "not enabled"
    g_control.record_fd = -1;
    return leak;
}

bool control_request_pending(const mall_handle *m) {
    return m->signal_control && g_control.owner.load() == m && g_control.request.load() != 0;
}

uint64_t control_take_request() { return g_control.request.exchange(0); }

// Applies a control request (called under step_mu): true when it changed the allocation.
// Never attached: within the cpus the process had at mall_open(). Attached: only when malld lets
// the job take signals (mallctl set JOB --signal-control on), within malld's published cpus
// (narrowing); malld's next generation replaces it. Once attached, malld's last cpus bound it.
bool apply_control_request(mall_handle *m, uint64_t request) {
    namespace sc = mall::signal_control;
    const auto decoded = sc::decode(static_cast<uint32_t>(request & 0xffffffffu));
    if (!decoded) {
        decide_request(m, request, "refused", "the value %#x is not a mall request", static_cast<unsigned>(request));
        return false;
    }
    const ControlView view = control_view(m);
    const mall_alloc_t &current = view.current;
    const mall::CpuSet &bound = view.bound;
    const int malld_threads = view.malld_threads;
    const char *job = m->job_name.load(std::memory_order_acquire);
    if (m->attached.load(std::memory_order_acquire) && !view.allowed) {
        decide_request(m, request, "refused",
                       "attached to malld as job %s, whose allocation wins: use `mallctl set %s --threads N` or "
                       "`--cpus LIST`, or let the job take signals with `mallctl set %s --signal-control on`",
                       job, job, job);
        return false;
    }
    if (m->attached.load(std::memory_order_acquire) && !m->has_malld_cpus) {
        decide_request(m, request, "refused", "attached to malld as job %s but no allocation was applied yet", job);
        return false;
    }
    mall::CpuSet cpus = current.ncpus > 0 ? mall::CpuSet::from_mask(current.mask) : bound;
    if (decoded->op == sc::Op::Range) cpus = mall::CpuSet::range(decoded->first_cpu, decoded->first_cpu + decoded->cpu_count - 1);
    if (!bound.contains(cpus)) {
        decide_request(m, request, "refused", "cpus %s are not all within %s, the cpus this process may use (%s)",
                       cpus.to_string().c_str(), bound.to_string().c_str(),
                       m->has_malld_cpus ? "malld's allocation" : "its affinity at mall_open()");
        return false;
    }
    if (decoded->threads > cpus.count()) {
        decide_request(m, request, "refused", "%d threads exceed the %d cpus (%s) of this process", decoded->threads,
                       cpus.count(), cpus.to_string().c_str());
        return false;
    }
    // Under malld (or after it), malld's thread count is a bound too: a request only narrows.
    if (malld_threads > 0 && decoded->threads > malld_threads) {
        decide_request(m, request, "refused", "%d threads exceed the %d malld gave this process", decoded->threads,
                       malld_threads);
        return false;
    }
    mall_alloc_t &next = m->scratch;
    next = mall_alloc_t{};
    next.generation = current.generation;  // malld's generation (0 without malld): unchanged
    next.ncpus = cpus.count();
    next.nthreads = decoded->threads > 0 ? decoded->threads : next.ncpus;
    if (malld_threads > 0 && next.nthreads > malld_threads) next.nthreads = malld_threads;
    cpus.to_mask(next.mask);
    std::snprintf(next.cpus, sizeof next.cpus, "%s", cpus.to_string().c_str());
    {
        std::lock_guard<std::mutex> lock(m->state_mu);
        m->applied = next;
    }
    run_callbacks(m, next);
    repin_bound_threads(m, next);
    pin_every_thread(cpu_set_of(next.mask));
    m->control_overrode = true;
    decide_request(m, request, "applied", "%d threads on cpus %s", next.nthreads, next.cpus);
    return true;
}

void control_request_superseded(mall_handle *m, uint64_t request, uint64_t generation) {
    decide_request(m, request, "superseded",
                   "malld published generation %llu, which replaces any request made before it",
                   static_cast<unsigned long long>(generation));
}

// After finish_change(): a request that arrived meanwhile makes the next mall_step() look again.
void recheck_control_request(mall_handle *m) {
    if (g_control.owner.load() == m && g_control.request.load() != 0) m->seen_generation.store(kForceApply);
}

void refresh_record(mall_handle *m) {
    if (!m->signal_control) return;
    try {
        std::lock_guard<std::mutex> lock(g_control.record_mu);
        write_record_locked(m);
    } catch (...) {
    }
}

}  // namespace mall::client
