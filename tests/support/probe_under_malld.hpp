// SPDX-License-Identifier: BSD-3-Clause
// probe_under_malld.hpp — the shared body of the framework-adapter tests (OpenMP, libtorch): runs a
// probe program (tests/support/*_probe_main.cpp) under mallrun on a private malld, forces the
// allocations 0 -> 0-1 -> 1 with `mallctl set`, and checks after each one what any adapter must
// guarantee (the probe's team masks equal the allocation before the ack and in the next region, it
// ran only there, every thread of the process is allowed exactly the allocation, the job settles),
// then lets the caller check its framework's own thread counts. Header-only: included by the tests.
#pragma once

#include <algorithm>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/malld_fixture.hpp"

namespace mall::test {

// The "key value" pairs of a probe's "resize gen G cpus LIST threads N ..." line.
using ProbeFields = std::map<std::string, std::string>;

inline std::optional<ProbeFields> resize_fields(const std::string &line) {
    std::istringstream in(line);
    std::string word, key, value;
    if (!(in >> word) || word != "resize") return std::nullopt;
    ProbeFields fields;
    while (in >> key >> value) fields[key] = value;
    return fields;
}

// Reads the probe's lines until a resize line for `cpus`.
inline std::optional<ProbeFields> next_resize_to(Child &probe, const std::string &cpus, Millis timeout) {
    auto line = probe.wait_for_line(
        [&](const std::string &l) {
            auto f = resize_fields(l);
            return f && (*f)["cpus"] == cpus;
        },
        timeout);
    if (!line) return std::nullopt;
    return resize_fields(*line);
}

inline bool is_cpu_subset(const std::string &part, const std::string &whole) {
    auto p = parse_cpu_list(part), w = parse_cpu_list(whole);
    if (!p || !w || p->empty()) return false;
    for (int cpu : *p)
        if (std::find(w->begin(), w->end(), cpu) == w->end()) return false;
    return true;
}

inline std::string probe_field(const ProbeFields &f, const char *key) {
    return f.count(key) ? f.at(key) : std::string("<missing>");
}

// The framework's own checks of one report: fields, the allocation's cpus and size, context text.
using FrameworkCheck = std::function<void(const ProbeFields &, const std::string &cpus, int ncpus,
                                          const std::string &context)>;

inline void expect_probe_follows(const ProbeFields &f, const std::string &cpus, const std::string &context,
                                 const FrameworkCheck &framework_check) {
    const int ncpus = static_cast<int>(parse_cpu_list(cpus).value_or(std::vector<int>{}).size());
    EXPECT_EQ(probe_field(f, "affinity"), cpus) << "the team's masks in the next region\n" << context;
    EXPECT_EQ(probe_field(f, "at_ack"), cpus) << "the team's masks before the ack\n" << context;
    EXPECT_TRUE(is_cpu_subset(probe_field(f, "ran_on"), cpus)) << "cpus the team ran on\n" << context;
    framework_check(f, cpus, ncpus, context);
}

// The whole sequence under a private malld with `backend`, the probe registered as job `job`.
inline void run_probe_through_allocations(const std::string &backend, const std::string &probe_program,
                                          const std::string &job, const FrameworkCheck &framework_check) {
    MalldOptions options;
    options.backend = backend;
    options.ack_timeout_ms = 20000;  // the probe steps every few ms: every change must be acked, not timed out
    PrivateMalld malld(options);
    std::string error;
    ASSERT_TRUE(malld.start(&error)) << error;

    const std::string stop_file = malld.dir() + "/stop-probe";  // removed with malld's temp dir
    Child probe(mallrun_argv(malld.socket(), "1:2", job,
                             {bin_path(probe_program), "--stop-file", stop_file, "--seconds", "200"}));
    ASSERT_TRUE(probe.started());

    auto first = next_resize_to(probe, "0-1", 30s);
    ASSERT_TRUE(first) << "no resize line for the initial allocation:\n" << joined_lines(probe.all_lines());
    ASSERT_TRUE(wait_until([&] { return job_settled_on(malld.socket(), job, "0-1", 1); }, 20s))
        << status_text(malld);
    expect_probe_follows(*first, "0-1", joined_lines(probe.all_lines()), framework_check);

    for (const std::string cpus : {"0", "0-1", "1"}) {
        SCOPED_TRACE("allocation " + cpus);
        auto set = run_command(mallctl_argv(malld.socket(), {"set", job, "--cpus", cpus}));
        ASSERT_EQ(set.exit_code, 0) << set.err;
        ASSERT_TRUE(wait_until([&] { return job_settled_on(malld.socket(), job, cpus, 1); }, 30s))
            << "the probe did not ack the change to " << cpus << "\n"
            << status_text(malld) << joined_lines(probe.all_lines());
        auto report = next_resize_to(probe, cpus, 20s);
        ASSERT_TRUE(report) << "no resize line for " << cpus << ":\n" << joined_lines(probe.all_lines());
        expect_probe_follows(*report, cpus, joined_lines(probe.all_lines()), framework_check);

        auto status = job_status(malld.socket(), job);
        ASSERT_TRUE(status);
        const auto pids = job_pids(*status);
        ASSERT_FALSE(pids.empty()) << status->dump();
        EXPECT_TRUE(wait_until([&] { return threads_all_on(pids, cpus); }, 10s)) << describe_threads(pids);
    }

    std::ofstream(stop_file) << "stop\n";
    ASSERT_EQ(probe.wait_exit(30s), 0) << joined_lines(probe.all_lines());
    EXPECT_TRUE(probe.wait_for_line_starting("done steps ", 1s)) << joined_lines(probe.all_lines());
    EXPECT_TRUE(wait_until(
        [&] {
            auto status = status_json(malld.socket());
            return status && !find_job(*status, job);
        },
        10s))
        << "the job must end with the probe\n" << status_text(malld);
}

// Without malld (MALL_SOCKET names no socket) the probe runs to the end, not malleable, warning once.
inline void run_probe_without_malld(const std::string &probe_program) {
    RunOptions options;
    options.env = {{"MALL_SOCKET", "/nonexistent/mall-adapter-test.sock"}};
    options.timeout = 60s;
    auto run = run_command({bin_path(probe_program), "--seconds", "1"}, options);
    ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
    EXPECT_NE(run.out.find("malleable no"), std::string::npos) << run.out;
    EXPECT_NE(run.out.find("done steps "), std::string::npos) << run.out;
    EXPECT_EQ(run.out.find("resize "), std::string::npos) << run.out;
    EXPECT_TRUE(contains_icase(run.err, "not malleable")) << run.err;
}

// gtest parameter names for the two backends.
inline std::string backend_test_name(const ::testing::TestParamInfo<std::string> &param_info) {
    return param_info.param == "cgroup-v1" ? std::string("cgroup_v1") : param_info.param;
}

}  // namespace mall::test
