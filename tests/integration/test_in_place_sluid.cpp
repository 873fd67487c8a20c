// SPDX-License-Identifier: BSD-3-Clause
// Slurm >= 26.05 names a job's cgroup v2 folder by its SLUID (e.g. sEKNKTV3WPV500), not job_<id>
// (cgroup.conf CgroupJobIdPaths=no, the default): proves malld finds and resizes such a job's
// cgroup from its task's /proc/PID/cgroup and never builds a path from the Slurm job id.
// The test plays slurmstepd: <root>/slurmstepd.scope/<SLUID>/step_0 (v1: the task lives in step_0;
// v2: in step_0/user/task_0, with slurmstepd's own step_0/slurm beside it), cpu 0 for the job,
// registered as Slurm's plugin names it (slurm-3385). Checked as a user would: the task's cgroup
// never changes, that cgroup follows `mallctl status --json` and `mallctl set`, the SLUID folder
// widens before its step, no job_3385 or job_slurm-3385 folder appears anywhere, and at the end
// the task's cgroup gets back cpu 0. Runs on cgroup v1 here and on v2 in tests/vm's guest.
#include <signal.h>

#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "../../libmall/src/daemon/procfs.hpp"
#include "support/malld_fixture.hpp"

MALL_TEST_WATCHDOG(180);

namespace mall::test {
namespace {

constexpr const char *kSluid = "sEKNKTV3WPV500";  // cgroup.conf(5)'s example SLUID
constexpr const char *kJob = "slurm-3385";           // the plugin's name for Slurm job 3385

std::string proc_cgroup(pid_t pid) { return process_cgroup(pid, cpuset_is_v2()).value_or("?"); }
std::string applied_cpus(const std::string &dir) {
    return trim(read_file(dir + (cpuset_is_v2() ? "/cpuset.cpus.effective" : "/cpuset.cpus")));
}

// Every folder under `root` (itself included) whose name starts with job_ : what a path built
// from a job id would have made.
std::vector<std::string> job_id_folders(const std::string &root) {
    std::vector<std::string> found;
    std::error_code ec;
    if (!std::filesystem::is_directory(root, ec)) return found;
    for (auto it = std::filesystem::recursive_directory_iterator(root, ec);
         it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
        if (ec) break;
        if (it->is_directory(ec) && it->path().filename().string().rfind("job_", 0) == 0)
            found.push_back(it->path().string());
    }
    return found;
}

TEST(InPlaceSluid, AJobCgroupNamedBySluidIsResizedWhereItLives) {
    MALL_REQUIRE_ROOT_AND_CPUSET();
    TestCgroupTree tree("mall_sluid_" + std::to_string(::getpid()));
    std::string error;
    const std::string scope = std::string("slurmstepd.scope/") + kSluid;
    const std::string job_dir = tree.make(scope, "0", &error);
    ASSERT_FALSE(job_dir.empty()) << error;
    const std::string step_dir = tree.make(scope + "/step_0", "0", &error);
    ASSERT_FALSE(step_dir.empty()) << error;
    std::string task_dir = step_dir;
    if (cpuset_is_v2()) {  // v2: processes only in leaves, as Slurm's cgroup/v2 lays them out
        ASSERT_FALSE(tree.make(scope + "/step_0/slurm", "", &error).empty()) << error;
        task_dir = tree.make(scope + "/step_0/user/task_0", "0", &error);
        ASSERT_FALSE(task_dir.empty()) << error;
    }
    PrivateMalld malld;
    ASSERT_TRUE(malld.start(&error)) << error;

    // The task, placed in its step's cgroup by "slurmstepd" before it registers.
    const std::string cmd = "echo $$ > '" + task_dir + "/cgroup.procs' && exec";
    std::vector<std::string> argv{"/bin/sh", "-c", cmd};
    for (const auto &a : mallrun_argv(malld.socket(), "1:2", kJob, test_client_argv({"--threads", "2", "--step-us", "1000"})))
        argv.back() += " '" + a + "'";
    Child task(argv);
    pid_t pid = -1;
    ASSERT_TRUE(wait_until([&] {
        auto j = job_status(malld.socket(), kJob);
        if (!j || job_pids(*j).empty()) return false;
        pid = job_pids(*j).front();
        return true;
    }, 20s)) << status_text(malld);
    const std::string task_rel = task_dir.substr(cpuset_root().size());
    EXPECT_EQ(proc_cgroup(pid), task_rel);

    // Alone, it grows to 0-1 in its SLUID-named cgroup: the SLUID folder widened first.
    auto describe = [&] {
        return "task cgroup " + applied_cpus(task_dir) + ", SLUID folder " + trim(read_file(job_dir + "/cpuset.cpus")) +
               ", threads " + describe_threads({pid}) + "\n" + status_text(malld);
    };
    ASSERT_TRUE(wait_until([&] {
        return job_settled_on(malld.socket(), kJob, "0-1", 1) && applied_cpus(task_dir) == "0-1" && threads_all_on({pid}, "0-1");
    }, 20s)) << describe();
    EXPECT_EQ(trim(read_file(job_dir + "/cpuset.cpus")), "0-1");
    auto j = job_status(malld.socket(), kJob);
    ASSERT_TRUE(j);
    EXPECT_EQ(j->value("cgroup", ""), task_dir) << j->dump(2);
    ASSERT_TRUE((*j)["cgroups"].is_array() && !(*j)["cgroups"].empty()) << j->dump(2);
    EXPECT_TRUE((*j)["cgroups"][0].value("in_place", false)) << j->dump(2);

    // An admin pins it to cpu 1, then gives it back to the policy: the same cgroup follows.
    for (const std::string cpus : {"1", "auto"}) {
        auto set = run_command(mallctl_argv(malld.socket(), {"set", kJob, "--cpus", cpus}));
        ASSERT_EQ(set.exit_code, 0) << set.out << set.err;
        const std::string want = cpus == "auto" ? "0-1" : cpus;
        ASSERT_TRUE(wait_until([&] {
            return job_settled_on(malld.socket(), kJob, want, 1) && applied_cpus(task_dir) == want && threads_all_on({pid}, want);
        }, 20s)) << describe();
        EXPECT_EQ(proc_cgroup(pid), task_rel) << "malld moved the task out of Slurm's cgroup";
    }
    EXPECT_TRUE(job_id_folders(tree.root()).empty() && job_id_folders(malld.cgroup_dir()).empty())
        << "a folder named from a job id appeared: "
        << ::testing::PrintToString(job_id_folders(tree.root())) << " "
        << ::testing::PrintToString(job_id_folders(malld.cgroup_dir()));

    // The task ends: the registration goes, its cgroup gets back cpu 0.
    task.signal_group(SIGTERM);
    ASSERT_TRUE(task.wait_exit(10s).has_value());
    ASSERT_TRUE(wait_until([&] { return !job_status(malld.socket(), kJob); }, 10s)) << status_text(malld);
    EXPECT_TRUE(wait_until([&] { return trim(read_file(task_dir + "/cpuset.cpus")) == "0"; }, 5s))
        << describe();
    EXPECT_TRUE(std::filesystem::exists(task_dir)) << "malld removed a cgroup it did not make";
}

}  // namespace
}  // namespace mall::test
