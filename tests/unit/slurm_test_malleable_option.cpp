// SPDX-License-Identifier: BSD-3-Clause
// Proves the `--malleable[=MIN[:MAX]][,weight=W]` parser accepts exactly the documented forms and
// rejects every bad input class (junk, reversed, zero, missing halves, signs, overflow, node and admin
// bounds, bad or repeated weights, unknown keys, empty items) with words that say what is allowed.
#include <unistd.h>

#include <gtest/gtest.h>

#include "malleable_option.hpp"
#include "../support/watchdog.h"

using mall::slurm::MalleableLimits;
using mall::slurm::MalleableRequest;
using mall::slurm::parse_malleable;
using mall::slurm::resolve_max;

namespace {

MALL_TEST_WATCHDOG(60);  // a hang fails the test instead of stalling CI

MalleableLimits node(unsigned cpus, unsigned admin_min = 0, unsigned admin_max = 0) {
    MalleableLimits l;
    l.node_cpus = cpus;
    l.admin_min = admin_min;
    l.admin_max = admin_max;
    return l;
}

// Expects a rejection and returns its text.
std::string rejected(const char *value, const MalleableLimits &limits) {
    std::string error;
    auto r = parse_malleable(value, limits, &error);
    EXPECT_FALSE(r.has_value()) << "accepted \"" << (value ? value : "(bare)") << "\"";
    EXPECT_NE(error.find("allowed: --malleable"), std::string::npos) << error;
    EXPECT_NE(error.find(",weight=W"), std::string::npos) << error;
    return error;
}

}  // namespace

TEST(MalleableOption, BareOptionMeansOneToNodeCores) {
    std::string error;
    auto r = parse_malleable(nullptr, node(8), &error);
    ASSERT_TRUE(r) << error;
    EXPECT_EQ(*r, (MalleableRequest{1, 0}));
    EXPECT_EQ(resolve_max(*r, node(8)), 8u);
}

TEST(MalleableOption, SingleNumberIsMin) {
    auto r = parse_malleable("3", node(8), nullptr);
    ASSERT_TRUE(r);
    EXPECT_EQ(*r, (MalleableRequest{3, 0}));
    EXPECT_EQ(resolve_max(*r, node(8)), 8u);
}

TEST(MalleableOption, MinMax) {
    auto r = parse_malleable("1:2", node(2), nullptr);
    ASSERT_TRUE(r);
    EXPECT_EQ(*r, (MalleableRequest{1, 2}));
    EXPECT_EQ(resolve_max(*r, node(2)), 2u);
    auto same = parse_malleable("2:2", node(2), nullptr);
    ASSERT_TRUE(same);
    EXPECT_EQ(*same, (MalleableRequest{2, 2}));
}

TEST(MalleableOption, UnknownNodeAcceptsLargeValuesUntilTheNodeIsKnown) {
    auto r = parse_malleable("1:64", node(0), nullptr);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->max, 64u);
    EXPECT_EQ(resolve_max(MalleableRequest{1, 0}, node(0)), 0u);  // still unknown
}

TEST(MalleableOption, RejectsJunk) {
    for (const char *v : {"x", "1x", "x:2", "1:y", "1.5", "1,2", " 1", "1 ", "1-2", "0x2", "one"})
        rejected(v, node(8));
    EXPECT_NE(rejected("x", node(8)).find("not a whole number"), std::string::npos);
}

TEST(MalleableOption, RejectsEmptyValue) {
    EXPECT_NE(rejected("", node(8)).find("empty"), std::string::npos);
}

TEST(MalleableOption, RejectsReversedRange) {
    EXPECT_NE(rejected("3:1", node(8)).find("below MIN"), std::string::npos);
}

TEST(MalleableOption, RejectsZero) {
    EXPECT_NE(rejected("0:2", node(8)).find("at least 1"), std::string::npos);
    rejected("0", node(8));
    rejected("0:0", node(8));
    rejected("1:0", node(8));
}

TEST(MalleableOption, RejectsMissingHalves) {
    EXPECT_NE(rejected("1:", node(8)).find("MAX is missing"), std::string::npos);
    EXPECT_NE(rejected(":2", node(8)).find("MIN is missing"), std::string::npos);
    rejected(":", node(8));
    EXPECT_NE(rejected("1:2:3", node(8)).find("more than one ':'"), std::string::npos);
}

TEST(MalleableOption, RejectsSigns) {
    for (const char *v : {"-1", "+1", "1:-2", "-1:2", "1:+2"}) rejected(v, node(8));
}

