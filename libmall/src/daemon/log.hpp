// SPDX-License-Identifier: BSD-3-Clause
// log.hpp — malld's log: "2026-11-22T10:00:00.123 malld[pid] level: text" on stderr, one write(2)
// per line so that lines of concurrent threads never interleave. Safe from any thread. Text a
// client chose goes through log_text() first; warnings a client can trigger at will go through
// log_warn_limited() (one line per kind per second) or a LogBudget (a few lines per key: a user,
// or all users together; access.cpp may_log_refusal), so no
// client can forge lines or flood the log.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace mall {

enum class LogLevel { Error = 0, Warn = 1, Info = 2, Debug = 3 };
std::optional<LogLevel> parse_log_level(const std::string &name);  // error, warn(ing), info, debug
void set_log_level(LogLevel level);
bool log_enabled(LogLevel level);
void log_line(LogLevel level, const std::string &text);

inline void log_error(const std::string &text) { log_line(LogLevel::Error, text); }
inline void log_warn(const std::string &text) { log_line(LogLevel::Warn, text); }
inline void log_info(const std::string &text) { log_line(LogLevel::Info, text); }
inline void log_debug(const std::string &text) { log_line(LogLevel::Debug, text); }

// A warning logged at most once per second per `kind`; the next line of that kind says how many
// were left out.
void log_warn_limited(const std::string &kind, const std::string &text);

// A token bucket per key (a uid) for lines a client can cause at will (refusals): `burst` lines at
// once, then one more every period / burst. Lines over the budget are only counted; when the
// key's next line is allowed, held_back says how many were left out since its last one. The
// table forgets keys whose bucket is full again (looked for at most once per period, once it
// holds over 4096 keys), so it stays small and a line costs O(log keys). One owner thread.
// Callers that weigh several budgets ask has_token() of each first, then spend with allow() only
// when all have one, and count a line none may log with hold() in the budget that refused it.
class LogBudget {
public:
    LogBudget(int burst, std::chrono::steady_clock::duration period) : burst_(burst), period_(period) {}
    // Spends a token of key's when it has one (true, *held_back: lines left out before); else
    // counts the line as held back (false).
    bool allow(uint64_t key, std::chrono::steady_clock::time_point now, uint64_t *held_back);
    // Whether key has a token now; spends nothing.
    bool has_token(uint64_t key, std::chrono::steady_clock::time_point now);
    // Counts a line of key's that is not logged (told with its next allowed line).
    void hold(uint64_t key, std::chrono::steady_clock::time_point now);

private:
    struct Bucket {
        double tokens = 0;
        std::chrono::steady_clock::time_point refilled{};
        uint64_t held_back = 0;
    };
    Bucket &refilled(uint64_t key, std::chrono::steady_clock::time_point now);
    int burst_;
    std::chrono::steady_clock::duration period_;
    std::map<uint64_t, Bucket> buckets_;
    std::optional<std::chrono::steady_clock::time_point> last_pruned_;
};

// For work malld repeats that may fail for a while (a file it rewrites, an update it sends): each
// distinct failure is logged once, not on every try, and the first success after one says so.
// One owner thread per instance.
class FailureLog {
public:
    // Logs `text` at `level` unless the previous outcome was a failure with the same `error`.
    void failed(const std::string &error, LogLevel level, const std::string &text) {
        const std::string key = error.empty() ? "?" : error;  // a failure without words is one too
        if (key != last_error_) log_line(level, text);
        last_error_ = key;
    }
    // After a failure, logs `back_again` (info) when it is not empty.
    void succeeded(const std::string &back_again = "") {
        if (!last_error_.empty() && !back_again.empty()) log_line(LogLevel::Info, back_again);
        last_error_.clear();
    }

private:
    std::string last_error_;  // empty: the last outcome was a success
};

// Client-supplied text made fit for a log line: at most 128 characters (the rest summarised by
// its size), newlines and control characters escaped.
std::string log_text(std::string_view text);

}  // namespace mall
