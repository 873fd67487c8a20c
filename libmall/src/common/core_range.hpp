// SPDX-License-Identifier: BSD-3-Clause
// core_range.hpp — the one parser of a job's core limits written MIN[:MAX], shared by mallrun's
// --malleable, the OCI hook's io.mall.malleable annotation and the Slurm option --malleable.
// Contract: a count is plain decimal digits (no sign, space, hex or exponent) no larger than the
// caller's bound; MIN is at least 1; MAX, when given, is at least MIN; one ':' at most. A fault
// comes back with its kind and its words (e.g. `MIN "x" is not a whole number of cores`), so each
// caller keeps its own sentence around them. Never throws. Header-only and free of dependencies:
// the Slurm plugin's parsers (mall_spank_logic) use it without linking mall_common.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace mall {

// The largest MIN or MAX mallrun and the OCI hook accept: a bound against typos (malld caps a job
// at its pool anyway). The Slurm option has its own, smaller one (kMaxMalleableCpus).
inline constexpr unsigned kMaxCoreCount = 999999;

// What the tools say a core range is (their messages go on with their own examples).
inline constexpr const char *kCoreRangeRule = "MIN or MIN:MAX, whole numbers of cores >= 1 with MIN <= MAX";

struct CoreRange {
    unsigned min = 0;
    std::optional<unsigned> max;  // nullopt: MIN alone (up to the whole pool or node)
};

enum class CoreRangeFault {
    none,
    syntax,         // a part is empty, not digits, above the bound, or there is a second ':'
    min_zero,       // MIN is 0
    max_below_min,  // MAX < MIN (MAX may be 0 here)
};

struct CoreRangeParse {
    CoreRange range;  // what was read: complete for none, min_zero and max_below_min
    CoreRangeFault fault = CoreRangeFault::none;
    std::string why;  // the fault in words, without the rule (empty when none)
    bool ok() const { return fault == CoreRangeFault::none; }
};

// One count: digits only, at most `largest`. `what` names it in the words ("MIN", "MAX").
// Returns nullopt with *why filled on failure.
inline std::optional<unsigned> parse_core_count(std::string_view text, const char *what, unsigned largest,
                                                std::string *why) {
    if (text.empty()) {
        *why = std::string(what) + " is missing";
        return std::nullopt;
    }
    uint64_t value = 0;
    for (char c : text) {
        if (c < '0' || c > '9') {
            *why = std::string(what) + " \"" + std::string(text) + "\" is not a whole number of cores";
            return std::nullopt;
        }
        value = value * 10 + static_cast<uint64_t>(c - '0');
        if (value > largest) {  // checked at every digit: a long text cannot overflow
            *why = std::string(what) + " \"" + std::string(text) + "\" is too large (at most " +
                   std::to_string(largest) + ")";
            return std::nullopt;
        }
    }
    return static_cast<unsigned>(value);
}

// MIN or MIN:MAX, each count at most `largest`. The checks run in this order: a second ':',
// MIN's and MAX's syntax, MIN >= 1, MAX >= MIN.
inline CoreRangeParse parse_core_range(std::string_view text, unsigned largest) {
    CoreRangeParse out;
    auto fail = [&](CoreRangeFault fault, std::string why) {
        out.fault = fault;
        out.why = std::move(why);
        return out;
    };
    const size_t colon = text.find(':');
    if (colon != std::string_view::npos && text.find(':', colon + 1) != std::string_view::npos)
        return fail(CoreRangeFault::syntax, "there is more than one ':' (write MIN:MAX)");
    std::string why;
    auto min = parse_core_count(text.substr(0, colon), "MIN", largest, &why);
    if (!min) return fail(CoreRangeFault::syntax, why);
    out.range.min = *min;
    if (colon != std::string_view::npos) {
        auto max = parse_core_count(text.substr(colon + 1), "MAX", largest, &why);
        if (!max) return fail(CoreRangeFault::syntax, why);
        out.range.max = *max;
    }
    if (*min == 0) return fail(CoreRangeFault::min_zero, "MIN must be at least 1 (a job always keeps one core)");
    if (out.range.max && *out.range.max < *min)
        return fail(CoreRangeFault::max_below_min,
                    "MAX (" + std::to_string(*out.range.max) + ") is below MIN (" + std::to_string(*min) + ")");
    return out;
}

}  // namespace mall
