// SPDX-License-Identifier: BSD-3-Clause
// backend.cpp — the names of backends and cgroup modes, and make_backend: which backend malld runs,
// from what the host has (backend_probe.cpp). The backends themselves live in their own files:
// backend_cgroup.{hpp,cpp} (the common cgroup layer) with backend_cgroup_v1.cpp and
// backend_cgroup_v2.cpp (the kernel interfaces), cgroup_modes.{hpp,cpp} (one type per cgroup
// mode), backend_in_place.cpp, backend_own_folder.cpp, backend_slice_mode.cpp,
// systemd_slice.{hpp,cpp}, cgroup_tree.{hpp,cpp}, job_cpu_time.{hpp,cpp} (the counters of a job's
// cpu time), and affinity_backend.{hpp,cpp} (no cgroups).
#include "backend.hpp"

#include <cstddef>

#include "affinity_backend.hpp"
#include "backend_cgroup.hpp"
#include "backend_probe.hpp"

namespace mall {

namespace {

// Each enum's names, written once for parsing and for printing.
template <typename Enum>
struct Named {
    Enum value;
    const char *name;
};

constexpr Named<CgroupMode> kCgroupModeNames[] = {
    {CgroupMode::Auto, "auto"},
    {CgroupMode::Own, "own"},
    {CgroupMode::InPlace, "in-place"},
    {CgroupMode::Container, "container"},
    {CgroupMode::ContainerSystemd, "container-systemd"},
};

constexpr Named<BackendKind> kBackendNames[] = {
    {BackendKind::Auto, "auto"},
    {BackendKind::CgroupV1, "cgroup-v1"},
    {BackendKind::CgroupV2, "cgroup-v2"},
    {BackendKind::Affinity, "affinity"},
};

template <typename Enum, size_t N>
std::optional<Enum> value_named(const Named<Enum> (&table)[N], const std::string &name) {
    for (const auto &entry : table)
        if (name == entry.name) return entry.value;
    return std::nullopt;
}

template <typename Enum, size_t N>
const char *name_of(const Named<Enum> (&table)[N], Enum value) {
    for (const auto &entry : table)
        if (entry.value == value) return entry.name;
    return "unknown";
}

}  // namespace

std::optional<CgroupMode> parse_cgroup_mode(const std::string &name) { return value_named(kCgroupModeNames, name); }
const char *cgroup_mode_name(CgroupMode mode) { return name_of(kCgroupModeNames, mode); }
std::optional<BackendKind> parse_backend(const std::string &name) { return value_named(kBackendNames, name); }
const char *backend_name(BackendKind kind) { return name_of(kBackendNames, kind); }

std::unique_ptr<CpusetBackend> make_backend(BackendKind kind, const std::string &parent,
                                            std::string *why, std::string *error) {
    auto set = [](std::string *out, const std::string &text) {
        if (out) *out = text;
    };
    if (parent.empty() || parent.find('/') != std::string::npos || parent == "." || parent == "..") {
        set(error, "bad cgroup parent name '" + parent +
                       "': give one folder name such as 'mall' (no '/')");
        return nullptr;
    }
    switch (kind) {
        case BackendKind::CgroupV1: {
            CgroupProbe p = probe_v1(parent);
            if (p.mount.empty()) {
                set(error, "backend cgroup-v1 is not usable: " + p.reason +
                               "; choose --backend auto or affinity");
                return nullptr;
            }
            set(why, "requested with --backend cgroup-v1; " + p.reason);
            return make_cgroup_v1_backend(p.mount, parent);
        }
        case BackendKind::CgroupV2: {
            CgroupProbe p = probe_v2();
            if (p.mount.empty()) {
                set(error, "backend cgroup-v2 is not usable: " + p.reason +
                               "; choose --backend auto or affinity");
                return nullptr;
            }
            set(why, "requested with --backend cgroup-v2; " + p.reason);
            return make_cgroup_v2_backend(p.mount, parent);
        }
        case BackendKind::Affinity:
            set(why, "requested with --backend affinity");
            return make_affinity_backend();
        case BackendKind::Auto: {
            CgroupProbe v1 = probe_v1(parent);
            if (!v1.mount.empty()) {
                set(why, "auto: " + v1.reason);
                return make_cgroup_v1_backend(v1.mount, parent);
            }
            CgroupProbe v2 = probe_v2();
            if (!v2.mount.empty()) {
                set(why, "auto: cgroup-v1 not usable (" + v1.reason + "); " + v2.reason);
                return make_cgroup_v2_backend(v2.mount, parent);
            }
            set(why, "auto: cgroup-v1 not usable (" + v1.reason + "); cgroup-v2 not usable (" +
                         v2.reason + "); falling back to thread affinity, which a process may "
                         "undo itself");
            return make_affinity_backend();
        }
    }
    set(error, "unknown backend");
    return nullptr;
}

}  // namespace mall
