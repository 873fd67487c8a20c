// SPDX-License-Identifier: BSD-3-Clause
// rules.hpp — the values and bounds every part of mall must agree on, each defined once: the
// default socket, malld's default ack timeout, how long tools wait to connect, the job weight
// bound, the job-name prefixes kept for malld's own naming. Header-only and free of dependencies beyond the public mall.h, so pure parsers (the
// Slurm plugin's option logic) use the same rule as malld without linking mall_common. Change a
// rule here and nowhere else.
#pragma once

#include <chrono>
#include <string>
#include <string_view>

#include "mall/mall.h"

namespace mall {

// Where malld listens and clients look when neither --socket nor $MALL_SOCKET says otherwise.
inline constexpr const char *kDefaultSocketPath = MALL_DEFAULT_SOCKET;

// malld's own folder for its state file and the history of finished jobs (malld --state-dir):
// root's, mode 0700 when malld creates it, never shared with the socket's folder (which containers
// may mount): malld refuses a state folder that is a symlink, not its own or writable by others.
inline constexpr const char *kDefaultStateDir = "/var/lib/mall";

// The environment a job's processes find malld and their registration by: mallrun, the Slurm
// plugin and the OCI hook set them; libmall, mallctl and malld read them.
inline constexpr const char *kSocketEnv = "MALL_SOCKET";  // malld's socket
inline constexpr const char *kJobIdEnv = "MALL_JOB_ID";   // the job's registered name
// Without $MALL_JOB_ID, libmall registers the process itself with cores from MIN to MAX; mallrun and
// the Slurm plugin also set MAX for the frameworks that size their pools once (mall.tensorflow).
inline constexpr const char *kMinEnv = "MALL_MIN";
inline constexpr const char *kMaxEnv = "MALL_MAX";
// libmall's own settings (docs/c-api.md): its lines on stderr off (1), the notification signal,
// control by signal (1 or a real-time signal), how long mall_open waits for malld's answer.
inline constexpr const char *kQuietEnv = "MALL_QUIET";
inline constexpr const char *kNotifySignalEnv = "MALL_NOTIFY_SIGNAL";
inline constexpr const char *kSignalControlEnv = "MALL_SIGNAL_CONTROL";
inline constexpr const char *kAttachTimeoutEnv = "MALL_ATTACH_TIMEOUT_MS";

// How long malld waits for a job's processes to acknowledge a smaller allocation before it
// enforces anyway (malld --ack-timeout-ms; the plugin's plugstack.conf ack_timeout_ms= mirrors it).
inline constexpr std::chrono::milliseconds kDefaultAckTimeout{2000};

// How long a tool (mallctl, mallrun, the Slurm plugin) waits for malld to take a connection: a
// stopped or overloaded malld's listen backlog fills, and a blocking connect would wait forever.
inline constexpr std::chrono::milliseconds kDefaultConnectWait{3000};

// Job weights (the weighted policy's shares): a number above 0 and at most kMaxWeight; the same
// bound for Register, Set, the state file, mallrun --weight, mallctl set --weight and the Slurm
// option's ",weight=W". False for NaN.
inline constexpr double kDefaultWeight = 1.0;  // a job that names no weight
inline constexpr double kMaxWeight = 1e6;
inline constexpr const char *kWeightRule = "a number above 0 and at most 1000000";
// kWeightRule spells kMaxWeight out in digits: the compiler keeps the two equal.
constexpr bool text_ends_with_number(const char *text, long long number) {
    const char *end = text;
    while (*end) ++end;
    do {
        if (end == text || *--end != static_cast<char>('0' + number % 10)) return false;
        number /= 10;
    } while (number > 0);
    return end == text || *(end - 1) < '0' || *(end - 1) > '9';
}
static_assert(text_ends_with_number(kWeightRule, static_cast<long long>(kMaxWeight)),
              "kWeightRule must end with kMaxWeight's digits");
inline constexpr bool valid_weight(double weight) { return weight > 0 && weight <= kMaxWeight; }

// Job names malld gives a meaning by their prefix, and who alone may give such a name:
//   "self-"  self-registered jobs: malld names a process that attached without a job self-<pid>
//            and re-adopts a job of that name after a restart as self-registered (in place, never
//            moved), so no Register, mallrun or container may take such a name;
//   "slurm-" Slurm jobs: the Slurm plugin (root, in slurmstepd) registers slurm-<jobid>, Slurm's
//            epilog releases it and malld --slurm checks it against slurmctld, so only root names
//            one (the plugin, or root testing by hand with mallrun --job).
// malld's Register, mallrun (--job and its default name) and mall-oci-hook (--job-prefix and the
// container's name) all ask reserved_job_name_problem(); add a prefix here and nowhere else.
enum class JobNamer {
    SelfRegistration,  // malld itself, naming a self-registered job
    Root,              // a sender or tool user of uid 0 (the Slurm plugin)
    Other,             // everyone else: an --admin-uid, mallrun run by a user, a container's annotation
};
struct ReservedJobPrefix {
    const char *prefix;
    const char *kept_for;  // "kept for <this>": what the names are and who gives them
    JobNamer namer;        // who may give such a name
};
inline constexpr const char *kSelfJobPrefix = "self-";
inline constexpr const char *kSlurmJobPrefix = "slurm-";
inline constexpr ReservedJobPrefix kReservedJobPrefixes[] = {
    {kSelfJobPrefix,
     "self-registered jobs (malld names them self-<pid> and re-adopts them by that name after a restart)",
     JobNamer::SelfRegistration},
    {kSlurmJobPrefix,
     "Slurm jobs (the Slurm plugin registers slurm-<jobid> as root; Slurm's epilog releases it)",
     JobNamer::Root},
};
// The reserved prefix `name` starts with; nullptr for a name under none.
inline const ReservedJobPrefix *reserved_job_prefix(std::string_view name) {
    for (const ReservedJobPrefix &reserved : kReservedJobPrefixes)
        if (name.substr(0, std::string_view(reserved.prefix).size()) == reserved.prefix) return &reserved;
    return nullptr;
}
// "" when `namer` may give a job the name `name` (or a prefix of job names, such as the OCI hook's
// --job-prefix: a prefix under a reserved one makes every name under it reserved); else the words
// of the refusal, "job names starting with 'slurm-' are kept for Slurm jobs (...)".
inline std::string reserved_job_name_problem(std::string_view name, JobNamer namer) {
    const ReservedJobPrefix *reserved = reserved_job_prefix(name);
    if (!reserved || reserved->namer == namer) return "";
    return std::string("job names starting with '") + reserved->prefix + "' are kept for " + reserved->kept_for;
}

}  // namespace mall
