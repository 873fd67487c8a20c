// SPDX-License-Identifier: BSD-3-Clause
// test_state_folder.cpp — issue 37: nothing planted in malld's state folder is followed or
// truncated (the temp file has an unpredictable name, created O_EXCL|O_NOFOLLOW; the state file is
// read O_NOFOLLOW; history rotation replaces links), the state and history files are 0600, and
// folder paths are normalized. The state folder is opened once, walking from "/" (no folder above
// it that others may write unless sticky: open_private_folder), and saves, loads and history
// appends go through that descriptor. The fixture is state_file_test_support.hpp's.
#include <gtest/gtest.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "common/files.hpp"
#include "common/job_history.hpp"
#include "daemon/state_file.hpp"
#include "support/watchdog.h"
#include "unit/state_file_test_support.hpp"

namespace fs = std::filesystem;
using mall::CpuSet;
using mall::test::StateFileTest;

namespace {

MALL_TEST_WATCHDOG(60);

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

}  // namespace
