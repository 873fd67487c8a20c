// SPDX-License-Identifier: BSD-3-Clause
// mall_spank.cpp — the Slurm SPANK plugin "mall": the `--malleable[=MIN[:MAX]][,weight=W]` option,
// and the malld requests around a job's life (Reclaim before its tasks run, Register/Deregister per
// task, with the job's weight; Release at the end). Contract: never fails a job because malld is
// away (unless the admin chose on_daemon_down=fail, and then only the task), never drains a node,
// never lets an exception out.
//
// What Slurm 22.05 lets a SPANK plugin do, and how this file copes (checked on this machine kind):
// - Changing the job request: not possible. spank.h (22.05) has no call that edits the job's
//   options (-c/--cpus-per-task) in local/allocator context (spank_job_control_setenv only reaches
//   the prolog/epilog environment), and an environment variable set from the option callback comes
//   too late: measured on this machine, setting SRUN_/SLURM_/SBATCH_/SALLOC_CPUS_PER_TASK there
//   leaves srun, sbatch and salloc jobs at 1 cpu per task (the clients read those variables before
//   the command line).
//   sbatch/srun also cannot see -c through SPANK, so the check happens on the node: if Slurm gave
//   the job fewer cores than MIN per local task, the job runs non-malleable and its stderr says to
//   pass -c MIN. slurm_plugin/cli_filter.lua (Slurm's cli_filter/lua) does it at submission instead:
//   with no -c it sets cpus-per-task to MIN, and it refuses a -c outside MIN..MAX.
// - Failing: errors returned by an `optional` plugin's callbacks are ignored by slurmstepd, and a
//   `required` one that fails drains the node. on_daemon_down=fail therefore ends the task itself
//   (in task_init, before exec, with exit code 1 and a line on its stderr): the step fails, the
//   node stays up.
// - Time: a wedged malld must never hang slurmstepd or slurmd. Each callback's exchanges with
//   malld (connect, send, reply) share one budget: malld's ack timeout + 3 s (5 s by default),
//   after which the job runs non-malleable with a warning; once malld ran out of time in a
//   process, its later callbacks get 0.5 s (CallbackBudget).
// - Job ids: task_init sees S_JOB_ID 0 (a 22.05 bug), so it reads SLURM_JOB_ID from the task env.
// - Cores: S_JOB_ALLOC_CORES gives Slurm's abstract core ids on this node; common/slurm_cpu_map.hpp
//   maps them to Linux cpus as slurmd does (malld maps the prolog's lookup with the same code).
// - The job prolog (a separate process under slurmd) gets no core list in 22.05 (S_JOB_ALLOC_CORES
//   is a slurmstepd item and the prolog environment has no cpu list), so the prolog sends a Reclaim
//   naming only the owner and malld (started with --slurm) asks slurmctld for the job's cores on
//   this node. Without --slurm that Reclaim is refused, and the Reclaim happens in
//   slurm_spank_init_post_opt of each step, as root, before that step's tasks start (later steps
//   find the cores already reserved and skip it).
// - Where the task is when it registers: task_post_fork runs in slurmstepd after proctrack_g_add
//   and task_g_pre_set_affinity (src/slurmd/slurmstepd/mgr.c, _fork_all_tasks), so with
//   proctrack/cgroup + task/cgroup the task already sits in Slurm's step cgroup (v1:
//   cpuset/slurm_<node>/uid_<uid>/job_<id>/step_<step>, which slurmstepd shares; v2:
//   .../job_<id>/step_<step>/user/task_<n> or task_special) and has not exec'd yet: malld reads
//   that cgroup from /proc/PID/cgroup and resizes it in place.
// - A later step of a job malld has grown: task/cgroup (task_cgroup_cpuset_create, in the new
//   step's task_g_pre_setuid) writes the job cgroup's cpus back to Slurm's cores. On cgroup v1 the
//   kernel refuses that (EBUSY: an earlier step's cgroup, grown in place, is wider), and Slurm fails
//   the step ("Failed to invoke task plugins", "Slurmd could not execve job"); on v2 the write
//   succeeds and silently takes the borrowed cpus from the running step behind malld's back. So
//   for a job malld enforces in Slurm's cgroups (status: a cgroup in_place; never with
//   proctrack/linuxproc + task/affinity, where malld's own folders hold the job),
//   slurm_spank_init_post_opt (in the new step's slurmstepd, before task_g_pre_setuid) pins the job
//   to its Slurm cores in malld and waits until they are enforced (hold_for_step), and the step's
//   first task_post_fork (or the step's exit, if no task started) lets the policy have it again.
//   Concurrent step starts of one job are not serialised: one step's release can regrow the job
//   while another step's slurmstepd is between its check and Slurm's write.
extern "C" {
#pragma GCC visibility push(default)
#include <slurm/slurm.h>
#include <slurm/spank.h>
#pragma GCC visibility pop
}

