// SPDX-License-Identifier: BSD-3-Clause
// mall.cpp — the C API of libmall (mall/mall.h), the training-process side of mall: each extern "C"
// function checks its arguments and hands the work to a file of src/client/: handle.hpp (the handle
// they share), open_config (options and environment), lifecycle (create, destroy), attach (the
// connection and the page), monitor (the background thread), notify (mall_fd, notification signal),
// change (mall_step's change path), control_by_signal, process_effects (callbacks, affinity).
// Contract: mall_step() costs one acquire load and one compare when nothing changed, inlined here
// (no system call, no lock, no allocation, no call into another file): the page pointer always
// points at a readable mapping, attached or not; only a difference calls the change path
// (change.cpp). Nothing escapes an extern "C" function (every exception becomes a MALL_ERR_* code),
// nothing exits, aborts, raises a signal or blocks a step for long. Only the mall_* functions are
// exported (cmake/libmall.map).
#include "mall/mall.h"

#include <exception>
#include <mutex>
#include <new>
#include <string>
#include <utility>

#include "attach.hpp"
#include "change.hpp"
#include "error_text.hpp"
#include "handle.hpp"
#include "lifecycle.hpp"
#include "monitor.hpp"
#include "open_config.hpp"
#include "process_effects.hpp"

using namespace mall::client;

