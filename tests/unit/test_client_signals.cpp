// SPDX-License-Identifier: BSD-3-Clause
// test_client_signals.cpp — proves libmall's use of signals against an in-process fake malld:
// MALL_NOTIFY_SIGNAL / notify_signal (one signal per unapplied change, never sent while the
// action is the default, bad signals refused with words) and control by signal (a queued request
// applies at the next mall_step() within the opening cpus, refused or narrowed under malld).
#include "client_test_support.hpp"

using namespace std::chrono_literals;
using namespace mall::test::client;
using mall::test::FakeDaemon;

namespace {

MALL_TEST_WATCHDOG(60);

}  // namespace

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
    // A negative check over a sampling window: time for a (wrong) signal to land, which would
    // end this process.
    constexpr auto kWrongSignalWindow = 200ms;
    std::this_thread::sleep_for(kWrongSignalWindow);
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

