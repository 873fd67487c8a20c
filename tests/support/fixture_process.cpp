// SPDX-License-Identifier: BSD-3-Clause
// fixture_process.cpp — the helpers that run programs (see malld_fixture.hpp): fork/exec with a
// MALL_*-free environment in a process group of its own, run_command (run to completion, output
// captured, SIGKILLed at its deadline), Child (a background reader of its stdout lines; the
// destructor ends and reaps the group) and the argv builders for mallrun, mallctl and the test
// client. Contract: every group spawned is in the watchdog sweep's registry until reaped.

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "support/fixture_internal.hpp"

extern char **environ;

namespace mall::test {

using namespace internal;

// =============================================================================================
// Spawning.

internal::SpawnPlan internal::make_plan(const std::vector<std::string> &argv,
                    const std::vector<std::pair<std::string, std::string>> &env, bool as_nobody) {
    SpawnPlan plan;
    plan.argv_storage = argv;
    for (char **e = environ; e && *e; ++e)
        if (std::strncmp(*e, "MALL_", 5) != 0) plan.env_storage.emplace_back(*e);
    for (const auto &[k, v] : env) plan.env_storage.push_back(k + "=" + v);
    for (auto &s : plan.argv_storage) plan.argv.push_back(s.data());
    plan.argv.push_back(nullptr);
    for (auto &s : plan.env_storage) plan.envp.push_back(s.data());
    plan.envp.push_back(nullptr);
    plan.as_nobody = as_nobody;
    if (as_nobody) {
        struct passwd *pw = ::getpwnam("nobody");
        plan.uid = pw ? pw->pw_uid : 65534;
        plan.gid = pw ? pw->pw_gid : 65534;
    }
    return plan;
}

pid_t internal::spawn(const SpawnPlan &plan, int stdout_fd, int stderr_fd) {
    pid_t pid = ::fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        ::setpgid(0, 0);
        sigset_t all;
        sigemptyset(&all);
        ::sigprocmask(SIG_SETMASK, &all, nullptr);
        ::signal(SIGPIPE, SIG_DFL);
        int devnull = ::open("/dev/null", O_RDONLY);
        if (devnull >= 0) ::dup2(devnull, 0);
        if (stdout_fd >= 0) ::dup2(stdout_fd, 1);
        if (stderr_fd >= 0) ::dup2(stderr_fd, 2);
        if (plan.as_nobody) {
            if (::chdir("/") != 0 || ::setgroups(0, nullptr) != 0 || ::setgid(plan.gid) != 0 ||
                ::setuid(plan.uid) != 0) {
                safe_write("mall test: cannot become user nobody in the child\n");
                ::_exit(126);
            }
        }
        ::execve(plan.argv[0], plan.argv.data(), plan.envp.data());
        safe_write("mall test: execve failed for ");
        safe_write(plan.argv[0]);
        safe_write("\n");
        ::_exit(127);
    }
    ::setpgid(pid, pid);  // also in the parent, so the group exists before we signal it
    track_group(pid);
    return pid;
}

int internal::decode_status(int status) {
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return -1;
}

std::optional<int> internal::wait_pid(pid_t pid, Millis timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
        int status = 0;
        pid_t r = ::waitpid(pid, &status, WNOHANG);
        if (r == pid) return decode_status(status);
        if (r < 0 && errno != EINTR) return -1;
        if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
        std::this_thread::sleep_for(5ms);
    }
}

CommandResult run_command(const std::vector<std::string> &argv, const RunOptions &options) {
    CommandResult result;
    int out_pipe[2], err_pipe[2];
    if (::pipe2(out_pipe, O_CLOEXEC) != 0) return result;
    if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
        ::close(out_pipe[0]);
        ::close(out_pipe[1]);
        return result;
    }
    SpawnPlan plan = make_plan(argv, options.env, options.as_nobody);
    pid_t pid = spawn(plan, out_pipe[1], err_pipe[1]);
    ::close(out_pipe[1]);
    ::close(err_pipe[1]);
    result.pid = pid;
    if (pid < 0) {
        ::close(out_pipe[0]);
        ::close(err_pipe[0]);
        return result;
    }
    auto deadline = std::chrono::steady_clock::now() + options.timeout;
    struct pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
    int open_fds = 2;
    while (open_fds > 0) {
        auto left = std::chrono::duration_cast<Millis>(deadline - std::chrono::steady_clock::now());
        if (left.count() <= 0) {
            result.timed_out = true;
            break;
        }
        int r = ::poll(fds, 2, static_cast<int>(std::min<long long>(left.count(), 100)));
        if (r < 0 && errno != EINTR) break;
        for (int i = 0; i < 2; ++i) {
            if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            char buf[4096];
            ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
            if (n > 0) {
                (i == 0 ? result.out : result.err).append(buf, static_cast<size_t>(n));
            } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
                ::close(fds[i].fd);
                fds[i].fd = -1;
                --open_fds;
            }
        }
    }
    for (auto &f : fds)
        if (f.fd >= 0) ::close(f.fd);
    if (result.timed_out) ::kill(-pid, SIGKILL);
    auto left = std::chrono::duration_cast<Millis>(deadline - std::chrono::steady_clock::now());
    auto code = wait_pid(pid, std::max(left, Millis(2000)));
    if (!code) {
        result.timed_out = true;
        ::kill(-pid, SIGKILL);
        code = wait_pid(pid, 10s);
    }
    ::kill(-pid, SIGKILL);  // leftovers of its group (a grandchild that outlived it)
    untrack_group(pid);
    result.exit_code = code.value_or(-1);
    return result;
}

