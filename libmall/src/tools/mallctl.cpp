// SPDX-License-Identifier: BSD-3-Clause
// mallctl.cpp — the administrator's command line for malld: status, set, policy, reclaim,
// release, watch; metrics and history (tools/mallctl_reports.cpp); top (tools/mallctl_top.cpp);
// and signal (tools/mallctl_signal.cpp), which talks to a process, not to malld.
// Validates every argument (cpu lists included) locally before sending anything.
// Exit codes: 0 ok, 1 malld refused (its words on stderr), 2 usage error, 3 malld unreachable.
#include <sys/time.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include "common/cpuset.hpp"
#include "common/ctl_client.hpp"
#include "common/protocol.hpp"
#include "common/rules.hpp"
#include "mall/mall.h"
#include "tools/exit_codes.hpp"
#include "tools/mallctl_reports.hpp"
#include "tools/mallctl_signal.hpp"
#include "tools/mallctl_top.hpp"

namespace po = boost::program_options;
using nlohmann::json;

namespace {

using namespace mall::tools;


// ---------------------------------------------------------------------------------------------
// Help texts. Each command has a synopsis, a description, its options and examples.

struct Command {
    const char *name;
    const char *synopsis;  // after "mallctl [--socket PATH] "
    const char *summary;   // one line for the command list
    std::string details;   // the body of `mallctl help NAME`
};

const Command kCommands[] = {
    {"status", "status [--json]", "show the pool, the policy and every job's cores",
     "Shows the malleable pool, the free cores, the policy and the enforcement backend, then one\n"
     "row per job:\n"
     "  JOB    the job name            UID    the owner's uid\n"
     "  MIN    MAX  the job's core limits\n"
     "  CPUS   the cores last published to the job, NCPUS how many\n"
     "  GEN    the generation of that allocation, ACKED the last one its processes acknowledged\n"
     "  STATE  settled, or changing while a two-phase move waits for the job's ack; then\n"
     "         \",pinned\" (mallctl set --cpus), \",uses N\" (mall_set_usage), \",threads N\"\n"
     "         (mallctl set --threads), \",signals\" (mallctl set --signal-control on)\n"
     "  PIDS   the job's registered processes\n"
     "With a cgroup backend, CGROUPS then lists each job's cgroups: \"in place\" for a cgroup its\n"
     "resource manager or runtime made (a Slurm step, a container, a systemd scope), which malld\n"
     "resizes where it is, \"malld's\" for a folder of malld's own; \"(container)\" marks a\n"
     "container job (mallrun --container, mall-oci-hook), whose processes are those in its cgroups.\n"
     "\n"
     "Options:\n"
     "  --json   print malld's status object as JSON (2-space indent) instead of the table\n"
     "\n"
     "Anyone may ask for the status.\n"
     "\n"
     "Examples:\n"
     "  mallctl status\n"
     "  mallctl status --json | jq '.jobs[].cpus'\n"},
    {"set", "set JOB [--cpus LIST|auto] [--weight W] [--threads N|auto] [--signal-control on|off]",
     "pin a job to cores or hand it back to the policy; set its weight, threads or signal control",
     "Pins JOB to the cores in LIST (an administrator's override): malld moves the job there with\n"
     "the usual two-phase protocol (shrink, wait for the ack, grow) and the policy leaves it there.\n"
     "`--cpus auto` removes the pin and lets the policy decide again. LIST must lie inside the\n"
     "pool and must not take cores that other pinned jobs hold. --weight sets the job's share for\n"
     "the weighted policy (malld re-plans at once). --threads N makes the job run N threads on the\n"
     "cores it holds (N from 1 to its cores; the others stay its own and idle, e.g. to measure how\n"
     "it scales or to leave room for a helper process): its processes get the count with the next\n"
     "allocation (mall_alloc_threads() in the C API; the Eigen, OpenMP and libtorch adapters follow\n"
     "it) at their next step and acknowledge it like any change. `--threads auto` goes back to one\n"
     "thread per core. The count stays when the job grows; a shrink below it lowers it. mallctl\n"
     "status shows it (THREADS, and `threads` / `active_threads` in --json), and malld's state file\n"
     "keeps it across restarts.\n"
     "\n"
     "--signal-control on lets the job's processes take `mallctl signal PID` requests. By default\n"
     "(off) a process attached to malld refuses them: malld's allocation is the truth. With it on, a\n"
     "process that opted in (MALL_SIGNAL_CONTROL=1 in its environment) accepts a request only when\n"
     "it narrows what malld gave it: fewer threads, or a cpu range within the cores malld published.\n"
     "malld's next change of the job (new cores, a thread count, this switch) wins and drops the\n"
     "override. malld publishes the switch to the job's processes with the same cores and thread\n"
     "count (a new generation, acknowledged like any change); `--signal-control off` stops further\n"
     "requests and ends an override in force. mallctl status shows it (\",signals\" in STATE,\n"
     "`signal_control` in --json), and malld's state file keeps it across restarts.\n"
     "\n"
     "Give one option or more; when one is refused nothing changes.\n"
     "\n"
     "Options:\n"
     "  --cpus LIST|auto          the cores, in Linux list format (\"0-3,8\"), or auto\n"
     "  --weight W                the job's weight (" + std::string(mall::kWeightRule) + "; default 1)\n"
     "  --threads N|auto          threads to run on its cores, 1 to the cores it holds; auto: one per\n"
     "                            core\n"
     "  --signal-control on|off   whether its processes accept `mallctl signal` requests that narrow\n"
     "                            within malld's allocation (default off)\n"
     "\n"
     "Needs root or an admin uid of malld (--admin-uid).\n"
     "\n"
     "Examples:\n"
     "  sudo mallctl set train-42 --cpus 0-3\n"
     "  sudo mallctl set train-42 --cpus auto\n"
     "  sudo mallctl set train-42 --weight 3\n"
     "  sudo mallctl set train-42 --threads 1\n"
     "  sudo mallctl set train-42 --threads auto\n"
     "  sudo mallctl set train-42 --signal-control on\n"},
    {"policy", "policy NAME", "switch the allocation policy (equal, static, weighted, throughput)",
     "Switches the policy malld uses to share the pool between jobs, and re-plans at once:\n"
     "  equal    idle cores are lent out evenly, each job within its MIN..MAX\n"
     "  static   each job keeps its guaranteed (or MIN) cores; nothing is lent (the baseline)\n"
     "  weighted idle cores are lent in proportion to each job's weight (mallrun --weight),\n"
     "           each job within its MIN..MAX\n"
     "  throughput idle cores go where they add the most measured speedup: each job's work rate\n"
     "           (mall_report_progress) at the core counts it ran on gives its speedup curve;\n"
     "           within 6 s of a change a job is not shrunk, and small gains move nothing\n"
     "\n"
     "Needs root or an admin uid of malld.\n"
     "\n"
     "Examples:\n"
     "  sudo mallctl policy static\n"
     "  sudo mallctl policy equal\n"},
    {"reclaim", "reclaim LIST [--owner JOB] [--timeout-ms N]",
     "take cores out of the pool; returns once no job holds them",
     "Takes the cores in LIST out of the malleable pool: jobs that hold them are shrunk (two-phase)\n"
     "and the command returns once no job holds any of them, so something else (a new Slurm job,\n"
     "a benchmark) can use them. This is what the Slurm prolog calls before a job starts on lent\n"
     "cores. Give them back with `mallctl release`.\n"
     "\n"
     "Options:\n"
     "  --owner JOB      keep the cores reserved for the job named JOB (e.g. slurm-1234): when\n"
     "                   it registers with them as guaranteed cores they become its own, and\n"
     "                   `mallctl release --owner JOB` gives them back (the prolog/epilog pair)\n"
     "  --timeout-ms N   how long to wait for malld's confirmation (default 30000)\n"
     "\n"
     "Needs root or an admin uid of malld.\n"
     "\n"
     "Examples:\n"
     "  sudo mallctl reclaim 6-7\n"
     "  sudo mallctl reclaim 2-3 --owner slurm-1234\n"
     "  sudo mallctl reclaim 0,2 --timeout-ms 5000\n"},
    {"release", "release LIST | release --owner JOB", "give reclaimed cores back to the pool",
     "Puts the cores in LIST back into the malleable pool (after `mallctl reclaim`); the policy\n"
     "lends them out again at once. With --owner JOB instead of a list: releases every core\n"
     "reserved for JOB and ends JOB's registration if it is still there (what a Slurm epilog does;\n"
     "an owner with nothing reserved is fine).\n"
     "\n"
     "Needs root or an admin uid of malld.\n"
     "\n"
     "Examples:\n"
     "  sudo mallctl release 6-7\n"
     "  sudo mallctl release --owner slurm-1234\n"},
    {"watch", "watch [--json] [--count N] [--timeout-s S]",
     "print one line per event: registrations, moves, acks, ends",
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
     "Anyone may watch.\n"
     "\n"
     "Examples:\n"
     "  mallctl watch\n"
     "  mallctl watch --json --count 20 > events.jsonl\n"
     "  mallctl watch --timeout-s 10\n"},
    {"metrics", kMetricsSynopsis, kMetricsSummary, kMetricsDetails},
    {"history", kHistorySynopsis, kHistorySummary, kHistoryDetails},
    {"top", kTopSynopsis, kTopSummary, kTopDetails},
    {"signal", kSignalSynopsis, kSignalSummary, kSignalDetails},
};

// "status, set, ... or signal": the command names for error messages.
std::string command_names(const char *last_joiner = " or ") {
    std::string names;
    const size_t n = std::size(kCommands);
    for (size_t i = 0; i < n; ++i)
        names += (i == 0 ? "" : i + 1 == n ? last_joiner : ", ") + std::string(kCommands[i].name);
    return names;
}

const Command *find_command(const std::string &name) {
    for (const auto &c : kCommands)
        if (name == c.name) return &c;
    return nullptr;
}

std::string version_text() {
    std::ostringstream out;
    out << "mallctl (mall) " << MALL_API_VERSION_MAJOR << "." << MALL_API_VERSION_MINOR << "."
        << MALL_API_VERSION_PATCH;
    return out.str();
}

void print_main_help(std::ostream &out) {
    out << "mallctl - inspect and steer malld, the mall node manager\n"
           "\n"
           "Usage:\n"
           "  mallctl [--socket PATH] COMMAND [ARGS...]\n"
           "  mallctl help COMMAND        (or: mallctl COMMAND --help)\n"
           "\n"
           "Commands:\n";
    for (const auto &c : kCommands) {
        std::string syn = c.synopsis;
        out << "  " << syn;
        if (syn.size() < 32)
            out << std::string(32 - syn.size(), ' ');
        else
            out << "\n  " << std::string(32, ' ');
        out << c.summary << "\n";
    }
    out << "\n"
           "Global options (before or after the command):\n"
           "  --socket PATH   malld's socket (default: $MALL_SOCKET, else "
        << mall::kDefaultSocketPath
        << ")\n"
           "  -h, --help      show this text, or the command's help after a command\n"
           "  --version       print the version\n"
           "\n"
           "CPU lists use the Linux list format: \"0-3,8\" (ascending or not, no spaces).\n"
           "status, watch, metrics, history and top are open to everyone; set, policy, reclaim and\n"
           "release need root or an admin uid of malld. signal talks to a process, not to malld:\n"
           "its owner or root may.\n"
           "\n"
           "Exit status:\n"
           "  0  success\n"
           "  1  malld refused the request (its reason is printed)\n"
           "  2  usage error (bad command, option or cpu list)\n"
           "  3  malld could not be reached (signal: the process is gone or did not confirm)\n"
           "\n"
           "Examples:\n"
           "  mallctl status\n"
           "  mallctl --socket /tmp/mall/malld.sock watch --count 10\n"
           "  sudo mallctl set train-42 --cpus 0-3\n"
           "  sudo mallctl reclaim 6-7 && sudo mallctl release 6-7\n";
}

void print_command_help(const Command &c, std::ostream &out) {
    std::string summary = c.summary;
    summary[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(summary[0])));
    out << "Usage: mallctl [--socket PATH] " << c.synopsis << "\n\n"
        << summary << ".\n\n"
        << c.details;
}

