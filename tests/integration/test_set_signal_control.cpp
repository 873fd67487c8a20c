// SPDX-License-Identifier: BSD-3-Clause
// Proves `mallctl set JOB --signal-control on|off` under a real malld, as an admin would use it:
// off by default; `on` publishes a new generation with the same cpus and thread count that the
// job's process applies and acknowledges (no cpu moves), and the page the process maps carries
// kPageFlagSignalControl (read through /proc/PID/map_files, the process's own mapping); `mallctl
// status` shows it (",signals" in STATE, `signal_control` in --json); the state file keeps it and a
// malld killed and restarted re-adopts the job with it, its page written with the flag again;
// `off` clears it the same way; bad values are usage errors that change nothing.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <fstream>

#include <gtest/gtest.h>

#include "common/shared_page.hpp"
#include "support/malld_fixture.hpp"

MALL_TEST_WATCHDOG(240);

namespace mall::test {
namespace {

using nlohmann::json;

// What the process `pid` sees on the shared page of `job` it maps: generation, cpus and the flags
// word. Read from its own mapping (/proc/PID/map_files, root only), so it proves the page reached
// the process, not just that malld wrote some page.
struct PageSeen {
    uint64_t generation = 0;
    std::string cpus;
    uint32_t flags = 0;
};

std::optional<PageSeen> page_seen_by(pid_t pid, const std::string &job) {
    std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
    const std::string name = "/memfd:mall-page-" + job;  // then " (deleted)" or the line's end
    std::string line;
    while (std::getline(maps, line)) {
        const size_t at = line.find(name);
        if (at == std::string::npos || (at + name.size() != line.size() && line[at + name.size()] != ' ')) continue;
        const std::string range = line.substr(0, line.find(' '));
        const int fd = ::open(("/proc/" + std::to_string(pid) + "/map_files/" + range).c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) return std::nullopt;
        void *map = ::mmap(nullptr, kSharedPageSize, PROT_READ, MAP_SHARED, fd, 0);
        ::close(fd);
        if (map == MAP_FAILED) return std::nullopt;
        mall_alloc_t alloc{};
        PageSeen seen;
        const bool ok = page_read(static_cast<const SharedPage *>(map), &alloc, &seen.flags);
        ::munmap(map, kSharedPageSize);
        if (!ok) return std::nullopt;
        seen.generation = alloc.generation;
        seen.cpus = alloc.cpus;
        return seen;
    }
    return std::nullopt;
}

std::string describe(const std::optional<PageSeen> &p) {
    if (!p) return "(no page mapped)";
    return "gen " + std::to_string(p->generation) + " cpus " + p->cpus + " flags " + std::to_string(p->flags);
}

// The process maps the job's page at generation `generation` with the flag `on`.
bool page_says(pid_t pid, const std::string &job, uint64_t generation, bool on) {
    auto p = page_seen_by(pid, job);
    return p && p->generation == generation && ((p->flags & kPageFlagSignalControl) != 0) == on;
}

// A "change ... gen=G ..." line of mall_test_client for generation G on the same cpus.
auto change_to(uint64_t generation) {
    return [generation](const std::string &l) {
        return l.rfind("change ", 0) == 0 && l.find(" gen=" + std::to_string(generation) + " ") != std::string::npos &&
               l.find(" cpus=0-1") != std::string::npos;
    };
}

TEST(SignalControl, MallctlSetSignalControlIsPublishedShownAndKept) {
    MALL_REQUIRE_ROOT_AND_CPUSET();
    MalldOptions options;
    options.ack_timeout_ms = 20000;  // every change must be acked, never timed out
    PrivateMalld malld(options);
    std::string error;
    ASSERT_TRUE(malld.start(&error)) << error;
    Child client(mallrun_argv(malld.socket(), "1:2", "sig", test_client_argv({"--threads", "2", "--duration-s", "200"})));
    ASSERT_TRUE(wait_until([&] { return job_settled_on(malld.socket(), "sig", "0-1", 1); }, 20s))
        << status_text(malld);
    const auto pids = job_pids(*job_status(malld.socket(), "sig"));
    ASSERT_EQ(pids.size(), 1u);
    const pid_t pid = pids[0];

    // Off by default, on the page too.
    auto job = job_status(malld.socket(), "sig");
    ASSERT_TRUE(job);
    EXPECT_EQ((*job)["signal_control"], false);
    const uint64_t gen0 = (*job)["generation"].get<uint64_t>();
    ASSERT_TRUE(wait_until([&] { return page_says(pid, "sig", gen0, false); }, 10s)) << describe(page_seen_by(pid, "sig"));

    // Bad values: usage errors with words, nothing sent, nothing changed.
    for (const std::string bad : {"maybe", "yes", "On"}) {
        auto r = run_command(mallctl_argv(malld.socket(), {"set", "sig", "--signal-control", bad}));
        EXPECT_EQ(r.exit_code, 2) << bad << ": " << r.err;
        EXPECT_NE(r.err.find("--signal-control takes on or off"), std::string::npos) << r.err;
    }
    auto unknown = run_command(mallctl_argv(malld.socket(), {"set", "nobody", "--signal-control", "on"}));
    EXPECT_EQ(unknown.exit_code, 1) << unknown.err;
    job = job_status(malld.socket(), "sig");
    EXPECT_EQ((*job)["signal_control"], false);
    EXPECT_EQ((*job)["generation"].get<uint64_t>(), gen0);

    // on: a new generation with the same cpus, applied and acked by the process; no cpu moves.
    auto set = run_command(mallctl_argv(malld.socket(), {"set", "sig", "--signal-control", "on"}));
    ASSERT_EQ(set.exit_code, 0) << set.err;
    EXPECT_NE(set.out.find("signal-control on"), std::string::npos) << set.out;
    EXPECT_TRUE(client.wait_for_line(change_to(gen0 + 1), 20s)) << joined_lines(client.all_lines());
    ASSERT_TRUE(wait_until([&] { return job_settled_on(malld.socket(), "sig", "0-1", 1); }, 20s))
        << status_text(malld);
    job = job_status(malld.socket(), "sig");
    ASSERT_TRUE(job);
    EXPECT_EQ((*job)["signal_control"], true);
    EXPECT_EQ((*job)["generation"].get<uint64_t>(), gen0 + 1);
    EXPECT_EQ((*job)["acked_generation"], (*job)["generation"]);
    EXPECT_EQ((*job)["cpuset"], "0-1");
    EXPECT_EQ((*job)["transitions"], 1);  // the first allocation only: a flag is no cpu move
    EXPECT_EQ((*job)["ack_timeouts"], 0);
    EXPECT_EQ((*job)["active_threads"], 2);
    EXPECT_TRUE(page_says(pid, "sig", gen0 + 1, true)) << describe(page_seen_by(pid, "sig"));
    auto table = run_command(mallctl_argv(malld.socket(), {"status"}));
    ASSERT_EQ(table.exit_code, 0) << table.err;
    EXPECT_NE(table.out.find("settled,signals"), std::string::npos) << table.out;

    // The state file keeps it; a malld killed and restarted re-adopts the job with it, sends the
    // process nothing new, and the page the process maps again carries the flag.
    ASSERT_TRUE(wait_until(
        [&] {
            const std::string text = read_file(malld.state_dir() + "/malld.state.json");
            if (text.empty()) return false;
            const json state = json::parse(text, nullptr, false);
            return !state.is_discarded() && state.contains("jobs") && state["jobs"].size() == 1 &&
                   state["jobs"][0].value("signal_control", false) &&
                   state["jobs"][0].value("published_signal_control", false);
        },
        10s))
        << read_file(malld.state_dir() + "/malld.state.json");
    malld.kill9();
    ASSERT_TRUE(malld.restart(&error)) << error;
    ASSERT_TRUE(wait_until(
        [&] {
            auto j = job_status(malld.socket(), "sig");
            return j && j->value("attached", 0) == 1 && job_settled_on(malld.socket(), "sig", "0-1", 1);
        },
        30s))
        << status_text(malld);
    job = job_status(malld.socket(), "sig");
    ASSERT_TRUE(job);
    EXPECT_EQ((*job)["signal_control"], true);
    EXPECT_EQ((*job)["generation"].get<uint64_t>(), gen0 + 1);
    EXPECT_TRUE(wait_until([&] { return page_says(pid, "sig", gen0 + 1, true); }, 10s))
        << describe(page_seen_by(pid, "sig"));
    table = run_command(mallctl_argv(malld.socket(), {"status"}));
    EXPECT_NE(table.out.find("settled,signals"), std::string::npos) << table.out;

    // off: the same again without the flag.
    set = run_command(mallctl_argv(malld.socket(), {"set", "sig", "--signal-control", "off"}));
    ASSERT_EQ(set.exit_code, 0) << set.err;
    EXPECT_NE(set.out.find("signal-control off"), std::string::npos) << set.out;
    EXPECT_TRUE(client.wait_for_line(change_to(gen0 + 2), 20s)) << joined_lines(client.all_lines());
    ASSERT_TRUE(wait_until([&] { return job_settled_on(malld.socket(), "sig", "0-1", 1); }, 20s))
        << status_text(malld);
    job = job_status(malld.socket(), "sig");
    EXPECT_EQ((*job)["signal_control"], false);
    EXPECT_EQ((*job)["generation"].get<uint64_t>(), gen0 + 2);
    EXPECT_EQ((*job)["acked_generation"], (*job)["generation"]);
    EXPECT_TRUE(page_says(pid, "sig", gen0 + 2, false)) << describe(page_seen_by(pid, "sig"));
    table = run_command(mallctl_argv(malld.socket(), {"status"}));
    EXPECT_EQ(table.out.find(",signals"), std::string::npos) << table.out;
    EXPECT_TRUE(threads_all_on(pids, "0-1")) << describe_threads(pids);
}

}  // namespace
}  // namespace mall::test
