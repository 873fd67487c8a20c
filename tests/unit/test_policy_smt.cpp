// SPDX-License-Identifier: BSD-3-Clause
// Proves placement on SMT nodes (issue 13) gives whole cores: even counts hold whole cores, odd PUs
// of two jobs share a core only when no free core is left, shrinking gives back whole cores,
// regrowing takes whole cores, and minimal movement and stability hold, on hwloc `pu:2`
// topologies and on an XML one whose hyperthread siblings have non-adjacent Linux numbers.

#include <gtest/gtest.h>

#include <random>

#include "daemon/core/policy.hpp"
#include "support/unit_helpers.hpp"
#include "support/watchdog.h"

using namespace mall;

namespace {

using mall::test::cpus;
MALL_TEST_WATCHDOG(60);

// core k of package p holds cpus 2k+p and 2k+p+8 (tests/data/README.md)
const std::string kInterleavedXml = [] {
    const std::string here = __FILE__;  // .../tests/unit/test_policy_smt.cpp
    return here.substr(0, here.rfind("/unit/")) + "/data/topology-2pack-4core-2pu-interleaved.xml";
}();

PolicyJob job(const std::string &id, int min, int max, uint64_t order,
              const std::string &current = "") {
    PolicyJob j;
    j.id = id;
    j.min = min;
    j.max = max;
    j.order = order;
    j.current = cpus(current);
    return j;
}

using Allocation = std::map<std::string, CpuSet>;

// The topology's cores as a user reads them (lstopo): each core's PUs, whatever their numbers.
std::vector<CpuSet> cores_of(const Topology &topology) {
    std::vector<CpuSet> cores;
    for (const auto &pus : topology.cores()) cores.push_back(CpuSet::from_list(pus));
    return cores;
}

// Cores on which `set` holds some, but not all, of the PUs the pool has there.
std::vector<CpuSet> half_cores(const Topology &topology, const CpuSet &pool, const CpuSet &set) {
    std::vector<CpuSet> halves;
    for (const CpuSet &core : cores_of(topology)) {
        if (set.intersects(core) && !set.contains(core & pool)) halves.push_back(core);
    }
    return halves;
}

// Cores on which two or more jobs hold PUs, as "core cpus: job job" lines (empty: none).
std::vector<std::string> shared_cores(const Topology &topology, const Allocation &allocation) {
    std::vector<std::string> shared;
    for (const CpuSet &core : cores_of(topology)) {
        std::string holders;
        int count = 0;
        for (const auto &[id, set] : allocation) {
            if (!set.intersects(core)) continue;
            holders += " " + id;
            ++count;
        }
        if (count >= 2) shared.push_back(core.to_string() + ":" + holders);
    }
    return shared;
}

// A core of the pool no job holds any PU of.
bool free_whole_core_left(const Topology &topology, const CpuSet &pool,
                          const Allocation &allocation) {
    CpuSet used;
    for (const auto &[id, set] : allocation) used |= set;
    for (const CpuSet &core : cores_of(topology)) {
        if (pool.contains(core) && !used.intersects(core)) return true;
    }
    return false;
}

std::string describe(const Allocation &allocation) {
    std::string text;
    for (const auto &[id, set] : allocation) text += id + "=" + set.to_string() + " ";
    return text;
}

int moves(const std::vector<PolicyJob> &jobs, const Allocation &after) {
    int total = 0;
    for (const auto &j : jobs) {
        const CpuSet &target = after.at(j.id);
        total += ((j.current - target) | (target - j.current)).count();
    }
    return total;
}

int move_lower_bound(const std::vector<PolicyJob> &jobs, const Allocation &after) {
    int total = 0;
    for (const auto &j : jobs) total += std::abs(after.at(j.id).count() - j.current.count());
    return total;
}

class SmtPlacement : public ::testing::Test {
protected:
    void SetUp() override {
        std::string error;
        small_ = Topology::load("pack:1 core:4 pu:2", &error);
        ASSERT_NE(small_, nullptr) << error;
        two_packages_ = Topology::load("pack:2 core:4 pu:2", &error);
        ASSERT_NE(two_packages_, nullptr) << error;
        node_ = Topology::load("pack:2 core:16 pu:2", &error);
        ASSERT_NE(node_, nullptr) << error;
        interleaved_ = Topology::load(kInterleavedXml, &error);
        ASSERT_NE(interleaved_, nullptr) << error;
        ASSERT_EQ(interleaved_->cores()[1], (std::vector<int>{2, 10}));  // the file we think it is
    }

