// SPDX-License-Identifier: BSD-3-Clause
// connections.hpp — malld's client connections and everything sent on them. One Connection per
// accepted socket: its peer (SO_PEERCRED, pidfd), the job it attached to, its outbox. Sends never
// block: a packet the socket cannot take waits in a bounded outbox (EPOLLOUT is asked for), a slow
// reader that exceeds the bound loses its connection, and droppable packets (Notify, Event) are
// dropped instead of queued. Connections are only marked `closing` here; the loop closes them
// between batches of events (close()), so no caller ever holds a dangling reference.
// Sockets malld is done with (connections it closes, refuses or drops) are shut down and emptied
// on the loop (empty_socket_for_close): one whose receive queue holds no packet with descriptors
// is closed there and then, since its close releases nothing a peer chose; a hang-up, a refusal,
// every connection of a client that never passes descriptors ends so. Only a socket whose queue
// holds descriptors (kernels without SO_PASSRIGHTS, a peer that passed them) goes to the closer
// thread (unix_socket.hpp), and while the closer's queue is full it is parked here. Nothing a
// peer may make hang is ever closed on the loop.
// Limits are counted per user (limits_owner, a LimitsOwner): a peer in malld's user namespace under
// its uid, a peer in another user namespace under the uid owning it (a rootless container's user,
// however many subuids it maps), except that a namespace made by root or an admin uid (rootful
// podman --userns=auto, a Kubernetes pod with user namespaces, setuid bwrap) is a user of its own,
// keyed by the namespace: such containers never share a limit with each other or with root. The
// limits: kMaxDaemonConnections in all; the last kAdminConnectionReserve of them only for admins
// (root, malld's uid, --admin-uid), whose connections count against no per-user limit; ordinary
// users at most their per-user limit each (malld --max-connections-per-user, parked sockets
// included) and kMaxWatchersPerUid watchers each.
// What a client passing descriptors while a close hangs can cost malld (the closer stuck for good,
// say on a FUSE file or a socket lingering with unsent data): one thread, and descriptors bounded
// as follows. Descriptors are received only from a user with nothing waiting for the closer (no
// descriptor queued or being closed, no socket parked) and only while the queue has room for a
// whole packet (may_receive_descriptors), so received ones never exceed kMaxQueuedCloses and each
// user adds at most one packet (kMaxDescriptorsPerPacket) until the closer has closed it; a
// connection whose next packet carries descriptors at another time is dropped unread. A user with
// more than kMaxCloserDebtPerUser descriptors or sockets waiting gets no new connection. Sockets
// holding descriptors go to the closer while it has room (its kMaxQueuedCloses), else are parked,
// counted against their user and malld's limits; once kMaxParkedSockets are parked malld accepts
// nothing more (the server takes the listener out of its loop) until the closer catches up, so
// malld holds at most kMaxDaemonConnections + kMaxParkedSockets sockets plus kMaxQueuedCloses
// queued descriptors, and its loop never waits. While that lasts new clients, admins' included,
// wait in the listen backlog (connections already open, such as watchers, go on working); the log
// names the users whose sockets are parked, so that root can end them (which ends their hanging
// closes: a FUSE server's death aborts its files, a reset ends a lingering socket).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "../common/protocol.hpp"
#include "../common/unix_socket.hpp"
#include "core/node_manager.hpp"

