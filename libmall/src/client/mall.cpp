// SPDX-License-Identifier: BSD-3-Clause
// mall.cpp — libmall, the training-process side of mall: implements every function of mall/mall.h.
// Contract: mall_step() costs one acquire load when nothing changed (the page pointer always points
// at a readable mapping, attached or not); a monitor thread per handle keeps the connection to
// malld (Notify -> mall_fd, hang-up -> reconnect with backoff, progress totals); nothing escapes an
// extern "C" function, nothing exits, aborts, raises a signal or blocks a step for long.
#include "mall/mall.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <forward_list>
#include <mutex>
#include <new>
#include <string>
#include <thread>

#include "common/ctl_client.hpp"
#include "common/protocol.hpp"
#include "common/quiet_thread.hpp"
#include "common/shared_page.hpp"
#include "common/signal_control.hpp"
#include "common/cpuset.hpp"
#include "common/unix_socket.hpp"
#include "attach.hpp"
#include "control_by_signal.hpp"
#include "error_text.hpp"
#include "handle.hpp"
#include "monitor.hpp"
#include "notify.hpp"
#include "process_effects.hpp"

namespace mall::client {

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

// Parses $name as an integer in [min, max]; unset or empty gives fallback. False when malformed.
bool env_int(const char *name, long min, long max, long fallback, long *out) {
    const char *text = std::getenv(name);
    if (!text || !*text) {
        *out = fallback;
        return true;
    }
    errno = 0;
    char *end = nullptr;
    long value = std::strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || value < min || value > max) return false;
    *out = value;
    return true;
}




__attribute__((noinline, cold)) int apply_change(mall_handle *m) {
    std::lock_guard<std::mutex> step_lock(m->step_mu);
    mall_alloc_t &snapshot = m->scratch;
    bool consistent;
    uint32_t page_flags = 0;
    {
        std::lock_guard<std::mutex> lock(m->conn_mu);
        consistent = mall::page_read(m->page, &snapshot, &page_flags);
    }
    const bool control_pending = control_request_pending(m);
    // Never attached, the page is a zero page (no magic): generation 0 for a control request.
    if (!consistent && control_pending && !m->attached.load(std::memory_order_acquire)) {
        snapshot = mall_alloc_t{};
        consistent = true;
    }
    if (!consistent) {
        // The private zero page of a handle never attached, with a stray force (a control signal
        // whose request a step took already): back to the fast path. A torn page: next step.
        if (!m->attached.load(std::memory_order_acquire) &&
            __atomic_load_n(&m->page->magic, __ATOMIC_RELAXED) != mall::kPageMagic)
            finish_change(m, page_generation(m->page));
        return MALL_NOUPDT;
    }
    uint64_t generation = snapshot.generation;
    // Does the page hold what was applied last (same generation, and malld's same cpus, thread
    // count and flags)? A control request applies only then; a later page replaces it.
    bool page_unchanged;
    {
        std::lock_guard<std::mutex> lock(m->state_mu);
        page_unchanged = generation == m->applied.generation &&
                         (!m->has_malld_cpus ||
                          (std::memcmp(snapshot.mask, m->malld_cpus, sizeof m->malld_cpus) == 0 &&
                           mall_alloc_threads(&snapshot) == m->malld_threads && page_flags == m->page_flags));
    }
    if (control_pending) {
        // A control request, unless malld published something new (that wins: the request is dropped).
        const uint64_t request = control_take_request();
        if (page_unchanged) {
            const bool changed = apply_control_request(m, request);
            finish_change(m, generation);
            recheck_control_request(m);
            return changed ? MALL_SUCCESS : MALL_NOUPDT;
        }
        control_request_superseded(m, request, generation);
    }
    if (generation == m->seen_generation.load(std::memory_order_relaxed)) return MALL_NOUPDT;
    if (page_unchanged && m->has_malld_cpus) {
        // Forced (a control signal's handler stored its marker after a step took the request, or
        // a re-attach), but the page holds what was applied: ack it again (a re-attached malld may
        // wait for it), change nothing, and go back to the fast path.
        try {
            send_nonblocking(m, mall::proto::Type::Ack, {{"generation", generation}});
        } catch (...) {
        }
        finish_change(m, generation);
        recheck_control_request(m);
        return MALL_NOUPDT;
    }

    if (snapshot.ncpus <= 0) {
        // Nothing a process can run on: acknowledge it but keep the last allocation.
        try {
            send_nonblocking(m, mall::proto::Type::Ack, {{"generation", generation}});
        } catch (...) {
        }
        finish_change(m, generation);
        return MALL_NOUPDT;
    }

    {
        std::lock_guard<std::mutex> lock(m->state_mu);
        m->applied = snapshot;
        std::memcpy(m->malld_cpus, snapshot.mask, sizeof m->malld_cpus);
        m->has_malld_cpus = true;
        m->malld_threads = mall_alloc_threads(&snapshot);
        m->page_flags = page_flags;
    }
    run_callbacks(m, snapshot);
    repin_bound_threads(m, snapshot);
    if (m->control_overrode) {
        // A signal request had pinned every thread: malld's allocation replaces it for them all.
        pin_every_thread(cpu_set_of(snapshot.mask));
        m->control_overrode = false;
    }
    try {
        send_nonblocking(m, mall::proto::Type::Ack, {{"generation", generation}});
    } catch (...) {
        // Out of memory: malld's ack timeout covers the missing ack.
    }
    finish_change(m, generation);
    recheck_control_request(m);
    refresh_record(m);
    return MALL_SUCCESS;
}

