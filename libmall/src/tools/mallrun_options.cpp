// SPDX-License-Identifier: BSD-3-Clause
// mallrun_options.cpp — mallrun's command line (see mallrun_options.hpp): the help, the usage
// errors, the split at "--", --malleable and every other option's checks.
#include "tools/mallrun_options.hpp"

#include <unistd.h>

#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <boost/program_options.hpp>

#include "common/core_range.hpp"
#include "common/protocol.hpp"
#include "common/rules.hpp"
#include "mall/mall.h"
#include "tools/exit_codes.hpp"
#include "tools/tool_cli.hpp"

namespace po = boost::program_options;

namespace mall::tools::mallrun {

namespace {

const char *const kUsageLine =
    "usage: mallrun [--socket PATH] --malleable=MIN[:MAX] [--job NAME] [--weight W]\n"
    "               [--cgroup auto|own|in-place] [--require] [--verbose] -- CMD [ARGS...]\n"
    "       mallrun [--socket PATH] --container[=podman|docker] --malleable=MIN[:MAX] [--job NAME]\n"
    "               [--weight W] [--require] [--verbose] -- ENGINE run [RUN-OPTIONS] IMAGE [CMD...]\n";

void print_help() {
    std::cout
        << "mallrun - run a command as a malleable job under malld\n"
           "\n"
        << kUsageLine
        << "\n"
           "mallrun starts CMD held back, registers it with malld (the node manager) as a job\n"
           "that may use between MIN and MAX cores, waits until malld has given it its first\n"
           "cores, then lets CMD run with MALL_SOCKET and MALL_JOB_ID in its environment, so that\n"
           "libmall inside CMD attaches to the job and follows the cores malld gives it at each\n"
           "training step (and MALL_MAX, the most cores it may grow to, which a framework sizes\n"
           "its thread pools for: mall.tensorflow.size_pools() reads it). When CMD ends, mallrun\n"
           "deregisters the job and exits with CMD's status.\n"
           "\n"
           "Options:\n"
           "  --malleable=MIN[:MAX]  the job's core limits: integers >= 1 with MIN <= MAX.\n"
           "                         Without MAX the job may grow to the whole pool.\n"
           "  --job NAME             the job's name (1-64 characters from A-Z a-z 0-9 . _ : -);\n"
           "                         default: <basename of CMD>-<pid of mallrun>. Names\n"
           "                         starting with self- (self-registered jobs) are refused,\n"
           "                         slurm- (Slurm jobs) unless run as root; a default name\n"
           "                         that would start so gets run- in front\n"
           "  --weight W             the job's relative share for weight-aware policies (> 0,\n"
           "                         default 1; the equal and static policies ignore it)\n"
           "  --cgroup MODE          where malld's cgroup backends enforce the job's cores:\n"
           "                         auto (default): in place when CMD starts in a cgroup made\n"
           "                           for it (a Slurm step, a container, a systemd scope made\n"
           "                           with systemd-run --scope), else in a folder of malld's own;\n"
           "                         own: always in malld's folder (CMD is moved there);\n"
           "                         in-place: always where CMD starts; refused when that is the\n"
           "                           root, malld's own cgroup or a login session.\n"
           "                         In place, malld narrows and widens that cgroup's cpuset and\n"
           "                         never moves CMD out of it. Ignored by the affinity backend.\n"
           "  --container[=ENGINE]   CMD runs a container: `podman run ...` or `docker run ...`\n"
           "                         (ENGINE: podman or docker; default: CMD's program name).\n"
           "                         malld makes the job's cgroup, and mallrun adds to the run,\n"
           "                         right after its `run` word:\n"
           "                           --cgroup-parent=<the job's cgroup>  (the container is\n"
           "                             created inside the job's cpuset and resized with it)\n"
           "                           --volume=<socket folder>:<socket folder>:ro\n"
           "                             (read-only: the container may connect, not write)\n"
           "                           --env=MALL_SOCKET=<socket> --env=MALL_JOB_ID=<job>\n"
           "                           --env=MALL_MAX=<the job's MAX>\n"
           "                         and, for podman, --cgroup-manager=DRIVER before `run`.\n"
           "                         The job's cgroup follows the engine's cgroup driver (CMD's\n"
           "                         podman --cgroup-manager, else `ENGINE info`, asked only where\n"
           "                         systemd runs): cgroupfs: a folder of malld's, /mall/job_<job>;\n"
           "                         systemd (podman 5's and docker's default on a systemd host\n"
           "                         with cgroup v2): the slice mall-<job>.slice in mall.slice,\n"
           "                         which malld resizes through systemd (AllowedCPUs). On cgroup\n"
           "                         v1 podman is told cgroupfs; docker must use cgroupfs there.\n"
           "                         libmall inside the container attaches by itself; so does a\n"
           "                         process added with `podman exec`/`docker exec` (malld knows\n"
           "                         it by its cgroup), whatever its uid inside. The job ends when\n"
           "                         the container's last process ends: with `run -d` mallrun\n"
           "                         returns at once and the job lives on with the container.\n"
           "                         Needs malld's cgroup backend (cgroup-v1 or cgroup-v2).\n"
           "  --socket PATH          malld's socket (default: $MALL_SOCKET, else "
        << mall::kDefaultSocketPath
        << ")\n"
           "  --require              fail (exit 3) when malld cannot be reached, instead of running\n"
           "                         CMD without malleability\n"
           "  -v, --verbose          say what mallrun does (registration, cores, deregistration)\n"
           "  -h, --help             show this text\n"
           "  --version              print the version\n"
           "\n"
           "The `--` before CMD is required: everything after it belongs to CMD.\n"
           "Registering needs root or an admin uid of malld (malld --admin-uid).\n"
           "\n"
           "Signals: SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 sent to mallrun are\n"
           "passed on to CMD (a Ctrl-C from the terminal reaches CMD directly).\n"
           "\n"
           "Exit status:\n"
           "  CMD's exit status, or 128+N when CMD was killed by signal N\n"
           "  1    malld refused the registration (its reason is printed)\n"
           "  2    usage error\n"
           "  3    malld unreachable and --require given\n"
           "  127  CMD could not be run\n"
           "  When malld cannot be reached (and no --require), mallrun warns and runs CMD as an\n"
           "  ordinary, non-malleable process.\n"
           "\n"
           "Examples:\n"
           "  sudo mallrun --malleable=1:4 -- ./train --epochs 3\n"
           "  sudo mallrun --malleable=2 --job resnet-a --weight 2 -- python3 train.py\n"
           "  mallrun --socket /tmp/mall/malld.sock --malleable=1:2 --require -- mall_train_sgd\n"
           "  sudo mallrun --container --malleable=1:4 --job tf-a -- \\\n"
           "       podman run --rm -v /data:/data IMAGE python3 /data/train.py\n"
           "  sudo mallrun --container --malleable=1:2 --job svc -- docker run -d IMAGE ./train\n";
}

int usage_error(const std::string &what) {
    std::cerr << "mallrun: " << what << "\n" << kUsageLine << "see `mallrun --help`\n";
    return kExitUsage;
}

// --- --malleable=MIN[:MAX] ------------------------------------------------------------------

// MIN[:MAX] by the tools' shared parser (common/core_range.hpp), counts 1 to mall::kMaxCoreCount.
// Only MAX below MIN gets its own words; every other fault (a 0 included) the rule alone.
std::optional<Limits> parse_malleable(const std::string &text, std::string *error) {
    const std::string allowed = std::string("--malleable takes ") + mall::kCoreRangeRule +
                                " (e.g. --malleable=1:4, or --malleable=2 to grow up to the whole pool)";
    const mall::CoreRangeParse parsed = mall::parse_core_range(text, mall::kMaxCoreCount);
    if (!parsed.ok()) {
        if (parsed.fault == mall::CoreRangeFault::max_below_min && *parsed.range.max != 0)
            *error = "bad --malleable value '" + text + "': MIN (" + std::to_string(parsed.range.min) +
                     ") is larger than MAX (" + std::to_string(*parsed.range.max) + "); " + allowed;
        else
            *error = "bad --malleable value '" + text + "': " + allowed;
        return std::nullopt;
    }
    Limits limits;
    limits.min = static_cast<int>(parsed.range.min);
    if (parsed.range.max) limits.max = static_cast<int>(*parsed.range.max);
    return limits;
}

// --- command line splitting ------------------------------------------------------------------

// mallrun's own options come before "--", the command after it. The separator is required so
// that CMD's own options can never be taken for mallrun's. Returns false with *error when a word
// that is neither an option nor an option's value stands before "--" (or "--" is missing).
bool split_command_line(int argc, char **argv, std::vector<std::string> *own,
                        std::vector<std::string> *command, std::string *error) {
    static const char *const with_value[] = {"--socket", "--job", "--weight", "--malleable", "--cgroup"};
    int i = 1;
    bool separator = false;
    std::string stray;
    for (; i < argc; ++i) {
        std::string arg = argv[i];
        if (arg == "--") {
            separator = true;
            ++i;
            break;
        }
        if (arg.size() < 2 || arg[0] != '-') {
            if (stray.empty()) stray = arg;
            continue;
        }
        own->push_back(arg);
        for (const char *name : with_value) {
            if (arg == name && i + 1 < argc) {
                own->push_back(argv[++i]);
                break;
            }
        }
    }
    for (; i < argc; ++i) command->push_back(argv[i]);
    if (!stray.empty()) {
        *error = separator ? "unexpected argument '" + stray + "' before --; the command goes after --"
                           : "put the command after -- (got '" + stray +
                                 "' without it), e.g. mallrun --malleable=1:2 -- " + stray;
        return false;
    }
    return true;
}

// Put before a default name that would start with a reserved prefix (./self-play.py, slurm-x.sh).
constexpr const char *kDefaultNameGuard = "run-";

// A valid job name from CMD's basename: invalid characters become '_', "run-" in front of a name
// under a reserved prefix (common/rules.hpp: self-, slurm-), at most kMaxJobNameLength characters.
std::string default_job_name(const std::string &cmd) {
    std::string base = cmd.substr(cmd.find_last_of('/') == std::string::npos ? 0 : cmd.find_last_of('/') + 1);
    std::string clean;
    for (char c : base) clean += mall::proto::is_job_name_char(c) ? c : '_';
    if (clean.empty()) clean = "job";
    if (mall::reserved_job_prefix(clean)) clean = kDefaultNameGuard + clean;
    std::string suffix = "-" + std::to_string(getpid());
    constexpr size_t kMax = mall::proto::kMaxJobNameLength;
    if (clean.size() + suffix.size() > kMax) clean.resize(kMax - suffix.size());
    return clean + suffix;
}

}  // namespace

std::optional<int> parse_command_line(int argc, char **argv, Options *options) {
    Options &o = *options;
    std::vector<std::string> own;
    std::string split_error;
    const bool split_ok = split_command_line(argc, argv, &own, &o.command, &split_error);

    po::options_description opts;
    opts.add_options()("socket", po::value<std::string>(), "")("malleable", po::value<std::string>(), "")(
        "job", po::value<std::string>(), "")("weight", po::value<double>(), "")(
        "cgroup", po::value<std::string>(), "")(
        "container", po::value<std::string>()->implicit_value(""), "")(
        "require", po::bool_switch(), "")("verbose,v", po::bool_switch(), "");
    mall::tools::add_help_and_version(opts);
    po::variables_map vm;
    try {
        po::store(po::command_line_parser(own).options(opts).run(), vm);
        po::notify(vm);
    } catch (const po::error &e) {
        return usage_error(e.what());
    }
    if (auto answered = mall::tools::answer_help_or_version(vm, "mallrun", print_help)) return answered;
    if (!split_ok) return usage_error(split_error);
    if (!vm.count("malleable"))
        return usage_error("--malleable=MIN[:MAX] is required (e.g. --malleable=1:4)");
    std::string error;
    auto limits = parse_malleable(vm["malleable"].as<std::string>(), &error);
    if (!limits) return usage_error(error);
    o.limits = *limits;
    if (vm.count("weight")) {
        o.weight = vm["weight"].as<double>();
        if (!mall::proto::valid_weight(o.weight))
            return usage_error(std::string("--weight must be ") + mall::proto::kWeightRule + " (e.g. 1 or 2.5)");
    }
    if (o.command.empty()) return usage_error("no command given; put it after --, e.g. mallrun --malleable=1:2 -- ./train");
    o.job = vm.count("job") ? vm["job"].as<std::string>() : default_job_name(o.command[0]);
    if (auto why = mall::proto::invalid_job_name(o.job)) return usage_error("bad job name '" + o.job + "': " + *why);
    // Root may name a Slurm job by hand (slurm-<jobid>, as the plugin would); nobody a self-registered one.
    const auto namer = ::geteuid() == 0 ? mall::JobNamer::Root : mall::JobNamer::Other;
    if (std::string reserved = mall::reserved_job_name_problem(o.job, namer); !reserved.empty())
        return usage_error("bad job name '" + o.job + "': " + reserved + "; choose another --job");
    if (vm.count("cgroup")) {
        o.cgroup_mode = vm["cgroup"].as<std::string>();
        if (o.cgroup_mode != "auto" && o.cgroup_mode != "own" && o.cgroup_mode != "in-place")
            return usage_error("bad --cgroup '" + o.cgroup_mode + "': use auto, own or in-place");
    }
    if (vm.count("container")) {
        o.container = true;
        if (vm.count("cgroup"))
            return usage_error("--container and --cgroup do not go together: a container job always "
                               "lives in the cgroup folder malld makes for it");
        o.engine = vm["container"].as<std::string>();
        if (!o.engine.empty() && o.engine != "podman" && o.engine != "docker")
            return usage_error("bad --container '" + o.engine + "': use --container (the engine from "
                               "CMD's name), --container=podman or --container=docker");
        if (o.engine.empty()) o.engine = program_name(o.command[0]);
        if (std::string problem = container_command_problem(o.command, o.engine); !problem.empty())
            return usage_error(problem);
    }
    o.require = vm["require"].as<bool>();
    o.verbose = vm["verbose"].as<bool>();
    if (vm.count("socket")) {
        o.socket = vm["socket"].as<std::string>();
        if (o.socket.empty())
            return usage_error(std::string("--socket needs a path, e.g. --socket ") + mall::kDefaultSocketPath);
    }
    return std::nullopt;
}

}  // namespace mall::tools::mallrun
