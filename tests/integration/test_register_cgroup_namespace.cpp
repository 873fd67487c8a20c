// SPDX-License-Identifier: BSD-3-Clause
// test_register_cgroup_namespace.cpp — Register and a process whose cgroup lies outside malld's
// cgroup namespace (issue 37, point 11's "/.." follow-up). /proc/PID/cgroup shows paths relative to
// the reader's namespace; a process above malld's namespace root reads "/..", which malld refuses
// to join to its mount (procfs.cpp). Such a process used to count as having no cgroup: Register
// accepted it and silently skipped its cgroup (never moved, never resized in place). Now the
// Register is refused with words, and no job is listed. A container job ("cgroup": "container")
// is the exception: its registered pid (the engine's client) is never moved nor resized, so its
// cgroup does not matter. malld runs here in a cgroup namespace of its own (`unshare -C` inside a
// cpuset folder of the test's), the registered process in the test's cgroup, above it. Helpers
// (ask, listed_jobs): support/attackers.hpp.
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include <gtest/gtest.h>

#include "../../libmall/src/daemon/procfs.hpp"
#include "common/ctl_client.hpp"
#include "common/protocol.hpp"
#include "mall/mall.h"
#include "support/attackers.hpp"
#include "support/malld_fixture.hpp"

MALL_TEST_WATCHDOG(120);

namespace mall::test {
namespace {

using nlohmann::json;

constexpr const char *kUnshare = "/usr/bin/unshare";

bool contains(const std::string &text, const std::string &part) { return text.find(part) != std::string::npos; }

std::string namespace_of(pid_t pid) {
    std::error_code ec;
    return std::filesystem::read_symlink("/proc/" + std::to_string(pid) + "/ns/cgroup", ec).string();
}

TEST(Issue37RegisterCgroupNamespace, PidWhoseCgroupLiesOutsideMalldsCgroupNamespaceIsRefused) {
    if (auto missing = missing_root_or_any_cpuset()) GTEST_SKIP() << *missing;
    if (::access(kUnshare, X_OK) != 0) GTEST_SKIP() << kUnshare << " is missing";
    // malld's namespace root: a cpuset folder below the test's cgroup (the one the target stays in).
    TestCgroupTree tree("cgns");
    std::string error;
    const std::string all = trim(read_file(cpuset_root() + (cpuset_is_v2() ? "/cpuset.cpus.effective" : "/cpuset.cpus")));
    const std::string folder = tree.make("", all, &error);
    ASSERT_FALSE(folder.empty()) << error;

    PrivateMalld malld;  // its socket, state dir and cgroup parent; started below, in the namespace
    std::vector<std::string> command{"/bin/sh", "-c",
                                     "echo $$ > '" + folder + "/cgroup.procs' && exec " + kUnshare +
                                         " --cgroup \"$0\" \"$@\""};
    for (const std::string &arg : malld.argv()) command.push_back(arg);
    ChildOptions capture;
    capture.capture_stderr = true;
    Child server(command, capture);
    ASSERT_TRUE(server.started());
    const bool up = wait_until([&] { return status_json(malld.socket()).has_value() || server.exited(); }, 10s);
    ASSERT_TRUE(up && !server.exited()) << "malld in a cgroup namespace did not start:\n"
                                        << joined_lines(server.all_lines());
    if (namespace_of(server.pid()) == namespace_of(::getpid()))
        GTEST_SKIP() << "malld did not get a cgroup namespace of its own";

    Child target({"/bin/sleep", "60"});
    ASSERT_TRUE(target.started());
    const std::string cgroup_before = process_cgroup(target.pid(), cpuset_is_v2()).value_or("?");
    const std::string p = std::to_string(target.pid());

    const std::string refused = ask(malld.socket(), proto::Type::Register,
                                    {{"job", "cgns-outside"}, {"uid", 0}, {"min", 1}, {"max", 2},
                                     {"pids", {target.pid()}}});
    EXPECT_TRUE(contains(refused, "refused " + std::to_string(MALL_ERR_DENIED))) << refused;
    EXPECT_TRUE(contains(refused, "pid " + p + "'s cgroup path as malld sees it is outside malld's cgroup namespace"))
        << refused;
    EXPECT_TRUE(contains(refused, "/..")) << refused;
    EXPECT_EQ(listed_jobs(malld.socket()), std::vector<std::string>{});
    EXPECT_EQ(process_cgroup(target.pid(), cpuset_is_v2()).value_or("?"), cgroup_before);

    // A container job's pid (the engine's client) is never moved nor resized: its cgroup does not
    // matter, and the registration is accepted.
    const std::string container = ask(malld.socket(), proto::Type::Register,
                                      {{"job", "cgns-container"}, {"uid", 0}, {"min", 1}, {"max", 2},
                                       {"cgroup", "container"}, {"pids", {target.pid()}}});
    EXPECT_TRUE(contains(container, "ok ")) << container << "\n" << joined_lines(server.all_lines());
    EXPECT_EQ(listed_jobs(malld.socket()), std::vector<std::string>{"cgns-container"});
    EXPECT_EQ(process_cgroup(target.pid(), cpuset_is_v2()).value_or("?"), cgroup_before);
    ask(malld.socket(), proto::Type::Deregister, {{"job", "cgns-container"}});
}

}  // namespace
}  // namespace mall::test
