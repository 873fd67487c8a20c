// SPDX-License-Identifier: BSD-3-Clause
// mallctl_status.hpp — mallctl's observing commands: `status` (the pool, the policy, one row per
// job and where its cgroups are; --json: malld's status object) and `watch` (one line per event
// as it happens; --json: one object per line). Anyone may run them.
// Contract: exit codes are mallctl's: 0 ok, 1 malld refused, 2 usage, 3 malld unreachable (or,
// for watch, malld closed the connection).
#pragma once

#include <string>
#include <vector>

#include "tools/mallctl_session.hpp"  // Globals, UsageError

namespace mall::tools {

// The synopsis, one-line summary and body of `mallctl help status` and `mallctl help watch`.
extern const char *const kStatusSynopsis;
extern const char *const kStatusSummary;
extern const char *const kStatusDetails;
extern const char *const kWatchSynopsis;
extern const char *const kWatchSummary;
extern const char *const kWatchDetails;

// Run the command on its arguments (after its name); usage_error prints the words, the synopsis
// and where to read more, and returns 2.
int cmd_status(const Globals &g, const std::vector<std::string> &args, const UsageError &usage_error);
int cmd_watch(const Globals &g, const std::vector<std::string> &args, const UsageError &usage_error);

}  // namespace mall::tools
