// SPDX-License-Identifier: BSD-3-Clause
// Proves that the memory-bound example (mall_train_linear: logistic regression streaming a dataset
// larger than the caches, blocks on Eigen's own pool, parked by mall) keeps its promise under a
// real malld: the pool follows `mallctl set` (threads reported and every thread's Cpus_allowed_list equal the
// allocation) and the trained weights are bit-identical to a plain one-thread run's (same
// checksum), with the held-out accuracy it documents.
#include <regex>

#include <gtest/gtest.h>

#include "support/malld_fixture.hpp"

MALL_TEST_WATCHDOG(290);

namespace mall::test {
namespace {

// 128 MiB of data, 8 MiB a step: ~1-2 ms a step on one core here (~14 ms in a sanitizer build, so
// 1500 steps there), several seconds a run: time for three changes on a loaded machine.
std::vector<std::string> trainer_argv() {
    return {bin_path("mall_train_linear"), "--rows", "131072", "--batch", "8192", "--steps", kUnderSanitizer ? "1500" : "6000",
            "--print-every", "500", "--log-changes"};
}

struct Result {
    std::string checksum;
    double accuracy = -1;
    int resizes = -1;
};

Result parse_result(const std::string &out) {
    Result r;
    std::smatch m;
    const std::regex final_re(R"(final loss [0-9.eE+-]+ test_accuracy ([0-9.]+) checksum ([0-9a-f]{16}))");
    const std::regex done_re(R"(done steps [0-9]+ seconds [0-9.]+ rows_per_s [0-9.]+ resizes ([0-9]+))");
    if (std::regex_search(out, m, final_re)) r.accuracy = std::stod(m[1]), r.checksum = m[2];
    if (std::regex_search(out, m, done_re)) r.resizes = std::stoi(m[1]);
    return r;
}

TEST(LinearExample, FollowsMallctlSetAndTrainsTheSameWeightsAsAPlainRun) {
    MALL_REQUIRE_ROOT_AND_CPUSET();
    auto plain_argv = trainer_argv();
    plain_argv.insert(plain_argv.end(), {"--threads", "1"});
    const auto plain = run_command(plain_argv, RunOptions{{}, false, 200s});
    ASSERT_EQ(plain.exit_code, 0) << plain.err;
    const Result reference = parse_result(plain.out);
    ASSERT_FALSE(reference.checksum.empty()) << plain.out;
    EXPECT_GE(reference.accuracy, 0.90) << plain.out;

    MalldOptions options;
    options.backend = "cgroup-v1";
    options.ack_timeout_ms = 20000;  // it steps every few ms: every change is acked, never timed out
    PrivateMalld malld(options);
    std::string error;
    ASSERT_TRUE(malld.start(&error)) << error;
    Child trainer(mallrun_argv(malld.socket(), "1:2", "linear", trainer_argv()));
    ASSERT_TRUE(trainer.wait_for_line_starting("step 1 ", 60s)) << joined_lines(trainer.all_lines());

    for (const std::string cpus : {"0", "0-1", "1"}) {
        const int threads = cpus == "0-1" ? 2 : 1;
        auto set = run_command(mallctl_argv(malld.socket(), {"set", "linear", "--cpus", cpus}));
        ASSERT_EQ(set.exit_code, 0) << set.err;
        ASSERT_TRUE(wait_until([&] { return job_settled_on(malld.socket(), "linear", cpus, 1); }, 30s))
            << "the trainer did not ack " << cpus << " (did it finish first?)\n"
            << status_text(malld) << joined_lines(trainer.all_lines());
        const std::string tail = "-> " + std::to_string(threads) + " cpus " + cpus;
        EXPECT_TRUE(trainer.wait_for_line(
            [&](const std::string &l) {
                return l.rfind("resize ", 0) == 0 && l.size() > tail.size() &&
                       l.compare(l.size() - tail.size(), tail.size(), tail) == 0;
            },
            20s))
            << "no resize line ending \"" << tail << "\":\n" << joined_lines(trainer.all_lines());
        auto job = job_status(malld.socket(), "linear");
        ASSERT_TRUE(job);
        const auto pids = job_pids(*job);
        ASSERT_EQ(pids.size(), 1u);
        EXPECT_TRUE(wait_until([&] { return threads_all_on(pids, cpus); }, 10s)) << describe_threads(pids);
    }
    ASSERT_EQ(trainer.wait_exit(200s), 0) << joined_lines(trainer.all_lines());
    const Result resized = parse_result(joined_lines(trainer.all_lines()));
    EXPECT_EQ(resized.checksum, reference.checksum) << "the weights must not depend on the thread counts\n"
                                                    << joined_lines(trainer.all_lines());
    EXPECT_GE(resized.resizes, 3) << joined_lines(trainer.all_lines());
    auto status = status_json(malld.socket());
    ASSERT_TRUE(status);
    EXPECT_FALSE(find_job(*status, "linear")) << "the job must end with the trainer";
}

}  // namespace
}  // namespace mall::test
