// SPDX-License-Identifier: BSD-3-Clause
// mallctl_status.cpp — `mallctl status` and `mallctl watch` (see mallctl_status.hpp): their help,
// the status table (one row per job, then where each job's cgroups are, then a line on other
// users' jobs when malld shows this user only its own) and one human line per event.
#include "tools/mallctl_status.hpp"

#include <sys/time.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include "common/cpuset.hpp"
#include "tools/exit_codes.hpp"

namespace po = boost::program_options;
using nlohmann::json;

namespace mall::tools {

const char *const kStatusSynopsis = "status [--json]";
const char *const kStatusSummary = "show the pool, the policy and every job's cores";
const char *const kStatusDetails =
    "Shows the malleable pool, the free cores, the policy and the enforcement backend, then one\n"
    "row per job:\n"
    "  JOB    the job name            UID    the owner's uid\n"
    "  MIN    MAX  the job's core limits\n"
    "  CPUS   the cores last published to the job, NCPUS how many\n"
    "  GEN    the generation of that allocation, ACKED the last one its processes acknowledged\n"
    "  STATE  settled, or changing while a two-phase move waits for the job's ack; then\n"
    "         \",pinned\" (mallctl set --cpus), \",uses N\" (mall_set_usage), \",threads N\"\n"
    "         (mallctl set --threads), \",signals\" (mallctl set --signal-control on)\n"
    "  BUSY   the cpu time the job ran over the cores it held, in malld's last window of about\n"
    "         2 s (\"-\" before a first window; --json: cpu_busy, and cpu_seconds since it began)\n"
    "  PIDS   the job's registered processes\n"
    "With a cgroup backend, CGROUPS then lists each job's cgroups: \"in place\" for a cgroup its\n"
    "resource manager or runtime made (a Slurm step, a container, a systemd scope), which malld\n"
    "resizes where it is, \"malld's\" for a folder of malld's own; \"(container)\" marks a\n"
    "container job (mallrun --container, mall-oci-hook), whose processes are those in its cgroups.\n"
    "\n"
    "Options:\n"
    "  --json   print malld's status object as JSON (2-space indent) instead of the table\n"
    "\n"
    "Anyone may ask for the status. Root and malld's admins (malld --admin-uid) see every job;\n"
    "other users see their own jobs in full and of other users' jobs only the cpus they hold\n"
    "(OTHERS; \"other_jobs\" in --json, and \"view\": \"own\" instead of \"all\").\n"
    "\n"
    "Examples:\n"
    "  mallctl status\n"
    "  mallctl status --json | jq '.jobs[].cpus'\n";

const char *const kWatchSynopsis = "watch [--json] [--count N] [--timeout-s S]";
const char *const kWatchSummary = "print one line per event: registrations, moves, acks, ends";
const char *const kWatchDetails =
    "Follows malld's events as they happen, one line each:\n"
    "  HH:MM:SS.mmm  EVENT        JOB           details\n"
    "Events: register, publish (a new allocation: generation, cpus and their count), ack (the\n"
    "job applied it: latency from publication), ack_timeout, enforce (the cpuset was written),\n"
    "end (with the job's accounting: lent and held core-seconds, resizes, ack timeouts), policy,\n"
    "reclaim, release, pin.\n"
    "\n"
    "Options:\n"
    "  --json          print each event as one JSON object per line\n"
    "  --count N       stop after N events\n"
    "  --timeout-s S   stop after S seconds (exit 0)\n"
    "\n"
    "Anyone may watch. Root and malld's admins see every event; other users see every event of\n"
    "their own jobs and of other users' jobs only register, publish (with the cpus) and end, as\n"
    "JOB \"(other)\" (\"other_job\": true in --json, without the job's name, uid or pids).\n"
    "\n"
    "Examples:\n"
    "  mallctl watch\n"
    "  mallctl watch --json --count 20 > events.jsonl\n"
    "  mallctl watch --timeout-s 10\n";

namespace {

std::string join_pids(const json &pids) {
    if (!pids.is_array() || pids.empty()) return "-";
    std::string out;
    for (const auto &p : pids) {
        if (!out.empty()) out += ",";
        out += p.is_string() ? p.get<std::string>() : p.dump();
    }
    return out;
}

// "HH:MM:SS.mmm" in local time from seconds since the epoch.
std::string clock_text(double seconds) {
    if (!(seconds > 0)) {
        timeval tv{};
        gettimeofday(&tv, nullptr);
        seconds = static_cast<double>(tv.tv_sec) + tv.tv_usec / 1e6;
    }
    time_t whole = static_cast<time_t>(seconds);
    int millis = static_cast<int>((seconds - static_cast<double>(whole)) * 1000.0);
    if (millis > 999) millis = 999;
    if (millis < 0) millis = 0;
    tm local{};
    localtime_r(&whole, &local);
    char buf[32];
    std::snprintf(buf, sizeof buf, "%02d:%02d:%02d.%03d", local.tm_hour, local.tm_min, local.tm_sec,
                  millis);
    return buf;
}

std::string pad(std::string s, size_t width) {
    if (s.size() < width) s.append(width - s.size(), ' ');
    return s;
}

// One human line per event: time, event, job, then what applies to that event.
std::string format_event(const json &e) {
    const std::string event = field_string(e, "event");
    double when = e.contains("time") && e["time"].is_number() ? e["time"].get<double>() : 0.0;
    std::string job = field_string(e, "job");
    // Another user's job, which malld names to its owner and admins only.
    if (job.empty() && e.contains("other_job") && e["other_job"].is_boolean() && e["other_job"].get<bool>())
        job = "(other)";
    std::ostringstream out;
    out << clock_text(when) << "  " << pad(event.empty() ? "?" : event, 11) << "  "
        << pad(text_or_dash(job), 12);

    std::vector<std::string> parts;
    auto has = [&](const char *k) { return e.contains(k) && !e[k].is_null(); };
    if (has("generation")) parts.push_back("gen " + field_string(e, "generation"));
    if (event == "register") {
        if (has("min") || has("max"))
            parts.push_back("min " + field_string(e, "min") + "  max " + field_string(e, "max"));
        if (has("pids")) parts.push_back("pids " + join_pids(e["pids"]));
        if (has("uid")) parts.push_back("uid " + field_string(e, "uid"));
        if (has("weight") && e["weight"].is_number() && e["weight"].get<double>() != 1.0)
            parts.push_back("weight " + field_string(e, "weight"));
    }
    if (has("cpus")) {
        std::string cpus = "cpus " + text_or_dash(field_string(e, "cpus"));
        if (has("ncpus")) cpus += " (" + field_string(e, "ncpus") + ")";
        if (event == "enforce" && has("growing") && e["growing"].is_boolean())
            cpus += e["growing"].get<bool>() ? " grow" : " shrink";
        parts.push_back(cpus);
    }
    if (has("latency_us") && e["latency_us"].is_number()) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "ack %.1f us", e["latency_us"].get<double>());
        parts.push_back(buf);
    }
    if (event == "ack_timeout") parts.push_back("no ack within the timeout: enforced anyway");
    if (has("reason")) parts.push_back(field_string(e, "reason"));
    if (has("policy")) parts.push_back("policy " + field_string(e, "policy"));
    // A job's end carries its accounting: one short summary (--json has every figure).
    if (event == "end" && has("lent_core_seconds") && e["lent_core_seconds"].is_number()) {
        auto number = [&](const char *k) { return e.contains(k) && e[k].is_number() ? e[k].get<double>() : 0.0; };
        char buf[160];
        std::snprintf(buf, sizeof buf, "after %.1f s: lent %.1f of %.1f core-s, %.0f resizes, %.0f ack timeouts",
                      number("duration_seconds"), number("lent_core_seconds"), number("core_seconds"),
                      number("resizes"), number("ack_timeouts"));
        parts.push_back(buf);
        if (has("cpu_seconds") && e["cpu_seconds"].is_number() && number("core_seconds") > 0) {
            std::snprintf(buf, sizeof buf, "busy %.0f%% (%.1f cpu-s)",
                          100 * number("cpu_seconds") / number("core_seconds"), number("cpu_seconds"));
            parts.push_back(buf);
        }
        if (number("oversubscribed_seconds") > 0) {
            std::snprintf(buf, sizeof buf, "%.1f s oversubscribed", number("oversubscribed_seconds"));
            parts.push_back(buf);
        }
    }

