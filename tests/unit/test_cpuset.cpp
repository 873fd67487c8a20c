// SPDX-License-Identifier: BSD-3-Clause
// Proves CpuSet parses cpu lists strictly, formats canonically, and does set algebra and masks.

#include <gtest/gtest.h>
#include <unistd.h>

#include "common/cpuset.hpp"
#include "common/cpuset_hwloc.hpp"
#include "support/watchdog.h"

using mall::CpuSet;
using mall::cpuset_from_hwloc;
using mall::to_hwloc;

namespace {

CpuSet parsed(const std::string &text) {
    std::string error;
    auto set = CpuSet::parse(text, &error);
    EXPECT_TRUE(set.has_value()) << text << ": " << error;
    return set.value_or(CpuSet());
}

MALL_TEST_WATCHDOG(60);

}  // namespace

TEST(CpuSetParse, RoundTripsCanonicalText) {
    for (const char *text : {"", "0", "3", "0-3", "0-3,8", "0,2,4", "1-2,4-5,1023", "0-1023"}) {
        EXPECT_EQ(parsed(text).to_string(), text);
    }
}

TEST(CpuSetParse, MergesIntoCanonicalForm) {
    EXPECT_EQ(parsed("3,1,2").to_string(), "1-3");
    EXPECT_EQ(parsed("0-2,3-5").to_string(), "0-5");
    EXPECT_EQ(parsed("5,0-3,2").to_string(), "0-3,5");
    EXPECT_EQ(parsed("7-7").to_string(), "7");
    EXPECT_EQ(parsed("1,1,1").to_string(), "1");
    EXPECT_EQ(parsed("10-12,0-11").to_string(), "0-12");
}

TEST(CpuSetParse, EmptyStringIsEmptySet) {
    CpuSet set = parsed("");
    EXPECT_TRUE(set.empty());
    EXPECT_EQ(set.count(), 0);
    EXPECT_EQ(set.first(), -1);
    EXPECT_EQ(set.last(), -1);
}

TEST(CpuSetParse, RejectsEveryBadInputClassWithAnExplanation) {
    const char *bad[] = {
        " 1",   "1 ",    "1, 2", "1 -2",  // spaces
        "1,,2", ",1",    "1,",   ",",     // empty items, trailing comma
        "3-1",                           // reversed range
        "2-",   "2-,3",                  // open range
        "-1",   "+1",    "1-+2", "1--2",  // signs
        "1024", "0-1024", "5000",         // beyond the limit
        "99999999999999999999999999999", "1-184467440737095516160",  // overflow
        "a",    "1a",    "0x1",  "1;2", "1.5", "1\n",  // junk
    };
    for (const char *text : bad) {
        std::string error;
        auto set = CpuSet::parse(text, &error);
        EXPECT_FALSE(set.has_value()) << "accepted \"" << text << "\"";
        EXPECT_NE(error.find("bad cpu list"), std::string::npos) << text << ": " << error;
        EXPECT_NE(error.find("\"0-3,8\""), std::string::npos) << "no hint for " << text;
    }
}

TEST(CpuSetParse, ErrorsNameTheProblem) {
    std::string error;
    EXPECT_FALSE(CpuSet::parse("3-1", &error).has_value());
    EXPECT_NE(error.find("reversed"), std::string::npos) << error;
    EXPECT_FALSE(CpuSet::parse("1024", &error).has_value());
    EXPECT_NE(error.find("too large"), std::string::npos) << error;
    EXPECT_FALSE(CpuSet::parse("1,,2", &error).has_value());
    EXPECT_NE(error.find("empty item"), std::string::npos) << error;
    EXPECT_FALSE(CpuSet::parse("1,", &error).has_value());
    EXPECT_NE(error.find("trailing comma"), std::string::npos) << error;
    EXPECT_FALSE(CpuSet::parse("2-", &error).has_value());
    EXPECT_NE(error.find("no end"), std::string::npos) << error;
    EXPECT_FALSE(CpuSet::parse("0x1", &error).has_value());
    EXPECT_NE(error.find("'x'"), std::string::npos) << error;
    EXPECT_FALSE(CpuSet::parse("1")->empty());
    EXPECT_FALSE(CpuSet::parse("bad").has_value());  // a null error pointer is fine
}

TEST(CpuSetParse, AcceptsTheLimits) {
    CpuSet set = parsed("1023");
    EXPECT_EQ(set.count(), 1);
    EXPECT_TRUE(set.contains(1023));
    EXPECT_EQ(set.first(), 1023);
    CpuSet all = parsed("0-1023");
    EXPECT_EQ(all.count(), 1024);
    EXPECT_EQ(all.last(), 1023);
    EXPECT_EQ(parsed("0001").to_string(), "1");  // leading zeros are still a number below 1024
}

TEST(CpuSetBuild, FromListRangeAndVector) {
    EXPECT_EQ(CpuSet::from_list({5, 1, 2, 3, -4, 1024, 2000}).to_string(), "1-3,5");
    EXPECT_EQ(CpuSet::range(2, 5).to_string(), "2-5");
    EXPECT_TRUE(CpuSet::range(5, 2).empty());
    EXPECT_EQ(CpuSet::range(1020, 5000).to_string(), "1020-1023");
    EXPECT_EQ(parsed("0-2,7").to_vector(), (std::vector<int>{0, 1, 2, 7}));
}

