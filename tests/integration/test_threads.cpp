// SPDX-License-Identifier: BSD-3-Clause
// Proves `mallctl set JOB --threads N|auto` under a real malld, as an admin would use it: the Eigen
// example (mall_train_digits) keeps its cpus but runs N pool threads from its next step (its own
// resize line, every thread still allowed the job's cpus), `mallctl status` shows the count
// (THREADS column, ",threads N"; `threads` / `active_threads` in --json), the count survives a malld
// restart without a change reaching the process, `auto` goes back to one thread per cpu, bad values
// are refused with words and change nothing, and the loss curve is a plain 2-thread run's.
#include <unistd.h>

#include <gtest/gtest.h>

#include "support/malld_fixture.hpp"
#include "support/training_curve.hpp"

MALL_TEST_WATCHDOG(290);

namespace mall::test {
namespace {

using nlohmann::json;

std::vector<std::string> trainer_argv() {
    return {bin_path("mall_train_digits"), "--steps", kUnderSanitizer ? "1500" : "6000", "--batch", "256", "--hidden", "256",
            "--print-every", kUnderSanitizer ? "100" : "200", "--log-changes"};
}

// A line "resize ... threads A -> B cpus LIST" with the given B and LIST.
bool is_resize_to(const std::string &l, int threads, const std::string &cpus) {
    const std::string tail = "-> " + std::to_string(threads) + " cpus " + cpus;
    return l.rfind("resize ", 0) == 0 && l.size() > tail.size() &&
           l.compare(l.size() - tail.size(), tail.size(), tail) == 0;
}

int count_resizes(const std::vector<std::string> &lines) {
    int n = 0;
    for (const auto &l : lines) n += l.rfind("resize ", 0) == 0 ? 1 : 0;
    return n;
}

TEST(Threads, MallctlSetThreadsRunsFewerThreadsOnTheSameCpus) {
    MALL_REQUIRE_ROOT_AND_CPUSET();
    if (access(kDigits, R_OK) != 0)
        GTEST_FAIL() << kDigits << " is missing: launch_scripts/install-deps.sh installs python3-sklearn";
    auto plain_argv = trainer_argv();
    plain_argv.insert(plain_argv.end(), {"--threads", "2"});
    const auto plain = run_command(plain_argv, RunOptions{{}, false, 200s});
    ASSERT_EQ(plain.exit_code, 0) << plain.err;
    const Curve reference = parse_curve(split_lines(plain.out));
    ASSERT_GE(reference.loss_at_step.size(), 10u) << plain.out;

    MalldOptions options;
    options.ack_timeout_ms = 20000;  // every change must be acked, never timed out
    PrivateMalld malld(options);
    std::string error;
    ASSERT_TRUE(malld.start(&error)) << error;
    Child trainer(mallrun_argv(malld.socket(), "1:2", "digits", trainer_argv()));
    ASSERT_TRUE(trainer.wait_for_line_starting("step 1 ", 60s)) << joined_lines(trainer.all_lines());
    ASSERT_TRUE(wait_until([&] { return job_settled_on(malld.socket(), "digits", "0-1", 1); }, 20s))
        << status_text(malld);
    const auto pids = job_pids(*job_status(malld.socket(), "digits"));
    ASSERT_EQ(pids.size(), 1u);

    // Bad values: usage errors (exit 2) or malld's refusal (exit 1), with words; nothing changes.
    const json before = *job_status(malld.socket(), "digits");
    for (const std::string bad : {"0", "-1", "abc", "2000"}) {
        auto r = run_command(mallctl_argv(malld.socket(), {"set", "digits", "--threads", bad}));
        EXPECT_EQ(r.exit_code, 2) << bad << ": " << r.err;
        EXPECT_NE(r.err.find("--threads must be 1 to"), std::string::npos) << r.err;
    }
    auto too_many = run_command(mallctl_argv(malld.socket(), {"set", "digits", "--threads", "3"}));
    EXPECT_EQ(too_many.exit_code, 1) << too_many.err;
    EXPECT_NE(too_many.err.find("holds 2 cpus (0-1)"), std::string::npos) << too_many.err;
    auto unknown = run_command(mallctl_argv(malld.socket(), {"set", "nobody", "--threads", "1"}));
    EXPECT_EQ(unknown.exit_code, 1) << unknown.err;
    const json after = *job_status(malld.socket(), "digits");
    EXPECT_EQ(after["generation"], before["generation"]);
    EXPECT_EQ(after["threads"], 0);
    EXPECT_EQ(after["active_threads"], 2);

    // --threads 1: same cpus, one pool thread from the next step, acked.
    auto set = run_command(mallctl_argv(malld.socket(), {"set", "digits", "--threads", "1"}));
    ASSERT_EQ(set.exit_code, 0) << set.err;
    EXPECT_NE(set.out.find("threads 1"), std::string::npos) << set.out;
    EXPECT_TRUE(trainer.wait_for_line([](const std::string &l) { return is_resize_to(l, 1, "0-1"); }, 20s))
        << joined_lines(trainer.all_lines());
    ASSERT_TRUE(wait_until([&] { return job_settled_on(malld.socket(), "digits", "0-1", 1); }, 20s))
        << status_text(malld);
    auto job = job_status(malld.socket(), "digits");
    ASSERT_TRUE(job);
    EXPECT_EQ((*job)["threads"], 1);
    EXPECT_EQ((*job)["active_threads"], 1);
    EXPECT_EQ((*job)["cpuset"], "0-1");
    EXPECT_EQ((*job)["acked_generation"], (*job)["generation"]);
    EXPECT_EQ((*job)["ack_timeouts"], 0);
    EXPECT_TRUE(threads_all_on(pids, "0-1")) << describe_threads(pids);  // the cpus stay the job's
    EXPECT_TRUE(trainer.wait_for_line(
        [](const std::string &l) { return l.rfind("step ", 0) == 0 && l.find(" threads 1 cpus 0-1") != std::string::npos; },
        20s))
        << joined_lines(trainer.all_lines());
    auto table = run_command(mallctl_argv(malld.socket(), {"status"}));
    ASSERT_EQ(table.exit_code, 0) << table.err;
    EXPECT_NE(table.out.find("THREADS"), std::string::npos) << table.out;
    EXPECT_NE(table.out.find("settled,threads 1"), std::string::npos) << table.out;

    // A malld restart keeps the count and sends the process nothing new.
    const int resizes_before = count_resizes(trainer.all_lines());
    const uint64_t generation = (*job)["generation"].get<uint64_t>();
    malld.kill9();
    ASSERT_TRUE(malld.restart(&error)) << error;
    ASSERT_TRUE(wait_until([&] { return job_settled_on(malld.socket(), "digits", "0-1", 1); }, 30s))
        << status_text(malld);
    job = job_status(malld.socket(), "digits");
    ASSERT_TRUE(job);
    EXPECT_EQ((*job)["threads"], 1);
    EXPECT_EQ((*job)["active_threads"], 1);
    EXPECT_EQ((*job)["generation"].get<uint64_t>(), generation);
    EXPECT_EQ(count_resizes(trainer.all_lines()), resizes_before) << joined_lines(trainer.all_lines());

    // auto: one thread per cpu again.
    set = run_command(mallctl_argv(malld.socket(), {"set", "digits", "--threads", "auto"}));
    ASSERT_EQ(set.exit_code, 0) << set.err;
    EXPECT_TRUE(trainer.wait_for_line([](const std::string &l) { return is_resize_to(l, 2, "0-1"); }, 20s))
        << joined_lines(trainer.all_lines());
    ASSERT_TRUE(wait_until([&] { return job_settled_on(malld.socket(), "digits", "0-1", 1); }, 20s))
        << status_text(malld);
    job = job_status(malld.socket(), "digits");
    EXPECT_EQ((*job)["threads"], 0);
    EXPECT_EQ((*job)["active_threads"], 2);
    EXPECT_TRUE(threads_all_on(pids, "0-1")) << describe_threads(pids);

    ASSERT_EQ(trainer.wait_exit(200s), 0) << joined_lines(trainer.all_lines());
    const Curve resized = parse_curve(trainer.all_lines());
    ASSERT_EQ(resized.loss_at_step.size(), reference.loss_at_step.size()) << joined_lines(trainer.all_lines());
    for (const auto &[step, loss] : reference.loss_at_step)
        EXPECT_NEAR(resized.loss_at_step.at(step), loss, 1e-4 * std::max(1.0, loss)) << "at step " << step;
}

}  // namespace
}  // namespace mall::test
