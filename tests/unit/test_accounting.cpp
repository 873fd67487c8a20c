// SPDX-License-Identifier: BSD-3-Clause
// Proves the core's accounting with a clock the test moves: core-seconds and lent core-seconds
// integrate the published cpus over time (lent: above the guaranteed cpus, or the min), the ack
// latency histogram counts each ack, oversubscription runs from an ack timeout of a shrink to the
// late ack, the end event carries the job's figures and the node's totals keep them.
#include <gtest/gtest.h>

#include <cmath>

#include "daemon/core/node_manager.hpp"
#include "support/core_effects.hpp"
#include "support/unit_helpers.hpp"
#include "support/watchdog.h"

using namespace mall;
using namespace std::chrono_literals;

namespace {

using mall::test::cpus;
MALL_TEST_WATCHDOG(60);


class AccountingTest : public ::testing::Test {
protected:
    void SetUp() override {
        std::string error;
        topology_ = Topology::load("pack:1 core:4 pu:1", &error);
        ASSERT_NE(topology_, nullptr) << error;
        manager_ = std::make_unique<NodeManager>(*topology_, cpus("0-3"), PolicyKind::Equal, 2000ms, effects_);
    }
    static JobSpec spec(const std::string &id, int min, int max, const std::string &guaranteed = "") {
        return test::job_spec(id, min, max, cpus(guaranteed), {static_cast<pid_t>(100 + id.size())});
    }
    const nlohmann::json &job_status(const nlohmann::json &status, const std::string &id) {
        for (const auto &j : status["jobs"])
            if (j["job"] == id) return j;
        ADD_FAILURE() << "no job " << id;
        static const nlohmann::json none;
        return none;
    }
    TimePoint at(double seconds) { return t0_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds)); }

    test::EventLogEffects effects_;
    std::unique_ptr<Topology> topology_;
    std::unique_ptr<NodeManager> manager_;
    TimePoint t0_ = Clock::now();
};

TEST_F(AccountingTest, LentCoreSecondsCountCpusAboveTheMinOverTime) {
    NodeManager &nm = *manager_;
    ASSERT_TRUE(nm.register_job(spec("a", 1, 4), at(0)).ok);  // alone: all 4 cpus, 3 above its min
    nlohmann::json s = nm.status(at(10));
    EXPECT_EQ(job_status(s, "a")["lent_cpus"], 3);
    EXPECT_NEAR(job_status(s, "a")["core_seconds"].get<double>(), 40, 1e-6);
    EXPECT_NEAR(job_status(s, "a")["lent_core_seconds"].get<double>(), 30, 1e-6);
    EXPECT_NEAR(job_status(s, "a")["duration_seconds"].get<double>(), 10, 1e-6);
    EXPECT_NEAR(s["node"]["lent_core_seconds"].get<double>(), 30, 1e-6);

    // A second job (guaranteed cpu 3) takes half: from t=10 "a" holds 2 cpus, 1 lent; "b" holds 2
    // cpus of which 1 is guaranteed, so 1 is lent.
    ASSERT_TRUE(nm.register_job(spec("b", 1, 4, "3"), at(10)).ok);
    s = nm.status(at(20));
    EXPECT_EQ(job_status(s, "a")["ncpus"], 2);
    EXPECT_NEAR(job_status(s, "a")["lent_core_seconds"].get<double>(), 30 + 10, 1e-6);
    EXPECT_NEAR(job_status(s, "a")["core_seconds"].get<double>(), 40 + 20, 1e-6);
    EXPECT_EQ(job_status(s, "b")["lent_cpus"], 1);
    EXPECT_NEAR(job_status(s, "b")["lent_core_seconds"].get<double>(), 10, 1e-6);
    EXPECT_NEAR(s["node"]["lent_core_seconds"].get<double>(), 50, 1e-6);
    EXPECT_EQ(s["node"]["resizes"], job_status(s, "a")["transitions"].get<int>() + job_status(s, "b")["transitions"].get<int>());

    // "a" ends at t=20: its record carries its figures and the node keeps them.
    ASSERT_TRUE(nm.deregister_job("a", at(20)).ok);
    const auto ends = effects_.named("end");
    ASSERT_EQ(ends.size(), 1u);
    EXPECT_EQ(ends[0]["job"], "a");
    EXPECT_EQ(ends[0]["uid"], 1000);
    EXPECT_NEAR(ends[0]["lent_core_seconds"].get<double>(), 40, 1e-6);
    EXPECT_NEAR(ends[0]["core_seconds"].get<double>(), 60, 1e-6);
    EXPECT_NEAR(ends[0]["duration_seconds"].get<double>(), 20, 1e-6);
    EXPECT_EQ(nm.totals().jobs_ended, 1u);
    EXPECT_NEAR(nm.totals().lent_core_seconds, 40, 1e-6);
    // "b" then has all 4 cpus (3 lent) from t=20: the node total runs on without a jump.
    s = nm.status(at(30));
    EXPECT_EQ(s["node"]["jobs_ended"], 1);
    EXPECT_NEAR(s["node"]["lent_core_seconds"].get<double>(), 40 + 10 + 10 * 3, 1e-6);
}

