// SPDX-License-Identifier: BSD-3-Clause
// test_register_boundaries.cpp — where an admin's or root's Register may put processes (issue 37,
// point 7), attacked as the users who would attack it (helpers: support/attackers.hpp):
// - An --admin-uid (61001, a forked child that setresuid()s to it) sends Register for pid 1, kthreadd
//   and a kworker, malld itself and its parent, and root's own process in its own name: each is
//   refused with words naming the pid and why, `mallctl status --json` lists no job, and pid 1's
//   cgroup is unchanged; the same admin may register its own process, and root may register a
//   user's task for that user (the Slurm plugin's Register) but not another user's process.
// - Root's processes are root's: the admin uid cannot register a root process for job uid 0, nor a
//   process running as root under a user's real uid, nor a user's process whose child stays root
//   (malld would move it with its descendants), nor resize in place a cgroup that also holds root's
//   process. Its container jobs hold another uid's process
//   only in a user namespace the job's uid made: another user's `unshare --user` (uid 61003) is
//   refused for uid 61002, accepted for 61003; a process of a subordinate uid (61004) in 61002's
//   namespace joins no plain job of 61002 by saying "container": true, but may be 61002's
//   container job.
// - Reserved job names (common/rules.hpp): mallrun's default name for ./self-play.sh registers
//   (run-self-play.sh-<pid>), mallrun --job self-7 (and a user's --job slurm-5) is refused with
//   words, and the admin uid's Register of slurm-5 is refused.
// Self-registration (point 4) is test_self_register_boundaries.cpp's.
// Runs on the machine's cpuset controller: cgroup v1 here, cgroup v2 in tests/vm's guest.
#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>

#include <gtest/gtest.h>

#include "../../libmall/src/daemon/procfs.hpp"
#include "common/ctl_client.hpp"
#include "common/protocol.hpp"
#include "mall/mall.h"
#include "support/malld_fixture.hpp"
#include "support/attackers.hpp"

MALL_TEST_WATCHDOG(240);

namespace mall::test {
namespace {

using nlohmann::json;

// A kernel worker thread: a child of kthreadd (pid 2) other than kthreadd itself.
pid_t some_kworker() {
    DIR *d = ::opendir("/proc");
    pid_t found = -1;
    while (dirent *e = d ? ::readdir(d) : nullptr) {
        const pid_t pid = static_cast<pid_t>(std::atol(e->d_name));
        if (pid <= 2) continue;
        if (parent_pid(pid) == 2) {
            found = pid;
            break;
        }
    }
    if (d) ::closedir(d);
    return found;
}

// A private malld with --admin-uid 61001 (kAdminUid), started for each test.
class AdminUidMalld : public ::testing::Test {
protected:
    void SetUp() override {
        MALL_REQUIRE_ROOT_AND_CPUSET();
        MalldOptions options;
        options.extra_args = {"--admin-uid", std::to_string(kAdminUid)};
        malld_ = std::make_unique<PrivateMalld>(options);
        std::string error;
        ASSERT_TRUE(malld_->start(&error)) << error;
    }
    void TearDown() override { malld_.reset(); }
    std::unique_ptr<PrivateMalld> malld_;
};

// ---------------------------------------------------------------------------------------------
// Point 7: an --admin-uid may register only processes a job may hold.
class Issue37AdminUidRegister : public AdminUidMalld {
protected:
    void SetUp() override {
        AdminUidMalld::SetUp();
        if (IsSkipped() || HasFatalFailure()) return;
        pid1_cgroup_ = read_file("/proc/1/cgroup");
    }
    void TearDown() override {
        if (malld_) {
            EXPECT_EQ(read_file("/proc/1/cgroup"), pid1_cgroup_) << "pid 1 was moved";
        }
        AdminUidMalld::TearDown();
    }

    // Register {pid} for job `job` of uid `job_uid`, sent by a process of uid `sender`; `extra`'s
    // fields ("container", "join") are added to the request.
    std::string register_as(uid_t sender, const std::string &job, pid_t pid, uid_t job_uid,
                            const json &extra = json::object()) {
        json body{{"job", job}, {"uid", job_uid}, {"pids", {pid}}, {"min", 1}, {"max", 1}};
        body.update(extra);
        if (sender == 0) return ask(malld_->socket(), proto::Type::Register, body);
        Peer peer(sender, "", [&] { return ask(malld_->socket(), proto::Type::Register, body); });
        return peer.result();
    }

