// SPDX-License-Identifier: BSD-3-Clause
// fake_daemon.cpp — the in-process malld stand-in of fake_daemon.hpp. It speaks the real protocol
// (protocol.hpp, unix_socket.hpp, shared_page.hpp) but none of malld's policy: one job, one page.
#include "support/fake_daemon.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/cpuset.hpp"
#include "common/protocol.hpp"
#include "common/unix_socket.hpp"

namespace mall::test {

namespace {

void write_allocation(SharedPage *page, uint64_t generation, const std::string &cpus, uint32_t flags = 0) {
    auto set = CpuSet::parse(cpus);
    CpuSet parsed = set ? *set : CpuSet();
    uint64_t mask[MALL_MAX_CPUS / 64] = {};
    parsed.to_mask(mask);
    page_write(page, generation, mask, parsed.count(), parsed.to_string().c_str(), 0, flags);
}

std::string packet(proto::Type type, uint32_t request_id, nlohmann::json body) {
    proto::Message msg;
    msg.type = type;
    msg.request_id = request_id;
    msg.body = std::move(body);
    return proto::encode(msg);
}

}  // namespace

FakeDaemon::FakeDaemon(std::string socket_path) : path_(std::move(socket_path)) {}

FakeDaemon::~FakeDaemon() { stop(); }

bool FakeDaemon::start(uint64_t generation, const std::string &cpus, std::string *error) {
    stop();
    page_fd_ = memfd_create("mall-fake-page", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (page_fd_ < 0 || ftruncate(page_fd_, kSharedPageSize) != 0) {
        if (error) *error = std::string("memfd: ") + std::strerror(errno);
        stop();
        return false;
    }
    void *mapped = mmap(nullptr, kSharedPageSize, PROT_READ | PROT_WRITE, MAP_SHARED, page_fd_, 0);
    if (mapped == MAP_FAILED) {
        if (error) *error = std::string("mmap: ") + std::strerror(errno);
        stop();
        return false;
    }
    page_ = static_cast<SharedPage *>(mapped);
    page_init(page_);
    if (generation != 0) write_allocation(page_, generation, cpus);
    bool seal;
    {
        std::lock_guard<std::mutex> lock(mu_);
        seal = seal_page_;
    }
    if (seal && fcntl(page_fd_, F_ADD_SEALS, kPageSeals) != 0) {
        if (error) *error = std::string("sealing the page: ") + std::strerror(errno);
        stop();
        return false;
    }

    std::string why;
    listen_fd_ = unix_listen(path_, 0600, &why);
    if (listen_fd_ < 0) {
        if (error) *error = why;
        stop();
        return false;
    }
    wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    {
        std::lock_guard<std::mutex> lock(mu_);
        stopping_ = false;
        generation_ = generation;
        last_ack_ = 0;
    }
    thread_ = std::thread([this] { run(); });
    return true;
}

void FakeDaemon::stop() {
    if (thread_.joinable()) {
        {
            std::lock_guard<std::mutex> lock(mu_);
            stopping_ = true;
        }
        uint64_t one = 1;
        ssize_t n = write(wake_fd_, &one, sizeof one);
        (void)n;
        thread_.join();
    }
    close_all();
}

void FakeDaemon::close_all() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto &client : clients_) close(client.fd);
    clients_.clear();
    if (listen_fd_ >= 0) {
        close(listen_fd_);
        unlink(path_.c_str());
    }
    listen_fd_ = -1;
    if (wake_fd_ >= 0) close(wake_fd_);
    wake_fd_ = -1;
    if (page_) munmap(page_, kSharedPageSize);
    page_ = nullptr;
    if (page_fd_ >= 0) close(page_fd_);
    page_fd_ = -1;
}

void FakeDaemon::set_mode(Mode mode, int refuse_code, std::string refuse_text) {
    std::lock_guard<std::mutex> lock(mu_);
    mode_ = mode;
    refuse_code_ = refuse_code;
    refuse_text_ = std::move(refuse_text);
}

void FakeDaemon::set_job(std::string job) {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = std::move(job);
}

void FakeDaemon::set_forget_jobs(bool forget) {
    std::lock_guard<std::mutex> lock(mu_);
    forget_jobs_ = forget;
}

void FakeDaemon::set_seal_page(bool seal) {
    std::lock_guard<std::mutex> lock(mu_);
    seal_page_ = seal;
}

bool FakeDaemon::truncate_page() {
    std::lock_guard<std::mutex> lock(mu_);
    if (page_fd_ < 0 || ftruncate(page_fd_, 0) != 0) return false;
    munmap(page_, kSharedPageSize);  // the fake's own mapping would fault as well
    page_ = nullptr;
    return true;
}

