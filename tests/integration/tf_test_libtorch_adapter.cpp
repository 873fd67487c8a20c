// Proves that the libtorch adapter makes a libtorch program follow its allocation under a real
// malld (cgroup-v1 and affinity backends): after each forced change at::get_num_threads(), OpenMP's
// count and the threads an at::parallel_for uses equal the allocation's size, they were pinned
// before the ack, every thread of the process is allowed exactly the allocation, the job settles,
// and the program ends cleanly; without malld it runs, not malleable, with a warning.
#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>

#include <gtest/gtest.h>

#include "support/malld_fixture.hpp"

MALL_TEST_WATCHDOG(280);

namespace mall::test {
namespace {

using nlohmann::json;
using Fields = std::map<std::string, std::string>;

std::string all_text(const std::vector<std::string> &lines) {
    std::string s;
    for (const auto &l : lines) s += l + "\n";
    return s;
}

// The "key value" pairs of a probe's "resize gen G cpus LIST threads N ..." line.
std::optional<Fields> resize_fields(const std::string &line) {
    std::istringstream in(line);
    std::string word, key, value;
    if (!(in >> word) || word != "resize") return std::nullopt;
    Fields fields;
    while (in >> key >> value) fields[key] = value;
    return fields;
}

// Reads the probe's lines until a resize line for `cpus`.
std::optional<Fields> next_resize_to(Child &probe, const std::string &cpus, Millis timeout) {
    auto line = probe.wait_for_line(
        [&](const std::string &l) {
            auto f = resize_fields(l);
            return f && (*f)["cpus"] == cpus;
        },
        timeout);
    if (!line) return std::nullopt;
    return resize_fields(*line);
}

bool is_subset(const std::string &part, const std::string &whole) {
    auto p = parse_cpu_list(part), w = parse_cpu_list(whole);
    if (!p || !w || p->empty()) return false;
    for (int cpu : *p)
        if (std::find(w->begin(), w->end(), cpu) == w->end()) return false;
    return true;
}

// What a user checks in the probe's report of one allocation.
void expect_follows(const Fields &f, const std::string &cpus, const std::string &context) {
    const int ncpus = static_cast<int>(parse_cpu_list(cpus).value_or(std::vector<int>{}).size());
    auto get = [&](const char *key) { return f.count(key) ? f.at(key) : std::string("<missing>"); };
    EXPECT_EQ(get("threads"), std::to_string(ncpus)) << "at::get_num_threads()\n" << context;
    EXPECT_EQ(get("omp"), std::to_string(ncpus)) << "omp_get_max_threads()\n" << context;
    EXPECT_EQ(get("team"), std::to_string(ncpus)) << "threads of the next at::parallel_for\n" << context;
    EXPECT_EQ(get("affinity"), cpus) << "the team's masks in the next region\n" << context;
    EXPECT_EQ(get("at_ack"), cpus) << "the team's masks before the ack\n" << context;
    EXPECT_TRUE(is_subset(get("ran_on"), cpus)) << "cpus the team ran on\n" << context;
    EXPECT_EQ(get("matched"), "yes") << "the adapter's own check\n" << context;
}

class LibtorchAdapterUnderMalld : public ::testing::TestWithParam<std::string> {};

TEST_P(LibtorchAdapterUnderMalld, ThreadCountAndPinningFollowTheAllocation) {
    MALL_REQUIRE_ROOT_AND_CPUSET();
    MalldOptions options;
    options.backend = GetParam();
    options.ack_timeout_ms = 20000;  // the probe steps every few ms: every change must be acked, not timed out
    PrivateMalld malld(options);
    std::string error;
    ASSERT_TRUE(malld.start(&error)) << error;

    const std::string stop_file = malld.dir() + "/stop-probe";  // removed with malld's temp dir
    Child probe(mallrun_argv(malld.socket(), "1:2", "torch",
                             {bin_path("mall_torch_probe"), "--stop-file", stop_file, "--seconds", "200"}));
    ASSERT_TRUE(probe.started());

    auto first = next_resize_to(probe, "0-1", 30s);
    ASSERT_TRUE(first) << "no resize line for the initial allocation:\n" << all_text(probe.all_lines());
    ASSERT_TRUE(wait_until([&] { return job_settled_on(malld.socket(), "torch", "0-1", 1); }, 20s))
        << status_text(malld);
    expect_follows(*first, "0-1", all_text(probe.all_lines()));

    for (const std::string cpus : {"0", "0-1", "1"}) {
        SCOPED_TRACE("allocation " + cpus);
        auto set = run_command(mallctl_argv(malld.socket(), {"set", "torch", "--cpus", cpus}));
        ASSERT_EQ(set.exit_code, 0) << set.err;
        ASSERT_TRUE(wait_until([&] { return job_settled_on(malld.socket(), "torch", cpus, 1); }, 30s))
            << "the probe did not ack the change to " << cpus << "\n"
            << status_text(malld) << all_text(probe.all_lines());
        auto report = next_resize_to(probe, cpus, 20s);
        ASSERT_TRUE(report) << "no resize line for " << cpus << ":\n" << all_text(probe.all_lines());
        expect_follows(*report, cpus, all_text(probe.all_lines()));

        auto job = job_status(malld.socket(), "torch");
        ASSERT_TRUE(job);
        const auto pids = job_pids(*job);
        ASSERT_FALSE(pids.empty()) << job->dump();
        EXPECT_TRUE(wait_until([&] { return threads_all_on(pids, cpus); }, 10s)) << describe_threads(pids);
    }

    std::ofstream(stop_file) << "stop\n";
    ASSERT_EQ(probe.wait_exit(30s), 0) << all_text(probe.all_lines());
    EXPECT_TRUE(probe.wait_for_line_starting("done steps ", 1s)) << all_text(probe.all_lines());
    EXPECT_TRUE(wait_until(
        [&] {
            auto status = status_json(malld.socket());
            return status && !find_job(*status, "torch");
        },
        10s))
        << "the job must end with the probe\n" << status_text(malld);
}

INSTANTIATE_TEST_SUITE_P(Backends, LibtorchAdapterUnderMalld, ::testing::Values("cgroup-v1", "affinity"),
                         [](const ::testing::TestParamInfo<std::string> &param_info) {
                             return param_info.param == "cgroup-v1" ? std::string("cgroup_v1") : param_info.param;
                         });

TEST(LibtorchAdapterWithoutMalld, RunsNotMalleableWithAWarning) {
    RunOptions options;
    options.env = {{"MALL_SOCKET", "/nonexistent/mall-adapter-test.sock"}};
    options.timeout = 60s;
    auto run = run_command({bin_path("mall_torch_probe"), "--seconds", "1"}, options);
    ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
    EXPECT_NE(run.out.find("malleable no"), std::string::npos) << run.out;
    EXPECT_NE(run.out.find("done steps "), std::string::npos) << run.out;
    EXPECT_EQ(run.out.find("resize "), std::string::npos) << run.out;
    EXPECT_TRUE(contains_icase(run.err, "not malleable")) << run.err;
}

}  // namespace
}  // namespace mall::test
