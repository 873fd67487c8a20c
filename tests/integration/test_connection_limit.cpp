// SPDX-License-Identifier: BSD-3-Clause
// Proves malld's per-user connection limit fits large nodes and explains itself: by default one
// ordinary user may hold more than 64 connections (one per rank of a many-rank job; the old fixed
// limit was 64 and rank 65 retried forever), a user over the limit set with
// --max-connections-per-user gets an error naming the limit and the option (tools and libmall
// alike), root is never locked out (not even when 16 ordinary uids each take all they may: issue
// 37.2), an ordinary user holds at most 8 watchers, the uids of a user namespace (a rootless
// container's subuids) share their owner's limit, a user namespace root made is a user of its own
// (neither sharing root's connections nor another such namespace's), and a bad limit is a usage
// error that starts nothing.
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <fstream>
#include <cstring>

#include <gtest/gtest.h>

#include "common/ctl_client.hpp"
#include "common/protocol.hpp"
#include "common/unix_socket.hpp"
#include "daemon/connections.hpp"
#include "mall/mall.h"
#include "support/malld_fixture.hpp"

MALL_TEST_WATCHDOG(180);

namespace mall::test {
namespace {

using nlohmann::json;

// What one ordinary user (nobody) saw while opening connections to malld.
struct Flood {
    int answered = 0;          // connections on which a Status request was answered
    int refusal_code = 0;      // the first failed connection's code (0: none failed)
    std::string refusal;       // and its words
    int open_rc = 0;           // mall_open() with all those connections still held
    std::string open_error;
};

// In a child running as nobody: opens `count` connections, each asking Status (and held open),
// then calls mall_open() once more. The result comes back as JSON through a pipe.
Flood flood_as_nobody(const std::string &socket, int count) {
    struct passwd *pw = ::getpwnam("nobody");
    const uid_t uid = pw ? pw->pw_uid : 65534;
    const gid_t gid = pw ? pw->pw_gid : 65534;
    int out[2];
    if (::pipe2(out, O_CLOEXEC) != 0) return {};
    pid_t child = ::fork();
    if (child == 0) {
        ::close(out[0]);
        if (::setgroups(0, nullptr) != 0 || ::setgid(gid) != 0 || ::setuid(uid) != 0) ::_exit(10);
        json result{{"answered", 0}, {"refusal_code", 0}, {"refusal", ""}};
        std::vector<CtlClient> held;
        for (int i = 0; i < count; ++i) {
            std::string error;
            auto client = CtlClient::connect(socket, &error);
            CtlResult r = client ? client->request(proto::Type::Status, json::object(), 10s) : CtlResult{};
            if (client && r.ok) {
                result["answered"] = result["answered"].get<int>() + 1;
                held.push_back(std::move(*client));
            } else if (result["refusal_code"] == 0) {
                result["refusal_code"] = client ? r.code : MALL_ERR_NODAEMON;
                result["refusal"] = client ? r.error : error;
            }
        }
        ::unsetenv("MALL_JOB_ID");
        mall_t *m = nullptr;
        mall_error_t err{};
        result["open_rc"] = mall_open(socket.c_str(), &m, &err);
        result["open_error"] = err.text;
        mall_close(m);
        std::string text = result.dump();
        if (::write(out[1], text.data(), text.size()) != static_cast<ssize_t>(text.size())) ::_exit(11);
        ::_exit(0);
    }
    ::close(out[1]);
    std::string text;
    char buffer[4096];
    for (ssize_t n; (n = ::read(out[0], buffer, sizeof buffer)) != 0;) {
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) break;
        text.append(buffer, static_cast<size_t>(n));
    }
    ::close(out[0]);
    int status = 0;
    ::waitpid(child, &status, 0);
    Flood flood;
    json result = json::parse(text, nullptr, false);
    if (result.is_discarded()) {
        flood.refusal = "the child reported nothing (wait status " + std::to_string(status) + ")";
        return flood;
    }
    flood.answered = result.value("answered", 0);
    flood.refusal_code = result.value("refusal_code", 0);
    flood.refusal = result.value("refusal", "");
    flood.open_rc = result.value("open_rc", 0);
    flood.open_error = result.value("open_error", "");
    return flood;
}

class ConnectionLimit : public ::testing::Test {
protected:
    void SetUp() override { MALL_REQUIRE_ROOT_AND_CPUSET(); }
    std::unique_ptr<PrivateMalld> start_malld(std::vector<std::string> extra_args) {
        MalldOptions options;
        options.extra_args = std::move(extra_args);
        auto malld = std::make_unique<PrivateMalld>(options);
        std::string error;
        EXPECT_TRUE(malld->start(&error)) << error;
        return malld;
    }
};

TEST_F(ConnectionLimit, DefaultLetsOneUserHoldAHundredConnections) {
    auto malld = start_malld({});
    ASSERT_TRUE(malld->running());
    Flood flood = flood_as_nobody(malld->socket(), 100);
    EXPECT_EQ(flood.answered, 100) << "first refusal: " << flood.refusal << "\n" << malld->log();
    EXPECT_EQ(flood.refusal_code, 0) << flood.refusal;
    // The 101st connection is served too: nobody has no job, which is what malld says.
    EXPECT_EQ(flood.open_rc, MALL_ERR_NOJOB) << flood.open_error;
}

TEST_F(ConnectionLimit, OverTheLimitIsRefusedWithWordsNamingTheOption) {
    auto malld = start_malld({"--max-connections-per-user", "8"});
    ASSERT_TRUE(malld->running());
    Flood flood = flood_as_nobody(malld->socket(), 10);
    EXPECT_EQ(flood.answered, 8) << flood.refusal << "\n" << malld->log();
    EXPECT_EQ(flood.refusal_code, MALL_ERR_DENIED) << flood.refusal;
    EXPECT_NE(flood.refusal.find("malld refused the connection"), std::string::npos) << flood.refusal;
    EXPECT_NE(flood.refusal.find("holds 8 connections"), std::string::npos) << flood.refusal;
    EXPECT_NE(flood.refusal.find("--max-connections-per-user"), std::string::npos) << flood.refusal;
    EXPECT_EQ(flood.open_rc, MALL_ERR_DENIED) << flood.open_error;
    EXPECT_NE(flood.open_error.find("--max-connections-per-user"), std::string::npos) << flood.open_error;
    EXPECT_NE(malld->log().find("raise it with malld --max-connections-per-user"), std::string::npos)
        << malld->log();
    // Root (an admin) is not counted against anyone's limit.
    CommandResult status = run_command(mallctl_argv(malld->socket(), {"status"}));
    EXPECT_EQ(status.exit_code, 0) << status.err;
}

// A throwaway uid (no passwd entry) in a forked child that holds connections until released.
class HeldConnections {
public:
    // As uid (gid the same): opens connections (each answered a Status, or a Watch when
    // `watch`) until one is refused or `most` are open; keeps them until this object ends (the
    // child is killed: its siblings inherit any pipe that could tell it to go).
    HeldConnections(const std::string &socket, uid_t uid, int most, bool watch) {
        int report[2];
        if (::pipe2(report, O_CLOEXEC) != 0) return;
        child_ = ::fork();
        if (child_ == 0) {
            ::close(report[0]);
            if (::setgroups(0, nullptr) != 0 || ::setresgid(uid, uid, uid) != 0 || ::setresuid(uid, uid, uid) != 0)
                ::_exit(10);
            json result{{"open", 0}, {"refusal", ""}};
            std::vector<CtlClient> held;
            for (int i = 0; i < most; ++i) {
                std::string error;
                auto client = CtlClient::connect(socket, &error);
                CtlResult r = client ? client->request(watch ? proto::Type::Watch : proto::Type::Status,
                                                       json::object(), 10s)
                                     : CtlResult{};
                if (!client || !r.ok) {
                    result["refusal"] = client ? r.error : error;
                    break;
                }
                held.push_back(std::move(*client));
            }
            result["open"] = static_cast<int>(held.size());
            const std::string text = result.dump() + "\n";
            if (::write(report[1], text.data(), text.size()) != static_cast<ssize_t>(text.size())) ::_exit(11);
            for (;;) ::pause();
        }
        ::close(report[1]);
        if (child_ < 0) {
            ::close(report[0]);
            return;
        }
        std::string text;
        char buffer[4096];
        for (ssize_t n; (n = ::read(report[0], buffer, sizeof buffer)) != 0;) {
            if (n < 0 && errno == EINTR) continue;
            if (n < 0) break;
            text.append(buffer, static_cast<size_t>(n));
            if (text.find('\n') != std::string::npos) break;
        }
        ::close(report[0]);
        json result = json::parse(text, nullptr, false);
        if (result.is_discarded()) {
            refusal = "the child of uid " + std::to_string(uid) + " reported nothing";
            return;
        }
        open = result.value("open", 0);
        refusal = result.value("refusal", "");
    }
    ~HeldConnections() {
        if (child_ > 0) {
            ::kill(child_, SIGKILL);
            int status = 0;
            ::waitpid(child_, &status, 0);
        }
    }
    HeldConnections(const HeldConnections &) = delete;
    HeldConnections &operator=(const HeldConnections &) = delete;