#include <dlfcn.h>
#include <sys/types.h>
#include <unistd.h>

#include <hwloc.h>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/cpuset.hpp"
#include "common/ctl_client.hpp"
#include "common/protocol.hpp"
#include "common/rules.hpp"
#include "common/slurm_cpu_map.hpp"
#include "malleable_option.hpp"
#include "plugstack_args.hpp"
#include "slurm_release.hpp"

#define MALL_SPANK_EXPORT __attribute__((visibility("default")))

// The plugin symbols Slurm's loader looks up. SPANK_PLUGIN() inside C++ gives them internal
// linkage ("Plugin name/type/version symbol missing"), hence explicit extern "C" + extern const.
extern "C" {
MALL_SPANK_EXPORT extern const char plugin_name[] = "mall";
MALL_SPANK_EXPORT extern const char plugin_type[] = "spank";
MALL_SPANK_EXPORT extern const unsigned int plugin_version = SLURM_VERSION_NUMBER;
MALL_SPANK_EXPORT extern const unsigned int spank_plugin_version = 1;
}

namespace {

using mall::CpuSet;
using mall::slurm::MalleableLimits;
using mall::slurm::MalleableRequest;
using mall::slurm::OnDaemonDown;
using mall::slurm::PlugstackConfig;

constexpr const char *kOptionEnv = "SLURM_SPANK__SLURM_SPANK_OPTION_mall_malleable";
// How long one callback may spend with malld (connect, send and reply together): malld's ack
// timeout (a Register or Reclaim reply waits for a shrinking job's ack) plus a margin, 5 s with the
// defaults. Once malld failed to answer in this process (a wedged malld), the later callbacks of
// the same process (one task_post_fork per local task) get kAfterTimeoutBudget only, so a step of
// many tasks is not held back that long per task.
constexpr std::chrono::milliseconds kRequestMargin{3000};  // on top of malld's ack timeout
constexpr std::chrono::milliseconds kAfterTimeoutBudget{500};

// Per-process state: each Slurm process (sbatch, srun, slurmstepd, the prolog) loads its own copy.
struct PluginState {
    bool configured = false;         // plugstack arguments looked at (once per process)
    bool enabled = false;            // plugstack arguments parsed fine
    PlugstackConfig config;
    bool option_given = false;       // --malleable seen (callback, getopt or env)
    bool option_bare = false;        // given without a value
    std::string option_text;         // the value as the user wrote it
    bool reclaimed = false;          // this process already sent the Reclaim for its job
    std::optional<uint32_t> held_job; // this step pinned that job to its Slurm cores (hold_for_step)
    std::string held_restore;        // what to give back: "auto" or an admin's earlier pin
    bool malld_unresponsive = false; // a connect or request to malld ran out of time here
    bool release_checked = false;    // the running Slurm's release compared with ours (once)
    bool wrong_release = false;      // built for another Slurm release: everything stays off
};
PluginState g_state;

std::string format_text(const char *fmt, va_list ap) {
    char buf[1024];
    vsnprintf(buf, sizeof buf, fmt, ap);
    return buf;
}

// slurm_error reaches the user (srun's stderr, the batch job's output) as well as the logs.
__attribute__((format(printf, 1, 2))) void tell_user(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::string text = format_text(fmt, ap);
    va_end(ap);
    slurm_error("mall: %s", text.c_str());
}

__attribute__((format(printf, 1, 2))) void log_info(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::string text = format_text(fmt, ap);
    va_end(ap);
    slurm_info("mall: %s", text.c_str());
}

__attribute__((format(printf, 1, 2))) void log_debug(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::string text = format_text(fmt, ap);
    va_end(ap);
    slurm_debug("mall: %s", text.c_str());
}

// One callback's time with malld: every connect and request of the callback draws on it.
class CallbackBudget {
public:
    CallbackBudget()
        : end_(std::chrono::steady_clock::now() +
               (g_state.malld_unresponsive
                    ? kAfterTimeoutBudget
                    : std::chrono::milliseconds(g_state.config.ack_timeout_ms) + kRequestMargin)) {}
    // What is left, at least 1 ms (a request with no time left fails at once as timed out).
    std::chrono::milliseconds left() const {
        auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(end_ - std::chrono::steady_clock::now());
        return std::max(ms, std::chrono::milliseconds(1));
    }

private:
    std::chrono::steady_clock::time_point end_;
};

// Connects within the budget; nullopt with *error when malld cannot be reached.
std::optional<mall::CtlClient> connect_to_malld(const CallbackBudget &budget, std::string *error) {
    auto client = mall::CtlClient::connect(g_state.config.socket, error, nullptr, budget.left());
    if (!client) g_state.malld_unresponsive = true;  // not there, or not taking connections
    return client;
}

// A request within the budget; a transport failure (no answer in time) marks malld unresponsive.
mall::CtlResult request_within(mall::CtlClient &client, const CallbackBudget &budget, mall::proto::Type type,
                               const nlohmann::json &body) {
    mall::CtlResult result = client.request(type, body, budget.left());
    if (!result.ok && result.code == MALL_ERR_NODAEMON) g_state.malld_unresponsive = true;
    return result;
}

// The node's topology, loaded once per process, including cpus outside our own cpuset (slurmstepd
// may already sit in a restricted one).
hwloc_topology_t node_topology() {
    static hwloc_topology_t topology = [] {
        hwloc_topology_t t = nullptr;
        if (hwloc_topology_init(&t) != 0) return static_cast<hwloc_topology_t>(nullptr);
        hwloc_topology_set_flags(t, HWLOC_TOPOLOGY_FLAG_INCLUDE_DISALLOWED);
        if (hwloc_topology_load(t) != 0) {
            hwloc_topology_destroy(t);
            return static_cast<hwloc_topology_t>(nullptr);
        }
        return t;
    }();
    return topology;
}

unsigned node_cpu_count() {
    if (hwloc_topology_t t = node_topology()) {
        int n = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_PU);
        if (n > 0) return static_cast<unsigned>(n);
    }
    long n = sysconf(_SC_NPROCESSORS_CONF);
    return n > 0 ? static_cast<unsigned>(n) : 0;
}

