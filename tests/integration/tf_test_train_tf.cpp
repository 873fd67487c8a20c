// SPDX-License-Identifier: BSD-3-Clause
// tf_test_train_tf.cpp — the TensorFlow example (mall_train_tf: TensorFlow's own ops, one
// Session::Run per step on TensorFlow's own pools, parked by mall) under a real malld, as a user
// would check it: it follows `mallctl set` 0 -> 0-1 -> 1 (its own resize lines, every thread's
// Cpus_allowed_list, the parked workers idle while it trains, the next step's thread count), its
// loss curve is the one a fixed-size run prints (TensorFlow's kernels give the same losses here for
// 1 and 2 threads; the tolerance only allows float rounding), two
// TensorFlow jobs share the node without overlap, and without malld it trains non-malleable after
// one warning. Built only when CMake finds TensorFlow (MALL_WITH_TENSORFLOW).
#include <signal.h>
#include <unistd.h>

#include <regex>

#include <gtest/gtest.h>

#include "support/malld_fixture.hpp"
#include "support/training_curve.hpp"

MALL_TEST_WATCHDOG(290);

namespace mall::test {
namespace {


// ~1 ms a step here: 12000 steps leave time for three changes on a loaded machine.
std::vector<std::string> trainer_argv(const std::string &steps = "12000") {
    return {bin_path("mall_train_tf"), "--steps", steps, "--batch", "256", "--hidden", "256",
            "--print-every", "250", "--log-changes"};
}

bool ends_with(const std::string &s, const std::string &tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

class TfExample : public ::testing::TestWithParam<std::string> {
protected:
    void SetUp() override {
        MALL_REQUIRE_ROOT_AND_CPUSET();
        ::setenv("TF_CPP_MIN_LOG_LEVEL", "2", 1);  // TensorFlow's start-up notes
        if (access(kDigits, R_OK) != 0)
            GTEST_FAIL() << kDigits << " is missing: launch_scripts/install-deps.sh installs python3-sklearn";
    }
};

TEST_P(TfExample, FollowsMallctlSetAndTheLossCurveIsUnchanged) {
    auto plain_argv = trainer_argv();
    plain_argv.insert(plain_argv.end(), {"--threads", "2"});
    const auto plain = run_command(plain_argv, RunOptions{{}, false, 200s});
    ASSERT_EQ(plain.exit_code, 0) << plain.err;
    const Curve reference = parse_curve(split_lines(plain.out));
    ASSERT_GE(reference.loss_at_step.size(), 40u) << plain.out;

    MalldOptions options;
    options.backend = GetParam();
    options.ack_timeout_ms = 20000;  // every change must be acked at a step boundary, never timed out
    PrivateMalld malld(options);
    std::string error;
    ASSERT_TRUE(malld.start(&error)) << error;
    Child trainer(mallrun_argv(malld.socket(), "1:2", "tf", trainer_argv()));
    ASSERT_TRUE(trainer.wait_for_line_starting("step 1 ", 60s)) << joined_lines(trainer.all_lines());
    ASSERT_TRUE(wait_until([&] { return job_settled_on(malld.socket(), "tf", "0-1", 1); }, 20s)) << status_text(malld);

    for (const std::string cpus : {"0", "0-1", "1"}) {
        const int threads = cpus == "0-1" ? 2 : 1;
        auto set = run_command(mallctl_argv(malld.socket(), {"set", "tf", "--cpus", cpus}));
        ASSERT_EQ(set.exit_code, 0) << set.err;
        ASSERT_TRUE(wait_until([&] { return job_settled_on(malld.socket(), "tf", cpus, 1); }, 30s))
            << "the trainer did not ack " << cpus << "\n" << status_text(malld) << joined_lines(trainer.all_lines());
        EXPECT_TRUE(trainer.wait_for_line(
            [&](const std::string &l) { return l.rfind("resize ", 0) == 0 && ends_with(l, "-> " + std::to_string(threads) + " cpus " + cpus); },
            20s))
            << "no resize to " << threads << " threads on " << cpus << ":\n" << joined_lines(trainer.all_lines());
        auto job = job_status(malld.socket(), "tf");
        ASSERT_TRUE(job);
        const auto pids = job_pids(*job);
        ASSERT_EQ(pids.size(), 1u);
        // Every thread of the process — mall's pool workers, the training thread, and the threads
        // TensorFlow made for its own (idle) pools — on exactly those cpus.
        EXPECT_TRUE(wait_until([&] { return threads_all_on(pids, cpus); }, 10s)) << describe_threads(pids);
        // The workers beyond the allocation are parked: the example names them, and they use no cpu
        // while the process trains on.
        const auto parked_line = trainer.wait_for_line(
            [&](const std::string &l) { return l.rfind("parked step ", 0) == 0; }, 20s);
        ASSERT_TRUE(parked_line) << joined_lines(trainer.all_lines());
        EXPECT_EQ(parked_workers_follow(*parked_line, pids[0], threads), "") << describe_threads(pids);
        EXPECT_TRUE(trainer.wait_for_line(
            [&](const std::string &l) { return l.rfind("step ", 0) == 0 && ends_with(l, " threads " + std::to_string(threads) + " cpus " + cpus); },
            20s))
            << joined_lines(trainer.all_lines());
    }
    ASSERT_EQ(trainer.wait_exit(200s), 0) << joined_lines(trainer.all_lines());

    const auto lines = trainer.all_lines();
    const Curve resized = parse_curve(lines);
    ASSERT_EQ(resized.loss_at_step.size(), reference.loss_at_step.size()) << joined_lines(lines);
    for (const auto &[step, loss] : reference.loss_at_step)
        EXPECT_NEAR(resized.loss_at_step.at(step), loss, 1e-4 * std::max(1.0, loss)) << "at step " << step;
    EXPECT_NEAR(resized.final_loss, reference.final_loss, 1e-4);
    EXPECT_GE(resized.test_accuracy, 0.95) << joined_lines(lines);
    auto status = status_json(malld.socket());
    ASSERT_TRUE(status);
    EXPECT_FALSE(find_job(*status, "tf")) << "the job must end with the trainer";
}

INSTANTIATE_TEST_SUITE_P(Backends, TfExample, ::testing::Values("cgroup-v1", "affinity"),
                         [](const ::testing::TestParamInfo<std::string> &backend) {
                             return backend.param == "cgroup-v1" ? std::string("cgroup_v1") : backend.param;
                         });

TEST(TfExampleTwoJobs, TwoTensorFlowJobsShareTheNodeWithoutOverlap) {
    MALL_REQUIRE_ROOT_AND_CPUSET();
    ::setenv("TF_CPP_MIN_LOG_LEVEL", "2", 1);
    PrivateMalld malld;
    std::string error;
    ASSERT_TRUE(malld.start(&error)) << error;
    Child a(mallrun_argv(malld.socket(), "1:2", "tf-a", trainer_argv("30000")));
    Child b(mallrun_argv(malld.socket(), "1:2", "tf-b", trainer_argv("30000")));
    std::string cpus_a, cpus_b;
    ASSERT_TRUE(wait_until([&] {
        auto ja = job_status(malld.socket(), "tf-a");
        auto jb = job_status(malld.socket(), "tf-b");
        if (!ja || !jb) return false;
        cpus_a = ja->value("cpus", "");
        cpus_b = jb->value("cpus", "");
        return ja->value("ncpus", 0) == 1 && jb->value("ncpus", 0) == 1 && cpus_a != cpus_b &&
               job_settled_on(malld.socket(), "tf-a", cpus_a, 1) && job_settled_on(malld.socket(), "tf-b", cpus_b, 1);
    }, 60s)) << status_text(malld);
    auto pids_a = job_pids(*job_status(malld.socket(), "tf-a"));
    auto pids_b = job_pids(*job_status(malld.socket(), "tf-b"));
    EXPECT_TRUE(wait_until([&] { return threads_all_on(pids_a, cpus_a) && threads_all_on(pids_b, cpus_b); }, 10s))
        << describe_threads(pids_a) << "\n" << describe_threads(pids_b);
    EXPECT_TRUE(a.wait_for_line([&](const std::string &l) { return l.rfind("step ", 0) == 0 && ends_with(l, " threads 1 cpus " + cpus_a); }, 30s))
        << joined_lines(a.all_lines());
    EXPECT_TRUE(b.wait_for_line([&](const std::string &l) { return l.rfind("step ", 0) == 0 && ends_with(l, " threads 1 cpus " + cpus_b); }, 30s))
        << joined_lines(b.all_lines());
    a.signal_group(SIGTERM);
    b.signal_group(SIGTERM);
    a.wait_exit(20s);
    b.wait_exit(20s);
}

TEST(TfExampleAlone, WithoutMalldItTrainsNonMalleableAfterOneWarning) {
    const std::string missing = "/tmp/mall-no-such-dir-" + std::to_string(::getpid()) + "/malld.sock";
    auto argv = trainer_argv("300");
    auto r = run_command(argv, RunOptions{{{"MALL_SOCKET", missing}, {"MALL_JOB_ID", "tf"}, {"TF_CPP_MIN_LOG_LEVEL", "2"}}, false, 120s});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    const Curve curve = parse_curve(split_lines(r.out));
    EXPECT_GE(curve.test_accuracy, 0.9) << r.out;
    size_t warnings = 0;
    for (const auto &l : split_lines(r.err))
        if (l.find("warning") != std::string::npos) ++warnings;
    EXPECT_EQ(warnings, 1u) << r.err;
}

}  // namespace
}  // namespace mall::test
