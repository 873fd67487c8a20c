// SPDX-License-Identifier: BSD-3-Clause
// client_test_support.hpp — what the client library's unit tests share (test_client.cpp,
// test_client_signals.cpp, test_client_transport.cpp): ClientTest (a private folder and socket
// with an in-process FakeDaemon, handles closed and the MALL_* environment cleared at teardown),
// polling, the calling thread's Cpus_allowed_list, the callbacks' Recorder, a BoundThread, and
// ScriptedServer (one scripted reply) with reply_packet.
// Contract: nothing a helper creates outlives its test.
#pragma once

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


namespace mall::test::client {

using namespace std::chrono_literals;

// Polls done every kPollInterval until it is true or the timeout passes; returns its last value.
inline bool wait_until(const std::function<bool()> &done, std::chrono::milliseconds timeout) {
    constexpr auto kPollInterval = 1ms;
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
        if (done()) return true;
        std::this_thread::sleep_for(kPollInterval);
    }
    return done();
}

// Steps until a change is applied (or the timeout passes).
inline bool step_until_success(mall_t *m, std::chrono::milliseconds timeout) {
    return wait_until([&] { return mall_step(m) == MALL_SUCCESS; }, timeout);
}

inline pid_t gettid_() { return static_cast<pid_t>(syscall(SYS_gettid)); }

inline std::string cpus_allowed_list(pid_t tid) {
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

inline bool process_may_use(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) != 0) return false;
    return CPU_ISSET(cpu, &set);
}

inline bool readable(int fd, int timeout_ms) {
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

// A protocol packet of the given version (the version field overwritten after encoding).
inline std::string reply_packet(uint16_t version, nlohmann::json body, mall::proto::Type type = mall::proto::Type::Reply,
                         uint32_t request_id = 1) {
    mall::proto::Message msg;
    msg.type = type;
    msg.request_id = request_id;
    msg.body = std::move(body);
    std::string packet = mall::proto::encode(msg);
    std::memcpy(&packet[4], &version, sizeof version);
    return packet;
}

}  // namespace mall::test::client
