// SPDX-License-Identifier: BSD-3-Clause
// mallctl.cpp — the administrator's command line for malld: the global options, the command
// table (each command's name, help and handler, in one row), the help texts' layout, usage errors
// and dispatch. The commands live in their own files:
// status and watch (tools/mallctl_status.cpp); set, policy, reclaim, release and record
// (tools/mallctl_steer.cpp); metrics and history (tools/mallctl_reports.cpp); top
// (tools/mallctl_top.cpp); and signal (tools/mallctl_signal.cpp), which talks to a process, not
// to malld. Each exports its help and its handler (CommandHandler, mallctl_session.hpp: one
// signature for all); each validates every argument locally before sending anything.
// Exit codes: 0 ok, 1 malld refused (its words on stderr), 2 usage error, 3 malld unreachable.
#include <cctype>
#include <iostream>
#include <string>
#include <vector>

#include <boost/program_options.hpp>

#include "common/rules.hpp"
#include "mall/mall.h"
#include "tools/exit_codes.hpp"
#include "tools/mallctl_reports.hpp"
#include "tools/mallctl_session.hpp"
#include "tools/mallctl_signal.hpp"
#include "tools/mallctl_status.hpp"
#include "tools/mallctl_steer.hpp"
#include "tools/mallctl_top.hpp"
#include "tools/tool_cli.hpp"

namespace po = boost::program_options;

namespace {

using namespace mall::tools;

// ---------------------------------------------------------------------------------------------
// The commands: each file exports a synopsis, a summary, the details and the handler.

struct Command {
    const char *name;
    const char *synopsis;  // after "mallctl [--socket PATH] "
    const char *summary;   // one line for the command list
    std::string details;   // the body of `mallctl help NAME`
    CommandHandler run;    // runs `mallctl NAME ARGS...`
};

// Built on first use (in main), after every file's help texts are initialised. The order is the
// command list's in `mallctl --help` and in the error messages.
const std::vector<Command> &commands() {
    static const std::vector<Command> table = {
        {"status", kStatusSynopsis, kStatusSummary, kStatusDetails, cmd_status},
        {"set", kSetSynopsis, kSetSummary, kSetDetails, cmd_set},
        {"policy", kPolicySynopsis, kPolicySummary, kPolicyDetails, cmd_policy},
        {"reclaim", kReclaimSynopsis, kReclaimSummary, kReclaimDetails, cmd_reclaim},
        {"release", kReleaseSynopsis, kReleaseSummary, kReleaseDetails, cmd_release},
        {"record", kRecordSynopsis, kRecordSummary, kRecordDetails, cmd_record},
        {"watch", kWatchSynopsis, kWatchSummary, kWatchDetails, cmd_watch},
        {"metrics", kMetricsSynopsis, kMetricsSummary, kMetricsDetails, cmd_metrics},
        {"history", kHistorySynopsis, kHistorySummary, kHistoryDetails, cmd_history},
        {"top", kTopSynopsis, kTopSummary, kTopDetails, cmd_top},
        {"signal", kSignalSynopsis, kSignalSummary, kSignalDetails, cmd_signal},
    };
    return table;
}

// "status, set, ... or signal": the command names for error messages.
std::string command_names(const char *last_joiner = " or ") {
    std::string names;
    const size_t n = commands().size();
    for (size_t i = 0; i < n; ++i)
        names += (i == 0 ? "" : i + 1 == n ? last_joiner : ", ") + std::string(commands()[i].name);
    return names;
}

const Command *find_command(const std::string &name) {
    for (const auto &c : commands())
        if (name == c.name) return &c;
    return nullptr;
}

void print_main_help(std::ostream &out) {
    out << "mallctl - inspect and steer malld, the mall node manager\n"
           "\n"
           "Usage:\n"
           "  mallctl [--socket PATH] COMMAND [ARGS...]\n"
           "  mallctl help COMMAND        (or: mallctl COMMAND --help)\n"
           "\n"
           "Commands:\n";
    for (const auto &c : commands()) {
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
           "status, watch, metrics and top are open to everyone (a user who is not an admin sees\n"
           "other users' jobs only as their cpus); history reads malld's history file (mode 0600:\n"
           "root). set, policy, reclaim, release and record need root or an admin uid of malld.\n"
           "signal talks to a process, not to malld: its owner or root may.\n"
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

int run(int argc, char **argv) {
    // Step 1: the global options and the command name; the rest is left for the command.
    po::options_description global;
    global.add_options()("socket", po::value<std::string>(), "")("command", po::value<std::string>(), "")(
        "args", po::value<std::vector<std::string>>(), "");
    mall::tools::add_help_and_version(global);
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

    // --version wins over --help here: the help depends on the command named.
    const bool help = mall::tools::wants_help(vm);
    if (mall::tools::wants_version(vm)) {
        std::cout << mall::tools::version_line("mallctl") << "\n";
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
    if (!c) {
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
    try {
        return c->run(g, rest, [c](const std::string &what) { return usage_error(c->name, what); });
    } catch (const po::error &e) {  // a command's own options, read by parse_command()
        return usage_error(command, e.what());
    }
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
