// SPDX-License-Identifier: BSD-3-Clause
// mallctl_reports.hpp — mallctl's reporting commands: `metrics` (malld's status in Prometheus
// text, the same renderer as `malld --metrics-file`) and `history` (finished jobs from malld's
// history file). They only read: anyone may run them (history needs read access to the file).
// Exit codes are mallctl's: 0 ok, 1 the file cannot be read, 2 usage, 3 malld unreachable.
#pragma once

#include <string>
#include <vector>

#include "tools/mallctl_session.hpp"  // Globals, UsageError

namespace mall::tools {

extern const char *const kMetricsSynopsis;
extern const char *const kMetricsSummary;
extern const char *const kMetricsDetails;
extern const char *const kHistorySynopsis;
extern const char *const kHistorySummary;
extern const char *const kHistoryDetails;

// Run the command on its arguments (after its name), asking malld at g.socket for its status;
// usage_error prints the words, the synopsis and where to read more, and returns 2.
int cmd_metrics(const Globals &g, const std::vector<std::string> &args, const UsageError &usage_error);
int cmd_history(const Globals &g, const std::vector<std::string> &args, const UsageError &usage_error);

}  // namespace mall::tools