    int open = 0;         // connections held
    std::string refusal;  // why the next one was refused ("" when none was)

private:
    pid_t child_ = -1;
};

// Regression (issue 37.2): the global cap (4096) was applied before the admin exemption, so 16
// ordinary uids at 256 connections each took every slot and root's `mallctl status` and the
// Slurm plugin's Register were refused. Ordinary users now share all but 256 of the slots.
TEST_F(ConnectionLimit, Issue37OrdinaryUsersCannotFillTheTableAndLockRootOut) {
    // malld (which inherits it) must have room for 4096 connections, and for what else it opens.
    rlimit files{};
    ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &files), 0);
    const rlim_t wanted = 8192;
    if (files.rlim_cur < wanted) {
        rlimit raised{wanted, std::max(files.rlim_max, wanted)};
        ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &raised), 0) << std::strerror(errno);
    }
    auto malld = start_malld({"--max-connections-per-user", "256"});
    ASSERT_TRUE(malld->running());
    std::vector<std::unique_ptr<HeldConnections>> users;
    int total = 0;
    for (uid_t uid = 61001; uid <= 61016; ++uid) {
        users.push_back(std::make_unique<HeldConnections>(malld->socket(), uid, 300, false));
        total += users.back()->open;
    }
    // Every user got connections up to its limit or to the ordinary users' share, no further.
    EXPECT_EQ(total, kMaxNonAdminConnections) << malld->log().substr(0, 4000);
    EXPECT_EQ(users.front()->open, 256) << users.front()->refusal;
    EXPECT_NE(users.front()->refusal.find("per-user limit"), std::string::npos) << users.front()->refusal;
    EXPECT_NE(users.back()->refusal.find("kept for root and admin uids"), std::string::npos)
        << users.back()->refusal;

    // Root still gets in: mallctl status, and a Register (as the Slurm plugin sends).
    CommandResult status = run_command(mallctl_argv(malld->socket(), {"status", "--json"}));
    EXPECT_EQ(status.exit_code, 0) << status.err;
    Child task({"/bin/sleep", "60"});
    std::string error;
    auto ctl = CtlClient::connect(malld->socket(), &error);
    ASSERT_TRUE(ctl) << error;
    CtlResult reg = ctl->request(proto::Type::Register,
                                 json{{"job", "rootjob"}, {"uid", 0}, {"pids", {task.pid()}}, {"min", 1}, {"max", 1}},
                                 20s);
    EXPECT_TRUE(reg.ok) << reg.error;
    users.clear();
    if (files.rlim_cur < wanted) ::setrlimit(RLIMIT_NOFILE, &files);
}