// A notification signal's name or number: SIGUSR1, SIGUSR2, SIGRTMIN, SIGRTMIN+N, SIGRTMAX-N,
// SIGRTMAX (the "SIG" prefix may be left out) or its number; only those signals are allowed (the
// others have meanings of their own). 0 with *why when not.
int parse_notify_signal(const std::string &text, std::string *why) {
    std::string s = text;
    if (s.rfind("SIG", 0) == 0) s = s.substr(3);
    auto number = [](const std::string &digits, long *out) {
        if (digits.empty() || digits.size() > 4) return false;
        for (char c : digits)
            if (c < '0' || c > '9') return false;
        *out = std::strtol(digits.c_str(), nullptr, 10);
        return true;
    };
    long sig = -1, n = 0;
    if (s == "USR1") sig = SIGUSR1;
    else if (s == "USR2") sig = SIGUSR2;
    else if (s == "RTMIN") sig = SIGRTMIN;
    else if (s == "RTMAX") sig = SIGRTMAX;
    else if (s.rfind("RTMIN+", 0) == 0 && number(s.substr(6), &n)) sig = SIGRTMIN + n;
    else if (s.rfind("RTMAX-", 0) == 0 && number(s.substr(6), &n)) sig = SIGRTMAX - n;
    else if (!number(s, &sig)) sig = -1;
    if (sig == SIGUSR1 || sig == SIGUSR2 || (sig >= SIGRTMIN && sig <= SIGRTMAX)) return static_cast<int>(sig);
    *why = "'" + text + "' is not SIGUSR1, SIGUSR2 or a real-time signal SIGRTMIN..SIGRTMAX (SIGRTMIN+N, SIGRTMAX-N, " +
           std::to_string(SIGRTMIN) + ".." + std::to_string(SIGRTMAX) + " here)";
    return 0;
}

}  // namespace mall::client

