// Proves SlurmChecker turns job ids into verdicts off the caller's thread (a blocked query never
// blocks the caller), merges duplicate requests, and signals its fd; and slurm_job_id_of's parsing.
#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>

#include <gtest/gtest.h>

#include "daemon/slurm_jobs.hpp"
#include "support/watchdog.h"

namespace {

using namespace std::chrono_literals;
using mall::SlurmJobState;

MALL_TEST_WATCHDOG(60);

// Answers from a table; can be held (blocked) to prove the caller never waits for a query.
class FakeQuery : public mall::SlurmQuery {
public:
    SlurmJobState query(uint32_t id) override {
        std::unique_lock<std::mutex> lock(mu);
        ++calls;
        released.wait(lock, [this] { return !held; });
        SlurmJobState s;
        s.kind = id % 2 ? SlurmJobState::Kind::Running : SlurmJobState::Kind::NotRunning;
        s.uid = 1000 + id;
        s.detail = id % 2 ? "RUNNING" : "COMPLETED";
        return s;
    }
    std::mutex mu;
    std::condition_variable released;
    bool held = false;
    int calls = 0;
};

bool readable(int fd, std::chrono::milliseconds timeout) {
    pollfd p{fd, POLLIN, 0};
    return ::poll(&p, 1, static_cast<int>(timeout.count())) == 1;
}

TEST(SlurmJobId, ParsesOnlySlurmNames) {
    EXPECT_EQ(mall::slurm_job_id_of("slurm-123"), 123u);
    EXPECT_EQ(mall::slurm_job_id_of("slurm-4294967295"), 4294967295u);
    for (const char *bad : {"slurm-", "slurm-0", "slurm-12x", "slurm--1", "slurm-4294967296", "job-1",
                            "Slurm-1", "slurm-1.0", ""})
        EXPECT_FALSE(mall::slurm_job_id_of(bad).has_value()) << bad;
}

TEST(SlurmChecker, VerdictsArriveThroughTheFd) {
    auto fake = std::make_unique<FakeQuery>();
    mall::SlurmChecker checker(std::move(fake));
    checker.check({7, 8});
    std::vector<SlurmJobState> got;
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (got.size() < 2 && std::chrono::steady_clock::now() < deadline) {
        if (readable(checker.fd(), 1000ms))
            for (auto &s : checker.take_results()) got.push_back(s);
    }
    ASSERT_EQ(got.size(), 2u);
    std::set<uint32_t> ids;
    for (const auto &s : got) {
        ids.insert(s.job_id);
        EXPECT_EQ(s.kind, s.job_id == 7 ? SlurmJobState::Kind::Running : SlurmJobState::Kind::NotRunning);
        EXPECT_EQ(s.uid, 1000 + s.job_id);
    }
    EXPECT_EQ(ids, (std::set<uint32_t>{7, 8}));
    EXPECT_FALSE(readable(checker.fd(), 50ms));  // drained
}

TEST(SlurmChecker, ABlockedQueryNeverBlocksTheCallerAndDuplicatesMerge) {
    auto owned = std::make_unique<FakeQuery>();
    FakeQuery *fake = owned.get();
    fake->held = true;
    mall::SlurmChecker checker(std::move(owned));
    const auto start = std::chrono::steady_clock::now();
    checker.check({1});
    for (int i = 0; i < 100; ++i) checker.check({2, 3});  // while 1 is stuck: 2 and 3 queue once
    EXPECT_TRUE(checker.take_results().empty());
    EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);  // watchdog-style bound, not a speed claim
    {
        std::lock_guard<std::mutex> lock(fake->mu);
        fake->held = false;
    }
    fake->released.notify_all();
    std::vector<SlurmJobState> got;
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (got.size() < 3 && std::chrono::steady_clock::now() < deadline) {
        if (readable(checker.fd(), 1000ms))
            for (auto &s : checker.take_results()) got.push_back(s);
    }
    EXPECT_EQ(got.size(), 3u);
    std::lock_guard<std::mutex> lock(fake->mu);
    EXPECT_EQ(fake->calls, 3);
}

}  // namespace