// Slurm's abstract core ids -> Linux cpus, by the mapping malld uses for the prolog's lookup
// (common/slurm_cpu_map.hpp). slurmstepd does not tell a plugin how slurm.conf describes the node,
// so it is taken to match hwloc (as `slurmd -C` prints it); malld, which asks slurmctld, logs it
// when they differ. Ids the node does not have map to nothing: no Reclaim from here, and the job
// runs non-malleable, rather than mall guessing the cores.
std::optional<CpuSet> slurm_cores_to_cpus(const CpuSet &cores) {
    static const mall::NodeCores node = mall::node_cores_in_slurm_order(node_topology());
    mall::SlurmCpuMapping mapped = mall::map_slurm_cores(cores, node, mall::SlurmNodeShape{});
    if (!mapped.cpus)
        log_info("cannot map Slurm's core ids %s to this node's cpus: %s", cores.to_string().c_str(),
                 mapped.error.c_str());
    return mapped.cpus;
}

// The job's cores on this node as Linux cpus, from S_JOB_ALLOC_CORES (slurmstepd only).
std::optional<CpuSet> job_cpus_on_node(spank_t sp) {
    char *cores_text = nullptr;
    if (spank_get_item(sp, S_JOB_ALLOC_CORES, &cores_text) != ESPANK_SUCCESS || !cores_text) return std::nullopt;
    std::string error;
    auto cores = CpuSet::parse(cores_text, &error);
    if (!cores || cores->empty()) {
        log_info("cannot read Slurm's core list \"%s\": %s", cores_text, error.c_str());
        return std::nullopt;
    }
    return slurm_cores_to_cpus(*cores);
}

std::optional<uint32_t> job_id(spank_t sp) {
    uint32_t id = 0;
    if (spank_get_item(sp, S_JOB_ID, &id) == ESPANK_SUCCESS && id != 0) return id;
    char buf[32];
    if (spank_getenv(sp, "SLURM_JOB_ID", buf, sizeof buf) == ESPANK_SUCCESS) {
        char *end = nullptr;
        unsigned long v = strtoul(buf, &end, 10);
        if (end != buf && *end == '\0' && v != 0) return static_cast<uint32_t>(v);
    }
    return std::nullopt;
}

std::string malld_job_name(uint32_t id) { return "slurm-" + std::to_string(id); }

