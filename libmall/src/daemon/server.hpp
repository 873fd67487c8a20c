// server.hpp — malld's socket server around the NodeManager core: one epoll loop over the listening
// socket, client connections, a signalfd and a pidfd per registered process. It decodes, authorizes
// (one request table: each message type names its handler and the role it needs), dispatches to the
// core, encodes replies, and carries out the core's Effects (cgroup writes, shared pages, events).
// Also: the state file (saved after every change), re-adoption at start, and malld's log lines.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../common/cpuset.hpp"
#include "../common/protocol.hpp"
#include "../common/shared_page.hpp"
#include "../common/unix_socket.hpp"
#include "backend.hpp"
#include "core/node_manager.hpp"
#include "slurm_jobs.hpp"
#include "core/policy.hpp"
#include "state_file.hpp"
#include "core/topology.hpp"

namespace mall {

// --- malld's log: "2026-11-22T10:00:00.123 malld[pid] info: text" on stderr ---
enum class LogLevel { Error = 0, Warn = 1, Info = 2, Debug = 3 };
std::optional<LogLevel> parse_log_level(const std::string &name);
void set_log_level(LogLevel level);
bool log_enabled(LogLevel level);
void log_line(LogLevel level, const std::string &text);

struct ServerOptions {
    std::string socket_path;
    unsigned socket_mode = 0666;  // authorization is by SO_PEERCRED, not by file mode
    std::string state_dir;
    std::chrono::milliseconds ack_timeout{2000};
    PolicyKind policy = PolicyKind::Equal;
    bool policy_given = false;     // --policy was on the command line: it wins over the state file
    std::set<uid_t> admin_uids;    // besides root and malld's own euid
    bool allow_self_register = false;
};

class StateWriter;  // writes the state file on its own thread (server.cpp)

class Server final : private Effects {
public:
    Server(ServerOptions options, const Topology &topology, CpuSet pool,
           std::unique_ptr<CpusetBackend> backend);
    ~Server() override;
    Server(const Server &) = delete;
    Server &operator=(const Server &) = delete;

    // Listens on the socket (refusing one a live malld serves), prepares the backend, loads the
    // state file and re-adopts the jobs whose processes still run. False with *error on failure.
    bool start(std::string *error);
    // Before start(): check "slurm-<jobid>" registrations and reservations against Slurm, right
    // after each registration and every `interval`; jobs Slurm no longer runs (or that are not
    // the registering uid's) are ended and their cpus released.
    void enable_slurm_checks(std::unique_ptr<SlurmQuery> query, std::chrono::seconds interval);
    // Serves until SIGTERM or SIGINT, then stops cleanly (state kept, socket removed).
    // Returns the process exit code (0).
    int run();

private:
    enum class Role { Any, Admin, Owner, Attached };
    struct Connection;
    using Handler = void (Server::*)(Connection &, const proto::Message &);
    struct RequestRule {
        proto::Type type;
        Role role;
        Handler handler;
    };
    static const RequestRule kRequestTable[];

    struct Outgoing {
        std::string data;
        UniqueFd fd;  // a descriptor to pass along (dup'ed), or empty
    };
    struct Connection {
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
        // The peer process itself (SO_PEERPIDFD), so that a pid reused after the peer exited is
        // never taken for it; empty on kernels without SO_PEERPIDFD.
        UniqueFd peer_pidfd;
        unsigned long long accepted_ticks = 0;  // CLOCK_BOOTTIME at accept, in clock ticks
        TimePoint last_activity{};              // last packet received (idle connections close)
        TimePoint refusal_log_window{};         // per-connection rate limit for refusal logs
        int refusals_logged = 0;
    };
    struct JobPage {
        UniqueFd memfd;
        SharedPage *page = nullptr;
    };
    struct PidWatch {
        std::string job;
        pid_t pid = 0;
        UniqueFd pidfd;  // empty when pidfd_open is unavailable: polled instead
    };
    struct PendingReply {
        // LookUp: a Reclaim for an owner without cpus, waiting for Slurm to say which (--slurm).
        enum class Kind { Register, Reclaim, LookUp } kind;
        uint64_t connection = 0;
        uint32_t request_id = 0;
        std::string job;  // Register: the job; Reclaim: the owner ("" when none)
        CpuSet cpus;
        TimePoint deadline;
    };

    // --- Effects (called by the core) ---
    bool enforce(const std::string &job, const CpuSet &cpus, bool growing,
                 std::string *error) override;
    void publish(const std::string &job, uint64_t generation, const CpuSet &cpus) override;
    void job_removed(const std::string &job) override;
    void event(const nlohmann::json &event) override;
    TimePoint clock_now(TimePoint) override { return Clock::now(); }

