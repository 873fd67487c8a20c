// SPDX-License-Identifier: BSD-3-Clause
// process_effects.cpp — see process_effects.hpp. The tables (callbacks, bound threads) are fixed
// arrays in the handle: registering never allocates, and a full table says MALL_ERR_FULL.
#include "process_effects.hpp"

#include <dirent.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace mall::client {

void repin_bound_threads(mall_handle *m, const mall_alloc_t &alloc) {
    std::lock_guard<std::mutex> lock(m->threads_mu);
    if (m->nthreads == 0) return;
    cpu_set_t set = cpu_set_of(alloc.mask);
    pid_t pid = ::getpid();
    int kept = 0;
    for (int i = 0; i < m->nthreads; ++i) {
        pid_t tid = m->threads[i];
        // tgkill(.., 0) checks that the tid is still a thread of this process: a tid of an exited
        // thread may be reused by another process, which must never be re-pinned.
        if (::syscall(SYS_tgkill, pid, tid, 0) != 0 && errno == ESRCH) continue;
        if (::sched_setaffinity(tid, sizeof set, &set) != 0 && errno == ESRCH) continue;
        m->threads[kept++] = tid;
    }
    m->nthreads = kept;
}

void pin_every_thread(const cpu_set_t &set) {
    DIR *dir = ::opendir("/proc/self/task");
    if (dir == nullptr) return;
    while (dirent *e = ::readdir(dir)) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        (void)::sched_setaffinity(static_cast<pid_t>(std::strtol(e->d_name, nullptr, 10)), sizeof set, &set);
    }
    ::closedir(dir);
}

void run_callbacks(mall_handle *m, const mall_alloc_t &alloc) {
    ResizeCallback callbacks[kMaxCallbacks];
    int ncallbacks;
    {
        std::lock_guard<std::mutex> lock(m->callbacks_mu);
        ncallbacks = m->ncallbacks;
        std::copy(m->callbacks, m->callbacks + ncallbacks, callbacks);
    }
    for (int i = 0; i < ncallbacks; ++i) {
        try {
            callbacks[i].fn(&alloc, callbacks[i].arg);
        } catch (...) {
            // A C++ callback that throws must not unwind into the caller's C frames.
        }
    }
}

int bind_current_thread(mall_handle *m) {
    pid_t tid = current_tid();
    std::lock_guard<std::mutex> lock(m->threads_mu);
    bool known = std::find(m->threads, m->threads + m->nthreads, tid) != m->threads + m->nthreads;
    if (!known) {
        if (m->nthreads >= kMaxBoundThreads) return MALL_ERR_FULL;
        m->threads[m->nthreads++] = tid;
    }
    uint64_t mask[MALL_MAX_CPUS / 64];
    int ncpus;
    {
        std::lock_guard<std::mutex> state(m->state_mu);
        ncpus = m->applied.ncpus;
        std::memcpy(mask, m->applied.mask, sizeof mask);
    }
    if (ncpus > 0) {
        cpu_set_t set = cpu_set_of(mask);
        if (::sched_setaffinity(0, sizeof set, &set) != 0) return MALL_ERR_SYSTEM;
    }
    return MALL_SUCCESS;
}

int unbind_current_thread(mall_handle *m) {
    pid_t tid = current_tid();
    std::lock_guard<std::mutex> lock(m->threads_mu);
    pid_t *end = std::remove(m->threads, m->threads + m->nthreads, tid);
    m->nthreads = static_cast<int>(end - m->threads);
    return MALL_SUCCESS;
}

}  // namespace mall::client
