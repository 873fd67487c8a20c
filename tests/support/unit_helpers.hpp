// SPDX-License-Identifier: BSD-3-Clause
// unit_helpers.hpp — small helpers the pure unit tests share: cpu-list literals that fail the test
// when mistyped. (The watchdog every test arms is support/watchdog.h.)
#pragma once

#include <string>

#include <gtest/gtest.h>

#include "common/cpuset.hpp"

namespace mall::test {

// "0-3,8" -> CpuSet; a bad literal is a test failure (and gives the empty set).
inline CpuSet cpus(const std::string &text) {
    auto set = CpuSet::parse(text);
    EXPECT_TRUE(set.has_value()) << text;
    return set.value_or(CpuSet());
}

}  // namespace mall::test
