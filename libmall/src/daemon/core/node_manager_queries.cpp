// SPDX-License-Identifier: BSD-3-Clause
// node_manager_queries.cpp — the node manager's read-only side (see node_manager.hpp): lookups,
// the pool's free and available cpus, a job's accounting so far, and the status document that
// `mallctl status --json` shows (filtered per viewer by daemon/status_view.cpp). Nothing here
// changes a job; record_reclaim only adds to the node's reclaim figures.
#include <algorithm>

#include "node_manager.hpp"
#include "registration_order.hpp"

namespace mall {

const Job *NodeManager::find(const std::string &job) const {
    auto it = jobs_.find(job);
    return it == jobs_.end() ? nullptr : &it->second;
}

CpuSet NodeManager::available_pool() const {
    CpuSet available = pool_ - reclaimed_;
    for (const auto &[owner, cpus] : reserved_) {
        if (auto job = jobs_.find(owner); job != jobs_.end()) available |= cpus & job->second.spec.guaranteed;
    }
    return available;
}

bool NodeManager::holds_any(const CpuSet &cpus, const std::string &except) const {
    for (const auto &[id, job] : jobs_) {
        if (id != except && job.held().intersects(cpus)) return true;
    }
    return false;
}

bool NodeManager::steady(const std::string &job) const {
    const Job *j = find(job);
    return j != nullptr && j->steady();
}

CpuSet NodeManager::free_cpus() const {
    CpuSet free = available_pool();
    for (const auto &[id, job] : jobs_) free -= job.held();
    return free;
}

JobAccount NodeManager::accounting(const Job &job, TimePoint now) const {
    auto seconds = [](TimePoint from, TimePoint to) {
        return to > from ? std::chrono::duration<double>(to - from).count() : 0.0;
    };
    const double since_mark = seconds(job.accounted_until, now);
    JobAccount out;
    out.duration_seconds = seconds(job.registered_at, now);
    out.core_seconds = job.core_seconds + job.published.count() * since_mark;
    out.lent_core_seconds = job.lent_core_seconds + job.lent_cpus() * since_mark;
    out.oversubscribed_seconds = job.oversubscribed_seconds;
    if (job.oversubscribed_since) out.oversubscribed_seconds += seconds(*job.oversubscribed_since, now);
    out.cpu_seconds = job.cpu_seconds;
    out.resizes = job.transitions;
    out.ack_timeouts = job.ack_timeouts;
    out.acks = job.ack_latency.count();
    out.ack_latency_seconds_sum = job.ack_latency.sum();
    return out;
}

void NodeManager::record_reclaim(double seconds, bool timed_out) {
    ++totals_.reclaims;
    if (timed_out) ++totals_.reclaim_timeouts;
    totals_.reclaim_duration.observe(seconds);
}

nlohmann::json NodeManager::status(std::optional<TimePoint> now) const {
    nlohmann::json out;
    out["pool"] = pool_.to_string();
    out["available"] = available_pool().to_string();
    out["reclaimed"] = reclaimed_.to_string();
    out["reserved"] = nlohmann::json::object();
    for (const auto &[owner, cpus] : reserved_) out["reserved"][owner] = cpus.to_string();
    out["free"] = free_cpus().to_string();
    out["policy"] = policy_name(policy_);
    out["ack_timeout_ms"] = ack_timeout_.count();
    out["histogram_bounds_seconds"] = kDurationBounds;
    // The node's totals: ended jobs' accounting plus the running jobs' up to `now`.
    NodeTotals node = totals_;
    nlohmann::json jobs = nlohmann::json::array();
    for (const Job *job : in_registration_order<const Job *>(jobs_)) {
        const JobAccount account = accounting(*job, now.value_or(job->accounted_until));
        node.core_seconds += account.core_seconds;
        node.lent_core_seconds += account.lent_core_seconds;
        node.oversubscribed_seconds += account.oversubscribed_seconds;
        node.cpu_seconds += account.cpu_seconds;
        auto target = targets_.find(job->spec.id);
        const CpuSet &goal = target == targets_.end() ? job->published : target->second;
        jobs.push_back({
            {"job", job->spec.id},
            {"uid", job->spec.uid},
            {"min", job->spec.min},
            {"max", job->spec.max},
            {"weight", job->spec.weight},
            {"guaranteed", job->spec.guaranteed.to_string()},
            {"cpus", job->published.to_string()},
            {"ncpus", job->published.count()},
            {"cpuset", job->cpuset.to_string()},
            {"target", goal.to_string()},
            {"generation", job->generation},
            {"acked_generation", job->acked_generation()},
            {"pinned", job->pinned.has_value()},
            {"usage_cap", job->usage_cap},
            {"threads", job->threads},
            {"active_threads", job->active_threads()},
            {"signal_control", job->signal_control},
            {"planned_max", job->planned_max()},
            {"attached", job->attachments.size()},
            {"state", job->settled(goal) ? "settled" : "changing"},
            {"transitions", job->transitions},
            {"ack_timeouts", job->ack_timeouts},
            {"last_ack_latency_us", job->last_ack_latency_us},
            {"work_units", job->work_units},
            {"steps", job->steps},
            {"lent_cpus", job->lent_cpus()},
            {"duration_seconds", account.duration_seconds},
            {"core_seconds", account.core_seconds},
            {"lent_core_seconds", account.lent_core_seconds},
            {"oversubscribed", job->oversubscribed_since.has_value()},
            {"oversubscribed_seconds", account.oversubscribed_seconds},
            {"cpu_seconds", account.cpu_seconds},
            {"cpu_busy", job->cpu_busy ? nlohmann::json(*job->cpu_busy) : nlohmann::json(nullptr)},
            {"ack_latency_seconds", job->ack_latency.to_json()},
        });
        if (!job->rate_samples.empty()) {  // what the throughput policy believes about it
            const SpeedupEstimate estimate = estimate_speedup(job->rate_samples);
            nlohmann::json measured = nlohmann::json::object();
            for (const auto &[cpus, rate] : estimate.measured) measured[std::to_string(cpus)] = rate;
            jobs.back()["speedup"] = {{"serial_fraction", estimate.serial_fraction},
                                      {"one_core_rate", estimate.one_core_rate},
                                      {"measured_rates", measured}};
        }
    }
    out["jobs"] = std::move(jobs);
    out["node"] = node.to_json();
    return out;
}

}  // namespace mall
