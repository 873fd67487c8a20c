// SPDX-License-Identifier: BSD-3-Clause
// test_client.cpp — proves libmall's handshake against an in-process fake malld (no real malld):
// attach, apply, callbacks, re-pinning, acks, mall_fd, progress, reconnection, error mapping,
// bounded open, the C++ wrapper's exception barrier; plus the seqlock page, the socket helpers and
// CtlClient underneath.
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/ctl_client.hpp"
#include "common/protocol.hpp"
#include "common/shared_page.hpp"
#include "common/signal_control.hpp"
#include "common/unix_socket.hpp"
#include "mall/mall.h"
#include "mall/mall.hpp"
#include "support/fake_daemon.hpp"
#include "support/watchdog.h"

using namespace std::chrono_literals;
using mall::test::FakeDaemon;

namespace {

MALL_TEST_WATCHDOG(60);

bool wait_until(const std::function<bool()> &done, std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
        if (done()) return true;
        std::this_thread::sleep_for(1ms);
    }
    return done();
}

// Steps until a change is applied (or the timeout passes).
bool step_until_success(mall_t *m, std::chrono::milliseconds timeout) {
    return wait_until([&] { return mall_step(m) == MALL_SUCCESS; }, timeout);
}

pid_t gettid_() { return static_cast<pid_t>(syscall(SYS_gettid)); }

std::string cpus_allowed_list(pid_t tid) {
    std::ifstream status("/proc/self/task/" + std::to_string(tid) + "/status");
    std::string line;
    while (std::getline(status, line)) {
        const std::string key = "Cpus_allowed_list:";
        if (line.rfind(key, 0) == 0) {
            std::string value = line.substr(key.size());
            value.erase(0, value.find_first_not_of(" \t"));
            return value;
        }
    }
    return "?";
}

bool process_may_use(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) != 0) return false;
    return CPU_ISSET(cpu, &set);
}

bool readable(int fd, int timeout_ms) {
    pollfd pfd{fd, POLLIN, 0};
    return poll(&pfd, 1, timeout_ms) == 1;
}

// Each test gets its own folder and socket, removed afterwards; the environment is cleared.
class ClientTest : public ::testing::Test {
protected:
    void SetUp() override {
        char pattern[] = "/tmp/mall-client-test-XXXXXX";
        ASSERT_NE(mkdtemp(pattern), nullptr);
        dir_ = pattern;
        socket_ = dir_ + "/malld.sock";
        for (const char *name : {"MALL_JOB_ID", "MALL_MIN", "MALL_MAX", "MALL_SOCKET"}) unsetenv(name);
        daemon_ = std::make_unique<FakeDaemon>(socket_);
    }
    void TearDown() override {
        for (mall_t *m : handles_) mall_close(m);
        daemon_.reset();
        unlink(socket_.c_str());
        rmdir(dir_.c_str());
        for (const char *name : {"MALL_JOB_ID", "MALL_MIN", "MALL_MAX"}) unsetenv(name);
    }

    void start_daemon(uint64_t generation, const std::string &cpus) {
        std::string error;
        ASSERT_TRUE(daemon_->start(generation, cpus, &error)) << error;
    }

    // Opens a handle closed at teardown.
    mall_t *open_handle(int expected_rc, mall_error_t *err_out = nullptr) {
        mall_t *m = nullptr;
        mall_error_t err{};
        int rc = mall_open(socket_.c_str(), &m, &err);
        EXPECT_EQ(rc, expected_rc) << mall_strerror(rc) << ": " << err.text;
        if (m) handles_.push_back(m);
        if (err_out) *err_out = err;
        return m;
    }

    std::string dir_, socket_;
    std::unique_ptr<FakeDaemon> daemon_;
    std::vector<mall_t *> handles_;
};

// Records what the resize callbacks saw.
struct Recorder {
    std::mutex mu;
    std::vector<std::string> calls;
    mall_alloc_t last{};

    static void first(const mall_alloc_t *alloc, void *arg) { static_cast<Recorder *>(arg)->record("first", alloc); }
    static void second(const mall_alloc_t *alloc, void *arg) {
        static_cast<Recorder *>(arg)->record("second", alloc);
    }
    void record(const char *who, const mall_alloc_t *alloc) {
        std::lock_guard<std::mutex> lock(mu);
        calls.push_back(std::string(who) + ":" + std::to_string(alloc->generation) + ":" + alloc->cpus);
        last = *alloc;
    }
};

// A thread that binds itself to the handle and waits to be released.
class BoundThread {
public:
    explicit BoundThread(mall_t *m) {
        thread_ = std::thread([this, m] {
            int rc = mall_bind_thread(m);
            {
                std::lock_guard<std::mutex> lock(mu_);
                tid_ = gettid_();
                bind_rc_ = rc;
            }
            cv_.notify_all();
            std::unique_lock<std::mutex> lock(mu_);
            cv_.wait(lock, [this] { return done_; });
        });
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return tid_ != 0; });
    }
    ~BoundThread() {
        {
            std::lock_guard<std::mutex> lock(mu_);
            done_ = true;
        }
        cv_.notify_all();
        thread_.join();
    }
    pid_t tid() const { return tid_; }
    int bind_rc() const { return bind_rc_; }

private:
    std::mutex mu_;
    std::condition_variable cv_;
    pid_t tid_ = 0;
    int bind_rc_ = 0;
    bool done_ = false;
    std::thread thread_;
};

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