// =============================================================================================
// Child.

Child::Child(std::vector<std::string> argv, ChildOptions options) : argv_(std::move(argv)) {
    int out_pipe[2];
    if (::pipe2(out_pipe, O_CLOEXEC) != 0) return;
    SpawnPlan plan = make_plan(argv_, options.env, options.as_nobody);
    pid_ = spawn(plan, out_pipe[1], options.capture_stderr ? out_pipe[1] : -1);
    ::close(out_pipe[1]);
    if (pid_ < 0) {
        ::close(out_pipe[0]);
        eof_ = true;
        return;
    }
    reader_ = std::thread([this, fd = out_pipe[0]] { reader_loop(fd); });
}

void Child::reader_loop(int fd) {
    std::string partial;
    for (;;) {
        struct pollfd p{fd, POLLIN, 0};
        int r = ::poll(&p, 1, 100);
        {
            std::lock_guard lock(mutex_);
            if (eof_) break;  // the destructor asked us to stop
        }
        if (r <= 0) continue;
        char buf[4096];
        ssize_t n = ::read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        std::lock_guard lock(mutex_);
        if (n <= 0) {
            if (!partial.empty()) lines_.push_back(partial);
            eof_ = true;
            cv_.notify_all();
            break;
        }
        partial.append(buf, static_cast<size_t>(n));
        size_t nl;
        while ((nl = partial.find('\n')) != std::string::npos) {
            lines_.push_back(partial.substr(0, nl));
            partial.erase(0, nl + 1);
        }
        cv_.notify_all();
    }
    ::close(fd);
}

std::optional<std::string> Child::read_line(Millis timeout) {
    std::unique_lock lock(mutex_);
    cv_.wait_for(lock, timeout, [&] { return next_unread_ < lines_.size() || eof_; });
    if (next_unread_ < lines_.size()) return lines_[next_unread_++];
    return std::nullopt;
}

std::optional<std::string> Child::wait_for_line(const std::function<bool(const std::string &)> &pred,
                                                Millis timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
        auto left = std::chrono::duration_cast<Millis>(deadline - std::chrono::steady_clock::now());
        if (left.count() < 0) return std::nullopt;
        auto line = read_line(left);
        if (!line) return std::nullopt;
        if (pred(*line)) return line;
    }
}

std::optional<std::string> Child::wait_for_line_starting(const std::string &prefix, Millis timeout) {
    return wait_for_line([&](const std::string &l) { return l.rfind(prefix, 0) == 0; }, timeout);
}

std::vector<std::string> Child::all_lines() const {
    std::lock_guard lock(mutex_);
    return lines_;
}

void Child::signal(int sig) const {
    if (pid_ > 0 && !exit_code_) ::kill(pid_, sig);
}

void Child::signal_group(int sig) const {
    if (pid_ > 0) ::kill(-pid_, sig);
}

std::optional<int> Child::wait_exit(Millis timeout) {
    if (exit_code_) return exit_code_;
    if (pid_ <= 0) return std::nullopt;
    exit_code_ = wait_pid(pid_, timeout);
    return exit_code_;
}

Child::~Child() {
    if (pid_ > 0) {
        if (!exit_code_) {
            ::kill(-pid_, SIGTERM);
            if (!wait_exit(3s)) {
                ::kill(-pid_, SIGKILL);
                wait_exit(30s);
            }
        }
        ::kill(-pid_, SIGKILL);  // anything left in its group (e.g. a grandchild)
        untrack_group(pid_);
    }
    if (reader_.joinable()) {
        // The reader stops at end of output; if a stray process still holds the pipe, tell it to stop.
        auto deadline = std::chrono::steady_clock::now() + 2s;
        while (std::chrono::steady_clock::now() < deadline) {
            {
                std::lock_guard lock(mutex_);
                if (eof_) break;
            }
            std::this_thread::sleep_for(10ms);
        }
        {
            std::lock_guard lock(mutex_);
            eof_ = true;
        }
        reader_.join();
    }
}

std::vector<std::string> mallrun_argv(const std::string &socket, const std::string &malleable,
                                      const std::string &job, const std::vector<std::string> &cmd,
                                      const std::vector<std::string> &extra) {
    std::vector<std::string> argv{bin_path("mallrun"), "--socket", socket, "--malleable=" + malleable};
    if (!job.empty()) {
        argv.push_back("--job");
        argv.push_back(job);
    }
    argv.insert(argv.end(), extra.begin(), extra.end());
    argv.push_back("--");
    argv.insert(argv.end(), cmd.begin(), cmd.end());
    return argv;
}

std::vector<std::string> test_client_argv(const std::vector<std::string> &options) {
    std::vector<std::string> argv{bin_path("mall_test_client")};
    argv.insert(argv.end(), options.begin(), options.end());
    return argv;
}

std::vector<std::string> mallctl_argv(const std::string &socket, const std::vector<std::string> &args) {
    std::vector<std::string> argv{bin_path("mallctl"), "--socket", socket};
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
}

}  // namespace mall::test
