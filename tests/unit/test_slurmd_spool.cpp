// SPDX-License-Identifier: BSD-3-Clause
// Proves malld reads which Slurm jobs run on its node from slurmd's spool folder (issue 39: no RPC
// to slurmctld in steady state): the stepd socket names it believes and those it ignores, %n/%h
// expansion, and that it believes nothing a user could plant (a folder others can write, a
// symlinked folder, a symlink or plain file named like a socket).
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "daemon/slurmd_spool.hpp"
#include "support/watchdog.h"

namespace {

MALL_TEST_WATCHDOG(60);

using mall::SlurmdSpool;
using mall::stepd_socket_job_id;

TEST(StepdSocketName, OnlyThisNodesJobStepSocketsCount) {
    EXPECT_EQ(stepd_socket_job_id("node1_123.0", "node1"), 123u);
    EXPECT_EQ(stepd_socket_job_id("node1_123.4294967291", "node1"), 123u);  // the extern step
    EXPECT_EQ(stepd_socket_job_id("node1_4294967295.0", "node1"), 4294967295u);
    EXPECT_EQ(stepd_socket_job_id("node_x_7.1", "node_x"), 7u);
    EXPECT_FALSE(stepd_socket_job_id("node12_123.0", "node1"));  // another node's
    EXPECT_FALSE(stepd_socket_job_id("node1_123", "node1"));
    EXPECT_FALSE(stepd_socket_job_id("node1_.0", "node1"));
    EXPECT_FALSE(stepd_socket_job_id("node1_0.0", "node1"));
    EXPECT_FALSE(stepd_socket_job_id("node1_12a.0", "node1"));
    EXPECT_FALSE(stepd_socket_job_id("node1_123.0.1", "node1"));
    EXPECT_FALSE(stepd_socket_job_id("node1_4294967296.0", "node1"));
    EXPECT_FALSE(stepd_socket_job_id("cred_state", "node1"));
    EXPECT_FALSE(stepd_socket_job_id("node1_123.0", ""));
}

TEST(SlurmdSpoolDir, ExpandsAsSlurmdDoes) {
    EXPECT_EQ(mall::expand_slurmd_spool_dir("/var/spool/slurmd", "n1", "h1"), "/var/spool/slurmd");
    EXPECT_EQ(mall::expand_slurmd_spool_dir("/c/nodes/%n/spool", "node7", "host"), "/c/nodes/node7/spool");
    EXPECT_EQ(mall::expand_slurmd_spool_dir("/s/%h-%n/%%/%x%", "n", "h"), "/s/h-n/%/%x%");
}

class Spool : public ::testing::Test {
protected:
    void SetUp() override {
        char tmpl[] = "/tmp/mall_test_slurmd_spool_XXXXXX";
        ASSERT_NE(::mkdtemp(tmpl), nullptr);
        dir = tmpl;
        ASSERT_EQ(::chmod(dir.c_str(), 0755), 0);
    }
    void TearDown() override {
        for (int fd : sockets) ::close(fd);
        std::error_code ignored;
        std::filesystem::remove_all(dir, ignored);
    }
    // A listening unix socket at dir/name, as slurmstepd makes one per step.
    void stepd_socket(const std::string &name) {
        const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        ASSERT_GE(fd, 0);
        sockaddr_un addr{};
        addr.sun_family = AF_UNIX;
        const std::string path = dir + "/" + name;
        ASSERT_LT(path.size(), sizeof addr.sun_path);
        std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path.c_str());
        ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr *>(&addr), sizeof addr), 0) << path;
        ASSERT_EQ(::listen(fd, 1), 0);
        sockets.push_back(fd);
    }
    SlurmdSpool spool(const std::string &folder) const { return SlurmdSpool(folder, "node1", ::getuid()); }

    std::string dir;
    std::vector<int> sockets;
};

TEST_F(Spool, ListsTheJobsWithAStepdSocketOfThisNode) {
    stepd_socket("node1_11.0");
    stepd_socket("node1_11.4294967291");
    stepd_socket("node1_12.4294967294");  // a batch step
    stepd_socket("node2_13.0");           // another node's (nodes sharing a spool)
    std::ofstream(dir + "/cred_state") << "x";
    const auto listing = spool(dir).read();
    ASSERT_TRUE(listing.ok()) << listing.error;
    EXPECT_EQ(listing.jobs, (std::set<uint32_t>{11, 12}));
}

TEST_F(Spool, AnEmptySpoolListsNoJob) {
    const auto listing = spool(dir).read();
    ASSERT_TRUE(listing.ok()) << listing.error;
    EXPECT_TRUE(listing.jobs.empty());
}

TEST_F(Spool, NamesThatAreNotSocketsAreNotBelieved) {
    std::ofstream(dir + "/node1_21.0") << "planted";                       // a plain file
    ASSERT_EQ(::symlink("/run/some.sock", (dir + "/node1_22.0").c_str()), 0);  // a symlink
    ASSERT_EQ(::mkdir((dir + "/node1_23.0").c_str(), 0755), 0);            // a folder
    const auto listing = spool(dir).read();
    ASSERT_TRUE(listing.ok()) << listing.error;
    EXPECT_TRUE(listing.jobs.empty()) << *listing.jobs.begin();
}

TEST_F(Spool, AFolderOthersCanWriteIsNotTrusted) {
    stepd_socket("node1_31.0");
    ASSERT_EQ(::chmod(dir.c_str(), 0777), 0);
    auto listing = spool(dir).read();
    EXPECT_FALSE(listing.ok());
    EXPECT_TRUE(listing.jobs.empty());
    EXPECT_NE(listing.error.find("writable by others than its owner"), std::string::npos) << listing.error;
    ASSERT_EQ(::chmod(dir.c_str(), 0775), 0);  // group-writable: the same
    EXPECT_FALSE(spool(dir).read().ok());
}

TEST_F(Spool, AFolderOfAnotherUserIsNotTrusted) {
    // Trusted owners are root and SlurmdUser: with SlurmdUser given as another uid than the
    // folder's owner (and the owner not root), the folder is refused.
    if (::getuid() == 0) {
        ASSERT_EQ(::chown(dir.c_str(), 61001, 61001), 0);
        const auto listing = SlurmdSpool(dir, "node1", 0).read();
        EXPECT_FALSE(listing.ok());
        EXPECT_NE(listing.error.find("owned by uid 61001"), std::string::npos) << listing.error;
    } else {
        const auto listing = SlurmdSpool(dir, "node1", ::getuid() + 1).read();
        EXPECT_FALSE(listing.ok());
        EXPECT_NE(listing.error.find("not root or SlurmdUser"), std::string::npos) << listing.error;
    }
}

TEST_F(Spool, ASymlinkedFolderIsNotFollowed) {
    stepd_socket("node1_41.0");
    const std::string link = dir + ".link";
    ASSERT_EQ(::symlink(dir.c_str(), link.c_str()), 0);
    const auto listing = spool(link).read();
    ::unlink(link.c_str());
    EXPECT_FALSE(listing.ok());
    EXPECT_NE(listing.error.find("cannot be opened"), std::string::npos) << listing.error;
}

TEST_F(Spool, AMissingFolderSaysSo) {
    const auto listing = spool(dir + "/absent").read();
    EXPECT_FALSE(listing.ok());
    EXPECT_NE(listing.error.find("absent cannot be opened: No such file or directory"), std::string::npos)
        << listing.error;
}

}  // namespace
