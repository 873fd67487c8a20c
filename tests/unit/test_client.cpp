// SPDX-License-Identifier: BSD-3-Clause
// test_client.cpp — proves libmall's handshake against an in-process fake malld (no real malld):
// attach, apply, callbacks, re-pinning, acks, mall_fd, progress, reconnection, error mapping,
// bounded open, the C++ wrapper's exception barrier. Notification and control by signal are in
// test_client_signals.cpp; the seqlock page, the socket helpers and CtlClient underneath in
// test_client_transport.cpp (helpers shared by the three: client_test_support.hpp).
#include "client_test_support.hpp"

using namespace std::chrono_literals;
using namespace mall::test::client;
using mall::test::FakeDaemon;

namespace {

MALL_TEST_WATCHDOG(60);

}  // namespace

TEST_F(ClientTest, AttachAppliesInitialAllocationAndAcks) {
    setenv("MALL_JOB_ID", "job-a", 1);
    daemon_->set_job("job-a");
    start_daemon(1, "0");
    mall_t *m = open_handle(MALL_SUCCESS);
    ASSERT_NE(m, nullptr);
    EXPECT_EQ(daemon_->last_attach_body(), (nlohmann::json{{"job", "job-a"}}));
    EXPECT_EQ(mall_attached(m), MALL_SUCCESS);
    EXPECT_STREQ(mall_job_id(m), "job-a");

    Recorder rec;
    ASSERT_EQ(mall_on_resize(m, &Recorder::first, &rec), MALL_SUCCESS);
    ASSERT_EQ(mall_on_resize(m, &Recorder::second, &rec), MALL_SUCCESS);

    mall_alloc_t before{};
    ASSERT_EQ(mall_get_allocation(m, &before), MALL_SUCCESS);
    EXPECT_EQ(before.generation, 0u);
    EXPECT_EQ(before.ncpus, 0);

    EXPECT_EQ(mall_step(m), MALL_SUCCESS);
    EXPECT_EQ(rec.calls, (std::vector<std::string>{"first:1:0", "second:1:0"}));
    mall_alloc_t alloc{};
    ASSERT_EQ(mall_get_allocation(m, &alloc), MALL_SUCCESS);
    EXPECT_EQ(alloc.generation, 1u);
    EXPECT_EQ(alloc.ncpus, 1);
    EXPECT_STREQ(alloc.cpus, "0");
    EXPECT_EQ(alloc.mask[0], 1u);
    EXPECT_TRUE(daemon_->wait_for_ack(1, 5s)) << "no ack for generation 1 reached the daemon";

    // Nothing changed: no callbacks, no ack.
    EXPECT_EQ(mall_step(m), MALL_NOUPDT);
    EXPECT_EQ(mall_step(m), MALL_NOUPDT);
    EXPECT_EQ(rec.calls.size(), 2u);
    EXPECT_EQ(daemon_->unexpected_packets(), 0);
}

TEST_F(ClientTest, SelfRegistrationSendsLimitsFromEnvironment) {
    start_daemon(1, "0");
    open_handle(MALL_SUCCESS);
    EXPECT_EQ(daemon_->last_attach_body(), (nlohmann::json{{"min", 1}})) << "no \"max\": the whole pool";

    setenv("MALL_MIN", "2", 1);
    setenv("MALL_MAX", "3", 1);
    open_handle(MALL_SUCCESS);
    EXPECT_EQ(daemon_->last_attach_body(), (nlohmann::json{{"min", 2}, {"max", 3}}));
}

TEST_F(ClientTest, BadEnvironmentIsAnInvalidArgument) {
    mall_t *m = reinterpret_cast<mall_t *>(0x1);
    mall_error_t err{};
    setenv("MALL_MIN", "two", 1);
    EXPECT_EQ(mall_open(socket_.c_str(), &m, &err), MALL_ERR_INVAL);
    EXPECT_EQ(m, nullptr);
    EXPECT_NE(std::string(err.text).find("MALL_MIN"), std::string::npos) << err.text;
    unsetenv("MALL_MIN");
    setenv("MALL_JOB_ID", "no/slashes", 1);
    EXPECT_EQ(mall_open(socket_.c_str(), &m, &err), MALL_ERR_INVAL);
    EXPECT_NE(std::string(err.text).find("MALL_JOB_ID"), std::string::npos) << err.text;
}

