// SPDX-License-Identifier: BSD-3-Clause
// Proves SlurmChecker turns job ids into verdicts off the caller's thread (a blocked query never
// blocks the caller), merges duplicate requests, and signals its fd; and slurm_job_id_of's parsing.
#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "daemon/slurm_jobs.hpp"
#include "daemon/slurm_reconcile.hpp"
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
        order.push_back("query " + std::to_string(id));
        SlurmJobState s;
        s.kind = id % 2 ? SlurmJobState::Kind::Running : SlurmJobState::Kind::NotRunning;
        s.uid = 1000 + id;
        s.detail = id % 2 ? "RUNNING" : "COMPLETED";
        return s;
    }
    Annotated annotate(uint32_t id, const std::string &figures) override {
        std::unique_lock<std::mutex> lock(mu);
        ++annotate_calls;
        released.wait(lock, [this] { return !held; });
        annotated.push_back(std::to_string(id) + " " + figures);
        order.push_back("annotate " + std::to_string(id) + " " + figures);
        if (id == 13) return {"Job has already finished", true};
        return {};
    }
    // held: every query and update waits in the fake until set_held(false).
    void set_held(bool on) {
        {
            std::lock_guard<std::mutex> lock(mu);
            held = on;
        }
        released.notify_all();
    }
    // Waits (5 s at most) until `count` calls counted by `begun` (calls, annotate_calls) began.
    bool wait_begun(int FakeQuery::*begun, int count) {
        for (int i = 0; i < 1000; ++i) {
            {
                std::lock_guard<std::mutex> lock(mu);
                if (this->*begun >= count) return true;
            }
            std::this_thread::sleep_for(5ms);
        }
        return false;
    }
    std::vector<std::string> annotated;
    std::vector<std::string> order;  // queries and updates, as the thread ran them
    std::mutex mu;
    std::condition_variable released;
    bool held = false;
    int calls = 0;           // queries begun
    int annotate_calls = 0;  // updates begun
};

bool readable(int fd, std::chrono::milliseconds timeout) {
    pollfd p{fd, POLLIN, 0};
    return ::poll(&p, 1, static_cast<int>(timeout.count())) == 1;
}

// The checker's finished updates, taken as its fd says they come, until `updates` of them and
// `verdicts` query results (into *results) came, or 10 s passed.
std::vector<mall::SlurmAnnotation> take_updates(mall::SlurmChecker &checker, size_t updates, size_t verdicts = 0,
                                                std::vector<SlurmJobState> *results = nullptr) {
    std::vector<mall::SlurmAnnotation> done;
    std::vector<SlurmJobState> got;
    for (int i = 0; i < 100 && (done.size() < updates || got.size() < verdicts); ++i) {
        if (!readable(checker.fd(), 100ms)) continue;
        for (auto &a : checker.take_annotations()) done.push_back(a);
        for (auto &r : checker.take_results()) got.push_back(r);
    }
    if (results != nullptr) *results = std::move(got);
    return done;
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
    fake->set_held(true);
    mall::SlurmChecker checker(std::move(owned));
    const auto start = std::chrono::steady_clock::now();
    checker.check({1});
    for (int i = 0; i < 100; ++i) checker.check({2, 3});  // while 1 is stuck: 2 and 3 queue once
    EXPECT_TRUE(checker.take_results().empty());
    EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);  // watchdog-style bound, not a speed claim
    fake->set_held(false);
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

// AdminComment segments: this node's replaces its older one, other text stays.
TEST(SlurmAdminComment, MergesThisNodesSegmentAndKeepsTheRest) {
    EXPECT_EQ(mall::merge_admin_comment("", "node1", "lent_core_s=1.0"), "mall:node1:lent_core_s=1.0");
    EXPECT_EQ(mall::merge_admin_comment("audited by bob", "node1", "x=1"), "audited by bob;mall:node1:x=1");
    EXPECT_EQ(mall::merge_admin_comment("mall:node1:x=1;mall:node2:x=2", "node1", "x=3"),
              "mall:node2:x=2;mall:node1:x=3");
    EXPECT_EQ(mall::merge_admin_comment("a;;mall:node10:x=1", "node1", "x=3"), "a;mall:node10:x=1;mall:node1:x=3")
        << "node10 is not node1";
    const nlohmann::json end = {{"event", "end"}, {"lent_core_seconds", 12.345}, {"core_seconds", 40.0},
                                {"resizes", 3}, {"ack_timeouts", 1}, {"oversubscribed_seconds", 0.25}};
    EXPECT_EQ(mall::admin_comment_figures(end), "lent_core_s=12.3,core_s=40.0,resizes=3,ack_timeouts=1,oversub_s=0.2");
}

