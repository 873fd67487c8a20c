// SPDX-License-Identifier: BSD-3-Clause
// example_support.hpp — what the example trainers (and the adapter test probes) share: whether
// the process was launched under malld, a seeded generator that gives the same numbers with every
// standard library, Linux cpu-list text of a cpu set, the count of cpus this process may use, and
// the FNV-1a checksum the trainers print. Header-only.
#pragma once

#include <sched.h>
#include <sys/types.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

namespace mall::examples {

// Launched under malld: by a launcher (mallrun, the Slurm plugin: MALL_JOB_ID) or pointed at a
// malld that allows self-registration (MALL_SOCKET). Only then does an example open libmall.
inline bool launched_under_malld() {
    return std::getenv("MALL_JOB_ID") != nullptr || std::getenv("MALL_SOCKET") != nullptr;
}

// splitmix64: std:: distributions differ between standard libraries, this does not.
class Rng {
public:
    explicit Rng(uint64_t seed) : state_(seed) {}
    uint64_t next() {
        uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
    double normal() {  // Box-Muller
        const double u = std::max(uniform(), 1e-300), v = uniform();
        return std::sqrt(-2.0 * std::log(u)) * std::cos(6.283185307179586 * v);
    }
    uint64_t below(uint64_t n) { return next() % n; }

private:
    uint64_t state_;
};

// Linux list text ("0-1,4") of a cpu set; "" when it is empty.
// Thread ids as "t1,t2" ("-" for none), for the "parked" log lines.
inline std::string tid_list(const std::vector<pid_t> &tids) {
    std::string text;
    for (pid_t tid : tids) text += (text.empty() ? "" : ",") + std::to_string(tid);
    return text.empty() ? "-" : text;
}

inline std::string cpu_list(const cpu_set_t &set) {
    std::string text;
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
        if (!CPU_ISSET(cpu, &set)) continue;
        int last = cpu;
        while (last + 1 < CPU_SETSIZE && CPU_ISSET(last + 1, &set)) ++last;
        if (!text.empty()) text += ',';
        text += std::to_string(cpu);
        if (last > cpu) text += '-' + std::to_string(last);
        cpu = last;
    }
    return text;
}

// The calling thread's allowed cpus as list text ("?" if they cannot be read).
inline std::string affinity_list() {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) != 0) return "?";
    return cpu_list(set);
}

// How many cpus this process may use (1 when that cannot be read).
inline int affinity_count() {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
    return std::max(1, CPU_COUNT(&set));
}

// FNV-1a over raw bytes: the trainers' "checksum" of their final weights.
inline uint64_t fnv1a(const void *data, size_t size) {
    const auto *bytes = static_cast<const unsigned char *>(data);
    uint64_t hash = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < size; ++i) {
        hash ^= bytes[i];
        hash *= 0x100000001b3ull;
    }
    return hash;
}

}  // namespace mall::examples
