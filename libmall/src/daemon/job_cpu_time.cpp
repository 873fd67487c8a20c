// SPDX-License-Identifier: BSD-3-Clause
// job_cpu_time.cpp — see job_cpu_time.hpp. A process's time comes from /proc/PID/stat
// (procfs.hpp's parser splits after the last ')'), a cgroup's from its cpu.stat, each read with
// read_text_file; the account adds only growth, so a process that exits (its counter vanishes)
// or a pid that is reused (a new key) never makes the total go back.
#include "job_cpu_time.hpp"

#include <sys/stat.h>

#include <set>
#include <sstream>

#include "../common/files.hpp"
#include "cgroup_tree.hpp"
#include "procfs.hpp"

namespace mall {

double CpuTimeAccount::add_sample(const std::vector<CpuTimeReading> &readings, unsigned long long now_ticks) {
    std::map<std::string, double> seen;
    began_a_counter_ = false;
    for (const CpuTimeReading &r : readings) {
        if (!seen.emplace(r.key, r.seconds).second) continue;  // a key counts once per sample
        auto before = last_.find(r.key);
        if (before != last_.end()) {
            if (r.seconds > before->second) total_ += r.seconds - before->second;
        } else if (last_sample_ticks_ && r.started_ticks && *r.started_ticks >= *last_sample_ticks_ &&
                   r.seconds > 0) {
            total_ += r.seconds;  // started since the sample before: all its time is this window's
        } else {
            began_a_counter_ = true;  // a baseline
        }
    }
    last_ = std::move(seen);
    last_sample_ticks_ = now_ticks;
    return total_;
}

std::vector<CpuTimeReading> process_tree_cpu_readings(const std::vector<pid_t> &pids) {
    std::set<pid_t> tree;
    for (pid_t pid : pids) {
        if (pid <= 0 || !tree.insert(pid).second) continue;
        for (pid_t d : descendants_of(pid)) tree.insert(d);
        if (tree.size() > kMaxMeasuredProcesses) return {};
    }
    const double hz = static_cast<double>(clock_ticks_per_second());
    std::vector<CpuTimeReading> out;
    for (pid_t pid : tree) {
        auto time = process_cpu_time(pid);
        if (!time) continue;  // gone since
        out.push_back({std::to_string(pid) + ":" + std::to_string(time->start_ticks),
                       static_cast<double>(time->cpu_ticks) / hz, time->start_ticks});
    }
    return out;
}

std::optional<double> parse_cpu_stat_usage(const std::string &cpu_stat_text) {
    std::istringstream in(cpu_stat_text);
    std::string name;
    unsigned long long value = 0;
    while (in >> name) {
        if (!(in >> value)) return std::nullopt;
        if (name == "usage_usec") return static_cast<double>(value) / 1e6;
    }
    return std::nullopt;
}

std::vector<std::string> outermost_cgroups(const std::vector<std::string> &paths) {
    std::vector<std::string> out;
    for (size_t i = 0; i < paths.size(); ++i) {
        bool inner = false;
        for (size_t j = 0; j < paths.size() && !inner; ++j) {
            if (paths[j] == paths[i]) inner = j < i;  // a duplicate counts once
            else inner = cgroup_tree::is_path_prefix(paths[j], paths[i]);
        }
        if (!inner) out.push_back(paths[i]);
    }
    return out;
}

std::vector<CpuTimeReading> cgroup_cpu_readings(const std::vector<std::string> &paths) {
    std::vector<CpuTimeReading> out;
    for (const std::string &path : outermost_cgroups(paths)) {
        std::string text;
        struct stat folder {};
        if (::stat(path.c_str(), &folder) != 0 || !read_text_file(path + "/cpu.stat", &text)) continue;
        if (auto seconds = parse_cpu_stat_usage(text))
            out.push_back({path + ":" + std::to_string(folder.st_ino), *seconds, std::nullopt});
    }
    return out;
}

}  // namespace mall