extern "C" {

MALL_EXPORT int mall_get_api_version(void) { return MALL_API_VERSION; }

MALL_EXPORT const char *mall_strerror(int rc) {
    switch (rc) {
        case MALL_SUCCESS: return "success";
        case MALL_NOUPDT: return "no update: the allocation did not change";
        case MALL_ERR_INVAL: return "invalid argument";
        case MALL_ERR_NODAEMON: return "no node manager (malld) answered; the handle is detached";
        case MALL_ERR_DENIED: return "the node manager refused the request";
        case MALL_ERR_NOJOB: return "no registration for this process and self-registration is off";
        case MALL_ERR_PROTOCOL: return "the node manager sent something this library cannot read";
        case MALL_ERR_NOMEM: return "out of memory";
        case MALL_ERR_SYSTEM: return "a system call failed";
        case MALL_ERR_DETACHED: return "the handle is not connected to a node manager";
        case MALL_ERR_VERSION: return "the node manager speaks an incompatible protocol version";
        case MALL_ERR_FULL: return "a fixed-size table is full";
        default: return "unknown mall error";
    }
}

MALL_EXPORT int mall_open(const char *socket_path, mall_t **out, mall_error_t *err) {
    mall_open_options_t options = MALL_OPEN_OPTIONS_INIT;
    options.socket_path = socket_path;
    return mall_open_ex(&options, out, err);
}

MALL_EXPORT int mall_open_ex(const mall_open_options_t *options, mall_t **out, mall_error_t *err) {
    clear_error(err);
    if (!out) {
        set_error(err, "mall_open: out must point at a mall_t * to fill");
        return MALL_ERR_INVAL;
    }
    *out = nullptr;
    if (int rc = check_open_options(options, err); rc != MALL_SUCCESS) return rc;
    mall_handle *m = nullptr;
    try {
        OpenConfig config;
        if (int rc = read_open_config(options, &config, err); rc != MALL_SUCCESS) return rc;
        if (int rc = create_handle(std::move(config), options->socket_path, &m, err); rc != MALL_SUCCESS) return rc;
        // The first attach is mall_open's own (bounded by $MALL_ATTACH_TIMEOUT_MS); the monitor
        // retries after a failure and follows the connection from then on.
        std::string why;
        int rc = attach_once(m, m->attach_timeout, &why);
        if (rc != MALL_SUCCESS) {
            set_error(err, "%s", why.c_str());
            m->first_retry = rc == MALL_ERR_NODAEMON ? kFirstBackoff : next_backoff(rc, kFirstBackoff);
        }
        if (!start_monitor(m)) {
            if (rc == MALL_SUCCESS)
                set_error(err, "mall_open: cannot start the background thread; changes still apply at "
                               "mall_step() but a malld restart will not be followed");
            rc = MALL_ERR_SYSTEM;
        }
        *out = m;
        return rc;
    } catch (const std::bad_alloc &) {
        if (m) destroy(m);
        set_error(err, "mall_open: out of memory");
        return MALL_ERR_NOMEM;
    } catch (const std::exception &e) {
        if (m) destroy(m);
        set_error(err, "mall_open: %s", e.what());
        return MALL_ERR_SYSTEM;
    } catch (...) {
        if (m) destroy(m);
        set_error(err, "mall_open: unexpected error");
        return MALL_ERR_SYSTEM;
    }
}

// Aligned to a cache line so that its fast path (31 bytes, up to the first ret) lies in one 32-byte
// fetch window wherever the linker puts it: measured, a fast path split over two windows costs
// ~0.3 ns (15%) per step on this project's CI machines (bench_step, BM_StepNoChange*).
MALL_EXPORT __attribute__((aligned(64))) int mall_step(mall_t *m) {
    if (__builtin_expect(m == nullptr, 0)) return MALL_ERR_INVAL;
    uint64_t g = page_generation(m->page);
    if (__builtin_expect(g == m->seen_generation.load(std::memory_order_relaxed), 1)) return MALL_NOUPDT;
    try {
        return apply_change(m);
    } catch (...) {
        return MALL_NOUPDT;  // e.g. a lock failing: try again at the next step
    }
}

MALL_EXPORT int mall_get_allocation(mall_t *m, mall_alloc_t *out) {
    if (!m || !out) return MALL_ERR_INVAL;
    try {
        std::lock_guard<std::mutex> lock(m->state_mu);
        *out = m->applied;
        return MALL_SUCCESS;
    } catch (...) {
        return MALL_ERR_SYSTEM;
    }
}

MALL_EXPORT int mall_on_resize_with_release(mall_t *m, mall_resize_fn fn, void *arg, mall_release_fn release) {
    if (!m || !fn) return MALL_ERR_INVAL;
    try {
        std::lock_guard<std::mutex> lock(m->callbacks_mu);
        if (m->ncallbacks >= kMaxCallbacks) return MALL_ERR_FULL;
        m->callbacks[m->ncallbacks++] = ResizeCallback{fn, arg, release};
        return MALL_SUCCESS;
    } catch (...) {
        return MALL_ERR_SYSTEM;
    }
}

MALL_EXPORT int mall_on_resize(mall_t *m, mall_resize_fn fn, void *arg) {
    return mall_on_resize_with_release(m, fn, arg, nullptr);
}

MALL_EXPORT int mall_bind_thread(mall_t *m) {
    if (!m) return MALL_ERR_INVAL;
    try {
        return bind_current_thread(m);
    } catch (...) {
        return MALL_ERR_SYSTEM;
    }
}

MALL_EXPORT int mall_unbind_thread(mall_t *m) {
    if (!m) return MALL_ERR_INVAL;
    try {
        return unbind_current_thread(m);
    } catch (...) {
        return MALL_ERR_SYSTEM;
    }
}

MALL_EXPORT int mall_fd(mall_t *m) {
    if (!m) return MALL_ERR_INVAL;
    return m->user_event_fd;
}

MALL_EXPORT int mall_report_progress(mall_t *m, uint64_t work_units) {
    if (!m) return MALL_ERR_INVAL;
    m->work_units.fetch_add(work_units, std::memory_order_relaxed);
    m->progress_calls.fetch_add(1, std::memory_order_relaxed);
    return MALL_SUCCESS;
}

MALL_EXPORT int mall_set_usage(mall_t *m, int ncpus) {
    if (!m || ncpus < 0 || ncpus > MALL_MAX_CPUS) return MALL_ERR_INVAL;
    try {
        m->usage_cap.store(ncpus);
        // Detached: the monitor sends it after the next attach.
        send_nonblocking(m, mall::proto::Type::Usage, {{"cpus_used", ncpus}});
        return MALL_SUCCESS;
    } catch (const std::bad_alloc &) {
        return MALL_ERR_NOMEM;  // the cap is kept: the monitor sends it at the next attach
    } catch (...) {
        return MALL_ERR_SYSTEM;
    }
}

MALL_EXPORT int mall_attached(mall_t *m) {
    if (!m) return MALL_ERR_INVAL;
    return m->attached.load(std::memory_order_acquire) ? MALL_SUCCESS : MALL_ERR_DETACHED;
}

MALL_EXPORT const char *mall_job_id(mall_t *m) {
    if (!m) return nullptr;
    return m->attached.load(std::memory_order_acquire) ? m->job_name.load(std::memory_order_acquire) : "";
}

MALL_EXPORT void mall_close(mall_t *m) {
    if (!m) return;
    try {
        destroy(m);
    } catch (...) {
        // join() failing (a deadlock would need mall_close from a callback): leak rather than crash.
    }
}

}  // extern "C"
