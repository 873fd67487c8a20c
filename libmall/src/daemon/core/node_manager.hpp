// SPDX-License-Identifier: BSD-3-Clause
// node_manager.hpp — the node manager's core: jobs, their allocations, the policy, and the
// two-phase transitions. A plain class with no sockets, no threads and no clock of its own, so
// tests and mallsim drive it directly. The server feeds it requests and timer ticks and carries
// out its Effects.
//
// Time: the core reads no clock. Every request and tick passes `now` (a steady-clock TimePoint),
// which dates everything the core decides: ack deadlines, enforce retries, dwell, rate samples and
// periodic replans. Effects::clock_now() gives the moment a publish happened (ack latency counts
// from it), and Effects::event_time() the wall time an event carries as "time" (when it gives
// none, Effects::event() stamps it: malld's KernelEffects does).
//
// Transition protocol per job (the two phases docs/architecture.md's "malld, the node manager" describes,
// stated in full here): a job holds `cpuset` (enforced) and `published` (what its processes were
// told). To move toward its target T, the job's next published set is
// N = (published ∩ T) ∪ (T's cpus that no other job holds), provided N is neither empty nor
// unchanged (else the job waits). Then:
//   1. cpuset := cpuset ∪ N (widening only ever uses free cpus), publish N (generation + 1);
//   2. wait for every attached process to ack that generation, or the ack timeout (counted);
//      a job with no attached process needs no ack;
//   3. cpuset := N; the cpus it gave up become free and other jobs may take them.
// Invariant: the sets cpuset ∪ published (Job::held) of different jobs never intersect.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../../common/cpuset.hpp"
#include "../../common/rules.hpp"
#include "histogram.hpp"
#include "policy.hpp"
#include "topology.hpp"

