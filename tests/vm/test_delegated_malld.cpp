// SPDX-License-Identifier: BSD-3-Clause
// malld under a delegated cgroup-v2 subtree, as a systemd unit with Delegate=yes starts it: malld
// moves itself into the leaf <subtree>/malld, enables cpuset below the subtree and keeps its job
// folders inside it (never at the root, which systemd owns); restarted in that leaf (systemd's
// DelegateSubgroup=malld) it re-adopts its jobs; in a subtree without the cpuset controller its
// folders stay at the root, with a warning that says how to delegate it. The test plays systemd: it makes the unit's cgroup
// (with cpuset enabled in its parents) and starts malld in it. Also the v2-only refusal: a job
// whose cgroup has no cpuset controller (its parent does not enable it) cannot be resized in place,
// so its registration is refused with words and mallrun does not run it (exit 1).
// Runs only inside tests/vm's guest (vm.cgroup_v2), where cgroup v2 has the cpuset controller; it
// fails, not skips, elsewhere.
#include <filesystem>

#include <gtest/gtest.h>

#include "../../libmall/src/daemon/procfs.hpp"
#include "support/malld_fixture.hpp"

MALL_TEST_WATCHDOG(240);

namespace mall::test {
namespace {

std::string proc_cgroup_v2(pid_t pid) { return process_cgroup(pid, true).value_or("?"); }

class DelegatedSubtree : public ::testing::Test {
protected:
    void SetUp() override {
        ASSERT_TRUE(cpuset_is_v2()) << "this test needs cgroup v2 with the cpuset controller (it runs in "
                                       "tests/vm's guest: ctest vm.cgroup_v2)";
        ASSERT_EQ(::geteuid(), 0u);
    }
};

TEST_F(DelegatedSubtree, MalldKeepsItsFoldersInTheSubtreeAndReadoptsFromItsLeaf) {
    TestCgroupTree slice("mall_slice_" + std::to_string(::getpid()));
    std::string error;
    const std::string unit = slice.make("malld.service", "0-1", &error);
    ASSERT_FALSE(unit.empty()) << error;
    const std::string unit_rel = unit.substr(cpuset_root().size());

    MalldOptions options;
    options.backend = "cgroup-v2";
    options.start_in_cgroup = unit;
    PrivateMalld malld(options);
    ASSERT_TRUE(malld.start(&error)) << error;
    EXPECT_EQ(proc_cgroup_v2(malld.pid()), unit_rel + "/malld") << malld.log();
    const std::string folders = unit + "/" + malld.cgroup_parent();
    EXPECT_NE(malld.log().find("own job folders go under " + folders), std::string::npos) << malld.log();
    EXPECT_FALSE(std::filesystem::exists(malld.cgroup_dir())) << "malld made a folder at the cgroup root";

    // A job launched from outside any job cgroup gets malld's folder, inside the subtree.
    Child a(mallrun_argv(malld.socket(), "1:2", "a", test_client_argv({"--threads", "2", "--step-us", "1000"})));
    ASSERT_TRUE(wait_until([&] { return job_settled_on(malld.socket(), "a", "0-1", 1); }, 20s)) << status_text(malld);
    auto job = job_status(malld.socket(), "a");
    ASSERT_TRUE(job);
    EXPECT_EQ(job->value("cgroup", ""), folders + "/job_a") << job->dump(2);
    const auto pids = job_pids(*job);
    ASSERT_FALSE(pids.empty());
    EXPECT_EQ(proc_cgroup_v2(pids.front()), unit_rel + "/" + malld.cgroup_parent() + "/job_a");
    EXPECT_EQ(trim(read_file(folders + "/job_a/cpuset.cpus.effective")), "0-1");

    // A second job: one cpu each, inside the subtree, no overlap.
    Child b(mallrun_argv(malld.socket(), "1:2", "b", test_client_argv({"--step-us", "1000"})));
    std::string cpus_a, cpus_b;
    ASSERT_TRUE(wait_until([&] {
        auto ja = job_status(malld.socket(), "a");
        auto jb = job_status(malld.socket(), "b");
        if (!ja || !jb || ja->value("ncpus", 0) != 1 || jb->value("ncpus", 0) != 1) return false;
        cpus_a = ja->value("cpus", "");
        cpus_b = jb->value("cpus", "");
        return job_settled_on(malld.socket(), "a", cpus_a, 1) && job_settled_on(malld.socket(), "b", cpus_b, 1);
    }, 20s)) << status_text(malld);
    EXPECT_NE(cpus_a, cpus_b);
    EXPECT_EQ(trim(read_file(folders + "/job_a/cpuset.cpus.effective")), cpus_a);
    EXPECT_EQ(trim(read_file(folders + "/job_b/cpuset.cpus.effective")), cpus_b);
    EXPECT_TRUE(threads_all_on(pids, cpus_a)) << describe_threads(pids);

    // Killed and started again in its leaf (what systemd's DelegateSubgroup=malld does: the unit's
    // cgroup now enables cpuset for children, so it can hold no process itself): re-adopted.
    malld.kill9();
    ASSERT_TRUE(malld.restart_in_cgroup(unit + "/malld", &error)) << error;
    ASSERT_TRUE(wait_until([&] { return job_settled_on(malld.socket(), "a", cpus_a, 1); }, 20s)) << status_text(malld);
    EXPECT_NE(malld.log().find("re-adopted job a"), std::string::npos) << malld.log();
    EXPECT_EQ(proc_cgroup_v2(malld.pid()), unit_rel + "/malld");
    EXPECT_EQ(trim(read_file(folders + "/job_a/cpuset.cpus.effective")), cpus_a);
    b.signal_group(SIGTERM);
    ASSERT_TRUE(b.wait_exit(10s).has_value());
    ASSERT_TRUE(wait_until([&] { return job_settled_on(malld.socket(), "a", "0-1", 1); }, 20s)) << status_text(malld);
    EXPECT_FALSE(std::filesystem::exists(folders + "/job_b")) << "an ended job's folder stayed";
}

TEST_F(DelegatedSubtree, ASubtreeWithoutCpusetKeepsTheFoldersAtTheRootAndSaysHowToDelegateIt) {
    TestCgroupTree slice("mall_plain_" + std::to_string(::getpid()));
    std::string error;
    ASSERT_FALSE(slice.make("", "0-1", &error).empty()) << error;
    // A unit whose parent does not enable cpuset for its children (no Delegate=).
    const std::string unit = slice.root() + "/plain.service";
    ASSERT_EQ(::mkdir(unit.c_str(), 0755), 0) << std::strerror(errno);
    ASSERT_FALSE(std::filesystem::exists(unit + "/cpuset.cpus"));

    MalldOptions options;
    options.backend = "cgroup-v2";
    options.start_in_cgroup = unit;
    PrivateMalld malld(options);
    ASSERT_TRUE(malld.start(&error)) << error;
    EXPECT_NE(malld.log().find("was not given the cpuset controller"), std::string::npos) << malld.log();
    EXPECT_NE(malld.log().find("Delegate=yes"), std::string::npos) << malld.log();
    EXPECT_FALSE(std::filesystem::exists(unit + "/malld")) << "malld changed a subtree it was not given";
    Child a(mallrun_argv(malld.socket(), "1:2", "a", test_client_argv({"--step-us", "1000"})));
    ASSERT_TRUE(wait_until([&] { return job_settled_on(malld.socket(), "a", "0-1", 1); }, 20s)) << status_text(malld);
    auto job = job_status(malld.socket(), "a");
    ASSERT_TRUE(job);
    EXPECT_EQ(job->value("cgroup", ""), malld.cgroup_dir() + "/job_a") << job->dump(2);
}

TEST_F(DelegatedSubtree, AJobCgroupWithoutCpusetIsRefusedWithWordsAndNothingChanges) {
    TestCgroupTree runtime("mall_runtime_" + std::to_string(::getpid()));
    std::string error;
    ASSERT_FALSE(runtime.make("", "0-1", &error).empty()) << error;
    // A runtime's cgroup for the job, made without the cpuset controller.
    const std::string job = runtime.root() + "/ctr";
    ASSERT_EQ(::mkdir(job.c_str(), 0755), 0) << std::strerror(errno);
    PrivateMalld malld;
    ASSERT_TRUE(malld.start(&error)) << error;
    auto run = run_command({"/bin/sh", "-c",
                            "echo $$ > '" + job + "/cgroup.procs' && exec '" + bin_path("mallrun") +
                                "' --socket '" + malld.socket() + "' --malleable=1:2 --job ctr -- /bin/echo ran"});
    EXPECT_EQ(run.exit_code, 1) << run.out << run.err;
    EXPECT_EQ(run.out.find("ran"), std::string::npos) << "a refused job ran: " << run.out;
    EXPECT_NE(run.err.find("cannot resize in place"), std::string::npos) << run.err;
    EXPECT_NE(run.err.find("cpuset controller is not enabled"), std::string::npos) << run.err;
    EXPECT_FALSE(job_status(malld.socket(), "ctr")) << status_text(malld);
    EXPECT_FALSE(std::filesystem::exists(job + "/cpuset.cpus")) << "malld enabled a controller in a cgroup it does not own";
    EXPECT_FALSE(std::filesystem::exists(malld.cgroup_dir() + "/job_ctr"));
}

}  // namespace
}  // namespace mall::test