// Notification by signal: with a handler installed the process gets the signal (value: the
// generation) for each change it has not applied yet; the handshake still happens at mall_step().
std::atomic<int> g_notified{0};
std::atomic<int> g_notified_value{-1};
void on_notify(int, siginfo_t *info, void *) {
    g_notified_value.store(info->si_value.sival_int);
    g_notified.fetch_add(1);
}

TEST_F(ClientTest, NotifySignalArrivesForEachUnappliedChange) {
    struct sigaction sa {}, old {};
    sa.sa_sigaction = on_notify;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    ASSERT_EQ(sigaction(SIGUSR2, &sa, &old), 0);
    start_daemon(1, "0");
    mall_open_options_t options = MALL_OPEN_OPTIONS_INIT;
    options.socket_path = socket_.c_str();
    options.notify_signal = SIGUSR2;
    mall_t *m = nullptr;
    mall_error_t err{};
    ASSERT_EQ(mall_open_ex(&options, &m, &err), MALL_SUCCESS) << err.text;
    handles_.push_back(m);
    EXPECT_TRUE(wait_until([] { return g_notified.load() >= 1; }, 5s)) << "no signal for the first allocation";
    EXPECT_EQ(g_notified_value.load(), 1);
    ASSERT_EQ(mall_step(m), MALL_SUCCESS);
    const int before = g_notified.load();
    const uint64_t g = daemon_->publish("0", /*notify=*/true);
    EXPECT_TRUE(wait_until([&] { return g_notified.load() > before; }, 5s)) << "no signal after a Notify";
    EXPECT_EQ(g_notified_value.load(), static_cast<int>(g));
    EXPECT_EQ(mall_step(m), MALL_SUCCESS);
    EXPECT_TRUE(daemon_->wait_for_ack(g, 5s));
    sigaction(SIGUSR2, &old, nullptr);
}

// A signal whose disposition is the default would end the process: libmall sends nothing, and
// the change still applies at mall_step(). (Were it sent, this test process would die.)
TEST_F(ClientTest, NotifySignalIsNeverSentWhileItsActionIsTheDefault) {
    const int sig = SIGRTMIN + 5;
    signal(sig, SIG_DFL);
    start_daemon(1, "0");
    setenv("MALL_NOTIFY_SIGNAL", ("SIGRTMIN+" + std::to_string(5)).c_str(), 1);
    mall_t *m = open_handle(MALL_SUCCESS);
    unsetenv("MALL_NOTIFY_SIGNAL");
    const uint64_t g = daemon_->publish("0", /*notify=*/true);
    EXPECT_TRUE(readable(mall_fd(m), 5000));
    std::this_thread::sleep_for(200ms);  // a sampling interval: time for a (wrong) signal to land
    // A handler installed after the change was published still gets it (the monitor re-checks
    // every 500 ms and had sent nothing).
    struct sigaction sa {}, old {};
    sa.sa_sigaction = on_notify;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    const int before = g_notified.load();
    ASSERT_EQ(sigaction(sig, &sa, &old), 0);
    EXPECT_TRUE(wait_until([&] { return g_notified.load() > before; }, 5s)) << "the late handler got nothing";
    EXPECT_EQ(g_notified_value.load(), static_cast<int>(g));
    EXPECT_EQ(mall_step(m), MALL_SUCCESS);
    EXPECT_TRUE(daemon_->wait_for_ack(g, 5s));
    sigaction(sig, &old, nullptr);
}

TEST_F(ClientTest, BadNotifySignalsAreRefusedWithWords) {
    start_daemon(1, "0");
    for (const char *bad : {"SIGTERM", "9", "SIGRTMIN+99", "USR3", "abc"}) {
        setenv("MALL_NOTIFY_SIGNAL", bad, 1);
        mall_t *m = nullptr;
        mall_error_t err{};
        EXPECT_EQ(mall_open(socket_.c_str(), &m, &err), MALL_ERR_INVAL) << bad;
        EXPECT_EQ(m, nullptr) << bad;
        EXPECT_NE(std::string(err.text).find("MALL_NOTIFY_SIGNAL"), std::string::npos) << err.text;
    }
    unsetenv("MALL_NOTIFY_SIGNAL");
    mall_open_options_t options = MALL_OPEN_OPTIONS_INIT;
    options.socket_path = socket_.c_str();
    mall_t *m = nullptr;
    mall_error_t err{};
    options.notify_signal = SIGKILL;
    EXPECT_EQ(mall_open_ex(&options, &m, &err), MALL_ERR_INVAL) << err.text;
    options.notify_signal = 0;
    options.flags = 0x80;
    EXPECT_EQ(mall_open_ex(&options, &m, &err), MALL_ERR_INVAL) << err.text;
    options.flags = 0;
    options.size = 4;
    EXPECT_EQ(mall_open_ex(&options, &m, &err), MALL_ERR_INVAL) << err.text;
    EXPECT_EQ(mall_open_ex(nullptr, &m, &err), MALL_ERR_INVAL);
    EXPECT_EQ(m, nullptr);
    // A larger struct (a newer header) with zero bytes past what this library knows is fine.
    struct {
        mall_open_options_t known;
        char newer[16];
    } larger{};
    larger.known = MALL_OPEN_OPTIONS_INIT;
    larger.known.size = sizeof larger;
    larger.known.socket_path = socket_.c_str();
    EXPECT_EQ(mall_open_ex(&larger.known, &m, &err), MALL_SUCCESS) << err.text;
    if (m) handles_.push_back(m);
    m = nullptr;
    larger.newer[3] = 1;
    EXPECT_EQ(mall_open_ex(&larger.known, &m, &err), MALL_ERR_INVAL) << err.text;
}

