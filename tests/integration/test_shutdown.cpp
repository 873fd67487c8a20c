// SPDX-License-Identifier: BSD-3-Clause
// Proves that malld stops cleanly on SIGTERM whatever threads it runs: with --slurm (the Slurm
// checker's thread) it logs the signal, writes its final state, removes its socket and exits 0;
// SIGHUP does not stop it. Issue 12's first defect: the checker thread was started before the stop
// signals were blocked, so the kernel gave it SIGTERM with the default action and malld died
// without its shutdown. No slurmctld is needed: malld only has to load a slurm.conf.
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/utsname.h>

#include <fstream>

#include <gtest/gtest.h>

#include "support/malld_fixture.hpp"

MALL_TEST_WATCHDOG(120);

namespace mall::test {
namespace {

std::string node_name() {
    struct utsname u {};
    return ::uname(&u) == 0 ? u.nodename : "localhost";
}

bool exists(const std::string &path) {
    struct stat st {};
    return ::lstat(path.c_str(), &st) == 0;
}

// A private malld started with --slurm on a minimal slurm.conf of its own (SLURM_CONF), with one
// registered job so that the final state write has something to keep.
class SlurmMalldShutdown : public ::testing::Test {
protected:
    void SetUp() override {
        MALL_REQUIRE_ROOT_AND_CPUSET();
#ifndef MALL_TEST_HAVE_SLURM
        GTEST_SKIP() << "this build has no Slurm support (MALL_WITH_SLURM), so malld has no --slurm";
#endif
        MalldOptions options;
        options.extra_args = {"--slurm", "--slurm-interval-s", "1"};
        malld_ = std::make_unique<PrivateMalld>(options);
        const std::string conf = malld_->dir() + "/slurm.conf";
        std::ofstream(conf) << "ClusterName=malltest\nSlurmctldHost=localhost\nNodeName=" << node_name()
                            << " CPUs=2\nPartitionName=p Nodes=ALL\n";
        ::setenv("SLURM_CONF", conf.c_str(), 1);  // inherited by malld
        std::string error;
        ASSERT_TRUE(malld_->start(&error)) << error;
        ::unsetenv("SLURM_CONF");
        ASSERT_NE(malld_->log().find("checking Slurm jobs every 1 s"), std::string::npos) << malld_->log();
        job_ = std::make_unique<Child>(
            mallrun_argv(malld_->socket(), "1:2", "kept", test_client_argv({"--step-us", "1000"})));
        ASSERT_TRUE(wait_until([&] { return job_settled_on(malld_->socket(), "kept", "0-1", 1); }, 20s))
            << malld_->log();
    }
    void TearDown() override {
        job_.reset();
        malld_.reset();
    }
    std::unique_ptr<PrivateMalld> malld_;
    std::unique_ptr<Child> job_;
};

TEST_F(SlurmMalldShutdown, SigtermStopsItCleanly) {
    // The Slurm checker's thread is running (it exists from start-up on): malld has more threads
    // than its loop, so a SIGTERM has another thread it could land on.
    ASSERT_TRUE(wait_until([&] { return thread_cpus_allowed(malld_->pid()).size() >= 2; }, 10s))
        << "malld runs no thread beside its loop: " << describe_threads({malld_->pid()});
    const std::string state_file = malld_->state_dir() + "/malld.state.json";
    ::unlink(state_file.c_str());  // whatever is there now, the shutdown must write it again

    std::optional<int> code = malld_->stop(10s);
    ASSERT_TRUE(code.has_value());
    const std::string log = malld_->log();
    EXPECT_EQ(*code, 0) << "malld did not exit 0 on SIGTERM (128+n = killed by signal n):\n" << log;
    EXPECT_NE(log.find("received SIGTERM"), std::string::npos) << log;
    EXPECT_NE(log.find("stopped"), std::string::npos) << log;
    EXPECT_FALSE(exists(malld_->socket())) << "malld left its socket behind";
    std::string saved = read_file(state_file);
    EXPECT_NE(saved.find("\"kept\""), std::string::npos)
        << "the final state write did not keep the running job; " << state_file << ": " << saved;
}

TEST_F(SlurmMalldShutdown, SighupLeavesItServing) {
    ASSERT_EQ(::kill(malld_->pid(), SIGHUP), 0);
    ASSERT_TRUE(wait_until([&] { return malld_->log().find("SIGHUP ignored") != std::string::npos; }, 10s))
        << malld_->log();
    auto status = status_json(malld_->socket());
    ASSERT_TRUE(status.has_value()) << "malld stopped answering after SIGHUP:\n" << malld_->log();
    EXPECT_TRUE(find_job(*status, "kept").has_value()) << status->dump(2);
}

}  // namespace
}  // namespace mall::test
