// SPDX-License-Identifier: BSD-3-Clause
// Proves that an ordinary user (nobody) can read malld's status (a summary: other users' jobs only
// as their cpus) but cannot change allocations, policies or the pool, nor attach to root's job,
// and that malld logs each refusal with uid and pid.
#include <grp.h>
#include <pwd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <regex>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "common/ctl_client.hpp"
#include "common/protocol.hpp"
#include "mall/mall.h"
#include "support/malld_fixture.hpp"

MALL_TEST_WATCHDOG(240);

namespace mall::test {
namespace {

using nlohmann::json;

uid_t nobody_uid() {
    struct passwd *pw = ::getpwnam("nobody");
    return pw ? pw->pw_uid : 65534;
}

// malld's log has a line naming both the refused uid and pid.
bool logged_refusal(const PrivateMalld &malld, pid_t pid) {
    const std::regex uid_re("\\b" + std::to_string(nobody_uid()) + "\\b");
    const std::regex pid_re("\\b" + std::to_string(pid) + "\\b");
    std::istringstream log(malld.log());
    std::string line;
    while (std::getline(log, line))
        if (std::regex_search(line, uid_re) && std::regex_search(line, pid_re)) return true;
    return false;
}

bool says_refused(const std::string &text) {
    return contains_icase(text, "permission") || contains_icase(text, "denied") ||
           contains_icase(text, "not allowed") || contains_icase(text, "refused");
}

class Security : public MalldWithJobTest {
protected:
    std::string job_name() const override { return "rootjob"; }
    void SetUp() override {
        MalldWithJobTest::SetUp();
        if (IsSkipped() || HasFatalFailure()) return;
        before_ = *status_json(malld_->socket());
    }

    // Status must be as before the refused commands (ignoring counters that move by themselves).
    void expect_nothing_changed() {
        auto now = status_json(malld_->socket());
        ASSERT_TRUE(now);
        for (const char *key : {"pool", "available", "reclaimed", "free", "policy"})
            EXPECT_EQ((*now)[key], before_[key]) << key;
        auto was = find_job(before_, "rootjob"), is = find_job(*now, "rootjob");
        ASSERT_TRUE(was && is);
        for (const char *key : {"cpus", "cpuset", "generation", "pinned", "min", "max", "uid"})
            EXPECT_EQ((*is)[key], (*was)[key]) << key;
    }

    RunOptions as_nobody() const {
        RunOptions options;
        options.as_nobody = true;
        return options;
    }

    // Runs mallctl as nobody and checks the refusal: exit 1, words on stderr, a log line.
    void expect_refused(const std::vector<std::string> &args) {
        auto r = run_command(mallctl_argv(malld_->socket(), args), as_nobody());
        std::string cmd;
        for (const auto &a : args) cmd += a + " ";
        EXPECT_EQ(r.exit_code, 1) << "mallctl " << cmd << "as nobody\nstdout: " << r.out << "\nstderr: " << r.err;
        EXPECT_TRUE(says_refused(r.err)) << "mallctl " << cmd << ": the refusal should say so; stderr: " << r.err;
        EXPECT_TRUE(wait_until([&] { return logged_refusal(*malld_, r.pid); }, 5s))
            << "malld did not log the refusal of mallctl " << cmd << "(uid " << nobody_uid() << ", pid " << r.pid
            << ")";
    }

