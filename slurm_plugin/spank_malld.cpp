// SPDX-License-Identifier: BSD-3-Clause
// spank_malld.cpp — the plugin's requests to malld around a job's life: Reclaim of the job's cores
// before its tasks run (job prolog or step start), Register/Deregister of each task with the job's
// limits and weight, Release in the job epilog. Contract: each callback's exchanges with malld
// (connect, send, reply) share one time budget — malld's ack timeout + 3 s, 5 s by default; 0.5 s
// for the later callbacks of a process in which malld already ran out of time — so a wedged malld
// never hangs slurmstepd or slurmd; when malld is away or refuses, the job runs non-malleable and
// the user's stderr or the log says why. Never fails a job (on_daemon_down=fail ends the task in
// task_init, see mall_spank.cpp).
#include <algorithm>
#include <chrono>

#include "common/rules.hpp"
#include "spank_plugin.hpp"

namespace mall::spank {
namespace {

using mall::CpuSet;
using mall::slurm::MalleableLimits;
using mall::slurm::OnDaemonDown;

// How long one callback may spend with malld (connect, send and reply together): malld's ack
// timeout (a Register or Reclaim reply waits for a shrinking job's ack) plus a margin, 5 s with the
// defaults. Once malld failed to answer in this process (a wedged malld), the later callbacks of
// the same process (one task_post_fork per local task) get kAfterTimeoutBudget only, so a step of
// many tasks is not held back that long per task.
constexpr std::chrono::milliseconds kRequestMargin{3000};  // on top of malld's ack timeout
constexpr std::chrono::milliseconds kAfterTimeoutBudget{500};

bool g_malld_unresponsive = false;  // a connect or request to malld ran out of time in this process
bool g_reclaimed = false;           // this process already sent the Reclaim for its job

}  // namespace

std::string malld_job_name(uint32_t id) { return mall::kSlurmJobPrefix + std::to_string(id); }

CallbackBudget::CallbackBudget()
    : end_(std::chrono::steady_clock::now() +
           (g_malld_unresponsive ? kAfterTimeoutBudget
                                 : std::chrono::milliseconds(config().ack_timeout_ms) + kRequestMargin)) {}

std::chrono::milliseconds CallbackBudget::left() const {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(end_ - std::chrono::steady_clock::now());
    return std::max(ms, std::chrono::milliseconds(1));
}

std::optional<mall::CtlClient> connect_to_malld(const CallbackBudget &budget, std::string *error) {
    auto client = mall::CtlClient::connect(config().socket, error, nullptr, budget.left());
    if (!client) g_malld_unresponsive = true;  // not there, or not taking connections
    return client;
}

mall::CtlResult request_within(mall::CtlClient &client, const CallbackBudget &budget, mall::proto::Type type,
                               const nlohmann::json &body) {
    mall::CtlResult result = client.request(type, body, budget.left());
    if (!result.ok && result.code == MALL_ERR_NODAEMON) g_malld_unresponsive = true;
    return result;
}

std::optional<mall::CtlResult> ask_malld(mall::proto::Type type, const nlohmann::json &body, bool *unreachable,
                                         std::string *error) {
    *unreachable = false;
    CallbackBudget budget;
    auto client = connect_to_malld(budget, error);
    if (!client) {
        *unreachable = true;
        return std::nullopt;
    }
    mall::CtlResult result = request_within(*client, budget, type, body);
    if (!result.ok && result.code == MALL_ERR_NODAEMON) {
        *unreachable = true;
        *error = result.error;
        return std::nullopt;
    }
    return result;
}

// Takes the job's cores on this node back from borrowers; returns when malld says no other job
// holds them (or the request timed out). Never fails the job. Every step of a job on the node
// comes here (the prolog cannot, see mall_spank.cpp); a step after the first finds the cores
// already reserved for its job in malld's status and skips the Reclaim, so it neither waits nor
// disturbs the job's own registration.
// Without cpus (the job prolog, which Slurm 22.05 gives no core list), malld started with --slurm
// asks slurmctld for the job's cores on this node; a malld without --slurm refuses, and the reclaim
// then happens at step start as before.
bool reclaim_owner_only(uint32_t id) {
    const std::string owner = malld_job_name(id);
    std::string error;
    CallbackBudget budget;
    auto client = connect_to_malld(budget, &error);
    if (!client) {
        log_info("job %u: prolog reclaim skipped: %s", id, error.c_str());
        return false;
    }
    auto t0 = std::chrono::steady_clock::now();
    mall::CtlResult result = request_within(*client, budget, mall::proto::Type::Reclaim, {{"owner", owner}});
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (!result.ok) {
        log_debug("job %u: prolog reclaim by owner not done (%s); the reclaim happens at step start",
                  id, result.error.c_str());
        return false;
    }
    log_debug("job %u: reclaimed cores %s in the job prolog in %.1f ms", id,
              result.body.value("cpus", std::string("?")).c_str(), ms);
    return true;
}

void reclaim_for_job(uint32_t id, const CpuSet &cpus, const char *where) {
    if (g_reclaimed) return;
    g_reclaimed = true;
    const std::string owner = malld_job_name(id);
    std::string error;
    CallbackBudget budget;
    auto client = connect_to_malld(budget, &error);
    if (!client) {
        log_info("job %u: cores %s not reclaimed: %s", id, cpus.to_string().c_str(), error.c_str());
        return;
    }
    auto t0 = std::chrono::steady_clock::now();
    mall::CtlResult status = request_within(*client, budget, mall::proto::Type::Status, nlohmann::json::object());
    if (status.ok && status.body.contains("reserved") && status.body["reserved"].is_object()) {
        const auto &reserved = status.body["reserved"];
        auto it = reserved.find(owner);
        if (it != reserved.end() && it->is_string())
            if (auto held = CpuSet::parse(it->get<std::string>()); held && held->contains(cpus)) {
                log_debug("job %u: cores %s already reserved for %s", id, cpus.to_string().c_str(), owner.c_str());
                return;
            }
    }
    nlohmann::json body = {{"cpus", cpus.to_string()}, {"owner", owner}};
    mall::CtlResult result = request_within(*client, budget, mall::proto::Type::Reclaim, body);
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (!result.ok)
        log_info("job %u: cores %s not reclaimed: %s", id, cpus.to_string().c_str(), result.error.c_str());
    else
        log_debug("job %u: reclaimed cores %s in %s in %.1f ms", id, cpus.to_string().c_str(), where, ms);
}

void register_task(spank_t sp) {
    auto id = job_id(sp);
    uid_t uid = 0;
    pid_t pid = -1;
    uint32_t local_tasks = 1;
    if (!id || spank_get_item(sp, S_JOB_UID, &uid) != ESPANK_SUCCESS ||
        spank_get_item(sp, S_TASK_PID, &pid) != ESPANK_SUCCESS || pid <= 0) {
        tell_user("cannot read the job id, uid or task pid from Slurm; this job runs non-malleable");
        return;
    }
    if (spank_get_item(sp, S_JOB_LOCAL_TASK_COUNT, &local_tasks) != ESPANK_SUCCESS || local_tasks == 0)
        local_tasks = 1;
    auto guaranteed = job_cpus_on_node(sp);
    if (!guaranteed) {
        tell_user("Slurm did not say which cores job %u has on this node; this job runs non-malleable", *id);
        return;
    }

    MalleableLimits limits = limits_here(true);
    std::string error;
    auto request = parse_given_option(limits, &error);
    if (!request) {
        tell_user("%s; this job runs non-malleable", error.c_str());
        return;
    }
    // MIN and MAX are per task, like -c. All tasks of the job on this node form one malld job
    // ("slurm-<jobid>", every task joins it): its floor is the cores Slurm gave the job here,
    // its ceiling MAX per local task, capped by the node and the admin's max_cpus.
    unsigned granted = static_cast<unsigned>(guaranteed->count());
    unsigned want_min = request->min * local_tasks;
    if (granted < want_min) {
        tell_user("%s asks for %u core(s) per task but Slurm gave job %u only %u core(s) for %u "
                  "task(s) on this node; pass -c %u as well, or ask the admin to install mall's "
                  "cli_filter.lua (CliFilterPlugins=cli_filter/lua), which does it at submission; "
                  "this job runs non-malleable",
                  option_display().c_str(), request->min, *id, granted,
                  local_tasks, request->min);
        return;
    }
    unsigned node_max = mall::slurm::resolve_max(*request, limits);
    unsigned want_max = request->max == 0 ? node_max : std::min(request->max * local_tasks, node_max);
    if (limits.node_cpus != 0) want_max = std::min(want_max, limits.node_cpus);
    unsigned min = granted;  // the job keeps what Slurm gave it; mall only lends above that
    unsigned max = std::max(want_max, min);

    nlohmann::json body = {{"job", malld_job_name(*id)},
                           {"uid", static_cast<int64_t>(uid)},
                           {"pids", nlohmann::json::array({static_cast<int64_t>(pid)})},
                           {"min", min},
                           {"max", max},
                           {"guaranteed", guaranteed->to_string()},
                           {"weight", request->weight},
                           {"join", true}};
    // This node's place in a multi-node job: malld sends its figures to the job's AdminComment in
    // that turn at the job's end, so that the nodes' updates of the one field seldom collide.
    uint32_t node_index = 0, nodes = 0;
    if (spank_get_item(sp, S_JOB_NODEID, &node_index) == ESPANK_SUCCESS &&
        spank_get_item(sp, S_JOB_NNODES, &nodes) == ESPANK_SUCCESS && nodes > 1 && node_index < nodes) {
        body["slurm_node_index"] = node_index;
        body["slurm_nodes"] = nodes;
    }
    bool unreachable = false;
    auto result = ask_malld(mall::proto::Type::Register, body, &unreachable, &error);
    if (unreachable) {
        if (config().on_daemon_down == OnDaemonDown::Fail) {
            // The task itself stops in task_init (it prints why to its own stderr there: a message
            // sent from here right before a kill does not reach srun). Log it for the admin.
            log_info("job %u task pid %d: malld not reachable at %s (%s); on_daemon_down=fail", *id, pid,
                     config().socket.c_str(), error.c_str());
            return;
        }
        tell_user("malld not reachable at %s (%s); this job runs non-malleable", config().socket.c_str(),
                  error.c_str());
        return;
    }
    if (!result->ok) {
        tell_user("malld refused to register task %d of job %u: %s; this job runs non-malleable", pid, *id,
                  result->error.c_str());
        return;
    }
    log_info("job %u task pid %d registered: min %u max %u weight %g guaranteed %s, cpus %s", *id, pid, min,
             max, request->weight, guaranteed->to_string().c_str(),
             result->body.value("cpus", std::string()).c_str());
}

void deregister_task(uint32_t id, pid_t pid) {
    nlohmann::json body = {{"job", malld_job_name(id)}, {"pid", static_cast<int64_t>(pid)}};
    bool unreachable = false;
    std::string error;
    auto result = ask_malld(mall::proto::Type::Deregister, body, &unreachable, &error);
    if (!unreachable && !result->ok)  // e.g. never registered, or malld already dropped it
        log_debug("job %u: deregister pid %d: %s", id, pid, result->error.c_str());
}

void release_job(uint32_t id) {
    nlohmann::json body = {{"owner", malld_job_name(id)}};
    bool unreachable = false;
    std::string error;
    auto result = ask_malld(mall::proto::Type::Release, body, &unreachable, &error);
    if (unreachable)
        log_info("job %u epilog: malld not reachable at %s (%s); nothing released", id, config().socket.c_str(),
                 error.c_str());
    else if (!result->ok)
        log_info("job %u epilog: malld refused the release: %s", id, result->error.c_str());
}

}  // namespace mall::spank
