// SPDX-License-Identifier: BSD-3-Clause
// plugstack_args.cpp — parser for the plugin's plugstack.conf arguments (see plugstack_args.hpp).
// Contract: never throws; strict decimal numbers; absolute socket paths that fit a Unix socket.
#include "plugstack_args.hpp"

#include <cstdint>
#include <set>

#include "malleable_option.hpp"

namespace mall::slurm {

namespace {

const char *kUsage =
    "accepted: socket=/absolute/path min_cpus=N max_cpus=N on_daemon_down=run|fail ack_timeout_ms=N "
    "prolog_lookup=yes|no";

std::optional<unsigned> parse_number(const std::string &key, const std::string &value, unsigned lo,
                                     unsigned hi, std::string *why) {
    if (value.empty()) {
        *why = key + "= needs a value (a whole number from " + std::to_string(lo) + " to " + std::to_string(hi) + ")";
        return std::nullopt;
    }
    uint64_t n = 0;
    for (char c : value) {
        if (c < '0' || c > '9') {
            *why = key + "=" + value + " is not a whole number (use digits only, from " + std::to_string(lo) +
                   " to " + std::to_string(hi) + ")";
            return std::nullopt;
        }
        n = n * 10 + static_cast<uint64_t>(c - '0');
        if (n > hi) break;
    }
    if (n < lo || n > hi) {
        *why = key + "=" + value + " is out of range (from " + std::to_string(lo) + " to " + std::to_string(hi) + ")";
        return std::nullopt;
    }
    return static_cast<unsigned>(n);
}

}  // namespace

std::optional<PlugstackConfig> parse_plugstack_args(const std::vector<std::string> &args, std::string *error) {
    PlugstackConfig config;
    std::set<std::string> seen;
    std::string why;
    auto fail = [&](const std::string &text) -> std::optional<PlugstackConfig> {
        if (error) *error = "mall plugstack.conf arguments: " + text + "; " + kUsage;
        return std::nullopt;
    };

    for (const std::string &arg : args) {
        size_t eq = arg.find('=');
        if (eq == std::string::npos || eq == 0)
            return fail("\"" + arg + "\" is not of the form key=value");
        std::string key = arg.substr(0, eq);
        std::string value = arg.substr(eq + 1);
        if (!seen.insert(key).second) return fail(key + "= is given twice");
        if (key == "socket") {
            if (value.empty() || value[0] != '/')
                return fail("socket=" + value + " must be an absolute path (e.g. socket=" + kDefaultSocketPath +
                            ")");
            if (value.size() > kMaxSocketPathBytes)
                return fail("socket=" + value + " is too long for a Unix socket (at most " +
                            std::to_string(kMaxSocketPathBytes) + " bytes)");
            config.socket = value;
        } else if (key == "min_cpus") {
            auto n = parse_number(key, value, 1, kMaxMalleableCpus, &why);
            if (!n) return fail(why);
            config.min_cpus = *n;
        } else if (key == "max_cpus") {
            auto n = parse_number(key, value, 1, kMaxMalleableCpus, &why);
            if (!n) return fail(why);
            config.max_cpus = *n;
        } else if (key == "ack_timeout_ms") {
            auto n = parse_number(key, value, 1, kMaxAckTimeoutMs, &why);
            if (!n) return fail(why);
            config.ack_timeout_ms = *n;
        } else if (key == "on_daemon_down") {
            if (value == "run")
                config.on_daemon_down = OnDaemonDown::Run;
            else if (value == "fail")
                config.on_daemon_down = OnDaemonDown::Fail;
            else
                return fail("on_daemon_down=" + value + " is not run or fail");
        } else if (key == "prolog_lookup") {
            if (value == "yes")
                config.prolog_lookup = true;
            else if (value == "no")
                config.prolog_lookup = false;
            else
                return fail("prolog_lookup=" + value + " is not yes or no");
        } else {
            return fail("unknown argument \"" + key + "\"");
        }
    }
    if (config.min_cpus != 0 && config.max_cpus != 0 && config.min_cpus > config.max_cpus)
        return fail("min_cpus=" + std::to_string(config.min_cpus) + " is above max_cpus=" +
                    std::to_string(config.max_cpus));
    return config;
}

std::optional<PlugstackConfig> parse_plugstack_args(int argc, char *const argv[], std::string *error) {
    std::vector<std::string> args;
    for (int i = 0; i < argc && argv != nullptr; ++i)
        if (argv[i] != nullptr) args.emplace_back(argv[i]);
    return parse_plugstack_args(args, error);
}

}  // namespace mall::slurm