    json before_;
};

TEST_F(Security, NobodyCannotSetAllocations) {
    expect_refused({"set", "rootjob", "--cpus", "0"});
    expect_refused({"set", "rootjob", "--cpus", "auto"});
    expect_nothing_changed();
}

TEST_F(Security, NobodyCannotChangeThePolicy) {
    expect_refused({"policy", "static"});
    expect_nothing_changed();
}

TEST_F(Security, NobodyCannotReclaimOrReleaseCpus) {
    expect_refused({"reclaim", "1"});
    expect_refused({"release", "1"});
    expect_nothing_changed();
}

TEST_F(Security, NobodyCannotAttachToRootsJob) {
    // A process of another user that names root's job in MALL_JOB_ID: libmall must report the
    // refusal (the process runs on, detached), and malld must log it.
    Child intruder(test_client_argv({"--duration-s", "30"}),
                   ChildOptions{{{"MALL_SOCKET", malld_->socket()}, {"MALL_JOB_ID", "rootjob"}}, true, false});
    ASSERT_TRUE(intruder.started());
    auto line = intruder.wait_for_line_starting("open ", 20s);
    ASSERT_TRUE(line) << "mall_test_client printed nothing";
    EXPECT_EQ(*line, "open rc=" + std::to_string(MALL_ERR_DENIED) + " job=");
    EXPECT_TRUE(wait_until([&] { return logged_refusal(*malld_, intruder.pid()); }, 5s))
        << "malld did not log the refused Attach (uid " << nobody_uid() << ", pid " << intruder.pid() << ")";
    auto job = job_status(malld_->socket(), "rootjob");
    ASSERT_TRUE(job);
    EXPECT_EQ(job->value("attached", 0), 1) << "only root's own process may be attached: " << job->dump();
    EXPECT_EQ(job_pids(*job).size(), 1u);
    expect_nothing_changed();
}

// Requests mallctl has no command for, sent by a forked child that became nobody: Register and
// Deregister are admin-only too (else nobody could end root's job or bind root's processes).
TEST_F(Security, NobodyCannotRegisterOrDeregisterJobs) {
    const std::string socket = malld_->socket();
    const pid_t root_pid = job_pids(*find_job(before_, "rootjob")).at(0);
    struct passwd *pw = ::getpwnam("nobody");
    ASSERT_NE(pw, nullptr);
    const uid_t uid = pw->pw_uid;
    const gid_t gid = pw->pw_gid;
    pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        if (::setgroups(0, nullptr) != 0 || ::setgid(gid) != 0 || ::setuid(uid) != 0) ::_exit(10);
        std::string error;
        auto client = CtlClient::connect(socket, &error);
        if (!client) ::_exit(11);
        auto reg = client->request(proto::Type::Register,
                                   json{{"job", "sneaky"}, {"uid", 0}, {"pids", {root_pid}}, {"min", 1}, {"max", 1}},
                                   5s);
        if (reg.ok || reg.code != MALL_ERR_DENIED) ::_exit(12);
        auto dereg = client->request(proto::Type::Deregister, json{{"job", "rootjob"}}, 5s);
        if (dereg.ok || dereg.code != MALL_ERR_DENIED) ::_exit(13);
        ::_exit(0);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0) << "10: cannot become nobody, 11: cannot connect, 12: Register was not "
                                         "refused with MALL_ERR_DENIED, 13: Deregister was not refused";
    EXPECT_TRUE(wait_until([&] { return logged_refusal(*malld_, child); }, 5s));
    auto status_now = status_json(malld_->socket());
    ASSERT_TRUE(status_now);
    EXPECT_FALSE(find_job(*status_now, "sneaky"));
    expect_nothing_changed();
}

// Anyone may read the node's summary and watch (issue 37, defect 10: not the details of others'
// jobs, which tests/integration/test_status_privacy.cpp proves at length).
TEST_F(Security, StatusWorksForAnyone) {
    auto r = run_command(mallctl_argv(malld_->socket(), {"status", "--json"}), as_nobody());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    json status = json::parse(r.out, nullptr, false);
    ASSERT_FALSE(status.is_discarded()) << "mallctl status --json printed no JSON: " << r.out;
    EXPECT_EQ(status.value("pool", ""), "0-1");
    EXPECT_EQ(status.value("view", ""), "own") << r.out;
    // Root's job shows as the cpus it holds, without its name, uid or pids.
    EXPECT_FALSE(find_job(status, "rootjob")) << r.out;
    ASSERT_EQ(status.value("other_jobs", json::array()).size(), 1u) << r.out;
    EXPECT_EQ(status["other_jobs"][0].value("cpus", ""), "0-1");
    EXPECT_FALSE(status["other_jobs"][0].contains("pids")) << r.out;

    auto table = run_command(mallctl_argv(malld_->socket(), {"status"}), as_nobody());
    EXPECT_EQ(table.exit_code, 0) << table.err;
    EXPECT_EQ(table.out.find("rootjob"), std::string::npos) << table.out;
    EXPECT_NE(table.out.find("OTHERS   1 job of other users holds cpus 0-1 (2 cpus)"), std::string::npos) << table.out;

    // Watching is allowed too: one event within the time it takes root to cause one (a policy
    // change: an event about the node, which everyone sees).
    Child watch(mallctl_argv(malld_->socket(), {"watch", "--json", "--count", "1", "--timeout-s", "20"}),
                ChildOptions{{}, true, false});
    // Root causes events until the watcher, connected at some point, sees one.
    bool flip = false;
    EXPECT_TRUE(wait_until(
        [&] {
            flip = !flip;
            auto set = run_command(mallctl_argv(malld_->socket(), {"policy", flip ? "static" : "equal"}));
            return set.exit_code == 0 && !watch.all_lines().empty();
        },
        20s, 200ms));
    auto event = watch.read_line(1s);
    ASSERT_TRUE(event) << "nobody's watch saw no event";
    json e = json::parse(*event, nullptr, false);
    EXPECT_TRUE(e.is_object() && e.contains("event")) << *event;
    EXPECT_EQ(watch.wait_exit(20s), 0);
}

}  // namespace
}  // namespace mall::test
