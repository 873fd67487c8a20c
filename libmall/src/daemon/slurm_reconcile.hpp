// SPDX-License-Identifier: BSD-3-Clause
// slurm_reconcile.hpp — Slurm is the authority on its jobs. With `malld --slurm`, every
// "slurm-<jobid>" registration is checked against slurmctld right after it is made, and every
// registration and reservation every interval: a job Slurm no longer runs (its epilog was missed, malld was down,
// or a client invented it) is ended and its cpus released; a registration under another uid than
// the job's is ended. Queries run on SlurmChecker's thread; verdicts come back through its fd.
// Slurm names cores in its own numbering: cpus_on_node() is where they become Linux cpus.
// A Slurm job's figures go to its AdminComment when it ends and, every `comment_interval` while it
// runs, as they are so far (marked running_as_of=<epoch seconds>): slurmctld refuses updates to a
// job it has finished, so a job ended by scancel or its time limit keeps its last running figures.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/node_manager.hpp"
#include "log.hpp"
#include "slurm_jobs.hpp"

namespace mall {

class SlurmReconciler {
public:
    // comment_interval 0: AdminComment only when a job ends.
    SlurmReconciler(std::unique_ptr<SlurmQuery> query, std::chrono::seconds interval,
                    std::chrono::seconds comment_interval = std::chrono::seconds(0));

    int fd() const { return checker_.fd(); }     // readable when verdicts wait (epoll)
    void check(uint32_t job_id) { checker_.check({job_id}); }
    // Asks about every slurm-* job and owner the core knows; the next round is due `interval` on.
    void check_all(const NodeManager &manager, TimePoint now);
    TimePoint next_check() const { return next_check_; }
    std::vector<SlurmJobState> take_results() { return checker_.take_results(); }
    // A job ended (its "end" event): a Slurm job's figures go to its AdminComment.
    void record_end(const nlohmann::json &end_event);
    // When a round is due: every Slurm job's figures so far go to its AdminComment (see
    // SlurmChecker::annotate); the next round is due `comment_interval` on. nullopt: no rounds.
    void record_running(const NodeManager &manager, TimePoint now);
    std::optional<TimePoint> next_running_record() const { return next_running_record_; }
    bool annotating(uint32_t job_id) const { return checker_.annotating(job_id); }
    // The finished AdminComment updates; failures are logged (each distinct one once).
    void take_annotations();
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
    SlurmChecker checker_;
    std::chrono::seconds interval_;
    std::chrono::seconds comment_interval_;
    TimePoint next_check_{};
    std::optional<TimePoint> next_running_record_;
    std::string disagreement_logged_;  // the last disagreement warned about
    FailureLog annotation_failures_;
};

// How long a Slurm job's Deregister answer waits for its AdminComment update.
inline constexpr std::chrono::seconds kAnnotationWait{2};

}  // namespace mall
