// SPDX-License-Identifier: BSD-3-Clause
// backend.cpp — the names of backends and cgroup modes, and make_backend: which backend malld runs,
// from what the host has (backend_probe.cpp). The backends themselves live in their own files:
// backend_cgroup.{hpp,cpp} (the common cgroup layer) with backend_cgroup_v1.cpp and
// backend_cgroup_v2.cpp (the kernel interfaces), backend_in_place.cpp, backend_own_folder.cpp,
// backend_slice_mode.cpp, systemd_slice.{hpp,cpp}, cgroup_tree.{hpp,cpp},
// cgroup_membership.cpp, and affinity_backend.{hpp,cpp} (no cgroups).
#include "backend.hpp"

#include "affinity_backend.hpp"
#include "backend_cgroup.hpp"
#include "backend_probe.hpp"

namespace mall {

std::optional<CgroupMode> parse_cgroup_mode(const std::string &name) {
    if (name == "auto") return CgroupMode::Auto;
    if (name == "own") return CgroupMode::Own;
    if (name == "in-place") return CgroupMode::InPlace;
    if (name == "container") return CgroupMode::Container;
    if (name == "container-systemd") return CgroupMode::ContainerSystemd;
    return std::nullopt;
}

const char *cgroup_mode_name(CgroupMode mode) {
    switch (mode) {
        case CgroupMode::Auto: return "auto";
        case CgroupMode::Own: return "own";
        case CgroupMode::InPlace: return "in-place";
        case CgroupMode::Container: return "container";
        case CgroupMode::ContainerSystemd: return "container-systemd";
    }
    return "unknown";
}

std::optional<BackendKind> parse_backend(const std::string &name) {
    if (name == "auto") return BackendKind::Auto;
    if (name == "cgroup-v1") return BackendKind::CgroupV1;
    if (name == "cgroup-v2") return BackendKind::CgroupV2;
    if (name == "affinity") return BackendKind::Affinity;
    return std::nullopt;
}

const char *backend_name(BackendKind kind) {
    switch (kind) {
        case BackendKind::Auto: return "auto";
        case BackendKind::CgroupV1: return "cgroup-v1";
        case BackendKind::CgroupV2: return "cgroup-v2";
        case BackendKind::Affinity: return "affinity";
    }
    return "unknown";
}

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
