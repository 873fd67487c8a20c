// SPDX-License-Identifier: BSD-3-Clause
// Proves that no client can make malld grow threads or flood its log (issue 37.3 and 37.9):
// descriptors passed to malld on a kernel without SO_PASSRIGHTS (simulated with
// MALLD_TEST_WITHOUT_SO_PASSRIGHTS=1) are closed by one closer thread with a bounded queue, even
// when each close hangs (TCP sockets lingering with unsent data), and a client that overfills the
// queue is dropped while malld keeps serving; refusals are logged a few per uid however often the
// client reconnects; a job that reports its usage 1000 times in a tight loop causes a few log lines,
// and its last report is the one in force (within about a second).
#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>

#include <gtest/gtest.h>

#include "common/ctl_client.hpp"
#include "common/protocol.hpp"
#include "common/unix_socket.hpp"
#include "support/malld_fixture.hpp"

MALL_TEST_WATCHDOG(200);

namespace mall::test {
namespace {

using nlohmann::json;

// Threads: in /proc/<pid>/status; -1 when unreadable.
int thread_count(pid_t pid) {
    std::ifstream status("/proc/" + std::to_string(pid) + "/status");
    std::string line;
    while (std::getline(status, line))
        if (line.rfind("Threads:", 0) == 0) return std::atoi(line.c_str() + 8);
    return -1;
}

// The state letter in /proc/<pid>/stat ('T' when stopped); '?' when unreadable.
char process_state(pid_t pid) {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    const size_t paren = text.rfind(')');
    return paren != std::string::npos && paren + 2 < text.size() ? text[paren + 2] : '?';
}

// Lines of text that contain every one of `parts`.
int lines_with(const std::string &text, const std::vector<std::string> &parts) {
    std::istringstream in(text);
    int count = 0;
    for (std::string line; std::getline(in, line);) {
        bool all = true;
        for (const auto &part : parts) all = all && line.find(part) != std::string::npos;
        count += all;
    }
    return count;
}

std::string packet_of(proto::Type type, const json &body, uint32_t id) {
    proto::Message msg;
    msg.type = type;
    msg.request_id = id;
    msg.body = body;
    return proto::encode(msg);
}

// A loopback TCP listener whose backlog keeps the server ends of connections unread, so that
// client ends with unsent data and SO_LINGER wait up to the linger time at their last close.
// Closing the listener resets them all, and such closes return.
class LingerTrap {
public:
    LingerTrap() {
        listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        int small = 4096;
        ::setsockopt(listener_, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
        addr_.sin_family = AF_INET;
        addr_.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t len = sizeof addr_;
        if (::bind(listener_, reinterpret_cast<sockaddr *>(&addr_), len) != 0 || ::listen(listener_, 128) != 0 ||
            ::getsockname(listener_, reinterpret_cast<sockaddr *>(&addr_), &len) != 0) {
            ::close(listener_);
            listener_ = -1;
        }
    }
    ~LingerTrap() { reset_all(); }
    bool ok() const { return listener_ >= 0; }
    // A client end holding unsent data, lingering up to linger_s at its last close; -1 on failure.
    int lingering_socket(int linger_s) const {
        int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        int small = 4096;
        ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
        if (::connect(fd, reinterpret_cast<const sockaddr *>(&addr_), sizeof addr_) != 0) {
            ::close(fd);
            return -1;
        }
        ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
        std::string junk(65536, 'x');
        while (::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL) > 0) {
        }
        linger lingering{1, linger_s};
        ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &lingering, sizeof lingering);
        return fd;
    }
    void reset_all() {
        if (listener_ >= 0) ::close(listener_);
        listener_ = -1;
    }

private:
    int listener_ = -1;
    sockaddr_in addr_{};
};

class DaemonFloods : public ::testing::Test {
protected:
    void SetUp() override { MALL_REQUIRE_ROOT_AND_CPUSET(); }
};

// Regression (issue 37.3): on kernels without SO_PASSRIGHTS malld started one detached thread per
// packet carrying descriptors to close them; a close that hangs kept each thread alive, so a
// client could make malld's threads pile up without bound. Now one closer thread takes them all.
TEST_F(DaemonFloods, Issue37PassedDescriptorsCostOneCloserThreadNotOneThreadEach) {
    ::setenv("MALLD_TEST_WITHOUT_SO_PASSRIGHTS", "1", 1);
    PrivateMalld malld;
    std::string error;
    const bool started = malld.start(&error);
    ::unsetenv("MALLD_TEST_WITHOUT_SO_PASSRIGHTS");
    ASSERT_TRUE(started) << error;
    const int before = thread_count(malld.pid());
    ASSERT_GT(before, 0);

    // kPackets Status requests, each carrying a lingering socket whose last reference malld must
    // drop: malld is stopped while they are sent and this process closes its copies, in rounds
    // (its socket queues only so many packets).
    constexpr int kPackets = 40, kPerRound = 8;
    LingerTrap trap;
    ASSERT_TRUE(trap.ok()) << std::strerror(errno);
    auto client = CtlClient::connect(malld.socket(), &error);
    ASSERT_TRUE(client) << error;
    for (int round = 0; round < kPackets / kPerRound; ++round) {
        ASSERT_EQ(::kill(malld.pid(), SIGSTOP), 0);
        ASSERT_TRUE(wait_until([&] { return process_state(malld.pid()) == 'T'; }, 5s));
        for (int i = 0; i < kPerRound; ++i) {
            int fd = trap.lingering_socket(60);
            ASSERT_GE(fd, 0) << std::strerror(errno);
            const bool sent = send_packet(client->fd(), packet_of(proto::Type::Status, json::object(), 1), fd);
            ::close(fd);
            ASSERT_TRUE(sent) << std::strerror(errno);
        }
        ASSERT_EQ(::kill(malld.pid(), SIGCONT), 0);
        for (int i = 0; i < kPerRound; ++i) {  // malld has taken every descriptor once it answered
            ASSERT_EQ(wait_readable(client->fd(), 10s), 1) << malld.log();
            std::string reply;
            ASSERT_GT(recv_packet(client->fd(), &reply, proto::kMaxPacket, nullptr, false), 0);
        }
    }
    const int during = thread_count(malld.pid());
    EXPECT_LE(during, before + 2) << "malld had " << before << " threads, now " << during;
    CommandResult status = run_command(mallctl_argv(malld.socket(), {"status"}));
    EXPECT_EQ(status.exit_code, 0) << status.err;

    // A client that overfills the closer's queue (kMaxQueuedCloses) while it is stuck is dropped;
    // malld goes on serving everyone else, with no more threads.
    int pipe_ends[2];
    ASSERT_EQ(::pipe2(pipe_ends, O_CLOEXEC), 0);
    auto flooder = CtlClient::connect(malld.socket(), &error);
    ASSERT_TRUE(flooder) << error;
    int sent = 0;
    for (int i = 0; i < 8; ++i) {  // 8 x 250 descriptors: twice the queue
        std::string packet = packet_of(proto::Type::Status, json::object(), 2000 + i);
        std::vector<int> many(250, pipe_ends[0]);
        iovec iov{packet.data(), packet.size()};
        alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 250)] = {};
        msghdr msg{};
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control;
        msg.msg_controllen = sizeof control;
        cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
        cmsg->cmsg_level = SOL_SOCKET;
        cmsg->cmsg_type = SCM_RIGHTS;
        cmsg->cmsg_len = CMSG_LEN(sizeof(int) * many.size());
        std::memcpy(CMSG_DATA(cmsg), many.data(), sizeof(int) * many.size());
        if (::sendmsg(flooder->fd(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) break;  // dropped already
        ++sent;
    }
    ::close(pipe_ends[0]);
    ::close(pipe_ends[1]);
    EXPECT_GE(sent, 4);
    EXPECT_TRUE(wait_until([&] { return malld.log().find("dropping the connection of uid 0") != std::string::npos; }, 10s))
        << malld.log();
    EXPECT_LE(thread_count(malld.pid()), before + 2);
    status = run_command(mallctl_argv(malld.socket(), {"status"}));
    EXPECT_EQ(status.exit_code, 0) << status.err;

    // Once the stuck closes return (the connections are reset), the closer catches up and
    // malld stops cleanly, in bounded time.
    trap.reset_all();
    EXPECT_EQ(malld.stop(10s), 0);
}

// Regression (issue 37.9): refusals were logged at most 5 per second per connection, so a client
// that reconnected for each refused request wrote a line each time. Now 10 per 10 s per uid, then
// one line that counts the rest.
TEST_F(DaemonFloods, Issue37ReconnectingForEachRefusedRequestDoesNotFloodTheLog) {
    PrivateMalld malld;
    std::string error;
    ASSERT_TRUE(malld.start(&error)) << error;
    const uid_t uid = 61030;
    pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        if (::setgroups(0, nullptr) != 0 || ::setresgid(uid, uid, uid) != 0 || ::setresuid(uid, uid, uid) != 0)
            ::_exit(10);
        auto refused_register = [&] {
            auto client = CtlClient::connect(malld.socket(), nullptr);
            if (!client) return false;
            auto r = client->request(proto::Type::Register,
                                     json{{"job", "sneaky"}, {"uid", uid}, {"pids", {::getpid()}}, {"min", 1}, {"max", 1}},
                                     5s);
            return !r.ok && r.code == MALL_ERR_DENIED;
        };
        for (int i = 0; i < 200; ++i)
            if (!refused_register()) ::_exit(11);
        ::sleep(2);  // a token comes back: the next refusal is logged with the count of the others
        ::_exit(refused_register() ? 0 : 12);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status));
    ASSERT_EQ(WEXITSTATUS(status), 0) << "10: cannot become uid 61030, 11/12: a Register was not refused";
    const std::string log = malld.log();
    const int refusals = lines_with(log, {"refused Register from uid 61030"});
    EXPECT_GE(refusals, 10) << log;
    EXPECT_LE(refusals, 20) << "201 refused requests on 201 connections made " << refusals << " lines";
    EXPECT_GE(lines_with(log, {"suppressed ", "refusal(s) from uid 61030"}), 1) << log;
}

