// SPDX-License-Identifier: BSD-3-Clause
// slurm_reconcile.cpp — see slurm_reconcile.hpp.
#include "slurm_reconcile.hpp"

#include <algorithm>
#include <iterator>
#include <set>

#include "log.hpp"

namespace mall {

SlurmReconciler::SlurmReconciler(std::unique_ptr<SlurmQuery> query, std::chrono::seconds interval,
                                 std::chrono::seconds comment_interval, std::optional<SlurmdSpool> spool)
    : checker_(std::move(query)), spool_(std::move(spool)), interval_(interval), comment_interval_(comment_interval) {
    if (comment_interval_.count() > 0) next_running_record_ = Clock::now() + comment_interval_;
}

std::set<uint32_t> SlurmReconciler::to_ask(const std::set<uint32_t> &ids, TimePoint now) {
    if (!spool_) return ids;
    const SlurmdSpool::Listing here = spool_->read();
    if (!here.ok()) {
        spool_failures_.failed(here.error, LogLevel::Warn,
                               here.error + ": malld asks slurmctld about every Slurm job every --slurm-interval-s "
                                            "instead (one RPC per job each time; point --slurmd-spool-dir at "
                                            "slurmd's SlurmdSpoolDir for this node)");
        return ids;
    }
    spool_failures_.succeeded("slurmd's spool folder " + spool_->folder() +
                              " can be read again: malld learns its jobs from it, not from slurmctld");
    std::set<uint32_t> ask;
    for (uint32_t id : ids) {
        if (here.jobs.count(id) != 0) {
            not_seen_here_.erase(id);
            continue;
        }
        // Missing once is normal at a job's end: its steps are gone before slurmd's epilog
        // releases its reservation (a multi-node job completes only when every node is done).
        // Asked only when still missing a round later.
        auto [entry, first_miss] = not_seen_here_.try_emplace(id);
        NotSeenHere &seen = entry->second;
        if (first_miss) {
            seen.next_ask = now + interval_;
            continue;
        }
        if (now < seen.next_ask) continue;
        seen.backoff = seen.backoff.count() == 0 ? interval_ : std::min(seen.backoff * 2, kMaxAskBackoff);
        seen.next_ask = now + seen.backoff;
        ask.insert(id);
    }
    return ask;
}

void SlurmReconciler::check_registered(uint32_t job_id, TimePoint now) {
    // The plugin registers from slurmstepd, whose socket is in the spool already; a job that is not
    // there is asked about a round later, like any other.
    if (auto ask = to_ask({job_id}, now); !ask.empty()) checker_.check(ask);
}

void SlurmReconciler::check_all(const NodeManager &manager, TimePoint now) {
    next_check_ = now + interval_;
    std::set<uint32_t> ids;
    for (const auto &[name, job] : manager.jobs())
        if (auto id = slurm_job_id_of(name)) ids.insert(*id);
    for (const auto &[owner, cpus] : manager.reserved())
        if (auto id = slurm_job_id_of(owner)) ids.insert(*id);
    for (auto it = ended_by_slurm_.begin(); it != ended_by_slurm_.end();)
        it = ids.count(*it) != 0 ? std::next(it) : ended_by_slurm_.erase(it);
    for (auto it = node_index_.begin(); it != node_index_.end();)
        it = ids.count(it->first) != 0 ? std::next(it) : node_index_.erase(it);
    // Forget jobs no longer known (ended, released).
    for (auto it = not_seen_here_.begin(); it != not_seen_here_.end();)
        it = ids.count(it->first) != 0 ? std::next(it) : not_seen_here_.erase(it);
    if (ids.empty()) return;
    if (auto ask = to_ask(ids, now); !ask.empty()) checker_.check(ask);
}

namespace {

// The figures AdminComment carries (admin_comment_figures), as the end event and the accounting
// name them: summed over a job's parts.
constexpr const char *kSummedSeconds[] = {"lent_core_seconds", "core_seconds", "oversubscribed_seconds"};
constexpr const char *kSummedCounts[] = {"resizes", "ack_timeouts"};

}  // namespace

nlohmann::json SlurmReconciler::with_earlier_parts(uint32_t job_id, const nlohmann::json &figures) const {
    const auto earlier = earlier_parts_.find(job_id);
    if (earlier == earlier_parts_.end()) return figures;
    nlohmann::json sum = figures;
    for (const char *field : kSummedSeconds)
        sum[field] = figures.value(field, 0.0) + earlier->second.totals.value(field, 0.0);
    for (const char *field : kSummedCounts)
        sum[field] = figures.value(field, uint64_t{0}) + earlier->second.totals.value(field, uint64_t{0});
    return sum;
}

void SlurmReconciler::record_end(const nlohmann::json &end_event) {
    auto id = slurm_job_id_of(end_event.value("job", std::string()));
    if (!id) return;
    // This part's figures join the job's earlier parts here, before anything else: a later part's
    // update carries them whatever becomes of this one's.
    const nlohmann::json figures = with_earlier_parts(*id, end_event);
    EarlierParts &parts = earlier_parts_[*id];
    for (const char *field : kSummedSeconds) parts.totals[field] = figures.value(field, 0.0);
    for (const char *field : kSummedCounts) parts.totals[field] = figures.value(field, uint64_t{0});
    parts.last_end = Clock::now();
    if (earlier_parts_.size() > kEarlierPartsKept) {
        earlier_parts_.erase(std::min_element(earlier_parts_.begin(), earlier_parts_.end(), [](const auto &a, const auto &b) {
            return a.second.last_end < b.second.last_end;
        }));
    }
    // Slurm had ended it (malld learnt so from slurmctld): an update would only be refused.
    if (ended_by_slurm_.erase(*id) != 0) {
        log_info(slurm_job_name(*id) + " had ended in Slurm before malld heard of its end: its figures are in "
                 "malld's history only");
        return;
    }
    std::chrono::milliseconds turn{0};
    if (auto slot = node_index_.find(*id); slot != node_index_.end()) {
        // The chain runs from the job's last node to its first (update_admin_comment); when
        // slurmctld merges, no node waits for another.
        const auto [index, nodes] = slot->second;
        if (!checker_.merges_in_slurmctld()) turn = (nodes - 1 - index) * admin_comment_turn(nodes);
        node_index_.erase(slot);
    }
    // When this node's part began: other nodes' segments that ended before it are an earlier
    // step's (update_admin_comment waits for this step's).
    const double part_began_at = end_event.value("time", 0.0) - end_event.value("duration_seconds", 0.0);
    checker_.annotate(*id, admin_comment_figures(figures), false, false, turn, part_began_at);
}

void SlurmReconciler::remember_node_index(uint32_t job_id, uint32_t index, uint32_t nodes) {
    if (nodes < 2 || index >= nodes) return;
    // At most one entry per registered job (the registrations are root's); forgotten at its end
    // or when check_all no longer finds it.
    node_index_[job_id] = {index, nodes};
}

namespace {

// A running job's figures so far (`so_far`: its parts here, this one included), marked with the
// wall-clock second they were taken.
std::string running_figures(const nlohmann::json &so_far) {
    const auto wall_now = std::chrono::duration_cast<std::chrono::seconds>(
        std::chrono::system_clock::now().time_since_epoch());
    return admin_comment_figures(so_far) + std::string(kRunningFiguresMark) + std::to_string(wall_now.count());
}

}  // namespace

void SlurmReconciler::record_running(const NodeManager &manager, TimePoint now) {
    if (!next_running_record_ || now < *next_running_record_) return;
    next_running_record_ = now + comment_interval_;
    for (const auto &[name, job] : manager.jobs()) {
        auto id = slurm_job_id_of(name);
        if (!id) continue;
        checker_.annotate(*id, running_figures(with_earlier_parts(*id, manager.accounting(job, now).to_json())), true);
    }
}

uint64_t SlurmReconciler::record_now(const NodeManager &manager, const Job &job, uint32_t job_id, TimePoint now) {
    return checker_.annotate(job_id, running_figures(with_earlier_parts(job_id, manager.accounting(job, now).to_json())),
                             true, /*behind_in_flight=*/true);
}

std::vector<SlurmAnnotation> SlurmReconciler::take_annotations() {
    std::vector<SlurmAnnotation> taken = checker_.take_annotations();
    for (const SlurmAnnotation &done : taken) {
        const std::string job = slurm_job_name(done.job_id);
        if (done.error.empty()) {
            log_debug("recorded " + job + "'s figures" + (done.running ? " so far" : "") + " in its Slurm AdminComment");
            annotation_failures_.succeeded();
        } else if (done.running && done.finished) {  // it ended in Slurm; malld hears of it soon
            log_debug("Slurm had finished " + job + " before its running figures reached it: " + done.error);
        } else if (done.finished) {  // scancel, a time limit: Slurm ends the job before its tasks
            log_info("Slurm had finished " + job + " before its tasks ended (cancelled or killed): its last figures "
                     "are in malld's history" +
                     (comment_interval_.count() > 0 ? ", its AdminComment keeps its running ones if a round sent any"
                                                    : " only") +
                     " (" + done.error + ")");
        } else {
            annotation_failures_.failed(done.error, LogLevel::Warn,
                                        "cannot record " + job + "'s figures" + (done.running ? " so far" : "") +
                                            " in Slurm: " + done.error +
                                            (!done.running ? " (malld's history has them)"
                                             : comment_interval_.count() > 0 ? " (malld tries again next round)"
                                                                             : ""));
        }
    }
    return taken;
}

void SlurmReconciler::apply(const SlurmJobState &state, NodeManager &manager) {
    const std::string name = slurm_job_name(state.job_id);
    const Job *job = manager.find(name);
    switch (state.kind) {
        case SlurmJobState::Kind::Unreachable:
            log_warn_limited("slurm", "cannot ask Slurm about job " + std::to_string(state.job_id) +
                                          ": " + state.detail +
                                          "; keeping it as it is (is slurmctld up? is SLURM_CONF set?)");
            break;
        case SlurmJobState::Kind::NotRunning: {
            if (!job && manager.reserved().count(name) == 0) break;
            log_info("Slurm reports job " + std::to_string(state.job_id) + " " + state.detail +
                     ": ending " + name + " and releasing its cpus");
            ended_by_slurm_.insert(state.job_id);
            CpuSet released;
            manager.release_owner(name, Clock::now(), &released);
            break;
        }
        case SlurmJobState::Kind::Running:
            if (job && job->spec.uid != state.uid) {
                log_error("job " + name + " was registered for uid " + std::to_string(job->spec.uid) +
                          " but Slurm runs it for uid " + std::to_string(state.uid) +
                          ": ending the registration");
                manager.deregister_job(name, Clock::now());
            } else if (job) {
                if (auto seen = not_seen_here_.find(state.job_id);
                    seen != not_seen_here_.end() && spool_ && !seen->second.said) {
                    seen->second.said = true;
                    log_warn("Slurm runs job " + std::to_string(state.job_id) + " but slurmd's spool folder " +
                             spool_->folder() + " shows no step of it on this node: malld asks slurmctld about it "
                             "again after a back-off (up to " + std::to_string(kMaxAskBackoff.count()) +
                             " s); if every job says this, --slurmd-spool-dir is wrong");
                }
                std::string why;
                auto cpus = cpus_on_node(state, manager.topology(), &why);
                if (!cpus && state.slurm_cores && !state.slurm_cores->empty())
                    log_warn_limited("slurm-cpus", why);
                else if (cpus && !cpus->contains(job->spec.guaranteed))
                    log_warn("job " + name + " claims guaranteed cpus " + job->spec.guaranteed.to_string() +
                             " but Slurm allocated it cpus " + cpus->to_string() + " on this node (Slurm's cores " +
                             state.slurm_cores->to_string() + ")");
            }
            break;
    }
}

std::optional<CpuSet> SlurmReconciler::cpus_on_node(const SlurmJobState &state, const Topology &topology,
                                                    std::string *why) {
    auto say = [&](std::string text) {
        if (why != nullptr) *why = std::move(text);
        return std::nullopt;
    };
    if (state.kind != SlurmJobState::Kind::Running) return say(state.detail);
    if (!state.slurm_cores || state.slurm_cores->empty()) return say(state.detail + ", no cores on this node");
    SlurmCpuMapping mapped = map_slurm_cores(*state.slurm_cores, topology.cores(), state.slurm_node);
    if (!mapped.disagreement.empty() && mapped.disagreement != disagreement_logged_) {
        log_warn(mapped.disagreement);
        disagreement_logged_ = mapped.disagreement;
    }
    if (!mapped.cpus) {
        return say("cannot map Slurm's cores " + state.slurm_cores->to_string() + " of job " +
                   std::to_string(state.job_id) + " to this node's cpus: " + mapped.error);
    }
    return mapped.cpus;
}

}  // namespace mall
