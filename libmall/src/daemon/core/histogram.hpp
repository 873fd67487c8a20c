// SPDX-License-Identifier: BSD-3-Clause
// histogram.hpp — a fixed-bucket histogram of durations in seconds, the shape Prometheus wants
// (cumulative `le` buckets, a sum and a count). malld keeps one per job for its ack latency and
// one per node for ack latency and reclaim duration. Every histogram uses the same bounds
// (kDurationBounds), so `mallctl status --json` gives them once ("histogram_bounds_seconds") and
// each histogram as {"counts": [per bucket, not cumulative; the last is above every bound],
// "sum": seconds, "count": n}. Observing costs no allocation.
#pragma once

#include <array>
#include <cstdint>
#include <optional>

#include <nlohmann/json.hpp>

namespace mall {

// From 100 µs (a process blocked in mall_wait answers in tens of µs) to a minute (a reclaim that
// waits for long training steps); a quarter-decade apart.
inline constexpr std::array<double, 18> kDurationBounds = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1,    0.25,    0.5,    1,     2.5,    5,     10,   30,    60};

class DurationHistogram {
public:
    static constexpr size_t kBuckets = kDurationBounds.size() + 1;  // the last: above every bound

    void observe(double seconds) {
        if (!(seconds >= 0)) seconds = 0;  // NaN or a clock step back: counted as instant
        size_t bucket = 0;
        while (bucket < kDurationBounds.size() && seconds > kDurationBounds[bucket]) ++bucket;
        ++counts_[bucket];
        sum_ += seconds;
        ++count_;
    }
    void add(const DurationHistogram &other) {
        for (size_t i = 0; i < kBuckets; ++i) counts_[i] += other.counts_[i];
        sum_ += other.sum_;
        count_ += other.count_;
    }
    uint64_t count() const { return count_; }
    double sum() const { return sum_; }
    const std::array<uint64_t, kBuckets> &counts() const { return counts_; }
    bool operator==(const DurationHistogram &) const = default;

    nlohmann::json to_json() const {
        return {{"counts", counts_}, {"sum", sum_}, {"count", count_}};
    }
    // None unless `j` is such an object with kBuckets counts that add up to its count.
    static std::optional<DurationHistogram> from_json(const nlohmann::json &j) {
        if (!j.is_object() || !j.contains("counts") || !j.contains("sum") || !j.contains("count")) return std::nullopt;
        const auto &counts = j["counts"];
        if (!counts.is_array() || counts.size() != kBuckets || !j["sum"].is_number() ||
            !j["count"].is_number_unsigned())
            return std::nullopt;
        DurationHistogram h;
        uint64_t total = 0;
        for (size_t i = 0; i < kBuckets; ++i) {
            if (!counts[i].is_number_unsigned()) return std::nullopt;
            h.counts_[i] = counts[i].get<uint64_t>();
            total += h.counts_[i];
        }
        h.sum_ = j["sum"].get<double>();
        h.count_ = j["count"].get<uint64_t>();
        if (total != h.count_ || !(h.sum_ >= 0)) return std::nullopt;
        return h;
    }

private:
    std::array<uint64_t, kBuckets> counts_{};
    double sum_ = 0;
    uint64_t count_ = 0;
};

}  // namespace mall