    // compute_allocation, checked for what every policy promises (disjoint, in the pool, counts
    // as compute_counts says) and for stability: recomputing from the result changes nothing.
    static Allocation placed(PolicyKind kind, const Topology &topology, const CpuSet &pool,
                             const std::vector<PolicyJob> &jobs) {
        Allocation result = compute_allocation(kind, topology, pool, jobs);
        auto counts = compute_counts(kind, pool, jobs);
        CpuSet seen;
        for (const auto &j : jobs) {
            const CpuSet &target = result[j.id];
            EXPECT_TRUE(pool.contains(target)) << j.id << " got " << target.to_string();
            EXPECT_FALSE(seen.intersects(target)) << j.id << " overlaps: " << target.to_string();
            EXPECT_EQ(target.count(), counts[j.id]) << j.id;
            seen |= target;
        }
        std::vector<PolicyJob> again = jobs;
        for (auto &j : again) j.current = result[j.id];
        EXPECT_EQ(compute_allocation(kind, topology, pool, again), result)
            << "not a fixed point: " << describe(result);
        return result;
    }

    std::unique_ptr<Topology> small_;         // 1 package x 4 cores x 2 PUs: cores {0,1}..{6,7}
    std::unique_ptr<Topology> two_packages_;  // 2 x 4 x 2: cpus 0-15, package 1 = 8-15
    std::unique_ptr<Topology> node_;          // 2 x 16 x 2: cpus 0-63
    std::unique_ptr<Topology> interleaved_;   // 2 x 4 x 2, siblings 8 apart, packages alternate
};

}  // namespace

TEST_F(SmtPlacement, EvenCountsHoldWholeCores) {
    const CpuSet pool = small_->all_cpus();
    // Fresh jobs.
    std::vector<PolicyJob> fresh{job("a", 2, 2, 1), job("b", 2, 2, 2), job("c", 4, 4, 3)};
    auto result = placed(PolicyKind::Equal, *small_, pool, fresh);
    EXPECT_TRUE(shared_cores(*small_, result).empty()) << describe(result);
    for (const auto &[id, set] : result) EXPECT_TRUE(half_cores(*small_, pool, set).empty()) << id;

    // a holds 7 PUs (cpu 0 had been outside the pool); b arrives and each gets 4: a keeps two
    // whole cores and gives back the rest, b gets the other two. The old placement kept 1-4 and
    // gave b 0,5-7: cores {0,1} and {4,5} shared.
    std::vector<PolicyJob> arrival{job("a", 1, 8, 1, "1-7"), job("b", 1, 8, 2)};
    result = placed(PolicyKind::Equal, *small_, pool, arrival);
    EXPECT_EQ(result["a"].to_string(), "2-5");
    EXPECT_EQ(result["b"].to_string(), "0-1,6-7");
    EXPECT_TRUE(shared_cores(*small_, result).empty()) << describe(result);

    // x (1 PU) sits on core {0,1}; a grows from core {2,3} to 4 PUs: it takes the whole core
    // {4,5}, not x's sibling 1 (the old placement took 1 and 4).
    std::vector<PolicyJob> beside{job("x", 1, 1, 1, "0"), job("a", 4, 4, 2, "2-3")};
    result = placed(PolicyKind::Equal, *small_, pool, beside);
    EXPECT_EQ(result["a"].to_string(), "2-5");
    EXPECT_TRUE(shared_cores(*small_, result).empty()) << describe(result);

    // The same on the interleaved node, whose cores are {0,8} {2,10} {4,12} {6,14} on package 0.
    const CpuSet package0 = cpus("0,2,4,6,8,10,12,14");
    std::vector<PolicyJob> interleaved{job("a", 1, 8, 1, "2,4,6,8,10,12,14"), job("b", 1, 8, 2)};
    result = placed(PolicyKind::Equal, *interleaved_, package0, interleaved);
    EXPECT_EQ(result["a"].to_string(), "2,4,10,12");
    EXPECT_EQ(result["b"].to_string(), "0,6,8,14");
    EXPECT_TRUE(shared_cores(*interleaved_, result).empty()) << describe(result);
    std::vector<PolicyJob> next_to{job("x", 1, 1, 1, "0"), job("a", 4, 4, 2, "2,10")};
    result = placed(PolicyKind::Equal, *interleaved_, interleaved_->all_cpus(), next_to);
    EXPECT_EQ(result["a"].to_string(), "2,4,10,12");  // core {4,12}, not 8 (x's sibling)
}

