// SPDX-License-Identifier: BSD-3-Clause
// Proves that the OpenMP adapter makes an OpenMP program follow its allocation under a real malld
// (cgroup-v1 and affinity backends): after each forced change the OpenMP thread count and team
// size equal the allocation's size, the team was pinned before the ack, every thread of the process
// is allowed exactly the allocation, the job settles, and the program ends cleanly; without malld
// it runs, not malleable, with a warning. The sequence itself is in support/probe_under_malld.hpp.
#include <cstdlib>

#include <gtest/gtest.h>

#include "support/probe_under_malld.hpp"

MALL_TEST_WATCHDOG(280);

namespace mall::test {
namespace {

void expect_openmp_follows(const ProbeFields &f, const std::string &, int ncpus, const std::string &context) {
    EXPECT_EQ(probe_field(f, "threads"), std::to_string(ncpus)) << "omp_get_max_threads()\n" << context;
    EXPECT_EQ(probe_field(f, "team"), std::to_string(ncpus)) << "omp_get_num_threads() in the next region\n"
                                                             << context;
    EXPECT_GE(std::atoi(probe_field(f, "pinned").c_str()), ncpus) << "threads the adapter pinned\n" << context;
}

class OpenMPAdapterUnderMalld : public ::testing::TestWithParam<std::string> {};

TEST_P(OpenMPAdapterUnderMalld, ThreadCountAndPinningFollowTheAllocation) {
    MALL_REQUIRE_ROOT_AND_CPUSET();
    run_probe_through_allocations(GetParam(), "mall_omp_probe", "omp", expect_openmp_follows);
}

INSTANTIATE_TEST_SUITE_P(Backends, OpenMPAdapterUnderMalld, ::testing::Values("cgroup-v1", "affinity"),
                         backend_test_name);

TEST(OpenMPAdapterWithoutMalld, RunsNotMalleableWithAWarning) { run_probe_without_malld("mall_omp_probe"); }

}  // namespace
}  // namespace mall::test
