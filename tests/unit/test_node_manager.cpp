// SPDX-License-Identifier: BSD-3-Clause
// Proves the two-phase protocol (shrink, ack or timeout, grow) and that bad requests change nothing.

#include <cmath>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <random>

#include "support/core_effects.hpp"
#include "support/unit_helpers.hpp"
#include "support/watchdog.h"
#include "daemon/core/node_manager.hpp"

using namespace mall;
using namespace std::chrono_literals;

namespace {

using mall::test::cpus;
MALL_TEST_WATCHDOG(60);

// Records every effect as one line ("enforce a 0-1 grow", "publish a 2 0-1", "removed a"; a
// publication says " threads N" and " signals" when it carries them) and keeps the events apart.
class RecordingEffects : public Effects {
public:
    bool enforce(const std::string &job, const CpuSet &set, bool growing,
                 std::string *error) override {
        calls.push_back("enforce " + job + " " + set.to_string() + (growing ? " grow" : " shrink"));
        if (fail_enforce) {
            *error = "simulated failure";
            return false;
        }
        return true;
    }
    void publish(const std::string &job, uint64_t generation, const CpuSet &set, int threads,
                 bool signal_control) override {
        calls.push_back("publish " + job + " " + std::to_string(generation) + " " + set.to_string() +
                        (threads > 0 ? " threads " + std::to_string(threads) : "") +
                        (signal_control ? " signals" : ""));
    }
    void job_removed(const std::string &job) override { calls.push_back("removed " + job); }
    std::optional<double> event_time() override { return wall_time; }  // the core has no wall clock
    void event(const nlohmann::json &ev) override {
        EXPECT_TRUE(ev.contains("event"));
        EXPECT_TRUE(ev.contains("time"));
        events.push_back(ev);
    }
    std::vector<std::string> take() {
        auto out = std::move(calls);
        calls.clear();
        return out;
    }
    std::vector<nlohmann::json> events_named(const std::string &name) const {
        std::vector<nlohmann::json> out;
        for (const auto &ev : events) {
            if (ev["event"] == name) out.push_back(ev);
        }
        return out;
    }

    std::vector<std::string> calls;
    std::vector<nlohmann::json> events;
    bool fail_enforce = false;
    double wall_time = 1.7e9;
};

using Calls = std::vector<std::string>;

class NodeManagerTest : public ::testing::Test {
protected:
    void SetUp() override { make("pack:2 core:2 pu:1", "0-3"); }

    void make(const std::string &topology_spec, const std::string &pool,
              PolicyKind policy = PolicyKind::Equal) {
        std::string error;
        manager_.reset();
        topology_ = Topology::load(topology_spec, &error);
        ASSERT_NE(topology_, nullptr) << error;
        manager_ = std::make_unique<NodeManager>(*topology_, cpus(pool), policy, 2000ms, effects_);
    }

    NodeManager &nm() { return *manager_; }

    static JobSpec spec(const std::string &id, int min, int max, const std::string &guaranteed = "",
                        std::vector<pid_t> pids = {100}) {
        return test::job_spec(id, min, max, cpus(guaranteed), std::move(pids));
    }

    // The invariant of node_manager.hpp plus the bookkeeping it relies on; called after every
    // operation in these tests.
    void check() {
        const auto &jobs = nm().jobs();
        for (auto a = jobs.begin(); a != jobs.end(); ++a) {
            const Job &job = a->second;
            const CpuSet held = job.cpuset | job.published;
            EXPECT_TRUE(nm().pool().contains(held)) << a->first << " holds " << held.to_string();
            EXPECT_TRUE(job.cpuset.contains(job.published))
                << a->first << ": published " << job.published.to_string() << " not in cpuset "
                << job.cpuset.to_string();
            if (!job.awaiting_ack && !job.enforce_retry_at) {  // a failed narrowing awaits retry
                EXPECT_EQ(job.cpuset, job.published) << a->first;
            }
            for (auto b = std::next(a); b != jobs.end(); ++b) {
                const CpuSet other = b->second.cpuset | b->second.published;
                EXPECT_FALSE(held.intersects(other))
                    << a->first << " and " << b->first << " share " << (held & other).to_string();
            }
        }
        CpuSet free = nm().free_cpus();
        EXPECT_FALSE(nm().holds_any(free));
        EXPECT_FALSE(free.intersects(nm().reclaimed()));
    }

    void ok(const Outcome &outcome) {
        EXPECT_TRUE(outcome.ok) << outcome.error;
        check();
    }

    // A request that must fail with `code` and leave everything as it was.
    template <typename Request>
    void refused(int code, Request request, const std::string &words = "") {
        const nlohmann::json before = nm().status();
        effects_.take();
        const size_t events_before = effects_.events.size();
        Outcome outcome = request();
        EXPECT_FALSE(outcome.ok);
        EXPECT_EQ(outcome.code, code) << outcome.error;
        EXPECT_FALSE(outcome.error.empty());
        if (!words.empty()) {
            EXPECT_NE(outcome.error.find(words), std::string::npos) << outcome.error;
        }
        EXPECT_EQ(nm().status(), before) << outcome.error;
        EXPECT_TRUE(effects_.take().empty());
        EXPECT_EQ(effects_.events.size(), events_before);
        check();
    }

    const Job &job(const std::string &id) {
        const Job *j = nm().find(id);
        EXPECT_NE(j, nullptr) << id;
        static Job none;
        return j != nullptr ? *j : none;
    }

    TimePoint at(std::chrono::microseconds offset) { return t0_ + offset; }

    RecordingEffects effects_;
    std::unique_ptr<Topology> topology_;
    std::unique_ptr<NodeManager> manager_;
    TimePoint t0_ = TimePoint{} + 1000s;
};

}  // namespace

TEST_F(NodeManagerTest, LoneJobGetsWholePool) {
    ok(nm().register_job(spec("a", 1, 4), at(0us)));
    EXPECT_EQ(effects_.take(), (Calls{"enforce a 0-3 grow", "publish a 1 0-3"}));
    EXPECT_TRUE(nm().steady("a"));
    EXPECT_EQ(job("a").generation, 1u);
    EXPECT_TRUE(nm().free_cpus().empty());
    auto reg = effects_.events_named("register");
    ASSERT_EQ(reg.size(), 1u);
    EXPECT_EQ(reg[0]["job"], "a");
    EXPECT_EQ(reg[0]["min"], 1);
    EXPECT_EQ(reg[0]["max"], 4);
    EXPECT_EQ(reg[0]["pids"], nlohmann::json::array({100}));
    auto pub = effects_.events_named("publish");
    ASSERT_EQ(pub.size(), 1u);
    EXPECT_EQ(pub[0]["generation"], 1);
    EXPECT_EQ(pub[0]["cpus"], "0-3");
    EXPECT_EQ(pub[0]["ncpus"], 4);
}