TEST_F(ClientTest, ChangeRunsCallbacksRepinsBoundThreadsAndAcks) {
    if (!process_may_use(0) || !process_may_use(1)) GTEST_SKIP() << "needs cpus 0 and 1 in this process's affinity";
    start_daemon(1, "0-1");
    mall_t *m = open_handle(MALL_SUCCESS);
    ASSERT_NE(m, nullptr);
    Recorder rec;
    ASSERT_EQ(mall_on_resize(m, &Recorder::first, &rec), MALL_SUCCESS);
    ASSERT_EQ(mall_on_resize(m, &Recorder::second, &rec), MALL_SUCCESS);

    BoundThread worker(m);
    ASSERT_EQ(worker.bind_rc(), MALL_SUCCESS);
    std::string main_before = cpus_allowed_list(gettid_());
    ASSERT_EQ(mall_step(m), MALL_SUCCESS);
    EXPECT_EQ(cpus_allowed_list(worker.tid()), "0-1");

    uint64_t g = daemon_->publish("0");
    ASSERT_EQ(mall_step(m), MALL_SUCCESS);
    EXPECT_EQ(cpus_allowed_list(worker.tid()), "0");
    EXPECT_TRUE(daemon_->wait_for_ack(g, 5s));

    g = daemon_->publish("1");
    ASSERT_EQ(mall_step(m), MALL_SUCCESS);
    EXPECT_EQ(cpus_allowed_list(worker.tid()), "1");
    EXPECT_TRUE(daemon_->wait_for_ack(g, 5s));
    EXPECT_EQ(mall_step(m), MALL_NOUPDT);

    // A thread that binds after a change is pinned at once; one that exited is dropped quietly.
    {
        BoundThread late(m);
        EXPECT_EQ(late.bind_rc(), MALL_SUCCESS);
        EXPECT_EQ(cpus_allowed_list(late.tid()), "1");
    }
    g = daemon_->publish("0-1");
    ASSERT_EQ(mall_step(m), MALL_SUCCESS);
    EXPECT_EQ(cpus_allowed_list(worker.tid()), "0-1");
    EXPECT_TRUE(daemon_->wait_for_ack(g, 5s));

    // The stepping thread itself was never bound: its mask is its own.
    EXPECT_EQ(cpus_allowed_list(gettid_()), main_before);
    EXPECT_EQ(rec.calls, (std::vector<std::string>{"first:1:0-1", "second:1:0-1", "first:2:0", "second:2:0",
                                                   "first:3:1", "second:3:1", "first:4:0-1", "second:4:0-1"}));
}

TEST_F(ClientTest, UnbindStopsRepinning) {
    if (!process_may_use(0) || !process_may_use(1)) GTEST_SKIP() << "needs cpus 0 and 1 in this process's affinity";
    start_daemon(1, "0-1");
    mall_t *m = open_handle(MALL_SUCCESS);
    ASSERT_EQ(mall_step(m), MALL_SUCCESS);
    ASSERT_EQ(mall_bind_thread(m), MALL_SUCCESS);
    ASSERT_EQ(mall_unbind_thread(m), MALL_SUCCESS);
    daemon_->publish("1");
    ASSERT_EQ(mall_step(m), MALL_SUCCESS);
    EXPECT_EQ(cpus_allowed_list(gettid_()), "0-1");  // pinned at bind time to 0-1, not moved to 1
    cpu_set_t restore;
    CPU_ZERO(&restore);
    CPU_SET(0, &restore);
    CPU_SET(1, &restore);
    sched_setaffinity(0, sizeof restore, &restore);
}

