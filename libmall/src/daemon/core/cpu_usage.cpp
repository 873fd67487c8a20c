// SPDX-License-Identifier: BSD-3-Clause
// cpu_usage.cpp — how busy a job keeps the cpus it holds (see node_manager.hpp's
// record_cpu_time and busy_fraction): windows between samples of the backend's cpu-time
// counter, measured against the core-seconds the job held in the same window. Changes no
// allocation: the figures are reported (status, metrics, history), nothing decides from them yet.
#include "node_manager.hpp"

namespace mall {

std::optional<double> busy_fraction(double cpu_seconds, double core_seconds) {
    if (!(core_seconds > 0) || cpu_seconds < 0) return std::nullopt;
    return cpu_seconds / core_seconds;
}

void NodeManager::record_cpu_time(const std::string &job, double counter, TimePoint now, CpuSampleKind kind) {
    auto it = jobs_.find(job);
    if (it == jobs_.end()) return;
    Job &self = it->second;
    const double core_seconds = accounting(self, now).core_seconds;
    const bool window_open = self.cpu_mark_counter && counter >= *self.cpu_mark_counter && now > self.cpu_mark_time;
    const bool long_enough = now - self.cpu_mark_time >= kMinCpuWindow;
    if (window_open && !long_enough && kind == CpuSampleKind::Regular) return;  // too short yet: it goes on
    if (window_open) {
        const double ran = counter - *self.cpu_mark_counter;
        self.cpu_seconds += ran;
        if (long_enough && kind != CpuSampleKind::Incomplete)
            self.cpu_busy = busy_fraction(ran, core_seconds - self.cpu_mark_core_seconds);
    }
    self.cpu_mark_counter = counter;
    self.cpu_mark_time = now;
    self.cpu_mark_core_seconds = core_seconds;
}

void NodeManager::sample_cpu_time(const std::string &job, TimePoint now, CpuSampleKind kind) {
    if (auto sample = effects_.cpu_time(job))
        record_cpu_time(job, sample->seconds, now, sample->incomplete ? CpuSampleKind::Incomplete : kind);
}

void NodeManager::sample_cpu_times(TimePoint now) {
    for (const auto &[name, job] : jobs_) sample_cpu_time(name, now);
}

}  // namespace mall
