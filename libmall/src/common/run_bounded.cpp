// SPDX-License-Identifier: BSD-3-Clause
// run_bounded.cpp — the one bounded child-process capture loop (see run_bounded.hpp): posix_spawn
// with stdin on /dev/null, a pipe for stdout (and stderr), poll until the deadline, SIGKILL past it.
#include "run_bounded.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

extern char **environ;

namespace mall {

bool BoundedResult::exited_zero() const {
    return spawn_error == 0 && !timed_out && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

std::string command_text(const std::vector<std::string> &argv) {
    std::string shown;
    for (const auto &w : argv) shown += (shown.empty() ? "" : " ") + w;
    return shown;
}

BoundedResult run_bounded(const BoundedCommand &command) {
    BoundedResult result;
    int out[2];
    if (::pipe2(out, O_CLOEXEC) != 0) {
        result.spawn_error = errno;
        return result;
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
    if (command.capture_stderr) posix_spawn_file_actions_adddup2(&actions, out[1], STDERR_FILENO);
    std::vector<std::string> words = command.argv;
    std::vector<char *> argv;
    for (auto &w : words) argv.push_back(w.data());
    argv.push_back(nullptr);
    std::vector<std::string> env_text;
    std::vector<char *> env;
    if (command.environment) {
        env_text = *command.environment;
        for (auto &e : env_text) env.push_back(e.data());
        env.push_back(nullptr);
    }
    char **envp = command.environment ? env.data() : environ;
    pid_t pid = 0;
    const int spawned = command.search_path
                            ? posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), envp)
                            : posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), envp);
    posix_spawn_file_actions_destroy(&actions);
    ::close(out[1]);
    if (spawned != 0) {
        ::close(out[0]);
        result.spawn_error = spawned;
        return result;
    }
    const auto deadline = std::chrono::steady_clock::now() + command.limit;
    for (;;) {
        const auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
        if (left.count() <= 0) {
            result.timed_out = true;
            break;
        }
        pollfd p{out[0], POLLIN, 0};
        const int ready = ::poll(&p, 1, static_cast<int>(left.count()));
        if (ready < 0 && errno == EINTR) continue;
        if (ready <= 0) {
            result.timed_out = ready == 0;
            break;
        }
        char buf[4096];
        const ssize_t n = ::read(out[0], buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        if (result.output.size() < command.max_output)
            result.output.append(buf, std::min(static_cast<size_t>(n), command.max_output - result.output.size()));
    }
    ::close(out[0]);
    if (result.timed_out) ::kill(pid, SIGKILL);
    while (::waitpid(pid, &result.status, 0) < 0 && errno == EINTR) {
    }
    return result;
}

}  // namespace mall
