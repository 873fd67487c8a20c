// SPDX-License-Identifier: BSD-3-Clause
// Proves malld's state file round-trips every saved field, is replaced atomically, and that
// corrupt, foreign or newer files are rejected with a clear error while a missing one is a fresh start.
// Issue 37: saved cgroup paths must be plain, and /proc/PID/cgroup paths with "/.." are refused.
// The state folder's safety (temp files, links, modes, the pinned folder, history) is
// test_state_folder.cpp's; the fixture is state_file_test_support.hpp's.
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <linux/magic.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/files.hpp"
#include "daemon/procfs.hpp"
#include "daemon/state_file.hpp"
#include "support/watchdog.h"
#include "unit/state_file_test_support.hpp"

namespace fs = std::filesystem;
using mall::CpuSet;
using mall::test::StateFileTest;

namespace {

MALL_TEST_WATCHDOG(60);

TEST_F(StateFileTest, MissingFileIsAFreshStart) {
    std::string error = "stale";
    auto state = mall::load_state(dir_, &error);
    EXPECT_FALSE(state.has_value());
    EXPECT_TRUE(error.empty()) << error;
}

TEST_F(StateFileTest, RoundTripKeepsEveryField) {
    const mall::SavedState saved = sample();
    std::string error;
    ASSERT_TRUE(mall::save_state(dir_, saved, &error)) << error;
    auto loaded = mall::load_state(dir_, &error);
    ASSERT_TRUE(loaded.has_value()) << error;
    EXPECT_EQ(loaded->pool, "0-7");
    EXPECT_EQ(loaded->reclaimed.to_string(), "6-7");
    EXPECT_EQ(loaded->policy, "equal");
    ASSERT_EQ(loaded->jobs.size(), 2u);
    const auto &a = loaded->jobs[0];
    EXPECT_EQ(a.job.spec.id, "train-a");
    EXPECT_EQ(a.job.spec.uid, 1000u);
    EXPECT_EQ(a.job.spec.min, 1);
    EXPECT_EQ(a.job.spec.max, 4);
    EXPECT_DOUBLE_EQ(a.job.spec.weight, 2.5);
    EXPECT_EQ(a.job.spec.guaranteed.to_string(), "0");
    EXPECT_EQ(a.job.spec.pids, (std::vector<pid_t>{1234, 1240}));
    EXPECT_EQ(a.job.order, 3u);
    EXPECT_EQ(a.job.cpuset.to_string(), "0-2");
    EXPECT_EQ(a.job.published.to_string(), "0-1");
    EXPECT_EQ(a.job.generation, 7u);
    ASSERT_TRUE(a.job.pinned.has_value());
    EXPECT_EQ(a.job.pinned->to_string(), "0-1");
    EXPECT_EQ(a.job.usage_cap, 3);
    EXPECT_EQ(a.job.threads, 1);
    EXPECT_EQ(a.job.published_threads, 1);
    EXPECT_TRUE(a.job.signal_control);
    EXPECT_TRUE(a.job.published_signal_control);
    EXPECT_EQ(a.job.transitions, 7u);
    EXPECT_EQ(a.job.ack_timeouts, 1u);
    EXPECT_DOUBLE_EQ(a.job.last_ack_latency_us, 41.5);
    EXPECT_EQ(a.job.work_units, 1000u);
    EXPECT_EQ(a.job.steps, 10u);
    ASSERT_EQ(a.pids.size(), 2u);
    EXPECT_EQ(a.pids[0].pid, 1234);
    EXPECT_EQ(a.pids[0].start_time, 99887766ull);
    ASSERT_EQ(a.cgroups.size(), 2u);
    EXPECT_EQ(a.cgroups[0].path, "/sys/fs/cgroup/cpuset/slurm/uid_1000/job_7/step_0");
    EXPECT_TRUE(a.cgroups[0].in_place);
    EXPECT_EQ(a.cgroups[0].original, "0");
    EXPECT_FALSE(a.cgroups[1].in_place);
    const auto &b = loaded->jobs[1];
    EXPECT_EQ(b.job.spec.id, "b");
    EXPECT_FALSE(b.job.pinned.has_value());
    EXPECT_FALSE(b.job.signal_control);
    EXPECT_FALSE(b.job.published_signal_control);
    EXPECT_EQ(b.job.cpuset.to_string(), "3-4");
    // The JSON form is stable: saving what was loaded gives the same document.
    EXPECT_EQ(mall::state_to_json(*loaded), mall::state_to_json(saved));
}

TEST_F(StateFileTest, SaveReplacesAtomicallyAndLeavesNoTempFile) {
    mall::SavedState first = sample();
    std::string error;
    ASSERT_TRUE(mall::save_state(dir_, first, &error)) << error;
    struct stat before{};
    ASSERT_EQ(::stat(path().c_str(), &before), 0);

    mall::SavedState second = sample();
    second.policy = "static";
    second.jobs.pop_back();
    ASSERT_TRUE(mall::save_state(dir_, second, &error)) << error;
    struct stat after{};
    ASSERT_EQ(::stat(path().c_str(), &after), 0);
    // rename() put a new file in place (a new inode), rather than rewriting the old one in place,
    // so a reader (or a crash) never sees a half-written file.
    EXPECT_NE(before.st_ino, after.st_ino);
    for (const auto &entry : fs::directory_iterator(dir_))
        EXPECT_EQ(entry.path().filename(), "malld.state.json") << "left behind: " << entry.path();

    auto loaded = mall::load_state(dir_, &error);
    ASSERT_TRUE(loaded.has_value()) << error;
    EXPECT_EQ(loaded->policy, "static");
    EXPECT_EQ(loaded->jobs.size(), 1u);
}

TEST_F(StateFileTest, SaveIntoMissingFolderFailsWithPath) {
    std::string error;
    EXPECT_FALSE(mall::save_state(dir_ + "/no/such/folder", sample(), &error));
    EXPECT_NE(error.find(dir_ + "/no/such/folder"), std::string::npos) << error;
    EXPECT_NE(error.find("--state-dir"), std::string::npos) << error;
}

TEST_F(StateFileTest, CorruptFileIsAnErrorNotAFreshStart) {
    write_raw("{\"format\": \"mall-malld-state\", \"version\": 1, \"pool\": ");
    std::string error;
    auto state = mall::load_state(dir_, &error);
    EXPECT_FALSE(state.has_value());
    ASSERT_FALSE(error.empty());
    EXPECT_NE(error.find("not valid JSON"), std::string::npos) << error;
    EXPECT_NE(error.find(path()), std::string::npos) << error;
    EXPECT_NE(error.find("move it away"), std::string::npos) << error;
}

TEST_F(StateFileTest, ForeignFileIsRejected) {
    write_raw("{\"hello\": \"world\"}");
    std::string error;
    EXPECT_FALSE(mall::load_state(dir_, &error).has_value());
    EXPECT_NE(error.find("not a malld state file"), std::string::npos) << error;

    write_raw("[1, 2, 3]");
    EXPECT_FALSE(mall::load_state(dir_, &error).has_value());
    EXPECT_FALSE(error.empty());
}

TEST_F(StateFileTest, NewerSchemaIsRejected) {
    nlohmann::json j = mall::state_to_json(sample());
    j["version"] = 99;
    write_raw(j.dump());
    std::string error;
    EXPECT_FALSE(mall::load_state(dir_, &error).has_value());
    EXPECT_NE(error.find("newer malld"), std::string::npos) << error;
    EXPECT_NE(error.find("99"), std::string::npos) << error;
}

TEST_F(StateFileTest, BadFieldsNameTheFieldAndChangeNothing) {
    struct Case {
        const char *what;
        std::function<void(nlohmann::json &)> spoil;
        const char *expect;
    };
    const Case cases[] = {
        {"bad cpu list", [](nlohmann::json &j) { j["jobs"][0]["cpuset"] = "3-1"; }, "cpuset"},
        {"missing pids", [](nlohmann::json &j) { j["jobs"][0].erase("pids"); }, "pids"},
        {"min > max", [](nlohmann::json &j) { j["jobs"][1]["min"] = 5; }, "min"},
        {"bad job name", [](nlohmann::json &j) { j["jobs"][0]["job"] = "a b"; }, "a b"},
        {"duplicate job", [](nlohmann::json &j) { j["jobs"][1]["job"] = "train-a"; }, "twice"},
        {"negative pid", [](nlohmann::json &j) { j["jobs"][1]["pids"][0]["pid"] = -3; }, "pid"},
        {"string generation", [](nlohmann::json &j) { j["jobs"][0]["generation"] = "7"; }, "generation"},
        {"bad pool", [](nlohmann::json &j) { j["pool"] = "x"; }, "pool"},
        {"zero weight", [](nlohmann::json &j) { j["jobs"][0]["weight"] = 0; }, "weight"},
        {"relative cgroup", [](nlohmann::json &j) { j["jobs"][0]["cgroups"][0]["path"] = "slurm/x"; }, "path"},
        {"cgroup with ..", [](nlohmann::json &j) { j["jobs"][0]["cgroups"][0]["path"] = "/a/../b"; }, "path"},
        {"bad original", [](nlohmann::json &j) { j["jobs"][0]["cgroups"][0]["original"] = "0-"; }, "original"},
        {"string in_place", [](nlohmann::json &j) { j["jobs"][0]["cgroups"][0]["in_place"] = "yes"; }, "in_place"},
    };
    for (const auto &c : cases) {
        nlohmann::json j = mall::state_to_json(sample());
        c.spoil(j);
        std::string error;
        EXPECT_FALSE(mall::state_from_json(j, &error).has_value()) << c.what;
        EXPECT_NE(error.find(c.expect), std::string::npos) << c.what << ": " << error;
    }
}

// malld writes the state file when state_fingerprint() changes. Regression (issue 11): the
// fingerprint was written by hand apart from the serializer and left usage_cap out, so a cap
// that moved no cpu was never saved. Now every saved field counts, except the progress counters.
TEST_F(StateFileTest, FingerprintChangesWithEverySavedFieldButProgress) {
    const std::string base = mall::state_fingerprint(sample());
    EXPECT_EQ(mall::state_fingerprint(sample()), base);
    const std::vector<std::pair<const char *, std::function<void(mall::SavedState &)>>> saved = {
        {"usage_cap", [](mall::SavedState &s) { s.jobs[0].job.usage_cap = 1; }},
        {"threads", [](mall::SavedState &s) { s.jobs[0].job.threads = 0; }},
        {"published_threads", [](mall::SavedState &s) { s.jobs[0].job.published_threads = 0; }},
        {"signal_control", [](mall::SavedState &s) { s.jobs[0].job.signal_control = false; }},
        {"published_signal_control", [](mall::SavedState &s) { s.jobs[0].job.published_signal_control = false; }},
        {"weight", [](mall::SavedState &s) { s.jobs[0].job.spec.weight = 3; }},
        {"pinned", [](mall::SavedState &s) { s.jobs[0].job.pinned.reset(); }},
        {"generation", [](mall::SavedState &s) { s.jobs[0].job.generation = 8; }},
        {"pid start time", [](mall::SavedState &s) { s.jobs[0].pids[0].start_time = 1; }},
        {"reserved", [](mall::SavedState &s) { s.reserved["slurm-9"] = *CpuSet::parse("7"); }},
        {"policy", [](mall::SavedState &s) { s.policy = "static"; }},
        {"cgroup original", [](mall::SavedState &s) { s.jobs[0].cgroups[0].original = "0-1"; }},
        {"cgroup path", [](mall::SavedState &s) { s.jobs[0].cgroups.pop_back(); }},
    };
    for (const auto &[what, change] : saved) {
        mall::SavedState s = sample();
        change(s);
        EXPECT_NE(mall::state_fingerprint(s), base) << what << " changed but the fingerprint did not";
    }
    mall::SavedState progress = sample();
    progress.jobs[0].job.work_units += 500;
    progress.jobs[0].job.steps += 5;
    progress.jobs[0].job.last_ack_latency_us = 12;
    EXPECT_EQ(mall::state_fingerprint(progress), base) << "progress counters alone must not cause a write";
}

// mallds before 0.2 accepted weights above today's bound: their state files still load (the
// weight is brought within the bound at re-adoption), so an upgrade keeps every job.
TEST_F(StateFileTest, AnOlderFilesWeightAboveTheBoundStillLoads) {
    nlohmann::json j = mall::state_to_json(sample());
    j["jobs"][0]["weight"] = 2e6;
    std::string error;
    auto state = mall::state_from_json(j, &error);
    ASSERT_TRUE(state.has_value()) << error;
    EXPECT_DOUBLE_EQ(state->jobs[0].job.spec.weight, 2e6);
}

// mallds before 0.3 saved no "cgroups": their files load with none (the restarted malld reads
// where the pids live from /proc).
TEST_F(StateFileTest, AnOlderFileWithoutCgroupsStillLoads) {
    nlohmann::json j = mall::state_to_json(sample());
    for (auto &job : j["jobs"]) job.erase("cgroups");
    std::string error;
    auto state = mall::state_from_json(j, &error);
    ASSERT_TRUE(state.has_value()) << error;
    EXPECT_TRUE(state->jobs[0].cgroups.empty());
}

// mallds before API 0.3 saved no thread counts: their files load with one thread per cpu; a bad
// count names the field.
TEST_F(StateFileTest, AnOlderFileWithoutThreadCountsStillLoadsAndBadCountsAreRefused) {
    nlohmann::json j = mall::state_to_json(sample());
    for (auto &job : j["jobs"]) {
        job.erase("threads");
        job.erase("published_threads");
    }
    std::string error;
    auto state = mall::state_from_json(j, &error);
    ASSERT_TRUE(state.has_value()) << error;
    EXPECT_EQ(state->jobs[0].job.threads, 0);
    EXPECT_EQ(state->jobs[0].job.published_threads, 0);
    j["jobs"][0]["threads"] = -2;
    EXPECT_FALSE(mall::state_from_json(j, &error).has_value());
    EXPECT_NE(error.find("threads"), std::string::npos) << error;
}

// mallds before signal control (issue 17) saved no flag: their files load with it off (the
// default then and now); a flag that is not a bool names the field.
TEST_F(StateFileTest, AnOlderFileWithoutSignalControlLoadsWithItOffAndBadFlagsAreRefused) {
    nlohmann::json j = mall::state_to_json(sample());
    ASSERT_EQ(j["jobs"][0]["signal_control"], true);
    ASSERT_EQ(j["jobs"][0]["published_signal_control"], true);
    for (auto &job : j["jobs"]) {
        job.erase("signal_control");
        job.erase("published_signal_control");
    }
    std::string error;
    auto state = mall::state_from_json(j, &error);
    ASSERT_TRUE(state.has_value()) << error;
    EXPECT_FALSE(state->jobs[0].job.signal_control);
    EXPECT_FALSE(state->jobs[0].job.published_signal_control);
    for (const char *field : {"signal_control", "published_signal_control"}) {
        nlohmann::json bad = j;
        bad["jobs"][0][field] = "on";
        EXPECT_FALSE(mall::state_from_json(bad, &error).has_value()) << field;
        EXPECT_NE(error.find(field), std::string::npos) << error;
    }
}

}  // namespace

