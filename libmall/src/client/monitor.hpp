// SPDX-License-Identifier: BSD-3-Clause
// monitor.hpp — the monitor thread of a handle: it keeps the connection to malld. Notify ->
// mall_fd() and the notification signal; hang-up -> detach, one line on stderr, and reconnect with
// backoff (50 ms doubling to 1 s while no malld answers, 5 s after a refusal); every 500 ms the
// progress totals (mall_report_progress) when they changed, and a re-check of the page that covers
// a Notify that never came. After a reconnect it sends the usage cap (mall_set_usage) again.
// Contract: the thread starts with every signal blocked (the host's handlers keep running on the
// host's threads), never lets an exception end the process, and ends when mall_close() writes the
// stop eventfd (destroy() joins it).
#pragma once

#include "handle.hpp"

namespace mall::client {

// Starts m's monitor thread; false when the thread cannot be created.
bool start_monitor(mall_handle *m);

// The wait before the next attach attempt after one that ended with rc, the last wait being backoff.
milliseconds next_backoff(int rc, milliseconds backoff);

}  // namespace mall::client
