// SPDX-License-Identifier: BSD-3-Clause
// spank_step_hold.cpp — a job kept within its Slurm cores while Slurm writes a new step's cgroups.
// Why: task/cgroup (task_cgroup_cpuset_create, in the new step's task_g_pre_setuid) writes the job
// cgroup's cpus back to Slurm's cores. On cgroup v1 the kernel refuses that (EBUSY: an earlier
// step's cgroup, grown in place, is wider), and Slurm fails the step ("Failed to invoke task
// plugins", "Slurmd could not execve job"); on v2 the write succeeds and silently takes the
// borrowed cpus from the running step behind malld's back. So for a job malld enforces in Slurm's
// cgroups (status: a cgroup in_place; never with proctrack/linuxproc + task/affinity, where malld's
// own folders hold the job), slurm_spank_init_post_opt (in the new step's slurmstepd, before
// task_g_pre_setuid) pins the job to its Slurm cores in malld and waits until they are enforced
// (hold_for_step), and the step's first task_post_fork (or the step's exit, if no task started)
// lets the policy have it again (release_hold). Contract: never fails the step; a hold that cannot
// be set up or confirmed in the callback's time budget is logged and the step goes on.
// Concurrent step starts of one job are not serialised: one step's release can regrow the job
// while another step's slurmstepd is between its check and Slurm's write.
#include <unistd.h>

#include <chrono>

#include "spank_plugin.hpp"

namespace mall::spank {
namespace {

using mall::CpuSet;

// The job this step pinned to its Slurm cores, and what to give back ("auto" or an admin's pin).
struct StepHold {
    std::optional<uint32_t> job;
    std::string restore;
};
StepHold g_hold;

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

}  // namespace

// A new step of job `id` is about to get its cgroups from Slurm: if malld holds the job on cpus
// beyond Slurm's cores here (`cpus`), pin it to those cores and wait until malld has narrowed its
// cgroups, so Slurm's write of the job cgroup succeeds.
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
    g_hold.job = id;
    g_hold.restore = restore;
    // malld tells the job first and waits for its ack (at most its ack timeout), then narrows.
    while (true) {
        mall::CtlResult now = request_within(*client, budget, mall::proto::Type::Status, nlohmann::json::object());
        const nlohmann::json *j = status_job(now, name);
        if (!j) {  // ended meanwhile: nothing to give back
            g_hold.job.reset();
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
    if (!g_hold.job) return;
    uint32_t id = *g_hold.job;
    g_hold.job.reset();
    bool unreachable = false;
    std::string error;
    auto result = ask_malld(mall::proto::Type::Set, {{"job", malld_job_name(id)}, {"cpus", g_hold.restore}},
                            &unreachable, &error);
    if (unreachable || !result->ok)
        log_info("job %u: could not give it back to malld's policy in %s: %s", id, where,
                 unreachable ? error.c_str() : result->error.c_str());
}

}  // namespace mall::spank
