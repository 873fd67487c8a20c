// SPDX-License-Identifier: BSD-3-Clause
// metrics_text.hpp — malld's status (the object `mallctl status --json` prints) in Prometheus'
// text exposition format (version 0.0.4), the one renderer behind `malld --metrics-file` (for
// node_exporter's textfile collector) and `mallctl metrics`, so the two always agree.
//
// Contract: every metric has its # HELP and # TYPE lines once, names follow Prometheus' rules
// (mall_ prefix, base units in the name: _seconds, _cpus; counters end in _total), per-job
// series carry the labels mall_job="…" and uid="…" (values escaped; not "job", which Prometheus
// sets to the scrape job and would rename to exported_job), histograms give cumulative
// _bucket{le=…} series ending in le="+Inf", then _sum and _count. No timestamps (the textfile
// collector refuses them). Fields a status lacks (an older malld) are left out, never invented.
// The metric names and their meanings are listed in metric_catalog() (docs/observability.md).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mall {

// The exposition text for `status`; throws std::invalid_argument when it is not a malld status
// object (no "jobs" array or "pool").
std::string render_prometheus(const nlohmann::json &status);

struct MetricInfo {
    const char *name;
    const char *type;  // gauge, counter, histogram, info-style gauge
    const char *help;
};
// Every metric render_prometheus may write, in the order it writes them.
const std::vector<MetricInfo> &metric_catalog();

}  // namespace mall
