// SPDX-License-Identifier: BSD-3-Clause
// job_cpu_time.hpp — how malld measures the cpu time a job used (CpusetBackend::cpu_time_readings
// reads the counters, KernelEffects::cpu_time keeps their account):
// a running total, per job, built from counters that come and go (the job's processes, its
// cgroups) and that never goes back. CpuTimeAccount is the pure part (KernelEffects keeps one per
// job); the readers below turn /proc and cgroup files into its readings with the project's readers
// (files.hpp, procfs.hpp), reading only what malld already tracks: the job's registered processes
// and their descendants (at most kMaxMeasuredProcesses), or the job's own cgroups.
// Contract: malld's event loop calls these; nothing throws; an unreadable counter is left out.
#pragma once

#include <sys/types.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace mall {

// One counter of cpu seconds at one moment, named by a key that never names another counter
// (a process: its pid and start time, so a reused pid is a new key; a cgroup: its path).
struct CpuTimeReading {
    std::string key;
    double seconds = 0;  // the counter's cumulative value
    // When the counter started, in boot-clock ticks (a process's start time), or none when
    // unknown (a cgroup): a counter first seen with no start after the previous sample is taken
    // as a baseline, since its earlier time was not spent in this interval.
    std::optional<unsigned long long> started_ticks;
};

// The cpu seconds a job used since its first sample. Each sample adds, per key seen in the
// previous sample too, how much its counter grew (a counter that went back adds nothing); a key
// first seen adds its whole counter when it started at or after the previous sample (a process
// forked since), else nothing. Keys gone since are forgotten, so the map holds only the counters
// of the last sample. The total never decreases.
class CpuTimeAccount {
public:
    // Takes a sample made at `now_ticks` (boot clock) and returns the new total.
    double add_sample(const std::vector<CpuTimeReading> &readings, unsigned long long now_ticks);
    double total() const { return total_; }
    // True when the last sample took some counter as a baseline (first seen, its earlier time
    // unknown): the growth up to that sample misses that counter's, so the window it closes is
    // incomplete (a cgroup or a process that joined the job since the sample before).
    bool last_sample_began_a_counter() const { return began_a_counter_; }
    size_t counters() const { return last_.size(); }

private:
    std::map<std::string, double> last_;
    std::optional<unsigned long long> last_sample_ticks_;
    double total_ = 0;
    bool began_a_counter_ = false;
};

// A job whose process tree holds more processes than this is not measured (the readers return no
// reading): each sample costs a read of every process's /proc/PID/stat, every 2 s, as root.
inline constexpr size_t kMaxMeasuredProcesses = 4096;

// The processes `pids` and their descendants, each read once from /proc/PID/stat: key
// "pid:start", utime + stime in seconds, started at its start time; none at all when the tree
// holds more than kMaxMeasuredProcesses.
std::vector<CpuTimeReading> process_tree_cpu_readings(const std::vector<pid_t> &pids);

// cgroup v2: the cpu time of every task that ever ran in a cgroup or below it, exited ones
// included: "usage_usec" of its cpu.stat (present in every v2 cgroup, with or without the cpu
// controller). Seconds; nullopt when the text has no such line.
std::optional<double> parse_cpu_stat_usage(const std::string &cpu_stat_text);
// Drops each path that lies below another one of `paths` (its time is already in that one's).
std::vector<std::string> outermost_cgroups(const std::vector<std::string> &paths);
// One reading per outermost cgroup of `paths` whose cpu.stat can be read: key its path and inode
// (a cgroup removed and made again under the same path, even by a user it is delegated to, is a
// new counter).
std::vector<CpuTimeReading> cgroup_cpu_readings(const std::vector<std::string> &paths);

}  // namespace mall
