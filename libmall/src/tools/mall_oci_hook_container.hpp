// SPDX-License-Identifier: BSD-3-Clause
// mall_oci_hook_container.hpp — what mall-oci-hook reads of a container: the OCI state the runtime
// passes on stdin, the host uid its user maps to (the bundle's config.json), and the io.mall.*
// annotations that say what to register. Contract: pure reading, no malld: each function returns
// its result or nullopt with *error in words that name the bad value (shown printable, one line,
// at most 80 characters) and how to fix the container's annotation.
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

// What the annotations ask for.
struct Request {
    int min = 1;
    std::optional<int> max;  // nullopt: the whole pool
    std::string job;
    double weight = mall::kDefaultWeight;
    bool require = false;
};

// A value from the container's definition as it is shown in a message: one line, printable, short.
std::string shown(const std::string &value);

// The job's name (io.mall.job, else ctr-<12 characters of the id>); poststop needs only this.
std::optional<std::string> job_name_of(const State &s, std::string *error);

// All the annotations: io.mall.malleable (required; MIN[:MAX] by the tools' shared parser),
// io.mall.job, io.mall.weight, io.mall.require.
std::optional<Request> parse_request(const State &s, std::string *error);

}  // namespace mall::tools::oci_hook
