// SPDX-License-Identifier: BSD-3-Clause
// Proves that malld keeps serving under hostile clients: descriptors pushed at it, one user's
// connection flood, and oversized client strings (not echoed in full or with newlines into its log).
#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <pwd.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "common/protocol.hpp"
#include "common/unix_socket.hpp"
#include "mall/mall.h"
#include "support/malld_fixture.hpp"

MALL_TEST_WATCHDOG(240);

namespace mall::test {
namespace {

using nlohmann::json;

// A connected TCP socket whose last close blocks (SO_LINGER 30 s with data the peer never
// reads), plus the peer end that keeps the data unread. abort() makes closing it instant.
struct LingeringTcp {
    UniqueFd listener, client, server;

    bool open() {
        listener.reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
        sockaddr_in addr{};
        addr.sin_family = AF_INET;
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t len = sizeof addr;
        if (!listener || ::bind(listener.get(), reinterpret_cast<sockaddr *>(&addr), len) != 0 ||
            ::listen(listener.get(), 1) != 0 ||
            ::getsockname(listener.get(), reinterpret_cast<sockaddr *>(&addr), &len) != 0)
            return false;
        client.reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
        int small = 4096;
        ::setsockopt(client.get(), SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
        if (::connect(client.get(), reinterpret_cast<sockaddr *>(&addr), sizeof addr) != 0) return false;
        server.reset(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
        if (!server) return false;
        ::setsockopt(server.get(), SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
        // Fill both buffers: the unsent rest keeps a lingering close waiting.
        ::fcntl(client.get(), F_SETFL, O_NONBLOCK);
        std::string chunk(65536, 'd');
        while (::send(client.get(), chunk.data(), chunk.size(), MSG_NOSIGNAL) > 0) {
        }
        linger lg{1, 30};
        return ::setsockopt(client.get(), SOL_SOCKET, SO_LINGER, &lg, sizeof lg) == 0;
    }
    // Reset instead of lingering, so that our own close returns at once.
    void abort() {
        linger lg{1, 0};
        if (client) ::setsockopt(client.get(), SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    }
    ~LingeringTcp() { abort(); }
};

// Sends one packet carrying fd; true when the kernel took it.
bool send_with_fd(int sock, const std::string &data, int fd) { return send_packet(sock, data, fd); }

std::string encoded(proto::Type type, const json &body, uint32_t request_id = 1) {
    proto::Message msg;
    msg.type = type;
    msg.request_id = request_id;
    msg.body = body;
    return proto::encode(msg);
}

bool mallctl_status_works(const PrivateMalld &malld) {
    RunOptions options;
    options.timeout = 10s;
    CommandResult r = run_command(mallctl_argv(malld.socket(), {"status"}), options);
    return r.exit_code == 0 && !r.timed_out;
}

class Hardening : public MalldWithJobTest {};

// recv_packet itself: a descriptor the caller did not ask for is closed off the caller's thread,
// so a lingering TCP socket does not hold the caller (malld's loop, libmall's monitor thread).
TEST(RecvPacket, UnwantedLingeringDescriptorDoesNotBlockTheCaller) {
    int pair[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair), 0);
    UniqueFd a(pair[0]), b(pair[1]);
    LingeringTcp tcp;
    ASSERT_TRUE(tcp.open());
    ASSERT_TRUE(send_with_fd(a.get(), "x", tcp.client.get()));
    tcp.client.reset();  // not the last reference: the packet in flight holds one, no wait here
    std::atomic<bool> returned{false};
    std::thread receiver([&] {
        std::string data;
        recv_packet(b.get(), &data, 16, nullptr, false);
        returned = true;
    });
    const bool in_time = wait_until([&] { return returned.load(); }, 5s);
    if (!in_time) tcp.server.reset();  // unblock the close so the thread can be joined
    receiver.join();
    EXPECT_TRUE(in_time) << "recv_packet waited for the lingering close of the passed socket";
}

TEST_F(Hardening, PassedDescriptorsDoNotStallMalld) {
    UniqueFd sock(unix_connect(malld_->socket()));
    ASSERT_TRUE(sock) << std::strerror(errno);
    // A plain pipe end and a TCP socket whose last close would block for 30 s.
    int p[2];
    ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
    UniqueFd pr(p[0]), pw(p[1]);
    LingeringTcp tcp;
    ASSERT_TRUE(tcp.open());
    const std::string status = encoded(proto::Type::Status, json::object());
    const bool pipe_taken = send_with_fd(sock.get(), status, pr.get());
    const bool tcp_taken = send_with_fd(sock.get(), status, tcp.client.get());
    // On kernels with SO_PASSRIGHTS malld refuses descriptors outright (EPERM); otherwise it
    // takes them and must close them without waiting.
    if (!pipe_taken) {
        EXPECT_EQ(errno, EPERM);
    }
    if (!tcp_taken) {
        EXPECT_EQ(errno, EPERM);
    }
    // Our copy is closed on a thread of its own, linger still on: whoever closes last (malld, if it
    // took the socket) waits for the unsent data; the test must not, and malld must not either.
    std::thread([fd = tcp.client.release()] { ::close(fd); }).detach();
    // Asked in-process (status_json gives up after 5 s), not through a forked mallctl: a fork
    // while the closing thread runs would hand the child a reference to the lingering socket,
    // and the child's exec would then be the one that waits for it.
    EXPECT_TRUE(status_json(malld_->socket()).has_value()) << malld_->log();
    tcp.server.reset();  // unread data: a reset ends any lingering close
    EXPECT_TRUE(mallctl_status_works(*malld_)) << malld_->log();
}

TEST_F(Hardening, OneUsersConnectionFloodDoesNotLockOutRoot) {
    struct passwd *pw = ::getpwnam("nobody");
    const uid_t uid = pw ? pw->pw_uid : 65534;
    const gid_t gid = pw ? pw->pw_gid : 65534;
    constexpr int kConnections = 300;  // above malld's default per-user cap on this 2-cpu node (256)
    int ready[2], hold[2];
    ASSERT_EQ(::pipe2(ready, O_CLOEXEC), 0);
    ASSERT_EQ(::pipe2(hold, O_CLOEXEC), 0);
    const std::string socket = malld_->socket();
    pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        ::close(ready[0]);
        ::close(hold[1]);
        if (::setgroups(0, nullptr) != 0 || ::setgid(gid) != 0 || ::setuid(uid) != 0) ::_exit(10);
        std::vector<int> fds;
        for (int i = 0; i < kConnections; ++i) {
            int fd = unix_connect(socket);
            if (fd >= 0) fds.push_back(fd);
        }
        char n = 1;
        if (::write(ready[1], &n, 1) != 1) ::_exit(11);
        char c;
        while (::read(hold[0], &c, 1) < 0 && errno == EINTR) {
        }
        ::_exit(0);  // the kernel closes the connections
    }
    ::close(ready[1]);
    ::close(hold[0]);
    char n = 0;
    ssize_t got;
    do {
        got = ::read(ready[0], &n, 1);
    } while (got < 0 && errno == EINTR);
    EXPECT_EQ(got, 1) << "the flooding child did not report";
    EXPECT_TRUE(mallctl_status_works(*malld_)) << malld_->log();
    EXPECT_TRUE(wait_until([&] { return malld_->log().find("the limit per non-admin user") != std::string::npos; }, 5s))
        << malld_->log();
    ::close(hold[1]);  // the child exits
    ::close(ready[0]);
    int wstatus = 0;
    ASSERT_EQ(::waitpid(child, &wstatus, 0), child);
    EXPECT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << "child status " << wstatus;
    EXPECT_TRUE(mallctl_status_works(*malld_)) << malld_->log();
}

TEST_F(Hardening, HugeClientStringsAreNotLoggedInFull) {
    UniqueFd sock(unix_connect(malld_->socket()));
    ASSERT_TRUE(sock) << std::strerror(errno);
    const std::string marker(60000, 'q');
    const std::string name = marker + "\n2026-01-01T00:00:00.000 malld[1] info: FORGED";
    ASSERT_TRUE(send_packet(sock.get(), encoded(proto::Type::Attach, {{"job", name}}, 7)));
    ASSERT_EQ(wait_readable(sock.get(), 10s), 1);
    std::string data;
    ASSERT_GT(recv_packet(sock.get(), &data, proto::kMaxPacket), 0);
    auto reply = proto::decode(data, nullptr);
    ASSERT_TRUE(reply.has_value());
    EXPECT_FALSE(reply->body.value("ok", true));
    EXPECT_EQ(reply->body.value("code", 0), MALL_ERR_INVAL) << reply->body.dump().substr(0, 300);
    EXPECT_EQ(reply->body.dump().find(std::string(200, 'q')), std::string::npos) << "the reply echoes the name";
    // A request any client may send, with a huge field: malld logs requests at debug level.
    ASSERT_TRUE(send_packet(sock.get(), encoded(proto::Type::Status, {{"junk", name}}, 8)));
    ASSERT_EQ(wait_readable(sock.get(), 10s), 1);
    ASSERT_GT(recv_packet(sock.get(), &data, proto::kMaxPacket), 0);

    EXPECT_TRUE(mallctl_status_works(*malld_)) << malld_->log().substr(0, 4000);
    const std::string log = malld_->log();
    EXPECT_EQ(log.find(std::string(200, 'q')), std::string::npos) << "a client string was logged in full";
    EXPECT_EQ(log.find("\n2026-01-01T00:00:00.000 malld[1] info: FORGED"), std::string::npos)
        << "a client forged a log line";
    EXPECT_NE(log.find("refused Attach"), std::string::npos) << log.substr(0, 4000);
}

}  // namespace
}  // namespace mall::test