// Control by signal, in process (mallctl signal does the same from outside): a queued request
// applies at the next mall_step() through the callbacks and the pinning of every thread, within the
// cpus the process had at open; anything else is ignored; an attached handle refuses; mall_close()
// leaves the signal ignored, never at its default (which would end the process).
std::string my_threads_lists() {
    std::string out;
    for (const auto &entry : std::filesystem::directory_iterator("/proc/self/task")) {
        std::ifstream status(entry.path() / "status");
        std::string line;
        while (std::getline(status, line))
            if (line.rfind("Cpus_allowed_list:", 0) == 0) out += line.substr(line.find_first_not_of(" \t", 18)) + " ";
    }
    return out;
}

bool every_thread_on(const std::string &list) {
    std::string all = my_threads_lists();
    size_t n = 0;
    for (size_t pos = 0; (pos = all.find(' ', pos)) != std::string::npos; ++pos) ++n;
    std::string expected;
    for (size_t i = 0; i < n; ++i) expected += list + " ";
    return n > 0 && all == expected;
}

// The process's own mall-signal record (what `mallctl signal` reads), nullopt when there is none.
std::optional<mall::signal_control::Record> own_record() {
    DIR *dir = opendir("/proc/self/fd");
    if (!dir) return std::nullopt;
    std::optional<mall::signal_control::Record> record;
    while (dirent *e = readdir(dir)) {
        char target[256];
        const std::string path = std::string("/proc/self/fd/") + e->d_name;
        const ssize_t n = readlink(path.c_str(), target, sizeof target - 1);
        if (n <= 0) continue;
        target[n] = '\0';
        if (std::string(target) != "/memfd:mall-signal (deleted)") continue;
        std::string text(mall::signal_control::kRecordSize, '\0');
        const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) break;
        const ssize_t got = pread(fd, text.data(), text.size(), 0);
        close(fd);
        if (got > 0) record = mall::signal_control::parse_record(text);
        break;
    }
    closedir(dir);
    return record;
}

void queue_control(uint32_t value) {
    union sigval v;
    v.sival_int = static_cast<int>(value);
    ASSERT_EQ(sigqueue(getpid(), SIGRTMAX - 7, v), 0) << std::strerror(errno);
}

