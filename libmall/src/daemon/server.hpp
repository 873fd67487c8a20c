// SPDX-License-Identifier: BSD-3-Clause
// server.hpp — malld's event loop, which wires the daemon's parts together: one epoll loop over
// the listening socket, the client connections (connections.hpp), a signalfd, a pidfd per
// registered process (pid_watch.hpp) and the Slurm checker's eventfd (slurm_reconcile.hpp).
// Packets go to access.cpp (decode, authorize, dispatch to handlers.cpp); the core's decisions are
// carried out by kernel_effects.cpp; persistence.cpp keeps the state file. The loop itself only
// accepts, reads, times and closes.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "../common/cpuset.hpp"
#include "../common/rules.hpp"
#include "../common/unix_socket.hpp"
#include "access.hpp"
#include "backend.hpp"
#include "connections.hpp"
#include "core/node_manager.hpp"
#include "core/policy.hpp"
#include "core/topology.hpp"
#include "handlers.hpp"
#include "kernel_effects.hpp"
#include "log.hpp"
#include "persistence.hpp"
#include "pid_watch.hpp"
#include "slurm_jobs.hpp"
#include "slurm_reconcile.hpp"

namespace mall {

// --max-connections-per-user's default for a pool of `cpus` cpus: 8 per cpu (a rank per cpu with
// room for tools and helper connections), at least kMinDefaultConnectionsPerUid, at most
// kMaxDefaultConnectionsPerUid. The arithmetic (connections.hpp has the limits): ordinary users
// share kMaxNonAdminConnections = 4096 - 256 = 3840 connections, and admins keep their 256
// whatever ordinary users do; 16 users at the default's maximum hold 16 x 224 = 3584 of the 3840,
// so a 17th still finds 256.
inline constexpr int kMinDefaultConnectionsPerUid = 128;
inline constexpr int kMaxDefaultConnectionsPerUid = 224;
static_assert(16 * kMaxDefaultConnectionsPerUid + 256 <= kMaxNonAdminConnections,
              "16 ordinary users at the default limit must leave room for a 17th");
int default_connections_per_uid(int cpus);

struct ServerOptions {
    std::string socket_path;
    unsigned socket_mode = 0666;  // authorization is by SO_PEERCRED, not by file mode
    std::string state_dir;
    std::chrono::milliseconds ack_timeout = kDefaultAckTimeout;
    PolicyKind policy = PolicyKind::Equal;
    bool policy_given = false;     // --policy was on the command line: it wins over the state file
    std::set<uid_t> admin_uids;    // besides root and malld's own euid
    bool allow_self_register = false;
    int max_connections_per_uid = kMinDefaultConnectionsPerUid;  // of one non-admin uid (malld option)
    // --metrics-file: Prometheus text (common/metrics_text.hpp) rewritten atomically every
    // metrics_interval, and removed when malld stops cleanly; empty: none.
    std::string metrics_file;
    std::chrono::seconds metrics_interval{15};
    // --history-file: each finished job's record (common/job_history.hpp); empty: none.
    std::string history_file;
    uint64_t history_max_bytes = 16ull << 20;
    // --checkpoint-interval: while jobs run, the state file (and so their accounting) is rewritten
    // at least this often, so a SIGKILL or an OOM kill of malld loses at most this much of the
    // figures of jobs that end before it restarts.
    std::chrono::seconds checkpoint_interval{60};
    std::string host;  // the node's name in history records
};


class Server final {
public:
    Server(ServerOptions options, const Topology &topology, CpuSet pool,
           std::unique_ptr<CpusetBackend> backend);
    ~Server();
    Server(const Server &) = delete;
    Server &operator=(const Server &) = delete;

