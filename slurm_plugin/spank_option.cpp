// SPDX-License-Identifier: BSD-3-Clause
// spank_option.cpp — the `--malleable[=MIN[:MAX]][,weight=W]` option: its registration record, the
// callback Slurm calls with the user's value, and what the process knows of the value afterwards.
// The parsing itself is malleable_option.cpp's. Contract: in sbatch/salloc/srun a bad value stops
// the command (the callback returns -1, Slurm adds "Invalid --malleable argument"); on the node the
// value is only remembered, and checked in task_post_fork, where failing is safe.
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/rules.hpp"
#include "spank_plugin.hpp"

namespace mall::spank {
namespace {

using mall::slurm::MalleableLimits;
using mall::slurm::MalleableRequest;

// Where slurmstepd, the prolog and the epilog find the value (Slurm sets it for the job).
constexpr const char *kOptionEnv = "SLURM_SPANK__SLURM_SPANK_OPTION_mall_malleable";

// What this process knows of the option: set by the callback or load_option().
struct GivenOption {
    bool given = false;  // --malleable seen (callback, getopt or env)
    bool bare = false;   // given without a value
    std::string text;    // the value as the user wrote it
};
GivenOption g_option;

int malleable_option_cb(int val, const char *optarg, int remote);

char kOptName[] = "malleable";
char kOptArgInfo[] = "MIN[:MAX][,weight=W]";
// Built once at load time: the weight bound comes from rules.hpp (Slurm wants a char *). Written as
// an unsigned: a long long here makes the module export one more libstdc++ symbol (a digits table).
static_assert(mall::kMaxWeight <= 4294967295.0, "kMaxWeight must fit the unsigned it is written as");
std::string g_opt_usage =
    "let mall grow and shrink this job's cores between MIN and MAX while it runs (MIN is guaranteed "
    "by Slurm, like -c MIN; MAX defaults to the node's cores); weight=W (above 0, at most " +
    std::to_string(static_cast<unsigned>(mall::kMaxWeight)) +
    ", default 1) is the job's share of idle cores under malld's weighted policy, e.g. 2:8,weight=3 "
    "or weight=2";
struct spank_option g_malleable_option = {kOptName, kOptArgInfo, g_opt_usage.data(), 2, 0,
                                          malleable_option_cb};

// A bare `--malleable` reaches the job environment as the text "(null)" (sbatch formats the missing
// argument with printf), and an srun inside the job reads it back from there: same as no value.
bool is_bare_value(const char *value, bool remote) {
    return value == nullptr || strcmp(value, "(null)") == 0 || (remote && value[0] == '\0');
}

void remember(const char *value, bool remote) {
    g_option.given = true;
    g_option.bare = is_bare_value(value, remote);
    g_option.text = g_option.bare ? "" : value;
}

int malleable_option_cb(int, const char *optarg, int remote) {
    try {
        if (wrong_release()) return 0;  // said at init; node_info_t may not be ours to read
        remember(optarg, remote);
        if (g_option.bare) optarg = nullptr;
        if (remote) return 0;  // checked against the node in task_post_fork, where failing is safe
        std::string error;
        // First without the cluster's node table: a request within this host's own cpus needs
        // no RPC (issue 39). Only a MIN or MAX above them asks slurmctld for its largest node
        // (one REQUEST_NODE_INFO); each node checks the request against its own cpus anyway.
        MalleableLimits limits = limits_here(false, /*ask_slurmctld=*/false);
        auto request = mall::slurm::parse_malleable(optarg, limits, &error);
        const unsigned here = node_cpu_count();
        if (request && (here == 0 || request->min > here || request->max > here) && !inside_job()) {
            limits = limits_here(false, /*ask_slurmctld=*/true);
            request = mall::slurm::parse_malleable(optarg, limits, &error);
        }
        if (!request) {
            slurm_error("%s", error.c_str());
            return -1;  // Slurm adds "Invalid --malleable argument" and the command exits
        }
        return 0;
    } catch (...) {
        return -1;
    }
}

}  // namespace

struct spank_option *malleable_option() { return &g_malleable_option; }

bool option_given() { return g_option.given; }

std::string option_display() {
    return g_option.bare ? std::string("--malleable") : "--malleable=" + g_option.text;
}

void load_option(spank_t sp) {
    if (g_option.given) return;
    char *value = nullptr;
    if (spank_option_getopt(sp, &g_malleable_option, &value) == ESPANK_SUCCESS) {
        remember(value, true);
        return;
    }
    char buf[256];
    if (spank_getenv(sp, kOptionEnv, buf, sizeof buf) == ESPANK_SUCCESS)
        remember(buf, true);
    else if (const char *env = getenv(kOptionEnv))
        remember(env, true);
}

std::optional<MalleableRequest> parse_given_option(const MalleableLimits &limits, std::string *error) {
    return mall::slurm::parse_malleable(g_option.bare ? nullptr : g_option.text.c_str(), limits, error);
}

bool inside_job() {
    const char *id = std::getenv("SLURM_JOB_ID");
    return id != nullptr && *id != '\0';
}

MalleableLimits limits_here(bool on_node, bool ask_slurmctld) {
    MalleableLimits limits;
    limits.admin_min = config().min_cpus;
    limits.admin_max = config().max_cpus;
    // On the node: its own cpus. In sbatch/salloc/srun: the largest node of the cluster (the whole
    // node table from slurmctld) when asked to, never inside a job (SLURM_JOB_ID set: srun in a
    // batch script): that job's request was checked at its submission and each node checks its
    // own cpus at the task's start, so a step costs slurmctld no node table (issue 39).
    limits.node_cpus = on_node ? node_cpu_count() : (ask_slurmctld && !inside_job() ? largest_node_cpus() : 0);
    limits.largest_node = !on_node;
    return limits;
}

std::optional<unsigned> task_max_cpus() {
    const MalleableLimits limits = limits_here(true);
    std::string error;
    auto request = parse_given_option(limits, &error);
    if (!request) return std::nullopt;
    unsigned max = mall::slurm::resolve_max(*request, limits);
    if (limits.node_cpus != 0 && (max == 0 || max > limits.node_cpus)) max = limits.node_cpus;
    if (max == 0) return std::nullopt;
    return max;
}

}  // namespace mall::spank