    // The admin uid's Register of pid is refused with MALL_ERR_DENIED, in words that name the pid
    // and `reason`; no job appears.
    void expect_admin_refused(pid_t pid, const std::string &reason) {
        const std::string job = "grab-" + std::to_string(pid);
        const std::string reply = register_as(kAdminUid, job, pid, kAdminUid);
        EXPECT_EQ(reply.rfind("refused " + std::to_string(MALL_ERR_DENIED) + " ", 0), 0u)
            << "Register of pid " << pid << " by admin uid " << kAdminUid << ": " << reply;
        EXPECT_NE(reply.find("pid " + std::to_string(pid)), std::string::npos) << reply;
        EXPECT_TRUE(contains_icase(reply, reason)) << "the refusal should say '" << reason << "': " << reply;
        const auto jobs = listed_jobs(malld_->socket());
        EXPECT_TRUE(std::find(jobs.begin(), jobs.end(), job) == jobs.end())
            << "mallctl status --json lists " << job << "\n" << status_text(*malld_);
    }

    std::string pid1_cgroup_;
};

TEST_F(Issue37AdminUidRegister, AnAdminUidCannotRegisterPid1) {
    expect_admin_refused(1, "init process");
    EXPECT_TRUE(listed_jobs(malld_->socket()).empty()) << status_text(*malld_);
}

TEST_F(Issue37AdminUidRegister, AnAdminUidCannotRegisterKernelThreads) {
    ASSERT_EQ(parent_pid(2), 0) << "pid 2 is not kthreadd here (a pid namespace?)";
    expect_admin_refused(2, "kernel thread");
    const pid_t kworker = some_kworker();
    ASSERT_GT(kworker, 2) << "no child of kthreadd found in /proc";
    expect_admin_refused(kworker, "kernel thread");
    EXPECT_TRUE(listed_jobs(malld_->socket()).empty()) << status_text(*malld_);
}

TEST_F(Issue37AdminUidRegister, AnAdminUidCannotRegisterMalldOrItsAncestors) {
    const std::string malld_cgroup = cgroup_of(malld_->pid());
    expect_admin_refused(malld_->pid(), "malld itself");
    const auto parent = parent_pid(malld_->pid());
    ASSERT_TRUE(parent && *parent > 1);
    expect_admin_refused(*parent, "ancestor of malld");
    EXPECT_EQ(cgroup_of(malld_->pid()), malld_cgroup) << "malld was moved";
    EXPECT_TRUE(listed_jobs(malld_->socket()).empty()) << status_text(*malld_);
}

TEST_F(Issue37AdminUidRegister, AnAdminUidCannotRegisterRootsProcessInItsOwnName) {
    Child roots({"/bin/sleep", "120"});
    ASSERT_TRUE(roots.started());
    const std::string before = cgroup_of(roots.pid());
    expect_admin_refused(roots.pid(), "runs as uid 0");
    EXPECT_EQ(cgroup_of(roots.pid()), before) << "root's process was moved";
    EXPECT_TRUE(listed_jobs(malld_->socket()).empty()) << status_text(*malld_);
}

// The control: the refusals above are about the pids, not the admin's role.
TEST_F(Issue37AdminUidRegister, AnAdminUidMayRegisterItsOwnProcess) {
    Child own(sleeper_as(kAdminUid));
    ASSERT_TRUE(own.started());
    ASSERT_TRUE(wait_until([&] { return runs_as(own.pid(), kAdminUid); }, 10s));
    const std::string reply = register_as(kAdminUid, "admins-own", own.pid(), kAdminUid);
    EXPECT_EQ(reply.rfind("ok ", 0), 0u) << reply << "\n" << malld_->log();
    const auto jobs = listed_jobs(malld_->socket());
    EXPECT_TRUE(std::find(jobs.begin(), jobs.end(), "admins-own") != jobs.end()) << status_text(*malld_);
}

// The Slurm plugin registers the user's task for the user's uid, as root; the task may still run
// as root then (slurmstepd's child between fork and setuid). Another user's process is refused.
TEST_F(Issue37AdminUidRegister, RootRegistersAUsersTaskForThatUserButNotAnotherUsersProcess) {
    Child task(sleeper_as(kUserUid));
    ASSERT_TRUE(task.started());
    ASSERT_TRUE(wait_until([&] { return runs_as(task.pid(), kUserUid); }, 10s));
    std::string reply = register_as(0, "slurm-3701", task.pid(), kUserUid);
    EXPECT_EQ(reply.rfind("ok ", 0), 0u) << reply << "\n" << malld_->log();

    Child not_yet_setuid({"/bin/sleep", "120"});
    ASSERT_TRUE(not_yet_setuid.started());
    reply = register_as(0, "slurm-3702", not_yet_setuid.pid(), kUserUid);
    EXPECT_EQ(reply.rfind("ok ", 0), 0u) << reply << "\n" << malld_->log();

    Child someone_elses(sleeper_as(kOtherUserUid));
    ASSERT_TRUE(someone_elses.started());
    ASSERT_TRUE(wait_until([&] { return runs_as(someone_elses.pid(), kOtherUserUid); }, 10s));
    reply = register_as(0, "slurm-3703", someone_elses.pid(), kUserUid);
    EXPECT_EQ(reply.rfind("refused " + std::to_string(MALL_ERR_DENIED) + " ", 0), 0u) << reply;
    EXPECT_NE(reply.find("pid " + std::to_string(someone_elses.pid()) + " runs as uid " +
                         std::to_string(kOtherUserUid)),
              std::string::npos)
        << reply;
    const auto jobs = listed_jobs(malld_->socket());
    EXPECT_TRUE(std::find(jobs.begin(), jobs.end(), "slurm-3703") == jobs.end()) << status_text(*malld_);
}

// Root's processes are root's alone: the job's uid is the caller's word, so an admin uid that names
// uid 0 for a root process must be refused (before, real uid 0 == job uid 0 let it take sshd,
// slurmd or any root service, moved into malld's folder in `own` mode).
TEST_F(Issue37AdminUidRegister, AnAdminUidCannotRegisterARootProcessForUid0) {
    Child roots({"/bin/sleep", "120"});
    ASSERT_TRUE(roots.started());
    const std::string before = cgroup_of(roots.pid());
    const std::string reply = register_as(kAdminUid, "roots-job", roots.pid(), 0, json{{"cgroup", "own"}});
    EXPECT_EQ(reply.rfind("refused " + std::to_string(MALL_ERR_DENIED) + " ", 0), 0u) << reply;
    EXPECT_TRUE(contains_icase(reply, "a job of uid 0 (root) is registered only by that uid or root")) << reply;
    EXPECT_TRUE(listed_jobs(malld_->socket()).empty()) << status_text(*malld_);
    EXPECT_EQ(cgroup_of(roots.pid()), before) << "root's process was moved";
}

// A process whose real uid is the user's but which runs as root (a setuid-root program): root's too.
TEST_F(Issue37AdminUidRegister, AnAdminUidCannotRegisterAProcessRunningAsRootUnderAUsersRealUid) {
    const std::string u = std::to_string(kUserUid);
    Child setuid_root({"/usr/bin/setpriv", "--ruid=" + u, "--rgid=" + u, "--clear-groups", "--", "/bin/sleep", "120"});
    ASSERT_TRUE(setuid_root.started());
    ASSERT_TRUE(wait_until([&] { return runs_as(setuid_root.pid(), kUserUid); }, 10s));
    const std::string reply = register_as(kAdminUid, "setuid-job", setuid_root.pid(), kUserUid);
    EXPECT_EQ(reply.rfind("refused " + std::to_string(MALL_ERR_DENIED) + " ", 0), 0u) << reply;
    EXPECT_TRUE(contains_icase(reply, "pid " + std::to_string(setuid_root.pid()) + " runs as uid 0 (root)")) << reply;
    EXPECT_TRUE(listed_jobs(malld_->socket()).empty()) << status_text(*malld_);
}

// malld moves (or pins) a registered process with all its descendants, so the uid rule holds for
// them too: a user's login shell whose child runs as root (`sudo -s`) is not the admin uid's to
// take. Here the named process (uid 61002) forked a child that stayed root before dropping to the
// user; the refusal names the child and nothing moves.
TEST_F(Issue37AdminUidRegister, AnAdminUidCannotRegisterAProcessWhoseDescendantRunsAsRoot) {
    const std::string u = std::to_string(kUserUid);
    Child shell({"/bin/sh", "-c", "/bin/sleep 120 & exec setpriv --reuid=" + u + " --regid=" + u +
                                      " --clear-groups -- /bin/sleep 120"});
    ASSERT_TRUE(shell.started());
    ASSERT_TRUE(wait_until([&] { return runs_as(shell.pid(), kUserUid); }, 10s));
    std::vector<pid_t> children;
    ASSERT_TRUE(wait_until([&] { return (children = descendants_of(shell.pid())).size() == 1; }, 10s));
    const pid_t roots_child = children.front();
    ASSERT_TRUE(runs_as(roots_child, 0));
    const std::string child_file = "/proc/" + std::to_string(roots_child) + "/cgroup";
    const std::string shell_before = cgroup_of(shell.pid()), child_before = read_file(child_file);
    for (const char *mode : {"own", "auto"}) {
        const std::string job = std::string("shell-") + mode;
        const std::string reply = register_as(kAdminUid, job, shell.pid(), kUserUid, json{{"cgroup", mode}});
        EXPECT_EQ(reply.rfind("refused " + std::to_string(MALL_ERR_DENIED) + " ", 0), 0u) << mode << ": " << reply;
        EXPECT_TRUE(contains_icase(reply, "pid " + std::to_string(roots_child) + ", a descendant of pid " +
                                              std::to_string(shell.pid())))
            << reply;
        EXPECT_TRUE(contains_icase(reply, "runs as uid 0 (root)")) << reply;
        EXPECT_EQ(read_file(child_file), child_before) << "root's child was moved (" << mode << ")";
        EXPECT_EQ(cgroup_of(shell.pid()), shell_before) << "the named process was moved (" << mode << ")";
        EXPECT_TRUE(listed_jobs(malld_->socket()).empty()) << status_text(*malld_);
    }
    // The control: root (the Slurm plugin) may still register it.
    const std::string reply = register_as(0, "roots-shell", shell.pid(), kUserUid);
    EXPECT_EQ(reply.rfind("ok ", 0), 0u) << reply << "\n" << malld_->log();
}

// Resizing a cgroup in place confines every process in it: an admin uid may not register a user's
// process in place where the cgroup also holds root's process (a step cgroup shared with a root
// service). The cgroup keeps its cpus and no job appears.
TEST_F(Issue37AdminUidRegister, AnAdminUidCannotResizeInPlaceACgroupThatHoldsRootsProcess) {
    TestCgroupTree tree("mall_admin_inplace_" + std::to_string(::getpid()));
    std::string error;
    const std::string shared = tree.make("shared", "0-1", &error);
    ASSERT_FALSE(shared.empty()) << error;
    Child roots({"/bin/sh", "-c", "echo $$ > " + shared + "/cgroup.procs && exec /bin/sleep 120"});
    Child users(sleeper_as(kUserUid, shared));
    ASSERT_TRUE(roots.started() && users.started());
    ASSERT_TRUE(wait_until([&] { return cgroup_of(roots.pid()) == relative(shared); }, 10s));
    ASSERT_TRUE(wait_until([&] { return runs_as(users.pid(), kUserUid); }, 10s));
    ASSERT_EQ(cgroup_of(users.pid()), relative(shared));
    const std::string reply =
        register_as(kAdminUid, "in-shared", users.pid(), kUserUid, json{{"cgroup", "in-place"}});
    EXPECT_EQ(reply.rfind("refused " + std::to_string(MALL_ERR_DENIED) + " ", 0), 0u) << reply;
    EXPECT_TRUE(contains_icase(reply, "pid " + std::to_string(roots.pid()) + ", in cgroup " + shared)) << reply;
    EXPECT_TRUE(contains_icase(reply, "runs as uid 0 (root)")) << reply;
    EXPECT_TRUE(listed_jobs(malld_->socket()).empty()) << status_text(*malld_);
    EXPECT_EQ(cgroup_cpus(shared).value_or("?"), "0-1") << "the shared cgroup was resized";
}

// A rootless user namespace (unshare --user as uid 61003) belongs to its maker: an admin uid's
// container job for uid 61002 may not take it (before, any process in any other user namespace was
// accepted); for 61003, whose container it is, it may.
TEST_F(Issue37AdminUidRegister, AnotherUsersRootlessNamespaceIsNotAnAdminsContainerJob) {
    const std::string u = std::to_string(kOtherUserUid);
    Child rootless({"/usr/bin/setpriv", "--reuid=" + u, "--regid=" + u, "--clear-groups", "--",
                    "/usr/bin/unshare", "--user", "--", "/bin/sleep", "120"});
    ASSERT_TRUE(rootless.started());
    ASSERT_TRUE(wait_until([&] { return runs_as(rootless.pid(), kOtherUserUid) &&
                                        shares_user_namespace(rootless.pid()) == false; }, 10s))
        << "unshare --user did not start a process of uid " << u << " in a namespace of its own";
    ASSERT_EQ(user_namespace_owner(rootless.pid()), kOtherUserUid);
    std::string reply = register_as(kAdminUid, "ns-theirs", rootless.pid(), kUserUid, json{{"container", true}});
    EXPECT_EQ(reply.rfind("refused " + std::to_string(MALL_ERR_DENIED) + " ", 0), 0u) << reply;
    EXPECT_TRUE(contains_icase(reply, "in a user namespace made by uid " + u)) << reply;
    EXPECT_TRUE(listed_jobs(malld_->socket()).empty()) << status_text(*malld_);
    reply = register_as(kAdminUid, "ns-own", rootless.pid(), kOtherUserUid, json{{"container", true}});
    EXPECT_EQ(reply.rfind("ok ", 0), 0u) << reply << "\n" << malld_->log();
    EXPECT_EQ(listed_jobs(malld_->socket()), std::vector<std::string>{"ns-own"}) << status_text(*malld_);
}

// A process in a user namespace that uid `owner` made, running as host uid `mapped` (root wrote
// the namespace's uid_map "0 mapped 1", as newuidmap does from /etc/subuid for a rootless
// container): a rootless container's process of a subordinate uid. It lives until destroyed.
class MappedNamespaceProcess {
public:
    MappedNamespaceProcess(uid_t owner, uid_t mapped) {
        int unshared[2], mapped_pipe[2];
        if (::pipe2(unshared, O_CLOEXEC) != 0 || ::pipe2(mapped_pipe, O_CLOEXEC) != 0) return;
        pid_ = ::fork();
        if (pid_ == 0) {
            char byte = 0;
            if (::setgroups(0, nullptr) != 0 || ::setresgid(owner, owner, owner) != 0 ||
                ::setresuid(owner, owner, owner) != 0 || ::unshare(CLONE_NEWUSER) != 0)
                ::_exit(2);
            if (::write(unshared[1], &byte, 1) != 1 || ::read(mapped_pipe[0], &byte, 1) != 1) ::_exit(3);
            if (::setresuid(0, 0, 0) != 0) ::_exit(4);
            ::execl("/bin/sleep", "sleep", "120", static_cast<char *>(nullptr));
            ::_exit(5);
        }
        ::close(unshared[1]);
        ::close(mapped_pipe[0]);
        char byte = 0;
        if (pid_ > 0 && ::read(unshared[0], &byte, 1) == 1 &&
            write_line("/proc/" + std::to_string(pid_) + "/uid_map", "0 " + std::to_string(mapped) + " 1"))
            ready_ = ::write(mapped_pipe[1], &byte, 1) == 1;
        ::close(unshared[0]);
        ::close(mapped_pipe[1]);
    }
    ~MappedNamespaceProcess() {
        if (pid_ <= 0) return;
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
    }
    MappedNamespaceProcess(const MappedNamespaceProcess &) = delete;
    MappedNamespaceProcess &operator=(const MappedNamespaceProcess &) = delete;
    bool ready() const { return ready_; }
    pid_t pid() const { return pid_; }

private:
    pid_t pid_ = -1;
    bool ready_ = false;
};

// A joining Register is judged by the job it joins: the request's "container": true does not make
// a plain job a container job. Before, a process of another uid in another user namespace joined
// a plain job of uid 61002 that way; a new container job of 61002 may hold it (61002 made its
// namespace: its own rootless container's subordinate uid).
TEST_F(Issue37AdminUidRegister, JoiningAPlainJobWithContainerTrueIsJudgedAsThatPlainJob) {
    constexpr uid_t kSubordinateUid = 61004;
    Child users_task(sleeper_as(kUserUid));
    ASSERT_TRUE(users_task.started());
    ASSERT_TRUE(wait_until([&] { return runs_as(users_task.pid(), kUserUid); }, 10s));
    std::string reply = register_as(0, "plain", users_task.pid(), kUserUid);
    ASSERT_EQ(reply.rfind("ok ", 0), 0u) << reply << "\n" << malld_->log();

    MappedNamespaceProcess mapped(kUserUid, kSubordinateUid);
    ASSERT_TRUE(mapped.ready()) << "could not start a process in a user namespace of uid " << kUserUid;
    ASSERT_TRUE(wait_until([&] { return runs_as(mapped.pid(), kSubordinateUid); }, 10s))
        << "the namespaced process does not run as uid " << kSubordinateUid;
    ASSERT_EQ(user_namespace_owner(mapped.pid()), kUserUid);
    reply = register_as(kAdminUid, "plain", mapped.pid(), kUserUid, json{{"container", true}, {"join", true}});
    EXPECT_EQ(reply.rfind("refused " + std::to_string(MALL_ERR_DENIED) + " ", 0), 0u) << reply;
    EXPECT_TRUE(contains_icase(reply, "pid " + std::to_string(mapped.pid()) + " runs as uid " +
                                          std::to_string(kSubordinateUid) + ", not as the job's uid " +
                                          std::to_string(kUserUid)))
        << reply;
    auto plain = job_status(malld_->socket(), "plain");
    ASSERT_TRUE(plain) << status_text(*malld_);
    EXPECT_EQ((*plain)["pids"], json::array({users_task.pid()})) << plain->dump(2);

    reply = register_as(kAdminUid, "users-ctr", mapped.pid(), kUserUid, json{{"container", true}});
    EXPECT_EQ(reply.rfind("ok ", 0), 0u) << reply << "\n" << malld_->log();
}

// ---------------------------------------------------------------------------------------------
// Finding 7 (review of 37.4): the reserved job-name prefixes (common/rules.hpp) hold for every
// namer: "self-" is malld's for self-registered jobs, "slurm-" root's (the Slurm plugin's).
class Issue37ReservedJobNames : public AdminUidMalld {};

// mallrun's default name is the command's basename: ./self-play.sh was named self-play.sh-<pid>,
// which malld refused. It gets "run-" in front and runs malleable.
TEST_F(Issue37ReservedJobNames, MallrunsDefaultNameForACommandNamedSelfSomethingRegisters) {
    const std::string script = malld_->dir() + "/self-play.sh";
    ASSERT_TRUE(write_line(script, "#!/bin/sh\necho \"job=$MALL_JOB_ID\""));
    ASSERT_EQ(::chmod(script.c_str(), 0755), 0);
    auto r = run_command(mallrun_argv(malld_->socket(), "1:1", "", {script}, {"--require"}));
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err << "\n" << malld_->log();
    EXPECT_NE(r.out.find("job=run-self-play.sh-"), std::string::npos) << r.out << r.err;
    EXPECT_EQ(malld_->log().find("kept for"), std::string::npos) << malld_->log();
}

TEST_F(Issue37ReservedJobNames, MallrunRefusesAReservedJobNameWithWords) {
    auto r = run_command(mallrun_argv(malld_->socket(), "1:1", "self-7", {"/bin/true"}));
    EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
    EXPECT_TRUE(contains_icase(r.err, "bad job name 'self-7': job names starting with 'self-' are kept for "
                                      "self-registered jobs"))
        << r.err;
    // slurm-<jobid> is root's (the plugin's, or root by hand): a user's mallrun is refused.
    const std::string u = std::to_string(kAdminUid);
    std::vector<std::string> as_user{"/usr/bin/setpriv", "--reuid=" + u, "--regid=" + u, "--clear-groups", "--"};
    for (const auto &arg : mallrun_argv(malld_->socket(), "1:1", "slurm-5", {"/bin/true"})) as_user.push_back(arg);
    r = run_command(as_user);
    EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
    EXPECT_TRUE(contains_icase(r.err, "job names starting with 'slurm-' are kept for Slurm jobs")) << r.err;
    EXPECT_TRUE(listed_jobs(malld_->socket()).empty()) << status_text(*malld_);
}

// malld's Register: a slurm- name only from root; a self- name from nobody.
TEST_F(Issue37ReservedJobNames, AnAdminUidCannotRegisterASlurmJobsName) {
    Child own(sleeper_as(kAdminUid));
    ASSERT_TRUE(own.started());
    ASSERT_TRUE(wait_until([&] { return runs_as(own.pid(), kAdminUid); }, 10s));
    const json body{{"job", "slurm-5"}, {"uid", kAdminUid}, {"pids", {own.pid()}}, {"min", 1}, {"max", 1}};
    Peer admin(kAdminUid, "", [&] { return ask(malld_->socket(), proto::Type::Register, body); });
    const std::string reply = admin.result();
    EXPECT_EQ(reply.rfind("refused " + std::to_string(MALL_ERR_INVAL) + " ", 0), 0u) << reply;
    EXPECT_TRUE(contains_icase(reply, "job names starting with 'slurm-' are kept for Slurm jobs")) << reply;
    EXPECT_TRUE(listed_jobs(malld_->socket()).empty()) << status_text(*malld_);
}
}  // namespace
}  // namespace mall::test
