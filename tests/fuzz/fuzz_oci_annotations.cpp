// SPDX-License-Identifier: BSD-3-Clause
// fuzz_oci_annotations.cpp — libFuzzer target for what mall-oci-hook reads of a container that
// whoever creates it writes: the OCI state on stdin (parse_state) and its io.mall.* annotations
// within the admin's limits (parse_request, job_prefix_problem). Input: a first line of the hook's
// limits, "PREFIX<TAB>MAX-WEIGHT<TAB>MAX-CORES" (a prefix the hook would refuse, or an unreadable
// number, or a weight cap below the default weight 1, falls back to the defaults: ctr-, 100, 8),
// then the state JSON. Checked besides "no
// crash, leak or sanitizer report": a refusal says why on one printable line; an accepted request
// keeps the admin's limits: the job is the prefix and then a valid job name that is never a Slurm
// job's (slurm-...) nor a self-registered job's (self-...), 1 <= MIN <= MAX <= max(MAX-CORES, MIN) (MAX cut, asked_max only when it was
// above the cap), the weight above 0, finite, at most MAX-WEIGHT; a prefix the hook accepts is
// job-name characters, at most 32 of them, not starting slurm- or self-.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "common/protocol.hpp"
#include "fuzz_check.hpp"
#include "tools/mall_oci_hook_container.hpp"

namespace {

namespace hook = mall::tools::oci_hook;
using mall::fuzz::shown;

bool one_printable_line(const std::string &text) {
    for (unsigned char c : text)
        if (c < 0x20 || c == 0x7f) return false;
    return !text.empty();
}

void check_prefix_rule(const std::string &prefix) {
    const bool accepted = hook::job_prefix_problem(prefix).empty();
    bool expected = prefix.size() <= hook::kMaxJobPrefixLength && prefix.rfind("slurm-", 0) != 0 &&
                    prefix.rfind("self-", 0) != 0;
    for (char c : prefix) expected = expected && mall::proto::is_job_name_char(c);
    MALL_FUZZ_CHECK(accepted == expected, "prefix " + shown(prefix) + (accepted ? " accepted" : " refused"));
    if (!accepted)
        MALL_FUZZ_CHECK(one_printable_line(hook::job_prefix_problem(prefix)), "prefix refusal not one line");
}

hook::Limits limits_of(std::string_view line) {
    hook::Limits limits;
    limits.max_cores = 8;
    const size_t tab1 = line.find('\t');
    const size_t tab2 = tab1 == std::string_view::npos ? tab1 : line.find('\t', tab1 + 1);
    const std::string prefix(line.substr(0, tab1));
    check_prefix_rule(prefix);
    if (hook::job_prefix_problem(prefix).empty()) limits.job_prefix = prefix;
    if (tab1 != std::string_view::npos) {
        const std::string weight(line.substr(tab1 + 1, tab2 == std::string_view::npos ? tab2 : tab2 - tab1 - 1));
        char *end = nullptr;
        const double w = std::strtod(weight.c_str(), &end);
        if (!weight.empty() && end == weight.c_str() + weight.size() && mall::proto::valid_weight(w) && w >= 1)
            limits.max_weight = w;
    }
    if (tab2 != std::string_view::npos) {
        const std::string cores(line.substr(tab2 + 1, 6));
        const long n = std::strtol(cores.c_str(), nullptr, 10);
        if (n >= 1 && n <= 999999) limits.max_cores = static_cast<int>(n);
    }
    return limits;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const std::string_view input(reinterpret_cast<const char *>(data), size);
    const size_t newline = input.find('\n');
    const hook::Limits limits = limits_of(input.substr(0, newline));
    const std::string state_text(newline == std::string_view::npos ? std::string_view() : input.substr(newline + 1));

    std::string error;
    auto state = hook::parse_state(state_text, &error);
    if (!state) {
        MALL_FUZZ_CHECK(one_printable_line(error), "state refusal not one printable line: " + shown(error));
        return 0;
    }
    MALL_FUZZ_CHECK(!state->id.empty(), "a state without an id was accepted");
    MALL_FUZZ_CHECK(state->pid >= 0 && state->pid <= mall::proto::kMaxPid, "pid out of range");

    error.clear();
    auto request = hook::parse_request(*state, limits, &error);
    if (!request) {
        MALL_FUZZ_CHECK(one_printable_line(error), "request refusal not one printable line: " + shown(error));
        return 0;
    }
    const hook::Request &r = *request;
    MALL_FUZZ_CHECK(r.job.rfind(limits.job_prefix, 0) == 0,
                    "job " + shown(r.job) + " lacks the prefix " + shown(limits.job_prefix));
    MALL_FUZZ_CHECK(!mall::proto::invalid_job_name(r.job), "invalid job name " + shown(r.job));
    MALL_FUZZ_CHECK(r.job.rfind("slurm-", 0) != 0, "a Slurm job's name was accepted: " + shown(r.job));
    MALL_FUZZ_CHECK(r.job.rfind("self-", 0) != 0, "a self-registered job's name was accepted: " + shown(r.job));
    MALL_FUZZ_CHECK(r.min >= 1, "MIN below 1");
    if (r.max) {
        MALL_FUZZ_CHECK(*r.max >= r.min, "MAX below MIN");
        MALL_FUZZ_CHECK(*r.max <= std::max(limits.max_cores, r.min), "MAX above the admin's cap");
    }
    if (r.asked_max) MALL_FUZZ_CHECK(*r.asked_max > limits.max_cores && r.max, "asked_max without a cut");
    MALL_FUZZ_CHECK(r.weight > 0 && std::isfinite(r.weight) && r.weight <= limits.max_weight,
                    "weight " + std::to_string(r.weight) + " outside (0, " + std::to_string(limits.max_weight) + "]");
    return 0;
}
