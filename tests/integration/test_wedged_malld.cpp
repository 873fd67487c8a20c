// SPDX-License-Identifier: BSD-3-Clause
// Proves that a wedged malld (SIGSTOPped, its listen backlog full) cannot hang its clients: mallctl
// fails with exit 3 and says what is wrong, mallrun runs the command without malleability (with
// --require: runs nothing and exits 3), mall_open() returns
// MALL_ERR_NODAEMON within its attach bound, and once malld continues everything works again.
// Issue 12's second defect: every client connected with an unbounded blocking connect().
#include <signal.h>

#include <gtest/gtest.h>

#include "common/unix_socket.hpp"
#include "mall/mall.h"
#include "support/malld_fixture.hpp"

MALL_TEST_WATCHDOG(180);

namespace mall::test {
namespace {

class WedgedMalld : public ::testing::Test {
protected:
    void SetUp() override {
        MALL_REQUIRE_ROOT_AND_CPUSET();
        malld_ = std::make_unique<PrivateMalld>();
        std::string error;
        ASSERT_TRUE(malld_->start(&error)) << error;
        ASSERT_EQ(::kill(malld_->pid(), SIGSTOP), 0);
        stopped_ = true;
        // Connections nobody accepts until the kernel takes no more: the backlog is full.
        for (int i = 0; i < 4096; ++i) {
            UniqueFd fd(unix_connect(malld_->socket(), std::chrono::milliseconds(0)));
            if (!fd) {
                ASSERT_EQ(errno, EAGAIN) << std::strerror(errno);
                break;
            }
            backlog_.push_back(std::move(fd));
        }
        ASSERT_GT(backlog_.size(), 0u);
        ASSERT_LT(backlog_.size(), 4096u) << "the backlog never filled";
    }
    void TearDown() override {
        resume();
        backlog_.clear();
        malld_.reset();
    }
    void resume() {
        if (stopped_ && malld_) ::kill(malld_->pid(), SIGCONT);
        stopped_ = false;
    }
    std::unique_ptr<PrivateMalld> malld_;
    std::vector<UniqueFd> backlog_;
    bool stopped_ = false;
};

TEST_F(WedgedMalld, MallctlFailsWithExit3AndSaysWhy) {
    RunOptions options;
    options.timeout = 60s;  // far above the connect bound: a hang shows as timed_out
    CommandResult r = run_command(mallctl_argv(malld_->socket(), {"status"}), options);
    EXPECT_FALSE(r.timed_out) << "mallctl status hung on a stopped malld";
    EXPECT_EQ(r.exit_code, 3) << r.err;
    EXPECT_NE(r.err.find("did not take the connection in time"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("stopped, stuck or overloaded"), std::string::npos) << r.err;
}

TEST_F(WedgedMalld, MallrunRunsTheCommandNonMalleableOrWithRequireExits3) {
    RunOptions options;
    options.timeout = 60s;  // far above the connect bound: a hang shows as timed_out
    const std::string marker = malld_->dir() + "/ran";
    const std::vector<std::string> command = {"/bin/sh", "-c", "touch " + marker};
    CommandResult r = run_command(mallrun_argv(malld_->socket(), "1:2", "wedged", command), options);
    EXPECT_FALSE(r.timed_out) << "mallrun hung on a stopped malld";
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("did not take the connection in time"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("without malleability"), std::string::npos) << r.err;
    EXPECT_EQ(::access(marker.c_str(), F_OK), 0) << "mallrun did not run the command";

    ::unlink(marker.c_str());
    r = run_command(mallrun_argv(malld_->socket(), "1:2", "wedged", command, {"--require"}), options);
    EXPECT_FALSE(r.timed_out) << "mallrun --require hung on a stopped malld";
    EXPECT_EQ(r.exit_code, 3) << r.err;
    EXPECT_NE(r.err.find("did not take the connection in time"), std::string::npos) << r.err;
    EXPECT_NE(::access(marker.c_str(), F_OK), 0) << "mallrun --require ran the command although it could not register";
}

TEST_F(WedgedMalld, MallOpenReturnsAndMalldServesAgainAfterSigcont) {
    mall_t *m = nullptr;
    mall_error_t err{};
    int rc = mall_open(malld_->socket().c_str(), &m, &err);
    EXPECT_EQ(rc, MALL_ERR_NODAEMON) << err.text;
    EXPECT_EQ(mall_attached(m), MALL_ERR_DETACHED);
    // malld continues and the backlog drains: it serves again.
    backlog_.clear();
    resume();
    auto status = status_json(malld_->socket());
    EXPECT_TRUE(status.has_value()) << "malld does not serve after SIGCONT:\n" << malld_->log();
    mall_close(m);
}

}  // namespace
}  // namespace mall::test
