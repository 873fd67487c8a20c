// SPDX-License-Identifier: BSD-3-Clause
// Proves the one MIN[:MAX] parser (common/core_range.hpp) that mallrun --malleable, the OCI hook's
// io.mall.malleable and the Slurm option share: it accepts exactly digits-only MIN or MIN:MAX with
// 1 <= MIN <= MAX <= the bound, and names each fault (syntax, MIN 0, MAX below MIN) in words; and
// that mallrun and the hook, run as built, still say what they said before they shared it.
#include <unistd.h>

#include <gtest/gtest.h>

#include <string>
#include <tuple>

#include "common/core_range.hpp"
#include "support/malld_fixture.hpp"
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

// The three callers keep their own sentences around the shared parser's verdict: mallrun and the
// OCI hook name only MAX below MIN (a 0 is a bad count to them); the Slurm option passes the
// parser's words on (slurm_test_malleable_option and system.slurm_malleable pin those).
namespace {

const std::string kBinDir = MALL_BIN_DIR;

// mallrun --malleable=VALUE -- true: its first stderr line (it stops before connecting).
std::string mallrun_words(const std::string &value) {
    auto r = mall::test::run_command({kBinDir + "/mallrun", "--socket", "/nonexistent/mall.sock",
                                      "--malleable=" + value, "--", "true"});
    EXPECT_EQ(r.exit_code, 2) << value << ": " << r.err;
    return r.err.substr(0, r.err.find('\n'));
}

// mall-oci-hook createRuntime for a container annotated io.mall.malleable=VALUE: its words.
std::string hook_words(const std::string &value) {
    const std::string state = "{\"ociVersion\":\"1.0.2\",\"id\":\"abc\",\"status\":\"created\",\"pid\":1,"
                              "\"bundle\":\"/nonexistent\",\"annotations\":{\"io.mall.malleable\":\"" + value + "\"}}";
    auto r = mall::test::run_command({"/bin/sh", "-c", "printf '%s' \"$0\" | \"$1\" --socket /nonexistent/mall.sock createRuntime",
                                      state, kBinDir + "/mall-oci-hook"});
    EXPECT_EQ(r.exit_code, 2) << value << ": " << r.err;
    return r.err.substr(0, r.err.find('\n'));
}

}  // namespace

TEST(CoreRangeCallers, MallrunKeepsItsWords) {
    const std::string rule = "--malleable takes MIN or MIN:MAX, whole numbers of cores >= 1 with MIN <= MAX "
                             "(e.g. --malleable=1:4, or --malleable=2 to grow up to the whole pool)";
    EXPECT_EQ(mallrun_words("3:1"), "mallrun: bad --malleable value '3:1': MIN (3) is larger than MAX (1); " + rule);
    for (const char *bad : {"0", "0:2", "2:0", "1:", ":1", "1:2:3", "x", "1000000", "-1"})
        EXPECT_EQ(mallrun_words(bad), "mallrun: bad --malleable value '" + std::string(bad) + "': " + rule);
}

TEST(CoreRangeCallers, OciHookKeepsItsWords) {
    const std::string rule = "use MIN or MIN:MAX, whole numbers of cores >= 1 with MIN <= MAX (MIN alone: up "
                             "to the whole pool)";
    EXPECT_EQ(hook_words("3:1"), "mall-oci-hook: bad annotation io.mall.malleable='3:1': MIN (3) is larger than "
                                 "MAX (1); " + rule + "; fix the container's annotation, e.g. "
                                 "--annotation io.mall.malleable=1:3");
    for (const char *bad : {"0", "0:2", "2:0", "1:", "1:2:3", "x", "1000000"})
        EXPECT_EQ(hook_words(bad), "mall-oci-hook: bad annotation io.mall.malleable='" + std::string(bad) + "': " +
                                       rule + "; fix the container's annotation, e.g. --annotation "
                                       "io.mall.malleable=1:4");
}
