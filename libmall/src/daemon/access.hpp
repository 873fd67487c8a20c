// SPDX-License-Identifier: BSD-3-Clause
// access.hpp — malld's whole security surface, for a reviewer to read in one file: the request
// table (each message type, the role a peer needs to send it, and its handler), authorize() (the
// only place a request is allowed or refused), the checks on the peer process behind a connection,
// and serve_packet(), through which every packet passes: decode, look up, authorize, dispatch.
// Identities come from SO_PEERCRED and the peer's pidfd (kernel-verified), never from a message.
#pragma once

#include <sys/types.h>

#include <set>
#include <string>

#include "../common/protocol.hpp"
#include "backend.hpp"
#include "connections.hpp"
#include "core/node_manager.hpp"

namespace mall {

class RequestHandlers;

enum class Role { Any, Admin, Owner, Attached };

struct AccessRules {
    std::set<uid_t> admin_uids;        // besides root and malld's own euid (--admin-uid)
    bool allow_self_register = false;  // --allow-self-register
    bool is_admin(uid_t uid) const;
};

struct RequestRule {
    proto::Type type;
    Role role;
    void (RequestHandlers::*handler)(Connection &, const proto::Message &);
};

// The rule for a request type; null for types no client may send (replies, events).
const RequestRule *find_request_rule(proto::Type type);

// True when the connection's peer may send `msg` under `rule`; else false with a mall_rc code
// (*code) and words that say why and how to fix it (*why). `backend` answers whether a process
// lives in one of a job's cgroups (membership by cgroup, for processes that enter a job from the
// side: `podman exec`, another step).
bool authorize(const AccessRules &rules, const NodeManager &manager, const CpusetBackend &backend,
               const Connection &c, const RequestRule &rule, const proto::Message &msg, int *code,
               std::string *why);

// The container job (JobSpec::container) one of whose cgroups holds `pid`, if any: such a process
// belongs to that job whatever its uid (a container's users map to host uids of their own), and
// may attach without naming the job.
std::optional<std::string> container_job_of(const NodeManager &manager, const CpusetBackend &backend,
                                            pid_t pid);

// Refusals are logged with uid and pid, but at most 10 per 10 s per user (Connection::owner: a
// rootless container's subuids are one user; however often it reconnects) and 50 per 10 s for all
// ordinary users; a "suppressed N refusals from uid U" line counts the rest. Admins have a budget
// of their own (10 per 10 s each) that users cannot spend. A client looping on a refused request
// must not flood the log. True when this refusal may be logged.
bool may_log_refusal(Connection &c);

// One packet from a client: malformed packets and types no client may send close the connection
// (with an error reply); refused requests get an error reply and a log line; allowed ones go to
// their handler, whose ProtocolError or other exception becomes an error reply.
void serve_packet(Connection &c, const std::string &packet, const AccessRules &rules,
                  const NodeManager &manager, const CpusetBackend &backend, RequestHandlers &handlers,
                  Connections &connections);

}  // namespace mall
