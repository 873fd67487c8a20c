// SPDX-License-Identifier: BSD-3-Clause
// mall.hpp — a thin header-only C++ RAII wrapper over the C API in mall/mall.h.
// Contract: mall::Client owns one handle (closed on destruction, movable, not copyable); resize
// callbacks are std::functions called through one C trampoline, and whatever they throw is caught
// there so it never crosses the C boundary. Never throws except std::bad_alloc from on_resize().
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "mall/mall.h"

namespace mall {

class Client {
public:
    using ResizeFn = std::function<void(const mall_alloc_t &)>;

    struct Opened;

    // Opens a handle (see mall_open): socket_path "" means $MALL_SOCKET, then the default socket.
    // The result holds the client, the return code and the error words. The client holds a handle
    // whenever mall_open() made one (see its *out): on every error but MALL_ERR_INVAL,
    // MALL_ERR_NOMEM and a MALL_ERR_SYSTEM from making the handle, it stays detached and keeps
    // trying. Without a handle (test with `if (client)`), its calls return MALL_ERR_INVAL.
    static Opened open(const std::string &socket_path = "");
    // The same with mall_open_ex()'s options (notify_signal, control_signal; since API 0.3.0).
    static Opened open(const mall_open_options_t &options);

    Client() = default;
    Client(Client &&other) noexcept { swap(other); }
    Client &operator=(Client &&other) noexcept {
        if (this != &other) {
            Client gone(std::move(other));
            swap(gone);
        }
        return *this;
    }
    Client(const Client &) = delete;
    Client &operator=(const Client &) = delete;
    ~Client() { mall_close(handle_); }  // before callbacks_ goes: no call can come after this

    // MALL_SUCCESS when a new allocation was applied, MALL_NOUPDT otherwise (see mall_step).
    int step() noexcept { return mall_step(handle_); }

    // The allocation last applied by step() (generation 0 and ncpus 0 before the first).
    mall_alloc_t allocation() const noexcept {
        mall_alloc_t alloc{};
        mall_get_allocation(handle_, &alloc);
        return alloc;
    }

    // Adds a callback run by step() on each new allocation, in registration order. Exceptions it
    // throws are caught and counted (callback_failures()). Do not call it from a callback.
    int on_resize(ResizeFn fn) {
        if (!handle_ || !fn) return MALL_ERR_INVAL;
        if (!callbacks_) {
            auto table = std::make_unique<Callbacks>();
            int rc = mall_on_resize(handle_, &Client::trampoline, table.get());
            if (rc != MALL_SUCCESS) return rc;
            callbacks_ = std::move(table);
        }
        std::lock_guard<std::mutex> lock(callbacks_->mutex);
        callbacks_->fns.push_back(std::make_shared<ResizeFn>(std::move(fn)));
        return MALL_SUCCESS;
    }

    int bind_thread() noexcept { return mall_bind_thread(handle_); }
    int unbind_thread() noexcept { return mall_unbind_thread(handle_); }
    int fd() const noexcept { return mall_fd(handle_); }
    int report_progress(uint64_t work_units) noexcept { return mall_report_progress(handle_, work_units); }
    bool attached() const noexcept { return mall_attached(handle_) == MALL_SUCCESS; }
    std::string job_id() const {
        const char *id = mall_job_id(handle_);
        return id ? id : "";
    }
    // How many times a callback threw (the exception itself is dropped at the C boundary).
    uint64_t callback_failures() const noexcept {
        if (!callbacks_) return 0;
        std::lock_guard<std::mutex> lock(callbacks_->mutex);
        return callbacks_->failures;
    }

    mall_t *get() const noexcept { return handle_; }
    explicit operator bool() const noexcept { return handle_ != nullptr; }

private:
    struct Callbacks {
        mutable std::mutex mutex;
        std::vector<std::shared_ptr<ResizeFn>> fns;
        uint64_t failures = 0;
    };

    explicit Client(mall_t *handle) : handle_(handle) {}

    void swap(Client &other) noexcept {
        std::swap(handle_, other.handle_);
        std::swap(callbacks_, other.callbacks_);
    }

    // The one C callback: runs the std::functions on a snapshot of the list, so a callback may
    // add another without deadlocking, and nothing thrown escapes into the C library.
    static void trampoline(const mall_alloc_t *alloc, void *arg) noexcept {
        auto *table = static_cast<Callbacks *>(arg);
        try {
            std::vector<std::shared_ptr<ResizeFn>> fns;
            {
                std::lock_guard<std::mutex> lock(table->mutex);
                fns = table->fns;
            }
            for (const auto &fn : fns) {
                try {
                    (*fn)(*alloc);
                } catch (...) {
                    std::lock_guard<std::mutex> lock(table->mutex);
                    ++table->failures;
                }
            }
        } catch (...) {
        }
    }

    mall_t *handle_ = nullptr;
    std::unique_ptr<Callbacks> callbacks_;  // heap: its address is the C callback's arg
};

struct Client::Opened {
    Client client;
    int rc = MALL_ERR_INVAL;
    std::string error;  // empty on success
};

inline Client::Opened Client::open(const std::string &socket_path) {
    Opened result;
    mall_t *handle = nullptr;
    mall_error_t err{};
    result.rc = mall_open(socket_path.empty() ? nullptr : socket_path.c_str(), &handle, &err);
    result.client = Client(handle);
    if (result.rc != MALL_SUCCESS) result.error = err.text[0] ? err.text : mall_strerror(result.rc);
    return result;
}

inline Client::Opened Client::open(const mall_open_options_t &options) {
    Opened result;
    mall_t *handle = nullptr;
    mall_error_t err{};
    result.rc = mall_open_ex(&options, &handle, &err);
    result.client = Client(handle);
    if (result.rc != MALL_SUCCESS) result.error = err.text[0] ? err.text : mall_strerror(result.rc);
    return result;
}

}  // namespace mall
