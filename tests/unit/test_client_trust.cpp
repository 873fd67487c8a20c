// SPDX-License-Identifier: BSD-3-Clause
// test_client_trust.cpp — what libmall refuses to trust, and what a forked child may not break
// (issue 37, defects 5 and 6): a page its server could truncate (unsealed) is never mapped, so a
// truncation cannot kill the process with SIGBUS; a server that runs as another user who does not
// own the socket file is refused (fork + setuid for that server); a forked child's mall_close()
// frees only its own copy and the parent's handle keeps following malld (reattaching after a
// restart, mall_fd() readable on a change). The in-process FakeDaemon plays malld and the attacker.
#include <grp.h>

#include <algorithm>

#include "client_test_support.hpp"

using namespace std::chrono_literals;
using namespace mall::test::client;
using mall::test::FakeDaemon;

namespace {

MALL_TEST_WATCHDOG(60);

constexpr uid_t kOtherUid = 61001;  // a throwaway uid: no passwd entry needed

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
// nothing of it is mapped. The same server owning its socket file (a malld under a service
// account) is accepted.
TEST_F(ClientTest, Issue37ServerOfAnotherUserNotOwningTheSocketIsRefused) {
    if (geteuid() != 0) GTEST_SKIP() << "needs root (setuid to a throwaway uid)";
    daemon_.reset();  // the in-process one is not used
    ASSERT_EQ(chown(dir_.c_str(), kOtherUid, kOtherUid), 0) << std::strerror(errno);
    {
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
    {
        ServerOfAnotherUser server(socket_);  // its socket file stays its own
        ASSERT_TRUE(server.ready());
        mall_error_t err{};
        mall_t *m = open_handle(MALL_SUCCESS, &err);
        ASSERT_NE(m, nullptr);
        EXPECT_EQ(mall_step(m), MALL_SUCCESS);
        mall_close(m);
        handles_.erase(std::find(handles_.begin(), handles_.end(), m));
    }
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
