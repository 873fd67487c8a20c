// SPDX-License-Identifier: BSD-3-Clause
// mall_oci_hook.cpp — the OCI runtime hook that makes a container a malleable job of malld, whatever
// tool started it (podman, CRI-O: any engine that reads hooks.d files). Contract: run by the runtime
// with the container's OCI state JSON on stdin. `createRuntime` (before the container's process
// starts) registers the container's init pid, as the host uid its user maps to, with malld in place
// (malld resizes the cgroup the runtime made: with crun under systemd, crun's delegated `container`
// cgroup in the container's scope) and returns once the job holds cores; `poststop`
// deregisters what createRuntime registered. Annotations io.mall.* say what to do, within the
// limits the admin sets with the hook's options in the hooks.d file (whoever creates a container
// writes its annotations): job names under --job-prefix (never a reserved one: slurm-, self-),
// weights up to --max-weight, MAX cut to --max-cores. It never waits unbounded, never fails a
// container's teardown, and fails a start only on bad annotations or, with io.mall.require=true,
// when malld is unreachable or refuses. Its --log is opened without following a symlink, and only as a regular
// file. Here: the help, the bounded reads, the two stages and their talk with malld; what is read
// of the container (the state, its user, the annotations) is mall_oci_hook_container.cpp's.
#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include "common/core_range.hpp"
#include "common/cpuset.hpp"
#include "common/ctl_client.hpp"
#include "common/files.hpp"
#include "common/protocol.hpp"
#include "common/rules.hpp"
#include "mall/mall.h"
#include "tools/exit_codes.hpp"
#include "tools/mall_oci_hook_container.hpp"
#include "tools/tool_cli.hpp"

namespace po = boost::program_options;
using nlohmann::json;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

using namespace mall::tools;
using namespace mall::tools::oci_hook;

// createRuntime leaves the job's name here, in the container's bundle, for poststop: poststop
// deregisters only what this hook registered for this container (never another container's job
// that happens to carry the same name). The bundle goes with the container.
constexpr const char *kMarkerName = "mall-oci-hook.job";

constexpr size_t kMaxInputBytes = 4 << 20;  // the state and config.json are a few KiB
constexpr int kDefaultTimeoutS = 20;        // the whole hook: connect, status, register
constexpr int kMaxTimeoutS = 300;
constexpr milliseconds kPoststopBudget{5000};  // poststop: at most this (or --timeout, if less)

const char *const kUsageLine =
    "usage: mall-oci-hook [--socket PATH] [--timeout S] [--log FILE] [--job-prefix P] [--max-weight W]\n"
    "                     [--max-cores N] createRuntime|poststop\n";

// The node's cpus: --max-cores's default (MAX beyond it could never be met here).
int node_cpu_count() {
    const long n = sysconf(_SC_NPROCESSORS_CONF);
    return n >= 1 ? static_cast<int>(std::min<long>(n, mall::kMaxCoreCount)) : 1;
}

