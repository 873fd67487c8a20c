// SPDX-License-Identifier: BSD-3-Clause
// tf_test_keras.cpp — Python TensorFlow made malleable by mall (TensorFlow's own pools parked through
// mall's op library, unpatched TensorFlow from the project's venv), under a real malld, as a user
// would check it:
//  - Keras model.fit with mall.keras.Malleable (examples/keras_digits.py) and a custom loop of
//    tf.function steps with mall.tensorflow.Malleable (examples/tf_function_digits.py) follow
//    `mallctl set` 0 -> 0-1 -> 1 -> auto: their own resize lines with TensorFlow's running intra-op
//    count, every thread's Cpus_allowed_list, the parked workers idle and the process on about one
//    core while it trains at one, exit 0, and the loss curve of a plain run (--no-mall) within
//    float rounding (the largest difference is printed), their steps counted as work in the status;
//    with --threads 1 (pools TensorFlow made with one worker) the masks follow and nothing is
//    ever parked;
//  - a Conv2D and a GRU model survive 2,000 steps with the allocation changing every few steps;
//  - a job parked at exit ends 0, Ctrl-C while parked ends the job, and malld SIGKILLed mid-fit
//    leaves it training with one warning and re-attached (it follows a set) after the restart.
// Built only with TensorFlow. By default against the build tree (the venv's python, the source's
// package, the built libraries); with MALL_TEST_TF_PYTHON set, against that Python's own installed
// mall, as a user's venv has it after `pip install` (tests/python_package/run-pip-keras.sh).
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>

#include <gtest/gtest.h>

#include "support/malld_fixture.hpp"
#include "support/training_curve.hpp"

MALL_TEST_WATCHDOG(480);  // per entry: tf_test_keras ~100-140 s here, the lifecycle ~70 s