TEST(MalleableOption, RejectsOverflow) {
    EXPECT_NE(rejected("99999999999999999999999", node(0)).find("too large"), std::string::npos);
    rejected("1:4294967297", node(0));
    rejected("65537", node(0));
}

TEST(MalleableOption, RejectsValuesAboveTheNode) {
    std::string e = rejected("1:3", node(2));
    EXPECT_NE(e.find("above this node's 2 cores"), std::string::npos) << e;
    EXPECT_NE(e.find("MIN <= MAX <= 2"), std::string::npos) << e;
    rejected("3", node(2));
}

TEST(MalleableOption, RejectsValuesOutsideAdminBounds) {
    std::string e = rejected("1:6", node(8, 0, 4));
    EXPECT_NE(e.find("max_cpus (4)"), std::string::npos) << e;
    e = rejected("1:4", node(8, 2, 4));
    EXPECT_NE(e.find("below the administrator's min_cpus (2)"), std::string::npos) << e;
    EXPECT_NE(e.find("2 <= MIN"), std::string::npos) << e;
    rejected("5", node(0, 0, 4));  // admin bound checked even where the node is unknown
}

TEST(MalleableOption, AdminBoundsShapeTheDefaults) {
    auto r = parse_malleable(nullptr, node(8, 2, 4), nullptr);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->min, 2u);
    EXPECT_EQ(resolve_max(*r, node(8, 2, 4)), 4u);
    EXPECT_FALSE(parse_malleable(nullptr, node(2, 4, 0), nullptr));  // admin min above the node
}

TEST(MalleableOption, ErrorNamesTheValue) {
    std::string e = rejected("3:1", node(8));
    EXPECT_EQ(e.rfind("--malleable=3:1: ", 0), 0u) << e;
}

// At submission the bound is the cluster's largest node, and the words say so.
TEST(MalleableOption, SubmissionChecksTheLargestNode) {
    mall::slurm::MalleableLimits limits;
    limits.node_cpus = 2;
    limits.largest_node = true;
    std::string error;
    EXPECT_FALSE(mall::slurm::parse_malleable("1:3", limits, &error));
    EXPECT_NE(error.find("MAX (3) is above the largest node's 2 cores"), std::string::npos) << error;
    EXPECT_TRUE(mall::slurm::parse_malleable("1:2", limits, &error).has_value()) << error;
}

TEST(MalleableOption, BareAndOldFormsHaveWeightOne) {
    for (const char *v : {static_cast<const char *>(nullptr), "3", "1:2"}) {
        auto r = parse_malleable(v, node(8), nullptr);
        ASSERT_TRUE(r) << (v ? v : "(bare)");
        EXPECT_EQ(r->weight, 1.0) << (v ? v : "(bare)");
    }
    EXPECT_EQ((MalleableRequest{1, 0}).weight, 1.0);
}

TEST(MalleableOption, CoresWithWeight) {
    struct Case {
        const char *value;
        MalleableRequest want;
    };
    for (const Case &c : {Case{"2:8,weight=3", {2, 8, 3.0}}, Case{"1,weight=0.5", {1, 0, 0.5}},
                          Case{"1:2,weight=2.5", {1, 2, 2.5}}, Case{"1:2,weight=1000000", {1, 2, 1e6}},
                          Case{"1:2,weight=1000000.0", {1, 2, 1e6}}, Case{"4,weight=007", {4, 0, 7.0}},
                          Case{"1:2,weight=0.001", {1, 2, 0.001}}}) {
        std::string error;
        auto r = parse_malleable(c.value, node(8), &error);
        ASSERT_TRUE(r) << c.value << ": " << error;
        EXPECT_EQ(*r, c.want) << c.value;
    }
}

TEST(MalleableOption, WeightAloneKeepsTheDefaultCores) {
    auto r = parse_malleable("weight=2", node(8), nullptr);
    ASSERT_TRUE(r);
    EXPECT_EQ(*r, (MalleableRequest{1, 0, 2.0}));
    auto admin = parse_malleable("weight=0.5", node(8, 2, 4), nullptr);
    ASSERT_TRUE(admin);
    EXPECT_EQ(*admin, (MalleableRequest{2, 0, 0.5}));
    EXPECT_EQ(resolve_max(*admin, node(8, 2, 4)), 4u);
    // Like the bare option: an admin min above the node is refused.
    EXPECT_NE(rejected("weight=2", node(2, 4, 0)).find("min_cpus (4) is above"), std::string::npos);
}