void print_help() {
    std::cout
        << "mall-oci-hook - make containers malleable jobs of malld (an OCI runtime hook)\n"
           "\n"
        << kUsageLine
        << "\n"
           "The container runtime (runc or crun, started by podman or any engine that reads\n"
           "hooks.d files) runs mall-oci-hook with the container's OCI state as JSON on stdin:\n"
           "\n"
           "  createRuntime  after the runtime made the container's cgroup and before the\n"
           "                 container's process starts: registers the container's init with\n"
           "                 malld as a job that may use MIN to MAX cores, enforced in place\n"
           "                 (malld narrows and widens the cpuset of the cgroup the runtime made),\n"
           "                 and returns once the job holds its first cores, so the application\n"
           "                 starts on them. With podman's systemd cgroup manager and crun (cgroup\n"
           "                 v2) that cgroup is crun's `container` cgroup inside the container's\n"
           "                 scope (/machine.slice/libpod-<id>.scope/container), delegated to\n"
           "                 the runtime: malld resizes that cgroup, not the scope systemd owns.\n"
           "                 (runc there puts the container in the scope itself, whose cpus\n"
           "                 systemd may set back: prefer crun, or mallrun --container.) The job\n"
           "                 belongs to the host uid the container's user maps to\n"
           "                 (process.user.uid through linux.uidMappings in the bundle's\n"
           "                 config.json), so the container's processes may attach to it.\n"
           "  poststop       after the container stopped: deregisters the job createRuntime\n"
           "                 registered (if malld has not already ended it when the init exited).\n"
           "                 Never fails: problems are warnings.\n"
           "\n"
           "Annotations (podman run --annotation KEY=VALUE):\n"
           "  io.mall.malleable=MIN[:MAX]  required: the job's core limits, whole numbers >= 1\n"
           "                               with MIN <= MAX; without MAX the job may grow to the\n"
           "                               whole pool (mallrun --malleable's rule). MAX above\n"
           "                               --max-cores is cut to it; MIN above it is refused as\n"
           "                               malld refuses a job (see io.mall.require)\n"
           "  io.mall.job=NAME             the job's name after this node's --job-prefix: job\n"
           "                               PREFIXNAME (all of it 1-64 characters from A-Z a-z\n"
           "                               0-9 . _ : -); default: PREFIX<first 12 characters of\n"
           "                               the id>. A reserved name is refused: a Slurm job's\n"
           "                               (slurm-N), a self-registered job's (self-N)\n"
           "  io.mall.weight=W             the job's share for weight-aware policies, default 1:\n"
           "                               a number above 0 and at most --max-weight\n"
           "  io.mall.require=true|false   true: the container does not start when malld cannot\n"
           "                               be reached or refuses the job; default false: a\n"
           "                               warning, and the container runs without malleability\n"
           "A missing or malformed io.mall.* annotation always fails the container's start with\n"
           "a line naming the annotation: the runtime shows a hook's output only when the hook\n"
           "fails, so a warning would go unseen.\n"
           "\n"
           "Inside the container a process that uses libmall needs only the socket: bind-mount\n"
           "malld's folder read-only and set MALL_SOCKET (launch_scripts/examples/\n"
           "containers.conf.mall does both for every podman container). malld finds its job by\n"
           "the cgroup it lives in, also for podman exec. (A malld that does not mark the job\n"
           "\"container\": true in `mallctl status --json` needs MALL_JOB_ID=<the job's name> in\n"
           "the container as well.)\n"
           "\n"
           "Whoever creates a container writes its annotations (any user of a rootful engine's\n"
           "socket, any Kubernetes pod spec): they are requests, and the options below are the\n"
           "admin's limits on them, set in the hooks.d file's args.\n"
           "\n"
           "Options:\n"
           "  --job-prefix P  every container job's name starts with P (default "
        << kDefaultJobPrefix
        << "), so a\n"
           "                  container can never take the name of another kind of job, e.g. a\n"
           "                  Slurm job's slurm-N (which Slurm's epilog would end). P: at most\n"
           "                  "
        << kMaxJobPrefixLength
        << " characters from A-Z a-z 0-9 . _ : -, not starting with\n"
           "                  slurm- or self-; \"\" for none (io.mall.job=slurm-N is refused all\n"
           "                  the same)\n"
           "  --max-weight W  the largest io.mall.weight a container may ask for (default "
        << kDefaultMaxWeight
        << ";\n"
           "                  from 1, the default weight, to "
        << static_cast<long long>(mall::kMaxWeight)
        << "); above it the start fails\n"
           "  --max-cores N   the most cores a container job may grow to (default: this node's\n"
           "                  cpus): MAX above it is cut to N, MIN above it is refused\n"
           "  --socket PATH   malld's socket (default: $MALL_SOCKET, else "
        << mall::kDefaultSocketPath
        << ").\n"
           "                  The runtime runs hooks with the hooks.d file's env only, so name\n"
           "                  the socket here when malld listens elsewhere.\n"
           "  --timeout S     bound on the whole hook in seconds: connecting, asking for the pool,\n"
           "                  waiting for the first cores (default "
        << kDefaultTimeoutS << ", at most " << kMaxTimeoutS
        << ");\n"
           "                  poststop waits at most "
        << kPoststopBudget.count() / 1000
        << " s (or S, if less)\n"
           "  --log FILE      also append every message, with time and container id, to FILE\n"
           "                  (the runtime drops a successful hook's stderr). FILE is made 0640\n"
           "                  when missing; a FILE that is a symlink or not a regular file is not\n"
           "                  written (a warning says so). Keep it in a folder only root may write,\n"
           "                  e.g. /var/log/mall-oci-hook.log\n"
           "  -h, --help      show this text\n"
           "  --version       print the version\n"
           "\n"
           "Installing (podman): copy launch_scripts/examples/mall-hooks.d/*.json to a hooks\n"
           "folder (/usr/share/containers/oci/hooks.d, /etc/containers/oci/hooks.d, or\n"
           "containers.conf's hooks_dir), with \"path\" naming this program and \"args\" this\n"
           "node's limits. They run the hook only for containers that carry io.mall.malleable.\n"
           "Registering needs root or an admin uid of malld (malld --admin-uid): rootful podman\n"
           "runs hooks as root. Containers get malld's socket folder read-only (it holds only\n"
           "the socket: connecting works, planting files does not).\n"
           "Docker has no hooks.d: run docker containers with `mallrun --container`.\n"
           "\n"
           "Exit status (createRuntime; a non-zero status makes the runtime fail the container):\n"
           "  0  registered, or malld unreachable or refusing without io.mall.require=true (the\n"
           "     container runs without malleability); poststop always exits 0\n"
           "  1  malld refused the job (or MIN is above --max-cores) and io.mall.require=true\n"
           "  2  bad input: an io.mall.* annotation (a Slurm job's name, a weight above\n"
           "     --max-weight, ...), the state on stdin, the bundle's config.json, or the command\n"
           "     line\n"
           "  3  malld unreachable and io.mall.require=true\n"
           "\n"
           "Examples:\n"
           "  sudo podman run --annotation io.mall.malleable=1:4 --annotation io.mall.job=train \\\n"
           "       -v /run/mall:/run/mall:ro -e MALL_SOCKET=/run/mall/malld.sock IMAGE python3 train.py\n"
           "  mallctl status          (job ctr-train, its container cgroup listed \"in place\")\n"
           "  echo '{\"id\":\"abc\",\"pid\":4242,\"bundle\":\"/path\",\"annotations\":{...}}' \\\n"
           "       | mall-oci-hook --socket /tmp/mall/malld.sock createRuntime     (a manual test)\n";
}

