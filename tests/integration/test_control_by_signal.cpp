// SPDX-License-Identifier: BSD-3-Clause
// Proves control by signal as a user runs it: `mallctl signal PID --threads N | --cpus a-b` resizes
// a process that opted in (MALL_SIGNAL_CONTROL=1) without malld: the C99 program mall_signal_client
// (its active workers and every thread's Cpus_allowed_list) and mall_train_digits 2 -> 1 -> 2
// threads (its own resize lines, masks, and a loss curve equal to a plain 2-thread run's). Bad
// PIDs, values and targets that do not catch the signal are refused with words and nothing is
// killed; a process that never steps leaves mallctl with exit 3 and lives on. Under malld an
// attached process refuses until `mallctl set JOB --signal-control on`, then only narrows, and
// malld's next publication wins; a process blocked in sigsuspend is woken by MALL_NOTIFY_SIGNAL.
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "support/malld_fixture.hpp"
#include "support/training_curve.hpp"

MALL_TEST_WATCHDOG(290);

namespace mall::test {
namespace {

using nlohmann::json;

// Signal control needs cpus 0 and 1 (the tests move processes between them).
std::optional<std::string> missing_two_cpus() {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) != 0 || !CPU_ISSET(0, &set) || !CPU_ISSET(1, &set))
        return std::string("this test moves a process between cpus 0 and 1, which it may not use here");
    return std::nullopt;
}
#define REQUIRE_TWO_CPUS()                                   \
    do {                                                     \
        if (auto why = missing_two_cpus()) GTEST_SKIP() << *why; \
    } while (0)

// A socket path where no malld listens: the process runs detached and takes signals.
std::string no_malld_socket() { return "/tmp/mall-no-malld-" + std::to_string(getpid()) + ".sock"; }

std::vector<std::pair<std::string, std::string>> signal_env() {
    return {{"MALL_SIGNAL_CONTROL", "1"}, {"MALL_SOCKET", no_malld_socket()}, {"MALL_QUIET", "1"}};
}

CommandResult mallctl_signal(pid_t pid, const std::vector<std::string> &args, const RunOptions &options = {}) {
    std::vector<std::string> argv{bin_path("mallctl"), "signal", std::to_string(pid)};
    argv.insert(argv.end(), args.begin(), args.end());
    return run_command(argv, options);
}

bool alive(pid_t pid) { return kill(pid, 0) == 0; }

