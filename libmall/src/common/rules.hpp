// SPDX-License-Identifier: BSD-3-Clause
// rules.hpp — the values and bounds every part of mall must agree on, each defined once: the
// default socket, malld's default ack timeout, how long tools wait to connect, the job weight
// bound. Header-only and free of dependencies beyond the public mall.h, so pure parsers (the
// Slurm plugin's option logic) use the same rule as malld without linking mall_common. Change a
// rule here and nowhere else.
#pragma once

#include <chrono>

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

}  // namespace mall