// ---- messages: stderr (seen when the hook fails) and the optional --log file -------------------

struct Reporter {
    std::string stage = "-";
    std::string container = "-";  // first 12 characters of the id, once known
    int log_fd = -1;

    void line(const std::string &text) const {
        std::string msg = "mall-oci-hook: " + text + "\n";
        std::cerr << msg;
        std::cerr.flush();
        if (log_fd < 0) return;
        char stamp[40] = "";
        const std::time_t now = std::time(nullptr);
        std::tm tm{};
        if (gmtime_r(&now, &tm)) std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", &tm);
        std::string entry = std::string(stamp) + " pid " + std::to_string(getpid()) + " " + stage +
                            " container " + container + ": " + text + "\n";
        // One write(2) on an O_APPEND descriptor: lines of concurrent hooks do not interleave.
        if (write(log_fd, entry.data(), entry.size()) < 0) {
        }
    }
    void warn(const std::string &text) const { line("warning: " + text); }
};

// Opens the --log file to append to, made 0640 when missing: never through a symlink (O_NOFOLLOW),
// never blocking (O_NONBLOCK: a FIFO without a reader fails instead), and only a regular file.
// The descriptor, or -1 with *why.
int open_log(const std::string &path, std::string *why) {
    const int fd = open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOCTTY | O_NOFOLLOW | O_NONBLOCK, 0640);
    if (fd < 0) {
        *why = errno == ELOOP ? "it is a symlink, which the hook does not follow (name the file itself)"
                              : std::strerror(errno);
        return -1;
    }
    struct stat st {};
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        *why = "it is not a regular file";
        close(fd);
        return -1;
    }
    return fd;
}