// Regression (issue 37.2): watchers are never closed as idle, and an ordinary user could hold any
// number of them; now kMaxWatchersPerUid, with words naming the limit. Root is not limited.
TEST_F(ConnectionLimit, Issue37WatchersAreLimitedPerUser) {
    auto malld = start_malld({});
    ASSERT_TRUE(malld->running());
    HeldConnections watchers(malld->socket(), 61017, kMaxWatchersPerUid + 2, true);
    EXPECT_EQ(watchers.open, kMaxWatchersPerUid) << watchers.refusal;
    EXPECT_NE(watchers.refusal.find("watch connections"), std::string::npos) << watchers.refusal;
    EXPECT_NE(watchers.refusal.find("(" + std::to_string(kMaxWatchersPerUid) + ")"), std::string::npos)
        << watchers.refusal;
    // Another user, and root, may still watch.
    HeldConnections other(malld->socket(), 61018, 1, true);
    EXPECT_EQ(other.open, 1) << other.refusal;
    std::vector<CtlClient> root_watchers;
    for (int i = 0; i < kMaxWatchersPerUid + 2; ++i) {
        std::string error;
        auto client = CtlClient::connect(malld->socket(), &error);
        ASSERT_TRUE(client) << error;
        CtlResult r = client->request(proto::Type::Watch, json::object(), 10s);
        ASSERT_TRUE(r.ok) << r.error;
        root_watchers.push_back(std::move(*client));
    }
}

