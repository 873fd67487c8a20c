// SPDX-License-Identifier: BSD-3-Clause
// mallrun_container.hpp — what `mallrun --container` decides before it registers the job: the
// cgroup driver the engine will use for this run (so malld makes a folder or a slice to match).
// The options added to the engine's `run` are container_engine.hpp's (pure, unit-tested).
// Contract: without systemd running here the driver is cgroupfs and nothing is asked; otherwise
// podman's --cgroup-manager in CMD wins, else the engine is asked (`podman info`, `docker info`,
// bounded to 60 s). The systemd driver on cgroup v1 is refused with words (podman falls back to
// cgroupfs when CMD did not name it). As root the engine is run from the system folders only
// (pin_engine_program).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tools/container_engine.hpp"
#include "tools/mallrun_options.hpp"

namespace mall::tools::mallrun {

// As root (euid 0), CMD's engine named without a folder ("podman") becomes its path in the system
// folders (common/run_bounded.hpp's trusted_program_path: root-owned, never through $PATH), for
// `ENGINE info` and the run itself; false with *why when there is none. A path CMD names
// ("/opt/podman/bin/podman": root chose it) and any other user's CMD are left as they are.
bool pin_engine_program(Options *o, std::string *why);

// The driver for this run, or nullopt with *why; on success *why may hold a note for --verbose.
std::optional<CgroupDriver> choose_cgroup_driver(const Options &o, std::string *why);

// CMD as a shell would show it (words with blanks or shell characters in single quotes).
std::string quoted_command(const std::vector<std::string> &command);

}  // namespace mall::tools::mallrun
