// SPDX-License-Identifier: BSD-3-Clause
// malld_fixture.cpp — PrivateMalld (a malld of the test's own: temp dir, socket, state dir and
// cgroup parent), the Status readers, and EventRecorder (malld's Watch stream on a thread); the
// rest of malld_fixture.hpp lives in fixture_system.cpp, fixture_process.cpp and
// fixture_sweep.cpp. Contract: a PrivateMalld stops malld and removes its cgroup folders and temp
// dir in its destructor (printing malld's log when the test failed); the watchdog's sweep does it
// when the test hangs.

#include "support/malld_fixture.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/ctl_client.hpp"
#include "common/protocol.hpp"
#include "support/fixture_internal.hpp"

namespace mall::test {

namespace fs = std::filesystem;
using namespace internal;

// =============================================================================================
// PrivateMalld.
namespace {
std::atomic<int> g_malld_counter{0};
// Watchdog slots of each PrivateMalld, keyed by its temp dir.
std::mutex g_slots_mutex;
std::map<std::string, std::pair<int, int>> g_slots;
}  // namespace

PrivateMalld::PrivateMalld(MalldOptions options) : options_(std::move(options)) {
    char tmpl[] = "/tmp/mall_test_XXXXXX";
    if (char *d = ::mkdtemp(tmpl)) dir_ = d;
    // Readable by nobody: the security test runs clients as nobody against this socket.
    ::chmod(dir_.c_str(), 0755);
    socket_ = dir_ + "/malld.sock";
    state_dir_ = dir_ + "/state";
    ::mkdir(state_dir_.c_str(), 0755);
    log_path_ = dir_ + "/malld.log";
    cgroup_parent_ = "mall_test_" + std::to_string(::getpid()) + "_" + std::to_string(g_malld_counter++);
    int cg = track_cgroup_dir(cgroup_dir());
    int tmp = track_temp_dir(dir_);
    std::lock_guard lock(g_slots_mutex);
    g_slots[dir_] = {cg, tmp};
}

std::string PrivateMalld::cgroup_dir() const { return cpuset_root() + "/" + cgroup_parent_; }

std::vector<std::string> PrivateMalld::argv() const {
    std::vector<std::string> argv{bin_path("malld"),    "--socket",        socket_,
                                  "--state-dir",        state_dir_,        "--backend",
                                  backend_or_system(options_.backend), "--policy", options_.policy,
                                  "--ack-timeout-ms",   std::to_string(options_.ack_timeout_ms),
                                  "--cgroup-parent",    cgroup_parent_,    "--log-level",
                                  options_.log_level};
    if (!options_.cpus.empty()) {
        argv.push_back("--cpus");
        argv.push_back(options_.cpus);
    }
    argv.insert(argv.end(), options_.extra_args.begin(), options_.extra_args.end());
    return argv;
}

bool PrivateMalld::start(std::string *error) {
    if (pid_ > 0) {
        if (error) *error = "malld is already running";
        return false;
    }
    int log_fd = ::open(log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0) {
        if (error) *error = "cannot open " + log_path_ + ": " + std::strerror(errno);
        return false;
    }
    std::vector<std::string> command = argv();
    if (!options_.start_in_cgroup.empty()) {
        std::vector<std::string> wrapped{"/bin/sh", "-c",
                                         "echo $$ > '" + options_.start_in_cgroup + "/cgroup.procs' && exec \"$0\" \"$@\""};
        wrapped.insert(wrapped.end(), command.begin(), command.end());
        command = std::move(wrapped);
    }
    SpawnPlan plan = make_plan(command, options_.env, false);
    pid_ = spawn(plan, log_fd, log_fd);
    ::close(log_fd);
    if (pid_ < 0) {
        if (error) *error = std::string("fork failed: ") + std::strerror(errno);
        return false;
    }
    auto deadline = std::chrono::steady_clock::now() + options_.ready_timeout;
    for (;;) {
        int status = 0;
        if (::waitpid(pid_, &status, WNOHANG) == pid_) {
            untrack_group(pid_);
            pid_ = -1;
            if (error)
                *error = "malld exited with code " + std::to_string(decode_status(status)) +
                         " before answering; its log:\n" + log();
            return false;
        }
        if (status_json(socket_)) return true;
        if (std::chrono::steady_clock::now() >= deadline) {
            if (error) *error = "malld did not answer a Status within the ready timeout; its log:\n" + log();
            return false;
        }
        std::this_thread::sleep_for(20ms);
    }
}

void PrivateMalld::kill9() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    wait_pid(pid_, 30s);
    untrack_group(pid_);
    pid_ = -1;
}

std::optional<int> PrivateMalld::stop(Millis deadline) {
    if (pid_ <= 0) return std::nullopt;
    ::kill(pid_, SIGTERM);
    auto code = wait_pid(pid_, deadline);
    if (!code) {
        ::kill(pid_, SIGKILL);
        code = wait_pid(pid_, 30s);
    }
    untrack_group(pid_);
    pid_ = -1;
    return code;
}