// ---- bounded reads -------------------------------------------------------------------------------

milliseconds left_until(Clock::time_point deadline) {
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    return left.count() > 0 ? left : milliseconds(0);
}

// Reads stdin to end-of-file within the deadline. False with *error in words.
bool read_stdin(Clock::time_point deadline, std::string *out, std::string *error) {
    if (isatty(STDIN_FILENO)) {
        *error = "stdin is a terminal: the hook reads the container's OCI state JSON on stdin, as "
                 "the runtime passes it (see --help)";
        return false;
    }
    char buf[65536];
    for (;;) {
        pollfd p{STDIN_FILENO, POLLIN, 0};
        const int ms = static_cast<int>(std::min<long long>(left_until(deadline).count(), 1 << 30));
        const int ready = poll(&p, 1, ms);
        if (ready < 0 && errno == EINTR) continue;
        if (ready < 0) {
            *error = std::string("cannot read the OCI state on stdin: ") + std::strerror(errno);
            return false;
        }
        if (ready == 0) {
            *error = "no end of the OCI state on stdin within the time limit (is the runtime "
                     "running the hook, and does it close stdin?)";
            return false;
        }
        const ssize_t n = read(STDIN_FILENO, buf, sizeof buf);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (n < 0) {
            *error = std::string("cannot read the OCI state on stdin: ") + std::strerror(errno);
            return false;
        }
        if (n == 0) return true;
        out->append(buf, static_cast<size_t>(n));
        if (out->size() > kMaxInputBytes) {
            *error = "the OCI state on stdin is larger than " + std::to_string(kMaxInputBytes) + " bytes";
            return false;
        }
    }
}

// ---- the two stages ------------------------------------------------------------------------------

struct Options {
    std::string socket_path;
    milliseconds budget{kDefaultTimeoutS * 1000};
    Limits limits;
};

std::string marker_path(const State &s) { return s.bundle + "/" + kMarkerName; }

// Writes the marker (replacing an older one: a restarted container). 0 or the errno.
int write_marker(const std::string &path, const std::string &text) {
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) return errno;
    const ssize_t n = write(fd, text.data(), text.size());
    const int err = n < 0 ? errno : (static_cast<size_t>(n) != text.size() ? EIO : 0);
    close(fd);
    return err;
}

// Deregisters `job`; "no such job" is fine (malld ends a job whose processes are gone). Only warns.
void deregister(const Reporter &say, const std::string &socket_path, const std::string &job,
                Clock::time_point deadline) {
    std::string error;
    const milliseconds wait = std::max(left_until(deadline), milliseconds(100));
    auto client = mall::CtlClient::connect(socket_path, &error, nullptr, std::min(wait, mall::kDefaultConnectWait));
    if (!client) {
        say.warn("could not deregister job " + job + ": " + error + " (malld ends it by itself when its processes are gone)");
        return;
    }
    mall::CtlResult r = client->request(mall::proto::Type::Deregister, json{{"job", job}}, wait);
    if (r.ok)
        say.line("deregistered job " + job);
    else if (r.code == MALL_ERR_NOJOB)
        say.line("job " + job + " had already ended (malld saw its processes exit)");
    else
        say.warn("could not deregister job " + job + ": " + r.error);
}

