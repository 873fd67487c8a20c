// SPDX-License-Identifier: BSD-3-Clause
// connections.cpp — see connections.hpp. Outbox bounds: kMaxOutbox packets and kMaxOutboxBytes
// (Status replies can be large); a reader over either bound is closed, with a rate-limited warning.
// Sockets are emptied and closed on the loop, or, when they hold passed descriptors, disposed of
// through the closer thread, parked while its queue is full. limits_owner takes a peer's user
// namespace and its owner from procfs's outer_user_namespace (the one reader of that rule).
#include "connections.hpp"

#include <fcntl.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <sys/epoll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "log.hpp"
#include "procfs.hpp"

namespace mall {

namespace {

constexpr size_t kMaxOutbox = 64;            // replies queued for a slow reader before we drop it
constexpr size_t kMaxOutboxBytes = 1 << 20;  // ... and their bytes

}  // namespace

std::string LimitsOwner::describe() const {
    if (!is_user_namespace()) return "uid " + std::to_string(uid_);
    return "user namespace " + std::to_string(key_ & ~kNamespaceKeyBit) +
           (uid_ == 0 ? " (made by root)" : " (made by admin uid " + std::to_string(uid_) + ")");
}

LimitsOwner limits_owner(const PeerCred &peer, int peer_pidfd, const std::function<bool(uid_t)> &is_admin) {
    const std::optional<OuterUserNamespace> outer = outer_user_namespace(peer.pid, peer_pidfd);
    // A peer in malld's own user namespace (nullopt) counts under its uid.
    if (!outer) return LimitsOwner::user(peer.uid);
    // Root's and admins' namespaces are each a user of their own: the containers they start are
    // not one user, and not root.
    if (outer->owner == 0 || is_admin(outer->owner))
        return LimitsOwner::user_namespace(outer->inode, outer->owner);
    return LimitsOwner::user(outer->owner);
}

Connection *Connections::add(UniqueFd fd, const PeerCred &peer, UniqueFd peer_pidfd, bool admin,
                             const LimitsOwner &owner) {
    const uint64_t id = next_id_++;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = epoll_tag(Source::Connection, id);
    if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd.get(), &ev) != 0) {
        log_warn(std::string("epoll_ctl failed for a new client: ") + std::strerror(errno));
        dispose(std::move(fd), owner, admin);
        return nullptr;
    }
    Connection &c = connections_[id];
    c.id = id;
    c.fd = std::move(fd);
    c.peer = peer;
    c.admin = admin;
    c.owner = owner;
    c.peer_pidfd = std::move(peer_pidfd);
    c.last_activity = Clock::now();
    count(owner, admin, +1);
    return &c;
}

void Connections::count(const LimitsOwner &owner, bool admin, int change) {
    if (admin) return;  // admins have their reserve (kAdminConnectionReserve), and no per-user limit
    non_admin_ += change;
    int &of_owner = per_owner_[owner];
    of_owner += change;
    if (of_owner <= 0) per_owner_.erase(owner);
}

bool Connections::may_watch(const Connection &c, std::string *why) const {
    if (c.admin || c.watcher) return true;
    int watching = 0;
    for (const auto &[id, other] : connections_)
        if (other.watcher && !other.closing && other.owner == c.owner) ++watching;
    if (watching < kMaxWatchersPerUid) return true;
    *why = c.owner.describe() + " holds " + std::to_string(watching) +
           " watch connections already, the limit per non-admin user (" +
           std::to_string(kMaxWatchersPerUid) + "); close one (e.g. another mallctl watch) first";
    return false;
}

size_t Connections::closer_debt(const LimitsOwner &owner) const {
    auto it = parked_of_.find(owner);
    return (it == parked_of_.end() ? 0 : it->second) + descriptors_waiting_to_close(owner.key());
}

bool Connections::may_receive_descriptors(const Connection &c) const {
    const size_t waiting = descriptors_waiting_to_close();
    if (waiting == 0 && parked_.empty()) return true;
    return waiting + kMaxDescriptorsPerPacket <= kMaxQueuedCloses && closer_debt(c.owner) == 0;
}

void Connections::dispose(UniqueFd fd, const LimitsOwner &owner, bool admin) {
    if (!fd) return;
    if (empty_socket_for_close(fd.get())) {
        fd.reset();  // nothing a peer passed is released: this close cannot block
        return;
    }
    if (parked_.empty() && close_off_thread(fd.get(), owner.key())) {
        fd.release();
        return;
    }
    log_warn_limited("closer-parked", "malld's closer thread has " + std::to_string(descriptors_waiting_to_close()) +
                                          " descriptors queued (a peer passed files whose close hangs); "
                                          "a socket of " + owner.describe() +
                                          " holding passed descriptors waits for room and counts against "
                                          "that user's connections (parked: " + parked_owners_text() + ")");
    count(owner, admin, +1);
    ++parked_of_[owner];
    parked_.push_back(Parked{std::move(fd), owner, admin});
}