TEST(ControlBySignal, CProgramFollowsThreadsAndCpusWithoutMalld) {
    REQUIRE_TWO_CPUS();
    Child client({bin_path("mall_signal_client"), "--workers", "4"}, ChildOptions{signal_env(), false, false});
    ASSERT_TRUE(client.wait_for_line_starting("active=2", 10s)) << joined_lines(client.all_lines());
    const std::vector<pid_t> pids{client.pid()};

    auto r = mallctl_signal(client.pid(), {"--threads", "1"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("1 thread on cpus 0-1"), std::string::npos) << r.out;
    ASSERT_TRUE(client.wait_for_line_starting("change threads=1 ncpus=2 cpus=0-1 gen=0", 5s))
        << joined_lines(client.all_lines());
    ASSERT_TRUE(client.wait_for_line_starting("active=1", 5s)) << joined_lines(client.all_lines());
    EXPECT_TRUE(threads_all_on(pids, "0-1")) << describe_threads(pids);

    r = mallctl_signal(client.pid(), {"--cpus", "0"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("1 thread on cpus 0 "), std::string::npos) << r.out;
    ASSERT_TRUE(client.wait_for_line_starting("change threads=1 ncpus=1 cpus=0 gen=0", 5s))
        << joined_lines(client.all_lines());
    // Every thread of the process, workers, main thread and libmall's own, is on cpu 0 now.
    EXPECT_TRUE(wait_until([&] { return threads_all_on(pids, "0"); }, 2s)) << describe_threads(pids);

    r = mallctl_signal(client.pid(), {"--cpus", "0-1", "--threads", "auto"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("2 threads on cpus 0-1"), std::string::npos) << r.out;
    ASSERT_TRUE(client.wait_for_line_starting("change threads=2 ncpus=2 cpus=0-1 gen=0", 5s))
        << joined_lines(client.all_lines());
    ASSERT_TRUE(client.wait_for_line_starting("active=2", 5s)) << joined_lines(client.all_lines());
    EXPECT_TRUE(threads_all_on(pids, "0-1")) << describe_threads(pids);

    // The process's own checks, past mallctl's: a range beyond its opening cpus is refused by
    // mallctl before sending, and the process is unchanged and alive.
    r = mallctl_signal(client.pid(), {"--cpus", "1000"});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("not all within 0-1"), std::string::npos) << r.err;
    r = mallctl_signal(client.pid(), {"--threads", "3"});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("3 threads exceed its 2 cpus"), std::string::npos) << r.err;
    EXPECT_TRUE(alive(client.pid()));
    EXPECT_TRUE(threads_all_on(pids, "0-1")) << describe_threads(pids);

    // Only the owner or root: nobody may not control root's process (the record is not readable).
    r = mallctl_signal(client.pid(), {"--threads", "1"}, RunOptions{{}, true, 30s});
    EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
    EXPECT_NE(r.err.find("only its owner or root"), std::string::npos) << r.err;
    EXPECT_TRUE(alive(client.pid()));
}

TEST(ControlBySignal, AnOwnerControlsItsOwnProcessWithoutRoot) {
    REQUIRE_TWO_CPUS();
    if (geteuid() != 0) GTEST_SKIP() << "needs root to run both processes as nobody (a user on a workstation)";
    Child client({bin_path("mall_signal_client")}, ChildOptions{signal_env(), true, false});
    ASSERT_TRUE(client.wait_for_line_starting("active=2", 10s)) << joined_lines(client.all_lines());
    auto r = mallctl_signal(client.pid(), {"--cpus", "1"}, RunOptions{{}, true, 30s});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("1 thread on cpus 1 "), std::string::npos) << r.out;
    const std::vector<pid_t> pids{client.pid()};
    EXPECT_TRUE(wait_until([&] { return threads_all_on(pids, "1"); }, 2s)) << describe_threads(pids);
}