TEST(CpuSetAlgebra, UnionIntersectionDifference) {
    CpuSet a = parsed("0-7");
    CpuSet b = parsed("4-11");
    EXPECT_EQ((a | b).to_string(), "0-11");
    EXPECT_EQ((a & b).to_string(), "4-7");
    EXPECT_EQ((a - b).to_string(), "0-3");
    EXPECT_EQ((b - a).to_string(), "8-11");
    EXPECT_TRUE(a.intersects(b));
    EXPECT_FALSE(parsed("0-3").intersects(parsed("4-7")));
    EXPECT_TRUE(a.contains(parsed("1-3")));
    EXPECT_FALSE(a.contains(b));
    EXPECT_TRUE(a.contains(CpuSet()));
    EXPECT_TRUE(a.contains(7));
    EXPECT_FALSE(a.contains(8));
    EXPECT_FALSE(a.contains(-1));
    EXPECT_FALSE(a.contains(5000));

    CpuSet c = a;
    c |= b;
    EXPECT_EQ(c.to_string(), "0-11");
    c &= parsed("2-9");
    EXPECT_EQ(c.to_string(), "2-9");
    c -= parsed("5");
    EXPECT_EQ(c.to_string(), "2-4,6-9");
    c.add(5);
    c.remove(9);
    c.add(-3);      // ignored
    c.add(1024);    // ignored
    EXPECT_EQ(c.to_string(), "2-8");
    EXPECT_EQ(c.count(), 7);
    EXPECT_TRUE(c == parsed("2-8"));
    EXPECT_TRUE(c != parsed("2-9"));
    c.clear();
    EXPECT_TRUE(c.empty());
}

TEST(CpuSetValue, CopiesAndMovesAreIndependent) {
    CpuSet a = parsed("1-3");
    CpuSet b = a;
    b.add(9);
    EXPECT_EQ(a.to_string(), "1-3");
    CpuSet moved = std::move(b);
    EXPECT_EQ(moved.to_string(), "1-3,9");
    EXPECT_TRUE(b.empty());  // NOLINT: a moved-from set is empty and usable
    b.add(4);
    EXPECT_EQ(b.to_string(), "4");
    a = moved;
    EXPECT_EQ(a.to_string(), "1-3,9");
    a = std::move(b);
    EXPECT_EQ(a.to_string(), "4");
    a = a;  // self-assignment keeps the value
    EXPECT_EQ(a.to_string(), "4");
}

TEST(CpuSetMask, MaskRoundTripsAt1024Cpus) {
    uint64_t mask[MALL_MAX_CPUS / 64];
    CpuSet edges = parsed("0,63-64,127,512,1022-1023");
    edges.to_mask(mask);
    EXPECT_EQ(mask[0], (uint64_t{1} << 63) | 1u);
    EXPECT_EQ(mask[1], (uint64_t{1} << 63) | 1u);
    EXPECT_EQ(mask[8], 1u);
    EXPECT_EQ(mask[15], uint64_t{3} << 62);
    EXPECT_EQ(mask[2], 0u);
    EXPECT_EQ(CpuSet::from_mask(mask), edges);

    CpuSet all = CpuSet::range(0, 1023);
    all.to_mask(mask);
    for (uint64_t word : mask) EXPECT_EQ(word, ~uint64_t{0});
    EXPECT_EQ(CpuSet::from_mask(mask).to_string(), "0-1023");
}

TEST(CpuSetMask, CpuSetTAndHwlocBitmap) {
    CpuSet set = parsed("1,5,1023");
    cpu_set_t native = set.to_cpu_set();
    EXPECT_EQ(CPU_COUNT(&native), 3);
    EXPECT_TRUE(CPU_ISSET(1, &native));
    EXPECT_TRUE(CPU_ISSET(1023, &native));

    hwloc_bitmap_t bitmap = hwloc_bitmap_alloc();
    hwloc_bitmap_set_range(bitmap, 1020, 2000);
    hwloc_bitmap_set(bitmap, 3);
    EXPECT_EQ(cpuset_from_hwloc(bitmap).to_string(), "3,1020-1023");
    hwloc_bitmap_fill(bitmap);  // infinite: must come back finite
    EXPECT_EQ(cpuset_from_hwloc(bitmap).count(), 1024);
    hwloc_bitmap_free(bitmap);
    const auto back = to_hwloc(set);
    EXPECT_TRUE(hwloc_bitmap_isset(back.get(), 5));
    EXPECT_EQ(hwloc_bitmap_weight(back.get()), 3);
    EXPECT_EQ(cpuset_from_hwloc(back.get()), set);
}

TEST(CpuSetFormat, LargeSparseSetFitsTheTextLimit) {
    CpuSet every_other;
    for (int cpu = 0; cpu < 1024; cpu += 2) every_other.add(cpu);
    const std::string text = every_other.to_string();
    EXPECT_LT(text.size() + 1, static_cast<size_t>(MALL_CPULIST_MAX));
    EXPECT_EQ(parsed(text), every_other);
}