TEST_F(AccountingTest, GuaranteedCpusAreNotLent) {
    NodeManager &nm = *manager_;
    ASSERT_TRUE(nm.set_policy("static", at(0)).ok);
    ASSERT_TRUE(nm.register_job(spec("g", 2, 4, "0-1"), at(0)).ok);
    const nlohmann::json s = nm.status(at(5));
    EXPECT_EQ(job_status(s, "g")["ncpus"], 2);
    EXPECT_EQ(job_status(s, "g")["lent_cpus"], 0);
    EXPECT_NEAR(job_status(s, "g")["core_seconds"].get<double>(), 10, 1e-6);
    EXPECT_EQ(job_status(s, "g")["lent_core_seconds"].get<double>(), 0);
}

TEST_F(AccountingTest, AckLatencyGoesToTheHistogram) {
    NodeManager &nm = *manager_;
    ASSERT_TRUE(nm.register_job(spec("a", 1, 4), at(0)).ok);
    ASSERT_TRUE(nm.attach("a", 1).ok);
    ASSERT_TRUE(nm.register_job(spec("b", 1, 4), at(1)).ok);  // "a" must shrink: waits for its ack
    const Job *a = nm.find("a");
    ASSERT_TRUE(a->awaiting_ack);
    nm.ack("a", 1, a->generation, at(1.003));  // 3 ms later
    const nlohmann::json s = nm.status(at(2));
    const auto &histogram = job_status(s, "a")["ack_latency_seconds"];
    EXPECT_EQ(histogram["count"], 1);
    EXPECT_NEAR(histogram["sum"].get<double>(), 0.003, 1e-6);
    // 3 ms falls in the bucket above 2.5 ms (index of 0.005).
    const auto &bounds = s["histogram_bounds_seconds"];
    size_t bucket = 0;
    while (bounds[bucket].get<double>() < 0.003) ++bucket;
    EXPECT_EQ(histogram["counts"][bucket], 1);
    EXPECT_EQ(histogram["counts"].size(), bounds.size() + 1);
    EXPECT_EQ(s["node"]["ack_latency_seconds"]["count"], 1);
}

TEST_F(AccountingTest, OversubscriptionRunsFromTheTimeoutToTheLateAck) {
    NodeManager &nm = *manager_;
    ASSERT_TRUE(nm.register_job(spec("a", 1, 4), at(0)).ok);
    ASSERT_TRUE(nm.attach("a", 1).ok);  // its process runs 4 threads
    ASSERT_TRUE(nm.register_job(spec("b", 1, 4), at(1)).ok);
    const uint64_t shrink = nm.find("a")->generation;
    nm.tick(at(1) + 2000ms);  // no ack: the timeout narrows "a" to 2 cpus under 4 threads
    nlohmann::json s = nm.status(at(5));
    EXPECT_EQ(job_status(s, "a")["ack_timeouts"], 1);
    EXPECT_EQ(job_status(s, "a")["oversubscribed"], true);
    EXPECT_NEAR(job_status(s, "a")["oversubscribed_seconds"].get<double>(), 2, 1e-6);
    EXPECT_EQ(s["node"]["ack_timeouts"], 1);
    nm.ack("a", 1, shrink, at(7));  // the late ack: 4 s oversubscribed
    s = nm.status(at(9));
    EXPECT_EQ(job_status(s, "a")["oversubscribed"], false);
    EXPECT_NEAR(job_status(s, "a")["oversubscribed_seconds"].get<double>(), 4, 1e-6);
    EXPECT_NEAR(s["node"]["oversubscribed_seconds"].get<double>(), 4, 1e-6);
}