namespace mall {

using Clock = std::chrono::steady_clock;
using TimePoint = Clock::time_point;

// One sample of a job's cpu time: the running total, and whether the window it closes is
// incomplete (a counter joined since the sample before, whose growth in it is unknown).
struct CpuTimeSample {
    double seconds = 0;
    bool incomplete = false;
};

// How a cpu-time sample closes the job's current window (NodeManager::record_cpu_time).
enum class CpuSampleKind {
    Regular,     // a window shorter than kMinCpuWindow goes on
    Last,        // the job's end: its growth counts however short the window
    Incomplete,  // its growth counts, but the window gives no busy fraction
};

// What the core asks the outside world to do. Implemented by the server (real cgroups and pages)
// and by tests (recording fakes).
class Effects {
public:
    virtual ~Effects() = default;
    // Make the job's enforced cpu set `cpus` (cgroup cpuset and/or thread affinity). `growing` is
    // true when cpus gained members (affinity must then be widened on every thread too).
    // Returns false with *error on failure: the core reports it as the "error" of the "enforce"
    // event, counts the job as holding its old cpus and the new ones, and writes again: a
    // narrowing after kEnforceRetry, a widening at the job's next change.
    virtual bool enforce(const std::string &job, const CpuSet &cpus, bool growing,
                         std::string *error) = 0;
    // Write a new allocation to the job's shared page and notify its attached processes.
    // threads: the threads its processes should run on those cpus (0 = one per cpu).
    // signal_control: its processes may take `mallctl signal` requests that narrow within these
    // cpus (mallctl set --signal-control on; the page's kPageFlagSignalControl).
    virtual void publish(const std::string &job, uint64_t generation, const CpuSet &cpus, int threads,
                         bool signal_control) = 0;
    // The job is gone: remove its cgroup, page, etc.
    virtual void job_removed(const std::string &job) = 0;
    // An event for watchers and the log: {"event": "...", ...}, with "time" when event_time()
    // gave one (otherwise the implementation stamps it).
    virtual void event(const nlohmann::json &event) = 0;
    // The wall time (seconds since the epoch) the next event carries as "time", or none to leave
    // the stamp to event(). The core has no wall clock: this is where its events' time comes from.
    virtual std::optional<double> event_time() { return std::nullopt; }
    // The time now, read right after a publish so ack latency counts from the moment the page
    // changed (not from the request that caused it). Tests with a fake clock keep `fallback`.
    virtual TimePoint clock_now(TimePoint fallback) { return fallback; }
    // The job's cpu-time counter now (a running total that never goes back: KernelEffects keeps
    // it from the backend's readings), or none when there is nothing to read. The core samples it
    // when a job registers and when it ends, and sample_cpu_times() every kCpuSampleInterval.
    virtual std::optional<CpuTimeSample> cpu_time(const std::string &job) {
        (void)job;
        return std::nullopt;
    }
};

struct JobSpec {
    std::string id;
    uid_t uid = 0;
    int min = 1;
    int max = 1;
    double weight = mall::kDefaultWeight;
    CpuSet guaranteed;
    std::vector<pid_t> pids;
    // A container job (mallrun --container): registered before its container exists, with the
    // launcher's pid only (it may also have none); malld adds the processes it finds in the
    // job's cgroup as the engine starts them, and the job ends when the last of them is gone.
    bool container = false;
};

struct Job {
    JobSpec spec;
    uint64_t order = 0;
    CpuSet cpuset;        // enforced
    CpuSet published;     // last published
    uint64_t generation = 0;
    std::optional<CpuSet> pinned;
    // The job's processes use only this many of its cpus (mall_set_usage; 0 = all): it is
    // planned with max = clamp(usage_cap, min, max), so the surplus above its min is lent.
    int usage_cap = 0;
    int planned_max() const;
    // Usage changes take effect at most once per kUsageInterval (each is a replan, an event and
    // its broadcast): one that comes sooner waits here until usage_applied + kUsageInterval, and
    // a later one replaces it (NodeManager::set_usage, tick).
    std::optional<int> usage_wanted;
    std::optional<TimePoint> usage_applied;
    // mallctl set --threads: the job keeps its cpus but runs this many threads (0 = one per cpu).
    // Published with each allocation as min(threads, its cpus); published_threads is what the
    // page says now (0 = one per cpu).
    int threads = 0;
    int published_threads = 0;
    int wanted_threads(const CpuSet &cpus) const { return threads > 0 && threads < cpus.count() ? threads : 0; }
    int active_threads() const { return published_threads > 0 ? published_threads : published.count(); }
    // mallctl set --signal-control on|off (default off): the job's processes that opted in
    // (MALL_SIGNAL_CONTROL) may take `mallctl signal` requests narrowing within the published cpus
    // until the next generation. Published with every allocation; published_signal_control is
    // what the page says now (a toggle alone publishes the same cpus and thread count).
    bool signal_control = false;
    bool published_signal_control = false;
    // transition in flight
    bool awaiting_ack = false;
    TimePoint publish_time{};
    TimePoint ack_deadline{};
    // a failed cgroup/affinity write is retried at this time (the job keeps the wider set meanwhile)
    std::optional<TimePoint> enforce_retry_at;
    // attachments: attach id -> acked generation
    std::map<uint64_t, uint64_t> attachments;
    uint64_t acked_generation() const;  // min over attachments, or generation if none

    // What "settled" means, once. Two notions, apart on purpose:
    // A move is under way: an ack of the last publication is awaited (until the ack timeout), or
    // the enforced cpuset is not yet the published set (a widening or narrowing between its
    // steps, a failed cgroup write awaiting its retry, a job adopted mid-move).
    bool moving() const { return awaiting_ack || cpuset != published; }
    // Steady: no move under way and at least one cpu. The job runs on a fixed set of cpus, so
    // what it reports measures that many cpus (rate samples), and a job that just registered has
    // been given cpus (NodeManager::steady). It may still be short of its target, e.g. waiting for
    // another job to give cpus up: requiring the target here would delay both for nothing.
    bool steady() const { return !moving() && !published.empty(); }
    // Settled: no move under way and the published set is `target`: nothing is left to do until
    // the plan changes (`mallctl status` shows "settled", otherwise "changing").
    bool settled(const CpuSet &target) const { return !moving() && published == target; }
    // Every cpu the job may run on now (enforced or told): no other job may be given these.
    CpuSet held() const { return cpuset | published; }
    // Cpus no other job may be guaranteed or pinned to: its guaranteed cpus and its pin.
    CpuSet claimed() const { return pinned ? spec.guaranteed | *pinned : spec.guaranteed; }

