// SPDX-License-Identifier: BSD-3-Clause
// transitions.cpp — the moving part of the node manager (node_manager.hpp): plans from the
// policy, the two-phase protocol's steps (advance), their ends (ack, timeout), enforcement with
// retry, the feasibility replay (reachable), timers (tick, next_deadline) and the core's events.
// Invariant kept by construction: cpus are only ever added to a job's cpuset from cpus no other
// job holds, so the sets cpuset ∪ published of different jobs never intersect.
#include <algorithm>

#include "node_manager.hpp"
#include "registration_order.hpp"

namespace mall {

namespace {

// The protocol's step (node_manager.hpp): from `published` toward `goal`, keep what it holds of
// the goal and add the goal's cpus that `others` do not hold. None when the step would be empty
// (the job's threads would have nowhere to run: it waits until a cpu of its goal is free) or
// would change nothing.
std::optional<CpuSet> next_step(const CpuSet &published, const CpuSet &goal, const CpuSet &others) {
    const CpuSet next = (published & goal) | (goal - others);
    if (next.empty() || next == published) return std::nullopt;
    return next;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// time

void NodeManager::tick(TimePoint now) {
    apply_due_usage(now);
    if (policy_ == PolicyKind::Throughput && !jobs_.empty() && (!next_rate_replan_ || *next_rate_replan_ <= now)) {
        next_rate_replan_ = now + kRateReplan;
        replan(now);  // new rate samples may move cores
    }
    for (auto &[id, job] : jobs_) {
        if (!job.awaiting_ack) continue;
        if (job.acked_generation() >= job.generation) {
            finish_transition(job, now, false);
        } else if (job.ack_deadline <= now) {
            finish_transition(job, now, true);
        }
    }
    advance(now);
}

std::optional<TimePoint> NodeManager::next_deadline() const {
    std::optional<TimePoint> next;
    for (const auto &[id, job] : jobs_) {
        if (job.awaiting_ack && (!next || job.ack_deadline < *next)) next = job.ack_deadline;
        if (job.enforce_retry_at && (!next || *job.enforce_retry_at < *next))
            next = job.enforce_retry_at;
        if (job.usage_wanted) {
            const TimePoint due = job.usage_applied.value_or(TimePoint{}) + kUsageInterval;
            if (!next || due < *next) next = due;
        }
    }
    if (policy_ == PolicyKind::Throughput && !jobs_.empty()) {
        const TimePoint replan_at = next_rate_replan_.value_or(TimePoint{});
        if (!next || replan_at < *next) next = replan_at;
    }
    return next;
}

std::map<std::string, CpuSet> NodeManager::plan(TimePoint now) const {
    // A job that holds nothing yet (just registered) gets its share now: dwell protects jobs from
    // being moved back and forth, not from sharing with a newcomer.
    const bool newcomer = std::any_of(jobs_.begin(), jobs_.end(), [](const auto &entry) {
        return entry.second.published.empty() && !entry.second.pinned;
    });
    std::vector<PolicyJob> input;
    input.reserve(jobs_.size());
    for (const auto &[id, job] : jobs_) {
        PolicyJob p;
        p.id = id;
        p.min = job.spec.min;
        p.max = job.planned_max();
        p.weight = job.spec.weight;
        p.guaranteed = job.spec.guaranteed;
        p.current = job.published;  // what its processes use now: moves are counted against it
        p.pinned = job.pinned;
        p.order = job.order;
        if (policy_ == PolicyKind::Throughput) {
            p.samples = job.rate_samples;
            p.in_dwell = !newcomer && job.generation > 0 && now - job.last_change < kDwell;
        }
        input.push_back(std::move(p));
    }
    return compute_allocation(policy_, topology_, available_pool(), input);
}

void NodeManager::end_job(const std::string &job, const char *reason, TimePoint now) {
    auto it = jobs_.find(job);
    if (it == jobs_.end()) return;
    // Its last cpu-time sample, while the backend still knows its processes and cgroups.
    sample_cpu_time(job, now, CpuSampleKind::Last);
    close_accounts(it->second, reason, now);
    jobs_.erase(it);
    targets_.erase(job);
    effects_.job_removed(job);
}

void NodeManager::close_accounts(const Job &ended, const char *reason, TimePoint until) {
    const JobAccount account = accounting(ended, until);
    ++totals_.jobs_ended;
    totals_.core_seconds += account.core_seconds;
    totals_.lent_core_seconds += account.lent_core_seconds;
    totals_.oversubscribed_seconds += account.oversubscribed_seconds;
    totals_.cpu_seconds += account.cpu_seconds;
    // The end event is the job's record (malld's history file keeps it): who, what it was
    // promised, and what it got.
    nlohmann::json ev = make_event("end");
    ev["job"] = ended.spec.id;
    ev["reason"] = reason;
    ev["uid"] = ended.spec.uid;
    ev["min"] = ended.spec.min;
    ev["max"] = ended.spec.max;
    ev["guaranteed"] = ended.spec.guaranteed.to_string();
    if (ended.spec.container) ev["container"] = true;
    ev.update(account.to_json());
    effects_.event(ev);
}

void NodeManager::close_saved_job(const Job &job, const char *reason) {
    if (jobs_.count(job.spec.id) != 0) return;  // a job the core runs ends through end_job
    close_accounts(job, reason, job.accounted_until);
}

void NodeManager::account(Job &job, TimePoint now) {
    if (now <= job.accounted_until) return;
    const double seconds = std::chrono::duration<double>(now - job.accounted_until).count();
    job.core_seconds += job.published.count() * seconds;
    job.lent_core_seconds += job.lent_cpus() * seconds;
    job.accounted_until = now;
}

void NodeManager::caught_up(Job &job, TimePoint now) {
    if (!job.attachments.empty() && job.acked_generation() < job.generation) return;
    // Its processes run what the page says now: a later timeout is measured against that.
    if (!job.attachments.empty()) job.acked_threads = job.active_threads();
    if (!job.oversubscribed_since) return;
    if (now > *job.oversubscribed_since)
        job.oversubscribed_seconds += std::chrono::duration<double>(now - *job.oversubscribed_since).count();
    job.oversubscribed_since.reset();
}

void NodeManager::replan(TimePoint now) {
    targets_ = plan(now);
    advance(now);
}

bool NodeManager::reachable(const std::map<std::string, CpuSet> &targets,
                            std::string *stuck) const {
    // Replays advance() on sets alone, as if every ack came at once: a job takes next_step()
    // while it has one. Cycles (two single-cpu jobs swapping) are the case this catches.
    std::map<std::string, CpuSet> held;
    for (const auto &[id, job] : jobs_) held[id] = job.published;
    for (bool progress = true; progress;) {
        progress = false;
        for (auto &[id, mine] : held) {
            auto goal = targets.find(id);
            if (goal == targets.end() || goal->second == mine) continue;
            CpuSet others;
            for (const auto &[other_id, theirs] : held)
                if (other_id != id) others |= theirs;
            const auto next = next_step(mine, goal->second, others);
            if (!next) continue;
            mine = *next;
            progress = true;
        }
    }
    for (const auto &[id, mine] : held) {
        auto goal = targets.find(id);
        if (goal != targets.end() && goal->second != mine) {
            if (stuck) *stuck = id;
            return false;
        }
    }
    return true;
}

void NodeManager::enforce(Job &job, const CpuSet &cpus, bool growing, TimePoint now) {
    std::string error;
    const bool ok = effects_.enforce(job.spec.id, cpus, growing, &error);
    nlohmann::json ev = make_event("enforce");
    ev["job"] = job.spec.id;
    ev["cpus"] = cpus.to_string();
    ev["growing"] = growing;
    if (ok) {
        job.cpuset = cpus;
        job.enforce_retry_at.reset();
    } else {
        // The kernel may still give the job its old cpus: count both as held so no other job is
        // given them. A failed narrowing is retried after kEnforceRetry (advance() sees cpuset
        // wider than published); a failed widening is only reported: the process still pins its
        // threads through libmall, and the next change writes the cgroup again.
        job.cpuset |= cpus;
        job.enforce_retry_at.reset();
        if (job.cpuset != cpus) job.enforce_retry_at = now + kEnforceRetry;
        ev["error"] = error.empty() ? std::string("enforce failed") : error;
    }
    effects_.event(ev);
}

void NodeManager::advance(TimePoint now) {
    // Each pass either publishes a step toward a target or finishes one; published sets only
    // grow toward targets after their first step, so this ends. The cap is a safety net.
    for (int pass = 0; pass < 4 * CpuSet::kMaxCpus; ++pass) {
        bool moved = false;
        for (Job *job : in_registration_order<Job *>(jobs_)) {
            if (job->awaiting_ack) continue;
            if (job->cpuset != job->published) {  // adopted mid-shrink, or a failed write
                if (job->enforce_retry_at && now < *job->enforce_retry_at) continue;
                enforce(*job, job->published, !job->cpuset.contains(job->published), now);
                moved = true;
                continue;
            }
            auto target = targets_.find(job->spec.id);
            if (target == targets_.end() || target->second == job->published) {
                // The cpus stay; a new thread count (mallctl set --threads) or signal-control flag
                // (mallctl set --signal-control) is published alone. A job with no cpus yet gets
                // both with its first step.
                if (!job->published.empty() && (job->wanted_threads(job->published) != job->published_threads ||
                                                job->signal_control != job->published_signal_control)) {
                    publish_step(*job, job->published, now);
                    // A rate measured across the change would mix thread counts: start a new mark.
                    job->rate_mark_time.reset();
                    moved = true;
                }
                continue;
            }
            // No step (an empty one would leave the job's threads nowhere to run): wait until a
            // cpu of its goal is free (registrations, pins, reclaims and policy switches check
            // with feasible() that their goals can be reached).
            const auto step = next_step(job->published, target->second, held_by_others(job->spec.id));
            if (!step) continue;
            const CpuSet &next = *step;

            const CpuSet widened = job->cpuset | next;
            if (widened != job->cpuset) enforce(*job, widened, true, now);
            ++job->transitions;
            ++totals_.resizes;
            job->last_change = now;
            publish_step(*job, next, now);
            moved = true;
        }
        if (!moved) return;
    }
}

// Publishes `next` (with the job's thread count for it and its signal-control flag) as the job's
// next generation and waits for the ack when a process is attached.
void NodeManager::publish_step(Job &job, const CpuSet &next, TimePoint now) {
    account(job, now);  // the time so far counts with the cpus it had
    ++job.generation;
    job.published = next;
    job.published_threads = job.wanted_threads(next);
    job.published_signal_control = job.signal_control;
    effects_.publish(job.spec.id, job.generation, next, job.published_threads, job.published_signal_control);
    nlohmann::json ev = make_event("publish");
    ev["job"] = job.spec.id;
    ev["generation"] = job.generation;
    ev["cpus"] = next.to_string();
    ev["ncpus"] = next.count();
    if (job.published_threads > 0) ev["threads"] = job.published_threads;  // fewer threads than cpus
    if (job.published_signal_control) ev["signal_control"] = true;  // signal requests allowed
    effects_.event(ev);
    if (job.attachments.empty()) {
        finish_transition(job, now, false);  // nobody to wait for
    } else {
        job.awaiting_ack = true;
        job.publish_time = effects_.clock_now(now);
        job.ack_deadline = now + ack_timeout_;
    }
}

void NodeManager::finish_transition(Job &job, TimePoint now, bool timed_out) {
    const bool was_waiting = job.awaiting_ack;
    job.awaiting_ack = false;
    if (was_waiting && timed_out) {
        ++job.ack_timeouts;
        ++totals_.ack_timeouts;
        // Its processes still run the threads of the allocation they last acknowledged: more than
        // the cpus it is narrowed to now, they are oversubscribed until they acknowledge or leave.
        if (!job.oversubscribed_since && job.acked_threads > job.active_threads())
            job.oversubscribed_since = now;
        nlohmann::json ev = make_event("ack_timeout");
        ev["job"] = job.spec.id;
        ev["generation"] = job.generation;
        effects_.event(ev);
    } else if (was_waiting && !job.attachments.empty()) {
        job.last_ack_latency_us =
            std::chrono::duration<double, std::micro>(now - job.publish_time).count();
        job.ack_latency.observe(job.last_ack_latency_us / 1e6);
        totals_.ack_latency.observe(job.last_ack_latency_us / 1e6);
        caught_up(job, now);
        nlohmann::json ev = make_event("ack");
        ev["job"] = job.spec.id;
        ev["generation"] = job.generation;
        ev["latency_us"] = job.last_ack_latency_us;
        effects_.event(ev);
    }
    if (!timed_out) job.acked_threads = job.active_threads();  // what its processes run now
    if (job.cpuset != job.published) enforce(job, job.published, false, now);
}

nlohmann::json NodeManager::make_event(const char *name) {
    nlohmann::json ev{{"event", name}};
    if (const auto time = effects_.event_time()) ev["time"] = *time;
    return ev;
}

CpuSet NodeManager::held_by_others(const std::string &job) const {
    CpuSet held;
    for (const auto &[id, other] : jobs_) {
        if (id != job) held |= other.held();
    }
    return held;
}

}  // namespace mall