TEST_F(NodeManagerTest, SecondJobWaitsForTheFirstToAckItsShrink) {
    ok(nm().register_job(spec("a", 1, 4), at(0us)));
    ok(nm().attach("a", 1));
    effects_.take();

    ok(nm().register_job(spec("b", 1, 4, "", {200}), at(10us)));
    // Phase 1: only a's smaller allocation is published; nothing is enforced yet.
    EXPECT_EQ(effects_.take(), (Calls{"publish a 2 0-1"}));
    EXPECT_EQ(job("a").cpuset.to_string(), "0-3");
    EXPECT_TRUE(job("b").cpuset.empty());
    EXPECT_TRUE(nm().holds_any(cpus("2-3")));
    EXPECT_FALSE(nm().steady("a"));
    EXPECT_FALSE(nm().steady("b"));
    EXPECT_EQ(nm().status()["jobs"][0]["state"], "changing");
    EXPECT_EQ(nm().next_deadline(), at(10us) + 2000ms);

    nm().ack("a", 1, 1, at(20us));  // an old generation changes nothing
    check();
    EXPECT_TRUE(effects_.take().empty());

    // Phase 2: the ack narrows a, and only then is b widened and published.
    nm().ack("a", 1, 2, at(60us));
    check();
    EXPECT_EQ(effects_.take(),
              (Calls{"enforce a 0-1 shrink", "enforce b 2-3 grow", "publish b 1 2-3"}));
    auto acks = effects_.events_named("ack");
    ASSERT_EQ(acks.size(), 1u);
    EXPECT_EQ(acks[0]["job"], "a");
    EXPECT_EQ(acks[0]["generation"], 2);
    EXPECT_DOUBLE_EQ(acks[0]["latency_us"].get<double>(), 50.0);
    EXPECT_DOUBLE_EQ(job("a").last_ack_latency_us, 50.0);
    EXPECT_TRUE(nm().steady("a"));
    EXPECT_TRUE(nm().steady("b"));
    EXPECT_FALSE(nm().next_deadline().has_value());
    EXPECT_EQ(job("a").acked_generation(), 2u);

    const auto status = nm().status();
    EXPECT_EQ(status["free"], "");
    EXPECT_EQ(status["jobs"][0]["job"], "a");
    EXPECT_EQ(status["jobs"][0]["cpus"], "0-1");
    EXPECT_EQ(status["jobs"][0]["cpuset"], "0-1");
    EXPECT_EQ(status["jobs"][0]["generation"], 2);
    EXPECT_EQ(status["jobs"][0]["acked_generation"], 2);
    EXPECT_EQ(status["jobs"][0]["attached"], 1);
    EXPECT_EQ(status["jobs"][0]["transitions"], 2);
    EXPECT_EQ(status["jobs"][0]["state"], "settled");
    EXPECT_EQ(status["jobs"][1]["job"], "b");
    EXPECT_EQ(status["jobs"][1]["ncpus"], 2);
}

TEST_F(NodeManagerTest, EveryAttachedProcessMustAck) {
    ok(nm().register_job(spec("a", 1, 4, "", {100, 101}), at(0us)));
    ok(nm().attach("a", 1));
    ok(nm().attach("a", 2));
    ok(nm().register_job(spec("b", 1, 4), at(0us)));
    effects_.take();
    nm().ack("a", 1, 2, at(5us));
    check();
    EXPECT_TRUE(effects_.take().empty());
    EXPECT_EQ(job("a").acked_generation(), 1u);
    nm().ack("a", 2, 2, at(9us));
    check();
    EXPECT_EQ(effects_.take(),
              (Calls{"enforce a 0-1 shrink", "enforce b 2-3 grow", "publish b 1 2-3"}));
}

TEST_F(NodeManagerTest, DetachingTheLastProcessEndsTheWait) {
    ok(nm().register_job(spec("a", 1, 4), at(0us)));
    ok(nm().attach("a", 7));
    ok(nm().register_job(spec("b", 1, 4), at(0us)));
    effects_.take();
    nm().detach("a", 7, at(3us));
    check();
    EXPECT_EQ(effects_.take(),
              (Calls{"enforce a 0-1 shrink", "enforce b 2-3 grow", "publish b 1 2-3"}));
    EXPECT_TRUE(effects_.events_named("ack").empty());  // nobody acked
}

TEST_F(NodeManagerTest, JobWithoutAttachmentShrinksWithoutWaiting) {
    ok(nm().register_job(spec("a", 1, 4), at(0us)));
    effects_.take();
    ok(nm().register_job(spec("b", 1, 4), at(0us)));
    EXPECT_EQ(effects_.take(), (Calls{"publish a 2 0-1", "enforce a 0-1 shrink",
                                      "enforce b 2-3 grow", "publish b 1 2-3"}));
    EXPECT_TRUE(nm().steady("a"));
    EXPECT_TRUE(nm().steady("b"));
}

TEST_F(NodeManagerTest, AckTimeoutEnforcesAtTheDeadline) {
    ok(nm().register_job(spec("a", 1, 4), at(0us)));
    ok(nm().attach("a", 1));
    ok(nm().register_job(spec("b", 1, 4), at(0us)));
    EXPECT_EQ(effects_.take(), (Calls{"enforce a 0-3 grow", "publish a 1 0-3", "publish a 2 0-1"}));
    ASSERT_TRUE(nm().next_deadline().has_value());
    EXPECT_EQ(*nm().next_deadline(), at(0us) + 2000ms);

    nm().tick(at(1999ms));
    check();
    EXPECT_TRUE(effects_.take().empty());
    EXPECT_EQ(job("a").ack_timeouts, 0u);

    nm().tick(at(2000ms));
    check();
    EXPECT_EQ(effects_.take(),
              (Calls{"enforce a 0-1 shrink", "enforce b 2-3 grow", "publish b 1 2-3"}));
    EXPECT_EQ(job("a").ack_timeouts, 1u);
    EXPECT_EQ(nm().status()["jobs"][0]["ack_timeouts"], 1);
    auto timeouts = effects_.events_named("ack_timeout");
    ASSERT_EQ(timeouts.size(), 1u);
    EXPECT_EQ(timeouts[0]["job"], "a");
    EXPECT_EQ(timeouts[0]["generation"], 2);

    nm().ack("a", 1, 2, at(2500ms));  // late: nothing left to do
    check();
    EXPECT_TRUE(effects_.take().empty());
    EXPECT_EQ(job("a").acked_generation(), 2u);
}

TEST_F(NodeManagerTest, GrowthWithAnAttachmentPublishesAtOnceThenWaits) {
    ok(nm().register_job(spec("a", 1, 4), at(0us)));
    ok(nm().register_job(spec("b", 1, 4), at(0us)));
    ok(nm().attach("a", 1));
    effects_.take();
    ok(nm().deregister_job("b", at(10us)));
    EXPECT_EQ(effects_.take(), (Calls{"removed b", "enforce a 0-3 grow", "publish a 3 0-3"}));
    EXPECT_TRUE(job("a").awaiting_ack);
    auto end = effects_.events_named("end");
    ASSERT_EQ(end.size(), 1u);
    EXPECT_EQ(end[0]["reason"], "deregistered");
    nm().ack("a", 1, 3, at(20us));
    check();
    EXPECT_TRUE(effects_.take().empty());  // nothing to narrow
    EXPECT_TRUE(nm().steady("a"));
}