// Processes in a user namespace that `maker` makes (root, or a throwaway uid), mapped by the test:
// its uid 0 is `first_outer` outside, its uids 1..members first_outer+1... Member k (uid k inside)
// opens connections one after the other, each answered a Status, until one is refused or `most`
// are open, reports, and holds them while this object lives; members run one after the other.
class NamespaceMembers {
public:
    NamespaceMembers(const std::string &socket, uid_t maker, uid_t first_outer, int members, int most) {
        int results[2], mapped[2], release[2];
        if (::pipe2(results, O_CLOEXEC) != 0 || ::pipe2(mapped, O_CLOEXEC) != 0 ||
            ::pipe2(release, O_CLOEXEC) != 0) {
            failure = "no pipes";
            return;
        }
        child_ = ::fork();
        if (child_ == 0) {
            ::close(results[0]);
            ::close(mapped[1]);
            ::close(release[1]);  // the test's: its close lets everyone here end
            if (::setgroups(0, nullptr) != 0 || ::setresgid(maker, maker, maker) != 0 ||
                ::setresuid(maker, maker, maker) != 0 || ::unshare(CLONE_NEWUSER) != 0)
                ::_exit(10);
            char byte;
            if (::write(results[1], "u", 1) != 1 || ::read(mapped[0], &byte, 1) != 1) ::_exit(11);
            for (uid_t uid = 1; uid <= static_cast<uid_t>(members); ++uid) {
                int done[2];
                if (::pipe2(done, O_CLOEXEC) != 0) ::_exit(12);
                pid_t member = ::fork();
                if (member == 0) {
                    if (::setresgid(uid, uid, uid) != 0 || ::setresuid(uid, uid, uid) != 0) ::_exit(13);
                    std::vector<UniqueFd> held;
                    Report report{};
                    for (int i = 0; i < most; ++i) {
                        UniqueFd c(unix_connect(socket, 5s));
                        proto::Message status;
                        status.type = proto::Type::Status;
                        status.request_id = 7;
                        std::string reply;
                        // A refused connection may be shut down before the send: its refusal
                        // waits to be read all the same.
                        const bool sent = c && send_packet(c.get(), proto::encode(status));
                        if (!c || wait_readable(c.get(), 10s) != 1 ||
                            recv_packet(c.get(), &reply, proto::kMaxPacket) <= 0) {
                            std::snprintf(report.refusal, sizeof report.refusal, "%s: %s",
                                          !c ? "no connection" : sent ? "no reply" : "send failed, no reply",
                                          std::strerror(errno));
                            break;
                        }
                        auto message = proto::decode(reply, nullptr);
                        if (!message || message->request_id != 7) {  // the refusal has its own id
                            const std::string why = message ? message->body.value("error", "") : "undecodable";
                            std::snprintf(report.refusal, sizeof report.refusal, "%s", why.c_str());
                            break;
                        }
                        ++report.answered;
                        held.push_back(std::move(c));
                    }
                    if (::write(results[1], &report, sizeof report) != sizeof report) ::_exit(14);
                    (void)!::write(done[1], "x", 1);
                    (void)!::read(release[0], &byte, 1);  // holds its connections until the test ends
                    ::_exit(0);
                }
                ::close(done[1]);
                if (member < 0 || ::read(done[0], &byte, 1) != 1) ::_exit(15);
                ::close(done[0]);
            }
            (void)!::read(release[0], &byte, 1);
            ::_exit(0);
        }
        ::close(results[1]);
        ::close(mapped[0]);
        ::close(release[0]);
        release_ = release[1];
        char byte;
        if (child_ < 0 || ::read(results[0], &byte, 1) != 1) {
            failure = "the child could not make a user namespace";
        } else {
            const std::string ids = "0 " + std::to_string(first_outer) + " 1\n1 " +
                                    std::to_string(first_outer + 1) + " " + std::to_string(members) + "\n";
            for (const char *map : {"uid_map", "gid_map"}) {
                std::ofstream out("/proc/" + std::to_string(child_) + "/" + map);
                out << ids;
                out.close();
                if (!out) failure = std::string("cannot write ") + map;
            }
        }
        if (failure.empty() && ::write(mapped[1], "m", 1) == 1) {
            for (int i = 0; i < members; ++i) {
                Report report{};
                if (::read(results[0], &report, sizeof report) != static_cast<ssize_t>(sizeof report)) {
                    failure = "member " + std::to_string(i + 1) + " of the namespace failed";
                    break;
                }
                answered.push_back(report.answered);
                refusals.emplace_back(report.refusal);
            }
        }
        ::close(mapped[1]);
        ::close(results[0]);
    }
    ~NamespaceMembers() {
        if (release_ >= 0) ::close(release_);  // the members let go of their connections and exit
        if (child_ > 0) ::waitpid(child_, nullptr, 0);
    }
    NamespaceMembers(const NamespaceMembers &) = delete;
    NamespaceMembers &operator=(const NamespaceMembers &) = delete;

