// SPDX-License-Identifier: BSD-3-Clause
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

namespace {
std::string record_text(const std::string &seq, const std::string &end) {
    return "mall-signal 1\nseq " + seq + "\npid 42\nsignal 57\napi 0.3.0\nmode attached\njob train-1\nallowed 1\n"
           "bound 0-3\ncpus 0-1\nthreads 1\nreceived 3\nhandled 2\nlast a0000001\nfrom 77\nresult refused\n"
           "why 5 threads exceed the 2 cpus\nend " + end + "\n";
}
}  // namespace

TEST(SignalControl, TheRecordParsesWhenWholeAndIsRefusedWhenTorn) {
    auto r = sc::parse_record(record_text("9", "9") + std::string(100, '\0'));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->pid, 42);
    EXPECT_EQ(r->signal, 57);
    EXPECT_EQ(r->mode, "attached");
    EXPECT_EQ(r->job, "train-1");
    EXPECT_TRUE(r->allowed);
    EXPECT_EQ(r->bound, "0-3");
    EXPECT_EQ(r->cpus, "0-1");
    EXPECT_EQ(r->threads, 1);
    EXPECT_EQ(r->received, 3u);
    EXPECT_EQ(r->handled, 2u);
    EXPECT_EQ(r->last, 0xa0000001u);
    EXPECT_EQ(r->from, 77);
    EXPECT_EQ(r->result, "refused");
    EXPECT_EQ(r->why, "5 threads exceed the 2 cpus");
    EXPECT_FALSE(sc::parse_record(record_text("9", "8"))) << "a rewrite in the middle of the read";
    EXPECT_FALSE(sc::parse_record(record_text("9", "9").substr(0, 60))) << "cut short";
    EXPECT_FALSE(sc::parse_record("mall-signal 2\n" + record_text("9", "9").substr(14))) << "another format";
    EXPECT_FALSE(sc::parse_record(""));
    std::string bad = record_text("9", "9");
    bad.replace(bad.find("threads 1"), 9, "threads x");
    EXPECT_FALSE(sc::parse_record(bad)) << "a malformed number";
}
