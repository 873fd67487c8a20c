// SPDX-License-Identifier: BSD-3-Clause
// malleable_pool.hpp — how the Eigen-pool examples (train_digits, train_linear) join malld and
// cross a step boundary. attach_if_launched(): when the process was launched under malld
// (launched_under_malld(), example_support.hpp) or opted in to control by signal (MALL_SIGNAL_CONTROL), open
// libmall, attach the parking of Eigen's own pool (workers parked or released and pinned inside
// mall_step() before the ack) and pin the main thread; returns the handle, or nullptr after ONE
// warning naming the program and the thread count it keeps (never exits). With signal control and no malld the handle is kept: it
// takes `mallctl signal` requests (and attaches if malld comes). Neither: nullptr, silently.
// StepBoundary: mall_step() at each step, counting and logging changes.
#pragma once

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <unistd.h>

#include "mall/mall.h"
#include "mall/tf/mall_pool_glue.hpp"
#include "mall/tf/pool_parking.hpp"

#include "example_support.hpp"

namespace mall::examples {

inline bool signal_control_requested() {
    const char *value = std::getenv("MALL_SIGNAL_CONTROL");
    return value != nullptr && *value != '\0' && std::string(value) != "0";
}

// The allocation's cpu list for a log line ("-" before the first allocation).
inline const char *allocation_text(const mall_alloc_t &alloc) { return alloc.cpus[0] != '\0' ? alloc.cpus : "-"; }

inline mall_t *attach_if_launched(const char *program, mall::tf::PoolParking &pool) {
    const bool by_signal = signal_control_requested();
    if (!launched_under_malld() && !by_signal) return nullptr;
    mall_t *m = nullptr;
    mall_error_t err{};
    const int rc = mall_open(nullptr, &m, &err);
    if (rc == MALL_ERR_NODAEMON && m != nullptr && by_signal) {
        std::fprintf(stderr, "%s: no malld (%s); running on %d threads, resizable with `mallctl signal %ld`\n",
                     program, err.text, pool.active_threads(), static_cast<long>(getpid()));
    } else if (rc != MALL_SUCCESS) {
        std::fprintf(stderr, "%s: not malleable (%s); running on %d threads\n", program, err.text, pool.active_threads());
        if (m != nullptr) mall_close(m);
        return nullptr;
    }
    if (mall::tf::attach_pool(m, pool) != MALL_SUCCESS || mall_bind_thread(m) != MALL_SUCCESS) {
        std::fprintf(stderr, "%s: could not attach the pool to libmall; running on %d threads\n", program,
                     pool.active_threads());
        mall_close(m);
        return nullptr;
    }
    return m;
}

// Calls mall_step() (nothing when m is nullptr: a plain run). When it brought an allocation, the
// glue has already parked or released workers and re-pinned the pool; a change after the first
// allocation counts as a resize, and with `log` a line "resize step <n> gen <g> threads <a> -> <b>
// cpus <list>" is printed, then "parked step <n> tids <t1,t2,...|->" (the Linux thread ids of the
// workers parked now). The pool changes size only inside mall_step() (the glue), so the size before
// a change is the one read after the previous change: the no-change path is mall_step()'s two
// atomic loads and nothing else.
class StepBoundary {
public:
    // pool may be null only with m null (a fixed pool that never follows malld).
    StepBoundary(mall_t *m, const mall::tf::PoolParking *pool, bool log)
        : m_(m), pool_(pool), log_(log), threads_(pool != nullptr ? pool->active_threads() : 0) {}

    void cross(int step) {
        if (m_ == nullptr || pool_ == nullptr || mall_step(m_) != MALL_SUCCESS) return;  // no change
        mall_alloc_t alloc;
        mall_get_allocation(m_, &alloc);
        // malld's first allocation sizes the pool; every later change, and every change by signal
        // (generation 0: no malld), is a resize.
        if (changes_++ > 0 || alloc.generation == 0) ++resizes_;
        const int threads_before = threads_;
        threads_ = pool_->active_threads();
        if (log_) {
            std::printf("resize step %d gen %" PRIu64 " threads %d -> %d cpus %s\n", step, alloc.generation,
                        threads_before, threads_, allocation_text(alloc));
            std::printf("parked step %d tids %s\n", step, tid_list(pool_->parked_tids()).c_str());
        }
    }
    int resizes() const { return resizes_; }

private:
    mall_t *m_;
    const mall::tf::PoolParking *pool_;
    bool log_;
    int threads_;
    int changes_ = 0;
    int resizes_ = 0;
};

}  // namespace mall::examples
