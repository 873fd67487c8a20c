// SPDX-License-Identifier: BSD-3-Clause
// Proves that malld measures how busy each job keeps its cores (issue 41), on the cgroup backend
// and on the affinity backend: of two jobs on one cpu each, the one that spins shows cpu_busy near
// 1 and the one that sleeps near 0 in `mallctl status --json` (and a BUSY percentage in the table),
// the metrics file carries both jobs' mall_job_cpu_busy_ratio and mall_job_cpu_seconds_total, and
// once the spinner ends `mallctl watch` prints its busy share in the end line and its history
// record holds the cpu seconds it ran (`mallctl history` shows it as the job's BUSY percentage).
#include <signal.h>

#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "support/malld_fixture.hpp"

MALL_TEST_WATCHDOG(200);

namespace mall::test {
namespace {

using nlohmann::json;

std::optional<double> cpu_busy(const std::string &socket, const std::string &job) {
    auto j = job_status(socket, job);
    if (!j || !j->contains("cpu_busy") || !(*j)["cpu_busy"].is_number()) return std::nullopt;
    return (*j)["cpu_busy"].get<double>();
}

// The history record of `job`, when the file has one.
std::optional<json> history_record_of(const std::string &path, const std::string &job) {
    std::istringstream lines(read_file(path));
    std::string line;
    while (std::getline(lines, line)) {
        json r = json::parse(line, nullptr, false);
        if (r.is_object() && r.value("job", "") == job) return r;
    }
    return std::nullopt;
}

class CpuBusy : public ::testing::TestWithParam<const char *> {};

TEST_P(CpuBusy, ASpinnerIsBusyAndASleeperIsNot) {
    MALL_REQUIRE_ROOT_AND_CPUSET();
    MalldOptions options;
    options.backend = GetParam();
    PrivateMalld malld(options);
    std::string error;
    ASSERT_TRUE(malld.start(&error)) << error;

    // One cpu each: "spin" busy-loops two threads on its cpu, "nap" sleeps between steps.
    Child spin(mallrun_argv(malld.socket(), "1:1", "spin",
                            test_client_argv({"--threads", "2", "--spin", "--step-us", "1000"})));
    Child nap(mallrun_argv(malld.socket(), "1:1", "nap", test_client_argv({"--threads", "1", "--step-us", "20000"})));
    ASSERT_TRUE(spin.started() && nap.started());
    ASSERT_TRUE(wait_until(
        [&] {
            auto s = job_status(malld.socket(), "spin"), n = job_status(malld.socket(), "nap");
            return s && n && s->value("ncpus", 0) == 1 && n->value("ncpus", 0) == 1;
        },
        20s))
        << status_text(malld);

    // Before a first window the figure is null and the table shows "-"; within a few windows of
    // about 2 s each job's shows. The bounds are wide: another test run may share these cpus.
    ASSERT_TRUE(wait_until([&] { return cpu_busy(malld.socket(), "spin").value_or(0) > 0.6; }, 30s, 200ms))
        << status_text(malld);
    ASSERT_TRUE(wait_until([&] { return cpu_busy(malld.socket(), "nap").has_value(); }, 30s, 200ms))
        << status_text(malld);
    EXPECT_LT(*cpu_busy(malld.socket(), "nap"), 0.2) << status_text(malld);
    auto spin_status = job_status(malld.socket(), "spin");
    ASSERT_TRUE(spin_status);
    EXPECT_GT((*spin_status)["cpu_seconds"].get<double>(), 0.5) << spin_status->dump();
    EXPECT_LE((*spin_status)["cpu_seconds"].get<double>(), (*spin_status)["core_seconds"].get<double>() * 1.2)
        << spin_status->dump();

    CommandResult table = run_command(mallctl_argv(malld.socket(), {"status"}));
    ASSERT_EQ(table.exit_code, 0) << table.err;
    EXPECT_NE(table.out.find("BUSY"), std::string::npos) << table.out;
    bool spin_row_has_percent = false;
    for (const std::string &line : split_lines(table.out))
        if (line.rfind("spin ", 0) == 0 && line.find('%') != std::string::npos) spin_row_has_percent = true;
    EXPECT_TRUE(spin_row_has_percent) << table.out;

    // Metrics (`mallctl metrics`, the text malld's --metrics-file holds): both series, both jobs.
    CommandResult prom = run_command(mallctl_argv(malld.socket(), {"metrics"}));
    ASSERT_EQ(prom.exit_code, 0) << prom.err;
    for (const char *series : {"mall_job_cpu_busy_ratio{mall_job=\"spin\"", "mall_job_cpu_busy_ratio{mall_job=\"nap\"",
                               "mall_job_cpu_seconds_total{mall_job=\"spin\"", "mall_job_cpu_seconds_total{mall_job=\"nap\""})
        EXPECT_NE(prom.out.find(series), std::string::npos) << series << "\n" << prom.out;
    EXPECT_NE(prom.out.find("# TYPE mall_job_cpu_busy_ratio gauge"), std::string::npos) << prom.out;
    EXPECT_NE(prom.out.find("# TYPE mall_job_cpu_seconds_total counter"), std::string::npos) << prom.out;

    // The spinner ends: `mallctl watch` says how busy it was in its end line, and its record in
    // the history holds the cpu time it ran.
    Child watch(mallctl_argv(malld.socket(), {"watch", "--timeout-s", "60"}));
    ASSERT_TRUE(watch.started());
    std::this_thread::sleep_for(500ms);  // connected before the end it must see
    spin.signal_group(SIGTERM);
    ASSERT_TRUE(spin.wait_exit(20s));
    const std::string history = malld.state_dir() + "/malld.history.jsonl";
    ASSERT_TRUE(wait_until([&] { return history_record_of(history, "spin").has_value(); }, 20s, 100ms))
        << read_file(history) << malld.log();
    auto end_line = watch.wait_for_line(
        [](const std::string &line) {
            return line.find(" end ") != std::string::npos && line.find("spin") != std::string::npos;
        },
        20s);
    ASSERT_TRUE(end_line) << "watch printed no end line for spin";
    EXPECT_NE(end_line->find("busy "), std::string::npos) << *end_line;
    EXPECT_NE(end_line->find(" cpu-s)"), std::string::npos) << *end_line;
    const json record = *history_record_of(history, "spin");
    ASSERT_TRUE(record.contains("cpu_seconds") && record["cpu_seconds"].is_number()) << record.dump();
    EXPECT_GT(record["cpu_seconds"].get<double>(), 0.5) << record.dump();

    // `mallctl history` shows it as the job's BUSY percentage, and in the total line.
    CommandResult shown = run_command(mallctl_argv(malld.socket(), {"history", "--file", history}));
    ASSERT_EQ(shown.exit_code, 0) << shown.err;
    EXPECT_NE(shown.out.find("BUSY"), std::string::npos) << shown.out;
    bool spin_history_has_percent = false;
    for (const std::string &line : split_lines(shown.out))
        if (line.find(" spin ") != std::string::npos && line.find('%') != std::string::npos)
            spin_history_has_percent = true;
    EXPECT_TRUE(spin_history_has_percent) << shown.out;
    EXPECT_NE(shown.out.find(", busy "), std::string::npos) << shown.out;
}

INSTANTIATE_TEST_SUITE_P(Backends, CpuBusy, ::testing::Values("", "affinity"),
                         [](const ::testing::TestParamInfo<const char *> &backend) {
                             return std::string(*backend.param ? backend.param : "cgroup");
                         });

}  // namespace
}  // namespace mall::test
