// SPDX-License-Identifier: BSD-3-Clause
// attackers.cpp — the helpers attackers.hpp declares: Peer (fork, become a uid, report one line,
// hold until released), ask, listed_jobs, delegate, kill_and_craft_saved_cgroup and the small /proc
// readers.
#include "support/attackers.hpp"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <fstream>

#include <gtest/gtest.h>

#include "../../libmall/src/daemon/procfs.hpp"
#include "common/ctl_client.hpp"

namespace mall::test {

using nlohmann::json;

std::string cgroup_of(pid_t pid) { return process_cgroup(pid, cpuset_is_v2()).value_or("?"); }

std::string relative(const std::string &dir) { return dir.substr(cpuset_root().size()); }

bool write_line(const std::string &path, const std::string &text) {
    std::ofstream out(path);
    out << text << std::endl;
    return static_cast<bool>(out);
}

void delegate(const std::string &dir, uid_t uid) {
    for (const char *name : {"", "/cgroup.procs", "/tasks", "/cgroup.threads", "/cgroup.subtree_control"}) {
        const std::string path = dir + name;
        if (::access(path.c_str(), F_OK) != 0) continue;
        ASSERT_EQ(::chown(path.c_str(), uid, uid), 0) << path;
    }
}

std::string ask(const std::string &socket, proto::Type type, const json &body) {
    std::string error;
    auto client = CtlClient::connect(socket, &error);
    if (!client) return "unreachable " + error;
    CtlResult r = client->request(type, body, 15s);
    return r.ok ? "ok " + r.body.dump() : "refused " + std::to_string(r.code) + " " + r.error;
}

std::vector<std::string> listed_jobs(const std::string &socket) {
    std::vector<std::string> names;
    auto r = run_command(mallctl_argv(socket, {"status", "--json"}));
    json status = json::parse(r.out, nullptr, false);
    if (r.exit_code != 0 || !status.is_object()) return {"(mallctl status --json failed: " + r.err + ")"};
    for (const auto &job : status.value("jobs", json::array())) names.push_back(job.value("job", ""));
    return names;
}

std::vector<std::string> sleeper_as(uid_t uid, const std::string &cgroup) {
    const std::string u = std::to_string(uid);
    std::string command = "exec setpriv --reuid=" + u + " --regid=" + u + " --clear-groups -- /bin/sleep 120";
    if (!cgroup.empty()) command = "echo $$ > " + cgroup + "/cgroup.procs && " + command;
    return {"/bin/sh", "-c", command};
}

bool runs_as(pid_t pid, uid_t uid) { return process_real_uid(pid) == uid; }

void kill_and_craft_saved_cgroup(PrivateMalld &malld, const std::string &path) {
    malld.kill9();
    const std::string state_file = malld.state_dir() + "/malld.state.json";
    json state = json::parse(read_file(state_file), nullptr, false);
    ASSERT_TRUE(state.is_object() && state["jobs"].size() == 1u) << read_file(state_file);
    json &job = state["jobs"][0];
    job["cpuset"] = "0";
    job["published"] = "0";
    job["cgroups"] = json::array({{{"path", path}, {"in_place", true}, {"original", "0-1"}}});
    {
        std::ofstream out(state_file, std::ios::trunc);
        out << state.dump(2);
    }
    ASSERT_EQ(::chmod(state_file.c_str(), 0600), 0);
}

Peer::Peer(uid_t uid, const std::string &cgroup, const std::function<std::string()> &work) {
    int report[2], hold[2];
    if (::pipe2(report, O_CLOEXEC) != 0 || ::pipe2(hold, O_CLOEXEC) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
        ::close(report[0]);
        ::close(hold[1]);
        std::string line;
        if (!cgroup.empty() && !write_line(cgroup + "/cgroup.procs", std::to_string(::getpid())))
            line = "setup: cannot enter " + cgroup;
        else if (::setgroups(0, nullptr) != 0 || ::setresgid(uid, uid, uid) != 0 ||
                 ::setresuid(uid, uid, uid) != 0)
            line = "setup: cannot become uid " + std::to_string(uid);
        else
            line = work();
        line += "\n";
        if (::write(report[1], line.data(), line.size()) < 0) ::_exit(2);
        char byte;
        while (::read(hold[0], &byte, 1) < 0 && errno == EINTR) {
        }
        ::_exit(0);
    }
    ::close(report[1]);
    ::close(hold[0]);
    report_ = report[0];
    hold_ = hold[1];
}

Peer::~Peer() {
    release();
    if (report_ >= 0) ::close(report_);
    if (pid_ > 0 && !wait_until([&] { return ::waitpid(pid_, nullptr, WNOHANG) == pid_; }, 5s)) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
    }
}

std::string Peer::result(Millis timeout) {
    std::string text;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (text.find('\n') == std::string::npos && std::chrono::steady_clock::now() < deadline) {
        pollfd p{report_, POLLIN, 0};
        if (::poll(&p, 1, 100) <= 0) continue;
        char buf[4096];
        const ssize_t n = ::read(report_, buf, sizeof buf);
        if (n <= 0) break;
        text.append(buf, static_cast<size_t>(n));
    }
    return text.substr(0, text.find('\n'));
}

void Peer::release() {
    if (hold_ >= 0) ::close(hold_);
    hold_ = -1;
}

}  // namespace mall::test
