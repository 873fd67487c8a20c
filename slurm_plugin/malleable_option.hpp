// SPDX-License-Identifier: BSD-3-Clause
// malleable_option.hpp — strict parser for the user's `--malleable[=MIN[:MAX]][,weight=W]` value
// (SPANK plugin). Pure logic, no Slurm: accepts the bare option, "N" (MIN=N), "MIN:MAX", either
// followed by ",weight=W", and "weight=W" alone; rejects everything else with words that say what is
// allowed. MAX 0 in the result means "the node's cores" (unknown yet).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "common/rules.hpp"

namespace mall::slurm {

// What the value may be checked against. 0 means "unknown / no bound".
struct MalleableLimits {
    unsigned node_cpus = 0;  // cpus of the node the task runs on (slurmstepd), or of the largest
                             // node of the cluster (sbatch/salloc/srun); 0 = unknown
    bool largest_node = false;  // node_cpus is the largest node's (at submission), for the words
    unsigned admin_min = 0;  // plugstack.conf min_cpus=
    unsigned admin_max = 0;  // plugstack.conf max_cpus=
};

struct MalleableRequest {
    unsigned min = 1;  // cores the job always keeps (Slurm guarantees them, like -c MIN)
    unsigned max = 0;  // most cores mall may lend it; 0 = the node's cores (resolved on the node)
    double weight = mall::kDefaultWeight;  // its share under malld's weighted policy: mall::valid_weight() holds
    bool operator==(const MalleableRequest &) const = default;
};

// The largest value accepted for MIN or MAX (and plugstack.conf's min_cpus/max_cpus), whatever
// the limits (a sanity bound against typos).
constexpr unsigned kMaxMalleableCpus = 65536;
// W is bounded by mall::kMaxWeight (rules.hpp), the bound malld, mallrun and mallctl use.

// value: nullptr or "" is invalid only when `present_with_equals` is true ("--malleable=" with
// nothing after it); a bare `--malleable` passes nullptr. Defaults: MIN = max(1, admin_min),
// MAX = 0 ("the node's cores", capped by admin_max when given), weight 1. W is digits with an
// optional '.' and fraction (no sign, exponent, hex, nan or inf), read without the locale.
// On failure returns nullopt and *error says what was wrong and what is allowed.
std::optional<MalleableRequest> parse_malleable(const char *value, const MalleableLimits &limits,
                                                std::string *error);

// The MAX a request resolves to on a node with node_cpus cpus (0 → node_cpus, also capped by
// admin_max when given).
unsigned resolve_max(const MalleableRequest &request, const MalleableLimits &limits);

// One sentence saying what the option accepts under these limits (used in every error message).
std::string malleable_allowed_text(const MalleableLimits &limits);

}  // namespace mall::slurm
