// SPDX-License-Identifier: BSD-3-Clause
// mallrun_child.hpp — how mallrun runs a program and reads its end: exec in a forked child (127
// with words on stderr when it cannot run), wait through EINTR, and the shell's exit code of a
// wait status (128+signal for a killed one). Header-only; used by the run path (mallrun.cpp) and
// by mallrun_container.cpp's bounded `ENGINE info`.
#pragma once

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "tools/exit_codes.hpp"

namespace mall::tools::mallrun {

// Runs `command` in place of this (forked) process; on failure writes why and _exits 127.
[[noreturn]] inline void exec_command(const std::vector<std::string> &command) {
    std::vector<char *> args;
    for (const auto &a : command) args.push_back(const_cast<char *>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    int err = errno;
    std::string msg = "mallrun: cannot run " + command[0] + ": " + std::strerror(err) + "\n";
    if (write(STDERR_FILENO, msg.data(), msg.size()) < 0) {
    }
    _exit(kExitCannotRun);
}

// The exit code a shell shows for a wait status.
inline int exit_code_of(int status) {
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return kExitRefused;
}

// Waits for `child` (retrying on EINTR): its wait status, or 1 (kExitRefused) after printing why.
inline int wait_child(pid_t child) {
    int status = 0;
    while (waitpid(child, &status, 0) < 0) {
        if (errno != EINTR) {
            std::cerr << "mallrun: waiting for " << child << " failed: " << std::strerror(errno) << "\n";
            return kExitRefused;
        }
    }
    return status;
}

}  // namespace mall::tools::mallrun
