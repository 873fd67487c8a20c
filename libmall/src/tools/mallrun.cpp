// SPDX-License-Identifier: BSD-3-Clause
// mallrun.cpp — runs a command as a malleable job without Slurm: forks CMD held on a pipe,
// registers the child's pid with malld (the reply comes once the job holds cpus), then lets it
// exec with MALL_SOCKET and MALL_JOB_ID set. Forwards signals, deregisters when the child ends,
// and exits with the child's code (128+signal when it was killed; 127 when CMD cannot run).
// With --container, CMD is a `podman run` or `docker run`: malld makes the job's cgroup first (a
// folder for the cgroupfs driver, a systemd slice for the systemd driver: container_engine.hpp),
// and mallrun adds to the run the options that put the container there (--cgroup-parent),
// bind-mount malld's socket folder read-only and set MALL_SOCKET/MALL_JOB_ID inside; the job
// then ends with the container's last process (malld watches its cgroup), also for a detached
// container.
// This file is the run and supervise path: connect, register, release the held child, forward
// signals, deregister. The command line is mallrun_options.cpp's, the engine's cgroup driver
// mallrun_container.cpp's, the options added to the engine's run container_engine.hpp's.
#include <fcntl.h>
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/cpuset.hpp"
#include "common/ctl_client.hpp"
#include "common/protocol.hpp"
#include "common/rules.hpp"
#include "mall/mall.h"
#include "tools/container_engine.hpp"
#include "tools/exit_codes.hpp"
#include "tools/mallrun_child.hpp"
#include "tools/mallrun_container.hpp"
#include "tools/mallrun_options.hpp"

using nlohmann::json;

