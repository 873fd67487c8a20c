// SPDX-License-Identifier: BSD-3-Clause
// Issue 37, defect 10: Status and Watch showed every job's uid, pids, cgroup paths and progress to
// every local user (defeating hidepid=2). Proves, as the users themselves (setpriv to throwaway
// uids), that a job's details reach only its owner and admins: uid 61002 sees the node and its own
// job, and of uid 61001's job only the cpus it holds, in `mallctl status --json`, the table, `top`,
// `metrics` and a Watch stream; uid 61001 sees its own job whole; root sees everything.
#include <gtest/gtest.h>

#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/ctl_client.hpp"
#include "common/protocol.hpp"
#include "support/malld_fixture.hpp"

MALL_TEST_WATCHDOG(180);

namespace mall::test {
namespace {

using nlohmann::json;

constexpr uid_t kAlice = 61001, kBob = 61002;  // throwaway uids: no passwd entry needed
const std::string kAliceJob = "alice-secret-model", kBobJob = "bob-job";

// argv that runs `argv` as `uid` (gid the same, no supplementary groups); setpriv execs it, so
// the process keeps setpriv's pid.
std::vector<std::string> as_user(uid_t uid, std::vector<std::string> argv) {
    std::vector<std::string> out = {"/usr/bin/setpriv", "--reuid=" + std::to_string(uid),
                                    "--regid=" + std::to_string(uid), "--clear-groups"};
    out.insert(out.end(), argv.begin(), argv.end());
    return out;
}

// The real uid of pid from /proc/PID/status; -1 when unreadable.
long real_uid_of(pid_t pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/status");
    std::string line;
    while (std::getline(in, line))
        if (line.rfind("Uid:", 0) == 0) return std::stol(line.substr(4));
    return -1;
}

// Whether any value in j (at any depth) is the integer n, or a string holding `text`.
bool holds_number(const json &j, long long n) {
    if (j.is_number_integer()) return j.get<long long>() == n;
    if (j.is_structured())
        for (const auto &v : j)  // an object's values, an array's elements
            if (holds_number(v, n)) return true;
    return false;
}
bool holds_text(const json &j, const std::string &text) {
    if (j.is_string()) return j.get<std::string>().find(text) != std::string::npos;
    if (j.is_object())
        for (auto it = j.begin(); it != j.end(); ++it)
            if (it.key().find(text) != std::string::npos || holds_text(it.value(), text)) return true;
    if (j.is_array())
        for (const auto &v : j)
            if (holds_text(v, text)) return true;
    return false;
}

class StatusPrivacy : public ::testing::Test {
protected:
    void SetUp() override {
        MALL_REQUIRE_ROOT_AND_CPUSET();
        malld_ = std::make_unique<PrivateMalld>();
        std::string error;
        ASSERT_TRUE(malld_->start(&error)) << error;
        ctl_ = CtlClient::connect(malld_->socket(), &error);
        ASSERT_TRUE(ctl_) << error;
        // Bob's job: a process of his that never attaches.
        bob_ = std::make_unique<Child>(as_user(kBob, {"/bin/sleep", "170"}));
        register_job(kBobJob, kBob, *bob_);
    }
    void TearDown() override {
        watcher_.reset();
        alice_.reset();
        bob_.reset();
        ctl_.reset();
        malld_.reset();
    }

    // Registers `job` for `uid` with the child's pid (as root, as the plugin or mallrun would),
    // once the child runs as that uid.
    void register_job(const std::string &job, uid_t uid, const Child &child) {
        ASSERT_TRUE(child.started());
        ASSERT_TRUE(wait_until([&] { return real_uid_of(child.pid()) == static_cast<long>(uid); }, 10s))
            << "process " << child.pid() << " did not become uid " << uid;
        auto r = ctl_->request(proto::Type::Register,
                               json{{"job", job}, {"uid", uid}, {"pids", {child.pid()}}, {"min", 1}, {"max", 2}}, 20s);
        ASSERT_TRUE(r.ok) << "registering " << job << ": " << r.error;
    }

