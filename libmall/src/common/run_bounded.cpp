// SPDX-License-Identifier: BSD-3-Clause
// run_bounded.cpp — the one bounded child-process capture loop (see run_bounded.hpp): posix_spawn
// with stdin on /dev/null, a pipe for stdout (and stderr), poll until the deadline, then wait for
// the child's end until the same deadline, SIGKILL past it; and the trusted-program lookup for root.
#include "run_bounded.hpp"

#include "files.hpp"  // folder_chain_problem: the one rule for folders above a path root trusts

#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

extern char **environ;

namespace mall {

namespace {

using Clock = std::chrono::steady_clock;

// Children killed at their deadline that were not reaped within kReapGrace (stuck in the kernel):
// each later call reaps those that have ended meanwhile, so none stays a zombie for long.
std::mutex g_unreaped_mutex;
std::vector<pid_t> g_unreaped;

void reap_leftovers() {
    std::lock_guard<std::mutex> lock(g_unreaped_mutex);
    g_unreaped.erase(std::remove_if(g_unreaped.begin(), g_unreaped.end(),
                                    [](pid_t pid) {
                                        int status = 0;
                                        const pid_t got = ::waitpid(pid, &status, WNOHANG);
                                        return got == pid || (got < 0 && errno != EINTR);
                                    }),
                     g_unreaped.end());
}

// How waiting for a child ended.
enum class Reap {
    Reaped,   // it ended and we reaped it: the status is its own
    Gone,     // ECHILD: no longer ours to wait for (SIGCHLD ignored, or another waitpid reaped it);
              // its end was never seen and its pid may already be another process's
    Running,  // still running at the deadline
};

// Waits for `pid` to end, at most until `deadline`.
Reap reap_by(pid_t pid, int *status, Clock::time_point deadline) {
    auto pause = std::chrono::microseconds(500);
    for (;;) {
        const pid_t got = ::waitpid(pid, status, WNOHANG);
        if (got == pid) return Reap::Reaped;
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return Reap::Gone;
        const auto now = Clock::now();
        if (now >= deadline) return Reap::Running;
        std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
        pause = std::min(pause * 2, std::chrono::microseconds(20000));
    }
}

std::string octal_mode(mode_t mode) {
    char text[8];
    std::snprintf(text, sizeof text, "%04o", static_cast<unsigned>(mode & 07777));
    return text;
}

// "" when `st` (of `what`, "file X" or "folder X") is owned by root and writable by neither its
// group nor others; else what is wrong.
std::string ownership_problem(const struct stat &st, const std::string &what) {
    if (st.st_uid != 0) return what + " is owned by uid " + std::to_string(st.st_uid) + ", not root";
    if (st.st_mode & (S_IWGRP | S_IWOTH))
        return what + " is writable by " + ((st.st_mode & S_IWOTH) ? "others" : "its group") + " (mode " +
               octal_mode(st.st_mode) + ")";
    return "";
}

}  // namespace

bool BoundedResult::exited_zero() const {
    return spawn_error == 0 && !timed_out && reaped && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

std::string command_text(const std::vector<std::string> &argv) {
    std::string shown;
    for (const auto &w : argv) shown += (shown.empty() ? "" : " ") + w;
    return shown;
}

BoundedResult run_bounded(const BoundedCommand &command) {
    BoundedResult result;
    reap_leftovers();
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
    const auto deadline = Clock::now() + command.limit;
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
    result.pid = pid;
    // Its output until end-of-file (or the deadline)...
    for (;;) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
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
    // ...then its end, by the same deadline: a child that closed its output and hangs (a stuck
    // systemctl) is killed like one that still prints.
    if (!result.timed_out) {
        const Reap ended = reap_by(pid, &result.status, deadline);
        if (ended == Reap::Gone) {  // its status is unknown: never reported as a success
            result.status = 0;
            result.reaped = false;
            return result;
        }
        if (ended == Reap::Running) result.timed_out = true;
    }
    if (result.timed_out) {
        ::kill(pid, SIGKILL);
        result.status = 0;
        const Reap ended = reap_by(pid, &result.status, Clock::now() + kReapGrace);
        result.reaped = ended == Reap::Reaped;
        if (ended == Reap::Running) {
            std::lock_guard<std::mutex> lock(g_unreaped_mutex);
            g_unreaped.push_back(pid);
        }
    }
    return result;
}

std::string untrusted_program_problem(const std::string &path) {
    if (path.empty() || path[0] != '/') return "'" + path + "' is not an absolute path";
    char resolved[PATH_MAX];
    if (::realpath(path.c_str(), resolved) == nullptr)
        return "cannot resolve " + path + ": " + std::strerror(errno);
    struct stat st{};
    if (::stat(resolved, &st) != 0) return "cannot read " + std::string(resolved) + ": " + std::strerror(errno);
    const std::string file = path == resolved ? "file " + path : "file " + path + " (" + resolved + ")";
    if (!S_ISREG(st.st_mode)) return file + " is not a regular file";
    if ((st.st_mode & (S_IXUSR | S_IXGRP | S_IXOTH)) == 0) return file + " is not executable";
    if (std::string problem = ownership_problem(st, file); !problem.empty()) return problem;
    // The folders as written (where a symlink on the way lives) and as resolved.
    if (std::string problem = folder_chain_problem(path, 0); !problem.empty()) return problem;
    if (std::string problem = folder_chain_problem(resolved, 0); !problem.empty()) return problem;
    return "";
}

std::optional<std::string> trusted_program_path(const std::string &name, std::string *why,
                                                const std::vector<std::string> &dirs) {
    std::string looked;
    for (const auto &d : dirs) looked += (looked.empty() ? "" : ", ") + d;
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
        if (why) *why = "'" + name + "' is not a program name (a name without '/', found in " + looked + ")";
        return std::nullopt;
    }
    std::string problems;
    for (const auto &dir : dirs) {
        const std::string candidate = dir + "/" + name;
        struct stat st{};
        if (::lstat(candidate.c_str(), &st) != 0) continue;
        const std::string problem = untrusted_program_problem(candidate);
        if (problem.empty()) return candidate;
        problems += "; " + problem;
    }
    if (why)
        *why = (problems.empty() ? "no " + name + " in " + looked
                                 : "no " + name + " that root may run in " + looked + problems) +
               " (as root, mall runs programs only from these folders, owned by root and writable by "
               "neither group nor others, never through $PATH)";
    return std::nullopt;
}

std::optional<ProgramChoice> program_to_run(const std::string &name, bool as_root, std::string *why) {
    if (!as_root) return ProgramChoice{name, true};
    auto path = trusted_program_path(name, why);
    if (!path) return std::nullopt;
    return ProgramChoice{*path, false};
}

}  // namespace mall