void Connections::retry_parked() {
    while (!parked_.empty() && close_off_thread(parked_.front().fd.get(), parked_.front().owner.key())) {
        Parked &first = parked_.front();
        first.fd.release();
        count(first.owner, first.admin, -1);
        auto it = parked_of_.find(first.owner);
        if (it != parked_of_.end() && --it->second == 0) parked_of_.erase(it);
        parked_.pop_front();
    }
}

std::string Connections::parked_owners_text(size_t most) const {
    std::vector<std::pair<size_t, LimitsOwner>> by_count;
    for (const auto &[owner, n] : parked_of_) by_count.emplace_back(n, owner);
    std::sort(by_count.rbegin(), by_count.rend());
    std::string text;
    for (size_t i = 0; i < by_count.size() && i < most; ++i)
        text += (i ? ", " : "") + by_count[i].second.describe() + ": " + std::to_string(by_count[i].first);
    return text.empty() ? "none" : text;
}

Connection *Connections::find(uint64_t id) {
    auto it = connections_.find(id);
    return it == connections_.end() ? nullptr : &it->second;
}

int Connections::count_of_owner(const LimitsOwner &owner) const {
    auto it = per_owner_.find(owner);
    return it == per_owner_.end() ? 0 : it->second;
}

bool Connections::send_message(Connection &c, proto::Type type, uint32_t request_id,
                               const nlohmann::json &body, int pass_fd, bool droppable) {
    if (c.closing || !c.fd) return false;
    proto::Message msg;
    msg.type = type;
    msg.request_id = request_id;
    msg.body = body;
    std::string data;
    UniqueFd body_fd;  // a reply too large for a packet: its JSON, in a sealed memfd
    try {
        data = proto::encode(msg);
    } catch (const std::exception &e) {
        std::string why = e.what();
        // One large reply per connection at a time: each memfd holds a whole status that neither
        // the socket's buffer nor the outbox counts, so a client that asks and never reads could
        // otherwise make malld pin one per request. A reply still unread (queued in the socket,
        // SIOCOUTQ, or in the outbox) means this one is refused with words.
        int unread = 0;
        const bool earlier_unread = !c.outbox.empty() || (::ioctl(c.fd.get(), SIOCOUTQ, &unread) == 0 && unread > 0);
        if (type == proto::Type::Reply && pass_fd < 0 && earlier_unread) {
            why = "malld's earlier reply on this connection is still unread; read it before asking again";
        } else if (type == proto::Type::Reply && pass_fd < 0 && !c.accepts_body_fd) {
            why += " (this client reads no large replies: use the mallctl or libmall of malld's version)";
        } else if (type == proto::Type::Reply && pass_fd < 0) {
            const std::string json = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
            body_fd = sealed_memfd("mall-reply", json, &why);
            if (body_fd) {
                msg.body = {{"ok", true}, {proto::kBodyInFdField, json.size()}};
                pass_fd = body_fd.get();
            }
        }
        if (!body_fd) msg.body = proto::error_reply(MALL_ERR_SYSTEM, "reply too large: " + why);
        data = proto::encode(msg);
    }
    if (c.outbox.empty()) {
        if (send_packet(c.fd.get(), data, pass_fd, true)) return true;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            c.closing = true;  // the peer is gone
            return false;
        }
    }
    if (droppable) return false;
    if (c.outbox.size() >= kMaxOutbox || c.outbox_bytes + data.size() > kMaxOutboxBytes) {
        log_warn_limited("slow-reader", "client uid " + std::to_string(c.peer.uid) + " pid " +
                                            std::to_string(c.peer.pid) +
                                            " does not read its replies; closing its connection");
        c.closing = true;
        return false;
    }
    Connection::Outgoing out;
    if (pass_fd >= 0) {
        out.fd.reset(::fcntl(pass_fd, F_DUPFD_CLOEXEC, 0));
        if (!out.fd) {  // a reply without its descriptor would be wrong: the client asks again
            give_up(c, std::string("cannot keep a descriptor for a queued reply: ") + std::strerror(errno));
            return false;
        }
    }
    c.outbox_bytes += data.size();
    out.data = std::move(data);
    c.outbox.push_back(std::move(out));
    if (!c.want_write) {
        if (!watch_for(c, EPOLLIN | EPOLLOUT)) return false;  // the outbox would never drain
        c.want_write = true;
    }
    return true;
}

