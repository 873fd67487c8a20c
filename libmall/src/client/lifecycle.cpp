// SPDX-License-Identifier: BSD-3-Clause
// lifecycle.cpp — see lifecycle.hpp. The order in create_handle is part of the contract: the
// control signal is claimed before anything that can fail for lack of resources, so that every
// later failure goes through destroy(), which releases it.
#include "lifecycle.hpp"

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
    } catch (...) {
        destroy(m);
        throw;
    }
    *out = m;
    return MALL_SUCCESS;
}

void destroy(mall_handle *m) {
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
