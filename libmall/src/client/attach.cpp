// SPDX-License-Identifier: BSD-3-Clause
// attach.cpp — see attach.hpp. After a successful attach: the progress baselines restart (malld
// counts per connection), a self-registered job's name is kept for later attaches, the page is
// reconciled with what was applied, and mall_fd() and the control record are brought up to date.
#include "attach.hpp"

#include <poll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/ctl_client.hpp"
#include "common/unix_socket.hpp"
#include "control_by_signal.hpp"
#include "notify.hpp"

namespace mall::client {

namespace {

// Decimal text of a number (std::to_string would export a libstdc++ template from libmall.so).
std::string decimal(long long value) {
    char text[32];
    std::snprintf(text, sizeof text, "%lld", value);
    return text;
}

// True while addr starts a mapped page (mincore fails with ENOMEM on an unmapped one).
bool page_is_mapped(void *addr) {
    unsigned char resident;
    return ::mincore(addr, mall::kSharedPageSize, &resident) == 0 || errno != ENOMEM;
}

// Moves the job's page, mapped at `incoming` (which this call takes over), to the handle's fixed
// page address, where mall_step() reads it without a lock. Called with conn_mu held. One mremap
// does it: the kernel checks its limits before it lets go of the old page, so on failure the old
// page normally stays. Should the address be unmapped all the same, a zero page goes back (retried
// for up to a second under memory pressure): the fast path must never read an unmapped address.
bool install_page(mall_handle *m, void *incoming, std::string *why) {
    void *at = const_cast<mall::SharedPage *>(m->page);
    void *moved = ::mremap(incoming, mall::kSharedPageSize, mall::kSharedPageSize, MREMAP_MAYMOVE | MREMAP_FIXED, at);
    if (moved == at) return true;
    int err = errno;
    ::munmap(incoming, mall::kSharedPageSize);
    *why = std::string("cannot install malld's page: ") + std::strerror(err);
    for (int attempt = 0; !page_is_mapped(at) && attempt < 1000; ++attempt) {
        if (::mmap(at, mall::kSharedPageSize, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == at) break;
        ::usleep(1000);
    }
    return false;
}

// After a (re)attach whose page shows the generation already applied: a malld that re-adopted the
// job from its state file published nothing new, so ack that generation now (no mall_step() change
// will). A malld that lost its state counts generations from 1 again: if the same number now holds
// other cpus, make the next mall_step() apply it.
void reconcile_after_attach(mall_handle *m) {
    std::lock_guard<std::mutex> step_lock(m->step_mu);  // no change path runs meanwhile
    uint64_t seen = m->seen_generation.load(std::memory_order_acquire);
    if (seen == 0 || seen == kForceApply) return;
    mall_alloc_t &snapshot = m->scratch;
    bool consistent;
    {
        std::lock_guard<std::mutex> lock(m->conn_mu);
        consistent = mall::page_read(m->page, &snapshot);
    }
    if (!consistent || snapshot.generation != seen) return;  // the next mall_step() applies it
    bool same;
    {
        std::lock_guard<std::mutex> lock(m->state_mu);
        same = snapshot.ncpus == m->applied.ncpus && snapshot.nthreads == m->applied.nthreads &&
               std::memcmp(snapshot.mask, m->applied.mask, sizeof snapshot.mask) == 0;
    }
    if (same) {
        send_nonblocking(m, mall::proto::Type::Ack, {{"generation", seen}});
        return;
    }
    std::lock_guard<std::mutex> lock(m->notify_mu);
    m->seen_generation.store(kForceApply, std::memory_order_release);
}

// One attempt to connect and attach with body, bounded by timeout and interrupted by mall_close().
// On success installs the connection and the page and returns MALL_SUCCESS.
int attach_with(mall_handle *m, const nlohmann::json &body, milliseconds timeout, std::string *why) {
    const std::string &path = m->socket_path;
    auto deadline = Clock::now() + timeout;
    mall::UniqueFd sock(mall::unix_connect(path, milliseconds(0)));  // non-blocking: a full backlog fails at once
    if (!sock) {
        mall::ConnectFailure failure = mall::explain_connect_failure(path, errno, mall::SocketNaming::Environment);
        *why = failure.text();
        return failure.code;
    }
    // Anyone listening on a path this process was pointed at is not therefore malld.
    if (std::string problem = mall::server_identity_problem(sock.get(), path); !problem.empty()) {
        *why = "refusing the server: " + problem + "; check MALL_SOCKET=" + path;
        return MALL_ERR_NODAEMON;
    }

    mall::proto::Message request;
    request.type = mall::proto::Type::Attach;
    request.request_id = m->next_request_id++;
    if (m->next_request_id == 0) m->next_request_id = 1;
    request.body = body;
    if (!mall::send_packet(sock.get(), mall::proto::encode(request), -1, true)) {
        int err = errno;
        if (auto refusal = mall::pending_refusal(sock.get())) {
            *why = refusal->error;
            return refusal->code;
        }
        *why = "cannot send the attach request to malld at " + path + ": " + std::strerror(err);
        return MALL_ERR_NODAEMON;
    }

    std::string data;
    for (;;) {
        pollfd fds[2] = {{sock.get(), POLLIN, 0}, {m->stop_event_fd, POLLIN, 0}};
        int ready = ::poll(fds, 2, remaining_ms(deadline));
        if (ready < 0 && errno == EINTR) continue;
        if (ready < 0) {
            *why = std::string("waiting for malld failed: ") + std::strerror(errno);
            return MALL_ERR_SYSTEM;
        }
        if (fds[1].revents) {
            *why = "the handle was closed while attaching";
            return MALL_ERR_NODAEMON;
        }
        if (ready == 0) {
            *why = "malld at " + path + " did not answer the attach request within " +
                   decimal(timeout.count()) +
                   " ms (stuck or overloaded?); retrying in the background";
            return MALL_ERR_NODAEMON;
        }
        int passed = -1;
        ssize_t n = mall::recv_packet(sock.get(), &data, mall::proto::kMaxPacket, &passed, true);
        mall::UniqueFd page_fd(passed);
        if (n == 0) {
            *why = "malld at " + path + " closed the connection without answering the attach request";
            return MALL_ERR_NODAEMON;
        }
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) continue;
            if (errno == EMSGSIZE) {
                *why = "malld sent a packet larger than the protocol allows";
                return MALL_ERR_PROTOCOL;
            }
            int err = errno;
            if (auto refusal = mall::pending_refusal(sock.get())) {
                *why = refusal->error;
                return refusal->code;
            }
            *why = "receiving malld's attach reply failed: " + std::string(std::strerror(err));
            return MALL_ERR_NODAEMON;
        }
        std::string decode_error;
        mall::proto::DecodeFailure failure;
        auto reply = mall::proto::decode(data, &decode_error, &failure);
        if (!reply) {
            if (failure.reason == mall::proto::DecodeError::OtherVersion) {
                *why = "malld at " + path + " speaks protocol version " + decimal(failure.version) +
                       ", this libmall speaks " + decimal(mall::proto::kVersion) +
                       "; use libmall and malld from the same release";
            } else {
                *why = "cannot read malld's attach reply: " + decode_error;
            }
            return mall::proto::decode_error_code(failure.reason);
        }
        if (reply->type != mall::proto::Type::Reply) continue;
        const bool refused_connection = reply->request_id == mall::proto::kConnectionRefusalId;
        if (reply->request_id != request.request_id && !refused_connection) continue;

        const nlohmann::json &answer = reply->body;
        mall::proto::ReplyOutcome outcome = mall::proto::read_reply(answer, "attach");
        if (refused_connection) {
            *why = "malld refused the connection: " + (outcome.ok ? std::string("no reason given") : outcome.error);
            return outcome.ok ? MALL_ERR_PROTOCOL : outcome.code;
        }
        if (!outcome.ok) {
            *why = outcome.malformed ? outcome.error : "malld refused to attach: " + outcome.error;
            return outcome.code;
        }

        std::string job;
        try {
            job = mall::proto::get_string(answer, "job");
        } catch (const mall::proto::ProtocolError &e) {
            *why = std::string("malld's attach reply is malformed: ") + e.what();
            return MALL_ERR_PROTOCOL;
        }
        if (auto bad = mall::proto::invalid_job_name(job)) {
            *why = "malld's attach reply names an invalid job: " + *bad;
            return MALL_ERR_PROTOCOL;
        }
        if (!page_fd) {
            *why = "malld's attach reply carried no page descriptor";
            return MALL_ERR_PROTOCOL;
        }
        // Unsealed, its sender could truncate it under the mapping: SIGBUS at the next step.
        if (std::string problem = mall::page_fd_problem(page_fd.get()); !problem.empty()) {
            *why = "refusing the server's page: " + problem + "; malld seals every page (server at " + path + ")";
            return MALL_ERR_PROTOCOL;
        }
        // Mapped away from the live page and checked there; only a good page replaces it.
        void *incoming = ::mmap(nullptr, mall::kSharedPageSize, PROT_READ, MAP_SHARED, page_fd.get(), 0);
        if (incoming == MAP_FAILED) {
            *why = std::string("cannot map malld's page: ") + std::strerror(errno);
            return MALL_ERR_SYSTEM;
        }
        struct Unmap {
            void *addr;
            ~Unmap() {
                if (addr) ::munmap(addr, mall::kSharedPageSize);
            }
        } unmap_incoming{incoming};
        const auto *incoming_page = static_cast<const mall::SharedPage *>(incoming);
        uint32_t page_magic = __atomic_load_n(&incoming_page->magic, __ATOMIC_RELAXED);
        uint32_t page_version = __atomic_load_n(&incoming_page->version, __ATOMIC_RELAXED);
        if (page_magic != mall::kPageMagic) {
            *why = "malld's page does not start with the page magic";
            return MALL_ERR_PROTOCOL;
        }
        if (page_version != mall::kPageVersion) {
            *why = "malld's page has layout version " + decimal(page_version) + ", this libmall reads " +
                   decimal(mall::kPageVersion) + "; use libmall and malld from the same release";
            return MALL_ERR_VERSION;
        }

        {
            std::lock_guard<std::mutex> lock(m->conn_mu);
            unmap_incoming.addr = nullptr;  // install_page takes it over
            if (!install_page(m, incoming, why)) return MALL_ERR_SYSTEM;
            if (m->sock >= 0) ::close(m->sock);
            m->sock = sock.release();
            if (job != m->job_name.load(std::memory_order_relaxed)) {
                auto known = std::find(m->job_names.begin(), m->job_names.end(), job);
                if (known == m->job_names.end()) known = m->job_names.insert_after(m->job_names.before_begin(), job);
                m->job_name.store(known->c_str(), std::memory_order_release);
            }
            m->progress_base_units = m->work_units.load(std::memory_order_relaxed);
            m->progress_base_calls = m->progress_calls.load(std::memory_order_relaxed);
            m->progress_sent_units = 0;
            m->progress_sent_calls = 0;
            m->attached.store(true, std::memory_order_release);
        }
        if (!m->attach_body.contains("job")) m->self_job = job;
        reconcile_after_attach(m);
        signal_if_pending(m);
        refresh_record(m);
        return MALL_SUCCESS;
    }
}

}  // namespace

