// SPDX-License-Identifier: BSD-3-Clause
// mallrun.cpp — runs a command as a malleable job without Slurm: forks CMD held on a pipe,
// registers the child's pid with malld (the reply comes once the job holds cpus), then lets it
// exec with MALL_SOCKET and MALL_JOB_ID set. Forwards signals, deregisters when the child ends,
// and exits with the child's code (128+signal when it was killed; 127 when CMD cannot run).
// With --container, CMD is a `podman run` or `docker run`: malld makes the job's cgroup first (a
// folder for the cgroupfs driver, a systemd slice for the systemd driver: container_engine.hpp),
// and mallrun adds to the run the options that put the container there (--cgroup-parent),
// bind-mount malld's socket folder and set MALL_SOCKET/MALL_JOB_ID inside; the job then ends with
// the container's last process (malld watches its cgroup), also for a detached container.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include "common/core_range.hpp"
#include "common/cpuset.hpp"
#include "common/ctl_client.hpp"
#include "common/protocol.hpp"
#include "common/rules.hpp"
#include "mall/mall.h"
#include "tools/container_engine.hpp"
#include "tools/exit_codes.hpp"

namespace po = boost::program_options;
using nlohmann::json;

namespace {

using namespace mall::tools;

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
           "                         default: <basename of CMD>-<pid of mallrun>\n"
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
           "                           --volume=<socket folder>:<socket folder>\n"
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

struct Limits {
    int min = 1;
    std::optional<int> max;  // nullopt: the whole pool
};

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

// A valid job name from CMD's basename: invalid characters become '_', at most kMaxJobNameLength
// characters.
std::string default_job_name(const std::string &cmd) {
    std::string base = cmd.substr(cmd.find_last_of('/') == std::string::npos ? 0 : cmd.find_last_of('/') + 1);
    std::string clean;
    for (char c : base) clean += mall::proto::is_job_name_char(c) ? c : '_';
    if (clean.empty()) clean = "job";
    std::string suffix = "-" + std::to_string(getpid());
    constexpr size_t kMax = mall::proto::kMaxJobNameLength;
    if (clean.size() + suffix.size() > kMax) clean.resize(kMax - suffix.size());
    return clean + suffix;
}

std::string absolute_path(const std::string &path) {
    if (path.empty() || path[0] == '/') return path;
    char cwd[4096];
    if (!getcwd(cwd, sizeof cwd)) return path;
    return std::string(cwd) + "/" + path;
}

// --- signals -------------------------------------------------------------------------------

volatile sig_atomic_t g_child = 0;
const int kForwarded[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};

void forward_signal(int sig, siginfo_t *info, void *) {
    // A signal the terminal generated (Ctrl-C, Ctrl-\, hang-up) went to the whole foreground
    // process group, the child included: passing it on would deliver it twice.
    if (info && info->si_code == SI_KERNEL) return;
    pid_t child = g_child;
    if (child > 0) kill(child, sig);
}

void install_forwarding() {
    struct sigaction sa {};
    sa.sa_sigaction = forward_signal;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    for (int sig : kForwarded) sigaction(sig, &sa, nullptr);
}

sigset_t forwarded_set() {
    sigset_t set;
    sigemptyset(&set);
    for (int sig : kForwarded) sigaddset(&set, sig);
    return set;
}

// --- running the command -------------------------------------------------------------------

[[noreturn]] void exec_command(const std::vector<std::string> &command) {
    std::vector<char *> args;
    for (const auto &a : command) args.push_back(const_cast<char *>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    int err = errno;
    std::string msg = "mallrun: cannot run " + command[0] + ": " + std::strerror(err) + "\n";
    if (write(STDERR_FILENO, msg.data(), msg.size()) < 0) {
    }
    _exit(kExitCannotRun);
}

int exit_code_of(int status) {
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return kExitRefused;
}

int wait_child(pid_t child) {
    int status = 0;
    while (waitpid(child, &status, 0) < 0) {
        if (errno != EINTR) {
            std::cerr << "mallrun: waiting for " << child << " failed: " << std::strerror(errno) << "\n";
            return kExitRefused;
        }
    }
    return status;
}

// --- containers ------------------------------------------------------------------------------

std::string quoted_command(const std::vector<std::string> &command) {
    std::string text;
    for (const auto &a : command) {
        if (!text.empty()) text += ' ';
        const bool plain = !a.empty() && a.find_first_of(" \t\n'\"$\\;&|<>()*?[]{}`!#~") == std::string::npos;
        text += plain ? a : "'" + a + "'";
    }
    return text;
}

struct Options {
    std::string socket;
    Limits limits;
    std::string job;
    double weight = mall::kDefaultWeight;
    std::string cgroup_mode = "auto";
    bool container = false;
    std::string engine;  // --container: podman or docker
    CgroupDriver driver = CgroupDriver::Cgroupfs;  // --container: how the engine makes cgroups
    bool require = false;
    bool verbose = false;
    std::vector<std::string> command;
};

// Runs `words` (no shell) with stdin from /dev/null and stderr kept, bounded by `limit`: its stdout,
// or nullopt with *error when it could not run, failed or took too long.
std::optional<std::string> capture_output(const std::vector<std::string> &words, std::chrono::seconds limit,
                                          std::string *error) {
    int out[2];
    if (pipe2(out, O_CLOEXEC) != 0) {
        *error = std::string("pipe failed: ") + std::strerror(errno);
        return std::nullopt;
    }
    pid_t pid = fork();
    if (pid < 0) {
        *error = std::string("fork failed: ") + std::strerror(errno);
        close(out[0]);
        close(out[1]);
        return std::nullopt;
    }
    if (pid == 0) {
        int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (null >= 0) dup2(null, STDIN_FILENO);
        dup2(out[1], STDOUT_FILENO);
        std::vector<char *> args;
        for (const auto &w : words) args.push_back(const_cast<char *>(w.c_str()));
        args.push_back(nullptr);
        execvp(args[0], args.data());
        _exit(kExitCannotRun);
    }
    close(out[1]);
    std::string text;
    const auto deadline = std::chrono::steady_clock::now() + limit;
    bool timed_out = false;
    for (;;) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
        if (left.count() <= 0) {
            timed_out = true;
            break;
        }
        pollfd p{out[0], POLLIN, 0};
        int ready = poll(&p, 1, static_cast<int>(left.count()));
        if (ready < 0 && errno == EINTR) continue;
        if (ready <= 0) {
            timed_out = ready == 0;
            break;
        }
        char buf[4096];
        ssize_t n = read(out[0], buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        text.append(buf, static_cast<size_t>(n));
    }
    close(out[0]);
    if (timed_out) kill(pid, SIGKILL);
    int status = wait_child(pid);
    if (timed_out) {
        *error = "it did not answer within " + std::to_string(limit.count()) + " s";
        return std::nullopt;
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        *error = WIFEXITED(status) && WEXITSTATUS(status) == kExitCannotRun
                     ? std::string("it could not be run")
                     : "it ended with status " + std::to_string(exit_code_of(status));
        return std::nullopt;
    }
    return text;
}

// True when /sys/fs/cgroup is the unified cgroup v2 hierarchy (where systemd sets cpusets).
bool unified_cgroup_hierarchy() {
    struct statfs fs {};
    constexpr long kCgroup2SuperMagic = 0x63677270;
    return statfs("/sys/fs/cgroup", &fs) == 0 && static_cast<long>(fs.f_type) == kCgroup2SuperMagic;
}

// The cgroup driver the engine will use for this run. Without systemd running here both engines
// use cgroupfs (podman falls back to it), so nothing is asked; otherwise CMD's podman
// --cgroup-manager, else the engine's own answer (`podman info`, `docker info`). systemd needs
// cgroup v2 (systemd sets cpusets on the unified hierarchy only): podman is then told to use
// cgroupfs, as before; docker's driver is its daemon's, so mallrun refuses with words.
// nullopt with *why on failure; else *why may hold a note for --verbose.
std::optional<CgroupDriver> choose_cgroup_driver(const Options &o, std::string *why) {
    struct stat st {};
    const bool systemd_here = lstat("/run/systemd/system", &st) == 0 && S_ISDIR(st.st_mode);
    std::optional<CgroupDriver> driver;
    if (o.engine == "podman") {
        if (auto named = explicit_cgroup_manager(o.command)) {
            driver = parse_cgroup_driver(*named);
            if (!driver) {
                *why = "podman --cgroup-manager='" + *named + "' is neither systemd nor cgroupfs";
                return std::nullopt;
            }
        }
    }
    if (!driver && !systemd_here) {
        *why = "systemd does not run here";
        return CgroupDriver::Cgroupfs;
    }
    if (!driver) {
        const auto info = engine_info_command(o.command, o.engine);
        std::string error;
        auto text = capture_output(info, std::chrono::seconds(60), &error);
        if (text) driver = parse_cgroup_driver(*text);
        if (!driver) {
            const std::string asked = "`" + quoted_command(info) + "` " +
                                      (text ? "answered '" + *text + "', neither systemd nor cgroupfs" : error);
            if (o.engine == "podman") {
                // podman run takes the driver mallrun names: the one that worked before.
                *why = "cannot ask podman for its cgroup manager (" + asked + "): using cgroupfs";
                return CgroupDriver::Cgroupfs;
            }
            *why = "cannot ask docker for its cgroup driver: " + asked + "; is dockerd running?";
            return std::nullopt;
        }
    }
    if (*driver == CgroupDriver::Systemd && !unified_cgroup_hierarchy()) {
        if (o.engine == "podman" && !explicit_cgroup_manager(o.command)) {
            *why = "podman's systemd manager on cgroup v1, where systemd sets no cpusets: using cgroupfs";
            return CgroupDriver::Cgroupfs;
        }
        *why = o.engine + " uses the systemd cgroup driver on cgroup v1, where systemd sets no cpusets, "
               "so malld could not resize the container; " +
               (o.engine == "docker" ? "configure dockerd with the cgroupfs driver (daemon.json: "
                                       "\"exec-opts\": [\"native.cgroupdriver=cgroupfs\"])"
                                     : "use podman --cgroup-manager=cgroupfs") +
               ", or boot with cgroup v2";
        return std::nullopt;
    }
    return driver;
}

// Tells malld the job is over; "unknown job" is fine (malld may have seen the exit first).
void deregister(const Options &o, const std::string &socket_path) {
    std::string error;
    auto client = mall::CtlClient::connect(socket_path, &error);
    if (!client) {
        std::cerr << "mallrun: warning: could not deregister job " << o.job << ": " << error
                  << " (malld notices the exit by itself)\n";
        return;
    }
    mall::CtlResult r =
        client->request(mall::proto::Type::Deregister, json{{"job", o.job}}, std::chrono::seconds(10));
    if (r.ok) {
        if (o.verbose) std::cerr << "mallrun: job " << o.job << " deregistered\n";
        return;
    }
    if (r.code == MALL_ERR_NOJOB) {
        if (o.verbose) std::cerr << "mallrun: job " << o.job << " was already gone from malld\n";
        return;
    }
    std::cerr << "mallrun: warning: could not deregister job " << o.job << ": " << r.error << "\n";
}

int run_malleable(const Options &o, mall::CtlClient &client, const std::string &socket_path) {
    // The pool size, when MAX was left out: "up to the whole pool".
    int max = 0;
    if (o.limits.max) {
        max = *o.limits.max;
    } else {
        mall::CtlResult status = client.request(mall::proto::Type::Status, json::object(),
                                                std::chrono::seconds(10));
        if (!status.ok) {
            std::cerr << "mallrun: cannot ask malld for the pool size: " << status.error << "\n";
            return status.code == MALL_ERR_NODAEMON ? kExitUnreachable : kExitRefused;
        }
        std::string error;
        std::string pool = status.body.value("pool", std::string());
        auto cpus = mall::CpuSet::parse(pool, &error);
        max = cpus ? cpus->count() : 0;
        if (cpus && max < o.limits.min) {
            std::cerr << "mallrun: --malleable=" << o.limits.min << " asks for at least " << o.limits.min
                      << " cores, but malld's pool has " << max << " (" << pool
                      << "); use a MIN of at most " << max << "\n";
            return kExitRefused;
        }
        if (max < o.limits.min) max = o.limits.min;  // unreadable pool: let malld judge
    }

    int gate[2];
    if (pipe2(gate, O_CLOEXEC) != 0) {
        std::cerr << "mallrun: pipe failed: " << std::strerror(errno) << "\n";
        return kExitRefused;
    }
    // Signals stay blocked across fork so neither side handles one half set up.
    sigset_t forwarded = forwarded_set(), previous;
    sigprocmask(SIG_BLOCK, &forwarded, &previous);
    pid_t child = fork();
    if (child < 0) {
        std::cerr << "mallrun: fork failed: " << std::strerror(errno) << "\n";
        sigprocmask(SIG_SETMASK, &previous, nullptr);
        return kExitRefused;
    }
    if (child == 0) {
        sigprocmask(SIG_SETMASK, &previous, nullptr);
        close(gate[1]);
        // A go byte (1), then for a container the job's cgroup folder, then end-of-file.
        std::string word;
        char buffer[512];
        for (;;) {
            ssize_t n = read(gate[0], buffer, sizeof buffer);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) break;
            word.append(buffer, static_cast<size_t>(n));
        }
        if (word.empty() || word[0] != 1) _exit(kExitRefused);  // mallrun gave up (refused, or it died)
        const std::string socket = absolute_path(socket_path);
        setenv("MALL_SOCKET", socket.c_str(), 1);
        setenv("MALL_JOB_ID", o.job.c_str(), 1);
        setenv("MALL_MAX", std::to_string(max).c_str(), 1);  // what a framework sizes its pools for
        if (o.container) {
            const auto command =
                container_command(o.command, o.engine, o.driver, word.substr(1), socket, o.job, max);
            if (o.verbose) {
                const std::string line = "mallrun: running " + quoted_command(command) + "\n";
                if (write(STDERR_FILENO, line.data(), line.size()) < 0) {
                }
            }
            exec_command(command);
        }
        exec_command(o.command);
    }
    g_child = child;
    close(gate[0]);
    install_forwarding();
    sigprocmask(SIG_SETMASK, &previous, nullptr);

    json body = {{"job", o.job},     {"uid", static_cast<int64_t>(getuid())},
                 {"pids", {child}},  {"min", o.limits.min},
                 {"max", max},       {"weight", o.weight}};
    if (o.cgroup_mode != "auto") body["cgroup"] = o.cgroup_mode;  // older mallds know no such field
    // A container job: the child (the engine's client) is only its launcher; malld makes the
    // folder the container goes in and finds the container's processes there.
    // With the systemd driver the engine takes a slice, which malld resizes through systemd.
    if (o.container) body["cgroup"] = o.driver == CgroupDriver::Systemd ? "container-systemd" : "container";
    if (o.verbose)
        std::cerr << "mallrun: registering job " << o.job << " (pid " << child << ", cores "
                  << o.limits.min << ".." << max << ") with malld at " << socket_path << "\n";
    mall::CtlResult r = client.request(mall::proto::Type::Register, body, std::chrono::seconds(30));
    if (!r.ok) {
        close(gate[1]);  // the held child reads end-of-file and exits without running CMD
        kill(child, SIGKILL);
        wait_child(child);
        if (r.code == MALL_ERR_NODAEMON)
            std::cerr << "mallrun: malld at " << socket_path << " did not answer the registration: "
                      << r.error << "\n";
        else
            std::cerr << "mallrun: malld refused job " << o.job << ": " << r.error << "\n";
        // A registration that timed out on our side may still complete on malld's. (Any other
        // refusal registered nothing, and the name may belong to someone else's job.)
        if (r.code == MALL_ERR_NODAEMON) deregister(o, socket_path);
        return r.code == MALL_ERR_NODAEMON ? kExitUnreachable : kExitRefused;
    }
    std::string go(1, '\1');
    if (o.container) {
        const std::string parent = r.body.value("cgroup_parent", std::string());
        if (parent.empty()) {
            close(gate[1]);
            kill(child, SIGKILL);
            wait_child(child);
            deregister(o, socket_path);
            std::cerr << "mallrun: malld registered job " << o.job << " but named no cgroup folder for "
                      << "the container (a malld older than 0.4?); update malld, or run the container "
                         "without --container\n";
            return kExitRefused;
        }
        if (std::string problem = cgroup_parent_problem(parent, o.driver); !problem.empty()) {
            close(gate[1]);
            kill(child, SIGKILL);
            wait_child(child);
            deregister(o, socket_path);
            std::cerr << "mallrun: job " << o.job << ": " << problem << "\n";
            return kExitRefused;
        }
        go += parent;
    }
    if (o.verbose)
        std::cerr << "mallrun: job " << o.job << " holds cpus " << r.body.value("cpus", std::string("?"))
                  << " (generation " << r.body.value("generation", json(0)).dump() << "); starting "
                  << o.command[0]
                  << (o.container ? " in cgroup " + r.body.value("cgroup_parent", std::string()) : "") << "\n";
    for (size_t done = 0; done < go.size();) {
        ssize_t n = write(gate[1], go.data() + done, go.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        done += static_cast<size_t>(n);
    }
    close(gate[1]);

    int status = wait_child(child);
    g_child = 0;
    // A container job ends by itself with the container's last process (a detached container
    // lives on after its `run` returned); any other job ends with its command.
    if (o.container) {
        if (o.verbose)
            std::cerr << "mallrun: " << o.engine << " ended; job " << o.job
                      << " ends when its container's last process does (`mallctl status`)\n";
        return exit_code_of(status);
    }
    deregister(o, socket_path);
    int code = exit_code_of(status);
    if (o.verbose) std::cerr << "mallrun: " << o.command[0] << " ended with status " << code << "\n";
    return code;
}

int run(int argc, char **argv) {
    std::vector<std::string> own;
    Options o;
    std::string split_error;
    const bool split_ok = split_command_line(argc, argv, &own, &o.command, &split_error);

    po::options_description opts;
    opts.add_options()("socket", po::value<std::string>(), "")("malleable", po::value<std::string>(), "")(
        "job", po::value<std::string>(), "")("weight", po::value<double>(), "")(
        "cgroup", po::value<std::string>(), "")(
        "container", po::value<std::string>()->implicit_value(""), "")(
        "require", po::bool_switch(), "")("verbose,v", po::bool_switch(), "")(
        "help,h", po::bool_switch(), "")("version", po::bool_switch(), "");
    po::variables_map vm;
    try {
        po::store(po::command_line_parser(own).options(opts).run(), vm);
        po::notify(vm);
    } catch (const po::error &e) {
        return usage_error(e.what());
    }
    if (vm["help"].as<bool>()) {
        print_help();
        return 0;
    }
    if (vm["version"].as<bool>()) {
        std::cout << "mallrun (mall) " << MALL_API_VERSION_MAJOR << "." << MALL_API_VERSION_MINOR
                  << "." << MALL_API_VERSION_PATCH << "\n";
        return 0;
    }
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
    const std::string socket_path = mall::resolve_socket_path(o.socket);

    mall::ConnectFailure failure;
    auto client = mall::CtlClient::connect(socket_path, &error, &failure);
    if (!client) {
        if (o.require) {
            // When nobody listens there, the fuller hint below replaces the short advice.
            std::cerr << "mallrun: " << (failure.nobody_listening ? failure.what : failure.text()) << "\n"
                      << "  is malld running? start it with `malld --socket " << socket_path
                      << "` or pass --socket / set MALL_SOCKET; without --require, mallrun runs the "
                         "command without malleability\n";
            return kExitUnreachable;
        }
        std::cerr << "mallrun: warning: " << error << "\n"
                  << "mallrun: running " << o.command[0] << " without malleability\n";
        std::cerr.flush();
        exec_command(o.command);
    }
    if (o.container) {
        std::string why;
        auto driver = choose_cgroup_driver(o, &why);
        if (!driver) {
            std::cerr << "mallrun: " << why << "\n";
            return kExitRefused;
        }
        o.driver = *driver;
        if (o.verbose)
            std::cerr << "mallrun: " << o.engine << " uses the " << cgroup_driver_name(o.driver)
                      << " cgroup driver" << (why.empty() ? "" : " (" + why + ")") << "\n";
    }
    return run_malleable(o, *client, socket_path);
}

}  // namespace

int main(int argc, char **argv) {
    try {
        return run(argc, argv);
    } catch (const std::exception &e) {
        std::cerr << "mallrun: " << e.what() << "\n";
        return kExitRefused;
    }
}
