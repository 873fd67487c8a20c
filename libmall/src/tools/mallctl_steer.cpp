// SPDX-License-Identifier: BSD-3-Clause
// mallctl_steer.cpp — mallctl's steering commands, `set`, `policy`, `reclaim`, `release` and
// `record` (see mallctl_steer.hpp): their help, the local checks of every argument (job names, cpu
// lists, weights, thread counts) and the requests to malld.
#include "tools/mallctl_steer.hpp"

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include "common/cpuset.hpp"
#include "common/rules.hpp"
#include "tools/exit_codes.hpp"

namespace po = boost::program_options;
using nlohmann::json;

namespace mall::tools {

const char *const kSetSynopsis = "set JOB [--cpus LIST|auto] [--weight W] [--threads N|auto] [--signal-control on|off]";
const char *const kSetSummary = 
    "pin a job to cores or hand it back to the policy; set its weight, threads or signal control";
const std::string kSetDetails =
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
    "  sudo mallctl set train-42 --signal-control on\n";

const char *const kPolicySynopsis = "policy NAME";
const char *const kPolicySummary = "switch the allocation policy (equal, static, weighted, throughput)";
const char *const kPolicyDetails =
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
    "  sudo mallctl policy equal\n";

const char *const kReclaimSynopsis = "reclaim LIST [--owner JOB] [--timeout-ms N]";
const char *const kReclaimSummary = "take cores out of the pool; returns once no job holds them";
const char *const kReclaimDetails =
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
    "  sudo mallctl reclaim 0,2 --timeout-ms 5000\n";

const char *const kReleaseSynopsis = "release LIST | release --owner JOB";
const char *const kReleaseSummary = "give reclaimed cores back to the pool";
const char *const kReleaseDetails =
    "Puts the cores in LIST back into the malleable pool (after `mallctl reclaim`); the policy\n"
    "lends them out again at once. With --owner JOB instead of a list: releases every core\n"
    "reserved for JOB and ends JOB's registration if it is still there (what a Slurm epilog does;\n"
    "an owner with nothing reserved is fine).\n"
    "\n"
    "Needs root or an admin uid of malld.\n"
    "\n"
    "Examples:\n"
    "  sudo mallctl release 6-7\n"
    "  sudo mallctl release --owner slurm-1234\n";

const char *const kRecordSynopsis = "record JOB";
const char *const kRecordSummary = "write a Slurm job's figures so far into its AdminComment now";
const char *const kRecordDetails =
    "Writes this node's figures for the Slurm job JOB (slurm-<jobid>, the name the Slurm plugin\n"
    "registers it under) into the job's AdminComment now, as they are so far, and returns once\n"
    "slurmctld has taken them. malld writes them there by itself when the job ends on this node;\n"
    "record is for a long job you want to read before it ends (`scontrol show job JOBID`). The\n"
    "node's segment is the one the end writes, marked with the time T it was taken (Unix seconds):\n"
    "  mall:NODE:lent_core_s=..,core_s=..,resizes=..,ack_timeouts=..,oversub_s=..,running_as_of=T\n"
    "and the job's end replaces it with the last figures. When the job's end is being recorded at\n"
    "that moment, that update is the answer: mallctl prints its figures and says they are final.\n"
    "\n"
    "Each node writes only its own segment: for a job on several nodes, run record on each of them\n"
    "(e.g. `pdsh -w NODES mallctl record slurm-1234`). It costs slurmctld one job read and one job\n"
    "update for a job on one node, and one more read (to see that no other node's write replaced\n"
    "it) for a job on several.\n"
    "\n"
    "malld must run with --slurm. mallctl waits up to 10 s for slurmctld; past that malld says so,\n"
    "and the update stays queued until slurmctld answers. slurmctld refuses figures for a job it\n"
    "has finished: mallctl prints Slurm's words and exits 1.\n"
    "\n"
    "Needs root or an admin uid of malld.\n"
    "\n"
    "Examples:\n"
    "  sudo mallctl record slurm-1234\n"
    "  sudo pdsh -w node[01-08] mallctl record slurm-1234\n";

namespace {

// Parses a cpu list locally; on failure prints the parser's explanation and an example.
std::optional<mall::CpuSet> parse_cpus_or_complain(const UsageError &usage_error, const std::string &text,
                                                   const std::string &example) {
    std::string error;
    auto cpus = mall::CpuSet::parse(text, &error);
    if (!cpus) {
        usage_error(error + "\n  example: " + example);
        return std::nullopt;
    }
    if (cpus->empty()) {
        usage_error("the cpu list is empty; name at least one cpu\n  example: " + example);
        return std::nullopt;
    }
    return cpus;
}

int cmd_reclaim_or_release(const Globals &g, const std::vector<std::string> &args, bool reclaim,
                           const UsageError &usage_error) {
    const std::string name = reclaim ? "reclaim" : "release";
    po::options_description opts;
    opts.add_options()("cpus", po::value<std::string>(), "")("owner", po::value<std::string>(), "");
    if (reclaim) opts.add_options()("timeout-ms", po::value<long>()->default_value(30000), "");
    po::positional_options_description pos;
    pos.add("cpus", 1);
    po::variables_map vm = parse_command(args, opts, pos);
    std::optional<std::string> owner;
    if (vm.count("owner")) {
        owner = vm["owner"].as<std::string>();
        if (auto why = mall::proto::invalid_job_name(*owner))
            return usage_error("bad --owner \"" + *owner + "\": " + *why);
    }
    json request = json::object();
    if (owner) request["owner"] = *owner;
    std::optional<mall::CpuSet> cpus;
    if (!reclaim && owner && vm.count("cpus"))
        return usage_error("give either a cpu list or --owner, not both");
    if (reclaim || !owner) {
        if (!vm.count("cpus")) return usage_error("name the cpus, e.g. mallctl " + name + " 2-3");
        cpus = parse_cpus_or_complain(usage_error, vm["cpus"].as<std::string>(), "mallctl " + name + " 2-3");
        if (!cpus) return kExitUsage;
        request["cpus"] = cpus->to_string();
    }
    long timeout_ms = 10000;
    if (reclaim) {
        timeout_ms = vm["timeout-ms"].as<long>();
        if (timeout_ms < 1 || timeout_ms > 24L * 3600 * 1000)
            return usage_error("--timeout-ms must be between 1 and 86400000 (milliseconds)");
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

}  // namespace

int cmd_set(const Globals &g, const std::vector<std::string> &args, const UsageError &usage_error) {
    po::options_description opts;
    opts.add_options()("job", po::value<std::string>(), "")("cpus", po::value<std::string>(), "")(
        "weight", po::value<std::string>(), "")("threads", po::value<std::string>(), "")(
        "signal-control", po::value<std::string>(), "");
    po::positional_options_description pos;
    pos.add("job", 1);
    po::variables_map vm = parse_command(args, opts, pos);
    if (!vm.count("job")) return usage_error("name the job to set, e.g. mallctl set train-42 --cpus 0-3");
    if (!vm.count("cpus") && !vm.count("weight") && !vm.count("threads") && !vm.count("signal-control"))
        return usage_error(
            "give --cpus LIST|auto, --weight W, --threads N|auto or --signal-control on|off "
            "(one or more), e.g. --cpus 0-3");
    const std::string job = vm["job"].as<std::string>();
    if (auto why = mall::proto::invalid_job_name(job)) return usage_error("bad job name '" + job + "': " + *why);
    json request{{"job", job}};
    if (vm.count("cpus")) {
        std::string cpus_text = vm["cpus"].as<std::string>();
        if (cpus_text != "auto") {
            auto cpus = parse_cpus_or_complain(usage_error, cpus_text, "mallctl set " + job + " --cpus 0-3");
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
            return usage_error(std::string("--weight must be ") + mall::proto::kWeightRule +
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
                return usage_error("--threads must be 1 to " + std::to_string(mall::CpuSet::kMaxCpus) +
                                              " (at most the cores the job holds) or auto, e.g. --threads 1 (got '" +
                                              text + "')");
            request["threads"] = static_cast<int>(n);
        }
    }
    if (vm.count("signal-control")) {
        const std::string text = vm["signal-control"].as<std::string>();
        if (text != "on" && text != "off")
            return usage_error("--signal-control takes on or off, e.g. --signal-control on (got '" + text + "')");
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

int cmd_policy(const Globals &g, const std::vector<std::string> &args, const UsageError &usage_error) {
    po::options_description opts;
    opts.add_options()("name", po::value<std::string>(), "");
    po::positional_options_description pos;
    pos.add("name", 1);
    po::variables_map vm = parse_command(args, opts, pos);
    if (!vm.count("name") || vm["name"].as<std::string>().empty())
        return usage_error("name the policy: equal, static, weighted or throughput");
    Session s(g.socket);
    if (!s.connect()) return kExitUnreachable;
    int rc = kExitOk;
    auto body = s.request(mall::proto::Type::Policy, json{{"name", vm["name"].as<std::string>()}}, &rc);
    if (!body) return rc;
    std::cout << "policy " << text_or_dash(field_string(*body, "policy")) << "\n";
    return kExitOk;
}

int cmd_reclaim(const Globals &g, const std::vector<std::string> &args, const UsageError &usage_error) {
    return cmd_reclaim_or_release(g, args, true, usage_error);
}

int cmd_release(const Globals &g, const std::vector<std::string> &args, const UsageError &usage_error) {
    return cmd_reclaim_or_release(g, args, false, usage_error);
}

int cmd_record(const Globals &g, const std::vector<std::string> &args, const UsageError &usage_error) {
    po::options_description opts;
    opts.add_options()("job", po::value<std::string>(), "");
    po::positional_options_description pos;
    pos.add("job", 1);
    po::variables_map vm = parse_command(args, opts, pos);
    if (!vm.count("job")) return usage_error("name the Slurm job, e.g. mallctl record slurm-1234");
    const std::string job = vm["job"].as<std::string>();
    if (auto why = mall::proto::invalid_job_name(job)) return usage_error("bad job name '" + job + "': " + *why);
    if (job.rfind(mall::kSlurmJobPrefix, 0) != 0)
        return usage_error("'" + job + "' is not a Slurm job's name: malld records figures in Slurm only for "
                           "slurm-<jobid>, e.g. mallctl record slurm-1234");
    Session s(g.socket);
    if (!s.connect()) return kExitUnreachable;
    int rc = kExitOk;
    // malld answers within 10 s (its own limit for slurmctld), with an error past it.
    auto body = s.request(mall::proto::Type::Record, json{{"job", job}}, &rc, std::chrono::seconds(30));
    if (!body) return rc;
    const bool final = body->value("final", false);
    std::cout << "job " << job << ": " << (final ? "its end was being recorded; final figures " : "recorded ")
              << text_or_dash(field_string(*body, "figures")) << "\n";
    return kExitOk;
}

}  // namespace mall::tools
