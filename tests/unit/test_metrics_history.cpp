// SPDX-License-Identifier: BSD-3-Clause
// Proves the Prometheus renderer's contract on a status the real core makes (HELP/TYPE once per
// metric, cumulative buckets ending in +Inf, counters named _total, escaped labels, no
// timestamps, values equal to the status's) and the history file: records, append, rotation,
// torn lines, and the --since forms. (tools/metrics_check.py parses malld's real output with
// Prometheus' own parser.)
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include "common/job_history.hpp"
#include "common/metrics_text.hpp"
#include "daemon/core/node_manager.hpp"
#include "support/core_effects.hpp"
#include "support/unit_helpers.hpp"
#include "support/watchdog.h"

using namespace mall;
using namespace std::chrono_literals;

namespace {

using mall::test::cpus;
MALL_TEST_WATCHDOG(60);


// A status from the real core: two jobs, one ack, so every metric has a value.
nlohmann::json sample_status() {
    static test::EventLogEffects effects;
    std::string error;
    static auto topology = Topology::load("pack:1 core:4 pu:1", &error);
    NodeManager nm(*topology, cpus("0-3"), PolicyKind::Equal, 2000ms, effects);
    const TimePoint t0 = Clock::now();
    JobSpec a;
    a.id = "train-a";
    a.uid = 1000;
    a.min = 1;
    a.max = 4;
    a.pids = {100};
    EXPECT_TRUE(nm.register_job(a, t0).ok);
    EXPECT_TRUE(nm.attach("train-a", 1).ok);
    JobSpec b = a;
    b.id = "train-b";
    b.uid = 1001;
    b.pids = {101};
    b.guaranteed = cpus("3");
    EXPECT_TRUE(nm.register_job(b, t0 + 1s).ok);
    nm.ack("train-a", 1, nm.find("train-a")->generation, t0 + 1s + 2ms);
    nm.record_cpu_time("train-a", 10, t0 + 2s);  // a window: 2.5 cpu seconds over 3 s
    nm.record_cpu_time("train-a", 12.5, t0 + 5s);
    nlohmann::json status = nm.status(t0 + 11s);
    status["backend"] = "affinity";
    status["version"] = "0.3.0";
    return status;
}

// name{labels} -> value, and the # TYPE of each family.
struct Parsed {
    std::map<std::string, double> samples;
    std::map<std::string, std::string> types;
    std::map<std::string, int> help_lines;
    double at(const std::string &sample) const {
        auto it = samples.find(sample);
        if (it == samples.end()) {
            ADD_FAILURE() << "no sample " << sample;
            return NAN;
        }
        return it->second;
    }
};

Parsed parse(const std::string &text) {
    Parsed p;
    std::istringstream in(text);
    std::string line;
    const std::regex sample(R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$)");
    while (std::getline(in, line)) {
        if (line.rfind("# HELP ", 0) == 0) {
            ++p.help_lines[line.substr(7, line.find(' ', 7) - 7)];
            continue;
        }
        if (line.rfind("# TYPE ", 0) == 0) {
            std::istringstream words(line.substr(7));
            std::string name, type;
            words >> name >> type;
            EXPECT_EQ(p.types.count(name), 0u) << "second # TYPE for " << name;
            p.types[name] = type;
            continue;
        }
        std::smatch m;
        EXPECT_TRUE(std::regex_match(line, m, sample)) << "not a sample line (or a timestamp): " << line;
        if (m.empty()) continue;
        p.samples[m[1].str() + m[2].str()] = m[3] == "+Inf" ? INFINITY : std::stod(m[3]);
    }
    return p;
}

TEST(PrometheusText, EveryMetricOnceWithValuesFromTheStatus) {
    const nlohmann::json status = sample_status();
    Parsed p = parse(render_prometheus(status));
    for (const auto &[name, type] : p.types) {
        EXPECT_EQ(p.help_lines.count(name) ? p.help_lines.at(name) : 0, 1) << name;
        EXPECT_EQ(name.rfind("mall_", 0), 0u) << name;
        if (type == "counter") {
            EXPECT_TRUE(name.size() > 6 && name.substr(name.size() - 6) == "_total") << name;
        }
    }
    EXPECT_EQ(p.types.size(), metric_catalog().size());
    EXPECT_EQ(p.at("mall_pool_cpus"), 4);
    EXPECT_EQ(p.at("mall_jobs"), 2);
    EXPECT_EQ(p.at("mall_free_cpus"), 0);
    EXPECT_EQ(p.at("mall_info{version=\"0.3.0\",policy=\"equal\",backend=\"affinity\"}"), 1);
    const std::string a = "{mall_job=\"train-a\",uid=\"1000\"}", b = "{mall_job=\"train-b\",uid=\"1001\"}";
    const auto &ja = status["jobs"][0];
    EXPECT_EQ(p.at("mall_job_cpus" + a), ja["ncpus"].get<double>());
    EXPECT_EQ(p.at("mall_job_lent_cpus" + a), ja["lent_cpus"].get<double>());
    EXPECT_DOUBLE_EQ(p.at("mall_job_lent_core_seconds_total" + a), ja["lent_core_seconds"].get<double>());
    EXPECT_GT(p.at("mall_job_lent_core_seconds_total" + a), 0);
    EXPECT_EQ(p.at("mall_job_guaranteed_cpus" + b), 1);
    EXPECT_DOUBLE_EQ(p.at("mall_lent_core_seconds_total"), status["node"]["lent_core_seconds"].get<double>());
    EXPECT_DOUBLE_EQ(p.at("mall_cpu_seconds_total"), status["node"]["cpu_seconds"].get<double>());
    EXPECT_DOUBLE_EQ(p.at("mall_cpu_seconds_total"), 2.5);  // the running job's, summed into the node's
    EXPECT_DOUBLE_EQ(p.at("mall_job_cpu_seconds_total" + a), 2.5);
    EXPECT_NEAR(p.at("mall_job_last_ack_latency_seconds" + a), 0.002, 1e-9);
    // "train-b" never acked: no last latency, an empty histogram.
    EXPECT_EQ(p.samples.count("mall_job_last_ack_latency_seconds" + b), 0u);
    EXPECT_EQ(p.at("mall_job_ack_latency_seconds_count" + b), 0);
    // Histograms: cumulative, ending at +Inf with the count.
    EXPECT_EQ(p.types["mall_ack_latency_seconds"], "histogram");
    double previous = 0;
    for (const auto &bound : status["histogram_bounds_seconds"]) {
        std::ostringstream le;
        le << bound.get<double>();
        const double v = p.at("mall_job_ack_latency_seconds_bucket{mall_job=\"train-a\",uid=\"1000\",le=\"" + le.str() + "\"}");
        EXPECT_GE(v, previous);
        previous = v;
    }
    EXPECT_EQ(p.at("mall_job_ack_latency_seconds_bucket{mall_job=\"train-a\",uid=\"1000\",le=\"+Inf\"}"), 1);
    EXPECT_EQ(p.at("mall_ack_latency_seconds_bucket{le=\"+Inf\"}"), p.at("mall_ack_latency_seconds_count"));
    EXPECT_EQ(p.at("mall_job_ack_latency_seconds_bucket{mall_job=\"train-a\",uid=\"1000\",le=\"0.0025\"}"), 1);
    EXPECT_EQ(p.at("mall_job_ack_latency_seconds_bucket{mall_job=\"train-a\",uid=\"1000\",le=\"0.001\"}"), 0);
}

TEST(PrometheusText, LabelValuesAreEscapedAndOldStatusesLoseOnlyWhatTheyLack) {
    nlohmann::json status = {{"pool", "0-1"}, {"free", "1"}, {"policy", "equal"},
                             {"jobs", {{{"job", "we\"ird\\job"}, {"uid", 5}, {"ncpus", 1}}}}};
    const std::string text = render_prometheus(status);
    EXPECT_NE(text.find("mall_job_cpus{mall_job=\"we\\\"ird\\\\job\",uid=\"5\"} 1\n"), std::string::npos) << text;
    EXPECT_EQ(text.find("mall_lent_core_seconds_total "), std::string::npos) << "invented a value";
    EXPECT_EQ(text.find("_bucket"), std::string::npos) << "histograms without bounds";
    EXPECT_THROW(render_prometheus(nlohmann::json::object()), std::invalid_argument);
}

class HistoryFile : public ::testing::Test {
protected:
    void SetUp() override {
        char templ[] = "/tmp/mall-history-test.XXXXXX";
        ASSERT_NE(::mkdtemp(templ), nullptr);
        dir_ = templ;
        path_ = dir_ + "/malld.history.jsonl";
    }
    void TearDown() override { std::filesystem::remove_all(dir_); }
    static nlohmann::json end_event(const std::string &job, double time) {
        return {{"event", "end"}, {"time", time}, {"job", job}, {"reason", "exited"}, {"uid", 1000},
                {"duration_seconds", 60.0}, {"lent_core_seconds", 12.5}, {"core_seconds", 120.0}};
    }
    std::string dir_, path_;
};

TEST_F(HistoryFile, AppendsRecordsAndReadsThemBackOldestFirst) {
    std::string error;
    ASSERT_TRUE(append_history(path_, history_record(end_event("a", 1000), "node7"), 1 << 20, &error)) << error;
    ASSERT_TRUE(append_history(path_, history_record(end_event("b", 2000), "node7"), 1 << 20, &error)) << error;
    auto read = read_history(path_, &error);
    ASSERT_TRUE(read) << error;
    ASSERT_EQ(read->records.size(), 2u);
    EXPECT_EQ(read->records[0]["job"], "a");
    EXPECT_EQ(read->records[0]["host"], "node7");
    EXPECT_EQ(read->records[0]["started"], 940.0);
    EXPECT_EQ(read->records[0]["lent_core_seconds"], 12.5);
    EXPECT_FALSE(read->records[0].contains("event"));
    // Root's only (issue 37): the records name every job's owner and figures.
    EXPECT_EQ(std::filesystem::status(path_).permissions() & std::filesystem::perms::mask,
              std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
}

TEST_F(HistoryFile, RotatesAtTheLimitAndKeepsOneOlderFile) {
    std::string error;
    const size_t line = history_record(end_event("job-0", 1000), "n").dump().size() + 1;
    for (int i = 0; i < 7; ++i)  // three records per file
        ASSERT_TRUE(append_history(path_, history_record(end_event("job-" + std::to_string(i), 1000 + i), "n"),
                                   3 * line, &error))
            << error;
    auto read = read_history(path_, &error);
    ASSERT_TRUE(read) << error;
    // job-0..2 went to .1, were replaced by job-3..5; job-6 is in the current file.
    ASSERT_EQ(read->records.size(), 4u);
    EXPECT_EQ(read->records.front()["job"], "job-3");
    EXPECT_EQ(read->records.back()["job"], "job-6");
}

TEST_F(HistoryFile, SkipsTornAndForeignLinesAndCountsThem) {
    std::string error;
    ASSERT_TRUE(append_history(path_, history_record(end_event("a", 1000), "n"), 1 << 20, &error));
    std::ofstream(path_, std::ios::app) << "{\"format\": \"mall-history-1\", \"job\": \"torn\n"
                                        << "{\"something\": \"else\"}\n"
                                        << "{\"format\": \"mall-history-1\", \"job\": 7, \"time\": 1}\n"
                                        << "{\"format\": \"mall-history-1\", \"job\": \"x\", \"time\": 1, "
                                           "\"lent_core_seconds\": \"many\"}\n";
    ASSERT_TRUE(append_history(path_, history_record(end_event("b", 2000), "n"), 1 << 20, &error));
    auto read = read_history(path_, &error);
    ASSERT_TRUE(read) << error;
    EXPECT_EQ(read->records.size(), 2u);
    EXPECT_EQ(read->skipped_lines, 4u);
    EXPECT_TRUE(read_history(dir_ + "/none.jsonl", &error)) << "a missing file is an empty history";
}

TEST(HistorySince, AcceptsAgesEpochsAndLocalDates) {
    std::string error;
    EXPECT_EQ(parse_since("90s", 10000, &error), 9910);
    EXPECT_EQ(parse_since("30m", 10000, &error), 8200);
    EXPECT_EQ(parse_since("2h", 10000, &error), 2800);
    EXPECT_EQ(parse_since("1d", 100000, &error), 13600);
    EXPECT_EQ(parse_since("1700000000", 0, &error), 1700000000);
    ::setenv("TZ", "UTC", 1);
    ::tzset();
    EXPECT_EQ(parse_since("2026-11-24", 0, &error), 1795478400);
    EXPECT_EQ(parse_since("2026-11-24T08:30", 0, &error), 1795478400 + 8 * 3600 + 1800);
    EXPECT_EQ(parse_since("2026-11-24 08:30:15", 0, &error), 1795478400 + 8 * 3600 + 1815);
    for (const char *bad : {"", "yesterday", "-5m", "5x", "2026-13-01", "m"}) {
        error.clear();
        EXPECT_FALSE(parse_since(bad, 0, &error)) << bad;
        EXPECT_NE(error.find("30m"), std::string::npos) << bad << ": " << error;
    }
}

}  // namespace
