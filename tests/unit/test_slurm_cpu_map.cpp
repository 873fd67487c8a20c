// SPDX-License-Identifier: BSD-3-Clause
// Proves Slurm's abstract core ids become the right Linux cpus on SMT and interleaved nodes (issue
// 12, defect 4: the prolog's lookup used them as Linux cpus), the same way for the plugin and malld.
#include <hwloc.h>

#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "common/slurm_cpu_map.hpp"
#include "daemon/core/topology.hpp"
#include "daemon/slurm_reconcile.hpp"
#include "support/unit_helpers.hpp"
#include "support/watchdog.h"

namespace {

using mall::CpuSet;
using mall::SlurmNodeShape;
using mall::Topology;
using mall::test::cpus;

MALL_TEST_WATCHDOG(60);

// Two packages, four cores each, two threads per core; Linux numbers cpus alternating packages and
// puts second threads 8 on: core k of package p = cpus 2k+p and 2k+p+8.
const std::string kInterleavedXml = std::string(MALL_SOURCE_DIR) + "/tests/data/topology-2pack-4core-2pu-interleaved.xml";
// One package, four cores, two threads; siblings numbered 4 apart (core k = cpus k and k+4).
const std::string kSiblingsApart = "pack:1 core:4 pu:2(indexes=0,4,1,5,2,6,3,7)";

std::unique_ptr<Topology> must_load(const std::string &spec) {
    std::string error;
    auto topology = Topology::load(spec, &error);
    EXPECT_NE(topology, nullptr) << spec << ": " << error;
    return topology;
}

// Maps and expects success; returns the cpus as list text.
std::string mapped(const Topology &topology, const std::string &cores, SlurmNodeShape slurm = {}) {
    mall::SlurmCpuMapping m = mall::map_slurm_cores(cpus(cores), topology.cores(), slurm);
    EXPECT_TRUE(m.cpus.has_value()) << cores << ": " << m.error;
    return m.cpus ? m.cpus->to_string() : "(none: " + m.error + ")";
}

// An answer to no one: SlurmReconciler needs a query, cpus_on_node() never calls it.
class NoQuery : public mall::SlurmQuery {
public:
    mall::SlurmJobState query(uint32_t) override { return {}; }
    Annotated annotate(uint32_t, const std::string &, mall::CommentChain *) override { return {"not asked", false}; }
};

mall::SlurmJobState running(uint32_t id, const std::string &cores, SlurmNodeShape slurm) {
    mall::SlurmJobState state;
    state.job_id = id;
    state.kind = mall::SlurmJobState::Kind::Running;
    state.detail = "RUNNING";
    state.slurm_cores = cpus(cores);
    state.slurm_node = slurm;
    return state;
}

}  // namespace

TEST(SlurmCpuMap, TwoThreadsPerCoreGiveBothSiblings) {
    auto topology = must_load("package:2 core:4 pu:2");  // siblings adjacent: core c = 2c, 2c+1
    ASSERT_NE(topology, nullptr);
    const SlurmNodeShape slurm{2, 4, 2};
    EXPECT_EQ(mapped(*topology, "1", slurm), "2-3");
    EXPECT_EQ(mapped(*topology, "0,5", slurm), "0-1,10-11");
    EXPECT_EQ(mapped(*topology, "0-7", slurm), "0-15");
    EXPECT_EQ(mapped(*topology, "1"), "2-3");  // Slurm's description unknown (the plugin): same
}

TEST(SlurmCpuMap, SiblingsNumberedApartAsIntelDoes) {
    auto topology = must_load(kSiblingsApart);
    ASSERT_NE(topology, nullptr);
    EXPECT_EQ(mapped(*topology, "1", {1, 4, 2}), "1,5");
    EXPECT_EQ(mapped(*topology, "2-3", {1, 4, 2}), "2-3,6-7");
    EXPECT_EQ(mapped(*topology, "0"), "0,4");
}

TEST(SlurmCpuMap, XmlWhoseNumberingAlternatesPackages) {
    auto topology = must_load(kInterleavedXml);
    ASSERT_NE(topology, nullptr);
    ASSERT_EQ(topology->description(), "2 packages, 8 cores, 16 PUs");
    const SlurmNodeShape slurm{2, 4, 2};
    EXPECT_EQ(mapped(*topology, "1", slurm), "2,10");  // package 0's second core, not cpu 1
    EXPECT_EQ(mapped(*topology, "4", slurm), "1,9");   // package 1's first core
    EXPECT_EQ(mapped(*topology, "0-3", slurm), "0,2,4,6,8,10,12,14");  // all of package 0
    EXPECT_EQ(mapped(*topology, "4-7", slurm), "1,3,5,7,9,11,13,15");
    mall::SlurmCpuMapping m = mall::map_slurm_cores(cpus("1"), topology->cores(), slurm);
    EXPECT_TRUE(m.disagreement.empty()) << m.disagreement;
}