namespace {

using namespace mall::tools;
using namespace mall::tools::mallrun;

std::string absolute_path(const std::string &path) {
    if (path.empty() || path[0] == '/') return path;
    char cwd[4096];
    if (!getcwd(cwd, sizeof cwd)) return path;
    return std::string(cwd) + "/" + path;
}

// --- signals -------------------------------------------------------------------------------

volatile sig_atomic_t g_child = 0;
const int kForwarded[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};

void forward_signal(int sig, siginfo_t *info, void *) {
    // A signal the terminal generated (Ctrl-C, Ctrl-\, hang-up) went to the whole foreground
    // process group, the child included: passing it on would deliver it twice.
    if (info && info->si_code == SI_KERNEL) return;
    pid_t child = g_child;
    if (child > 0) kill(child, sig);
}

void install_forwarding() {
    struct sigaction sa {};
    sa.sa_sigaction = forward_signal;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    for (int sig : kForwarded) sigaction(sig, &sa, nullptr);
}

sigset_t forwarded_set() {
    sigset_t set;
    sigemptyset(&set);
    for (int sig : kForwarded) sigaddset(&set, sig);
    return set;
}

// Tells malld the job is over; "unknown job" is fine (malld may have seen the exit first).
void deregister(const Options &o, const std::string &socket_path) {
    std::string error;
    auto client = mall::CtlClient::connect(socket_path, &error);
    if (!client) {
        std::cerr << "mallrun: warning: could not deregister job " << o.job << ": " << error
                  << " (malld notices the exit by itself)\n";
        return;
    }
    mall::CtlResult r =
        client->request(mall::proto::Type::Deregister, json{{"job", o.job}}, std::chrono::seconds(10));
    if (r.ok) {
        if (o.verbose) std::cerr << "mallrun: job " << o.job << " deregistered\n";
        return;
    }
    if (r.code == MALL_ERR_NOJOB) {
        if (o.verbose) std::cerr << "mallrun: job " << o.job << " was already gone from malld\n";
        return;
    }
    std::cerr << "mallrun: warning: could not deregister job " << o.job << ": " << r.error << "\n";
}

int run_malleable(const Options &o, mall::CtlClient &client, const std::string &socket_path) {
    // The pool size, when MAX was left out: "up to the whole pool".
    int max = 0;
    if (o.limits.max) {
        max = *o.limits.max;
    } else {
        mall::CtlResult status = client.request(mall::proto::Type::Status, json::object(),
                                                std::chrono::seconds(10));
        if (!status.ok) {
            std::cerr << "mallrun: cannot ask malld for the pool size: " << status.error << "\n";
            return status.code == MALL_ERR_NODAEMON ? kExitUnreachable : kExitRefused;
        }
        std::string error;
        std::string pool = status.body.value("pool", std::string());
        auto cpus = mall::CpuSet::parse(pool, &error);
        max = cpus ? cpus->count() : 0;
        if (cpus && max < o.limits.min) {
            std::cerr << "mallrun: --malleable=" << o.limits.min << " asks for at least " << o.limits.min
                      << " cores, but malld's pool has " << max << " (" << pool
                      << "); use a MIN of at most " << max << "\n";
            return kExitRefused;
        }
        if (max < o.limits.min) max = o.limits.min;  // unreadable pool: let malld judge
    }

    int gate[2];
    if (pipe2(gate, O_CLOEXEC) != 0) {
        std::cerr << "mallrun: pipe failed: " << std::strerror(errno) << "\n";
        return kExitRefused;
    }
    // Signals stay blocked across fork so neither side handles one half set up.
    sigset_t forwarded = forwarded_set(), previous;
    sigprocmask(SIG_BLOCK, &forwarded, &previous);
    pid_t child = fork();
    if (child < 0) {
        std::cerr << "mallrun: fork failed: " << std::strerror(errno) << "\n";
        sigprocmask(SIG_SETMASK, &previous, nullptr);
        return kExitRefused;
    }
    if (child == 0) {
        sigprocmask(SIG_SETMASK, &previous, nullptr);
        close(gate[1]);
        // A go byte (1), then for a container the job's cgroup folder, then end-of-file.
        std::string word;
        char buffer[512];
        for (;;) {
            ssize_t n = read(gate[0], buffer, sizeof buffer);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) break;
            word.append(buffer, static_cast<size_t>(n));
        }
        if (word.empty() || word[0] != 1) _exit(kExitRefused);  // mallrun gave up (refused, or it died)
        const std::string socket = absolute_path(socket_path);
        setenv(mall::kSocketEnv, socket.c_str(), 1);
        setenv(mall::kJobIdEnv, o.job.c_str(), 1);
        setenv(mall::kMaxEnv, std::to_string(max).c_str(), 1);  // what a framework sizes its pools for
        if (o.container) {
            const auto command =
                container_command(o.command, o.engine, o.driver, word.substr(1), socket, o.job, max);
            if (o.verbose) {
                const std::string line = "mallrun: running " + quoted_command(command) + "\n";
                if (write(STDERR_FILENO, line.data(), line.size()) < 0) {
                }
            }
            exec_command(command);
        }
        exec_command(o.command);
    }
    g_child = child;
    close(gate[0]);
    install_forwarding();
    sigprocmask(SIG_SETMASK, &previous, nullptr);

