// SPDX-License-Identifier: BSD-3-Clause
// Enforcement in place: a job whose processes live in a cgroup someone else made (here the test
// plays Slurm: <root> for the job, step_0 and step_0/task_0 below it; the job lives in step_0 on
// v1, in the leaf task_0 on v2) is resized in that very cgroup.
// Checked as a user would: /proc/PID/cgroup never changes, the step's (and its task cgroup's)
// cpuset follows `mallctl status --json`, ancestors widen before a growth, the job's threads'
// Cpus_allowed_list follow, a second job never overlaps it, a restarted malld re-adopts it without
// a write, and at the end the cgroup gets back the cpus its resource manager gave it. Also a
// container job's folder with an engine's cgroup inside it (ContainerFolder). Runs on the
// cgroup-v1 cpuset here and on cgroup v2 in tests/vm's virtual machine.
#include <signal.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <set>

#include <gtest/gtest.h>

#include "../../libmall/src/common/ctl_client.hpp"
#include "../../libmall/src/daemon/procfs.hpp"
#include "support/malld_fixture.hpp"

MALL_TEST_WATCHDOG(240);

namespace mall::test {
namespace {

using nlohmann::json;

// The cgroup of pid in the cpuset hierarchy, as /proc/PID/cgroup names it (malld's own reader).
std::string proc_cgroup(pid_t pid) { return process_cgroup(pid, cpuset_is_v2()).value_or("?"); }

// What applies to a cgroup's processes: v1 cpuset.cpus, v2 cpuset.cpus.effective.
std::string applied_cpus(const std::string &dir) {
    return trim(read_file(dir + (cpuset_is_v2() ? "/cpuset.cpus.effective" : "/cpuset.cpus")));
}

std::string rel_of(const std::string &dir) { return dir.substr(cpuset_root().size()); }

// `sh -c 'echo $$ > DIR/cgroup.procs && exec ARGV...'`: ARGV starts inside DIR, as a task that
// Slurm's slurmstepd (or a container runtime) placed in its cgroup.
std::vector<std::string> started_in(const std::string &dir, const std::vector<std::string> &argv) {
    std::string cmd = "echo $$ > '" + dir + "/cgroup.procs' && exec";
    for (const auto &a : argv) cmd += " '" + a + "'";
    return {"/bin/sh", "-c", cmd};
}

void write_text(const std::string &path, const std::string &text) {
    std::ofstream out(path);
    out << text << std::endl;
}

// The pid of the job's registered process (mallrun's child), once malld lists it.
pid_t registered_pid(const std::string &socket, const std::string &job) {
    pid_t pid = -1;
    wait_until([&] {
        auto j = job_status(socket, job);
        if (!j) return false;
        auto pids = job_pids(*j);
        if (pids.empty()) return false;
        pid = pids.front();
        return true;
    }, 20s);
    return pid;
}

class InPlace : public ::testing::Test {
protected:
    void SetUp() override {
        MALL_REQUIRE_ROOT_AND_CPUSET();
        tree_ = std::make_unique<TestCgroupTree>("mall_rm_" + std::to_string(::getpid()));
        std::string error;
        // As Slurm would for a job given cpu 0: the job's cgroup, its step, a task cgroup below.
        // On v1 the job's processes live in the step and one more in the task cgroup below it
        // (malld must narrow that one first). On v2 processes live in leaves only (a cgroup that
        // enables cpuset for children holds none), as with Slurm's cgroup/v2: the job lives in
        // the task cgroup, and the step and job cgroups are its ancestors.
        job_dir_ = tree_->make("", "0", &error);
        ASSERT_FALSE(job_dir_.empty()) << error;
        const std::string step = tree_->make("step_0", "0", &error);
        ASSERT_FALSE(step.empty()) << error;
        const std::string task = tree_->make("step_0/task_0", "0", &error);
        ASSERT_FALSE(task.empty()) << error;
        step_dir_ = cpuset_is_v2() ? task : step;
        task_dir_ = task;
        malld_ = std::make_unique<PrivateMalld>();
        ASSERT_TRUE(malld_->start(&error)) << error;
    }
    void TearDown() override {
        side_.reset();
        job_.reset();
        malld_.reset();
        tree_.reset();
    }