    // Anything else the event carries, so nothing is hidden from the reader.
    static const char *known[] = {"event", "time", "job", "generation", "min", "max", "pids", "uid",
                                  "weight", "cpus", "ncpus", "growing", "latency_us", "reason", "policy",
                                  "duration_seconds", "core_seconds", "lent_core_seconds", "cpu_seconds",
                                  "oversubscribed_seconds", "resizes", "ack_timeouts", "acks",
                                  "ack_latency_seconds_sum", "other_job"};
    for (auto it = e.begin(); it != e.end(); ++it) {
        if (it->is_null() || (it->is_string() && it->get<std::string>().empty())) continue;
        if (std::find_if(std::begin(known), std::end(known),
                         [&](const char *k) { return it.key() == k; }) != std::end(known))
            continue;
        parts.push_back(it.key() + " " + (it->is_string() ? it->get<std::string>() : it->dump()));
    }
    for (const auto &p : parts) out << "  " << p;
    std::string line = out.str();
    while (!line.empty() && line.back() == ' ') line.pop_back();
    return line;
}

// Other users' jobs, which malld shows a non-admin only as the cpus they hold ("other_jobs"):
// "OTHERS   2 jobs of other users hold cpus 2-5 (4 cpus); ..."; "" when the status has none.
std::string other_jobs_line(const json &s) {
    auto it = s.find("other_jobs");
    if (it == s.end() || !it->is_array() || it->empty()) return "";
    CpuSet held;
    for (const auto &j : *it)
        if (j.is_object() && j.contains("cpus") && j["cpus"].is_string())
            if (auto cpus = CpuSet::parse(j["cpus"].get<std::string>())) held |= *cpus;
    const size_t n = it->size();
    std::string line = "OTHERS   " + std::to_string(n) + (n == 1 ? " job of other users holds " : " jobs of other users hold ");
    line += held.empty() ? std::string("no cpus")
                         : "cpus " + held.to_string() + " (" + std::to_string(held.count()) + " cpus)";
    return line + "; only their owners and admins see more";
}

