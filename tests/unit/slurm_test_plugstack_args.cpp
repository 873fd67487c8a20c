// SPDX-License-Identifier: BSD-3-Clause
// Proves the plugin's plugstack.conf argument parser takes the documented keys with their defaults
// and rejects every malformed form (unknown key, no '=', duplicates, bad numbers, bad paths,
// bad on_daemon_down or prolog_lookup, min above max) with a message naming the argument.
#include <unistd.h>

#include <gtest/gtest.h>

#include "plugstack_args.hpp"
#include "../support/watchdog.h"

using mall::slurm::OnDaemonDown;
using mall::slurm::parse_plugstack_args;
using mall::slurm::PlugstackConfig;

namespace {

MALL_TEST_WATCHDOG(60);  // a hang fails the test instead of stalling CI

std::string rejected(const std::vector<std::string> &args) {
    std::string error;
    auto c = parse_plugstack_args(args, &error);
    EXPECT_FALSE(c.has_value());
    EXPECT_NE(error.find("accepted: socket="), std::string::npos) << error;
    return error;
}

}  // namespace

TEST(PlugstackArgs, Defaults) {
    std::string error;
    auto c = parse_plugstack_args(std::vector<std::string>{}, &error);
    ASSERT_TRUE(c) << error;
    EXPECT_EQ(c->socket, "/run/mall/malld.sock");
    EXPECT_EQ(c->min_cpus, 0u);
    EXPECT_EQ(c->max_cpus, 0u);
    EXPECT_EQ(c->on_daemon_down, OnDaemonDown::Run);
    EXPECT_EQ(c->ack_timeout_ms, 2000u);
    EXPECT_FALSE(c->prolog_lookup);  // issue 39: no RPC per job and node unless asked for
}

TEST(PlugstackArgs, AllKeys) {
    std::string error;
    auto c = parse_plugstack_args({"socket=/tmp/mall-cluster/malld.sock", "min_cpus=1", "max_cpus=2",
                                   "on_daemon_down=fail", "ack_timeout_ms=500", "prolog_lookup=yes"},
                                  &error);
    ASSERT_TRUE(c) << error;
    EXPECT_EQ(c->socket, "/tmp/mall-cluster/malld.sock");
    EXPECT_EQ(c->min_cpus, 1u);
    EXPECT_EQ(c->max_cpus, 2u);
    EXPECT_EQ(c->on_daemon_down, OnDaemonDown::Fail);
    EXPECT_EQ(c->ack_timeout_ms, 500u);
    EXPECT_TRUE(c->prolog_lookup);
    auto run = parse_plugstack_args({"on_daemon_down=run"}, &error);
    ASSERT_TRUE(run) << error;
    EXPECT_EQ(run->on_daemon_down, OnDaemonDown::Run);
}

TEST(PlugstackArgs, ArgcArgvForm) {
    char a0[] = "socket=/x.sock", a1[] = "max_cpus=4";
    char *argv[] = {a0, a1};
    std::string error;
    auto c = parse_plugstack_args(2, argv, &error);
    ASSERT_TRUE(c) << error;
    EXPECT_EQ(c->socket, "/x.sock");
    EXPECT_EQ(c->max_cpus, 4u);
    EXPECT_TRUE(parse_plugstack_args(0, nullptr, &error));
}

TEST(PlugstackArgs, RejectsUnknownKey) {
    EXPECT_NE(rejected({"sockett=/x"}).find("unknown argument \"sockett\""), std::string::npos);
}

TEST(PlugstackArgs, RejectsMissingEquals) {
    EXPECT_NE(rejected({"socket"}).find("not of the form key=value"), std::string::npos);
    rejected({"=5"});
}

TEST(PlugstackArgs, RejectsDuplicates) {
    EXPECT_NE(rejected({"max_cpus=2", "max_cpus=3"}).find("given twice"), std::string::npos);
}

TEST(PlugstackArgs, RejectsBadNumbers) {
    for (const char *key : {"min_cpus", "max_cpus", "ack_timeout_ms"}) {
        for (const char *value : {"", "x", "-1", "+1", "1.5", "0", "99999999999999999999"}) {
            std::string e = rejected({std::string(key) + "=" + value});
            EXPECT_NE(e.find(key), std::string::npos) << e;
        }
    }
    EXPECT_NE(rejected({"ack_timeout_ms=600001"}).find("out of range"), std::string::npos);
    EXPECT_NE(rejected({"max_cpus=abc"}).find("not a whole number"), std::string::npos);
}

TEST(PlugstackArgs, RejectsBadSocketPaths) {
    EXPECT_NE(rejected({"socket="}).find("absolute path"), std::string::npos);
    EXPECT_NE(rejected({"socket=run/malld.sock"}).find("absolute path"), std::string::npos);
    EXPECT_NE(rejected({"socket=/" + std::string(200, 'a')}).find("too long"), std::string::npos);
}

TEST(PlugstackArgs, RejectsBadOnDaemonDown) {
    EXPECT_NE(rejected({"on_daemon_down=drain"}).find("not run or fail"), std::string::npos);
    rejected({"on_daemon_down="});
    rejected({"on_daemon_down=RUN"});
}

TEST(PlugstackArgs, RejectsBadPrologLookup) {
    EXPECT_NE(rejected({"prolog_lookup=1"}).find("prolog_lookup=1 is not yes or no"), std::string::npos);
    rejected({"prolog_lookup="});
    auto no = parse_plugstack_args({"prolog_lookup=no"}, nullptr);
    ASSERT_TRUE(no);
    EXPECT_FALSE(no->prolog_lookup);
}

TEST(PlugstackArgs, RejectsMinAboveMax) {
    EXPECT_NE(rejected({"min_cpus=4", "max_cpus=2"}).find("above max_cpus"), std::string::npos);
}
