// SPDX-License-Identifier: BSD-3-Clause
// Proves how malld measures a job's cpu time and its busy fraction (issue 41): the account never
// goes back when a process exits or its pid is reused and counts a process forked between samples
// in full but not one merely seen late; /proc/PID/stat is read after its last ')' whatever the
// command name holds; cgroup v2's cpu.stat gives usage_usec, nested cgroups count once; a real
// spinning child's time is found through its parent; the core turns samples into cpu_seconds and
// a busy fraction of the core-seconds held, weighing a mid-window resize by its length.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <set>

#include "daemon/core/node_manager.hpp"
#include "daemon/job_cpu_time.hpp"
#include "daemon/procfs.hpp"
#include "support/core_effects.hpp"
#include "support/unit_helpers.hpp"
#include "support/watchdog.h"

using namespace mall;
using namespace std::chrono_literals;

MALL_TEST_WATCHDOG(60);

namespace {

CpuTimeReading proc(pid_t pid, unsigned long long start, double seconds) {
    return {std::to_string(pid) + ":" + std::to_string(start), seconds, start};
}

TEST(CpuTimeAccount, FirstSampleIsABaselineThenGrowthIsAdded) {
    CpuTimeAccount account;
    EXPECT_EQ(account.add_sample({proc(10, 5, 7.0), proc(11, 6, 3.0)}, 100), 0);
    EXPECT_TRUE(account.last_sample_began_a_counter());
    EXPECT_DOUBLE_EQ(account.add_sample({proc(10, 5, 8.5), proc(11, 6, 3.25)}, 300), 1.75);
    EXPECT_FALSE(account.last_sample_began_a_counter());
}

TEST(CpuTimeAccount, AnExitedProcessNeverTakesTimeBack) {
    CpuTimeAccount account;
    account.add_sample({proc(10, 5, 1.0), proc(11, 6, 4.0)}, 100);
    EXPECT_DOUBLE_EQ(account.add_sample({proc(10, 5, 2.0), proc(11, 6, 6.0)}, 300), 3.0);
    // 11 exits: the total keeps what it ran; only 10's growth is added.
    EXPECT_DOUBLE_EQ(account.add_sample({proc(10, 5, 2.5)}, 500), 3.5);
    EXPECT_EQ(account.counters(), 1u);  // the gone process is forgotten
}

TEST(CpuTimeAccount, AReusedPidIsANewProcess) {
    CpuTimeAccount account;
    account.add_sample({proc(10, 5, 9.0)}, 100);
    // pid 10 exits and is reused by a process started (tick 250) after the last sample (tick 100):
    // its 0.5 s all fall in this interval; the old process's 9 s are neither lost nor repeated.
    EXPECT_DOUBLE_EQ(account.add_sample({proc(10, 250, 0.5)}, 300), 0.5);
    EXPECT_FALSE(account.last_sample_began_a_counter());  // a process forked since: fully counted
    EXPECT_DOUBLE_EQ(account.add_sample({proc(10, 250, 1.5)}, 500), 1.5);
}

TEST(CpuTimeAccount, AProcessSeenLateIsABaseline) {
    CpuTimeAccount account;
    account.add_sample({proc(10, 5, 1.0)}, 100);
    // 12 started (tick 50) before the previous sample but was not read then: its 20 s are not this
    // interval's.
    EXPECT_DOUBLE_EQ(account.add_sample({proc(10, 5, 1.5), proc(12, 50, 20.0)}, 300), 0.5);
    EXPECT_TRUE(account.last_sample_began_a_counter());  // the window misses 12's growth
    EXPECT_DOUBLE_EQ(account.add_sample({proc(10, 5, 1.5), proc(12, 50, 21.0)}, 500), 1.5);
}

TEST(CpuTimeAccount, ACounterThatGoesBackAddsNothing) {
    CpuTimeAccount account;
    account.add_sample({{"/cg", 10.0, std::nullopt}}, 100);
    EXPECT_DOUBLE_EQ(account.add_sample({{"/cg", 4.0, std::nullopt}}, 300), 0);
    EXPECT_DOUBLE_EQ(account.add_sample({{"/cg", 5.0, std::nullopt}}, 500), 1.0);
    // A cgroup that joins later (no start time) is a baseline too.
    EXPECT_DOUBLE_EQ(account.add_sample({{"/cg", 5.0, std::nullopt}, {"/new", 50.0, std::nullopt}}, 700), 1.0);
}

TEST(ProcStat, CpuTimeIsReadAfterTheLastParenthesis) {
    // A command name a user chose: spaces, parentheses and digits that would shift naive fields.
    const std::string text =
        "4242 (evil) 1 2 3 (x) 4) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 75 7 9 20 0 3 0 123456 "
        "1000000 200 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n";
    auto t = parse_process_cpu_time(text);
    ASSERT_TRUE(t);
    EXPECT_EQ(t->cpu_ticks, 325u);  // utime 250 + stime 75 (cutime and cstime not counted)
    EXPECT_EQ(t->start_ticks, 123456u);
    EXPECT_FALSE(parse_process_cpu_time("4242 (no close paren S 1 2"));
    EXPECT_FALSE(parse_process_cpu_time("4242 (short) S 1 2 3"));
    EXPECT_FALSE(parse_process_cpu_time(
        "1 (x) S 1 1 1 0 -1 0 0 0 0 0 -5 75 7 9 20 0 3 0 123456 1 1"));  // a negative utime
}

TEST(CgroupCpuStat, UsageUsecInSeconds) {
    EXPECT_DOUBLE_EQ(*parse_cpu_stat_usage("usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n"), 2.5);
    EXPECT_DOUBLE_EQ(*parse_cpu_stat_usage("nr_periods 0\nusage_usec 7\n"), 7e-6);
    EXPECT_FALSE(parse_cpu_stat_usage("user_usec 1\n"));
    EXPECT_FALSE(parse_cpu_stat_usage("usage_usec lots\n"));
}

TEST(CgroupCpuStat, ACgroupBelowAnotherCountsOnce) {
    EXPECT_EQ(outermost_cgroups({"/sys/fs/cgroup/a/b", "/sys/fs/cgroup/a", "/sys/fs/cgroup/ab", "/sys/fs/cgroup/a"}),
              (std::vector<std::string>{"/sys/fs/cgroup/a", "/sys/fs/cgroup/ab"}));
}

TEST(ProcessTree, ASpinningChildsTimeIsFoundThroughItsParent) {
    pid_t parent = ::fork();
    ASSERT_GE(parent, 0);
    if (parent == 0) {
        pid_t child = ::fork();
        if (child == 0)
            for (;;) asm volatile("" ::: "memory");  // spins on its cpu
        ::pause();
        ::_exit(0);
    }
    CpuTimeAccount account;
    account.add_sample(process_tree_cpu_readings({parent}), boot_time_ticks());
    ::usleep(600 * 1000);
    const double ran = account.add_sample(process_tree_cpu_readings({parent}), boot_time_ticks());
    for (pid_t d : descendants_of(parent)) ::kill(d, SIGKILL);
    ::kill(parent, SIGKILL);
    ::waitpid(parent, nullptr, 0);
    EXPECT_GT(ran, 0.1);   // the grandchild spun for most of 0.6 s (2 cpus, a busy host: wide)
    EXPECT_LT(ran, 1.3);   // one thread cannot run more than the wall time, plus tick rounding
}

// A node manager over a synthetic node of `cores` single-PU cores (cpus 0..cores-1), policy
// equal, whose effects are EffectsT: the set-up both busy-fraction fixtures share.
template <typename EffectsT, int cores>
class NodeOfCores : public ::testing::Test {
protected:
    void SetUp() override {
        std::string error;
        topology_ = Topology::load("pack:1 core:" + std::to_string(cores) + " pu:1", &error);
        ASSERT_NE(topology_, nullptr) << error;
        manager_ = std::make_unique<NodeManager>(*topology_, test::cpus("0-" + std::to_string(cores - 1)),
                                                 PolicyKind::Equal, 2000ms, effects_);
    }
    EffectsT effects_;
    std::unique_ptr<Topology> topology_;
    std::unique_ptr<NodeManager> manager_;
    const TimePoint t0_ = Clock::now();
};

class BusyFraction : public NodeOfCores<test::EventLogEffects, 4> {
protected:
    TimePoint at(double seconds) {
        return t0_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    }
};

TEST(BusyFractionMath, CpuOverCoreSeconds) {
    EXPECT_DOUBLE_EQ(*busy_fraction(3, 4), 0.75);
    EXPECT_FALSE(busy_fraction(1, 0));  // held no cpus
    EXPECT_DOUBLE_EQ(*busy_fraction(4.2, 4), 1.05);  // not capped
}

TEST_F(BusyFraction, WindowsBecomeTheBusyFractionAndTheTotalEndsInTheRecord) {
    NodeManager &nm = *manager_;
    ASSERT_TRUE(nm.register_job(test::job_spec("a", 4, 4, CpuSet(), {100}), at(0)).ok);
    nm.tick(at(0));
    ASSERT_EQ(nm.find("a")->published.count(), 4);
    nm.record_cpu_time("a", 50.0, at(1));  // a baseline: no window yet
    EXPECT_FALSE(nm.find("a")->cpu_busy);
    EXPECT_TRUE(nm.status(at(1))["jobs"][0]["cpu_busy"].is_null());
    nm.record_cpu_time("a", 51.0, at(1.5));  // shorter than kMinCpuWindow: the window goes on
    EXPECT_FALSE(nm.find("a")->cpu_busy);
    nm.record_cpu_time("a", 56.0, at(3));  // 6 s of cpu over 4 cpus x 2 s
    EXPECT_DOUBLE_EQ(*nm.find("a")->cpu_busy, 0.75);
    nm.record_cpu_time("a", 56.4, at(5));
    EXPECT_NEAR(*nm.find("a")->cpu_busy, 0.05, 1e-9);
    const nlohmann::json s = nm.status(at(5));
    EXPECT_NEAR(s["jobs"][0]["cpu_busy"].get<double>(), 0.05, 1e-9);
    EXPECT_NEAR(s["jobs"][0]["cpu_seconds"].get<double>(), 6.4, 1e-9);
    nm.record_cpu_time("a", 10.0, at(7));  // the counter went back (cannot, but): a new baseline only
    EXPECT_NEAR(nm.find("a")->cpu_seconds, 6.4, 1e-9);
    nm.record_cpu_time("nobody", 1.0, at(7));  // unknown jobs are ignored
    ASSERT_TRUE(nm.deregister_job("a", at(8)).ok);
    const auto ends = effects_.named("end");
    ASSERT_EQ(ends.size(), 1u);
    EXPECT_NEAR(ends[0]["cpu_seconds"].get<double>(), 6.4, 1e-9);
}

TEST_F(BusyFraction, AResizeWithinTheWindowIsWeighedByItsLength) {
    NodeManager &nm = *manager_;
    ASSERT_TRUE(nm.register_job(test::job_spec("a", 1, 4, CpuSet(), {100}), at(0)).ok);
    nm.tick(at(0));
    ASSERT_EQ(nm.find("a")->published.count(), 4);
    nm.record_cpu_time("a", 0, at(0));
    // "b" takes half at t=1 ("a" has no attached process: its shrink needs no ack).
    ASSERT_TRUE(nm.register_job(test::job_spec("b", 1, 4, CpuSet(), {200}), at(1)).ok);
    nm.tick(at(1));
    ASSERT_EQ(nm.find("a")->published.count(), 2);
    // 4 cpus x 1 s + 2 cpus x 2 s = 8 core-seconds; 6 cpu seconds ran.
    nm.record_cpu_time("a", 6, at(3));
    EXPECT_NEAR(*nm.find("a")->cpu_busy, 0.75, 1e-6);
}

// Effects whose cpu-time counters the test sets (the backend's, in malld).
class CountingEffects : public test::EventLogEffects {
public:
    std::optional<CpuTimeSample> cpu_time(const std::string &job) override {
        auto it = counters.find(job);
        if (it == counters.end()) return std::nullopt;
        return CpuTimeSample{it->second, incomplete.count(job) > 0};
    }
    std::map<std::string, double> counters;
    std::set<std::string> incomplete;  // jobs whose next samples say a counter joined
};

// A node of 2 cpus whose jobs' cpu-time counters the test sets.
using BusyFractionLife = NodeOfCores<CountingEffects, 2>;

// malld samples a job's cpu time when it registers (its first window starts there, not at the
// first periodic sample up to 2 s later) and when it ends (the last part of its life counts even
// when shorter than a window), so a job's cpu_seconds covers its whole life.
TEST_F(BusyFractionLife, RegistrationAndEndAreSampled) {
    NodeManager &nm = *manager_;
    effects_.counters["a"] = 100.0;  // time its processes ran before they registered: not the job's
    ASSERT_TRUE(nm.register_job(test::job_spec("a", 2, 2, CpuSet(), {100}), t0_).ok);
    effects_.counters["a"] = 104.0;
    nm.sample_cpu_times(t0_ + 2s);  // a window from the registration: 4 cpu-s over 2 cpus x 2 s
    ASSERT_TRUE(nm.find("a")->cpu_busy);
    EXPECT_NEAR(*nm.find("a")->cpu_busy, 1.0, 1e-3);
    effects_.counters["a"] = 104.5;
    ASSERT_TRUE(nm.deregister_job("a", t0_ + 2500ms).ok);  // 0.5 s after the last sample
    const auto ends = effects_.named("end");
    ASSERT_EQ(ends.size(), 1u);
    EXPECT_NEAR(ends[0]["cpu_seconds"].get<double>(), 4.5, 1e-9);
}

// A window in which a counter joined (a cgroup the job was classified into after registration, a
// process seen late) adds what it measured to cpu_seconds but gives no busy fraction: it misses
// the new counter's growth, and a false low figure is what a policy must never decide from.
TEST_F(BusyFractionLife, AnIncompleteWindowGivesNoFraction) {
    NodeManager &nm = *manager_;
    effects_.counters["a"] = 0;
    ASSERT_TRUE(nm.register_job(test::job_spec("a", 2, 2, CpuSet(), {100}), t0_).ok);
    effects_.counters["a"] = 0.5;
    effects_.incomplete.insert("a");
    nm.sample_cpu_times(t0_ + 2s);
    EXPECT_FALSE(nm.find("a")->cpu_busy);
    EXPECT_NEAR(nm.find("a")->cpu_seconds, 0.5, 1e-9);
    effects_.incomplete.clear();
    effects_.counters["a"] = 4.5;  // the next window is complete: 4 cpu-s over 2 cpus x 2 s
    nm.sample_cpu_times(t0_ + 4s);
    ASSERT_TRUE(nm.find("a")->cpu_busy);
    EXPECT_NEAR(*nm.find("a")->cpu_busy, 1.0, 1e-3);
}

}  // namespace