TEST(SlurmCpuMap, OneThreadPerCoreInTreeOrderIsTheIdentity) {
    auto topology = must_load("pack:2 core:4");
    ASSERT_NE(topology, nullptr);
    for (const char *cores : {"0", "3", "1,4-6", "0-7"}) {
        EXPECT_EQ(mapped(*topology, cores, {2, 4, 1}), cores);
        EXPECT_EQ(mapped(*topology, cores), cores);
    }
    EXPECT_EQ(mapped(*topology, ""), "");  // no ids: no cpus
}

// slurm.conf counts hardware threads as cores (ThreadsPerCore=1, CoresPerSocket=8 on a 4-core SMT
// package): slurmd maps abstract core c to the c-th PU in hwloc's order; so does mall, and says so.
TEST(SlurmCpuMap, SlurmDescribingThreadsAsCoresIsMappedAsSlurmdDoes) {
    auto topology = must_load(kSiblingsApart);  // PUs in order: 0,4,1,5,2,6,3,7
    ASSERT_NE(topology, nullptr);
    const SlurmNodeShape slurm{1, 8, 1};
    mall::SlurmCpuMapping m = mall::map_slurm_cores(cpus("1,2"), topology->cores(), slurm);
    ASSERT_TRUE(m.cpus.has_value()) << m.error;
    EXPECT_EQ(m.cpus->to_string(), "1,4");
    EXPECT_NE(m.disagreement.find("1 socket x 8 cores x 1 thread (8 cpus)"), std::string::npos) << m.disagreement;
    EXPECT_NE(m.disagreement.find("slurmd -C"), std::string::npos) << m.disagreement;
    EXPECT_FALSE(mall::map_slurm_cores(cpus("8"), topology->cores(), slurm).cpus.has_value());
}

// slurm.conf promises more cpus than the node has: slurmd falls back to hwloc's layout, and ids
// beyond the node map to nothing (never to some other job's cpus).
TEST(SlurmCpuMap, IdsTheNodeDoesNotHaveMapToNothing) {
    auto topology = must_load("package:2 core:4 pu:2");
    ASSERT_NE(topology, nullptr);
    const SlurmNodeShape bigger{2, 8, 2};
    mall::SlurmCpuMapping fits = mall::map_slurm_cores(cpus("1"), topology->cores(), bigger);
    ASSERT_TRUE(fits.cpus.has_value()) << fits.error;
    EXPECT_EQ(fits.cpus->to_string(), "2-3");
    EXPECT_FALSE(fits.disagreement.empty());
    for (SlurmNodeShape slurm : {bigger, SlurmNodeShape{}}) {
        mall::SlurmCpuMapping beyond = mall::map_slurm_cores(cpus("3,9"), topology->cores(), slurm);
        EXPECT_FALSE(beyond.cpus.has_value());
        EXPECT_NE(beyond.error.find("core id 9 is beyond this node's 8 cores"), std::string::npos) << beyond.error;
    }
}

// The plugin walks its own hwloc topology with node_cores_in_slurm_order(); malld's Topology walks
// the same way, so both map a job's cores alike.
TEST(SlurmCpuMap, PluginAndMalldWalkTheSameCores) {
    for (const std::string &spec : {kInterleavedXml, kSiblingsApart}) {
        auto topology = must_load(spec);
        ASSERT_NE(topology, nullptr);
        hwloc_topology_t raw = nullptr;
        ASSERT_EQ(hwloc_topology_init(&raw), 0);
        if (spec == kInterleavedXml)
            ASSERT_EQ(hwloc_topology_set_xml(raw, spec.c_str()), 0);
        else
            ASSERT_EQ(hwloc_topology_set_synthetic(raw, spec.c_str()), 0);
        ASSERT_EQ(hwloc_topology_load(raw), 0);
        EXPECT_EQ(mall::node_cores_in_slurm_order(raw), topology->cores()) << spec;
        hwloc_topology_destroy(raw);
    }
}

TEST(SlurmReconcilerCpus, RunningJobsCoresBecomeLinuxCpus) {
    auto topology = must_load(kInterleavedXml);
    ASSERT_NE(topology, nullptr);
    mall::SlurmReconciler reconciler(std::make_unique<NoQuery>(), std::chrono::seconds(3600));
    std::string why;
    auto on_node = reconciler.cpus_on_node(running(7, "1,4", {2, 4, 2}), *topology, &why);
    ASSERT_TRUE(on_node.has_value()) << why;
    EXPECT_EQ(on_node->to_string(), "1-2,9-10");

    mall::SlurmJobState done = running(8, "1", {2, 4, 2});
    done.kind = mall::SlurmJobState::Kind::NotRunning;
    done.detail = "COMPLETED";
    EXPECT_FALSE(reconciler.cpus_on_node(done, *topology, &why).has_value());
    EXPECT_EQ(why, "COMPLETED");

    mall::SlurmJobState none = running(9, "", {2, 4, 2});
    EXPECT_FALSE(reconciler.cpus_on_node(none, *topology, &why).has_value());

    EXPECT_FALSE(reconciler.cpus_on_node(running(10, "8", {2, 4, 2}), *topology, &why).has_value());
    EXPECT_NE(why.find("cannot map Slurm's cores 8 of job 10"), std::string::npos) << why;
}
