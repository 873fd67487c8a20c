// SPDX-License-Identifier: BSD-3-Clause
// tool_cli.hpp — what mall's command-line tools (mallctl, mallrun, mall-oci-hook) answer the same
// way: the -h/--help and --version switches they accept, and the version line they print,
// "<tool> (mall) MAJOR.MINOR.PATCH" (the mall.h they were built with). Header-only: each tool links
// it into its own program. malld (daemon/malld_main.cpp) prints version_line too; its switches
// carry help text of their own.
#pragma once

#include <iostream>
#include <optional>
#include <string>

#include <boost/program_options.hpp>

#include "mall/mall.h"
#include "tools/exit_codes.hpp"

namespace mall::tools {

// "<tool> (mall) X.Y.Z", without a newline.
inline std::string version_line(const char *tool) {
    return std::string(tool) + " (mall) " + std::to_string(MALL_API_VERSION_MAJOR) + "." +
           std::to_string(MALL_API_VERSION_MINOR) + "." + std::to_string(MALL_API_VERSION_PATCH);
}

// Adds "-h/--help" and "--version" as switches (no text: each tool writes its own help).
inline void add_help_and_version(boost::program_options::options_description &options) {
    options.add_options()("help,h", boost::program_options::bool_switch(), "")(
        "version", boost::program_options::bool_switch(), "");
}

inline bool wants_help(const boost::program_options::variables_map &values) { return values["help"].as<bool>(); }
inline bool wants_version(const boost::program_options::variables_map &values) {
    return values["version"].as<bool>();
}

// For a tool whose --help wins over --version: prints the help (print_help) or the version line
// to stdout and returns kExitOk; nullopt when neither was asked for.
template <class PrintHelp>
std::optional<int> answer_help_or_version(const boost::program_options::variables_map &values, const char *tool,
                                          PrintHelp print_help) {
    if (wants_help(values)) {
        print_help();
        return kExitOk;
    }
    if (wants_version(values)) {
        std::cout << version_line(tool) << "\n";
        return kExitOk;
    }
    return std::nullopt;
}

}  // namespace mall::tools