// A usage error: says what is wrong, shows the synopsis and where to read more. Returns 2.
int usage_error(const std::string &command, const std::string &what) {
    std::cerr << "mallctl" << (command.empty() ? "" : " " + command) << ": " << what << "\n";
    if (const Command *c = find_command(command)) {
        std::cerr << "usage: mallctl [--socket PATH] " << c->synopsis << "\n"
                  << "see `mallctl help " << c->name << "`\n";
    } else {
        std::cerr << "see `mallctl --help`\n";
    }
    return kExitUsage;
}

// Parses a cpu list locally; on failure prints the parser's explanation and an example.
std::optional<mall::CpuSet> parse_cpus_or_complain(const std::string &command, const std::string &text,
                                                   const std::string &example) {
    std::string error;
    auto cpus = mall::CpuSet::parse(text, &error);
    if (!cpus) {
        usage_error(command, error + "\n  example: " + example);
        return std::nullopt;
    }
    if (cpus->empty()) {
        usage_error(command, "the cpu list is empty; name at least one cpu\n  example: " + example);
        return std::nullopt;
    }
    return cpus;
}

// ---------------------------------------------------------------------------------------------
// Talking to malld.

class Session {
public:
    explicit Session(std::string socket_path) : path_(mall::resolve_socket_path(socket_path)) {}

