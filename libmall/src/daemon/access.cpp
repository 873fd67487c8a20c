// SPDX-License-Identifier: BSD-3-Clause
// access.cpp — see access.hpp. Read top to bottom: the request table with its roles, the peer
// checks, authorize(), serve_packet(). A new request type is a line in the table and a handler.
#include "access.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "cgroup_tree.hpp"
#include "handlers.hpp"
#include "log.hpp"
#include "procfs.hpp"

namespace mall {

namespace {

// Refusals a user can cause at will are logged at most kRefusalLinesPerUser per kRefusalPeriod per
// user (Connection::owner: a uid, or the user namespace all of a rootless container's subuids share;
// however often it reconnects), and at most kRefusalLinesAll per period for all ordinary users
// together; the rest are counted in one "suppressed" line. Admins' refusals have a budget of their
// own (kRefusalLinesPerUser per admin uid), which no ordinary user can spend.
constexpr int kRefusalLinesPerUser = 10;
constexpr int kRefusalLinesAll = 50;
constexpr auto kRefusalPeriod = std::chrono::seconds(10);

// The request table: each message type, its handler, and the role a peer needs to send it.
//   admin:    root, malld's own euid, or an --admin-uid (Connection::admin, taken at accept).
//             Only admins move cpus between jobs. Their Register names only processes a job may
//             hold, and a non-root admin's never root's (register_pids_allowed).
//   owner:    Attach. The peer's uid owns the job (or is an admin) and the peer process is one of
//             the job's registered processes or descends from one.
//   attached: Ack, Progress and Usage, only on the connection that attached (so a process can
//             only acknowledge and report for the job it proved it belongs to).
//   any:      read-only requests.
const RequestRule kRequestTable[] = {
    {proto::Type::Register, Role::Admin, &RequestHandlers::handle_register},
    {proto::Type::Deregister, Role::Admin, &RequestHandlers::handle_deregister},
    {proto::Type::Attach, Role::Owner, &RequestHandlers::handle_attach},
    {proto::Type::Ack, Role::Attached, &RequestHandlers::handle_ack},
    {proto::Type::Progress, Role::Attached, &RequestHandlers::handle_progress},
    {proto::Type::Status, Role::Any, &RequestHandlers::handle_status},
    {proto::Type::Set, Role::Admin, &RequestHandlers::handle_set},
    {proto::Type::Policy, Role::Admin, &RequestHandlers::handle_policy},
    {proto::Type::Reclaim, Role::Admin, &RequestHandlers::handle_reclaim},
    {proto::Type::Release, Role::Admin, &RequestHandlers::handle_release},
    {proto::Type::Watch, Role::Any, &RequestHandlers::handle_watch},
    {proto::Type::Usage, Role::Attached, &RequestHandlers::handle_usage},
    {proto::Type::Record, Role::Admin, &RequestHandlers::handle_record},
};

// SO_PEERCRED's pid was taken at connect time: by now that process may have exited and its pid
// been given to another process, which must not be taken for the peer (owner check, self-
// registration). With SO_PEERPIDFD the pidfd names the peer itself: its pid in fdinfo must still
// be the credential pid (-1 once it has exited). Without it, the process now holding the pid must
// have started no later than the connection was accepted and run as the peer's uid.
bool peer_still_connected_process(const Connection &c, std::string *why) {
    const std::string pid = std::to_string(c.peer.pid);
    if (c.peer_pidfd) {
        auto now_pid = pidfd_pid(c.peer_pidfd.get());
        if (!now_pid) {
            *why = "cannot read the pidfd of process " + pid + " (/proc/self/fdinfo)";
            return false;
        }
        if (*now_pid != c.peer.pid) {
            *why = "process " + pid + " that opened this connection has exited";
            return false;
        }
        return true;
    }
    auto start = process_start_time(c.peer.pid);
    if (!start || !process_alive(c.peer.pid)) {
        *why = "process " + pid + " that opened this connection has exited";
        return false;
    }
    if (*start > c.accepted_ticks) {
        *why = "process " + pid + " started after this connection was opened: the connecting "
               "process has exited and its pid was reused";
        return false;
    }
    if (!process_has_uid(c.peer.pid, c.peer.uid)) {
        *why = "process " + pid + " no longer runs as uid " + std::to_string(c.peer.uid) +
               ": the connecting process has exited and its pid was reused";
        return false;
    }
    return true;
}

}  // namespace

std::optional<std::string> container_job_of(const NodeManager &manager, const CpusetBackend &backend,
                                            pid_t pid) {
    for (const auto &[name, job] : manager.jobs())
        if (job.spec.container && backend.in_job_cgroups(name, pid)) return name;
    return std::nullopt;
}

const RequestRule *find_request_rule(proto::Type type) {
    for (const auto &rule : kRequestTable)
        if (rule.type == type) return &rule;
    return nullptr;
}

bool AccessRules::is_admin(uid_t uid) const {
    return uid == 0 || uid == ::geteuid() || admin_uids.count(uid) != 0;
}

bool may_log_refusal(Connection &c) {
    static LogBudget per_user(kRefusalLinesPerUser, kRefusalPeriod);  // the loop's thread only
    static LogBudget all(kRefusalLinesAll, kRefusalPeriod);
    static LogBudget per_admin(kRefusalLinesPerUser, kRefusalPeriod);
    const auto now = std::chrono::steady_clock::now();
    const std::string period = std::to_string(kRefusalPeriod.count());
    uint64_t held_of_user = 0, held_of_all = 0;
    if (c.admin) {
        if (!per_admin.allow(c.peer.uid, now, &held_of_user)) return false;  // counted there
        if (held_of_user > 0)
            log_warn("suppressed " + std::to_string(held_of_user) + " refusal(s) from admin uid " +
                     std::to_string(c.peer.uid) + " (at most " + std::to_string(kRefusalLinesPerUser) +
                     " are logged per " + period + " s per admin)");
        return true;
    }
    // Both budgets are asked before either is spent, and a refusal not logged is counted once: in
    // the all-users count when that budget is empty, else in its user's. Each count comes out in
    // the "suppressed" line logged with that budget's next refusal.
    const uint64_t user = c.owner.key();
    if (!all.has_token(0, now)) {
        all.hold(0, now);
        return false;
    }
    if (!per_user.has_token(user, now)) {
        per_user.hold(user, now);
        return false;
    }
    per_user.allow(user, now, &held_of_user);
    all.allow(0, now, &held_of_all);
    if (held_of_all > 0)
        log_warn("suppressed " + std::to_string(held_of_all) + " refusal(s) of all users (at most " +
                 std::to_string(kRefusalLinesAll) + " are logged per " + period + " s)");
    if (held_of_user > 0)
        log_warn("suppressed " + std::to_string(held_of_user) + " refusal(s) from " + c.owner.describe() +
                 " (at most " + std::to_string(kRefusalLinesPerUser) + " are logged per " + period +
                 " s per user)");
    return true;
}

namespace {

// Register puts processes under malld's control (their cgroup resized in place, or moved into
// malld's folder with their descendants; their threads' masks set), so even an admin's Register
// names only processes a job may hold.
// Refused for any sender: pid 1 (every process descends from it), kernel threads, malld itself and
// its ancestors, and a thread id instead of its process.
// The uid rule: a job holds processes whose real uid is the job's uid ("uid"), except:
// - root (the Slurm plugin, the OCI hook, mallrun and mallctl run as root) may name a process that
//   still runs as root for a user's job (slurmstepd's task between its fork and its setuid, which
//   the plugin registers in task_post_fork for the user's uid), and a process of any uid for a
//   container job ("cgroup": "container" or "container-systemd", or "container": true), since a
//   container's processes run as its users, mapped: mallrun --container registers the engine's
//   client (never moved nor resized), the OCI hook the container's init while it is the
//   container's root.
// - any other admin (an --admin-uid; malld's own uid when malld is not root) never registers a job
//   for a protected uid nor names a process that runs as one in any of its uids (real, effective,
//   saved, filesystem: a setuid-root program too): root's, and malld's own unless the sender is
//   malld's uid. For a container job it may name a process of another uid only inside a user
//   namespace the job's uid made (the owner of the outermost namespace below malld's, ioctl
//   NS_GET_OWNER_UID: that user's rootless container), never another user's container or sandbox.
//   What malld does to a named process it also does to others, so for such an admin the rule
//   holds for them too: every descendant of a named pid (moved into malld's folder with it, its
//   threads pinned) passes the same uid rule, unless the job's mode leaves the named process alone
//   (a container mode's launcher); and a cgroup resized in place (the backend says which:
//   cgroup_resized_in_place) holds no process of a protected uid, in it or below it. A process
//   that appears after the check (a later `sudo` in a job's shell) lands in the job's cgroup as any
//   child does; the rule is about what the Register itself takes.
// A Register that joins an existing job ("join": true) is judged by that job's uid and container
// flag, never by the request's. Fields that are missing or malformed are left to the handler,
// which refuses them with its own words. True when every pid may be registered; else *why.
bool register_pids_allowed(const NodeManager &manager, const CpusetBackend &backend, const Connection &c,
                           const proto::Message &msg, std::string *why) {
    const nlohmann::json &body = msg.body;
    auto pids = body.find("pids");
    if (pids == body.end() || !pids->is_array()) return true;
    std::optional<uid_t> job_uid;
    if (auto u = body.find("uid"); u != body.end() && u->is_number_integer() && u->get<int64_t>() >= 0 &&
                                   u->get<int64_t>() <= proto::kMaxUid)
        job_uid = static_cast<uid_t>(u->get<int64_t>());
    CgroupMode mode = CgroupMode::Auto;
    if (auto field = body.find("cgroup"); field != body.end() && field->is_string())
        if (auto parsed = parse_cgroup_mode(field->get<std::string>())) mode = *parsed;
    bool container = is_container_mode(mode);
    if (auto flag = body.find("container"); flag != body.end() && flag->is_boolean() && flag->get<bool>())
        container = true;
    const auto join = body.find("join");
    const auto name = body.find("job");
    const std::string job_name = name != body.end() && name->is_string() ? name->get<std::string>() : "";
    const Job *joined = nullptr;
    if (join != body.end() && join->is_boolean() && join->get<bool>() && !job_name.empty())
        if ((joined = manager.find(job_name))) {
            container = joined->spec.container;
            job_uid = joined->spec.uid;
        }
    const bool peer_root = c.peer.uid == 0;
    // The uids a non-root admin may not touch: root's, and malld's own (unless it is the sender's).
    std::vector<uid_t> protected_uids;
    if (!peer_root) {
        protected_uids.push_back(0);
        if (::geteuid() != 0 && ::geteuid() != c.peer.uid) protected_uids.push_back(::geteuid());
    }
    auto is_protected = [&](uid_t uid) {
        return std::find(protected_uids.begin(), protected_uids.end(), uid) != protected_uids.end();
    };
    auto whose = [](uid_t uid) { return uid == 0 ? std::string(" (root)") : std::string(" (malld's own)"); };
    const std::string sender = "uid " + std::to_string(c.peer.uid);
    if (job_uid && is_protected(*job_uid)) {
        *why = "a job of uid " + std::to_string(*job_uid) + whose(*job_uid) + " is registered only by that uid "
               "or root; " + sender + " is an admin uid, which may register jobs of other users only "
               "(register it as root, e.g. sudo mallrun)";
        return false;
    }
    // Why the process `pid` (called `text` in the words) runs as a protected uid, or "".
    auto protected_refusal = [&](pid_t pid, const std::string &text) -> std::string {
        for (uid_t uid : process_uids(pid))
            if (is_protected(uid))
                return text + " runs as uid " + std::to_string(uid) + whose(uid) + ": that uid's processes are "
                       "registered only by that uid or root, never by " + sender + " (an admin uid)";
        return "";
    };
    // Why the job may not hold the process `pid` (called `text`) by its real uid, or "". A
    // descendant of a job's process may also run in a user namespace the job's uid made (the
    // user's rootless container started from the job): `descendant`.
    auto job_uid_refusal = [&](pid_t pid, const std::string &text, bool descendant) -> std::string {
        if (!job_uid) return "";
        const auto real = process_real_uid(pid);
        if (!real || *real == *job_uid) return "";
        if (peer_root && *real == 0) return "";  // a launcher's task before it drops to the user
        if (peer_root && container) return "";   // a container's processes run as its users, mapped
        const std::string job_uid_text = std::to_string(*job_uid);
        const auto owner = container || descendant ? user_namespace_owner(pid) : std::nullopt;
        if (owner && *owner == *job_uid) return "";  // the job's user's own rootless container
        if (container) {
            return text + " runs as uid " + std::to_string(*real) + ", not as the job's uid " + job_uid_text +
                   ", " + (owner ? "in a user namespace made by uid " + std::to_string(*owner)
                                 : std::string("in malld's user namespace")) +
                   ": an admin uid's container job holds only processes of the job's uid or of a "
                   "user namespace that uid made (its own rootless container); register it for uid " +
                   (owner ? std::to_string(*owner) : std::to_string(*real)) + ", or as root";
        }
        return text + " runs as uid " + std::to_string(*real) + ", not as the job's uid " + job_uid_text +
               ": a job holds only its owner's processes (register it for uid " + std::to_string(*real) +
               ", or start the job's processes as uid " + job_uid_text + ")";
    };
    // A container mode's launcher (a new job's) is never moved, resized nor pinned: its
    // descendants stay untouched too.
    const bool descendants_taken = !(is_container_mode(mode) && !joined);
    std::vector<std::string> in_place_checked;
    const pid_t self = ::getpid();
    const std::vector<pid_t> malld_ancestors = ancestors_of(self);
    for (const auto &p : *pids) {
        if (!p.is_number_integer() || p.get<int64_t>() <= 0 || p.get<int64_t>() > proto::kMaxPid) continue;
        const pid_t pid = static_cast<pid_t>(p.get<int64_t>());
        const std::string text = "pid " + std::to_string(pid);
        if (!process_alive(pid)) continue;  // the handler says it is not a running process
        if (pid == 1) {
            *why = text + " is the init process: every process of the node descends from it, so no "
                          "job may hold it; register the job's own processes";
            return false;
        }
        if (is_kernel_thread(pid)) {
            *why = text + " is a kernel thread, which no job may hold; register the job's own processes";
            return false;
        }
        if (pid == self) {
            *why = text + " is malld itself, which no job may hold";
            return false;
        }
        if (std::find(malld_ancestors.begin(), malld_ancestors.end(), pid) != malld_ancestors.end()) {
            *why = text + " is an ancestor of malld (malld's parent chain: " + pid_list_text(malld_ancestors) +
                   "), which no job may hold";
            return false;
        }
        if (auto group = thread_group_of(pid); group && *group != pid) {
            *why = text + " is a thread of process " + std::to_string(*group) + ": register the process";
            return false;
        }
        if (std::string refusal = protected_refusal(pid, text); !refusal.empty()) {
            *why = refusal;
            return false;
        }
        if (std::string refusal = job_uid_refusal(pid, text, false); !refusal.empty()) {
            *why = refusal;
            return false;
        }
        if (peer_root) continue;  // root's Register takes what it names, descendants included
        const std::string fix = "; register the job as root, or only processes whose descendants all "
                                "belong to the job";
        if (descendants_taken)
            for (pid_t d : descendants_of(pid)) {
                const std::string d_text = "pid " + std::to_string(d) + ", a descendant of " + text +
                                           " (malld moves or pins it with " + text + "),";
                std::string refusal = protected_refusal(d, d_text);
                if (refusal.empty()) refusal = job_uid_refusal(d, d_text, true);
                if (!refusal.empty()) {
                    *why = refusal + fix;
                    return false;
                }
            }
        const auto dir = backend.cgroup_resized_in_place(job_name, pid, mode);
        if (!dir || std::count(in_place_checked.begin(), in_place_checked.end(), *dir) != 0) continue;
        in_place_checked.push_back(*dir);
        for (pid_t member : cgroup_tree::pids_in_tree(*dir)) {
            const std::string m_text = "pid " + std::to_string(member) + ", in cgroup " + *dir +
                                       " (which malld would resize in place for " + text + ") or below it,";
            if (std::string refusal = protected_refusal(member, m_text); !refusal.empty()) {
                *why = refusal + "; register the job as root, or in cgroup mode own";
                return false;
            }
        }
    }
    return true;
}

}  // namespace

// Authorization lives here and only here: every request passes through this function before its
// handler runs, so the request table above is malld's whole access policy and no handler can forget
// a check. Identities come from SO_PEERCRED (kernel-verified), never from the message body.
bool authorize(const AccessRules &rules, const NodeManager &manager, const CpusetBackend &backend,
               const Connection &c, const RequestRule &rule, const proto::Message &msg, int *code,
               std::string *why) {
    const std::string type = proto::type_name(rule.type);
    *code = MALL_ERR_DENIED;
    switch (rule.role) {
        case Role::Any:
            return true;
        case Role::Admin:
            if (!c.admin) {  // rules.is_admin(c.peer.uid), taken at accept
                *why = type + " needs root or an admin uid (malld --admin-uid); uid " +
                       std::to_string(c.peer.uid) + " is neither";
                return false;
            }
            // What an admin may register: only processes a job may hold.
            return rule.type != proto::Type::Register || register_pids_allowed(manager, backend, c, msg, why);
        case Role::Attached:
            if (!c.job.empty() && manager.find(c.job)) return true;
            *why = type + " is only accepted on a connection attached to a job (send Attach first)";
            return false;
        case Role::Owner: {
            if (!c.job.empty()) {
                *code = MALL_ERR_INVAL;
                *why = "this connection is already attached to job " + c.job;
                return false;
            }
            // Both ways to attach act on the peer's pid: it must still be the connecting process.
            std::string gone;
            if (!peer_still_connected_process(c, &gone)) {
                *why = gone + "; reconnect and attach again";
                return false;
            }
            auto field = msg.body.find("job");
            if (field == msg.body.end() || field->is_null()) {
                if (rules.allow_self_register) return true;
                // A process of a container job (its cgroups) attaches to it without a name.
                if (container_job_of(manager, backend, c.peer.pid)) return true;
                *code = MALL_ERR_NOJOB;
                *why = "no job given and self-registration is off: start the process with mallrun "
                       "(which sets MALL_JOB_ID) or run malld with --allow-self-register";
                return false;
            }
            if (!field->is_string()) {
                *code = MALL_ERR_INVAL;
                *why = "field \"job\" must be a string";
                return false;
            }
            const std::string name = field->get<std::string>();
            // Validated before the name is echoed into the reply or the log.
            if (auto bad = proto::invalid_job_name(name)) {
                *code = MALL_ERR_INVAL;
                *why = "bad job name in field \"job\": " + *bad;
                return false;
            }
            const Job *job = manager.find(name);
            if (!job) {
                *code = MALL_ERR_NOJOB;
                *why = "no job named \"" + name + "\" is registered (MALL_JOB_ID is stale or the "
                       "job has ended)";
                return false;
            }
            // A container job's processes may run as any uid (--user, user namespaces): living in
            // one of its cgroups, which only root or the engine can place a process in, is proof.
            const bool container_member = job->spec.container && backend.in_job_cgroups(name, c.peer.pid);
            if (c.peer.uid != job->spec.uid && !c.admin && !container_member) {
                *why = "job " + name + " belongs to uid " + std::to_string(job->spec.uid) +
                       "; uid " + std::to_string(c.peer.uid) + " may not attach to it";
                return false;
            }
            // A member: a registered process, a descendant of one, or a process in one of the
            // job's cgroups (which only root, or the cgroup's delegate, can move a process into).
            if (!container_member && !in_process_tree(c.peer.pid, job->spec.pids) &&
                !backend.in_job_cgroups(name, c.peer.pid)) {
                *why = "process " + std::to_string(c.peer.pid) + " is not a process of job " + name +
                       " (pids " + pid_list_text(job->spec.pids) + "), nor a descendant of one, nor in "
                       "one of its cgroups";
                return false;
            }
            return true;
        }
    }
    *why = "unknown role";
    return false;
}

void serve_packet(Connection &c, const std::string &packet, const AccessRules &rules,
                  const NodeManager &manager, const CpusetBackend &backend, RequestHandlers &handlers,
                  Connections &connections) {
    std::string why;
    std::optional<proto::Message> msg = proto::decode(packet, &why);
    if (!msg) {
        // A peer that sends garbage loses its connection; everyone else is unaffected.
        log_warn_limited("malformed", "malformed packet from uid " + std::to_string(c.peer.uid) +
                                          " pid " + std::to_string(c.peer.pid) + ": " + log_text(why) +
                                          "; closing that connection");
        connections.reply_error(c, proto::request_id_of(packet), MALL_ERR_PROTOCOL, why);
        c.closing = true;
        return;
    }
    if (auto accepts = msg->body.find(proto::kAcceptsBodyFdField);
        accepts != msg->body.end() && accepts->is_boolean() && accepts->get<bool>())
        c.accepts_body_fd = true;
    const RequestRule *rule = find_request_rule(msg->type);
    if (!rule) {
        std::string text = std::string("message type ") + proto::type_name(msg->type) +
                           " is not a request a client may send";
        log_warn_limited("protocol", "protocol error from uid " + std::to_string(c.peer.uid) + " pid " +
                                         std::to_string(c.peer.pid) + ": " + text +
                                         "; closing that connection");
        connections.reply_error(c, msg->request_id, MALL_ERR_PROTOCOL, text);
        c.closing = true;
        return;
    }
    int code = MALL_ERR_DENIED;
    if (!authorize(rules, manager, backend, c, *rule, *msg, &code, &why)) {
        if (may_log_refusal(c))
            log_warn(std::string("refused ") + proto::type_name(msg->type) + " from uid " +
                     std::to_string(c.peer.uid) + " pid " + std::to_string(c.peer.pid) + ": " +
                     log_text(why));
        connections.reply_error(c, msg->request_id, code, why);
        return;
    }
    if (log_enabled(LogLevel::Debug))
        log_debug(std::string("request ") + proto::type_name(msg->type) + " from uid " +
                  std::to_string(c.peer.uid) + " pid " + std::to_string(c.peer.pid) + ": " +
                  log_text(msg->body.dump()));
    try {
        (handlers.*rule->handler)(c, *msg);
    } catch (const proto::ProtocolError &e) {
        connections.reply_error(c, msg->request_id, MALL_ERR_INVAL,
                                std::string(proto::type_name(msg->type)) + ": " + e.what());
    } catch (const std::exception &e) {
        connections.reply_error(c, msg->request_id, MALL_ERR_INVAL,
                                std::string(proto::type_name(msg->type)) + ": bad request: " + e.what());
    }
}

}  // namespace mall