    // metrics
    uint64_t transitions = 0;   // resizes: publications of new cpus
    uint64_t ack_timeouts = 0;
    double last_ack_latency_us = -1;
    DurationHistogram ack_latency;  // every ack that ended a transition, in seconds

    // Accounting (NodeManager::account brings the integrals up to a moment): core-seconds are the
    // job's published cpus times the time it held them; lent core-seconds count only the cpus
    // above its guaranteed ones (lent_cpus()), the idle capacity malld turned into its work.
    // Oversubscribed seconds: time after an ack timeout of a shrink while its processes still ran
    // more threads than the cpus they were left (acked_threads > the published count), until they
    // acknowledged or detached.
    TimePoint registered_at{};
    TimePoint accounted_until{};       // the integrals below are complete up to here
    double core_seconds = 0;
    double lent_core_seconds = 0;
    double oversubscribed_seconds = 0; // closed intervals; plus now - oversubscribed_since if open
    std::optional<TimePoint> oversubscribed_since;
    int acked_threads = 0;             // threads its processes ran at the last acknowledged change
    // The cpus above what the job is guaranteed: its guaranteed set's size, or its min when it
    // has no guaranteed cpus (the policy always gives a job its min).
    int lent_cpus() const {
        const int own = spec.guaranteed.empty() ? spec.min : spec.guaranteed.count();
        return published.count() > own ? published.count() - own : 0;
    }
    // Cpu time (cpu_usage.cpp): what the job's processes ran, measured by malld about every
    // kCpuSampleInterval (Effects::cpu_time). cpu_seconds adds each window's growth, so
    // cpu_seconds / core_seconds is its life-long busy fraction; cpu_busy is the last window's
    // (none before a first full window). The marks are where the current window began: the
    // backend's counter, the time and the job's core_seconds then; none after a restart.
    double cpu_seconds = 0;
    std::optional<double> cpu_busy;
    std::optional<double> cpu_mark_counter;
    TimePoint cpu_mark_time{};
    double cpu_mark_core_seconds = 0;
    uint64_t work_units = 0;
    uint64_t steps = 0;
    // throughput policy: work rates measured between progress reports while the job held the same
    // cpus (steady), newest last, at most kMaxRateSamples; and when its cpus last changed.
    std::vector<RateSample> rate_samples;
    TimePoint last_change{};
    std::optional<TimePoint> rate_mark_time;  // the previous report that can start a sample
    uint64_t rate_mark_units = 0;
    int rate_mark_cpus = 0;
};

// What the node's jobs did, for metrics and history: the totals of the jobs that ended (their
// accounting is added when they end) and counters that run across jobs. Kept in the state file.
struct NodeTotals {
    uint64_t jobs_ended = 0;
    double core_seconds = 0;            // of ended jobs
    double lent_core_seconds = 0;       // of ended jobs
    double oversubscribed_seconds = 0;  // of ended jobs
    double cpu_seconds = 0;             // of ended jobs: the cpu time their processes ran
    uint64_t resizes = 0;               // every job's, counted as they happen
    uint64_t ack_timeouts = 0;          // every job's, counted as they happen
    DurationHistogram ack_latency;      // every job's acks
    uint64_t reclaims = 0;              // reclaim requests answered (cpus free, or timed out)
    uint64_t reclaim_timeouts = 0;      // of those, the ones whose cpus stayed held past the wait
    DurationHistogram reclaim_duration; // from request to reply
    bool operator==(const NodeTotals &) const = default;
    // The totals as `mallctl status --json` ("node", before running jobs are added) and the state
    // file ("totals") write them: one field list for both.
    nlohmann::json to_json() const {
        return {{"jobs_ended", jobs_ended},
                {"core_seconds", core_seconds},
                {"lent_core_seconds", lent_core_seconds},
                {"oversubscribed_seconds", oversubscribed_seconds},
                {"cpu_seconds", cpu_seconds},
                {"resizes", resizes},
                {"ack_timeouts", ack_timeouts},
                {"ack_latency_seconds", ack_latency.to_json()},
                {"reclaims", reclaims},
                {"reclaim_timeouts", reclaim_timeouts},
                {"reclaim_duration_seconds", reclaim_duration.to_json()}};
    }
};

// A job's accounting as of a moment (computed, not stored): what its "end" event, its row of
// `mallctl status --json` and its running AdminComment figures carry.
struct JobAccount {
    double duration_seconds = 0;        // since it registered
    double core_seconds = 0;            // cpus held times the time held
    double lent_core_seconds = 0;       // cpus held above its guaranteed cpus (or min), times the time
    double oversubscribed_seconds = 0;  // from an ack timeout of a shrink until its processes caught up
    double cpu_seconds = 0;             // cpu time its processes ran, up to the last sample
    uint64_t resizes = 0;
    uint64_t ack_timeouts = 0;
    uint64_t acks = 0;
    double ack_latency_seconds_sum = 0;
    nlohmann::json to_json() const {  // the field names above
        return {{"duration_seconds", duration_seconds},
                {"core_seconds", core_seconds},
                {"lent_core_seconds", lent_core_seconds},
                {"oversubscribed_seconds", oversubscribed_seconds},
                {"cpu_seconds", cpu_seconds},
                {"resizes", resizes},
                {"ack_timeouts", ack_timeouts},
                {"acks", acks},
                {"ack_latency_seconds_sum", ack_latency_seconds_sum}};
    }
};

struct Outcome {
    bool ok = true;
    int code = 0;        // mall_rc value when !ok
    std::string error;   // words when !ok, saying how to fix it
    static Outcome success() { return {}; }
    static Outcome failure(int code, std::string text) { return {false, code, std::move(text)}; }
};

class NodeManager {
public:
    NodeManager(const Topology &topology, CpuSet pool, PolicyKind policy,
                std::chrono::milliseconds ack_timeout, Effects &effects);

