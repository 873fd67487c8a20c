// SPDX-License-Identifier: BSD-3-Clause
// handlers.cpp — see handlers.hpp. Handlers validate every field before they change anything;
// a refusal from the core (an Outcome) goes back to the client with its code and words.
#include "handlers.hpp"

#include <algorithm>
#include <map>
#include <set>

#include "access.hpp"
#include "log.hpp"
#include "procfs.hpp"
#include "slurm_reconcile.hpp"
#include "systemd_slice.hpp"

namespace mall {

namespace {

// How much longer than the ack timeout a deferred reply may wait: the transition it waits for
// may need one ack timeout after the request, plus a loop turn or two.
constexpr auto kDeferredReplySlack = std::chrono::seconds(5);

}  // namespace

RequestHandlers::RequestHandlers(std::chrono::milliseconds ack_timeout, const CpuSet &pool,
                                 NodeManager &manager, Connections &connections, KernelEffects &effects,
                                 PidWatcher &pids, CpusetBackend &backend, SlurmReconciler *slurm)
    : ack_timeout_(ack_timeout),
      pool_(pool),
      manager_(manager),
      connections_(connections),
      effects_(effects),
      pids_(pids),
      backend_(backend),
      slurm_(slurm) {
    // Watch: each watcher gets only what it may see of each event (status_view.hpp).
    connections_.set_event_view(
        [this](const Connection &c, const nlohmann::json &event) { return event_for_watcher(c, event); });
}

RequestHandlers::~RequestHandlers() { connections_.set_event_view(nullptr); }

StatusViewer RequestHandlers::viewer_of(const Connection &c) const {
    return StatusViewer{c.peer.uid, c.admin};  // taken at accept (AccessRules::is_admin)
}

std::optional<nlohmann::json> RequestHandlers::event_for_watcher(const Connection &c,
                                                                 const nlohmann::json &event) const {
    const StatusViewer viewer = viewer_of(c);
    std::optional<uid_t> owner;
    if (!viewer.admin && event.is_object())
        if (auto job = event.find("job"); job != event.end() && job->is_string())
            if (const Job *j = manager_.find(job->get<std::string>())) owner = j->spec.uid;
    return event_seen_by(event, viewer, owner);
}

std::chrono::milliseconds RequestHandlers::reply_wait() const {
    return ack_timeout_ + std::chrono::duration_cast<std::chrono::milliseconds>(kDeferredReplySlack);
}

TimePoint RequestHandlers::reply_deadline() const { return Clock::now() + reply_wait(); }

void RequestHandlers::handle_register(Connection &c, const proto::Message &msg) {
    const nlohmann::json &body = msg.body;
    JobSpec spec;
    spec.id = proto::get_string(body, "job");
    if (auto bad = proto::invalid_job_name(spec.id)) throw proto::ProtocolError("bad job name: " + *bad);
    // self-<pid> is malld's own name for self-registered jobs; slurm-<jobid> is root's (the plugin).
    const JobNamer namer = c.peer.uid == 0 ? JobNamer::Root : JobNamer::Other;
    if (std::string reserved = reserved_job_name_problem(spec.id, namer); !reserved.empty())
        throw proto::ProtocolError(reserved + ": choose another name");
    spec.uid = static_cast<uid_t>(proto::get_int(body, "uid", 0, proto::kMaxUid));
    spec.min = static_cast<int>(proto::get_int(body, "min", 0, CpuSet::kMaxCpus));
    spec.max = static_cast<int>(proto::get_int(body, "max", 1, CpuSet::kMaxCpus));
    CgroupMode cgroup_mode = CgroupMode::Auto;
    if (auto mode = proto::get_optional_string(body, "cgroup")) {
        auto parsed = parse_cgroup_mode(*mode);
        if (!parsed)
            throw proto::ProtocolError("field \"cgroup\" is '" + *mode +
                                       "': use auto, own, in-place, container or container-systemd");
        cgroup_mode = *parsed;
    }
    // A container job: "cgroup": "container" (malld makes the folder the engine puts the
    // container in), or "container": true with a container's own cgroup (an OCI hook registering
    // the container's init in place). Its processes are found in its cgroups.
    auto container = body.find("container");
    if (container != body.end() && !container->is_boolean())
        throw proto::ProtocolError("field \"container\" must be true or false");
    spec.container = is_container_mode(cgroup_mode) || (container != body.end() && container->get<bool>());
    auto pids = body.find("pids");
    if (pids == body.end() || !pids->is_array() || (pids->empty() && !spec.container))
        throw proto::ProtocolError("field \"pids\" must be a non-empty array of process ids");
    for (const auto &p : *pids) {
        if (!p.is_number_integer() || p.get<int64_t>() <= 0 || p.get<int64_t>() > proto::kMaxPid)
            throw proto::ProtocolError("field \"pids\" must hold positive process ids, got " + p.dump());
        pid_t pid = static_cast<pid_t>(p.get<int64_t>());
        if (std::find(spec.pids.begin(), spec.pids.end(), pid) == spec.pids.end()) spec.pids.push_back(pid);
    }
    if (auto g = proto::get_optional_string(body, "guaranteed")) {
        std::string why;
        auto set = CpuSet::parse(*g, &why);
        if (!set) throw proto::ProtocolError("field \"guaranteed\": " + why);
        spec.guaranteed = *set;
    }
    if (auto w = body.find("weight"); w != body.end()) {
        if (!w->is_number()) throw proto::ProtocolError("field \"weight\" must be a number");
        spec.weight = w->get<double>();
    }
    // "join": a further task of a job already registered on this node (several Slurm tasks of one
    // job share its allocation) adds its pids instead of being refused as a duplicate. The job
    // stays what it was registered as: a joiner's "container" says nothing (authorize() checked
    // the pids against the existing job's flag too).
    auto join = body.find("join");
    if (join != body.end() && !join->is_boolean()) throw proto::ProtocolError("field \"join\" must be true or false");
    const Job *existing = manager_.find(spec.id);
    const bool joining = join != body.end() && join->get<bool>() && existing != nullptr;
    if (joining) spec.container = existing->spec.container;
    if (spec.container && backend_.kind() == BackendKind::Affinity) {
        const std::string why = "job " + spec.id + " is a container job, which needs malld's cgroup "
                                "backend (the container engine puts the container in the job's "
                                "cgroup); this malld runs --backend affinity: start it with "
                                "--backend auto, cgroup-v1 or cgroup-v2 as root";
        log_warn("refused to register job " + spec.id + ": " + why);
        connections_.reply_error(c, msg.request_id, MALL_ERR_DENIED, why);
        return;
    }
    if (is_container_mode(cgroup_mode) && joining)
        throw proto::ProtocolError("a container job cannot be joined: register each container as its own job");
    std::map<pid_t, unsigned long long> starts;
    for (pid_t pid : spec.pids) {
        auto start = process_start_time(pid);
        if (!process_alive(pid) || !start) {
            connections_.reply_error(c, msg.request_id, MALL_ERR_INVAL,
                        "pid " + std::to_string(pid) + " is not a running process");
            return;
        }
        starts[pid] = *start;
        if (auto refusal = manager_.pid_in_other_job(pid, "")) {  // any job, its own included
            connections_.reply_error(c, msg.request_id, refusal->code, refusal->error);
            return;
        }
    }
    // Where the pids live decides where malld enforces them (in place, or its own folder): a
    // cgroup malld may not write refuses the registration here, before anything changed, and the
    // launcher runs the job non-malleable with the words.
    std::string cgroup_error;
    // A cgroup outside malld's cgroup namespace (malld runs in one, the process above its root)
    // has no path malld can join to its mount: neither moved nor resized, the process would hold
    // the job's cpus unconfined. Refused, except for a container job, whose registered pid (the
    // engine's client) is never moved nor resized; the affinity backend uses no cgroup.
    if (backend_.kind() != BackendKind::Affinity && !is_container_mode(cgroup_mode))
        for (pid_t pid : spec.pids) {
            const CgroupReading cgroup = read_process_cgroup(pid, backend_.kind() == BackendKind::CgroupV2);
            if (cgroup.kind != CgroupReading::Kind::NotPlain) continue;
            const std::string p = std::to_string(pid);
            cgroup_error = "pid " + p + "'s cgroup path as malld sees it is outside malld's cgroup namespace (" +
                           cgroup.path + " in /proc/" + p + "/cgroup), so malld can neither move nor resize "
                           "it; run malld in the host's cgroup namespace (or register only processes "
                           "inside malld's)";
            break;
        }
    if (cgroup_error.empty() && cgroup_mode == CgroupMode::ContainerSystemd && !systemd_slice::job_slice_name(spec.id))
        cgroup_error = "job name '" + spec.id + "' is too long for a systemd slice name once escaped ('-' "
                       "and ':' take 4 characters each, 244 at most): use a shorter name";
    if (!cgroup_error.empty() || !backend_.check_pids(spec.pids, cgroup_mode, &cgroup_error)) {
        log_warn("refused to register job " + spec.id + ": " + cgroup_error);
        connections_.reply_error(c, msg.request_id, MALL_ERR_DENIED, cgroup_error);
        return;
    }
    const bool new_job = manager_.find(spec.id) == nullptr;
    if (new_job) backend_.set_mode(spec.id, cgroup_mode);
    Outcome outcome = joining ? manager_.add_pids(spec.id, spec.uid, spec.pids, Clock::now())
                              : manager_.register_job(spec, Clock::now());
    if (!outcome.ok) {
        if (new_job && !manager_.find(spec.id)) backend_.remove(spec.id);
        connections_.reply_error(c, msg.request_id, outcome.code, outcome.error);
        return;
    }
    // The start times read above, before anything else could reuse those pids.
    for (auto &[pid, start] : starts) pids_.remember_start(pid, start);
    if (auto slurm_id = slurm_job_id_of(spec.id); slurm_ && slurm_id) {
        slurm_->check_registered(*slurm_id, Clock::now());
        // The plugin says where this node stands in a multi-node job (its turn at the job's end).
        // Read after the registration succeeded, so only a hint: a bad value is ignored, never an
        // error (the job is registered already).
        auto hint = [&](const char *field) -> std::optional<uint32_t> {
            const auto it = msg.body.find(field);
            if (it == msg.body.end() || !it->is_number_unsigned() || it->get<uint64_t>() > kMaxSlurmNodes)
                return std::nullopt;
            return static_cast<uint32_t>(it->get<uint64_t>());
        };
        const auto index = hint("slurm_node_index");
        const auto nodes = hint("slurm_nodes");
        if (index && nodes) slurm_->remember_node_index(*slurm_id, *index, *nodes);
    }
    std::string error;
    if (!backend_.add_pids(spec.id, spec.pids, &error)) log_warn("job " + spec.id + ": " + error);
    pids_.sync(manager_);
    // The reply waits until the job holds cpus, so a launcher can start its task on them.
    PendingReply pending{PendingReply::Kind::Register, c.id, msg.request_id, spec.id, {},
                         reply_deadline()};
    pending_.push_back(std::move(pending));
}

void RequestHandlers::handle_deregister(Connection &c, const proto::Message &msg) {
    const std::string job = proto::get_string(msg.body, "job");
    // Checked before the name is echoed back (every registered job has a valid name).
    if (auto bad = proto::invalid_job_name(job)) throw proto::ProtocolError("bad job name: " + *bad);
    auto pid = proto::get_optional_int(msg.body, "pid", 1, proto::kMaxPid);
    Outcome outcome = pid ? manager_.remove_pid(job, static_cast<pid_t>(*pid), Clock::now())
                          : manager_.deregister_job(job, Clock::now());
    nlohmann::json fields{{"job", job}};
    if (pid) fields["pid"] = *pid;
    // The job's end (now, or when its last process exited just before) is being recorded in
    // Slurm: the answer waits for it, at most kAnnotationWait, so the task-exit of Slurm's step
    // cannot complete the job before the update reaches slurmctld.
    if (auto slurm_id = slurm_job_id_of(job); slurm_ && slurm_id && slurm_->annotating(*slurm_id)) {
        PendingReply pending{PendingReply::Kind::Deregister, c.id, msg.request_id, job, {},
                             Clock::now() + kAnnotationWait};
        if (outcome.ok) {
            pending.answer = std::move(fields);
        } else {
            pending.error_code = outcome.code;
            pending.error = outcome.error;
        }
        pending_.push_back(std::move(pending));
        return;
    }
    if (!outcome.ok) {
        connections_.reply_error(c, msg.request_id, outcome.code, outcome.error);
        return;
    }
    connections_.reply(c, msg.request_id, proto::ok_reply(fields));
}

void RequestHandlers::handle_attach(Connection &c, const proto::Message &msg) {
    const TimePoint now = Clock::now();
    // Every refusal is logged with the peer's uid and pid (may_log_refusal: a budget per user,
    // one for all users and one for admins, so reconnecting does not buy more lines).
    auto refuse = [&](int code, const std::string &text) {
        if (may_log_refusal(c))
            log_warn("refused Attach from uid " + std::to_string(c.peer.uid) + " pid " +
                     std::to_string(c.peer.pid) + ": " + log_text(text));
        connections_.reply_error(c, msg.request_id, code, text);
    };
    std::string job;
    auto field = msg.body.find("job");
    const bool named = field != msg.body.end() && !field->is_null();
    // Membership by cgroup: a process in a container job's cgroups (an OCI hook's container, whose
    // processes know only MALL_SOCKET) belongs to that job.
    const auto by_cgroup = named ? std::nullopt : container_job_of(manager_, backend_, c.peer.pid);
    if (by_cgroup) {
        job = *by_cgroup;
    } else if (!named) {
        // Self-registration (authorize() checked --allow-self-register): within the pool's size.
        const int pool_size = std::max(1, manager_.available_pool().count());
        int64_t min = proto::get_optional_int(msg.body, "min", 1, CpuSet::kMaxCpus).value_or(1);
        int64_t max = proto::get_optional_int(msg.body, "max", 1, CpuSet::kMaxCpus).value_or(pool_size);
        if (min > max)
            throw proto::ProtocolError("min (" + std::to_string(min) + ") is larger than max (" +
                                       std::to_string(max) + ")");
        max = std::min<int64_t>(max, pool_size);
        min = std::min<int64_t>(min, max);
        // A job's process, by descent or by cgroup (a daemon started inside a Slurm step left the
        // step's process tree but not its cgroup): it has a job already.
        for (const auto &[name, other] : manager_.jobs()) {
            if (in_process_tree(c.peer.pid, other.spec.pids) || backend_.in_job_cgroups(name, c.peer.pid)) {
                refuse(MALL_ERR_INVAL,
                            "process " + std::to_string(c.peer.pid) + " belongs to job " + name +
                                "; attach to it with MALL_JOB_ID=" + name);
                return;
            }
        }
        // Only in a cgroup delegated to the peer's uid, resized where it is (never moved out of it).
        std::string not_delegated;
        if (!backend_.check_self_registration(c.peer.pid, c.peer.uid, &not_delegated)) {
            refuse(MALL_ERR_DENIED, not_delegated);
            return;
        }
        auto start = process_start_time(c.peer.pid);
        if (!start) {
            refuse(MALL_ERR_SYSTEM,
                        "cannot read /proc/" + std::to_string(c.peer.pid) + "/stat");
            return;
        }
        JobSpec spec;
        spec.id = kSelfJobPrefix + std::to_string(c.peer.pid);
        spec.uid = c.peer.uid;
        spec.min = static_cast<int>(min);
        spec.max = static_cast<int>(max);
        spec.pids = {c.peer.pid};
        const bool new_job = manager_.find(spec.id) == nullptr;
        if (new_job) backend_.set_self_registered(spec.id);
        Outcome outcome = manager_.register_job(spec, now);
        if (!outcome.ok) {
            if (new_job && !manager_.find(spec.id)) backend_.remove(spec.id);
            refuse(outcome.code, outcome.error);
            return;
        }
        std::string cgroup_error;
        if (!backend_.add_pids(spec.id, spec.pids, &cgroup_error)) log_warn("job " + spec.id + ": " + cgroup_error);
        pids_.remember_start(c.peer.pid, *start);
        pids_.sync(manager_);
        job = spec.id;
        log_info("self-registered job " + job + " for uid " + std::to_string(c.peer.uid) +
                 " (min " + std::to_string(min) + ", max " + std::to_string(max) + ")");
    } else {
        job = field->get<std::string>();
    }
    std::string error;
    KernelEffects::JobPage *page = effects_.ensure_page(job, &error);
    if (!page) {
        refuse(MALL_ERR_SYSTEM, error);
        return;
    }
    const uint64_t attach_id = next_attach_id_++;
    Outcome outcome = manager_.attach(job, attach_id);
    if (!outcome.ok) {
        refuse(outcome.code, outcome.error);
        return;
    }
    c.job = job;
    c.attach_id = attach_id;
    const Job *j = manager_.find(job);
    if (j && page->page->generation.load(std::memory_order_relaxed) != j->generation && j->generation > 0)
        effects_.write_page(*page, j->generation, j->published, j->published_threads, j->published_signal_control);
    log_info("process " + std::to_string(c.peer.pid) + " (uid " + std::to_string(c.peer.uid) +
             ") attached to job " + job);
    connections_.reply(c, msg.request_id,
          proto::ok_reply({{"job", job}, {"generation", j ? j->generation : 0}}),
          page->memfd.get());
}

void RequestHandlers::handle_ack(Connection &c, const proto::Message &msg) {
    manager_.ack(c.job, c.attach_id, proto::get_uint(msg.body, "generation"), Clock::now());
}

void RequestHandlers::handle_progress(Connection &c, const proto::Message &msg) {
    manager_.progress(c.job, proto::get_uint(msg.body, "work_units"),
                       proto::get_uint(msg.body, "steps"), Clock::now());
}

void RequestHandlers::handle_usage(Connection &c, const proto::Message &msg) {
    const uint64_t cpus_used = proto::get_uint(msg.body, "cpus_used");
    if (cpus_used > static_cast<uint64_t>(CpuSet::kMaxCpus)) {
        throw proto::ProtocolError("field \"cpus_used\" is " + std::to_string(cpus_used) +
                                   ", more than " + std::to_string(CpuSet::kMaxCpus));
    }
    Outcome outcome = manager_.set_usage(c.job, static_cast<int>(cpus_used), Clock::now());
    if (!outcome.ok) throw proto::ProtocolError(outcome.error);
}

void RequestHandlers::handle_status(Connection &c, const proto::Message &msg) {
    // Admins see every job in full, others their own jobs and a summary of the rest.
    connections_.reply(c, msg.request_id, proto::ok_reply(status_seen_by(full_status(), viewer_of(c))));
}

void RequestHandlers::handle_set(Connection &c, const proto::Message &msg) {
    const std::string job = proto::get_string(msg.body, "job");
    // Checked before the name is echoed back (every registered job has a valid name).
    if (auto bad = proto::invalid_job_name(job)) throw proto::ProtocolError("bad job name: " + *bad);
    const bool has_cpus = msg.body.contains("cpus"), has_weight = msg.body.contains("weight"),
               has_threads = msg.body.contains("threads"), has_signal_control = msg.body.contains("signal_control");
    if (!has_cpus && !has_weight && !has_threads && !has_signal_control)
        throw proto::ProtocolError(
            "give field \"cpus\", \"weight\", \"threads\" or \"signal_control\" (one or more)");
    std::optional<CpuSet> pinned;
    if (has_cpus) {
        const std::string text = proto::get_string(msg.body, "cpus");
        if (text != "auto") {
            std::string why;
            pinned = CpuSet::parse(text, &why);
            if (!pinned) throw proto::ProtocolError("field \"cpus\": " + why + " (or \"auto\")");
            if (pinned->empty()) throw proto::ProtocolError("field \"cpus\" is empty; give cpus or \"auto\"");
        }
    }
    double weight = 0;
    if (has_weight) {
        const auto &w = msg.body["weight"];
        if (!w.is_number() || !proto::valid_weight(w.get<double>()))
            throw proto::ProtocolError(std::string("field \"weight\" must be ") + proto::kWeightRule);
        weight = w.get<double>();
    }
    int threads = 0;  // 0 = auto: one per cpu
    if (has_threads) {
        const auto &t = msg.body["threads"];
        if (t.is_string() && t.get<std::string>() == "auto") {
            threads = 0;
        } else if (t.is_number_integer() && t.get<int64_t>() >= 1 && t.get<int64_t>() <= CpuSet::kMaxCpus) {
            threads = static_cast<int>(t.get<int64_t>());
        } else {
            throw proto::ProtocolError("field \"threads\" must be 1 to " + std::to_string(CpuSet::kMaxCpus) +
                                       " or \"auto\"");
        }
        // Checked before anything changes: against what the job holds, or with a pin in the same
        // request against the pin; with --cpus auto against the job's max (the policy decides its
        // cpus, and a count at or above them means one thread per cpu).
        Outcome outcome = manager_.check_threads(job, threads, has_cpus);
        if (!outcome.ok) return connections_.reply_error(c, msg.request_id, outcome.code, outcome.error);
        if (threads > 0 && pinned && threads > pinned->count()) {
            return connections_.reply_error(c, msg.request_id, MALL_ERR_INVAL,
                                            "threads " + std::to_string(threads) + " exceed the " +
                                                std::to_string(pinned->count()) + " cpus given (" +
                                                pinned->to_string() + ")");
        }
    }
    bool signal_control = false;
    if (has_signal_control) {
        const auto &s = msg.body["signal_control"];
        if (!s.is_boolean()) throw proto::ProtocolError("field \"signal_control\" must be true or false");
        signal_control = s.get<bool>();
    }
    // The weight is valid (checked above), so once the pin is accepted the weight can only be
    // refused for an unknown job, which the pin would have refused first: a refusal changes nothing.
    // The same holds for the thread count (checked above) and the signal-control flag (any bool).
    if (has_cpus) {
        Outcome outcome = manager_.set_cpus(job, pinned, Clock::now());
        if (!outcome.ok) return connections_.reply_error(c, msg.request_id, outcome.code, outcome.error);
    }
    if (has_weight) {
        Outcome outcome = manager_.set_weight(job, weight, Clock::now());
        if (!outcome.ok) return connections_.reply_error(c, msg.request_id, outcome.code, outcome.error);
    }
    if (has_threads) {
        // Checked above, so it is accepted: a refusal changes nothing.
        Outcome outcome = manager_.set_threads(job, threads, Clock::now(), has_cpus);
        if (!outcome.ok) return connections_.reply_error(c, msg.request_id, outcome.code, outcome.error);
    }
    if (has_signal_control) {
        // Refused only for an unknown job, which a field before it would have refused first.
        Outcome outcome = manager_.set_signal_control(job, signal_control, Clock::now());
        if (!outcome.ok) return connections_.reply_error(c, msg.request_id, outcome.code, outcome.error);
    }
    nlohmann::json result{{"job", job}};
    if (has_cpus) result["cpus"] = pinned ? pinned->to_string() : "auto";
    if (const Job *j = manager_.find(job); j && has_threads)
        result["threads"] = j->threads > 0 ? nlohmann::json(j->threads) : nlohmann::json("auto");
    if (const Job *j = manager_.find(job); j && has_signal_control) result["signal_control"] = j->signal_control;
    if (const Job *j = manager_.find(job)) result["weight"] = j->spec.weight;
    connections_.reply(c, msg.request_id, proto::ok_reply(result));
}

void RequestHandlers::handle_policy(Connection &c, const proto::Message &msg) {
    const std::string name = proto::get_string(msg.body, "name");
    Outcome outcome = manager_.set_policy(name, Clock::now());
    if (!outcome.ok) {
        connections_.reply_error(c, msg.request_id, outcome.code, outcome.error);
        return;
    }
    connections_.reply(c, msg.request_id, proto::ok_reply({{"policy", policy_name(manager_.policy())}}));
}

void RequestHandlers::handle_watch(Connection &c, const proto::Message &msg) {
    // Watchers are never closed as idle: an ordinary user holds at most kMaxWatchersPerUid.
    if (std::string why; !connections_.may_watch(c, &why)) {
        connections_.reply_error(c, msg.request_id, MALL_ERR_DENIED, why);
        return;
    }
    // From now on c gets the events it may see (event_for_watcher, at each broadcast).
    c.watcher = true;
    connections_.reply(c, msg.request_id, proto::ok_reply());
}

void RequestHandlers::process_pending(TimePoint now) {
    std::vector<PendingReply> still;
    for (auto &p : pending_) {
        Connection *asker = connections_.find(p.connection);
        const bool asker_left = !asker || asker->closing;
        if (p.kind == PendingReply::Kind::Reclaim) {
            // Goes on when its asker left (a prolog killed at its timeout): the cpus are freed all
            // the same, and the node's reclaim figures count it.
            if (!finish_reclaim(p, asker_left ? nullptr : asker, now)) still.push_back(std::move(p));
            continue;
        }
        if (asker_left) continue;
        Connection &c = *asker;
        const auto waited_ms = std::to_string(reply_wait().count());
        if (p.kind == PendingReply::Kind::Deregister) {
            const auto slurm_id = slurm_job_id_of(p.job);
            if (slurm_ && slurm_id && slurm_->annotating(*slurm_id) && now < p.deadline) {
                still.push_back(std::move(p));
            } else if (p.error_code != 0) {
                connections_.reply_error(c, p.request_id, p.error_code, p.error);
            } else {
                connections_.reply(c, p.request_id, proto::ok_reply(p.answer));
            }
        } else if (p.kind == PendingReply::Kind::Record) {
            if (now >= p.deadline) {
                connections_.reply_error(c, p.request_id, MALL_ERR_SYSTEM,
                            "slurmctld did not take " + p.job + "'s figures within " +
                                std::to_string(kRecordWait.count()) + " s; the update stays queued and "
                                "reaches Slurm when slurmctld answers (is slurmctld up? see malld's log)");
            } else {
                still.push_back(std::move(p));
            }
        } else if (p.kind == PendingReply::Kind::LookUp) {
            if (now >= p.deadline) {
                connections_.reply_error(c, p.request_id, MALL_ERR_SYSTEM,
                            "Slurm did not say which cpus " + p.job + " has on this node within " +
                                waited_ms + " ms; nothing was reclaimed (is slurmctld up?)");
            } else {
                still.push_back(std::move(p));
            }
        } else if (p.kind == PendingReply::Kind::Register) {
            const Job *job = manager_.find(p.job);
            if (!job) {
                connections_.reply_error(c, p.request_id, MALL_ERR_NOJOB,
                            "job " + p.job + " ended before it was given cpus");
            } else if (manager_.steady(p.job)) {
                nlohmann::json reply = {{"job", p.job},
                                        {"cpus", job->published.to_string()},
                                        {"generation", job->generation}};
                // A container job: where the engine must create the container.
                if (std::string parent = backend_.engine_cgroup_parent(p.job); !parent.empty())
                    reply["cgroup_parent"] = parent;
                connections_.reply(c, p.request_id, proto::ok_reply(reply));
            } else if (now >= p.deadline) {
                connections_.reply_error(c, p.request_id, MALL_ERR_SYSTEM,
                            "job " + p.job + " is registered but was not given cpus within " +
                                waited_ms + " ms (the pool may be reclaimed or held by guaranteed "
                                "jobs); it will get cpus when some are free (see `mallctl status`)");
            } else {
                still.push_back(std::move(p));
            }
        }
    }
    pending_ = std::move(still);
}

std::optional<TimePoint> RequestHandlers::next_deadline() const {
    std::optional<TimePoint> next;
    for (const auto &p : pending_)
        if (!next || p.deadline < *next) next = p.deadline;
    return next;
}

std::set<uint64_t> RequestHandlers::connections_waiting() const {
    std::set<uint64_t> waiting;
    for (const auto &p : pending_) waiting.insert(p.connection);
    return waiting;
}

nlohmann::json RequestHandlers::full_status() const {
    nlohmann::json status = manager_.status(Clock::now());
    status["backend"] = backend_name(backend_.kind());
    status.update(status_extras_);
    if (status.contains("jobs") && status["jobs"].is_array()) {
        for (auto &j : status["jobs"]) {
            const std::string name = j.value("job", std::string());
            j["pids"] = effects_.pids_of(name);
            j["cgroup"] = backend_.cgroup_path(name);
            if (const Job *job = manager_.find(name); job && job->spec.container) j["container"] = true;
            // Every cgroup the job is enforced on: in place (made by its resource manager or
            // runtime, resized where it is) or malld's own folder.
            nlohmann::json cgroups = nlohmann::json::array();
            for (const JobCgroup &cg : backend_.cgroups_of(name))
                cgroups.push_back({{"path", cg.path}, {"in_place", cg.in_place}});
            j["cgroups"] = std::move(cgroups);
        }
    }
    return status;
}

}  // namespace mall
