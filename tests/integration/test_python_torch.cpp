// SPDX-License-Identifier: BSD-3-Clause
// Proves that the Python module and its PyTorch helper follow a real malld: while examples/
// train_torch.py trains under mallrun --malleable=1:2 and is moved to cpus 0, 0-1, 1, the thread
// count torch reports and every thread's Cpus_allowed_list follow each allocation, and it still
// reaches its accuracy; without malld it warns once and trains non-malleable.
#include <cstdlib>
#include <regex>
#include <sstream>

#include <gtest/gtest.h>

#include "support/malld_fixture.hpp"

MALL_TEST_WATCHDOG(280);

// python/CMakeLists.txt passes the interpreter it chose and libmall's path; the fallbacks keep the
// file buildable on its own.
#ifndef MALL_PYTHON3_EXECUTABLE
#define MALL_PYTHON3_EXECUTABLE "/usr/bin/python3"
#endif
#ifndef MALL_LIBRARY_FILE
#define MALL_LIBRARY_FILE MALL_BIN_DIR "/../lib/libmall.so"
#endif

namespace mall::test {
namespace {

using nlohmann::json;

constexpr double kAccuracyTarget = 0.90;  // train_torch.py's stated target with its defaults

struct PythonProbe {
    std::string python;       // an interpreter that imports torch and numpy and finds sklearn
    std::string skip_reason;  // why there is none
};

std::string last_line(const std::string &text) {
    std::string t = trim(text);
    auto newline = t.rfind('\n');
    return newline == std::string::npos ? t : t.substr(newline + 1);
}

// The first candidate interpreter that can run the example, probed once (importing torch takes a
// few seconds). $MALL_PYTHON overrides the configured one.
const PythonProbe &probe_python() {
    static const PythonProbe probe = [] {
        std::vector<std::string> candidates;
        if (const char *env = std::getenv("MALL_PYTHON"); env && *env) candidates.push_back(env);
        candidates.push_back(MALL_PYTHON3_EXECUTABLE);
        candidates.push_back("/usr/bin/python3");
        PythonProbe result;
        std::string reasons;
        for (const auto &python : candidates) {
            if (python.empty() || python[0] != '/') continue;
            auto r = run_command({python, "-c",
                                  "import importlib.util, sys\n"
                                  "import numpy, torch\n"
                                  "sys.exit(0 if importlib.util.find_spec('sklearn') else 3)"},
                                 RunOptions{{}, false, 120s});
            if (r.exit_code == 0) {
                result.python = python;
                return result;
            }
            reasons += "\n  " + python + ": " +
                       (r.exit_code == -1  ? std::string("cannot be started")
                        : r.exit_code == 3 ? std::string("python3-sklearn (the digits data) is missing")
                                           : "cannot import torch/numpy: " + last_line(r.err));
        }
        result.skip_reason = "no python3 with torch, numpy and sklearn (apt install python3-torch "
                             "python3-numpy python3-sklearn):" + reasons;
        return result;
    }();
    return probe;
}

// Skips the current test when no interpreter can run the example.
#define REQUIRE_PYTHON_TORCH()                                \
    do {                                                      \
        const auto &mall_probe_ = probe_python();             \
        if (!mall_probe_.skip_reason.empty())                 \
            GTEST_SKIP() << mall_probe_.skip_reason;          \
    } while (0)

std::vector<std::pair<std::string, std::string>> python_env() {
    return {{"MALL_LIBRARY", MALL_LIBRARY_FILE},
            {"PYTHONPATH", std::string(MALL_SOURCE_DIR) + "/python"},
            {"PYTHONDONTWRITEBYTECODE", "1"}};  // nothing written into the source tree
}

std::vector<std::string> example_argv(const std::vector<std::string> &options) {
    std::vector<std::string> argv{probe_python().python, std::string(MALL_SOURCE_DIR) + "/examples/train_torch.py"};
    argv.insert(argv.end(), options.begin(), options.end());
    return argv;
}

struct Resize {
    unsigned long generation = 0;
    std::string cpus;
    int threads = 0;
};

struct ExampleOutput {
    std::vector<Resize> resizes;
    // For each "step" line: torch's thread count and how many resize lines came before it.
    std::vector<std::pair<int, size_t>> step_threads;
    double accuracy = -1;
    int final_resizes = -1;
};

ExampleOutput parse_output(const std::vector<std::string> &lines) {
    static const std::regex resize_re(R"(^resize gen ([0-9]+) cpus (\S+) threads ([0-9]+)$)");
    static const std::regex step_re(R"(^step [0-9]+ loss \S+ threads ([0-9]+)$)");
    static const std::regex final_re(
        R"(^final loss \S+ accuracy ([0-9.]+) steps [0-9]+ resizes ([0-9]+)$)");
    ExampleOutput out;
    std::smatch m;
    for (const auto &line : lines) {
        if (std::regex_match(line, m, resize_re)) {
            out.resizes.push_back({std::stoul(m[1]), m[2], std::stoi(m[3])});
        } else if (std::regex_match(line, m, step_re)) {
            out.step_threads.emplace_back(std::stoi(m[1]), out.resizes.size());
        } else if (std::regex_match(line, m, final_re)) {
            out.accuracy = std::stod(m[1]);
            out.final_resizes = std::stoi(m[2]);
        }
    }
    return out;
}

TEST(PythonTorch, ThreadsFollowTheAllocationUnderMalld) {
    MALL_REQUIRE_ROOT_AND_CPUSET();
    REQUIRE_PYTHON_TORCH();

    MalldOptions options;
    options.ack_timeout_ms = 20000;  // it steps every few ms: every change must be acked, not timed out
    PrivateMalld malld(options);
    std::string error;
    ASSERT_TRUE(malld.start(&error)) << error;

    // The initial allocation and three forced changes: it trains until it has applied all four.
    Child trainer(mallrun_argv(malld.socket(), "1:2", "torch",
                               example_argv({"--steps", "300", "--print-every", "25", "--until-resizes",
                                             "4", "--max-steps", "200000"})),
                  ChildOptions{python_env(), false, false});
    ASSERT_TRUE(trainer.wait_for_line_starting("step 1 ", 120s)) << joined_lines(trainer.all_lines());
    ASSERT_TRUE(wait_until([&] { return job_settled_on(malld.socket(), "torch", "0-1", 1); }, 20s))
        << status_json(malld.socket()).value_or(json()).dump(1);

    const std::vector<std::pair<std::string, int>> moves{{"0", 1}, {"0-1", 2}, {"1", 1}};
    for (const auto &[cpus, threads] : moves) {
        auto set = run_command(mallctl_argv(malld.socket(), {"set", "torch", "--cpus", cpus}));
        ASSERT_EQ(set.exit_code, 0) << set.err;
        ASSERT_TRUE(wait_until([&] { return job_settled_on(malld.socket(), "torch", cpus, 1); }, 30s))
            << "the trainer did not ack the change to " << cpus << "\n"
            << status_json(malld.socket()).value_or(json()).dump(1) << joined_lines(trainer.all_lines());
        auto job = job_status(malld.socket(), "torch");
        ASSERT_TRUE(job);
        auto pids = job_pids(*job);
        ASSERT_FALSE(pids.empty());
        EXPECT_TRUE(wait_until([&] { return threads_all_on(pids, cpus); }, 10s))
            << "cpus " << cpus << ": " << describe_threads(pids);
        const std::string expected = "cpus " + cpus + " threads " + std::to_string(threads);
        EXPECT_TRUE(trainer.wait_for_line(
            [&](const std::string &l) {
                return l.rfind("resize ", 0) == 0 && l.size() >= expected.size() &&
                       l.compare(l.size() - expected.size(), std::string::npos, expected) == 0;
            },
            30s))
            << "no '" << expected << "' line:\n" << joined_lines(trainer.all_lines());
    }
    ASSERT_EQ(trainer.wait_exit(180s), 0) << joined_lines(trainer.all_lines());

    const auto lines = trainer.all_lines();
    const ExampleOutput out = parse_output(lines);
    // Torch's thread count after each applied allocation: the whole pool, then the three moves.
    ASSERT_EQ(out.resizes.size(), 4u) << joined_lines(lines);
    const std::vector<std::pair<std::string, int>> expected{{"0-1", 2}, {"0", 1}, {"0-1", 2}, {"1", 1}};
    for (size_t i = 0; i < expected.size(); ++i) {
        EXPECT_EQ(out.resizes[i].cpus, expected[i].first) << joined_lines(lines);
        EXPECT_EQ(out.resizes[i].threads, expected[i].second) << joined_lines(lines);
        if (i > 0) {
            EXPECT_GT(out.resizes[i].generation, out.resizes[i - 1].generation);
        }
    }
    // Every step printed after a resize ran with the thread count of that resize.
    ASSERT_FALSE(out.step_threads.empty()) << joined_lines(lines);
    for (const auto &[threads, resizes_before] : out.step_threads) {
        if (resizes_before == 0) continue;
        EXPECT_EQ(threads, out.resizes[resizes_before - 1].threads) << joined_lines(lines);
    }
    EXPECT_EQ(out.final_resizes, 4) << joined_lines(lines);
    EXPECT_GE(out.accuracy, kAccuracyTarget) << joined_lines(lines);

    auto status = status_json(malld.socket());
    ASSERT_TRUE(status);
    EXPECT_FALSE(find_job(*status, "torch")) << "the job must end with the trainer";
}

TEST(PythonTorch, WithoutMalldItWarnsOnceAndTrains) {
    REQUIRE_PYTHON_TORCH();
    auto env = python_env();
    env.emplace_back("MALL_SOCKET", "/nonexistent-mall-test/malld.sock");
    auto r = run_command(example_argv({"--steps", "300", "--print-every", "100"}),
                         RunOptions{env, false, 180s});
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;

    int warnings = 0;
    for (const auto &l : split_lines(r.err)) warnings += l.rfind("mall: not malleable", 0) == 0;
    EXPECT_EQ(warnings, 1) << r.err;
    EXPECT_NE(r.err.find("/nonexistent-mall-test/malld.sock"), std::string::npos)
        << "the warning should name the socket:\n" << r.err;

    const ExampleOutput out = parse_output(split_lines(r.out));
    EXPECT_TRUE(out.resizes.empty()) << r.out;
    EXPECT_EQ(out.final_resizes, 0) << r.out;
    EXPECT_GE(out.accuracy, kAccuracyTarget) << r.out;
}

}  // namespace
}  // namespace mall::test
