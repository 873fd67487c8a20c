// SPDX-License-Identifier: BSD-3-Clause
// run_bounded.hpp — runs one command without a shell, bounded by a time limit, and captures what
// it prints. Contract: stdin is /dev/null; stdout (and stderr when asked) goes into `output`
// (at most max_output bytes kept, the rest read and dropped so the child never blocks); a child
// still running at the limit is SIGKILLed and reaped; the caller decides what an exit status
// means. Used by malld's systemctl calls (daemon/systemd_slice.cpp), mallrun's `podman info` /
// `docker info` (tools/mallrun_container.cpp) and mall-help2man, which compiles this file in
// itself (it links no mall library).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace mall {

struct BoundedCommand {
    std::vector<std::string> argv;      // argv[0] is the program
    bool search_path = false;           // true: argv[0] is looked up in PATH (posix_spawnp)
    std::optional<std::vector<std::string>> environment;  // "NAME=value" each; nullopt: malld's own
    bool capture_stderr = false;        // true: stderr goes into output too; false: inherited
    std::chrono::milliseconds limit{std::chrono::seconds(15)};
    size_t max_output = static_cast<size_t>(-1);  // bytes of output kept
};

struct BoundedResult {
    int spawn_error = 0;     // errno of a command that could not start (nothing else is set then)
    bool timed_out = false;  // ran past the limit and was killed
    int status = 0;          // waitpid's status
    std::string output;      // what it printed, as printed
    bool exited_zero() const;
};

// Runs `command` and waits for it (at most its limit, then kills it). Never throws for the
// child's failures: they are in the result. A pipe that cannot be made reads as spawn_error.
BoundedResult run_bounded(const BoundedCommand &command);

// "prog arg1 arg2": the command as a person would type it, for messages.
std::string command_text(const std::vector<std::string> &argv);

}  // namespace mall