int attach_once(mall_handle *m, milliseconds timeout, std::string *why) {
    if (m->self_job.empty()) return attach_with(m, m->attach_body, timeout, why);
    int rc = attach_with(m, nlohmann::json{{"job", m->self_job}}, timeout, why);
    if (rc != MALL_ERR_NOJOB) return rc;
    // malld forgot the job (restarted without its state): register anew.
    m->self_job.clear();
    return attach_with(m, m->attach_body, timeout, why);
}

void detach(mall_handle *m) {
    {
        std::lock_guard<std::mutex> lock(m->conn_mu);
        m->attached.store(false, std::memory_order_release);
        if (m->sock >= 0) ::close(m->sock);
        m->sock = -1;
        // The page stays mapped: its frozen generation keeps mall_step() on the fast path until a
        // new attachment replaces it.
    }
    refresh_record(m);
}

void send_nonblocking(mall_handle *m, mall::proto::Type type, nlohmann::json body) {
    mall::proto::Message msg;
    msg.type = type;
    msg.body = std::move(body);
    std::string packet = mall::proto::encode(msg);
    std::lock_guard<std::mutex> lock(m->conn_mu);
    if (m->sock >= 0) mall::send_packet(m->sock, packet, -1, true);
}

int remaining_ms(Clock::time_point deadline) {
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    return left > 0 ? static_cast<int>(std::min<int64_t>(left, 60000)) : 0;
}

}  // namespace mall::client
