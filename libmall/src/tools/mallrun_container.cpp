// SPDX-License-Identifier: BSD-3-Clause
// mallrun_container.cpp — what `mallrun --container` asks of the host before it registers the job
// (see mallrun_container.hpp): which cgroup driver the engine will use, asked of the engine with a
// bounded `podman info` / `docker info`; and, for root, the engine's path in the system folders.
#include "tools/mallrun_container.hpp"

#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/run_bounded.hpp"
#include "tools/mallrun_child.hpp"

namespace mall::tools::mallrun {

namespace {

// Runs `words` (no shell; a program without '/' looked up in PATH) with stdin from /dev/null and stderr kept, bounded by
// `limit` (common/run_bounded): its stdout, or nullopt with *error when it could not run, failed or
// took too long.
std::optional<std::string> capture_output(const std::vector<std::string> &words, std::chrono::seconds limit,
                                          std::string *error) {
    BoundedCommand command;
    command.argv = words;
    command.search_path = words[0].find('/') == std::string::npos;
    command.limit = limit;
    BoundedResult result = run_bounded(command);
    if (result.spawn_error != 0) {
        *error = "it could not be run (" + std::string(std::strerror(result.spawn_error)) + ")";
        return std::nullopt;
    }
    if (result.timed_out) {
        *error = "it did not answer within " + std::to_string(limit.count()) + " s";
        return std::nullopt;
    }
    if (!result.exited_zero()) {
        *error = "it ended with status " + std::to_string(exit_code_of(result.status));
        return std::nullopt;
    }
    return std::move(result.output);
}

// True when /sys/fs/cgroup is the unified cgroup v2 hierarchy (where systemd sets cpusets).
bool unified_cgroup_hierarchy() {
    struct statfs fs {};
    constexpr long kCgroup2SuperMagic = 0x63677270;
    return statfs("/sys/fs/cgroup", &fs) == 0 && static_cast<long>(fs.f_type) == kCgroup2SuperMagic;
}

}  // namespace

std::string quoted_command(const std::vector<std::string> &command) {
    std::string text;
    for (const auto &a : command) {
        if (!text.empty()) text += ' ';
        const bool plain = !a.empty() && a.find_first_of(" \t\n'\"$\\;&|<>()*?[]{}`!#~") == std::string::npos;
        text += plain ? a : "'" + a + "'";
    }
    return text;
}

bool pin_engine_program(Options *o, std::string *why) {
    if (!o->container || o->command.empty() || o->command[0].find('/') != std::string::npos) return true;
    if (::geteuid() != 0) return true;
    std::string error;
    auto path = mall::trusted_program_path(o->command[0], &error);
    if (!path) {
        *why = "as root, mallrun --container runs " + o->command[0] + " only from the system folders: " + error +
               "; or name the engine by its full path in CMD";
        return false;
    }
    o->command[0] = *path;
    return true;
}

// The cgroup driver the engine will use for this run. Without systemd running here both engines
// use cgroupfs (podman falls back to it), so nothing is asked; otherwise CMD's podman
// --cgroup-manager, else the engine's own answer (`podman info`, `docker info`). systemd needs
// cgroup v2 (systemd sets cpusets on the unified hierarchy only): podman is then told to use
// cgroupfs, as before; docker's driver is its daemon's, so mallrun refuses with words.
// nullopt with *why on failure; else *why may hold a note for --verbose.
std::optional<CgroupDriver> choose_cgroup_driver(const Options &o, std::string *why) {
    struct stat st {};
    const bool systemd_here = lstat("/run/systemd/system", &st) == 0 && S_ISDIR(st.st_mode);
    std::optional<CgroupDriver> driver;
    if (o.engine == "podman") {
        if (auto named = explicit_cgroup_manager(o.command)) {
            driver = parse_cgroup_driver(*named);
            if (!driver) {
                *why = "podman --cgroup-manager='" + *named + "' is neither systemd nor cgroupfs";
                return std::nullopt;
            }
        }
    }
    if (!driver && !systemd_here) {
        *why = "systemd does not run here";
        return CgroupDriver::Cgroupfs;
    }
    if (!driver) {
        const auto info = engine_info_command(o.command, o.engine);
        std::string error;
        auto text = capture_output(info, std::chrono::seconds(60), &error);
        if (text) driver = parse_cgroup_driver(*text);
        if (!driver) {
            const std::string asked = "`" + quoted_command(info) + "` " +
                                      (text ? "answered '" + *text + "', neither systemd nor cgroupfs" : error);
            if (o.engine == "podman") {
                // podman run takes the driver mallrun names: the one that worked before.
                *why = "cannot ask podman for its cgroup manager (" + asked + "): using cgroupfs";
                return CgroupDriver::Cgroupfs;
            }
            *why = "cannot ask docker for its cgroup driver: " + asked + "; is dockerd running?";
            return std::nullopt;
        }
    }
    if (*driver == CgroupDriver::Systemd && !unified_cgroup_hierarchy()) {
        if (o.engine == "podman" && !explicit_cgroup_manager(o.command)) {
            *why = "podman's systemd manager on cgroup v1, where systemd sets no cpusets: using cgroupfs";
            return CgroupDriver::Cgroupfs;
        }
        *why = o.engine + " uses the systemd cgroup driver on cgroup v1, where systemd sets no cpusets, "
               "so malld could not resize the container; " +
               (o.engine == "docker" ? "configure dockerd with the cgroupfs driver (daemon.json: "
                                       "\"exec-opts\": [\"native.cgroupdriver=cgroupfs\"])"
                                     : "use podman --cgroup-manager=cgroupfs") +
               ", or boot with cgroup v2";
        return std::nullopt;
    }
    return driver;
}

}  // namespace mall::tools::mallrun
