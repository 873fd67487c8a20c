// SPDX-License-Identifier: BSD-3-Clause
// slurmd_spool.hpp — which Slurm jobs run on this node, learnt from the node itself, without an
// RPC to slurmctld: every running step of a job has a slurmstepd, and every slurmstepd listens on
// a socket "<node>_<jobid>.<stepid>" in slurmd's spool folder (SlurmdSpoolDir with %n and %h
// expanded) until the step ends; the extern step (PrologFlags=contain) and the batch step live as
// long as the job. pam_slurm_adopt and `scontrol listpids` find a node's jobs the same way.
// Contract: read() lists the job ids with at least one such socket, owned by root, in a folder
// owned by root (or SlurmdUser's uid, given) and not writable by anyone else; it follows no
// symlink (the folder is opened O_NOFOLLOW, entries are lstat'ed) and reads at most
// kMaxSpoolEntries names, so what a user could plant or pile up is never believed or unbounded.
// A folder that cannot be read or trusted gives no list and says why (the caller asks slurmctld).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>

namespace mall {

// "node1_123.0" or "node1_123.4294967291" with node "node1" -> 123; anything else -> nullopt.
std::optional<uint32_t> stepd_socket_job_id(std::string_view file_name, std::string_view node);

// SlurmdSpoolDir as slurm.conf writes it, with slurmd's own expansions: %n the node's name, %h the
// host's name, %% a percent sign (other % sequences are kept as they are).
std::string expand_slurmd_spool_dir(const std::string &pattern, const std::string &node, const std::string &host);

inline constexpr std::size_t kMaxSpoolEntries = 65536;

class SlurmdSpool {
public:
    // `folder`: the expanded SlurmdSpoolDir; `node`: this node's Slurm name (the sockets' prefix).
    SlurmdSpool(std::string folder, std::string node, uid_t slurmd_uid = 0)
        : folder_(std::move(folder)), node_(std::move(node)), slurmd_uid_(slurmd_uid) {}

    struct Listing {
        std::set<uint32_t> jobs;  // jobs with a step on this node now
        std::string error;        // not empty: no listing (the folder's fault, in words with a fix)
        bool ok() const { return error.empty(); }
    };
    Listing read() const;
    const std::string &folder() const { return folder_; }

private:
    std::string folder_;
    std::string node_;
    uid_t slurmd_uid_;
};

}  // namespace mall