TEST_F(ClientTest, FdIsReadableWhileAChangeIsPending) {
    start_daemon(1, "0");
    mall_t *m = open_handle(MALL_SUCCESS);
    int fd = mall_fd(m);
    ASSERT_GE(fd, 0);
    EXPECT_TRUE(readable(fd, 5000)) << "the initial allocation is pending, the fd should say so";
    ASSERT_EQ(mall_step(m), MALL_SUCCESS);
    EXPECT_FALSE(readable(fd, 0)) << "mall_step should drain the fd";

    uint64_t g = daemon_->publish("0", /*notify=*/true);
    EXPECT_TRUE(readable(fd, 5000)) << "no wake-up after a Notify";
    EXPECT_EQ(mall_step(m), MALL_SUCCESS);
    EXPECT_FALSE(readable(fd, 0));
    EXPECT_TRUE(daemon_->wait_for_ack(g, 5s));

    // A Notify for a generation that is already applied must not leave the fd readable.
    g = daemon_->publish("0", /*notify=*/false);
    ASSERT_EQ(mall_step(m), MALL_SUCCESS);
    EXPECT_EQ(mall_fd(m), fd);
    // Without a Notify, the monitor's periodic check still wakes a waiting loop.
    daemon_->publish("0", /*notify=*/false);
    EXPECT_TRUE(readable(fd, 5000)) << "no wake-up for a change published without Notify";
    EXPECT_EQ(mall_step(m), MALL_SUCCESS);
    EXPECT_FALSE(readable(fd, 0));
}

TEST_F(ClientTest, ProgressTotalsReachTheDaemon) {
    start_daemon(1, "0");
    mall_t *m = open_handle(MALL_SUCCESS);
    EXPECT_EQ(mall_report_progress(m, 10), MALL_SUCCESS);
    EXPECT_EQ(mall_report_progress(m, 20), MALL_SUCCESS);
    EXPECT_TRUE(daemon_->wait_for_progress(30, 2, 5s)) << daemon_->last_progress().dump();
    EXPECT_EQ(mall_report_progress(m, 5), MALL_SUCCESS);
    EXPECT_TRUE(daemon_->wait_for_progress(35, 3, 5s)) << daemon_->last_progress().dump();
}

TEST_F(ClientTest, ReconnectsByItselfAfterDaemonRestart) {
    start_daemon(1, "0");
    mall_t *m = open_handle(MALL_SUCCESS);
    int fd = mall_fd(m);
    ASSERT_EQ(mall_step(m), MALL_SUCCESS);

    daemon_->stop();
    ASSERT_TRUE(wait_until([&] { return mall_attached(m) == MALL_ERR_DETACHED; }, 10s));
    EXPECT_EQ(mall_step(m), MALL_NOUPDT) << "a detached handle keeps its last allocation";
    EXPECT_STREQ(mall_job_id(m), "");

    start_daemon(10, "0-1");
    ASSERT_TRUE(step_until_success(m, 10s)) << "the handle did not re-attach to the restarted daemon";
    mall_alloc_t alloc{};
    ASSERT_EQ(mall_get_allocation(m, &alloc), MALL_SUCCESS);
    EXPECT_EQ(alloc.generation, 10u);
    EXPECT_STREQ(alloc.cpus, "0-1");
    EXPECT_EQ(alloc.ncpus, 2);
    EXPECT_EQ(mall_attached(m), MALL_SUCCESS);
    EXPECT_STREQ(mall_job_id(m), "fake-job");
    EXPECT_TRUE(daemon_->wait_for_ack(10, 5s));
    EXPECT_EQ(mall_fd(m), fd) << "mall_fd must stay the same across reconnects";
    EXPECT_EQ(daemon_->last_attach_body(), (nlohmann::json{{"job", "fake-job"}}))
        << "a self-registered process re-attaches to its job by name";

    uint64_t g = daemon_->publish("1");
    EXPECT_TRUE(step_until_success(m, 5s));
    ASSERT_EQ(mall_get_allocation(m, &alloc), MALL_SUCCESS);
    EXPECT_EQ(alloc.generation, g);
    EXPECT_STREQ(alloc.cpus, "1");
}

