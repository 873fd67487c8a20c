// SPDX-License-Identifier: BSD-3-Clause
// test_self_register_boundaries.cpp — where self-registration may put a process (issue 37, point 4),
// attacked as the user who would attack it (helpers: support/attackers.hpp):
// - With --allow-self-register, a process of uid 61002 self-registers (Attach without a job) only
//   where its cgroup is delegated to 61002 (a cpuset folder and its cgroup.procs chowned to it, as an
//   admin or systemd's Delegate= would) and holds only its processes: malld then resizes that folder
//   in place, moves nothing, and gives it back its cpus at the job's end. A process in the root
//   cgroup, in a root-owned folder, in a delegated folder shared with root's process, under a parent
//   that limits its cpus, or inside a registered job's cgroup (a daemon started in a Slurm step: no
//   longer a descendant of the step's task) is refused with words and stays where it was.
// - Register keeps "self-" names for self-registered jobs.
// An admin's or root's Register (point 7) is test_register_boundaries.cpp's.
// Runs on the machine's cpuset controller: cgroup v1 here, cgroup v2 in tests/vm's guest.
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <optional>

#include <gtest/gtest.h>

#include "../../libmall/src/daemon/procfs.hpp"
#include "common/ctl_client.hpp"
#include "common/protocol.hpp"
#include "mall/mall.h"
#include "support/attackers.hpp"
#include "support/malld_fixture.hpp"

MALL_TEST_WATCHDOG(240);

namespace mall::test {
namespace {

using nlohmann::json;

// ---------------------------------------------------------------------------------------------
// Point 4: self-registration only in a cgroup delegated to the process's uid, resized in place.
class Issue37SelfRegister : public ::testing::Test {
protected:
    void SetUp() override {
        MALL_REQUIRE_ROOT_AND_CPUSET();
        MalldOptions options;
        options.extra_args = {"--allow-self-register"};
        malld_ = std::make_unique<PrivateMalld>(options);
        std::string error;
        ASSERT_TRUE(malld_->start(&error)) << error;
        tree_ = std::make_unique<TestCgroupTree>("mall_selfreg_" + std::to_string(::getpid()));
    }
    void TearDown() override {
        malld_.reset();
        tree_.reset();
    }

    // Attach without a job (libmall's self-registration), from a process of uid `uid` in `cgroup`
    // ("" for the test's own cgroup): "ok {job...}" or "refused <code> <words>".
    std::unique_ptr<Peer> self_register(uid_t uid, const std::string &cgroup) {
        const std::string socket = malld_->socket();
        return std::make_unique<Peer>(uid, cgroup, [socket] {
            std::string error;
            auto client = CtlClient::connect(socket, &error);
            if (!client) return "unreachable " + error;
            CtlResult r = client->request(proto::Type::Attach, json{{"min", 1}, {"max", 2}}, 15s);
            const std::string line =
                r.ok ? "ok " + r.body.dump() : "refused " + std::to_string(r.code) + " " + r.error;
            // Stays attached until released: the connection must outlive the reply.
            static std::optional<CtlClient> kept;
            kept = std::move(client);
            return line;
        });
    }

    std::string make(const std::string &rel, const std::string &cpus) {
        std::string error;
        std::string dir = tree_->make(rel, cpus, &error);
        EXPECT_FALSE(dir.empty()) << error;
        return dir;
    }

    // The self-registration was refused with words that say why and what to do instead; malld lists
    // no job; the process is still where it was.
    void expect_refused(Peer &peer, const std::string &reply, const std::string &where, const std::string &why) {
        EXPECT_EQ(reply.rfind("refused ", 0), 0u) << reply << "\n" << status_text(*malld_);
        EXPECT_TRUE(contains_icase(reply, why)) << "the refusal should say '" << why << "': " << reply;
        EXPECT_TRUE(contains_icase(reply, "ask an admin to register the job or run it under mallrun/Slurm") ||
                    contains_icase(reply, "MALL_JOB_ID="))
            << reply;
        const auto jobs = listed_jobs(malld_->socket());
        EXPECT_TRUE(std::find(jobs.begin(), jobs.end(), "self-" + std::to_string(peer.pid())) == jobs.end())
            << status_text(*malld_);
        EXPECT_EQ(cgroup_of(peer.pid()), where) << "the process was moved";
        EXPECT_FALSE(::access((malld_->cgroup_dir() + "/job_self-" + std::to_string(peer.pid())).c_str(), F_OK) == 0)
            << "malld made a folder for the refused process";
    }

