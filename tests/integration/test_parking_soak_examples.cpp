// SPDX-License-Identifier: BSD-3-Clause
// Proves that parking holds up when the allocation toggles every few steps: each example trainer
// (mall_train_digits and mall_train_linear on Eigen's own pool, mall_train_tf on TensorFlow's own
// pools) runs 2,400 steps (MALL_SOAK_STEPS: run-tsan.sh asks for fewer) under a real malld while mallctl moves it between 1 and 2 cpus and 1 and
// 2 threads as fast as it can (every ~10 steps), and it still exits 0, acks every change (none
// timed out), applies many of them, and trains exactly what a fixed run trains (the same printed
// losses; for mall_train_linear the same weights checksum). Run by run-tests.sh and, for the Eigen
// examples, under ThreadSanitizer (tests/tsan/run-tsan.sh).
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <regex>
#include <thread>

#include <gtest/gtest.h>

#include "support/malld_fixture.hpp"
#include "support/training_curve.hpp"

MALL_TEST_WATCHDOG(590);

namespace mall::test {
namespace {

using nlohmann::json;

// Steps per run: 2,400, or $MALL_SOAK_STEPS (240 or more; run-tsan.sh sets 960, since each step
// costs ~10x under ThreadSanitizer); a loss line every twelfth of them. The environment is read
// once, at the first call; a bad value fails that first test once and every run uses 2,400.
int soak_steps() {
    static const int steps = [] {
        const char *text = std::getenv("MALL_SOAK_STEPS");
        if (text == nullptr || *text == '\0') return 2400;
        char *end = nullptr;
        const long parsed = std::strtol(text, &end, 10);
        if (*end != '\0' || parsed < 240 || parsed > 1000000) {
            ADD_FAILURE() << "MALL_SOAK_STEPS='" << text << "' is not a whole number of steps from 240 up; using 2400";
            return 2400;
        }
        return static_cast<int>(parsed);
    }();
    return steps;
}

struct Example {
    std::string name;               // the job's name, and the test's
    std::vector<std::string> argv;  // soak_steps() steps, twelve loss lines, --log-changes
    bool compare_checksum = false;  // mall_train_linear: bit-identical weights
};

std::vector<std::string> step_args() {
    const int steps = soak_steps();
    return {"--steps", std::to_string(steps), "--print-every", std::to_string(steps / 12)};
}

std::vector<std::string> with(std::vector<std::string> argv, const std::vector<std::string> &more) {
    argv.insert(argv.end(), more.begin(), more.end());
    return argv;
}

Example digits() {
    return {"digits", with({bin_path("mall_train_digits"), "--batch", "256", "--hidden", "256", "--log-changes"},
                           step_args())};
}
Example linear() {
    return {"linear",
            with({bin_path("mall_train_linear"), "--rows", "65536", "--batch", "4096", "--log-changes"}, step_args()),
            true};
}
Example tensorflow() {
    return {"tf", with({bin_path("mall_train_tf"), "--batch", "256", "--hidden", "256", "--log-changes"},
                       step_args())};
}

std::string checksum_of(const std::vector<std::string> &lines) {
    const std::regex re(R"(checksum ([0-9a-f]{16}))");
    std::smatch m;
    for (const auto &line : lines)
        if (std::regex_search(line, m, re)) return m[1];
    return "";
}

int resizes_of(const std::vector<std::string> &lines) {
    const std::regex re(R"(^done steps [0-9]+ .* resizes ([0-9]+))");
    std::smatch m;
    for (const auto &line : lines)
        if (std::regex_search(line, m, re)) return std::stoi(m[1]);
    return -1;
}

void soak(const Example &example, const std::string &backend) {
    ::setenv("TF_CPP_MIN_LOG_LEVEL", "2", 1);
    // The reference: the same run without malld, fixed at two threads.
    auto plain_argv = example.argv;
    plain_argv.insert(plain_argv.end(), {"--threads", "2"});
    const auto plain = run_command(plain_argv, RunOptions{{}, false, 400s});
    ASSERT_EQ(plain.exit_code, 0) << plain.err;
    const auto plain_lines = split_lines(plain.out);
    const Curve reference = parse_curve(plain_lines);
    ASSERT_GE(reference.loss_at_step.size(), 12u) << plain.out;

    MalldOptions options;
    options.backend = backend;
    options.ack_timeout_ms = 30000;  // every change must be acked at a step boundary, never timed out
    PrivateMalld malld(options);
    std::string error;
    ASSERT_TRUE(malld.start(&error)) << error;
    Child trainer(mallrun_argv(malld.socket(), "1:2", example.name, example.argv));
    ASSERT_TRUE(trainer.wait_for_line_starting("step 1 ", 120s)) << joined_lines(trainer.all_lines());

    // Toggle as fast as mallctl goes until the trainer is done.
    const std::vector<std::vector<std::string>> moves = {
        {"--cpus", "0"}, {"--cpus", "0-1"}, {"--threads", "1"}, {"--cpus", "1"}, {"--threads", "auto"}, {"--cpus", "auto"}};
    std::atomic<bool> done{false};
    std::atomic<int> accepted{0};
    std::thread toggler([&] {
        for (size_t i = 0; !done.load(); ++i) {
            std::vector<std::string> args = {"set", example.name};
            const auto &move = moves[i % moves.size()];
            args.insert(args.end(), move.begin(), move.end());
            if (run_command(mallctl_argv(malld.socket(), args)).exit_code == 0) accepted.fetch_add(1);
        }
    });
    const auto exit_code = trainer.wait_exit(kUnderSanitizer ? 500s : 300s);
    done = true;
    toggler.join();
    ASSERT_EQ(exit_code, 0) << joined_lines(trainer.all_lines());

    const auto lines = trainer.all_lines();
    const int resizes = resizes_of(lines);
    EXPECT_GE(accepted.load(), 20) << "mallctl moved the job too rarely to call this a soak";
    EXPECT_GE(resizes, 20) << "the trainer applied too few changes\n" << joined_lines(lines);
    std::printf("%s on %s: %d moves accepted, %d applied in %d steps\n", example.name.c_str(), backend.c_str(),
                accepted.load(), resizes, soak_steps());
    // Every change was acked in time: malld counted no ack timeout for the job.
    auto status = status_json(malld.socket());
    ASSERT_TRUE(status);
    EXPECT_FALSE(find_job(*status, example.name)) << "the job must end with the trainer";
    const auto timeouts = status->value("node", json::object()).value("ack_timeouts", -1);
    EXPECT_EQ(timeouts, 0) << status->dump();

    // The same training as the fixed run.
    if (example.compare_checksum) {
        EXPECT_EQ(checksum_of(lines), checksum_of(plain_lines)) << joined_lines(lines);
    } else {
        const Curve resized = parse_curve(lines);
        ASSERT_EQ(resized.loss_at_step.size(), reference.loss_at_step.size()) << joined_lines(lines);
        for (const auto &[step, loss] : reference.loss_at_step)
            EXPECT_NEAR(resized.loss_at_step.at(step), loss, 1e-4 * std::max(1.0, loss)) << "at step " << step;
        EXPECT_NEAR(resized.final_loss, reference.final_loss, 1e-4);
    }
}

class ParkingSoak : public ::testing::TestWithParam<std::string> {
protected:
    void SetUp() override {
        MALL_REQUIRE_ROOT_AND_CPUSET();
        if (access(kDigits, R_OK) != 0)
            GTEST_FAIL() << kDigits << " is missing: launch_scripts/install-deps.sh installs python3-sklearn";
    }
};

TEST_P(ParkingSoak, DigitsTogglingEveryFewSteps) { soak(digits(), GetParam()); }
TEST_P(ParkingSoak, LinearTogglingEveryFewSteps) { soak(linear(), GetParam()); }
// mall_train_tf exists only in a build with TensorFlow (the ThreadSanitizer tree has none: run-tsan.sh
// leaves this case out with a filter).
TEST_P(ParkingSoak, TfTogglingEveryFewSteps) {
    if (access(bin_path("mall_train_tf").c_str(), X_OK) != 0)
        GTEST_SKIP() << "mall_train_tf is not built (no TensorFlow in this build: -DMALL_WITH_TENSORFLOW=ON)";
    soak(tensorflow(), GetParam());
}

INSTANTIATE_TEST_SUITE_P(Backends, ParkingSoak, ::testing::Values("cgroup-v1", "affinity"),
                         [](const ::testing::TestParamInfo<std::string> &backend) {
                             return backend.param == "cgroup-v1" ? std::string("cgroup_v1") : backend.param;
                         });

}  // namespace
}  // namespace mall::test
