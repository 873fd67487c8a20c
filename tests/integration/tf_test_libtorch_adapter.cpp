// SPDX-License-Identifier: BSD-3-Clause
// Proves that the libtorch adapter makes a libtorch program follow its allocation under a real
// malld (cgroup-v1 and affinity backends): after each forced change at::get_num_threads(), OpenMP's
// count and the threads an at::parallel_for uses equal the allocation's size, they were pinned
// before the ack, every thread of the process is allowed exactly the allocation, the job settles,
// and the program ends cleanly; without malld it runs, not malleable, with a warning. The sequence
// itself is in support/probe_under_malld.hpp.
#include <gtest/gtest.h>

#include "support/probe_under_malld.hpp"

MALL_TEST_WATCHDOG(280);

namespace mall::test {
namespace {

void expect_libtorch_follows(const ProbeFields &f, const std::string &, int ncpus, const std::string &context) {
    EXPECT_EQ(probe_field(f, "threads"), std::to_string(ncpus)) << "at::get_num_threads()\n" << context;
    EXPECT_EQ(probe_field(f, "omp"), std::to_string(ncpus)) << "omp_get_max_threads()\n" << context;
    EXPECT_EQ(probe_field(f, "team"), std::to_string(ncpus)) << "threads of the next at::parallel_for\n"
                                                             << context;
    EXPECT_EQ(probe_field(f, "matched"), "yes") << "the adapter's own check\n" << context;
}

class LibtorchAdapterUnderMalld : public ::testing::TestWithParam<std::string> {};

TEST_P(LibtorchAdapterUnderMalld, ThreadCountAndPinningFollowTheAllocation) {
    MALL_REQUIRE_ROOT_AND_CPUSET();
    run_probe_through_allocations(GetParam(), "mall_torch_probe", "torch", expect_libtorch_follows);
}

INSTANTIATE_TEST_SUITE_P(Backends, LibtorchAdapterUnderMalld, ::testing::Values("cgroup-v1", "affinity"),
                         backend_test_name);

TEST(LibtorchAdapterWithoutMalld, RunsNotMalleableWithAWarning) { run_probe_without_malld("mall_torch_probe"); }

}  // namespace
}  // namespace mall::test