// Updates run on the checker's thread before queries; annotating() holds until each is done and
// failures come back with Slurm's words.
TEST(SlurmChecker, AnnotatesOnItsThreadAndSaysWhenDone) {
    auto query = std::make_unique<FakeQuery>();
    FakeQuery *fake = query.get();
    fake->set_held(true);
    mall::SlurmChecker checker(std::move(query));
    checker.check({5});
    checker.annotate(12, "lent_core_s=1.0");
    checker.annotate(13, "lent_core_s=2.0");
    EXPECT_TRUE(checker.annotating(12));
    EXPECT_TRUE(checker.annotating(13));
    EXPECT_FALSE(checker.annotating(5));
    fake->set_held(false);
    std::vector<mall::SlurmJobState> results;
    const auto done = take_updates(checker, 2, 1, &results);
    ASSERT_EQ(done.size(), 2u);
    EXPECT_EQ(done[0].job_id, 12u);
    EXPECT_EQ(done[0].error, "");
    EXPECT_EQ(done[1].job_id, 13u);
    EXPECT_NE(done[1].error.find("finished"), std::string::npos);
    EXPECT_TRUE(done[1].finished);
    EXPECT_FALSE(done[0].finished);
    EXPECT_FALSE(checker.annotating(12));
    EXPECT_FALSE(checker.annotating(13));
    std::lock_guard<std::mutex> lock(fake->mu);
    ASSERT_EQ(fake->annotated.size(), 2u);
    EXPECT_EQ(fake->annotated[0], "12 lent_core_s=1.0");
}

// A running job's figures so far wait behind queries and ended jobs' figures; a job's last figures
// replace its running ones still queued (sent after, they would overwrite the last ones); a newer
// running update replaces the figures of one still queued; only an ended job's update counts as
// annotating() (a Deregister waits for that one alone).
TEST(SlurmChecker, RunningFiguresNeverOverwriteTheLastOnesAndWaitBehindQueries) {
    auto query = std::make_unique<FakeQuery>();
    FakeQuery *fake = query.get();
    fake->set_held(true);
    mall::SlurmChecker checker(std::move(query));
    checker.check({5});  // the thread takes it and waits in the held query
    ASSERT_TRUE(fake->wait_begun(&FakeQuery::calls, 1)) << "the checker's thread never took the query";
    checker.annotate(20, "so far", true);
    checker.annotate(21, "so far", true);
    checker.check({7});
    checker.annotate(20, "last");
    checker.annotate(21, "newer", true);  // replaces the figures of the one queued for 21
    EXPECT_TRUE(checker.annotating(20));
    EXPECT_FALSE(checker.annotating(21)) << "a running update must not hold a Deregister";
    fake->set_held(false);
    const auto done = take_updates(checker, 2);
    ASSERT_EQ(done.size(), 2u);
    EXPECT_EQ(done[0].job_id, 20u);
    EXPECT_FALSE(done[0].running);
    EXPECT_EQ(done[1].job_id, 21u);
    EXPECT_TRUE(done[1].running);
    EXPECT_FALSE(checker.annotating(20));
    EXPECT_FALSE(checker.annotating(21));
    std::lock_guard<std::mutex> lock(fake->mu);
    EXPECT_EQ(fake->order, (std::vector<std::string>{"query 5", "annotate 20 last", "query 7", "annotate 21 newer"}));
}

// The fd stays readable while either kind waits: taking updates must not swallow the wake-up of a
// verdict that came meanwhile (malld takes both on one wake-up, updates first; a verdict that came
// between the two takes waited for the next event, and this file's own helper lost updates so).
TEST(SlurmChecker, TakingOneKindLeavesTheFdReadableForTheOther) {
    auto query = std::make_unique<FakeQuery>();
    mall::SlurmChecker checker(std::move(query));
    checker.check({5});
    ASSERT_TRUE(readable(checker.fd(), 5000ms)) << "no verdict for job 5";
    EXPECT_TRUE(checker.take_annotations().empty());
    EXPECT_TRUE(readable(checker.fd(), 0ms)) << "taking (no) updates drained the verdict's wake-up";
    EXPECT_EQ(checker.take_results().size(), 1u);
    EXPECT_FALSE(readable(checker.fd(), 0ms)) << "nothing waits: the fd must not stay readable";

    checker.annotate(31, "last");
    ASSERT_TRUE(readable(checker.fd(), 5000ms)) << "no finished update for job 31";
    EXPECT_TRUE(checker.take_results().empty());
    EXPECT_TRUE(readable(checker.fd(), 0ms)) << "taking (no) verdicts drained the update's wake-up";
    EXPECT_EQ(checker.take_annotations().size(), 1u);
}

// A job ends while its running update is in flight: the end's update goes after it (one thread),
// and annotating() holds until that last one is done.
TEST(SlurmChecker, AnEndDuringARunningUpdateIsRecordedAfterIt) {
    auto query = std::make_unique<FakeQuery>();
    FakeQuery *fake = query.get();
    fake->set_held(true);
    mall::SlurmChecker checker(std::move(query));
    checker.annotate(30, "so far", true);  // the thread takes it and waits in the held update
    ASSERT_TRUE(fake->wait_begun(&FakeQuery::annotate_calls, 1)) << "the checker's thread never took the update";
    EXPECT_FALSE(checker.annotating(30)) << "a running update must not hold a Deregister";
    checker.annotate(30, "last");
    checker.annotate(30, "later", true);  // the end is being recorded: dropped
    EXPECT_TRUE(checker.annotating(30));
    fake->set_held(false);
    const auto done = take_updates(checker, 2);
    ASSERT_EQ(done.size(), 2u);
    EXPECT_TRUE(done[0].running);
    EXPECT_FALSE(done[1].running);
    EXPECT_FALSE(checker.annotating(30));
    std::lock_guard<std::mutex> lock(fake->mu);
    EXPECT_EQ(fake->annotated, (std::vector<std::string>{"30 so far", "30 last"}));
}

