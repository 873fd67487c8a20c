// SPDX-License-Identifier: BSD-3-Clause
// node_manager.cpp — the node manager's requests, processes, queries and re-adoption (see
// node_manager.hpp); the moving part (plans, the two-phase steps, timers, events) is in
// transitions.cpp. Every request validates fully and changes nothing when it fails (a change that
// needs a plan to judge is applied tentatively, checked by feasible() and undone); every change
// of targets runs advance(), which moves jobs until none can move further.
// The queries and the status document are in node_manager_queries.cpp. What stays here is one
// surface over one private state in four marked sections — requests (each a validation then a
// change), the client's calls (attach, ack, progress), re-adoption, feasibility — that share the
// refusal helpers below.
#include "node_manager.hpp"

#include <algorithm>
#include <cmath>

#include "../../common/protocol.hpp"
#include "../../common/rules.hpp"

namespace mall {

namespace {

std::string quoted_set(const CpuSet &cpus) {
    return cpus.empty() ? std::string("(none)") : cpus.to_string();
}

Outcome invalid(std::string text) { return Outcome::failure(MALL_ERR_INVAL, std::move(text)); }

Outcome no_job(const std::string &job) {
    return Outcome::failure(MALL_ERR_NOJOB, "no job named \"" + job +
                                                "\" is registered (see `mallctl status`)");
}

// The refusal of a weight outside the rule of common/rules.hpp (registration and set_weight).
Outcome bad_weight(double weight) {
    return invalid(std::string("weight must be ") + kWeightRule + ", got " + std::to_string(weight));
}

// A job's pids, the same rule at registration and when a task joins: at least one, each > 0.
Outcome no_pids() { return invalid("a job needs at least one pid"); }
std::optional<Outcome> bad_pid(pid_t pid) {
    if (pid > 0) return std::nullopt;
    return invalid("pid " + std::to_string(pid) + " is not a valid process id");
}


}  // namespace

uint64_t Job::acked_generation() const {
    if (attachments.empty()) return generation;
    uint64_t lowest = UINT64_MAX;
    for (const auto &[id, acked] : attachments) lowest = std::min(lowest, acked);
    return lowest;
}

NodeManager::NodeManager(const Topology &topology, CpuSet pool, PolicyKind policy,
                         std::chrono::milliseconds ack_timeout, Effects &effects)
    : topology_(topology),
      pool_(std::move(pool)),
      policy_(policy),
      ack_timeout_(ack_timeout),
      effects_(effects) {}

// ---------------------------------------------------------------------------------------------
// requests

Outcome NodeManager::register_job(const JobSpec &spec, TimePoint now) {
    if (auto why = proto::invalid_job_name(spec.id)) return invalid("bad job name: " + *why);
    if (jobs_.count(spec.id) != 0) {
        return invalid("job \"" + spec.id +
                       "\" is already registered; deregister it first or pick another name");
    }
    if (spec.min < 1) return invalid("min must be at least 1 (got " + std::to_string(spec.min) + ")");
    if (spec.min > spec.max) {
        return invalid("min (" + std::to_string(spec.min) + ") is larger than max (" +
                       std::to_string(spec.max) + ")");
    }
    if (spec.max > pool_.count()) {
        return invalid("max (" + std::to_string(spec.max) + ") is larger than the pool (" +
                       std::to_string(pool_.count()) + " cpus: " + quoted_set(pool_) +
                       "); use a max of at most " + std::to_string(pool_.count()));
    }
    if (!valid_weight(spec.weight)) return bad_weight(spec.weight);
    if (!pool_.contains(spec.guaranteed)) {
        return invalid("guaranteed cpus " + (spec.guaranteed - pool_).to_string() +
                       " are not in malld's pool " + quoted_set(pool_));
    }
    if (spec.guaranteed.count() > spec.max) {
        return invalid("the job is guaranteed " + std::to_string(spec.guaranteed.count()) +
                       " cpus but its max is " + std::to_string(spec.max) +
                       "; max must be at least the number of guaranteed cpus");
    }
    for (const auto &[id, other] : jobs_) {
        const CpuSet reserved = other.claimed();
        if (spec.guaranteed.intersects(reserved)) {
            return invalid("guaranteed cpus " + (spec.guaranteed & reserved).to_string() +
                           " are already guaranteed or pinned to job \"" + id + "\"");
        }
    }
    for (const auto &[owner, cpus] : reserved_) {
        if (owner != spec.id && spec.guaranteed.intersects(cpus)) {
            return invalid("guaranteed cpus " + (spec.guaranteed & cpus).to_string() +
                           " are reserved for \"" + owner + "\" (reclaimed by its prolog)");
        }
    }
    if (spec.pids.empty() && !spec.container) return no_pids();
    for (pid_t pid : spec.pids) {
        if (auto refusal = bad_pid(pid)) return *refusal;
    }

    Job job;
    job.spec = spec;
    job.order = next_order_++;
    job.registered_at = now;
    job.accounted_until = now;
    jobs_.emplace(spec.id, std::move(job));
    if (Outcome check = feasible("registering job \"" + spec.id + "\"", now); !check.ok) {
        jobs_.erase(spec.id);
        --next_order_;
        return check;
    }

    nlohmann::json ev = make_event("register");
    ev["job"] = spec.id;
    ev["uid"] = spec.uid;
    ev["min"] = spec.min;
    ev["max"] = spec.max;
    ev["weight"] = spec.weight;
    ev["guaranteed"] = spec.guaranteed.to_string();
    ev["pids"] = spec.pids;
    if (spec.container) ev["container"] = true;
    effects_.event(ev);

    replan(now);
    // The first cpu-time sample starts its first window (what the backend can read of it now; a
    // cgroup it is classified into later joins as an incomplete window's counter).
    sample_cpu_time(spec.id, now);
    return Outcome::success();
}

Outcome NodeManager::deregister_job(const std::string &job, TimePoint now) {
    if (jobs_.count(job) == 0) return no_job(job);
    end_job(job, "deregistered", now);
    replan(now);
    return Outcome::success();
}

Outcome NodeManager::remove_pid(const std::string &job, pid_t pid, TimePoint now) {
    auto it = jobs_.find(job);
    if (it == jobs_.end()) return no_job(job);
    auto &pids = it->second.spec.pids;
    auto pos = std::find(pids.begin(), pids.end(), pid);
    if (pos == pids.end()) {
        return invalid("pid " + std::to_string(pid) + " is not registered to job \"" + job + "\"");
    }
    pids.erase(pos);
    if (!pids.empty()) return Outcome::success();
    end_job(job, "exited", now);
    replan(now);
    return Outcome::success();
}

Outcome NodeManager::set_weight(const std::string &job, double weight, TimePoint now) {
    auto it = jobs_.find(job);
    if (it == jobs_.end()) return no_job(job);
    if (!valid_weight(weight)) return bad_weight(weight);
    if (it->second.spec.weight == weight) return Outcome::success();
    it->second.spec.weight = weight;
    nlohmann::json ev = make_event("weight");
    ev["job"] = job;
    ev["weight"] = weight;
    effects_.event(ev);
    replan(now);  // only the weighted policy reads weights; the others plan the same
    return Outcome::success();
}

Outcome NodeManager::check_threads(const std::string &job, int threads, bool holdings_checked) const {
    auto it = jobs_.find(job);
    if (it == jobs_.end()) return no_job(job);
    if (threads < 0 || threads > CpuSet::kMaxCpus)
        return invalid("threads must be 1 to " + std::to_string(CpuSet::kMaxCpus) + " or auto (one per cpu), got " +
                       std::to_string(threads));
    const Job &self = it->second;
    const CpuSet holds = self.pinned ? *self.pinned : self.published;
    const int limit = holds.empty() || holdings_checked ? self.spec.max : holds.count();
    if (threads > limit)
        return invalid("job \"" + job + "\" " +
                       (holds.empty() ? "takes at most " + std::to_string(limit) + " cpus"
                                      : "holds " + std::to_string(limit) + " cpus (" + holds.to_string() + ")") +
                       ": threads must be 1 to " + std::to_string(limit) + ", or auto (one per cpu)");
    return Outcome::success();
}

Outcome NodeManager::set_threads(const std::string &job, int threads, TimePoint now, bool holdings_checked) {
    if (Outcome check = check_threads(job, threads, holdings_checked); !check.ok) return check;
    Job &self = jobs_.at(job);
    if (self.threads == threads) return Outcome::success();
    self.threads = threads;
    nlohmann::json ev = make_event("threads");
    ev["job"] = job;
    ev["threads"] = threads > 0 ? nlohmann::json(threads) : nlohmann::json("auto");
    effects_.event(ev);
    advance(now);  // publishes the count now unless a change is under way (then after its ack)
    return Outcome::success();
}

Outcome NodeManager::set_signal_control(const std::string &job, bool on, TimePoint now) {
    auto it = jobs_.find(job);
    if (it == jobs_.end()) return no_job(job);
    Job &self = it->second;
    if (self.signal_control == on) return Outcome::success();
    self.signal_control = on;
    nlohmann::json ev = make_event("signal_control");
    ev["job"] = job;
    ev["signal_control"] = on;
    effects_.event(ev);
    advance(now);  // publishes the flag now unless a change is under way (then after its ack)
    return Outcome::success();
}

int Job::planned_max() const {
    if (usage_cap <= 0) return spec.max;
    return std::clamp(usage_cap, spec.min, spec.max);
}

Outcome NodeManager::set_usage(const std::string &job, int cpus_used, TimePoint now) {
    auto it = jobs_.find(job);
    if (it == jobs_.end()) return no_job(job);
    if (cpus_used < 0 || cpus_used > CpuSet::kMaxCpus) {
        return invalid("cpus_used must be 0 (all) to " + std::to_string(CpuSet::kMaxCpus) + ", got " +
                       std::to_string(cpus_used));
    }
    Job &self = it->second;
    if (self.usage_applied && now < *self.usage_applied + kUsageInterval) {
        // Too soon after the last change: the latest wish waits for tick() (none if it is the
        // cap in force).
        if (cpus_used == self.usage_cap)
            self.usage_wanted.reset();
        else
            self.usage_wanted = cpus_used;
        return Outcome::success();
    }
    self.usage_wanted.reset();
    apply_usage(job, self, cpus_used, now);
    return Outcome::success();
}

void NodeManager::apply_usage(const std::string &job, Job &self, int cpus_used, TimePoint now) {
    if (self.usage_cap == cpus_used) return;
    self.usage_applied = now;
    const int planned_before = self.planned_max();
    self.usage_cap = cpus_used;
    nlohmann::json ev = make_event("usage");
    ev["job"] = job;
    ev["cpus_used"] = cpus_used;
    ev["planned_max"] = self.planned_max();
    effects_.event(ev);
    // The job's min is unchanged, so the plan stays feasible whatever the cap.
    if (self.planned_max() != planned_before) replan(now);
}

void NodeManager::apply_due_usage(TimePoint now) {
    std::vector<std::string> due;
    for (const auto &[id, job] : jobs_)
        if (job.usage_wanted && (!job.usage_applied || now >= *job.usage_applied + kUsageInterval))
            due.push_back(id);
    for (const std::string &id : due) {  // replans add or remove no job: the names stay valid
        Job &self = jobs_.at(id);
        const int wanted = *self.usage_wanted;
        self.usage_wanted.reset();
        apply_usage(id, self, wanted, now);
    }
}

Outcome NodeManager::set_cpus(const std::string &job, std::optional<CpuSet> pinned,
                              TimePoint now) {
    auto it = jobs_.find(job);
    if (it == jobs_.end()) return no_job(job);
    const Job &self = it->second;
    if (pinned) {
        const CpuSet available = available_pool();
        if (!available.contains(*pinned)) {
            return invalid("cpus " + (*pinned - available).to_string() +
                           " are not in the available pool " + quoted_set(available));
        }
        const int n = pinned->count();
        if (n < self.spec.min || n > self.spec.max) {
            return invalid("job \"" + job + "\" takes " + std::to_string(self.spec.min) + " to " +
                           std::to_string(self.spec.max) + " cpus, but " +
                           std::to_string(n) + " were given");
        }
        const CpuSet own_guaranteed = self.spec.guaranteed & available;
        if (!pinned->contains(own_guaranteed)) {
            return invalid("the pinned set must contain the job's guaranteed cpus " +
                           own_guaranteed.to_string());
        }
        for (const auto &[id, other] : jobs_) {
            if (id == job) continue;
            const CpuSet reserved = other.claimed();
            if (pinned->intersects(reserved)) {
                return invalid("cpus " + (*pinned & reserved).to_string() +
                               " are guaranteed or pinned to job \"" + id + "\"");
            }
        }
    }
    const std::optional<CpuSet> previous = it->second.pinned;
    it->second.pinned = pinned;
    if (Outcome check = feasible("moving job \"" + job + "\" to cpus " +
                                 (pinned ? pinned->to_string() : std::string("chosen by the policy")),
                                 now);
        !check.ok) {
        it->second.pinned = previous;
        return check;
    }
    nlohmann::json ev = make_event("pin");
    ev["job"] = job;
    ev["cpus"] = pinned ? pinned->to_string() : std::string("auto");
    effects_.event(ev);
    replan(now);
    return Outcome::success();
}

Outcome NodeManager::set_policy(const std::string &name, TimePoint now) {
    auto kind = parse_policy(name);
    if (!kind) {
        std::string valid;
        for (const auto &n : policy_names()) valid += (valid.empty() ? "" : ", ") + n;
        return invalid("unknown policy \"" + name + "\"; valid policies: " + valid);
    }
    const PolicyKind previous = policy_;
    policy_ = *kind;
    if (Outcome check = feasible(std::string("switching to policy ") + policy_name(*kind), now); !check.ok) {
        policy_ = previous;
        return check;
    }
    nlohmann::json ev = make_event("policy");
    ev["policy"] = policy_name(policy_);
    effects_.event(ev);
    replan(now);
    return Outcome::success();
}

Outcome NodeManager::reclaim(const CpuSet &cpus, TimePoint now, const std::string &owner) {
    if (cpus.empty()) return invalid("no cpus to reclaim were given");
    if (!owner.empty()) {
        if (auto why = proto::invalid_job_name(owner)) return invalid("bad owner name: " + *why);
    }
    if (!pool_.contains(cpus)) {
        return invalid("cpus " + (cpus - pool_).to_string() + " are not in malld's pool " +
                       quoted_set(pool_));
    }
    for (const auto &[id, job] : jobs_) {
        if (id != owner && cpus.intersects(job.spec.guaranteed)) {
            return invalid("cpus " + (cpus & job.spec.guaranteed).to_string() +
                           " are guaranteed to job \"" + id + "\" and cannot be reclaimed");
        }
    }
    const CpuSet previous = reclaimed_;
    const auto previous_reserved = reserved_;
    reclaimed_ |= cpus;
    if (!owner.empty()) reserved_[owner] |= cpus;
    if (Outcome check = feasible("reclaiming cpus " + cpus.to_string(), now); !check.ok) {
        reclaimed_ = previous;
        reserved_ = previous_reserved;
        return check;
    }
    nlohmann::json ev = make_event("reclaim");
    ev["cpus"] = cpus.to_string();
    if (!owner.empty()) ev["owner"] = owner;
    effects_.event(ev);
    replan(now);
    return Outcome::success();
}

Outcome NodeManager::release(const CpuSet &cpus, TimePoint now) {
    if (cpus.empty()) return invalid("no cpus to release were given");
    if (!reclaimed_.contains(cpus)) {
        return invalid("cpus " + (cpus - reclaimed_).to_string() +
                       " were not reclaimed (reclaimed now: " + quoted_set(reclaimed_) + ")");
    }
    reclaimed_ -= cpus;
    for (auto it = reserved_.begin(); it != reserved_.end();) {
        it->second -= cpus;
        it = it->second.empty() ? reserved_.erase(it) : std::next(it);
    }
    nlohmann::json ev = make_event("release");
    ev["cpus"] = cpus.to_string();
    effects_.event(ev);
    replan(now);
    return Outcome::success();
}

Outcome NodeManager::release_owner(const std::string &owner, TimePoint now, CpuSet *released) {
    if (auto why = proto::invalid_job_name(owner)) return invalid("bad owner name: " + *why);
    CpuSet cpus;
    if (auto it = reserved_.find(owner); it != reserved_.end()) {
        cpus = it->second;
        reserved_.erase(it);
        reclaimed_ -= cpus;
    }
    if (released) *released = cpus;
    // The epilog comes after the job's tasks: a job still registered missed its task exits.
    const bool ended = jobs_.count(owner) != 0;
    if (ended) end_job(owner, "released", now);
    if (cpus.empty() && !ended) return Outcome::success();  // already released (e.g. by --slurm)
    nlohmann::json ev = make_event("release");
    ev["cpus"] = cpus.to_string();
    ev["owner"] = owner;
    effects_.event(ev);
    replan(now);
    return Outcome::success();
}

Outcome NodeManager::add_pids(const std::string &job, uid_t uid, const std::vector<pid_t> &pids,
                              TimePoint now) {
    auto it = jobs_.find(job);
    if (it == jobs_.end()) return no_job(job);
    if (it->second.spec.uid != uid) {
        return invalid("job \"" + job + "\" belongs to uid " + std::to_string(it->second.spec.uid) +
                       ", not " + std::to_string(uid) + "; a task can only join its own job");
    }
    if (pids.empty()) return no_pids();
    for (pid_t pid : pids) {
        if (auto refusal = bad_pid(pid)) return *refusal;
        if (auto refusal = pid_in_other_job(pid, job)) return *refusal;
    }
    auto &known = it->second.spec.pids;
    for (pid_t pid : pids)
        if (std::find(known.begin(), known.end(), pid) == known.end()) known.push_back(pid);
    nlohmann::json ev = make_event("join");
    ev["job"] = job;
    ev["pids"] = pids;
    effects_.event(ev);
    advance(now);
    return Outcome::success();
}

// ---------------------------------------------------------------------------------------------
// processes

Outcome NodeManager::attach(const std::string &job, uint64_t attach_id) {
    auto it = jobs_.find(job);
    if (it == jobs_.end()) return no_job(job);
    // The new process reads the page as it is now, so it has seen the current generation.
    it->second.attachments[attach_id] = it->second.generation;
    if (!it->second.awaiting_ack) it->second.acked_threads = it->second.active_threads();
    return Outcome::success();
}

void NodeManager::detach(const std::string &job, uint64_t attach_id, TimePoint now) {
    auto it = jobs_.find(job);
    if (it == jobs_.end()) return;
    Job &j = it->second;
    if (j.attachments.erase(attach_id) == 0) return;
    if (j.awaiting_ack && j.acked_generation() >= j.generation) {
        finish_transition(j, now, false);
        advance(now);
    } else {
        caught_up(j, now);  // the late process left
    }
}

void NodeManager::ack(const std::string &job, uint64_t attach_id, uint64_t generation,
                      TimePoint now) {
    auto it = jobs_.find(job);
    if (it == jobs_.end()) return;
    Job &j = it->second;
    auto att = j.attachments.find(attach_id);
    if (att == j.attachments.end() || generation > j.generation) return;
    att->second = std::max(att->second, generation);
    if (j.awaiting_ack && j.acked_generation() >= j.generation) {
        finish_transition(j, now, false);
        advance(now);
    } else {
        caught_up(j, now);  // a late ack after the timeout
    }
}

void NodeManager::progress(const std::string &job, uint64_t work_units, uint64_t steps, TimePoint now) {
    auto it = jobs_.find(job);
    if (it == jobs_.end()) return;
    Job &j = it->second;
    j.work_units = work_units;
    j.steps = steps;
    // A rate sample spans two reports while the job held the same steady cpus; totals restart
    // at zero when a process re-attaches (a report below the mark then starts a new mark).
    // A job running fewer threads than cpus (mallctl set --threads) measures the threads, not the
    // cpus: no sample then; nor while its processes may run narrowed by `mallctl signal`
    // (--signal-control on), which malld does not see.
    const bool steady = j.steady() && j.published_threads == 0 && !j.published_signal_control;
    const int cpus = j.published.count();
    if (steady && j.rate_mark_time && j.rate_mark_cpus == cpus && *j.rate_mark_time >= j.last_change &&
        work_units >= j.rate_mark_units && now - *j.rate_mark_time >= kMinRateWindow) {
        const double seconds = std::chrono::duration<double>(now - *j.rate_mark_time).count();
        const double rate = static_cast<double>(work_units - j.rate_mark_units) / seconds;
        if (rate > 0) {
            j.rate_samples.push_back({cpus, rate});
            if (j.rate_samples.size() > kMaxRateSamples) {
                // Forget the oldest sample of the count measured most often, so that what was
                // learnt at other counts is kept (dropping by age alone would forget whole counts
                // and make the policy probe them again).
                std::map<int, int> per_count;
                for (const auto &s : j.rate_samples) ++per_count[s.cpus];
                const int busiest = std::max_element(per_count.begin(), per_count.end(), [](auto &a, auto &b) {
                                        return a.second < b.second;
                                    })->first;
                auto oldest = std::find_if(j.rate_samples.begin(), j.rate_samples.end(),
                                           [&](const RateSample &s) { return s.cpus == busiest; });
                j.rate_samples.erase(oldest);
            }
        }
    }
    if (!steady) {
        j.rate_mark_time.reset();
    } else if (!j.rate_mark_time || j.rate_mark_cpus != cpus || work_units < j.rate_mark_units ||
               now - *j.rate_mark_time >= kMinRateWindow) {
        j.rate_mark_time = now;
        j.rate_mark_units = work_units;
        j.rate_mark_cpus = cpus;
    }
}

// ---------------------------------------------------------------------------------------------
// queries

std::optional<Outcome> NodeManager::pid_in_other_job(pid_t pid, const std::string &job) const {
    for (const auto &[id, other] : jobs_) {
        const auto &known = other.spec.pids;
        if (id != job && std::find(known.begin(), known.end(), pid) != known.end())
            return invalid("pid " + std::to_string(pid) + " already belongs to job " + id +
                           "; a process can be in one job only");
    }
    return std::nullopt;
}

// ---------------------------------------------------------------------------------------------
// restart

Outcome NodeManager::adopt(const Job &job) {
    const std::string &id = job.spec.id;
    if (auto why = proto::invalid_job_name(id)) return invalid("bad job name: " + *why);
    if (jobs_.count(id) != 0) return invalid("job \"" + id + "\" is already registered");
    const CpuSet held = job.held();
    if (!pool_.contains(held)) {
        return invalid("job \"" + id + "\" holds cpus " + (held - pool_).to_string() +
                       " outside malld's pool " + quoted_set(pool_));
    }
    for (const auto &[other_id, other] : jobs_) {
        const CpuSet overlap = held & other.held();
        if (!overlap.empty()) {
            return invalid("job \"" + id + "\" holds cpus " + overlap.to_string() +
                           " that job \"" + other_id + "\" holds too");
        }
    }
    Job adopted = job;
    if (adopted.order == 0) adopted.order = next_order_;
    next_order_ = std::max(next_order_, adopted.order + 1);
    // Until the next change of plan, an adopted job's target is what it was told: a restart alone
    // moves nothing.
    targets_[id] = adopted.published;
    jobs_.emplace(id, std::move(adopted));
    return Outcome::success();
}

// ---------------------------------------------------------------------------------------------
// request validation

Outcome NodeManager::feasible(const std::string &change, TimePoint now) const {
    const auto targets = plan(now);
    for (const auto &[id, job] : jobs_) {
        auto target = targets.find(id);
        const int given = target == targets.end() ? 0 : target->second.count();
        if (given < job.spec.min) {
            return invalid(change + " would leave job \"" + id + "\" " + std::to_string(given) +
                           " cpus, below its minimum of " + std::to_string(job.spec.min) +
                           " (the available pool " + quoted_set(available_pool()) +
                           " cannot hold every job's minimum and guaranteed cpus)");
        }
    }
    std::string stuck;
    if (!reachable(targets, &stuck)) {
        return invalid(change + " would need job \"" + stuck + "\" to give up its only cpus "
                       "before it gets others (a swap of cpus between jobs at their minimum cannot "
                       "happen without a moment of overlap); do it in two steps that each leave "
                       "every job at least one cpu");
    }
    return Outcome::success();
}

}  // namespace mall