PrivateMalld::~PrivateMalld() {
    stop();
    if (::testing::UnitTest::GetInstance()->current_test_info() && ::testing::Test::HasFailure()) {
        std::string text = log();
        if (text.size() > 12000) text = "...\n" + text.substr(text.size() - 12000);
        std::fprintf(stderr, "---- malld log (%s) ----\n%s---- end of malld log ----\n",
                     log_path_.c_str(), text.c_str());
    }
    if (fs::exists(cgroup_dir())) remove_cgroup_tree(cgroup_dir());
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
    std::lock_guard lock(g_slots_mutex);
    auto it = g_slots.find(dir_);
    if (it != g_slots.end()) {
        untrack_cgroup_dir(it->second.first);
        untrack_temp_dir(it->second.second);
        g_slots.erase(it);
    }
}

// =============================================================================================
// Talking to malld.

std::string status_text(const PrivateMalld &malld) {
    auto s = status_json(malld.socket());
    return s ? s->dump(1) : std::string("(malld does not answer)");
}

double percentile(std::vector<double> samples, double p) {
    if (samples.empty()) return 0;
    std::sort(samples.begin(), samples.end());
    size_t rank = static_cast<size_t>(std::ceil(p * static_cast<double>(samples.size())));
    return samples[std::clamp<size_t>(rank, 1, samples.size()) - 1];
}

std::optional<nlohmann::json> status_json(const std::string &socket) {
    std::string error;
    auto client = CtlClient::connect(socket, &error);
    if (!client) return std::nullopt;
    auto reply = client->request(proto::Type::Status, nlohmann::json::object(), 5s);
    if (!reply.ok || !reply.body.is_object()) return std::nullopt;
    return reply.body;
}

std::optional<nlohmann::json> find_job(const nlohmann::json &status, const std::string &job) {
    if (!status.contains("jobs") || !status["jobs"].is_array()) return std::nullopt;
    for (const auto &j : status["jobs"])
        if (j.value("job", "") == job) return j;
    return std::nullopt;
}

std::optional<nlohmann::json> job_status(const std::string &socket, const std::string &job) {
    auto status = status_json(socket);
    if (!status) return std::nullopt;
    return find_job(*status, job);
}

bool job_settled_on(const std::string &socket, const std::string &job, const std::string &cpus,
                    int attached) {
    auto j = job_status(socket, job);
    if (!j) return false;
    try {
        return j->value("cpus", "?") == cpus && j->value("cpuset", "?") == cpus &&
               j->value("state", "") == "settled" &&
               j->value("generation", 0ull) == j->value("acked_generation", ~0ull) &&
               (attached < 0 || j->value("attached", -1) == attached);
    } catch (const std::exception &) {
        return false;
    }
}

std::vector<pid_t> job_pids(const nlohmann::json &job) {
    std::vector<pid_t> pids;
    if (job.contains("pids") && job["pids"].is_array())
        for (const auto &p : job["pids"])
            if (p.is_number_integer()) pids.push_back(p.get<pid_t>());
    return pids;
}

// =============================================================================================
// EventRecorder.

struct EventRecorder::Impl {
    std::optional<CtlClient> client;
};

bool EventRecorder::start(const std::string &socket, std::string *error) {
    impl_ = std::make_shared<Impl>();
    impl_->client = CtlClient::connect(socket, error);
    if (!impl_->client) return false;
    auto reply = impl_->client->request(proto::Type::Watch, nlohmann::json::object(), 5s);
    if (!reply.ok) {
        if (error) *error = "Watch refused: " + reply.error;
        return false;
    }
    thread_ = std::thread([this] { loop(); });
    return true;
}

void EventRecorder::loop() {
    for (;;) {
        {
            std::lock_guard lock(mutex_);
            if (stop_) return;
        }
        bool closed = false;
        auto event = impl_->client->next_event(100ms, &closed);
        std::lock_guard lock(mutex_);
        if (event) {
            events_.push_back(std::move(*event));
            cv_.notify_all();
        }
        if (closed) {
            closed_ = true;
            cv_.notify_all();
            return;
        }
    }
}

void EventRecorder::stop() {
    {
        std::lock_guard lock(mutex_);
        stop_ = true;
    }
    if (thread_.joinable()) thread_.join();
}

EventRecorder::~EventRecorder() { stop(); }

std::vector<nlohmann::json> EventRecorder::events() const {
    std::lock_guard lock(mutex_);
    return events_;
}

nlohmann::json EventRecorder::at(size_t index) const {
    std::lock_guard lock(mutex_);
    return index < events_.size() ? events_[index] : nlohmann::json();
}

size_t EventRecorder::size() const {
    std::lock_guard lock(mutex_);
    return events_.size();
}

std::optional<size_t> EventRecorder::wait_for(const std::function<bool(const nlohmann::json &)> &pred,
                                              Millis timeout, size_t from) {
    std::unique_lock lock(mutex_);
    size_t checked = from;
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
        for (; checked < events_.size(); ++checked)
            if (pred(events_[checked])) return checked;
        if (closed_) return std::nullopt;
        if (cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
            for (; checked < events_.size(); ++checked)
                if (pred(events_[checked])) return checked;
            return std::nullopt;
        }
    }
}

bool is_event(const nlohmann::json &e, const std::string &kind, const std::string &job) {
    if (!e.is_object() || e.value("event", "") != kind) return false;
    return job.empty() || e.value("job", "") == job;
}

}  // namespace mall::test
