// SPDX-License-Identifier: BSD-3-Clause
// connections.hpp — malld's client connections and everything sent on them. One Connection per
// accepted socket: its peer (SO_PEERCRED, pidfd), the job it attached to, its outbox. Sends never
// block: a packet the socket cannot take waits in a bounded outbox (EPOLLOUT is asked for), a slow
// reader that exceeds the bound loses its connection, and droppable packets (Notify, Event) are
// dropped instead of queued. Connections are only marked `closing` here; the loop closes them
// between batches of events (close()), so no caller ever holds a dangling reference.
// A socket malld is done with is never closed on the loop: its receive queue may hold descriptors
// a peer passed (kernels without SO_PASSRIGHTS), whose last close can block, so it goes to the
// closer thread (unix_socket.hpp). While the closer's queue is full the socket is parked and still
// counts against its uid's and malld's connection limits, so a peer that makes closes hang cannot
// make malld hold more than those limits allow (at most kMaxParkedSockets are parked).
// The limits: kMaxDaemonConnections in all; the last kAdminConnectionReserve of them only for
// admins (root, malld's uid, --admin-uid); ordinary users at most their per-uid limit each
// (malld --max-connections-per-user) and kMaxWatchersPerUid watchers each.
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
// Sockets parked while the closer's queue is full (Connections::dispose); past this many (a
// closer stuck for good), a socket is closed on the loop after all, the last resort.
inline constexpr size_t kMaxParkedSockets = 1024;
// Watch subscribers are never closed as idle: an ordinary user may hold at most this many.
inline constexpr int kMaxWatchersPerUid = 8;

struct Connection {
    struct Outgoing {
        std::string data;
        UniqueFd fd;  // a descriptor to pass along (dup'ed), or empty
    };
    uint64_t id = 0;
    UniqueFd fd;
    PeerCred peer;
    bool admin = false;  // the peer's uid is an admin's (AccessRules::is_admin), taken at accept
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

class Connections {
public:
    explicit Connections(int epoll_fd) : epoll_fd_(epoll_fd) {}
    Connections(const Connections &) = delete;
    Connections &operator=(const Connections &) = delete;

    // Takes an accepted socket into the loop (EPOLLIN). Null when epoll refuses it (the socket
    // is disposed of).
    Connection *add(UniqueFd fd, const PeerCred &peer, UniqueFd peer_pidfd, bool admin);
    Connection *find(uint64_t id);
    // Connections open, parked sockets included (what kMaxDaemonConnections bounds).
    size_t size() const { return connections_.size() + parked_.size(); }
    // Of those, the ones of non-admin peers (what kMaxNonAdminConnections bounds).
    int non_admin_count() const { return non_admin_; }
    int count_of_uid(uid_t uid) const;  // parked sockets included
    // A Watch on c may start: an admin's, a connection watching already, or one of a uid that
    // holds fewer than kMaxWatchersPerUid watchers. Else false with *why in words.
    bool may_watch(const Connection &c, std::string *why) const;
    // A socket malld is done with (a connection it refused or dropped): to the closer thread, or
    // parked while the closer's queue is full (counted for `uid` meanwhile).
    void dispose(UniqueFd fd, uid_t uid, bool admin);
    // Hands parked sockets to the closer as its queue makes room (the loop calls it).
    void retry_parked();
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
    std::map<uid_t, int> per_uid_;  // open connections (and parked sockets) of each peer uid
    int non_admin_ = 0;             // open connections (and parked sockets) of non-admin peers
    struct Parked {
        UniqueFd fd;
        uid_t uid;
        bool admin;
    };
    std::deque<Parked> parked_;  // sockets waiting for room in the closer's queue
    void count(uid_t uid, bool admin, int change);
    EventView event_view_;
};

}  // namespace mall
