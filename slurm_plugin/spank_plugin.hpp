// SPDX-License-Identifier: BSD-3-Clause
// spank_plugin.hpp — what the files of the SPANK plugin mall_spank.so share; internal, never
// installed. One section per file: the process's plugin setup (spank_plugin.cpp), the --malleable
// option (spank_option.cpp), Slurm's cores on this node (spank_cores.cpp), the requests to malld
// (spank_malld.cpp) and the step hold (spank_step_hold.cpp); mall_spank.cpp holds the SPANK entry
// points and calls these. Contract for every function here: it never fails a job because malld is
// away, never drains a node; exceptions may leave it, and the entry points catch them all.
//
// Global state, all per process (each Slurm process — sbatch, srun, slurmstepd, the prolog — loads
// its own copy of the plugin), and kept in the file that owns it:
// - spank_plugin.cpp: the plugstack arguments and the release check (read by every file: config());
// - spank_option.cpp: whether and how --malleable was given;
// - spank_malld.cpp: whether this process already sent the job's Reclaim, and whether malld ran
//   out of time here (later callbacks then get a short budget);
// - spank_step_hold.cpp: the job this step pinned to its Slurm cores, and what to give back.
#pragma once

extern "C" {
#pragma GCC visibility push(default)
#include <slurm/slurm.h>
#include <slurm/spank.h>
#pragma GCC visibility pop
}

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/cpuset.hpp"
#include "common/ctl_client.hpp"
#include "common/protocol.hpp"
#include "malleable_option.hpp"
#include "plugstack_args.hpp"

namespace mall::spank {

// ---- spank_plugin.cpp: the process's plugin setup and log helpers ----

// The plugstack.conf arguments of this process (defaults until enabled() parsed them).
const mall::slurm::PlugstackConfig &config();
// Reads the plugstack arguments once per process, after checking Slurm's release once; false when
// either is wrong (said once in the logs and on the user's stderr): the plugin then stays off.
bool enabled(spank_t sp, int ac, char **av);
// This process found itself in another Slurm release than it was built for (enabled() said so).
bool wrong_release();

// slurm_error: reaches the user (srun's stderr, the batch job's output) as well as the logs.
__attribute__((format(printf, 1, 2))) void tell_user(const char *fmt, ...);
__attribute__((format(printf, 1, 2))) void log_info(const char *fmt, ...);
__attribute__((format(printf, 1, 2))) void log_debug(const char *fmt, ...);

// ---- spank_option.cpp: --malleable, its callback and what it was given ----

// The option registered in slurm_spank_init (Slurm keeps the pointer).
struct spank_option *malleable_option();
// Reads the option where the callback did not run (job prolog/epilog, task_init, task_post_fork):
// getopt, then the environment variable Slurm sets for the job. Nothing once it is known.
void load_option(spank_t sp);
bool option_given();
// The option as the user wrote it, for messages: "--malleable" or "--malleable=VALUE".
std::string option_display();
// The given value parsed against `limits` (malleable_option.hpp); nullopt with *error when invalid.
std::optional<mall::slurm::MalleableRequest> parse_given_option(const mall::slurm::MalleableLimits &limits,
                                                               std::string *error);
// The bounds here: the admin's min_cpus/max_cpus, and the node's cpus (on_node) or, in
// sbatch/salloc/srun with ask_slurmctld and outside a job, the largest node's of the cluster (one
// REQUEST_NODE_INFO: the whole node table); else unknown (0).
mall::slurm::MalleableLimits limits_here(bool on_node, bool ask_slurmctld = false);
// Whether this process runs inside a Slurm job (SLURM_JOB_ID set): srun in a batch script.
bool inside_job();
// The most cores a task on this node may grow to (MAX per task, capped by the node and max_cpus),
// exported to the task as MALL_MAX; nullopt when the value is invalid or the bound is unknown.
std::optional<unsigned> task_max_cpus();

// ---- spank_cores.cpp: the job and Slurm's cores on this node ----

// The job id: S_JOB_ID, else SLURM_JOB_ID from the task env (S_JOB_ID is 0 in task_init, 22.05).
std::optional<uint32_t> job_id(spank_t sp);
// The job's cores on this node as Linux cpus, from S_JOB_ALLOC_CORES (slurmstepd only); nullopt,
// logged, when Slurm gives none or they do not map onto this node.
std::optional<mall::CpuSet> job_cpus_on_node(spank_t sp);
// This node's cpus (hwloc, including disallowed ones; else sysconf); 0 when unknown.
unsigned node_cpu_count();
// The most cpus any node of the cluster has, from slurmctld through the host's libslurm; 0 when unknown.
unsigned largest_node_cpus();

// ---- spank_malld.cpp: the requests to malld, each within one callback's time budget ----

// malld's name for Slurm job `id`: "slurm-<id>", shared by all of the job's tasks on this node.
std::string malld_job_name(uint32_t id);

// One callback's time with malld: every connect and request of the callback draws on it. malld's
// ack timeout + 3 s; 0.5 s once malld ran out of time in this process.
class CallbackBudget {
public:
    CallbackBudget();
    // What is left, at least 1 ms (a request with no time left fails at once as timed out).
    std::chrono::milliseconds left() const;

private:
    std::chrono::steady_clock::time_point end_;
};
// Connects within the budget; nullopt with *error when malld cannot be reached.
std::optional<mall::CtlClient> connect_to_malld(const CallbackBudget &budget, std::string *error);
// A request within the budget; a transport failure (no answer in time) marks malld unresponsive.
mall::CtlResult request_within(mall::CtlClient &client, const CallbackBudget &budget, mall::proto::Type type,
                               const nlohmann::json &body);
// One request on a fresh connection and budget. nullopt + *unreachable (+ *error) when malld
// cannot be reached or does not answer in time.
std::optional<mall::CtlResult> ask_malld(mall::proto::Type type, const nlohmann::json &body, bool *unreachable,
                                         std::string *error);

// The job prolog's Reclaim naming only the owner (malld --slurm looks the cores up); false when
// not done (the reclaim then happens at step start).
bool reclaim_owner_only(uint32_t id);
// Takes the job's cores on this node back from borrowers, once per process; `where` is for the log.
void reclaim_for_job(uint32_t id, const mall::CpuSet &cpus, const char *where);
// Registers the task of this task_post_fork with malld (it joins the job "slurm-<id>"), or tells
// the user why the job runs non-malleable. The option must be loaded and given.
void register_task(spank_t sp);
// A task is gone: its pid leaves malld's job (malld ends the job when no pid is left).
void deregister_task(uint32_t id, pid_t pid);
// The job epilog: the job's reserved cores (and the job, if still registered) go back to the pool.
void release_job(uint32_t id);

// ---- spank_step_hold.cpp: a job kept within its Slurm cores while Slurm writes a new step's cgroups ----

// Pins job `id` to its Slurm cores `cpus` in malld and waits until enforced, if malld holds it
// beyond them in Slurm's own cgroups; remembered until release_hold(). Never fails the step.
void hold_for_step(uint32_t id, const mall::CpuSet &cpus);
// Gives a held job back to malld's policy (or the admin's earlier pin); nothing when none is held.
void release_hold(const char *where);

}  // namespace mall::spank
