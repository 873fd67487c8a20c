// SPDX-License-Identifier: BSD-3-Clause
// Proves status_view's rule (issue 37, defect 10) on status objects and events shaped like
// malld's: an admin sees every job and event whole; a job's owner sees its own jobs whole; anyone
// else sees the node and, of other users' jobs, only their cpus and limits (no name, uid, pids,
// cgroups, progress, rates or accounting), and of their events only register, publish (with its
// cpus) and end, reduced. The daemon's wiring is proved in tests/integration/test_status_privacy.cpp.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "daemon/status_view.hpp"
#include "support/watchdog.h"

using nlohmann::json;
using mall::StatusViewer;

MALL_TEST_WATCHDOG(30);

namespace {

constexpr uid_t kAlice = 61001, kBob = 61002;

json job_of(const std::string &name, uid_t uid, const std::string &cpus, int pid) {
    return json{{"job", name},
                {"uid", uid},
                {"min", 1},
                {"max", 2},
                {"cpus", cpus},
                {"ncpus", 1},
                {"pids", {pid}},
                {"cgroup", "/sys/fs/cgroup/cpuset/mall/job_" + name},
                {"cgroups", {{{"path", "/sys/fs/cgroup/cpuset/mall/job_" + name}, {"in_place", false}}}},
                {"work_units", 1234},
                {"steps", 99},
                {"core_seconds", 5.5},
                {"speedup", {{"serial_fraction", 0.1}, {"one_core_rate", 3.0}}}};
}

json full_status() {
    return json{{"pool", "0-3"},
                {"free", "2-3"},
                {"policy", "equal"},
                {"backend", "cgroup-v1"},
                {"reserved", json::object()},
                {"node", {{"jobs_ended", 4}}},
                {"jobs", {job_of("train_alice-100", kAlice, "0", 4242), job_of("train_bob-200", kBob, "1", 4343)}}};
}

TEST(StatusView, AnAdminSeesEveryJobWhole) {
    const json seen = mall::status_seen_by(full_status(), StatusViewer{0, true});
    EXPECT_EQ(seen.value("view", ""), "all");
    ASSERT_EQ(seen["jobs"].size(), 2u);
    EXPECT_EQ(seen["jobs"][0], full_status()["jobs"][0]);
    EXPECT_EQ(seen["jobs"][1], full_status()["jobs"][1]);
    EXPECT_FALSE(seen.contains("other_jobs"));
}

TEST(StatusView, AnOwnerSeesItsJobWholeAndOthersOnlyAsCpus) {
    const json seen = mall::status_seen_by(full_status(), StatusViewer{kAlice, false});
    EXPECT_EQ(seen.value("view", ""), "own");
    ASSERT_EQ(seen["jobs"].size(), 1u);
    EXPECT_EQ(seen["jobs"][0], full_status()["jobs"][0]);
    ASSERT_EQ(seen["other_jobs"].size(), 1u);
    EXPECT_EQ(seen["other_jobs"][0], (json{{"cpus", "1"}, {"ncpus", 1}, {"min", 1}, {"max", 2}}));
    // The node stays whole.
    for (const char *key : {"pool", "free", "policy", "backend", "reserved", "node"})
        EXPECT_EQ(seen[key], full_status()[key]) << key;
}

TEST(StatusView, AnotherUserSeesNothingPersonalOfOtherJobs) {
    const json seen = mall::status_seen_by(full_status(), StatusViewer{65534, false});
    EXPECT_TRUE(seen["jobs"].empty());
    ASSERT_EQ(seen["other_jobs"].size(), 2u);
    const std::string text = seen.dump();
    for (const char *secret : {"train_alice", "train_bob", "61001", "61002", "4242", "4343", "/sys/fs/cgroup",
                               "work_units", "1234", "steps", "speedup", "core_seconds", "\"job\"", "\"uid\"",
                               "\"pids\"", "\"cgroups\""})
        EXPECT_EQ(text.find(secret), std::string::npos) << secret << " in " << text;
}

TEST(StatusView, AStatusWithoutJobsOrOddEntriesDoesNotThrow) {
    json odd = {{"pool", "0"}, {"jobs", {1, "x", json{{"job", "nouid"}}}}};
    const json seen = mall::status_seen_by(odd, StatusViewer{kBob, false});
    EXPECT_TRUE(seen["jobs"].empty());
    EXPECT_EQ(seen["other_jobs"].size(), 1u);  // the object without a uid counts as another's
    const json none = mall::status_seen_by(json{{"pool", "0"}}, StatusViewer{kBob, false});
    EXPECT_TRUE(none["jobs"].empty() && none["other_jobs"].empty());
}

TEST(StatusView, EventsOfOtherUsersJobsAreReducedOrDropped) {
    const StatusViewer bob{kBob, false};
    const json reg = {{"event", "register"}, {"time", 1.5}, {"job", "train_alice-100"}, {"uid", kAlice},
                      {"pids", {4242}}, {"min", 1}, {"max", 2}};
    auto seen = mall::event_seen_by(reg, bob, std::nullopt);
    ASSERT_TRUE(seen);
    EXPECT_EQ(*seen, (json{{"event", "register"}, {"time", 1.5}, {"other_job", true}}));
    const json publish = {{"event", "publish"}, {"time", 2.0}, {"job", "train_alice-100"}, {"generation", 3},
                          {"cpus", "0-1"}, {"ncpus", 2}};
    seen = mall::event_seen_by(publish, bob, kAlice);
    ASSERT_TRUE(seen);
    EXPECT_EQ(*seen, (json{{"event", "publish"}, {"time", 2.0}, {"cpus", "0-1"}, {"ncpus", 2}, {"other_job", true}}));
    const json end = {{"event", "end"}, {"job", "train_alice-100"}, {"uid", kAlice}, {"core_seconds", 9.0}};
    seen = mall::event_seen_by(end, bob, std::nullopt);
    ASSERT_TRUE(seen);
    EXPECT_FALSE(seen->contains("job") || seen->contains("uid") || seen->contains("core_seconds")) << seen->dump();
    for (const char *dropped : {"ack", "ack_timeout", "usage", "join", "enforce", "pin", "weight", "threads"}) {
        const json e = {{"event", dropped}, {"job", "train_alice-100"}, {"pids", {4242}}, {"latency_us", 80}};
        EXPECT_FALSE(mall::event_seen_by(e, bob, kAlice)) << dropped;
        EXPECT_FALSE(mall::event_seen_by(e, bob, std::nullopt)) << dropped << " of a job that is gone";
    }
}

TEST(StatusView, EventsOfOnesOwnJobsAndOfTheNodeGoOutWhole) {
    const json ack = {{"event", "ack"}, {"job", "train_alice-100"}, {"generation", 3}, {"latency_us", 80}};
    EXPECT_EQ(mall::event_seen_by(ack, StatusViewer{kAlice, false}, kAlice), ack);
    EXPECT_EQ(mall::event_seen_by(ack, StatusViewer{0, true}, kAlice), ack);
    const json reg = {{"event", "register"}, {"job", "train_alice-100"}, {"uid", kAlice}, {"pids", {4242}}};
    // The event's own uid wins over a wrong lookup.
    EXPECT_EQ(mall::event_seen_by(reg, StatusViewer{kAlice, false}, kBob), reg);
    const json policy = {{"event", "policy"}, {"policy", "static"}};
    EXPECT_EQ(mall::event_seen_by(policy, StatusViewer{kBob, false}, std::nullopt), policy);
    const json reclaim = {{"event", "reclaim"}, {"cpus", "2-3"}, {"owner", "slurm-7"}};
    EXPECT_EQ(mall::event_seen_by(reclaim, StatusViewer{kBob, false}, std::nullopt), reclaim);
}

}  // namespace