    // The job "rm": mallrun started inside the step cgroup (so mallrun and its child live there),
    // plus a process of the job in the task cgroup below it (not registered: it is the cgroup, not
    // the pid, that malld resizes).
    void start_job_in_step(const std::vector<std::string> &extra = {}) {
        job_ = std::make_unique<Child>(started_in(
            step_dir_, mallrun_argv(malld_->socket(), "1:2", "rm",
                                    test_client_argv({"--threads", "2", "--step-us", "1000"}), extra)));
        side_ = std::make_unique<Child>(started_in(task_dir_, {"/bin/sleep", "300"}));
        ASSERT_TRUE(wait_until([&] { return proc_cgroup(side_->pid()) == rel_of(task_dir_); }, 5s));
    }

    bool settled_everywhere(pid_t pid, const std::string &cpus) {
        return job_settled_on(malld_->socket(), "rm", cpus, 1) && applied_cpus(step_dir_) == cpus &&
               applied_cpus(task_dir_) == cpus && threads_all_on({pid, side_->pid()}, cpus);
    }

    std::string describe(pid_t pid) {
        return "step " + applied_cpus(step_dir_) + ", task " + applied_cpus(task_dir_) + ", job " +
               trim(read_file(job_dir_ + "/cpuset.cpus")) + "; threads " +
               describe_threads({pid, side_->pid()}) + "\n" + status_text(*malld_);
    }