    // Connects; on failure prints where it looked and how to fix it.
    bool connect() {
        mall::ConnectFailure failure;
        client_ = mall::CtlClient::connect(path_, nullptr, &failure);
        if (!client_) {
            unreachable(failure);
            return false;
        }
        return true;
    }

    // The connection failed: say where we looked and how to fix it. When nobody listens there,
    // the fuller hint below (how to start malld on this path) replaces the short advice.
    void unreachable(const mall::ConnectFailure &failure) const {
        std::cerr << "mallctl: " << (failure.nobody_listening ? failure.what : failure.text()) << "\n"
                  << "  is malld running? start it with `malld --socket " << path_
                  << "` or pass --socket / set MALL_SOCKET\n";
    }

    // Sends a request; on failure prints malld's words and returns the exit code to use.
    std::optional<json> request(mall::proto::Type type, const json &body, int *exit_code,
                                std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
        mall::CtlResult r = client_->request(type, body, timeout);
        if (r.ok) return r.body;
        if (r.code == MALL_ERR_NODAEMON) {  // no answer, or the connection broke
            std::cerr << "mallctl: " << r.error << "\n";
            *exit_code = kExitUnreachable;
        } else {
            std::cerr << "mallctl: malld refused: " << r.error << "\n";
            *exit_code = kExitRefused;
        }
        return std::nullopt;
    }