// The odd-count rule (policy.hpp): whole cores plus one PU on a core no other job is on, while
// such a core is free; two jobs' odd PUs share a core only when none is.
TEST_F(SmtPlacement, OddPusShareACoreOnlyWhenNoFreeCoreIsLeft) {
    const CpuSet pool = small_->all_cpus();
    // Room to spare: two 1-PU jobs and a 2-PU job share nothing (old: the 1-PU jobs shared {2,3}).
    std::vector<PolicyJob> roomy{job("a", 1, 1, 1), job("b", 1, 1, 2), job("c", 2, 2, 3)};
    auto result = placed(PolicyKind::Equal, *small_, pool, roomy);
    EXPECT_TRUE(shared_cores(*small_, result).empty()) << describe(result);
    EXPECT_EQ(result["c"].to_string(), "0-1");

    // A 1-PU job arriving next to a 3-PU job takes a free core, not the 3-PU job's free sibling
    // (old: cpu 43, beside a's 42).
    std::vector<PolicyJob> beside{job("a", 3, 3, 1, "40-42"), job("b", 1, 1, 2)};
    result = placed(PolicyKind::Equal, *node_, node_->all_cpus(), beside);
    EXPECT_TRUE(shared_cores(*node_, result).empty()) << describe(result);
    EXPECT_EQ(result["b"].count(), 1);

    // Three 3-PU jobs with room (static): each one whole core plus a PU alone on a core (old:
    // 0-2, 3-5, 6-8, two shared cores).
    std::vector<PolicyJob> threes{job("a", 3, 3, 1), job("b", 3, 3, 2), job("c", 3, 3, 3)};
    result = placed(PolicyKind::Static, *node_, node_->all_cpus(), threes);
    EXPECT_TRUE(shared_cores(*node_, result).empty()) << describe(result);
    for (const auto &[id, set] : result) {
        EXPECT_EQ(half_cores(*node_, node_->all_cpus(), set).size(), 1u) << id;
    }

    // The node full, counts 3+3+2: the two odd PUs must share a core, and that is the only
    // shared core; the even job holds a whole core.
    std::vector<PolicyJob> full{job("a", 1, 8, 1), job("b", 1, 8, 2), job("c", 2, 2, 3)};
    result = placed(PolicyKind::Equal, *small_, pool, full);
    EXPECT_EQ(result["a"].count(), 3);
    EXPECT_EQ(result["b"].count(), 3);
    EXPECT_EQ(shared_cores(*small_, result), std::vector<std::string>{"6-7: a b"})
        << describe(result);
    EXPECT_TRUE(half_cores(*small_, pool, result["c"]).empty()) << describe(result);

    // Five 3-PU jobs on 16 PUs: 5 whole cores, 5 odd PUs on the 3 cores left, so exactly 2
    // shared cores (one free PU remains); every job holds one whole core and one half.
    std::vector<PolicyJob> five;
    for (int j = 0; j < 5; ++j) five.push_back(job(std::string(1, char('a' + j)), 3, 3, j + 1));
    result = placed(PolicyKind::Equal, *two_packages_, two_packages_->all_cpus(), five);
    EXPECT_EQ(shared_cores(*two_packages_, result).size(), 2u) << describe(result);
    for (const auto &[id, set] : result) {
        EXPECT_EQ(half_cores(*two_packages_, two_packages_->all_cpus(), set).size(), 1u) << id;
    }

    // A pool missing one PU of a core (cpu 0): its sibling 1 is a lone PU, the natural place for
    // an odd job's extra PU; the even jobs get whole cores.
    std::vector<PolicyJob> lone{job("a", 3, 3, 1), job("b", 2, 2, 2), job("c", 2, 2, 3)};
    result = placed(PolicyKind::Equal, *small_, cpus("1-7"), lone);
    EXPECT_TRUE(result["a"].contains(1)) << describe(result);
    EXPECT_TRUE(shared_cores(*small_, result).empty()) << describe(result);
    EXPECT_TRUE(half_cores(*small_, cpus("1-7"), result["b"]).empty()) << describe(result);
    EXPECT_TRUE(half_cores(*small_, cpus("1-7"), result["c"]).empty()) << describe(result);
}