    std::unique_ptr<PrivateMalld> malld_;
    std::unique_ptr<TestCgroupTree> tree_;
};

TEST_F(Issue37SelfRegister, AProcessInTheRootCgroupIsRefusedAndNotMoved) {
    auto peer = self_register(kUserUid, cpuset_root());
    const std::string reply = peer->result();
    expect_refused(*peer, reply, "/", "not delegated to uid " + std::to_string(kUserUid));
    EXPECT_NE(reply.find("process " + std::to_string(peer->pid())), std::string::npos) << reply;
}

TEST_F(Issue37SelfRegister, AProcessInACgroupNotDelegatedToItsUidIsRefused) {
    const std::string service = make("service", "0-1");  // root's: a shared service's cgroup
    auto peer = self_register(kUserUid, service);
    const std::string reply = peer->result();
    expect_refused(*peer, reply, relative(service), "not delegated to uid " + std::to_string(kUserUid));
    EXPECT_EQ(cgroup_cpus(service).value_or("?"), "0-1") << "the cgroup was resized";
}

TEST_F(Issue37SelfRegister, ADelegatedCgroupThatAlsoHoldsRootsProcessIsRefused) {
    const std::string shared = make("shared", "0-1");
    delegate(shared, kUserUid);
    Child roots({"/bin/sh", "-c", "echo $$ > " + shared + "/cgroup.procs && exec /bin/sleep 120"});
    ASSERT_TRUE(roots.started());
    ASSERT_TRUE(wait_until([&] { return cgroup_of(roots.pid()) == relative(shared); }, 10s));
    auto peer = self_register(kUserUid, shared);
    const std::string reply = peer->result();
    expect_refused(*peer, reply, relative(shared), "holds process " + std::to_string(roots.pid()) + " of uid 0");
}

TEST_F(Issue37SelfRegister, ADelegatedCgroupWhoseParentLimitsItsCpusIsRefused) {
    make("", "0");  // the parent allows cpu 0 only: growing the job would widen it
    const std::string limited = make("limited", "0");
    delegate(limited, kUserUid);
    auto peer = self_register(kUserUid, limited);
    const std::string reply = peer->result();
    expect_refused(*peer, reply, relative(limited), "never widens");
    EXPECT_EQ(cgroup_cpus(tree_->root()).value_or("?"), "0") << "the limiting parent was widened";
}

// A daemon started inside a Slurm step: it left the step task's process tree (its parent is not
// the task), but it is still in the step's cgroup, so it belongs to that job.
TEST_F(Issue37SelfRegister, AProcessInsideARegisteredJobsCgroupIsRefused) {
    const std::string step = make("job_37/step_0", "0-1");
    delegate(step, kUserUid);  // even delegated: it is the job's cgroup
    Child task(sleeper_as(kUserUid, step));
    ASSERT_TRUE(task.started());
    ASSERT_TRUE(wait_until([&] { return runs_as(task.pid(), kUserUid); }, 10s));
    const std::string reply_reg = ask(malld_->socket(), proto::Type::Register,
                                      json{{"job", "slurm-37"}, {"uid", kUserUid}, {"pids", {task.pid()}},
                                           {"min", 1}, {"max", 2}});
    ASSERT_EQ(reply_reg.rfind("ok ", 0), 0u) << reply_reg << "\n" << malld_->log();
    auto daemon = self_register(kUserUid, step);
    ASSERT_FALSE(in_process_tree(daemon->pid(), {task.pid()}));
    const std::string reply = daemon->result();
    expect_refused(*daemon, reply, relative(step), "belongs to job slurm-37");
    EXPECT_EQ(listed_jobs(malld_->socket()), std::vector<std::string>{"slurm-37"}) << status_text(*malld_);
}

// A self-registered job is re-adopted after a restart as one (in place, never moved) by its name,
// so Register keeps "self-" names for self-registrations.
TEST_F(Issue37SelfRegister, RegisterRefusesTheNameOfASelfRegisteredJob) {
    Child task({"/bin/sleep", "120"});
    ASSERT_TRUE(task.started());
    const std::string reply = ask(malld_->socket(), proto::Type::Register,
                                  json{{"job", "self-" + std::to_string(task.pid())}, {"uid", 0},
                                       {"pids", {task.pid()}}, {"min", 1}, {"max", 1}});
    EXPECT_EQ(reply.rfind("refused " + std::to_string(MALL_ERR_INVAL) + " ", 0), 0u) << reply;
    EXPECT_TRUE(contains_icase(reply, "kept for self-registered jobs")) << reply;
    EXPECT_TRUE(listed_jobs(malld_->socket()).empty()) << status_text(*malld_);
}

// The one way in: a folder delegated to the uid, holding only its processes, under a parent that
// allows the pool. malld resizes it in place (the job alone gets the whole pool), moves nothing,
// makes no folder of its own, and gives the folder back its cpus when the job ends.
TEST_F(Issue37SelfRegister, ADelegatedCgroupIsResizedInPlaceAndGivenBackItsCpus) {
    const std::string mine = make("user_61002", "0");
    delegate(mine, kUserUid);
    auto peer = self_register(kUserUid, mine);
    const std::string reply = peer->result();
    ASSERT_EQ(reply.rfind("ok ", 0), 0u) << reply << "\n" << malld_->log();
    const std::string job = "self-" + std::to_string(peer->pid());
    EXPECT_NE(reply.find(job), std::string::npos) << reply;
    EXPECT_TRUE(wait_until([&] { return cgroup_cpus(mine).value_or("") == "0-1"; }, 20s))
        << "the delegated cgroup was not grown in place to the pool: cpuset.cpus "
        << cgroup_cpus(mine).value_or("?") << "\n" << status_text(*malld_);
    auto status = job_status(malld_->socket(), job);
    ASSERT_TRUE(status) << status_text(*malld_);
    ASSERT_TRUE((*status)["cgroups"].is_array() && (*status)["cgroups"].size() == 1u) << status->dump(2);
    EXPECT_EQ((*status)["cgroups"][0].value("path", ""), mine) << status->dump(2);
    EXPECT_TRUE((*status)["cgroups"][0].value("in_place", false)) << status->dump(2);
    EXPECT_EQ(cgroup_of(peer->pid()), relative(mine)) << "the process was moved";
    EXPECT_NE(::access((malld_->cgroup_dir() + "/job_" + job).c_str(), F_OK), 0) << "malld made a folder";

    peer.reset();  // the process exits: the job ends
    EXPECT_TRUE(wait_until([&] { return !job_status(malld_->socket(), job); }, 20s)) << status_text(*malld_);
    EXPECT_TRUE(wait_until([&] { return cgroup_cpus(mine).value_or("") == "0"; }, 10s))
        << "the delegated cgroup did not get its cpus back: " << cgroup_cpus(mine).value_or("?");
}

}  // namespace
}  // namespace mall::test