// SPDX-License-Identifier: BSD-3-Clause
// Proves that the Eigen example (mall_train_digits: Eigen::Tensor on a ThreadPoolDevice over
// Eigen's own pool, parked by mall) follows `mallctl set` under a real malld — the pool's running
// thread count matches each allocation, every thread of the process (the pool's workers included)
// is allowed exactly the allocated cpus, the parked workers use no cpu while it trains — and that
// its loss curve is the one a plain run without malld prints.
#include <unistd.h>

#include <cmath>
#include <regex>
#include <sstream>

#include <gtest/gtest.h>

#include "support/malld_fixture.hpp"
#include "support/training_curve.hpp"

MALL_TEST_WATCHDOG(290);

namespace mall::test {
namespace {

using nlohmann::json;

// A smaller model than the example's default (~1.3 ms a step on one core here, 8 s a run) so that
// the run also fits under ASan; 6000 steps (1500 in a sanitizer build, ~10x slower a step) leave
// time for three changes on a loaded machine.

std::vector<std::string> trainer_argv() {
    return {bin_path("mall_train_digits"), "--steps", kUnderSanitizer ? "1500" : "6000", "--batch", "256", "--hidden", "256",
            "--print-every", kUnderSanitizer ? "100" : "200", "--log-changes"};
}

class EigenExample : public ::testing::TestWithParam<std::string> {
protected:
    void SetUp() override {
        MALL_REQUIRE_ROOT_AND_CPUSET();
        if (access(kDigits, R_OK) != 0)
            GTEST_FAIL() << kDigits << " is missing: launch_scripts/install-deps.sh installs python3-sklearn";
    }
};

TEST_P(EigenExample, PoolFollowsMallctlSetAndTheLossCurveIsUnchanged) {
    // The reference curve: no malld, two threads.
    auto plain_argv = trainer_argv();
    plain_argv.insert(plain_argv.end(), {"--threads", "2"});
    const auto plain = run_command(plain_argv, RunOptions{{}, false, 200s});
    ASSERT_EQ(plain.exit_code, 0) << plain.err;
    const Curve reference = parse_curve(split_lines(plain.out));
    ASSERT_GE(reference.loss_at_step.size(), 10u) << plain.out;

    MalldOptions options;
    options.backend = GetParam();
    options.ack_timeout_ms = 20000;  // it steps every ~10 ms: every change must be acked, never timed out
    PrivateMalld malld(options);
    std::string error;
    ASSERT_TRUE(malld.start(&error)) << error;
    Child trainer(mallrun_argv(malld.socket(), "1:2", "digits", trainer_argv()));
    ASSERT_TRUE(trainer.wait_for_line_starting("step 1 ", 60s)) << joined_lines(trainer.all_lines());
    ASSERT_TRUE(wait_until([&] { return job_settled_on(malld.socket(), "digits", "0-1", 1); }, 20s))
        << status_text(malld);

    for (const std::string cpus : {"0", "0-1", "1"}) {
        const int expected_threads = cpus == "0-1" ? 2 : 1;
        auto set = run_command(mallctl_argv(malld.socket(), {"set", "digits", "--cpus", cpus}));
        ASSERT_EQ(set.exit_code, 0) << set.err;
        ASSERT_TRUE(wait_until([&] { return job_settled_on(malld.socket(), "digits", cpus, 1); }, 30s))
            << "the trainer did not ack " << cpus << " (did it finish first?)\n"
            << status_text(malld) << joined_lines(trainer.all_lines());
        // The example's own report: the pool now has as many active workers as the allocation has cpus.
        const auto resized = trainer.wait_for_line(
            [&](const std::string &l) {
                const std::string tail = "-> " + std::to_string(expected_threads) + " cpus " + cpus;
                return l.rfind("resize ", 0) == 0 && l.size() > tail.size() &&
                       l.compare(l.size() - tail.size(), tail.size(), tail) == 0;
            },
            20s);
        EXPECT_TRUE(resized) << "no resize to " << expected_threads << " threads on " << cpus << ":\n"
                             << joined_lines(trainer.all_lines());
        // Every thread — the training thread and all pool workers, parked or not — on exactly those cpus.
        auto job = job_status(malld.socket(), "digits");
        ASSERT_TRUE(job);
        const auto pids = job_pids(*job);
        ASSERT_EQ(pids.size(), 1u);
        EXPECT_TRUE(wait_until([&] { return threads_all_on(pids, cpus); }, 10s)) << describe_threads(pids);
        // The workers beyond the allocation are parked: the example names them, and they use no cpu
        // while the process trains on.
        const auto parked_line = trainer.wait_for_line(
            [&](const std::string &l) { return l.rfind("parked step ", 0) == 0; }, 20s);
        ASSERT_TRUE(parked_line) << joined_lines(trainer.all_lines());
        EXPECT_EQ(parked_workers_follow(*parked_line, pids[0], expected_threads), "") << describe_threads(pids);
        // The pool's workers exist: 2 workers + the main thread at least.
        EXPECT_GE(thread_cpus_allowed(pids[0]).size(), 3u) << describe_threads(pids);
        // The next printed step reports the same thread count.
        EXPECT_TRUE(trainer.wait_for_line(
            [&](const std::string &l) {
                const std::string tail = " threads " + std::to_string(expected_threads) + " cpus " + cpus;
                return l.rfind("step ", 0) == 0 && l.size() > tail.size() &&
                       l.compare(l.size() - tail.size(), tail.size(), tail) == 0;
            },
            20s))
            << joined_lines(trainer.all_lines());
    }
    ASSERT_EQ(trainer.wait_exit(200s), 0) << joined_lines(trainer.all_lines());

    const auto lines = trainer.all_lines();
    const Curve resized = parse_curve(lines);
    ASSERT_EQ(resized.loss_at_step.size(), reference.loss_at_step.size()) << joined_lines(lines);
    // The same curve: every printed loss matches the plain run's (Eigen's contractions may block
    // differently for another thread count, so allow float rounding, nothing more).
    for (const auto &[step, loss] : reference.loss_at_step) {
        ASSERT_TRUE(resized.loss_at_step.count(step)) << "step " << step << " missing\n" << joined_lines(lines);
        EXPECT_NEAR(resized.loss_at_step.at(step), loss, 1e-4 * std::max(1.0, loss)) << "at step " << step;
    }
    EXPECT_NEAR(resized.final_loss, reference.final_loss, 1e-4);
    EXPECT_GE(resized.test_accuracy, 0.95) << joined_lines(lines);
    EXPECT_LT(resized.final_loss, 0.2 * resized.loss_at_step.begin()->second) << joined_lines(lines);

    auto status = status_json(malld.socket());
    ASSERT_TRUE(status);
    EXPECT_FALSE(find_job(*status, "digits")) << "the job must end with the trainer";
}

INSTANTIATE_TEST_SUITE_P(Backends, EigenExample, ::testing::Values("cgroup-v1", "affinity"),
                         [](const ::testing::TestParamInfo<std::string> &backend) {
                             return backend.param == "cgroup-v1" ? std::string("cgroup_v1") : backend.param;
                         });

}  // namespace
}  // namespace mall::test
