// SPDX-License-Identifier: BSD-3-Clause
// mall_spank.cpp — the Slurm SPANK plugin "mall": the `--malleable[=MIN[:MAX]][,weight=W]` option,
// and the malld requests around a job's life (Reclaim before its tasks run, Register/Deregister per
// task, with the job's weight; Release at the end). Contract: never fails a job because malld is
// away (unless the admin chose on_daemon_down=fail, and then only the task), never drains a node,
// never lets an exception out.
// This file holds the symbols Slurm's loader looks up and the SPANK entry points, which only say
// what happens when; the files doing it are listed in spank_plugin.hpp (option, cores on this node,
// malld requests, step hold, plugin setup).
//
// What Slurm 22.05 lets a SPANK plugin do, and how the plugin copes (checked on this machine kind):
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
//   process, its later callbacks get 0.5 s (CallbackBudget, spank_malld.cpp).
// - Job ids: task_init sees S_JOB_ID 0 (a 22.05 bug), so it reads SLURM_JOB_ID from the task env.
// - Cores: S_JOB_ALLOC_CORES gives Slurm's abstract core ids on this node; common/slurm_cpu_map.hpp
//   maps them to Linux cpus as slurmd does (malld maps the prolog's lookup with the same code).
// - The job prolog (a separate process under slurmd) gets no core list in 22.05 (S_JOB_ALLOC_CORES
//   is a slurmstepd item and the prolog environment has no cpu list). The Reclaim happens in
//   slurm_spank_init_post_opt of each step, as root, before that step's tasks start (later steps
//   find the cores already reserved and skip it). With prolog_lookup=yes the prolog also sends a
//   Reclaim naming only the owner and malld (started with --slurm) asks slurmctld for the job's
//   cores on this node: earlier, at one RPC per job and node (off by default: issue 39).
// - Where the task is when it registers: task_post_fork runs in slurmstepd after proctrack_g_add
//   and task_g_pre_set_affinity (src/slurmd/slurmstepd/mgr.c, _fork_all_tasks), so with
//   proctrack/cgroup + task/cgroup the task already sits in Slurm's step cgroup (v1:
//   cpuset/slurm_<node>/uid_<uid>/job_<id>/step_<step>, which slurmstepd shares; v2:
//   .../job_<id>/step_<step>/user/task_<n> or task_special) and has not exec'd yet: malld reads
//   that cgroup from /proc/PID/cgroup and resizes it in place.
// - A later step of a job malld has grown: Slurm writes the job cgroup's cpus back to its own
//   cores when the step starts, which fails (v1) or takes borrowed cpus behind malld's back (v2);
//   slurm_spank_init_post_opt therefore pins the job to its Slurm cores first, and the step's first
//   task_post_fork (or its exit) lets it go (spank_step_hold.cpp says why and how).
#include <unistd.h>

#include <cstdio>
#include <exception>
#include <string>

#include "common/rules.hpp"
#include "spank_plugin.hpp"

#define MALL_SPANK_EXPORT __attribute__((visibility("default")))

// The plugin symbols Slurm's loader looks up. SPANK_PLUGIN() inside C++ gives them internal
// linkage ("Plugin name/type/version symbol missing"), hence explicit extern "C" + extern const.
extern "C" {
MALL_SPANK_EXPORT extern const char plugin_name[] = "mall";
MALL_SPANK_EXPORT extern const char plugin_type[] = "spank";
MALL_SPANK_EXPORT extern const unsigned int plugin_version = SLURM_VERSION_NUMBER;
MALL_SPANK_EXPORT extern const unsigned int spank_plugin_version = 1;
}

using namespace mall::spank;

extern "C" {

MALL_SPANK_EXPORT int slurm_spank_init(spank_t sp, int ac, char **av) {
    try {
        enabled(sp, ac, av);
        spank_context_t context = spank_context();
        // Registered in every context (also when disabled, so scripts with --malleable still run):
        // sbatch/salloc only know options registered here, slurmstepd needs it to see the value.
        if (context == S_CTX_LOCAL || context == S_CTX_ALLOCATOR || context == S_CTX_REMOTE ||
            context == S_CTX_JOB_SCRIPT) {
            spank_err_t rc = spank_option_register(sp, malleable_option());
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
        else if (id && config().prolog_lookup)
            reclaim_owner_only(*id);  // malld --slurm looks the cores up (one RPC to slurmctld)
        else
            log_debug("job prolog: no core list here; the reclaim happens at step start");
        return 0;
    } catch (...) {
        return 0;
    }
}

// Remote, root, in slurmstepd right after the task's fork (it has not exec'd yet; Slurm has put
// it in its step cgroup already): the task registers with malld. The step's cgroups exist, so a
// hold_for_step() ends here, after the task joined the job (it then grows with the job's earlier
// tasks).
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
        if (!option_given()) return 0;
        register_task(sp);
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
        if (!option_given()) return 0;
        auto id = job_id(sp);  // S_JOB_ID is 0 here in 22.05: job_id() falls back to SLURM_JOB_ID
        if (!id) return 0;
        if (config().on_daemon_down == mall::slurm::OnDaemonDown::Fail) {
            // Errors of an `optional` plugin are ignored by slurmstepd, and a `required` one that fails
            // drains the node: so the task ends itself, before exec, saying why on its own stderr.
            std::string error;
            if (!connect_to_malld(CallbackBudget(), &error)) {
                dprintf(STDERR_FILENO,
                        "mall: malld not reachable at %s (%s); on_daemon_down=fail: this --malleable task does "
                        "not run\n",
                        config().socket.c_str(), error.c_str());
                _exit(1);
            }
        }
        spank_setenv(sp, mall::kSocketEnv, config().socket.c_str(), 1);
        spank_setenv(sp, mall::kJobIdEnv, malld_job_name(*id).c_str(), 1);
        // The most cores this task may grow to: what a framework sizes its pools for
        // (mall.tensorflow.size_pools() reads it).
        if (auto max = task_max_cpus()) spank_setenv(sp, mall::kMaxEnv, std::to_string(*max).c_str(), 1);
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
        if (!option_given()) return 0;
        auto id = job_id(sp);
        pid_t pid = -1;
        if (!id || spank_get_item(sp, S_TASK_PID, &pid) != ESPANK_SUCCESS || pid <= 0) return 0;
        deregister_task(*id, pid);
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
        release_job(*id);
        return 0;
    } catch (...) {
        return 0;
    }
}

}  // extern "C"
