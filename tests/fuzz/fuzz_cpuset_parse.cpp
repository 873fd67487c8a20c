// SPDX-License-Identifier: BSD-3-Clause
// fuzz_cpuset_parse.cpp — libFuzzer target for CpuSet::parse(), the reader of every cpu list malld
// takes from a client, a state file, cgroup files or the command line. Input: the list text.
// Checked besides "no crash, leak or sanitizer report": parse() accepts exactly what a separate
// reading of the grammar in cpuset.hpp accepts, with the same cpus; refusals have words; the
// canonical text is what that reading prints, re-parses to the same set and is a fixed point;
// count/first/last/contains, the mask and cpu_set_t forms and the set algebra agree with the set.
#include <bitset>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/cpuset.hpp"
#include "common/cpuset_hwloc.hpp"
#include "fuzz_check.hpp"

namespace {

using mall::CpuSet;
using mall::cpuset_from_hwloc;
using mall::to_hwloc;
using mall::fuzz::shown;
using Model = std::bitset<CpuSet::kMaxCpus>;

// The grammar as cpuset.hpp states it: "" is empty; otherwise items separated by single commas,
// each N or N-M with decimal digits only (leading zeros allowed), every N below kMaxCpus, N <= M.
std::optional<Model> model_parse(std::string_view text) {
    Model set;
    if (text.empty()) return set;
    size_t pos = 0;
    auto number = [&](int &out) {
        size_t start = pos;
        while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9') ++pos;
        std::string_view digits = text.substr(start, pos - start);
        if (digits.empty()) return false;
        while (digits.size() > 1 && digits.front() == '0') digits.remove_prefix(1);
        if (digits.size() > 4) return false;
        out = std::stoi(std::string(digits));
        return out < CpuSet::kMaxCpus;
    };
    for (;;) {
        int first = 0;
        if (!number(first)) return std::nullopt;
        int last = first;
        if (pos < text.size() && text[pos] == '-') {
            ++pos;
            if (!number(last) || last < first) return std::nullopt;
        }
        for (int cpu = first; cpu <= last; ++cpu) set.set(cpu);
        if (pos == text.size()) return set;
        if (text[pos] != ',') return std::nullopt;
        ++pos;
    }
}

// The canonical text of cpuset.hpp: ascending, runs of two or more as "N-M", "" when empty.
std::string model_format(const Model &set) {
    std::string out;
    for (int cpu = 0; cpu < CpuSet::kMaxCpus;) {
        if (!set.test(cpu)) {
            ++cpu;
            continue;
        }
        int end = cpu;
        while (end + 1 < CpuSet::kMaxCpus && set.test(end + 1)) ++end;
        if (!out.empty()) out += ',';
        out += std::to_string(cpu);
        if (end > cpu) out += "-" + std::to_string(end);
        cpu = end + 1;
    }
    return out;
}

void check_set(const CpuSet &set, const Model &model, std::string_view text) {
    const std::string where = " for " + shown(text);
    MALL_FUZZ_CHECK(set.count() == static_cast<int>(model.count()), "count" + where);
    MALL_FUZZ_CHECK(set.empty() == model.none(), "empty" + where);
    int first = -1, last = -1;
    for (int cpu = 0; cpu < CpuSet::kMaxCpus; ++cpu) {
        MALL_FUZZ_CHECK(set.contains(cpu) == model.test(cpu), "contains(" + std::to_string(cpu) + ")" + where);
        if (model.test(cpu)) {
            if (first < 0) first = cpu;
            last = cpu;
        }
    }
    MALL_FUZZ_CHECK(set.first() == first && set.last() == last, "first/last" + where);
    MALL_FUZZ_CHECK(!set.contains(-1) && !set.contains(CpuSet::kMaxCpus), "contains out of range" + where);

    std::vector<int> cpus = set.to_vector();
    MALL_FUZZ_CHECK(cpus.size() == model.count(), "to_vector size" + where);
    for (size_t i = 0; i < cpus.size(); ++i)
        MALL_FUZZ_CHECK(model.test(cpus[i]) && (i == 0 || cpus[i - 1] < cpus[i]), "to_vector" + where);
    MALL_FUZZ_CHECK(CpuSet::from_list(cpus) == set, "from_list(to_vector)" + where);

    uint64_t mask[CpuSet::kMaxCpus / 64];
    set.to_mask(mask);
    MALL_FUZZ_CHECK(CpuSet::from_mask(mask) == set, "from_mask(to_mask)" + where);
    cpu_set_t native = set.to_cpu_set();
    MALL_FUZZ_CHECK(CPU_COUNT(&native) == set.count(), "to_cpu_set" + where);
    MALL_FUZZ_CHECK(cpuset_from_hwloc(to_hwloc(set).get()) == set, "cpuset_from_hwloc(to_hwloc)" + where);
    MALL_FUZZ_CHECK(set.first() == (cpus.empty() ? -1 : cpus.front()) && set.last() == (cpus.empty() ? -1 : cpus.back()),
                    "first/last" + where);

    const std::string canonical = set.to_string();
    MALL_FUZZ_CHECK(canonical == model_format(model), "to_string gave " + shown(canonical) + where);
    std::string error;
    auto again = CpuSet::parse(canonical, &error);
    MALL_FUZZ_CHECK(again && *again == set, "the canonical text does not re-parse" + where + ": " + error);
    MALL_FUZZ_CHECK(again->to_string() == canonical, "the canonical text is not a fixed point" + where);

    // The algebra against the set's own span and a copy: cheap identities a bitmap slip would break.
    CpuSet span = set.empty() ? CpuSet() : CpuSet::range(set.first(), set.last());
    MALL_FUZZ_CHECK(span.contains(set) && (set & span) == set && (set | span) == span, "span" + where);
    CpuSet gaps = span - set;
    MALL_FUZZ_CHECK(!gaps.intersects(set) && (gaps | set) == span, "difference" + where);
    MALL_FUZZ_CHECK(gaps.count() + set.count() == span.count(), "difference count" + where);
    CpuSet copy = set;
    copy -= set;
    MALL_FUZZ_CHECK(copy.empty() && !copy.intersects(set), "x - x" + where);
    copy |= set;
    MALL_FUZZ_CHECK(copy == set, "(x - x) | x" + where);
    CpuSet moved = std::move(copy);
    MALL_FUZZ_CHECK(moved == set && copy.empty(), "move" + where);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    std::string_view text(reinterpret_cast<const char *>(data), size);
    std::string error;
    auto set = CpuSet::parse(text, &error);
    auto model = model_parse(text);
    MALL_FUZZ_CHECK(set.has_value() == model.has_value(),
                    std::string(set ? "accepted" : "refused") + " " + shown(text) + " against the grammar" +
                        (set ? "" : ": " + error));
    MALL_FUZZ_CHECK(CpuSet::parse(text).has_value() == set.has_value(), "parse's answer depends on *error");
    if (!set) {
        MALL_FUZZ_CHECK(error.rfind("bad cpu list \"", 0) == 0, "a refusal without the usual words: " + error);
        return 0;
    }
    check_set(*set, *model, text);
    return 0;
}
