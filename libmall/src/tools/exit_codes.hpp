// SPDX-License-Identifier: BSD-3-Clause
// exit_codes.hpp — the exit statuses mallctl and mallrun share, as their --help texts document
// them: scripts (and the Slurm plugin's callers) tell "malld said no" from "malld is not there".
#pragma once

namespace mall::tools {

constexpr int kExitOk = 0;
constexpr int kExitRefused = 1;      // malld answered and refused (its reason is printed)
constexpr int kExitUsage = 2;        // bad command line; nothing was sent
constexpr int kExitUnreachable = 3;  // no malld at the socket
constexpr int kExitCannotRun = 127;  // mallrun: the command could not be executed

}  // namespace mall::tools