    // Alice's job: a stepping test client (attached, reporting progress) that starts once the
    // job is registered (the gate file appears).
    void start_alice() {
        const std::string gate = malld_->dir() + "/alice-gate";
        const std::string script = "while [ ! -e " + gate + " ]; do sleep 0.05; done; exec " +
                                   bin_path("mall_test_client") + " --step-us 2000 --duration-s 170";
        alice_ = std::make_unique<Child>(
            as_user(kAlice, {"/bin/sh", "-c", script}),
            ChildOptions{{{"MALL_SOCKET", malld_->socket()}, {"MALL_JOB_ID", kAliceJob}}, false, false});
        register_job(kAliceJob, kAlice, *alice_);
        std::ofstream(gate) << "open\n";
        ASSERT_TRUE(wait_until(
            [&] {
                auto job = job_status(malld_->socket(), kAliceJob);
                return job && job->value("attached", 0) == 1 && job->value("work_units", 0) > 0;
            },
            30s))
            << "alice's job did not attach and report progress: " << status_text(*malld_);
    }

    // `mallctl ARGS` as uid (root when uid is 0).
    CommandResult mallctl_as(uid_t uid, const std::vector<std::string> &args) {
        auto argv = mallctl_argv(malld_->socket(), args);
        return run_command(uid == 0 ? argv : as_user(uid, argv));
    }
    json status_as(uid_t uid) {
        auto r = mallctl_as(uid, {"status", "--json"});
        EXPECT_EQ(r.exit_code, 0) << "mallctl status --json as uid " << uid << ": " << r.err;
        json status = json::parse(r.out, nullptr, false);
        EXPECT_TRUE(status.is_object()) << "mallctl status --json as uid " << uid << " printed: " << r.out;
        return status.is_object() ? status : json::object();
    }

    // Whether `j` shows anything of Alice's job but its cpus: her uid, her pid, her job's name
    // (also in its cgroup paths).
    std::string alice_details_in(const json &j) const {
        if (holds_number(j, kAlice)) return "uid " + std::to_string(kAlice);
        if (alice_ && holds_number(j, alice_->pid())) return "pid " + std::to_string(alice_->pid());
        if (holds_text(j, kAliceJob)) return "the job's name " + kAliceJob;
        return "";
    }