    mall::CtlClient &client() { return *client_; }
    const std::string &path() const { return path_; }

private:
    std::string path_;
    std::optional<mall::CtlClient> client_;
};

// ---------------------------------------------------------------------------------------------
// Formatting.

std::string text_or_dash(const std::string &s) { return s.empty() ? "-" : s; }

std::string field_string(const json &j, const char *key) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return "";
    if (it->is_string()) return it->get<std::string>();
    return it->dump();
}

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
        if (number("oversubscribed_seconds") > 0) {
            std::snprintf(buf, sizeof buf, "%.1f s oversubscribed", number("oversubscribed_seconds"));
            parts.push_back(buf);
        }
    }

    // Anything else the event carries, so nothing is hidden from the reader.
    static const char *known[] = {"event", "time", "job", "generation", "min", "max", "pids", "uid",
                                  "weight", "cpus", "ncpus", "growing", "latency_us", "reason", "policy",
                                  "duration_seconds", "core_seconds", "lent_core_seconds",
                                  "oversubscribed_seconds", "resizes", "ack_timeouts", "acks",
                                  "ack_latency_seconds_sum"};
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
    out << "\n";
    if (jobs.empty()) {
        out << "no jobs registered\n";
        return;
    }
    const std::vector<std::string> header = {"JOB", "UID", "MIN", "MAX", "CPUS", "NCPUS", "THREADS",
                                             "GEN", "ACKED", "STATE", "PIDS"};
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
                        f("generation"), f("acked_generation"), state,
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
    if (cgroup_lines.empty()) return;
    out << "\nCGROUPS\n";
    for (const auto &line : cgroup_lines) out << line << "\n";
}