    // --- requests (each validates fully and changes nothing when it fails) ---
    Outcome register_job(const JobSpec &spec, TimePoint now);
    Outcome deregister_job(const std::string &job, TimePoint now);
    Outcome remove_pid(const std::string &job, pid_t pid, TimePoint now);  // job ends with its last pid
    Outcome set_cpus(const std::string &job, std::optional<CpuSet> pinned, TimePoint now);  // nullopt = auto
    Outcome set_policy(const std::string &name, TimePoint now);
    // The job's weight for the weighted policy (valid_weight in common/rules.hpp); replans when
    // it changes.
    Outcome set_weight(const std::string &job, double weight, TimePoint now);
    // The job keeps its cpus but runs `threads` threads (0 = one per cpu): 1..the cpus it holds
    // (or is pinned to). Publishes the same cpus with the new count (a new generation, acked
    // like any change); a later shrink below the count publishes fewer.
    // With holdings_checked the caller already checked the count against the cpus the job is
    // being given (a pin in the same request): only the range is checked here.
    Outcome check_threads(const std::string &job, int threads, bool holdings_checked = false) const;
    Outcome set_threads(const std::string &job, int threads, TimePoint now, bool holdings_checked = false);
    // Allows (or stops allowing) the job's processes to take signal requests (Job::signal_control):
    // publishes the same cpus and thread count with the new flag (a new generation, acked like any
    // change). Refused only for an unknown job.
    Outcome set_signal_control(const std::string &job, bool on, TimePoint now);
    // Takes cpus out of the lending pool (a Slurm job prolog: Slurm gave them to a job). With an
    // owner ("slurm-<jobid>") they stay reserved for that owner: when a job of that name registers
    // with them as guaranteed cpus, they come back into the pool as its own.
    Outcome reclaim(const CpuSet &cpus, TimePoint now, const std::string &owner = "");
    Outcome release(const CpuSet &cpus, TimePoint now);
    // Releases everything reserved for owner and ends the job of that name if it is still
    // registered (a job epilog). Unknown owners are fine (returns the empty set released).
    Outcome release_owner(const std::string &owner, TimePoint now, CpuSet *released);
    // A further task of a registered job joins it (same uid): its pids are added.
    Outcome add_pids(const std::string &job, uid_t uid, const std::vector<pid_t> &pids,
                     TimePoint now);

