// SPDX-License-Identifier: BSD-3-Clause
// fuzz_malleable_option.cpp — libFuzzer target for parse_malleable(), the Slurm plugin's reader of
// the user's `--malleable[=MIN[:MAX]][,weight=W]` value (run in sbatch/srun and, as root, in
// slurmstepd). Input: VALUE, optionally followed by a NUL byte and up to 7 bytes of limits: flags
// (bit 0: a bare --malleable, VALUE ignored; bit 1: node_cpus is the largest node's), then
// node_cpus, admin_min, admin_max as 16-bit little-endian numbers (missing bytes are 0). So a plain
// text seed is a value under no limits. Checked besides "no crash, leak or sanitizer report": an
// accepted request keeps every bound (1 <= admin_min <= MIN <= MAX <= node and admin bounds, W
// within mall's weight rule), resolve_max agrees, and its text form parses back to the same
// request; a refusal quotes the value and ends with the sentence of what is allowed.
#include <charconv>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "fuzz_check.hpp"
#include "malleable_option.hpp"

namespace {

using mall::fuzz::shown;
using mall::slurm::MalleableLimits;
using mall::slurm::MalleableRequest;

std::string describe(const MalleableLimits &limits) {
    return "node_cpus=" + std::to_string(limits.node_cpus) + (limits.largest_node ? " (largest)" : "") +
           " admin_min=" + std::to_string(limits.admin_min) + " admin_max=" + std::to_string(limits.admin_max);
}

// The request as a user would type it: MIN[:MAX],weight=W with W in plain fixed notation.
std::string as_text(const MalleableRequest &request) {
    std::string text = std::to_string(request.min);
    if (request.max != 0) text += ":" + std::to_string(request.max);
    char weight[400];
    auto [end, ec] = std::to_chars(weight, weight + sizeof weight, request.weight, std::chars_format::fixed);
    MALL_FUZZ_CHECK(ec == std::errc(), "cannot print weight " + std::to_string(request.weight));
    return text + ",weight=" + std::string(weight, end);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    std::string_view input(reinterpret_cast<const char *>(data), size);
    size_t nul = input.find('\0');
    std::string value(input.substr(0, nul));
    uint8_t tail[7] = {};
    if (nul != std::string_view::npos) {
        std::string_view rest = input.substr(nul + 1);
        std::memcpy(tail, rest.data(), std::min(rest.size(), sizeof tail));
    }
    auto u16 = [&](int at) { return static_cast<unsigned>(tail[at] | (tail[at + 1] << 8)); };
    MalleableLimits limits;
    bool bare = (tail[0] & 1) != 0;
    limits.largest_node = (tail[0] & 2) != 0;
    limits.node_cpus = u16(1);
    limits.admin_min = u16(3);
    limits.admin_max = u16(5);
    const std::string where = " for " + (bare ? std::string("bare --malleable") : shown(value)) + " under " +
                              describe(limits);

    std::string error;
    auto request = mall::slurm::parse_malleable(bare ? nullptr : value.c_str(), limits, &error);
    auto quiet = mall::slurm::parse_malleable(bare ? nullptr : value.c_str(), limits, nullptr);
    MALL_FUZZ_CHECK(request == quiet, "the answer depends on *error" + where);
    if (!request) {
        const std::string allowed = "; " + mall::slurm::malleable_allowed_text(limits);
        MALL_FUZZ_CHECK(error.rfind("--malleable=" + (bare ? std::string() : value) + ": ", 0) == 0,
                        "a refusal that does not quote the value: " + error);
        MALL_FUZZ_CHECK(error.size() > allowed.size() &&
                            error.compare(error.size() - allowed.size(), allowed.size(), allowed) == 0,
                        "a refusal that does not end with the allowed forms: " + error);
        return 0;
    }

    unsigned hi = 0;  // the tightest known upper bound
    for (unsigned bound : {limits.node_cpus, limits.admin_max})
        if (bound != 0) hi = hi == 0 ? bound : std::min(hi, bound);
    MALL_FUZZ_CHECK(request->min >= 1 && request->min >= limits.admin_min, "MIN below its floor" + where);
    MALL_FUZZ_CHECK(request->min <= mall::slurm::kMaxMalleableCpus, "MIN above the sanity bound" + where);
    MALL_FUZZ_CHECK(hi == 0 || request->min <= hi, "MIN above the cores" + where);
    MALL_FUZZ_CHECK(request->max == 0 || (request->max >= request->min && (hi == 0 || request->max <= hi)),
                    "MAX out of bounds" + where);
    MALL_FUZZ_CHECK(mall::valid_weight(request->weight), "weight outside mall's rule" + where);
    if (bare) MALL_FUZZ_CHECK(request->max == 0 && request->weight == mall::kDefaultWeight, "bare option" + where);

    unsigned resolved = mall::slurm::resolve_max(*request, limits);
    if (request->max != 0)
        MALL_FUZZ_CHECK(resolved == request->max, "resolve_max changed an explicit MAX" + where);
    else
        MALL_FUZZ_CHECK(resolved == hi, "resolve_max is not the tightest bound" + where);

    const std::string text = as_text(*request);
    auto again = mall::slurm::parse_malleable(text.c_str(), limits, &error);
    MALL_FUZZ_CHECK(again.has_value(), "its own text " + shown(text) + " is refused" + where + ": " + error);
    MALL_FUZZ_CHECK(*again == *request, "its own text " + shown(text) + " parses differently" + where);
    return 0;
}