TEST_F(SmtPlacement, ShrinkingGivesBackWholeCores) {
    const CpuSet pool = small_->all_cpus();
    // 4 -> 2: a whole core goes back.
    std::vector<PolicyJob> halve{job("a", 2, 2, 1, "0-3"), job("b", 4, 4, 2, "4-7")};
    auto result = placed(PolicyKind::Equal, *small_, pool, halve);
    EXPECT_EQ(result["a"].to_string(), "0-1");

    // a holds 1-5, where 1 shares core {0,1} with x; shrinking to 4 it gives back 1 and keeps its
    // two whole cores (old: kept 1-4, splitting {4,5} and keeping the shared core).
    std::vector<PolicyJob> shared{job("x", 1, 1, 1, "0"), job("a", 4, 4, 2, "1-5")};
    result = placed(PolicyKind::Equal, *small_, pool, shared);
    EXPECT_EQ(result["a"].to_string(), "2-5");
    EXPECT_TRUE(shared_cores(*small_, result).empty()) << describe(result);

    // The same on the interleaved node: a holds 8 (x holds its sibling 0) and cores {2,10}, {4,12}.
    std::vector<PolicyJob> interleaved{job("x", 1, 1, 1, "0"), job("a", 4, 4, 2, "2,4,8,10,12")};
    result = placed(PolicyKind::Equal, *interleaved_, interleaved_->all_cpus(), interleaved);
    EXPECT_EQ(result["a"].to_string(), "2,4,10,12");

    // To an odd count: whole cores plus one PU, and the half core it keeps is the one it already
    // held (cpu 2, beside x's 3), not a split of a whole one: core {4,5} goes back whole.
    std::vector<PolicyJob> odd{job("x", 1, 1, 1, "3"), job("a", 3, 3, 2, "0-2,4-5")};
    result = placed(PolicyKind::Equal, *small_, pool, odd);
    EXPECT_EQ(result["a"].to_string(), "0-2");

    // Everything to a new job, twice: 8 -> 6 -> 4 gives back one whole core each time.
    std::vector<PolicyJob> gens{job("a", 1, 8, 1, "0-7"), job("b", 2, 2, 2)};
    result = placed(PolicyKind::Equal, *small_, pool, gens);
    EXPECT_TRUE(half_cores(*small_, pool, result["a"]).empty()) << describe(result);
    gens[0].current = result["a"];
    gens[1].current = result["b"];
    gens[1].min = gens[1].max = 4;
    result = placed(PolicyKind::Equal, *small_, pool, gens);
    EXPECT_TRUE(half_cores(*small_, pool, result["a"]).empty()) << describe(result);
    EXPECT_TRUE(shared_cores(*small_, result).empty()) << describe(result);
}

