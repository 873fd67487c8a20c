// SPDX-License-Identifier: BSD-3-Clause
// handlers.hpp — what malld does for each request, once access.cpp has authorized it: decode the
// body's fields (a ProtocolError names the bad one and changes nothing), ask the core, reply.
// Register and Reclaim reply later (deferred replies): Register once the job holds cpus, Reclaim
// once no other job holds the cpus, a Reclaim without cpus once Slurm said which cpus the owner
// has here; each within the ack timeout plus a slack, after which the asker gets an error that
// says what is still pending. Record (a Slurm job's figures so far into its AdminComment) replies
// once slurmctld took the update, within kRecordWait. A deferred reply whose asker left is dropped.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../common/protocol.hpp"
#include "backend.hpp"
#include "connections.hpp"
#include "core/node_manager.hpp"
#include "kernel_effects.hpp"
#include "pid_watch.hpp"
#include "slurm_jobs.hpp"
#include "status_view.hpp"

namespace mall {

class SlurmReconciler;

class RequestHandlers {
public:
    // `slurm` is null unless malld runs with --slurm.
    RequestHandlers(std::chrono::milliseconds ack_timeout, const CpuSet &pool, NodeManager &manager,
                    Connections &connections, KernelEffects &effects, PidWatcher &pids,
                    CpusetBackend &backend, SlurmReconciler *slurm);
    ~RequestHandlers();
    RequestHandlers(const RequestHandlers &) = delete;
    RequestHandlers &operator=(const RequestHandlers &) = delete;

    // --- one per request type (access.cpp's table names them) ---
    void handle_register(Connection &c, const proto::Message &msg);
    void handle_deregister(Connection &c, const proto::Message &msg);
    void handle_attach(Connection &c, const proto::Message &msg);
    void handle_ack(Connection &c, const proto::Message &msg);
    void handle_progress(Connection &c, const proto::Message &msg);
    void handle_usage(Connection &c, const proto::Message &msg);
    void handle_status(Connection &c, const proto::Message &msg);
    void handle_set(Connection &c, const proto::Message &msg);
    void handle_policy(Connection &c, const proto::Message &msg);
    void handle_reclaim(Connection &c, const proto::Message &msg);
    void handle_release(Connection &c, const proto::Message &msg);
    void handle_watch(Connection &c, const proto::Message &msg);
    void handle_record(Connection &c, const proto::Message &msg);

    // --- deferred replies ---
    // Answers every deferred request whose condition holds or whose deadline passed.
    void process_pending(TimePoint now);
    std::optional<TimePoint> next_deadline() const;
    std::set<uint64_t> connections_waiting() const;  // connections a deferred reply is owed to
    // Reclaims waiting for Slurm's word on an owner's cpus become ordinary deferred reclaims once
    // Slurm has answered, or fail with its words.
    void resolve_lookups(const std::string &owner, const SlurmJobState &state);
    // Records waiting for their AdminComment update are answered with its outcome (--slurm).
    void resolve_annotations(const std::vector<SlurmAnnotation> &finished);

    // The status an admin sees (`mallctl status --json` as root): the core's status plus the
    // backend, and each job's pids and cgroup. Others see status_seen_by() of it (handle_status).
    nlohmann::json full_status() const;
    // Fields malld adds to every status (where its metrics and history files are).
    void set_status_extras(nlohmann::json extras) { status_extras_ = std::move(extras); }

private:
    struct PendingReply {
        // LookUp: a Reclaim for an owner without cpus, waiting for Slurm to say which (--slurm).
        // Deregister: the answer to a Slurm job's Deregister, held while malld records the ended
        // job's figures in Slurm (its AdminComment): Slurm's task-exit waits for it, so the job is
        // still running in slurmctld when the update arrives.
        // Record: an admin's request to record a Slurm job's figures so far, waiting for the
        // AdminComment update of `ticket` (0: for the update of the job's end being recorded).
        enum class Kind { Register, Reclaim, LookUp, Deregister, Record };
        PendingReply(Kind kind_, uint64_t connection_, uint32_t request_id_, std::string job_, CpuSet cpus_,
                     TimePoint deadline_)
            : kind(kind_), connection(connection_), request_id(request_id_), job(std::move(job_)),
              cpus(std::move(cpus_)), deadline(deadline_) {}
        Kind kind;
        uint64_t connection = 0;
        uint32_t request_id = 0;
        std::string job;  // Register: the job; Reclaim: the owner ("" when none)
        CpuSet cpus;
        TimePoint deadline;
        TimePoint started = Clock::now();  // a reclaim's duration counts from here (metrics)
        // Deregister: the answer to give (the ok fields, or error_code and the error's words).
        nlohmann::json answer = nlohmann::json::object();
        int error_code = 0;
        std::string error;
        uint64_t ticket = 0;  // Record: SlurmChecker::annotate's number for its update
    };
    // Answers a Record with the outcome of the AdminComment update it waited for.
    void answer_record(Connection &c, const PendingReply &p, const SlurmAnnotation &done);
    // A deferred reclaim ends when its cpus are free or its deadline passed: it is counted in the
    // node's reclaim figures and answered (when `asker` is not null). False: it waits on.
    bool finish_reclaim(const PendingReply &p, Connection *asker, TimePoint now);
    std::chrono::milliseconds reply_wait() const;  // how long a deferred reply may wait
    TimePoint reply_deadline() const;              // now + reply_wait()
    // The peer of `c` as status_view.hpp judges it (its uid, and whether it is an admin: the
    // connection's `admin`, taken at accept by AccessRules::is_admin).
    StatusViewer viewer_of(const Connection &c) const;
    // What watcher `c` may see of `event` (status_view.hpp); none: it is not sent to c.
    std::optional<nlohmann::json> event_for_watcher(const Connection &c, const nlohmann::json &event) const;

    std::chrono::milliseconds ack_timeout_;
    const CpuSet &pool_;
    NodeManager &manager_;
    Connections &connections_;
    KernelEffects &effects_;
    PidWatcher &pids_;
    CpusetBackend &backend_;
    SlurmReconciler *slurm_;
    uint64_t next_attach_id_ = 1;
    std::vector<PendingReply> pending_;
    nlohmann::json status_extras_ = nlohmann::json::object();
};

// How long a Record's answer waits for slurmctld to take the update (it waits behind an ended
// job's update and slurmctld's queries, and a multi-node job's update may try a few times).
inline constexpr std::chrono::seconds kRecordWait{10};

}  // namespace mall
