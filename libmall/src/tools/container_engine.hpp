// SPDX-License-Identifier: BSD-3-Clause
// container_engine.hpp — what `mallrun --container` knows of podman and docker: which `run` it wraps,
// which cgroup driver the engine uses, and the options that put the container in the job's cgroup.
// Contract: with the cgroupfs driver malld names a folder (/mall/job_X) and podman is told
// --cgroup-manager=cgroupfs; with the systemd driver (podman 5's default on a systemd host with
// cgroup v2, docker's native.cgroupdriver=systemd) malld names a slice (mall-X.slice), which is
// what such an engine takes as --cgroup-parent, and podman is told --cgroup-manager=systemd so the
// container is made the way malld prepared for. The container gets malld's socket folder (which
// holds only the socket) mounted read-only, MALL_SOCKET, MALL_JOB_ID and MALL_MAX. Pure functions, header-only (mallrun and the unit
// tests include it); asking the engine is engine_info_command's words, run by mallrun.
#pragma once

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "common/rules.hpp"
#include "common/text.hpp"

namespace mall::tools {

enum class CgroupDriver { Cgroupfs, Systemd };

inline const char *cgroup_driver_name(CgroupDriver d) { return d == CgroupDriver::Systemd ? "systemd" : "cgroupfs"; }

// "systemd" or "cgroupfs" (what `podman info` and `docker info` print, blanks around allowed).
inline std::optional<CgroupDriver> parse_cgroup_driver(const std::string &text) {
    const std::string word = mall::trim(text);
    if (word == "systemd") return CgroupDriver::Systemd;
    if (word == "cgroupfs") return CgroupDriver::Cgroupfs;
    return std::nullopt;
}

// The index of the engine's `run` word in CMD (`podman run`, `podman container run`, also after
// global options such as `podman --root DIR run`), or nullopt.
inline std::optional<size_t> run_word_index(const std::vector<std::string> &command) {
    for (size_t i = 1; i < command.size(); ++i) {
        if (command[i] == "run") return i;
        if (command[i] == "--") break;
    }
    return std::nullopt;
}

inline std::string program_name(const std::string &path) {
    auto slash = path.find_last_of('/');
    return slash == std::string::npos ? path : path.substr(slash + 1);
}

// Checks CMD for --container; "" when it is a run of a known engine, else what is wrong.
inline std::string container_command_problem(const std::vector<std::string> &command, const std::string &engine) {
    if (engine != "podman" && engine != "docker")
        return "--container needs CMD to be `podman run ...` or `docker run ...` (CMD's program is '" +
               program_name(command[0]) +
               "'); name the engine with --container=podman or "
               "--container=docker when it has another name";
    auto run = run_word_index(command);
    if (!run) return "--container needs a `run` of the engine: " + engine + " run [OPTIONS] IMAGE [CMD...]";
    for (size_t i = *run + 1; i < command.size(); ++i) {
        const std::string &a = command[i];
        if (a == "--cgroup-parent" || a.rfind("--cgroup-parent=", 0) == 0)
            return "mallrun --container sets --cgroup-parent itself (the job's cgroup folder, or its "
                   "systemd slice): remove yours";
        if (a.empty() || a[0] != '-') break;  // the image: what follows is the container's command
    }
    return "";
}

// podman's global --cgroup-manager in CMD (before `run`), when CMD names one.
inline std::optional<std::string> explicit_cgroup_manager(const std::vector<std::string> &command) {
    auto run = run_word_index(command);
    const size_t end = run ? *run : command.size();
    std::optional<std::string> found;
    for (size_t i = 1; i < end; ++i) {
        const std::string &a = command[i];
        if (a.rfind("--cgroup-manager=", 0) == 0) found = a.substr(std::strlen("--cgroup-manager="));
        else if (a == "--cgroup-manager" && i + 1 < end) found = command[++i];
    }
    return found;
}

// The engine's own words for its cgroup driver: CMD's program and global options (a podman --root
// or --cgroup-manager, a docker -H or --context) with `info --format ...` instead of `run ...`.
inline std::vector<std::string> engine_info_command(const std::vector<std::string> &command, const std::string &engine) {
    auto run = run_word_index(command);
    std::vector<std::string> out(command.begin(), command.begin() + static_cast<long>(run ? *run : 1));
    // `podman container run`: the globals end before `container`.
    if (out.size() > 1 && out.back() == "container") out.pop_back();
    out.push_back("info");
    out.push_back(engine == "podman" ? "--format={{.Host.CgroupManager}}" : "--format={{.CgroupDriver}}");
    return out;
}

// The cgroup parent malld answered fits the driver: a slice name for systemd, a path for cgroupfs.
// "" when it does, else what is wrong.
inline std::string cgroup_parent_problem(const std::string &parent, CgroupDriver driver) {
    const bool slice = parent.size() > 6 && parent.compare(parent.size() - 6, 6, ".slice") == 0 &&
                       parent.find('/') == std::string::npos;
    if (driver == CgroupDriver::Systemd && !slice)
        return "malld named the cgroup folder '" + parent +
               "', but the engine uses the systemd cgroup driver, which takes a slice name (this "
               "malld predates systemd drivers: update malld)";
    if (driver == CgroupDriver::Cgroupfs && (parent.empty() || parent[0] != '/'))
        return "malld named '" + parent + "', which is not a cgroup folder for the cgroupfs driver";
    return "";
}

// CMD with the options that make the container part of the job, right after `run` (and, for
// podman, the cgroup manager before it: cgroupfs takes --cgroup-parent as a path, systemd as a
// slice name; a --cgroup-manager CMD names itself is left as it is).
inline std::vector<std::string> container_command(const std::vector<std::string> &command, const std::string &engine,
                                                  CgroupDriver driver, const std::string &cgroup_parent,
                                                  const std::string &socket, const std::string &job, int max) {
    const size_t run = *run_word_index(command);
    const std::string folder = socket.substr(0, socket.find_last_of('/') == 0 ? 1 : socket.find_last_of('/'));
    std::vector<std::string> out(command.begin(), command.begin() + static_cast<long>(run));
    if (engine == "podman" && !explicit_cgroup_manager(command))
        out.push_back(std::string("--cgroup-manager=") + cgroup_driver_name(driver));
    out.push_back("run");
    out.push_back("--cgroup-parent=" + cgroup_parent);
    // Read-only: the container may connect() to the socket (a read-only mount does not stop that),
    // but neither plant nor replace a file in malld's folder.
    out.push_back("--volume=" + folder + ":" + folder + ":ro");
    out.push_back(std::string("--env=") + mall::kSocketEnv + "=" + socket);
    out.push_back(std::string("--env=") + mall::kJobIdEnv + "=" + job);
    out.push_back("--env=MALL_MAX=" + std::to_string(max));
    out.insert(out.end(), command.begin() + static_cast<long>(run) + 1, command.end());
    return out;
}

}  // namespace mall::tools