// The most cpus any node of the cluster has, asked from slurmctld; 0 when unknown. Used in
// sbatch/salloc/srun, where the job's node is not chosen yet: a MIN or MAX above every node can
// never be served. The plugin does not link libslurm (it would be a second copy beside the one
// the host program uses): the functions are looked up in the host process, and skipped if absent.
unsigned largest_node_cpus() {
    using load_fn = int (*)(time_t, node_info_msg_t **, uint16_t);
    using free_fn = void (*)(node_info_msg_t *);
    auto load = reinterpret_cast<load_fn>(::dlsym(RTLD_DEFAULT, "slurm_load_node"));
    auto release = reinterpret_cast<free_fn>(::dlsym(RTLD_DEFAULT, "slurm_free_node_info_msg"));
    if (load == nullptr || release == nullptr) return 0;
    node_info_msg_t *nodes = nullptr;
    if (load(static_cast<time_t>(0), &nodes, SHOW_ALL) != 0 || nodes == nullptr) return 0;
    unsigned largest = 0;
    for (uint32_t i = 0; i < nodes->record_count; ++i)
        largest = std::max<unsigned>(largest, nodes->node_array[i].cpus);
    release(nodes);
    return largest;
}

MalleableLimits limits_here(bool on_node) {
    MalleableLimits limits;
    limits.admin_min = g_state.config.min_cpus;
    limits.admin_max = g_state.config.max_cpus;
    // On the node: its own cpus. In sbatch/salloc/srun: the largest node of the cluster.
    limits.node_cpus = on_node ? node_cpu_count() : largest_node_cpus();
    limits.largest_node = !on_node;
    return limits;
}

int malleable_option_cb(int val, const char *optarg, int remote);

char kOptName[] = "malleable";
char kOptArgInfo[] = "MIN[:MAX][,weight=W]";
// Built once at load time: the weight bound comes from rules.hpp (Slurm wants a char *).
std::string g_opt_usage =
    "let mall grow and shrink this job's cores between MIN and MAX while it runs (MIN is guaranteed "
    "by Slurm, like -c MIN; MAX defaults to the node's cores); weight=W (above 0, at most " +
    std::to_string(static_cast<long long>(mall::kMaxWeight)) +
    ", default 1) is the job's share of idle cores under malld's weighted policy, e.g. 2:8,weight=3 "
    "or weight=2";
struct spank_option g_malleable_option = {kOptName, kOptArgInfo, g_opt_usage.data(), 2, 0,
                                          malleable_option_cb};

// A bare `--malleable` reaches the job environment as the text "(null)" (sbatch formats the missing
// argument with printf), and an srun inside the job reads it back from there: same as no value.
bool is_bare_value(const char *value, bool remote) {
    return value == nullptr || strcmp(value, "(null)") == 0 || (remote && value[0] == '\0');
}

int malleable_option_cb(int, const char *optarg, int remote) {
    try {
        if (g_state.wrong_release) return 0;  // said at init; node_info_t may not be ours to read
        g_state.option_given = true;
        g_state.option_bare = is_bare_value(optarg, remote);
        g_state.option_text = g_state.option_bare ? "" : optarg;
        if (g_state.option_bare) optarg = nullptr;
        if (remote) return 0;  // checked against the node in task_post_fork, where failing is safe
        std::string error;
        if (!mall::slurm::parse_malleable(optarg, limits_here(false), &error)) {
            slurm_error("%s", error.c_str());
            return -1;  // Slurm adds "Invalid --malleable argument" and the command exits
        }
        return 0;
    } catch (...) {
        return -1;
    }
}

std::string option_display() {
    return g_state.option_bare ? std::string("--malleable") : "--malleable=" + g_state.option_text;
}

// Reads the option where the callback did not run (job prolog/epilog, task_init): getopt, then
// the environment variable Slurm sets for the job.
void load_option(spank_t sp) {
    if (g_state.option_given) return;
    char *value = nullptr;
    if (spank_option_getopt(sp, &g_malleable_option, &value) == ESPANK_SUCCESS) {
        g_state.option_given = true;
        g_state.option_bare = is_bare_value(value, true);
        g_state.option_text = g_state.option_bare ? "" : value;
        return;
    }
    char buf[256];
    if (spank_getenv(sp, kOptionEnv, buf, sizeof buf) == ESPANK_SUCCESS) {
        g_state.option_given = true;
        g_state.option_bare = is_bare_value(buf, true);
        g_state.option_text = g_state.option_bare ? "" : buf;
    } else if (const char *env = getenv(kOptionEnv)) {
        g_state.option_given = true;
        g_state.option_bare = is_bare_value(env, true);
        g_state.option_text = g_state.option_bare ? "" : env;
    }
}