// -------------------------------------------------------------------------------------------------
// The C API

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
    // The options of API 0.3.0 (a caller built against a later header may pass a larger struct
    // whose extra bytes must then be zero: options this library does not know are refused).
    constexpr size_t kKnownSize = sizeof(mall_open_options_t);  // with its tail padding
    if (!options || options->size < kKnownSize) {
        set_error(err, "mall_open_ex: options must be set up with MALL_OPEN_OPTIONS_INIT (size %zu or more)", kKnownSize);
        return MALL_ERR_INVAL;
    }
    for (size_t i = kKnownSize; i < options->size; ++i) {
        if (reinterpret_cast<const unsigned char *>(options)[i] != 0) {
            set_error(err, "mall_open_ex: options of a newer libmall are set (byte %zu); this library is API %d.%d.%d",
                      i, MALL_API_VERSION_MAJOR, MALL_API_VERSION_MINOR, MALL_API_VERSION_PATCH);
            return MALL_ERR_INVAL;
        }
    }
    if (options->flags != 0) {
        set_error(err, "mall_open_ex: unknown flags 0x%x (none are defined in API %d.%d)", options->flags,
                  MALL_API_VERSION_MAJOR, MALL_API_VERSION_MINOR);
        return MALL_ERR_INVAL;
    }
    const char *socket_path = options->socket_path;
    mall_handle *m = nullptr;
    try {
        // The notification signal: the option, else $MALL_NOTIFY_SIGNAL, else none.
        int notify_signal = 0;
        if (options->notify_signal > 0) {
            std::string why;
            notify_signal = parse_notify_signal(std::to_string(options->notify_signal), &why);
            if (notify_signal == 0) {
                set_error(err, "mall_open_ex: notify_signal %s", why.c_str());
                return MALL_ERR_INVAL;
            }
        } else if (options->notify_signal == 0) {
            const char *env = std::getenv("MALL_NOTIFY_SIGNAL");
            if (env && *env) {
                std::string why;
                notify_signal = parse_notify_signal(env, &why);
                if (notify_signal == 0) {
                    set_error(err, "MALL_NOTIFY_SIGNAL: %s; unset it or name one of those", why.c_str());
                    return MALL_ERR_INVAL;
                }
            }
        } else if (options->notify_signal != -1) {
            set_error(err, "mall_open_ex: notify_signal must be -1 (none), 0 ($MALL_NOTIFY_SIGNAL) or a signal number");
            return MALL_ERR_INVAL;
        }
        // Control by signal: the option, else $MALL_SIGNAL_CONTROL (1 = the default signal), else off.
        int control_signal = 0;
        {
            std::string text;
            if (options->control_signal > 0) {
                text = std::to_string(options->control_signal);
            } else if (options->control_signal == 0) {
                const char *env = std::getenv("MALL_SIGNAL_CONTROL");
                text = env ? env : "";
                if (text == "0") text.clear();
                if (text == "1") text = "SIGRTMAX-7";
            } else if (options->control_signal != -1) {
                set_error(err, "mall_open_ex: control_signal must be -1 (off), 0 ($MALL_SIGNAL_CONTROL) or a real-time signal");
                return MALL_ERR_INVAL;
            }
            if (!text.empty()) {
                std::string why;
                control_signal = parse_notify_signal(text, &why);
                if (control_signal == SIGUSR1 || control_signal == SIGUSR2) {
                    control_signal = 0;
                    why = "'" + text + "' is not a real-time signal (a standard signal would drop queued values)";
                }
                if (control_signal == 0) {
                    set_error(err, "MALL_SIGNAL_CONTROL (or control_signal): %s; use 1 for SIGRTMAX-7", why.c_str());
                    return MALL_ERR_INVAL;
                }
                if (control_signal == notify_signal) {
                    set_error(err, "the control signal %d is also the notification signal: choose two", control_signal);
                    return MALL_ERR_INVAL;
                }
            }
        }
        // The attach request, from the environment the launcher set.
        nlohmann::json attach_body = nlohmann::json::object();
        const char *job = std::getenv("MALL_JOB_ID");
        if (job && *job) {
            if (auto bad = mall::proto::invalid_job_name(job)) {
                set_error(err, "MALL_JOB_ID is not a valid job name: %s", bad->c_str());
                return MALL_ERR_INVAL;
            }
            attach_body["job"] = job;
        } else {
            long min = 1, max = 0;
            if (!env_int("MALL_MIN", 1, MALL_MAX_CPUS, 1, &min)) {
                set_error(err, "MALL_MIN must be a whole number from 1 to %d (or unset)", MALL_MAX_CPUS);
                return MALL_ERR_INVAL;
            }
            if (!env_int("MALL_MAX", 0, MALL_MAX_CPUS, 0, &max)) {
                set_error(err, "MALL_MAX must be a whole number from 0 (whole pool) to %d (or unset)", MALL_MAX_CPUS);
                return MALL_ERR_INVAL;
            }
            if (max != 0 && max < min) {
                set_error(err, "MALL_MAX (%ld) is below MALL_MIN (%ld)", max, min);
                return MALL_ERR_INVAL;
            }
            attach_body["min"] = min;
            if (max != 0) attach_body["max"] = max;  // no "max" asks for up to the whole pool
        }

        long attach_timeout_ms = 0;
        if (!env_int("MALL_ATTACH_TIMEOUT_MS", 0, kMaxAttachTimeoutMs, kDefaultAttachTimeout.count(),
                     &attach_timeout_ms)) {
            set_error(err, "MALL_ATTACH_TIMEOUT_MS must be a whole number of milliseconds from 0 to %ld (or unset)",
                      kMaxAttachTimeoutMs);
            return MALL_ERR_INVAL;
        }

        m = new (std::nothrow) mall_handle();
        if (!m) {
            set_error(err, "mall_open: out of memory");
            return MALL_ERR_NOMEM;
        }
        m->attach_timeout = milliseconds(attach_timeout_ms);
        m->notify_signal = notify_signal;
        if (control_signal > 0) {
            if (int rc = control_enable(m, control_signal, err); rc != MALL_SUCCESS) {
                delete m;
                return rc;
            }
        }
        m->socket_path = mall::resolve_socket_path(socket_path ? socket_path : "");
        m->attach_body = std::move(attach_body);

        // Until attached, the page is a private zero page (generation 0 = nothing to apply).
        void *zero = ::mmap(nullptr, mall::kSharedPageSize, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (zero == MAP_FAILED) {
            int e = errno;
            set_error(err, "mall_open: cannot map a page: %s", std::strerror(e));
            destroy(m);  // also unhooks the control signal
            return e == ENOMEM ? MALL_ERR_NOMEM : MALL_ERR_SYSTEM;
        }
        m->page = static_cast<const mall::SharedPage *>(zero);
        m->user_event_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        m->stop_event_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (m->user_event_fd < 0 || m->stop_event_fd < 0) {
            int e = errno;
            set_error(err, "mall_open: cannot create an eventfd: %s", std::strerror(e));
            destroy(m);
            return e == ENOMEM ? MALL_ERR_NOMEM : MALL_ERR_SYSTEM;
        }

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

MALL_EXPORT int mall_step(mall_t *m) {
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
