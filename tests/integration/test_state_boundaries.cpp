// SPDX-License-Identifier: BSD-3-Clause
// Proves malld's state stays root's and cannot steer it (issue 37, defects 1 and 8, point 11):
// malld refuses a --state-dir that is a link, not a folder, not its own or writable by others
// (exit 2, words naming --state-dir, nothing started); it makes a missing one 0700 and its state
// and history files 0600; a crafted state file whose cgroup path lies outside the cgroup mount (or
// is shorter than it) is not adopted and malld runs on; and a job the kernel lets run on more cpus
// than the state file says (malld SIGKILLed between a widening cgroup write and its save) keeps
// them, so no other job is given them, until malld has narrowed it back.
// The review's points: a folder above the state folder that others may write (not sticky) is
// refused; malld works through the folder it opened at start (a folder swapped in later gets
// nothing); a trailing '/' is dropped; an ordinary user's default is under its home and option
// values are checked before the folder; a job widened in the kernel does not keep reclaimed cpus.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>

#include <filesystem>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>

#include "support/attackers.hpp"
#include "support/malld_fixture.hpp"

MALL_TEST_WATCHDOG(240);

namespace mall::test {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

unsigned mode_of(const std::string &path) {
    struct stat st{};
    return ::lstat(path.c_str(), &st) == 0 ? st.st_mode & 07777 : 0;
}

json read_json(const std::string &path) { return json::parse(read_file(path), nullptr, false); }

void write_text(const std::string &path, const std::string &text) {
    std::ofstream out(path, std::ios::trunc);
    out << text;
}

// The state file in `folder` lists `job` on `cpus` (malld saves on a writer thread after each
// change: a SIGKILL right after a change may come before the save).
bool saved_in(const std::string &folder, const std::string &job, const std::string &cpus) {
    return wait_until(
        [&] {
            const json state = read_json(folder + "/malld.state.json");
            if (!state.is_object() || !state.contains("jobs")) return false;
            for (const auto &j : state["jobs"])
                if (j.value("job", "") == job && j.value("cpuset", "") == cpus && j.value("published", "") == cpus)
                    return true;
            return false;
        },
        10s);
}
bool saved_on(const PrivateMalld &malld, const std::string &job, const std::string &cpus) {
    return saved_in(malld.state_dir(), job, cpus);
}

// malld answers status now and a moment later (it did not die at its first loop turn).
bool keeps_answering(const PrivateMalld &malld) {
    for (int i = 0; i < 5; ++i) {
        if (!status_json(malld.socket())) return false;
        std::this_thread::sleep_for(200ms);
    }
    return true;
}

// Job "a" (min 1, max 1) settled on one cpu of the two: its cpu, the other, and its cgroup.
struct OneCpuJob {
    std::string cpus, free_cpu, cgroup;
};
void wait_for_a_on_one_cpu(const PrivateMalld &malld, OneCpuJob *one) {
    ASSERT_TRUE(wait_until(
        [&] {
            auto j = job_status(malld.socket(), "a");
            if (!j || j->value("ncpus", 0) != 1) return false;
            one->cpus = j->value("cpus", "");
            return job_settled_on(malld.socket(), "a", one->cpus, 1);
        },
        20s))
        << status_text(malld);
    one->free_cpu = one->cpus == "0" ? "1" : "0";
    one->cgroup = job_status(malld.socket(), "a")->value("cgroup", "");
    ASSERT_FALSE(one->cgroup.empty());
}

// Each unsafe state folder: malld (a real start, not only --check) exits 2 before it serves,
// saying what is wrong with --state-dir and how to fix it.
TEST(Issue37StateBoundaries, MalldRefusesAStateDirThatIsALinkNotItsOwnOrWritableByOthers) {
    MALL_REQUIRE_ROOT_AND_CPUSET();
    PrivateMalld scratch;  // its temp dir holds the folders (removed with it)
    const std::string base = scratch.dir();
    const std::string socket = base + "/refused.sock";
    const std::string good = base + "/good";
    ASSERT_EQ(::mkdir(good.c_str(), 0700), 0);
    struct Case {
        std::string what, dir;
    };
    std::vector<Case> cases;
    const std::string open_to_all = base + "/mode0777";
    ASSERT_EQ(::mkdir(open_to_all.c_str(), 0700), 0);
    ASSERT_EQ(::chmod(open_to_all.c_str(), 0777), 0);
    cases.push_back({"mode 0777", open_to_all});
    const std::string group_writable = base + "/mode0770";
    ASSERT_EQ(::mkdir(group_writable.c_str(), 0700), 0);
    ASSERT_EQ(::chmod(group_writable.c_str(), 0770), 0);
    cases.push_back({"mode 0770", group_writable});
    const std::string foreign = base + "/foreign";
    ASSERT_EQ(::mkdir(foreign.c_str(), 0700), 0);
    ASSERT_EQ(::chown(foreign.c_str(), 61001, 61001), 0);
    cases.push_back({"owned by uid 61001", foreign});
    const std::string link = base + "/link";
    ASSERT_EQ(::symlink(good.c_str(), link.c_str()), 0);
    cases.push_back({"a symlink", link});
    const std::string file = base + "/file";
    write_text(file, "");
    cases.push_back({"a file", file});

    for (const auto &c : cases) {
        for (bool check : {true, false}) {
            std::vector<std::string> argv{bin_path("malld"), "--socket", socket, "--state-dir", c.dir,
                                          "--backend", "affinity", "--cpus", "0-1"};
            if (check) argv.push_back("--check");
            auto run = run_command(argv, RunOptions{{}, false, 20s});
            EXPECT_FALSE(run.timed_out) << c.what << ": malld started on an unsafe state folder";
            EXPECT_EQ(run.exit_code, 2) << c.what << (check ? " (--check)" : "") << ": " << run.err;
            EXPECT_NE(run.err.find("--state-dir"), std::string::npos) << c.what << ": " << run.err;
            EXPECT_NE(run.err.find(c.dir), std::string::npos) << c.what << ": " << run.err;
            EXPECT_NE(run.err.find("chmod 0700"), std::string::npos) << c.what << ": " << run.err;
            EXPECT_FALSE(fs::exists(socket)) << c.what << ": a refused malld made its socket";
            ::unlink(socket.c_str());
        }
    }
    EXPECT_EQ(mode_of(open_to_all), 0777u) << "a refused malld changed the folder";
    EXPECT_TRUE(fs::is_empty(good)) << "a refused malld wrote through the link";

    // A root-owned folder others cannot write is fine, 0755 as `mkdir` makes it, or 0700.
    auto fine = run_command({bin_path("malld"), "--socket", socket, "--state-dir", good, "--backend", "affinity",
                             "--cpus", "0-1", "--check"});
    EXPECT_EQ(fine.exit_code, 0) << fine.err;
}

// A missing state folder is made 0700; the state file and the history of finished jobs are 0600.
TEST(Issue37StateBoundaries, MalldMakesItsStateFolder0700AndItsFiles0600) {
    MALL_REQUIRE_ROOT_AND_CPUSET();
    PrivateMalld malld;
    ASSERT_EQ(::rmdir(malld.state_dir().c_str()), 0);
    std::string error;
    ASSERT_TRUE(malld.start(&error)) << error;
    EXPECT_EQ(mode_of(malld.state_dir()), 0700u);
    {
        Child a(mallrun_argv(malld.socket(), "1:2", "a", test_client_argv()));
        ASSERT_TRUE(wait_until([&] { return job_settled_on(malld.socket(), "a", "0-1", 1); }, 20s))
            << status_text(malld);
    }  // the job ends: a history record
    ASSERT_TRUE(wait_until([&] { return fs::exists(malld.state_dir() + "/malld.history.jsonl"); }, 20s))
        << malld.log();
    EXPECT_EQ(malld.stop(), 0);
    EXPECT_EQ(mode_of(malld.state_dir() + "/malld.state.json"), 0600u);
    EXPECT_EQ(mode_of(malld.state_dir() + "/malld.history.jsonl"), 0600u);
    for (const auto &entry : fs::directory_iterator(malld.state_dir()))
        EXPECT_EQ(entry.path().filename().string().find(".tmp"), std::string::npos) << "left: " << entry.path();
}

// Starts malld with job "a" (mallrun, min 1, max 2) alone on the pool, SIGKILLs malld, and rewrites
// the job's saved cgroups as someone with write access to the state file could: one cgroup in
// place at `path`, saved on cpu 0 only (so the next plan grows it, which resizes the cgroup;
// support/attackers.hpp's kill_and_craft_saved_cgroup).
void crash_with_crafted_cgroup(PrivateMalld &malld, std::unique_ptr<Child> *a, const std::string &path) {
    std::string error;
    ASSERT_TRUE(malld.start(&error)) << error;
    *a = std::make_unique<Child>(mallrun_argv(malld.socket(), "1:2", "a", test_client_argv()));
    ASSERT_TRUE(wait_until([&] { return job_settled_on(malld.socket(), "a", "0-1", 1); }, 20s)) << status_text(malld);
    ASSERT_TRUE(saved_on(malld, "a", "0-1")) << read_file(malld.state_dir() + "/malld.state.json");
    kill_and_craft_saved_cgroup(malld, path);
}

// Point 11: an in-place path shorter than the cgroup mount threw std::out_of_range out of the
// backend at the job's first growth: malld died at every start. The path is outside the mount
// besides: it must not be adopted at all, nor written.
TEST(Issue37StateBoundaries, ACraftedCgroupPathShorterThanTheMountIsNotAdoptedAndMalldRunsOn) {
    MALL_REQUIRE_ROOT_AND_CPUSET();
    char tmpl[] = "/tmp/mcXXXXXX";  // shorter than any cgroup mount
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    const std::string crafted = tmpl;
    ASSERT_LT(crafted.size(), cpuset_root().size());
    write_text(crafted + "/cpuset.cpus", "0\n");
    std::unique_ptr<Child> a;
    PrivateMalld malld;
    crash_with_crafted_cgroup(malld, &a, crafted);
    std::string error;
    const bool started = !HasFatalFailure() && malld.restart(&error);
    EXPECT_TRUE(started) << error;
    if (started) {
        EXPECT_TRUE(keeps_answering(malld)) << "malld died after adopting the crafted file:\n" << malld.log();
        EXPECT_FALSE(job_status(malld.socket(), "a")) << "job a was adopted with cgroup " << crafted << ":\n"
                                                      << status_text(malld);
        EXPECT_NE(malld.log().find("cannot re-adopt job a"), std::string::npos) << malld.log();
    }
    EXPECT_EQ(read_file(crafted + "/cpuset.cpus"), "0\n") << "malld wrote to the crafted cgroup path";
    a.reset();
    ::unlink((crafted + "/cpuset.cpus").c_str());
    ::rmdir(crafted.c_str());
}

// A cgroup outside the mount (here another hierarchy's folder, long enough): not adopted.
TEST(Issue37StateBoundaries, ACraftedCgroupPathOutsideTheMountIsNotAdopted) {
    MALL_REQUIRE_ROOT_AND_CPUSET();
    std::unique_ptr<Child> a;
    PrivateMalld malld;
    const std::string outside = "/proc/sys/kernel/mall_test_not_a_cgroup_folder_at_all";
    ASSERT_NO_FATAL_FAILURE(crash_with_crafted_cgroup(malld, &a, outside));
    std::string error;
    ASSERT_TRUE(malld.restart(&error)) << error;
    EXPECT_TRUE(keeps_answering(malld)) << malld.log();
    EXPECT_FALSE(job_status(malld.socket(), "a")) << "job a was adopted with cgroup " << outside << ":\n"
                                                  << status_text(malld);
    const std::string log = malld.log();
    EXPECT_NE(log.find("cannot re-adopt job a: its saved cgroup '" + outside + "'"), std::string::npos) << log;
}

// Defect 8. malld widens a job's cgroup before it publishes the wider set, and saves its state on
// a writer thread afterwards: a SIGKILL in between leaves the kernel's cpuset wider than the file.
// The window is too short to hit on purpose, so this test makes it by hand, as the kernel is left
// after such a kill: malld is SIGKILLed while job a (min 1, max 1) runs on one cpu, and a's cgroup
// is then widened to the whole pool, as the lost widening write would have. The restarted malld
// must count the extra cpu as a's (so the policy lends it to nobody) until it has narrowed a back to
// what a was told; only then may job b get it. Before the fix it logged a warning and gave b that
// cpu while a's cgroup still held it.
TEST(Issue37StateBoundaries, AJobWidenedInTheKernelBeforeTheSaveKeepsThoseCpusUntilMalldNarrowsIt) {
    MALL_REQUIRE_ROOT_AND_CPUSET();
    PrivateMalld malld;
    std::string error;
    ASSERT_TRUE(malld.start(&error)) << error;
    Child a(mallrun_argv(malld.socket(), "1:1", "a", test_client_argv()));
    OneCpuJob one;
    ASSERT_NO_FATAL_FAILURE(wait_for_a_on_one_cpu(malld, &one));
    const std::string a_cpus = one.cpus, free_cpu = one.free_cpu, cgroup = one.cgroup;
    ASSERT_EQ(cgroup_cpus(cgroup).value_or("?"), a_cpus);
    ASSERT_TRUE(saved_on(malld, "a", a_cpus)) << read_file(malld.state_dir() + "/malld.state.json");

    malld.kill9();
    write_text(cgroup + "/cpuset.cpus", "0-1");  // the widening write whose save never came
    ASSERT_EQ(cgroup_cpus(cgroup).value_or("?"), "0-1");
    ASSERT_TRUE(malld.restart(&error)) << error;

    // Narrowed back to what a was told, by malld, before anything else could happen.
    EXPECT_TRUE(wait_until([&] { return cgroup_cpus(cgroup).value_or("?") == a_cpus; }, 10s))
        << "a's cgroup still holds " << cgroup_cpus(cgroup).value_or("?") << "\n" << malld.log();
    auto ja = job_status(malld.socket(), "a");
    ASSERT_TRUE(ja) << status_text(malld);
    EXPECT_EQ(ja->value("cpus", ""), a_cpus);
    EXPECT_NE(malld.log().find("job a can run on cpus '" + free_cpu + "' beyond its saved cpuset"), std::string::npos)
        << malld.log();

    // Now b gets the freed cpu, and never while a's cgroup still has it.
    Child b(mallrun_argv(malld.socket(), "1:2", "b", test_client_argv()));
    bool overlap = false;
    ASSERT_TRUE(wait_until(
        [&] {
            auto jb = job_status(malld.socket(), "b");
            const std::string b_cpus = jb ? jb->value("cpuset", "") : "";
            if (!b_cpus.empty() && cgroup_cpus(cgroup).value_or("") != a_cpus) overlap = true;
            return job_settled_on(malld.socket(), "b", free_cpu, 1);
        },
        20s))
        << status_text(malld);
    EXPECT_FALSE(overlap) << "b was given a cpu while a's cgroup still held it";
    EXPECT_EQ(cgroup_cpus(cgroup).value_or("?"), a_cpus) << "a and b share a cpu";
}

// ---------------------------------------------------------------------------------------------
// Review of issue 37.1 (points 5, 6 and 13 of the review): the folders above the state folder,
// the folder swapped after the start, a trailing '/', the default for an ordinary user, the order
// of validation, and a kernel-widened job on reclaimed cpus.

constexpr uid_t kUser = 61001;  // a throwaway uid: no passwd entry needed

// Runs malld with `args` (and --backend affinity --cpus 0-1) and expects exit 2 before it serves,
// with words naming every one of `words`.
void expect_refused(const std::vector<std::string> &args, const std::vector<std::string> &words,
                    const std::string &what) {
    for (bool check : {true, false}) {
        std::vector<std::string> argv{bin_path("malld"), "--backend", "affinity", "--cpus", "0-1"};
        argv.insert(argv.end(), args.begin(), args.end());
        if (check) argv.push_back("--check");
        auto run = run_command(argv, RunOptions{{}, false, 20s});
        EXPECT_FALSE(run.timed_out) << what << ": malld started";
        EXPECT_EQ(run.exit_code, 2) << what << (check ? " (--check)" : "") << ": " << run.err;
        for (const auto &word : words) EXPECT_NE(run.err.find(word), std::string::npos) << what << ": " << run.err;
    }
}

// Whoever may write a folder above the state folder (not sticky) can rename the state folder and
// put a folder of their own in its place, which malld then saved into and adopted at its next
// start. Such a state folder is refused at start; below a sticky folder (like /tmp) it is fine.
TEST(Issue37StateBoundaries, AStateDirBelowAFolderOthersMayWriteIsRefused) {
    MALL_REQUIRE_ROOT_AND_CPUSET();
    PrivateMalld scratch;
    const std::string socket = scratch.dir() + "/refused.sock";
    const std::string open_parent = scratch.dir() + "/open";
    ASSERT_EQ(::mkdir(open_parent.c_str(), 0755), 0);
    ASSERT_EQ(::chmod(open_parent.c_str(), 0777), 0);
    const std::string state = open_parent + "/state";
    ASSERT_EQ(::mkdir(state.c_str(), 0700), 0);
    expect_refused({"--socket", socket, "--state-dir", state},
                   {"--state-dir", "folder " + open_parent + " is writable by others", "not sticky", "chmod go-w"},
                   "a parent of mode 0777");
    EXPECT_FALSE(fs::exists(socket)) << "a refused malld made its socket";
    EXPECT_TRUE(fs::is_empty(state)) << "a refused malld wrote into the state folder";
    // Missing, it is not made there either.
    ASSERT_EQ(::rmdir(state.c_str()), 0);
    expect_refused({"--socket", socket, "--state-dir", state}, {"--state-dir", open_parent}, "a missing folder below 0777");
    EXPECT_FALSE(fs::exists(state)) << "malld made its state folder below a folder anyone may write";
    // A folder above that belongs to another user (who may rename what lies in it).
    const std::string foreign_parent = scratch.dir() + "/foreign";
    ASSERT_EQ(::mkdir(foreign_parent.c_str(), 0755), 0);
    ASSERT_EQ(::mkdir((foreign_parent + "/state").c_str(), 0700), 0);
    ASSERT_EQ(::chown(foreign_parent.c_str(), kUser, kUser), 0);
    expect_refused({"--socket", socket, "--state-dir", foreign_parent + "/state"},
                   {"--state-dir", "folder " + foreign_parent + " is owned by uid 61001"}, "a parent of uid 61001");

    // Sticky (others may add names, but not rename root's folder): accepted, and made 0700.
    ASSERT_EQ(::chmod(open_parent.c_str(), 01777), 0);
    auto fine = run_command({bin_path("malld"), "--socket", socket, "--state-dir", state, "--backend", "affinity",
                             "--cpus", "0-1", "--check"});
    EXPECT_EQ(fine.exit_code, 0) << fine.err;
}

// After the start, the state folder is renamed away and another put in its place (as the owner of
// a folder above could have done; here root does it): malld keeps saving into the folder it opened,
// now under its new name, and writes nothing into the replacement, neither state nor history.
TEST(Issue37StateBoundaries, AStateFolderSwappedAfterTheStartIsNotWrittenInto) {
    MALL_REQUIRE_ROOT_AND_CPUSET();
    PrivateMalld malld;
    std::string error;
    ASSERT_TRUE(malld.start(&error)) << error;
    const std::string moved = malld.dir() + "/state.moved";
    ASSERT_EQ(::rename(malld.state_dir().c_str(), moved.c_str()), 0);
    ASSERT_EQ(::mkdir(malld.state_dir().c_str(), 0700), 0);  // the replacement
    {
        Child a(mallrun_argv(malld.socket(), "1:2", "a", test_client_argv()));
        ASSERT_TRUE(wait_until([&] { return job_settled_on(malld.socket(), "a", "0-1", 1); }, 20s))
            << status_text(malld);
        EXPECT_TRUE(saved_in(moved, "a", "0-1")) << "the save did not reach the folder malld opened: "
                                                 << read_file(moved + "/malld.state.json");
    }  // the job ends: a history record
    EXPECT_TRUE(wait_until([&] { return read_file(moved + "/malld.history.jsonl").find("\"a\"") != std::string::npos; },
                           20s))
        << "no history record in the folder malld opened\n" << malld.log();
    EXPECT_EQ(malld.stop(), 0);
    std::vector<std::string> written;
    for (const auto &entry : fs::directory_iterator(malld.state_dir())) written.push_back(entry.path().string());
    EXPECT_TRUE(written.empty()) << "malld wrote into the replacement folder: " << written.front() << "\n"
                                 << read_file(written.front());
    EXPECT_EQ(mode_of(moved + "/malld.state.json"), 0600u);
}

// "/x/state/": lstat followed a symlink there, and the folder was made by mkdir -p with 0755. The
// trailing '/' is dropped: the folder is made 0700, and a link there is refused.
TEST(Issue37StateBoundaries, ATrailingSlashIsDroppedAndTheFolderIsMade0700) {
    MALL_REQUIRE_ROOT_AND_CPUSET();
    PrivateMalld scratch;
    const std::string socket = scratch.dir() + "/slash.sock";
    const std::string fresh = scratch.dir() + "/fresh";
    {
        Child malld({bin_path("malld"), "--socket", socket, "--state-dir", fresh + "/", "--backend", "affinity",
                     "--cpus", "0-1", "--log-level", "warn"});
        ASSERT_TRUE(wait_until([&] { return status_json(socket).has_value(); }, 20s)) << "malld did not answer";
        EXPECT_EQ(mode_of(fresh), 0700u);
        malld.signal(SIGTERM);
        EXPECT_EQ(malld.wait_exit(10s).value_or(-1), 0);
    }
    EXPECT_TRUE(fs::exists(fresh + "/malld.state.json"));
    const std::string real = scratch.dir() + "/real";
    ASSERT_EQ(::mkdir(real.c_str(), 0700), 0);
    const std::string link = scratch.dir() + "/link";
    ASSERT_EQ(::symlink(real.c_str(), link.c_str()), 0);
    expect_refused({"--socket", socket, "--state-dir", link + "/"}, {"--state-dir", link, "symbolic link"},
                   "a symlink with a trailing '/'");
    EXPECT_TRUE(fs::is_empty(real)) << "malld wrote through the link";
    expect_refused({"--socket", socket, "--state-dir", "relative/state"}, {"--state-dir", "absolute"}, "a relative path");
}

// A HOME for the throwaway user: a fresh folder of its own (0700), removed with what is in it.
struct UserHome {
    std::string path;
    UserHome() {
        char tmpl[] = "/tmp/mall_home_XXXXXX";
        if (::mkdtemp(tmpl)) path = tmpl;
        if (!path.empty()) (void)::chown(path.c_str(), kUser, kUser);
    }
    ~UserHome() {
        std::error_code ec;
        if (!path.empty()) fs::remove_all(path, ec);
    }
};

// argv running malld as kUser with HOME=home and no XDG_STATE_HOME.
std::vector<std::string> malld_as_user(const std::string &home, const std::vector<std::string> &args) {
    std::vector<std::string> argv{"/usr/bin/setpriv", "--reuid=" + std::to_string(kUser),
                                  "--regid=" + std::to_string(kUser), "--clear-groups", "--",
                                  "/usr/bin/env", "-u", "XDG_STATE_HOME", "HOME=" + home, bin_path("malld")};
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
}

// The README's tour runs a private malld as an ordinary user without --state-dir: the default
// /var/lib/mall made it fail ("cannot create the state folder"). An ordinary user's default is
// $XDG_STATE_HOME/mall, else ~/.local/state/mall, made 0700 with the folders above it.
TEST(Issue37StateBoundaries, AnOrdinaryUsersMalldKeepsItsStateUnderItsHome) {
    MALL_REQUIRE_ROOT_AND_CPUSET();
    UserHome home;
    ASSERT_FALSE(home.path.empty());
    const std::string socket = home.path + "/malld.sock";
    const std::string expected = home.path + "/.local/state/mall";
    auto check = run_command(malld_as_user(home.path, {"--socket", socket, "--backend", "affinity", "--cpus", "0-1",
                                                       "--check"}));
    EXPECT_EQ(check.exit_code, 0) << check.err;
    EXPECT_NE(check.out.find("state in " + expected), std::string::npos) << check.out;
    {
        Child malld(malld_as_user(home.path, {"--socket", socket, "--backend", "affinity", "--cpus", "0-1",
                                              "--log-level", "warn"}));
        // It saves its state at start (root's mallctl would not talk to a malld of another uid
        // whose socket lies in /tmp: see ctl_client's server check).
        ASSERT_TRUE(wait_until([&] { return fs::exists(expected + "/malld.state.json"); }, 20s))
            << "an ordinary user's malld did not start without --state-dir";
        malld.signal(SIGTERM);
        EXPECT_EQ(malld.wait_exit(10s).value_or(-1), 0);
    }
    EXPECT_FALSE(fs::exists(socket)) << "malld did not stop cleanly";
    for (const std::string &folder : {home.path + "/.local", home.path + "/.local/state", expected}) {
        struct stat st{};
        ASSERT_EQ(::lstat(folder.c_str(), &st), 0) << folder;
        EXPECT_EQ(st.st_mode & 07777, 0700u) << folder;
        EXPECT_EQ(st.st_uid, kUser) << folder;
    }
    EXPECT_TRUE(fs::exists(expected + "/malld.state.json"));
}

// Every option value is checked before the state folder: an ordinary user on a host with a
// root-owned /var/lib/mall (here: a root-owned --state-dir) gets the error about the option they
// got wrong, not one about the folder.
TEST(Issue37StateBoundaries, OptionValuesAreCheckedBeforeTheStateFolder) {
    MALL_REQUIRE_ROOT_AND_CPUSET();
    UserHome home;
    ASSERT_FALSE(home.path.empty());
    PrivateMalld scratch;  // its state folder is root's (0755): not the user's
    for (const char *bad : {"0", "many"}) {
        auto run = run_command(malld_as_user(home.path, {"--socket", home.path + "/s.sock", "--state-dir",
                                                         scratch.state_dir(), "--max-connections-per-user", bad,
                                                         "--backend", "affinity", "--check"}));
        EXPECT_EQ(run.exit_code, 2) << run.err;
        EXPECT_NE(run.err.find("max-connections-per-user"), std::string::npos) << bad << ": " << run.err;
        EXPECT_EQ(run.err.find("--state-dir"), std::string::npos) << bad << ": " << run.err;
    }
    // With good values, the folder's own error.
    auto run = run_command(malld_as_user(home.path, {"--socket", home.path + "/s.sock", "--state-dir",
                                                     scratch.state_dir(), "--backend", "affinity", "--check"}));
    EXPECT_EQ(run.exit_code, 2) << run.err;
    EXPECT_NE(run.err.find("--state-dir"), std::string::npos) << run.err;
}

// Review point 13: a job the kernel runs wider than saved kept every cpu beyond its saved set that
// no other job held, reclaimed ones too: cores a Slurm prolog had reclaimed for a new job. Here cpu
// `free` is reclaimed while job a runs on the other; malld is killed, a's cgroup widened to both
// (the lost write), and the restarted malld must take the reclaimed cpu off a at once.
TEST(Issue37StateBoundaries, AJobWidenedInTheKernelDoesNotKeepReclaimedCpus) {
    MALL_REQUIRE_ROOT_AND_CPUSET();
    PrivateMalld malld;
    std::string error;
    ASSERT_TRUE(malld.start(&error)) << error;
    Child a(mallrun_argv(malld.socket(), "1:1", "a", test_client_argv()));
    OneCpuJob one;
    ASSERT_NO_FATAL_FAILURE(wait_for_a_on_one_cpu(malld, &one));
    const std::string a_cpus = one.cpus, free_cpu = one.free_cpu, cgroup = one.cgroup;
    auto reclaim = run_command(mallctl_argv(malld.socket(), {"reclaim", free_cpu, "--timeout-ms", "20000"}));
    ASSERT_EQ(reclaim.exit_code, 0) << reclaim.err;
    ASSERT_TRUE(saved_on(malld, "a", a_cpus));
    ASSERT_TRUE(wait_until(
        [&] { return read_json(malld.state_dir() + "/malld.state.json").value("reclaimed", "") == free_cpu; }, 10s))
        << read_file(malld.state_dir() + "/malld.state.json");

    malld.kill9();
    write_text(cgroup + "/cpuset.cpus", "0-1");  // the widening write whose save never came
    ASSERT_EQ(cgroup_cpus(cgroup).value_or("?"), "0-1");
    ASSERT_TRUE(malld.restart(&error)) << error;

    EXPECT_TRUE(wait_until([&] { return cgroup_cpus(cgroup).value_or("?") == a_cpus; }, 10s))
        << "a's cgroup still holds " << cgroup_cpus(cgroup).value_or("?") << "\n" << malld.log();
    auto status = status_json(malld.socket());
    ASSERT_TRUE(status) << malld.log();
    EXPECT_EQ(status->value("reclaimed", ""), free_cpu) << status->dump(1);
    auto ja = find_job(*status, "a");
    ASSERT_TRUE(ja) << status->dump(1);
    EXPECT_EQ(ja->value("cpuset", ""), a_cpus) << status->dump(1);
    const std::string log = malld.log();
    EXPECT_NE(log.find("cpus '" + free_cpu + "' are another job's or reclaimed: narrowed to '" + a_cpus + "' now"),
              std::string::npos)
        << log;
    EXPECT_EQ(log.find("stay the job's"), std::string::npos) << "a kept the reclaimed cpu:\n" << log;
}

}  // namespace
}  // namespace mall::test
