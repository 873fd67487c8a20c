// SPDX-License-Identifier: BSD-3-Clause
// Proves that two real jobs share the node without overlap: a lone job gets the whole pool, a second
// job makes the first shrink (acked, then enforced) before it grows, and a killed job's cpus go back.
#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <iterator>
#include <map>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "support/malld_fixture.hpp"

MALL_TEST_WATCHDOG(240);

namespace mall::test {
namespace {

using nlohmann::json;

// A job launched the way a user would: mallrun --malleable=1:2 -- mall_test_client.
std::unique_ptr<Child> start_job(const PrivateMalld &malld, const std::string &job) {
    return std::make_unique<Child>(
        mallrun_argv(malld.socket(), "1:2", job, test_client_argv({"--threads", "2", "--step-us", "1000"})));
}

// Both jobs settled, attached, on one cpu each.
bool both_settled_on_one_cpu(const PrivateMalld &malld) {
    auto status = status_json(malld.socket());
    if (!status) return false;
    for (const char *name : {"a", "b"}) {
        auto j = find_job(*status, name);
        if (!j || j->value("ncpus", 0) != 1) return false;
        if (!job_settled_on(malld.socket(), name, j->value("cpus", ""), 1)) return false;
    }
    return true;
}

std::set<int> as_set(const std::string &list) {
    auto v = parse_cpu_list(list);
    return v ? std::set<int>(v->begin(), v->end()) : std::set<int>{};
}

TEST(TwoJobs, LoneJobGetsTheWholePool) {
    MALL_REQUIRE_ROOT_AND_CPUSET();
    PrivateMalld malld;
    std::string error;
    ASSERT_TRUE(malld.start(&error)) << error;

    auto a = start_job(malld, "a");
    ASSERT_TRUE(a->started());
    auto open_line = a->wait_for_line_starting("open ", 20s);
    ASSERT_TRUE(open_line) << "mall_test_client printed nothing";
    EXPECT_EQ(*open_line, "open rc=0 job=a");

    ASSERT_TRUE(wait_until([&] { return job_settled_on(malld.socket(), "a", "0-1", 1); }, 20s))
        << status_text(malld);
    auto job = job_status(malld.socket(), "a");
    ASSERT_TRUE(job);
    EXPECT_EQ(job->value("ncpus", 0), 2);
    auto pids = job_pids(*job);
    ASSERT_EQ(pids.size(), 1u) << job->dump();

    // What the process sees: every thread may run on both cpus, and its cgroup says the same.
    EXPECT_TRUE(wait_until([&] { return threads_all_on(pids, "0-1"); }, 10s)) << describe_threads(pids);
    std::string cgroup = job->value("cgroup", "");
    EXPECT_EQ(std::filesystem::path(cgroup).parent_path(), std::filesystem::path(malld.cgroup_dir()));
    EXPECT_EQ(cgroup_cpus(cgroup).value_or("(missing)"), "0-1") << cgroup;

    auto status = status_json(malld.socket());
    ASSERT_TRUE(status);
    EXPECT_EQ(status->value("pool", ""), "0-1");
    EXPECT_EQ(status->value("free", "?"), "");
}

TEST(TwoJobs, SecondJobMakesTheFirstShrinkBeforeItGrows) {
    MALL_REQUIRE_ROOT_AND_CPUSET();
    // A long ack timeout: the first job steps every ms, so its shrink is acked, never timed out.
    MalldOptions options;
    options.ack_timeout_ms = 20000;
    PrivateMalld malld(options);
    std::string error;
    ASSERT_TRUE(malld.start(&error)) << error;
    EventRecorder events;
    ASSERT_TRUE(events.start(malld.socket(), &error)) << error;

    auto a = start_job(malld, "a");
    ASSERT_TRUE(wait_until([&] { return job_settled_on(malld.socket(), "a", "0-1", 1); }, 20s))
        << status_text(malld);
    const size_t before_b = events.size();

    auto b = start_job(malld, "b");
    ASSERT_TRUE(wait_until([&] { return both_settled_on_one_cpu(malld); }, 30s)) << status_text(malld);

    auto status = status_json(malld.socket());
    ASSERT_TRUE(status);
    auto ja = find_job(*status, "a"), jb = find_job(*status, "b");
    ASSERT_TRUE(ja && jb);
    const std::string cpus_a = ja->value("cpus", ""), cpus_b = jb->value("cpus", "");
    EXPECT_EQ(as_set(cpus_a).size() + as_set(cpus_b).size(), 2u);
    std::set<int> both = as_set(cpus_a);
    both.merge(as_set(cpus_b));
    EXPECT_EQ(both, (std::set<int>{0, 1})) << "the two jobs must split the pool: a=" << cpus_a << " b=" << cpus_b;
    EXPECT_EQ(ja->value("ack_timeouts", -1), 0) << ja->dump();

    // The order, from malld's own event stream: a is told to shrink, acks, is narrowed; only then
    // does b's cpuset widen and b get its allocation.
    auto is_a_narrowing = [](const json &e) {
        return is_event(e, "enforce", "a") && !e.value("growing", true) && e.value("cpus", "") != "0-1";
    };
    auto is_b_growing = [](const json &e) {
        return (is_event(e, "enforce", "b") && e.value("growing", false)) ||
               (is_event(e, "publish", "b") && e.value("ncpus", 0) > 0);
    };
    auto a_narrow = events.wait_for(is_a_narrowing, 10s, before_b);
    auto b_grow = events.wait_for(is_b_growing, 10s, before_b);
    auto a_shrink_publish = events.wait_for(
        [](const json &e) { return is_event(e, "publish", "a") && e.value("ncpus", 0) == 1; }, 10s, before_b);
    const auto all = events.events();
    std::string trace;
    for (size_t i = before_b; i < all.size(); ++i) trace += all[i].dump() + "\n";
    ASSERT_TRUE(a_narrow && b_grow && a_shrink_publish) << "events after b arrived:\n" << trace;
    EXPECT_LT(*a_shrink_publish, *a_narrow) << trace;
    EXPECT_LT(*a_narrow, *b_grow) << "b grew before a was narrowed:\n" << trace;
    EXPECT_LE(all[*a_narrow].value("time", 0.0), all[*b_grow].value("time", 0.0)) << trace;
    const uint64_t shrink_generation = all[*a_shrink_publish].value("generation", 0ull);
    auto a_ack = events.wait_for(
        [&](const json &e) { return is_event(e, "ack", "a") && e.value("generation", 0ull) == shrink_generation; },
        1s, *a_shrink_publish);
    ASSERT_TRUE(a_ack) << "a's shrink was not acked:\n" << trace;
    EXPECT_LT(*a_ack, *a_narrow) << "a was narrowed before it acked:\n" << trace;
    EXPECT_FALSE(events.wait_for([](const json &e) { return is_event(e, "ack_timeout"); }, 0ms)) << trace;

    // The kernel agrees: each cgroup holds its job's cpus, and at no sampled moment may a thread
    // of one job run where a thread of the other may.
    const auto pids_a = job_pids(*ja), pids_b = job_pids(*jb);
    EXPECT_EQ(cgroup_cpus(ja->value("cgroup", "")).value_or("(missing)"), cpus_a);
    EXPECT_EQ(cgroup_cpus(jb->value("cgroup", "")).value_or("(missing)"), cpus_b);
    EXPECT_TRUE(wait_until([&] { return threads_all_on(pids_a, cpus_a) && threads_all_on(pids_b, cpus_b); }, 10s))
        << "a: " << describe_threads(pids_a) << "\nb: " << describe_threads(pids_b);
    // A negative check over a sampling window: 50 samples, kSamplePause apart (about a second).
    constexpr auto kSamplePause = 20ms;
    for (int sample = 0; sample < 50; ++sample) {
        auto on_a = allowed_cpus_union(pids_a), on_b = allowed_cpus_union(pids_b);
        std::vector<int> shared;
        std::set_intersection(on_a.begin(), on_a.end(), on_b.begin(), on_b.end(), std::back_inserter(shared));
        ASSERT_TRUE(shared.empty()) << "sample " << sample << ": threads of both jobs allowed on the same cpu\n"
                                    << "a: " << describe_threads(pids_a) << "\nb: " << describe_threads(pids_b);
        std::this_thread::sleep_for(kSamplePause);
    }

    // Each process was told its allocation too.
    EXPECT_TRUE(a->wait_for_line([&](const std::string &l) { return l.find("cpus=" + cpus_a) != std::string::npos &&
                                                                    l.find("ncpus=1") != std::string::npos; },
                                 10s));
    EXPECT_TRUE(b->wait_for_line([&](const std::string &l) { return l.find("cpus=" + cpus_b) != std::string::npos; },
                                 10s));
}

// An admin pins the first job to the cpu the second holds (a swap on a 2-cpu pool). Whether malld
// refuses it or carries it out, no process may be told "no cpus", no cpuset write may fail, and the
// two jobs' enforced cpusets (as the successful enforce events set them) may never overlap.
TEST(TwoJobs, AdminSwapNeverPublishesNoCpusNorOverlaps) {
    MALL_REQUIRE_ROOT_AND_CPUSET();
    MalldOptions options;
    options.ack_timeout_ms = 20000;
    PrivateMalld malld(options);
    std::string error;
    ASSERT_TRUE(malld.start(&error)) << error;
    EventRecorder events;
    ASSERT_TRUE(events.start(malld.socket(), &error)) << error;
    auto a = start_job(malld, "a");
    ASSERT_TRUE(wait_until([&] { return job_settled_on(malld.socket(), "a", "0-1", 1); }, 20s));
    auto b = start_job(malld, "b");
    ASSERT_TRUE(wait_until([&] { return both_settled_on_one_cpu(malld); }, 30s)) << status_text(malld);
    auto before = status_json(malld.socket());
    ASSERT_TRUE(before);
    const std::string cpu_a = find_job(*before, "a")->value("cpus", ""), cpu_b = find_job(*before, "b")->value("cpus", "");
    const size_t from = events.size();

    auto set = run_command(mallctl_argv(malld.socket(), {"set", "a", "--cpus", cpu_b}));
    ASSERT_TRUE(set.exit_code == 0 || set.exit_code == 1) << set.err;
    if (set.exit_code == 0) {
        EXPECT_TRUE(wait_until([&] { return job_settled_on(malld.socket(), "a", cpu_b, 1) &&
                                            job_settled_on(malld.socket(), "b", cpu_a, 1); },
                               20s))
            << status_text(malld);
        // The swap's events that the checks below read reach the recorder: each job's publish
        // of its final generation and its enforce of its final cpus (malld sent them before it
        // answered this status; only acks may follow them).
        const auto after = status_json(malld.socket());
        ASSERT_TRUE(after) << malld.log();
        auto recorded = [&](const std::string &job, const std::string &cpus) {
            const uint64_t final_generation = find_job(*after, job).value_or(json::object()).value("generation", 0ull);
            return events.wait_for([&](const json &e) { return is_event(e, "enforce", job) && e.value("cpus", "") == cpus; },
                                   10s, from) &&
                   events.wait_for([&](const json &e) {
                       return is_event(e, "publish", job) && e.value("generation", 0ull) == final_generation;
                   }, 10s, from);
        };
        EXPECT_TRUE(recorded("a", cpu_b) && recorded("b", cpu_a)) << status_text(malld);
    } else {
        EXPECT_FALSE(trim(set.err).empty());
        // Refused: nothing should change. A negative check over a sampling window, long enough
        // for a stray event of a half-made change to reach the recorder.
        constexpr auto kStrayEventWindow = 200ms;
        std::this_thread::sleep_for(kStrayEventWindow);
    }

    std::map<std::string, std::set<int>> enforced{{"a", as_set(cpu_a)}, {"b", as_set(cpu_b)}};
    const auto all = events.events();
    std::string trace, violations;
    for (size_t i = from; i < all.size(); ++i) {
        const json &e = all[i];
        const std::string where = "event " + std::to_string(i - from) + ": ";
        trace += std::to_string(i - from) + ": " + e.dump() + "\n";
        if (is_event(e, "publish") && e.value("ncpus", 0) <= 0)
            violations += where + "job " + e.value("job", "") + " was told it has no cpus\n";
        if (!is_event(e, "enforce")) continue;
        if (e.contains("error")) {  // the kernel state did not change
            violations += where + "a cpuset write failed, the kernel kept the old cpus\n";
            continue;
        }
        enforced[e.value("job", "")] = as_set(e.value("cpus", ""));
        std::vector<int> shared;
        std::set_intersection(enforced["a"].begin(), enforced["a"].end(), enforced["b"].begin(), enforced["b"].end(),
                              std::back_inserter(shared));
        if (!shared.empty()) violations += where + "the two jobs' cpusets overlap\n";
    }
    EXPECT_EQ(violations, "") << "events after `mallctl set a --cpus " << cpu_b << "`:\n" << trace;
    // Whatever happened, the kernel agrees with status at the end.
    auto after = status_json(malld.socket());
    ASSERT_TRUE(after);
    for (const char *name : {"a", "b"}) {
        auto j = find_job(*after, name);
        ASSERT_TRUE(j);
        EXPECT_EQ(cgroup_cpus(j->value("cgroup", "")).value_or("(missing)"), j->value("cpuset", "")) << name;
    }
}

TEST(TwoJobs, KilledJobsCpusGoBackAndExitCodesPassThrough) {
    MALL_REQUIRE_ROOT_AND_CPUSET();
    MalldOptions options;
    options.ack_timeout_ms = 20000;
    PrivateMalld malld(options);
    std::string error;
    ASSERT_TRUE(malld.start(&error)) << error;

    auto a = start_job(malld, "a");
    ASSERT_TRUE(wait_until([&] { return job_settled_on(malld.socket(), "a", "0-1", 1); }, 20s))
        << status_text(malld);
    auto b = start_job(malld, "b");
    ASSERT_TRUE(wait_until([&] { return both_settled_on_one_cpu(malld); }, 30s)) << status_text(malld);
    auto jb = job_status(malld.socket(), "b");
    ASSERT_TRUE(jb);
    const std::string cgroup_b = jb->value("cgroup", "");
    auto pids_b = job_pids(*jb);
    ASSERT_EQ(pids_b.size(), 1u);

    // SIGKILL the second job's process (not its mallrun): malld and mallrun must notice.
    ASSERT_EQ(::kill(pids_b[0], SIGKILL), 0);
    EXPECT_EQ(b->wait_exit(20s), 128 + SIGKILL) << "mallrun must exit with its child's status";

    ASSERT_TRUE(wait_until([&] { return job_settled_on(malld.socket(), "a", "0-1", 1); }, 10s))
        << status_text(malld);
    auto status = status_json(malld.socket());
    ASSERT_TRUE(status);
    EXPECT_FALSE(find_job(*status, "b")) << status->dump(1);
    auto ja = find_job(*status, "a");
    ASSERT_TRUE(ja);
    auto pids_a = job_pids(*ja);
    EXPECT_TRUE(wait_until([&] { return threads_all_on(pids_a, "0-1"); }, 10s)) << describe_threads(pids_a);
    EXPECT_EQ(cgroup_cpus(ja->value("cgroup", "")).value_or("(missing)"), "0-1");
    EXPECT_TRUE(wait_until([&] { return !std::filesystem::exists(cgroup_b); }, 10s))
        << "the dead job's cgroup " << cgroup_b << " was not removed";
    EXPECT_TRUE(a->wait_for_line([](const std::string &l) { return l.find("cpus=0-1") != std::string::npos; }, 10s));

    // The first job ends normally (its process exits 0 on SIGTERM): mallrun exits 0 and the job
    // leaves status.
    ASSERT_EQ(pids_a.size(), 1u);
    ASSERT_EQ(::kill(pids_a[0], SIGTERM), 0);
    EXPECT_EQ(a->wait_exit(20s), 0);
    EXPECT_TRUE(wait_until(
        [&] {
            auto s = status_json(malld.socket());
            return s && s->contains("jobs") && (*s)["jobs"].empty();
        },
        10s))
        << status_text(malld);

    // A clean stop with no job left removes malld's cgroup parent.
    EXPECT_EQ(malld.stop(), 0);
    EXPECT_FALSE(std::filesystem::exists(malld.cgroup_dir())) << malld.cgroup_dir() << " left behind";
    EXPECT_FALSE(std::filesystem::exists(malld.socket())) << "socket left behind after a clean stop";
}

}  // namespace
}  // namespace mall::test
