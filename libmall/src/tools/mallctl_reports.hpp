// SPDX-License-Identifier: BSD-3-Clause
// mallctl_reports.hpp — mallctl's reporting commands: `metrics` (malld's status in Prometheus
// text, the same renderer as `malld --metrics-file`) and `history` (finished jobs from malld's
// history file). They only read: anyone may run them (history needs read access to the file).
// Exit codes are mallctl's: 0 ok, 1 the file cannot be read, 2 usage, 3 malld unreachable.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mall::tools {

extern const char *const kMetricsSynopsis;
extern const char *const kMetricsSummary;
extern const char *const kMetricsDetails;
extern const char *const kHistorySynopsis;
extern const char *const kHistorySummary;
extern const char *const kHistoryDetails;

// How a command gets malld's status: the status object, or none after printing why, with
// *exit_code set (3 when malld cannot be reached).
using StatusFetcher = std::function<std::optional<nlohmann::json>(int *exit_code)>;
using UsageError = std::function<int(const std::string &)>;

int cmd_metrics(const std::vector<std::string> &args, const StatusFetcher &fetch_status, const UsageError &usage_error);
int cmd_history(const std::vector<std::string> &args, const StatusFetcher &fetch_status, const UsageError &usage_error);

}  // namespace mall::tools
