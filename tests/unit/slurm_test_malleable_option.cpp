// Proves the `--malleable[=MIN[:MAX]]` parser accepts exactly the documented forms and rejects
// every bad input class (junk, reversed, zero, missing halves, signs, overflow, node and admin bounds)
// with words that say what is allowed.
#include <unistd.h>

#include <gtest/gtest.h>

#include "malleable_option.hpp"

using mall::slurm::MalleableLimits;
using mall::slurm::MalleableRequest;
using mall::slurm::parse_malleable;
using mall::slurm::resolve_max;

namespace {

const int kWatchdog = (alarm(60), 0);  // a hang fails the test instead of stalling CI

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