namespace mall {

// epoll tags of malld's loop: the kind of source in the top byte, its id below.
enum class Source : uint64_t { Listen = 1, Signal = 2, Connection = 3, Pid = 4, Slurm = 5 };
constexpr uint64_t kSourceShift = 56;
constexpr uint64_t kSourceIdMask = (uint64_t{1} << kSourceShift) - 1;
constexpr uint64_t epoll_tag(Source kind, uint64_t id) {
    return (static_cast<uint64_t>(kind) << kSourceShift) | (id & kSourceIdMask);
}

// malld serves at most this many connections at once (every user together).
inline constexpr int kMaxDaemonConnections = 4096;
// ... of which ordinary (non-admin) users together hold at most kMaxDaemonConnections minus this:
// admins (root: the Slurm plugin, the OCI hook, mallctl) always find a free slot.
inline constexpr int kAdminConnectionReserve = 256;
inline constexpr int kMaxNonAdminConnections = kMaxDaemonConnections - kAdminConnectionReserve;
// Sockets holding passed descriptors parked while the closer's queue is full (Connections::dispose);
// with this many parked malld accepts no connection until the closer catches up.
inline constexpr size_t kMaxParkedSockets = 1024;
// A non-admin user with more descriptors and sockets than this waiting for the closer gets no new
// connection (clients that pass no descriptors never have any waiting).
inline constexpr size_t kMaxCloserDebtPerUser = 16;
// Watch subscribers are never closed as idle: an ordinary user may hold at most this many.
inline constexpr int kMaxWatchersPerUid = 8;

// Whom a peer's per-user limits and closer debt count under: a uid, or a user namespace made by root
// or by an admin uid (its inode), never uid 0 for such a namespace. key() is what the closer thread
// counts descriptors for (unix_socket.hpp): a uid, or kNamespaceKeyBit | the namespace's inode.
class LimitsOwner {
public:
    LimitsOwner() = default;
    static LimitsOwner user(uid_t uid) { return LimitsOwner(uid, uid); }
    static LimitsOwner user_namespace(uint64_t inode, uid_t maker) {
        return LimitsOwner(kNamespaceKeyBit | inode, maker);
    }
    uint64_t key() const { return key_; }
    bool is_user_namespace() const { return (key_ & kNamespaceKeyBit) != 0; }
    // The user: the uid itself, or the uid that made the namespace.
    uid_t uid() const { return uid_; }
    // For log lines and refusals: "uid 1000", or "user namespace 4026532840 (made by root)".
    std::string describe() const;
    bool operator==(const LimitsOwner &other) const { return key_ == other.key_; }
    bool operator!=(const LimitsOwner &other) const { return key_ != other.key_; }
    bool operator<(const LimitsOwner &other) const { return key_ < other.key_; }

private:
    static constexpr uint64_t kNamespaceKeyBit = uint64_t{1} << 63;
    LimitsOwner(uint64_t key, uid_t uid) : key_(key), uid_(uid) {}
    uint64_t key_ = 0;
    uid_t uid_ = 0;
};

struct Connection {
    struct Outgoing {
        std::string data;
        UniqueFd fd;  // a descriptor to pass along (dup'ed), or empty
    };
    uint64_t id = 0;
    UniqueFd fd;
    PeerCred peer;
    bool admin = false;  // the peer's uid is an admin's (AccessRules::is_admin), taken at accept
    LimitsOwner owner;   // the user its limits count under (limits_owner), taken at accept
    bool watcher = false;
    bool closing = false;
    bool want_write = false;
    std::string job;         // the job this connection attached to ("" when not attached)
    uint64_t attach_id = 0;
    std::deque<Outgoing> outbox;  // replies the socket could not take yet
    size_t outbox_bytes = 0;      // bytes in outbox (bounded as well as the count)
    bool accepts_body_fd = false; // a request said it reads large replies from a memfd (protocol.hpp)
    // The peer process itself (SO_PEERPIDFD), so that a pid reused after the peer exited is
    // never taken for it; empty on kernels without SO_PEERPIDFD.
    UniqueFd peer_pidfd;
    unsigned long long accepted_ticks = 0;  // CLOCK_BOOTTIME at accept, in clock ticks
    TimePoint last_activity{};              // last packet received (idle connections close)
};

// Whom a peer's per-user limits count under: its own uid when it runs in malld's user namespace
// (or when that cannot be told), else the uid owning the outermost user namespace between malld's
// and the peer's (a rootless container's user, for all its subuids), or, when that uid is root or
// an admin's (is_admin), that namespace itself. The peer's namespace is read from
// /proc/PID/ns/user; peer_pidfd (-1 if none) proves PID was still the peer's when it was read
// (without it, a pid reused between connect and accept may be misread).
LimitsOwner limits_owner(const PeerCred &peer, int peer_pidfd, const std::function<bool(uid_t)> &is_admin);

class Connections {
public:
    explicit Connections(int epoll_fd) : epoll_fd_(epoll_fd) {}
    Connections(const Connections &) = delete;
    Connections &operator=(const Connections &) = delete;

