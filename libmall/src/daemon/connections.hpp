// SPDX-License-Identifier: BSD-3-Clause
// connections.hpp — malld's client connections and everything sent on them. One Connection per
// accepted socket: its peer (SO_PEERCRED, pidfd), the job it attached to, its outbox. Sends never
// block: a packet the socket cannot take waits in a bounded outbox (EPOLLOUT is asked for), a slow
// reader that exceeds the bound loses its connection, and droppable packets (Notify, Event) are
// dropped instead of queued. Connections are only marked `closing` here; the loop closes them
// between batches of events (close()), so no caller ever holds a dangling reference.
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

struct Connection {
    struct Outgoing {
        std::string data;
        UniqueFd fd;  // a descriptor to pass along (dup'ed), or empty
    };
    uint64_t id = 0;
    UniqueFd fd;
    PeerCred peer;
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
    TimePoint refusal_log_window{};         // per-connection rate limit for refusal logs
    int refusals_logged = 0;
};

class Connections {
public:
    explicit Connections(int epoll_fd) : epoll_fd_(epoll_fd) {}
    Connections(const Connections &) = delete;
    Connections &operator=(const Connections &) = delete;

    // Takes an accepted socket into the loop (EPOLLIN). Null when epoll refuses it.
    Connection *add(UniqueFd fd, const PeerCred &peer, UniqueFd peer_pidfd);
    Connection *find(uint64_t id);
    size_t size() const { return connections_.size(); }
    int count_of_uid(uid_t uid) const;
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
    // Closes every connection without detaching (malld is stopping; the state keeps the jobs).
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
    std::map<uid_t, int> per_uid_;  // open connections of each peer uid
    EventView event_view_;
};

}  // namespace mall