TEST_F(NodeManagerTest, DeregisterAndLastPidReturnCpus) {
    ok(nm().register_job(spec("a", 1, 4), at(0us)));
    ok(nm().register_job(spec("b", 1, 4, "", {200, 201}), at(0us)));
    effects_.take();
    ok(nm().remove_pid("b", 200, at(0us)));
    EXPECT_TRUE(effects_.take().empty());
    refused(MALL_ERR_INVAL, [&] { return nm().remove_pid("b", 200, at(0us)); }, "200");
    refused(MALL_ERR_NOJOB, [&] { return nm().remove_pid("zz", 1, at(0us)); }, "zz");
    ok(nm().remove_pid("b", 201, at(0us)));
    EXPECT_EQ(effects_.take(), (Calls{"removed b", "enforce a 0-3 grow", "publish a 3 0-3"}));
    EXPECT_EQ(effects_.events_named("end").at(0)["reason"], "exited");
    EXPECT_EQ(nm().find("b"), nullptr);
    ok(nm().deregister_job("a", at(0us)));
    EXPECT_EQ(nm().free_cpus().to_string(), "0-3");
    refused(MALL_ERR_NOJOB, [&] { return nm().deregister_job("a", at(0us)); });
}

TEST_F(NodeManagerTest, ReclaimShrinksHoldersAndReleaseGivesBack) {
    ok(nm().register_job(spec("a", 1, 4), at(0us)));
    ok(nm().attach("a", 1));
    effects_.take();
    ok(nm().reclaim(cpus("2-3"), at(0us)));
    EXPECT_EQ(effects_.take(), (Calls{"publish a 2 0-1"}));
    EXPECT_TRUE(nm().holds_any(cpus("2-3")));
    EXPECT_EQ(nm().available_pool().to_string(), "0-1");
    nm().ack("a", 1, 2, at(30us));
    check();
    EXPECT_EQ(effects_.take(), (Calls{"enforce a 0-1 shrink"}));
    EXPECT_FALSE(nm().holds_any(cpus("2-3")));
    auto status = nm().status();
    EXPECT_EQ(status["reclaimed"], "2-3");
    EXPECT_EQ(status["available"], "0-1");
    EXPECT_EQ(status["pool"], "0-3");
    EXPECT_EQ(status["free"], "");
    EXPECT_EQ(effects_.events_named("reclaim").at(0)["cpus"], "2-3");

    // A new job now gets no reclaimed cpu.
    ok(nm().register_job(spec("b", 1, 4), at(40us)));
    nm().ack("a", 1, 3, at(50us));
    check();
    EXPECT_FALSE(nm().holds_any(cpus("2-3")));
    EXPECT_EQ(job("b").published.count(), 1);

    refused(MALL_ERR_INVAL, [&] { return nm().release(cpus("1-2"), at(0us)); }, "not reclaimed");
    refused(MALL_ERR_INVAL, [&] { return nm().release(CpuSet(), at(0us)); });
    ok(nm().release(cpus("2-3"), at(60us)));
    EXPECT_EQ(effects_.events_named("release").at(0)["cpus"], "2-3");
    nm().tick(at(100s));
    check();
    EXPECT_EQ(nm().available_pool().to_string(), "0-3");
    EXPECT_EQ(job("a").published.count() + job("b").published.count(), 4);
}

TEST_F(NodeManagerTest, BadReclaimsChangeNothing) {
    ok(nm().register_job(spec("a", 2, 4, "0"), at(0us)));
    ok(nm().register_job(spec("b", 1, 4), at(0us)));
    refused(MALL_ERR_INVAL, [&] { return nm().reclaim(cpus("3-4"), at(0us)); }, "not in");
    refused(MALL_ERR_INVAL, [&] { return nm().reclaim(cpus("0"), at(0us)); }, "guaranteed");
    refused(MALL_ERR_INVAL, [&] { return nm().reclaim(cpus("1-3"), at(0us)); }, "below its minimum");
    refused(MALL_ERR_INVAL, [&] { return nm().reclaim(CpuSet(), at(0us)); });
    ok(nm().reclaim(cpus("3"), at(0us)));
}

TEST_F(NodeManagerTest, PinnedSetAndBackToAuto) {
    ok(nm().register_job(spec("a", 1, 4), at(0us)));
    ok(nm().register_job(spec("b", 1, 4), at(0us)));
    effects_.take();
    ok(nm().set_cpus("b", cpus("1-3"), at(0us)));
    EXPECT_EQ(job("b").published.to_string(), "1-3");
    EXPECT_EQ(job("a").published.to_string(), "0");
    EXPECT_TRUE(job("b").pinned.has_value());
    EXPECT_EQ(nm().status()["jobs"][1]["pinned"], true);
    auto pin = effects_.events_named("pin");
    ASSERT_EQ(pin.size(), 1u);
    EXPECT_EQ(pin[0]["cpus"], "1-3");

    // Other jobs cannot be pinned onto b's pinned cpus.
    refused(MALL_ERR_INVAL, [&] { return nm().set_cpus("a", cpus("0-1"), at(0us)); }, "pinned");
    refused(MALL_ERR_INVAL, [&] { return nm().set_cpus("a", cpus("0,9"), at(0us)); }, "pool");
    refused(MALL_ERR_INVAL, [&] { return nm().set_cpus("a", CpuSet(), at(0us)); }, "1 to 4");
    refused(MALL_ERR_NOJOB, [&] { return nm().set_cpus("nope", cpus("0"), at(0us)); });

    ok(nm().set_cpus("b", std::nullopt, at(0us)));
    EXPECT_EQ(effects_.events_named("pin").back()["cpus"], "auto");
    EXPECT_FALSE(job("b").pinned.has_value());
    EXPECT_EQ(job("a").published.count(), 2);
    EXPECT_EQ(job("b").published.count(), 2);
}

TEST_F(NodeManagerTest, PinOutsideMinMaxIsRefused) {
    ok(nm().register_job(spec("a", 2, 3), at(0us)));
    refused(MALL_ERR_INVAL, [&] { return nm().set_cpus("a", cpus("0"), at(0us)); }, "2 to 3");
    refused(MALL_ERR_INVAL, [&] { return nm().set_cpus("a", cpus("0-3"), at(0us)); }, "2 to 3");
    ok(nm().set_cpus("a", cpus("2-3"), at(0us)));
    EXPECT_EQ(job("a").published.to_string(), "2-3");
}

TEST_F(NodeManagerTest, PolicySwitch) {
    ok(nm().register_job(spec("a", 1, 4), at(0us)));
    effects_.take();
    ok(nm().set_policy("static", at(0us)));
    EXPECT_EQ(nm().policy(), PolicyKind::Static);
    EXPECT_EQ(job("a").published.count(), 1);
    EXPECT_EQ(nm().status()["policy"], "static");
    EXPECT_EQ(effects_.events_named("policy").at(0)["policy"], "static");
    refused(MALL_ERR_INVAL, [&] { return nm().set_policy("greedy", at(0us)); }, "equal, static");
    ok(nm().set_policy("equal", at(0us)));
    EXPECT_EQ(job("a").published.count(), 4);
}