TEST_F(ClientTest, SelfRegistersAgainWhenTheRestartedDaemonForgotTheJob) {
    start_daemon(1, "0");
    mall_t *m = open_handle(MALL_SUCCESS);
    ASSERT_EQ(mall_step(m), MALL_SUCCESS);
    daemon_->stop();
    ASSERT_TRUE(wait_until([&] { return mall_attached(m) == MALL_ERR_DETACHED; }, 10s));
    int attaches = daemon_->attach_count();
    daemon_->set_forget_jobs(true);
    start_daemon(1, "1");
    ASSERT_TRUE(wait_until([&] { return mall_attached(m) == MALL_SUCCESS; }, 10s));
    EXPECT_GE(daemon_->attach_count(), attaches + 2) << "first by name (refused), then self-registration";
    EXPECT_EQ(daemon_->last_attach_body(), (nlohmann::json{{"min", 1}}));
    // The new page counts from generation 1 again, with other cpus: it must still be applied.
    ASSERT_EQ(mall_step(m), MALL_SUCCESS);
    mall_alloc_t alloc{};
    ASSERT_EQ(mall_get_allocation(m, &alloc), MALL_SUCCESS);
    EXPECT_EQ(alloc.generation, 1u);
    EXPECT_STREQ(alloc.cpus, "1");
    EXPECT_TRUE(daemon_->wait_for_ack(1, 5s));
    EXPECT_EQ(mall_step(m), MALL_NOUPDT);
}

TEST_F(ClientTest, ReadoptedGenerationIsAckedWithoutAChange) {
    start_daemon(4, "0");
    mall_t *m = open_handle(MALL_SUCCESS);
    ASSERT_EQ(mall_step(m), MALL_SUCCESS);
    ASSERT_TRUE(daemon_->wait_for_ack(4, 5s));
    daemon_->stop();
    ASSERT_TRUE(wait_until([&] { return mall_attached(m) == MALL_ERR_DETACHED; }, 10s));
    start_daemon(4, "0");  // a restarted malld re-adopting the job as it was
    EXPECT_TRUE(daemon_->wait_for_ack(4, 10s)) << "the re-attached process should ack the generation it holds";
    EXPECT_EQ(mall_step(m), MALL_NOUPDT);
}

TEST_F(ClientTest, AttachesLaterWhenStartedBeforeTheDaemon) {
    mall_error_t err{};
    mall_t *m = open_handle(MALL_ERR_NODAEMON, &err);
    ASSERT_NE(m, nullptr);
    EXPECT_NE(std::string(err.text).find(socket_), std::string::npos) << err.text;
    EXPECT_EQ(mall_step(m), MALL_NOUPDT);
    start_daemon(3, "0");
    ASSERT_TRUE(step_until_success(m, 10s));
    mall_alloc_t alloc{};
    ASSERT_EQ(mall_get_allocation(m, &alloc), MALL_SUCCESS);
    EXPECT_EQ(alloc.generation, 3u);
    EXPECT_TRUE(daemon_->wait_for_ack(3, 5s));
}

TEST_F(ClientTest, ErrorRepliesMapToReturnCodes) {
    start_daemon(1, "0");
    struct Case {
        int code;
        int expected;
    };
    for (Case c : {Case{MALL_ERR_DENIED, MALL_ERR_DENIED}, Case{MALL_ERR_NOJOB, MALL_ERR_NOJOB},
                   Case{-99, MALL_ERR_PROTOCOL}, Case{3, MALL_ERR_PROTOCOL}}) {
        daemon_->set_mode(FakeDaemon::Mode::Refuse, c.code, "refused for test " + std::to_string(c.code));
        mall_error_t err{};
        mall_t *m = open_handle(c.expected, &err);
        ASSERT_NE(m, nullptr);
        EXPECT_NE(std::string(err.text).find("refused for test " + std::to_string(c.code)), std::string::npos)
            << err.text;
        EXPECT_EQ(mall_attached(m), MALL_ERR_DETACHED);
        EXPECT_EQ(mall_step(m), MALL_NOUPDT);
    }
}

TEST_F(ClientTest, SilentDaemonMakesOpenReturnWithinItsBound) {
    start_daemon(1, "0");
    daemon_->set_mode(FakeDaemon::Mode::Silent);
    auto begin = std::chrono::steady_clock::now();
    mall_error_t err{};
    mall_t *m = open_handle(MALL_ERR_NODAEMON, &err);
    auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - begin);
    std::printf("mall_open against a silent daemon returned after %lld ms: %s\n",
                static_cast<long long>(took.count()), err.text);
    ASSERT_NE(m, nullptr);
    EXPECT_NE(std::string(err.text).find("did not answer"), std::string::npos) << err.text;
    EXPECT_EQ(mall_step(m), MALL_NOUPDT);
}

