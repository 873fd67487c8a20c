// plugstack_args.hpp — parser for the plugin's plugstack.conf arguments (pure logic, no Slurm):
//   socket=PATH min_cpus=N max_cpus=N on_daemon_down=run|fail ack_timeout_ms=N
// Every argument is optional, each may appear once; unknown or malformed ones are errors whose text
// names the argument and says what is accepted.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace mall::slurm {

enum class OnDaemonDown { Run, Fail };

struct PlugstackConfig {
    std::string socket = "/run/mall/malld.sock";
    unsigned min_cpus = 0;         // 0: no admin lower bound
    unsigned max_cpus = 0;         // 0: no admin upper bound (the node's cores)
    OnDaemonDown on_daemon_down = OnDaemonDown::Run;
    unsigned ack_timeout_ms = 2000;  // malld's ack timeout; our request timeouts add a margin to it
};

constexpr unsigned kMaxAckTimeoutMs = 600000;  // 10 minutes: anything longer stalls job starts
constexpr size_t kMaxSocketPathBytes = 107;     // sun_path minus the terminating NUL

// On failure returns nullopt and *error says which argument is wrong and what is accepted.
std::optional<PlugstackConfig> parse_plugstack_args(const std::vector<std::string> &args,
                                                    std::string *error);

// Convenience for the SPANK callbacks (argc/argv as Slurm passes them).
std::optional<PlugstackConfig> parse_plugstack_args(int argc, char *const argv[], std::string *error);

}  // namespace mall::slurm
