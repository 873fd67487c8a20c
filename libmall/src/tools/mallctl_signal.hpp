// SPDX-License-Identifier: BSD-3-Clause
// mallctl_signal.hpp — `mallctl signal PID`: control by signal, without malld. Sends a process
// that opted in (MALL_SIGNAL_CONTROL=1) a real-time signal whose value asks for a thread count
// and/or a cpu range, then waits for the process's own record of the outcome.
// Contract: nothing is sent unless the target catches the signal and keeps a mall record (the
// default action of a real-time signal would end it); exit codes are mallctl's (0 applied,
// 1 refused, 2 usage, 3 the process is gone or did not confirm in time).
#pragma once

#include <string>
#include <vector>

#include "tools/mallctl_session.hpp"  // Globals, UsageError

namespace mall::tools {

// The synopsis, one-line summary and body of `mallctl help signal`.
extern const char *const kSignalSynopsis;
extern const char *const kSignalSummary;
extern const char *const kSignalDetails;

// Runs the command on its arguments (after "signal"); usage_error prints the words and the
// synopsis and returns 2. The global options do not apply: it talks to the process, not malld.
int cmd_signal(const Globals &g, const std::vector<std::string> &args, const UsageError &usage_error);

}  // namespace mall::tools
