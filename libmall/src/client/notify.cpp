// SPDX-License-Identifier: BSD-3-Clause
// notify.cpp — see notify.hpp.
#include "notify.hpp"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/rules.hpp"

namespace mall::client {

namespace {

// Queues the notification signal to this process, once per generation, unless its disposition is
// the default (it would terminate the process: nothing is sent, and the user is told once) or
// ignore. Called under notify_mu. The value is the generation's low 31 bits.
void send_notify_signal(mall_handle *m, uint64_t generation) {
    if (m->notify_signal <= 0 || generation == m->notified_generation) return;
    struct sigaction current;
    if (::sigaction(m->notify_signal, nullptr, &current) != 0) return;
    if (!(current.sa_flags & SA_SIGINFO) && current.sa_handler == SIG_DFL) {
        if (!m->notify_warned) {
            m->notify_warned = true;
            char what[160];
            std::snprintf(what, sizeof what,
                          "not sending the notification signal %d: the process has no handler for it "
                          "(its default action would end the process)", m->notify_signal);
            tell_user(m, what);
        }
        return;
    }
    if (!(current.sa_flags & SA_SIGINFO) && current.sa_handler == SIG_IGN) return;
    union sigval value;
    value.sival_int = static_cast<int>(generation & 0x7fffffff);
    // Marked only once sent: without a handler yet, or with the queue full (EAGAIN), the monitor's
    // next re-check (500 ms) tries again.
    if (::sigqueue(::getpid(), m->notify_signal, value) == 0) m->notified_generation = generation;
}

}  // namespace

void signal_if_pending(mall_handle *m) {
    std::lock_guard<std::mutex> lock(m->notify_mu);
    // Written even when signaled already: the caller may have read the eventfd itself.
    const uint64_t generation = page_generation(m->page);
    if (generation != m->seen_generation.load(std::memory_order_acquire)) {
        eventfd_signal(m->user_event_fd);
        m->user_fd_signaled = true;
        send_notify_signal(m, generation);
    }
}

void finish_change(mall_handle *m, uint64_t generation) {
    std::lock_guard<std::mutex> lock(m->notify_mu);
    m->seen_generation.store(generation, std::memory_order_release);
    bool pending = page_generation(m->page) != generation;
    // A control signal's handler may have made the eventfd readable behind user_fd_signaled.
    if ((m->user_fd_signaled || m->signal_control) && !pending) {
        eventfd_drain(m->user_event_fd);
        m->user_fd_signaled = false;
    } else if (!m->user_fd_signaled && pending) {
        eventfd_signal(m->user_event_fd);
        m->user_fd_signaled = true;
    }
}

void tell_user(mall_handle *m, const char *what) {
    static const bool quiet = [] {
        const char *q = std::getenv(mall::kQuietEnv);
        return q != nullptr && q[0] == '1';
    }();
    if (quiet) return;
    std::string line = "mall: " + std::string(what) + " (job " + std::string(m->job_name.load()) +
                       ", malld at " + m->socket_path + ", pid " + std::to_string(::getpid()) + ")\n";
    ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
    (void)ignored;
}

}  // namespace mall::client
