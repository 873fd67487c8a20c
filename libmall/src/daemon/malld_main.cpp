// SPDX-License-Identifier: BSD-3-Clause
// malld_main.cpp — the node manager daemon's command line: parses and validates the options
// (exit 2 with a clear message on bad ones), loads the topology, picks the cpuset backend, logs
// what it chose and why, then runs the Server in the foreground. Exit 0 on a clean stop, 1 when
// start-up fails.
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/program_options.hpp>
#include <cstdio>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <tuple>
#include <vector>

#include "../common/cpuset.hpp"
#include "../common/files.hpp"
#include "../common/rules.hpp"
#include "../tools/tool_cli.hpp"
#include "backend.hpp"
#include "mall/mall.h"
#include "core/policy.hpp"
#include "log.hpp"
#include "persistence.hpp"
#include "server.hpp"
#include "core/topology.hpp"

namespace po = boost::program_options;

namespace {

constexpr int kExitOk = 0;
constexpr int kExitStartup = 1;
constexpr int kExitUsage = 2;

const char *kSynopsis =
    "malld - the mall node manager: lends a node's idle cpu cores to malleable jobs\n"
    "\n"
    "Usage: malld [OPTIONS]\n"
    "\n"
    "malld owns the node's malleable cpu pool. Launchers (mallrun, the Slurm plugin) register\n"
    "jobs with a minimum and maximum number of cpus; a policy divides the pool between them and\n"
    "malld moves cores between jobs in two phases: it publishes the smaller allocation on the\n"
    "job's shared page, waits for the job's processes to acknowledge it at their next training\n"
    "step (at most --ack-timeout-ms), narrows the job's cpuset, and only then gives the cores to\n"
    "another job. Allocations are enforced with cgroup cpusets (cgroup v1 or v2) or, where no\n"
    "cpuset controller can be used, with thread affinity. malld runs in the foreground and logs\n"
    "to stderr. Its state file lets a restarted malld re-adopt running jobs without changing\n"
    "their cpusets.\n"
    "\n"
    "Which cgroup: a job whose processes live in a cgroup made for them (a Slurm step with\n"
    "proctrack/cgroup or task/cgroup, a container, a systemd scope) is enforced in place: malld\n"
    "narrows and widens that cgroup's cpuset (v1: ancestors widened first, descendants narrowed\n"
    "first; v2: cpuset.cpus written, cpuset.cpus.effective checked) and never moves a process out\n"
    "of it; at the job's end the cgroup gets back the cpus it had. Other jobs (e.g. mallrun from a\n"
    "shell) get a folder of malld's own, <cpuset mount>/<--cgroup-parent>/job_<name>. On cgroup v2\n"
    "below the root (a systemd unit with Delegate=yes), malld moves itself into <its cgroup>/malld\n"
    "and keeps its folders in its own subtree. A job whose cgroup malld may not resize (v2 without\n"
    "the cpuset controller, not writable) is refused with the reason: it runs non-malleable.\n"
    "\n"
    "Clients authenticate by SO_PEERCRED: root, malld's own user and every --admin-uid may\n"
    "register, set, reclaim and release; a job's owner may only attach to, acknowledge and report\n"
    "progress for its own job; anyone may read the status, but a user who is not an admin sees\n"
    "only its own jobs whole and other users' jobs as their cpus (other_jobs), in watch too.\n"
    "Refusals are logged, at most 10 per 10 s per user and 50 for all users (admins apart).\n";

const char *kEpilog =
    "\n"
    "Signals:\n"
    "  SIGTERM, SIGINT  stop cleanly: the state file is kept for the next malld, the socket is\n"
    "                   removed, and cgroups of ended jobs (and the parent, if empty) are removed.\n"
    "  SIGHUP           ignored.\n"
    "\n"
    "Examples:\n"
    "  malld                                   serve the whole node on " MALL_DEFAULT_SOCKET "\n"
    "  malld --cpus 4-31 --policy equal        lend only cpus 4-31\n"
    "  malld --socket /tmp/m/s.sock --state-dir /tmp/m/state --backend affinity\n"
    "                                          a private malld for an ordinary user\n"
    "  malld --topology 'pack:2 core:16 pu:2' --backend affinity --cpus 0-1\n"
    "                                          model a larger node (tests)\n"
    "  malld --admin-uid 1000 --allow-self-register\n"
    "  malld --slurm --cgroup-parent mall     on a Slurm node: reconcile with slurmctld\n"
    "  malld --metrics-file /var/lib/node_exporter/textfile/mall.prom --metrics-interval 15\n"
    "                                          metrics for node_exporter's textfile collector\n"
    "\n"
    "Files:\n"
    "  <state-dir>                      /var/lib/mall by default as root, else\n"
    "                                   $XDG_STATE_HOME/mall or ~/.local/state/mall: malld's own\n"
    "                                   folder (mode 0700 when malld creates it; refused if others\n"
    "                                   can write it or swap a folder above it)\n"
    "  <state-dir>/malld.state.json     the jobs, reservations, policy and accounting a restart\n"
    "                                   re-adopts (mode 0600; rewritten at every change and every\n"
    "                                   --checkpoint-interval while jobs run)\n"
    "  <state-dir>/malld.history.jsonl  finished jobs, one JSON line each (--history-file;\n"
    "                                   mode 0600)\n"
    "  /etc/default/malld               MALLD_OPTIONS: this node's options, read by malld.service\n"
    "                                   (not by malld itself)\n"
    "\n"
    "Exit status:\n"
    "  0  stopped cleanly (SIGTERM or SIGINT); with --check, the options are valid\n"
    "  1  start-up failed (socket in use by a live malld, unusable backend, unreadable state file)\n"
    "  2  bad command line\n";

int usage_error(const std::string &text) {
    std::cerr << "malld: " << text << "\nTry 'malld --help' for more information.\n";
    return kExitUsage;
}

// The state folder when --state-dir is not given: root's /var/lib/mall (malld.service's
// StateDirectory), else the user's own under the XDG base directories, so a private malld started
// by an ordinary user (the README's tour) works: $XDG_STATE_HOME/mall when that is an absolute path,
// else $HOME/.local/state/mall. "" with *why when neither is known.
std::string default_state_dir(std::string *why) {
    if (::geteuid() == 0) return mall::kDefaultStateDir;
    std::string unused;
    if (const char *xdg = std::getenv("XDG_STATE_HOME"); xdg && xdg[0] == '/') {
        const std::string folder = mall::normalized_folder_path(std::string(xdg) + "/mall", &unused);
        if (!folder.empty()) return folder;
    }
    if (const char *home = std::getenv("HOME"); home && home[0] == '/') {
        const std::string folder = mall::normalized_folder_path(std::string(home) + "/.local/state/mall", &unused);
        if (!folder.empty()) return folder;
    }
    *why = "no --state-dir given, and neither $XDG_STATE_HOME nor $HOME names an absolute folder for uid " +
           std::to_string(::geteuid()) + "'s default: pass --state-dir (a folder of your own, e.g. "
           "--state-dir /tmp/mall-$USER/state)";
    return "";
}

std::string folder_of(const std::string &path) {
    size_t slash = path.find_last_of('/');
    if (slash == std::string::npos) return ".";
    if (slash == 0) return "/";
    return path.substr(0, slash);
}

// Every client connection costs malld a descriptor: take all the hard limit allows, so that a
// connection flood hits malld's own per-user and total caps long before the kernel's limit.
void raise_open_file_limit() {
    rlimit limit{};
    if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
    if (limit.rlim_cur < limit.rlim_max) {
        rlimit raised = limit;
        raised.rlim_cur = limit.rlim_max;
        if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
    }
    mall::log_line(mall::LogLevel::Info,
                   "open-file limit: " + (limit.rlim_cur == RLIM_INFINITY ? std::string("unlimited")
                                                                          : std::to_string(limit.rlim_cur)));
}

}  // namespace

