// SPDX-License-Identifier: BSD-3-Clause
// slurm_jobs.hpp — what malld asks Slurm about the jobs it serves ("slurm-<jobid>" registrations
// and reservations): does the job exist, is it running, whose is it, which cores did Slurm give it
// on this node (in Slurm's numbering, with Slurm's description of the node: SlurmReconciler maps
// them to Linux cpus through the topology). Queries are RPCs to slurmctld that may take seconds
// when it is slow or down, so they run on SlurmChecker's own thread; the event loop posts job ids
// and collects verdicts through an eventfd. Without libslurm (MALL_WITH_SLURM off)
// make_libslurm_query says why.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "../common/cpuset.hpp"
#include "../common/slurm_cpu_map.hpp"
#include "../common/unix_socket.hpp"

namespace mall {

// malld's name for Slurm job 123, "slurm-123" (what the plugin registers and reserves under),
// and back; anything else -> nullopt.
std::string slurm_job_name(uint32_t job_id);
std::optional<uint32_t> slurm_job_id_of(const std::string &job_name);

struct SlurmJobState {
    enum class Kind {
        Running,     // Slurm runs it (uid and slurm_cores are set)
        NotRunning,  // finished, cancelled, pending again, or unknown to slurmctld
        Unreachable  // slurmctld did not answer: decide nothing
    };
    uint32_t job_id = 0;
    Kind kind = Kind::Unreachable;
    uid_t uid = 0;
    // Slurm's abstract core ids on this node (not Linux cpus: common/slurm_cpu_map.hpp maps them)
    // and Slurm's description of the node they count in (unknown if slurmctld did not give it).
    std::optional<CpuSet> slurm_cores;
    SlurmNodeShape slurm_node;
    std::string detail;  // Slurm's state name or the error, for the log
};

struct CommentChain;  // below, with update_admin_comment

class SlurmQuery {
public:
    virtual ~SlurmQuery() = default;
    virtual SlurmJobState query(uint32_t job_id) = 0;  // may block (an RPC)
    // Records this node's figures for the job in Slurm (its AdminComment, see
    // update_admin_comment). May block (RPCs). `chain` (an ended job's last figures only, else
    // null) keeps the update's place among the job's nodes between calls: when the nodes before
    // this one have not written yet, the call returns with retry_in set, having written nothing,
    // and the caller calls again with the same chain after that pause.
    struct Annotated {
        std::string error;      // empty on success, else the failure's words
        bool finished = false;  // refused because slurmctld had finished the job (e.g. scancel)
        std::chrono::milliseconds retry_in{0};  // > 0: not written yet, call again after this
    };
    virtual Annotated annotate(uint32_t job_id, const std::string &figures, CommentChain *chain) = 0;
    // slurmd's spool folder as slurm.conf names it (SlurmdSpoolDir, %n and %h not expanded) and
    // SlurmdUser's uid, read from the configuration libslurm loaded (no RPC); empty when unknown.
    virtual std::string slurmd_spool_pattern() const { return {}; }
    virtual uid_t slurmd_uid() const { return 0; }
    // Whether query() can give a running job's cores on this node (libslurm 22.05 can, 24.11 not).
    virtual bool lists_cores() const { return true; }
    // slurm.conf's JobSubmitPlugins as libslurm loaded it (no RPC); empty when unknown or unset.
    virtual std::string job_submit_plugins() const { return {}; }
    // Whether annotate() sends one merge request (admin_comment_merge_request) that slurmctld's
    // job_submit/lua merges (--slurm-comment-merge slurmctld) instead of reading and merging here.
    virtual bool merges_in_slurmctld() const { return false; }
};

// Who puts a node's segment into a job's AdminComment (malld --slurm-comment-merge):
// - Malld: this node reads the field, merges and writes it (update_admin_comment: 2 RPCs a node).
// - Slurmctld: this node sends only its segment, marked as a merge request, and mall's
//   job_submit.lua (slurm_plugin/job_submit.lua, JobSubmitPlugins=lua) merges it into the field
//   inside slurmctld, under its job write lock: 1 RPC a node, no read, no race, no turns.
enum class CommentMerge { Malld, Slurmctld };
// What starts a merge request, then "mall:<node>:<figures>"; job_submit.lua checks the same words.
inline constexpr std::string_view kMergeRequestMark = "mall-merge;";
std::string admin_comment_merge_request(const std::string &node, const std::string &figures);
// Why slurm.conf's JobSubmitPlugins (as job_submit_plugins() gives it) cannot merge requests
// (it does not name lua), or "" when it can.
std::string job_submit_lua_problem(const std::string &job_submit_plugins);

// A job's AdminComment with this node's segment "mall:<node>:<figures>" put in: segments are
// separated by ';', an older segment of the same node is replaced, other text is kept as it was.
std::string merge_admin_comment(const std::string &existing, const std::string &node, const std::string &figures);
// What marks a running job's figures so far (`mallctl record`, --slurm-comment-interval) in its
// segment: "...,running_as_of=<epoch seconds>". A segment without it holds a node's last figures.
inline constexpr std::string_view kRunningFiguresMark = ",running_as_of=";
// How far apart the nodes of a job on `nodes` nodes send their last figures (0 on one node): the
// node k places before the batch host in the chain waits k turns after the job's end there.
std::chrono::milliseconds admin_comment_turn(uint32_t nodes);
// What ends a node's last figures: "...,ended_at=<epoch seconds, to the ms>", when its part of the
// job ended there (admin_comment_figures).
inline constexpr std::string_view kEndedAtKey = ",ended_at=";
// Whether `comment` holds `node`'s last figures (a segment "mall:<node>:..." without
// kRunningFiguresMark), of a part that ended at or after `since` (epoch seconds; 0: any).
bool holds_last_figures(const std::string &comment, const std::string &node, double since = 0);

// Puts this node's segment into a job's AdminComment with `load` (read the field, the job's node
// count and node list) and `store` (write it) as slurmctld allows: read, merge, write. slurmctld
// keeps the last write, with no compare-and-swap and no append, so:
// - A job on one node has no other writer from mall: read and write (2 RPCs).
// - An ended multi-node job's nodes write one after the other, from the last node of the job's
//   node list to the first (the batch host, whose job ends last), when `chain` is given and the
//   figures are its last (no kRunningFiguresMark): a node writes when its read shows the last
//   figures of every node before it in that order and of none after it. Then no write can undo
//   another: the one node allowed to write a given text is the first one missing from it. Read
//   and write, 2 RPCs a node; a node that reads too early gets Wait (chain->retry_in set, nothing
//   written) and one more read per wait. A node waits at most kChainWait, and at most
//   kChainStalledReads reads in a row without any node before it showing up (one that runs no
//   mall task, or whose malld is down), then goes on as below.
// - Otherwise (no chain, running figures, node list unknown, the chain given up or broken by a
//   node after it), it reads back after writing and, when its segment is not there, tries again
//   after a short random pause, `attempts` times in all (3 RPCs a try).
// Failed: load or store said no (their own words say why). Lost: other writers kept undoing it.
enum class CommentUpdate { Kept, Failed, Lost, Wait };
struct LoadedComment {
    std::string text;
    uint32_t nodes = 0;                   // the job's node count (0: unknown, treated as several)
    std::vector<std::string> node_names;  // the job's nodes in Slurm's order; empty: unknown
};
struct CommentChain {
    // When this node's part of the job began (epoch seconds): another node's segment that ended
    // before it is of an earlier step (a job's steps end one after the other), not of this round.
    double part_began_at = 0;
    std::chrono::steady_clock::time_point give_up_at{};  // set by the first read
    size_t missing = SIZE_MAX;           // nodes before this one missing at the last read
    int stalled_reads = 0;               // reads in a row that showed no more of them
    std::chrono::milliseconds retry_in{0};  // set with Wait: read again after this
};
inline constexpr std::chrono::milliseconds kChainWait{500};
inline constexpr int kChainStalledReads = 3;
CommentUpdate update_admin_comment(const std::function<bool(LoadedComment *)> &load,
                                   const std::function<bool(const std::string &)> &store, const std::string &node,
                                   const std::string &figures, CommentChain *chain = nullptr, int attempts = 5);
// The figures malld records for an ended job, from its "end" event:
// "lent_core_s=12.3,core_s=40.0,resizes=3,ack_timeouts=0,oversub_s=0.0,ended_at=1795903689.631"
// (ended_at: the event's time, when it has one; a running job's figures have none).
std::string admin_comment_figures(const nlohmann::json &end_event);

// One AdminComment update's outcome (error empty on success).
struct SlurmAnnotation {
    uint32_t job_id = 0;
    std::string error;
    bool finished = false;  // SlurmQuery::Annotated::finished
    bool running = false;   // a running job's figures so far, not its last ones
    std::string figures;    // what was sent (this node's segment without "mall:<node>:")
    uint64_t ticket = 0;    // SlurmChecker::annotate's number for it
};

// libslurm against the cluster of $SLURM_CONF (or Slurm's default), for the node `node_name`.
// Returns nullptr with *why when malld was built without libslurm.
// `merge`: who merges this node's AdminComment segment (CommentMerge).
std::unique_ptr<SlurmQuery> make_libslurm_query(const std::string &node_name, std::string *why,
                                                CommentMerge merge = CommentMerge::Malld);

// Runs queries on its own thread. The loop calls check() with job ids, waits for fd() to become
// readable, and takes the verdicts with take_results(). Duplicate pending ids are merged.
class SlurmChecker {
public:
    explicit SlurmChecker(std::unique_ptr<SlurmQuery> query);
    ~SlurmChecker();  // stops the thread (a query in flight is waited for)
    SlurmChecker(const SlurmChecker &) = delete;
    SlurmChecker &operator=(const SlurmChecker &) = delete;

