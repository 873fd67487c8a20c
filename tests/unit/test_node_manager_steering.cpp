// SPDX-License-Identifier: BSD-3-Clause
// Proves the NodeManager's steering on top of the two-phase protocol: usage caps lend the surplus
// and take it back in two phases, weights and the throughput policy replan, events take their time
// from the effects, thread counts and signal control are published with the same cpus and acked,
// and bad values change nothing.

#include "node_manager_test_support.hpp"

using namespace mall;
using namespace std::chrono_literals;
using namespace mall::test::node_manager;

namespace {
MALL_TEST_WATCHDOG(60);
}  // namespace

// mall_set_usage: a job that uses fewer cpus than it holds is planned with that max, so the surplus
// (above its min) becomes free and is lent; raising or clearing the cap gives it back.
TEST_F(NodeManagerTest, UsageCapLendsTheSurplusAndRaisingItTakesItBack) {
    ok(nm().register_job(spec("a", 2, 4), at(0us)));
    ASSERT_TRUE(nm().steady("a"));
    EXPECT_EQ(job("a").published.count(), 4);

    ok(nm().set_usage("a", 3, at(1s)));  // no attachment: the shrink needs no ack
    // (each change comes kUsageInterval after the one before: sooner ones wait, see below)
    EXPECT_EQ(job("a").published.count(), 3);
    EXPECT_EQ(nm().free_cpus().count(), 1);
    EXPECT_EQ(nm().status()["jobs"][0]["usage_cap"], 3);
    EXPECT_EQ(nm().status()["jobs"][0]["planned_max"], 3);
    ASSERT_EQ(effects_.events_named("usage").size(), 1u);
    EXPECT_EQ(effects_.events_named("usage")[0]["cpus_used"], 3);

    ok(nm().set_usage("a", 1, at(2s)));  // below its min of 2: planned with its min
    EXPECT_EQ(job("a").published.count(), 2);
    EXPECT_EQ(nm().status()["jobs"][0]["planned_max"], 2);

    ok(nm().register_job(spec("b", 1, 4, "", {200}), at(3s)));  // the surplus goes to b
    EXPECT_EQ(job("a").published.count(), 2);
    EXPECT_EQ(job("b").published.count(), 2);

    ok(nm().set_usage("a", 0, at(4s)));  // no cap: equal shares again (2 and 2: no change)
    EXPECT_EQ(job("a").published.count(), 2);
    ok(nm().deregister_job("b", at(5s)));
    EXPECT_EQ(job("a").published.count(), 4) << "without b and without a cap, a takes the pool back";

    refused(MALL_ERR_NOJOB, [&] { return nm().set_usage("nobody", 1, at(6s)); });
    refused(MALL_ERR_INVAL, [&] { return nm().set_usage("a", -1, at(6s)); });
}

// Usage changes are coalesced (issue 37.9): within kUsageInterval of the last change a report is
// only noted; tick() applies the latest one when its time comes, so a job that reports a thousand
// times a second costs one replan, one event and one broadcast a second.
TEST_F(NodeManagerTest, UsageReportsWithinAnIntervalAreCoalescedAndTheLatestWins) {
    ok(nm().register_job(spec("a", 1, 4), at(0us)));
    ok(nm().set_usage("a", 3, at(1s)));
    EXPECT_EQ(job("a").published.count(), 3);
    for (int i = 0; i < 100; ++i)  // a flood within the interval: noted, not applied
        ok(nm().set_usage("a", 1 + i % 2, at(1s + std::chrono::milliseconds(1 + i))));
    ok(nm().set_usage("a", 2, at(1s + 500ms)));
    EXPECT_EQ(job("a").published.count(), 3) << "a report within the interval must wait";
    EXPECT_EQ(effects_.events_named("usage").size(), 1u);
    ASSERT_TRUE(nm().next_deadline().has_value());
    EXPECT_LE(*nm().next_deadline(), at(2s)) << "malld must wake when the waiting report is due";
    nm().tick(at(2s));
    EXPECT_EQ(job("a").published.count(), 2) << "the latest report applies when due";
    EXPECT_EQ(effects_.events_named("usage").size(), 2u);
    EXPECT_EQ(effects_.events_named("usage")[1]["cpus_used"], 2);
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