    std::unique_ptr<TestCgroupTree> tree_;
    std::string job_dir_;
    std::string step_dir_;  // where the job's processes live (v1: step_0; v2: step_0/task_0)
    std::string task_dir_;  // where the extra process lives (step_0/task_0: below it on v1)
    std::unique_ptr<PrivateMalld> malld_;
    std::unique_ptr<Child> job_, side_;
};

TEST_F(InPlace, AJobInAResourceManagersCgroupIsResizedWhereItLives) {
    start_job_in_step();
    const pid_t pid = registered_pid(malld_->socket(), "rm");
    ASSERT_GT(pid, 0) << status_text(*malld_);

    // Alone on the node, the job grows from its cpu 0 to the pool 0-1: its cgroup's ancestors
    // widened first (the job cgroup), then the step, then the task cgroup below, then the threads.
    ASSERT_TRUE(wait_until([&] { return settled_everywhere(pid, "0-1"); }, 20s)) << describe(pid);
    EXPECT_EQ(trim(read_file(job_dir_ + "/cpuset.cpus")), "0-1");
    EXPECT_EQ(proc_cgroup(pid), rel_of(step_dir_)) << "malld moved the job's process out of its cgroup";
    EXPECT_EQ(proc_cgroup(side_->pid()), rel_of(task_dir_));
    auto j = job_status(malld_->socket(), "rm");
    ASSERT_TRUE(j);
    EXPECT_EQ(j->value("cgroup", ""), step_dir_) << j->dump(2);
    ASSERT_TRUE((*j)["cgroups"].is_array() && (*j)["cgroups"].size() == 1) << j->dump(2);
    EXPECT_EQ((*j)["cgroups"][0].value("path", ""), step_dir_);
    EXPECT_TRUE((*j)["cgroups"][0].value("in_place", false));
    EXPECT_FALSE(std::filesystem::exists(malld_->cgroup_dir() + "/job_rm"))
        << "malld made a folder of its own for a job that lives in a cgroup of its own";
    auto table = run_command(mallctl_argv(malld_->socket(), {"status"}));
    EXPECT_NE(table.out.find("in place  " + step_dir_), std::string::npos) << table.out;

    // An admin moves it to cpu 1 (narrowing: the task cgroup before the step), then to cpu 0 (a
    // move: widen to 0-1 everywhere, then narrow to 0), as a user would check each time.
    for (const std::string cpus : {"1", "0"}) {
        auto set = run_command(mallctl_argv(malld_->socket(), {"set", "rm", "--cpus", cpus}));
        ASSERT_EQ(set.exit_code, 0) << set.out << set.err;
        ASSERT_TRUE(wait_until([&] { return settled_everywhere(pid, cpus); }, 20s)) << describe(pid);
        EXPECT_EQ(proc_cgroup(pid), rel_of(step_dir_));
    }
    auto back = run_command(mallctl_argv(malld_->socket(), {"set", "rm", "--cpus", "auto"}));
    ASSERT_EQ(back.exit_code, 0) << back.out << back.err;
    ASSERT_TRUE(wait_until([&] { return settled_everywhere(pid, "0-1"); }, 20s)) << describe(pid);

    // A second job (mallrun from the root: a folder of malld's own) arrives: the first shrinks to
    // one cpu in its own cgroup, the second gets the other; their cgroups never overlap.
    Child other(mallrun_argv(malld_->socket(), "1:2", "other", test_client_argv({"--step-us", "1000"})));
    ASSERT_TRUE(wait_until([&] {
        auto s = status_json(malld_->socket());
        auto a = s ? find_job(*s, "rm") : std::nullopt;
        auto b = s ? find_job(*s, "other") : std::nullopt;
        return a && b && a->value("ncpus", 0) == 1 && b->value("ncpus", 0) == 1 &&
               job_settled_on(malld_->socket(), "rm", a->value("cpus", ""), 1) &&
               job_settled_on(malld_->socket(), "other", b->value("cpus", ""), 1);
    }, 20s)) << describe(pid);
    auto a = job_status(malld_->socket(), "rm");
    auto b = job_status(malld_->socket(), "other");
    ASSERT_TRUE(a && b);
    EXPECT_EQ(applied_cpus(step_dir_), a->value("cpus", ""));
    EXPECT_EQ(applied_cpus(task_dir_), a->value("cpus", ""));
    EXPECT_TRUE(threads_all_on({pid}, a->value("cpus", ""))) << describe_threads({pid});
    EXPECT_EQ(b->value("cgroup", ""), malld_->cgroup_dir() + "/job_other");
    EXPECT_EQ(applied_cpus(malld_->cgroup_dir() + "/job_other"), b->value("cpus", ""));
    EXPECT_NE(a->value("cpus", ""), b->value("cpus", ""));
    EXPECT_EQ(proc_cgroup(pid), rel_of(step_dir_));

    // The job ends: its cgroup gets back what its resource manager gave it (cpu 0), and the
    // process left in the task cgroup is still there.
    job_->signal_group(SIGTERM);
    ASSERT_TRUE(job_->wait_exit(10s).has_value());
    ASSERT_TRUE(wait_until([&] { return !job_status(malld_->socket(), "rm"); }, 10s)) << status_text(*malld_);
    EXPECT_TRUE(wait_until([&] { return trim(read_file(step_dir_ + "/cpuset.cpus")) == "0"; }, 5s))
        << describe(pid);
    EXPECT_EQ(proc_cgroup(side_->pid()), rel_of(task_dir_));
    EXPECT_TRUE(std::filesystem::exists(step_dir_)) << "malld removed a cgroup it did not make";
}

TEST_F(InPlace, ARestartedMalldReadoptsTheCgroupWithoutWritingAndStillGivesItBack) {
    start_job_in_step();
    const pid_t pid = registered_pid(malld_->socket(), "rm");
    ASSERT_GT(pid, 0);
    ASSERT_TRUE(wait_until([&] { return settled_everywhere(pid, "0-1"); }, 20s)) << describe(pid);
    auto set = run_command(mallctl_argv(malld_->socket(), {"set", "rm", "--cpus", "1"}));
    ASSERT_EQ(set.exit_code, 0) << set.err;
    ASSERT_TRUE(wait_until([&] { return settled_everywhere(pid, "1"); }, 20s)) << describe(pid);

    // Killed, restarted: the step cgroup keeps cpu 1 (no write: its modification time stays).
    // malld's state writer saves in the background: kill it only once the file has the change.
    const std::string state_path = malld_->state_dir() + "/malld.state.json";
    auto saved_cpuset = [&]() -> std::string {
        try {
            std::ifstream in(state_path);
            const nlohmann::json state = nlohmann::json::parse(in);
            for (const auto &job : state.at("jobs"))
                if (job.at("job") == "rm") return job.value("cpuset", std::string());
        } catch (const std::exception &) {
        }
        return "";
    };
    ASSERT_TRUE(wait_until([&] { return saved_cpuset() == "1"; }, 10s)) << read_file(state_path);
    malld_->kill9();
    struct stat before {};
    ASSERT_EQ(::stat((step_dir_ + "/cpuset.cpus").c_str(), &before), 0);
    std::string error;
    ASSERT_TRUE(malld_->restart(&error)) << error;
    ASSERT_TRUE(wait_until([&] { return job_settled_on(malld_->socket(), "rm", "1"); }, 20s)) << describe(pid);
    struct stat after {};
    ASSERT_EQ(::stat((step_dir_ + "/cpuset.cpus").c_str(), &after), 0);
    EXPECT_EQ(before.st_mtim.tv_sec, after.st_mtim.tv_sec);
    EXPECT_EQ(before.st_mtim.tv_nsec, after.st_mtim.tv_nsec) << "the restarted malld wrote the job's cgroup";
    EXPECT_EQ(applied_cpus(step_dir_), "1");
    auto j = job_status(malld_->socket(), "rm");
    ASSERT_TRUE(j);
    EXPECT_EQ(j->value("cgroup", ""), step_dir_) << j->dump(2);
    EXPECT_NE(malld_->log().find("re-adopted job rm"), std::string::npos) << malld_->log();

    // It still acts in place, and at the end gives back the cpu the resource manager gave.
    auto again = run_command(mallctl_argv(malld_->socket(), {"set", "rm", "--cpus", "0-1"}));
    ASSERT_EQ(again.exit_code, 0) << again.err;
    ASSERT_TRUE(wait_until([&] { return settled_everywhere(pid, "0-1"); }, 20s)) << describe(pid);
    job_->signal_group(SIGTERM);
    ASSERT_TRUE(job_->wait_exit(10s).has_value());
    EXPECT_TRUE(wait_until([&] { return trim(read_file(step_dir_ + "/cpuset.cpus")) == "0"; }, 10s))
        << describe(pid);
}

TEST_F(InPlace, ModeOwnMovesTheJobAndModeInPlaceRefusesTheRoot) {
    // --cgroup own: the process leaves the step cgroup for malld's folder.
    start_job_in_step({"--cgroup", "own"});
    const pid_t pid = registered_pid(malld_->socket(), "rm");
    ASSERT_GT(pid, 0);
    ASSERT_TRUE(wait_until([&] { return proc_cgroup(pid) == rel_of(malld_->cgroup_dir() + "/job_rm"); }, 20s))
        << proc_cgroup(pid) << "\n" << status_text(*malld_);
    auto j = job_status(malld_->socket(), "rm");
    ASSERT_TRUE(j);
    EXPECT_FALSE((*j)["cgroups"][0].value("in_place", true)) << j->dump(2);

    // --cgroup in-place from the root: refused with words, nothing runs, nothing registered.
    auto refused = run_command(mallrun_argv(malld_->socket(), "1:2", "rooted", {"/bin/true"}, {"--cgroup", "in-place"}));
    EXPECT_EQ(refused.exit_code, 1) << refused.out << refused.err;
    EXPECT_NE(refused.err.find("no cgroup of its own to resize in place"), std::string::npos) << refused.err;
    EXPECT_FALSE(job_status(malld_->socket(), "rooted"));

    auto bad = run_command(mallrun_argv(malld_->socket(), "1:2", "x", {"/bin/true"}, {"--cgroup", "sideways"}));
    EXPECT_EQ(bad.exit_code, 2);
    EXPECT_NE(bad.err.find("use auto, own or in-place"), std::string::npos) << bad.err;
}

// Membership by cgroup: a process that enters the job's cgroup from the side (as `podman exec` or a
// second step does: not a descendant of any registered process) attaches to the job; the same
// program outside the job's cgroups is refused with words.
TEST_F(InPlace, AProcessThatEntersTheJobsCgroupFromTheSideAttaches) {
    start_job_in_step();
    const pid_t pid = registered_pid(malld_->socket(), "rm");
    ASSERT_GT(pid, 0);
    ASSERT_TRUE(wait_until([&] { return settled_everywhere(pid, "0-1"); }, 20s)) << describe(pid);
    ChildOptions env;
    env.env = {{"MALL_SOCKET", malld_->socket()}, {"MALL_JOB_ID", "rm"}};
    Child side(started_in(step_dir_, test_client_argv({"--step-us", "1000"})), env);
    auto line = side.wait_for_line_starting("open ", 20s);
    ASSERT_TRUE(line) << "the side process printed nothing";
    EXPECT_EQ(*line, "open rc=0 job=rm") << malld_->log();
    EXPECT_TRUE(wait_until([&] { return job_settled_on(malld_->socket(), "rm", "0-1", 2); }, 20s))
        << status_text(*malld_);
    EXPECT_TRUE(threads_all_on({side.pid()}, "0-1")) << describe_threads({side.pid()});

    Child outsider(test_client_argv({"--step-us", "1000"}), env);
    auto refused = outsider.wait_for_line_starting("open ", 20s);
    ASSERT_TRUE(refused);
    EXPECT_EQ(*refused, "open rc=-3 job=") << malld_->log();
    EXPECT_NE(malld_->log().find("nor in one of its cgroups"), std::string::npos) << malld_->log();
}

// A cgroup made below malld's own folder for a job (as `podman run --cgroup-parent=<that folder>`
// makes a container's) follows the job: narrowed before the folder (v1 refuses a parent narrower
// than a child), widened after it, its process never moved. (cgroup v1; see the comment inside.)
TEST_F(InPlace, ACgroupBelowMalldsOwnFolderFollowsTheJob) {
    Child job(mallrun_argv(malld_->socket(), "1:2", "own", test_client_argv({"--step-us", "1000"})));
    ASSERT_TRUE(wait_until([&] { return job_settled_on(malld_->socket(), "own", "0-1", 1); }, 20s)) << status_text(*malld_);
    const std::string folder = malld_->cgroup_dir() + "/job_own";
    // Checked on cgroup v1 only: on v2 a folder that holds the job's process cannot enable cpuset
    // for a child ("no internal processes"), so there a container's cgroup cannot sit below the
    // folder of a job whose process lives in it (issue 14 gives container jobs an empty folder).
    if (cpuset_is_v2()) return;
    const std::string below = folder + "/ctr";
    ASSERT_EQ(::mkdir(below.c_str(), 0755), 0) << std::strerror(errno);
    write_text(below + "/cpuset.cpus", "0-1");
    write_text(below + "/cpuset.mems", trim(read_file(folder + "/cpuset.mems")));
    Child inside(started_in(below, {"/bin/sleep", "120"}));
    ASSERT_TRUE(wait_until([&] { return proc_cgroup(inside.pid()) == rel_of(below); }, 5s));

    for (const std::string cpus : {"1", "0-1", "0"}) {
        auto set = run_command(mallctl_argv(malld_->socket(), {"set", "own", "--cpus", cpus}));
        ASSERT_EQ(set.exit_code, 0) << set.err;
        EXPECT_TRUE(wait_until([&] {
            return job_settled_on(malld_->socket(), "own", cpus, 1) && applied_cpus(folder) == cpus &&
                   applied_cpus(below) == cpus && threads_all_on({inside.pid()}, cpus);
        }, 20s)) << cpus << ": folder " << applied_cpus(folder) << ", below " << applied_cpus(below) << "\n"
                 << status_text(*malld_);
        EXPECT_EQ(proc_cgroup(inside.pid()), rel_of(below));
    }
    inside.signal(SIGKILL);
    inside.wait_exit(5s);
    ::rmdir(below.c_str());
}

// Two tasks of one job in two different cgroups (two steps of a Slurm job, as `join` registers
// them): malld says so in its log, lists both, resizes both in place, and moves neither.
TEST_F(InPlace, TasksOfOneJobInTwoCgroupsAreEachResizedWhereTheyLive) {
    std::string error;
    const std::string other_leaf = tree_->make(cpuset_is_v2() ? "step_1/task_0" : "step_1", "0", &error);
    ASSERT_FALSE(other_leaf.empty()) << error;
    Child task1(started_in(step_dir_, {"/bin/sleep", "120"}));
    Child task2(started_in(other_leaf, {"/bin/sleep", "120"}));
    ASSERT_TRUE(wait_until([&] {
        return proc_cgroup(task1.pid()) == rel_of(step_dir_) && proc_cgroup(task2.pid()) == rel_of(other_leaf);
    }, 5s));
    auto ctl = CtlClient::connect(malld_->socket(), &error);
    ASSERT_TRUE(ctl) << error;
    json first{{"job", "slurm-5"}, {"uid", 0}, {"pids", {task1.pid()}}, {"min", 1}, {"max", 2}, {"join", true}};
    auto r1 = ctl->request(proto::Type::Register, first, 20s);
    ASSERT_TRUE(r1.ok) << r1.error;
    json second = first;
    second["pids"] = {task2.pid()};
    auto r2 = ctl->request(proto::Type::Register, second, 20s);
    ASSERT_TRUE(r2.ok) << r2.error;

    ASSERT_TRUE(wait_until([&] {
        return job_settled_on(malld_->socket(), "slurm-5", "0-1") && applied_cpus(step_dir_) == "0-1" &&
               applied_cpus(other_leaf) == "0-1" && threads_all_on({task1.pid(), task2.pid()}, "0-1");
    }, 20s)) << status_text(*malld_);
    auto j = job_status(malld_->socket(), "slurm-5");
    ASSERT_TRUE(j);
    ASSERT_EQ((*j)["cgroups"].size(), 2u) << j->dump(2);
    EXPECT_EQ((*j)["cgroups"][0].value("path", ""), step_dir_);
    EXPECT_EQ((*j)["cgroups"][1].value("path", ""), other_leaf);
    EXPECT_NE(malld_->log().find("slurm-5's processes live in several cgroups"), std::string::npos) << malld_->log();

    auto set = run_command(mallctl_argv(malld_->socket(), {"set", "slurm-5", "--cpus", "1"}));
    ASSERT_EQ(set.exit_code, 0) << set.err;
    EXPECT_TRUE(wait_until([&] {
        return job_settled_on(malld_->socket(), "slurm-5", "1") && applied_cpus(step_dir_) == "1" &&
               applied_cpus(other_leaf) == "1" && threads_all_on({task1.pid(), task2.pid()}, "1");
    }, 20s)) << status_text(*malld_);
    EXPECT_EQ(proc_cgroup(task1.pid()), rel_of(step_dir_));
    EXPECT_EQ(proc_cgroup(task2.pid()), rel_of(other_leaf));
}

// A container job (mallrun --container) on this cgroup version: malld makes the job's folder, the
// engine's runtime makes the container's cgroup inside it (--cgroup-parent) and starts the
// container's process there, detached. The engine here is a script named podman that does what
// runc does with the cgroupfs driver (v1: cpus and mems copied from the parent; v2: nothing, the
// parent enables cpuset for it), so the same check runs in tests/vm's cgroup-v2 guest, where
// podman and docker cannot run; tests/containers/test_container_jobs.sh drives the real engines.
TEST(ContainerFolder, AnEnginesCgroupInsideAContainerJobsFolderFollowsTheJob) {
    MALL_REQUIRE_ROOT_AND_CPUSET();
    PrivateMalld malld;
    std::string error;
    ASSERT_TRUE(malld.start(&error)) << error;
    const std::string engine = malld.dir() + "/podman";
    write_text(engine,
               "#!/bin/sh\n"
               "# plays `podman run -d`: the container's cgroup in --cgroup-parent, its process there\n"
               "root='" + cpuset_root() + "' parent=\n"
               "for a; do case $a in --cgroup-parent=*) parent=${a#--cgroup-parent=} ;; esac; done\n"
               "[ -n \"$parent\" ] || { echo 'no --cgroup-parent' >&2; exit 125; }\n"
               "dir=$root$parent/libpod-fake\n"
               "mkdir \"$dir\" || exit 125\n"
               "if [ -f \"$dir/cpuset.mems\" ] && [ -z \"$(cat \"$dir/cpuset.mems\")\" ]; then\n"
               "  cat \"$root$parent/cpuset.cpus\" > \"$dir/cpuset.cpus\"; cat \"$root$parent/cpuset.mems\" > \"$dir/cpuset.mems\"\n"
               "fi\n"
               "while [ $# -gt 0 ] && [ \"$1\" != IMAGE ]; do shift; done; shift\n"
               "setsid sh -c 'echo $$ > \"$0/cgroup.procs\" && exec \"$@\"' \"$dir\" \"$@\" </dev/null >/dev/null 2>&1 &\n"
               "# like podman run -d, return once the container's process runs in its cgroup\n"
               "while [ -z \"$(cat \"$dir/cgroup.procs\")\" ]; do sleep 0.01; done\n"
               "echo started\n");
    ASSERT_EQ(::chmod(engine.c_str(), 0755), 0);
    std::vector<std::string> argv{bin_path("mallrun"), "--socket", malld.socket(), "--container",
                                  "--malleable=1:2", "--job", "ctr", "--require", "--", engine, "run", "-d", "IMAGE"};
    for (const auto &a : test_client_argv({"--threads", "2", "--step-us", "1000", "--duration-s", "120"}))
        argv.push_back(a);
    auto run = run_command(argv);
    ASSERT_EQ(run.exit_code, 0) << run.err;
    const std::string folder = malld.cgroup_dir() + "/job_ctr";
    const std::string container = folder + "/libpod-fake";

    // The container's process joins the job from its cgroup and attaches (MALL_JOB_ID from mallrun).
    pid_t pid = -1;
    ASSERT_TRUE(wait_until([&] {
        auto j = job_status(malld.socket(), "ctr");
        if (!j || j->value("attached", 0) < 1) return false;
        for (pid_t p : job_pids(*j))
            if (proc_cgroup(p) == rel_of(container)) pid = p;
        return pid > 0;
    }, 20s)) << status_text(malld);
    auto j = job_status(malld.socket(), "ctr");
    ASSERT_TRUE(j);
    EXPECT_TRUE(j->value("container", false)) << j->dump(2);
    EXPECT_EQ(j->value("cgroup", ""), folder) << j->dump(2);

    // It follows mallctl set inside the engine's cgroup, threads included, and comes back.
    for (const std::string cpus : {"1", "0-1"}) {
        auto set = run_command(mallctl_argv(malld.socket(), {"set", "ctr", "--cpus", cpus == "0-1" ? "auto" : cpus}));
        ASSERT_EQ(set.exit_code, 0) << set.err;
        EXPECT_TRUE(wait_until([&] {
            return job_settled_on(malld.socket(), "ctr", cpus, 1) && applied_cpus(container) == cpus &&
                   threads_all_on({pid}, cpus);
        }, 20s)) << "want " << cpus << ": container cgroup " << applied_cpus(container) << ", threads "
                 << describe_threads({pid}) << "\n" << status_text(malld);
    }
    EXPECT_EQ(proc_cgroup(pid), rel_of(container)) << "malld moved the container's process";

    // The container's last process ends: so does the job, and the folders go.
    ASSERT_EQ(::kill(pid, SIGKILL), 0);
    EXPECT_TRUE(wait_until([&] { return !job_status(malld.socket(), "ctr"); }, 10s)) << status_text(malld);
    EXPECT_TRUE(wait_until([&] { return !std::filesystem::exists(folder); }, 10s))
        << folder << " left behind";
}

}  // namespace
}  // namespace mall::test
