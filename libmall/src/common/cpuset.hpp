// SPDX-License-Identifier: BSD-3-Clause
// cpuset.hpp — CpuSet, a value type for a set of cpu numbers (0..MALL_MAX_CPUS-1), a fixed array of
// 64-bit words (no allocation, and no hwloc: libmall links none; cpuset_hwloc.hpp converts), with
// strict parsing and canonical formatting of the Linux list format ("0-3,8").
// Parsing never throws: it returns std::nullopt and fills a message that says what is wrong and
// what is accepted. Formatting always gives the canonical form (ascending, ranges merged).
#pragma once

#include <sched.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "mall/mall.h"

namespace mall {

class CpuSet {
public:
    static constexpr int kMaxCpus = MALL_MAX_CPUS;

    CpuSet() = default;  // empty
    CpuSet(const CpuSet &other) = default;
    CpuSet &operator=(const CpuSet &other) = default;
    // A moved-from set is empty (and usable), as it was when sets were hwloc bitmaps.
    CpuSet(CpuSet &&other) noexcept : words_(other.words_) { other.words_.fill(0); }
    CpuSet &operator=(CpuSet &&other) noexcept {
        if (this != &other) {
            words_ = other.words_;
            other.words_.fill(0);
        }
        return *this;
    }

    // Strict parse of "", "3", "0-3,8,10-11". Rejects spaces, signs, empty items ("1,,2"),
    // reversed ranges ("3-1"), open ranges ("2-"), numbers >= kMaxCpus, overflow, trailing junk.
    // An empty string is the empty set. On failure *error (if given) says what and why.
    static std::optional<CpuSet> parse(std::string_view text, std::string *error = nullptr);
    static CpuSet from_list(const std::vector<int> &cpus);  // ignores values outside 0..kMaxCpus-1
    static CpuSet range(int first, int last);               // [first, last], empty if last < first
    static CpuSet from_mask(const uint64_t mask[MALL_MAX_CPUS / 64]);

    std::string to_string() const;  // canonical list text, "" for empty
    std::vector<int> to_vector() const;  // ascending
    void to_mask(uint64_t mask[MALL_MAX_CPUS / 64]) const;
    cpu_set_t to_cpu_set() const;   // for sched_setaffinity (bits >= CPU_SETSIZE dropped)

    int count() const;
    bool empty() const;
    bool contains(int cpu) const;
    bool contains(const CpuSet &other) const;   // other is a subset of *this
    bool intersects(const CpuSet &other) const;
    int first() const;  // -1 when empty
    int last() const;   // -1 when empty
    int next_after(int cpu) const;  // the smallest member above cpu, -1 when none

    void add(int cpu);
    void remove(int cpu);
    void clear();

    CpuSet operator|(const CpuSet &o) const;
    CpuSet operator&(const CpuSet &o) const;
    CpuSet operator-(const CpuSet &o) const;  // set difference
    CpuSet &operator|=(const CpuSet &o);
    CpuSet &operator&=(const CpuSet &o);
    CpuSet &operator-=(const CpuSet &o);
    bool operator==(const CpuSet &o) const;
    bool operator!=(const CpuSet &o) const { return !(*this == o); }


private:
    static constexpr int kWords = kMaxCpus / 64;
    std::array<uint64_t, kWords> words_{};  // bit c % 64 of words_[c / 64] set when cpu c is in
};

}  // namespace mall