// ---------------------------------------------------------------------------------------------
// Commands. Each parses its own arguments (after the global ones were taken out), validates
// them, then talks to malld. `help` is set when --help appeared anywhere.

struct Globals {
    std::string socket;
};

// Parses a command's own arguments; throws po::error on bad ones.
po::variables_map parse_command(const std::vector<std::string> &args,
                                const po::options_description &options,
                                const po::positional_options_description &positional) {
    po::variables_map vm;
    po::store(po::command_line_parser(args).options(options).positional(positional).run(), vm);
    po::notify(vm);
    return vm;
}

// malld's status object (for status, and the reporting commands of tools/mallctl_reports.cpp).
// `timeout` bounds the request (a live view asks again soon, so it waits less than a script).
StatusFetcher status_fetcher(const Globals &g, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    return [socket = g.socket, timeout](int *exit_code) -> std::optional<json> {
        Session s(socket);
        if (!s.connect()) {
            *exit_code = kExitUnreachable;
            return std::nullopt;
        }
        auto body = s.request(mall::proto::Type::Status, json::object(), exit_code, timeout);
        if (body) body->erase("ok");
        return body;
    };
}

int cmd_status(const Globals &g, const std::vector<std::string> &args) {
    po::options_description opts;
    opts.add_options()("json", po::bool_switch(), "");
    po::positional_options_description pos;
    po::variables_map vm;
    try {
        vm = parse_command(args, opts, pos);
    } catch (const po::error &e) {
        return usage_error("status", e.what());
    }
    int rc = kExitOk;
    auto body = status_fetcher(g)(&rc);
    if (!body) return rc;
    if (vm["json"].as<bool>())
        std::cout << body->dump(2) << "\n";
    else
        print_status_table(*body, std::cout);
    return kExitOk;
}