uint64_t FakeDaemon::publish(const std::string &cpus, bool notify, uint32_t flags) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!page_) return 0;
    ++generation_;
    write_allocation(page_, generation_, cpus, flags);
    if (notify) {
        std::string note = packet(proto::Type::Notify, 0, {{"generation", generation_}});
        for (auto &client : clients_)
            if (client.attached) send_packet(client.fd, note, -1, true);
    }
    return generation_;
}

uint64_t FakeDaemon::generation() const {
    std::lock_guard<std::mutex> lock(mu_);
    return generation_;
}

bool FakeDaemon::wait_for_ack(uint64_t generation, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return last_ack_ >= generation; });
}

uint64_t FakeDaemon::last_ack() const {
    std::lock_guard<std::mutex> lock(mu_);
    return last_ack_;
}

bool FakeDaemon::wait_for_attaches(int count, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return attaches_ >= count; });
}

int FakeDaemon::attach_count() const {
    std::lock_guard<std::mutex> lock(mu_);
    return attaches_;
}

nlohmann::json FakeDaemon::last_attach_body() const {
    std::lock_guard<std::mutex> lock(mu_);
    return last_attach_body_;
}

bool FakeDaemon::wait_for_progress(uint64_t work_units, uint64_t steps, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] {
        return last_progress_.is_object() && last_progress_.value("work_units", uint64_t{0}) == work_units &&
               last_progress_.value("steps", uint64_t{0}) == steps;
    });
}

nlohmann::json FakeDaemon::last_progress() const {
    std::lock_guard<std::mutex> lock(mu_);
    return last_progress_;
}

int FakeDaemon::unexpected_packets() const {
    std::lock_guard<std::mutex> lock(mu_);
    return unexpected_;
}

void FakeDaemon::run() {
    std::string data;
    for (;;) {
        std::vector<pollfd> fds;
        {
            std::lock_guard<std::mutex> lock(mu_);
            if (stopping_) return;
            fds.push_back({wake_fd_, POLLIN, 0});
            fds.push_back({listen_fd_, POLLIN, 0});
            for (auto &client : clients_) fds.push_back({client.fd, POLLIN, 0});
        }
        int ready = poll(fds.data(), fds.size(), 1000);
        if (ready <= 0) continue;
        std::lock_guard<std::mutex> lock(mu_);
        if (stopping_) return;
        if (fds[1].revents & POLLIN) {
            int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
            if (fd >= 0) clients_.push_back({fd, false});
        }
        for (size_t i = 2; i < fds.size(); ++i) {
            if (!fds[i].revents) continue;
            auto it = std::find_if(clients_.begin(), clients_.end(), [&](const Client &c) { return c.fd == fds[i].fd; });
            if (it == clients_.end()) continue;
            ssize_t n = recv_packet(it->fd, &data, proto::kMaxPacket, nullptr, true);
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) continue;
            if (n <= 0) {
                close(it->fd);
                clients_.erase(it);
                continue;
            }
            handle_packet(*it, data);
        }
    }
}

// Called with mu_ held.
void FakeDaemon::handle_packet(Client &client, const std::string &data) {
    auto msg = proto::decode(data, nullptr);
    if (!msg) {
        ++unexpected_;
        return;
    }
    switch (msg->type) {
        case proto::Type::Attach: {
            last_attach_body_ = msg->body;
            if (mode_ == Mode::Silent) break;
            ++attaches_;
            if (mode_ == Mode::Refuse) {
                send_packet(client.fd, packet(proto::Type::Reply, msg->request_id,
                                              proto::error_reply(refuse_code_, refuse_text_)));
            } else if (forget_jobs_ && msg->body.contains("job")) {
                send_packet(client.fd, packet(proto::Type::Reply, msg->request_id,
                                              proto::error_reply(MALL_ERR_NOJOB, "no such job")));
            } else {
                client.attached = true;
                send_packet(client.fd,
                            packet(proto::Type::Reply, msg->request_id,
                                   proto::ok_reply({{"job", job_}, {"generation", generation_}})),
                            page_fd_);
            }
            cv_.notify_all();
            break;
        }
        case proto::Type::Ack:
            if (msg->body.contains("generation") && msg->body["generation"].is_number_unsigned())
                last_ack_ = std::max(last_ack_, msg->body["generation"].get<uint64_t>());
            cv_.notify_all();
            break;
        case proto::Type::Progress:
            last_progress_ = msg->body;
            cv_.notify_all();
            break;
        default:
            ++unexpected_;
            break;
    }
}

}  // namespace mall::test