TEST_F(NodeManagerTest, BadRegistrationsChangeNothing) {
    ok(nm().register_job(spec("a", 1, 4, "1"), at(0us)));
    auto reg = [&](JobSpec s) { return [this, s] { return nm().register_job(s, at(0us)); }; };
    refused(MALL_ERR_INVAL, reg(spec("a", 1, 4)), "already registered");
    refused(MALL_ERR_INVAL, reg(spec("", 1, 4)), "job name");
    refused(MALL_ERR_INVAL, reg(spec("bad name", 1, 4)), "job name");
    refused(MALL_ERR_INVAL, reg(spec("b/c", 1, 4)), "job name");
    refused(MALL_ERR_INVAL, reg(spec(std::string(65, 'x'), 1, 4)), "job name");
    refused(MALL_ERR_INVAL, reg(spec("b", 0, 4)), "min");
    refused(MALL_ERR_INVAL, reg(spec("b", 3, 2)), "larger than max");
    refused(MALL_ERR_INVAL, reg(spec("b", 1, 5)), "pool");
    refused(MALL_ERR_INVAL, reg(spec("b", 1, 4, "4")), "not in");
    refused(MALL_ERR_INVAL, reg(spec("b", 1, 4, "1-2")), "guaranteed");
    refused(MALL_ERR_INVAL, reg(spec("b", 1, 1, "2-3")), "max");
    refused(MALL_ERR_INVAL, reg(spec("b", 1, 4, "", {})), "pid");
    refused(MALL_ERR_INVAL, reg(spec("b", 1, 4, "", {0})), "pid");
    JobSpec heavy = spec("b", 1, 4);
    heavy.weight = 0;
    refused(MALL_ERR_INVAL, reg(heavy), "weight");
    heavy.weight = 2e6;  // the bound set_weight, mallrun and mallctl also apply
    refused(MALL_ERR_INVAL, reg(heavy), "at most 1000000");
    ok(nm().register_job(spec("b.1:x-y_z", 1, 4, "2-3"), at(0us)));
}

TEST_F(NodeManagerTest, GuaranteedCpusGoToTheirJob) {
    ok(nm().register_job(spec("a", 1, 4), at(0us)));
    ok(nm().attach("a", 1));
    ok(nm().register_job(spec("b", 1, 4, "0"), at(0us)));
    nm().ack("a", 1, 2, at(10us));
    check();
    EXPECT_TRUE(job("b").published.contains(0));
    EXPECT_FALSE(job("a").published.contains(0));
    EXPECT_EQ(nm().status()["jobs"][1]["guaranteed"], "0");
}

TEST_F(NodeManagerTest, EnforceFailureIsReportedAndTheProtocolGoesOn) {
    effects_.fail_enforce = true;
    ok(nm().register_job(spec("a", 1, 4), at(0us)));
    auto enforce = effects_.events_named("enforce");
    ASSERT_EQ(enforce.size(), 1u);
    EXPECT_EQ(enforce[0]["error"], "simulated failure");
    EXPECT_EQ(enforce[0]["growing"], true);
    EXPECT_TRUE(nm().steady("a"));
}

TEST_F(NodeManagerTest, ProgressIsReported) {
    ok(nm().register_job(spec("a", 1, 4), at(0us)));
    nm().progress("a", 1000, 10, at(1ms));
    nm().progress("zz", 1, 1, at(1ms));  // unknown job: ignored
    auto status = nm().status();
    EXPECT_EQ(status["jobs"][0]["work_units"], 1000);
    EXPECT_EQ(status["jobs"][0]["steps"], 10);
    EXPECT_EQ(status["jobs"][0]["last_ack_latency_us"], -1.0);
    EXPECT_EQ(status["ack_timeout_ms"], 2000);
    refused(MALL_ERR_NOJOB, [&] { return nm().attach("zz", 1); });
}

TEST_F(NodeManagerTest, AdoptInstallsAsIsWithoutEffects) {
    Job a;
    a.spec = spec("a", 1, 4);
    a.order = 5;
    a.cpuset = cpus("0-1");
    a.published = cpus("0-1");
    a.generation = 7;
    ok(nm().adopt(a));
    Job b;
    b.spec = spec("b", 1, 4);
    b.order = 6;
    b.cpuset = cpus("2-3");
    b.published = cpus("3");
    b.generation = 3;
    b.awaiting_ack = true;
    b.ack_deadline = at(5s);
    ok(nm().adopt(b));
    EXPECT_TRUE(effects_.take().empty());
    EXPECT_TRUE(effects_.events.empty());
    EXPECT_EQ(job("a").generation, 7u);
    EXPECT_EQ(nm().status()["jobs"][1]["cpuset"], "2-3");

    Job dup = a;
    refused(MALL_ERR_INVAL, [&] { return nm().adopt(dup); }, "already");
    Job overlapping;
    overlapping.spec = spec("c", 1, 4);
    overlapping.cpuset = cpus("1");
    overlapping.published = cpus("1");
    refused(MALL_ERR_INVAL, [&] { return nm().adopt(overlapping); }, "holds");
    Job outside;
    outside.spec = spec("c", 1, 4);
    outside.cpuset = cpus("9");
    outside.published = cpus("9");
    refused(MALL_ERR_INVAL, [&] { return nm().adopt(outside); }, "pool");

    // b has no attachment left, so the next tick finishes its shrink; a keeps its cpus.
    nm().tick(at(1s));
    check();
    EXPECT_EQ(effects_.take(), (Calls{"enforce b 3 shrink"}));
    EXPECT_EQ(job("a").published.to_string(), "0-1");
    // A later registration orders after adopted jobs and replans everyone.
    ok(nm().register_job(spec("c", 1, 4), at(2s)));
    EXPECT_GT(job("c").order, 6u);
    EXPECT_EQ(job("c").published.to_string(), "2");
}