TEST_F(SmtPlacement, RegrowingStaysOnWholeCores) {
    const CpuSet pool = two_packages_->all_cpus();
    // a shrank to one core while x took a PU next to it; growing back to 6 it takes whole cores,
    // never the PU beside x (old: took 3, beside x's 2).
    std::vector<PolicyJob> jobs{job("a", 6, 6, 1, "0-1"), job("x", 1, 1, 2, "2")};
    auto result = placed(PolicyKind::Equal, *two_packages_, pool, jobs);
    EXPECT_TRUE(half_cores(*two_packages_, pool, result["a"]).empty()) << describe(result);
    EXPECT_TRUE(shared_cores(*two_packages_, result).empty()) << describe(result);
    EXPECT_TRUE(result["a"].contains(cpus("0-1"))) << describe(result);

    // A job grown back to an odd count fills its own half core first.
    std::vector<PolicyJob> own{job("a", 5, 5, 1, "0-2"), job("x", 1, 1, 2, "4")};
    result = placed(PolicyKind::Equal, *two_packages_, pool, own);
    EXPECT_TRUE(result["a"].contains(3)) << describe(result);
    EXPECT_TRUE(shared_cores(*two_packages_, result).empty()) << describe(result);

    // Interleaved: a holds core {2,10}, x holds 0; a grows to 6 on whole cores, not x's sibling 8.
    std::vector<PolicyJob> interleaved{job("a", 6, 6, 1, "2,10"), job("x", 1, 1, 2, "0")};
    result = placed(PolicyKind::Equal, *interleaved_, interleaved_->all_cpus(), interleaved);
    EXPECT_TRUE(half_cores(*interleaved_, interleaved_->all_cpus(), result["a"]).empty())
        << describe(result);
    EXPECT_FALSE(result["a"].contains(8)) << describe(result);
}

// Guaranteed cpus (Slurm's) and pins stay where they are; the cores they leave half used are
// avoided by the jobs that grow around them.
TEST_F(SmtPlacement, GuaranteedAndPinnedCpusStayAndTheirHalfCoresAreAvoided) {
    const CpuSet pool = small_->all_cpus();
    // x is pinned to cpu 1 (half of core {0,1}); a grows from {2,3} to 4 PUs with a whole core,
    // not x's sibling 0 (old: took 0).
    std::vector<PolicyJob> pinned{job("x", 1, 8, 1), job("a", 4, 4, 2, "2-3")};
    pinned[0].pinned = cpus("1");
    auto result = placed(PolicyKind::Equal, *small_, pool, pinned);
    EXPECT_EQ(result["x"].to_string(), "1");
    EXPECT_EQ(result["a"].to_string(), "2-5");

    // Slurm guaranteed a the core {2,10} of the interleaved node, y holds 0: a grows to 4 with a
    // whole core, not y's sibling 8 (old: took 8 and 4).
    std::vector<PolicyJob> guaranteed{job("y", 1, 1, 1, "0"), job("a", 4, 4, 2)};
    guaranteed[1].guaranteed = cpus("2,10");
    result = placed(PolicyKind::Equal, *interleaved_, interleaved_->all_cpus(), guaranteed);
    EXPECT_TRUE(result["a"].contains(cpus("2,10")));
    EXPECT_TRUE(half_cores(*interleaved_, interleaved_->all_cpus(), result["a"]).empty())
        << describe(result);
    EXPECT_TRUE(shared_cores(*interleaved_, result).empty()) << describe(result);

    // Guaranteed half a core (cpu 1) and a count of 3: its sibling first, then a whole core.
    std::vector<PolicyJob> half{job("a", 3, 3, 1)};
    half[0].guaranteed = cpus("1");
    result = placed(PolicyKind::Equal, *small_, pool, half);
    EXPECT_EQ(result["a"].to_string(), "0-2");
}

