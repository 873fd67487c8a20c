// SPDX-License-Identifier: BSD-3-Clause
// mallrun_options.hpp — mallrun's command line: its own options before "--", the command after
// it, `--help` and `--version`. Contract: every option is checked here (--malleable by the tools'
// shared MIN[:MAX] parser, job names, weights, --cgroup, --container's engine and run command)
// before anything is started or sent; a bad one is a usage error (its words, the usage lines,
// where to read more; exit 2).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/rules.hpp"
#include "tools/container_engine.hpp"  // CgroupDriver

namespace mall::tools::mallrun {

// --malleable=MIN[:MAX]: the job's core limits.
struct Limits {
    int min = 1;
    std::optional<int> max;  // nullopt: the whole pool
};

// What the command line asks for.
struct Options {
    std::string socket;  // --socket; empty: $MALL_SOCKET, else the default
    Limits limits;
    std::string job;  // --job, else a name from CMD's basename and mallrun's pid
    double weight = mall::kDefaultWeight;
    std::string cgroup_mode = "auto";
    bool container = false;
    std::string engine;  // --container: podman or docker
    CgroupDriver driver = CgroupDriver::Cgroupfs;  // --container: how the engine makes cgroups (set later)
    bool require = false;
    bool verbose = false;
    std::vector<std::string> command;
};

// Parses argv into *options. Returns the exit code when mallrun is done already (0 after --help
// or --version, 2 after printing a usage error), nullopt when the job is to be run.
std::optional<int> parse_command_line(int argc, char **argv, Options *options);

}  // namespace mall::tools::mallrun
