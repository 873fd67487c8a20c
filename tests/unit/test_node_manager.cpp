// SPDX-License-Identifier: BSD-3-Clause
// Proves the two-phase protocol (shrink, ack or timeout, grow) and that bad requests change nothing;
// the steering (usage caps, weights, the throughput policy, thread counts, signal control) is in
// test_node_manager_steering.cpp (shared fixture: node_manager_test_support.hpp).

#include "node_manager_test_support.hpp"

using namespace mall;
using namespace std::chrono_literals;
using namespace mall::test::node_manager;

namespace {
MALL_TEST_WATCHDOG(60);
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