TEST_F(NodeManagerTest, RandomOperationsKeepTheInvariant) {
    make("pack:2 core:4 pu:2", "0-13");
    std::mt19937 rng(12345);
    auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
    std::vector<std::string> names;
    uint64_t next_attach = 1;
    std::map<std::string, std::vector<uint64_t>> attachments;
    auto now = t0_;
    int next_name = 0;
    for (int op = 0; op < 500; ++op) {
        now += std::chrono::microseconds(1 + pick(300000));
        const std::string some = names.empty() ? "none" : names[pick(static_cast<int>(names.size()))];
        switch (pick(11)) {
            case 0:
            case 1: {
                if (names.size() >= 5) break;
                const std::string id = "job" + std::to_string(next_name++);
                const int min = 1 + pick(3);
                Outcome o = nm().register_job(spec(id, min, min + pick(10)), now);
                if (o.ok) names.push_back(id);
                if (o.ok && pick(2) == 0) {  // its process attaches at once
                    nm().attach(id, next_attach);
                    attachments[id].push_back(next_attach++);
                }
                break;
            }
            case 2:
                if (!names.empty()) {
                    nm().deregister_job(some, now);
                    names.erase(std::find(names.begin(), names.end(), some));
                    attachments.erase(some);
                }
                break;
            case 3:
                if (!names.empty()) {
                    nm().attach(some, next_attach);
                    attachments[some].push_back(next_attach++);
                }
                break;
            case 4:
            case 5:
                if (!names.empty()) {  // processes of a job ack at their next step
                    for (auto id : attachments[some]) nm().ack(some, id, job(some).generation, now);
                }
                break;
            case 6:
                if (!names.empty() && !attachments[some].empty()) {
                    nm().detach(some, attachments[some].back(), now);
                    attachments[some].pop_back();
                }
                break;
            case 7: nm().tick(now); break;
            case 8: {
                CpuSet set;
                set.add(pick(14));
                if (pick(2) == 0) {
                    nm().reclaim(set, now);
                } else {
                    nm().release(set, now);
                }
                break;
            }
            case 9:
                if (!names.empty()) {
                    if (pick(2) == 0) {
                        nm().set_cpus(some, std::nullopt, now);
                    } else {
                        CpuSet set;
                        const int first = pick(14);
                        const int n = 1 + pick(4);
                        for (int c = first; c < first + n && c < 14; ++c) set.add(c);
                        nm().set_cpus(some, set, now);
                    }
                }
                break;
            case 10: nm().set_policy(pick(2) == 0 ? "equal" : "static", now); break;
        }
        check();
        if (HasFailure()) FAIL() << "invariant broken at operation " << op;
    }
    // The sequence exercised the protocol rather than refusing everything.
    std::map<std::string, int> seen;
    for (const auto &ev : effects_.events) seen[ev["event"].get<std::string>()]++;
    EXPECT_GT(seen["publish"], 80);
    EXPECT_GT(seen["ack"], 10);
    EXPECT_GT(seen["ack_timeout"], 0);
    EXPECT_GT(seen["reclaim"], 0);
    EXPECT_GT(seen["pin"], 0);
    EXPECT_GT(seen["end"], 0);
    // Once every process acks (or times out), every job reaches its target.
    for (int round = 0; round < 50; ++round) {
        now += 3s;
        for (const auto &[id, ids] : attachments) {
            for (auto a : ids) nm().ack(id, a, job(id).generation, now);
        }
        nm().tick(now);
        check();
    }
    const nlohmann::json final_status = nm().status();
    for (const auto &entry : final_status["jobs"]) {
        EXPECT_EQ(entry["state"], "settled") << entry.dump();
        EXPECT_EQ(entry["cpus"], entry["target"]) << entry.dump();
    }
}

// Regression (integration test AdminSwapNeverPublishesNoCpusNorOverlaps): swapping the cpus of
// two single-cpu jobs can only go through an empty allocation or an overlap, so the pin is refused
// and nothing is published; a reachable pin still works.
TEST_F(NodeManagerTest, UnreachableSwapIsRefusedAndNothingEmptyIsPublished) {
    make("pack:1 core:2 pu:1", "0-1");
    ok(nm().register_job(spec("a", 1, 1), at(0us)));
    ok(nm().register_job(spec("b", 1, 1), at(0us)));
    ASSERT_EQ(job("a").published.to_string(), "0");
    ASSERT_EQ(job("b").published.to_string(), "1");
    refused(MALL_ERR_INVAL, [&] { return nm().set_cpus("a", cpus("1"), at(0us)); }, "only cpus");
    for (const auto &ev : effects_.events_named("publish")) EXPECT_NE(ev["ncpus"], 0) << ev.dump();
    ok(nm().set_cpus("a", cpus("0"), at(0us)));  // already there: fine
}

// Regression: a cgroup write that fails while narrowing must not free the cpus for another job
// (the kernel still lets the job run there); the write is retried after a second.
TEST_F(NodeManagerTest, FailedNarrowingKeepsCpusHeldAndRetries) {
    make("pack:1 core:2 pu:1", "0-1");
    ok(nm().register_job(spec("a", 1, 2), at(0us)));
    ASSERT_EQ(job("a").published.to_string(), "0-1");
    effects_.fail_enforce = true;
    ok(nm().register_job(spec("b", 1, 2), at(0us)));  // a has no attachment: shrinks at once
    EXPECT_EQ(job("a").published.to_string(), "0");
    EXPECT_EQ(job("a").cpuset.to_string(), "0-1");   // still held
    EXPECT_TRUE(job("b").published.empty());          // so b waits
    ASSERT_TRUE(nm().next_deadline().has_value());
    EXPECT_EQ(*nm().next_deadline(), at(1s));
    effects_.fail_enforce = false;
    nm().tick(at(1s));
    check();
    EXPECT_EQ(job("a").cpuset.to_string(), "0");
    EXPECT_EQ(job("b").published.to_string(), "1");
    EXPECT_FALSE(nm().next_deadline().has_value());
}

// Regression (review, case A): a reclaim that the pool can only honour by leaving a job with no
// cpus used to be accepted and then stall (the job kept the cpu, the reclaim never completed).
// Guaranteed cpus count toward what the pool must hold.
TEST_F(NodeManagerTest, ReclaimThatWouldStarveAJobIsRefused) {
    ok(nm().register_job(spec("x", 1, 2, "0-1"), at(0us)));
    ok(nm().register_job(spec("y", 1, 1), at(0us)));
    ok(nm().register_job(spec("z", 1, 1), at(0us)));
    refused(MALL_ERR_INVAL, [&] { return nm().reclaim(cpus("3"), at(0us)); }, "below its minimum");
    ok(nm().set_cpus("z", std::nullopt, at(0us)));
}

// Regression (review, case B): a new job whose guaranteed cpu is held by a single-cpu job while
// the rest of the pool is full could only be placed through a deadlock; it is refused up front.
TEST_F(NodeManagerTest, RegistrationThatCannotBePlacedIsRefused) {
    make("pack:1 core:2 pu:1", "0-1");
    ok(nm().register_job(spec("a", 1, 1), at(0us)));
    ok(nm().register_job(spec("b", 1, 1), at(0us)));
    refused(MALL_ERR_INVAL, [&] { return nm().register_job(spec("c", 1, 1, "0"), at(0us)); },
            "registering job \"c\"");
    EXPECT_EQ(nm().find("c"), nullptr);
    // The order counter was not consumed: a later job still registers normally.
    ok(nm().deregister_job("b", at(0us)));
    ok(nm().register_job(spec("c", 1, 1), at(0us)));
    EXPECT_EQ(job("c").published.count(), 1);
}

