// SPDX-License-Identifier: BSD-3-Clause
// probe_support.hpp — what the adapter probes (omp_probe_main.cpp, torch_probe_main.cpp) share:
// their command line, opening mall, the step loop's end (--seconds or --stop-file) and the record
// of which cpus and masks the threads of one parallel region had. Header-only.
#pragma once

#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <mall/mall.h>

#include "example_support.hpp"

namespace mall::test {

constexpr int kMaxTeam = 1024;

// What each thread of one parallel region saw: its cpu and its affinity mask, by thread number.
struct TeamObservation {
    std::atomic<bool> seen[kMaxTeam];
    int cpu[kMaxTeam];
    cpu_set_t mask[kMaxTeam];

    void clear() {
        for (auto &s : seen) s.store(false);
    }
    // Called by the thread with number id (0-based) inside the region.
    void record(int id) {
        if (id < 0 || id >= kMaxTeam) return;
        cpu[id] = sched_getcpu();
        CPU_ZERO(&mask[id]);
        if (sched_getaffinity(0, sizeof mask[id], &mask[id]) != 0) CPU_ZERO(&mask[id]);
        seen[id].store(true);
    }
    int team() const {
        int n = 0;
        for (const auto &s : seen) n += s.load();
        return n;
    }
    std::string ran_on() const {
        cpu_set_t set;
        CPU_ZERO(&set);
        for (int i = 0; i < kMaxTeam; ++i)
            if (seen[i].load() && cpu[i] >= 0 && cpu[i] < CPU_SETSIZE) CPU_SET(cpu[i], &set);
        return text_or_none(set);
    }
    // The mask every thread had, or "mixed:UNION" when they differ ("none" without threads).
    std::string affinity() const {
        cpu_set_t all;
        CPU_ZERO(&all);
        const cpu_set_t *first = nullptr;
        bool equal = true;
        for (int i = 0; i < kMaxTeam; ++i) {
            if (!seen[i].load()) continue;
            if (first == nullptr) first = &mask[i];
            CPU_OR(&all, &all, &mask[i]);
            equal = equal && CPU_EQUAL(&mask[i], first);
        }
        if (first == nullptr) return "none";
        return equal ? text_or_none(all) : "mixed:" + text_or_none(all);
    }
    static std::string text_or_none(const cpu_set_t &set) {
        const std::string text = mall::examples::cpu_list(set);
        return text.empty() ? "none" : text;
    }
};

struct ProbeOptions {
    long step_ms = 5;
    long seconds = 120;
    std::string stop_file;
};

// --step-ms N --seconds N --stop-file PATH; false (usage printed) on anything else.
inline bool parse_probe_options(int argc, char **argv, const char *program, ProbeOptions *options) {
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (i + 1 < argc && arg == "--step-ms") options->step_ms = std::atol(argv[++i]);
        else if (i + 1 < argc && arg == "--seconds") options->seconds = std::atol(argv[++i]);
        else if (i + 1 < argc && arg == "--stop-file") options->stop_file = argv[++i];
        else {
            std::fprintf(stderr, "usage: %s [--step-ms N] [--seconds N] [--stop-file PATH]\n", program);
            return false;
        }
    }
    return true;
}

// mall_open(NULL) (under mallrun: $MALL_SOCKET); on failure one "not malleable" line naming the
// thread count the probe keeps. *open_rc receives mall_open's code.
inline mall_t *open_probe_handle(const char *program, int threads, int *open_rc) {
    mall_t *m = nullptr;
    mall_error_t err{};
    *open_rc = mall_open(nullptr, &m, &err);
    if (*open_rc != MALL_SUCCESS)
        std::fprintf(stderr, "%s: not malleable (%s: %s); running with %d threads\n", program,
                     mall_strerror(*open_rc), err.text, threads);
    return m;
}

// The end of one probe step: true when the stop file exists or --seconds have passed since
// `start`; otherwise sleeps --step-ms and returns false.
inline bool probe_step_ends_run(const ProbeOptions &options, const timespec &start) {
    if (!options.stop_file.empty() && access(options.stop_file.c_str(), F_OK) == 0) return true;
    timespec now{};
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (now.tv_sec - start.tv_sec >= options.seconds) return true;
    timespec pause{options.step_ms / 1000, (options.step_ms % 1000) * 1000000L};
    nanosleep(&pause, nullptr);
    return false;
}

}  // namespace mall::test
