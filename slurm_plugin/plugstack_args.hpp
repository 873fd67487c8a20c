// SPDX-License-Identifier: BSD-3-Clause
// plugstack_args.hpp — parser for the plugin's plugstack.conf arguments (pure logic, no Slurm):
//   socket=PATH min_cpus=N max_cpus=N on_daemon_down=run|fail ack_timeout_ms=N prolog_lookup=yes|no
// Every argument is optional, each may appear once; unknown or malformed ones are errors whose text
// names the argument and says what is accepted.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/rules.hpp"
#include "common/unix_socket.hpp"  // kMaxSocketPathBytes only: the logic links no mall_common

namespace mall::slurm {

enum class OnDaemonDown { Run, Fail };

struct PlugstackConfig {
    std::string socket = kDefaultSocketPath;
    unsigned min_cpus = 0;         // 0: no admin lower bound
    unsigned max_cpus = 0;         // 0: no admin upper bound (the node's cores)
    OnDaemonDown on_daemon_down = OnDaemonDown::Run;
    // malld's ack timeout (its --ack-timeout-ms); our request timeouts add a margin to it.
    unsigned ack_timeout_ms = static_cast<unsigned>(kDefaultAckTimeout.count());
    // Whether the job prolog, which Slurm 22.05 gives no core list, asks malld --slurm to look the
    // job's cores up in slurmctld (one RPC per job and node) so that they are reclaimed before
    // the first step starts; off, each step's start reclaims them, still before its tasks.
    bool prolog_lookup = false;
};

constexpr unsigned kMaxAckTimeoutMs = 600000;  // 10 minutes: anything longer stalls job starts
// socket= paths are at most mall::kMaxSocketPathBytes long (unix_socket.hpp).

// On failure returns nullopt and *error says which argument is wrong and what is accepted.
std::optional<PlugstackConfig> parse_plugstack_args(const std::vector<std::string> &args,
                                                    std::string *error);

// Convenience for the SPANK callbacks (argc/argv as Slurm passes them).
std::optional<PlugstackConfig> parse_plugstack_args(int argc, char *const argv[], std::string *error);

}  // namespace mall::slurm
