// slurm_reconcile.cpp — see slurm_reconcile.hpp.
#include "slurm_reconcile.hpp"

#include <set>

#include "log.hpp"

namespace mall {

SlurmReconciler::SlurmReconciler(std::unique_ptr<SlurmQuery> query, std::chrono::seconds interval)
    : checker_(std::move(query)), interval_(interval) {}

void SlurmReconciler::check_all(const NodeManager &manager, TimePoint now) {
    next_check_ = now + interval_;
    std::set<uint32_t> ids;
    for (const auto &[name, job] : manager.jobs())
        if (auto id = slurm_job_id_of(name)) ids.insert(*id);
    for (const auto &[owner, cpus] : manager.reserved())
        if (auto id = slurm_job_id_of(owner)) ids.insert(*id);
    if (!ids.empty()) checker_.check(ids);
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
            } else if (job && state.cpus_on_node && !state.cpus_on_node->contains(job->spec.guaranteed)) {
                log_warn("job " + name + " claims guaranteed cpus " + job->spec.guaranteed.to_string() +
                         " but Slurm allocated it " + state.cpus_on_node->to_string() +
                         " on this node (Slurm's cpu ids; with several threads per core they differ "
                         "from Linux cpu numbers)");
            }
            break;
    }
}

}  // namespace mall