int cmd_set(const Globals &g, const std::vector<std::string> &args) {
    po::options_description opts;
    opts.add_options()("job", po::value<std::string>(), "")("cpus", po::value<std::string>(), "")(
        "weight", po::value<std::string>(), "")("threads", po::value<std::string>(), "")(
        "signal-control", po::value<std::string>(), "");
    po::positional_options_description pos;
    pos.add("job", 1);
    po::variables_map vm;
    try {
        vm = parse_command(args, opts, pos);
    } catch (const po::error &e) {
        return usage_error("set", e.what());
    }
    if (!vm.count("job")) return usage_error("set", "name the job to set, e.g. mallctl set train-42 --cpus 0-3");
    if (!vm.count("cpus") && !vm.count("weight") && !vm.count("threads") && !vm.count("signal-control"))
        return usage_error("set",
                           "give --cpus LIST|auto, --weight W, --threads N|auto or --signal-control on|off "
                           "(one or more), e.g. --cpus 0-3");
    const std::string job = vm["job"].as<std::string>();
    if (auto why = mall::proto::invalid_job_name(job)) return usage_error("set", "bad job name '" + job + "': " + *why);
    json request{{"job", job}};
    if (vm.count("cpus")) {
        std::string cpus_text = vm["cpus"].as<std::string>();
        if (cpus_text != "auto") {
            auto cpus = parse_cpus_or_complain("set", cpus_text, "mallctl set " + job + " --cpus 0-3");
            if (!cpus) return kExitUsage;
            cpus_text = cpus->to_string();
        }
        request["cpus"] = cpus_text;
    }
    if (vm.count("weight")) {
        const std::string text = vm["weight"].as<std::string>();
        char *end = nullptr;
        errno = 0;
        const double weight = std::strtod(text.c_str(), &end);
        if (text.empty() || *end != '\0' || errno != 0 || !mall::proto::valid_weight(weight))
            return usage_error("set", std::string("--weight must be ") + mall::proto::kWeightRule +
                                          ", e.g. --weight 2 (got '" + text + "')");
        request["weight"] = weight;
    }
    if (vm.count("threads")) {
        const std::string text = vm["threads"].as<std::string>();
        if (text == "auto") {
            request["threads"] = "auto";
        } else {
            char *end = nullptr;
            errno = 0;
            const long n = std::strtol(text.c_str(), &end, 10);
            if (text.empty() || *end != '\0' || errno != 0 || n < 1 || n > mall::CpuSet::kMaxCpus)
                return usage_error("set", "--threads must be 1 to " + std::to_string(mall::CpuSet::kMaxCpus) +
                                              " (at most the cores the job holds) or auto, e.g. --threads 1 (got '" +
                                              text + "')");
            request["threads"] = static_cast<int>(n);
        }
    }
    if (vm.count("signal-control")) {
        const std::string text = vm["signal-control"].as<std::string>();
        if (text != "on" && text != "off")
            return usage_error("set", "--signal-control takes on or off, e.g. --signal-control on (got '" + text + "')");
        request["signal_control"] = text == "on";
    }
    Session s(g.socket);
    if (!s.connect()) return kExitUnreachable;
    int rc = kExitOk;
    auto body = s.request(mall::proto::Type::Set, request, &rc);
    if (!body) return rc;
    std::cout << "job " << job << ":";
    if (body->contains("cpus")) std::cout << " cpus " << text_or_dash(field_string(*body, "cpus"));
    if (body->contains("weight")) std::cout << " weight " << field_string(*body, "weight");
    if (body->contains("threads")) std::cout << " threads " << field_string(*body, "threads");
    if (body->contains("signal_control") && (*body)["signal_control"].is_boolean())
        std::cout << " signal-control " << ((*body)["signal_control"].get<bool>() ? "on" : "off");
    std::cout << "\n";
    if (request.contains("threads") && !body->contains("threads")) {
        // A malld before API 0.3 ignores the field next to --cpus or --weight.
        std::cerr << "mallctl set: malld at " << g.socket
                  << " did not apply --threads (it predates thread counts, API 0.3); upgrade malld\n";
        return kExitRefused;
    }
    if (request.contains("signal_control") && !body->contains("signal_control")) {
        // A malld before signal control (issue 17) ignores the field next to another option.
        std::cerr << "mallctl set: malld at " << g.socket
                  << " ignored --signal-control (it predates signal control); upgrade malld\n";
        return kExitRefused;
    }
    return kExitOk;
}

int cmd_policy(const Globals &g, const std::vector<std::string> &args) {
    po::options_description opts;
    opts.add_options()("name", po::value<std::string>(), "");
    po::positional_options_description pos;
    pos.add("name", 1);
    po::variables_map vm;
    try {
        vm = parse_command(args, opts, pos);
    } catch (const po::error &e) {
        return usage_error("policy", e.what());
    }
    if (!vm.count("name") || vm["name"].as<std::string>().empty())
        return usage_error("policy", "name the policy: equal, static, weighted or throughput");
    Session s(g.socket);
    if (!s.connect()) return kExitUnreachable;
    int rc = kExitOk;
    auto body = s.request(mall::proto::Type::Policy, json{{"name", vm["name"].as<std::string>()}}, &rc);
    if (!body) return rc;
    std::cout << "policy " << text_or_dash(field_string(*body, "policy")) << "\n";
    return kExitOk;
}

