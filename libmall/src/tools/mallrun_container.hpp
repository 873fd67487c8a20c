// SPDX-License-Identifier: BSD-3-Clause
// mallrun_container.hpp — what `mallrun --container` decides before it registers the job: the
// cgroup driver the engine will use for this run (so malld makes a folder or a slice to match).
// The options added to the engine's `run` are container_engine.hpp's (pure, unit-tested).
// Contract: without systemd running here the driver is cgroupfs and nothing is asked; otherwise
// podman's --cgroup-manager in CMD wins, else the engine is asked (`podman info`, `docker info`,
// bounded to 60 s). The systemd driver on cgroup v1 is refused with words (podman falls back to
// cgroupfs when CMD did not name it).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tools/container_engine.hpp"
#include "tools/mallrun_options.hpp"

namespace mall::tools::mallrun {

// The driver for this run, or nullopt with *why; on success *why may hold a note for --verbose.
std::optional<CgroupDriver> choose_cgroup_driver(const Options &o, std::string *why);

// CMD as a shell would show it (words with blanks or shell characters in single quotes).
std::string quoted_command(const std::vector<std::string> &command);

}  // namespace mall::tools::mallrun