TEST(ControlBySignal, TrainDigitsGoesTwoOneTwoThreadsWithTheSameLoss) {
    REQUIRE_TWO_CPUS();
    if (access(kDigits, R_OK) != 0)
        GTEST_FAIL() << kDigits << " is missing: launch_scripts/install-deps.sh installs python3-sklearn";
    const std::vector<std::string> trainer{bin_path("mall_train_digits"), "--steps", kUnderSanitizer ? "1200" : "4000",
                                           "--batch", "256", "--hidden", "256", "--print-every", "100",
                                           "--log-changes", "--threads", "2"};
    const auto plain = run_command(trainer, RunOptions{{}, false, 200s});
    ASSERT_EQ(plain.exit_code, 0) << plain.err;
    const Curve reference = parse_curve(split_lines(plain.out));
    ASSERT_GE(reference.loss_at_step.size(), 10u) << plain.out;

    Child run(trainer, ChildOptions{signal_env(), false, false});
    ASSERT_TRUE(run.wait_for_line_starting("step 100 ", 60s)) << joined_lines(run.all_lines());
    const std::vector<pid_t> pids{run.pid()};
    auto r = mallctl_signal(run.pid(), {"--threads", "1"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    ASSERT_TRUE(run.wait_for_line([](const std::string &l) { return l.rfind("resize ", 0) == 0 && l.find("threads 2 -> 1 cpus 0-1") != std::string::npos; }, 10s))
        << joined_lines(run.all_lines());
    // The pool runs 1 thread ("step N loss X threads 1"), and every thread stays allowed both cpus.
    ASSERT_TRUE(run.wait_for_line([](const std::string &l) { return l.rfind("step ", 0) == 0 && l.find(" threads 1 cpus") != std::string::npos; }, 30s))
        << joined_lines(run.all_lines());
    EXPECT_TRUE(threads_all_on(pids, "0-1")) << describe_threads(pids);
    r = mallctl_signal(run.pid(), {"--threads", "2"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    ASSERT_TRUE(run.wait_for_line([](const std::string &l) { return l.rfind("resize ", 0) == 0 && l.find("threads 1 -> 2 cpus 0-1") != std::string::npos; }, 10s))
        << joined_lines(run.all_lines());
    EXPECT_TRUE(threads_all_on(pids, "0-1")) << describe_threads(pids);
    const auto code = run.wait_exit(200s);
    ASSERT_TRUE(code.has_value());
    EXPECT_EQ(*code, 0);
    const auto lines = run.all_lines();
    const Curve resized = parse_curve(lines);
    EXPECT_EQ(resized.loss_at_step, reference.loss_at_step) << joined_lines(lines);
    EXPECT_EQ(resized.final_loss, reference.final_loss);
    bool two_resizes = false;
    for (const auto &l : lines) two_resizes |= l.rfind("done ", 0) == 0 && l.find("resizes 2") != std::string::npos;
    EXPECT_TRUE(two_resizes) << joined_lines(lines);
}

TEST(ControlBySignal, BadTargetsAndValuesAreRefusedWithWordsAndNothingDies) {
    // No handler at all: the default action of the signal would kill it.
    Child sleeper({"/bin/sleep", "60"});
    auto r = mallctl_signal(sleeper.pid(), {"--threads", "1"});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("has not enabled mall signal control"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("nothing was sent"), std::string::npos) << r.err;
    // A process that catches the very signal but keeps no mall record is not ours either.
    // It also traps RTMAX ("marker"): a barrier for the check below.
    Child trapper({"/bin/bash", "-c",
                   "trap 'echo caught' RTMAX-7; trap 'echo marker' RTMAX; echo ready; while sleep 0.1; do :; done"});
    ASSERT_TRUE(trapper.wait_for_line_starting("ready", 10s));
    r = mallctl_signal(trapper.pid(), {"--threads", "1"});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("has not enabled mall signal control"), std::string::npos) << r.err;
    // Had mallctl sent RTMAX-7, it would be pending before the marker: Linux delivers the lower
    // real-time signal first and bash runs pending traps in signal order, so "caught" would
    // come before "marker".
    trapper.signal(SIGRTMAX);
    ASSERT_TRUE(trapper.wait_for_line_starting("marker", 10s)) << joined_lines(trapper.all_lines());
    for (const auto &l : trapper.all_lines()) EXPECT_NE(l, "caught") << "a signal was sent";
    EXPECT_TRUE(alive(trapper.pid()));
    // The sleeper has no handler, so a signal would end it: a negative check over a sampling
    // window in which a sent signal would have killed it.
    constexpr auto kFatalSignalWindow = 300ms;
    EXPECT_FALSE(sleeper.wait_exit(kFatalSignalWindow)) << "a signal was sent: the sleeper died";
    EXPECT_TRUE(alive(sleeper.pid()));

    // Bad PIDs: usage errors (process groups, words), or no such process.
    for (const std::string bad : {"0", "-1", "abc", "99999999", "12x"}) {
        auto b = run_command({bin_path("mallctl"), "signal", bad, "--threads", "1"});
        EXPECT_EQ(b.exit_code, 2) << bad << ": " << b.err;
        EXPECT_FALSE(b.err.empty());
    }
    pid_t reaped = fork();
    if (reaped == 0) _exit(0);
    waitpid(reaped, nullptr, 0);
    r = mallctl_signal(reaped, {"--threads", "1"});
    EXPECT_EQ(r.exit_code, 3) << r.err;
    EXPECT_NE(r.err.find("no process"), std::string::npos) << r.err;
    // PID 1 never opted in: refused, nothing sent.
    r = mallctl_signal(1, {"--threads", "1"});
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find("nothing was sent"), std::string::npos) << r.err;

    // Bad values: refused before anything is looked at.
    struct Case {
        std::vector<std::string> args;
        std::string words;
    };
    const std::vector<Case> cases{
        {{"--threads", "0"}, "from 1 to 1024"},
        {{"--threads", "2000"}, "from 1 to 1024"},
        {{"--threads", "two"}, "from 1 to 1024"},
        {{"--cpus", "0,32"}, "does not fit in a signal"},
        {{"--cpus", "0-1,8"}, "does not fit in a signal"},
        {{"--cpus", "x"}, "example: --cpus 0-3"},
        {{"--cpus", "0-1", "--threads", "300"}, "255"},
        {{"--cpus", "0", "--threads", "2"}, "exceed"},
        {{}, "say what to change"},
        {{"--bogus"}, "unknown option"},
        {{"--timeout-ms", "0", "--threads", "1"}, "--timeout-ms"},
    };
    for (const auto &c : cases) {
        auto b = mallctl_signal(sleeper.pid(), c.args);
        EXPECT_EQ(b.exit_code, 2) << b.err;
        EXPECT_NE(b.err.find(c.words), std::string::npos) << b.err;
    }
    EXPECT_TRUE(alive(sleeper.pid()));
}

TEST(ControlBySignal, AProcessWhoseHandlerIsGoneIsNotSignalled) {
    REQUIRE_TWO_CPUS();
    // The record is there but the program replaced libmall's handler: SigCgt no longer has 57.
    Child client({bin_path("mall_signal_client"), "--drop-handler"}, ChildOptions{signal_env(), false, false});
    ASSERT_TRUE(client.wait_for_line_starting("active=", 10s)) << joined_lines(client.all_lines());
    const auto r = mallctl_signal(client.pid(), {"--threads", "1"});
    EXPECT_EQ(r.exit_code, 1) << r.out;
    EXPECT_NE(r.err.find("does not catch signal " + std::to_string(SIGRTMAX - 7)), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("SigCgt"), std::string::npos) << r.err;
    EXPECT_TRUE(alive(client.pid()));
}

TEST(ControlBySignal, AChildForkedWithoutExecIsNotTheProcessThatOptedIn) {
    REQUIRE_TWO_CPUS();
    // A raw clone skips libmall's atfork handler: the child keeps the parent's record descriptor.
    Child client({bin_path("mall_signal_client"), "--raw-fork"}, ChildOptions{signal_env(), false, false});
    const auto line = client.wait_for_line_starting("forked=", 10s);
    ASSERT_TRUE(line) << joined_lines(client.all_lines());
    const pid_t child = static_cast<pid_t>(std::stol(line->substr(7)));
    const auto r = mallctl_signal(child, {"--threads", "1"});
    EXPECT_EQ(r.exit_code, 1) << r.out;
    EXPECT_NE(r.err.find("holds the mall-signal record of process " + std::to_string(client.pid())), std::string::npos)
        << r.err;
    EXPECT_TRUE(alive(child));
    // The parent itself is still controlled.
    EXPECT_EQ(mallctl_signal(client.pid(), {"--threads", "1"}).exit_code, 0);
}

TEST(ControlBySignal, AProcessThatNeverStepsLeavesTheRequestPending) {
    REQUIRE_TWO_CPUS();
    Child client({bin_path("mall_signal_client"), "--no-step"}, ChildOptions{signal_env(), false, false});
    ASSERT_TRUE(client.wait_for_line_starting("open ", 10s));
    const auto r = mallctl_signal(client.pid(), {"--threads", "1", "--timeout-ms", "500"});
    EXPECT_EQ(r.exit_code, 3) << r.out << r.err;
    EXPECT_NE(r.err.find("stays pending"), std::string::npos) << r.err;
    EXPECT_TRUE(alive(client.pid()));
    const auto n = mallctl_signal(client.pid(), {"--threads", "1", "--no-wait"});
    EXPECT_EQ(n.exit_code, 0) << n.err;
    EXPECT_NE(n.out.find("next mall_step()"), std::string::npos) << n.out;
    EXPECT_TRUE(alive(client.pid()));
}

TEST(ControlBySignal, AProcessThatClosesItsHandleMeanwhileEndsTheWait) {
    REQUIRE_TWO_CPUS();
    Child client({bin_path("mall_signal_client"), "--no-step", "--close-after-s", "1"},
                 ChildOptions{signal_env(), false, false});
    ASSERT_TRUE(client.wait_for_line_starting("open ", 10s));
    // Sent while control is on; the process closes its handle without ever stepping: mallctl says
    // so instead of waiting its whole timeout, and the process lives (the signal is now ignored).
    const auto r = mallctl_signal(client.pid(), {"--threads", "1", "--timeout-ms", "60000"});
    EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
    EXPECT_NE(r.err.find("turned mall signal control off"), std::string::npos) << r.err;
    ASSERT_TRUE(client.wait_for_line_starting("closed", 10s));
    EXPECT_TRUE(alive(client.pid()));
}

TEST(ControlBySignal, UnderMalldTheAdminDecidesAndMalldWins) {
    MALL_REQUIRE_ROOT_AND_CPUSET();
    PrivateMalld malld;
    std::string error;
    ASSERT_TRUE(malld.start(&error)) << error;
    Child client(mallrun_argv(malld.socket(), "1:2", "sig", {bin_path("mall_signal_client"), "--workers", "4"}),
                 ChildOptions{{{"MALL_SIGNAL_CONTROL", "1"}}, false, false});
    ASSERT_TRUE(wait_until([&] { return job_settled_on(malld.socket(), "sig", "0-1", 1); }, 20s)) << status_text(malld);
    const auto pids = job_pids(*job_status(malld.socket(), "sig"));
    ASSERT_EQ(pids.size(), 1u);
    ASSERT_TRUE(client.wait_for_line_starting("active=2", 10s)) << joined_lines(client.all_lines());

    // Attached and not allowed: refused, with the job and the admin's commands named.
    auto r = mallctl_signal(pids[0], {"--threads", "1"});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("attached to malld as job sig"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("mallctl set sig --signal-control on"), std::string::npos) << r.err;

    auto set = run_command(mallctl_argv(malld.socket(), {"set", "sig", "--signal-control", "on"}));
    ASSERT_EQ(set.exit_code, 0) << set.err;
    ASSERT_TRUE(wait_until([&] {
        auto j = job_status(malld.socket(), "sig");
        return j && j->value("signal_control", false) && j->value("acked_generation", 0) == j->value("generation", -1);
    }, 10s)) << status_text(malld);

    // Allowed: narrowing within malld's cpus is applied; widening past them is not.
    r = mallctl_signal(pids[0], {"--cpus", "0", "--timeout-ms", "10000"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    ASSERT_TRUE(client.wait_for_line_starting("change threads=1 ncpus=1 cpus=0 ", 5s)) << joined_lines(client.all_lines());
    EXPECT_TRUE(wait_until([&] { return threads_all_on(pids, "0"); }, 2s)) << describe_threads(pids);
    r = mallctl_signal(pids[0], {"--cpus", "0-1000"});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("not all within 0-1"), std::string::npos) << r.err;

    // malld's next publication wins (a thread count here), and it re-pins every thread; its
    // thread count bounds requests too.
    auto malld_change = [](int threads) {
        return [threads](const std::string &l) {
            return l.rfind("change threads=" + std::to_string(threads) + " ncpus=2 cpus=0-1 gen=", 0) == 0 &&
                   l.find("gen=0") == std::string::npos;
        };
    };
    set = run_command(mallctl_argv(malld.socket(), {"set", "sig", "--threads", "1"}));
    ASSERT_EQ(set.exit_code, 0) << set.err;
    ASSERT_TRUE(client.wait_for_line(malld_change(1), 10s)) << joined_lines(client.all_lines());
    EXPECT_TRUE(wait_until([&] { return threads_all_on(pids, "0-1"); }, 2s)) << describe_threads(pids);
    // The process rewrites its record after the resize callbacks ran (the line above): until then
    // mallctl refuses from the record's older cpus (also exit 1). Ask until the process answers.
    EXPECT_TRUE(wait_until([&] {
        r = mallctl_signal(pids[0], {"--threads", "2"});
        return r.exit_code == 1 && r.err.find("2 threads exceed the 1 malld gave") != std::string::npos;
    }, 5s)) << r.exit_code << " " << r.err;
    set = run_command(mallctl_argv(malld.socket(), {"set", "sig", "--threads", "auto"}));
    ASSERT_EQ(set.exit_code, 0) << set.err;
    ASSERT_TRUE(client.wait_for_line(malld_change(2), 10s)) << joined_lines(client.all_lines());

    // Turning signals off republishes the job's cpus; requests are refused again.
    set = run_command(mallctl_argv(malld.socket(), {"set", "sig", "--signal-control", "off"}));
    ASSERT_EQ(set.exit_code, 0) << set.err;
    ASSERT_TRUE(client.wait_for_line([](const std::string &l) {
        return l.rfind("change threads=2 ncpus=2 cpus=0-1 gen=", 0) == 0 && l.find("gen=0") == std::string::npos;
    }, 10s)) << joined_lines(client.all_lines());
    EXPECT_TRUE(wait_until([&] { return threads_all_on(pids, "0-1"); }, 2s)) << describe_threads(pids);
    // As above: the record says "not allowed" once the process rewrote it after the change.
    EXPECT_TRUE(wait_until([&] {
        r = mallctl_signal(pids[0], {"--threads", "1"});
        return r.exit_code == 1 && r.err.find("attached to malld as job sig") != std::string::npos;
    }, 5s)) << r.exit_code << " " << r.err;
}

TEST(ControlBySignal, NotifySignalWakesAProcessBlockedInSigsuspend) {
    MALL_REQUIRE_ROOT_AND_CPUSET();
    PrivateMalld malld;
    std::string error;
    ASSERT_TRUE(malld.start(&error)) << error;
    Child client(mallrun_argv(malld.socket(), "1:2", "notify", {bin_path("mall_signal_client"), "--wait-notify"}),
                 ChildOptions{{{"MALL_NOTIFY_SIGNAL", "SIGUSR1"}}, false, false});
    // The first allocation comes by signal too: the client only steps after "notified".
    ASSERT_TRUE(client.wait_for_line_starting("notified", 20s)) << joined_lines(client.all_lines()) << status_text(malld);
    ASSERT_TRUE(wait_until([&] { return job_settled_on(malld.socket(), "notify", "0-1", 1); }, 20s)) << status_text(malld);
    auto set = run_command(mallctl_argv(malld.socket(), {"set", "notify", "--cpus", "0"}));
    ASSERT_EQ(set.exit_code, 0) << set.err;
    ASSERT_TRUE(client.wait_for_line_starting("change threads=1 ncpus=1 cpus=0 ", 10s)) << joined_lines(client.all_lines());
    EXPECT_TRUE(wait_until([&] { return job_settled_on(malld.socket(), "notify", "0", 1); }, 10s)) << status_text(malld);
    EXPECT_EQ(job_status(malld.socket(), "notify")->value("ack_timeouts", -1), 0) << status_text(malld);
}

}  // namespace
}  // namespace mall::test
