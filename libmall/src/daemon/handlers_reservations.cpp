// SPDX-License-Identifier: BSD-3-Clause
// handlers_reservations.cpp — the requests of a scheduler's job prolog and epilog and of Slurm's
// bookkeeping, and their deferred replies: Reclaim (free cores for a job before its tasks start,
// answered once no other job holds them; with --slurm, a prolog's lookup of the job's cores in
// Slurm first), Release (an epilog gives its job's reservation back), Record (an admin's
// `mallctl record`: a Slurm job's figures so far to its AdminComment, answered once slurmctld took
// them). The rest of RequestHandlers is in handlers.cpp; the contract is handlers.hpp's.
#include "handlers.hpp"

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "log.hpp"
#include "slurm_reconcile.hpp"

namespace mall {

void RequestHandlers::handle_reclaim(Connection &c, const proto::Message &msg) {
    std::string why;
    auto owner = proto::get_optional_string(msg.body, "owner");
    if (!msg.body.contains("cpus") && owner) {
        // A Slurm job prolog knows the job but not its cores (22.05 gives it no core list): with
        // --slurm, malld asks slurmctld which cores the job has here, off the loop, then reclaims.
        auto slurm_id = slurm_job_id_of(*owner);
        if (!slurm_ || !slurm_id) {
            connections_.reply_error(c, msg.request_id, MALL_ERR_INVAL,
                        "no \"cpus\" given; malld can look a job's cpus up only for an owner "
                        "\"slurm-<jobid>\" and when started with --slurm");
            return;
        }
        if (!slurm_->lists_cores()) {  // libslurm 24.11: the answer would name no cores (no RPC for that)
            connections_.reply_error(c, msg.request_id, MALL_ERR_INVAL,
                        "this malld's libslurm cannot list a job's cores on a node; the Slurm plugin "
                        "reclaims them at each step's start");
            return;
        }
        slurm_->ask_slurmctld(*slurm_id);
        pending_.push_back(PendingReply{PendingReply::Kind::LookUp, c.id, msg.request_id, *owner, {},
                                        reply_deadline()});
        return;
    }
    auto cpus = CpuSet::parse(proto::get_string(msg.body, "cpus"), &why);
    if (!cpus) throw proto::ProtocolError("field \"cpus\": " + why);
    Outcome outcome = manager_.reclaim(*cpus, Clock::now(), owner.value_or(""));
    if (!outcome.ok) {
        connections_.reply_error(c, msg.request_id, outcome.code, outcome.error);
        return;
    }
    log_info("reclaiming cpus " + cpus->to_string() + (owner ? " for " + log_text(*owner) : std::string()));
    // The reply waits until no job holds them, so the caller may start its own work there.
    // The owner's own job may hold its reserved cpus (a later step of the same Slurm job).
    PendingReply pending{PendingReply::Kind::Reclaim, c.id, msg.request_id, owner.value_or(""), *cpus,
                         reply_deadline()};
    pending_.push_back(std::move(pending));
}

void RequestHandlers::handle_release(Connection &c, const proto::Message &msg) {
    if (auto owner = proto::get_optional_string(msg.body, "owner")) {  // a job epilog
        CpuSet released;
        Outcome outcome = manager_.release_owner(*owner, Clock::now(), &released);
        if (!outcome.ok) {
            connections_.reply_error(c, msg.request_id, outcome.code, outcome.error);
            return;
        }
        connections_.reply(c, msg.request_id, proto::ok_reply({{"owner", *owner}, {"cpus", released.to_string()}}));
        return;
    }
    std::string why;
    auto cpus = CpuSet::parse(proto::get_string(msg.body, "cpus"), &why);
    if (!cpus) throw proto::ProtocolError("field \"cpus\": " + why);
    Outcome outcome = manager_.release(*cpus, Clock::now());
    if (!outcome.ok) {
        connections_.reply_error(c, msg.request_id, outcome.code, outcome.error);
        return;
    }
    connections_.reply(c, msg.request_id, proto::ok_reply({{"cpus", cpus->to_string()}}));
}

void RequestHandlers::handle_record(Connection &c, const proto::Message &msg) {
    const std::string job = proto::get_string(msg.body, "job");
    // Checked before the name is echoed back (every registered job has a valid name).
    if (auto bad = proto::invalid_job_name(job)) throw proto::ProtocolError("bad job name: " + *bad);
    if (!slurm_) {
        connections_.reply_error(c, msg.request_id, MALL_ERR_INVAL,
                                 "this malld was not started with --slurm, so it records no figures in Slurm; "
                                 "job figures are in `mallctl status` and, once a job ends, in malld's history "
                                 "file (--history-file)");
        return;
    }
    const auto slurm_id = slurm_job_id_of(job);
    if (!slurm_id) {
        connections_.reply_error(c, msg.request_id, MALL_ERR_INVAL,
                                 "job " + job + " is not a Slurm job: malld records figures in Slurm only for "
                                 "jobs named slurm-<jobid> (what the Slurm plugin registers); see `mallctl "
                                 "status` for this job's figures");
        return;
    }
    const TimePoint now = Clock::now();
    const Job *registered = manager_.find(job);
    // A job that just ended, whose end is being recorded, is answered by that update (its last figures).
    if (!registered && !slurm_->annotating(*slurm_id)) {
        connections_.reply_error(c, msg.request_id, MALL_ERR_NOJOB,
                                 "no job " + job + " on this node (see `mallctl status`); a Slurm job's "
                                 "figures reach its AdminComment when it ends here");
        return;
    }
    PendingReply pending{PendingReply::Kind::Record, c.id, msg.request_id, job, {}, now + kRecordWait};
    // 0 while its end is recorded: the reply waits for that update (resolve_annotations).
    if (registered) pending.ticket = slurm_->record_now(manager_, *registered, *slurm_id, now);
    log_info("recording " + job + "'s figures so far in its Slurm AdminComment (asked by uid " +
             std::to_string(c.peer.uid) + ")");
    pending_.push_back(std::move(pending));
}

void RequestHandlers::answer_record(Connection &c, const PendingReply &p, const SlurmAnnotation &done) {
    const std::string id = std::to_string(done.job_id);
    if (done.error.empty()) {
        connections_.reply(c, p.request_id,
                           proto::ok_reply({{"job", p.job}, {"figures", done.figures}, {"final", !done.running}}));
    } else if (done.finished) {
        connections_.reply_error(c, p.request_id, MALL_ERR_NOJOB,
                                 "Slurm had finished job " + id + ", so slurmctld refused its figures (" +
                                     done.error + "); they are in malld's history when the job ends here");
    } else {
        connections_.reply_error(c, p.request_id, MALL_ERR_SYSTEM,
                                 "slurmctld refused " + p.job + "'s figures: " + done.error);
    }
}

void RequestHandlers::resolve_annotations(const std::vector<SlurmAnnotation> &finished) {
    for (const SlurmAnnotation &done : finished) {
        for (auto &p : pending_) {
            if (p.kind != PendingReply::Kind::Record || p.connection == 0) continue;
            if (slurm_job_id_of(p.job) != done.job_id) continue;
            if (p.ticket != 0) {
                // An update queued before the request (older figures) is not its answer; one of the
                // job's end queued after it is (the end replaced the queued running update).
                if (done.ticket < p.ticket) continue;
            } else {
                if (done.running) continue;  // waiting for the end's update
                // The job was registered again since (a new step): its figures so far go now.
                if (const Job *again = manager_.find(p.job); again && slurm_) {
                    p.ticket = slurm_->record_now(manager_, *again, done.job_id, Clock::now());
                    continue;
                }
            }
            if (Connection *asker = connections_.find(p.connection); asker && !asker->closing)
                answer_record(*asker, p, done);
            p.connection = 0;  // answered: dropped below
        }
    }
    pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                  [](const PendingReply &p) { return p.connection == 0; }),
                   pending_.end());
}

