// SPDX-License-Identifier: BSD-3-Clause
// fuzz_plugstack_args.cpp — libFuzzer target for parse_plugstack_args(), the Slurm plugin's reader
// of its plugstack.conf arguments (run as root in slurmstepd and in every client). Input: the
// text after the plugin's path on its plugstack.conf line; it is split on blanks, newlines and NUL
// bytes, as Slurm splits the line, into the arguments. Checked besides "no crash, leak or sanitizer
// report": both overloads (vector, argc/argv) give the same answer; a line with a word that is not
// key=value, an unknown key or a key given twice is refused; an accepted configuration keeps every
// bound and its own arguments parse back to it; a refusal ends with the accepted forms.
#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_check.hpp"
#include "malleable_option.hpp"  // kMaxMalleableCpus
#include "plugstack_args.hpp"

namespace {

using mall::fuzz::shown;
using mall::slurm::OnDaemonDown;
using mall::slurm::PlugstackConfig;

bool same(const PlugstackConfig &a, const PlugstackConfig &b) {
    return a.socket == b.socket && a.min_cpus == b.min_cpus && a.max_cpus == b.max_cpus &&
           a.on_daemon_down == b.on_daemon_down && a.ack_timeout_ms == b.ack_timeout_ms &&
           a.prolog_lookup == b.prolog_lookup;
}

std::vector<std::string> as_args(const PlugstackConfig &config) {
    std::vector<std::string> args{"socket=" + config.socket,
                                  "ack_timeout_ms=" + std::to_string(config.ack_timeout_ms),
                                  config.on_daemon_down == OnDaemonDown::Run ? "on_daemon_down=run"
                                                                             : "on_daemon_down=fail",
                                  config.prolog_lookup ? "prolog_lookup=yes" : "prolog_lookup=no"};
    if (config.min_cpus != 0) args.push_back("min_cpus=" + std::to_string(config.min_cpus));
    if (config.max_cpus != 0) args.push_back("max_cpus=" + std::to_string(config.max_cpus));
    return args;
}

// Refusals that need no knowledge of the values: a word without "key=", an unknown key, a repeat.
bool must_refuse(const std::vector<std::string> &args) {
    static const std::set<std::string> keys{"socket",         "min_cpus",       "max_cpus",
                                            "on_daemon_down", "ack_timeout_ms", "prolog_lookup"};
    std::set<std::string> seen;
    for (const auto &arg : args) {
        size_t eq = arg.find('=');
        if (eq == std::string::npos || eq == 0) return true;
        std::string key = arg.substr(0, eq);
        if (!keys.count(key) || !seen.insert(key).second) return true;
    }
    return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    std::string_view line(reinterpret_cast<const char *>(data), size);
    std::vector<std::string> args;
    for (size_t pos = 0; pos < line.size();) {
        size_t end = line.find_first_of(std::string_view(" \t\r\n\0", 5), pos);
        if (end == std::string_view::npos) end = line.size();
        if (end > pos) args.emplace_back(line.substr(pos, end - pos));
        pos = end + 1;
    }
    const std::string where = " for " + shown(line);

    std::string error, argv_error;
    auto config = mall::slurm::parse_plugstack_args(args, &error);
    std::vector<char *> argv;
    for (auto &arg : args) argv.push_back(arg.data());
    auto from_argv = mall::slurm::parse_plugstack_args(static_cast<int>(argv.size()), argv.data(), &argv_error);
    MALL_FUZZ_CHECK(config.has_value() == from_argv.has_value() && error == argv_error &&
                        (!config || same(*config, *from_argv)),
                    "the vector and argv overloads disagree" + where);
    if (!config) {
        static const std::string accepted =
            "; accepted: socket=/absolute/path min_cpus=N max_cpus=N on_daemon_down=run|fail ack_timeout_ms=N "
            "prolog_lookup=yes|no";
        MALL_FUZZ_CHECK(error.rfind("mall plugstack.conf arguments: ", 0) == 0 && error.size() > accepted.size() &&
                            error.compare(error.size() - accepted.size(), accepted.size(), accepted) == 0,
                        "a refusal without the usual words: " + error);
        return 0;
    }
    MALL_FUZZ_CHECK(!must_refuse(args), "accepted a bad word, an unknown key or a repeat" + where);
    MALL_FUZZ_CHECK(!config->socket.empty() && config->socket[0] == '/' &&
                        config->socket.size() <= mall::kMaxSocketPathBytes,
                    "socket " + shown(config->socket) + where);
    MALL_FUZZ_CHECK(config->min_cpus <= mall::slurm::kMaxMalleableCpus &&
                        config->max_cpus <= mall::slurm::kMaxMalleableCpus,
                    "cpu bounds above the sanity bound" + where);
    MALL_FUZZ_CHECK(config->min_cpus == 0 || config->max_cpus == 0 || config->min_cpus <= config->max_cpus,
                    "min_cpus above max_cpus" + where);
    MALL_FUZZ_CHECK(config->ack_timeout_ms >= 1 && config->ack_timeout_ms <= mall::slurm::kMaxAckTimeoutMs,
                    "ack_timeout_ms" + where);

    auto again = mall::slurm::parse_plugstack_args(as_args(*config), &error);
    MALL_FUZZ_CHECK(again && same(*again, *config), "its own arguments parse differently" + where + ": " + error);
    return 0;
}
