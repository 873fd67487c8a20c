// SPDX-License-Identifier: BSD-3-Clause
// notify.hpp — how a process learns that malld published a change it has not applied: mall_fd()'s
// eventfd, the optional notification signal (mall_open_ex's notify_signal, $MALL_NOTIFY_SIGNAL),
// and the one-line stderr messages of the monitor.
// Contract: under notify_mu, "user_event_fd is readable" matches "the page holds a generation not
// applied yet": the monitor raises it (signal_if_pending), the change path lowers it
// (finish_change). The notification signal is queued once per generation and never while its
// disposition is the default (which would end the process: the user is told once instead).
// Nothing here runs on the mall_step() fast path.
#pragma once

#include <cstdint>

#include "handle.hpp"

namespace mall::client {

// Signals mall_fd() (and the notification signal, when asked for) when the page holds a
// generation the process has not applied.
void signal_if_pending(mall_handle *m);

// Marks generation as applied and leaves user_event_fd readable only if a newer one is waiting.
void finish_change(mall_handle *m, uint64_t generation);

// One line on stderr when the connection to malld is lost and when it is back: between the two the
// process keeps the cpus it has and runs on, not malleable (mall_step() says "no change"). Written
// by the monitor only, with one write(2), never on the step path; MALL_QUIET=1 silences it.
void tell_user(mall_handle *m, const char *what);

}  // namespace mall::client