    // --- processes of a job ---
    Outcome attach(const std::string &job, uint64_t attach_id);
    void detach(const std::string &job, uint64_t attach_id, TimePoint now);
    void ack(const std::string &job, uint64_t attach_id, uint64_t generation, TimePoint now);
    // Progress totals since the reporting process attached; `now` dates them for rate samples.
    void progress(const std::string &job, uint64_t work_units, uint64_t steps, TimePoint now);
    // A sample of the job's cpu time (cpu_usage.cpp): `counter` is its running total
    // (Effects::cpu_time). Once kMinCpuWindow has passed since the window's start, its
    // growth joins Job::cpu_seconds and Job::cpu_busy becomes busy_fraction(growth, the core-seconds
    // the job held meanwhile), and a new window starts. The first sample (or one whose counter
    // went back) only starts a window. Unknown jobs are ignored. `kind`: see CpuSampleKind.
    void record_cpu_time(const std::string &job, double counter, TimePoint now,
                         CpuSampleKind kind = CpuSampleKind::Regular);
    // Samples every job's cpu time (Effects::cpu_time) into record_cpu_time.
    void sample_cpu_times(TimePoint now);
    // One job's sample (`kind` Regular or Last; an incomplete sample is Incomplete).
    void sample_cpu_time(const std::string &job, TimePoint now, CpuSampleKind kind = CpuSampleKind::Regular);
    // The job uses only cpus_used of its cpus (0 = all): see Job::usage_cap. Never infeasible (the
    // job's min is unchanged); replans when the planned max changes. Coalesced: within
    // kUsageInterval of the last change it is only noted, and tick() applies the latest one.
    Outcome set_usage(const std::string &job, int cpus_used, TimePoint now);

    // --- time ---
    // Under the throughput policy replans every kRateReplan; then ends the transitions whose acks
    // came or whose ack timeout passed, and advances every job.
    void tick(TimePoint now);
    std::optional<TimePoint> next_deadline() const;

    // --- queries ---
    const Job *find(const std::string &job) const;
    const std::map<std::string, Job> &jobs() const { return jobs_; }
    // Some job's cpuset or published set meets cpus (the job named `except` does not count).
    bool holds_any(const CpuSet &cpus, const std::string &except = "") const;
    bool steady(const std::string &job) const;   // the job exists and Job::steady()
    // A process is in one job only: the refusal when pid is a pid of a job other than `job` ("":
    // of any job). malld's Register checks each pid with it; add_pids uses it too.
    std::optional<Outcome> pid_in_other_job(pid_t pid, const std::string &job) const;
    const CpuSet &pool() const { return pool_; }            // configured pool
    const Topology &topology() const { return topology_; }  // what the node is made of
    // The pool the policy divides: the configured pool minus reclaimed cpus, plus the reserved
    // cpus of registered owners that are their guaranteed cpus.
    CpuSet available_pool() const;
    const CpuSet &reclaimed() const { return reclaimed_; }
    const std::map<std::string, CpuSet> &reserved() const { return reserved_; }
    PolicyKind policy() const { return policy_; }
    CpuSet free_cpus() const;                    // available pool not held by any job
    // The object `mallctl status --json` prints. With `now`, the accounting figures (core-seconds,
    // lent core-seconds, oversubscribed seconds) run up to it; without, up to the last change.
    nlohmann::json status(std::optional<TimePoint> now = std::nullopt) const;
    // A job's accounting as of `now` (not stored).
    JobAccount accounting(const Job &job, TimePoint now) const;
    const NodeTotals &totals() const { return totals_; }
    // Brings the job's accounting integrals up to `now` (before its published cpus change, and on
    // a copy malld saves, so the state file holds them as of the save).
    static void account(Job &job, TimePoint now);
    void set_totals(const NodeTotals &totals) { totals_ = totals; }  // restart
    // A reclaim request was answered after `seconds` (timed_out: its cpus were still held).
    void record_reclaim(double seconds, bool timed_out);
    // A saved job malld does not take back at a restart (its processes ended while malld was
    // down, or it cannot be re-adopted): its figures up to its saved accounted_until join the
    // totals and its "end" event (with `reason`) is reported, so the node's counters never go back.
    void close_saved_job(const Job &job, const char *reason);

