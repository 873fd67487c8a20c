// SPDX-License-Identifier: BSD-3-Clause
// malleable_option.cpp — strict parser for `--malleable[=MIN[:MAX]][,weight=W]` (see
// malleable_option.hpp). MIN[:MAX] is read by common/core_range.hpp, the parser mallrun and the OCI
// hook use too; here are the option's own parts: the items, weight=W and the node's and the
// administrator's limits. Contract: never throws; accepts only plain decimal digits (and one '.' in
// W); every rejection names the bad part and ends with malleable_allowed_text() so the user learns
// what to type instead.
#include "malleable_option.hpp"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <system_error>
#include <vector>

#include "common/core_range.hpp"

namespace mall::slurm {

namespace {

unsigned lowest_min(const MalleableLimits &limits) { return std::max(1u, limits.admin_min); }

// The tightest known upper bound (0 = none known).
unsigned highest_max(const MalleableLimits &limits) {
    unsigned hi = 0;
    for (unsigned bound : {limits.node_cpus, limits.admin_max})
        if (bound != 0) hi = hi == 0 ? bound : std::min(hi, bound);
    return hi;
}

// mall::kMaxWeight in digits, as the messages show it ("1000000").
std::string max_weight_text() { return std::to_string(static_cast<long long>(kMaxWeight)); }

// Parses W of weight=W: digits, optionally '.' and more digits. The characters are checked here and
// std::from_chars converts them, so the result never depends on the locale.
std::optional<double> parse_weight(std::string_view text, std::string *why) {
    const std::string quoted = "weight \"" + std::string(text) + "\"";
    if (text.empty()) {
        *why = "weight is empty (write weight=W with a number, e.g. weight=2.5)";
        return std::nullopt;
    }
    size_t dot = text.find('.');
    bool digits_only =
        std::all_of(text.begin(), text.end(), [](char c) { return c == '.' || (c >= '0' && c <= '9'); });
    if (!digits_only || dot == 0 || dot + 1 == text.size() ||
        (dot != std::string_view::npos && text.find('.', dot + 1) != std::string_view::npos)) {
        *why = quoted + " is not a plain decimal number (digits with an optional fraction, e.g. 2 or 0.5)";
        return std::nullopt;
    }
    std::string_view whole = text.substr(0, dot);
    whole.remove_prefix(std::min(whole.find_first_not_of('0'), whole.size()));
    // More digits than the bound has: above it (and from_chars below cannot overflow).
    if (whole.size() > max_weight_text().size()) {
        *why = quoted + " is above " + max_weight_text();
        return std::nullopt;
    }
    double weight = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), weight, std::chars_format::fixed);
    if (ec == std::errc::result_out_of_range) {  // only underflow is left: a value too close to 0
        *why = quoted + " is too close to 0";
        return std::nullopt;
    }
    if (ec != std::errc() || end != text.data() + text.size()) {
        *why = quoted + " is not a plain decimal number (digits with an optional fraction, e.g. 2 or 0.5)";
        return std::nullopt;
    }
    if (!(weight > 0)) {
        *why = quoted + " must be above 0";
        return std::nullopt;
    }
    if (!valid_weight(weight)) {  // above 0 was checked: the bound
        *why = quoted + " is above " + max_weight_text();
        return std::nullopt;
    }
    return weight;
}

}  // namespace

std::string malleable_allowed_text(const MalleableLimits &limits) {
    std::string lo = std::to_string(lowest_min(limits));
    unsigned hi = highest_max(limits);
    std::string bound;
    if (hi == 0) {
        bound = "the node's cores";
    } else {
        bound = std::to_string(hi);
        if (limits.admin_max != 0 && hi == limits.admin_max)
            bound += " (the administrator's max_cpus)";
        else
            bound += limits.largest_node ? " (the largest node's cores)" : " (this node's cores)";
    }
    return "allowed: --malleable, --malleable=MIN or --malleable=MIN:MAX with whole numbers " + lo +
           " <= MIN <= MAX <= " + bound + "; MAX defaults to the node's cores; each form may end in " +
           ",weight=W (--malleable=weight=W keeps the default cores) with W a decimal number above 0 " +
           "and at most " + max_weight_text() + " (default 1), the job's share under malld's weighted policy";
}

unsigned resolve_max(const MalleableRequest &request, const MalleableLimits &limits) {
    unsigned max = request.max;
    if (max == 0) max = limits.node_cpus;
    if (limits.admin_max != 0 && (max == 0 || max > limits.admin_max)) max = limits.admin_max;
    return max;
}