// BUSY: the last window's cpu_busy as a percentage; "-" before a first window (null) or from a
// malld that does not measure it.
std::string busy_text(const json &job) {
    auto it = job.find("cpu_busy");
    if (it == job.end() || !it->is_number()) return "-";
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.0f%%", it->get<double>() * 100);
    return buf;
}

void print_status_table(const json &s, std::ostream &out) {
    auto str = [&](const char *k) { return text_or_dash(field_string(s, k)); };
    out << "POOL     " << str("pool");
    if (s.contains("available") || s.contains("reclaimed"))
        out << "   (available " << str("available") << ", reclaimed " << str("reclaimed") << ")";
    out << "\n";
    out << "POLICY   " << str("policy");
    if (s.contains("ack_timeout_ms")) out << "   (ack timeout " << field_string(s, "ack_timeout_ms") << " ms)";
    out << "\n";
    out << "BACKEND  " << str("backend") << "\n";
    out << "FREE     " << str("free") << "\n";

    const json jobs = s.contains("jobs") && s["jobs"].is_array() ? s["jobs"] : json::array();
    const std::string others = other_jobs_line(s);
    out << "\n";
    if (jobs.empty()) {
        out << (others.empty() ? "no jobs registered\n" : "none of your jobs is registered\n");
        if (!others.empty()) out << "\n" << others << "\n";
        return;
    }
    const std::vector<std::string> header = {"JOB", "UID", "MIN", "MAX", "CPUS", "NCPUS", "THREADS",
                                             "GEN", "ACKED", "STATE", "BUSY", "PIDS"};
    std::vector<std::vector<std::string>> rows;
    for (const auto &j : jobs) {
        auto f = [&](const char *k) { return text_or_dash(field_string(j, k)); };
        std::string state = f("state");
        if (j.contains("pinned") && j["pinned"].is_boolean() && j["pinned"].get<bool>())
            state += ",pinned";
        // A usage cap (mall_set_usage) shows as "uses N": the job is planned with that max.
        if (j.contains("usage_cap") && j["usage_cap"].is_number_integer() && j["usage_cap"].get<int>() > 0)
            state += ",uses " + field_string(j, "usage_cap");
        // An admin's thread count (mallctl set --threads) shows as "threads N".
        if (j.contains("threads") && j["threads"].is_number_integer() && j["threads"].get<int>() > 0)
            state += ",threads " + field_string(j, "threads");
        // Signal control allowed (mallctl set --signal-control on) shows as "signals".
        if (j.contains("signal_control") && j["signal_control"].is_boolean() && j["signal_control"].get<bool>())
            state += ",signals";
        // THREADS: what the processes were told to run (a malld before API 0.3: one per cpu, "-").
        rows.push_back({f("job"), f("uid"), f("min"), f("max"), f("cpus"), f("ncpus"), f("active_threads"),
                        f("generation"), f("acked_generation"), state, busy_text(j),
                        j.contains("pids") ? join_pids(j["pids"]) : "-"});
    }
    std::vector<size_t> width(header.size());
    for (size_t c = 0; c < header.size(); ++c) {
        width[c] = header[c].size();
        for (const auto &r : rows) width[c] = std::max(width[c], r[c].size());
    }
    auto print_row = [&](const std::vector<std::string> &r) {
        std::string line;
        for (size_t c = 0; c < r.size(); ++c) {
            line += c + 1 < r.size() ? pad(r[c], width[c] + 2) : r[c];
        }
        out << line << "\n";
    };
    print_row(header);
    for (const auto &r : rows) print_row(r);

    // Where each job is enforced: in place (its resource manager's or runtime's cgroup, resized
    // where it is) or a folder of malld's own.
    std::vector<std::string> cgroup_lines;
    for (const auto &j : jobs) {
        if (!j.contains("cgroups") || !j["cgroups"].is_array()) continue;
        for (const auto &c : j["cgroups"]) {
            if (!c.is_object() || !c.contains("path") || !c["path"].is_string()) continue;
            const bool in_place = c.value("in_place", false);
            const bool container = j.contains("container") && j["container"].is_boolean() && j["container"].get<bool>();
            cgroup_lines.push_back(pad(text_or_dash(field_string(j, "job")), width[0] + 2) +
                                   (in_place ? "in place  " : "malld's   ") + c["path"].get<std::string>() +
                                   (container ? "  (container)" : ""));
        }
    }
    if (!cgroup_lines.empty()) {
        out << "\nCGROUPS\n";
        for (const auto &line : cgroup_lines) out << line << "\n";
    }
    if (!others.empty()) out << "\n" << others << "\n";
}

}  // namespace

