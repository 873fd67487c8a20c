// SPDX-License-Identifier: BSD-3-Clause
// Proves malld's state file round-trips every saved field, is replaced atomically, and that
// corrupt, foreign or newer files are rejected with a clear error while a missing one is a fresh start.
// Issue 37: nothing planted in the state folder is followed or truncated (the temp file has an
// unpredictable name, created O_EXCL|O_NOFOLLOW; the state file is read O_NOFOLLOW), the state and
// history files are 0600, saved cgroup paths must be plain, and /proc/PID/cgroup paths with "/.."
// are refused. The state folder is opened once, walking from "/" (no folder above it that others
// may write unless sticky), and saves, loads and history appends go through that descriptor.
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <linux/magic.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "common/files.hpp"
#include "common/job_history.hpp"
#include "daemon/procfs.hpp"
#include "daemon/state_file.hpp"
#include "support/watchdog.h"

namespace fs = std::filesystem;
using mall::CpuSet;

namespace {

MALL_TEST_WATCHDOG(60);

class StateFileTest : public ::testing::Test {
protected:
    void SetUp() override {
        char tmpl[] = "/tmp/mall_state_test_XXXXXX";
        ASSERT_NE(::mkdtemp(tmpl), nullptr);
        dir_ = tmpl;
    }
    void TearDown() override {
        std::error_code ec;
        fs::remove_all(dir_, ec);
    }
    std::string path() const { return dir_ + "/malld.state.json"; }
    void write_raw(const std::string &text) {
        std::ofstream out(path(), std::ios::trunc);
        out << text;
    }
    std::string read_raw() const {
        std::ifstream in(path());
        return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    }

    static mall::SavedState sample() {
        mall::SavedState s;
        s.pool = "0-7";
        s.reclaimed = *CpuSet::parse("6-7");
        s.policy = "equal";
        mall::SavedJob a;
        a.job.spec.id = "train-a";
        a.job.spec.uid = 1000;
        a.job.spec.min = 1;
        a.job.spec.max = 4;
        a.job.spec.weight = 2.5;
        a.job.spec.guaranteed = *CpuSet::parse("0");
        a.job.spec.pids = {1234, 1240};
        a.job.order = 3;
        a.job.cpuset = *CpuSet::parse("0-2");
        a.job.published = *CpuSet::parse("0-1");
        a.job.generation = 7;
        a.job.pinned = *CpuSet::parse("0-1");
        a.job.transitions = 7;
        a.job.ack_timeouts = 1;
        a.job.usage_cap = 3;
        a.job.threads = 1;
        a.job.published_threads = 1;
        a.job.signal_control = true;
        a.job.published_signal_control = true;
        a.job.last_ack_latency_us = 41.5;
        a.job.work_units = 1000;
        a.job.steps = 10;
        a.pids = {{1234, 99887766ull}, {1240, 99887800ull}};
        a.cgroups = {{"/sys/fs/cgroup/cpuset/slurm/uid_1000/job_7/step_0", true, "0"},
                     {"/sys/fs/cgroup/cpuset/mall/job_train-a", false, ""}};
        mall::SavedJob b;
        b.job.spec.id = "b";
        b.job.spec.min = 2;
        b.job.spec.max = 2;
        b.job.spec.pids = {42};
        b.job.order = 4;
        b.job.cpuset = *CpuSet::parse("3-4");
        b.job.published = *CpuSet::parse("3-4");
        b.job.generation = 1;
        b.pids = {{42, 5}};
        s.jobs = {a, b};
        return s;
    }

    std::string dir_;
};

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
    job.acked_threads = 2;
    job.ack_latency.observe(0.003);
    saved.jobs[0].times = {1.7e9, 1.7e9 + 60, 1.7e9 + 50};
    saved.jobs[0].has_times = true;
    saved.totals.jobs_ended = 3;
    saved.totals.lent_core_seconds = 99;
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
                              "acked_threads", "registered_at", "accounted_until", "oversubscribed_since"})
            j.erase(f);
    auto older = mall::state_from_json(old, &error);
    ASSERT_TRUE(older) << error;
    EXPECT_EQ(older->jobs[0].job.lent_core_seconds, 0);
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
// Issue 37: the state folder, its files and the paths read from them.

