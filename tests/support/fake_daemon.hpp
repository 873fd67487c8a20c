// SPDX-License-Identifier: BSD-3-Clause
// fake_daemon.hpp — an in-process stand-in for malld, for libmall's tests and benchmarks: one
// thread listens on a private socket, answers Attach with a memfd page (written with page_write and
// sealed as malld seals it: kPageSeals), records Acks and Progress, and can refuse, stay silent,
// send Notify, or hang up and restart. As a hostile server it can also pass an unsealed page and
// truncate it under its clients.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/shared_page.hpp"

namespace mall::test {

class FakeDaemon {
public:
    enum class Mode {
        Serve,   // answer Attach with the page
        Refuse,  // answer Attach with an error reply (code and text from set_mode)
        Silent,  // accept and read, never answer
    };

    explicit FakeDaemon(std::string socket_path);
    ~FakeDaemon();
    FakeDaemon(const FakeDaemon &) = delete;
    FakeDaemon &operator=(const FakeDaemon &) = delete;

    // Listens with a fresh page at `generation` holding `cpus` ("" = empty page at generation 0).
    bool start(uint64_t generation, const std::string &cpus, std::string *error);
    // Hangs up on every client, closes and removes the socket and the page. Idempotent.
    void stop();
    bool running() const { return thread_.joinable(); }

    void set_mode(Mode mode, int refuse_code = 0, std::string refuse_text = "");
    void set_job(std::string job);
    // When set, an Attach that names a job is refused with MALL_ERR_NOJOB (as a malld restarted
    // without its state would); self-registrations are still served.
    void set_forget_jobs(bool forget);
    // Off: the next start() passes an unsealed page (what malld never does). On by default.
    void set_seal_page(bool seal);
    // Truncates the page to 0 bytes (possible only when unsealed): a client still mapping it would
    // take SIGBUS at its next read. The fake publishes nothing afterwards. True when it shrank.
    bool truncate_page();

    // Writes `cpus` to the page at generation + 1; with notify, sends Notify to attached clients.
    // flags: the page's kPageFlag* word (e.g. signal control allowed). Returns the new generation.
    uint64_t publish(const std::string &cpus, bool notify = true, uint32_t flags = 0);
    uint64_t generation() const;

    // Waits (bounded) until an ack for at least `generation` arrived since the last start().
    bool wait_for_ack(uint64_t generation, std::chrono::milliseconds timeout);
    uint64_t last_ack() const;
    // Waits until `count` Attach requests were answered or refused since construction.
    bool wait_for_attaches(int count, std::chrono::milliseconds timeout);
    int attach_count() const;
    nlohmann::json last_attach_body() const;
    // Waits until a Progress message with exactly these totals arrived.
    bool wait_for_progress(uint64_t work_units, uint64_t steps, std::chrono::milliseconds timeout);
    nlohmann::json last_progress() const;
    // Packets of other types than Attach, Ack and Progress, or that did not decode.
    int unexpected_packets() const;

    const std::string &socket_path() const { return path_; }

private:
    struct Client {
        int fd = -1;
        bool attached = false;
    };

    void run();
    void handle_packet(Client &client, const std::string &data);
    void close_all();

    std::string path_;
    int listen_fd_ = -1;
    int wake_fd_ = -1;
    int page_fd_ = -1;
    SharedPage *page_ = nullptr;
    std::thread thread_;

    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::vector<Client> clients_;
    bool stopping_ = false;
    Mode mode_ = Mode::Serve;
    int refuse_code_ = 0;
    std::string refuse_text_;
    std::string job_ = "fake-job";
    bool forget_jobs_ = false;
    bool seal_page_ = true;
    uint64_t generation_ = 0;
    uint64_t last_ack_ = 0;
    int attaches_ = 0;
    int unexpected_ = 0;
    nlohmann::json last_attach_body_;
    nlohmann::json last_progress_;
};

}  // namespace mall::test