int cmd_reclaim_or_release(const Globals &g, const std::vector<std::string> &args, bool reclaim) {
    const std::string name = reclaim ? "reclaim" : "release";
    po::options_description opts;
    opts.add_options()("cpus", po::value<std::string>(), "")("owner", po::value<std::string>(), "");
    if (reclaim) opts.add_options()("timeout-ms", po::value<long>()->default_value(30000), "");
    po::positional_options_description pos;
    pos.add("cpus", 1);
    po::variables_map vm;
    try {
        vm = parse_command(args, opts, pos);
    } catch (const po::error &e) {
        return usage_error(name, e.what());
    }
    std::optional<std::string> owner;
    if (vm.count("owner")) {
        owner = vm["owner"].as<std::string>();
        if (auto why = mall::proto::invalid_job_name(*owner))
            return usage_error(name, "bad --owner \"" + *owner + "\": " + *why);
    }
    json request = json::object();
    if (owner) request["owner"] = *owner;
    std::optional<mall::CpuSet> cpus;
    if (!reclaim && owner && vm.count("cpus"))
        return usage_error(name, "give either a cpu list or --owner, not both");
    if (reclaim || !owner) {
        if (!vm.count("cpus")) return usage_error(name, "name the cpus, e.g. mallctl " + name + " 2-3");
        cpus = parse_cpus_or_complain(name, vm["cpus"].as<std::string>(), "mallctl " + name + " 2-3");
        if (!cpus) return kExitUsage;
        request["cpus"] = cpus->to_string();
    }
    long timeout_ms = 10000;
    if (reclaim) {
        timeout_ms = vm["timeout-ms"].as<long>();
        if (timeout_ms < 1 || timeout_ms > 24L * 3600 * 1000)
            return usage_error(name, "--timeout-ms must be between 1 and 86400000 (milliseconds)");
    }
    Session s(g.socket);
    if (!s.connect()) return kExitUnreachable;
    int rc = kExitOk;
    auto body = s.request(reclaim ? mall::proto::Type::Reclaim : mall::proto::Type::Release,
                          request, &rc, std::chrono::milliseconds(timeout_ms));
    if (!body) return rc;
    std::cout << (reclaim ? "reclaimed cpus " : "released cpus ")
              << text_or_dash(body->contains("cpus") ? field_string(*body, "cpus") : request.value("cpus", ""))
              << (owner ? " (owner " + *owner + ")" : std::string()) << "\n";
    return kExitOk;
}

