// SPDX-License-Identifier: BSD-3-Clause
// Proves malld's refusal log budget (issue 37.9, review): a refusal the all-users budget leaves out
// costs its uid nothing (the uid's token was spent before, so that uid's later refusals went
// unlogged while the budget of all users had room again), every refusal left out is counted in a
// "suppressed" line, and LogBudget's has_token() spends nothing.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "daemon/access.hpp"
#include "daemon/connections.hpp"
#include "daemon/log.hpp"
#include "support/malld_fixture.hpp"

MALL_TEST_WATCHDOG(60);

namespace mall::test {
namespace {

// Runs f with malld's log (stderr) going to a temporary file; returns what was logged.
template <typename F>
std::string logged_by(F f) {
    char path[] = "/tmp/mall_refusal_log_XXXXXX";
    const int file = ::mkstemp(path);
    const int saved = ::dup(STDERR_FILENO);
    ::dup2(file, STDERR_FILENO);
    f();
    ::dup2(saved, STDERR_FILENO);
    ::close(saved);
    ::close(file);
    std::string text = read_file(path);
    ::unlink(path);
    return text;
}

int count_of(const std::string &text, const std::string &part) {
    int n = 0;
    for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
    return n;
}

TEST(LogBudget, HasTokenSpendsNothingAndHoldIsToldWithTheNextLine) {
    LogBudget budget(2, std::chrono::seconds(100));
    const auto now = std::chrono::steady_clock::now();
    for (int i = 0; i < 5; ++i) EXPECT_TRUE(budget.has_token(7, now));
    uint64_t held = 99;
    EXPECT_TRUE(budget.allow(7, now, &held));
    EXPECT_EQ(held, 0u);
    budget.hold(7, now);
    budget.hold(7, now);
    EXPECT_TRUE(budget.allow(7, now, &held));
    EXPECT_EQ(held, 2u);
    EXPECT_FALSE(budget.has_token(7, now));
    EXPECT_FALSE(budget.allow(7, now, &held));
}

// The budgets are malld's process-wide statics: each test below runs its story in a child process
// (a death test's fork), so it starts from full budgets and leaves the parent's as they were.
// Exit 0 when the story holds; its stderr says what was logged.
template <typename F>
[[noreturn]] void run_story(F story) {
    std::exit(story() ? 0 : 1);
}

// A rootless container's subuids are one user (Connection::owner, issue 37.9 review): ten of them
// refusing ten times each log at most that user's 10 lines, not 10 each (which would also spend
// the all-users budget and hide every other user's refusals).
TEST(RefusalLog, TheUidsOfAUserNamespaceShareOneBudget) {
    EXPECT_EXIT(run_story([] {
                    Connection c;
                    c.owner = LimitsOwner::user_namespace(4026599999u, 61060);
                    std::string text = logged_by([&] {
                        for (uid_t uid = 100000; uid < 100010; ++uid) {
                            c.peer.uid = uid;
                            for (int i = 0; i < 10; ++i)
                                if (may_log_refusal(c)) log_warn("refused Attach from uid " + std::to_string(uid));
                        }
                    });
                    const int logged = count_of(text, "refused Attach from uid ");
                    std::fprintf(stderr, "logged %d lines:\n%s", logged, text.c_str());
                    return logged <= 10 && logged >= 8;
                }),
                ::testing::ExitedWithCode(0), "");
}

// Admins have a budget of their own: after ordinary users spend the all-users budget, an admin's
// refusals (a mistyped `mallctl set` as root) are still logged.
TEST(RefusalLog, UsersCannotSpendTheAdminsBudget) {
    EXPECT_EXIT(run_story([] {
                    Connection c;
                    std::string text = logged_by([&] {
                        for (uid_t uid = 1; uid <= 8; ++uid) {
                            c.peer.uid = uid;
                            c.owner = LimitsOwner::user(uid);
                            for (int i = 0; i < 10; ++i)
                                if (may_log_refusal(c)) log_warn("refused Set from uid " + std::to_string(uid));
                        }
                        c.peer.uid = 0;
                        c.owner = LimitsOwner::user(0);
                        c.admin = true;
                        for (int i = 0; i < 5; ++i)
                            if (may_log_refusal(c)) log_warn("refused Set from admin uid 0");
                    });
                    const int admin_lines = count_of(text, "refused Set from admin uid 0");
                    std::fprintf(stderr, "admin lines %d:\n%s", admin_lines, text.c_str());
                    return admin_lines == 5;
                }),
                ::testing::ExitedWithCode(0), "");
}

// 5 uids x 10 refusals spend the 50 lines all users may log per 10 s; uid 6's 10 refusals then go
// unlogged, counted for all users. Two seconds later the all-users budget has about 10 lines
// again, and uid 6 still has its 10: its next refusals are logged (before, its tokens were gone:
// about 2 of 10 were), with the count of those left out.
TEST(RefusalLog, ARefusalTheAllUsersBudgetLeavesOutCostsItsUidNothing) {
    Connection c;
    std::string first = logged_by([&] {
        for (uid_t uid = 1; uid <= 6; ++uid) {
            c.peer.uid = uid;
            c.owner = LimitsOwner::user(uid);
            for (int i = 0; i < 10; ++i)
                if (may_log_refusal(c)) log_warn("refused Register from uid " + std::to_string(uid));
        }
    });
    EXPECT_EQ(count_of(first, "refused Register from uid "), 50) << first;
    EXPECT_EQ(count_of(first, "refused Register from uid 6"), 0) << first;
    std::this_thread::sleep_for(std::chrono::milliseconds(2100));
    c.peer.uid = 6;
    c.owner = LimitsOwner::user(6);
    std::string later = logged_by([&] {
        for (int i = 0; i < 10; ++i)
            if (may_log_refusal(c)) log_warn("refused Register from uid 6");
    });
    EXPECT_GE(count_of(later, "refused Register from uid 6"), 8) << later;
    EXPECT_NE(later.find("suppressed 10 refusal(s) of all users"), std::string::npos) << later;
}

}  // namespace
}  // namespace mall::test