    // Takes an accepted socket into the loop (EPOLLIN), counted for `owner` (limits_owner) unless
    // `admin`. Null when epoll refuses it (the socket is disposed of).
    Connection *add(UniqueFd fd, const PeerCred &peer, UniqueFd peer_pidfd, bool admin, const LimitsOwner &owner);
    Connection *find(uint64_t id);
    // Connections open, parked sockets included (what kMaxDaemonConnections bounds).
    size_t size() const { return connections_.size() + parked_.size(); }
    // Of those, the ones of non-admin peers (what kMaxNonAdminConnections bounds).
    int non_admin_count() const { return non_admin_; }
    // Of those, the ones of owner's non-admin peers (parked sockets included): what
    // --max-connections-per-user bounds. Admins' connections are counted for nobody.
    int count_of_owner(const LimitsOwner &owner) const;
    // Descriptors and sockets of owner's that wait for the closer: queued, being closed, parked.
    size_t closer_debt(const LimitsOwner &owner) const;
    // Whether descriptors may be received on c now: its user has nothing waiting for the closer and
    // the closer's queue has room for a whole packet of them (see the bound above).
    bool may_receive_descriptors(const Connection &c) const;
    // A Watch on c may start: an admin's, a connection watching already, or one of a user that
    // holds fewer than kMaxWatchersPerUid watchers. Else false with *why in words.
    bool may_watch(const Connection &c, std::string *why) const;
    // A socket malld is done with (a connection it refused or dropped): closed here when its
    // receive queue holds no descriptors, else to the closer thread, or parked while the closer's
    // queue is full (counted for `owner` meanwhile).
    void dispose(UniqueFd fd, const LimitsOwner &owner, bool admin);
    // Hands parked sockets to the closer as its queue makes room (the loop calls it).
    void retry_parked();
    size_t parked() const { return parked_.size(); }
    // kMaxParkedSockets are parked: malld must accept nothing until the closer catches up.
    bool parked_full() const { return parked_.size() >= kMaxParkedSockets; }
    // "uid U: N, ..." (LimitsOwner::describe) for the users with the most sockets parked (at most
    // `most`), for the log.
    std::string parked_owners_text(size_t most = 3) const;
    std::map<uint64_t, Connection> &all() { return connections_; }
    const std::map<uint64_t, Connection> &all() const { return connections_; }

    // Replies (never dropped; a reader that lets them pile up loses its connection).
    void reply(Connection &c, uint32_t request_id, const nlohmann::json &body, int pass_fd = -1);
    void reply_error(Connection &c, uint32_t request_id, int code, const std::string &text);
    // A wake-up to every connection attached to `job`: dropped when its socket is full (the
    // client then has unread notifications already, and the page holds the truth).
    void notify_attached(const std::string &job, uint64_t generation);
    // An event to every watcher, as the event view lets it see it; a watcher whose socket is
    // full is dropped.
    void broadcast_event(const nlohmann::json &event);
    // What a watcher may see of an event: the event to send it, or none (status_view.hpp's rule,
    // installed by RequestHandlers). Unset: every watcher gets every event.
    using EventView = std::function<std::optional<nlohmann::json>(const Connection &watcher,
                                                                   const nlohmann::json &event)>;
    void set_event_view(EventView view) { event_view_ = std::move(view); }
    // The job is gone: its attached connections are detached and hung up (the processes learn by
    // the hang-up that they are no longer managed).
    void hang_up_job(const std::string &job);
    // Sends what waits in the outbox (the socket became writable).
    void flush_outbox(Connection &c);

    // Removes a connection from the loop; returns the job and attach id it was attached to, so the
    // caller can detach it from the core after the erase.
    std::pair<std::string, uint64_t> close(uint64_t id);
    // Closes every connection without detaching (malld is stopping; the state keeps the jobs):
    // their sockets go to the closer; those it cannot take are left to the process's exit.
    void close_all();

private:
    bool send_message(Connection &c, proto::Type type, uint32_t request_id, const nlohmann::json &body,
                      int pass_fd, bool droppable);
    // Changes the events epoll watches on c; on failure gives up on c (false).
    // A memfd holding `data`, sealed against any change; empty with *why on failure.
    static UniqueFd sealed_memfd(const char *name, const std::string &data, std::string *why);
    bool watch_for(Connection &c, uint32_t events);
    // Marks c closing and logs why (rate-limited): it cannot be served correctly any more.
    void give_up(Connection &c, const std::string &why);

    int epoll_fd_;
    uint64_t next_id_ = 1;
    std::map<uint64_t, Connection> connections_;
    std::map<LimitsOwner, int> per_owner_;  // non-admin connections (and parked sockets) of each user
    int non_admin_ = 0;  // open connections (and parked sockets) of non-admin peers
    struct Parked {
        UniqueFd fd;
        LimitsOwner owner;
        bool admin;
    };
    std::deque<Parked> parked_;                // sockets waiting for room in the closer's queue
    std::map<LimitsOwner, size_t> parked_of_;  // of each user (admins' included: closer debt)
    void count(const LimitsOwner &owner, bool admin, int change);
    EventView event_view_;
};

}  // namespace mall
