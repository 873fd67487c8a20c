// SPDX-License-Identifier: BSD-3-Clause
// slurm_reconcile.hpp — Slurm is the authority on its jobs. With `malld --slurm`, every
// "slurm-<jobid>" registration is checked right after it is made, and every registration and
// reservation every interval: a job Slurm no longer runs (its epilog was missed, malld was down,
// or a client invented it) is ended and its cpus released; a registration under another uid than
// the job's is ended. The node answers first, for free: a job with a slurmstepd socket in slurmd's
// spool (slurmd_spool.hpp) runs here, and nothing is asked. slurmctld is asked (an RPC, on
// SlurmChecker's thread; verdicts come back through its fd) only about a job the spool has not
// shown for a whole round (at a job's end its steps are gone a while before the epilog releases
// its reservation), and again about the same job only after a back-off that doubles up to
// kMaxAskBackoff, so steady state costs slurmctld nothing however short the interval. Without a readable, trusted
// spool every job is asked about every interval (the old cost; a warning says how to fix it).
// Slurm names cores in its own numbering: cpus_on_node() is where they become Linux cpus.
// A Slurm job's figures go to its AdminComment when it ends (not when Slurm had already ended it:
// slurmctld refuses updates to a finished job), summed over the job's parts on this node (each of
// its steps, on a node without its batch script), and, only if `comment_interval` is set, every
// interval while it runs, as they are so far (marked running_as_of=<epoch seconds>), and when an
// admin asks (record_now).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/node_manager.hpp"
#include "log.hpp"
#include "slurm_jobs.hpp"
#include "slurmd_spool.hpp"

namespace mall {

class SlurmReconciler {
public:
    // comment_interval 0: AdminComment only when a job ends. spool: slurmd's spool folder of this
    // node (nullopt: slurmctld is asked about every job every interval).
    SlurmReconciler(std::unique_ptr<SlurmQuery> query, std::chrono::seconds interval,
                    std::chrono::seconds comment_interval = std::chrono::seconds(0),
                    std::optional<SlurmdSpool> spool = std::nullopt);

