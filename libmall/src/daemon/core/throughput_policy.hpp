// SPDX-License-Identifier: BSD-3-Clause
// throughput_policy.hpp — the `throughput` co-scheduling policy's counting core, a pure function:
// from each job's measured progress rates at the core counts it has run on, how many cores each
// job should get so that the node's total normalised throughput is largest. No I/O, no clock: the
// caller passes what it measured and which jobs are still inside their dwell time.
//
// The model, in a few lines:
//   - A job's rate at n cores is estimated from its samples: the measured rate where it ran at n
//     (mean of its samples there); between two measured counts lo < n < hi, the most a concave,
//     non-decreasing curve could give there, min(rate(lo) * n / lo, max(rate(lo), rate(hi))) —
//     optimistic, so the policy tries those counts and their measurements replace the bound;
//     outside them, Amdahl's law through the nearest measured point, with the serial fraction
//     fitted to all samples by least squares on 1/rate = a + b/n (s = a/(a+b)). With samples at
//     fewer than two counts the job is assumed to scale linearly (s = 0): optimism is the
//     exploration — an unmeasured job gets cores, runs on them, and its curve is then known.
//   - Throughputs are normalised by the job's own one-core rate (speedup S(n) = rate(n) / R), so a
//     job counting images and one counting tokens weigh the same per unit of speedup.
//   - Cores are handed out one at a time from every job's min, each to the job whose speedup gains
//     most from it (ties: fewer cores, then earlier job), within max. When no job gains from the
//     next core (all at max, or measured flat), it stays idle: lending it would only add contention.
//   - Probing: a job measured at a single count (and still there) is moved by one core, down when
//     above its min, else up, so that its next report gives the curve a second point (one job per
//     plan; the others share the core it frees).
//   - Damping: a job inside its dwell time is neither shrunk (while the pool lasts) nor probed (it
//     may still grow into cores no other job gains more from, e.g. those of a job that ended); and
//     the new plan replaces the current counts (when those are within every job's limits and the
//     pool) only when it adds at least `gain_threshold` (in one-core speedups summed over the
//     node) — otherwise the current counts stay, so measurement noise does not move cores.
//   - max is always respected, and min while the pool lasts (earlier jobs first); guaranteed
//     cores (Slurm) are the caller's to honour through min.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace mall {

struct RateSample {
    int cpus = 0;       // the core count the job ran on
    double rate = 0;    // work units per second measured there (> 0)
};

struct ThroughputJob {
    std::string id;
    int min = 1;
    int max = 1;
    uint64_t order = 0;               // registration order: earlier jobs win ties
    int current = 0;                  // cores it holds now
    bool in_dwell = false;            // changed less than the dwell time ago: keeps at least
                                      // `current` (within max, while the pool lasts), no probe
    std::vector<RateSample> samples;  // what it measured
};

struct ThroughputOptions {
    // A new plan must add at least this much total speedup (in one-core units) over the current
    // counts to replace them.
    double gain_threshold = 0.1;
};

// The fitted curve of one job (exposed for tests and for `mallctl status`).
struct SpeedupEstimate {
    double one_core_rate = 0;   // R
    double serial_fraction = 0; // s of the Amdahl fit (0 when fewer than two counts were measured)
    std::map<int, double> measured;  // mean measured rate per core count
    double rate(int cpus) const;     // measured, interpolated, or the fit through the nearest point
    double speedup(int cpus) const;  // rate(cpus) / R (0 for cpus <= 0)
};

SpeedupEstimate estimate_speedup(const std::vector<RateSample> &samples);

// Core counts per job id for a pool of pool_size cores. Every job appears in the result.
std::map<std::string, int> compute_throughput_counts(int pool_size, const std::vector<ThroughputJob> &jobs,
                                                     const ThroughputOptions &options = {});

}  // namespace mall
