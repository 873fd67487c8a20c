// malleable_option.cpp — strict parser for `--malleable[=MIN[:MAX]]` (see malleable_option.hpp).
// Contract: never throws; accepts only plain decimal digits; every rejection names the bad part and
// ends with malleable_allowed_text() so the user learns what to type instead.
#include "malleable_option.hpp"

#include <algorithm>
#include <cstdint>

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

// Parses a whole number made of digits only. Returns nullopt with *why filled on failure.
std::optional<unsigned> parse_count(std::string_view text, const char *what, std::string *why) {
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
        if (value > kMaxMalleableCpus) {
            *why = std::string(what) + " \"" + std::string(text) + "\" is too large (at most " +
                   std::to_string(kMaxMalleableCpus) + ")";
            return std::nullopt;
        }
    }
    return static_cast<unsigned>(value);
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
           " <= MIN <= MAX <= " + bound + "; MAX defaults to the node's cores";
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
    if (value == nullptr) {  // bare --malleable
        unsigned hi = highest_max(limits);
        if (hi != 0 && request.min > hi)
            return fail("the administrator's min_cpus (" + std::to_string(request.min) +
                        ") is above the cores available (" + std::to_string(hi) + ")");
        return request;
    }

    std::string_view text(value);
    if (text.empty()) return fail("the value is empty (write --malleable alone, or give MIN or MIN:MAX)");
    size_t colon = text.find(':');
    std::optional<unsigned> min, max;
    if (colon == std::string_view::npos) {
        min = parse_count(text, "MIN", &why);
        if (!min) return fail(why);
    } else {
        if (text.find(':', colon + 1) != std::string_view::npos)
            return fail("there is more than one ':' (write MIN:MAX)");
        min = parse_count(text.substr(0, colon), "MIN", &why);
        if (!min) return fail(why);
        max = parse_count(text.substr(colon + 1), "MAX", &why);
        if (!max) return fail(why);
    }

    if (*min == 0) return fail("MIN must be at least 1 (a job always keeps one core)");
    if (max && *max < *min)
        return fail("MAX (" + std::to_string(*max) + ") is below MIN (" + std::to_string(*min) + ")");
    if (limits.admin_min != 0 && *min < limits.admin_min)
        return fail("MIN (" + std::to_string(*min) + ") is below the administrator's min_cpus (" +
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
    if (auto bad = check_upper(*min, "MIN")) return fail(*bad);
    if (max)
        if (auto bad = check_upper(*max, "MAX")) return fail(*bad);

    request.min = *min;
    request.max = max ? *max : 0;
    return request;
}

}  // namespace mall::slurm
