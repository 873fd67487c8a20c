// Proves the 32-bit control value of `mallctl signal` (common/signal_control.hpp): every request
// round-trips, what does not fit is refused with the limit in words, and decoding refuses every
// value that is not one of ours (so a stray sigqueue to a process changes nothing).
#include "common/signal_control.hpp"

#include <gtest/gtest.h>

namespace sc = mall::signal_control;

TEST(SignalControl, ThreadsRoundTrip) {
    for (int threads : {0, 1, 2, 255, 1024}) {
        auto value = sc::encode_threads(threads, nullptr);
        ASSERT_TRUE(value) << threads;
        auto r = sc::decode(*value);
        ASSERT_TRUE(r) << threads;
        EXPECT_EQ(r->op, sc::Op::Threads);
        EXPECT_EQ(r->threads, threads);
    }
}

TEST(SignalControl, RangesRoundTrip) {
    struct Case { int threads, first, count; };
    for (Case c : {Case{0, 0, 1}, Case{1, 0, 2}, Case{2, 0, 2}, Case{255, 0, 1024}, Case{3, 1020, 4}}) {
        auto value = sc::encode_range(c.threads, c.first, c.count, nullptr);
        ASSERT_TRUE(value) << c.first << "+" << c.count;
        auto r = sc::decode(*value);
        ASSERT_TRUE(r);
        EXPECT_EQ(r->op, sc::Op::Range);
        EXPECT_EQ(r->threads, c.threads);
        EXPECT_EQ(r->first_cpu, c.first);
        EXPECT_EQ(r->cpu_count, c.count);
    }
}

TEST(SignalControl, WhatDoesNotFitIsRefusedWithTheLimit) {
    std::string why;
    EXPECT_FALSE(sc::encode_threads(1025, &why));
    EXPECT_NE(why.find("1 to 1024"), std::string::npos) << why;
    EXPECT_FALSE(sc::encode_threads(-1, &why));
    EXPECT_FALSE(sc::encode_range(256, 0, 1024, &why));
    EXPECT_NE(why.find("1 to 255"), std::string::npos) << why;
    EXPECT_FALSE(sc::encode_range(3, 0, 2, &why));
    EXPECT_NE(why.find("exceed the 2 cpus"), std::string::npos) << why;
    EXPECT_FALSE(sc::encode_range(0, 1020, 5, &why));
    EXPECT_NE(why.find("one range"), std::string::npos) << why;
    EXPECT_FALSE(sc::encode_range(0, 0, 0, &why));
}

TEST(SignalControl, ForeignValuesAreRefused) {
    EXPECT_FALSE(sc::decode(0));                       // no tag
    EXPECT_FALSE(sc::decode(0x12345678u));             // tag 00
    EXPECT_FALSE(sc::decode(0xC0000001u));             // tag 11
    EXPECT_FALSE(sc::decode(0x80000000u | (2u << 28)));  // reserved operation
    EXPECT_FALSE(sc::decode(0x80000000u | (3u << 28)));
    EXPECT_FALSE(sc::decode(0x80000000u | 1025u));     // threads above 1024
    EXPECT_FALSE(sc::decode(0x80000000u | (1u << 12) | 1u));  // unused bits set
    // A range past cpu 1023, or more threads than its cpus.
    EXPECT_FALSE(sc::decode(0x80000000u | (1u << 28) | (1023u << 10) | 1u));
    EXPECT_FALSE(sc::decode(0x80000000u | (1u << 28) | (3u << 20) | (0u << 10) | 1u));
}
