// SPDX-License-Identifier: BSD-3-Clause
// Proves that the example trainer (mall_train_sgd) follows forced resizes under malld and still
// computes exactly what a plain run without malld computes (same checksum), with its loss going down.
#include <regex>

#include <gtest/gtest.h>

#include "support/malld_fixture.hpp"

MALL_TEST_WATCHDOG(280);

namespace mall::test {
namespace {

using nlohmann::json;

constexpr const char *kSteps = "400";
constexpr const char *kSeed = "3";

struct TrainingResult {
    double final_loss = -1, first_loss = -1, accuracy = -1;
    std::string checksum;
    std::vector<double> step_losses;
};

// Reads the trainer's output: "step N loss X ...", "done ... first loss X", "final loss X accuracy A
// checksum H".
TrainingResult parse_output(const std::vector<std::string> &lines) {
    TrainingResult r;
    const std::regex final_re(R"(^final loss ([0-9.eE+-]+) accuracy ([0-9.eE+-]+) checksum ([0-9a-fA-F]+)$)");
    const std::regex first_re(R"(first loss ([0-9.eE+-]+))");
    const std::regex step_re(R"(^step [0-9]+ loss ([0-9.eE+-]+))");
    std::smatch m;
    for (const auto &line : lines) {
        if (std::regex_search(line, m, final_re)) {
            r.final_loss = std::stod(m[1]);
            r.accuracy = std::stod(m[2]);
            r.checksum = m[3];
        } else if (std::regex_search(line, m, first_re)) {
            r.first_loss = std::stod(m[1]);
        } else if (std::regex_search(line, m, step_re)) {
            r.step_losses.push_back(std::stod(m[1]));
        }
    }
    return r;
}

std::vector<std::string> trainer_argv() {
    return {bin_path("mall_train_sgd"), "--steps", kSteps, "--seed", kSeed, "--print-every", "20", "--log-changes"};
}

TEST(Example, ResizedRunGivesTheSameResultAsAPlainRun) {
    MALL_REQUIRE_ROOT_AND_CPUSET();

    // The reference: no malld, a fixed worker count.
    auto plain_argv = trainer_argv();
    plain_argv.insert(plain_argv.end(), {"--threads", "2"});
    auto plain = run_command(plain_argv, RunOptions{{}, false, 180s});
    ASSERT_EQ(plain.exit_code, 0) << plain.err;
    const TrainingResult reference = parse_output(split_lines(plain.out));
    ASSERT_FALSE(reference.checksum.empty()) << "no final line in:\n" << plain.out;
    EXPECT_LT(reference.final_loss, reference.first_loss) << plain.out;

    // The same training under malld, resized three times while it runs.
    MalldOptions options;
    options.ack_timeout_ms = 20000;  // it steps every ~10 ms: every change must be acked, not timed out
    PrivateMalld malld(options);
    std::string error;
    ASSERT_TRUE(malld.start(&error)) << error;
    Child trainer(mallrun_argv(malld.socket(), "1:2", "sgd", trainer_argv()));
    ASSERT_TRUE(trainer.wait_for_line_starting("step 1 ", 60s)) << joined_lines(trainer.all_lines());
    ASSERT_TRUE(wait_until([&] { return job_settled_on(malld.socket(), "sgd", "0-1", 1); }, 20s))
        << status_json(malld.socket()).value_or(json()).dump(1);

    for (const std::string cpus : {"0", "0-1", "1"}) {
        auto set = run_command(mallctl_argv(malld.socket(), {"set", "sgd", "--cpus", cpus}));
        ASSERT_EQ(set.exit_code, 0) << set.err;
        ASSERT_TRUE(wait_until([&] { return job_settled_on(malld.socket(), "sgd", cpus, 1); }, 30s))
            << "the trainer did not ack the change to " << cpus << " (did it finish first?)\n"
            << status_json(malld.socket()).value_or(json()).dump(1) << joined_lines(trainer.all_lines());
        auto job = job_status(malld.socket(), "sgd");
        ASSERT_TRUE(job);
        auto pids = job_pids(*job);
        EXPECT_TRUE(wait_until([&] { return threads_all_on(pids, cpus); }, 10s)) << describe_threads(pids);
        EXPECT_TRUE(trainer.wait_for_line(
            [&](const std::string &l) {
                return l.rfind("resize ", 0) == 0 && l.size() >= cpus.size() + 5 &&
                       l.compare(l.size() - cpus.size() - 5, std::string::npos, "cpus " + cpus) == 0;
            },
            20s))
            << "no resize line for cpus " << cpus << ":\n" << joined_lines(trainer.all_lines());
    }
    ASSERT_EQ(trainer.wait_exit(180s), 0) << joined_lines(trainer.all_lines());

    const auto lines = trainer.all_lines();
    const TrainingResult resized = parse_output(lines);
    ASSERT_FALSE(resized.checksum.empty()) << joined_lines(lines);
    int resize_lines = 0;
    for (const auto &l : lines) resize_lines += l.rfind("resize ", 0) == 0;
    EXPECT_GE(resize_lines, 4) << "the initial allocation and three forced changes:\n" << joined_lines(lines);

    EXPECT_EQ(resized.checksum, reference.checksum) << "resizes changed the result\nplain:\n"
                                                    << plain.out << "resized:\n" << joined_lines(lines);
    EXPECT_EQ(resized.final_loss, reference.final_loss);
    EXPECT_EQ(resized.accuracy, reference.accuracy);

    // It learned: the loss goes down over the run.
    EXPECT_LT(resized.final_loss, resized.first_loss) << joined_lines(lines);
    ASSERT_GE(resized.step_losses.size(), 2u);
    EXPECT_LT(resized.step_losses.back(), resized.step_losses.front()) << joined_lines(lines);
    EXPECT_LT(resized.final_loss, 0.5 * resized.first_loss) << joined_lines(lines);

    auto status = status_json(malld.socket());
    ASSERT_TRUE(status);
    EXPECT_FALSE(find_job(*status, "sgd")) << "the job must end with the trainer";
}

}  // namespace
}  // namespace mall::test