    std::unique_ptr<PrivateMalld> malld_;
    std::optional<CtlClient> ctl_;
    std::unique_ptr<Child> bob_, alice_, watcher_;
};

TEST_F(StatusPrivacy, AnotherUserSeesOnlyTheCpusOfAJobThatIsNotHis) {
    ASSERT_NO_FATAL_FAILURE(start_alice());

    const json bob_view = status_as(kBob);
    EXPECT_EQ(alice_details_in(bob_view), "") << "uid " << kBob << " sees " << alice_details_in(bob_view)
                                              << " of uid " << kAlice << "'s job:\n" << bob_view.dump(2);
    EXPECT_EQ(bob_view.value("view", ""), "own") << bob_view.dump(2);
    EXPECT_EQ(bob_view.value("pool", ""), "0-1") << "the node's summary is for everyone";
    EXPECT_TRUE(bob_view.contains("free") && bob_view.contains("policy")) << bob_view.dump(2);
    // His own job whole, hers as the cpus it holds.
    auto own = find_job(bob_view, kBobJob);
    ASSERT_TRUE(own) << bob_view.dump(2);
    EXPECT_EQ(own->value("uid", 0u), kBob);
    EXPECT_EQ(job_pids(*own), std::vector<pid_t>{bob_->pid()});
    ASSERT_TRUE(bob_view.contains("other_jobs") && bob_view["other_jobs"].size() == 1u) << bob_view.dump(2);
    const json &hers = bob_view["other_jobs"][0];
    EXPECT_EQ(hers.value("ncpus", 0), 1) << hers.dump();
    for (const char *hidden : {"job", "uid", "pids", "cgroup", "cgroups", "work_units", "steps", "speedup",
                               "core_seconds", "last_ack_latency_us"})
        EXPECT_FALSE(hers.contains(hidden)) << hidden << " of another user's job: " << hers.dump();

    // The table, top and the metrics say as little.
    auto table = mallctl_as(kBob, {"status"});
    EXPECT_EQ(table.exit_code, 0) << table.err;
    EXPECT_EQ(table.out.find(kAliceJob), std::string::npos) << table.out;
    EXPECT_NE(table.out.find(kBobJob), std::string::npos) << table.out;
    EXPECT_NE(table.out.find("OTHERS   1 job of other users holds cpus"), std::string::npos) << table.out;
    auto top = mallctl_as(kBob, {"top", "--once"});
    EXPECT_EQ(top.exit_code, 0) << top.err;
    EXPECT_EQ(top.out.find(kAliceJob), std::string::npos) << top.out;
    EXPECT_NE(top.out.find("JOBS 2"), std::string::npos) << top.out;
    EXPECT_NE(top.out.find("(others)"), std::string::npos) << top.out;
    auto metrics = mallctl_as(kBob, {"metrics"});
    EXPECT_EQ(metrics.exit_code, 0) << metrics.err;
    EXPECT_EQ(metrics.out.find(kAliceJob), std::string::npos) << metrics.out;
    EXPECT_EQ(metrics.out.find("uid=\"" + std::to_string(kAlice) + "\""), std::string::npos) << metrics.out;
    EXPECT_NE(metrics.out.find("\nmall_jobs 2\n"), std::string::npos) << metrics.out;
    EXPECT_NE(metrics.out.find("mall_job=\"" + kBobJob + "\""), std::string::npos) << metrics.out;
}

TEST_F(StatusPrivacy, TheOwnerSeesHerJobWholeAndRootSeesEverything) {
    ASSERT_NO_FATAL_FAILURE(start_alice());

    const json alice_view = status_as(kAlice);
    EXPECT_EQ(alice_view.value("view", ""), "own");
    auto mine = find_job(alice_view, kAliceJob);
    ASSERT_TRUE(mine) << alice_view.dump(2);
    EXPECT_EQ(mine->value("uid", 0u), kAlice);
    EXPECT_EQ(job_pids(*mine), std::vector<pid_t>{alice_->pid()});
    EXPECT_GT(mine->value("work_units", 0), 0);
    EXPECT_FALSE(mine->value("cgroups", json::array()).empty()) << mine->dump();
    EXPECT_FALSE(find_job(alice_view, kBobJob)) << "bob's job is not hers: " << alice_view.dump(2);
    EXPECT_FALSE(holds_number(alice_view, kBob)) << alice_view.dump(2);
    EXPECT_EQ(alice_view.value("other_jobs", json::array()).size(), 1u) << alice_view.dump(2);

    const json root_view = status_as(0);
    EXPECT_EQ(root_view.value("view", ""), "all");
    auto hers = find_job(root_view, kAliceJob), his = find_job(root_view, kBobJob);
    ASSERT_TRUE(hers && his) << root_view.dump(2);
    EXPECT_EQ(hers->value("uid", 0u), kAlice);
    EXPECT_EQ(his->value("uid", 0u), kBob);
    EXPECT_EQ(job_pids(*hers), std::vector<pid_t>{alice_->pid()});
    EXPECT_FALSE(root_view.contains("other_jobs"));
}

TEST_F(StatusPrivacy, AWatchStreamCarriesNoDetailsOfAnotherUsersJob) {
    watcher_ = std::make_unique<Child>(as_user(kBob, mallctl_argv(malld_->socket(), {"watch", "--json", "--timeout-s", "150"})));
    ASSERT_TRUE(watcher_->started());
    // Root changes the policy until bob's watcher has seen it: it is connected from then on.
    auto saw_policy = [&](const std::string &name) {
        for (const auto &line : watcher_->all_lines()) {
            json e = json::parse(line, nullptr, false);
            if (is_event(e, "policy") && e.value("policy", "") == name) return true;
        }
        return false;
    };
    ASSERT_TRUE(wait_until(
        [&] { return mallctl_as(0, {"policy", "static"}).exit_code == 0 && saw_policy("static"); }, 20s, 200ms))
        << "bob's watcher saw no policy event";

    // Alice's job is registered, attaches, acknowledges, reports progress; then a last marker.
    ASSERT_NO_FATAL_FAILURE(start_alice());
    ASSERT_EQ(mallctl_as(0, {"policy", "equal"}).exit_code, 0);
    ASSERT_TRUE(wait_until([&] { return saw_policy("equal"); }, 20s)) << "bob's watcher saw no second policy event";

    bool saw_other_register = false;
    for (const auto &line : watcher_->all_lines()) {
        json e = json::parse(line, nullptr, false);
        ASSERT_TRUE(e.is_object()) << "not an event: " << line;
        EXPECT_EQ(alice_details_in(e), "") << "bob's watcher got " << alice_details_in(e) << ": " << line;
        if (is_event(e, "register") && e.value("other_job", false)) saw_other_register = true;
    }
    EXPECT_TRUE(saw_other_register) << "bob's watcher should learn that another job registered:\n"
                                    << joined_lines(watcher_->all_lines());
}

}  // namespace
}  // namespace mall::test