    // --- restart: re-adopt a job exactly as it was (no effects are issued) ---
    Outcome adopt(const Job &job);
    void set_reclaimed(const CpuSet &cpus, std::map<std::string, CpuSet> reserved = {}) {
        reclaimed_ = cpus;
        reserved_ = std::move(reserved);
    }

private:
    void replan(TimePoint now);   // recompute targets with the policy, then advance
    void apply_usage(const std::string &job, Job &self, int cpus_used, TimePoint now);
    void apply_due_usage(TimePoint now);  // the coalesced Usage changes whose time has come
    // Removes a job, adds its accounting to the node's totals, reports its end ("deregistered",
    // "exited", "released", with its accounting) and its removal; the caller replans.
    void end_job(const std::string &job, const char *reason, TimePoint now);
    // Once its processes acked the current generation (or left): what they run is what the page
    // says (acked_threads), and an oversubscription ends.
    static void caught_up(Job &job, TimePoint now);
    // Adds an ended job's accounting up to `until` to the totals and reports its "end" event.
    void close_accounts(const Job &job, const char *reason, TimePoint until);
    void advance(TimePoint now);  // move every job toward its target as far as the protocol allows
    void finish_transition(Job &job, TimePoint now, bool timed_out);
    void publish_step(Job &job, const CpuSet &next, TimePoint now);  // the next generation: next, with its thread count and flag
    CpuSet held_by_others(const std::string &job) const;
    // The policy's targets for the current state (`now` decides which jobs are in their dwell).
    std::map<std::string, CpuSet> plan(TimePoint now) const;
    // Whether every job can reach `targets` through steps that never publish an empty set nor
    // let two jobs hold a cpu at once; names a job that would be stuck otherwise.
    bool reachable(const std::map<std::string, CpuSet> &targets, std::string *stuck) const;
    // Plans with the current state and checks that every job gets at least its min and can reach
    // its target; on failure the words start with `change` ("registering job x", ...). Requests
    // apply their change tentatively, call this, and undo the change when it fails.
    Outcome feasible(const std::string &change, TimePoint now) const;
    void enforce(Job &job, const CpuSet &cpus, bool growing, TimePoint now);
    // {"event": name}, with "time" when Effects::event_time() gives one.
    nlohmann::json make_event(const char *name);

    const Topology &topology_;
    CpuSet pool_;
    CpuSet reclaimed_;                          // every reclaimed cpu, reserved or not
    std::map<std::string, CpuSet> reserved_;    // owner -> reclaimed cpus reserved for it
    PolicyKind policy_;
    std::chrono::milliseconds ack_timeout_;
    Effects &effects_;
    std::map<std::string, Job> jobs_;
    std::map<std::string, CpuSet> targets_;
    uint64_t next_order_ = 1;
    std::optional<TimePoint> next_rate_replan_;  // throughput policy: the next periodic replan
    NodeTotals totals_;
};

// Throughput policy timing: samples shorter than kMinRateWindow are not taken; a job whose cpus
// changed less than kDwell ago is neither shrunk nor probed, unless some job holds nothing yet (a
// newcomer gets its share at once); the plan is recomputed every kRateReplan.
inline constexpr std::chrono::milliseconds kMinRateWindow{400};
inline constexpr std::chrono::seconds kDwell{6};
inline constexpr std::chrono::seconds kRateReplan{2};
// A job's Usage changes take effect at most once per kUsageInterval (Job::usage_wanted).
inline constexpr std::chrono::seconds kUsageInterval{1};
inline constexpr size_t kMaxRateSamples = 64;
// malld samples every job's cpu time this often; a window shorter than kMinCpuWindow is not
// measured (the counters' tick granularity would dominate it).
inline constexpr std::chrono::seconds kCpuSampleInterval{2};
inline constexpr std::chrono::milliseconds kMinCpuWindow{1000};
// The busy fraction of a window: the cpu seconds the job ran over the core-seconds it held (its
// published cpus times the time, so a change of allocation within the window is weighed by how
// long each lasted). None when it held no cpus. Not capped: above 1 means the job ran on more
// cpus than it was published (a shrink past its ack timeout, or counters' tick granularity).
std::optional<double> busy_fraction(double cpu_seconds, double core_seconds);
// A failed narrowing (the cgroup still lets the job run on the wider set) is written again after this.
inline constexpr std::chrono::seconds kEnforceRetry{1};

}  // namespace mall