// The Slurm model: a prolog reclaims a new job's cpus for its owner; borrowers shrink; when the
// job registers with them as guaranteed cpus they are its own; further tasks join; the epilog
// releases the owner, ending the job if its task exits were missed, and the cpus are lent again.
TEST_F(NodeManagerTest, ReclaimForOwnerThenRegisterJoinAndRelease) {
    ok(nm().register_job(spec("borrower", 1, 4), at(0us)));
    ASSERT_EQ(job("borrower").published.to_string(), "0-3");
    ok(nm().reclaim(cpus("2-3"), at(0us), "slurm-7"));
    EXPECT_EQ(job("borrower").published.to_string(), "0-1");
    EXPECT_FALSE(nm().holds_any(cpus("2-3")));
    EXPECT_EQ(nm().status()["reserved"]["slurm-7"], "2-3");
    // Someone else may not take reserved cpus as guaranteed ones.
    refused(MALL_ERR_INVAL, [&] { return nm().register_job(spec("other", 1, 2, "2"), at(0us)); },
            "reserved for \"slurm-7\"");
    ok(nm().register_job(spec("slurm-7", 2, 4, "2-3", {200}), at(0us)));
    EXPECT_EQ(job("slurm-7").published.to_string(), "2-3");
    refused(MALL_ERR_INVAL, [&] { return nm().add_pids("slurm-7", 1001, {201}, at(0us)); }, "uid");
    ok(nm().add_pids("slurm-7", 1000, {201}, at(0us)));
    // A later step of the same Slurm job reclaims its own cpus again: accepted, and only other
    // jobs count as holders (so the deferred reply comes at once).
    ok(nm().reclaim(cpus("2-3"), at(0us), "slurm-7"));
    EXPECT_FALSE(nm().holds_any(cpus("2-3"), "slurm-7"));
    EXPECT_TRUE(nm().holds_any(cpus("2-3")));
    EXPECT_EQ(job("slurm-7").spec.pids.size(), 2u);
    CpuSet released;
    ok(nm().release_owner("slurm-7", at(0us), &released));
    EXPECT_EQ(released.to_string(), "2-3");
    EXPECT_EQ(nm().find("slurm-7"), nullptr);
    EXPECT_EQ(job("borrower").published.to_string(), "0-3");
    EXPECT_TRUE(nm().status()["reserved"].empty());
    const size_t events_before = effects_.events.size();
    ok(nm().release_owner("slurm-unknown", at(0us), &released));  // an epilog without a prolog
    EXPECT_TRUE(released.empty());
    EXPECT_EQ(effects_.events.size(), events_before);  // nothing released, nothing reported
}

// mall_set_usage: a job that uses fewer cpus than it holds is planned with that max, so the surplus
// (above its min) becomes free and is lent; raising or clearing the cap gives it back.
TEST_F(NodeManagerTest, UsageCapLendsTheSurplusAndRaisingItTakesItBack) {
    ok(nm().register_job(spec("a", 2, 4), at(0us)));
    ASSERT_TRUE(nm().steady("a"));
    EXPECT_EQ(job("a").published.count(), 4);

    ok(nm().set_usage("a", 3, at(10us)));  // no attachment: the shrink needs no ack
    EXPECT_EQ(job("a").published.count(), 3);
    EXPECT_EQ(nm().free_cpus().count(), 1);
    EXPECT_EQ(nm().status()["jobs"][0]["usage_cap"], 3);
    EXPECT_EQ(nm().status()["jobs"][0]["planned_max"], 3);
    ASSERT_EQ(effects_.events_named("usage").size(), 1u);
    EXPECT_EQ(effects_.events_named("usage")[0]["cpus_used"], 3);

    ok(nm().set_usage("a", 1, at(20us)));  // below its min of 2: planned with its min
    EXPECT_EQ(job("a").published.count(), 2);
    EXPECT_EQ(nm().status()["jobs"][0]["planned_max"], 2);

    ok(nm().register_job(spec("b", 1, 4, "", {200}), at(30us)));  // the surplus goes to b
    EXPECT_EQ(job("a").published.count(), 2);
    EXPECT_EQ(job("b").published.count(), 2);

    ok(nm().set_usage("a", 0, at(40us)));  // no cap: equal shares again (2 and 2: no change)
    EXPECT_EQ(job("a").published.count(), 2);
    ok(nm().deregister_job("b", at(50us)));
    EXPECT_EQ(job("a").published.count(), 4) << "without b and without a cap, a takes the pool back";

    refused(MALL_ERR_NOJOB, [&] { return nm().set_usage("nobody", 1, at(60us)); });
    refused(MALL_ERR_INVAL, [&] { return nm().set_usage("a", -1, at(60us)); });
}

// A capped job waits for its processes to ack the smaller allocation before the cpus are lent.
TEST_F(NodeManagerTest, UsageCapShrinkIsTwoPhase) {
    ok(nm().register_job(spec("a", 1, 4), at(0us)));
    ok(nm().attach("a", 7));
    nm().ack("a", 7, job("a").generation, at(1us));
    effects_.take();
    ok(nm().set_usage("a", 1, at(10us)));
    EXPECT_TRUE(job("a").awaiting_ack);
    EXPECT_EQ(job("a").cpuset.count(), 4) << "still enforced wide until the ack";
    EXPECT_TRUE(nm().free_cpus().empty());
    nm().ack("a", 7, job("a").generation, at(20us));
    check();
    EXPECT_EQ(job("a").cpuset.count(), 1);
    EXPECT_EQ(nm().free_cpus().count(), 3);
}

// set_weight: under the weighted policy the pool follows the new weights at once; bad weights and
// unknown jobs are refused and change nothing.
TEST_F(NodeManagerTest, WeightChangesReplanUnderTheWeightedPolicy) {
    make("pack:1 core:8 pu:1", "0-7", PolicyKind::Weighted);
    ok(nm().register_job(spec("a", 1, 8), at(0us)));
    ok(nm().register_job(spec("b", 1, 8, "", {200}), at(0us)));
    EXPECT_EQ(job("a").published.count(), 4);
    EXPECT_EQ(job("b").published.count(), 4);
    ok(nm().set_weight("a", 3.0, at(10us)));  // no attachments: moves need no ack
    EXPECT_EQ(job("a").published.count(), 6);
    EXPECT_EQ(job("b").published.count(), 2);
    EXPECT_EQ(nm().status()["jobs"][0]["weight"], 3.0);
    ASSERT_EQ(effects_.events_named("weight").size(), 1u);
    refused(MALL_ERR_INVAL, [&] { return nm().set_weight("a", 0.0, at(20us)); });
    refused(MALL_ERR_INVAL, [&] { return nm().set_weight("a", -1.0, at(20us)); });
    refused(MALL_ERR_INVAL, [&] { return nm().set_weight("a", std::nan(""), at(20us)); });
    refused(MALL_ERR_NOJOB, [&] { return nm().set_weight("c", 2.0, at(20us)); });
}

