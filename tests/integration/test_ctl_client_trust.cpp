// SPDX-License-Identifier: BSD-3-Clause
// test_ctl_client_trust.cpp — the tools (mallctl, mallrun; the OCI hook and the Slurm plugin connect
// through the same CtlClient) trust a server only as libmall does (issue 37, point 5 carried to the
// tools; unit/test_client_trust.cpp is libmall's side): its SO_PEERCRED uid must be root, the
// tool's user, or the owner of the socket file where only root and that owner write the folders on
// the way. A local user (uid 61001, a forked child that setuid()s to it) listens on a socket whose
// file is root's (as one squatting a path root's tools were pointed at): `mallctl status` and
// `mallrun --require` exit 3 ("malld unreachable") and say the server is not malld, and the server
// receives no request. The same user listening on a socket of its own in a folder of its own under
// /tmp (bind() makes any listener its socket's owner; the sticky /tmp lets anyone make that
// folder) is refused too, by root's mallctl and by a third user's (61002, setpriv). Its socket in
// a folder of its own that root made for it (a 0755 folder in a root-only chain, as /run/mall
// for malld under a service account) is accepted: `mallctl status --json` prints its answer.
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include <gtest/gtest.h>

#include "common/ctl_client.hpp"
#include "common/protocol.hpp"
#include "common/unix_socket.hpp"
#include "support/malld_fixture.hpp"

MALL_TEST_WATCHDOG(120);