// One request to malld, bounded in time. nullopt + *unreachable when malld cannot be reached.
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
// comes here (the prolog cannot, see the top of the file); a step after the first finds the cores
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
    if (g_state.reclaimed) return;
    g_state.reclaimed = true;
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

// The entry of malld's job `name` in a status reply (nullptr when malld does not list it).
const nlohmann::json *status_job(const mall::CtlResult &status, const std::string &name) {
    if (!status.ok || !status.body.contains("jobs") || !status.body["jobs"].is_array()) return nullptr;
    for (const auto &j : status.body["jobs"])
        if (j.is_object() && j.value("job", std::string()) == name) return &j;
    return nullptr;
}
std::optional<CpuSet> status_cpus(const nlohmann::json &job, const char *field) {
    if (!job.contains(field) || !job[field].is_string()) return std::nullopt;
    return CpuSet::parse(job[field].get<std::string>());
}

// A new step of job `id` is about to get its cgroups from Slurm (see the top of the file): if
// malld holds the job on cpus beyond Slurm's cores here (`cpus`), pin it to those cores and wait
// until malld has narrowed its cgroups, so Slurm's write of the job cgroup succeeds. Released by
// release_hold() once the step's cgroups exist. Never fails the step.
void hold_for_step(uint32_t id, const CpuSet &cpus) {
    const std::string name = malld_job_name(id);
    std::string error;
    CallbackBudget budget;
    auto client = connect_to_malld(budget, &error);
    if (!client) return;  // malld away: it holds nothing to narrow either
    mall::CtlResult status = request_within(*client, budget, mall::proto::Type::Status, nlohmann::json::object());
    const nlohmann::json *job = status_job(status, name);
    if (!job) return;  // not a malleable job on this node (yet)
    // Only a job enforced in Slurm's own cgroups (task/cgroup) meets Slurm's write; in malld's
    // folders (proctrack/linuxproc + task/affinity) nothing of Slurm's is wider than its cores.
    bool in_place = false;
    if (job->contains("cgroups") && (*job)["cgroups"].is_array())
        for (const auto &c : (*job)["cgroups"])
            if (c.is_object() && c.value("in_place", false)) in_place = true;
    if (!in_place) return;
    auto published = status_cpus(*job, "cpus");
    auto enforced = status_cpus(*job, "cpuset");
    if (published && enforced && cpus.contains(*published) && cpus.contains(*enforced)) return;
    auto guaranteed = status_cpus(*job, "guaranteed");
    if (!guaranteed || !cpus.contains(*guaranteed) || guaranteed->empty()) {
        log_info("job %u: malld holds it on cpus %s beyond Slurm's cores %s, but its guaranteed cpus '%s' are not "
                 "inside them; not narrowed before the new step",
                 id, enforced ? enforced->to_string().c_str() : "?", cpus.to_string().c_str(),
                 job->value("guaranteed", std::string()).c_str());
        return;
    }
    std::string restore = "auto";
    if (job->value("pinned", false))
        if (auto pin = status_cpus(*job, "target")) restore = pin->to_string();
    auto t0 = std::chrono::steady_clock::now();
    mall::CtlResult set = request_within(*client, budget, mall::proto::Type::Set,
                                         {{"job", name}, {"cpus", guaranteed->to_string()}});
    if (!set.ok) {
        log_info("job %u: cannot narrow it to its Slurm cores %s before the new step: %s", id,
                 guaranteed->to_string().c_str(), set.error.c_str());
        return;
    }
    g_state.held_job = id;
    g_state.held_restore = restore;
    // malld tells the job first and waits for its ack (at most its ack timeout), then narrows.
    while (true) {
        mall::CtlResult now = request_within(*client, budget, mall::proto::Type::Status, nlohmann::json::object());
        const nlohmann::json *j = status_job(now, name);
        if (!j) {  // ended meanwhile: nothing to give back
            g_state.held_job.reset();
            return;
        }
        auto e = status_cpus(*j, "cpuset");
        if (e && guaranteed->contains(*e)) break;
        if (!now.ok || budget.left().count() <= 1) {
            log_info("job %u: malld did not narrow it to %s before the new step within the time budget "
                     "(cpuset %s); Slurm may refuse the step's cgroup", id, guaranteed->to_string().c_str(),
                     e ? e->to_string().c_str() : "?");
            return;
        }
        usleep(10000);  // polling interval
    }
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    log_info("job %u: narrowed to its Slurm cores %s for a new step in %.0f ms", id,
             guaranteed->to_string().c_str(), ms);
}

