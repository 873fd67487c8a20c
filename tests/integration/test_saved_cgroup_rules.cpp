// SPDX-License-Identifier: BSD-3-Clause
// test_saved_cgroup_rules.cpp — a state file is judged by the same rule as a live registration
// (issue 37, review finding 14): the cgroups no job is ever resized in (the hierarchy's root,
// malld's own folders, the cgroup malld runs in and its ancestors: never_delegated_reason) are
// never adopted from a state file as a job's in-place cgroup, whoever wrote the file. malld runs in
// <tree>/service/malld (as a systemd unit runs in /system.slice/malld.service); job "a" runs
// under mallrun; malld is SIGKILLed and its state file rewritten to name <tree>/service, malld's
// cgroup's parent, as a's cgroup in place, saved on cpu 0 (so the next plan would resize it). The
// restarted malld must not re-adopt a, must say why, and must leave <tree>/service's cpus as they
// were. Runs on the machine's cpuset controller (cgroup v1 here, v2 in tests/vm's guest). The
// state file is rewritten by support/attackers.hpp's kill_and_craft_saved_cgroup.
#include <unistd.h>

#include <thread>

#include <gtest/gtest.h>

#include "support/attackers.hpp"
#include "support/malld_fixture.hpp"

MALL_TEST_WATCHDOG(120);

namespace mall::test {
namespace {

using nlohmann::json;

json read_json(const std::string &path) { return json::parse(read_file(path), nullptr, false); }

// The state file lists `job` settled on `cpus` (malld saves on a writer thread after a change).
bool saved_on(const PrivateMalld &malld, const std::string &job, const std::string &cpus) {
    return wait_until(
        [&] {
            const json state = read_json(malld.state_dir() + "/malld.state.json");
            if (!state.is_object() || !state.contains("jobs")) return false;
            for (const auto &j : state["jobs"])
                if (j.value("job", "") == job && j.value("cpuset", "") == cpus && j.value("published", "") == cpus)
                    return true;
            return false;
        },
        10s);
}

TEST(Issue37SavedCgroupRules, ACraftedStateNamingTheParentOfMalldsCgroupIsNotAdopted) {
    MALL_REQUIRE_ROOT_AND_CPUSET();
    TestCgroupTree tree("mall_savedrule_" + std::to_string(::getpid()));
    std::string error;
    const std::string service = tree.make("service", "0-1", &error);
    ASSERT_FALSE(service.empty()) << error;
    const std::string malld_home = tree.make("service/malld", "0-1", &error);
    ASSERT_FALSE(malld_home.empty()) << error;

    MalldOptions options;
    options.start_in_cgroup = malld_home;
    PrivateMalld malld(options);
    ASSERT_TRUE(malld.start(&error)) << error;
    auto a = std::make_unique<Child>(mallrun_argv(malld.socket(), "1:2", "a", test_client_argv()));
    ASSERT_TRUE(wait_until([&] { return job_settled_on(malld.socket(), "a", "0-1", 1); }, 20s)) << status_text(malld);
    ASSERT_TRUE(saved_on(malld, "a", "0-1")) << read_file(malld.state_dir() + "/malld.state.json");
    ASSERT_NO_FATAL_FAILURE(kill_and_craft_saved_cgroup(malld, service));

    ASSERT_TRUE(malld.restart(&error)) << error;
    for (int i = 0; i < 5; ++i) {  // it runs on: answers now and a moment later
        ASSERT_TRUE(status_json(malld.socket())) << "malld stopped answering:\n" << malld.log();
        std::this_thread::sleep_for(200ms);
    }
    EXPECT_FALSE(job_status(malld.socket(), "a")) << "job a was adopted in place in " << service << ":\n"
                                                  << status_text(malld);
    const std::string log = malld.log();
    EXPECT_NE(log.find("cannot re-adopt job a: its saved cgroup '" + service +
                       "' is the cgroup malld runs in or one of its ancestors"),
              std::string::npos)
        << log;
    EXPECT_EQ(cgroup_cpus(service).value_or("?"), "0-1") << "malld resized its own cgroup's parent";
    EXPECT_EQ(cgroup_cpus(malld_home).value_or("?"), "0-1") << "malld resized its own cgroup";
    a.reset();
}

}  // namespace
}  // namespace mall::test