bool RequestHandlers::finish_reclaim(const PendingReply &p, Connection *asker, TimePoint now) {
    const double waited = std::chrono::duration<double>(now - p.started).count();
    if (!manager_.holds_any(p.cpus, p.job)) {
        manager_.record_reclaim(waited, false);
        if (asker) connections_.reply(*asker, p.request_id, proto::ok_reply({{"cpus", p.cpus.to_string()}}));
        return true;
    }
    if (now < p.deadline) return false;
    manager_.record_reclaim(waited, true);
    if (!asker) return true;
    std::string holders;
    for (const auto &[name, job] : manager_.jobs())
        if (name != p.job && job.held().intersects(p.cpus)) holders += (holders.empty() ? "" : ", ") + name;
    connections_.reply_error(*asker, p.request_id, MALL_ERR_SYSTEM,
                             "cpus " + p.cpus.to_string() + " are still held by job(s) " + holders + " after " +
                                 std::to_string(reply_wait().count()) +
                                 " ms; they stay reclaimed and will be free once those jobs have shrunk (see "
                                 "`mallctl status`)");
    return true;
}

void RequestHandlers::resolve_lookups(const std::string &owner, const SlurmJobState &state) {
    for (auto &p : pending_) {
        if (p.kind != PendingReply::Kind::LookUp || p.job != owner) continue;
        Connection *asker = connections_.find(p.connection);
        if (!asker) continue;
        Connection &c = *asker;
        std::string why;
        const auto on_node = slurm_->cpus_on_node(state, manager_.topology(), &why);
        if (!on_node) {
            connections_.reply_error(c, p.request_id, MALL_ERR_NOJOB,
                        "Slurm gives no cpus on this node to job " + std::to_string(state.job_id) + " (" +
                            why + "); nothing was reclaimed");
            p.connection = 0;  // answered: dropped below
            continue;
        }
        const CpuSet cpus = *on_node & pool_;
        Outcome outcome = manager_.reclaim(cpus, Clock::now(), owner);
        if (!outcome.ok) {
            connections_.reply_error(c, p.request_id, outcome.code, outcome.error);
            p.connection = 0;
            continue;
        }
        log_info("reclaiming cpus " + cpus.to_string() + " for " + owner + " (Slurm's allocation on this node)");
        p.kind = PendingReply::Kind::Reclaim;
        p.cpus = cpus;
    }
    pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                  [](const PendingReply &p) { return p.connection == 0; }),
                   pending_.end());
}

}  // namespace mall