TEST_F(ClientTest, ControlBySignalAppliesAtTheNextStepWithinTheOpeningCpus) {
    cpu_set_t start_set;
    ASSERT_EQ(sched_getaffinity(0, sizeof start_set, &start_set), 0);
    if (CPU_COUNT(&start_set) < 2 || !CPU_ISSET(0, &start_set) || !CPU_ISSET(1, &start_set))
        GTEST_SKIP() << "needs cpus 0 and 1 in this process's affinity";
    mall_open_options_t options = MALL_OPEN_OPTIONS_INIT;
    options.socket_path = socket_.c_str();  // no daemon: never attached
    options.control_signal = SIGRTMAX - 7;
    mall_t *m = nullptr;
    mall_error_t err{};
    ASSERT_EQ(mall_open_ex(&options, &m, &err), MALL_ERR_NODAEMON) << err.text;
    ASSERT_NE(m, nullptr);
    handles_.push_back(m);  // closed at teardown if an assertion ends the test early
    std::vector<std::pair<int, std::string>> seen;  // (threads, cpus)
    auto remember = [](const mall_alloc_t *a, void *arg) {
        static_cast<std::vector<std::pair<int, std::string>> *>(arg)->push_back({mall_alloc_threads(a), a->cpus});
    };
    ASSERT_EQ(mall_on_resize(m, remember, &seen), MALL_SUCCESS);
    EXPECT_EQ(mall_step(m), MALL_NOUPDT);

    // A forked child is not the process that opted in: no record there, so mallctl refuses it.
    ASSERT_TRUE(own_record());
    const pid_t child = fork();
    if (child == 0) _exit(own_record() ? 1 : 0);
    int child_status = -1;
    ASSERT_EQ(waitpid(child, &child_status, 0), child);
    EXPECT_TRUE(WIFEXITED(child_status) && WEXITSTATUS(child_status) == 0) << "the child kept the record";
    ASSERT_TRUE(own_record()) << "the parent keeps its record";

    // A second handle cannot take the signal; nor can a signal that has a handler of its own.
    mall_t *second = nullptr;
    EXPECT_EQ(mall_open_ex(&options, &second, &err), MALL_ERR_INVAL);
    EXPECT_NE(std::string(err.text).find("already enabled"), std::string::npos) << err.text;

    namespace sc = mall::signal_control;
    auto record = own_record();
    ASSERT_TRUE(record) << "no mall-signal record in /proc/self/fd";
    EXPECT_EQ(record->pid, getpid());
    EXPECT_EQ(record->signal, SIGRTMAX - 7);
    EXPECT_EQ(record->mode, "detached");
    EXPECT_EQ(record->bound, "0-1");
    EXPECT_EQ(record->result, "none");
    EXPECT_EQ(record->handled, 0u);
    queue_control(*sc::encode_threads(1, nullptr));
    EXPECT_EQ(own_record()->handled, 0u) << "the handler only takes the request; the step decides it";
    EXPECT_EQ(mall_step(m), MALL_SUCCESS);
    ASSERT_EQ(seen.size(), 1u);
    EXPECT_EQ(seen.back(), (std::pair<int, std::string>{1, "0-1"}));
    record = own_record();
    ASSERT_TRUE(record);
    EXPECT_EQ(record->result, "applied");
    EXPECT_EQ(record->received, 1u);
    EXPECT_EQ(record->handled, 1u);
    EXPECT_EQ(record->last, *sc::encode_threads(1, nullptr));
    EXPECT_EQ(record->from, getpid());
    EXPECT_EQ(record->threads, 1);
    EXPECT_EQ(record->cpus, "0-1");
    mall_alloc_t alloc{};
    ASSERT_EQ(mall_get_allocation(m, &alloc), MALL_SUCCESS);
    EXPECT_EQ(alloc.ncpus, 2);
    EXPECT_EQ(mall_alloc_threads(&alloc), 1);
    EXPECT_EQ(mall_step(m), MALL_NOUPDT);

    queue_control(*sc::encode_range(0, 0, 1, nullptr));  // cpu 0, one thread per cpu
    EXPECT_EQ(mall_step(m), MALL_SUCCESS);
    EXPECT_EQ(seen.back(), (std::pair<int, std::string>{1, "0"}));
    EXPECT_TRUE(every_thread_on("0")) << my_threads_lists();
    queue_control(*sc::encode_range(0, 0, 2, nullptr));  // back to 0-1, two threads
    EXPECT_EQ(mall_step(m), MALL_SUCCESS);
    EXPECT_EQ(seen.back(), (std::pair<int, std::string>{2, "0-1"}));
    EXPECT_TRUE(every_thread_on("0-1")) << my_threads_lists();

    // Outside the opening cpus, not ours, or without a value: nothing changes.
    const size_t changes = seen.size();
    queue_control(*sc::encode_range(0, 600, 1, nullptr));
    EXPECT_EQ(mall_step(m), MALL_NOUPDT);
    record = own_record();
    ASSERT_TRUE(record);
    EXPECT_EQ(record->result, "refused");
    EXPECT_NE(record->why.find("cpus 600 are not all within 0-1"), std::string::npos) << record->why;
    EXPECT_EQ(record->cpus, "0-1") << "a refused request changes nothing";
    queue_control(0x12345678u);
    EXPECT_EQ(mall_step(m), MALL_NOUPDT);
    ASSERT_EQ(kill(getpid(), SIGRTMAX - 7), 0);  // SI_USER: no value, ignored, the process lives
    EXPECT_EQ(mall_step(m), MALL_NOUPDT);
    EXPECT_EQ(seen.size(), changes);

    handles_.pop_back();
    mall_close(m);
    struct sigaction after {};
    ASSERT_EQ(sigaction(SIGRTMAX - 7, nullptr, &after), 0);
    EXPECT_EQ(after.sa_handler, SIG_IGN) << "after close the signal must be ignored, not deadly";
    EXPECT_FALSE(own_record()) << "mall_close() drops the record: mallctl then says control is off";
    queue_control(*sc::encode_threads(1, nullptr));  // ignored: the test process lives on
    signal(SIGRTMAX - 7, SIG_DFL);

    // A signal with a handler of its own is refused.
    signal(SIGRTMAX - 7, [](int) {});
    EXPECT_EQ(mall_open_ex(&options, &second, &err), MALL_ERR_INVAL);
    EXPECT_NE(std::string(err.text).find("already has a handler"), std::string::npos) << err.text;
    signal(SIGRTMAX - 7, SIG_DFL);
}

TEST_F(ClientTest, ControlBySignalIsRefusedWhileAttachedToMalld) {
    start_daemon(1, "0");
    setenv("MALL_SIGNAL_CONTROL", "1", 1);
    mall_t *m = open_handle(MALL_SUCCESS);
    unsetenv("MALL_SIGNAL_CONTROL");
    ASSERT_EQ(mall_step(m), MALL_SUCCESS);  // malld's allocation: cpu 0
    auto record = own_record();
    ASSERT_TRUE(record);
    EXPECT_EQ(record->mode, "attached");
    EXPECT_EQ(record->job, "fake-job");
    EXPECT_FALSE(record->allowed);
    queue_control(*mall::signal_control::encode_threads(1, nullptr));
    EXPECT_EQ(mall_step(m), MALL_NOUPDT);
    mall_alloc_t alloc{};
    ASSERT_EQ(mall_get_allocation(m, &alloc), MALL_SUCCESS);
    EXPECT_STREQ(alloc.cpus, "0");
    record = own_record();
    ASSERT_TRUE(record);
    EXPECT_EQ(record->result, "refused");
    EXPECT_NE(record->why.find("attached to malld as job fake-job"), std::string::npos) << record->why;
    // malld's next change still applies.
    const uint64_t g = daemon_->publish("0", /*notify=*/false);
    EXPECT_EQ(mall_step(m), MALL_SUCCESS);
    EXPECT_TRUE(daemon_->wait_for_ack(g, 5s));
}

