// SPDX-License-Identifier: BSD-3-Clause
// fixture_internal.hpp — what the support files share among themselves and no test calls: the
// watchdog sweep's registry of process groups, cgroup folders and temp dirs (fixture_sweep.cpp),
// and fork/exec/wait of a child (fixture_process.cpp). Contract: whatever spawn() starts is in the
// sweep's registry until its owner untracks it after reaping it; safe_write is async-signal-safe.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "support/malld_fixture.hpp"

namespace mall::test::internal {

// The sweep's registry (fixed arrays: the watchdog's handler allocates nothing). A track_* call
// returns a slot for its untrack_* (-1 when the registry is full or the path too long).
void track_group(pid_t pgid);
void untrack_group(pid_t pgid);
int track_cgroup_dir(const std::string &path);
void untrack_cgroup_dir(int slot);
int track_temp_dir(const std::string &path);
void untrack_temp_dir(int slot);
// The cgroup root the sweep moves leftover processes to (cpuset_root(), set at start-up).
void set_sweep_cpuset_root(const std::string &root);
// Writes s to stderr with write(2) only: safe in a signal handler and after fork.
void safe_write(const char *s);

// Everything a child needs, prepared before fork (no allocation after fork).
struct SpawnPlan {
    std::vector<std::string> argv_storage, env_storage;
    std::vector<char *> argv, envp;
    bool as_nobody = false;
    uid_t uid = 0;
    gid_t gid = 0;
};

// argv with the environment minus MALL_* plus env; as_nobody: the child becomes user nobody.
SpawnPlan make_plan(const std::vector<std::string> &argv,
                    const std::vector<std::pair<std::string, std::string>> &env, bool as_nobody);
// Forks and execs; the child gets its own process group (tracked for the sweep), stdout/stderr on
// the given fds (-1 = inherit). Returns the pid or -1.
pid_t spawn(const SpawnPlan &plan, int stdout_fd, int stderr_fd);
// A waitpid status as an exit code: the code, 128+signal when killed, -1 otherwise.
int decode_status(int status);
// Waits for pid to exit, up to timeout; returns its code or nullopt.
std::optional<int> wait_pid(pid_t pid, Millis timeout);

}  // namespace mall::test::internal