TEST(MalleableOption, CoreChecksStillApplyWithWeight) {
    EXPECT_NE(rejected("3:1,weight=2", node(8)).find("below MIN"), std::string::npos);
    EXPECT_NE(rejected("1:3,weight=2", node(2)).find("above this node's 2 cores"), std::string::npos);
    EXPECT_NE(rejected("x,weight=2", node(8)).find("not a whole number"), std::string::npos);
}

TEST(MalleableOption, RejectsEmptyWeight) {
    EXPECT_NE(rejected("2:4,weight=", node(8)).find("weight is empty"), std::string::npos);
    EXPECT_NE(rejected("weight=", node(8)).find("weight is empty"), std::string::npos);
    EXPECT_NE(rejected("2:4,weight", node(8)).find("weight has no value"), std::string::npos);
}

TEST(MalleableOption, RejectsWeightsThatAreNotPlainDecimals) {
    for (const char *w : {"abc", "0x10", "nan", "NaN", "inf", "infinity", "2x", "2.5.1", "1e3", "1E3", "-1",
                          "+1", ".5", "5.", " 2", "2 ", "1,5", "2;"}) {
        std::string value = std::string("2:4,weight=") + w;
        std::string e = rejected(value.c_str(), node(8));
        if (std::string(w) == "1,5") {  // the ',' splits items: "5" is a stray item
            EXPECT_NE(e.find("\"5\" after ','"), std::string::npos) << e;
            continue;
        }
        EXPECT_NE(e.find("weight \"" + std::string(w) + "\" is not a plain decimal number"), std::string::npos) << e;
    }
}

TEST(MalleableOption, RejectsWeightOutOfRange) {
    EXPECT_NE(rejected("2:4,weight=0", node(8)).find("weight \"0\" must be above 0"), std::string::npos);
    EXPECT_NE(rejected("2:4,weight=0.000", node(8)).find("must be above 0"), std::string::npos);
    EXPECT_NE(rejected("2:4,weight=1000000.5", node(8)).find("weight \"1000000.5\" is above 1000000"),
              std::string::npos);
    EXPECT_NE(rejected("2:4,weight=2000000", node(8)).find("is above 1000000"), std::string::npos);
    EXPECT_NE(rejected("2:4,weight=99999999999999999999999999", node(8)).find("is above 1000000"),
              std::string::npos);
    std::string tiny = "2:4,weight=0." + std::string(400, '0') + "1";
    EXPECT_NE(rejected(tiny.c_str(), node(8)).find("too close to 0"), std::string::npos);
}

TEST(MalleableOption, RejectsRepeatedWeight) {
    EXPECT_NE(rejected("2:4,weight=2,weight=3", node(8)).find("weight is given more than once"), std::string::npos);
    EXPECT_NE(rejected("weight=2,weight=2", node(8)).find("more than once"), std::string::npos);
}

TEST(MalleableOption, RejectsUnknownKeys) {
    std::string e = rejected("2:4,wieght=2", node(8));
    EXPECT_NE(e.find("unknown key \"wieght\""), std::string::npos) << e;
    EXPECT_NE(e.find("the only key is weight="), std::string::npos) << e;
    EXPECT_NE(rejected("2:4,Weight=2", node(8)).find("unknown key \"Weight\""), std::string::npos);
    EXPECT_NE(rejected("min=2", node(8)).find("unknown key \"min\""), std::string::npos);
    EXPECT_NE(rejected("2:4,=2", node(8)).find("unknown key \"\""), std::string::npos);
    EXPECT_NE(rejected("2:4,fast", node(8)).find("\"fast\" after ',' is not key=value"), std::string::npos);
}

TEST(MalleableOption, RejectsEmptyItems) {
    EXPECT_NE(rejected("2:4,", node(8)).find("item 2 is empty"), std::string::npos);
    EXPECT_NE(rejected(",weight=2", node(8)).find("item 1 is empty"), std::string::npos);
    EXPECT_NE(rejected("2:4,,weight=2", node(8)).find("item 2 is empty"), std::string::npos);
    EXPECT_NE(rejected(",", node(8)).find("is empty"), std::string::npos);
}

TEST(MalleableOption, CoresComeFirst) {
    EXPECT_NE(rejected("weight=2,2:4", node(8)).find("the cores MIN[:MAX] come first"), std::string::npos);
    EXPECT_NE(rejected("1,2", node(8)).find("\"2\" after ','"), std::string::npos);
}

TEST(MalleableOption, WeightErrorNamesTheValue) {
    std::string e = rejected("2:4,weight=0", node(8));
    EXPECT_EQ(e.rfind("--malleable=2:4,weight=0: ", 0), 0u) << e;
}