    void check(const std::set<uint32_t> &job_ids);
    bool lists_cores() const { return query_->lists_cores(); }
    bool merges_in_slurmctld() const { return query_->merges_in_slurmctld(); }
    // Queues an AdminComment update (SlurmQuery::annotate). An ended job's update goes before
    // queries (its stepd waits for it) and replaces a running one still queued for the job; a
    // running job's update (`running`) goes after queries: it replaces the figures of one still
    // queued for the job, and is dropped while one is in flight or the job's end is recorded.
    // `behind_in_flight` (an admin's explicit request, `mallctl record`): a running update is
    // queued behind the one in flight for the job instead of dropped (still dropped while the
    // job's end is recorded). Returns the update's ticket, which its SlurmAnnotation carries (an
    // update whose figures replaced a queued one's takes the newer ticket); 0 when dropped.
    // `delay` (an ended job's update only): sent no sooner than that from now, other work going
    // on meanwhile (the nodes of a multi-node job take turns; see SlurmReconciler::record_end).
    // `part_began_at` (an ended job's update only): when the job's part that ended on this node
    // began, epoch seconds (CommentChain).
    uint64_t annotate(uint32_t job_id, std::string figures, bool running = false, bool behind_in_flight = false,
                      std::chrono::milliseconds delay = std::chrono::milliseconds(0), double part_began_at = 0);
    // Whether the update of the job's end is queued or in flight (running updates do not count:
    // nothing waits for them).
    bool annotating(uint32_t job_id) const;
    // Readable while verdicts or finished updates wait; each take_* leaves it readable while the
    // other kind still waits.
    int fd() const { return event_fd_.get(); }
    std::vector<SlurmJobState> take_results();
    std::vector<SlurmAnnotation> take_annotations();

private:
    void loop();
    void drain_fd_if_nothing_waits();  // under mu_

    std::unique_ptr<SlurmQuery> query_;
    UniqueFd event_fd_;
    mutable std::mutex mu_;
    std::condition_variable wake_;
    std::deque<uint32_t> pending_;
    std::set<uint32_t> queued_;
    std::vector<SlurmJobState> results_;
    struct QueuedAnnotation {
        uint32_t job_id = 0;
        std::string figures;
        uint64_t ticket = 0;
        std::chrono::steady_clock::time_point not_before{};  // ended jobs' updates only
        CommentChain chain;                                  // ended jobs' updates only
    };
    std::deque<QueuedAnnotation> annotations_;          // ended jobs
    std::deque<QueuedAnnotation> running_annotations_;  // running jobs
    std::multiset<uint32_t> annotating_;  // every update queued or in flight
    std::multiset<uint32_t> ending_;      // of those, the ended jobs'
    std::vector<SlurmAnnotation> annotated_;
    uint64_t last_ticket_ = 0;
    bool stop_ = false;
    std::thread thread_;
};

}  // namespace mall
