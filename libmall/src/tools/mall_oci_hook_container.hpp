// SPDX-License-Identifier: BSD-3-Clause
// mall_oci_hook_container.hpp — what mall-oci-hook reads of a container: the OCI state the runtime
// passes on stdin, the host uid its user maps to (the bundle's config.json), and the io.mall.*
// annotations that say what to register, within the limits the admin set in the hooks.d file.
// Contract: pure reading, no malld: each function returns its result or nullopt with *error in
// words that name the bad value (shown printable, one line, at most 80 characters) and how to fix
// the container's annotation. Whoever creates a container writes its annotations, so they are
// requests: the job's name is always the admin's prefix and then the annotation's name (never a
// Slurm job's "slurm-N", never '/' or control characters), the weight is refused above the admin's
// cap, and MAX is cut to the admin's cap of cores.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/rules.hpp"

namespace mall::tools::oci_hook {

// The annotations the hook reads (the container's definition: podman run --annotation K=V).
inline constexpr const char *kAnnMalleable = "io.mall.malleable";
inline constexpr const char *kAnnJob = "io.mall.job";
inline constexpr const char *kAnnWeight = "io.mall.weight";
inline constexpr const char *kAnnRequire = "io.mall.require";

// The admin's limits on what a container may ask (the hook's options, in the hooks.d file).
inline constexpr const char *kDefaultJobPrefix = "ctr-";
inline constexpr double kDefaultMaxWeight = 100;
inline constexpr size_t kMaxJobPrefixLength = 32;
// A container job never takes a reserved name (mall::reserved_job_name_problem with
// JobNamer::Other: "slurm-<jobid>", which a Slurm epilog releases; "self-<pid>").

struct Limits {
    std::string job_prefix = kDefaultJobPrefix;  // every job name starts with it
    double max_weight = kDefaultMaxWeight;       // io.mall.weight above it is refused
    int max_cores = 1;                           // MAX above it is cut to it (default: the node's cpus)
};

// "" when `prefix` may start every container job's name (job-name characters, at most
// kMaxJobPrefixLength, under no reserved prefix: not slurm-, not self-); else what is wrong.
std::string job_prefix_problem(const std::string &prefix);

// The OCI state: the container's id, bundle, init pid and string annotations.
struct State {
    std::string id;
    std::string bundle;
    int64_t pid = 0;  // 0: none (poststop)
    std::vector<std::pair<std::string, std::string>> annotations;

    std::optional<std::string> annotation(const char *key) const {
        for (const auto &[k, v] : annotations)
            if (k == key) return v;
        return std::nullopt;
    }
};

// The state on stdin (a JSON object with a non-empty "id"; "pid" a process id when present).
std::optional<State> parse_state(const std::string &text, std::string *error);

// The host uid the container's process runs as: process.user.uid mapped through
// linux.uidMappings (none: the same uid). nullopt with *error when config.json says otherwise.
std::optional<uint32_t> host_uid_of(const std::string &bundle, std::string *error);

// What the annotations ask for, within the admin's limits.
struct Request {
    int min = 1;
    std::optional<int> max;        // nullopt: the whole pool (the caller cuts it to max_cores)
    std::optional<int> asked_max;  // the annotation's MAX when it was above max_cores
    std::string job;
    double weight = mall::kDefaultWeight;
    bool require = false;
};

// A value from the container's definition as it is shown in a message: one line, printable, short.
std::string shown(const std::string &value);

// The job's name: the prefix, then io.mall.job or else the first 12 characters of the id
// ("ctr-train", "ctr-0123456789ab"). Refused: a name that is not a valid job name, or a Slurm job's.
std::optional<std::string> job_name_of(const State &s, const std::string &prefix, std::string *error);

// All the annotations: io.mall.malleable (required; MIN[:MAX] by the tools' shared parser, MAX
// cut to limits.max_cores), io.mall.job (under limits.job_prefix), io.mall.weight (at most
// limits.max_weight), io.mall.require.
std::optional<Request> parse_request(const State &s, const Limits &limits, std::string *error);

}  // namespace mall::tools::oci_hook