int create_runtime(const Options &o, const Reporter &say, const State &s, Clock::time_point deadline) {
    std::string error;
    auto request = parse_request(s, o.limits, &error);
    if (!request) {
        say.line(error);
        return kExitUsage;
    }
    if (s.pid <= 0) {
        say.line("the OCI state has no \"pid\": createRuntime needs the container's init (is the hook "
                 "listed under a stage that runs before the container exists?)");
        return kExitUsage;
    }
    auto uid = host_uid_of(s.bundle, &error);
    if (!uid) {
        say.line(error);
        return kExitUsage;
    }
    const Request &r = *request;
    // A note left by an earlier run of this container (a restart whose poststop never ran) must
    // not make poststop deregister a job this run did not register.
    if (unlink(marker_path(s).c_str()) != 0 && errno != ENOENT)
        say.warn("cannot remove the old " + marker_path(s) + ": " + std::strerror(errno));
    // Without io.mall.require: say why, and let the container run as an ordinary one.
    auto give_up = [&](int code, const std::string &why) {
        if (r.require) {
            say.line(why + " (" + kAnnRequire + "=true: the container does not start)");
            return code;
        }
        say.warn(why + "; the container runs without malleability (" + kAnnRequire +
                 "=true makes this fail the container)");
        return kExitOk;
    };
    if (r.min > o.limits.max_cores)
        return give_up(kExitRefused, std::string(kAnnMalleable) + "=" + std::to_string(r.min) + " asks for at least " +
                                         std::to_string(r.min) + " cores, but this node's containers may have at most " +
                                         std::to_string(o.limits.max_cores) + " (mall-oci-hook --max-cores)");
    if (r.asked_max)
        say.line("job " + r.job + ": " + kAnnMalleable + " asks for up to " + std::to_string(*r.asked_max) +
                 " cores; this node's containers may have at most " + std::to_string(o.limits.max_cores) +
                 " (mall-oci-hook --max-cores), so the job may grow to " + std::to_string(*r.max));

    mall::ConnectFailure failure;
    auto client = mall::CtlClient::connect(o.socket_path, &error, &failure,
                                           std::min(left_until(deadline), mall::kDefaultConnectWait));
    if (!client) {
        std::string why = failure.what;
        if (failure.nobody_listening)
            why += "; is malld running? start it with `malld --socket " + o.socket_path +
                   "`, or name its socket with the hook's --socket in the hooks.d file";
        else if (!failure.advice.empty())
            why += "; " + failure.advice;
        return give_up(failure.code == MALL_ERR_NODAEMON ? kExitUnreachable : kExitRefused,
                       "cannot register job " + r.job + ": " + why);
    }

    int max = 0;
    if (r.max) {
        max = *r.max;
    } else {  // up to the whole pool
        mall::CtlResult status = client->request(mall::proto::Type::Status, json::object(), left_until(deadline));
        if (!status.ok)
            return give_up(status.code == MALL_ERR_NODAEMON ? kExitUnreachable : kExitRefused,
                           "cannot ask malld for its pool: " + status.error);
        std::string why;
        const std::string pool = status.body.value("pool", std::string());
        auto cpus = mall::CpuSet::parse(pool, &why);
        max = cpus ? std::min(cpus->count(), o.limits.max_cores) : 0;
        if (cpus && max < r.min)
            return give_up(kExitRefused, std::string(kAnnMalleable) + "=" + std::to_string(r.min) +
                                             " asks for at least " + std::to_string(r.min) +
                                             " cores, but malld's pool has " + std::to_string(max) + " (" +
                                             pool + ")");
        if (max < r.min) max = r.min;  // unreadable pool: let malld judge
    }

    // In place: malld resizes the cgroup the runtime made and never moves the container out of it.
    // A container job: its processes are those in its cgroups (podman exec's too, which are not
    // the init's descendants), and they attach without MALL_JOB_ID. An older malld ignores it.
    const json body = {{"job", r.job},       {"uid", *uid},          {"pids", {s.pid}},
                       {"min", r.min},       {"max", max},           {"weight", r.weight},
                       {"cgroup", "in-place"}, {"container", true}};
    // The last part of the budget is kept to withdraw a registration malld did not answer in time.
    const milliseconds left = left_until(deadline);
    const milliseconds reserve = std::min(milliseconds(1000), left / 4);
    mall::CtlResult reply = client->request(mall::proto::Type::Register, body, left - reserve);
    if (!reply.ok) {
        if (reply.code == MALL_ERR_NODAEMON) {
            // Our side gave up; malld's may still complete the registration.
            const int code = give_up(kExitUnreachable, "registering job " + r.job + ": " + reply.error);
            deregister(say, o.socket_path, r.job, deadline);
            return code;
        }
        return give_up(kExitRefused, "malld refused job " + r.job + ": " + reply.error);
    }
    // For poststop: this container's job, by the name malld knows it.
    if (int err = write_marker(marker_path(s), r.job + "\n"); err != 0)
        say.warn("cannot write " + marker_path(s) + ": " + std::strerror(err) +
                 "; poststop will not deregister job " + r.job + " (malld ends it when its processes are gone)");
    say.line("container " + shown(s.id.substr(0, 12)) + " (pid " + std::to_string(s.pid) + ", host uid " +
             std::to_string(*uid) + ") is job " + r.job + " (" + std::to_string(r.min) + ".." +
             std::to_string(max) + " cores), holding cpus " + reply.body.value("cpus", std::string("?")));
    return kExitOk;
}