int main(int argc, char **argv) {
    std::string default_socket = MALL_DEFAULT_SOCKET;
    if (const char *env = std::getenv(mall::kSocketEnv); env && *env) default_socket = env;

    std::string socket_path, cpus_text, state_dir, backend_text, policy_text, topology_spec;
    std::string cgroup_parent, log_level_text, socket_mode_text;
    int64_t ack_timeout_ms = 0;
    std::vector<unsigned> admin_uids;

    const std::string per_user_help =
        "connections one non-admin user may hold open at once (every rank of a job holds one); "
        "further ones are refused with an error naming this option (default: 8 per cpu of the "
        "pool, at least " + std::to_string(mall::kMinDefaultConnectionsPerUid) + ", at most " +
        std::to_string(mall::kMaxDefaultConnectionsPerUid) + "). malld serves " +
        std::to_string(mall::kMaxDaemonConnections) + " connections in all, of which non-admin "
        "users share " + std::to_string(mall::kMaxNonAdminConnections) + ": the last " +
        std::to_string(mall::kAdminConnectionReserve) + " are kept for root and admin uids, so "
        "the Slurm plugin and mallctl always get in; with the default, 16 users at the limit leave "
        "room for more. Each non-admin user may hold at most " +
        std::to_string(mall::kMaxWatchersPerUid) + " watch connections";
    po::options_description options("Options", 100, 40);
    // clang-format off
    options.add_options()
        ("socket", po::value(&socket_path)->default_value(default_socket),
         "Unix socket to serve (default: $MALL_SOCKET, else " MALL_DEFAULT_SOCKET "); its folder "
         "is created if missing; a stale socket is replaced, one a live malld serves is not")
        ("cpus", po::value(&cpus_text),
         "the malleable pool as a Linux cpu list, e.g. 0-3,8 (default: every cpu of the topology)")
        ("state-dir", po::value(&state_dir),
         "malld's own folder for malld.state.json and the history of finished jobs (default: "
         "/var/lib/mall when malld runs as root, else $XDG_STATE_HOME/mall, else "
         "$HOME/.local/state/mall); an absolute path (a trailing '/' is dropped); created mode 0700, "
         "with any missing folder above it, if missing; refused when it is a symlink, not owned by "
         "malld's user or writable by group or others, or when a folder above it is not root's or "
         "malld's user's, or is writable by others without being sticky (like /tmp). malld opens it "
         "once at start and works through that descriptor. Keep it apart from the socket's folder "
         "where containers mount that folder: they must not see the state")
        ("backend", po::value(&backend_text)->default_value("auto"),
         "how cpus are enforced: auto|cgroup-v1|cgroup-v2|affinity; auto takes cgroup-v1, then "
         "cgroup-v2, then affinity, and logs why")
        ("policy", po::value(&policy_text)->default_value("equal"),
         "how the pool is divided: equal (idle cores lent evenly within min..max), static "
         "(each job keeps its guaranteed/min cores), weighted (idle cores lent in proportion to "
         "each job's weight) or throughput (idle cores where the jobs' measured speedup gains "
         "most); without this option a saved policy is kept")
        ("ack-timeout-ms", po::value(&ack_timeout_ms)->default_value(mall::kDefaultAckTimeout.count()),
         "how long a shrinking job may take to acknowledge before malld enforces anyway (> 0)")
        ("topology", po::value(&topology_spec)->default_value("system"),
         "\"system\", an hwloc XML file, or an hwloc synthetic description such as "
         "'pack:2 core:16 pu:2'")
        ("cgroup-parent", po::value(&cgroup_parent)->default_value("mall"),
         "name of malld's own cgroup folder (under the cpuset hierarchy, or under malld's delegated "
         "subtree on cgroup v2) for jobs that live in no cgroup of their own: <parent>/job_<name>")
        ("admin-uid", po::value(&admin_uids)->composing(),
         "a uid that may administer malld besides root and malld's own user (repeatable): register "
         "and deregister jobs, set, reclaim, release, change the policy. Its Register may name only "
         "processes that run as the job's uid, and never registers a job for root (or malld's "
         "user) nor names a process running as root in any of its uids; for a container job, also "
         "processes of a user namespace the job's uid made (that user's rootless container). No "
         "Register, root's included, names pid 1, a kernel thread, malld or one of malld's "
         "ancestors. Root may also name a task that still runs as root (the Slurm plugin's, before "
         "slurmstepd drops it to the user) and, for a container job, a process of any uid (the "
         "container's mapped users). Job names starting with slurm- are root's, self- malld's")
        ("allow-self-register", po::bool_switch(),
         "let a process without a registration register itself (job \"self-<pid>\") on attach, "
         "only in a cgroup delegated to its uid (the folder and its cgroup.procs owned by that uid) "
         "that holds only that uid's processes, lies in no job's cgroup, and whose parent allows "
         "the whole pool: malld resizes that cgroup in place and moves nothing; elsewhere it is "
         "refused and the process runs non-malleable (with --backend affinity: its own threads' "
         "masks only)")
        ("max-connections-per-user", po::value<int>(), per_user_help.c_str())
        ("slurm", po::bool_switch(),
         "check \"slurm-<jobid>\" registrations and reservations against Slurm (libslurm, "
         "$SLURM_CONF): jobs Slurm does not run, or runs for another uid, are ended and their "
         "cpus released; run at each registration and every --slurm-interval-s. A job with a "
         "slurmstepd socket in slurmd's spool folder runs here: slurmctld is asked only about "
         "jobs the spool does not show (steady state: no RPC)")
        ("slurm-node", po::value<std::string>(),
         "this node's name in Slurm (default: the short host name)")
        ("slurmd-spool-dir", po::value<std::string>(),
         "with --slurm, slurmd's spool folder on this node, where each running step's slurmstepd "
         "keeps a socket <node>_<jobid>.<stepid> (%n and %h are expanded as slurmd does; default: "
         "SlurmdSpoolDir of slurm.conf). Must be owned by root or SlurmdUser and writable by no one "
         "else; \"none\": ask slurmctld about every job every --slurm-interval-s instead")
        ("slurm-interval-s", po::value<int>()->default_value(10),
         "seconds between reconciliations with Slurm (1-3600); each reads the spool folder and asks "
         "slurmctld only about jobs it does not show")
        ("slurm-comment-interval", po::value<int>()->default_value(0),
         "with --slurm, seconds between updates of each running Slurm job's AdminComment with its "
         "figures so far (marked running_as_of=<epoch seconds>; its last figures replace them when "
         "it ends), so that a job ended by scancel or its time limit, which Slurm no longer lets "
         "malld update, keeps some. Each update costs slurmctld 2 RPCs per job and node (3 for a "
         "multi-node job; 1 with --slurm-comment-merge slurmctld) and a job write; 0 (the default): "
         "only when a job ends (0-86400)")
        ("slurm-comment-merge", po::value<std::string>()->default_value("malld"),
         "with --slurm, who merges this node's figures into a job's AdminComment, which Slurm keeps "
         "as one field that the last writer sets: \"malld\" (the default: this node reads the field, "
         "merges and writes it; 2 RPCs a node and job, and a multi-node job's nodes take turns) or "
         "\"slurmctld\" (this node sends only its segment, which mall's job_submit.lua merges inside "
         "slurmctld: 1 RPC, no turns; needs JobSubmitPlugins=lua and that script on the "
         "controller, see docs/admin-slurm.md; malld refuses to start when slurm.conf names no lua)")
        ("metrics-file", po::value<std::string>(),
         "write Prometheus metrics (the ones `mallctl metrics` prints) to this file every "
         "--metrics-interval, atomically (a temporary file renamed over it), mode 0644: point "
         "node_exporter's --collector.textfile.directory at its folder and name it *.prom; removed "
         "when malld stops cleanly")
        ("metrics-interval", po::value<int>()->default_value(15),
         "seconds between rewrites of --metrics-file (1-3600)")
        ("history-file", po::value<std::string>(),
         "where each finished job's record goes (one JSON line: its cpus, lent core-seconds, "
         "resizes, ack timeouts; read with `mallctl history`), or \"none\" (default: "
         "<state-dir>/malld.history.jsonl). An absolute path; a folder other than --state-dir must "
         "exist and follow the same rules (malld's own, writable by nobody else, below folders "
         "only root or malld's user may write, or sticky ones), e.g. /var/log/mall; malld opens it "
         "once at start")
        ("history-max-mib", po::value<int>()->default_value(16),
         "size at which the history file is rotated to <file>.1, replacing an older one (1-4096)")
        ("checkpoint-interval", po::value<int>()->default_value(60),
         "while jobs run, seconds between rewrites of the state file that save their accounting "
         "figures (it is also saved at every change and at a clean stop): after a SIGKILL or an "
         "OOM kill of malld, the jobs that end before it restarts lose at most this much (1-3600)")
        ("log-level", po::value(&log_level_text)->default_value("info"),
         "error|warn|info|debug")
        ("socket-mode", po::value(&socket_mode_text)->default_value("0666"),
         "octal file mode of the socket (authorization is by peer credentials)")
        ("check", po::bool_switch(),
         "check the other options as a start would (names, values, ranges, folders, the topology "
         "and --cpus: everything that exits 2), print what malld would serve, and exit 0 without "
         "starting; e.g. `malld --check $MALLD_OPTIONS` before `systemctl restart malld`")
        ("help,h", "print this help and exit")
        ("version", "print the version and exit");
    // clang-format on

    po::variables_map vm;
    try {
        po::store(po::command_line_parser(argc, argv).options(options).run(), vm);
        po::notify(vm);
    } catch (const po::error &e) {
        return usage_error(e.what());
    }
    if (vm.count("help")) {
        std::cout << kSynopsis << "\n" << options << kEpilog;
        return kExitOk;
    }
    if (vm.count("version")) {
        std::cout << mall::tools::version_line("malld") << "\n";
        return kExitOk;
    }

    // --- validation: every exit 2 comes before anything is created, logged or started ---
    auto level = mall::parse_log_level(log_level_text);
    if (!level)
        return usage_error("bad --log-level '" + log_level_text + "': use error, warn, info or debug");
    mall::set_log_level(*level);

    auto backend_kind = mall::parse_backend(backend_text);
    if (!backend_kind)
        return usage_error("unknown --backend '" + backend_text +
                           "': use auto, cgroup-v1, cgroup-v2 or affinity");
    auto policy = mall::parse_policy(policy_text);
    if (!policy) {
        std::string names;
        for (const auto &n : mall::policy_names()) names += (names.empty() ? "" : ", ") + n;
        return usage_error("unknown --policy '" + policy_text + "': use one of " + names);
    }
    if (ack_timeout_ms <= 0)
        return usage_error("--ack-timeout-ms must be greater than 0 (got " +
                           std::to_string(ack_timeout_ms) + ")");
    if (ack_timeout_ms > 3600 * 1000)
        return usage_error("--ack-timeout-ms " + std::to_string(ack_timeout_ms) +
                           " is more than an hour; give milliseconds");
    unsigned socket_mode = 0;
    {
        char *end = nullptr;
        unsigned long mode = std::strtoul(socket_mode_text.c_str(), &end, 8);
        if (socket_mode_text.empty() || *end != '\0' || mode > 07777)
            return usage_error("bad --socket-mode '" + socket_mode_text +
                               "': give an octal mode such as 0666 or 0660");
        socket_mode = static_cast<unsigned>(mode);
    }
    if (socket_path.empty()) return usage_error("--socket must not be empty");
    if (cgroup_parent.empty() || cgroup_parent.find('/') != std::string::npos ||
        cgroup_parent == "." || cgroup_parent == "..")
        return usage_error("bad --cgroup-parent '" + cgroup_parent +
                           "': give one folder name such as 'mall' (no '/')");

    std::string error;
    auto topology = mall::Topology::load(topology_spec, &error);
    if (!topology) return usage_error("cannot load --topology '" + topology_spec + "': " + error);

    mall::CpuSet pool = topology->all_cpus();
    if (vm.count("cpus")) {
        auto parsed = mall::CpuSet::parse(cpus_text, &error);
        if (!parsed) return usage_error("bad --cpus '" + cpus_text + "': " + error);
        if (parsed->empty()) return usage_error("--cpus is empty: give at least one cpu");
        if (!topology->all_cpus().contains(*parsed))
            return usage_error("--cpus '" + cpus_text + "' names cpus " +
                               (*parsed - topology->all_cpus()).to_string() +
                               " that the topology does not have (it has " +
                               topology->all_cpus().to_string() + ")");
        pool = *parsed;
    }
    // Integer options with bounds: one check and one message for each.
    auto out_of_range = [&](const char *option, int low, int high) -> std::string {
        if (!vm.count(option)) return "";
        const int value = vm[option].as<int>();
        if (value >= low && value <= high) return "";
        return std::string("--") + option + " must be between " + std::to_string(low) + " and " +
               std::to_string(high) + " (got " + std::to_string(value) + ")";
    };
    for (const auto &[option, low, high] :
         {std::tuple<const char *, int, int>{"metrics-interval", 1, 3600},
          {"history-max-mib", 1, 4096},
          {"checkpoint-interval", 1, 3600},
          {"slurm-interval-s", 1, 3600},
          {"slurm-comment-interval", 0, 86400},
          {"max-connections-per-user", 1, mall::kMaxDaemonConnections}})
        if (auto why = out_of_range(option, low, high); !why.empty()) return usage_error(why);

    // Where the state goes: named (normalized: absolute, no trailing '/'), or the default for
    // malld's user. Checked on disk only below, once every option value is known to be good.
    if (vm.count("state-dir")) {
        std::string why;
        const std::string normalized = mall::normalized_folder_path(state_dir, &why);
        if (normalized.empty()) return usage_error("bad --state-dir '" + state_dir + "': it " + why);
        state_dir = normalized;
    } else {
        std::string why;
        state_dir = default_state_dir(&why);
        if (state_dir.empty()) return usage_error(why);
    }

    std::string metrics_file, history_file = state_dir + "/malld.history.jsonl";
    const int metrics_interval = vm["metrics-interval"].as<int>();
    const int history_max_mib = vm["history-max-mib"].as<int>();
    // Both files are written by malld as it runs: their folders must exist now, so a typo fails
    // here instead of as a log line an hour later.
    auto check_folder = [&](const char *option, const std::string &path) -> std::string {
        if (path.empty() || path.back() == '/') return std::string("--") + option + " must name a file, not a folder";
        const std::string folder = folder_of(path);
        struct stat st{};
        if (::stat(folder.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
            return std::string("--") + option + " '" + path + "': folder " + folder + " does not exist; create it first";
        return "";
    };
    if (vm.count("metrics-file")) {
        metrics_file = vm["metrics-file"].as<std::string>();
        if (auto why = check_folder("metrics-file", metrics_file); !why.empty()) return usage_error(why);
    }
    if (vm.count("history-file")) {
        history_file = vm["history-file"].as<std::string>();
        if (history_file == "none") {
            history_file.clear();
        } else if (history_file.empty() || history_file.back() == '/') {
            return usage_error("--history-file must name a file, not a folder");
        } else if (history_file[0] != '/') {
            return usage_error("--history-file '" + history_file + "' is not an absolute path: give one that "
                               "starts with '/' (mallctl history reads it from malld's status)");
        } else {
            std::string why;
            const std::string folder = mall::normalized_folder_path(folder_of(history_file), &why);
            if (folder.empty()) return usage_error("--history-file '" + history_file + "': its folder " + why);
            history_file = (folder == "/" ? "" : folder) + "/" + history_file.substr(history_file.find_last_of('/') + 1);
        }
    }

    char host_name[256] = {};
    ::gethostname(host_name, sizeof host_name - 1);
    const std::string short_host = std::string(host_name).substr(0, std::string(host_name).find('.'));
    // The node's name in history records: Slurm's name for it when it has one (--slurm-node: nodes
    // that share a host name, as the local cluster's do, stay apart), else the short host name.
    std::string node_name = short_host;

    std::unique_ptr<mall::SlurmQuery> slurm_query;
    std::string slurm_note;  // what the Slurm query connects to, logged at start-up
    std::optional<mall::SlurmdSpool> slurmd_spool;
    int max_connections_per_user = 0;  // 0: from the pool, once it is known
    if (vm.count("max-connections-per-user")) max_connections_per_user = vm["max-connections-per-user"].as<int>();
    const int slurm_interval = vm["slurm-interval-s"].as<int>();
    if (!vm["slurm"].as<bool>() && !vm["slurm-comment-merge"].defaulted())
        return usage_error("--slurm-comment-merge applies only with --slurm (it is about Slurm jobs' AdminComment)");
    if (vm["slurm"].as<bool>()) {
        std::string node;
        if (vm.count("slurm-node")) {
            node = vm["slurm-node"].as<std::string>();
        } else {
            node = short_host;
        }
        node_name = node;
        // libslurm ends the process (exit 1) when it cannot read its configuration: an explicit
        // SLURM_CONF that cannot be read is refused here with the fix. (Unset, libslurm reads its
        // default path or finds slurmctld by DNS, configless.)
        if (const char *conf = std::getenv("SLURM_CONF"); conf != nullptr && *conf != '\0' && ::access(conf, R_OK) != 0)
            return usage_error(std::string("--slurm: SLURM_CONF=") + conf + " cannot be read (" + std::strerror(errno) +
                               "): point it at the cluster's slurm.conf");
        const std::string merge_name = vm["slurm-comment-merge"].as<std::string>();
        if (merge_name != "malld" && merge_name != "slurmctld")
            return usage_error("--slurm-comment-merge must be malld or slurmctld (got '" + merge_name + "')");
        const auto merge = merge_name == "slurmctld" ? mall::CommentMerge::Slurmctld : mall::CommentMerge::Malld;
        std::string slurm_why;
        slurm_query = mall::make_libslurm_query(node, &slurm_why, merge);
        if (!slurm_query) {
            std::cerr << "malld: --slurm: " << slurm_why << "\n";
            return kExitUsage;
        }
        slurm_note = slurm_why;
        if (merge == mall::CommentMerge::Slurmctld) {
            if (auto why = mall::job_submit_lua_problem(slurm_query->job_submit_plugins()); !why.empty())
                return usage_error("--slurm-comment-merge slurmctld: " + why);
            slurm_note += "; AdminComment segments merged by slurmctld (job_submit.lua)";
        }
        std::string spool = vm.count("slurmd-spool-dir") ? vm["slurmd-spool-dir"].as<std::string>()
                                                           : slurm_query->slurmd_spool_pattern();
        if (spool.empty()) {
            slurm_note += "; slurmd's spool folder unknown (no SlurmdSpoolDir; set --slurmd-spool-dir): "
                          "slurmctld is asked about every job every interval";
        } else if (spool == "none") {
            slurm_note += "; no spool folder (--slurmd-spool-dir none): slurmctld is asked about every job "
                          "every interval";
        } else {
            spool = mall::expand_slurmd_spool_dir(spool, node, host_name);
            if (spool.front() != '/')
                return usage_error("--slurmd-spool-dir " + spool + ": give an absolute path (slurmd's SlurmdSpoolDir)");
            slurmd_spool.emplace(spool, node, slurm_query->slurmd_uid());
            slurm_note += "; running jobs seen in " + spool;
        }
    }

    // --- the folders malld writes into, now that every option value is good ---
    // The state file is trusted at the next start (cgroup paths, pids) and root writes into the
    // folder: nobody else may write there, swap it for a link, or swap a folder above it. Checked
    // here for the exit status and the words; created and opened for good by the server's start
    // (Persistence::open), which checks it again as it opens it.
    const bool check_only = vm["check"].as<bool>();
    bool state_dir_missing = false;
    {
        std::string why;
        const int fd = mall::open_private_folder(state_dir, ::geteuid(), false, 0700, &why, &state_dir_missing);
        if (fd < 0 && !state_dir_missing)
            return usage_error("--state-dir" + std::string(vm.count("state-dir") ? "" : " (the default for uid " +
                               std::to_string(::geteuid()) + ")") + ": " + why + "; " +
                               mall::Persistence::state_folder_fix());
        if (fd >= 0) ::close(fd);
    }
    // A history file in a folder of its own: the same rules, checked and opened once now; every
    // append goes through that descriptor (pinned, see files.hpp).
    if (!history_file.empty() && folder_of(history_file) != state_dir) {
        const std::string folder = folder_of(history_file);
        std::string why;
        bool missing = false;
        const int fd = mall::open_private_folder(folder, ::geteuid(), false, 0700, &why, &missing);
        if (missing)
            return usage_error("--history-file '" + history_file + "': folder " + folder +
                               " does not exist; create it first (mode 0700 or 0755)");
        if (fd < 0)
            return usage_error("--history-file '" + history_file + "': " + why +
                               "; give a file in a folder of malld's own (such as the state folder, or "
                               "/var/log/mall made with mkdir -m 0755), which only malld's user may write");
        if (check_only)
            ::close(fd);
        else
            mall::pin_folder(folder, fd);
    }

    if (check_only) {
        std::cout << "malld: the options are valid: pool " << pool.to_string() << " (" << pool.count()
                  << " cpus), policy " << mall::policy_name(*policy) << ", backend " << backend_text
                  << ", socket " << socket_path << ", state in " << state_dir
                  << (state_dir_missing ? " (created mode 0700 at start)" : "")
                  << (slurm_query ? ", Slurm checks" : "") << "\n";
        return kExitOk;
    }

    // --- start-up (exit 1 on failure) ---
    mall::log_line(mall::LogLevel::Info, mall::tools::version_line("malld") +
                                             " starting as uid " + std::to_string(::geteuid()));
    mall::log_line(mall::LogLevel::Info, "topology (" + topology_spec + "): " +
                                             topology->description() + ", cpus " +
                                             topology->all_cpus().to_string());
    mall::log_line(mall::LogLevel::Info, "pool: cpus " + pool.to_string() + " (" +
                                             std::to_string(pool.count()) + " cpus)");
    raise_open_file_limit();

    std::string why;
    auto backend = mall::make_backend(*backend_kind, cgroup_parent, &why, &error);
    if (!backend) {
        mall::log_line(mall::LogLevel::Error, error);
        return kExitStartup;
    }
    mall::log_line(mall::LogLevel::Info, "backend " + std::string(mall::backend_name(backend->kind())) +
                                             ": " + backend->describe() + " (" + why + ")");
    mall::log_line(mall::LogLevel::Info,
                   "policy " + std::string(mall::policy_name(*policy)) + ", ack timeout " +
                       std::to_string(ack_timeout_ms) + " ms" +
                       (vm["allow-self-register"].as<bool>() ? ", self-registration allowed" : ""));
    if (slurm_query)
        mall::log_line(mall::LogLevel::Info,
                       "checking Slurm jobs every " + std::to_string(slurm_interval) + " s (" + slurm_note +
                           "); running jobs' figures to their AdminComment " +
                           (vm["slurm-comment-interval"].as<int>() == 0
                                ? std::string("never (only when they end)")
                                : "every " + std::to_string(vm["slurm-comment-interval"].as<int>()) + " s"));

    mall::ServerOptions server_options;
    server_options.socket_path = socket_path;
    server_options.socket_mode = socket_mode;
    server_options.state_dir = state_dir;
    server_options.ack_timeout = std::chrono::milliseconds(ack_timeout_ms);
    server_options.policy = *policy;
    server_options.policy_given = !vm["policy"].defaulted();
    for (unsigned uid : admin_uids) server_options.admin_uids.insert(static_cast<uid_t>(uid));
    server_options.allow_self_register = vm["allow-self-register"].as<bool>();
    server_options.metrics_file = metrics_file;
    server_options.metrics_interval = std::chrono::seconds(metrics_interval);
    server_options.history_file = history_file;
    server_options.history_max_bytes = static_cast<uint64_t>(history_max_mib) << 20;
    server_options.checkpoint_interval = std::chrono::seconds(vm["checkpoint-interval"].as<int>());
    server_options.host = node_name;
    if (!metrics_file.empty())
        mall::log_line(mall::LogLevel::Info, "metrics: " + metrics_file + " every " + std::to_string(metrics_interval) + " s");
    mall::log_line(mall::LogLevel::Info,
                   "history of finished jobs: " + (history_file.empty() ? std::string("none (--history-file none)") : history_file));
    server_options.max_connections_per_uid = max_connections_per_user > 0
                                                 ? max_connections_per_user
                                                 : mall::default_connections_per_uid(pool.count());

    try {
        mall::Server server(std::move(server_options), *topology, pool, std::move(backend));
        if (slurm_query)
            server.enable_slurm_checks(std::move(slurm_query), std::chrono::seconds(slurm_interval),
                                       std::chrono::seconds(vm["slurm-comment-interval"].as<int>()),
                                       std::move(slurmd_spool));
        if (!server.start(&error)) {
            mall::log_line(mall::LogLevel::Error, "cannot start: " + error);
            return kExitStartup;
        }
        return server.run();
    } catch (const std::exception &e) {
        mall::log_line(mall::LogLevel::Error, std::string("fatal: ") + e.what());
        return kExitStartup;
    }
}