int cmd_watch(const Globals &g, const std::vector<std::string> &args) {
    po::options_description opts;
    opts.add_options()("json", po::bool_switch(), "")("count", po::value<long>(), "")(
        "timeout-s", po::value<double>(), "");
    po::positional_options_description pos;
    po::variables_map vm;
    try {
        vm = parse_command(args, opts, pos);
    } catch (const po::error &e) {
        return usage_error("watch", e.what());
    }
    long count = -1;
    if (vm.count("count")) {
        count = vm["count"].as<long>();
        if (count < 1) return usage_error("watch", "--count must be at least 1 (number of events)");
    }
    std::optional<std::chrono::steady_clock::time_point> deadline;
    if (vm.count("timeout-s")) {
        double t = vm["timeout-s"].as<double>();
        if (!(t > 0) || !std::isfinite(t) || t > 1e7)
            return usage_error("watch", "--timeout-s must be a positive number of seconds, e.g. 10 or 0.5");
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

using Handler = std::function<int(const Globals &, const std::vector<std::string> &)>;

const std::map<std::string, Handler> &handlers() {
    static const std::map<std::string, Handler> table = {
        {"status", cmd_status},
        {"set", cmd_set},
        {"policy", cmd_policy},
        {"reclaim", [](const Globals &g, const std::vector<std::string> &a) { return cmd_reclaim_or_release(g, a, true); }},
        {"release", [](const Globals &g, const std::vector<std::string> &a) { return cmd_reclaim_or_release(g, a, false); }},
        {"watch", cmd_watch},
        {"metrics", [](const Globals &g, const std::vector<std::string> &a) {
             return cmd_metrics(a, status_fetcher(g), [](const std::string &what) { return usage_error("metrics", what); });
         }},
        {"history", [](const Globals &g, const std::vector<std::string> &a) {
             return cmd_history(a, status_fetcher(g), [](const std::string &what) { return usage_error("history", what); });
         }},
        {"top", [](const Globals &g, const std::vector<std::string> &a) {
             // A stuck malld holds top's keys (q, Ctrl-C) only as long as one request may wait.
             return cmd_top(a, status_fetcher(g, std::chrono::seconds(2)),
                            [](const std::string &what) { return usage_error("top", what); });
         }},
        {"signal", [](const Globals &, const std::vector<std::string> &a) {
             return cmd_signal(a, [](const std::string &what) { return usage_error("signal", what); });
         }},
    };
    return table;
}

int run(int argc, char **argv) {
    // Step 1: the global options and the command name; the rest is left for the command.
    po::options_description global;
    global.add_options()("socket", po::value<std::string>(), "")("help,h", po::bool_switch(), "")(
        "version", po::bool_switch(), "")("command", po::value<std::string>(), "")(
        "args", po::value<std::vector<std::string>>(), "");
    po::positional_options_description pos;
    pos.add("command", 1).add("args", -1);

    po::variables_map vm;
    std::vector<std::string> rest;
    try {
        po::parsed_options parsed = po::command_line_parser(argc, argv)
                                        .options(global)
                                        .positional(pos)
                                        .allow_unregistered()
                                        .run();
        po::store(parsed, vm);
        po::notify(vm);
        // Everything but the global options and the command name, in the order given.
        for (const po::option &o : parsed.options) {
            if (o.unregistered || o.string_key == "args")
                rest.insert(rest.end(), o.original_tokens.begin(), o.original_tokens.end());
        }
    } catch (const po::error &e) {
        return usage_error("", e.what());
    }

    const bool help = vm["help"].as<bool>();
    if (vm["version"].as<bool>()) {
        std::cout << version_text() << "\n";
        return kExitOk;
    }
    if (!vm.count("command")) {
        if (help) {
            print_main_help(std::cout);
            return kExitOk;
        }
        if (!rest.empty()) return usage_error("", "unknown option '" + rest.front() + "'");
        return usage_error("", "name a command: " + command_names());
    }
    const std::string command = vm["command"].as<std::string>();

    if (command == "help") {
        if (rest.empty()) {
            print_main_help(std::cout);
            return kExitOk;
        }
        const Command *c = find_command(rest.front());
        if (!c) return usage_error("", "no command '" + rest.front() + "'; the commands are " + command_names(", "));
        print_command_help(*c, std::cout);
        return kExitOk;
    }
    const Command *c = find_command(command);
    auto handler = handlers().find(command);
    if (!c || handler == handlers().end()) {
        if (!command.empty() && command[0] == '-')
            return usage_error("", "unknown option '" + command + "'");
        return usage_error("", "unknown command '" + command + "'; the commands are " + command_names(", "));
    }
    if (help) {
        print_command_help(*c, std::cout);
        return kExitOk;
    }
    Globals g;
    if (vm.count("socket")) {
        g.socket = vm["socket"].as<std::string>();
        if (g.socket.empty())
            return usage_error(command,
                               std::string("--socket needs a path, e.g. --socket ") + mall::kDefaultSocketPath);
    }
    return handler->second(g, rest);
}

}  // namespace

int main(int argc, char **argv) {
    try {
        return run(argc, argv);
    } catch (const std::exception &e) {
        std::cerr << "mallctl: " << e.what() << "\n";
        return kExitRefused;
    }
}