UniqueFd Connections::sealed_memfd(const char *name, const std::string &data, std::string *why) {
    UniqueFd fd(::memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING));
    size_t done = 0;
    while (fd && done < data.size()) {
        const ssize_t n = ::write(fd.get(), data.data() + done, data.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        done += static_cast<size_t>(n);
    }
    // Sealed: the reader may trust the size it is told and that nobody changes the bytes.
    if (!fd || done != data.size() ||
        ::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        *why = std::string("cannot put a ") + std::to_string(data.size()) + "-byte reply in a memfd: " + std::strerror(errno);
        return UniqueFd();
    }
    return fd;
}

bool Connections::watch_for(Connection &c, uint32_t events) {
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = epoll_tag(Source::Connection, c.id);
    if (::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.fd.get(), &ev) == 0) return true;
    give_up(c, std::string("epoll_ctl failed: ") + std::strerror(errno));
    return false;
}

void Connections::give_up(Connection &c, const std::string &why) {
    log_warn_limited("connection-failure", "closing the connection of uid " + std::to_string(c.peer.uid) +
                                               " pid " + std::to_string(c.peer.pid) + ": " + why +
                                               " (the client reconnects)");
    c.closing = true;
}

void Connections::flush_outbox(Connection &c) {
    while (!c.outbox.empty() && !c.closing) {
        Connection::Outgoing &out = c.outbox.front();
        if (!send_packet(c.fd.get(), out.data, out.fd ? out.fd.get() : -1, true)) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            c.closing = true;
            return;
        }
        c.outbox_bytes -= std::min(c.outbox_bytes, out.data.size());
        c.outbox.pop_front();
    }
    // Still watched for EPOLLOUT, the (level-triggered) loop would spin: give up if it cannot stop.
    if (c.want_write && !c.closing && watch_for(c, EPOLLIN)) c.want_write = false;
}

void Connections::reply(Connection &c, uint32_t request_id, const nlohmann::json &body, int pass_fd) {
    send_message(c, proto::Type::Reply, request_id, body, pass_fd, false);
}

void Connections::reply_error(Connection &c, uint32_t request_id, int code, const std::string &text) {
    reply(c, request_id, proto::error_reply(code, text));
}

void Connections::notify_attached(const std::string &job, uint64_t generation) {
    for (auto &[id, c] : connections_)
        if (c.job == job) send_message(c, proto::Type::Notify, 0, {{"generation", generation}}, -1, true);
}

void Connections::broadcast_event(const nlohmann::json &event) {
    for (auto &[id, c] : connections_) {
        if (!c.watcher || c.closing) continue;
        const std::optional<nlohmann::json> seen = event_view_ ? event_view_(c, event) : event;
        if (!seen) continue;
        if (!send_message(c, proto::Type::Event, 0, *seen, -1, true) && !c.closing) {
            log_warn_limited("slow-watcher", "watcher uid " + std::to_string(c.peer.uid) + " pid " +
                                                 std::to_string(c.peer.pid) +
                                                 " does not keep up with events; dropping it");
            c.closing = true;
        }
    }
}

void Connections::hang_up_job(const std::string &job) {
    for (auto &[id, c] : connections_) {
        if (c.job != job) continue;
        c.job.clear();
        c.attach_id = 0;
        c.closing = true;
    }
}

std::pair<std::string, uint64_t> Connections::close(uint64_t id) {
    auto it = connections_.find(id);
    if (it == connections_.end()) return {};
    Connection &c = it->second;
    std::pair<std::string, uint64_t> attached{c.job, c.attach_id};
    if (c.fd) ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c.fd.get(), nullptr);
    log_debug("connection " + std::to_string(id) + " (uid " + std::to_string(c.peer.uid) + " pid " +
              std::to_string(c.peer.pid) + ") closed");
    count(c.owner, c.admin, -1);
    UniqueFd socket = std::move(c.fd);
    const LimitsOwner owner = c.owner;
    const bool admin = c.admin;
    connections_.erase(it);
    dispose(std::move(socket), owner, admin);
    return attached;
}

void Connections::close_all() {
    for (auto &[id, c] : connections_) {
        if (!c.fd) continue;
        ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c.fd.get(), nullptr);
        if (empty_socket_for_close(c.fd.get())) {
            c.fd.reset();
            continue;
        }
        // When the closer is full, the process's exit closes it instead.
        close_off_thread(c.fd.get(), c.owner.key());
        (void)c.fd.release();
    }
    for (Parked &p : parked_) (void)p.fd.release();
    connections_.clear();
    parked_.clear();
    parked_of_.clear();
    per_owner_.clear();
    non_admin_ = 0;
}

}  // namespace mall