    // Listens on the socket (refusing one a live malld serves), prepares the backend, loads the
    // state file and re-adopts the jobs whose processes still run. False with *error on failure.
    bool start(std::string *error);
    // Before start(): check "slurm-<jobid>" registrations and reservations against Slurm, right
    // after each registration and every `interval`; record running jobs' figures in their
    // AdminComment every `comment_interval` (0: only when they end; see slurm_reconcile.hpp);
    // `spool`: slurmd's spool folder of this node, where running jobs are seen without an RPC.
    void enable_slurm_checks(std::unique_ptr<SlurmQuery> query, std::chrono::seconds interval,
                             std::chrono::seconds comment_interval = std::chrono::seconds(0),
                             std::optional<SlurmdSpool> spool = std::nullopt);
    // Serves until SIGTERM or SIGINT, then stops cleanly (state kept, socket removed).
    // Returns the process exit code (0).
    int run();

private:
    void handle_listen();
    void accept_and_drop_one();
    // Whom a connection of `peer` counts under (limits_owner with malld's admin rule).
    LimitsOwner owner_of(const PeerCred &peer, int peer_pidfd) const;
    // Why a new connection of `peer` (counted for `owner`: limits_owner) is refused (logged,
    // rate-limited), or "" when it is served.
    std::string connection_refusal(const PeerCred &peer, bool admin, const LimitsOwner &owner) const;
    // Puts the listener in the loop or takes it out: out while malld is out of descriptors with
    // its spare spent, or while kMaxParkedSockets sockets are parked (connections.hpp).
    void update_listener();
    void handle_signal();
    void handle_connection(uint64_t id, uint32_t events);
    void handle_slurm_results();
    void after_events();
    // Container jobs: the processes now in their cgroups join them (the container's init, exec'd
    // processes), so the job lives until the last of them exits. Runs about once a second, and
    // before a watched process's exit is handled (the launcher's exit must not end a job whose
    // container has just started).
    void find_container_members(TimePoint now);
    // Every kCpuSampleInterval: each job's cpu time so far (the backend's counter) goes to the core,
    // which turns it into the job's busy fraction (NodeManager::record_cpu_time). Reads only the
    // job's own cgroups or processes.
    void sample_cpu_time(TimePoint now);
    void close_idle_connections(TimePoint now);
    void close_connection(uint64_t id);
    int next_timeout_ms() const;
    bool idle_candidate(const Connection &c, const std::set<uint64_t> &waiting) const;
    void stop_cleanly();
    // Saves the state when it changed, and every --checkpoint-interval while jobs run (their
    // figures grow with no event to save them).
    void save_state(TimePoint now);
    // Rewrites --metrics-file when it is due (and at start-up); failures are logged once each.
    void write_metrics(TimePoint now);
    // A job ended: its record goes to --history-file.
    void record_job_end(const nlohmann::json &end_event);

    ServerOptions options_;
    AccessRules access_;
    const Topology &topology_;
    CpuSet pool_;
    std::unique_ptr<CpusetBackend> backend_;

    UniqueFd epoll_fd_;
    UniqueFd listen_fd_;
    UniqueFd signal_fd_;
    UniqueFd spare_fd_;  // /dev/null held in reserve: freed to accept-and-close on EMFILE/ENFILE
    bool listening_ = false;
    bool listener_armed_ = false;      // the listener is in the epoll set
    bool out_of_descriptors_ = false;  // EMFILE/ENFILE and no spare: until after_events() has one again
    bool stopping_ = false;
    // What enable_slurm_checks() asked for: start() builds slurm_ from it once the stop signals
    // are blocked, so the checker's thread can never take them.
    std::unique_ptr<SlurmQuery> slurm_query_;
    std::chrono::seconds slurm_interval_{0};
    std::chrono::seconds slurm_comment_interval_{0};
    std::optional<SlurmdSpool> slurmd_spool_;
    TimePoint next_container_scan_{};
    TimePoint next_cpu_sample_{};
    std::optional<TimePoint> next_metrics_write_;  // set when --metrics-file is given
    std::optional<TimePoint> next_accounting_checkpoint_;  // set while the core has jobs
    FailureLog metrics_failures_, history_failures_;

    // Built in start() (persistence_ first, to read the state; slurm_ if enable_slurm_checks() ran);
    // each refers only to those declared before it, and ~Server() ends the writer thread first.
    std::unique_ptr<Connections> connections_;
    std::unique_ptr<PidWatcher> pids_;
    std::unique_ptr<KernelEffects> effects_;
    std::unique_ptr<NodeManager> manager_;
    std::unique_ptr<SlurmReconciler> slurm_;  // null unless enable_slurm_checks()
    std::unique_ptr<RequestHandlers> handlers_;
    std::unique_ptr<Persistence> persistence_;
};

}  // namespace mall