    int fd() const { return checker_.fd(); }     // readable when verdicts wait (epoll)
    // Asks slurmctld about the job now (a prolog's lookup of its cores).
    void ask_slurmctld(uint32_t job_id) { checker_.check({job_id}); }
    // Whether slurmctld's answer can name a job's cores on this node (else a lookup is pointless).
    bool lists_cores() const { return checker_.lists_cores(); }
    // A new registration: asks slurmctld only when slurmd's spool shows no step of the job here
    // a round later.
    void check_registered(uint32_t job_id, TimePoint now);
    // Checks every slurm-* job and owner the core knows (see the file's comment); the next round
    // is due `interval` on.
    void check_all(const NodeManager &manager, TimePoint now);
    TimePoint next_check() const { return next_check_; }
    std::vector<SlurmJobState> take_results() { return checker_.take_results(); }
    // Where this node stands in a multi-node Slurm job (the plugin's S_JOB_NODEID of
    // S_JOB_NNODES at registration): at the job's end the nodes take turns, node i sending its
    // update (nodes - 1 - i) * admin_comment_turn(nodes) after its end, so that each node's read
    // comes after the writes of the nodes before it in the chain (update_admin_comment: from the
    // job's last node to its first; a node that reads too early reads again, one more RPC).
    void remember_node_index(uint32_t job_id, uint32_t index, uint32_t nodes);
    // A job ended (its "end" event): a Slurm job's figures go to its AdminComment (in its node's
    // turn, see remember_node_index), added to those of its parts that ended here before.
    void record_end(const nlohmann::json &end_event);
    // When a round is due: every Slurm job's figures so far go to its AdminComment (see
    // SlurmChecker::annotate); the next round is due `comment_interval` on. nullopt: no rounds.
    void record_running(const NodeManager &manager, TimePoint now);
    std::optional<TimePoint> next_running_record() const { return next_running_record_; }
    // An admin asked (Record, `mallctl record`): the job's figures so far go to its AdminComment
    // now, queued behind an update in flight for it. Returns the update's ticket (its
    // SlurmAnnotation carries it), 0 when the job's end is being recorded (that update is the
    // newer one).
    uint64_t record_now(const NodeManager &manager, const Job &job, uint32_t job_id, TimePoint now);
    bool annotating(uint32_t job_id) const { return checker_.annotating(job_id); }
    // The finished AdminComment updates; failures are logged (each distinct one once). Returned
    // for the replies that wait on them (RequestHandlers::resolve_annotations).
    std::vector<SlurmAnnotation> take_annotations();
    // Acts on one verdict: ends and releases what Slurm does not run, ends registrations under
    // the wrong uid, warns about guaranteed cpus Slurm did not give; keeps everything when
    // slurmctld is unreachable.
    void apply(const SlurmJobState &state, NodeManager &manager);
    // The job's cpus on this node as Linux cpus: Slurm's core ids mapped through the node's
    // topology by common/slurm_cpu_map.hpp, the mapping the Slurm plugin uses for S_JOB_ALLOC_CORES.
    // nullopt with *why when there are none to take: Slurm does not run the job (why = Slurm's
    // state), gave it no cores here, or gave ids the node does not have (why says so; the caller
    // changes nothing). When Slurm's description of the node differs from the topology, a warning
    // is logged (again only when the difference changes) and the ids are mapped as slurmd does.
    std::optional<CpuSet> cpus_on_node(const SlurmJobState &state, const Topology &topology, std::string *why);

private:
    // The jobs of `ids` slurmctld must be asked about now: those the spool does not list, each at
    // most once per back-off. All of them when there is no spool or it cannot be read.
    std::set<uint32_t> to_ask(const std::set<uint32_t> &ids, TimePoint now);

    struct NotSeenHere {
        TimePoint next_ask{};
        std::chrono::seconds backoff{0};
        bool said = false;  // the "Slurm runs it, the spool does not show it" line was logged
    };
    SlurmChecker checker_;
    std::optional<SlurmdSpool> spool_;
    FailureLog spool_failures_;
    std::map<uint32_t, NotSeenHere> not_seen_here_;
    std::set<uint32_t> ended_by_slurm_;  // released because Slurm had ended them: no AdminComment
    std::map<uint32_t, std::pair<uint32_t, uint32_t>> node_index_;  // job -> (index, nodes)
    // The figures of a job's parts that ended on this node, summed (a node without the job's batch
    // script holds it only while a step runs there): each part's update carries the job's figures
    // on this node so far, not only its own. At most kEarlierPartsKept jobs, the oldest forgotten.
    struct EarlierParts {
        nlohmann::json totals;
        TimePoint last_end{};
    };
    std::map<uint32_t, EarlierParts> earlier_parts_;
    nlohmann::json with_earlier_parts(uint32_t job_id, const nlohmann::json &figures) const;
    std::chrono::seconds interval_;
    std::chrono::seconds comment_interval_;
    TimePoint next_check_{};
    std::optional<TimePoint> next_running_record_;
    std::string disagreement_logged_;  // the last disagreement warned about
    FailureLog annotation_failures_;
};

// How many Slurm jobs' earlier parts on this node malld keeps summed (a few hundred bytes each).
inline constexpr size_t kEarlierPartsKept = 4096;

// The most nodes a Slurm job's node-index hint may name (Register's slurm_nodes).
inline constexpr uint32_t kMaxSlurmNodes = 1000000;

// The longest wait before slurmctld is asked again about a job it runs that the spool does not show.
inline constexpr std::chrono::seconds kMaxAskBackoff{600};

// How long a Slurm job's Deregister answer waits for its AdminComment update.
inline constexpr std::chrono::seconds kAnnotationWait{2};

}  // namespace mall
