// SPDX-License-Identifier: BSD-3-Clause
// test_run_bounded: proves the bounded child runs malld and mallrun use (common/run_bounded.hpp)
// and how root finds the programs it runs (issue 37.11): a child that closes its output and then
// hangs is killed and reaped at the deadline with a "timed out" result (it once blocked malld's
// loop for as long as the child lived); root takes systemctl, podman and docker from root-owned
// system folders only, never from a folder $PATH names, and malld's systemctl call does not run a
// fake systemctl put first in PATH; the folders above what root trusts follow one rule (owned by
// root, writable by nobody else unless sticky); a child whose end was never seen (SIGCHLD ignored)
// is not a success. Every temporary file is removed; the watchdog fails a hang.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "common/files.hpp"
#include "common/run_bounded.hpp"
#include "daemon/systemd_slice.hpp"
#include "support/watchdog.h"

namespace {

MALL_TEST_WATCHDOG(60);  // a run_bounded that waits for its child without a deadline hangs here

using namespace std::chrono_literals;

// A fresh folder under $TMPDIR (or /tmp), removed with what the test put in it.
class TempFolder {
public:
    TempFolder() {
        const char *tmp = std::getenv("TMPDIR");
        std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/mall-run-bounded.XXXXXX";
        if (::mkdtemp(pattern.data()) != nullptr) path_ = pattern;
    }
    ~TempFolder() {
        for (const auto &f : files_) ::unlink(f.c_str());
        if (!path_.empty()) ::rmdir(path_.c_str());
    }
    const std::string &path() const { return path_; }
    // Writes an executable script `name` that leaves `marker` behind when it runs.
    std::string fake_program(const std::string &name, const std::string &marker) {
        const std::string file = path_ + "/" + name;
        std::ofstream(file) << "#!/bin/sh\necho ran >" << marker << "\nexit 0\n";
        ::chmod(file.c_str(), 0755);
        files_.push_back(file);
        files_.push_back(marker);
        return file;
    }

private:
    std::string path_;
    std::vector<std::string> files_;
};

// Puts `folder` alone in PATH for the test's lifetime.
class PathOverride {
public:
    explicit PathOverride(const std::string &folder) {
        if (const char *old = std::getenv("PATH")) saved_ = old;
        ::setenv("PATH", folder.c_str(), 1);
    }
    ~PathOverride() { ::setenv("PATH", saved_.c_str(), 1); }

private:
    std::string saved_ = "/usr/bin:/bin";
};

bool exists(const std::string &path) {
    struct stat st{};
    return ::lstat(path.c_str(), &st) == 0;
}

TEST(Issue37RunBounded, AChildThatClosesItsOutputAndHangsIsKilledAtTheDeadline) {
    mall::BoundedCommand command;
    command.argv = {"/bin/sh", "-c", "exec >&- 2>&-; exec sleep 300"};
    command.capture_stderr = true;
    command.limit = 500ms;
    const mall::BoundedResult result = mall::run_bounded(command);
    ASSERT_EQ(result.spawn_error, 0);
    EXPECT_TRUE(result.timed_out);
    EXPECT_FALSE(result.exited_zero());
    EXPECT_TRUE(result.reaped);
    ASSERT_GT(result.pid, 0);
    // Killed and reaped: no process, not even a zombie, holds its pid.
    EXPECT_EQ(::kill(result.pid, 0), -1);
    EXPECT_EQ(errno, ESRCH);
}

TEST(Issue37RunBounded, AChildThatEndsInTimeIsNotTimedOut) {
    mall::BoundedCommand command;
    command.argv = {"/bin/sh", "-c", "echo out; echo err >&2; exit 3"};
    command.capture_stderr = true;
    command.limit = 20s;
    const mall::BoundedResult result = mall::run_bounded(command);
    EXPECT_FALSE(result.timed_out);
    EXPECT_TRUE(result.reaped);
    EXPECT_TRUE(WIFEXITED(result.status));
    EXPECT_EQ(WEXITSTATUS(result.status), 3);
    EXPECT_EQ(result.output, "out\nerr\n");
}

TEST(Issue37TrustedProgram, RootNeverTakesAProgramFromAFolderInPath) {
    TempFolder folder;
    ASSERT_FALSE(folder.path().empty());
    for (const std::string name : {"systemctl", "podman", "docker"}) {
        const std::string fake = folder.fake_program(name, folder.path() + "/" + name + ".ran");
        PathOverride path(folder.path());
        std::string why;
        auto choice = mall::program_to_run(name, /*as_root=*/true, &why);
        if (choice) {
            EXPECT_NE(choice->program, fake);
            EXPECT_FALSE(choice->search_path) << name;
            bool in_system_folder = false;
            for (const auto &dir : mall::trusted_program_dirs())
                in_system_folder |= choice->program == dir + "/" + name;
            EXPECT_TRUE(in_system_folder) << choice->program;
        } else {
            EXPECT_NE(why.find("never through $PATH"), std::string::npos) << why;
        }
        // Another user keeps $PATH.
        auto user = mall::program_to_run(name, /*as_root=*/false, &why);
        ASSERT_TRUE(user);
        EXPECT_EQ(user->program, name);
        EXPECT_TRUE(user->search_path);
    }
}

TEST(Issue37TrustedProgram, MalldsSystemctlCallDoesNotRunAFakeSystemctlFromPath) {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root: the lookup without $PATH is root's";
    TempFolder folder;
    ASSERT_FALSE(folder.path().empty());
    const std::string marker = folder.path() + "/systemctl.ran";
    folder.fake_program("systemctl", marker);
    PathOverride path(folder.path());
    std::string error;
    // Whatever the real systemctl answers (or that there is none), the fake one never runs.
    mall::systemd_slice::run_systemctl({"--version"}, &error, 3s);
    EXPECT_FALSE(exists(marker)) << "the systemctl in PATH (" << folder.path() << ") ran";
}

TEST(Issue37TrustedProgram, FindsASystemProgram) {
    std::string why;
    auto sh = mall::trusted_program_path("sh", &why);
    ASSERT_TRUE(sh) << why;
    EXPECT_EQ(mall::untrusted_program_problem(*sh), "");
}

TEST(Issue37TrustedProgram, RefusesFilesAndFoldersOthersCouldHaveWritten) {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root: makes files owned by other uids";
    TempFolder folder;
    ASSERT_FALSE(folder.path().empty());
    ::chmod(folder.path().c_str(), 0755);
    const std::string file = folder.fake_program("tool", folder.path() + "/tool.ran");
    // A file of another uid.
    ASSERT_EQ(::chown(file.c_str(), 61001, 61001), 0);
    EXPECT_NE(mall::untrusted_program_problem(file).find("owned by uid 61001, not root"), std::string::npos)
        << mall::untrusted_program_problem(file);
    // Root's, but writable by its group.
    ASSERT_EQ(::chown(file.c_str(), 0, 0), 0);
    ::chmod(file.c_str(), 0775);
    EXPECT_NE(mall::untrusted_program_problem(file).find("writable by its group"), std::string::npos)
        << mall::untrusted_program_problem(file);
    // A good file in a folder others may write.
    ::chmod(file.c_str(), 0755);
    ::chmod(folder.path().c_str(), 0777);
    EXPECT_NE(mall::untrusted_program_problem(file).find("folder " + folder.path() + " is writable by others"),
              std::string::npos)
        << mall::untrusted_program_problem(file);
    // A folder of another uid.
    ::chmod(folder.path().c_str(), 0755);
    ASSERT_EQ(::chown(folder.path().c_str(), 61001, 61001), 0);
    EXPECT_NE(mall::untrusted_program_problem(file).find("folder " + folder.path() + " is owned by uid 61001"),
              std::string::npos)
        << mall::untrusted_program_problem(file);
    ASSERT_EQ(::chown(folder.path().c_str(), 0, 0), 0);
    // Looked up in a folder others may write: refused with the reason.
    ::chmod(folder.path().c_str(), 0777);
    std::string why;
    EXPECT_FALSE(mall::trusted_program_path("tool", &why, {folder.path()}));
    EXPECT_NE(why.find("no tool that root may run in " + folder.path()), std::string::npos) << why;
    EXPECT_NE(why.find("and not sticky"), std::string::npos) << why;
    ::chmod(folder.path().c_str(), 0755);
    EXPECT_FALSE(mall::trusted_program_path("../bin/sh", &why));
    EXPECT_FALSE(exists(folder.path() + "/tool.ran"));
}

// One rule for the folders above what root trusts (files.hpp's folder_chain_problem, used for the
// programs root runs and malld's state folder): owned by root (or the trusted uid), writable by
// nobody else unless sticky, as /tmp is (others may add names there, not rename root's).
TEST(Issue37TrustedProgram, FolderChainAllowsStickyFoldersButNotOpenOnes) {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root: makes folders owned by root and other uids";
    TempFolder outer;
    ASSERT_FALSE(outer.path().empty());
    const std::string inner = outer.path() + "/inner";
    ASSERT_EQ(::mkdir(inner.c_str(), 0755), 0);
    const std::string below = inner + "/x";
    ::chmod(outer.path().c_str(), 01777);  // like /tmp
    EXPECT_EQ(mall::folder_chain_problem(below, 0), "");
    ::chmod(outer.path().c_str(), 0777);  // anyone may rename inner and put another in its place
    EXPECT_NE(mall::folder_chain_problem(below, 0).find("folder " + outer.path() + " is writable by others"),
              std::string::npos)
        << mall::folder_chain_problem(below, 0);
    ::chmod(outer.path().c_str(), 0755);
    ASSERT_EQ(::chown(inner.c_str(), 61001, 61001), 0);
    EXPECT_NE(mall::folder_chain_problem(below, 0).find("folder " + inner + " is owned by uid 61001, not root"),
              std::string::npos)
        << mall::folder_chain_problem(below, 0);
    EXPECT_EQ(mall::folder_chain_problem(below, 61001), "") << "the trusted uid's own folder";
    ::rmdir(inner.c_str());
}

// Issue 37.11: a child the caller never saw end (reaped elsewhere: here SIGCHLD is ignored, so the
// kernel reaps it at once and waitpid says ECHILD) read as "exited 0", even /bin/false.
TEST(Issue37RunBounded, AChildNeverSeenToEndIsNotASuccess) {
    struct sigaction ignore{}, before{};
    ignore.sa_handler = SIG_IGN;
    ASSERT_EQ(::sigaction(SIGCHLD, &ignore, &before), 0);
    mall::BoundedCommand command;
    command.argv = {"/bin/false"};
    command.limit = 10s;
    const mall::BoundedResult result = mall::run_bounded(command);
    ::sigaction(SIGCHLD, &before, nullptr);
    EXPECT_EQ(result.spawn_error, 0);
    EXPECT_FALSE(result.timed_out) << "a child that ended is no time-out";
    EXPECT_FALSE(result.reaped) << "its end was never seen";
    EXPECT_FALSE(result.exited_zero()) << "/bin/false, reaped by the kernel, read as a success";
}

}  // namespace
