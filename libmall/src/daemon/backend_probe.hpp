// SPDX-License-Identifier: BSD-3-Clause
// backend_probe.hpp — what the host has: whether a cgroup v1 hierarchy with the cpuset controller,
// or a cgroup v2 mount with cpuset available, is there and usable by malld, and the words that say
// why or why not (make_backend reports them at start). Contract: a probe writes nothing that
// outlives it (v1 may create and remove the parent folder to prove it can).
#pragma once

#include <string>

namespace mall {

// Where a usable cpuset controller lives, or why there is none.
struct CgroupProbe {
    std::string mount;   // empty when not usable
    std::string reason;  // words: why usable or why not
};

// cgroup v1: a read-write cpuset hierarchy where malld may create (or already owns) `parent`.
CgroupProbe probe_v1(const std::string &parent);
// cgroup v2: a cgroup2 mount listing cpuset in cgroup.controllers, writable by malld.
CgroupProbe probe_v2();

}  // namespace mall