// The new step's cgroups exist: the job goes back to the policy (or the admin's pin).
void release_hold(const char *where) {
    if (!g_state.held_job) return;
    uint32_t id = *g_state.held_job;
    g_state.held_job.reset();
    bool unreachable = false;
    std::string error;
    auto result = ask_malld(mall::proto::Type::Set, {{"job", malld_job_name(id)}, {"cpus", g_state.held_restore}},
                            &unreachable, &error);
    if (unreachable || !result->ok)
        log_info("job %u: could not give it back to malld's policy in %s: %s", id, where,
                 unreachable ? error.c_str() : result->error.c_str());
}

// Slurm 22.05's and 24.11's loaders refuse a SPANK plugin of another release before it runs;
// a loader that does not (older ones skipped the check for spank) would run it with the other
// release's struct layouts: compare once per process and stay off, with the words of
// slurm_release.hpp (slurmd's and the step's logs, the user's srun/sbatch stderr), when the release
// differs. MALL_SPANK_BUILT_FOR (default SLURM_VERSION_NUMBER) lets a hand-made test build claim
// another release while its plugin_version still passes the loader.
#ifndef MALL_SPANK_BUILT_FOR
#define MALL_SPANK_BUILT_FOR SLURM_VERSION_NUMBER
#endif
bool right_release(spank_t sp) {
    if (g_state.release_checked) return !g_state.wrong_release;
    g_state.release_checked = true;
    char *major = nullptr, *minor = nullptr, *full = nullptr;  // S_SLURM_VERSION*: every context
    if (spank_get_item(sp, S_SLURM_VERSION_MAJOR, &major) != ESPANK_SUCCESS) major = nullptr;
    if (spank_get_item(sp, S_SLURM_VERSION_MINOR, &minor) != ESPANK_SUCCESS) minor = nullptr;
    if (spank_get_item(sp, S_SLURM_VERSION, &full) != ESPANK_SUCCESS) full = nullptr;
    if (auto text = mall::slurm::release_mismatch(MALL_SPANK_BUILT_FOR, major, minor, full)) {
        slurm_error("mall: %s", text->c_str());
        g_state.wrong_release = true;
    }
    return !g_state.wrong_release;
}

// Slurm calls slurm_spank_init in srun/sbatch/salloc and slurmstepd, but not in the job
// prolog/epilog process (22.05 goes straight to job_prolog/job_epilog), so every callback makes
// sure the release was checked and the arguments were read.
bool enabled(spank_t sp, int ac, char **av) {
    if (!right_release(sp)) return false;
    if (g_state.configured) return g_state.enabled;
    g_state.configured = true;
    std::string error;
    auto config = mall::slurm::parse_plugstack_args(ac, av, &error);
    if (!config) {
        // Logged in every context; jobs keep running (the plugin is loaded `optional`).
        slurm_error("mall: %s; the mall plugin is disabled, --malleable jobs run non-malleable", error.c_str());
        g_state.enabled = false;
        return false;
    }
    g_state.config = *config;
    g_state.enabled = true;
    return true;
}

}  // namespace

