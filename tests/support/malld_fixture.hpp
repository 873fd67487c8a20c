// SPDX-License-Identifier: BSD-3-Clause
// malld_fixture.hpp — helpers for integration tests and benchmarks: a private malld (own socket,
// state dir and cgroup parent in a temp folder), child processes killed and reaped by their owners,
// /proc and cgroup readers, a Watch-stream recorder, and the watchdog (support/watchdog.h). Everything a
// helper creates is removed by its destructor (and, on a watchdog expiry, by an async-signal-safe
// last-resort sweep). Implemented by concern: fixture_system.cpp (machine, cgroups, /proc),
// fixture_process.cpp (run_command, Child), malld_fixture.cpp (PrivateMalld, Status, EventRecorder),
// fixture_sweep.cpp (the watchdog's sweep).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/text.hpp"
#include "support/watchdog.h"

namespace mall::test {

using namespace std::chrono_literals;
using Millis = std::chrono::milliseconds;

// ---------------------------------------------------------------------------------------------
// Where things are.
std::string bin_path(const std::string &program);  // MALL_BIN_DIR/<program>
constexpr const char *kCpusetRoot = "/sys/fs/cgroup/cpuset";

// Why the integration tests cannot run here, or nullopt when they can: they need root (cgroup
// writes, setuid to nobody) and a cpuset controller (cgroup v1 here; v2 in tests/vm's guest).
std::optional<std::string> missing_privileges();

// Where the cpuset controller is: the cgroup-v1 cpuset hierarchy's mount when there is one, else
// a cgroup2 mount whose cgroup.controllers lists cpuset (cpuset_is_v2() true), else kCpusetRoot.
std::string cpuset_root();
bool cpuset_is_v2();
// Like missing_privileges(), but content with a cpuset controller on either cgroup version: for
// the tests that also run in tests/vm's cgroup-v2 virtual machine.
std::optional<std::string> missing_root_or_any_cpuset();
// MalldOptions::backend, or the system's cgroup backend when it is "".
std::string backend_or_system(const std::string &backend);

// A cgroup tree a test makes itself, as a resource manager or container runtime would (a Slurm
// job/step, a container's cgroup): cpuset_root()/<name>/... Removed by the destructor (sub-folders
// first, leftover processes moved to the root) and by the watchdog's sweep.
class TestCgroupTree {
public:
    explicit TestCgroupTree(const std::string &name);
    ~TestCgroupTree();
    TestCgroupTree(const TestCgroupTree &) = delete;
    TestCgroupTree &operator=(const TestCgroupTree &) = delete;
    // Makes <root>/<rel> (and the folders above it, v1: with their parent's cpus and mems; v2:
    // with cpuset enabled in each parent) and writes `cpus` to its cpuset.cpus. Returns the
    // folder's path, "" with *error on failure. rel "" is the tree's root.
    std::string make(const std::string &rel, const std::string &cpus, std::string *error);
    const std::string &root() const { return root_; }

private:
    std::string name_of_root() const;
    std::string root_;
    int slot_ = -1;
};

// Skips the current test with the stated reason when missing_privileges() says so.
#define MALL_REQUIRE_ROOT_AND_CPUSET()                                            \
    do {                                                                          \
        if (auto mall_skip_reason_ = ::mall::test::missing_privileges())          \
            GTEST_SKIP() << *mall_skip_reason_;                                   \
    } while (0)

// ---------------------------------------------------------------------------------------------
// Watchdog: support/watchdog.h's, armed with MALL_TEST_WATCHDOG(seconds) once per test file
// (benchmarks call mall_test_watchdog_arm()). These helpers add its expiry hook: a last-resort sweep
// that SIGKILLs every registered process group and malld and removes registered cgroup folders and
// temp dirs before the program dies of SIGALRM.

// ---------------------------------------------------------------------------------------------
// Small utilities.

// True in an ASan/TSan build (GCC and clang define these): the example trainers run ~10x slower
// there, so tests that drive a whole training run size it down to stay well inside their watchdog.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kUnderSanitizer = true;
#else
inline constexpr bool kUnderSanitizer = false;
#endif

// Polls pred every `interval` until it is true or the timeout passes; returns pred's last value.
bool wait_until(const std::function<bool()> &pred, Millis timeout, Millis interval = 20ms);

std::string read_file(const std::string &path);  // "" when unreadable
using mall::trim;  // common/text.hpp: blanks off both ends
bool contains_icase(const std::string &haystack, const std::string &needle);

// Cpus_allowed_list of every thread of pid (tid -> list text); empty map if the process is gone.
std::map<pid_t, std::string> thread_cpus_allowed(pid_t pid);
// Union of every thread's allowed cpus of the given pids, as sorted cpu numbers.
std::vector<int> allowed_cpus_union(const std::vector<pid_t> &pids);
// True when every thread of every pid is allowed exactly `cpus` (and the pids have threads).
bool threads_all_on(const std::vector<pid_t> &pids, const std::string &cpus);
// "pid/tid=list ..." for failure messages.
std::string describe_threads(const std::vector<pid_t> &pids);
// A cgroup's cpuset.cpus (trimmed), nullopt when the folder or file is missing.
std::optional<std::string> cgroup_cpus(const std::string &cgroup_dir);
// A program's output split into lines, and lines joined back (one per line) for failure messages.
std::vector<std::string> split_lines(const std::string &text);
std::string joined_lines(const std::vector<std::string> &lines);
// Parses Linux list text ("0-3,8") into cpu numbers; nullopt on bad text.
std::optional<std::vector<int>> parse_cpu_list(const std::string &text);

// Result of a program run to completion.
struct CommandResult {
    int exit_code = -1;      // exit status, 128+signal if killed, -1 if it could not be started
    bool timed_out = false;  // the deadline passed and the program was SIGKILLed
    pid_t pid = -1;
    std::string out;
    std::string err;
};

struct RunOptions {
    std::vector<std::pair<std::string, std::string>> env;  // added to a MALL_*-free environment
    bool as_nobody = false;  // setgid/setuid to nobody in the child (needs root)
    Millis timeout = 30s;
};

// Runs argv[0] (a path) with argv, capturing stdout and stderr.
CommandResult run_command(const std::vector<std::string> &argv, const RunOptions &options = {});

// ---------------------------------------------------------------------------------------------
// A child process in its own process group. Its stdout is read by a background thread into lines
// (so the child never blocks on a full pipe); stderr goes to the test's stderr unless captured.
struct ChildOptions {
    std::vector<std::pair<std::string, std::string>> env;  // added to a MALL_*-free environment
    bool as_nobody = false;
    bool capture_stderr = false;  // when true, stderr lines are merged into the stdout lines
};

class Child {
public:
    Child(std::vector<std::string> argv, ChildOptions options = {});
    ~Child();  // SIGTERM to the group, SIGKILL after 3 s, reap; joins the reader
    Child(const Child &) = delete;
    Child &operator=(const Child &) = delete;

