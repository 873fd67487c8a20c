// SPDX-License-Identifier: BSD-3-Clause
// state_file.hpp — malld's state on disk (JSON, mode 0600, written atomically: a temp file with an
// unpredictable name created O_EXCL|O_NOFOLLOW + fsync + rename, all through the state folder's
// descriptor), so a restarted malld re-adopts running jobs without touching their cpusets. Holds
// the pool, the reclaimed cpus and those reserved for an owner, the policy, and per job: spec, order, pids with
// their start times, the cgroups it is enforced on (in place, with their original cpus, or malld's
// own), enforced and published cpus, generation, pin, usage cap, and its counters.
// The field list is in state_file.cpp (visit_job_fields). Unreadable or foreign files are reported, never half-applied.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend.hpp"
#include "core/node_manager.hpp"

namespace mall {

struct SavedPid {
    pid_t pid = 0;
    unsigned long long start_time = 0;
};

// The job's accounting times, as wall-clock seconds since the epoch (the core keeps steady-clock
// time points, which mean nothing to the next malld): Persistence converts both ways.
struct SavedTimes {
    double registered_at = 0;
    double accounted_until = 0;
    std::optional<double> oversubscribed_since;
};

struct SavedJob {
    Job job;
    std::vector<SavedPid> pids;
    std::vector<JobCgroup> cgroups;  // where the backend enforces it (absent in files before 0.3)
    SavedTimes times;                // absent in files before issue 18: then "the load's moment"
    bool has_times = false;
};

struct SavedState {
    std::string pool;
    CpuSet reclaimed;
    std::map<std::string, CpuSet> reserved;  // owner -> reclaimed cpus reserved for it
    std::string policy;
    std::vector<SavedJob> jobs;
    NodeTotals totals;  // the node's accounting (absent in files before issue 18: zero)
};

nlohmann::json state_to_json(const SavedState &state);
std::optional<SavedState> state_from_json(const nlohmann::json &j, std::string *error);
// Everything the file holds except the progress counters (last ack latency, work units, steps,
// the accounting figures and times, the node's totals), which change at every report and are
// saved along with another change or at malld's --checkpoint-interval, as compact bytes: malld
// writes the file when this changes. Taken from the same field list as state_to_json, so
// every field the file gains counts.
std::string state_fingerprint(const SavedState &state);
// Writes "malld.state.json" (mode 0600) in the folder open as `dir_fd` (its name `dir` is for
// messages) through a temp file "malld.state.json.tmp.<random>" created O_EXCL|O_NOFOLLOW there,
// renamed over it (renameat), then fsyncs the folder. False with *error.
bool save_state(int dir_fd, const std::string &dir, const SavedState &state, std::string *error);
// The same for the folder at path `dir` (opened O_NOFOLLOW for this call: tests and tools).
bool save_state(const std::string &dir, const SavedState &state, std::string *error);
// Removes temp files a killed malld left in the folder ("malld.state.json.tmp" of mallds before
// issue 37 and "malld.state.json.tmp.*"), without following links. Returns how many.
int remove_stale_state_temp_files(int dir_fd);
int remove_stale_state_temp_files(const std::string &dir);
// nullopt with *error empty: no state file (a fresh start); with *error set: unreadable (a
// symlink or anything but a regular file is refused, never followed). Read from the folder open as
// `dir_fd` (openat O_NOFOLLOW), or at path `dir` (a missing folder is a fresh start).
std::optional<SavedState> load_state(int dir_fd, const std::string &dir, std::string *error);
std::optional<SavedState> load_state(const std::string &dir, std::string *error);

}  // namespace mall
