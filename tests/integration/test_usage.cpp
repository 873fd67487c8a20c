// SPDX-License-Identifier: BSD-3-Clause
// Proves mall_set_usage end to end with a real malld and real processes: a job that says it uses one
// of its two cpus is shrunk to one (after its ack), `mallctl status --json` shows the cap and the
// free cpu, a second job gets that cpu; the cap survives a malld restart (state file, and the
// client re-sends it on reconnect); clearing the cap makes the first job take its share again; a cap
// that moves no cpu is saved in the state file all the same.
#include <csignal>
#include <optional>

#include <gtest/gtest.h>

#include "support/malld_fixture.hpp"

#include <fstream>

MALL_TEST_WATCHDOG(200);

namespace mall::test {
namespace {

using nlohmann::json;

pid_t registered_pid(const std::string &socket, const std::string &job) {
    auto status = job_status(socket, job);
    if (!status) return -1;
    auto pids = job_pids(*status);
    return pids.size() == 1 ? pids[0] : -1;
}

int usage_cap(const std::string &socket, const std::string &job) {
    auto status = job_status(socket, job);
    return status ? status->value("usage_cap", -1) : -1;
}

// A private malld and job "a" (1:2), settled on both cpus, whose client says it uses one cpu on
// SIGUSR1 and all of them on SIGUSR2.
class Usage : public ::testing::Test {
protected:
    void SetUp() override {
        MALL_REQUIRE_ROOT_AND_CPUSET();
        std::string error;
        ASSERT_TRUE(malld.start(&error)) << error;
        socket = malld.socket();
        a_child.emplace(mallrun_argv(socket, "1:2", "a", test_client_argv({"--step-us", "1000", "--usage", "1"})));
        ASSERT_TRUE(wait_until([&] { return job_settled_on(socket, "a", "0-1", 1); }, 20s)) << status_text(malld);
        a_pid = registered_pid(socket, "a");
        ASSERT_GT(a_pid, 0);
    }
    PrivateMalld malld;
    std::string socket;
    std::optional<Child> a_child;
    pid_t a_pid = -1;
};

TEST_F(Usage, CapLendsTheSurplusToAnotherJobAndClearingItTakesTheShareBack) {
    Child &a = *a_child;
    std::string error;

    // "I use one cpu": a is shrunk to one cpu (acked), the other is free.
    ASSERT_EQ(::kill(a_pid, SIGUSR1), 0);
    ASSERT_TRUE(a.wait_for_line_starting("usage 1 rc=0", 10s));
    ASSERT_TRUE(wait_until(
        [&] {
            auto s = status_json(socket);
            auto job = s ? find_job(*s, "a") : std::nullopt;
            return job && (*job)["ncpus"] == 1 && (*job)["state"] == "settled" && (*s)["free"] != "";
        },
        20s))
        << status_text(malld);
    EXPECT_EQ(usage_cap(socket, "a"), 1);
    const std::string a_cpus = job_status(socket, "a")->at("cpus");
    const std::string other = a_cpus == "0" ? "1" : "0";
    EXPECT_EQ(status_json(socket)->at("free"), other);
    EXPECT_TRUE(wait_until([&] { return threads_all_on({a_pid}, a_cpus); }, 10s)) << describe_threads({a_pid});

    // A second job gets the lent cpu; a keeps its one.
    Child b(mallrun_argv(socket, "1:2", "b", test_client_argv({"--step-us", "1000"})));
    ASSERT_TRUE(wait_until([&] { return job_settled_on(socket, "b", other, 1); }, 20s)) << status_text(malld);
    EXPECT_TRUE(job_settled_on(socket, "a", a_cpus, 1)) << status_text(malld);

    // After a malld crash and restart the cap is still in force.
    malld.kill9();
    ASSERT_TRUE(malld.restart(&error)) << error;
    ASSERT_TRUE(wait_until([&] { return usage_cap(socket, "a") == 1 && job_settled_on(socket, "a", a_cpus, 1); },
                           20s))
        << status_text(malld);

    // No cap any more: equal shares, a and b keep one each; when b ends, a grows to both.
    ASSERT_EQ(::kill(a_pid, SIGUSR2), 0);
    ASSERT_TRUE(a.wait_for_line_starting("usage 0 rc=0", 10s));
    ASSERT_TRUE(wait_until([&] { return usage_cap(socket, "a") == 0; }, 10s)) << status_text(malld);
    b.signal_group(SIGTERM);
    ASSERT_TRUE(b.wait_exit(10s));
    ASSERT_TRUE(wait_until([&] { return job_settled_on(socket, "a", "0-1", 1); }, 20s)) << status_text(malld);
}

// Regression (issue 11): the state file was written only when a hand-written fingerprint of the
// state changed, and that fingerprint left usage_cap out, so a cap that moved no cpu was never
// saved (a malld restarted before the client re-sent it planned the job without its cap).
TEST_F(Usage, ACapThatMovesNoCpuIsSavedInTheStateFile) {
    Child &a = *a_child;
    Child b(mallrun_argv(socket, "1:2", "b", test_client_argv({"--step-us", "1000"})));
    auto settled_on_one_cpu = [&](const std::string &job) {
        auto j = job_status(socket, job);
        return j && j->value("ncpus", 0) == 1 && j->value("state", "") == "settled" &&
               j->value("generation", 0ull) == j->value("acked_generation", ~0ull);
    };
    ASSERT_TRUE(wait_until([&] { return settled_on_one_cpu("a") && settled_on_one_cpu("b"); }, 20s))
        << status_text(malld);
    const std::string a_cpus = job_status(socket, "a")->at("cpus");

    // a already holds one cpu: a cap of one changes its plan but moves nothing.
    ASSERT_EQ(::kill(a_pid, SIGUSR1), 0);
    ASSERT_TRUE(a.wait_for_line_starting("usage 1 rc=0", 10s));
    ASSERT_TRUE(wait_until([&] { return usage_cap(socket, "a") == 1; }, 10s)) << status_text(malld);
    EXPECT_TRUE(job_settled_on(socket, "a", a_cpus, 1)) << status_text(malld);

    const std::string state_path = malld.state_dir() + "/malld.state.json";
    auto saved_cap = [&]() -> int {
        try {
            std::ifstream in(state_path);
            const json state = json::parse(in);
            for (const auto &job : state.at("jobs"))
                if (job.at("job") == "a") return job.value("usage_cap", -1);
        } catch (const std::exception &) {
        }
        return -1;
    };
    EXPECT_TRUE(wait_until([&] { return saved_cap() == 1; }, 10s))
        << "usage_cap in " << state_path << " is " << saved_cap() << ", status says " << usage_cap(socket, "a")
        << "\n" << read_file(state_path);
    b.signal_group(SIGTERM);
    EXPECT_TRUE(b.wait_exit(10s));
}

}  // namespace
}  // namespace mall::test