    bool started() const { return pid_ > 0; }
    pid_t pid() const { return pid_; }
    const std::vector<std::string> &argv() const { return argv_; }

    // Next unread stdout line, waiting at most `timeout`; nullopt on timeout or end of output.
    std::optional<std::string> read_line(Millis timeout);
    // Reads lines until one satisfies pred (returned) or the timeout passes.
    std::optional<std::string> wait_for_line(const std::function<bool(const std::string &)> &pred,
                                             Millis timeout);
    std::optional<std::string> wait_for_line_starting(const std::string &prefix, Millis timeout);
    // Every line seen so far (read or not).
    std::vector<std::string> all_lines() const;

    void signal(int sig) const;        // to the child only
    void signal_group(int sig) const;  // to its whole process group
    // Waits for exit; returns the exit code (128+signal when killed) or nullopt on timeout.
    std::optional<int> wait_exit(Millis timeout);
    bool exited() const { return exit_code_.has_value(); }

private:
    void reader_loop(int fd);
    std::vector<std::string> argv_;
    pid_t pid_ = -1;
    std::optional<int> exit_code_;
    std::thread reader_;
    mutable std::mutex mutex_;
    std::condition_variable cv_;
    std::vector<std::string> lines_;
    size_t next_unread_ = 0;
    bool eof_ = false;
};

// argv for `mallrun --socket S --malleable=SPEC [--job NAME] [extra...] -- cmd...`.
std::vector<std::string> mallrun_argv(const std::string &socket, const std::string &malleable,
                                      const std::string &job, const std::vector<std::string> &cmd,
                                      const std::vector<std::string> &extra = {});
// argv for mall_test_client with the given options (e.g. {"--step-us", "100"}).
std::vector<std::string> test_client_argv(const std::vector<std::string> &options = {});
// argv for `mallctl --socket S args...`.
std::vector<std::string> mallctl_argv(const std::string &socket, const std::vector<std::string> &args);

// ---------------------------------------------------------------------------------------------
// A private malld.
struct MalldOptions {
    std::string backend = "";  // "" = the system's cpuset: cgroup-v1 here, cgroup-v2 in tests/vm
    std::string policy = "equal";
    int ack_timeout_ms = 2000;
    std::string cpus = "0-1";  // "" = malld's default (the whole topology)
    std::string log_level = "debug";
    std::vector<std::string> extra_args;
    // Added to malld's environment (e.g. LD_PRELOAD of a test shim).
    std::vector<std::pair<std::string, std::string>> env;
    // When set, malld starts inside this cgroup folder (as a systemd unit with Delegate=yes
    // would start it in its own cgroup).
    std::string start_in_cgroup;
    Millis ready_timeout = 10s;
};

class PrivateMalld {
public:
    explicit PrivateMalld(MalldOptions options = {});
    ~PrivateMalld();  // stops malld, removes its cgroup folders and the temp dir
    PrivateMalld(const PrivateMalld &) = delete;
    PrivateMalld &operator=(const PrivateMalld &) = delete;