// After a late ack the processes run what the page says: a later timed-out grow (2 -> 4 cpus,
// threads still 2) is no oversubscription, though the job once ran 4 threads.
TEST_F(AccountingTest, ALateAckResetsWhatTheProcessesRun) {
    NodeManager &nm = *manager_;
    ASSERT_TRUE(nm.register_job(spec("a", 1, 4), at(0)).ok);
    ASSERT_TRUE(nm.attach("a", 1).ok);  // 4 threads on 4 cpus
    ASSERT_TRUE(nm.register_job(spec("b", 1, 4), at(1)).ok);
    const uint64_t shrink = nm.find("a")->generation;
    nm.tick(at(1) + 2000ms);             // the shrink times out: oversubscribed
    nm.ack("a", 1, shrink, at(4));       // late: 2 threads on 2 cpus now
    ASSERT_TRUE(nm.deregister_job("b", at(5)).ok);  // "a" grows to 4; this ack never comes
    nm.tick(at(5) + 2000ms);
    const nlohmann::json s = nm.status(at(10));
    EXPECT_EQ(job_status(s, "a")["ack_timeouts"], 2);
    EXPECT_EQ(job_status(s, "a")["oversubscribed"], false);
    EXPECT_NEAR(job_status(s, "a")["oversubscribed_seconds"].get<double>(), 1, 1e-6);
}

// A saved job malld does not take back at a restart keeps its figures in the node's totals, with
// an end event, so no counter goes back.
TEST_F(AccountingTest, ASavedJobThatEndedWhileMalldWasAwayStaysInTheTotals) {
    NodeManager &nm = *manager_;
    Job saved;
    saved.spec = spec("gone", 1, 4);
    saved.published = saved.cpuset = cpus("0-3");
    saved.registered_at = at(0);
    saved.accounted_until = at(20);
    saved.core_seconds = 80;
    saved.lent_core_seconds = 60;
    nm.close_saved_job(saved, "ended while malld was away");
    EXPECT_EQ(nm.totals().jobs_ended, 1u);
    EXPECT_NEAR(nm.totals().lent_core_seconds, 60, 1e-9) << "counted up to the saved moment, no further";
    const auto ends = effects_.named("end");
    ASSERT_EQ(ends.size(), 1u);
    EXPECT_EQ(ends[0]["reason"], "ended while malld was away");
    EXPECT_NEAR(ends[0]["duration_seconds"].get<double>(), 20, 1e-6);
}

TEST_F(AccountingTest, ATimedOutGrowIsNotOversubscription) {
    NodeManager &nm = *manager_;
    ASSERT_TRUE(nm.register_job(spec("a", 1, 4), at(0)).ok);
    ASSERT_TRUE(nm.register_job(spec("b", 1, 4), at(0)).ok);
    ASSERT_TRUE(nm.attach("a", 1).ok);  // runs 2 threads on 2 cpus
    ASSERT_TRUE(nm.deregister_job("b", at(1)).ok);  // "a" may grow to 4: its ack never comes
    nm.tick(at(1) + 2000ms);
    const nlohmann::json s = nm.status(at(5));
    EXPECT_EQ(job_status(s, "a")["ack_timeouts"], 1);
    EXPECT_EQ(job_status(s, "a")["oversubscribed"], false);
    EXPECT_EQ(job_status(s, "a")["oversubscribed_seconds"].get<double>(), 0);
}

TEST_F(AccountingTest, ReclaimsAreCountedWithTheirDuration) {
    NodeManager &nm = *manager_;
    nm.record_reclaim(0.004, false);
    nm.record_reclaim(45, true);
    const nlohmann::json s = nm.status(at(0));
    EXPECT_EQ(s["node"]["reclaims"], 2);
    EXPECT_EQ(s["node"]["reclaim_timeouts"], 1);
    EXPECT_EQ(s["node"]["reclaim_duration_seconds"]["count"], 2);
    EXPECT_NEAR(s["node"]["reclaim_duration_seconds"]["sum"].get<double>(), 45.004, 1e-9);
}

TEST(DurationHistogram, ReadsBackWhatItWritesAndRefusesInconsistentCounts) {
    DurationHistogram h;
    h.observe(0.00005);
    h.observe(0.7);
    h.observe(1e6);  // above every bound
    auto back = DurationHistogram::from_json(h.to_json());
    ASSERT_TRUE(back);
    EXPECT_EQ(*back, h);
    EXPECT_EQ(h.counts().front(), 1u);
    EXPECT_EQ(h.counts().back(), 1u);
    nlohmann::json bad = h.to_json();
    bad["count"] = 5;  // the buckets say 3
    EXPECT_FALSE(DurationHistogram::from_json(bad));
    bad = h.to_json();
    bad["counts"].erase(0);
    EXPECT_FALSE(DurationHistogram::from_json(bad));
}

}  // namespace