namespace mall::test {
namespace {

bool ends_with(const std::string &s, const std::string &tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// The Python that trains: MALL_TEST_TF_PYTHON (a venv with mall pip-installed), else the project's.
std::string tf_python() {
    const char *installed = std::getenv("MALL_TEST_TF_PYTHON");
    return installed && *installed ? installed : MALL_TF_PYTHON;
}
bool uses_installed_mall() { return tf_python() != MALL_TF_PYTHON; }

// PYTHONPATH for the trainer: the source's package, or nothing for an installed mall.
std::string package_path() { return uses_installed_mall() ? "" : std::string(MALL_SOURCE_DIR) + "/python"; }

std::vector<std::string> python_argv(const std::string &program, const std::string &steps,
                                     const std::vector<std::string> &extra = {}) {
    std::vector<std::string> argv{tf_python(), std::string(MALL_SOURCE_DIR) + "/examples/" + program, "--steps", steps,
                                  "--log-changes"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return argv;
}

bool is_resize_to(const std::string &line, int threads, const std::string &cpus) {
    return line.rfind("resize ", 0) == 0 && ends_with(line, "-> " + std::to_string(threads) + " cpus " + cpus);
}

// Everything a test of this file needs before it starts a Python trainer.
void require_python_tensorflow() {
    if (access(kDigits, R_OK) != 0)
        GTEST_FAIL() << kDigits << " is missing: launch_scripts/install-deps.sh installs python3-sklearn";
    if (access(tf_python().c_str(), X_OK) != 0)
        GTEST_FAIL() << tf_python() << " is missing: launch_scripts/install-deps.sh makes the venv";
    if (uses_installed_mall()) {  // only what `pip install` put into that venv
        ::unsetenv("PYTHONPATH");
        ::unsetenv("MALL_LIBRARY");
        ::unsetenv("MALL_TF_OPS_LIBRARY");
    } else {  // what a user's environment has after `cmake --install`; here the build tree's files
        ::setenv("PYTHONPATH", package_path().c_str(), 1);
        ::setenv("MALL_LIBRARY", MALL_LIBRARY_FILE, 1);
        ::setenv("MALL_TF_OPS_LIBRARY", MALL_TF_OPS_FILE, 1);
    }
    ::setenv("TF_CPP_MIN_LOG_LEVEL", "2", 1);
}

struct Trainer {
    std::string name;     // the test's name part
    std::string program;  // under examples/
    std::vector<std::string> options;
    std::string backend;
    int pool_size;  // TensorFlow's pools: the most workers that can run
};

class FollowsMallctlSet : public ::testing::TestWithParam<Trainer> {
protected:
    void SetUp() override {
        MALL_REQUIRE_ROOT_AND_CPUSET();
        require_python_tensorflow();
    }
};

TEST_P(FollowsMallctlSet, OnTensorFlowsOwnPools) {
    const Trainer &trainer_kind = GetParam();
    auto argv = python_argv(trainer_kind.program, "10000", trainer_kind.options);
    argv.insert(argv.end(), {"--print-every", "500"});
    auto plain_argv = argv;
    plain_argv.push_back("--no-mall");
    // The plain run's curve, once per command (the Keras run on both backends shares one).
    static std::map<std::vector<std::string>, Curve> plain_curves;
    if (plain_curves.count(plain_argv) == 0) {
        const auto plain = run_command(plain_argv, RunOptions{{{"PYTHONPATH", package_path()},
                                                               {"TF_CPP_MIN_LOG_LEVEL", "2"}},
                                                              false, 250s});
        ASSERT_EQ(plain.exit_code, 0) << plain.err;
        plain_curves[plain_argv] = parse_curve(split_lines(plain.out));
    }
    const Curve reference = plain_curves.at(plain_argv);
    ASSERT_GE(reference.loss_at_step.size(), 20u);  // steps 1, 500, ..., 10000

    MalldOptions options;
    options.backend = trainer_kind.backend;
    options.ack_timeout_ms = 20000;  // every change must be acked at a step boundary, never timed out
    PrivateMalld malld(options);
    std::string error;
    ASSERT_TRUE(malld.start(&error)) << error;
    Child trainer(mallrun_argv(malld.socket(), "1:2", "tf", argv));
    ASSERT_TRUE(trainer.wait_for_line_starting("step 1 ", 90s)) << joined_lines(trainer.all_lines());
    ASSERT_TRUE(wait_until([&] { return job_settled_on(malld.socket(), "tf", "0-1", 1); }, 30s)) << status_text(malld);
    // The trainer reports each step as a unit of work (the Keras callback does it itself; the
    // custom loop calls report_progress): malld's status shows its work_units rising, never above
    // the steps it can have run (10,000 timed, and keras_digits.py's 20 warm-up steps).
    uint64_t units = 0;
    EXPECT_TRUE(wait_until([&] {
        auto job = job_status(malld.socket(), "tf");
        units = job ? job->value("work_units", uint64_t{0}) : 0;
        return units >= 100;
    }, 30s)) << "work_units " << units << "\n" << status_text(malld);
    EXPECT_LE(units, 10020u) << status_text(malld);

    for (const std::string cpus : {"0", "0-1", "1", "auto"}) {
        const std::string expected_cpus = cpus == "auto" ? "0-1" : cpus;
        const int threads = std::min(expected_cpus == "0-1" ? 2 : 1, trainer_kind.pool_size);
        auto set = run_command(mallctl_argv(malld.socket(), {"set", "tf", "--cpus", cpus}));
        ASSERT_EQ(set.exit_code, 0) << set.err;
        ASSERT_TRUE(wait_until([&] { return job_settled_on(malld.socket(), "tf", expected_cpus, 1); }, 30s))
            << "the trainer did not ack " << cpus << "\n" << status_text(malld) << joined_lines(trainer.all_lines());
        // Its own report: TensorFlow's intra-op pool runs as many workers as the allocation has cpus.
        EXPECT_TRUE(trainer.wait_for_line([&](const std::string &l) { return is_resize_to(l, threads, expected_cpus); }, 30s))
            << "no resize to " << threads << " on " << expected_cpus << ":\n" << joined_lines(trainer.all_lines());
        auto job = job_status(malld.socket(), "tf");
        ASSERT_TRUE(job);
        const auto pids = job_pids(*job);
        ASSERT_EQ(pids.size(), 1u);
        EXPECT_TRUE(wait_until([&] { return threads_all_on(pids, expected_cpus); }, 10s)) << describe_threads(pids);
        const auto parked_line = trainer.wait_for_line(
            [&](const std::string &l) { return l.rfind("parked step ", 0) == 0; }, 20s);
        ASSERT_TRUE(parked_line) << joined_lines(trainer.all_lines());
        if (trainer_kind.pool_size == 1) {
            EXPECT_TRUE(parked_tids_of(*parked_line).empty()) << "a pool of one worker parked it: " << *parked_line;
        } else {
            EXPECT_EQ(parked_workers_follow(*parked_line, pids[0], threads), "") << describe_threads(pids);
        }
        if (expected_cpus != "0-1") {
            // One cpu, one running worker: the process uses about one core (it could use two).
            const double cores = process_cores_over(pids[0], 1000ms);
            EXPECT_LT(cores, 1.25) << "on one cpu the trainer used " << cores << " cores";
            std::printf("%s on cpus %s: the process used %.2f cores\n", trainer_kind.name.c_str(), cpus.c_str(), cores);
        }
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
    std::printf("%s: largest loss difference against the plain run: %.3g\n", trainer_kind.name.c_str(), largest);
}

INSTANTIATE_TEST_SUITE_P(
    Trainers, FollowsMallctlSet,
    ::testing::Values(Trainer{"keras_cgroup_v1", "keras_digits.py", {}, "cgroup-v1", 2},
                      Trainer{"keras_affinity", "keras_digits.py", {}, "affinity", 2},
                      Trainer{"tf_function_cgroup_v1", "tf_function_digits.py", {}, "cgroup-v1", 2},
                      Trainer{"keras_threads_1_cgroup_v1", "keras_digits.py", {"--threads", "1"}, "cgroup-v1", 1}),
    [](const ::testing::TestParamInfo<Trainer> &trainer) { return trainer.param.name; });

// A trainer under a private malld (cgroup-v1 backend), started and settled on both cpus.
class KerasUnderMalld : public ::testing::Test {
protected:
    void SetUp() override {
        MALL_REQUIRE_ROOT_AND_CPUSET();
        require_python_tensorflow();
        MalldOptions options;
        options.backend = "cgroup-v1";
        options.ack_timeout_ms = 20000;
        malld_ = std::make_unique<PrivateMalld>(options);
        std::string error;
        ASSERT_TRUE(malld_->start(&error)) << error;
    }
    void start(const std::vector<std::string> &argv, std::vector<std::pair<std::string, std::string>> env = {}) {
        trainer_ = std::make_unique<Child>(mallrun_argv(malld_->socket(), "1:2", "keras", argv),
                                           ChildOptions{std::move(env), false, true});
        ASSERT_TRUE(trainer_->wait_for_line_starting("step 1 ", 90s)) << output();
        ASSERT_TRUE(wait_until([&] { return job_settled_on(malld_->socket(), "keras", "0-1", 1); }, 30s))
            << status_text(*malld_);
    }
    // mallctl set, then the trainer's own resize line for it.
    void set_and_see(const std::string &cpus, int threads, const std::string &expected_cpus) {
        auto set = run_command(mallctl_argv(malld_->socket(), {"set", "keras", "--cpus", cpus}));
        ASSERT_EQ(set.exit_code, 0) << set.err;
        ASSERT_TRUE(trainer_->wait_for_line([&](const std::string &l) { return is_resize_to(l, threads, expected_cpus); }, 30s))
            << "no resize to " << threads << " on " << expected_cpus << ":\n" << output();
    }
    pid_t python_pid() {
        auto job = job_status(malld_->socket(), "keras");
        if (!job) return -1;
        const auto pids = job_pids(*job);
        return pids.size() == 1 ? pids[0] : -1;
    }
    std::string output() const { return trainer_ ? joined_lines(trainer_->all_lines()) : ""; }

    std::unique_ptr<PrivateMalld> malld_;
    std::unique_ptr<Child> trainer_;
};

// Kernels that may nest parallel regions (Conv2D, GRU), with the allocation changing every few
// steps for 2,000 steps: no hang (the watchdog), no crash, the training ends as usual.
class ModelSoak : public KerasUnderMalld, public ::testing::WithParamInterface<std::string> {};

TEST_P(ModelSoak, TwoThousandStepsWithTheAllocationChangingEveryFewSteps) {
    start(python_argv("keras_digits.py", "2000", {"--model", GetParam(), "--print-every", "200", "--warmup", "5"}));
    const std::vector<std::string> cycle{"0", "0-1", "1", "auto"};
    int sets = 0;
    while (!trainer_->exited() && !trainer_->wait_exit(20ms)) {
        auto set = run_command(mallctl_argv(malld_->socket(), {"set", "keras", "--cpus", cycle[sets % cycle.size()]}));
        if (set.exit_code != 0 && trainer_->wait_exit(10s)) break;  // the job ended meanwhile
        ASSERT_EQ(set.exit_code, 0) << set.err << output();
        ++sets;
    }
    ASSERT_EQ(trainer_->wait_exit(200s), 0) << output();
    const auto lines = trainer_->all_lines();
    int resizes = 0;
    for (const auto &line : lines) resizes += line.rfind("resize ", 0) == 0;
    EXPECT_GE(resizes, 20) << "the allocation hardly changed during the run (" << sets << " sets):\n" << output();
    double accuracy = -1;
    const std::regex final_line(R"(^final loss \S+ test_loss \S+ accuracy (\S+)$)");
    std::smatch m;
    for (const auto &line : lines)
        if (std::regex_match(line, m, final_line)) accuracy = std::stod(m[1]);
    EXPECT_GT(accuracy, 0.5) << "it did not learn:\n" << output();
    std::printf("%s: %d sets, %d resizes applied in 2000 steps, test accuracy %.3f\n", GetParam().c_str(), sets,
                resizes, accuracy);
}

INSTANTIATE_TEST_SUITE_P(Models, ModelSoak, ::testing::Values("conv", "gru"));

// Parked at exit: the pools' parked workers are released at exit and the job ends 0, at once.
TEST_F(KerasUnderMalld, AJobParkedWhenItEndsExitsZero) {
    start(python_argv("keras_digits.py", "3000", {"--print-every", "1000"}));
    set_and_see("0", 1, "0");
    ASSERT_EQ(trainer_->wait_exit(200s), 0) << output();
    EXPECT_TRUE(wait_until([&] { return !job_status(malld_->socket(), "keras"); }, 10s)) << status_text(*malld_);
}

// How a process stands with signals, for a failure message: the process's pending, ignored and
// caught sets, and each thread's blocked and pending ones (/proc/PID/task/TID/status).
std::string signal_state(pid_t pid) {
    auto fields = [](const std::string &status_path, std::initializer_list<const char *> names) {
        std::ifstream in(status_path);
        std::string line, out;
        while (std::getline(in, line))
            for (const char *name : names)
                if (line.rfind(std::string(name) + ":", 0) == 0) out += " " + line;
        return out;
    };
    const std::string proc = "/proc/" + std::to_string(pid);
    std::string out = "pid " + std::to_string(pid) + fields(proc + "/status", {"ShdPnd", "SigIgn", "SigCgt"}) + "\n";
    std::error_code ec;
    for (const auto &task : std::filesystem::directory_iterator(proc + "/task", ec))
        out += "  tid " + task.path().filename().string() +
               fields(task.path().string() + "/status", {"Name", "SigPnd", "SigBlk"}) + "\n";
    return out;
}

// A long trainer's output, for a failure message: every line but the periodic "step " lines (the
// tracebacks, "Exception ignored" notes, resize lines), the count of step lines, and the last ones.
std::string output_digest(const std::vector<std::string> &lines) {
    std::string out;
    size_t steps = 0;
    for (const auto &line : lines) {
        if (line.rfind("step ", 0) == 0) ++steps;
        else out += line + "\n";
    }
    out += std::to_string(steps) + " step lines; the last lines:\n";
    for (size_t i = lines.size() > 5 ? lines.size() - 5 : 0; i < lines.size(); ++i) out += lines[i] + "\n";
    return out;
}

// Ctrl-C while workers are parked: the terminal's SIGINT reaches mallrun and Python; Keras stops
// with KeyboardInterrupt, nothing hangs on a parked worker, and malld forgets the job.
// A Ctrl-C can be lost without mall: Python raises KeyboardInterrupt in whatever Python code runs
// next, and C code that called that Python code may drop it (numpy's np.array(tensor) in Keras's
// per-batch pythonify_logs, TensorFlow's C++ fast path). tests/integration/keras_ctrl_c_loss.py,
// plain Keras without mall, lost 1 of 136 with TensorFlow 2.16 and 2 of 118 with 2.21; in a CI run two in
// a row were lost. So the test does what a user does, presses again, up to kCtrlCPresses times,
// and fails when none ends the job.
TEST_F(KerasUnderMalld, CtrlCWhileParkedEndsTheJob) {
    constexpr int kCtrlCPresses = 6;
    // PYTHONFAULTHANDLER: should every Ctrl-C be lost, a SIGABRT makes Python print each thread's
    // Python stack, which says where the main thread was.
    start(python_argv("keras_digits.py", "1000000", {"--print-every", "1000"}), {{"PYTHONFAULTHANDLER", "1"}});
    set_and_see("0", 1, "0");
    const pid_t pid = python_pid();
    ASSERT_GT(pid, 0) << status_text(*malld_);
    std::optional<int> code;
    for (int press = 1; press <= kCtrlCPresses && !code; ++press) {
        trainer_->signal_group(SIGINT);  // what Ctrl-C in a terminal does: the foreground process group
        code = trainer_->wait_exit(15s);
        if (!code)
            std::printf("note: Ctrl-C %d of %d did not end the job in 15 s; python's signal state (SIGINT is "
                        "bit 1, 0x2):\n%s", press, kCtrlCPresses, signal_state(pid).c_str());
    }
    if (!code) {
        const std::string state = signal_state(pid);
        ::kill(pid, SIGABRT);  // faulthandler prints each thread's Python stack, then Python dies
        trainer_->wait_exit(20s);
        FAIL() << "still running after " << kCtrlCPresses << " Ctrl-C (python's signal state: SIGINT is bit 1, 0x2):\n"
               << state << "its output, with the Python stacks of a SIGABRT at the end:\n"
               << output_digest(trainer_->all_lines());
    }
    EXPECT_NE(*code, 0) << output();
    EXPECT_NE(output().find("KeyboardInterrupt"), std::string::npos) << output();
    EXPECT_TRUE(wait_until([&] { return ::kill(pid, 0) != 0; }, 10s)) << "python " << pid << " outlived mallrun";
    EXPECT_TRUE(wait_until([&] { return !job_status(malld_->socket(), "keras"); }, 10s)) << status_text(*malld_);
}

// malld SIGKILLed mid-fit: the training runs on (its steps go on, one warning), and once malld is
// back on its state it re-adopts the job, which follows the next set.
TEST_F(KerasUnderMalld, MalldKilledMidFitTrainingRunsOnAndReattaches) {
    start(python_argv("keras_digits.py", "20000", {"--print-every", "500"}));
    malld_->kill9();
    auto step_after = [&](Millis timeout) {
        return trainer_->wait_for_line([](const std::string &l) { return l.rfind("step ", 0) == 0; }, timeout);
    };
    ASSERT_TRUE(step_after(30s)) << "no step after malld died:\n" << output();
    ASSERT_TRUE(step_after(30s)) << "no step after malld died:\n" << output();
    std::string error;
    ASSERT_TRUE(malld_->restart(&error)) << error;
    ASSERT_TRUE(wait_until([&] { return job_settled_on(malld_->socket(), "keras", "0-1", 1); }, 30s))
        << "not re-adopted and re-attached:\n" << status_text(*malld_) << output();
    set_and_see("1", 1, "1");
    const pid_t pid = python_pid();
    ASSERT_GT(pid, 0);
    EXPECT_TRUE(wait_until([&] { return threads_all_on({pid}, "1"); }, 10s)) << describe_threads({pid});
    set_and_see("auto", 2, "0-1");
    ASSERT_EQ(trainer_->wait_exit(250s), 0) << output();
    int lost = 0, reconnected = 0;
    for (const auto &line : trainer_->all_lines()) {
        lost += line.rfind("mall: lost the connection to malld", 0) == 0;
        reconnected += line.rfind("mall: reconnected to malld", 0) == 0;
    }
    EXPECT_EQ(lost, 1) << "one warning for one malld outage:\n" << output();
    EXPECT_EQ(reconnected, 1) << output();
}

}  // namespace
}  // namespace mall::test
