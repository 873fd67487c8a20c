// SPDX-License-Identifier: BSD-3-Clause
// Proves SlurmChecker turns job ids into verdicts off the caller's thread (a blocked query never
// blocks the caller), merges duplicate requests, and signals its fd; and slurm_job_id_of's parsing.
#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

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
    Annotated annotate(uint32_t id, const std::string &figures, mall::CommentChain *) override {
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

// --slurm-comment-merge slurmctld: the request job_submit.lua recognizes, and malld's check of
// slurm.conf's JobSubmitPlugins (the merge itself runs in slurmctld: system.slurm_comment_merge).
TEST(SlurmAdminCommentMerge, RequestIsTheMarkThenTheNodesSegment) {
    EXPECT_EQ(mall::admin_comment_merge_request("node3", "lent_core_s=1.0,core_s=2.0"),
              "mall-merge;mall:node3:lent_core_s=1.0,core_s=2.0");
}

TEST(SlurmAdminCommentMerge, NeedsLuaAmongTheJobSubmitPlugins) {
    EXPECT_EQ(mall::job_submit_lua_problem("lua"), "");
    EXPECT_EQ(mall::job_submit_lua_problem("job_submit/lua"), "");
    EXPECT_EQ(mall::job_submit_lua_problem("require_timelimit,lua"), "");
    EXPECT_EQ(mall::job_submit_lua_problem("lua,all_partitions"), "");
    for (const char *without : {"", "all_partitions", "luax", "job_submit/luajit", "require_timelimit,ua"}) {
        const std::string why = mall::job_submit_lua_problem(without);
        EXPECT_NE(why.find("add lua to it and install mall's job_submit.lua"), std::string::npos) << without << ": " << why;
    }
    EXPECT_NE(mall::job_submit_lua_problem("").find("JobSubmitPlugins is not set"), std::string::npos);
    EXPECT_NE(mall::job_submit_lua_problem("pbs").find("JobSubmitPlugins is 'pbs'"), std::string::npos);
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
    EXPECT_EQ(mall::update_admin_comment(load, always_lost, "node1", "x=1", nullptr, 3), mall::CommentUpdate::Lost);
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

// The turn: 50 ms a node, the whole job within 1.5 s (its task-exits wait 2 s for the updates).
TEST(SlurmAdminCommentTurn, SpreadsAJobsNodesWithinItsTaskExitWait) {
    EXPECT_EQ(mall::admin_comment_turn(1), 0ms);
    EXPECT_EQ(mall::admin_comment_turn(2), 50ms);
    EXPECT_EQ(mall::admin_comment_turn(8), 50ms);
    EXPECT_EQ(mall::admin_comment_turn(64), 23ms);
    EXPECT_EQ(mall::admin_comment_turn(1000), 2ms);
    for (uint32_t nodes : {2u, 8u, 64u, 500u})
        EXPECT_LE((nodes - 1) * mall::admin_comment_turn(nodes), 1500ms) << nodes;
    EXPECT_LT(1500ms, mall::kAnnotationWait);
}

// ---------------------------------------------------------------------------------------------
// Issue 39: a multi-node job's nodes write its AdminComment in the order of its node list, each
// after the ones before it, so no write undoes another and each node costs one read and one write.

// One AdminComment field as slurmctld keeps it (the last write wins), with the job's node list,
// counting reads and writes. Each node's load/store go through it.
struct FakeField {
    std::mutex mu;
    std::string text = "set by the site";
    std::vector<std::string> nodes;
    int loads = 0, stores = 0;
    std::chrono::milliseconds latency{0};  // each read or write takes this long (outside the lock)

    std::function<bool(mall::LoadedComment *)> load() {
        return [this](mall::LoadedComment *comment) {
            {
                std::lock_guard<std::mutex> lock(mu);
                ++loads;
                comment->text = text;
                comment->nodes = static_cast<uint32_t>(nodes.size());
                comment->node_names = nodes;
            }
            std::this_thread::sleep_for(latency);
            return true;
        };
    }
    std::function<bool(const std::string &)> store() {
        return [this](const std::string &comment) {
            std::this_thread::sleep_for(latency);
            std::lock_guard<std::mutex> lock(mu);
            ++stores;
            text = comment;
            return true;
        };
    }
    bool holds(const std::string &node, const std::string &figures) {
        std::lock_guard<std::mutex> lock(mu);
        return (";" + text + ";").find(";mall:" + node + ":" + figures + ";") != std::string::npos;
    }
};

std::vector<std::string> node_names(int count) {
    std::vector<std::string> names;
    for (int i = 0; i < count; ++i) names.push_back("n" + std::to_string(i));
    return names;
}

// The chain runs from the job's last node to its first (the batch host, whose job ends last).
// Nodes that end in the list's order: each reads, finds nodes before it in the chain missing, and
// waits without writing; the last node writes, then each in turn. No write undid another, and the
// segments stand in the chain's order.
TEST(SlurmAdminCommentChain, NodesWriteFromTheLastNodeToTheFirstWhateverOrderTheyEnd) {
    FakeField field;
    field.nodes = node_names(4);
    std::vector<mall::CommentChain> chains(4);
    for (int i = 0; i < 3; ++i) {
        EXPECT_EQ(mall::update_admin_comment(field.load(), field.store(), field.nodes[i], "x=" + std::to_string(i),
                                             &chains[i]),
                  mall::CommentUpdate::Wait)
            << i;
        EXPECT_GT(chains[i].retry_in.count(), 0);
        EXPECT_EQ(chains[i].missing, static_cast<size_t>(3 - i));
    }
    EXPECT_EQ(field.stores, 0) << "a node wrote before the nodes ahead of it";
    EXPECT_EQ(mall::update_admin_comment(field.load(), field.store(), "n3", "x=3", &chains[3]),
              mall::CommentUpdate::Kept);
    for (int i = 2; i >= 0; --i)
        EXPECT_EQ(mall::update_admin_comment(field.load(), field.store(), field.nodes[i], "x=" + std::to_string(i),
                                             &chains[i]),
                  mall::CommentUpdate::Kept)
            << i;
    EXPECT_EQ(field.text, "set by the site;mall:n3:x=3;mall:n2:x=2;mall:n1:x=1;mall:n0:x=0");
    EXPECT_EQ(field.stores, 4) << "one write a node";
    EXPECT_EQ(field.loads, 3 + 4) << "one read a node, and one more for each that read too early";
}

// In their turns (each after the one before it in the chain wrote), a 64-node job costs 2 RPCs
// a node.
TEST(SlurmAdminCommentChain, InTurnEachNodeReadsOnceAndWritesOnce) {
    FakeField field;
    field.nodes = node_names(64);
    for (auto node = field.nodes.rbegin(); node != field.nodes.rend(); ++node) {
        mall::CommentChain chain;
        EXPECT_EQ(mall::update_admin_comment(field.load(), field.store(), *node, "x=1", &chain),
                  mall::CommentUpdate::Kept)
            << *node;
    }
    EXPECT_EQ(field.loads, 64);
    EXPECT_EQ(field.stores, 64);
    for (const auto &node : field.nodes) EXPECT_TRUE(field.holds(node, "x=1")) << node;
}

// A node before it in the chain never writes (no mall task there, or its malld is down): after
// kChainStalledReads reads in a row showing no more of them, each pause twice the one before, a
// node writes anyway and reads back (the old way); the nodes after it, seeing a node that wrote
// out of turn, do the same at once.
TEST(SlurmAdminCommentChain, ANodeThatNeverWritesHoldsUpTheOthersOnlyAFewReads) {
    FakeField field;
    field.nodes = node_names(3);  // n2, the chain's first, never writes
    mall::CommentChain chain1, chain0;
    int waits = 0;
    std::chrono::milliseconds last_pause{0};
    mall::CommentUpdate outcome;
    while ((outcome = mall::update_admin_comment(field.load(), field.store(), "n1", "x=1", &chain1)) ==
           mall::CommentUpdate::Wait) {
        ASSERT_LT(++waits, 10);
        EXPECT_GT(chain1.retry_in, last_pause) << "the pauses grow";
        last_pause = chain1.retry_in;
    }
    EXPECT_EQ(outcome, mall::CommentUpdate::Kept);
    EXPECT_EQ(waits, mall::kChainStalledReads) << "reads without progress before it went on";
    EXPECT_EQ(field.stores, 1);
    const int loads_before = field.loads;
    EXPECT_EQ(mall::update_admin_comment(field.load(), field.store(), "n0", "x=0", &chain0), mall::CommentUpdate::Kept);
    EXPECT_EQ(field.loads - loads_before, 2) << "n0 saw n1 had written before n2: read, write, read back";
    EXPECT_TRUE(field.holds("n1", "x=1"));
    EXPECT_TRUE(field.holds("n0", "x=0"));
    // A node that has waited past kChainWait goes on too, whatever its reads showed.
    FakeField late;
    late.nodes = node_names(2);
    mall::CommentChain waited;
    waited.missing = 1;
    waited.give_up_at = std::chrono::steady_clock::now() - 1ms;
    EXPECT_EQ(mall::update_admin_comment(late.load(), late.store(), "n0", "x=0", &waited), mall::CommentUpdate::Kept);
    EXPECT_EQ(late.loads, 2);
}

// Running figures (mallctl record) and updates without a chain never wait: read, write, read back.
TEST(SlurmAdminCommentChain, RunningFiguresAndUpdatesWithoutAChainNeverWait) {
    FakeField field;
    field.nodes = node_names(2);
    mall::CommentChain chain;
    const std::string running = "x=1" + std::string(mall::kRunningFiguresMark) + "1700000000";
    EXPECT_EQ(mall::update_admin_comment(field.load(), field.store(), "n0", running, &chain), mall::CommentUpdate::Kept);
    EXPECT_EQ(mall::update_admin_comment(field.load(), field.store(), "n0", "x=2"), mall::CommentUpdate::Kept);
    EXPECT_EQ(field.loads, 4);
    EXPECT_EQ(field.stores, 2);
    // Running figures are not a node's last ones: n0's chain still waits for n1's.
    EXPECT_FALSE(mall::holds_last_figures("mall:n1:" + running, "n1"));
    EXPECT_TRUE(mall::holds_last_figures("a;mall:n0:x=1;b", "n0"));
    EXPECT_FALSE(mall::holds_last_figures("mall:n00:x=1", "n0"));
}

// A job's steps end one after the other, each leaving its nodes' last figures (with ended_at):
// a node waits for this step's segment of the node before it, not an earlier step's, so it never
// writes over one that node is about to replace.
TEST(SlurmAdminCommentChain, AnEarlierStepsSegmentIsNotThisRounds) {
    const nlohmann::json end = {{"event", "end"}, {"lent_core_seconds", 1.0}, {"core_seconds", 2.0},
                                {"resizes", 0}, {"ack_timeouts", 0}, {"oversubscribed_seconds", 0.0},
                                {"time", 1000.25}, {"duration_seconds", 10.0}};
    EXPECT_EQ(mall::admin_comment_figures(end),
              "lent_core_s=1.0,core_s=2.0,resizes=0,ack_timeouts=0,oversub_s=0.0,ended_at=1000.250");
    EXPECT_TRUE(mall::holds_last_figures("mall:n1:x=1,ended_at=1000.250", "n1", 1000.25));
    EXPECT_FALSE(mall::holds_last_figures("mall:n1:x=1,ended_at=1000.250", "n1", 1000.3));
    EXPECT_FALSE(mall::holds_last_figures("mall:n1:x=1", "n1", 1000.0)) << "no end time: not this round's";
    EXPECT_TRUE(mall::holds_last_figures("mall:n1:x=1", "n1")) << "any round";

    FakeField field;
    field.nodes = node_names(2);
    field.text = "mall:n1:x=1,ended_at=1000.000;mall:n0:x=0,ended_at=1000.010";  // step 1's
    mall::CommentChain chain;
    chain.part_began_at = 1001.0;  // n0's part of step 2
    EXPECT_EQ(mall::update_admin_comment(field.load(), field.store(), "n0", "x=2,ended_at=1005.000", &chain),
              mall::CommentUpdate::Wait)
        << "n1's segment is step 1's";
    EXPECT_EQ(field.stores, 0);
    mall::CommentChain chain1;
    chain1.part_began_at = 1001.0;
    EXPECT_EQ(mall::update_admin_comment(field.load(), field.store(), "n1", "x=3,ended_at=1005.001", &chain1),
              mall::CommentUpdate::Kept);
    EXPECT_EQ(mall::update_admin_comment(field.load(), field.store(), "n0", "x=2,ended_at=1005.000", &chain),
              mall::CommentUpdate::Kept);
    EXPECT_EQ(field.text, "mall:n1:x=3,ended_at=1005.001;mall:n0:x=2,ended_at=1005.000");
    EXPECT_EQ(field.loads, 3);
    EXPECT_EQ(field.stores, 2);
}

// Through the checkers of 8 nodes at once, as malld runs them (each node's update in its turn on
// its checker's thread, waits back in the queue): every node's figures are kept, each node wrote
// once (unless the machine held a thread back for long). The reads are printed, not asserted (a
// node whose thread ran late reads once more).
class FieldQuery : public mall::SlurmQuery {
public:
    FieldQuery(FakeField &field, std::string node) : field_(field), node_(std::move(node)) {}
    SlurmJobState query(uint32_t) override { return {}; }
    Annotated annotate(uint32_t, const std::string &figures, mall::CommentChain *chain) override {
        switch (mall::update_admin_comment(field_.load(), field_.store(), node_, figures, chain)) {
            case mall::CommentUpdate::Kept: return {};
            case mall::CommentUpdate::Wait: return {{}, false, chain->retry_in};
            default: return {"not kept", false};
        }
    }

private:
    FakeField &field_;
    std::string node_;
};

TEST(SlurmAdminCommentChain, EightNodesCheckersAtOnceKeepEveryNodesFigures) {
    FakeField field;
    field.nodes = node_names(8);
    field.latency = 1ms;
    std::vector<std::unique_ptr<mall::SlurmChecker>> checkers;
    for (const auto &node : field.nodes)
        checkers.push_back(std::make_unique<mall::SlurmChecker>(std::make_unique<FieldQuery>(field, node)));
    // Queued in the list's order, each in its node's turn (the last node's first).
    for (int i = 0; i < 8; ++i)
        checkers[i]->annotate(9, "x=" + std::to_string(i), false, false, (7 - i) * mall::admin_comment_turn(8));
    for (int i = 0; i < 8; ++i) {
        const auto done = take_updates(*checkers[i], 1);
        ASSERT_EQ(done.size(), 1u) << i;
        EXPECT_EQ(done[0].error, "") << i;
        EXPECT_FALSE(checkers[i]->annotating(9)) << i;
    }
    for (int i = 0; i < 8; ++i) EXPECT_TRUE(field.holds(field.nodes[i], "x=" + std::to_string(i))) << field.text;
    // One write a node; a node whose thread the machine held back past a node after it's give-up
    // (0.35 s and more without progress) makes that node go on the read-back way, a write or two more.
    EXPECT_GE(field.stores, 8);
    EXPECT_LE(field.stores, 12);
    std::printf("8 nodes: %d reads, %d writes\n", field.loads, field.stores);
}

// A job's parts on a node (each of its steps, on a node without its batch script) add up: each
// part's update carries the job's figures on this node so far, so the AdminComment segment covers
// the whole job, not only its last step; another job's parts stay apart.
TEST(SlurmReconciler, AJobsPartsOnANodeAddUpInItsAdminComment) {
    auto query = std::make_unique<FakeQuery>();
    FakeQuery *fake = query.get();
    mall::SlurmReconciler reconciler(std::move(query), 10s);
    auto end = [](const char *job, double lent, double core, int resizes, double time) {
        return nlohmann::json{{"event", "end"}, {"job", job}, {"lent_core_seconds", lent}, {"core_seconds", core},
                              {"resizes", resizes}, {"ack_timeouts", 0}, {"oversubscribed_seconds", 0.0},
                              {"time", time}, {"duration_seconds", 5.0}};
    };
    reconciler.record_end(end("slurm-40", 1.0, 10.0, 1, 1000.0));
    reconciler.record_end(end("slurm-41", 0.5, 3.0, 0, 1001.0));
    reconciler.record_end(end("slurm-40", 2.0, 20.0, 2, 1010.0));
    std::vector<mall::SlurmAnnotation> done;
    for (int i = 0; i < 100 && done.size() < 3; ++i) {
        if (!readable(reconciler.fd(), 100ms)) continue;
        for (auto &a : reconciler.take_annotations()) done.push_back(a);
    }
    ASSERT_EQ(done.size(), 3u);
    std::lock_guard<std::mutex> lock(fake->mu);
    EXPECT_EQ(fake->annotated,
              (std::vector<std::string>{
                  "40 lent_core_s=1.0,core_s=10.0,resizes=1,ack_timeouts=0,oversub_s=0.0,ended_at=1000.000",
                  "41 lent_core_s=0.5,core_s=3.0,resizes=0,ack_timeouts=0,oversub_s=0.0,ended_at=1001.000",
                  "40 lent_core_s=3.0,core_s=30.0,resizes=3,ack_timeouts=0,oversub_s=0.0,ended_at=1010.000"}));
}
