// SPDX-License-Identifier: BSD-3-Clause
// slurm_release.cpp — the build-vs-run Slurm release check of the SPANK plugin (see the header).
#include "slurm_release.hpp"

#include <cstdio>
#include <cstdlib>

namespace mall::slurm {

namespace {

// A decimal number of at most 3 digits, nothing else; -1 otherwise.
int small_number(const char *text) {
    if (text == nullptr || *text == '\0') return -1;
    char *end = nullptr;
    long value = std::strtol(text, &end, 10);
    if (*end != '\0' || value < 0 || value > 255) return -1;
    return static_cast<int>(value);
}

std::string release_text(unsigned major, unsigned minor) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%u.%02u", major, minor);
    return buf;
}

}  // namespace

std::string release_of_version_number(unsigned version_number) {
    return release_text((version_number >> 16) & 0xff, (version_number >> 8) & 0xff);
}

std::optional<std::string> release_mismatch(unsigned built_version_number, const char *running_major,
                                            const char *running_minor, const char *running_full) {
    const std::string built = release_of_version_number(built_version_number);
    const int major = small_number(running_major);
    const int minor = small_number(running_minor);
    std::string running;
    if (major >= 0 && minor >= 0) {
        running = release_text(static_cast<unsigned>(major), static_cast<unsigned>(minor));
        if (running == built) return std::nullopt;
    } else {
        running = "an unknown release";
    }
    std::string text = "mall_spank.so was built for Slurm " + built + " but runs in Slurm " + running;
    if (running_full != nullptr && *running_full != '\0') text += " (" + std::string(running_full) + ")";
    text += ": the mall plugin is disabled and --malleable jobs run non-malleable. Rebuild mall against "
            "this Slurm's headers: install its libslurm-dev (" + running +
            ") or configure with -DMALL_SLURM_INCLUDE_DIR=<folder holding its slurm/spank.h> "
            "-DMALL_SLURM_LIBRARY=<its libslurm.so>, then reinstall mall_spank.so on every node and "
            "login host";
    return text;
}

}  // namespace mall::slurm