// The throughput policy inside the manager: progress reports become rate samples at the jobs'
// core counts, periodic replans move cores to the job that scales, dwell and damping stop it from
// moving cores back and forth. A fake clock drives 90 s of two jobs reporting every 500 ms.
TEST_F(NodeManagerTest, ThroughputPolicyLearnsFromProgressAndSettles) {
    make("pack:1 core:8 pu:1", "0-7", PolicyKind::Throughput);
    ok(nm().register_job(spec("scales", 1, 8), at(0us)));
    ok(nm().register_job(spec("flat", 1, 8, "", {200}), at(0us)));
    auto rate = [](const std::string &id, int cpus) {  // work units per second at `cpus`
        return id == "scales" ? 100.0 * cpus : 100.0 * std::min(cpus, 2);
    };
    std::map<std::string, double> units{{"scales", 0}, {"flat", 0}};
    std::vector<std::pair<int, int>> history;  // (scales, flat) cpus every second
    for (int tick = 1; tick <= 180; ++tick) {
        const TimePoint now = at(std::chrono::milliseconds(500) * tick);
        for (auto &[id, total] : units) {
            total += rate(id, job(id).published.count()) * 0.5;
            nm().progress(id, static_cast<uint64_t>(total), static_cast<uint64_t>(tick), now);
        }
        nm().tick(now);
        check();
        if (tick % 2 == 0) history.push_back({job("scales").published.count(), job("flat").published.count()});
        if (std::getenv("MALL_TEST_TRACE") && tick % 2 == 0) std::printf("t=%d scales %d flat %d\n", tick / 2, job("scales").published.count(), job("flat").published.count());
    }
    const auto [scales, flat] = history.back();
    EXPECT_EQ(scales + flat, 8);
    EXPECT_GE(scales, 6) << "the job that scales should hold most cores";
    EXPECT_LE(flat, 2) << "cores beyond 2 add nothing to the flat job";
    for (size_t i = history.size() - 30; i < history.size(); ++i)
        EXPECT_EQ(history[i], history.back()) << "cores still moving at second " << i;
    auto status = nm().status();
    EXPECT_EQ(status["policy"], "throughput");
    EXPECT_TRUE(status["jobs"][0].contains("speedup")) << status.dump(1);
}

// Regression (issue 11, one meaning of "settled"): steady (no move under way, at least one cpu:
// what rate samples and the deferred Register reply need) and settled (steady at its target:
// `mallctl status`) are two notions. A job can run steadily on part of its target while another
// job's ack is awaited; it is steady there, and still "changing".
TEST_F(NodeManagerTest, SteadyShortOfItsTargetIsStillChanging) {
    make("pack:1 core:6 pu:1", "0-5");
    ok(nm().register_job(spec("a", 1, 4), at(0us)));
    ok(nm().attach("a", 1));
    ok(nm().register_job(spec("b", 1, 6, "", {200}), at(10us)));
    EXPECT_EQ(job("a").published.to_string(), "0-2");
    EXPECT_EQ(job("b").published.to_string(), "4-5");
    EXPECT_FALSE(nm().steady("a"));  // its ack is awaited
    EXPECT_TRUE(nm().steady("b"));   // it runs on 4-5 ...
    auto status = nm().status();
    EXPECT_EQ(status["jobs"][1]["target"], "3-5");  // ... short of its target
    EXPECT_EQ(status["jobs"][1]["state"], "changing");

    nm().ack("a", 1, 2, at(20us));
    check();
    EXPECT_EQ(job("b").published.to_string(), "3-5");
    status = nm().status();
    EXPECT_EQ(status["jobs"][0]["state"], "settled");
    EXPECT_EQ(status["jobs"][1]["state"], "settled");
}

// The core reads no wall clock (issue 11): an event's "time" is what Effects::event_time() gives;
// without one the event goes out without "time", for Effects::event() to stamp (malld's server
// stamps the moment it delivers it).
TEST(NodeManagerEvents, TheirTimeComesFromTheEffects) {
    test::EventLogEffects effects;
    effects.wall_time = 1234.5;
    std::string error;
    auto topology = Topology::load("pack:1 core:2 pu:1", &error);
    ASSERT_NE(topology, nullptr) << error;
    NodeManager manager(*topology, cpus("0-1"), PolicyKind::Equal, 2000ms, effects);
    const TimePoint t0 = TimePoint{} + 1000s;
    JobSpec spec;
    spec.id = "a";
    spec.pids = {100};
    ASSERT_TRUE(manager.register_job(spec, t0).ok);
    ASSERT_FALSE(effects.events.empty());
    for (const auto &ev : effects.events) EXPECT_EQ(ev.value("time", 0.0), 1234.5) << ev.dump();

    effects.events.clear();
    effects.wall_time.reset();
    ASSERT_TRUE(manager.deregister_job("a", t0 + 1s).ok);
    ASSERT_FALSE(effects.events.empty());
    for (const auto &ev : effects.events) EXPECT_FALSE(ev.contains("time")) << ev.dump();
}

// mallctl set --threads: the job keeps its cpus, a new generation carries the count and is acked
// like any change (no enforcement); a shrink below the count lowers it; auto goes back to one
// thread per cpu; bad values, counts above the cpus held and unknown jobs change nothing.
TEST_F(NodeManagerTest, ThreadCountIsPublishedWithTheSameCpusAndAcked) {
    ok(nm().register_job(spec("a", 1, 4), at(0us)));
    ok(nm().attach("a", 1));
    nm().ack("a", 1, 1, at(5us));
    effects_.take();

    ok(nm().set_threads("a", 2, at(10us)));
    EXPECT_EQ(effects_.take(), (Calls{"publish a 2 0-3 threads 2"}));  // no enforce: same cpus
    EXPECT_EQ(job("a").cpuset.to_string(), "0-3");
    EXPECT_EQ(nm().status()["jobs"][0]["state"], "changing");  // until the ack
    EXPECT_EQ(nm().status()["jobs"][0]["threads"], 2);
    EXPECT_EQ(nm().status()["jobs"][0]["active_threads"], 2);
    auto pub = effects_.events_named("publish");
    ASSERT_FALSE(pub.empty());
    EXPECT_EQ(pub.back()["threads"], 2);
    EXPECT_EQ(effects_.events_named("threads").back()["threads"], 2);
    nm().ack("a", 1, 2, at(20us));
    check();
    EXPECT_TRUE(effects_.take().empty());
    EXPECT_EQ(nm().status()["jobs"][0]["state"], "settled");
    EXPECT_EQ(job("a").transitions, 1u);  // a thread change is not a cpu transition

    ok(nm().set_threads("a", 2, at(25us)));  // the same count: nothing to publish
    EXPECT_TRUE(effects_.take().empty());

    // A second job halves a's cpus: the count (2) still fits and is published with the step.
    ok(nm().register_job(spec("b", 1, 4, "", {200}), at(30us)));
    EXPECT_EQ(effects_.take(), (Calls{"publish a 3 0-1"}));  // 2 threads on 2 cpus: one per cpu
    nm().ack("a", 1, 3, at(40us));
    check();
    effects_.take();
    EXPECT_EQ(nm().status()["jobs"][0]["active_threads"], 2);

    ok(nm().set_threads("a", 1, at(50us)));
    EXPECT_EQ(effects_.take(), (Calls{"publish a 4 0-1 threads 1"}));
    nm().ack("a", 1, 4, at(60us));
    // b leaves: a grows back to 0-3 and keeps running 1 thread.
    ok(nm().deregister_job("b", at(70us)));
    auto calls = effects_.take();
    ASSERT_FALSE(calls.empty());
    EXPECT_EQ(calls.back(), "publish a 5 0-3 threads 1");
    nm().ack("a", 1, 5, at(80us));

    ok(nm().set_threads("a", 0, at(90us)));  // auto
    EXPECT_EQ(effects_.take(), (Calls{"publish a 6 0-3"}));
    EXPECT_EQ(nm().status()["jobs"][0]["threads"], 0);
    EXPECT_EQ(nm().status()["jobs"][0]["active_threads"], 4);
}

