// cpuset.cpp — CpuSet over an hwloc bitmap. Contract (cpuset.hpp): every set is finite and holds
// only cpus 0..kMaxCpus-1; parse() is strict and never throws; to_string() is canonical
// ("1-3,8": ascending, adjacent cpus merged into ranges, "" for the empty set).
#include "cpuset.hpp"

#include <cstring>
#include <new>
#include <utility>

namespace mall {

namespace {

hwloc_bitmap_t new_bitmap() {
    hwloc_bitmap_t bitmap = hwloc_bitmap_alloc();
    if (bitmap == nullptr) throw std::bad_alloc();
    return bitmap;
}

// Keeps only bits 0..kMaxCpus-1 (also turns an infinite bitmap into a finite one).
void clamp_to_limit(hwloc_bitmap_t bitmap) {
    hwloc_bitmap_clr_range(bitmap, CpuSet::kMaxCpus, -1);
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

CpuSet::CpuSet() : bitmap_(new_bitmap()) {}

CpuSet::CpuSet(const CpuSet &other) : bitmap_(hwloc_bitmap_dup(other.bitmap_)) {
    if (bitmap_ == nullptr) throw std::bad_alloc();
}

// A moved-from CpuSet keeps a valid (empty) bitmap so every operation on it stays safe.
CpuSet::CpuSet(CpuSet &&other) noexcept : bitmap_(hwloc_bitmap_alloc()) {
    if (bitmap_ != nullptr) std::swap(bitmap_, other.bitmap_);
}

CpuSet &CpuSet::operator=(const CpuSet &other) {
    if (this != &other) hwloc_bitmap_copy(bitmap_, other.bitmap_);
    return *this;
}

CpuSet &CpuSet::operator=(CpuSet &&other) noexcept {
    if (this != &other) {
        std::swap(bitmap_, other.bitmap_);
        hwloc_bitmap_zero(other.bitmap_);
    }
    return *this;
}

CpuSet::~CpuSet() { hwloc_bitmap_free(bitmap_); }

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
        hwloc_bitmap_set_range(result.bitmap_, first, last);
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
    if (last >= first) hwloc_bitmap_set_range(result.bitmap_, first, last);
    return result;
}

CpuSet CpuSet::from_hwloc(hwloc_const_bitmap_t bitmap) {
    CpuSet result;
    if (bitmap != nullptr) {
        hwloc_bitmap_copy(result.bitmap_, bitmap);
        clamp_to_limit(result.bitmap_);
    }
    return result;
}

CpuSet CpuSet::from_mask(const uint64_t mask[MALL_MAX_CPUS / 64]) {
    CpuSet result;
    for (int word = 0; word < kMaxCpus / 64; ++word) {
        for (int bit = 0; bit < 64; ++bit) {
            if ((mask[word] >> bit) & 1u) hwloc_bitmap_set(result.bitmap_, word * 64 + bit);
        }
    }
    return result;
}

std::string CpuSet::to_string() const {
    std::string out;
    int cpu = hwloc_bitmap_first(bitmap_);
    while (cpu >= 0) {
        int end = cpu;
        while (hwloc_bitmap_isset(bitmap_, end + 1)) ++end;
        if (!out.empty()) out += ',';
        out += std::to_string(cpu);
        if (end > cpu) out += '-' + std::to_string(end);
        cpu = hwloc_bitmap_next(bitmap_, end);
    }
    return out;
}

std::vector<int> CpuSet::to_vector() const {
    std::vector<int> out;
    int cpu;
    hwloc_bitmap_foreach_begin(cpu, bitmap_) { out.push_back(cpu); }
    hwloc_bitmap_foreach_end();
    return out;
}

void CpuSet::to_mask(uint64_t mask[MALL_MAX_CPUS / 64]) const {
    std::memset(mask, 0, sizeof(uint64_t) * (kMaxCpus / 64));
    int cpu;
    hwloc_bitmap_foreach_begin(cpu, bitmap_) {
        if (cpu < kMaxCpus) mask[cpu / 64] |= uint64_t{1} << (cpu % 64);
    }
    hwloc_bitmap_foreach_end();
}

cpu_set_t CpuSet::to_cpu_set() const {
    cpu_set_t set;
    CPU_ZERO(&set);
    int cpu;
    hwloc_bitmap_foreach_begin(cpu, bitmap_) {
        if (cpu < CPU_SETSIZE) CPU_SET(cpu, &set);
    }
    hwloc_bitmap_foreach_end();
    return set;
}

int CpuSet::count() const { return hwloc_bitmap_weight(bitmap_); }
bool CpuSet::empty() const { return hwloc_bitmap_iszero(bitmap_) != 0; }
bool CpuSet::contains(int cpu) const {
    return cpu >= 0 && cpu < kMaxCpus && hwloc_bitmap_isset(bitmap_, cpu) != 0;
}
bool CpuSet::contains(const CpuSet &other) const {
    return hwloc_bitmap_isincluded(other.bitmap_, bitmap_) != 0;
}
bool CpuSet::intersects(const CpuSet &other) const {
    return hwloc_bitmap_intersects(bitmap_, other.bitmap_) != 0;
}
int CpuSet::first() const { return hwloc_bitmap_first(bitmap_); }
int CpuSet::last() const { return hwloc_bitmap_last(bitmap_); }

void CpuSet::add(int cpu) {
    if (cpu >= 0 && cpu < kMaxCpus) hwloc_bitmap_set(bitmap_, cpu);
}
void CpuSet::remove(int cpu) {
    if (cpu >= 0 && cpu < kMaxCpus) hwloc_bitmap_clr(bitmap_, cpu);
}
void CpuSet::clear() { hwloc_bitmap_zero(bitmap_); }

CpuSet CpuSet::operator|(const CpuSet &o) const {
    CpuSet result;
    hwloc_bitmap_or(result.bitmap_, bitmap_, o.bitmap_);
    return result;
}
CpuSet CpuSet::operator&(const CpuSet &o) const {
    CpuSet result;
    hwloc_bitmap_and(result.bitmap_, bitmap_, o.bitmap_);
    return result;
}
CpuSet CpuSet::operator-(const CpuSet &o) const {
    CpuSet result;
    hwloc_bitmap_andnot(result.bitmap_, bitmap_, o.bitmap_);
    return result;
}
CpuSet &CpuSet::operator|=(const CpuSet &o) {
    hwloc_bitmap_or(bitmap_, bitmap_, o.bitmap_);
    return *this;
}
CpuSet &CpuSet::operator&=(const CpuSet &o) {
    hwloc_bitmap_and(bitmap_, bitmap_, o.bitmap_);
    return *this;
}
CpuSet &CpuSet::operator-=(const CpuSet &o) {
    hwloc_bitmap_andnot(bitmap_, bitmap_, o.bitmap_);
    return *this;
}
bool CpuSet::operator==(const CpuSet &o) const {
    return hwloc_bitmap_isequal(bitmap_, o.bitmap_) != 0;
}

}  // namespace mall