    // --- loop ---
    void handle_listen();
    void handle_signal();
    void handle_connection(uint64_t id, uint32_t events);
    void handle_pid_exit(uint64_t watch_id);
    void after_events();
    int next_timeout_ms() const;
    void flush_outbox(Connection &c);
    void close_connection(Connection &c);
    void stop_cleanly();

    // --- messages ---
    void handle_packet(Connection &c, const std::string &packet);
    bool authorize(const Connection &c, const RequestRule &rule, const proto::Message &msg,
                   int *code, std::string *why) const;
    bool is_admin(uid_t uid) const;
    bool peer_still_connected_process(const Connection &c, std::string *why) const;
    bool may_log_refusal(Connection &c);
    bool waiting_for_reply(uint64_t connection) const;
    void close_idle_connections(TimePoint now);
    void accept_and_drop_one();
    void reply(Connection &c, uint32_t request_id, const nlohmann::json &body, int pass_fd = -1);
    void reply_error(Connection &c, uint32_t request_id, int code, const std::string &text);
    bool send_message(Connection &c, proto::Type type, uint32_t request_id,
                      const nlohmann::json &body, int pass_fd, bool droppable);

    void handle_register(Connection &c, const proto::Message &msg);
    void handle_deregister(Connection &c, const proto::Message &msg);
    void handle_attach(Connection &c, const proto::Message &msg);
    void handle_ack(Connection &c, const proto::Message &msg);
    void handle_progress(Connection &c, const proto::Message &msg);
    void handle_usage(Connection &c, const proto::Message &msg);
    void handle_status(Connection &c, const proto::Message &msg);
    void handle_set(Connection &c, const proto::Message &msg);
    void handle_policy(Connection &c, const proto::Message &msg);
    void handle_reclaim(Connection &c, const proto::Message &msg);
    void handle_release(Connection &c, const proto::Message &msg);
    void handle_watch(Connection &c, const proto::Message &msg);

    // --- jobs, pages, pids, state ---
    std::vector<pid_t> pids_of(const std::string &job) const;
    JobPage *ensure_page(const std::string &job, std::string *error);
    void write_page(JobPage &page, uint64_t generation, const CpuSet &cpus);
    void sync_pid_watches();
    void poll_unwatched_pids();
    void adopt_saved_jobs(const SavedState &saved);
    void remove_stale_job_cgroups();
    void save_state_if_changed(bool force = false);
    void process_pending_replies(TimePoint now);
    nlohmann::json full_status() const;

    ServerOptions options_;
    const Topology &topology_;
    CpuSet pool_;
    std::unique_ptr<CpusetBackend> backend_;
    std::unique_ptr<NodeManager> manager_;

    UniqueFd epoll_fd_;
    UniqueFd listen_fd_;
    UniqueFd signal_fd_;
    bool listening_ = false;
    bool stopping_ = false;

    uint64_t next_connection_id_ = 1;
    uint64_t next_attach_id_ = 1;
    uint64_t next_watch_id_ = 1;
    std::map<uint64_t, Connection> connections_;
    std::map<uid_t, int> connections_per_uid_;  // open connections of each peer uid
    UniqueFd spare_fd_;  // /dev/null held in reserve: freed to accept-and-close on EMFILE/ENFILE
    TimePoint next_idle_check_{};
    std::map<std::string, JobPage> pages_;
    std::map<uint64_t, PidWatch> pid_watches_;
    // Start time of every registered pid (/proc/PID/stat field 22): a pid reused by another
    // process after malld restarts must not be taken for the job's process.
    std::map<pid_t, unsigned long long> start_times_;
    // Pids of a job being registered, for enforce() calls made before the core lists the job.
    std::map<std::string, std::vector<pid_t>> registering_pids_;
    std::vector<PendingReply> pending_;
    TimePoint next_pid_poll_{};
    std::unique_ptr<SlurmChecker> slurm_;      // null unless enable_slurm_checks()
    std::chrono::seconds slurm_interval_{10};
    TimePoint next_slurm_check_{};
    void check_slurm_jobs(TimePoint now);      // posts every slurm-* job and owner
    void handle_slurm_results();
    void resolve_lookups(const std::string &owner, const SlurmJobState &state);
    std::string last_saved_;
    std::unique_ptr<StateWriter> state_writer_;
};

}  // namespace mall
