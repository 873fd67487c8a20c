// malleable_pool.hpp — how the Eigen-pool examples (train_digits, train_linear) join malld: when the
// process was launched under it (MALL_JOB_ID or MALL_SOCKET set), open libmall, attach the
// resizable pool (resized and pinned inside mall_step() before the ack) and pin the main thread.
//
// Contract: returns the open handle, or nullptr after ONE warning on stderr naming the program and
// the thread count it will keep; never exits. Not launched under malld: nullptr, silently.
#pragma once

#include <cstdio>
#include <cstdlib>

#include "mall/mall.h"
#include "mall/tf/mall_pool_glue.hpp"
#include "mall/tf/resizable_thread_pool.hpp"

namespace mall::examples {

inline bool launched_under_malld() {
    return std::getenv("MALL_JOB_ID") != nullptr || std::getenv("MALL_SOCKET") != nullptr;
}

// The allocation's cpu list for a log line ("-" before the first allocation).
inline const char *allocation_text(const mall_alloc_t &alloc) { return alloc.cpus[0] != '\0' ? alloc.cpus : "-"; }

inline mall_t *attach_if_launched(const char *program, mall::tf::ResizableThreadPool &pool) {
    if (!launched_under_malld()) return nullptr;
    mall_t *m = nullptr;
    mall_error_t err{};
    if (mall_open(nullptr, &m, &err) != MALL_SUCCESS) {
        std::fprintf(stderr, "%s: not malleable (%s); running on %d threads\n", program, err.text, pool.NumThreads());
        return nullptr;
    }
    if (mall::tf::attach_pool(m, pool) != MALL_SUCCESS || mall_bind_thread(m) != MALL_SUCCESS) {
        std::fprintf(stderr, "%s: could not attach the pool to libmall; running on %d threads\n", program,
                     pool.NumThreads());
        mall_close(m);
        return nullptr;
    }
    return m;
}

}  // namespace mall::examples
