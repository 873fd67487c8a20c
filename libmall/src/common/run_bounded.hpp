// SPDX-License-Identifier: BSD-3-Clause
// run_bounded.hpp — runs one command without a shell, bounded by a time limit, and captures what
// it prints; and finds the programs root may run (never through $PATH). Contract: stdin is
// /dev/null; stdout (and stderr when asked) goes into `output` (at most max_output bytes kept, the
// rest read and dropped so the child never blocks); one deadline, `limit` from the start, covers
// reading AND waiting for the child's end: a child that closed its output but still runs is
// SIGKILLed at the deadline like one that still prints, then reaped within kReapGrace (one stuck in
// the kernel past that is left to a later call to reap), so a call returns within limit +
// kReapGrace whatever the child does; the caller decides what an exit status means. Used by
// malld's systemctl calls (daemon/systemd_slice.cpp), mallrun's `podman info` / `docker info`
// (tools/mallrun_container.cpp) and mall-help2man, which compiles this file in itself (it links
// no mall library).
// Programs for root: trusted_program_path() looks a name up in kTrustedProgramDirs only, and takes
// a file only when it is owned by root and writable by neither group nor others and every folder
// above it (as named and as resolved through symlinks) passes folder_chain_problem (files.hpp, the
// rule malld's state folder follows too: owned by root, writable by nobody else unless sticky);
// program_to_run() applies that when the caller is root and keeps the $PATH lookup for anyone else.
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
    std::chrono::milliseconds limit{std::chrono::seconds(15)};  // output and exit, together
    size_t max_output = static_cast<size_t>(-1);  // bytes of output kept
};

// How long a call waits for a child it SIGKILLed to be reaped before it returns anyway.
inline constexpr std::chrono::milliseconds kReapGrace{200};

struct BoundedResult {
    int spawn_error = 0;     // errno of a command that could not start (nothing else is set then)
    pid_t pid = 0;           // the child's pid, once started (for messages and tests)
    bool timed_out = false;  // did not end (output closed and exited) by the limit, and was killed
    bool reaped = true;      // false: its end was not seen, status unknown: killed but not reaped
                             // within kReapGrace, or reaped elsewhere (ECHILD: SIGCHLD ignored)
    int status = 0;          // waitpid's status
    std::string output;      // what it printed, as printed
    bool exited_zero() const;
};

// Runs `command` and waits for it (at most its limit, then kills it). Never throws for the
// child's failures: they are in the result. A pipe that cannot be made reads as spawn_error.
BoundedResult run_bounded(const BoundedCommand &command);

// "prog arg1 arg2": the command as a person would type it, for messages.
std::string command_text(const std::vector<std::string> &argv);

// The folders root takes programs from, in this order; $PATH is never read for root.
inline const std::vector<std::string> &trusted_program_dirs() {
    static const std::vector<std::string> dirs{"/usr/bin", "/bin", "/usr/sbin", "/sbin", "/usr/local/bin"};
    return dirs;
}

// "" when `path` is a file root may run: an executable regular file owned by root and writable by
// neither group nor others, in folders (each one up to /, both on the path as written and on the
// path symlinks resolve it to) that pass folder_chain_problem(path, 0): owned by root, writable by
// nobody else unless sticky. Otherwise what is wrong, in words naming the file or folder.
std::string untrusted_program_problem(const std::string &path);

// The absolute path of program `name` (no '/') in the first of `dirs` that holds it and passes
// untrusted_program_problem(); nullopt with *why naming where it looked and what was wrong.
std::optional<std::string> trusted_program_path(const std::string &name, std::string *why,
                                                const std::vector<std::string> &dirs = trusted_program_dirs());

// What to run for program `name`: as root, trusted_program_path(name) (never $PATH: an environment
// root inherited must not choose root's programs); otherwise `name` itself, looked up in $PATH.
struct ProgramChoice {
    std::string program;  // what goes in argv[0]
    bool search_path = false;
};
std::optional<ProgramChoice> program_to_run(const std::string &name, bool as_root, std::string *why);

}  // namespace mall