// Accounting (issue 18): a job's figures and times and the node's totals survive a restart, files
// of older mallds (without them) load with zeros, and a bad histogram names its field.
TEST_F(StateFileTest, AccountingAndTotalsRoundTripAndOlderFilesLoadWithout) {
    mall::SavedState saved = sample();
    mall::Job &job = saved.jobs[0].job;
    job.core_seconds = 120.5;
    job.lent_core_seconds = 40.25;
    job.oversubscribed_seconds = 1.5;
    job.cpu_seconds = 33.5;  // issue 41: measured cpu time
    job.acked_threads = 2;
    job.ack_latency.observe(0.003);
    saved.jobs[0].times = {1.7e9, 1.7e9 + 60, 1.7e9 + 50};
    saved.jobs[0].has_times = true;
    saved.totals.jobs_ended = 3;
    saved.totals.lent_core_seconds = 99;
    saved.totals.cpu_seconds = 77.25;
    saved.totals.resizes = 12;
    saved.totals.reclaims = 2;
    saved.totals.reclaim_duration.observe(0.5);
    saved.totals.ack_latency.observe(0.003);
    std::string error;
    ASSERT_TRUE(mall::save_state(dir_, saved, &error)) << error;
    auto loaded = mall::load_state(dir_, &error);
    ASSERT_TRUE(loaded) << error;
    const mall::SavedJob &a = loaded->jobs[0];
    EXPECT_DOUBLE_EQ(a.job.core_seconds, 120.5);
    EXPECT_DOUBLE_EQ(a.job.lent_core_seconds, 40.25);
    EXPECT_DOUBLE_EQ(a.job.oversubscribed_seconds, 1.5);
    EXPECT_DOUBLE_EQ(a.job.cpu_seconds, 33.5);
    EXPECT_EQ(a.job.acked_threads, 2);
    EXPECT_EQ(a.job.ack_latency, job.ack_latency);
    ASSERT_TRUE(a.has_times);
    EXPECT_DOUBLE_EQ(a.times.accounted_until, 1.7e9 + 60);
    ASSERT_TRUE(a.times.oversubscribed_since);
    EXPECT_DOUBLE_EQ(*a.times.oversubscribed_since, 1.7e9 + 50);
    EXPECT_FALSE(loaded->jobs[1].times.oversubscribed_since);
    EXPECT_EQ(loaded->totals, saved.totals);
    // Accounting changes alone never cause a write.
    mall::SavedState progress = saved;
    progress.jobs[0].job.lent_core_seconds += 10;
    progress.totals.reclaims += 1;
    EXPECT_EQ(mall::state_fingerprint(progress), mall::state_fingerprint(saved));

    nlohmann::json old = mall::state_to_json(saved);
    old.erase("totals");
    for (auto &j : old["jobs"])
        for (const char *f : {"ack_latency_seconds", "core_seconds", "lent_core_seconds", "oversubscribed_seconds",
                              "cpu_seconds", "acked_threads", "registered_at", "accounted_until", "oversubscribed_since"})
            j.erase(f);
    auto older = mall::state_from_json(old, &error);
    ASSERT_TRUE(older) << error;
    EXPECT_EQ(older->jobs[0].job.lent_core_seconds, 0);
    EXPECT_EQ(older->jobs[0].job.cpu_seconds, 0);
    EXPECT_FALSE(older->jobs[0].has_times);
    EXPECT_EQ(older->totals, mall::NodeTotals{});

    nlohmann::json bad = mall::state_to_json(saved);
    bad["jobs"][0]["ack_latency_seconds"]["count"] = 7;
    EXPECT_FALSE(mall::state_from_json(bad, &error));
    EXPECT_NE(error.find("ack_latency_seconds"), std::string::npos) << error;
    bad = mall::state_to_json(saved);
    bad["jobs"][0]["lent_core_seconds"] = -1;
    EXPECT_FALSE(mall::state_from_json(bad, &error));
    EXPECT_NE(error.find("lent_core_seconds"), std::string::npos) << error;
}