TEST_F(ClientTest, ControlBySignalNarrowsWithinMalldsCpusWhenTheJobAllowsIt) {
    cpu_set_t start_set;
    ASSERT_EQ(sched_getaffinity(0, sizeof start_set, &start_set), 0);
    if (!CPU_ISSET(0, &start_set) || !CPU_ISSET(1, &start_set)) GTEST_SKIP() << "needs cpus 0 and 1";
    start_daemon(1, "0-1");
    setenv("MALL_SIGNAL_CONTROL", "1", 1);
    mall_t *m = open_handle(MALL_SUCCESS);
    unsetenv("MALL_SIGNAL_CONTROL");
    ASSERT_EQ(mall_step(m), MALL_SUCCESS);
    namespace sc = mall::signal_control;
    // malld lets the job take signals (mallctl set JOB --signal-control on): a new generation.
    uint64_t g = daemon_->publish("0-1", false, mall::kPageFlagSignalControl);
    ASSERT_EQ(mall_step(m), MALL_SUCCESS);
    ASSERT_TRUE(daemon_->wait_for_ack(g, 5s));
    auto record = own_record();
    ASSERT_TRUE(record);
    EXPECT_TRUE(record->allowed);
    EXPECT_EQ(record->bound, "0-1");
    // Narrowing within malld's cpus applies, keeps malld's generation and sends no ack.
    queue_control(*sc::encode_range(0, 1, 1, nullptr));
    EXPECT_EQ(mall_step(m), MALL_SUCCESS);
    mall_alloc_t alloc{};
    ASSERT_EQ(mall_get_allocation(m, &alloc), MALL_SUCCESS);
    EXPECT_STREQ(alloc.cpus, "1");
    EXPECT_EQ(alloc.generation, g);
    EXPECT_TRUE(every_thread_on("1")) << my_threads_lists();
    // Widening past them does not.
    queue_control(*sc::encode_range(0, 0, 3, nullptr));
    EXPECT_EQ(mall_step(m), MALL_NOUPDT);
    EXPECT_NE(own_record()->why.find("not all within 0-1"), std::string::npos) << own_record()->why;
    // A request pending when malld publishes is superseded: malld's allocation wins.
    queue_control(*sc::encode_threads(1, nullptr));
    g = daemon_->publish("0-1", false, mall::kPageFlagSignalControl);
    EXPECT_EQ(mall_step(m), MALL_SUCCESS);
    ASSERT_EQ(mall_get_allocation(m, &alloc), MALL_SUCCESS);
    EXPECT_STREQ(alloc.cpus, "0-1");
    EXPECT_EQ(mall_alloc_threads(&alloc), 2);
    EXPECT_TRUE(daemon_->wait_for_ack(g, 5s));
    EXPECT_EQ(own_record()->result, "superseded");
    EXPECT_TRUE(every_thread_on("0-1")) << my_threads_lists();
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

// A one-shot scripted server: answers the first packet with `replies` (the first one carrying
// fd_to_pass when given), then waits for the client to hang up.
class ScriptedServer {
public:
    ScriptedServer(const std::string &path, std::string reply, int fd_to_pass = -1)
        : ScriptedServer(path, std::vector<std::string>{std::move(reply)}, fd_to_pass) {}
    ScriptedServer(const std::string &path, std::vector<std::string> replies, int fd_to_pass = -1) {
        std::string why;
        listen_fd_ = mall::unix_listen(path, 0600, &why);
        EXPECT_GE(listen_fd_, 0) << why;
        thread_ = std::thread([this, replies, fd_to_pass] {
            mall::UniqueFd conn(accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC));
            if (!conn) return;
            std::string data;
            if (mall::recv_packet(conn.get(), &data, mall::proto::kMaxPacket) <= 0) return;
            for (size_t i = 0; i < replies.size(); ++i)
                mall::send_packet(conn.get(), replies[i], i == 0 ? fd_to_pass : -1);
            mall::wait_readable(conn.get(), 5s);  // until the client hangs up
        });
    }
    ~ScriptedServer() {
        thread_.join();
        close(listen_fd_);
    }

private:
    int listen_fd_ = -1;
    std::thread thread_;
};