// Two nodes of one job record their figures at the same moment: each read-merge-write that another
// node's write undid is tried again, so both segments end up in the field.
TEST(SlurmAdminComment, ANodeWhoseSegmentWasOverwrittenTriesAgain) {
    std::string field = "set by the site";
    int writes = 0;
    auto load = [&](mall::LoadedComment *comment) {
        comment->text = field;
        comment->nodes = 2;
        return true;
    };
    // node2 read the field before node1's first write and writes right after it: node1's segment
    // is lost once.
    auto store = [&](const std::string &comment) {
        field = comment;
        if (++writes == 1) field = mall::merge_admin_comment("set by the site", "node2", "x=2");
        return true;
    };
    EXPECT_EQ(mall::update_admin_comment(load, store, "node1", "x=1"), mall::CommentUpdate::Kept);
    EXPECT_EQ(writes, 2);
    EXPECT_EQ(field, "set by the site;mall:node2:x=2;mall:node1:x=1");
    // A writer that always wins: given up after the attempts, never a loop.
    int tries = 0;
    auto always_lost = [&](const std::string &) {
        ++tries;
        field = "someone else";
        return true;
    };
    EXPECT_EQ(mall::update_admin_comment(load, always_lost, "node1", "x=1", 3), mall::CommentUpdate::Lost);
    EXPECT_EQ(tries, 3);
    auto refused = [](const std::string &) { return false; };
    EXPECT_EQ(mall::update_admin_comment(load, refused, "node1", "x=1"), mall::CommentUpdate::Failed);
}

// Issue 39: a job on one node has no other mall writer: its figures cost one read and one write
// (no read-back), and the site's text is kept.
TEST(SlurmAdminComment, ASingleNodeJobIsReadOnceAndWrittenOnce) {
    std::string field = "set by the site";
    int loads = 0, stores = 0;
    auto load = [&](mall::LoadedComment *comment) {
        ++loads;
        comment->text = field;
        comment->nodes = 1;
        return true;
    };
    auto store = [&](const std::string &comment) {
        ++stores;
        field = comment;
        return true;
    };
    EXPECT_EQ(mall::update_admin_comment(load, store, "node1", "x=1"), mall::CommentUpdate::Kept);
    EXPECT_EQ(loads, 1);
    EXPECT_EQ(stores, 1);
    EXPECT_EQ(field, "set by the site;mall:node1:x=1");
}

// Issue 39: the nodes of a multi-node job take turns at its end. An ended job's update given a
// delay waits for it without holding up the thread: a later update without one, and a query,
// go first; annotating() counts the waiting one (its Deregister waits for it).
TEST(SlurmChecker, ADelayedEndUpdateWaitsItsTurnWhileOtherWorkGoesOn) {
    auto query = std::make_unique<FakeQuery>();
    FakeQuery *fake = query.get();
    mall::SlurmChecker checker(std::move(query));
    const auto queued = std::chrono::steady_clock::now();
    checker.annotate(21, "later", false, false, 400ms);
    checker.annotate(22, "now");
    checker.check({5});
    EXPECT_TRUE(checker.annotating(21));
    std::vector<mall::SlurmJobState> results;
    const auto done = take_updates(checker, 2, 1, &results);
    ASSERT_EQ(done.size(), 2u);
    EXPECT_EQ(done[0].job_id, 22u);
    EXPECT_EQ(done[1].job_id, 21u);
    EXPECT_GE(std::chrono::steady_clock::now() - queued, 400ms);
    EXPECT_FALSE(checker.annotating(21));
    std::lock_guard<std::mutex> lock(fake->mu);
    EXPECT_EQ(fake->order, (std::vector<std::string>{"annotate 22 now", "query 5", "annotate 21 later"}));
}

// The turn: 25 ms a node, the whole job within 1.5 s (its task-exits wait 2 s for the updates).
TEST(SlurmNodeTurn, SpreadsAJobsNodesWithinItsTaskExitWait) {
    EXPECT_EQ(mall::SlurmReconciler::node_turn(1), 0ms);
    EXPECT_EQ(mall::SlurmReconciler::node_turn(2), 25ms);
    EXPECT_EQ(mall::SlurmReconciler::node_turn(64), 23ms);
    EXPECT_EQ(mall::SlurmReconciler::node_turn(1000), 2ms);
    for (uint32_t nodes : {2u, 8u, 64u, 500u})
        EXPECT_LE((nodes - 1) * mall::SlurmReconciler::node_turn(nodes), 1500ms) << nodes;
    EXPECT_LT(1500ms, mall::kAnnotationWait);
}
