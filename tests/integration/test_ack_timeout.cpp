// SPDX-License-Identifier: BSD-3-Clause
// Proves that a process that never acks cannot hold cpus hostage: after the ack timeout malld
// narrows its cgroup anyway, counts the timeout, and gives the cpu to the job that needs it.
#include <filesystem>

#include <gtest/gtest.h>

#include "support/malld_fixture.hpp"

MALL_TEST_WATCHDOG(240);

namespace mall::test {
namespace {

using nlohmann::json;

TEST(AckTimeout, NonSteppingProcessIsEnforcedAfterTheTimeout) {
    MALL_REQUIRE_ROOT_AND_CPUSET();
    MalldOptions options;
    options.ack_timeout_ms = 300;
    PrivateMalld malld(options);
    std::string error;
    ASSERT_TRUE(malld.start(&error)) << error;
    EventRecorder events;
    ASSERT_TRUE(events.start(malld.socket(), &error)) << error;

    // The stubborn job: attached (mall_open succeeds) but never calls mall_step, so never acks.
    Child stubborn(mallrun_argv(malld.socket(), "1:2", "stubborn",
                                test_client_argv({"--no-step", "--threads", "2"})));
    auto open_line = stubborn.wait_for_line_starting("open ", 20s);
    ASSERT_TRUE(open_line) << "mall_test_client printed nothing";
    EXPECT_EQ(*open_line, "open rc=0 job=stubborn");
    ASSERT_TRUE(wait_until(
        [&] {
            auto j = job_status(malld.socket(), "stubborn");
            return j && j->value("attached", 0) == 1 && j->value("cpuset", "") == "0-1";
        },
        20s))
        << status_text(malld);

    // A well-behaved job arrives and needs one of the stubborn job's cpus.
    Child polite(mallrun_argv(malld.socket(), "1:2", "polite", test_client_argv({"--step-us", "1000"})));
    ASSERT_TRUE(wait_until(
        [&] {
            auto s = status_json(malld.socket());
            if (!s) return false;
            auto st = find_job(*s, "stubborn"), po = find_job(*s, "polite");
            return st && po && st->value("cpuset", "") != "0-1" && st->value("ncpus", 0) == 1 &&
                   job_settled_on(malld.socket(), "polite", po->value("cpus", "?"), 1);
        },
        20s))
        << status_text(malld);

    auto status = status_json(malld.socket());
    ASSERT_TRUE(status);
    auto st = find_job(*status, "stubborn");
    auto po = find_job(*status, "polite");
    ASSERT_TRUE(st && po);
    const std::string stubborn_cpus = st->value("cpuset", "");
    const std::string polite_cpus = po->value("cpus", "");
    EXPECT_GE(st->value("ack_timeouts", 0), 1) << st->dump();
    EXPECT_LT(st->value("acked_generation", 0ull), st->value("generation", 0ull))
        << "the stubborn job never acked, its acked generation must lag: " << st->dump();
    EXPECT_EQ(st->value("ncpus", 0), 1);
    EXPECT_EQ(stubborn_cpus, st->value("cpus", "")) << "enforced must equal published once timed out";
    EXPECT_EQ(po->value("ncpus", 0), 1);
    ASSERT_FALSE(polite_cpus.empty());
    EXPECT_NE(stubborn_cpus, polite_cpus);

    // The kernel agrees: the stubborn job's cgroup and every one of its threads are narrowed
    // without its cooperation; the polite job's cgroup holds the other cpu.
    EXPECT_EQ(cgroup_cpus(st->value("cgroup", "")).value_or("(missing)"), stubborn_cpus);
    EXPECT_EQ(cgroup_cpus(po->value("cgroup", "")).value_or("(missing)"), polite_cpus);
    auto stubborn_pids = job_pids(*st);
    auto polite_pids = job_pids(*po);
    EXPECT_TRUE(wait_until([&] { return threads_all_on(stubborn_pids, stubborn_cpus); }, 10s))
        << describe_threads(stubborn_pids);
    EXPECT_TRUE(wait_until([&] { return threads_all_on(polite_pids, polite_cpus); }, 10s))
        << describe_threads(polite_pids);
    EXPECT_TRUE(polite.wait_for_line(
        [&](const std::string &l) { return l.find("cpus=" + polite_cpus) != std::string::npos; }, 10s));

    // The event stream tells the same story: ack_timeout for the stubborn job, then its narrowing,
    // then the polite job's growth.
    auto timeout_at = events.wait_for([](const json &e) { return is_event(e, "ack_timeout", "stubborn"); }, 5s);
    ASSERT_TRUE(timeout_at);
    auto narrow_at = events.wait_for(
        [](const json &e) { return is_event(e, "enforce", "stubborn") && !e.value("growing", true); }, 5s,
        *timeout_at);
    ASSERT_TRUE(narrow_at);
    auto grow_at = events.wait_for(
        [](const json &e) { return is_event(e, "publish", "polite") && e.value("ncpus", 0) > 0; }, 5s);
    ASSERT_TRUE(grow_at);
    EXPECT_LT(*narrow_at, *grow_at) << "the polite job grew before the stubborn one was narrowed";
}

}  // namespace
}  // namespace mall::test