int post_stop(const Options &o, const Reporter &say, const State &s, Clock::time_point deadline) {
    if (s.bundle.empty()) {
        say.warn("the OCI state has no \"bundle\": nothing recorded to deregister");
        return kExitOk;
    }
    std::string text;
    int err = 0;
    if (!mall::read_text_file(marker_path(s), &text, &err)) {
        // createRuntime registered nothing for this container (or could not note it).
        if (err != ENOENT) say.warn("cannot read " + marker_path(s) + ": " + std::strerror(err));
        return kExitOk;
    }
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
    if (auto why = mall::proto::invalid_job_name(text)) {
        say.warn(marker_path(s) + " holds no job name ('" + shown(text) + "'): " + *why);
        return kExitOk;
    }
    deregister(say, o.socket_path, text, deadline);
    // A second poststop (stop, then rm) must not end a newer job of the same name.
    if (unlink(marker_path(s).c_str()) != 0 && errno != ENOENT)
        say.warn("cannot remove " + marker_path(s) + ": " + std::strerror(errno));
    return kExitOk;
}

bool g_teardown = false;  // poststop: whatever happens, exit 0

int usage_error(const std::string &what) {
    std::cerr << "mall-oci-hook: " << what << "\n" << kUsageLine << "see `mall-oci-hook --help`\n";
    return kExitUsage;
}