std::optional<MalleableRequest> parse_malleable(const char *value, const MalleableLimits &limits,
                                                std::string *error) {
    std::string why;
    auto fail = [&](const std::string &text) -> std::optional<MalleableRequest> {
        if (error) *error = "--malleable=" + std::string(value ? value : "") + ": " + text + "; " +
                            malleable_allowed_text(limits);
        return std::nullopt;
    };

    MalleableRequest request;
    request.min = lowest_min(limits);
    request.max = 0;
    auto check_default_cores = [&]() -> std::optional<std::string> {
        unsigned hi = highest_max(limits);
        if (hi != 0 && request.min > hi)
            return "the administrator's min_cpus (" + std::to_string(request.min) +
                   ") is above the cores available (" + std::to_string(hi) + ")";
        return std::nullopt;
    };
    if (value == nullptr) {  // bare --malleable
        if (auto bad = check_default_cores()) return fail(*bad);
        return request;
    }

    std::string_view text(value);
    if (text.empty()) return fail("the value is empty (write --malleable alone, or give MIN or MIN:MAX)");

    // Comma-separated items: the cores (MIN or MIN:MAX) first when given, then key=value items.
    std::vector<std::string_view> items;
    for (size_t start = 0;;) {
        size_t comma = text.find(',', start);
        items.push_back(text.substr(start, comma == std::string_view::npos ? comma : comma - start));
        if (comma == std::string_view::npos) break;
        start = comma + 1;
    }
    std::string_view cores;
    bool weight_given = false;
    for (size_t i = 0; i < items.size(); ++i) {
        std::string_view item = items[i];
        if (item.empty())
            return fail("item " + std::to_string(i + 1) +
                        " is empty (a stray ',' at the start, the end or doubled)");
        if (item == "weight") return fail("weight has no value (write weight=W, e.g. weight=2)");
        size_t eq = item.find('=');
        if (eq == std::string_view::npos) {
            if (i == 0) {
                cores = item;
                continue;
            }
            bool looks_like_cores = item.find_first_not_of("0123456789:") == std::string_view::npos;
            if (looks_like_cores)
                return fail("\"" + std::string(item) +
                            "\" after ',' is not key=value (the cores MIN[:MAX] come first, and MIN:MAX is "
                            "written with ':')");
            return fail("\"" + std::string(item) + "\" after ',' is not key=value (the only key is weight=)");
        }
        std::string_view key = item.substr(0, eq);
        if (key != "weight")
            return fail("unknown key \"" + std::string(key) + "\" (the only key is weight=)");
        if (weight_given) return fail("weight is given more than once");
        weight_given = true;
        auto weight = parse_weight(item.substr(eq + 1), &why);
        if (!weight) return fail(why);
        request.weight = *weight;
    }
    if (cores.empty()) {  // weight=W alone: the bare option's cores
        if (auto bad = check_default_cores()) return fail(*bad);
        return request;
    }

    // MIN[:MAX] itself (digits, a second ':', MIN >= 1, MAX >= MIN): the tools' shared parser.
    const CoreRangeParse parsed = parse_core_range(cores, kMaxMalleableCpus);
    if (!parsed.ok()) return fail(parsed.why);
    const unsigned min = parsed.range.min;
    const std::optional<unsigned> max = parsed.range.max;
    if (limits.admin_min != 0 && min < limits.admin_min)
        return fail("MIN (" + std::to_string(min) + ") is below the administrator's min_cpus (" +
                    std::to_string(limits.admin_min) + ")");
    auto check_upper = [&](unsigned v, const char *name) -> std::optional<std::string> {
        if (limits.node_cpus != 0 && v > limits.node_cpus)
            return std::string(name) + " (" + std::to_string(v) + ") is above " +
                   (limits.largest_node ? "the largest node's " : "this node's ") +
                   std::to_string(limits.node_cpus) + " cores";
        if (limits.admin_max != 0 && v > limits.admin_max)
            return std::string(name) + " (" + std::to_string(v) + ") is above the administrator's max_cpus (" +
                   std::to_string(limits.admin_max) + ")";
        return std::nullopt;
    };
    if (auto bad = check_upper(min, "MIN")) return fail(*bad);
    if (max)
        if (auto bad = check_upper(*max, "MAX")) return fail(*bad);

    request.min = min;
    request.max = max ? *max : 0;
    return request;
}

}  // namespace mall::slurm
