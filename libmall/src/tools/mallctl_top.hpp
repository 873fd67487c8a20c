// SPDX-License-Identifier: BSD-3-Clause
// mallctl_top.hpp — `mallctl top`: a live terminal view of malld's status (the pool, the policy,
// one row per job with a bar of its cores), redrawn every --interval and at once on a key.
// Contract: the terminal is always given back as it was (termios, alternate screen, cursor) on
// every exit path: q, Ctrl-C, SIGTERM, SIGHUP, an exception. With --once or --batch N, or when
// stdout is not a terminal, it prints plain frames without a single escape byte. Exit codes are
// mallctl's: 0 ok, 2 usage, 3 malld unreachable (--once/--batch only; the live view retries).
#pragma once

#include <string>
#include <vector>

#include "tools/mallctl_session.hpp"  // Globals, UsageError

namespace mall::tools {

// The synopsis, one-line summary and body of `mallctl help top`.
extern const char *const kTopSynopsis;
extern const char *const kTopSummary;
extern const char *const kTopDetails;

// Runs the command on its arguments (after "top"), asking malld at g.socket for its status once
// per refresh (each request waits at most 2 s); what the fetch prints on stderr when malld cannot
// be reached is shown in the live view's header. usage_error prints the words, the synopsis and
// where to read more, and returns 2.
int cmd_top(const Globals &g, const std::vector<std::string> &args, const UsageError &usage_error);

}  // namespace mall::tools