// Regression (issue 37.9): every Usage message of an attached job was a replan, an info line and
// a broadcast: 1000 of them made thousands of lines. Now changes take effect at most once a second
// per job, logged at debug level.
TEST_F(DaemonFloods, Issue37AThousandUsageReportsMakeAFewLogLines) {
    MalldOptions options;
    options.log_level = "info";
    PrivateMalld malld(options);
    std::string error;
    ASSERT_TRUE(malld.start(&error)) << error;
    int go[2], done[2];
    ASSERT_EQ(::pipe2(go, O_CLOEXEC), 0);
    ASSERT_EQ(::pipe2(done, O_CLOEXEC), 0);
    pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        ::close(go[1]);
        ::close(done[0]);
        char byte;
        if (::read(go[0], &byte, 1) != 1) ::_exit(10);
        auto client = CtlClient::connect(malld.socket(), nullptr);
        if (!client) ::_exit(11);
        if (!client->request(proto::Type::Attach, json{{"job", "reporter"}}, 10s).ok) ::_exit(12);
        for (int i = 0; i < 1000; ++i)  // 1, 2, 1, ... 2: the first takes effect at once, the last later
            if (!send_packet(client->fd(), packet_of(proto::Type::Usage, json{{"cpus_used", 1 + i % 2}}, 0)))
                ::_exit(13);
        if (::write(done[1], "x", 1) != 1) ::_exit(14);
        for (;;) ::pause();
    }
    ::close(go[0]);
    ::close(done[1]);
    struct Reap {
        pid_t pid;
        ~Reap() {
            ::kill(pid, SIGKILL);
            ::waitpid(pid, nullptr, 0);
        }
    } reap{child};
    auto ctl = CtlClient::connect(malld.socket(), &error);
    ASSERT_TRUE(ctl) << error;
    CtlResult reg = ctl->request(proto::Type::Register,
                                 json{{"job", "reporter"}, {"uid", 0}, {"pids", {child}}, {"min", 1}, {"max", 2}}, 20s);
    ASSERT_TRUE(reg.ok) << reg.error;
    const size_t lines_before = lines_with(malld.log(), {""});
    ASSERT_EQ(::write(go[1], "x", 1), 1);
    char byte;
    ASSERT_EQ(::read(done[0], &byte, 1), 1) << "the reporter could not attach or send";
    ::close(go[1]);
    ::close(done[0]);
    // The last report is in force soon, and malld answers all along.
    EXPECT_TRUE(wait_until(
        [&] {
            auto job = job_status(malld.socket(), "reporter");
            return job && job->value("usage_cap", -1) == 2;
        },
        10s))
        << status_text(malld);
    CommandResult status = run_command(mallctl_argv(malld.socket(), {"status"}));
    EXPECT_EQ(status.exit_code, 0) << status.err;
    const std::string log = malld.log();
    const int added = lines_with(log, {""}) - static_cast<int>(lines_before);
    EXPECT_LE(added, 40) << "1000 Usage reports made " << added << " log lines:\n" << log.substr(log.size() > 6000 ? log.size() - 6000 : 0);
    EXPECT_EQ(lines_with(log, {"info: event", "\"usage\""}), 0) << "usage events are logged at debug level";
}

}  // namespace
}  // namespace mall::test
