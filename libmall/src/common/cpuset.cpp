// SPDX-License-Identifier: BSD-3-Clause
// cpuset.cpp — CpuSet over a fixed array of 64-bit words. Contract (cpuset.hpp): every set is finite and holds
// only cpus 0..kMaxCpus-1; parse() is strict and never throws; to_string() is canonical
// ("1-3,8": ascending, adjacent cpus merged into ranges, "" for the empty set).
#include "cpuset.hpp"

#include <algorithm>

namespace mall {

namespace {

constexpr uint64_t kAll = ~uint64_t{0};

// The bits of a word that lie in [first, last] (cpu numbers), for the word holding cpus
// word*64..word*64+63.
uint64_t word_bits(int word, int first, int last) {
    const int lo = std::max(first - word * 64, 0), hi = std::min(last - word * 64, 63);
    if (lo > hi) return 0;
    const uint64_t upto_hi = hi == 63 ? kAll : (uint64_t{1} << (hi + 1)) - 1;
    return upto_hi & (kAll << lo);
}

constexpr const char *kAcceptedForm =
    "expected cpu numbers and ranges separated by commas, like \"0-3,8\" (no spaces or signs), "
    "each below 1024";

bool fail(std::string *error, std::string_view text, const std::string &what) {
    if (error != nullptr) {
        *error = "bad cpu list \"" + std::string(text) + "\": " + what + "; " + kAcceptedForm;
    }
    return false;
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// Reads one cpu number at text[pos...]; advances pos. Rejects values >= kMaxCpus without
// overflowing however long the digit run is.
bool read_number(std::string_view text, size_t &pos, int &value, std::string *error) {
    if (pos >= text.size()) return fail(error, text, "a number is missing at the end");
    if (!is_digit(text[pos])) {
        std::string what = "unexpected '" + std::string(1, text[pos]) + "' at position " +
                           std::to_string(pos);
        return fail(error, text, what);
    }
    long long v = 0;
    size_t start = pos;
    while (pos < text.size() && is_digit(text[pos])) {
        if (v < CpuSet::kMaxCpus) v = v * 10 + (text[pos] - '0');
        ++pos;
    }
    if (v >= CpuSet::kMaxCpus) {
        return fail(error, text,
                    "cpu " + std::string(text.substr(start, pos - start)) + " is too large");
    }
    value = static_cast<int>(v);
    return true;
}

}  // namespace

std::optional<CpuSet> CpuSet::parse(std::string_view text, std::string *error) {
    CpuSet result;
    if (text.empty()) return result;
    size_t pos = 0;
    while (true) {
        if (pos < text.size() && text[pos] == ',') {
            fail(error, text, "empty item at position " + std::to_string(pos));
            return std::nullopt;
        }
        int first = 0;
        if (!read_number(text, pos, first, error)) return std::nullopt;
        int last = first;
        if (pos < text.size() && text[pos] == '-') {
            ++pos;
            if (pos >= text.size() || !is_digit(text[pos])) {
                fail(error, text,
                     "range starting at " + std::to_string(first) + " has no end (write \"" +
                         std::to_string(first) + "-N\")");
                return std::nullopt;
            }
            if (!read_number(text, pos, last, error)) return std::nullopt;
            if (last < first) {
                fail(error, text,
                     "range " + std::to_string(first) + "-" + std::to_string(last) +
                         " is reversed (write the smaller number first)");
                return std::nullopt;
            }
        }
        result |= range(first, last);
        if (pos == text.size()) break;
        if (text[pos] != ',') {
            fail(error, text,
                 "unexpected '" + std::string(1, text[pos]) + "' at position " +
                     std::to_string(pos));
            return std::nullopt;
        }
        ++pos;
        if (pos == text.size()) {
            fail(error, text, "trailing comma");
            return std::nullopt;
        }
    }
    return result;
}

CpuSet CpuSet::from_list(const std::vector<int> &cpus) {
    CpuSet result;
    for (int cpu : cpus) result.add(cpu);
    return result;
}

CpuSet CpuSet::range(int first, int last) {
    CpuSet result;
    if (first < 0) first = 0;
    if (last >= kMaxCpus) last = kMaxCpus - 1;
    if (last < first) return result;
    for (int word = first / 64; word <= last / 64; ++word) result.words_[word] = word_bits(word, first, last);
    return result;
}

CpuSet CpuSet::from_mask(const uint64_t mask[MALL_MAX_CPUS / 64]) {
    CpuSet result;
    for (int word = 0; word < kWords; ++word) result.words_[word] = mask[word];
    return result;
}

std::string CpuSet::to_string() const {
    std::string out;
    int cpu = first();
    while (cpu >= 0) {
        int end = cpu;
        while (contains(end + 1)) ++end;
        if (!out.empty()) out += ',';
        out += std::to_string(cpu);
        if (end > cpu) out += '-' + std::to_string(end);
        cpu = next_after(end);
    }
    return out;
}

std::vector<int> CpuSet::to_vector() const {
    std::vector<int> out;
    out.reserve(static_cast<size_t>(count()));
    for (int cpu = first(); cpu >= 0; cpu = next_after(cpu)) out.push_back(cpu);
    return out;
}

void CpuSet::to_mask(uint64_t mask[MALL_MAX_CPUS / 64]) const {
    for (int word = 0; word < kWords; ++word) mask[word] = words_[word];
}

cpu_set_t CpuSet::to_cpu_set() const {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int cpu = first(); cpu >= 0 && cpu < CPU_SETSIZE; cpu = next_after(cpu)) CPU_SET(cpu, &set);
    return set;
}

int CpuSet::count() const {
    int n = 0;
    for (uint64_t w : words_) n += __builtin_popcountll(w);
    return n;
}
bool CpuSet::empty() const {
    for (uint64_t w : words_)
        if (w != 0) return false;
    return true;
}
bool CpuSet::contains(int cpu) const {
    return cpu >= 0 && cpu < kMaxCpus && ((words_[cpu / 64] >> (cpu % 64)) & 1u) != 0;
}
bool CpuSet::contains(const CpuSet &other) const {
    for (int word = 0; word < kWords; ++word)
        if ((other.words_[word] & ~words_[word]) != 0) return false;
    return true;
}
bool CpuSet::intersects(const CpuSet &other) const {
    for (int word = 0; word < kWords; ++word)
        if ((words_[word] & other.words_[word]) != 0) return true;
    return false;
}
int CpuSet::first() const { return next_after(-1); }
int CpuSet::last() const {
    for (int word = kWords - 1; word >= 0; --word)
        if (words_[word] != 0) return word * 64 + 63 - __builtin_clzll(words_[word]);
    return -1;
}
int CpuSet::next_after(int cpu) const {
    int from = cpu + 1;
    if (from < 0) from = 0;
    for (int word = from / 64; word < kWords; ++word) {
        const uint64_t bits = word == from / 64 ? words_[word] & (kAll << (from % 64)) : words_[word];
        if (bits != 0) return word * 64 + __builtin_ctzll(bits);
    }
    return -1;
}

void CpuSet::add(int cpu) {
    if (cpu >= 0 && cpu < kMaxCpus) words_[cpu / 64] |= uint64_t{1} << (cpu % 64);
}
void CpuSet::remove(int cpu) {
    if (cpu >= 0 && cpu < kMaxCpus) words_[cpu / 64] &= ~(uint64_t{1} << (cpu % 64));
}
void CpuSet::clear() { words_.fill(0); }

CpuSet CpuSet::operator|(const CpuSet &o) const { return CpuSet(*this) |= o; }
CpuSet CpuSet::operator&(const CpuSet &o) const { return CpuSet(*this) &= o; }
CpuSet CpuSet::operator-(const CpuSet &o) const { return CpuSet(*this) -= o; }
CpuSet &CpuSet::operator|=(const CpuSet &o) {
    for (int word = 0; word < kWords; ++word) words_[word] |= o.words_[word];
    return *this;
}
CpuSet &CpuSet::operator&=(const CpuSet &o) {
    for (int word = 0; word < kWords; ++word) words_[word] &= o.words_[word];
    return *this;
}
CpuSet &CpuSet::operator-=(const CpuSet &o) {
    for (int word = 0; word < kWords; ++word) words_[word] &= ~o.words_[word];
    return *this;
}
bool CpuSet::operator==(const CpuSet &o) const { return words_ == o.words_; }

}  // namespace mall