namespace mall::test {
namespace {

using nlohmann::json;

constexpr uid_t kOtherUid = 61001;  // a throwaway uid: no passwd entry needed
constexpr uid_t kThirdUid = 61002;  // a tool's user that is neither root nor the server's

// argv that runs `argv` as `uid` (gid the same, no supplementary groups).
std::vector<std::string> as_user(uid_t uid, std::vector<std::string> argv) {
    std::vector<std::string> out = {"/usr/bin/setpriv", "--reuid=" + std::to_string(uid),
                                    "--regid=" + std::to_string(uid), "--clear-groups"};
    out.insert(out.end(), argv.begin(), argv.end());
    return out;
}

// Whether only root may write folder (root's, no group or other write bit).
bool only_root_writes(const std::string &folder) {
    struct stat st{};
    return ::lstat(folder.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == 0 && (st.st_mode & 022) == 0;
}

bool contains(const std::string &text, const std::string &part) { return text.find(part) != std::string::npos; }

// A server of kOtherUid on `socket`, in a forked child: it answers every request with an ok
// Reply {"served_by_uid": 61001, "jobs": []} and counts the requests it received (requests()).
// It serves until destroyed.
class ServerOfAnotherUser {
public:
    explicit ServerOfAnotherUser(const std::string &socket) {
        int ready_pipe[2], stop_pipe[2], count_pipe[2];
        if (::pipe2(ready_pipe, O_CLOEXEC) != 0 || ::pipe2(stop_pipe, O_CLOEXEC) != 0 ||
            ::pipe2(count_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
            return;
        pid_ = ::fork();
        if (pid_ == 0) {
            ::close(ready_pipe[0]);
            ::close(stop_pipe[1]);
            ::close(count_pipe[0]);
            char ok = 0;
            int listener = -1;
            if (::setgroups(0, nullptr) == 0 && ::setgid(kOtherUid) == 0 && ::setuid(kOtherUid) == 0)
                listener = unix_listen(socket, 0666, nullptr);
            ok = listener >= 0 ? 1 : 0;
            (void)!::write(ready_pipe[1], &ok, 1);
            if (listener < 0) _exit(1);
            serve(listener, stop_pipe[0], count_pipe[1]);
            _exit(0);
        }
        ::close(ready_pipe[1]);
        ::close(stop_pipe[0]);
        ::close(count_pipe[1]);
        stop_fd_ = stop_pipe[1];
        count_fd_ = count_pipe[0];
        char ok = 0;
        ready_ = pid_ > 0 && ::read(ready_pipe[0], &ok, 1) == 1 && ok == 1;
        ::close(ready_pipe[0]);
    }
    ~ServerOfAnotherUser() {
        if (stop_fd_ >= 0) ::close(stop_fd_);
        if (count_fd_ >= 0) ::close(count_fd_);
        if (pid_ > 0) {
            auto deadline = std::chrono::steady_clock::now() + 10s;
            int status = 0;
            while (::waitpid(pid_, &status, WNOHANG) == 0) {
                if (std::chrono::steady_clock::now() > deadline) {
                    ::kill(pid_, SIGKILL);
                    ::waitpid(pid_, &status, 0);
                    break;
                }
                std::this_thread::sleep_for(5ms);
            }
        }
    }
    bool ready() const { return ready_; }
    // The requests received so far (each one a byte on the count pipe).
    int requests() {
        char bytes[64];
        ssize_t n;
        while ((n = ::read(count_fd_, bytes, sizeof bytes)) > 0) requests_ += static_cast<int>(n);
        return requests_;
    }

private:
    static void serve(int listener, int stop_fd, int count_fd) {
        std::vector<pollfd> fds{{stop_fd, POLLIN, 0}, {listener, POLLIN, 0}};
        std::string data;
        for (;;) {
            for (auto &p : fds) p.revents = 0;
            if (::poll(fds.data(), fds.size(), 1000) < 0 && errno != EINTR) return;
            if (fds[0].revents) return;  // the test is done
            if (fds[1].revents & POLLIN) {
                int client = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
                if (client >= 0) fds.push_back({client, POLLIN, 0});
            }
            for (size_t i = 2; i < fds.size(); ++i) {
                if (!fds[i].revents) continue;
                ssize_t n = recv_packet(fds[i].fd, &data, proto::kMaxPacket, nullptr, true);
                if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) continue;
                auto msg = n > 0 ? proto::decode(data, nullptr) : std::nullopt;
                if (!msg) {
                    ::close(fds[i].fd);
                    fds.erase(fds.begin() + static_cast<long>(i--));
                    continue;
                }
                (void)!::write(count_fd, "r", 1);
                proto::Message reply;
                reply.type = proto::Type::Reply;
                reply.request_id = msg->request_id;
                reply.body = proto::ok_reply({{"served_by_uid", kOtherUid}, {"jobs", json::array()}});
                send_packet(fds[i].fd, proto::encode(reply));
            }
        }
    }

    pid_t pid_ = -1;
    int stop_fd_ = -1, count_fd_ = -1;
    bool ready_ = false;
    int requests_ = 0;
};

class CtlClientTrust : public ::testing::Test {
protected:
    void SetUp() override {
        if (::geteuid() != 0) GTEST_SKIP() << "needs root (setuid to a throwaway uid, chown)";
        char tmpl[] = "/tmp/mall_ctl_trust_XXXXXX";
        ASSERT_NE(::mkdtemp(tmpl), nullptr) << std::strerror(errno);
        dir_ = tmpl;
        // The server's user may bind there (a folder of its own).
        ASSERT_EQ(::chown(dir_.c_str(), kOtherUid, kOtherUid), 0) << std::strerror(errno);
        socket_ = dir_ + "/malld.sock";
    }
    void TearDown() override {
        if (!dir_.empty()) std::filesystem::remove_all(dir_);
    }
    std::string dir_, socket_;
};

// A local user's server behind a socket file that is root's: root's mallctl and mallrun refuse it
// before they send anything, exit 3 and say why.
TEST_F(CtlClientTrust, Issue37ToolsRefuseAServerOfAnotherUserNotOwningTheSocket) {
    ServerOfAnotherUser server(socket_);
    ASSERT_TRUE(server.ready());
    ASSERT_EQ(::chown(socket_.c_str(), 0, 0), 0) << std::strerror(errno);

    CommandResult status = run_command(mallctl_argv(socket_, {"status", "--json"}));
    EXPECT_EQ(status.exit_code, 3) << status.out << status.err;
    EXPECT_TRUE(contains(status.err, "uid " + std::to_string(kOtherUid))) << status.err;
    EXPECT_TRUE(contains(status.err, "not malld")) << status.err;
    EXPECT_FALSE(contains(status.err, "is malld running")) << "a server that is not malld gets no start hint: " << status.err;
    EXPECT_FALSE(contains(status.out, "served_by_uid")) << status.out;

    CommandResult run = run_command(mallrun_argv(socket_, "1:2", "trust", {"/bin/true"}, {"--require"}));
    EXPECT_EQ(run.exit_code, 3) << run.out << run.err;
    EXPECT_TRUE(contains(run.err, "not malld")) << run.err;
    EXPECT_FALSE(contains(run.err, "is malld running")) << run.err;

    // The library call behind every tool (the OCI hook's and the Slurm plugin's too).
    std::string error;
    ConnectFailure failure;
    EXPECT_FALSE(CtlClient::connect(socket_, &error, &failure).has_value());
    EXPECT_EQ(failure.code, MALL_ERR_NODAEMON);
    EXPECT_TRUE(contains(error, "refusing the server at " + socket_)) << error;

    EXPECT_EQ(server.requests(), 0) << "a request reached the server that is not malld";
}

// Review finding 4: owning the socket vouched for any server (bind() makes its listener the
// owner). A user's server on its own socket in its own folder under the sticky, world-writable
// /tmp (user B's /tmp/mall/malld.sock, made before A's) is refused by root's mallctl and by a
// third user's, and receives no request.
TEST_F(CtlClientTrust, Issue37ToolsRefuseAServerOwningItsSocketInAFolderUnderTmp) {
    struct stat tmp{};
    ASSERT_EQ(::stat("/tmp", &tmp), 0);
    ASSERT_TRUE((tmp.st_mode & S_IWOTH) && (tmp.st_mode & S_ISVTX)) << "/tmp is not sticky and world-writable here";
    ASSERT_EQ(::chmod(dir_.c_str(), 0755), 0) << std::strerror(errno);  // the third user may reach the socket
    ServerOfAnotherUser server(socket_);
    ASSERT_TRUE(server.ready());
    struct stat st{};
    ASSERT_EQ(::stat(socket_.c_str(), &st), 0);
    ASSERT_EQ(st.st_uid, kOtherUid);

    for (bool as_root : {true, false}) {
        std::vector<std::string> argv = mallctl_argv(socket_, {"status", "--json"});
        CommandResult status = run_command(as_root ? argv : as_user(kThirdUid, argv));
        SCOPED_TRACE(as_root ? "root's mallctl" : "uid 61002's mallctl");
        EXPECT_EQ(status.exit_code, 3) << status.out << status.err;
        EXPECT_TRUE(contains(status.err, "uid " + std::to_string(kOtherUid))) << status.err;
        EXPECT_TRUE(contains(status.err, "others may write /tmp")) << status.err;
        EXPECT_TRUE(contains(status.err, "not malld")) << status.err;
        EXPECT_FALSE(contains(status.out, "served_by_uid")) << status.out;
    }
    EXPECT_EQ(server.requests(), 0) << "a request reached the server that is not malld";
}

// The same server owning its socket in a folder of its own that root made for it, in folders only
// root writes (malld under a service account in /run/mall), is accepted as before, by root's
// mallctl and by a third user's: its answer is printed.
TEST_F(CtlClientTrust, Issue37ToolsAcceptAServerOwningItsSocketWhereOnlyRootAndItWrite) {
    std::string base;
    for (const char *parent : {"/run", "/var/lib"}) {
        if (!only_root_writes("/") || !only_root_writes(parent)) continue;
        std::string pattern = std::string(parent) + "/mall_ctl_trust_XXXXXX";
        if (::mkdtemp(pattern.data()) != nullptr) {
            base = pattern;
            break;
        }
    }
    if (base.empty()) GTEST_SKIP() << "no folder chain only root writes (/run, /var/lib)";
    struct RemoveAtEnd {
        std::string path;
        ~RemoveAtEnd() {
            std::error_code ignored;
            std::filesystem::remove_all(path, ignored);
        }
    } remove_base{base};
    ASSERT_EQ(::chmod(base.c_str(), 0755), 0) << std::strerror(errno);
    const std::string service_folder = base + "/mall";
    ASSERT_EQ(::mkdir(service_folder.c_str(), 0755), 0) << std::strerror(errno);
    ASSERT_EQ(::chown(service_folder.c_str(), kOtherUid, kOtherUid), 0) << std::strerror(errno);
    const std::string socket = service_folder + "/malld.sock";
    ServerOfAnotherUser server(socket);
    ASSERT_TRUE(server.ready());

    for (bool as_root : {true, false}) {
        std::vector<std::string> argv = mallctl_argv(socket, {"status", "--json"});
        CommandResult status = run_command(as_root ? argv : as_user(kThirdUid, argv));
        SCOPED_TRACE(as_root ? "root's mallctl" : "uid 61002's mallctl");
        EXPECT_EQ(status.exit_code, 0) << status.out << status.err;
        json body = json::parse(status.out, nullptr, false);
        ASSERT_TRUE(body.is_object()) << status.out << status.err;
        EXPECT_EQ(body.value("served_by_uid", 0u), kOtherUid) << status.out;
    }
    EXPECT_GE(server.requests(), 2);
}

}  // namespace
}  // namespace mall::test
