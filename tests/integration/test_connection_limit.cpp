// SPDX-License-Identifier: BSD-3-Clause
// Proves malld's per-user connection limit fits large nodes and explains itself: by default one
// ordinary user may hold more than 64 connections (one per rank of a many-rank job; the old fixed
// limit was 64 and rank 65 retried forever), a user over the limit set with
// --max-connections-per-user gets an error naming the limit and the option (tools and libmall
// alike), root is never locked out, and a bad limit is a usage error that starts nothing.
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "common/ctl_client.hpp"
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