    int total() const {
        int sum = 0;
        for (int n : answered) sum += n;
        return sum;
    }

    std::vector<int> answered;          // connections each member holds
    std::vector<std::string> refusals;  // why each member's next one was refused ("" when none was)
    std::string failure;                // why the namespace could not be set up ("" when it was)

private:
    struct Report {
        int answered;
        char refusal[512];
    };
    pid_t child_ = -1;
    int release_ = -1;
};

// Regression (issue 37.2, review): per-user limits were counted per uid, so one person whose user
// namespace maps a subuid range (a rootless container) held the per-user limit once per uid, and
// 18 such uids filled every slot of ordinary users. Now a peer in another user namespace counts
// under the namespace's owner: 4 uids of one namespace (owned by uid 61060) share its 8.
TEST_F(ConnectionLimit, Issue37TheUidsOfAUserNamespaceShareItsOwnersLimit) {
    auto malld = start_malld({"--max-connections-per-user", "8"});
    ASSERT_TRUE(malld->running());
    constexpr int kUids = 4;
    NamespaceMembers members(malld->socket(), 61060, 300000, kUids, 8);
    ASSERT_EQ(members.failure, "");
    EXPECT_EQ(members.total(), 8) << kUids << " uids of one user namespace held " << members.total()
                                  << " connections; the namespace's owner may hold 8";
    EXPECT_NE(malld->log().find("uid 61060 (owner of uid 30000"), std::string::npos) << malld->log();
    // Another user still gets in.
    Flood other = flood_as_nobody(malld->socket(), 4);
    EXPECT_EQ(other.answered, 4) << other.refusal;
}