extern "C" {

MALL_SPANK_EXPORT int slurm_spank_init(spank_t sp, int ac, char **av) {
    try {
        enabled(sp, ac, av);
        spank_context_t context = spank_context();
        // Registered in every context (also when disabled, so scripts with --malleable still run):
        // sbatch/salloc only know options registered here, slurmstepd needs it to see the value.
        if (context == S_CTX_LOCAL || context == S_CTX_ALLOCATOR || context == S_CTX_REMOTE ||
            context == S_CTX_JOB_SCRIPT) {
            spank_err_t rc = spank_option_register(sp, &g_malleable_option);
            if (rc != ESPANK_SUCCESS)
                slurm_error("mall: cannot register --malleable: %s", spank_strerror(rc));
        }
        return 0;
    } catch (...) {
        return 0;
    }
}

// Remote (slurmstepd, root, before this step's tasks exist and before task/cgroup makes its
// cgroups): take the job's cores back from borrowers, and keep the job itself within them while
// Slurm writes the new step's cgroups. Done for every job, malleable or not: Slurm gave it these
// cores (the option cannot be read here in 22.05; malld's status says whether the job is malleable).
MALL_SPANK_EXPORT int slurm_spank_init_post_opt(spank_t sp, int ac, char **av) {
    try {
        if (!enabled(sp, ac, av) || spank_context() != S_CTX_REMOTE) return 0;
        auto id = job_id(sp);
        auto cpus = job_cpus_on_node(sp);
        if (id && cpus) reclaim_for_job(*id, *cpus, "step init");
        if (id && cpus) hold_for_step(*id, *cpus);
        return 0;
    } catch (...) {
        return 0;
    }
}

MALL_SPANK_EXPORT int slurm_spank_job_prolog(spank_t sp, int ac, char **av) {
    try {
        if (!enabled(sp, ac, av)) return 0;
        auto id = job_id(sp);
        auto cpus = job_cpus_on_node(sp);  // not provided to the prolog by Slurm 22.05
        if (id && cpus)
            reclaim_for_job(*id, *cpus, "job prolog");
        else if (id)
            reclaim_owner_only(*id);  // malld --slurm looks the cores up
        else
            log_debug("job prolog: no job id here; the reclaim happens at step start");
        return 0;
    } catch (...) {
        return 0;
    }
}

// Remote, root, in slurmstepd right after the task's fork (it has not exec'd yet; Slurm has put
// it in its step cgroup already). The step's cgroups exist, so a hold_for_step() ends here, after
// the task joined the job (it then grows with the job's earlier tasks).
MALL_SPANK_EXPORT int slurm_spank_task_post_fork(spank_t sp, int ac, char **av) {
    struct ReleaseHold {
        ~ReleaseHold() {
            try {
                release_hold("task_post_fork");
            } catch (...) {
            }
        }
    } release_hold_at_return;
    try {
        if (!enabled(sp, ac, av)) return 0;
        load_option(sp);
        if (!g_state.option_given) return 0;

        auto id = job_id(sp);
        uid_t uid = 0;
        pid_t pid = -1;
        uint32_t local_tasks = 1;
        if (!id || spank_get_item(sp, S_JOB_UID, &uid) != ESPANK_SUCCESS ||
            spank_get_item(sp, S_TASK_PID, &pid) != ESPANK_SUCCESS || pid <= 0) {
            tell_user("cannot read the job id, uid or task pid from Slurm; this job runs non-malleable");
            return 0;
        }
        if (spank_get_item(sp, S_JOB_LOCAL_TASK_COUNT, &local_tasks) != ESPANK_SUCCESS || local_tasks == 0)
            local_tasks = 1;
        auto guaranteed = job_cpus_on_node(sp);
        if (!guaranteed) {
            tell_user("Slurm did not say which cores job %u has on this node; this job runs non-malleable", *id);
            return 0;
        }

        MalleableLimits limits = limits_here(true);
        std::string error;
        auto request = mall::slurm::parse_malleable(g_state.option_bare ? nullptr : g_state.option_text.c_str(),
                                                    limits, &error);
        if (!request) {
            tell_user("%s; this job runs non-malleable", error.c_str());
            return 0;
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
            return 0;
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
        bool unreachable = false;
        auto result = ask_malld(mall::proto::Type::Register, body, &unreachable, &error);
        if (unreachable) {
            if (g_state.config.on_daemon_down == OnDaemonDown::Fail) {
                // The task itself stops in task_init (it prints why to its own stderr there: a message
                // sent from here right before a kill does not reach srun). Log it for the admin.
                log_info("job %u task pid %d: malld not reachable at %s (%s); on_daemon_down=fail", *id, pid,
                         g_state.config.socket.c_str(), error.c_str());
                return 0;
            }
            tell_user("malld not reachable at %s (%s); this job runs non-malleable", g_state.config.socket.c_str(),
                      error.c_str());
            return 0;
        }
        if (!result->ok) {
            tell_user("malld refused to register task %d of job %u: %s; this job runs non-malleable", pid, *id,
                      result->error.c_str());
            return 0;
        }
        log_info("job %u task pid %d registered: min %u max %u weight %g guaranteed %s, cpus %s", *id, pid, min,
                 max, request->weight, guaranteed->to_string().c_str(),
                 result->body.value("cpus", std::string()).c_str());
        return 0;
    } catch (const std::exception &e) {
        slurm_error("mall: task_post_fork: %s; this job runs non-malleable", e.what());
        return 0;
    } catch (...) {
        return 0;
    }
}

// Remote, as the user, in the task just before exec: tell libmall where malld is and which job
// it belongs to, so mall_open() in the task attaches by itself.
MALL_SPANK_EXPORT int slurm_spank_task_init(spank_t sp, int ac, char **av) {
    try {
        if (!enabled(sp, ac, av)) return 0;
        load_option(sp);
        if (!g_state.option_given) return 0;
        auto id = job_id(sp);  // S_JOB_ID is 0 here in 22.05: job_id() falls back to SLURM_JOB_ID
        if (!id) return 0;
        if (g_state.config.on_daemon_down == OnDaemonDown::Fail) {
            // Errors of an `optional` plugin are ignored by slurmstepd, and a `required` one that fails
            // drains the node: so the task ends itself, before exec, saying why on its own stderr.
            std::string error;
            if (!connect_to_malld(CallbackBudget(), &error)) {
                dprintf(STDERR_FILENO,
                        "mall: malld not reachable at %s (%s); on_daemon_down=fail: this --malleable task does "
                        "not run\n",
                        g_state.config.socket.c_str(), error.c_str());
                _exit(1);
            }
        }
        spank_setenv(sp, "MALL_SOCKET", g_state.config.socket.c_str(), 1);
        spank_setenv(sp, "MALL_JOB_ID", malld_job_name(*id).c_str(), 1);
        // The most cores this task may grow to (MAX per task, capped by the node and the admin's
        // max_cpus): what a framework sizes its pools for (mall.tensorflow.size_pools() reads it).
        const MalleableLimits limits = limits_here(true);
        std::string error;
        if (auto request = mall::slurm::parse_malleable(g_state.option_bare ? nullptr : g_state.option_text.c_str(),
                                                        limits, &error)) {
            unsigned max = mall::slurm::resolve_max(*request, limits);
            if (limits.node_cpus != 0 && (max == 0 || max > limits.node_cpus)) max = limits.node_cpus;
            if (max != 0) spank_setenv(sp, "MALL_MAX", std::to_string(max).c_str(), 1);
        }
        return 0;
    } catch (...) {
        return 0;
    }
}

// Remote, root: the task is gone; remove its pid (malld ends the job when no pid is left).
MALL_SPANK_EXPORT int slurm_spank_task_exit(spank_t sp, int ac, char **av) {
    try {
        if (!enabled(sp, ac, av)) return 0;
        load_option(sp);
        if (!g_state.option_given) return 0;
        auto id = job_id(sp);
        pid_t pid = -1;
        if (!id || spank_get_item(sp, S_TASK_PID, &pid) != ESPANK_SUCCESS || pid <= 0) return 0;
        nlohmann::json body = {{"job", malld_job_name(*id)}, {"pid", static_cast<int64_t>(pid)}};
        bool unreachable = false;
        std::string error;
        auto result = ask_malld(mall::proto::Type::Deregister, body, &unreachable, &error);
        if (!unreachable && !result->ok)  // e.g. never registered, or malld already dropped it
            log_debug("job %u: deregister pid %d: %s", *id, pid, result->error.c_str());
        return 0;
    } catch (...) {
        return 0;
    }
}

// Remote, root, at the end of slurmstepd: a step that pinned its job and never started a task
// (Slurm failed it before the fork) gives the job back here.
MALL_SPANK_EXPORT int slurm_spank_exit(spank_t sp, int ac, char **av) {
    try {
        if (!enabled(sp, ac, av) || spank_context() != S_CTX_REMOTE) return 0;
        release_hold("step exit");
        return 0;
    } catch (...) {
        return 0;
    }
}

// slurmd's epilog process, root: the job's reserved cores (and the job, if still registered) go
// back to the pool. Sent for every job, like the reclaim.
MALL_SPANK_EXPORT int slurm_spank_job_epilog(spank_t sp, int ac, char **av) {
    try {
        if (!enabled(sp, ac, av)) return 0;
        auto id = job_id(sp);
        if (!id) return 0;
        nlohmann::json body = {{"owner", malld_job_name(*id)}};
        bool unreachable = false;
        std::string error;
        auto result = ask_malld(mall::proto::Type::Release, body, &unreachable, &error);
        if (unreachable)
            log_info("job %u epilog: malld not reachable at %s (%s); nothing released", *id,
                     g_state.config.socket.c_str(), error.c_str());
        else if (!result->ok)
            log_info("job %u epilog: malld refused the release: %s", *id, result->error.c_str());
        return 0;
    } catch (...) {
        return 0;
    }
}

}  // extern "C"
