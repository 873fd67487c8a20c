// SPDX-License-Identifier: BSD-3-Clause
// persistence.hpp — malld's memory across restarts. At start: opens the state folder once (every
// later save and load goes through that descriptor) and loads the state file, re-adopts the
// jobs whose very processes still run (same pid and start time) without touching their cpusets,
// drops the rest (and any whose saved cgroups the backend would never have saved: a crafted file),
// and removes job cgroups no adopted job owns. A job the kernel lets run on more cpus than the file
// says (malld killed between a widening write and its save) keeps those cpus, lent to nobody else,
// until malld narrows it to its published cpus right after the adoption; of those, cpus another job
// holds or that are reclaimed (or reserved) are taken off it at once. While running: after every batch of
// events, hands a snapshot to a writer thread when the state's fingerprint changed (the disk's
// fsync never stalls the loop; snapshots coalesce, the newest wins). At a clean stop: flush().
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "../common/cpuset.hpp"
#include "../common/unix_socket.hpp"  // UniqueFd
#include "backend.hpp"
#include "core/node_manager.hpp"
#include "kernel_effects.hpp"
#include "pid_watch.hpp"
#include "state_file.hpp"

namespace mall {

class StateWriter;

class Persistence {
public:
    explicit Persistence(std::string state_dir);
    ~Persistence();  // writes what is pending, then stops the writer thread
    Persistence(const Persistence &) = delete;
    Persistence &operator=(const Persistence &) = delete;

    // Opens the state folder once (files.hpp's open_private_folder: made 0700 with any missing
    // folder above it; refused when it is a link, not malld's or writable by others, or when a
    // folder above it could be changed by anyone but root or malld's user and is not sticky), and
    // keeps the descriptor: every save and load after goes through it, so a folder renamed and
    // replaced later is never written into or read. Pins it (pin_folder) for the history file.
    // Removes temp files a killed malld left, starts the writer thread and reads the state file:
    // nullopt with *error empty on a fresh start, with *error set when the folder or the file is
    // unusable.
    std::optional<SavedState> open(std::string *error);
    // How to fix a refused state folder, for messages (malld_main's and open()'s).
    static std::string state_folder_fix();

    // Re-adopts the saved jobs into the core (see the file comment); reserved and reclaimed cpus
    // are restored within `pool`.
    void adopt(const SavedState &saved, const CpuSet &pool, NodeManager &manager, CpusetBackend &backend,
               KernelEffects &effects, PidWatcher &pids);
    // Job cgroups that no job of the core owns (a malld that died before its state file caught
    // up, a deleted state file) are removed: their processes go back to the root cpuset.
    static void remove_stale_job_cgroups(const NodeManager &manager, CpusetBackend &backend);

    // Queues a write when anything the file holds, progress counters aside, changed (always with
    // `force`). Runs after every batch of events: it builds the snapshot and its fingerprint (the
    // saved fields as bytes, no text) and compares that with the last one written.
    void save_if_changed(const NodeManager &manager, const CpuSet &pool, const PidWatcher &pids,
                         const CpusetBackend &backend, bool force = false);
    void flush();  // waits until the newest snapshot is on disk

private:
    std::string dir_;
    UniqueFd dir_fd_;  // before writer_: the writer thread ends before the folder is closed
    std::string last_saved_;
    std::unique_ptr<StateWriter> writer_;
};

}  // namespace mall