std::string reply_packet(uint16_t version, nlohmann::json body, mall::proto::Type type = mall::proto::Type::Reply,
                         uint32_t request_id = 1) {
    mall::proto::Message msg;
    msg.type = type;
    msg.request_id = request_id;
    msg.body = std::move(body);
    std::string packet = mall::proto::encode(msg);
    std::memcpy(&packet[4], &version, sizeof version);
    return packet;
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

// The page carries the thread count (mallctl set --threads) inside the seqlock; a page written
// without one (0, as by a malld before API 0.3) or with one out of range reads as one per cpu.
TEST(SharedPage, ThreadCountRoundTripsAndDefaultsToOnePerCpu) {
    auto page = std::make_unique<mall::SharedPage>();
    mall::page_init(page.get());
    uint64_t mask[MALL_MAX_CPUS / 64] = {};
    mask[0] = 0xf;
    mall_alloc_t snap{};
    mall::page_write(page.get(), 1, mask, 4, "0-3", 2);
    ASSERT_TRUE(mall::page_read(page.get(), &snap));
    EXPECT_EQ(snap.ncpus, 4);
    EXPECT_EQ(snap.nthreads, 2);
    EXPECT_EQ(mall_alloc_threads(&snap), 2);
    mall::page_write(page.get(), 2, mask, 4, "0-3");  // no count: one per cpu
    ASSERT_TRUE(mall::page_read(page.get(), &snap));
    EXPECT_EQ(snap.nthreads, 4);
    mall::page_write(page.get(), 3, mask, 4, "0-3", 9);  // more than the cpus: one per cpu
    ASSERT_TRUE(mall::page_read(page.get(), &snap));
    EXPECT_EQ(snap.nthreads, 4);
}

TEST(SharedPage, ConcurrentSnapshotsAreNeverTorn) {
    mall_test_watchdog_arm(60);  // a fresh 60 s for this test alone
    auto *page = new mall::SharedPage;
    mall::page_init(page);
    std::atomic<bool> writer_done{false};
    uint64_t big[MALL_MAX_CPUS / 64] = {};
    for (int i = 0; i < 512; ++i) big[i / 64] |= uint64_t{1} << (i % 64);
    uint64_t small[MALL_MAX_CPUS / 64] = {};
    small[600 / 64] |= uint64_t{1} << (600 % 64);
    constexpr uint64_t kWrites = 200000;
    std::thread writer([&] {
        for (uint64_t g = 1; g <= kWrites; ++g) {
            if (g % 2)
                mall::page_write(page, g, big, 512, "0-511");
            else
                mall::page_write(page, g, small, 1, "600");
            if (g % 64 == 0) std::this_thread::yield();  // let the reader in now and then
        }
        writer_done = true;
    });
    auto check = [](const mall_alloc_t &snap) {
        int bits = 0;
        for (uint64_t w : snap.mask) bits += std::popcount(w);
        EXPECT_EQ(bits, snap.ncpus) << "torn snapshot at generation " << snap.generation;
        EXPECT_STREQ(snap.cpus, snap.generation % 2 ? "0-511" : "600") << "torn at " << snap.generation;
        return bits == snap.ncpus;
    };
    long consistent = 0, refused = 0;
    while (!writer_done.load()) {
        mall_alloc_t snap;
        if (!mall::page_read(page, &snap)) {
            ++refused;
            continue;
        }
        if (snap.generation == 0) continue;
        ++consistent;
        if (!check(snap)) break;
    }
    writer.join();
    std::printf("snapshots during writes: %ld consistent, %ld given up (writer busy)\n", consistent, refused);
    mall_alloc_t final_snap;
    ASSERT_TRUE(mall::page_read(page, &final_snap));
    EXPECT_EQ(final_snap.generation, kWrites);
    check(final_snap);

    // Invalid pages are refused.
    mall_alloc_t snap;
    page->magic = 0;
    EXPECT_FALSE(mall::page_read(page, &snap));
    mall::page_init(page);
    page->ncpus = MALL_MAX_CPUS + 1;
    EXPECT_FALSE(mall::page_read(page, &snap));
    mall::page_init(page);
    std::memset(page->cpus, 'x', sizeof page->cpus);
    EXPECT_FALSE(mall::page_read(page, &snap));
    delete page;
}

// The socket helpers under the client: listen safety, descriptor passing, truncation, credentials.
TEST_F(ClientTest, UnixListenRefusesNonSocketsAndLiveSocketsButReplacesStaleOnes) {
    std::string why;
    std::string file = dir_ + "/not-a-socket";
    { std::ofstream(file) << "keep me"; }
    EXPECT_LT(mall::unix_listen(file, 0600, &why), 0);
    EXPECT_NE(why.find("not a socket"), std::string::npos) << why;
    struct stat st;
    EXPECT_EQ(stat(file.c_str(), &st), 0) << "the file must not be removed";
    unlink(file.c_str());

    // A stale socket: bound, then its listener closed without unlinking.
    {
        mall::UniqueFd stale(mall::unix_listen(socket_, 0600, &why));
        ASSERT_TRUE(stale) << why;
    }
    mall::UniqueFd live(mall::unix_listen(socket_, 0600, &why));
    ASSERT_TRUE(live) << "a stale socket should be replaced: " << why;
    EXPECT_LT(mall::unix_listen(socket_, 0600, &why), 0) << "a live socket must not be taken over";
    EXPECT_EQ(errno, EADDRINUSE);
    EXPECT_NE(why.find("listening"), std::string::npos) << why;
    live.reset();
    unlink(socket_.c_str());

    // Missing parent folders are created.
    std::string nested = dir_ + "/a/b/malld.sock";
    mall::UniqueFd created(mall::unix_listen(nested, 0666, &why));
    ASSERT_TRUE(created) << why;
    ASSERT_EQ(stat(nested.c_str(), &st), 0);
    EXPECT_TRUE(S_ISSOCK(st.st_mode));
    EXPECT_EQ(st.st_mode & 0777, 0666u);
    created.reset();
    unlink(nested.c_str());
    rmdir((dir_ + "/a/b").c_str());
    rmdir((dir_ + "/a").c_str());
}

TEST_F(ClientTest, PacketsCarryDescriptorsAndTruncationIsReported) {
    std::string why;
    mall::UniqueFd listener(mall::unix_listen(socket_, 0600, &why));
    ASSERT_TRUE(listener) << why;
    mall::UniqueFd client(mall::unix_connect(socket_));
    ASSERT_TRUE(client);
    mall::UniqueFd server(accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    ASSERT_TRUE(server);

    mall::PeerCred cred;
    ASSERT_TRUE(mall::peer_credentials(server.get(), &cred));
    EXPECT_EQ(cred.pid, getpid());
    EXPECT_EQ(cred.uid, getuid());

    int pipe_fds[2];
    ASSERT_EQ(pipe(pipe_fds), 0);
    ASSERT_TRUE(mall::send_packet(server.get(), "hello", pipe_fds[1]));
    close(pipe_fds[1]);
    std::string data;
    int received = -1;
    ASSERT_EQ(mall::recv_packet(client.get(), &data, 100, &received), 5);
    EXPECT_EQ(data, "hello");
    ASSERT_GE(received, 0);
    EXPECT_TRUE(fcntl(received, F_GETFD) & FD_CLOEXEC) << "passed descriptors must be close-on-exec";
    ASSERT_EQ(write(received, "x", 1), 1);
    char byte = 0;
    ASSERT_EQ(read(pipe_fds[0], &byte, 1), 1);
    EXPECT_EQ(byte, 'x');
    close(received);
    close(pipe_fds[0]);

    ASSERT_TRUE(mall::send_packet(server.get(), std::string(200, 'z')));
    EXPECT_EQ(mall::recv_packet(client.get(), &data, 100), -1);
    EXPECT_EQ(errno, EMSGSIZE);

    EXPECT_EQ(mall::wait_readable(client.get(), 0ms), 0);
    EXPECT_EQ(mall::recv_packet(client.get(), &data, 100, nullptr, /*nonblocking=*/true), -1);
    EXPECT_EQ(errno, EAGAIN);
    server.reset();
    EXPECT_EQ(mall::wait_readable(client.get(), 5000ms), 1);
    EXPECT_EQ(mall::recv_packet(client.get(), &data, 100), 0) << "hang-up reads as 0";
    EXPECT_FALSE(mall::send_packet(client.get(), "late")) << "no SIGPIPE, just an error";
    EXPECT_EQ(errno, EPIPE);
}

TEST_F(ClientTest, CtlClientWaitsForItsReplyAndExplainsFailures) {
    std::string error;
    EXPECT_FALSE(mall::CtlClient::connect(socket_, &error).has_value());
    EXPECT_NE(error.find(socket_), std::string::npos) << error;
    EXPECT_NE(error.find("is malld running"), std::string::npos) << error;

    const uint16_t v = mall::proto::kVersion;
    using mall::proto::Type;
    {
        ScriptedServer server(socket_, std::vector<std::string>{
                                           reply_packet(v, {{"generation", 3}}, Type::Notify, 0),
                                           reply_packet(v, {{"event", "publish"}}, Type::Event, 0),
                                           reply_packet(v, mall::proto::ok_reply({{"other", 1}}), Type::Reply, 99),
                                           reply_packet(v, mall::proto::ok_reply({{"pool", "0-1"}}), Type::Reply, 1)});
        auto ctl = mall::CtlClient::connect(socket_, &error);
        ASSERT_TRUE(ctl.has_value()) << error;
        mall::CtlResult result = ctl->request(Type::Status, nlohmann::json::object(), 5s);
        EXPECT_TRUE(result.ok) << result.error;
        EXPECT_EQ(result.body.value("pool", ""), "0-1");
    }
    unlink(socket_.c_str());
    {
        ScriptedServer server(socket_, reply_packet(v, mall::proto::error_reply(MALL_ERR_DENIED, "not an admin")));
        auto ctl = mall::CtlClient::connect(socket_, &error);
        ASSERT_TRUE(ctl.has_value()) << error;
        mall::CtlResult result = ctl->request(Type::Set, {{"job", "a"}, {"cpus", "0"}}, 5s);
        EXPECT_FALSE(result.ok);
        EXPECT_EQ(result.code, MALL_ERR_DENIED);
        EXPECT_EQ(result.error, "not an admin");
    }
    unlink(socket_.c_str());
    {
        ScriptedServer server(socket_, std::vector<std::string>{});  // never answers
        auto ctl = mall::CtlClient::connect(socket_, &error);
        ASSERT_TRUE(ctl.has_value()) << error;
        mall::CtlResult result = ctl->request(Type::Status, nlohmann::json::object(), 200ms);
        EXPECT_FALSE(result.ok);
        EXPECT_EQ(result.code, MALL_ERR_NODAEMON);
        EXPECT_NE(result.error.find("did not answer"), std::string::npos) << result.error;
    }
    unlink(socket_.c_str());
    {
        ScriptedServer server(socket_, reply_packet(2, mall::proto::ok_reply()));
        auto ctl = mall::CtlClient::connect(socket_, &error);
        ASSERT_TRUE(ctl.has_value()) << error;
        mall::CtlResult result = ctl->request(Type::Status, nlohmann::json::object(), 5s);
        EXPECT_FALSE(result.ok);
        EXPECT_EQ(result.code, MALL_ERR_VERSION);
        EXPECT_NE(result.error.find("protocol version 2"), std::string::npos) << result.error;
    }
}

// Issue 11 (error text used as an API): libmall and CtlClient take MALL_ERR_VERSION from decode()'s
// reason. A peer of another version whose header is shorter than ours is still "another version"
// (CtlClient used to see "truncated packet" there and say MALL_ERR_PROTOCOL), and a packet that is
// not mall's at all is MALL_ERR_PROTOCOL for both.
TEST_F(ClientTest, VersionAndProtocolErrorsComeFromTheDecodeReason) {
    std::string short_other_version = reply_packet(2, mall::proto::ok_reply()).substr(0, 8);
    std::string bad_magic = reply_packet(mall::proto::kVersion, mall::proto::ok_reply({{"job", "x"}}));
    bad_magic[0] = 'X';
    struct Case {
        std::string packet;
        int code;
        const char *words;
    };
    for (const Case &c : {Case{short_other_version, MALL_ERR_VERSION, "version 2"},
                          Case{bad_magic, MALL_ERR_PROTOCOL, "bad magic"}}) {
        mall_error_t err{};
        mall_t *m = nullptr;
        {
            ScriptedServer server(socket_, c.packet);
            EXPECT_EQ(mall_open(socket_.c_str(), &m, &err), c.code) << err.text;
            mall_close(m);
        }
        EXPECT_NE(std::string(err.text).find(c.words), std::string::npos) << err.text;
        unlink(socket_.c_str());
        {
            ScriptedServer server(socket_, c.packet);
            std::string error;
            auto ctl = mall::CtlClient::connect(socket_, &error);
            ASSERT_TRUE(ctl.has_value()) << error;
            mall::CtlResult result = ctl->request(mall::proto::Type::Status, nlohmann::json::object(), 5s);
            EXPECT_FALSE(result.ok);
            EXPECT_EQ(result.code, c.code) << result.error;
            EXPECT_NE(result.error.find(c.words), std::string::npos) << result.error;
        }
        unlink(socket_.c_str());
    }
}

// Issue 11 (connect advice written twice): one explanation of a failed connect for the tools and
// libmall; each names the socket the way its user does (--socket, MALL_SOCKET), and the tools read
// "nobody listens there" from a field instead of cutting the sentence.
TEST(ConnectFailure, OneExplanationForToolsAndLibrary) {
    using mall::SocketNaming;
    const std::string path = "/tmp/mall-nowhere/malld.sock";
    struct Case {
        int err;
        int code;
        bool nobody_listening;
        const char *advice;  // in the advice for both namings
    };
    for (const Case &c : {Case{ENOENT, MALL_ERR_NODAEMON, true, "is malld running?"},
                          Case{ECONNREFUSED, MALL_ERR_NODAEMON, true, "is malld running?"},
                          Case{EACCES, MALL_ERR_NODAEMON, false, "permissions"},
                          Case{EPERM, MALL_ERR_NODAEMON, false, "permissions"},
                          Case{ENAMETOOLONG, MALL_ERR_NODAEMON, false, "107 bytes at most"},
                          Case{EAGAIN, MALL_ERR_NODAEMON, false, "not accepting connections"},
                          Case{EMFILE, MALL_ERR_SYSTEM, false, ""},
                          Case{ENOMEM, MALL_ERR_SYSTEM, false, ""},
                          Case{EIO, MALL_ERR_NODAEMON, false, "names malld's socket"}}) {
        for (SocketNaming naming : {SocketNaming::Option, SocketNaming::Environment}) {
            mall::ConnectFailure f = mall::explain_connect_failure(path, c.err, naming);
            const std::string label = std::string(std::strerror(c.err)) +
                                      (naming == SocketNaming::Option ? " (tool)" : " (library)");
            EXPECT_EQ(f.code, c.code) << label;
            EXPECT_EQ(f.nobody_listening, c.nobody_listening) << label;
            EXPECT_EQ(f.what, "cannot connect to malld at " + path + ": " + std::strerror(c.err)) << label;
            EXPECT_NE(f.advice.find(c.advice), std::string::npos) << label << ": " << f.advice;
            EXPECT_EQ(f.text(), f.advice.empty() ? f.what : f.what + "; " + f.advice) << label;
            // Advice that names the socket names it the way this user sets it (malld's own
            // --socket-mode is about malld, not about this user's knob).
            auto mentions = [&](const std::string &name) {
                for (size_t at = f.advice.find(name); at != std::string::npos; at = f.advice.find(name, at + 1))
                    if (f.advice.compare(at, name.size() + 1, name + "-") != 0) return true;
                return false;
            };
            if (mentions("--socket") || mentions("MALL_SOCKET")) {
                const bool tool = naming == SocketNaming::Option;
                EXPECT_TRUE(mentions(tool ? "--socket" : "MALL_SOCKET")) << label << ": " << f.advice;
                EXPECT_FALSE(mentions(tool ? "MALL_SOCKET" : "--socket")) << label << ": " << f.advice;
            }
        }
    }
    // CtlClient::connect gives the same, as words and as parts.
    std::string error;
    mall::ConnectFailure failure;
    EXPECT_FALSE(mall::CtlClient::connect(path, &error, &failure).has_value());
    EXPECT_TRUE(failure.nobody_listening);
    EXPECT_EQ(error, failure.text());
    EXPECT_EQ(error, mall::explain_connect_failure(path, ENOENT, SocketNaming::Option).text());
}

// mall_open() explains a missing malld with the library's naming of the socket.
TEST_F(ClientTest, OpenWithoutMalldNamesMallSocket) {
    mall_error_t err{};
    mall_t *m = open_handle(MALL_ERR_NODAEMON, &err);
    ASSERT_NE(m, nullptr);
    EXPECT_EQ(std::string(err.text),
              mall::explain_connect_failure(socket_, ENOENT, mall::SocketNaming::Environment).text().substr(
                  0, sizeof err.text - 1));
    EXPECT_NE(std::string(err.text).find(socket_), std::string::npos) << err.text;
}