// mall.h's contract for *out: NULL exactly when no handle could be made (MALL_ERR_INVAL,
// MALL_ERR_NOMEM, or MALL_ERR_SYSTEM from making it); a detached handle on every other error. Out
// of file descriptors, the handle's eventfds cannot be made: MALL_ERR_SYSTEM with *out NULL and
// words that say why (a child process, so the test's own descriptors are untouched).
TEST(ClientOpen, OutOfDescriptorsGivesSystemErrorAndNoHandle) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        ::setenv("MALL_SOCKET", "/nonexistent/mall-test.sock", 1);
        ::unsetenv("MALL_JOB_ID");
        rlimit limit{64, 64};
        if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) ::_exit(10);
        while (::open("/dev/null", O_RDONLY | O_CLOEXEC) >= 0) {
        }
        if (errno != EMFILE) ::_exit(11);
        mall_t *m = reinterpret_cast<mall_t *>(0x1);  // must come back NULL
        mall_error_t err{};
        const int rc = mall_open(nullptr, &m, &err);
        if (rc != MALL_ERR_SYSTEM) ::_exit(20);
        if (m != nullptr) ::_exit(21);
        if (std::strstr(err.text, "eventfd") == nullptr) ::_exit(22);
        mall_close(m);  // NULL is accepted
        ::_exit(0);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status)) << "the child died instead of getting an error";
    EXPECT_EQ(WEXITSTATUS(status), 0) << "10/11: could not exhaust descriptors; 20: not MALL_ERR_SYSTEM; "
                                         "21: *out was not NULL; 22: the words do not say eventfd";
}

TEST_F(ClientTest, DetachedFastPathSaysNothingChanged) {
    mall_t *m = open_handle(MALL_ERR_NODAEMON);
    ASSERT_NE(m, nullptr);
    for (int i = 0; i < 100000; ++i) ASSERT_EQ(mall_step(m), MALL_NOUPDT);
    mall_alloc_t alloc;
    std::memset(&alloc, 0xff, sizeof alloc);
    ASSERT_EQ(mall_get_allocation(m, &alloc), MALL_SUCCESS);
    EXPECT_EQ(alloc.generation, 0u);
    EXPECT_EQ(alloc.ncpus, 0);
    EXPECT_STREQ(mall_job_id(m), "");
    EXPECT_EQ(mall_attached(m), MALL_ERR_DETACHED);
    EXPECT_FALSE(readable(mall_fd(m), 0));
}

// mall_on_resize_with_release: the handle owns the argument and mall_close() releases it exactly
// once; a registration that fails (16 callbacks already) leaves it with the caller.
TEST(ClientCallbacks, CloseReleasesOwnedArgumentsOnceAndFailuresKeepThem) {
    struct Owned {
        int *released;
    };
    int released = 0;
    auto release = [](void *arg) {
        auto *owned = static_cast<Owned *>(arg);
        ++*owned->released;
        delete owned;
    };
    auto ignore = [](const mall_alloc_t *, void *) {};
    mall_t *m = nullptr;
    mall_open("/nonexistent/mall-test-release.sock", &m, nullptr);  // detached, still a handle
    ASSERT_NE(m, nullptr);
    EXPECT_EQ(mall_on_resize_with_release(m, ignore, new Owned{&released}, release), MALL_SUCCESS);
    EXPECT_EQ(mall_on_resize_with_release(m, ignore, nullptr, nullptr), MALL_SUCCESS);  // no release: fine
    for (int i = 2; i < 16; ++i) ASSERT_EQ(mall_on_resize(m, ignore, nullptr), MALL_SUCCESS);
    Owned refused{&released};
    EXPECT_EQ(mall_on_resize_with_release(m, ignore, &refused, release), MALL_ERR_FULL);
    EXPECT_EQ(mall_on_resize_with_release(nullptr, ignore, &refused, release), MALL_ERR_INVAL);
    EXPECT_EQ(mall_step(m), MALL_NOUPDT);
    EXPECT_EQ(released, 0) << "nothing is released before mall_close()";
    mall_close(m);
    EXPECT_EQ(released, 1);
}

