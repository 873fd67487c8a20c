// SPDX-License-Identifier: BSD-3-Clause
// backend_probe.cpp — what the host has (see backend_probe.hpp): the cgroup v1 cpuset hierarchy,
// the cgroup v2 mount with cpuset, read from /proc/self/mountinfo and tried, never assumed.
#include "backend_probe.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <optional>
#include <vector>

#include "../common/files.hpp"
#include "../common/text.hpp"
#include "backend.hpp"
#include "cgroup_tree.hpp"
#include "procfs.hpp"

namespace mall {

using cgroup_tree::errno_text;
using cgroup_tree::has_token;
using cgroup_tree::has_word;
using cgroup_tree::is_directory;

namespace {

// The first cgroup v1 hierarchy holding the cpuset controller in /proc/self/mountinfo.
std::optional<MountEntry> v1_cpuset_mount_entry() {
    for (const auto &m : read_mountinfo())
        if (m.fstype == "cgroup" && has_token(m.super_options, "cpuset", ',')) return m;
    return std::nullopt;
}

}  // namespace

CgroupProbe probe_v1(const std::string &parent) {
    CgroupProbe p;
    const auto entry = v1_cpuset_mount_entry();
    const std::string found = entry ? entry->mount_point : "";
    const bool read_only = entry && has_token(entry->mount_options, "ro", ',');
    if (found.empty()) {
        p.reason = "no cgroup v1 hierarchy with the cpuset controller in /proc/self/mountinfo";
        return p;
    }
    if (read_only) {
        p.reason = "the cgroup v1 cpuset hierarchy at " + found + " is mounted read-only";
        return p;
    }
    // Usable means: malld may create (or already owns) its parent folder there.
    std::string dir = found + "/" + parent;
    if (is_directory(dir)) {
        if (::access((dir + "/cpuset.cpus").c_str(), W_OK) != 0) {
            p.reason = "cannot write " + dir + "/cpuset.cpus: " + errno_text(errno);
            return p;
        }
    } else {
        if (::mkdir(dir.c_str(), 0755) != 0) {
            p.reason = "cannot create " + dir + ": " + errno_text(errno) +
                       " (malld needs root or write access to " + found + ")";
            return p;
        }
        ::rmdir(dir.c_str());
    }
    p.mount = found;
    p.reason = "cgroup v1 cpuset controller mounted read-write at " + found +
               " and malld can create " + dir;
    return p;
}

CgroupProbe probe_v2() {
    CgroupProbe p;
    std::vector<std::string> reasons;
    for (const auto &m : read_mountinfo()) {
        if (m.fstype != "cgroup2") continue;
        std::string controllers;
        if (!read_text_file(m.mount_point + "/cgroup.controllers", &controllers, nullptr)) {
            reasons.push_back("cannot read " + m.mount_point + "/cgroup.controllers");
            continue;
        }
        if (!has_word(controllers, "cpuset")) {
            reasons.push_back(m.mount_point + " lists controllers '" + trim(controllers) +
                              "', no cpuset");
            continue;
        }
        if (has_token(m.mount_options, "ro", ',') ||
            ::access((m.mount_point + "/cgroup.subtree_control").c_str(), W_OK) != 0) {
            reasons.push_back(m.mount_point + " is not writable by malld");
            continue;
        }
        p.mount = m.mount_point;
        p.reason = "cgroup v2 with the cpuset controller at " + m.mount_point;
        return p;
    }
    if (reasons.empty()) reasons.push_back("no cgroup2 mount in /proc/self/mountinfo");
    std::string text;
    for (const auto &r : reasons) text += (text.empty() ? "" : "; ") + r;
    p.reason = text;
    return p;
}

std::string cgroup_v1_cpuset_mount() {
    const auto entry = v1_cpuset_mount_entry();
    return entry ? entry->mount_point : "";
}

}  // namespace mall
