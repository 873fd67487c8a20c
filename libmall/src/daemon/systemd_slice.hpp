// SPDX-License-Identifier: BSD-3-Clause
// systemd_slice.hpp — the systemd slice of a container job whose engine uses the systemd cgroup
// driver (podman --cgroup-manager=systemd with crun or runc, docker with native.cgroupdriver=systemd).
// Contract: such an engine takes a slice name, not a path, as --cgroup-parent, and puts the
// container's scope (podman: libpod-<id>.scope, its processes in crun's `container` child; docker:
// docker-<id>.scope) and podman's conmon scope in it. A job's slice is mall-<job>.slice below
// mall.slice, i.e. the cgroup /mall.slice/mall-<job>.slice; '-' would nest slices and ':' ends the
// slice in an OCI cgroupsPath, so the job name is escaped as systemd-escape does (\xNN). Systemd owns
// a slice's files: malld resizes it with `systemctl set-property --runtime SLICE AllowedCPUs=...`
// (kept across systemd's re-applications, dropped with `systemctl revert`), never by writing
// cpuset.cpus alone. The names are pure functions (the unit tests drive them); the systemctl calls
// are in systemd_slice.cpp (part of mall_daemon).
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "../common/cpuset.hpp"

namespace mall::systemd_slice {

constexpr const char *kParentSlice = "mall.slice";
constexpr const char *kJobSlicePrefix = "mall-";
constexpr const char *kSliceSuffix = ".slice";
constexpr size_t kUnitNameMax = 255;  // systemd's UNIT_NAME_MAX less the terminating zero

// The job's name as one component of a slice name: letters, digits, '_' and '.' stay (a leading
// '.' does not), anything else becomes \xNN (lower-case hex), so the mapping can be undone.
std::string escape_component(const std::string &text);
// The way back; nullopt for text escape_component cannot have written.
std::optional<std::string> unescape_component(const std::string &text);

// "mall-<escaped job>.slice"; nullopt when the escaped name is longer than a unit name may be.
std::optional<std::string> job_slice_name(const std::string &job);

// The job whose slice `name` is ("mall-a\x2db.slice" -> "a-b"); nullopt for any other name.
std::optional<std::string> job_of_slice(const std::string &name);

// Where systemd puts a job slice's cgroup, relative to the cgroup2 mount: "/mall.slice/<name>"
// (each '-' of a slice name is a level; the escaped job has none).
std::string cgroup_path_of(const std::string &job_slice);
std::string parent_cgroup_path();

// sd_booted(): systemd is PID 1 and manages units here.
bool systemd_booted();

// What one systemctl operation (one call, or stop_and_forget's two) may take of malld's event loop,
// which waits for it: a systemd too busy to answer in that time is reported, not waited for.
constexpr std::chrono::milliseconds kSystemctlBudget{5000};

// Runs `systemctl ARGS...` without a shell, bounded by `limit` (common/run_bounded.hpp: the output
// and the exit together; a systemctl still running then is killed). As root systemctl is taken
// from the system folders only (common/run_bounded.hpp's trusted_program_path), never through
// $PATH; as another user through $PATH. True on exit 0; otherwise false with *error holding the
// command and what it printed.
bool run_systemctl(const std::vector<std::string> &args, std::string *error,
                   std::chrono::milliseconds limit = kSystemctlBudget);

// The systemd way to resize a unit's cpuset: AllowedCPUs, for this boot only. Works on a slice that
// is not started yet (systemd keeps the setting and applies it when the engine starts a scope in it).
bool set_allowed_cpus(const std::string &unit, const CpuSet &cpus, std::string *error);

// Stops an (empty) slice, which removes its cgroup, and drops what set-property wrote for it; both
// systemctl calls together within kSystemctlBudget.
bool stop_and_forget(const std::string &unit, std::string *error);

}  // namespace mall::systemd_slice