namespace {

std::string read_text(const std::string &path) {
    std::ifstream in(path);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

unsigned file_mode(const std::string &path) {
    struct stat st{};
    if (::lstat(path.c_str(), &st) != 0) return 0;
    return st.st_mode & 07777;
}

// Root inside a container that had the socket folder (then also the state folder) planted
// malld.state.json.tmp -> a host file: malld's next save replaced the host file's content.
TEST_F(StateFileTest, Issue37StateTempFileIsNotFollowedThroughASymlink) {
    const std::string victim = dir_ + "/victim";
    { std::ofstream(victim) << "host file\n"; }
    ASSERT_EQ(::symlink(victim.c_str(), (path() + ".tmp").c_str()), 0);
    std::string error;
    ASSERT_TRUE(mall::save_state(dir_, sample(), &error)) << error;
    EXPECT_EQ(read_text(victim), "host file\n") << "the save wrote through the planted link";
    struct stat st{};
    ASSERT_EQ(::lstat(path().c_str(), &st), 0);
    EXPECT_TRUE(S_ISREG(st.st_mode)) << "the state file is not a regular file of malld's";
    auto loaded = mall::load_state(dir_, &error);
    ASSERT_TRUE(loaded) << error;
    EXPECT_EQ(loaded->jobs.size(), 2u);
}

// A symlink at the state file's own name: a save replaces the link (never writes its target), and
// a start refuses to read through one.
TEST_F(StateFileTest, Issue37StateFileSymlinkIsNeitherWrittenThroughNorRead) {
    const std::string victim = dir_ + "/victim";
    ASSERT_TRUE(mall::save_state(dir_, sample(), nullptr));
    ASSERT_EQ(::rename(path().c_str(), victim.c_str()), 0);  // a valid state file elsewhere
    const std::string victim_text = read_text(victim);
    ASSERT_EQ(::symlink(victim.c_str(), path().c_str()), 0);
    std::string error;
    EXPECT_FALSE(mall::load_state(dir_, &error)) << "a state file read through a symlink";
    EXPECT_NE(error.find("symbolic link"), std::string::npos) << error;
    EXPECT_NE(error.find(path()), std::string::npos) << error;

    mall::SavedState other = sample();
    other.policy = "static";
    ASSERT_TRUE(mall::save_state(dir_, other, &error)) << error;
    EXPECT_EQ(read_text(victim), victim_text) << "the save wrote through the link at the state file";
    auto loaded = mall::load_state(dir_, &error);
    ASSERT_TRUE(loaded) << error;
    EXPECT_EQ(loaded->policy, "static");
}

// The temp file's name cannot be guessed: two saves create two different names (watched with
// inotify), neither the old fixed "malld.state.json.tmp", and files planted under the old names
// are left alone (the old code truncated and renamed "malld.state.json.tmp").
TEST_F(StateFileTest, Issue37StateTempFileNamesAreUnpredictable) {
    const std::string planted = path() + ".tmp";
    { std::ofstream(planted) << "planted\n"; }
    const int watch = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    ASSERT_GE(watch, 0);
    ASSERT_GE(::inotify_add_watch(watch, dir_.c_str(), IN_CREATE), 0);
    std::string error;
    ASSERT_TRUE(mall::save_state(dir_, sample(), &error)) << error;
    ASSERT_TRUE(mall::save_state(dir_, sample(), &error)) << error;
    std::vector<std::string> created;
    alignas(inotify_event) char buf[8192];
    for (;;) {
        const ssize_t n = ::read(watch, buf, sizeof buf);
        if (n <= 0) break;
        for (ssize_t at = 0; at < n;) {
            const auto *ev = reinterpret_cast<const inotify_event *>(buf + at);
            if (ev->len > 0) created.emplace_back(ev->name);
            at += static_cast<ssize_t>(sizeof(inotify_event) + ev->len);
        }
    }
    ::close(watch);
    ASSERT_EQ(created.size(), 2u) << "expected one temp file per save";
    EXPECT_NE(created[0], created[1]) << "two saves used the same temp name " << created[0];
    for (const auto &name : created) {
        EXPECT_EQ(name.rfind("malld.state.json.tmp.", 0), 0u) << name;
        EXPECT_GE(name.size(), std::string("malld.state.json.tmp.").size() + 16) << "a short suffix: " << name;
    }
    EXPECT_EQ(read_text(planted), "planted\n") << "a file planted at the old temp name was used";
}

TEST_F(StateFileTest, Issue37TempFilesAreCreatedExclusivelyWithRandomNames) {
    const std::string prefix = dir_ + "/metrics.prom";
    // The old metrics writer's name ("<file>.tmp.<pid>") was removed and recreated: a planted file
    // there stays as it is now.
    const std::string old_name = prefix + ".tmp." + std::to_string(::getpid());
    { std::ofstream(old_name) << "planted\n"; }
    std::string first, second;
    const int a = mall::create_temp_file(prefix, 0600, &first);
    const int b = mall::create_temp_file(prefix, 0600, &second);
    ASSERT_GE(a, 0);
    ASSERT_GE(b, 0);
    ::close(a);
    ::close(b);
    EXPECT_NE(first, second);
    EXPECT_EQ(file_mode(first), 0600u);
    std::string error;
    ASSERT_TRUE(mall::replace_file_atomically(prefix, "metrics\n", 0644, &error)) << error;
    EXPECT_EQ(read_text(prefix), "metrics\n");
    EXPECT_EQ(file_mode(prefix), 0644u) << "node_exporter reads the metrics file";
    EXPECT_EQ(read_text(old_name), "planted\n") << "the metrics writer touched a planted file";
}

TEST_F(StateFileTest, Issue37StateAndHistoryFilesAreReadableByRootOnly) {
    std::string error;
    ASSERT_TRUE(mall::save_state(dir_, sample(), &error)) << error;
    EXPECT_EQ(file_mode(path()), 0600u);

    const std::string history = dir_ + "/malld.history.jsonl";
    const nlohmann::json record = {{"format", mall::kHistoryFormat}, {"job", "a"}, {"time", 1.0}};
    ASSERT_TRUE(mall::append_history(history, record, 1 << 20, &error)) << error;
    EXPECT_EQ(file_mode(history), 0600u);
    // A history file an older malld made 0644 is narrowed at the next append.
    ASSERT_EQ(::chmod(history.c_str(), 0644), 0);
    ASSERT_TRUE(mall::append_history(history, record, 1 << 20, &error)) << error;
    EXPECT_EQ(file_mode(history), 0600u);
    // Rotation: the new file is 0600 too.
    ASSERT_TRUE(mall::append_history(history, record, 10, &error)) << error;
    EXPECT_EQ(file_mode(history + ".1"), 0600u);
    EXPECT_EQ(file_mode(history), 0600u);
}

TEST_F(StateFileTest, Issue37HistoryFileSymlinksAreNotFollowed) {
    const std::string victim = dir_ + "/victim";
    { std::ofstream(victim) << "host file\n"; }
    const std::string history = dir_ + "/malld.history.jsonl";
    ASSERT_EQ(::symlink(victim.c_str(), history.c_str()), 0);
    const nlohmann::json record = {{"format", mall::kHistoryFormat}, {"job", "a"}, {"time", 1.0}};
    std::string error;
    EXPECT_FALSE(mall::append_history(history, record, 1 << 20, &error));
    EXPECT_NE(error.find(history), std::string::npos) << error;
    EXPECT_EQ(read_text(victim), "host file\n");
    // A link at the rotated name is replaced by the rotation, its target untouched.
    ASSERT_EQ(::unlink(history.c_str()), 0);
    ASSERT_EQ(::symlink(victim.c_str(), (history + ".1").c_str()), 0);
    ASSERT_TRUE(mall::append_history(history, record, 1 << 20, &error)) << error;
    ASSERT_TRUE(mall::append_history(history, record, 10, &error)) << error;
    EXPECT_EQ(read_text(victim), "host file\n");
    EXPECT_EQ(file_mode(history + ".1"), 0600u) << "the rotation did not replace the link";
}

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
// removal goes through its descriptor: a folder renamed away and replaced afterwards gets nothing.
TEST_F(StateFileTest, Issue37SavesGoThroughTheFolderOpenedAtStartNotItsName) {
    std::string error;
    const int fd = mall::open_private_folder(dir_, ::geteuid(), false, 0700, &error);
    ASSERT_GE(fd, 0) << error;
    const std::string moved = dir_ + ".moved";
    ASSERT_EQ(::rename(dir_.c_str(), moved.c_str()), 0);
    ASSERT_EQ(::mkdir(dir_.c_str(), 0700), 0);  // the replacement
    ASSERT_TRUE(mall::save_state(fd, dir_, sample(), &error)) << error;
    EXPECT_TRUE(fs::is_empty(dir_)) << "the save went to the folder now at the name";
    EXPECT_EQ(read_text(moved + "/malld.state.json").empty(), false);
    auto loaded = mall::load_state(fd, dir_, &error);
    ASSERT_TRUE(loaded) << error;
    EXPECT_EQ(loaded->jobs.size(), 2u);
    { std::ofstream(moved + "/malld.state.json.tmp.leftover") << "x"; }
    EXPECT_EQ(mall::remove_stale_state_temp_files(fd), 1);
    ::close(fd);
    std::error_code ec;
    fs::remove_all(moved, ec);
}

// The history file in a pinned folder (malld pins its state folder and the history's own) is
// appended and rotated through the descriptor; and a history file of another uid is refused.
TEST_F(StateFileTest, Issue37HistoryGoesThroughThePinnedFolderAndMustBeMalldsOwn) {
    std::string error;
    const int fd = mall::open_private_folder(dir_, ::geteuid(), false, 0700, &error);
    ASSERT_GE(fd, 0) << error;
    mall::pin_folder(dir_, fd);
    const std::string moved = dir_ + ".moved";
    ASSERT_EQ(::rename(dir_.c_str(), moved.c_str()), 0);
    ASSERT_EQ(::mkdir(dir_.c_str(), 0700), 0);
    const std::string history = dir_ + "/malld.history.jsonl";
    const nlohmann::json record = {{"format", mall::kHistoryFormat}, {"job", "a"}, {"time", 1.0}};
    ASSERT_TRUE(mall::append_history(history, record, 1 << 20, &error)) << error;
    ASSERT_TRUE(mall::append_history(history, record, 10, &error)) << error;  // rotates
    EXPECT_TRUE(fs::is_empty(dir_)) << "the history went to the folder now at the name";
    EXPECT_EQ(file_mode(moved + "/malld.history.jsonl"), 0600u);
    EXPECT_EQ(file_mode(moved + "/malld.history.jsonl.1"), 0600u);
    mall::pin_folder(dir_, -1);  // closes the pinned descriptor
    std::error_code ec;
    fs::remove_all(moved, ec);
    if (::geteuid() != 0) return;
    // A file another uid made (in a folder they may write, say): never appended to.
    { std::ofstream(history) << ""; }
    ASSERT_EQ(::chown(history.c_str(), 61001, 61001), 0);
    EXPECT_FALSE(mall::append_history(history, record, 1 << 20, &error));
    EXPECT_NE(error.find("uid 61001"), std::string::npos) << error;
    EXPECT_EQ(read_text(history), "");
}

// The walk from "/": a folder above that others may write (not sticky) or that another uid owns is
// refused, naming it; a sticky one is fine; a missing folder is made with `mode` (and its missing
// parents); a symlink above is followed when root owns it, refused when another uid does (in a
// sticky folder anyone may make one); the folder itself may not be a symlink.
TEST_F(StateFileTest, Issue37OpenPrivateFolderChecksEveryFolderAbove) {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root: makes folders of other uids";
    std::string error;
    const std::string open_parent = dir_ + "/open";
    ASSERT_EQ(::mkdir(open_parent.c_str(), 0700), 0);
    ASSERT_EQ(::chmod(open_parent.c_str(), 0777), 0);
    ASSERT_EQ(::mkdir((open_parent + "/state").c_str(), 0700), 0);
    EXPECT_LT(mall::open_private_folder(open_parent + "/state", 0, false, 0700, &error), 0);
    EXPECT_NE(error.find("folder " + open_parent + " is writable by others (mode 0777) and not sticky"),
              std::string::npos)
        << error;
    ASSERT_EQ(::chmod(open_parent.c_str(), 01777), 0);
    int fd = mall::open_private_folder(open_parent + "/state", 0, false, 0700, &error);
    EXPECT_GE(fd, 0) << error;
    if (fd >= 0) ::close(fd);

    bool missing = false;
    EXPECT_LT(mall::open_private_folder(dir_ + "/a/b/c", 0, false, 0700, &error, &missing), 0);
    EXPECT_TRUE(missing);
    EXPECT_FALSE(fs::exists(dir_ + "/a")) << "made a folder without `create`";
    fd = mall::open_private_folder(dir_ + "/a/b/c/", 0, true, 0700, &error);
    ASSERT_GE(fd, 0) << error;
    ::close(fd);
    for (const char *made : {"/a", "/a/b", "/a/b/c"}) EXPECT_EQ(file_mode(dir_ + made), 0700u) << made;

    ASSERT_EQ(::symlink((dir_ + "/a").c_str(), (dir_ + "/root-link").c_str()), 0);
    fd = mall::open_private_folder(dir_ + "/root-link/b/c", 0, false, 0700, &error);
    EXPECT_GE(fd, 0) << "a root-owned link in a root folder: " << error;
    if (fd >= 0) ::close(fd);
    ASSERT_EQ(::symlink((dir_ + "/a").c_str(), (open_parent + "/their-link").c_str()), 0);
    ASSERT_EQ(::lchown((open_parent + "/their-link").c_str(), 61001, 61001), 0);
    EXPECT_LT(mall::open_private_folder(open_parent + "/their-link/b/c", 0, false, 0700, &error), 0);
    EXPECT_NE(error.find("symbolic link " + open_parent + "/their-link is owned by uid 61001"), std::string::npos)
        << error;
    EXPECT_LT(mall::open_private_folder(dir_ + "/root-link", 0, false, 0700, &error), 0);
    EXPECT_NE(error.find("is a symbolic link"), std::string::npos) << error;
}

TEST(Issue37Paths, NormalizedFolderPathDropsTrailingSlashesAndRefusesRelativeOnes) {
    std::string why;
    EXPECT_EQ(mall::normalized_folder_path("/var/lib/mall/", &why), "/var/lib/mall");
    EXPECT_EQ(mall::normalized_folder_path("//var//lib/mall//", &why), "/var/lib/mall");
    EXPECT_EQ(mall::normalized_folder_path("/", &why), "/");
    EXPECT_EQ(mall::normalized_folder_path("", &why), "");
    EXPECT_EQ(mall::normalized_folder_path("state", &why), "");
    EXPECT_NE(why.find("absolute"), std::string::npos) << why;
    EXPECT_EQ(mall::normalized_folder_path("/var/lib/../mall", &why), "");
    EXPECT_EQ(mall::normalized_folder_path("/var/./mall", &why), "");
}

TEST(Issue37Paths, AbsolutePathProblemNamesTheFault) {
    EXPECT_EQ(mall::absolute_path_problem("/"), "");
    EXPECT_EQ(mall::absolute_path_problem("/sys/fs/cgroup/a.b/..c"), "");
    EXPECT_NE(mall::absolute_path_problem("/a/.."), "");
    EXPECT_NE(mall::absolute_path_problem("/a//b"), "");
    EXPECT_NE(mall::absolute_path_problem(std::string("/a\0b", 4)), "");
}

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
