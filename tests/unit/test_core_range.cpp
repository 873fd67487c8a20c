// SPDX-License-Identifier: BSD-3-Clause
// Proves the one MIN[:MAX] parser (common/core_range.hpp) that mallrun --malleable, the OCI hook's
// io.mall.malleable and the Slurm option share: it accepts exactly digits-only MIN or MIN:MAX with
// 1 <= MIN <= MAX <= the bound, and names each fault (syntax, MIN 0, MAX below MIN) in words.
#include <unistd.h>

#include <gtest/gtest.h>

#include <string>
#include <tuple>

#include "common/core_range.hpp"
#include "support/watchdog.h"

using mall::CoreRangeFault;
using mall::parse_core_range;

namespace {

MALL_TEST_WATCHDOG(60);  // a hang fails the test instead of stalling CI

// Expects a fault of this kind and returns its words.
std::string fault_words(const std::string &text, CoreRangeFault fault, unsigned largest = 1000) {
    const auto parsed = parse_core_range(text, largest);
    EXPECT_FALSE(parsed.ok()) << "accepted \"" << text << "\"";
    EXPECT_EQ(parsed.fault, fault) << "\"" << text << "\": " << parsed.why;
    EXPECT_FALSE(parsed.why.empty()) << text;
    return parsed.why;
}

}  // namespace

TEST(CoreRange, MinAloneLeavesMaxOpen) {
    const auto parsed = parse_core_range("3", 1000);
    ASSERT_TRUE(parsed.ok()) << parsed.why;
    EXPECT_EQ(parsed.range.min, 3u);
    EXPECT_FALSE(parsed.range.max.has_value());
    EXPECT_TRUE(parsed.why.empty());
}

TEST(CoreRange, MinAndMax) {
    for (const auto &[text, min, max] : {std::tuple{"1:4", 1u, 4u}, {"2:2", 2u, 2u}, {"007:010", 7u, 10u},
                                         {"1:1000", 1u, 1000u}, {"1000:1000", 1000u, 1000u}}) {
        const auto parsed = parse_core_range(text, 1000);
        ASSERT_TRUE(parsed.ok()) << text << ": " << parsed.why;
        EXPECT_EQ(parsed.range.min, min) << text;
        ASSERT_TRUE(parsed.range.max.has_value()) << text;
        EXPECT_EQ(*parsed.range.max, max) << text;
    }
}

TEST(CoreRange, OnlyPlainDigits) {
    for (const char *text : {"a", "1x", "+1", "-1", " 1", "1 ", "0x4", "1e3", "1.0", "1:+2", "1:2 ", "1:x", "１"}) {
        const std::string why = fault_words(text, CoreRangeFault::syntax);
        EXPECT_NE(why.find("is not a whole number of cores"), std::string::npos) << text << ": " << why;
    }
    EXPECT_EQ(fault_words("x:2", CoreRangeFault::syntax), "MIN \"x\" is not a whole number of cores");
    EXPECT_EQ(fault_words("2:x", CoreRangeFault::syntax), "MAX \"x\" is not a whole number of cores");
}

TEST(CoreRange, MissingHalves) {
    EXPECT_EQ(fault_words("", CoreRangeFault::syntax), "MIN is missing");
    EXPECT_EQ(fault_words(":4", CoreRangeFault::syntax), "MIN is missing");
    EXPECT_EQ(fault_words("4:", CoreRangeFault::syntax), "MAX is missing");
    EXPECT_EQ(fault_words(":", CoreRangeFault::syntax), "MIN is missing");
}

TEST(CoreRange, OneColonAtMost) {
    for (const char *text : {"1:2:3", "1::2", "::", "a:b:c"})
        EXPECT_EQ(fault_words(text, CoreRangeFault::syntax), "there is more than one ':' (write MIN:MAX)") << text;
}

TEST(CoreRange, BoundIsTheCallers) {
    EXPECT_TRUE(parse_core_range("65536", 65536).ok());
    EXPECT_EQ(fault_words("65537", CoreRangeFault::syntax, 65536), "MIN \"65537\" is too large (at most 65536)");
    EXPECT_EQ(fault_words("1:65537", CoreRangeFault::syntax, 65536), "MAX \"65537\" is too large (at most 65536)");
    EXPECT_TRUE(parse_core_range("1:999999", mall::kMaxCoreCount).ok());
    fault_words("1000000", CoreRangeFault::syntax, mall::kMaxCoreCount);
    // Far more digits than any integer holds: still a clean "too large", never a wrapped value.
    const std::string huge(400, '9');
    EXPECT_NE(fault_words(huge, CoreRangeFault::syntax, mall::kMaxCoreCount).find("is too large"), std::string::npos);
    EXPECT_NE(fault_words("18446744073709551617", CoreRangeFault::syntax, mall::kMaxCoreCount).find("is too large"),
              std::string::npos);
}

TEST(CoreRange, MinIsAtLeastOne) {
    EXPECT_EQ(fault_words("0", CoreRangeFault::min_zero), "MIN must be at least 1 (a job always keeps one core)");
    EXPECT_EQ(fault_words("0:4", CoreRangeFault::min_zero), "MIN must be at least 1 (a job always keeps one core)");
    EXPECT_EQ(fault_words("0:0", CoreRangeFault::min_zero), "MIN must be at least 1 (a job always keeps one core)");
    EXPECT_EQ(parse_core_range("000", 1000).fault, CoreRangeFault::min_zero);
}

TEST(CoreRange, MaxIsAtLeastMinAndBothAreKept) {
    const auto parsed = parse_core_range("4:2", 1000);
    EXPECT_EQ(parsed.fault, CoreRangeFault::max_below_min);
    EXPECT_EQ(parsed.why, "MAX (2) is below MIN (4)");
    EXPECT_EQ(parsed.range.min, 4u);  // the callers' own words name both
    ASSERT_TRUE(parsed.range.max.has_value());
    EXPECT_EQ(*parsed.range.max, 2u);
    // MAX 0 is "below MIN" too (mallrun and the hook call it a bad count, the Slurm option this).
    const auto zero = parse_core_range("2:0", 1000);
    EXPECT_EQ(zero.fault, CoreRangeFault::max_below_min);
    EXPECT_EQ(*zero.range.max, 0u);
}

TEST(CoreRange, TheRuleSaysWhatIsAllowed) {
    const std::string rule = mall::kCoreRangeRule;
    EXPECT_NE(rule.find("MIN or MIN:MAX"), std::string::npos);
    EXPECT_NE(rule.find("MIN <= MAX"), std::string::npos);
}
