// unit_helpers.hpp — small helpers the pure unit tests share: a watchdog that fails a hung test
// program instead of stalling CI, and cpu-list literals that fail the test when mistyped.
#pragma once

#include <unistd.h>

#include <string>

#include <gtest/gtest.h>

#include "common/cpuset.hpp"

namespace mall::test {

// Arms alarm(seconds) before the first test: a hang kills the program with SIGALRM.
inline void arm_unit_watchdog(unsigned seconds) {
    struct Watchdog : ::testing::Environment {
        explicit Watchdog(unsigned s) : seconds(s) {}
        void SetUp() override { ::alarm(seconds); }
        unsigned seconds;
    };
    ::testing::AddGlobalTestEnvironment(new Watchdog(seconds));
}

// "0-3,8" -> CpuSet; a bad literal is a test failure (and gives the empty set).
inline CpuSet cpus(const std::string &text) {
    auto set = CpuSet::parse(text);
    EXPECT_TRUE(set.has_value()) << text;
    return set.value_or(CpuSet());
}

}  // namespace mall::test
