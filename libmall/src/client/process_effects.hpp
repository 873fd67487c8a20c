// SPDX-License-Identifier: BSD-3-Clause
// process_effects.hpp — what an applied allocation does to the process itself: the resize
// callbacks (mall_on_resize), the affinity of the threads bound with mall_bind_thread, and, after a
// control-by-signal request, of every thread of the process.
// Contract: called on the change path (under step_mu) or from the C API, never on the fast path;
// nothing here throws out of a callback (a C++ callback that throws is stopped at its frame); a
// bound thread that exited, or whose tid now names another process, is forgotten, never re-pinned.
#pragma once

#include <sched.h>

#include "handle.hpp"

namespace mall::client {

// Calls every registered resize callback with alloc, outside callbacks_mu (a callback may register
// another one).
void run_callbacks(mall_handle *m, const mall_alloc_t &alloc);

// Pins the threads bound with mall_bind_thread to alloc's cpus.
void repin_bound_threads(mall_handle *m, const mall_alloc_t &alloc);

// Every thread of the process on `set` (what malld's affinity backend does for a job).
void pin_every_thread(const cpu_set_t &set);

// mall_bind_thread / mall_unbind_thread for the calling thread: MALL_SUCCESS, MALL_ERR_FULL (the
// table of bound threads is full) or MALL_ERR_SYSTEM (sched_setaffinity failed). May throw
// std::system_error (a lock); the C API turns that into MALL_ERR_SYSTEM.
int bind_current_thread(mall_handle *m);
int unbind_current_thread(mall_handle *m);

}  // namespace mall::client
