// SPDX-License-Identifier: BSD-3-Clause
// signal_control.hpp — the 32-bit value `mallctl signal` queues (sigqueue) to a process that opted in
// to control by signal (MALL_SIGNAL_CONTROL), and its decoding in libmall. Header-only, no state.
// Contract: encode_* refuse what does not fit with words that say the limit; decode refuses any
// value that is not one of ours (tag, op, ranges), so a stray sigqueue never changes anything.
//
// Layout (sival_int, 32 bits): bits 31-30 the tag 0b10; bits 29-28 the operation:
//   0 THREADS  bits 10-0: threads (0 = auto: one per cpu, 1..1024); the cpus stay
//   1 RANGE    bits 27-20: threads (0 = auto, 1..255); bits 19-10: first cpu (0..1023);
//              bits 9-0: count - 1 (first + count <= 1024)
// Other operations are reserved (refused).
//
// The status record: a process that opted in keeps a memfd named "mall-signal" (close-on-exec)
// holding one text record of kRecordSize bytes, rewritten in place with one pwrite() after each
// request it handled (never from the signal handler). `mallctl signal` finds it as the link
// "/memfd:mall-signal (deleted)" under /proc/PID/fd, which the kernel lets only the process's
// owner or root open (the people who may signal it). Lines "key value", first "mall-signal 1",
// then seq N ... end N (equal when the read was not torn):
//   pid, signal (the number to send), api, mode (detached|attached), job, allowed (0|1: malld let
//   the job take signals), bound (the cpus requests must stay within), cpus and threads (what the
//   process runs now), received, handled (requests taken / decided), last (the value of the last
//   decided request, hex), from (its sender's pid), result (none|applied|refused|superseded), why.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <map>
#include <optional>
#include <sstream>
#include <string>

#include "mall/mall.h"

namespace mall::signal_control {

constexpr uint32_t kTag = 0x2u;  // bits 31-30
enum class Op : uint32_t { Threads = 0, Range = 1 };
constexpr int kMaxThreadsAlone = 1024;
constexpr int kMaxThreadsWithRange = 255;

struct Request {
    Op op = Op::Threads;
    int threads = 0;      // 0 = auto
    int first_cpu = -1;   // Range only
    int cpu_count = 0;    // Range only
};

inline std::optional<uint32_t> encode_threads(int threads, std::string *why) {
    if (threads < 0 || threads > kMaxThreadsAlone) {
        if (why) *why = "threads must be 1 to " + std::to_string(kMaxThreadsAlone) + " or auto";
        return std::nullopt;
    }
    return (kTag << 30) | (static_cast<uint32_t>(Op::Threads) << 28) | static_cast<uint32_t>(threads);
}

inline std::optional<uint32_t> encode_range(int threads, int first_cpu, int cpu_count, std::string *why) {
    if (first_cpu < 0 || cpu_count < 1 || first_cpu + cpu_count > MALL_MAX_CPUS) {
        if (why) *why = "the cpus must be one range a-b within 0-" + std::to_string(MALL_MAX_CPUS - 1);
        return std::nullopt;
    }
    if (threads < 0 || threads > kMaxThreadsWithRange) {
        if (why) *why = "with --cpus, threads must be 1 to " + std::to_string(kMaxThreadsWithRange) + " or auto";
        return std::nullopt;
    }
    if (threads > cpu_count) {
        if (why) *why = "threads " + std::to_string(threads) + " exceed the " + std::to_string(cpu_count) + " cpus given";
        return std::nullopt;
    }
    return (kTag << 30) | (static_cast<uint32_t>(Op::Range) << 28) | (static_cast<uint32_t>(threads) << 20) |
           (static_cast<uint32_t>(first_cpu) << 10) | static_cast<uint32_t>(cpu_count - 1);
}

// nullopt for anything that is not a well-formed request (async-signal-safe: no allocation).
inline std::optional<Request> decode(uint32_t value) {
    if ((value >> 30) != kTag) return std::nullopt;
    const uint32_t op = (value >> 28) & 0x3u;
    Request r;
    if (op == static_cast<uint32_t>(Op::Threads)) {
        if ((value & 0x0ffff800u) != 0) return std::nullopt;  // unused bits must be zero
        r.op = Op::Threads;
        r.threads = static_cast<int>(value & 0x7ffu);
        if (r.threads > kMaxThreadsAlone) return std::nullopt;
        return r;
    }
    if (op == static_cast<uint32_t>(Op::Range)) {
        r.op = Op::Range;
        r.threads = static_cast<int>((value >> 20) & 0xffu);
        r.first_cpu = static_cast<int>((value >> 10) & 0x3ffu);
        r.cpu_count = static_cast<int>(value & 0x3ffu) + 1;
        if (r.first_cpu + r.cpu_count > MALL_MAX_CPUS || r.threads > r.cpu_count) return std::nullopt;
        return r;
    }
    return std::nullopt;
}

constexpr size_t kRecordSize = 12288;  // two cpu lists of MALL_CPULIST_MAX and the rest
constexpr const char *kRecordName = "mall-signal";
constexpr int kRecordFormat = 1;

struct Record {
    long pid = 0;
    int signal = 0;
    std::string api, mode, job, bound, cpus, result, why;
    bool allowed = false;
    int threads = 0;
    uint64_t received = 0, handled = 0;
    uint32_t last = 0;
    long from = 0;
};

// The record in `text`, or nullopt when it is not one (another format, torn, cut short).
inline std::optional<Record> parse_record(const std::string &text) {
    std::map<std::string, std::string> fields;
    std::istringstream in(text.substr(0, text.find('\0')));
    std::string line;
    bool first = true;
    while (std::getline(in, line)) {
        const auto space = line.find(' ');
        const std::string key = line.substr(0, space);
        const std::string value = space == std::string::npos ? "" : line.substr(space + 1);
        if (first && (key != kRecordName || value != std::to_string(kRecordFormat))) return std::nullopt;
        first = false;
        fields[key] = value;
    }
    if (first || !fields.count("seq") || fields["seq"] != fields["end"]) return std::nullopt;
    auto number = [&](const char *key, int base = 10) -> std::optional<unsigned long long> {
        auto it = fields.find(key);
        if (it == fields.end() || it->second.empty()) return std::nullopt;
        char *end = nullptr;
        const unsigned long long v = std::strtoull(it->second.c_str(), &end, base);
        if (*end != '\0') return std::nullopt;
        return v;
    };
    Record r;
    const auto pid = number("pid"), signal = number("signal"), threads = number("threads"),
               received = number("received"), handled = number("handled"), last = number("last", 16),
               from = number("from");
    if (!pid || !signal || !threads || !received || !handled || !last || !from) return std::nullopt;
    r.pid = static_cast<long>(*pid);
    r.signal = static_cast<int>(*signal);
    r.threads = static_cast<int>(*threads);
    r.received = *received;
    r.handled = *handled;
    r.last = static_cast<uint32_t>(*last);
    r.from = static_cast<long>(*from);
    r.api = fields["api"];
    r.mode = fields["mode"];
    r.job = fields["job"];
    r.allowed = fields["allowed"] == "1";
    r.bound = fields["bound"];
    r.cpus = fields["cpus"];
    r.result = fields["result"];
    r.why = fields["why"];
    return r;
}

}  // namespace mall::signal_control
