// tf_test_keras.cpp — Keras model.fit made malleable by mall's callback (mall.keras.Malleable:
// TensorFlow's own pools parked through mall's op library, unpatched TensorFlow from the project's
// venv), under a real malld, as a user would check it: examples/keras_digits.py follows `mallctl
// set` 0 -> 0-1 -> 1 -> auto (its own resize lines with TensorFlow's running intra-op count, every
// thread's Cpus_allowed_list, the parked workers idle while it trains), exits 0, and prints the
// loss curve of a plain Keras run (--no-mall) within float rounding. Built only with TensorFlow.
#include <unistd.h>

#include <gtest/gtest.h>

#include "support/malld_fixture.hpp"
#include "support/training_curve.hpp"

MALL_TEST_WATCHDOG(290);

namespace mall::test {
namespace {

bool ends_with(const std::string &s, const std::string &tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

std::vector<std::string> keras_argv(const std::string &steps) {
    return {MALL_TF_PYTHON, std::string(MALL_SOURCE_DIR) + "/examples/keras_digits.py", "--steps", steps,
            "--print-every", "500", "--log-changes"};
}

class KerasExample : public ::testing::TestWithParam<std::string> {
protected:
    void SetUp() override {
        MALL_REQUIRE_ROOT_AND_CPUSET();
        if (access(kDigits, R_OK) != 0)
            GTEST_FAIL() << kDigits << " is missing: launch_scripts/install-deps.sh installs python3-sklearn";
        if (access(MALL_TF_PYTHON, X_OK) != 0)
            GTEST_FAIL() << MALL_TF_PYTHON << " is missing: launch_scripts/install-deps.sh makes the venv";
        // What a user's environment has after `cmake --install`; here the build tree's files.
        ::setenv("PYTHONPATH", (std::string(MALL_SOURCE_DIR) + "/python").c_str(), 1);
        ::setenv("MALL_LIBRARY", MALL_LIBRARY_FILE, 1);
        ::setenv("MALL_TF_OPS_LIBRARY", MALL_TF_OPS_FILE, 1);
        ::setenv("TF_CPP_MIN_LOG_LEVEL", "2", 1);
    }
};

TEST_P(KerasExample, FitFollowsMallctlSetOnTensorFlowsOwnPools) {
    auto plain_argv = keras_argv("10000");
    plain_argv.push_back("--no-mall");
    const auto plain = run_command(plain_argv, RunOptions{{{"PYTHONPATH", std::string(MALL_SOURCE_DIR) + "/python"},
                                                           {"TF_CPP_MIN_LOG_LEVEL", "2"}},
                                                          false, 250s});
    ASSERT_EQ(plain.exit_code, 0) << plain.err;
    const Curve reference = parse_curve(split_lines(plain.out));
    ASSERT_GE(reference.loss_at_step.size(), 20u) << plain.out;  // steps 1, 500, ..., 10000

    MalldOptions options;
    options.backend = GetParam();
    options.ack_timeout_ms = 20000;  // every change must be acked at a batch end, never timed out
    PrivateMalld malld(options);
    std::string error;
    ASSERT_TRUE(malld.start(&error)) << error;
    Child trainer(mallrun_argv(malld.socket(), "1:2", "keras", keras_argv("10000")));
    ASSERT_TRUE(trainer.wait_for_line_starting("step 1 ", 90s)) << joined_lines(trainer.all_lines());
    ASSERT_TRUE(wait_until([&] { return job_settled_on(malld.socket(), "keras", "0-1", 1); }, 30s)) << status_text(malld);

    for (const std::string cpus : {"0", "0-1", "1", "auto"}) {
        const std::string expected_cpus = cpus == "auto" ? "0-1" : cpus;
        const int threads = expected_cpus == "0-1" ? 2 : 1;
        auto set = run_command(mallctl_argv(malld.socket(), {"set", "keras", "--cpus", cpus}));
        ASSERT_EQ(set.exit_code, 0) << set.err;
        ASSERT_TRUE(wait_until([&] { return job_settled_on(malld.socket(), "keras", expected_cpus, 1); }, 30s))
            << "the trainer did not ack " << cpus << "\n" << status_text(malld) << joined_lines(trainer.all_lines());
        // Its own report: TensorFlow's intra-op pool runs as many workers as the allocation has cpus.
        EXPECT_TRUE(trainer.wait_for_line(
            [&](const std::string &l) {
                return l.rfind("resize ", 0) == 0 && ends_with(l, "-> " + std::to_string(threads) + " cpus " + expected_cpus);
            },
            30s))
            << "no resize to " << threads << " on " << expected_cpus << ":\n" << joined_lines(trainer.all_lines());
        auto job = job_status(malld.socket(), "keras");
        ASSERT_TRUE(job);
        const auto pids = job_pids(*job);
        ASSERT_EQ(pids.size(), 1u);
        EXPECT_TRUE(wait_until([&] { return threads_all_on(pids, expected_cpus); }, 10s)) << describe_threads(pids);
        const auto parked_line = trainer.wait_for_line(
            [&](const std::string &l) { return l.rfind("parked step ", 0) == 0; }, 20s);
        ASSERT_TRUE(parked_line) << joined_lines(trainer.all_lines());
        EXPECT_EQ(parked_workers_follow(*parked_line, pids[0], threads), "") << describe_threads(pids);
    }
    ASSERT_EQ(trainer.wait_exit(250s), 0) << joined_lines(trainer.all_lines());

    const auto lines = trainer.all_lines();
    const Curve resized = parse_curve(lines);
    ASSERT_EQ(resized.loss_at_step.size(), reference.loss_at_step.size()) << joined_lines(lines);
    double largest = 0;
    for (const auto &[step, loss] : reference.loss_at_step) {
        largest = std::max(largest, std::abs(resized.loss_at_step.at(step) - loss));
        EXPECT_NEAR(resized.loss_at_step.at(step), loss, 1e-4 * std::max(1.0, loss)) << "at step " << step;
    }
    std::printf("largest loss difference against the plain run: %.3g\n", largest);
}

INSTANTIATE_TEST_SUITE_P(Backends, KerasExample, ::testing::Values("cgroup-v1", "affinity"),
                         [](const ::testing::TestParamInfo<std::string> &backend) {
                             return backend.param == "cgroup-v1" ? std::string("cgroup_v1") : backend.param;
                         });

}  // namespace
}  // namespace mall::test