int cmd_status(const Globals &g, const std::vector<std::string> &args, const UsageError & /*usage_error: a bad option is the dispatch's (parse_command)*/) {
    po::options_description opts;
    opts.add_options()("json", po::bool_switch(), "");
    po::positional_options_description pos;
    po::variables_map vm = parse_command(args, opts, pos);
    int rc = kExitOk;
    auto body = status_fetcher(g)(&rc);
    if (!body) return rc;
    if (vm["json"].as<bool>())
        std::cout << body->dump(2) << "\n";
    else
        print_status_table(*body, std::cout);
    return kExitOk;
}

int cmd_watch(const Globals &g, const std::vector<std::string> &args, const UsageError &usage_error) {
    po::options_description opts;
    opts.add_options()("json", po::bool_switch(), "")("count", po::value<long>(), "")(
        "timeout-s", po::value<double>(), "");
    po::positional_options_description pos;
    po::variables_map vm = parse_command(args, opts, pos);
    long count = -1;
    if (vm.count("count")) {
        count = vm["count"].as<long>();
        if (count < 1) return usage_error("--count must be at least 1 (number of events)");
    }
    std::optional<std::chrono::steady_clock::time_point> deadline;
    if (vm.count("timeout-s")) {
        double t = vm["timeout-s"].as<double>();
        if (!(t > 0) || !std::isfinite(t) || t > 1e7)
            return usage_error("--timeout-s must be a positive number of seconds, e.g. 10 or 0.5");
        deadline = std::chrono::steady_clock::now() +
                   std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                       std::chrono::duration<double>(t));
    }
    const bool as_json = vm["json"].as<bool>();

    Session s(g.socket);
    if (!s.connect()) return kExitUnreachable;
    int rc = kExitOk;
    if (!s.request(mall::proto::Type::Watch, json::object(), &rc, std::chrono::seconds(10))) return rc;

    long seen = 0;
    while (count < 0 || seen < count) {
        auto wait = std::chrono::milliseconds(1000);
        if (deadline) {
            auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                *deadline - std::chrono::steady_clock::now());
            if (left.count() <= 0) break;
            wait = std::min(wait, left + std::chrono::milliseconds(1));
        }
        bool closed = false;
        auto event = s.client().next_event(wait, &closed);
        if (closed) {
            std::cerr << "mallctl: malld at " << s.path() << " closed the connection (stopped?)\n";
            return kExitUnreachable;
        }
        if (!event) continue;
        if (as_json)
            std::cout << event->dump() << "\n";
        else
            std::cout << format_event(*event) << "\n";
        std::cout.flush();
        ++seen;
    }
    return kExitOk;
}

}  // namespace mall::tools
