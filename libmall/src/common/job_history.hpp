// SPDX-License-Identifier: BSD-3-Clause
// job_history.hpp — the record of finished jobs malld keeps (`--history-file`, by default
// <state-dir>/malld.history.jsonl) and `mallctl history` reads.
//
// Format: JSON Lines, one object per finished job, appended when the job ends: the "end" event
// (time, job, reason, uid, min, max, guaranteed, duration_seconds, core_seconds,
// lent_core_seconds, oversubscribed_seconds, cpu_seconds (since issue 41), resizes, ack_timeouts, acks,
// ack_latency_seconds_sum; container when it was one) plus "host" and "started" (time −
// duration). "format": "mall-history-1" marks each line so other tools can tell it apart.
// Rotation: before an append that would take the file past max_bytes it is renamed to
// "<path>.1" (replacing an older one), so at most about twice max_bytes is kept. Readers take
// "<path>.1" then "<path>", skip lines that are not records (a torn line after a crash) and
// count them. The file is root's (mode 0600): `mallctl history` reads it as root.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mall {

inline constexpr const char *kHistoryFormat = "mall-history-1";
inline constexpr uint64_t kDefaultHistoryMaxBytes = 16ull << 20;

// The record for an "end" event: the event's fields plus host, started and format.
nlohmann::json history_record(const nlohmann::json &end_event, const std::string &host);

// Appends one record as one line (one write(2) on an O_APPEND file, mode 0600: the records name
// every job's owner; opened O_NOFOLLOW, so a symlink at `path` is refused, never followed, and only
// a regular file owned by the caller's uid is written; a file of an older malld's 0644 is narrowed
// to 0600), rotating first when the file would grow past max_bytes. When the file's folder is
// pinned (files.hpp: malld opened it once at start), the file is opened and rotated through that
// descriptor (openat, renameat), never by path. False with *error on failure (nothing
// half-written stays: a short write is cut back).
bool append_history(const std::string &path, const nlohmann::json &record, uint64_t max_bytes,
                    std::string *error);

struct HistoryRead {
    std::vector<nlohmann::json> records;  // oldest first
    size_t skipped_lines = 0;             // lines that were not records
};
// Reads "<path>.1" (when present) and "<path>". None with *error when `path` cannot be read
// (a missing file is an empty history, not an error).
std::optional<HistoryRead> read_history(const std::string &path, std::string *error);

// A --since value as seconds since the epoch: "30m", "2h", "7d", "90s" (ago from `now`), an epoch
// number, "YYYY-MM-DD", "YYYY-MM-DDTHH:MM[:SS]" or "YYYY-MM-DD HH:MM[:SS]" (local time). None with
// *error saying which forms are accepted.
std::optional<double> parse_since(const std::string &text, double now, std::string *error);

}  // namespace mall