int run(int argc, char **argv) {
    po::options_description opts;
    opts.add_options()("socket", po::value<std::string>(), "")("timeout", po::value<int>(), "")(
        "log", po::value<std::string>(), "")("job-prefix", po::value<std::string>(), "")(
        "max-weight", po::value<std::string>(), "")("max-cores", po::value<std::string>(), "")(
        "stage", po::value<std::vector<std::string>>(), "");
    mall::tools::add_help_and_version(opts);
    po::positional_options_description positional;
    positional.add("stage", -1);
    po::variables_map vm;
    try {
        po::store(po::command_line_parser(argc, argv).options(opts).positional(positional).run(), vm);
        po::notify(vm);
    } catch (const po::error &e) {
        return usage_error(e.what());
    }
    if (auto answered = mall::tools::answer_help_or_version(vm, "mall-oci-hook", print_help)) return *answered;
    const std::vector<std::string> stages =
        vm.count("stage") ? vm["stage"].as<std::vector<std::string>>() : std::vector<std::string>{};
    if (stages.size() != 1 || (stages[0] != "createRuntime" && stages[0] != "poststop"))
        return usage_error(stages.empty() ? "name the stage: createRuntime or poststop (the hooks.d file's args)"
                                          : "the stage is createRuntime or poststop, got '" + stages[0] +
                                                (stages.size() > 1 ? "' and more" : "'"));
    Options o;
    if (vm.count("socket")) {
        const std::string s = vm["socket"].as<std::string>();
        if (s.empty()) return usage_error(std::string("--socket needs a path, e.g. --socket ") + mall::kDefaultSocketPath);
        o.socket_path = s;
    }
    o.socket_path = mall::resolve_socket_path(o.socket_path);
    if (vm.count("timeout")) {
        const int t = vm["timeout"].as<int>();
        if (t < 1 || t > kMaxTimeoutS)
            return usage_error("--timeout takes whole seconds from 1 to " + std::to_string(kMaxTimeoutS));
        o.budget = milliseconds(t * 1000);
    }
    if (vm.count("job-prefix")) {
        o.limits.job_prefix = vm["job-prefix"].as<std::string>();
        if (std::string problem = job_prefix_problem(o.limits.job_prefix); !problem.empty())
            return usage_error(problem);
    }
    if (vm.count("max-weight")) {
        const std::string text = vm["max-weight"].as<std::string>();
        char *end = nullptr;
        errno = 0;
        const double w = std::strtod(text.c_str(), &end);
        if (text.empty() || end != text.c_str() + text.size() || errno != 0 || !std::isfinite(w) ||
            !mall::proto::valid_weight(w) || w < mall::kDefaultWeight || std::isspace(static_cast<unsigned char>(text[0])))
            return usage_error("--max-weight takes a number from 1 (the default weight) to " +
                               std::to_string(static_cast<long long>(mall::kMaxWeight)) + ", e.g. --max-weight " +
                               std::to_string(static_cast<int>(kDefaultMaxWeight)) + "; got '" + shown(text) + "'");
        o.limits.max_weight = w;
    }
    o.limits.max_cores = node_cpu_count();
    if (vm.count("max-cores")) {
        const std::string text = vm["max-cores"].as<std::string>();
        const bool digits = !text.empty() && text.size() <= 9 &&
                            std::all_of(text.begin(), text.end(), [](unsigned char c) { return std::isdigit(c); });
        const long n = digits ? std::strtol(text.c_str(), nullptr, 10) : 0;
        if (n < 1 || n > static_cast<long>(mall::kMaxCoreCount))
            return usage_error("--max-cores takes a whole number of cores from 1 to " +
                               std::to_string(mall::kMaxCoreCount) + "; got '" + shown(text) + "'");
        o.limits.max_cores = static_cast<int>(n);
    }
    Reporter say;
    say.stage = stages[0];
    if (vm.count("log")) {
        const std::string path = vm["log"].as<std::string>();
        std::string why;
        say.log_fd = open_log(path, &why);
        if (say.log_fd < 0) std::cerr << "mall-oci-hook: warning: not logging to --log " << path << ": " << why << "\n";
    }
    const bool create = stages[0] == "createRuntime";
    g_teardown = !create;
    // A teardown is not held up for long by a stuck malld: malld ends a job whose processes are
    // gone by itself, so poststop's deregistration is a courtesy.
    const Clock::time_point deadline = Clock::now() + (create ? o.budget : std::min(o.budget, kPoststopBudget));

    std::string input, error;
    // Input that cannot be read fails a start, never a teardown.
    if (!read_stdin(deadline, &input, &error)) {
        say.line(create ? error : "warning: " + error);
        return create ? kExitUsage : kExitOk;
    }
    auto state = parse_state(input, &error);
    if (!state) {
        say.line(create ? error : "warning: " + error);
        return create ? kExitUsage : kExitOk;
    }
    say.container = shown(state->id.substr(0, 12));
    return create ? create_runtime(o, say, *state, deadline) : post_stop(o, say, *state, deadline);
}

}  // namespace

int main(int argc, char **argv) {
    try {
        return run(argc, argv);
    } catch (const std::exception &e) {
        std::cerr << "mall-oci-hook: " << (g_teardown ? "warning: " : "") << e.what() << "\n";
        return g_teardown ? kExitOk : kExitRefused;
    }
}
