// SPDX-License-Identifier: BSD-3-Clause
// lifecycle.cpp — see lifecycle.hpp. The order in create_handle is part of the contract: the
// control signal is claimed before anything that can fail for lack of resources, so that every
// later failure goes through destroy(), which releases it. The registry of open handles exists
// for the fork handlers only: they run in the forking thread, which never holds the registry lock
// while it calls out (create_handle and destroy hold it for a list insert or removal).
#include "lifecycle.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>
#include <utility>

#include "common/ctl_client.hpp"
#include "control_by_signal.hpp"
#include "error_text.hpp"

namespace mall::client {

namespace {

// The handle's page (a private zero page until attached: generation 0 = nothing to apply) and its
// two eventfds. MALL_SUCCESS, or NOMEM/SYSTEM with err's words.
int map_page_and_eventfds(mall_handle *m, mall_error_t *err) {
    void *zero = ::mmap(nullptr, mall::kSharedPageSize, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (zero == MAP_FAILED) {
        int e = errno;
        set_error(err, "mall_open: cannot map a page: %s", std::strerror(e));
        return e == ENOMEM ? MALL_ERR_NOMEM : MALL_ERR_SYSTEM;
    }
    m->page = static_cast<const mall::SharedPage *>(zero);
    m->user_event_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    m->stop_event_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (m->user_event_fd < 0 || m->stop_event_fd < 0) {
        int e = errno;
        set_error(err, "mall_open: cannot create an eventfd: %s", std::strerror(e));
        return e == ENOMEM ? MALL_ERR_NOMEM : MALL_ERR_SYSTEM;
    }
    return MALL_SUCCESS;
}

// The process's open handles (a list through prev_open/next_open). A plain pthread mutex: the
// fork handlers are C callbacks (nothing may throw there), and it is never destroyed.
pthread_mutex_t g_open_mu = PTHREAD_MUTEX_INITIALIZER;
mall_handle *g_open_head = nullptr;

// When forget_parent_state runs: in the fork handler, where the forking thread may be inside a
// resize callback and so hold the step lock, or at close, where no thread of the child holds it.
enum class DetachedAt { Fork, Close };

// Makes m a forked child's detached copy (see lifecycle.hpp). Runs in the child before fork()
// returns there, or at close in a child the fork handlers missed: single-threaded, and the locks
// of the handle may be held by threads that do not exist here, so they are made anew. All but the
// step lock at the fork: a resize callback that forked holds it in the forking thread, whose
// mall_step() releases it on the way out (in the child as in the parent: made anew, it would be
// unlocked while nobody holds it). A copy never takes it again (apply_change returns first for a
// copy; only an attach, which a copy never makes, takes it too), so one that a thread missing
// here held stays locked, unused; at close it is made anew, before it is freed.
void forget_parent_state(mall_handle *m, DetachedAt when) {
    m->forked_copy = true;
    new (&m->monitor) std::thread();  // the parent's monitor is not this process's to join or detach
    for (std::mutex *mu : {&m->conn_mu, &m->state_mu, &m->callbacks_mu, &m->threads_mu, &m->notify_mu})
        new (mu) std::mutex();
    if (when == DetachedAt::Close) new (&m->step_mu) std::mutex();
    m->attached.store(false, std::memory_order_relaxed);
    if (m->sock >= 0) ::close(m->sock);  // the child's reference only: the parent's connection stays
    m->sock = -1;
    m->nthreads = 0;  // the bound threads are the parent's
    m->signal_control = false;  // control_by_signal.cpp drops the control in a child too
    // Fresh eventfds at the same numbers: mall_fd() stays valid, and neither process can read or
    // write the other's (a close here must never stop the parent's monitor).
    for (int fd : {m->user_event_fd, m->stop_event_fd}) {
        if (fd < 0) continue;
        int fresh = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (fresh >= 0 && ::dup3(fresh, fd, O_CLOEXEC) >= 0) {
            ::close(fresh);
        } else {
            if (fresh >= 0) ::close(fresh);
            ::close(fd);  // at worst an unusable mall_fd(), never the parent's eventfd
            if (fd == m->user_event_fd) m->user_event_fd = -1;
            if (fd == m->stop_event_fd) m->stop_event_fd = -1;
        }
    }
    // A private zero page at the same address: the parent's malld publishes nothing here, and
    // mall_step() stays on its fast path ("no change"). Should the map fail, the shared page stays
    // and apply_change refuses to act on it in a copy.
    void *page = const_cast<mall::SharedPage *>(m->page);
    if (page != nullptr &&
        ::mmap(page, mall::kSharedPageSize, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == page)
        m->seen_generation.store(0, std::memory_order_relaxed);
}

void before_fork() { ::pthread_mutex_lock(&g_open_mu); }
void after_fork_in_parent() { ::pthread_mutex_unlock(&g_open_mu); }
void after_fork_in_child() {
    for (mall_handle *m = g_open_head; m != nullptr; m = m->next_open) forget_parent_state(m, DetachedAt::Fork);
    ::pthread_mutex_unlock(&g_open_mu);  // locked by this same thread in before_fork
}

void list_open_handle(mall_handle *m) {
    static std::once_flag fork_hooks;
    std::call_once(fork_hooks, [] { (void)::pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child); });
    ::pthread_mutex_lock(&g_open_mu);
    m->opener_pid = ::getpid();
    m->next_open = g_open_head;
    if (g_open_head) g_open_head->prev_open = m;
    g_open_head = m;
    ::pthread_mutex_unlock(&g_open_mu);
}

void unlist_open_handle(mall_handle *m) {
    ::pthread_mutex_lock(&g_open_mu);
    if (m->prev_open)
        m->prev_open->next_open = m->next_open;
    else if (g_open_head == m)
        g_open_head = m->next_open;
    if (m->next_open) m->next_open->prev_open = m->prev_open;
    m->prev_open = m->next_open = nullptr;
    ::pthread_mutex_unlock(&g_open_mu);
}

}  // namespace

int create_handle(OpenConfig &&config, const char *socket_path, mall_handle **out, mall_error_t *err) {
    mall_handle *m = new (std::nothrow) mall_handle();
    if (!m) {
        set_error(err, "mall_open: out of memory");
        return MALL_ERR_NOMEM;
    }
    m->attach_timeout = config.attach_timeout;
    m->notify_signal = config.notify_signal;
    try {
        if (config.control_signal > 0) {
            if (int rc = control_enable(m, config.control_signal, err); rc != MALL_SUCCESS) {
                delete m;  // nothing claimed, nothing mapped
                return rc;
            }
        }
        m->socket_path = mall::resolve_socket_path(socket_path ? socket_path : "");
        m->attach_body = std::move(config.attach_body);
        if (int rc = map_page_and_eventfds(m, err); rc != MALL_SUCCESS) {
            destroy(m);  // also unhooks the control signal
            return rc;
        }
        list_open_handle(m);
    } catch (...) {
        destroy(m);
        throw;
    }
    *out = m;
    return MALL_SUCCESS;
}

void destroy(mall_handle *m) {
    unlist_open_handle(m);
    // A forked child's copy frees only its own state (forget_parent_state made its monitor
    // unjoinable and its eventfds its own); one the fork handlers missed becomes such a copy now.
    if (!m->forked_copy && m->opener_pid != 0 && m->opener_pid != ::getpid())
        forget_parent_state(m, DetachedAt::Close);
    else if (m->forked_copy)
        new (&m->step_mu) std::mutex();  // left at the fork as it was, perhaps held by a thread not here
    if (m->monitor.joinable()) {
        eventfd_signal(m->stop_event_fd);
        m->monitor.join();
    }
    const bool leak = control_release(m);
    if (m->page) ::munmap(const_cast<mall::SharedPage *>(m->page), mall::kSharedPageSize);
    if (m->sock >= 0) ::close(m->sock);
    if (m->user_event_fd >= 0 && !leak) ::close(m->user_event_fd);
    if (m->stop_event_fd >= 0) ::close(m->stop_event_fd);
    // No callback can run any more (mall_step() must not race mall_close()): release their arguments.
    for (int i = 0; i < m->ncallbacks; ++i) {
        if (m->callbacks[i].release) m->callbacks[i].release(m->callbacks[i].arg);
    }
    if (!leak) delete m;
}

}  // namespace mall::client