// Root's connections, each an admin's, open before the namespace test below.
std::vector<CtlClient> root_connections(const std::string &socket, int count) {
    std::vector<CtlClient> held;
    for (int i = 0; i < count; ++i) {
        std::string error;
        auto client = CtlClient::connect(socket, &error);
        if (!client) break;
        CtlResult r = client->request(proto::Type::Status, json::object(), 10s);
        if (!r.ok) break;
        held.push_back(std::move(*client));
    }
    return held;
}

// Regression (issue 37.2, review): a user namespace root made (rootful podman --userns=auto, a
// Kubernetes pod with user namespaces) counted under uid 0, the same per-user bucket root's own
// connections filled: with root holding 6 connections and a limit of 4, every process of such a
// container was refused. Admins are now counted for nobody, and a root-made namespace is a user
// of its own.
TEST_F(ConnectionLimit, Issue37RootHoldingManyConnectionsDoesNotLockOutARootMadeUserNamespace) {
    auto malld = start_malld({"--max-connections-per-user", "4"});
    ASSERT_TRUE(malld->running());
    std::vector<CtlClient> roots = root_connections(malld->socket(), 6);
    ASSERT_EQ(roots.size(), 6u) << malld->log();
    NamespaceMembers container(malld->socket(), 0, 400000, 1, 5);
    ASSERT_EQ(container.failure, "");
    ASSERT_EQ(container.answered.size(), 1u);
    EXPECT_EQ(container.answered[0], 4) << container.refusals[0] << "\n" << malld->log();
    // Its fifth is refused, under the namespace, not under root.
    EXPECT_NE(container.refusals[0].find("(made by root)"), std::string::npos) << container.refusals[0];
    EXPECT_NE(container.refusals[0].find("holds 4 connections"), std::string::npos) << container.refusals[0];
    EXPECT_EQ(container.refusals[0].find("uid 0 "), std::string::npos) << container.refusals[0];
    // Root still gets in.
    CommandResult status = run_command(mallctl_argv(malld->socket(), {"status"}));
    EXPECT_EQ(status.exit_code, 0) << status.err;
}

// Regression (issue 37.2, review): every user namespace root made counted under uid 0, so two
// containers of different tenants shared one limit (and one closer debt): the first took all 4
// and the second got none. Each namespace now has a budget of its own.
TEST_F(ConnectionLimit, Issue37TwoRootMadeUserNamespacesHaveSeparateBudgets) {
    auto malld = start_malld({"--max-connections-per-user", "4"});
    ASSERT_TRUE(malld->running());
    NamespaceMembers first(malld->socket(), 0, 410000, 2, 3);
    ASSERT_EQ(first.failure, "");
    NamespaceMembers second(malld->socket(), 0, 420000, 2, 3);
    ASSERT_EQ(second.failure, "");
    ASSERT_EQ(first.answered.size(), 2u);
    ASSERT_EQ(second.answered.size(), 2u);
    // Two uids in each, 3 tries each: each namespace holds its 4, no more.
    EXPECT_EQ(first.total(), 4) << first.refusals[1] << "\n" << malld->log();
    EXPECT_EQ(second.total(), 4) << second.refusals[1] << "\n" << malld->log();
    EXPECT_NE(second.refusals[1].find("user namespace "), std::string::npos) << second.refusals[1];
    EXPECT_NE(second.refusals[1].find("(made by root)"), std::string::npos) << second.refusals[1];
}

TEST_F(ConnectionLimit, ABadLimitIsAUsageError) {
    for (const char *bad : {"0", "-3", "100000", "many"}) {
        CommandResult r = run_command({std::string(MALL_BIN_DIR) + "/malld", "--max-connections-per-user", bad,
                                       "--socket", "/nonexistent/never/used.sock"});
        EXPECT_EQ(r.exit_code, 2) << bad << ": " << r.err;
        EXPECT_NE(r.err.find("max-connections-per-user"), std::string::npos) << bad << ": " << r.err;
    }
}

}  // namespace
}  // namespace mall::test