    // Starts malld and waits until its socket answers a Status. False with *error (including the
    // log's tail) if it exited or did not answer before the ready timeout.
    bool start(std::string *error);
    // SIGKILLs malld and reaps it (its jobs' processes and cgroups stay, as after a crash).
    void kill9();
    // Starts again on the same socket, state dir and cgroup parent.
    bool restart(std::string *error) { return start(error); }
    // Starts again as restart() does, inside another cgroup (MalldOptions::start_in_cgroup).
    bool restart_in_cgroup(const std::string &cgroup, std::string *error) {
        options_.start_in_cgroup = cgroup;
        return start(error);
    }
    // SIGTERM, then SIGKILL after `deadline`. Returns malld's exit code (128+signal when killed),
    // nullopt when it was not running.
    std::optional<int> stop(Millis deadline = 5s);
    bool running() const { return pid_ > 0; }

    pid_t pid() const { return pid_; }
    const std::string &dir() const { return dir_; }
    const std::string &socket() const { return socket_; }
    const std::string &state_dir() const { return state_dir_; }
    const std::string &cgroup_parent() const { return cgroup_parent_; }
    std::string cgroup_dir() const;  // /sys/fs/cgroup/cpuset/<parent>
    const std::string &log_path() const { return log_path_; }
    std::string log() const { return read_file(log_path_); }
    const MalldOptions &options() const { return options_; }
    std::vector<std::string> argv() const;

private:
    MalldOptions options_;
    std::string dir_, socket_, state_dir_, cgroup_parent_, log_path_;
    pid_t pid_ = -1;
};

// Removes a cpuset cgroup folder and its sub-folders: moves leftover pids to the cpuset root,
// rmdirs children first. Returns false if something could not be removed.
bool remove_cgroup_tree(const std::string &dir);

// ---------------------------------------------------------------------------------------------
// Talking to malld.

// The Status reply body (what `mallctl status --json` prints), nullopt when malld does not answer.
std::optional<nlohmann::json> status_json(const std::string &socket);
// The status as indented JSON for failure messages, or a note that malld does not answer.
std::string status_text(const PrivateMalld &malld);
// The p-quantile (0 < p <= 1, nearest rank) of samples; 0 for none. For benchmarks' counters.
double percentile(std::vector<double> samples, double p);
// The job's entry in a status object, nullopt when not listed.
std::optional<nlohmann::json> find_job(const nlohmann::json &status, const std::string &job);
// Status of one job, nullopt when malld does not answer or does not list it.
std::optional<nlohmann::json> job_status(const std::string &socket, const std::string &job);
// True when the job is listed, settled (no transition in flight, every change acked) with the
// given published and enforced cpus, and (if attached >= 0) that many attached processes.
bool job_settled_on(const std::string &socket, const std::string &job, const std::string &cpus,
                    int attached = -1);
// The job's registered pids from status.
std::vector<pid_t> job_pids(const nlohmann::json &job);

// Records malld's Watch stream on a background thread.
class EventRecorder {
public:
    EventRecorder() = default;
    ~EventRecorder();
    bool start(const std::string &socket, std::string *error);
    void stop();
    std::vector<nlohmann::json> events() const;
    nlohmann::json at(size_t index) const;  // null when out of range
    size_t size() const;
    // Waits until some event at index >= from satisfies pred; returns its index.
    std::optional<size_t> wait_for(const std::function<bool(const nlohmann::json &)> &pred,
                                   Millis timeout, size_t from = 0);

private:
    void loop();
    struct Impl;
    std::shared_ptr<Impl> impl_;
    std::thread thread_;
    mutable std::mutex mutex_;
    std::condition_variable cv_;
    std::vector<nlohmann::json> events_;
    bool stop_ = false;
    bool closed_ = false;
};

// Predicates over event bodies.
bool is_event(const nlohmann::json &e, const std::string &kind, const std::string &job = "");

// A private malld (skips without root or a cpuset controller) and, when job_name() is not empty,
// one stepping test client started through mallrun --malleable=1:2 and settled on the whole
// 2-cpu pool. Tests that need a running malld with or without a job derive from it.
class MalldWithJobTest : public ::testing::Test {
protected:
    virtual std::string job_name() const { return ""; }
    void SetUp() override {
        MALL_REQUIRE_ROOT_AND_CPUSET();
        malld_ = std::make_unique<PrivateMalld>();
        std::string error;
        ASSERT_TRUE(malld_->start(&error)) << error;
        if (job_name().empty()) return;
        job_ = std::make_unique<Child>(mallrun_argv(malld_->socket(), "1:2", job_name(),
                                                    test_client_argv({"--step-us", "1000"})));
        ASSERT_TRUE(wait_until([&] { return job_settled_on(malld_->socket(), job_name(), "0-1", 1); },
                               std::chrono::seconds(20)))
            << malld_->log();
    }
    void TearDown() override {
        job_.reset();
        malld_.reset();
    }
    std::string socket() const { return malld_->socket(); }
    std::unique_ptr<PrivateMalld> malld_;
    std::unique_ptr<Child> job_;
};

}  // namespace mall::test
