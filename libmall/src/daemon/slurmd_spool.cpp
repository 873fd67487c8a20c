// SPDX-License-Identifier: BSD-3-Clause
// slurmd_spool.cpp — see slurmd_spool.hpp.
#include "slurmd_spool.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "../common/unix_socket.hpp"

namespace mall {

namespace {

std::optional<uint64_t> digits(std::string_view text) {
    if (text.empty() || text.size() > 10) return std::nullopt;
    uint64_t value = 0;
    for (char c : text) {
        if (c < '0' || c > '9') return std::nullopt;
        value = value * 10 + static_cast<uint64_t>(c - '0');
    }
    if (value > 0xFFFFFFFFull) return std::nullopt;
    return value;
}

}  // namespace

std::optional<uint32_t> stepd_socket_job_id(std::string_view file_name, std::string_view node) {
    if (node.empty() || file_name.size() <= node.size() + 1 || file_name.substr(0, node.size()) != node ||
        file_name[node.size()] != '_')
        return std::nullopt;
    const std::string_view rest = file_name.substr(node.size() + 1);
    const size_t dot = rest.find('.');
    if (dot == std::string_view::npos) return std::nullopt;
    const auto job = digits(rest.substr(0, dot));
    const auto step = digits(rest.substr(dot + 1));
    if (!job || !step || *job == 0) return std::nullopt;
    return static_cast<uint32_t>(*job);
}

std::string expand_slurmd_spool_dir(const std::string &pattern, const std::string &node, const std::string &host) {
    std::string out;
    for (size_t i = 0; i < pattern.size(); ++i) {
        if (pattern[i] != '%' || i + 1 == pattern.size()) {
            out += pattern[i];
            continue;
        }
        const char what = pattern[++i];
        if (what == 'n')
            out += node;
        else if (what == 'h')
            out += host;
        else if (what == '%')
            out += '%';
        else
            out.append(1, '%').append(1, what);
    }
    return out;
}

SlurmdSpool::Listing SlurmdSpool::read() const {
    Listing out;
    auto fail = [&](std::string why) {
        out.jobs.clear();
        out.error = "slurmd's spool folder " + folder_ + " " + why;
        return out;
    };
    UniqueFd dir(::open(folder_.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!dir) return fail(std::string("cannot be opened: ") + std::strerror(errno));
    struct stat st {};
    if (::fstat(dir.get(), &st) != 0) return fail(std::string("cannot be read: ") + std::strerror(errno));
    if (st.st_uid != 0 && st.st_uid != slurmd_uid_)
        return fail("is owned by uid " + std::to_string(st.st_uid) + ", not root or SlurmdUser: not trusted");
    if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0)
        return fail("is writable by others than its owner: not trusted (chmod go-w it)");
    // fdopendir owns the descriptor from here on.
    DIR *listing = ::fdopendir(dir.release());
    if (listing == nullptr) return fail(std::string("cannot be listed: ") + std::strerror(errno));
    const int dfd = ::dirfd(listing);
    size_t seen = 0;
    errno = 0;
    while (const dirent *entry = ::readdir(listing)) {
        if (++seen > kMaxSpoolEntries) {
            ::closedir(listing);
            return fail("holds more than " + std::to_string(kMaxSpoolEntries) + " entries: not read");
        }
        if (entry->d_type != DT_SOCK && entry->d_type != DT_UNKNOWN) continue;
        const auto job = stepd_socket_job_id(entry->d_name, node_);
        if (!job) continue;
        struct stat sock {};
        if (::fstatat(dfd, entry->d_name, &sock, AT_SYMLINK_NOFOLLOW) != 0) continue;  // the step just ended
        if (!S_ISSOCK(sock.st_mode) || (sock.st_uid != 0 && sock.st_uid != slurmd_uid_)) continue;
        out.jobs.insert(*job);
    }
    const int err = errno;
    ::closedir(listing);
    if (err != 0) return fail(std::string("cannot be listed: ") + std::strerror(err));
    return out;
}

}  // namespace mall