// Generation after generation as malld runs them (each job's current = its last target): moves
// stay minimal, a result is a fixed point, and what the generation changes follows the rules.
TEST_F(SmtPlacement, StableAcrossGenerations) {
    // Scripted: cpu 0 outside the pool, then back; jobs arrive and leave.
    std::vector<PolicyJob> jobs{job("a", 1, 8, 1)};
    auto step = [&](const CpuSet &pool) {
        auto result = placed(PolicyKind::Equal, *small_, pool, jobs);
        EXPECT_EQ(moves(jobs, result), move_lower_bound(jobs, result)) << describe(result);
        for (auto &j : jobs) j.current = result[j.id];
        return result;
    };
    EXPECT_EQ(step(cpus("1-7"))["a"].to_string(), "1-7");
    jobs.push_back(job("b", 1, 8, 2));
    auto result = step(small_->all_cpus());  // 4 + 4: both on whole cores (old: 2 shared cores)
    EXPECT_TRUE(shared_cores(*small_, result).empty()) << describe(result);
    jobs.push_back(job("c", 1, 8, 3));
    result = step(small_->all_cpus());  // 3 + 3 + 2: a and b give back one PU each; c has to take
    // those two half cores, since moving no more cpus than needed comes first.
    EXPECT_EQ(shared_cores(*small_, result).size(), 2u) << describe(result);
    jobs.erase(jobs.begin() + 2);
    result = step(small_->all_cpus());  // c leaves: a and b refill their own cores
    EXPECT_TRUE(shared_cores(*small_, result).empty()) << describe(result);
    EXPECT_TRUE(half_cores(*small_, small_->all_cpus(), result["a"]).empty()) << describe(result);

    // Random arrivals, departures and limits on two SMT topologies. Per generation, beside
    // minimal moves and the fixed point: a core newly shared by two jobs only when no free core
    // is left; an even job that held whole cores and grew holds whole cores while a free core is
    // left; a shrinking job gains no half core (one, when it gives back an odd number).
    for (const Topology *topology : {two_packages_.get(), interleaved_.get()}) {
        std::mt19937 rng(13);
        const CpuSet pool = topology->all_cpus();
        const int n = pool.count();
        std::vector<PolicyJob> live;
        uint64_t order = 1;
        // Limits up to half the node, so that some generations leave free cores.
        auto some_max = [&](int min) { return min + static_cast<int>(rng() % (n / 2)); };
        for (int round = 0; round < 1000; ++round) {
            const int action = static_cast<int>(rng() % 4);
            if (action == 0 && live.size() < 6) {
                const int min = 1 + static_cast<int>(rng() % 4);
                live.push_back(job("j" + std::to_string(order), min, some_max(min), order));
                ++order;
            } else if (action == 1 && !live.empty()) {
                live.erase(live.begin() + static_cast<long>(rng() % live.size()));
            } else if (action == 2 && !live.empty()) {
                PolicyJob &j = live[rng() % live.size()];
                j.max = some_max(j.min);
            }
            const PolicyKind kind = (round % 5 == 0) ? PolicyKind::Static : PolicyKind::Equal;
            auto after = placed(kind, *topology, pool, live);
            const std::string where = "round " + std::to_string(round) + ": " + describe(after);
            EXPECT_EQ(moves(live, after), move_lower_bound(live, after)) << where;
            const bool core_left = free_whole_core_left(*topology, pool, after);
            for (const CpuSet &core : cores_of(*topology)) {
                int holders = 0;
                bool new_here = false;
                for (const auto &j : live) {
                    if (!after[j.id].intersects(core)) continue;
                    ++holders;
                    new_here = new_here || !j.current.contains(after[j.id] & core);
                }
                if (holders >= 2 && new_here) {
                    EXPECT_FALSE(core_left)
                        << "core " << core.to_string() << " newly shared, " << where;
                }
            }
            for (const auto &j : live) {
                const CpuSet &now = after[j.id];
                const size_t halves_before = half_cores(*topology, pool, j.current).size();
                const size_t halves_after = half_cores(*topology, pool, now).size();
                if (now.count() > j.current.count() && now.count() % 2 == 0 && halves_before == 0 &&
                    core_left) {
                    EXPECT_EQ(halves_after, 0u) << j.id << " grew onto half cores, " << where;
                }
                if (now.count() < j.current.count()) {
                    const size_t odd = (j.current.count() - now.count()) % 2;
                    EXPECT_LE(halves_after, halves_before + odd) << j.id << " shrank, " << where;
                }
            }
            for (auto &j : live) j.current = after[j.id];
        }
    }
}