TEST_F(ClientTest, OtherProtocolVersionIsReported) {
    mall_error_t err{};
    mall_t *m = nullptr;
    {
        ScriptedServer server(socket_, reply_packet(2, mall::proto::ok_reply({{"job", "x"}})));
        EXPECT_EQ(mall_open(socket_.c_str(), &m, &err), MALL_ERR_VERSION) << err.text;
        mall_close(m);
    }
    EXPECT_NE(std::string(err.text).find("version 2"), std::string::npos) << err.text;
}

TEST_F(ClientTest, ReplyWithoutPageIsAProtocolError) {
    mall_error_t err{};
    mall_t *m = nullptr;
    {
        ScriptedServer server(socket_, reply_packet(mall::proto::kVersion, mall::proto::ok_reply({{"job", "x"}})));
        EXPECT_EQ(mall_open(socket_.c_str(), &m, &err), MALL_ERR_PROTOCOL) << err.text;
        mall_close(m);
    }
    EXPECT_NE(std::string(err.text).find("page"), std::string::npos) << err.text;
}

TEST_F(ClientTest, ShortPageIsRefusedInsteadOfCrashing) {
    int fd = memfd_create("short-page", MFD_CLOEXEC);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ftruncate(fd, 100), 0);
    mall_error_t err{};
    mall_t *m = nullptr;
    {
        ScriptedServer server(socket_, reply_packet(mall::proto::kVersion, mall::proto::ok_reply({{"job", "x"}})), fd);
        EXPECT_EQ(mall_open(socket_.c_str(), &m, &err), MALL_ERR_PROTOCOL) << err.text;
        EXPECT_EQ(mall_step(m), MALL_NOUPDT);
        mall_close(m);
    }
    close(fd);
}

TEST_F(ClientTest, WrapperContainsThrowingCallbacks) {
    start_daemon(1, "0");
    auto [client, rc, error] = mall::Client::open(socket_);
    ASSERT_EQ(rc, MALL_SUCCESS) << error;
    ASSERT_TRUE(client.attached());
    EXPECT_EQ(client.job_id(), "fake-job");
    std::vector<uint64_t> seen;
    EXPECT_EQ(client.on_resize([](const mall_alloc_t &) { throw std::runtime_error("callback failed"); }),
              MALL_SUCCESS);
    EXPECT_EQ(client.on_resize([&](const mall_alloc_t &a) { seen.push_back(a.generation); }), MALL_SUCCESS);
    EXPECT_EQ(client.step(), MALL_SUCCESS);
    EXPECT_EQ(seen, (std::vector<uint64_t>{1}));
    EXPECT_EQ(client.callback_failures(), 1u);
    EXPECT_TRUE(daemon_->wait_for_ack(1, 5s));

    mall::Client moved = std::move(client);  // the trampoline's table moves with it
    uint64_t g = daemon_->publish("0");
    EXPECT_EQ(moved.step(), MALL_SUCCESS);
    EXPECT_EQ(seen, (std::vector<uint64_t>{1, g}));
    EXPECT_EQ(moved.allocation().generation, g);
    EXPECT_GE(moved.fd(), 0);
    EXPECT_EQ(moved.report_progress(1), MALL_SUCCESS);
    EXPECT_EQ(client.step(), MALL_ERR_INVAL);  // the moved-from wrapper holds nothing

    auto missing = mall::Client::open(dir_ + "/none.sock");
    EXPECT_EQ(missing.rc, MALL_ERR_NODAEMON);
    EXPECT_FALSE(missing.error.empty());
    EXPECT_EQ(missing.client.step(), MALL_NOUPDT);

    // With options: a bad one is refused with words and no client.
    mall_open_options_t options = MALL_OPEN_OPTIONS_INIT;
    options.socket_path = socket_.c_str();
    options.notify_signal = SIGTERM;
    auto refused = mall::Client::open(options);
    EXPECT_EQ(refused.rc, MALL_ERR_INVAL);
    EXPECT_FALSE(refused.client);
    EXPECT_NE(refused.error.find("notify_signal"), std::string::npos) << refused.error;
}

