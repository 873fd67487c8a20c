// SPDX-License-Identifier: BSD-3-Clause
// throughput_policy.cpp — the throughput policy's counting core (see throughput_policy.hpp for the
// model): Amdahl fits of measured rates, greedy marginal-gain allocation, dwell and gain damping.
#include "throughput_policy.hpp"

#include <algorithm>
#include <iterator>

#include "registration_order.hpp"

namespace mall {

double SpeedupEstimate::rate(int cpus) const {
    if (cpus <= 0) return 0;
    auto amdahl = [this](int n) { return 1.0 / (serial_fraction + (1.0 - serial_fraction) / n); };
    if (measured.empty()) return one_core_rate * amdahl(cpus);
    auto above = measured.lower_bound(cpus);
    if (above != measured.end() && above->first == cpus) return above->second;
    if (above == measured.begin())  // below every measured count: the fit, through the lowest point
        return above->second * amdahl(cpus) / amdahl(above->first);
    auto below = std::prev(above);
    if (above == measured.end())  // above every measured count: the fit, through the highest point
        return below->second * amdahl(cpus) / amdahl(below->first);
    // Between two measured counts: the most a concave, non-decreasing curve through them could
    // give (no more than linear growth from the lower point, no more than the upper point). This
    // optimism makes the policy try the counts in between, whose measurements then replace it.
    return std::min(below->second * cpus / below->first, std::max(below->second, above->second));
}

double SpeedupEstimate::speedup(int cpus) const {
    if (cpus <= 0 || !(one_core_rate > 0)) return 0;
    return rate(cpus) / one_core_rate;
}

SpeedupEstimate estimate_speedup(const std::vector<RateSample> &samples) {
    SpeedupEstimate e;
    std::map<int, std::pair<double, int>> sums;  // cpus -> (sum of rates, count)
    for (const auto &s : samples) {
        if (s.cpus < 1 || !(s.rate > 0)) continue;
        sums[s.cpus].first += s.rate;
        sums[s.cpus].second += 1;
    }
    for (const auto &[cpus, sum] : sums) e.measured[cpus] = sum.first / sum.second;
    if (e.measured.empty()) {
        e.one_core_rate = 1;  // unknown scale: speedups are all that matter, and they are linear
        return e;
    }
    if (e.measured.size() == 1) {  // one count: assume linear scaling through it (optimistic)
        const auto &[cpus, rate] = *e.measured.begin();
        e.one_core_rate = rate / cpus;
        return e;
    }
    // Least squares of y = 1/rate on x = 1/cpus over the measured counts: y = a + b x.
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    const double n = static_cast<double>(e.measured.size());
    for (const auto &[cpus, rate] : e.measured) {
        const double x = 1.0 / cpus, y = 1.0 / rate;
        sx += x;
        sy += y;
        sxx += x * x;
        sxy += x * y;
    }
    const double denominator = n * sxx - sx * sx;
    double b = denominator > 0 ? (n * sxy - sx * sy) / denominator : 0;
    double a = (sy - b * sx) / n;
    if (b < 0) {  // more cores made it slower everywhere: all serial, through the mean
        b = 0;
        a = sy / n;
    }
    if (a < 0) {  // better than linear (noise, caches): linear through the origin
        a = 0;
        b = sxy / sxx;
    }
    e.serial_fraction = a / (a + b);
    e.one_core_rate = e.rate(1);
    return e;
}

namespace {

double total_speedup(const std::vector<SpeedupEstimate> &curves, const std::vector<int> &counts) {
    double total = 0;
    for (size_t i = 0; i < curves.size(); ++i) total += curves[i].speedup(counts[i]);
    return total;
}

}  // namespace

std::map<std::string, int> compute_throughput_counts(int pool_size, const std::vector<ThroughputJob> &jobs,
                                                     const ThroughputOptions &options) {
    // Registration order decides who gets its min first and who wins ties.
    const std::vector<size_t> order = registration_order(jobs);
    std::vector<SpeedupEstimate> curves(jobs.size());
    std::vector<int> low(jobs.size()), high(jobs.size());
    for (size_t i = 0; i < jobs.size(); ++i) {
        curves[i] = estimate_speedup(jobs[i].samples);
        low[i] = std::max(0, jobs[i].min);
        high[i] = std::max(low[i], jobs[i].max);
    }

    // 1. Every job's min, earlier jobs first while the pool lasts.
    std::vector<int> plan(jobs.size(), 0);
    int left = std::max(0, pool_size);
    for (size_t i : order) {
        plan[i] = std::min(low[i], left);
        left -= plan[i];
    }
    // 2. Jobs in their dwell time keep at least what they hold (within their limits, while the
    //    pool lasts): no core is taken from them, but they may still grow in step 4 into cores no
    //    one else gains more from (a core freed by a job that ended is not an oscillation).
    std::vector<bool> fixed(jobs.size(), false);
    for (size_t i : order) {
        if (!jobs[i].in_dwell) continue;
        const int keep = std::clamp(jobs[i].current, plan[i], high[i]);
        const int extra = std::min(keep - plan[i], left);
        plan[i] += extra;
        left -= extra;
    }
    // 3. Probing: a job measured at a single count, still at that count, cannot tell its slope
    //    (one point fits any curve), so it is moved by one core, down when it can, else up, and
    //    the next rate it reports fits the curve. Without this a job that scales badly would look
    //    linear forever.
    bool probing = false;
    for (size_t i : order) {
        if (jobs[i].in_dwell || curves[i].measured.size() != 1 ||
            curves[i].measured.begin()->first != jobs[i].current)
            continue;
        const int at = jobs[i].current;
        int probe = at > low[i] ? at - 1 : at + 1;
        if (probe > high[i]) continue;  // min == max: nothing to learn, nothing to decide
        const int extra = std::min(std::max(probe - plan[i], 0), left);
        if (plan[i] + extra != probe) continue;  // the pool cannot hold the probe
        plan[i] += extra;
        left -= extra;
        fixed[i] = true;
        probing = true;
        break;  // one probe at a time: the others share what it frees
    }
    // 4. Each further core to the job that gains most from it.
    while (left > 0) {
        size_t best = jobs.size();
        double best_gain = 0;
        for (size_t i : order) {
            if (fixed[i] || plan[i] >= high[i]) continue;
            const double gain = curves[i].speedup(plan[i] + 1) - curves[i].speedup(plan[i]);
            if (gain <= 0) continue;
            if (best == jobs.size() || gain > best_gain + 1e-12 ||
                (gain > best_gain - 1e-12 && plan[i] < plan[best])) {
                best = i;
                best_gain = gain;
            }
        }
        if (best == jobs.size()) break;
        ++plan[best];
        --left;
    }

    // 5. Damping: keep the current counts unless the plan adds at least the threshold (a probe
    //    always goes ahead: it is how the curves get known).
    std::vector<int> current(jobs.size());
    bool current_feasible = true;
    int current_total = 0;
    for (size_t i = 0; i < jobs.size(); ++i) {
        current[i] = jobs[i].current;
        current_total += current[i];
        if (current[i] < low[i] || current[i] > high[i] || (fixed[i] && current[i] != plan[i]))
            current_feasible = false;
    }
    if (current_total > pool_size) current_feasible = false;
    const bool keep_current =
        !probing && current_feasible && total_speedup(curves, plan) - total_speedup(curves, current) < options.gain_threshold;

    std::map<std::string, int> counts;
    for (size_t i = 0; i < jobs.size(); ++i) counts[jobs[i].id] = keep_current ? current[i] : plan[i];
    return counts;
}

}  // namespace mall