    json body = {{"job", o.job},     {"uid", static_cast<int64_t>(getuid())},
                 {"pids", {child}},  {"min", o.limits.min},
                 {"max", max},       {"weight", o.weight}};
    if (o.cgroup_mode != "auto") body["cgroup"] = o.cgroup_mode;  // older mallds know no such field
    // A container job: the child (the engine's client) is only its launcher; malld makes the
    // folder the container goes in and finds the container's processes there.
    // With the systemd driver the engine takes a slice, which malld resizes through systemd.
    if (o.container) body["cgroup"] = o.driver == CgroupDriver::Systemd ? "container-systemd" : "container";
    if (o.verbose)
        std::cerr << "mallrun: registering job " << o.job << " (pid " << child << ", cores "
                  << o.limits.min << ".." << max << ") with malld at " << socket_path << "\n";
    mall::CtlResult r = client.request(mall::proto::Type::Register, body, std::chrono::seconds(30));
    if (!r.ok) {
        close(gate[1]);  // the held child reads end-of-file and exits without running CMD
        kill(child, SIGKILL);
        wait_child(child);
        if (r.code == MALL_ERR_NODAEMON)
            std::cerr << "mallrun: malld at " << socket_path << " did not answer the registration: "
                      << r.error << "\n";
        else
            std::cerr << "mallrun: malld refused job " << o.job << ": " << r.error << "\n";
        // A registration that timed out on our side may still complete on malld's. (Any other
        // refusal registered nothing, and the name may belong to someone else's job.)
        if (r.code == MALL_ERR_NODAEMON) deregister(o, socket_path);
        return r.code == MALL_ERR_NODAEMON ? kExitUnreachable : kExitRefused;
    }
    std::string go(1, '\1');
    if (o.container) {
        const std::string parent = r.body.value("cgroup_parent", std::string());
        if (parent.empty()) {
            close(gate[1]);
            kill(child, SIGKILL);
            wait_child(child);
            deregister(o, socket_path);
            std::cerr << "mallrun: malld registered job " << o.job << " but named no cgroup folder for "
                      << "the container (a malld older than 0.4?); update malld, or run the container "
                         "without --container\n";
            return kExitRefused;
        }
        if (std::string problem = cgroup_parent_problem(parent, o.driver); !problem.empty()) {
            close(gate[1]);
            kill(child, SIGKILL);
            wait_child(child);
            deregister(o, socket_path);
            std::cerr << "mallrun: job " << o.job << ": " << problem << "\n";
            return kExitRefused;
        }
        go += parent;
    }
    if (o.verbose)
        std::cerr << "mallrun: job " << o.job << " holds cpus " << r.body.value("cpus", std::string("?"))
                  << " (generation " << r.body.value("generation", json(0)).dump() << "); starting "
                  << o.command[0]
                  << (o.container ? " in cgroup " + r.body.value("cgroup_parent", std::string()) : "") << "\n";
    for (size_t done = 0; done < go.size();) {
        ssize_t n = write(gate[1], go.data() + done, go.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        done += static_cast<size_t>(n);
    }
    close(gate[1]);

    int status = wait_child(child);
    g_child = 0;
    // A container job ends by itself with the container's last process (a detached container
    // lives on after its `run` returned); any other job ends with its command.
    if (o.container) {
        if (o.verbose)
            std::cerr << "mallrun: " << o.engine << " ended; job " << o.job
                      << " ends when its container's last process does (`mallctl status`)\n";
        return exit_code_of(status);
    }
    deregister(o, socket_path);
    int code = exit_code_of(status);
    if (o.verbose) std::cerr << "mallrun: " << o.command[0] << " ended with status " << code << "\n";
    return code;
}

int run(int argc, char **argv) {
    Options o;
    if (auto done = parse_command_line(argc, argv, &o)) return *done;
    std::string error;
    // As root the engine comes from the system folders, never $PATH (also for the fallback run).
    if (!pin_engine_program(&o, &error)) {
        std::cerr << "mallrun: " << error << "\n";
        return kExitCannotRun;
    }
    const std::string socket_path = mall::resolve_socket_path(o.socket);

    mall::ConnectFailure failure;
    auto client = mall::CtlClient::connect(socket_path, &error, &failure);
    if (!client) {
        if (o.require && failure.not_malld) {
            std::cerr << "mallrun: " << failure.text() << "\n";
            return kExitUnreachable;
        }
        if (o.require) {
            // When nobody listens there, the fuller hint below replaces the short advice.
            std::cerr << "mallrun: " << (failure.nobody_listening ? failure.what : failure.text()) << "\n"
                      << "  is malld running? start it with `malld --socket " << socket_path
                      << "` or pass --socket / set MALL_SOCKET; without --require, mallrun runs the "
                         "command without malleability\n";
            return kExitUnreachable;
        }
        std::cerr << "mallrun: warning: " << error << "\n"
                  << "mallrun: running " << o.command[0] << " without malleability\n";
        std::cerr.flush();
        exec_command(o.command);
    }
    if (o.container) {
        std::string why;
        auto driver = choose_cgroup_driver(o, &why);
        if (!driver) {
            std::cerr << "mallrun: " << why << "\n";
            return kExitRefused;
        }
        o.driver = *driver;
        if (o.verbose)
            std::cerr << "mallrun: " << o.engine << " uses the " << cgroup_driver_name(o.driver)
                      << " cgroup driver" << (why.empty() ? "" : " (" + why + ")") << "\n";
    }
    return run_malleable(o, *client, socket_path);
}

}  // namespace

int main(int argc, char **argv) {
    try {
        return run(argc, argv);
    } catch (const std::exception &e) {
        std::cerr << "mallrun: " << e.what() << "\n";
        return kExitRefused;
    }
}
