// SPDX-License-Identifier: BSD-3-Clause
// job_history.cpp — malld's history of finished jobs: records, appends with rotation, reads,
// and the --since forms of `mallctl history` (see job_history.hpp).
#include "job_history.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>

#include "files.hpp"

namespace mall {

nlohmann::json history_record(const nlohmann::json &end_event, const std::string &host) {
    nlohmann::json record = end_event;
    record.erase("event");
    record["format"] = kHistoryFormat;
    record["host"] = host;
    const double ended = end_event.value("time", 0.0);
    const double duration = end_event.value("duration_seconds", 0.0);
    if (ended > 0) record["started"] = ended - duration;
    return record;
}

bool append_history(const std::string &path, const nlohmann::json &record, uint64_t max_bytes,
                    std::string *error) {
    const std::string line = record.dump() + "\n";
    auto fail = [&](const std::string &what) {
        if (error) *error = what + ": " + std::strerror(errno);
        return false;
    };
    // Through the folder malld opened at start when it pinned one (a folder renamed and replaced
    // since is never written into), else by path.
    const size_t slash = path.find_last_of('/');
    const std::string folder = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
    const int pinned = pinned_folder(folder);
    const int dir_fd = pinned >= 0 ? pinned : AT_FDCWD;
    const std::string name = pinned >= 0 ? path.substr(slash + 1) : path;
    const std::string older = name + ".1";
    // O_NOFOLLOW: a symlink planted at the file's name is refused (ELOOP), never written through.
    auto open_file = [&] {
        return ::openat(dir_fd, name.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK,
                        0600);
    };
    // A regular file of malld's own (not one another user made in a folder they may write).
    auto usable = [&](int fd, struct stat *st) {
        if (::fstat(fd, st) != 0 || !S_ISREG(st->st_mode)) {
            errno = EINVAL;
            return fail("cannot append to " + path + " (not a regular file)");
        }
        if (st->st_uid != ::geteuid()) {
            errno = EPERM;
            return fail("cannot append to " + path + " (it belongs to uid " + std::to_string(st->st_uid) +
                        ", not to malld's uid " + std::to_string(::geteuid()) + ")");
        }
        return true;
    };
    int fd = open_file();
    if (fd < 0) return fail("cannot open " + path);
    struct stat st{};
    if (!usable(fd, &st)) {
        ::close(fd);
        return false;
    }
    // A file an older malld made 0644: its records (uids, jobs, figures) are for root only now.
    if ((st.st_mode & 077) != 0) (void)::fchmod(fd, 0600);
    if (st.st_size > 0 && static_cast<uint64_t>(st.st_size) + line.size() > max_bytes) {
        ::close(fd);
        // rename() moves the name: a symlink planted at "<path>.1" is replaced, not followed.
        if (::renameat(dir_fd, name.c_str(), dir_fd, older.c_str()) != 0)
            return fail("cannot rotate " + path + " to " + path + ".1");
        fd = open_file();
        if (fd < 0) return fail("cannot open " + path);
        if (!usable(fd, &st)) {
            ::close(fd);
            return false;
        }
    }
    const off_t before = ::lseek(fd, 0, SEEK_END);
    const ssize_t n = ::write(fd, line.data(), line.size());
    if (n != static_cast<ssize_t>(line.size())) {
        const int err = n < 0 ? errno : ENOSPC;
        if (before >= 0) (void)::ftruncate(fd, before);  // no torn line stays behind
        ::close(fd);
        errno = err;
        return fail("cannot append to " + path);
    }
    ::close(fd);
    return true;
}

namespace {

// A history record: an object of our format with a job name, a time, and numbers where figures go
// (readers take them without further checks).
bool is_record(const nlohmann::json &r) {
    if (!r.is_object()) return false;
    auto is = [&](const char *field, auto check) { return r.contains(field) && check(r[field]); };
    auto number = [](const nlohmann::json &v) { return v.is_number(); };
    auto text = [](const nlohmann::json &v) { return v.is_string(); };
    if (!is("format", text) || r["format"] != kHistoryFormat || !is("job", text) || !is("time", number)) return false;
    for (const char *field : {"duration_seconds", "core_seconds", "lent_core_seconds", "oversubscribed_seconds",
                              "cpu_seconds", "resizes", "ack_timeouts", "acks", "min", "max", "uid", "started"})
        if (r.contains(field) && !r[field].is_number()) return false;
    for (const char *field : {"reason", "host", "guaranteed"})
        if (r.contains(field) && !r[field].is_string()) return false;
    return true;
}

// Returns false when the file exists but cannot be read.
bool read_lines(const std::string &path, HistoryRead &out, std::string *error) {
    std::ifstream in(path);
    if (!in) {
        if (errno == ENOENT) return true;
        if (error) *error = "cannot read " + path + ": " + std::strerror(errno);
        return false;
    }
    std::string line;
    while (std::getline(in, line)) {
        if (line.empty()) continue;
        nlohmann::json record = nlohmann::json::parse(line, nullptr, false);
        if (!is_record(record)) {
            ++out.skipped_lines;
            continue;
        }
        out.records.push_back(std::move(record));
    }
    return true;
}

std::optional<double> local_time(const std::string &text) {
    std::tm tm{};
    for (const char *form : {"%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M",
                             "%Y-%m-%d %H:%M", "%Y-%m-%d"}) {
        tm = std::tm{};
        const char *end = ::strptime(text.c_str(), form, &tm);
        if (end && *end == '\0') {
            tm.tm_isdst = -1;
            const time_t t = std::mktime(&tm);
            if (t == static_cast<time_t>(-1)) return std::nullopt;
            return static_cast<double>(t);
        }
    }
    return std::nullopt;
}

}  // namespace

std::optional<HistoryRead> read_history(const std::string &path, std::string *error) {
    HistoryRead out;
    errno = 0;
    if (!read_lines(path + ".1", out, error)) return std::nullopt;
    errno = 0;
    if (!read_lines(path, out, error)) return std::nullopt;
    return out;
}

std::optional<double> parse_since(const std::string &text, double now, std::string *error) {
    auto bad = [&]() -> std::optional<double> {
        if (error)
            *error = "bad --since '" + text +
                     "': give an age (90s, 30m, 2h, 7d), seconds since the epoch, or a local date "
                     "and time (2026-11-24, 2026-11-24T08:30)";
        return std::nullopt;
    };
    if (text.empty()) return bad();
    if (text.size() >= 2 && std::string("smhd").find(text.back()) != std::string::npos &&
        text.find_first_not_of("0123456789.") == text.size() - 1) {
        char *end = nullptr;
        const double amount = std::strtod(text.c_str(), &end);
        if (end != text.c_str() + text.size() - 1 || !std::isfinite(amount) || amount < 0) return bad();
        const double unit = text.back() == 's' ? 1 : text.back() == 'm' ? 60 : text.back() == 'h' ? 3600 : 86400;
        return now - amount * unit;
    }
    if (text.find_first_not_of("0123456789.") == std::string::npos) {
        char *end = nullptr;
        const double epoch = std::strtod(text.c_str(), &end);
        if (*end != '\0' || !std::isfinite(epoch)) return bad();
        return epoch;
    }
    if (auto t = local_time(text)) return t;
    return bad();
}

}  // namespace mall
