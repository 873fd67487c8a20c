// SPDX-License-Identifier: BSD-3-Clause
// mallctl_reports.cpp — `mallctl metrics` and `mallctl history` (see mallctl_reports.hpp).
#include "tools/mallctl_reports.hpp"

#include <time.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <sstream>

#include <boost/program_options.hpp>

#include "common/job_history.hpp"
#include "common/metrics_text.hpp"
#include "tools/exit_codes.hpp"
#include "tools/time_text.hpp"

namespace po = boost::program_options;
using nlohmann::json;

namespace mall::tools {

const char *const kMetricsSynopsis = "metrics";
const char *const kMetricsSummary = "print malld's metrics in Prometheus text format";
const char *const kMetricsDetails =
    "Prints what `malld --metrics-file` writes for node_exporter's textfile collector, from\n"
    "malld's status now (Prometheus text exposition format 0.0.4, no timestamps). Node metrics:\n"
    "  mall_pool_cpus, mall_available_cpus, mall_free_cpus, mall_reclaimed_cpus, mall_jobs\n"
    "  mall_lent_core_seconds_total  cpus held above the jobs' guaranteed cpus (or their min)\n"
    "                                times the time held: idle capacity mall turned into work\n"
    "  mall_core_seconds_total       every cpu held by malleable jobs times the time held\n"
    "  mall_cpu_seconds_total        the cpu time their processes ran (over core-seconds: how busy\n"
    "                                the jobs kept the cpus they held)\n"
    "  mall_resizes_total, mall_ack_timeouts_total, mall_jobs_ended_total\n"
    "  mall_oversubscribed_seconds_total  time jobs ran more threads than cpus because they did\n"
    "                                not acknowledge a shrink before the ack timeout\n"
    "  mall_ack_latency_seconds      histogram: publication to acknowledgement\n"
    "  mall_reclaims_total, mall_reclaim_timeouts_total, mall_reclaim_duration_seconds (histogram)\n"
    "  mall_info{version,policy,backend}, mall_ack_timeout_seconds\n"
    "Per job, labelled mall_job=\"NAME\" and uid=\"UID\" (not job=, which Prometheus gives the\n"
    "scrape job):\n"
    "  mall_job_cpus, mall_job_min_cpus, mall_job_max_cpus, mall_job_guaranteed_cpus,\n"
    "  mall_job_lent_cpus, mall_job_threads, mall_job_attached_processes, mall_job_generation,\n"
    "  mall_job_oversubscribed (1 while oversubscribed), mall_job_core_seconds_total,\n"
    "  mall_job_lent_core_seconds_total, mall_job_oversubscribed_seconds_total,\n"
    "  mall_job_cpu_seconds_total, mall_job_cpu_busy_ratio (the last ~2 s window's cpu time over\n"
    "  the core-seconds held; absent before one),\n"
    "  mall_job_resizes_total, mall_job_ack_timeouts_total, mall_job_last_ack_latency_seconds,\n"
    "  mall_job_ack_latency_seconds (histogram), mall_job_work_units_total, mall_job_steps_total\n"
    "The node's counters include the jobs that ended; malld's state file keeps them across\n"
    "restarts.\n"
    "\n"
    "Anyone may read the metrics. Root and malld's admins get every job's series; other users\n"
    "get their own jobs' series and the node's (mall_jobs counts every job).\n"
    "\n"
    "Examples:\n"
    "  mallctl metrics\n"
    "  mallctl metrics | grep '^mall_lent_core_seconds_total'\n";

const char *const kHistorySynopsis = "history [--since WHEN] [--job NAME] [--json] [--file PATH]";
const char *const kHistorySummary = "show finished jobs: their cpus, lent core-seconds, resizes";
const char *const kHistoryDetails =
    "Shows the jobs that ended on this node, oldest first, from malld's history file (one record\n"
    "per job, written when it ends; malld --history-file, by default\n"
    "<state-dir>/malld.history.jsonl, rotated to <file>.1 at --history-max-mib):\n"
    "  ENDED      when it ended (local time)     JOB, UID   the job and its owner\n"
    "  REASON     exited (its processes ended), deregistered, released (a Slurm epilog)\n"
    "  DURATION   how long it was registered     MIN-MAX    its cpu limits\n"
    "  CORE-S     cpus held times the time held\n"
    "  LENT-S     cpus held above its guaranteed cpus (or its min) times the time held\n"
    "  BUSY       the cpu time its processes ran over CORE-S (- in records from before malld\n"
    "             measured it): how much of the cpus it held it used\n"
    "  RESIZES    new cpu sets published to it   TIMEOUTS   changes it did not acknowledge in time\n"
    "  OVERSUB-S  time it ran more threads than cpus after such a timeout\n"
    "A last line sums the jobs shown. Slurm jobs also carry their figures in Slurm's\n"
    "AdminComment when malld runs with --slurm.\n"
    "\n"
    "Options:\n"
    "  --since WHEN   only jobs that ended since WHEN: an age (90s, 30m, 2h, 7d), seconds since\n"
    "                 the epoch, or a local date and time (2026-11-24, 2026-11-24T08:30)\n"
    "  --job NAME     only the job named NAME (e.g. slurm-1234)\n"
    "  --json         print the records as a JSON array (2-space indent), every field\n"
    "  --file PATH    read this history file instead of asking malld where its file is (works\n"
    "                 while malld is down)\n"
    "\n"
    "Anyone who may read the history file may run it (malld writes it with mode 0600: root).\n"
    "\n"
    "Examples:\n"
    "  mallctl history\n"
    "  mallctl history --since 1d\n"
    "  mallctl history --job slurm-1234 --json\n"
    "  mallctl history --file /var/lib/mall/malld.history.jsonl --since 2026-11-01\n";

namespace {

po::variables_map parse(const std::vector<std::string> &args, const po::options_description &options) {
    po::variables_map vm;
    po::store(po::command_line_parser(args).options(options).run(), vm);
    po::notify(vm);
    return vm;
}


std::string duration_text(double seconds) {
    if (!(seconds >= 0)) return "-";
    const long s = std::lround(seconds);
    char buffer[32];
    if (s < 60) std::snprintf(buffer, sizeof buffer, "%lds", s);
    else if (s < 3600) std::snprintf(buffer, sizeof buffer, "%ldm%02lds", s / 60, s % 60);
    else if (s < 86400) std::snprintf(buffer, sizeof buffer, "%ldh%02ldm", s / 3600, (s % 3600) / 60);
    else std::snprintf(buffer, sizeof buffer, "%ldd%02ldh", s / 86400, (s % 86400) / 3600);
    return buffer;
}

std::string fixed(double x, int decimals = 1) {
    char buffer[64];
    std::snprintf(buffer, sizeof buffer, "%.*f", decimals, x);
    return buffer;
}

std::string text_of(const json &record, const char *field) {
    auto it = record.find(field);
    if (it == record.end() || it->is_null()) return "-";
    if (it->is_string()) return it->get<std::string>();
    return it->dump();
}

void print_table(const std::vector<std::vector<std::string>> &rows, std::ostream &out) {
    std::vector<size_t> width;
    for (const auto &row : rows)
        for (size_t i = 0; i < row.size(); ++i) {
            if (width.size() <= i) width.push_back(0);
            width[i] = std::max(width[i], row[i].size());
        }
    for (const auto &row : rows) {
        std::string line;
        for (size_t i = 0; i < row.size(); ++i) {
            line += row[i];
            if (i + 1 < row.size()) line += std::string(width[i] - row[i].size() + 2, ' ');
        }
        out << line << "\n";
    }
}

}  // namespace

int cmd_metrics(const Globals &g, const std::vector<std::string> &args, const UsageError &usage_error) {
    if (!args.empty()) return usage_error("metrics takes no arguments (got '" + args.front() + "')");
    int rc = kExitOk;
    auto status = status_fetcher(g)(&rc);
    if (!status) return rc;
    try {
        std::cout << render_prometheus(*status);
    } catch (const std::invalid_argument &e) {
        std::cerr << "mallctl: malld's status cannot be rendered: " << e.what() << "\n";
        return kExitRefused;
    }
    return kExitOk;
}

int cmd_history(const Globals &g, const std::vector<std::string> &args, const UsageError &usage_error) {
    po::options_description options;
    options.add_options()("since", po::value<std::string>(), "")("job", po::value<std::string>(), "")(
        "json", po::bool_switch(), "")("file", po::value<std::string>(), "");
    po::variables_map vm;
    try {
        vm = parse(args, options);
    } catch (const po::error &e) {
        return usage_error(e.what());
    }
    std::optional<double> since;
    if (vm.count("since")) {
        std::string why;
        since = parse_since(vm["since"].as<std::string>(), epoch_now(), &why);
        if (!since) return usage_error(why);
    }
    std::string path;
    if (vm.count("file")) {
        path = vm["file"].as<std::string>();
        if (path.empty()) return usage_error("--file needs a path");
    } else {
        int rc = kExitOk;
        auto status = status_fetcher(g)(&rc);
        if (!status) {
            std::cerr << "  (to read a history file without malld: mallctl history --file PATH)\n";
            return rc;
        }
        if (!status->contains("history_file") || !(*status)["history_file"].is_string()) {
            std::cerr << "mallctl: this malld keeps no history (it runs with --history-file none, or "
                         "predates it); pass --file PATH to read a history file\n";
            return kExitRefused;
        }
        path = (*status)["history_file"].get<std::string>();
    }
    std::string error;
    auto history = read_history(path, &error);
    if (!history) {
        std::cerr << "mallctl: " << error << "\n";
        if (error.find(std::strerror(EACCES)) != std::string::npos)
            std::cerr << "  (the history names every user's jobs, so malld keeps its file from other users: run\n"
                         "   mallctl history as root; your running jobs' figures are in mallctl status)\n";
        return kExitRefused;
    }
    if (history->skipped_lines > 0)
        std::cerr << "mallctl: note: skipped " << history->skipped_lines << " line(s) of " << path
                  << " that are not job records\n";
    std::vector<json> shown;
    for (auto &record : history->records) {
        if (since && record["time"].get<double>() < *since) continue;
        if (vm.count("job") && record.value("job", "") != vm["job"].as<std::string>()) continue;
        shown.push_back(std::move(record));
    }
    if (vm["json"].as<bool>()) {
        std::cout << json(shown).dump(2) << "\n";
        return kExitOk;
    }
    if (shown.empty()) {
        std::cout << "no finished jobs" << (since || vm.count("job") ? " match" : " recorded") << " (" << path << ")\n";
        return kExitOk;
    }
    std::vector<std::vector<std::string>> rows = {{"ENDED", "JOB", "UID", "REASON", "DURATION", "MIN-MAX", "CORE-S",
                                                   "LENT-S", "BUSY", "RESIZES", "TIMEOUTS", "OVERSUB-S"}};
    double core = 0, lent = 0, oversubscribed = 0, measured_core = 0, measured_cpu = 0;
    uint64_t resizes = 0, timeouts = 0;
    for (const json &r : shown) {
        const double c = r.value("core_seconds", 0.0), l = r.value("lent_core_seconds", 0.0),
                     o = r.value("oversubscribed_seconds", 0.0);
        core += c;
        lent += l;
        // BUSY: the cpu seconds the job's processes ran over the core-seconds it held ("-" in a
        // record written before malld measured cpu time).
        std::string busy = "-";
        if (r.contains("cpu_seconds") && r["cpu_seconds"].is_number() && c > 0) {
            busy = fixed(100 * r["cpu_seconds"].get<double>() / c, 0) + "%";
            measured_core += c;
            measured_cpu += r["cpu_seconds"].get<double>();
        }
        oversubscribed += o;
        resizes += r.value("resizes", uint64_t{0});
        timeouts += r.value("ack_timeouts", uint64_t{0});
        rows.push_back({local_time_text(r["time"].get<double>(), "%Y-%m-%d %H:%M:%S"), text_of(r, "job"), text_of(r, "uid"),
                        text_of(r, "reason"), duration_text(r.value("duration_seconds", -1.0)),
                        text_of(r, "min") + "-" + text_of(r, "max"), fixed(c), fixed(l), busy, text_of(r, "resizes"),
                        text_of(r, "ack_timeouts"), fixed(o)});
    }
    print_table(rows, std::cout);
    std::cout << "\n"
              << shown.size() << " job(s): " << fixed(lent) << " lent core-seconds of " << fixed(core)
              << " core-seconds held";
    if (core > 0) std::cout << " (" << fixed(100 * lent / core, 0) << "%)";
    if (measured_core > 0) std::cout << ", busy " << fixed(100 * measured_cpu / measured_core, 0) << "%";
    std::cout << ", " << resizes << " resizes, " << timeouts << " ack timeouts, " << fixed(oversubscribed)
              << " s oversubscribed\n";
    return kExitOk;
}

}  // namespace mall::tools
