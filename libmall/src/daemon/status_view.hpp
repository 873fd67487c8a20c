// SPDX-License-Identifier: BSD-3-Clause
// status_view.hpp — who sees what of malld's status and events (Status and Watch are open to
// every local user, and to containers that hold the socket). The rule, in one place:
//   - admins (root, malld's own uid, --admin-uid: AccessRules::is_admin) see everything;
//   - a job's owner (the peer's uid is the job's uid) sees its own jobs in full;
//   - everyone else sees the node: pool, free, reclaimed and reserved cpus, policy, backend, the
//     node's totals, and each other user's job only as its cpus and limits ("other_jobs":
//     [{"cpus", "ncpus", "min", "max"}]), without its name (mallrun names a job after its command),
//     uid, pids, cgroups, progress, rates or accounting. The status says which view it is:
//     "view": "all" (an admin's) or "own" (the peer's own jobs in full, others summarized).
// Events follow the same rule: an event about another user's job is dropped, except register,
// publish and end, which go out as {"event", "time", "other_job": true} (publish with its "cpus"
// and "ncpus"), so a watcher knows the node's division changed. Events about no job (policy,
// reclaim, release) go to everyone. Pure functions of their inputs (unit-tested).
#pragma once

#include <sys/types.h>

#include <optional>

#include <nlohmann/json.hpp>

namespace mall {

struct StatusViewer {
    uid_t uid = 0;       // the peer's uid (SO_PEERCRED)
    bool admin = false;  // AccessRules::is_admin(uid)
};

// What `viewer` may see of `full` (RequestHandlers::full_status(): every job with "uid").
nlohmann::json status_seen_by(const nlohmann::json &full, const StatusViewer &viewer);

// What `viewer` may see of `event`; none when it is not sent to that viewer. `job_owner` is the
// uid of the job the event names (its "uid" field wins when it has one); none when unknown (a job
// that is gone), which counts as another user's job.
std::optional<nlohmann::json> event_seen_by(const nlohmann::json &event, const StatusViewer &viewer,
                                            std::optional<uid_t> job_owner);

}  // namespace mall
