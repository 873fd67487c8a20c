// SPDX-License-Identifier: BSD-3-Clause
// Proves Topology loads synthetic, XML and system topologies and measures locality correctly.

#include <gtest/gtest.h>
#include <hwloc.h>
#include <sched.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>

#include "daemon/core/topology.hpp"
#include "support/watchdog.h"

using mall::CpuSet;
using mall::Topology;

namespace {

MALL_TEST_WATCHDOG(60);

std::unique_ptr<Topology> must_load(const std::string &spec) {
    std::string error;
    auto topology = Topology::load(spec, &error);
    EXPECT_NE(topology, nullptr) << spec << ": " << error;
    return topology;
}

// A temporary folder removed at the end of the test.
struct TempDir {
    std::string path;
    TempDir() {
        char tmpl[] = "/tmp/mall_test_topology_XXXXXX";
        path = mkdtemp(tmpl);
    }
    ~TempDir() { std::filesystem::remove_all(path); }
};

}  // namespace

TEST(Topology, SyntheticTwoPackagesSixtyFourPus) {
    auto topology = must_load("pack:2 core:16 pu:2");
    ASSERT_NE(topology, nullptr);
    EXPECT_EQ(topology->all_cpus().to_string(), "0-63");
    ASSERT_EQ(topology->cpus_in_tree_order().size(), 64u);
    for (int i = 0; i < 64; ++i) {
        EXPECT_EQ(topology->cpus_in_tree_order()[i], i);
        EXPECT_EQ(topology->tree_index(i), i);
    }
    EXPECT_EQ(topology->tree_index(64), -1);
    EXPECT_EQ(topology->tree_index(-1), -1);
    EXPECT_EQ(topology->description(), "2 packages, 32 cores, 64 PUs");
}

TEST(Topology, SharedDepthOrdersLocality) {
    auto topology = must_load("pack:2 core:16 pu:2");
    ASSERT_NE(topology, nullptr);
    const int same_pu = topology->shared_depth(0, 0);
    const int same_core = topology->shared_depth(0, 1);
    const int same_package = topology->shared_depth(0, 2);
    const int other_package = topology->shared_depth(0, 32);
    EXPECT_GT(same_pu, same_core);
    EXPECT_GT(same_core, same_package);
    EXPECT_GT(same_package, other_package);
    EXPECT_EQ(other_package, 0);  // only the machine is shared
    EXPECT_EQ(topology->shared_depth(5, 30), same_package);
    EXPECT_EQ(topology->shared_depth(33, 63), same_package);
    EXPECT_EQ(topology->shared_depth(62, 63), same_core);
    EXPECT_EQ(topology->shared_depth(31, 32), other_package);
    EXPECT_EQ(topology->shared_depth(7, 3), topology->shared_depth(3, 7));  // symmetric
    EXPECT_EQ(topology->shared_depth(0, 999), -1);                         // unknown cpu
}

TEST(Topology, SyntheticWithoutPuLevelMeansOnePuPerCore) {
    auto topology = must_load("pack:2 core:16");
    ASSERT_NE(topology, nullptr);
    EXPECT_EQ(topology->all_cpus().count(), 32);
    EXPECT_EQ(topology->description(), "2 packages, 32 cores, 32 PUs");
    EXPECT_GT(topology->shared_depth(0, 15), topology->shared_depth(15, 16));
}

TEST(Topology, XmlRoundTrip) {
    TempDir dir;
    const std::string xml = dir.path + "/node.xml";
    hwloc_topology_t source;
    ASSERT_EQ(hwloc_topology_init(&source), 0);
    ASSERT_EQ(hwloc_topology_set_synthetic(source, "pack:2 l3:1 core:4 pu:2"), 0);
    ASSERT_EQ(hwloc_topology_load(source), 0);
    ASSERT_EQ(hwloc_topology_export_xml(source, xml.c_str(), 0), 0);
    hwloc_topology_destroy(source);

    auto topology = must_load(xml);
    ASSERT_NE(topology, nullptr);
    EXPECT_EQ(topology->all_cpus().to_string(), "0-15");
    EXPECT_EQ(topology->description(), "2 packages, 8 cores, 16 PUs");
    EXPECT_GT(topology->shared_depth(0, 1), topology->shared_depth(0, 2));
    EXPECT_GT(topology->shared_depth(0, 7), topology->shared_depth(0, 8));
    auto synthetic = must_load("pack:2 l3:1 core:4 pu:2");
    ASSERT_NE(synthetic, nullptr);
    for (int a = 0; a < 16; ++a) {
        for (int b = 0; b < 16; ++b) {
            EXPECT_EQ(topology->shared_depth(a, b), synthetic->shared_depth(a, b)) << a << "," << b;
        }
    }
}

TEST(Topology, BadXmlFileIsAnError) {
    TempDir dir;
    const std::string xml = dir.path + "/broken.xml";
    FILE *f = fopen(xml.c_str(), "w");
    ASSERT_NE(f, nullptr);
    fputs("<topology><this is not hwloc", f);
    fclose(f);
    std::string error;
    EXPECT_EQ(Topology::load(xml, &error), nullptr);
    EXPECT_FALSE(error.empty());
}

TEST(Topology, SystemSeesThisMachinesPus) {
    for (const char *spec : {"", "system"}) {
        auto topology = must_load(spec);
        ASSERT_NE(topology, nullptr);
        const long online = sysconf(_SC_NPROCESSORS_ONLN);
        EXPECT_EQ(topology->all_cpus().count(), online);
        cpu_set_t mine;
        ASSERT_EQ(sched_getaffinity(0, sizeof mine, &mine), 0);
        for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
            if (CPU_ISSET(cpu, &mine)) {
                EXPECT_TRUE(topology->all_cpus().contains(cpu)) << cpu;
            }
        }
        EXPECT_EQ(static_cast<long>(topology->cpus_in_tree_order().size()), online);
        EXPECT_NE(topology->description().find("PU"), std::string::npos);
    }
}

TEST(Topology, BadSpecGivesAnError) {
    for (const char *spec : {"banana:3", "pack:0 core:2", "pack:2 core:x pu:2", "/no/such/file.xml"}) {
        std::string error;
        EXPECT_EQ(Topology::load(spec, &error), nullptr) << spec;
        EXPECT_NE(error.find("synthetic"), std::string::npos) << spec << ": " << error;
    }
}
