// SPDX-License-Identifier: BSD-3-Clause
// Unit tests of the throughput policy's counting core (libmall/src/daemon/core/throughput_policy.hpp):
// the Amdahl fit, allocations against a brute-force optimum for jobs with known speedup curves
// (linear, Amdahl with serial fraction 0.3, flat after 4 cores), learning from its own
// measurements without oscillating, dwell and gain damping, and min/max.
#include <cmath>
#include <cstdio>
#include <functional>

#include <gtest/gtest.h>

#include "daemon/core/throughput_policy.hpp"
#include "support/watchdog.h"

namespace mall {
namespace {

MALL_TEST_WATCHDOG(60);

using Curve = std::function<double(int)>;  // true speedup at n cores (rate at 1 core = 1)

const Curve kLinear = [](int n) { return static_cast<double>(n); };
const Curve kAmdahl03 = [](int n) { return 1.0 / (0.3 + 0.7 / n); };
const Curve kFlatAfter4 = [](int n) { return static_cast<double>(std::min(n, 4)); };

std::vector<RateSample> all_samples(const Curve &curve, int max, double scale) {
    std::vector<RateSample> samples;
    for (int n = 1; n <= max; ++n) samples.push_back({n, scale * curve(n)});
    return samples;
}

double true_total(const std::vector<Curve> &curves, const std::vector<ThroughputJob> &jobs,
                  const std::map<std::string, int> &counts) {
    double total = 0;
    for (size_t i = 0; i < jobs.size(); ++i) total += curves[i](counts.at(jobs[i].id));
    return total;
}

// The best total speedup over every allocation within min..max that fits the pool.
double brute_force_best(const std::vector<Curve> &curves, const std::vector<ThroughputJob> &jobs, int pool) {
    double best = 0;
    std::vector<int> n(jobs.size());
    std::function<void(size_t, int)> walk = [&](size_t i, int left) {
        if (i == jobs.size()) {
            double total = 0;
            for (size_t k = 0; k < jobs.size(); ++k) total += curves[k](n[k]);
            best = std::max(best, total);
            return;
        }
        for (int c = jobs[i].min; c <= std::min(jobs[i].max, left); ++c) {
            n[i] = c;
            walk(i + 1, left - c);
        }
    };
    walk(0, pool);
    return best;
}

ThroughputJob job(const std::string &id, int min, int max, uint64_t order) {
    ThroughputJob j;
    j.id = id;
    j.min = min;
    j.max = max;
    j.order = order;
    return j;
}

TEST(SpeedupEstimate, FitsAmdahlAndKeepsMeasuredRates) {
    const auto amdahl = estimate_speedup({{1, 10.0}, {2, 10.0 * kAmdahl03(2)}, {4, 10.0 * kAmdahl03(4)}});
    EXPECT_NEAR(amdahl.serial_fraction, 0.3, 1e-9);
    EXPECT_NEAR(amdahl.one_core_rate, 10.0, 1e-9);
    EXPECT_NEAR(amdahl.speedup(8), kAmdahl03(8), 1e-9);  // extrapolated
    EXPECT_DOUBLE_EQ(amdahl.rate(2), 10.0 * kAmdahl03(2));  // measured

    const auto linear = estimate_speedup({{2, 6.0}, {4, 12.0}});
    EXPECT_NEAR(linear.serial_fraction, 0.0, 1e-9);
    EXPECT_NEAR(linear.speedup(16), 16.0, 1e-9);

    const auto unknown = estimate_speedup({});
    EXPECT_DOUBLE_EQ(unknown.speedup(5), 5.0) << "an unmeasured job is assumed linear (exploration)";
    const auto one_count = estimate_speedup({{4, 8.0}, {4, 12.0}});
    EXPECT_DOUBLE_EQ(one_count.rate(4), 10.0) << "samples at one count are averaged";
    EXPECT_DOUBLE_EQ(one_count.speedup(2), 2.0);

    const auto slower = estimate_speedup({{1, 10.0}, {2, 8.0}});  // more cores, less work
    EXPECT_DOUBLE_EQ(slower.serial_fraction, 1.0);
    const auto junk = estimate_speedup({{0, 5.0}, {3, -1.0}, {2, std::nan("")}});
    EXPECT_TRUE(junk.measured.empty());
}

// With every curve measured, the allocation reaches (nearly) the brute-force optimum.
TEST(ThroughputPolicy, KnownCurvesReachTheBestTotal) {
    const std::vector<Curve> curves{kLinear, kAmdahl03, kFlatAfter4};
    for (int pool : {4, 6, 8, 12, 16}) {
        std::vector<ThroughputJob> jobs{job("linear", 1, pool, 1), job("amdahl", 1, pool, 2), job("flat", 1, pool, 3)};
        const double scales[] = {100.0, 7.0, 3000.0};  // different units of work: normalisation matters
        for (size_t i = 0; i < jobs.size(); ++i) jobs[i].samples = all_samples(curves[i], pool, scales[i]);
        const auto counts = compute_throughput_counts(pool, jobs);
        int used = 0;
        for (const auto &j : jobs) {
            EXPECT_GE(counts.at(j.id), j.min);
            EXPECT_LE(counts.at(j.id), j.max);
            used += counts.at(j.id);
        }
        EXPECT_LE(used, pool);
        const double best = brute_force_best(curves, jobs, pool);
        EXPECT_GE(true_total(curves, jobs, counts), 0.97 * best)
            << "pool " << pool << ": linear " << counts.at("linear") << " amdahl " << counts.at("amdahl") << " flat "
            << counts.at("flat");
        EXPECT_LE(counts.at("flat"), 4) << "cores past 4 add nothing to the flat job";
    }
}

// Starting from nothing known, each round it runs the jobs at the counts it chose and learns their
// rates there (with 2% noise): it must end near the optimum and stop moving cores.
TEST(ThroughputPolicy, LearnsTheCurvesAndSettlesWithoutOscillating) {
    const Curve amdahl01 = [](int n) { return 1.0 / (0.1 + 0.9 / n); };
    for (bool with_linear : {true, false}) {
    const std::vector<Curve> curves{kFlatAfter4, kAmdahl03, with_linear ? kLinear : amdahl01};
    for (int pool : {8, 16, 32}) {
        SCOPED_TRACE("pool " + std::to_string(pool) + (with_linear ? " with a linear job" : " Amdahl 0.1 job"));
        std::vector<ThroughputJob> jobs{job("flat", 1, pool, 1), job("amdahl", 1, pool, 2),
                                        job("linear", 1, pool, 3)};
        std::vector<std::map<std::string, int>> history;
        for (int round = 0; round < 40; ++round) {
            const auto counts = compute_throughput_counts(pool, jobs);
            history.push_back(counts);
            for (size_t i = 0; i < jobs.size(); ++i) {
                const int n = counts.at(jobs[i].id);
                jobs[i].current = n;
                const double noise = 1.0 + 0.02 * std::sin(round * 7.0 + static_cast<double>(i) * 3.0);
                jobs[i].samples.push_back({n, 50.0 * curves[i](n) * noise});
            }
        }
        const auto &final_counts = history.back();
        const double best = brute_force_best(curves, jobs, pool);
        const double reached = true_total(curves, jobs, final_counts);
        std::printf("pool %d: flat %d amdahl %d linear %d -> %.2f of best %.2f (%.3f)\n", pool,
                    final_counts.at("flat"), final_counts.at("amdahl"), final_counts.at("linear"), reached, best,
                    reached / best);
        EXPECT_GE(reached, 0.9 * best);
        int changes_in_last_20 = 0;
        for (size_t r = history.size() - 20; r < history.size(); ++r)
            changes_in_last_20 += history[r] != history[r - 1];
        EXPECT_EQ(changes_in_last_20, 0) << "cores kept moving";
        EXPECT_LE(final_counts.at("flat"), 5);
    }
    }
}

TEST(ThroughputPolicy, DwellKeepsACountAndSmallGainsMoveNothing) {
    std::vector<ThroughputJob> jobs{job("a", 1, 8, 1), job("b", 1, 8, 2)};
    jobs[0].samples = all_samples(kLinear, 8, 1.0);
    jobs[1].samples = all_samples(kLinear, 8, 1.0);
    jobs[0].current = 6;
    jobs[1].current = 2;
    // Both linear: 6+2 is as good as 4+4, so nothing moves.
    auto counts = compute_throughput_counts(8, jobs);
    EXPECT_EQ(counts.at("a"), 6);
    EXPECT_EQ(counts.at("b"), 2);

    // b becomes flat at 1 core: a should take 7; but a dwelling b keeps its 2.
    jobs[1].samples = all_samples([](int) { return 1.0; }, 8, 1.0);
    jobs[1].in_dwell = true;
    counts = compute_throughput_counts(8, jobs);
    EXPECT_EQ(counts.at("b"), 2);
    EXPECT_EQ(counts.at("a"), 6);
    jobs[1].in_dwell = false;
    counts = compute_throughput_counts(8, jobs);
    EXPECT_EQ(counts.at("b"), 1);
    EXPECT_EQ(counts.at("a"), 7);

    // A dwelling job is not shrunk, but it grows into cores that nobody else gains from: b (flat)
    // left alone with a dwelling a at 4 of 8 cores gets 1, a takes the rest.
    jobs[0].in_dwell = true;
    jobs[0].current = 4;
    jobs[1].current = 1;
    counts = compute_throughput_counts(8, jobs);
    EXPECT_EQ(counts.at("a"), 7);
    EXPECT_EQ(counts.at("b"), 1);
    jobs[0].in_dwell = false;
    jobs[0].current = 6;
    jobs[1].current = 2;

    // A gain below the threshold does not move cores; a larger threshold keeps even that one.
    ThroughputOptions sticky;
    sticky.gain_threshold = 2.0;
    counts = compute_throughput_counts(8, jobs, sticky);
    EXPECT_EQ(counts.at("a"), 6);
    EXPECT_EQ(counts.at("b"), 2);
}

TEST(ThroughputPolicy, LimitsAndShortPools) {
    std::vector<ThroughputJob> jobs{job("a", 3, 4, 1), job("b", 2, 8, 2), job("c", 2, 8, 3)};
    auto counts = compute_throughput_counts(6, jobs);  // mins 7 > 6: earlier jobs get theirs first
    EXPECT_EQ(counts.at("a"), 3);
    EXPECT_EQ(counts.at("b"), 2);
    EXPECT_EQ(counts.at("c"), 1);
    counts = compute_throughput_counts(32, jobs);  // unknown curves: linear, so every core is used
    EXPECT_EQ(counts.at("a"), 4);
    EXPECT_EQ(counts.at("b"), 8);
    EXPECT_EQ(counts.at("c"), 8);
    EXPECT_TRUE(compute_throughput_counts(8, {}).empty());
    counts = compute_throughput_counts(0, jobs);
    EXPECT_EQ(counts.at("a") + counts.at("b") + counts.at("c"), 0);
}

}  // namespace
}  // namespace mall
