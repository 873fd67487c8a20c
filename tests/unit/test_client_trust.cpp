// SPDX-License-Identifier: BSD-3-Clause
// test_client_trust.cpp — what libmall refuses to trust, and what a forked child may not break
// (issue 37, defects 5 and 6): a page its server could truncate (unsealed) is never mapped, so a
// truncation cannot kill the process with SIGBUS; a server that runs as another user is refused
// unless it owns the socket file in folders only root and it may write (fork + setuid for that
// server; the client checked as root and as a third uid): owning a socket it bound in a folder of
// its own under /tmp vouches for nothing; a forked child's mall_close() frees only its own copy
// and the parent's handle keeps following malld (reattaching after a restart, mall_fd() readable
// on a change), also when a resize callback forked it. The in-process FakeDaemon plays malld and
// the attacker.
#include <grp.h>
#include <pthread.h>

#include <algorithm>
#include <filesystem>

#include "client/handle.hpp"  // the handle's step lock, which only its state can show
#include "client_test_support.hpp"

using namespace std::chrono_literals;
using namespace mall::test::client;
using mall::test::FakeDaemon;

namespace {

MALL_TEST_WATCHDOG(60);

constexpr uid_t kOtherUid = 61001;  // a throwaway uid: no passwd entry needed
constexpr uid_t kThirdUid = 61002;  // a client that is neither root nor the server's user

bool contains(const std::string &text, const std::string &part) { return text.find(part) != std::string::npos; }

// Waits (bounded) for a child; its wait status, or -1 when it had to be killed.
int wait_child(pid_t pid, std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    int status = 0;
    while (std::chrono::steady_clock::now() < deadline) {
        pid_t done = waitpid(pid, &status, WNOHANG);
        if (done == pid) return status;
        std::this_thread::sleep_for(5ms);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return -1;
}

// A FakeDaemon in a child process running as kOtherUid, listening on `socket`. The child serves
// until its pipe closes; ready() says whether it came up.
class ServerOfAnotherUser {
public:
    explicit ServerOfAnotherUser(const std::string &socket) {
        int ready_pipe[2], stop_pipe[2];
        if (pipe2(ready_pipe, O_CLOEXEC) != 0 || pipe2(stop_pipe, O_CLOEXEC) != 0) return;
        pid_ = fork();
        if (pid_ == 0) {
            close(ready_pipe[0]);
            close(stop_pipe[1]);
            char ok = 0;
            if (setgroups(0, nullptr) == 0 && setgid(kOtherUid) == 0 && setuid(kOtherUid) == 0) {
                FakeDaemon daemon(socket);
                std::string error;
                if (daemon.start(1, "0", &error)) {
                    ok = 1;
                    (void)!write(ready_pipe[1], &ok, 1);
                    char byte;
                    (void)!read(stop_pipe[0], &byte, 1);  // EOF: the test is done
                    daemon.stop();
                    _exit(0);
                }
            }
            (void)!write(ready_pipe[1], &ok, 1);
            _exit(1);
        }
        close(ready_pipe[1]);
        close(stop_pipe[0]);
        stop_fd_ = stop_pipe[1];
        char ok = 0;
        ready_ = pid_ > 0 && read(ready_pipe[0], &ok, 1) == 1 && ok == 1;
        close(ready_pipe[0]);
    }
    ~ServerOfAnotherUser() {
        if (stop_fd_ >= 0) close(stop_fd_);
        if (pid_ > 0) wait_child(pid_, 10s);
    }
    bool ready() const { return ready_; }

private:
    pid_t pid_ = -1;
    int stop_fd_ = -1;
    bool ready_ = false;
};


// What mall_open(socket) gives a process running as uid (a forked child that setuid()s): its code
// and words. rc is kNoResult when the child did not report.
struct OpenOutcome {
    static constexpr int kNoResult = 1000;
    int rc = kNoResult;
    std::string text;
};
OpenOutcome open_as_uid(uid_t uid, const std::string &socket) {
    OpenOutcome outcome;
    int report[2];
    if (pipe2(report, O_CLOEXEC) != 0) return outcome;
    pid_t pid = fork();
    if (pid == 0) {
        close(report[0]);
        int rc = OpenOutcome::kNoResult;
        mall_error_t err{};
        if (setgroups(0, nullptr) == 0 && setgid(uid) == 0 && setuid(uid) == 0) {
            mall_t *m = nullptr;
            rc = mall_open(socket.c_str(), &m, &err);
            mall_close(m);
        }
        (void)!write(report[1], &rc, sizeof rc);
        (void)!write(report[1], err.text, strnlen(err.text, sizeof err.text));
        _exit(0);
    }
    close(report[1]);
    if (pid > 0) {
        int rc;
        if (read(report[0], &rc, sizeof rc) == sizeof rc) outcome.rc = rc;
        char text[256];
        ssize_t n;
        while ((n = read(report[0], text, sizeof text)) > 0) outcome.text.append(text, static_cast<size_t>(n));
        wait_child(pid, 10s);
    }
    close(report[0]);
    return outcome;
}

// A folder that only root may write (0755, root's), under a chain of such folders from /, for a
// server's socket folder whose every parent is safe; removed with what it holds. The path is
// empty when no such place exists here (/run missing or writable by others).
class FolderOnlyRootWrites {
public:
    FolderOnlyRootWrites() {
        for (const char *parent : {"/run", "/var/lib"}) {
            if (!only_root_writes(parent) || !only_root_writes("/")) continue;
            std::string pattern = std::string(parent) + "/mall-client-trust-XXXXXX";
            if (mkdtemp(pattern.data()) == nullptr) continue;
            path_ = pattern;
            if (chmod(path_.c_str(), 0755) != 0) path_.clear();
            return;
        }
    }
    ~FolderOnlyRootWrites() {
        std::error_code ignored;
        if (!path_.empty()) std::filesystem::remove_all(path_, ignored);
    }
    const std::string &path() const { return path_; }

private:
    static bool only_root_writes(const char *folder) {
        struct stat st{};
        return lstat(folder, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == 0 && (st.st_mode & 022) == 0;
    }
    std::string path_;
};

}  // namespace

// Defect 5: a server passed an unsealed memfd and truncated it; the attached process died with
// SIGBUS at its next mall_step(). Now the page is refused with words before it is mapped: the
// truncation touches nothing of the process, which steps on ("no change"), detached.
TEST_F(ClientTest, Issue37UnsealedPageIsRefusedAndItsTruncationCannotKillTheProcess) {
    daemon_->set_seal_page(false);
    start_daemon(1, "0");
    mall_error_t err{};
    mall_t *m = open_handle(MALL_ERR_PROTOCOL, &err);
    ASSERT_NE(m, nullptr);
    EXPECT_TRUE(contains(err.text, "not sealed")) << err.text;
    EXPECT_EQ(mall_attached(m), MALL_ERR_DETACHED);
    ASSERT_TRUE(daemon_->truncate_page());
    for (int i = 0; i < 100; ++i) ASSERT_EQ(mall_step(m), MALL_NOUPDT);
    mall_alloc_t alloc{};
    EXPECT_EQ(mall_get_allocation(m, &alloc), MALL_SUCCESS);
    EXPECT_EQ(alloc.generation, 0u);
}

// The page malld sends (sealed as kernel_effects.cpp seals it, which the FakeDaemon copies) is
// accepted: the check refuses a server's page only for what malld never does.
TEST_F(ClientTest, Issue37PageSealedAsMalldSealsItIsAccepted) {
    start_daemon(1, "0");
    mall_t *m = open_handle(MALL_SUCCESS);
    ASSERT_NE(m, nullptr);
    EXPECT_EQ(mall_step(m), MALL_SUCCESS);
}

// Defect 5: a local user listening where a trainer was pointed (a squatted MALL_SOCKET path) is
// not malld: the server's SO_PEERCRED uid must be root, the process's own user or the socket
// file's owner. Here the server runs as kOtherUid and the socket file is root's: refused, and
// nothing of it is mapped.
TEST_F(ClientTest, Issue37ServerOfAnotherUserNotOwningTheSocketIsRefused) {
    if (geteuid() != 0) GTEST_SKIP() << "needs root (setuid to a throwaway uid)";
    daemon_.reset();  // the in-process one is not used
    ASSERT_EQ(chown(dir_.c_str(), kOtherUid, kOtherUid), 0) << std::strerror(errno);
    ServerOfAnotherUser server(socket_);
    ASSERT_TRUE(server.ready());
    ASSERT_EQ(chown(socket_.c_str(), 0, 0), 0) << std::strerror(errno);
    mall_error_t err{};
    mall_t *m = open_handle(MALL_ERR_NODAEMON, &err);
    ASSERT_NE(m, nullptr);
    EXPECT_TRUE(contains(err.text, "uid " + std::to_string(kOtherUid))) << err.text;
    EXPECT_TRUE(contains(err.text, "not malld")) << err.text;
    EXPECT_EQ(mall_attached(m), MALL_ERR_DETACHED);
    EXPECT_EQ(mall_step(m), MALL_NOUPDT);
}

// Review of defect 5 (finding 4): bind() makes every listener the owner of its socket file, so
// "the socket's owner" let in any server: user B made /tmp/mall first (the sticky /tmp lets anyone
// make a folder there) and listened on /tmp/mall/malld.sock; A's trainer attached to B's page,
// and B decided A's threads and cpus. Now the owner counts only where root and the owner alone
// write every folder on the way: B's server is refused by a root client and by a third user's,
// and also behind a symlink in /tmp that leads to a folder B keeps safe (/tmp decides that step).
TEST_F(ClientTest, Issue37ServerOwningItsSocketInAFolderUnderTmpIsRefused) {
    if (geteuid() != 0) GTEST_SKIP() << "needs root (setuid to throwaway uids, chown)";
    struct stat tmp{};
    ASSERT_EQ(stat("/tmp", &tmp), 0);
    ASSERT_TRUE((tmp.st_mode & S_IWOTH) && (tmp.st_mode & S_ISVTX)) << "/tmp is not sticky and world-writable here";
    daemon_.reset();  // the in-process one is not used
    ASSERT_EQ(chown(dir_.c_str(), kOtherUid, kOtherUid), 0) << std::strerror(errno);  // B's /tmp/mall
    ASSERT_EQ(chmod(dir_.c_str(), 0755), 0) << std::strerror(errno);
    {
        ServerOfAnotherUser server(socket_);
        ASSERT_TRUE(server.ready());
        struct stat st{};
        ASSERT_EQ(stat(socket_.c_str(), &st), 0);
        ASSERT_EQ(st.st_uid, kOtherUid) << "the server owns its socket";
        ASSERT_EQ(chmod(socket_.c_str(), 0666), 0) << std::strerror(errno);  // a third user may connect

        mall_error_t err{};
        mall_t *m = open_handle(MALL_ERR_NODAEMON, &err);
        ASSERT_NE(m, nullptr);
        EXPECT_TRUE(contains(err.text, "uid " + std::to_string(kOtherUid))) << err.text;
        EXPECT_TRUE(contains(err.text, "others may write /tmp")) << err.text;
        EXPECT_TRUE(contains(err.text, "not malld")) << err.text;
        EXPECT_EQ(mall_attached(m), MALL_ERR_DETACHED);
        EXPECT_EQ(mall_step(m), MALL_NOUPDT);

        OpenOutcome third = open_as_uid(kThirdUid, socket_);
        EXPECT_EQ(third.rc, MALL_ERR_NODAEMON) << third.text;
        EXPECT_TRUE(contains(third.text, "others may write /tmp")) << third.text;
        EXPECT_TRUE(contains(third.text, "not malld")) << third.text;
    }
    // B's socket in a folder only root and B write, reached through B's symlink in /tmp.
    FolderOnlyRootWrites safe;
    if (safe.path().empty()) GTEST_SKIP() << "no folder chain only root writes (/run, /var/lib)";
    const std::string b_folder = safe.path() + "/b";
    ASSERT_EQ(mkdir(b_folder.c_str(), 0755), 0) << std::strerror(errno);
    ASSERT_EQ(chown(b_folder.c_str(), kOtherUid, kOtherUid), 0) << std::strerror(errno);
    const std::string link = dir_ + "-link";
    struct UnlinkAtEnd {
        std::string path;
        ~UnlinkAtEnd() { unlink(path.c_str()); }
    } unlink_link{link};
    ASSERT_EQ(symlink(b_folder.c_str(), link.c_str()), 0) << std::strerror(errno);
    {
        ServerOfAnotherUser server(b_folder + "/malld.sock");
        ASSERT_TRUE(server.ready());
        mall_t *m = nullptr;
        mall_error_t err{};
        EXPECT_EQ(mall_open((link + "/malld.sock").c_str(), &m, &err), MALL_ERR_NODAEMON) << err.text;
        EXPECT_TRUE(contains(err.text, "others may write /tmp")) << err.text;
        mall_close(m);
    }
}

// The rule keeps what it is for: malld under a service account of its own, its socket in a folder
// of that account's that root made for it (/run/mall owned by the account, 0755, in root's /run),
// is accepted by root and by any other user.
TEST_F(ClientTest, Issue37ServerOwningItsSocketWhereOnlyRootAndItWriteIsAccepted) {
    if (geteuid() != 0) GTEST_SKIP() << "needs root (setuid to throwaway uids, chown)";
    FolderOnlyRootWrites safe;
    if (safe.path().empty()) GTEST_SKIP() << "no folder chain only root writes (/run, /var/lib)";
    daemon_.reset();  // the in-process one is not used
    const std::string service_folder = safe.path() + "/mall";
    ASSERT_EQ(mkdir(service_folder.c_str(), 0755), 0) << std::strerror(errno);
    ASSERT_EQ(chown(service_folder.c_str(), kOtherUid, kOtherUid), 0) << std::strerror(errno);
    const std::string socket = service_folder + "/malld.sock";
    ServerOfAnotherUser server(socket);
    ASSERT_TRUE(server.ready());
    ASSERT_EQ(chmod(socket.c_str(), 0666), 0) << std::strerror(errno);

    mall_t *m = nullptr;
    mall_error_t err{};
    ASSERT_EQ(mall_open(socket.c_str(), &m, &err), MALL_SUCCESS) << err.text;
    EXPECT_EQ(mall_step(m), MALL_SUCCESS);
    mall_close(m);

    OpenOutcome third = open_as_uid(kThirdUid, socket);
    EXPECT_EQ(third.rc, MALL_SUCCESS) << third.text;
}

// Defect 6: a forked child's mall_close() (Python's finalizer at a DataLoader worker's exit) wrote
// the eventfd it shares with the parent and stopped the parent's monitor: the parent never
// reattached after a malld restart. Now the child's copy is detached at the fork and its close
// frees only the child's state; the parent reattaches and is notified through mall_fd().
TEST_F(ClientTest, Issue37ForkedChildsCloseLeavesTheParentFollowingMalld) {
    start_daemon(1, "0");
    mall_t *m = open_handle(MALL_SUCCESS);
    ASSERT_NE(m, nullptr);
    ASSERT_EQ(mall_step(m), MALL_SUCCESS);
    ASSERT_TRUE(daemon_->wait_for_ack(1, 5s));

    int report[2];
    ASSERT_EQ(pipe2(report, O_CLOEXEC), 0);
    pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        // Each check that fails sets a bit of the exit code.
        int failures = 0;
        char byte;
        (void)!read(report[0], &byte, 1);  // after the parent published a change
        if (mall_attached(m) != MALL_ERR_DETACHED) failures |= 1;
        if (mall_step(m) != MALL_NOUPDT) failures |= 2;  // the parent's malld does not drive the child
        if (readable(mall_fd(m), 0)) failures |= 4;      // nor does the parent's mall_fd()
        mall_close(m);
        _exit(failures);
    }
    uint64_t published = daemon_->publish("0");
    ASSERT_TRUE(wait_until([&] { return readable(mall_fd(m), 0); }, 5s)) << "the parent's mall_fd() before the fork's close";
    ASSERT_EQ(write(report[1], "x", 1), 1);
    close(report[0]);
    close(report[1]);
    int status = wait_child(child, 10s);
    ASSERT_NE(status, -1) << "the child's mall_close() hung";
    ASSERT_TRUE(WIFEXITED(status)) << "the child died: status " << status;
    EXPECT_EQ(WEXITSTATUS(status), 0) << "1: attached, 2: stepped a change, 4: mall_fd() readable";

    // The parent is untouched: its pending change applies, its mall_fd() is drained and raised again.
    EXPECT_EQ(mall_step(m), MALL_SUCCESS);
    EXPECT_TRUE(daemon_->wait_for_ack(published, 5s));
    EXPECT_FALSE(readable(mall_fd(m), 0));
    // malld restarts with a new page: only a running monitor reattaches and sees generation 7.
    daemon_->stop();
    start_daemon(7, "0");
    ASSERT_TRUE(step_until_success(m, 10s)) << "the parent no longer follows malld after the child's close";
    mall_alloc_t alloc{};
    ASSERT_EQ(mall_get_allocation(m, &alloc), MALL_SUCCESS);
    EXPECT_EQ(alloc.generation, 7u);
    EXPECT_EQ(mall_attached(m), MALL_SUCCESS);
    uint64_t next = daemon_->publish("0");
    EXPECT_TRUE(wait_until([&] { return readable(mall_fd(m), 0); }, 5s)) << "the parent's monitor reads Notify";
    EXPECT_EQ(mall_step(m), MALL_SUCCESS);
    EXPECT_TRUE(daemon_->wait_for_ack(next, 5s));
}

namespace {

// A resize callback that forks once; the child returns from it and finishes its mall_step().
struct ForkingCallback {
    pid_t child = 0;  // in the parent: the child's pid once forked; in the child: -1
};
void fork_in_callback(const mall_alloc_t *, void *arg) {
    auto *state = static_cast<ForkingCallback *>(arg);
    if (state->child != 0) return;
    pid_t pid = fork();
    state->child = pid == 0 ? -1 : pid;
}

// Whether a copy of mutex could be destroyed (glibc refuses one locked or whose user count went
// wrong, as an unlock of a mutex nobody held leaves it: EBUSY).
bool destroyable_copy(std::mutex *mutex) {
    pthread_mutex_t copy;
    std::memcpy(&copy, mutex->native_handle(), sizeof copy);
    return pthread_mutex_destroy(&copy) == 0;
}

}  // namespace

// Review of defect 6 (finding 10): a resize callback that called fork() held the handle's step
// lock in the forking thread; the child's fork handler made that lock anew (unlocked), and the
// child's mall_step() then unlocked it again on its way out: undefined behaviour (glibc counts
// the lock's users below zero). Now the step lock is left as the fork found it: the child's
// mall_step() releases it as the parent's does, and the child's copy stays detached.
TEST_F(ClientTest, Issue37ResizeCallbackThatForksLeavesTheChildsStepLockSound) {
    start_daemon(1, "0");
    mall_t *m = open_handle(MALL_SUCCESS);
    ASSERT_NE(m, nullptr);
    ASSERT_EQ(mall_step(m), MALL_SUCCESS);
    ForkingCallback state;
    ASSERT_EQ(mall_on_resize(m, fork_in_callback, &state), MALL_SUCCESS);
    uint64_t published = daemon_->publish("0");
    ASSERT_TRUE(wait_until([&] { return readable(mall_fd(m), 0); }, 5s));
    const int step_rc = mall_step(m);  // the callback forks in here
    if (state.child == -1) {
        // The child, back from its mall_step(). Each check that fails sets a bit of the exit code.
        int failures = 0;
        if (step_rc != MALL_SUCCESS) failures |= 1;
        if (!destroyable_copy(&m->step_mu)) failures |= 2;
        if (mall_step(m) != MALL_NOUPDT || mall_attached(m) != MALL_ERR_DETACHED) failures |= 4;
        mall_close(m);
        _exit(failures);
    }
    ASSERT_GT(state.child, 0) << "the callback did not fork";
    EXPECT_EQ(step_rc, MALL_SUCCESS);
    int status = wait_child(state.child, 10s);
    ASSERT_NE(status, -1) << "the child hung";
    ASSERT_TRUE(WIFEXITED(status)) << "the child died: status " << status;
    EXPECT_EQ(WEXITSTATUS(status), 0) << "1: its mall_step() failed, 2: its step lock was unlocked while "
                                         "nobody held it, 4: its copy is not detached";
    // The parent's handle is untouched.
    EXPECT_TRUE(daemon_->wait_for_ack(published, 5s));
    EXPECT_TRUE(destroyable_copy(&m->step_mu));
    uint64_t next = daemon_->publish("0");
    EXPECT_TRUE(wait_until([&] { return readable(mall_fd(m), 0); }, 5s));
    EXPECT_EQ(mall_step(m), MALL_SUCCESS);
    EXPECT_TRUE(daemon_->wait_for_ack(next, 5s));
}