TEST_F(NodeManagerTest, BadThreadCountsChangeNothing) {
    ok(nm().register_job(spec("a", 1, 4), at(0us)));
    ok(nm().register_job(spec("b", 1, 4, "", {200}), at(0us)));  // no attachments: 0-1 and 2-3 at once
    effects_.take();
    refused(MALL_ERR_INVAL, [&] { return nm().set_threads("a", 3, at(10us)); }, "holds 2 cpus (0-1)");
    refused(MALL_ERR_INVAL, [&] { return nm().set_threads("a", -1, at(10us)); }, "threads must be 1 to");
    refused(MALL_ERR_INVAL, [&] { return nm().set_threads("a", 5000, at(10us)); }, "threads must be 1 to");
    refused(MALL_ERR_NOJOB, [&] { return nm().set_threads("nobody", 1, at(10us)); });
}

// Rate samples measure cpus: a job running fewer threads than cpus gives none.
TEST_F(NodeManagerTest, NoRateSamplesWhileRunningFewerThreadsThanCpus) {
    ok(nm().register_job(spec("a", 1, 4), at(0us)));
    ok(nm().set_threads("a", 1, at(1us)));
    for (int i = 1; i <= 20; ++i) nm().progress("a", 1000u * i, 10u * i, at(std::chrono::seconds(i)));
    EXPECT_TRUE(job("a").rate_samples.empty());
    ok(nm().set_threads("a", 0, at(std::chrono::seconds(21))));
    for (int i = 22; i <= 40; ++i) nm().progress("a", 1000u * i, 10u * i, at(std::chrono::seconds(i)));
    EXPECT_FALSE(job("a").rate_samples.empty());
}

// mallctl set --signal-control: the job keeps its cpus and thread count, a new generation carries
// the flag and is acked like any change (no enforcement); every later publication carries it
// (a cpu change, a thread count) until it is turned off, which republishes without it; the same
// value again publishes nothing; a toggle during a move waits for the move's ack.
TEST_F(NodeManagerTest, SignalControlIsPublishedWithTheSameCpusAndAcked) {
    ok(nm().register_job(spec("a", 1, 4), at(0us)));
    ok(nm().attach("a", 1));
    nm().ack("a", 1, 1, at(5us));
    effects_.take();
    EXPECT_EQ(nm().status()["jobs"][0]["signal_control"], false);  // off by default

    ok(nm().set_signal_control("a", true, at(10us)));
    EXPECT_EQ(effects_.take(), (Calls{"publish a 2 0-3 signals"}));  // no enforce: same cpus
    EXPECT_EQ(job("a").cpuset.to_string(), "0-3");
    EXPECT_TRUE(job("a").signal_control);
    EXPECT_TRUE(job("a").published_signal_control);
    EXPECT_EQ(nm().status()["jobs"][0]["signal_control"], true);
    EXPECT_EQ(nm().status()["jobs"][0]["state"], "changing");  // until the ack
    EXPECT_EQ(nm().status()["jobs"][0]["acked_generation"], 1);
    auto pub = effects_.events_named("publish");
    ASSERT_FALSE(pub.empty());
    EXPECT_EQ(pub.back()["signal_control"], true);
    EXPECT_EQ(pub.back()["cpus"], "0-3");
    ASSERT_FALSE(effects_.events_named("signal_control").empty());
    EXPECT_EQ(effects_.events_named("signal_control").back()["signal_control"], true);
    nm().ack("a", 1, 2, at(20us));
    check();
    EXPECT_TRUE(effects_.take().empty());
    EXPECT_EQ(nm().status()["jobs"][0]["state"], "settled");
    EXPECT_EQ(job("a").transitions, 1u);  // the first allocation only: a flag change is no cpu transition

    ok(nm().set_signal_control("a", true, at(25us)));  // the same value: nothing to publish
    EXPECT_TRUE(effects_.take().empty());

    // A second job halves a's cpus: the shrink carries the flag.
    ok(nm().register_job(spec("b", 1, 4, "", {200}), at(30us)));
    EXPECT_EQ(effects_.take(), (Calls{"publish a 3 0-1 signals"}));
    // Turned off while the shrink awaits its ack: published only after it.
    ok(nm().set_signal_control("a", false, at(35us)));
    EXPECT_TRUE(effects_.take().empty());
    EXPECT_FALSE(job("a").signal_control);
    EXPECT_TRUE(job("a").published_signal_control);  // the page still says so
    nm().ack("a", 1, 3, at(40us));
    check();
    auto calls = effects_.take();
    ASSERT_FALSE(calls.empty());
    EXPECT_EQ(calls.front(), "enforce a 0-1 shrink");
    EXPECT_NE(std::find(calls.begin(), calls.end(), "publish a 4 0-1"), calls.end()) << ::testing::PrintToString(calls);
    EXPECT_FALSE(job("a").published_signal_control);
    nm().ack("a", 1, 4, at(50us));
    effects_.take();

    // On again, with a thread count: both ride on every publication, and a growth keeps them.
    ok(nm().set_signal_control("a", true, at(60us)));
    EXPECT_EQ(effects_.take(), (Calls{"publish a 5 0-1 signals"}));
    nm().ack("a", 1, 5, at(65us));
    ok(nm().set_threads("a", 1, at(70us)));
    EXPECT_EQ(effects_.take(), (Calls{"publish a 6 0-1 threads 1 signals"}));
    nm().ack("a", 1, 6, at(75us));
    ok(nm().deregister_job("b", at(80us)));
    calls = effects_.take();
    ASSERT_FALSE(calls.empty());
    EXPECT_EQ(calls.back(), "publish a 7 0-3 threads 1 signals");
    nm().ack("a", 1, 7, at(90us));
    check();

    ok(nm().set_signal_control("a", false, at(100us)));
    EXPECT_EQ(effects_.take(), (Calls{"publish a 8 0-3 threads 1"}));
    EXPECT_EQ(nm().status()["jobs"][0]["signal_control"], false);
    EXPECT_FALSE(effects_.events_named("publish").back().contains("signal_control"));
}

// A job with no process attached has nothing to wait for; an unknown job is refused and nothing
// changes.
TEST_F(NodeManagerTest, SignalControlWithoutAttachmentsAndForUnknownJobs) {
    ok(nm().register_job(spec("a", 1, 4), at(0us)));
    effects_.take();
    ok(nm().set_signal_control("a", true, at(10us)));
    EXPECT_EQ(effects_.take(), (Calls{"publish a 2 0-3 signals"}));
    EXPECT_EQ(nm().status()["jobs"][0]["state"], "settled");  // nobody to ack
    refused(MALL_ERR_NOJOB, [&] { return nm().set_signal_control("nobody", true, at(20us)); }, "nobody");
    refused(MALL_ERR_NOJOB, [&] { return nm().set_signal_control("nobody", false, at(20us)); });
    EXPECT_TRUE(job("a").signal_control);
    EXPECT_EQ(job("a").generation, 2u);
}