// ---------------------------------------------------------------------------------------------
// Issue 37: the paths read from the state file and from /proc.

namespace {

TEST_F(StateFileTest, Issue37SavedCgroupPathsMustBePlain) {
    for (const std::string &bad : std::vector<std::string>{"/sys/fs/cgroup/cpuset//x", "/sys/fs/cgroup/cpuset/./x", "/sys/fs/cgroup/cpuset/x/",
                                  "/sys/fs/cgroup/cpuset/../../etc", "/..", "", "relative/x",
                                  "/sys/fs/cgroup/" + std::string(5000, 'a')}) {
        nlohmann::json j = mall::state_to_json(sample());
        j["jobs"][0]["cgroups"][0]["path"] = bad;
        std::string error;
        EXPECT_FALSE(mall::state_from_json(j, &error)) << "accepted cgroup path '" << bad.substr(0, 60) << "'";
        EXPECT_NE(error.find("path"), std::string::npos) << error;
    }
    // Form only here: whether a path lies below the mount is the backend's check at adoption.
    nlohmann::json j = mall::state_to_json(sample());
    j["jobs"][0]["cgroups"][0]["path"] = "/etc";
    std::string error;
    EXPECT_TRUE(mall::state_from_json(j, &error)) << error;
}

// Review of 37.1, point 5: the state folder is opened once and every save, load and temp-file

// A process in a cgroup namespace reads other processes' cgroups above its namespace's root as
// "/../..": malld (in a container's cgroup namespace, say) must not join such a path to its mount.
// Here a child moves into a fresh cgroup-v2 folder, unshares its cgroup namespace there, and reads
// its parent's cgroup, which lies above: refused.
TEST(Issue37ProcCgroup, PathsWithDotDotFromAnotherCgroupNamespaceAreRefused) {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root (a cgroup folder and a cgroup namespace)";
    std::string v2;
    for (const char *mount : {"/sys/fs/cgroup", "/sys/fs/cgroup/unified"}) {
        struct statfs fs{};
        if (::statfs(mount, &fs) == 0 && fs.f_type == CGROUP2_SUPER_MAGIC) v2 = mount;
    }
    if (v2.empty()) GTEST_SKIP() << "no cgroup v2 hierarchy mounted";
    auto mine = mall::process_cgroup(0, true);
    ASSERT_TRUE(mine);
    const std::string folder = v2 + (*mine == "/" ? "" : *mine) + "/mall_test_cgns_" + std::to_string(::getpid());
    if (::mkdir(folder.c_str(), 0755) != 0) GTEST_SKIP() << "cannot create " << folder << ": " << std::strerror(errno);
    const pid_t parent = ::getpid();
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        std::ofstream(folder + "/cgroup.procs") << ::getpid() << std::endl;
        if (mall::process_cgroup(0, true).value_or("") == *mine) _exit(3);  // did not move
        if (::unshare(CLONE_NEWCGROUP) != 0) _exit(4);
        std::string raw;
        mall::read_text_file("/proc/" + std::to_string(parent) + "/cgroup", &raw);
        if (raw.find("0::/..") == std::string::npos) _exit(5);  // the kernel shows no "/.."
        _exit(mall::process_cgroup(parent, true).has_value() ? 1 : 0);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ::rmdir(folder.c_str());
    ASSERT_TRUE(WIFEXITED(status));
    if (WEXITSTATUS(status) == 3 || WEXITSTATUS(status) == 4 || WEXITSTATUS(status) == 5)
        GTEST_SKIP() << "this kernel gives no cgroup namespace view to test with (" << WEXITSTATUS(status) << ")";
    EXPECT_EQ(WEXITSTATUS(status), 0) << "a '/..' cgroup path from /proc/PID/cgroup was accepted";
}

}  // namespace