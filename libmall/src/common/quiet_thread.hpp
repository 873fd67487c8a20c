// SPDX-License-Identifier: BSD-3-Clause
// quiet_thread.hpp — the one way mall starts a thread: with every blockable signal blocked.
// Contract: start_quiet_thread(fn) returns a std::thread running fn whose signal mask blocks all
// signals (SIGKILL and SIGSTOP cannot be blocked; the synchronous faults SIGSEGV/SIGBUS/SIGFPE/
// SIGILL still reach the thread that caused them). The caller's own mask is unchanged when it
// returns, also when std::thread throws (std::system_error, as std::thread does).
// Why: a process-directed signal goes to any thread that does not block it. malld takes its stop
// signals through a signalfd, so a thread of its own that did not block them would die with the
// default action and take malld down without its shutdown (issue 12); libmall's threads live in a
// host process whose signal handlers must keep running on the host's threads, not ours.
#pragma once

#include <pthread.h>
#include <signal.h>

#include <thread>
#include <utility>

namespace mall {

template <typename Function>
std::thread start_quiet_thread(Function &&function) {
    sigset_t all, previous;
    sigfillset(&all);
    // A new thread inherits its creator's mask: block everything for the creation only.
    ::pthread_sigmask(SIG_BLOCK, &all, &previous);
    struct RestoreMask {
        const sigset_t *mask;
        ~RestoreMask() { ::pthread_sigmask(SIG_SETMASK, mask, nullptr); }
    } restore{&previous};
    return std::thread(std::forward<Function>(function));
}

}  // namespace mall
