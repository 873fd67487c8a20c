// SPDX-License-Identifier: BSD-3-Clause
// log.cpp — see log.hpp. The level is an atomic (read on every line, set once at start-up); the
// rate limiter's windows sit behind a mutex, so that any thread may use it (a LogBudget has one
// owner thread and no lock).
#include "log.hpp"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <map>
#include <mutex>

namespace mall {

namespace {

std::atomic<int> g_log_level{static_cast<int>(LogLevel::Info)};

const char *level_name(LogLevel level) {
    switch (level) {
        case LogLevel::Error: return "error";
        case LogLevel::Warn: return "warn";
        case LogLevel::Info: return "info";
        case LogLevel::Debug: return "debug";
    }
    return "?";
}

}  // namespace

std::optional<LogLevel> parse_log_level(const std::string &name) {
    if (name == "error") return LogLevel::Error;
    if (name == "warn" || name == "warning") return LogLevel::Warn;
    if (name == "info") return LogLevel::Info;
    if (name == "debug") return LogLevel::Debug;
    return std::nullopt;
}

void set_log_level(LogLevel level) { g_log_level.store(static_cast<int>(level)); }

bool log_enabled(LogLevel level) { return static_cast<int>(level) <= g_log_level.load(); }

void log_line(LogLevel level, const std::string &text) {
    if (!log_enabled(level)) return;
    timespec ts{};
    ::clock_gettime(CLOCK_REALTIME, &ts);
    tm local{};
    ::localtime_r(&ts.tv_sec, &local);
    char stamp[48];
    std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &local);
    char millis[24];
    std::snprintf(millis, sizeof millis, ".%03ld", ts.tv_nsec / 1000000);
    std::string line = std::string(stamp) + millis + " malld[" + std::to_string(::getpid()) + "] " +
                       level_name(level) + ": " + text + "\n";
    // One write per line so that lines of concurrent writers never interleave.
    ssize_t rc = ::write(STDERR_FILENO, line.data(), line.size());
    (void)rc;
}

// Warnings a client can trigger at will (refused connections, slow readers, descriptor
// exhaustion): a flood can neither fill the disk nor slow the loop down with log writes.
void log_warn_limited(const std::string &kind, const std::string &text) {
    struct Window {
        std::chrono::steady_clock::time_point last{};
        uint64_t suppressed = 0;
        bool used = false;
    };
    static std::mutex mutex;
    static std::map<std::string, Window> windows;
    const auto now = std::chrono::steady_clock::now();
    std::unique_lock<std::mutex> lock(mutex);
    Window &w = windows[kind];
    if (w.used && now - w.last < std::chrono::seconds(1)) {
        ++w.suppressed;
        return;
    }
    const uint64_t left_out = w.suppressed;
    w.last = now;
    w.used = true;
    w.suppressed = 0;
    lock.unlock();
    log_warn(text + (left_out ? " (" + std::to_string(left_out) + " similar warning(s) left out)" : ""));
}

LogBudget::Bucket &LogBudget::refilled(uint64_t key, std::chrono::steady_clock::time_point now) {
    using Seconds = std::chrono::duration<double>;
    const double per_second = burst_ / std::max(Seconds(period_).count(), 1e-3);
    // Forget keys that are quiet again (full bucket, nothing held): a scan of the whole table, so
    // at most once per period however many keys keep it over the mark.
    if (buckets_.size() > 4096 && (!last_pruned_ || now - *last_pruned_ >= period_)) {
        last_pruned_ = now;
        for (auto it = buckets_.begin(); it != buckets_.end();) {
            const Bucket &b = it->second;
            const double tokens = b.tokens + Seconds(now - b.refilled).count() * per_second;
            it = (tokens >= burst_ && b.held_back == 0) ? buckets_.erase(it) : std::next(it);
        }
    }
    auto [it, fresh] = buckets_.try_emplace(key);
    Bucket &b = it->second;
    if (fresh) {
        b.tokens = burst_;
    } else {
        b.tokens = std::min<double>(burst_, b.tokens + Seconds(now - b.refilled).count() * per_second);
    }
    b.refilled = now;
    return b;
}

bool LogBudget::has_token(uint64_t key, std::chrono::steady_clock::time_point now) {
    return refilled(key, now).tokens >= 1;
}

void LogBudget::hold(uint64_t key, std::chrono::steady_clock::time_point now) { ++refilled(key, now).held_back; }

bool LogBudget::allow(uint64_t key, std::chrono::steady_clock::time_point now, uint64_t *held_back) {
    Bucket &b = refilled(key, now);
    if (b.tokens < 1) {
        ++b.held_back;
        return false;
    }
    b.tokens -= 1;
    if (held_back) *held_back = b.held_back;
    b.held_back = 0;
    return true;
}

// At most kMaxLoggedText characters: a client can neither forge log lines (newlines) nor blow up
// the log with 64 KiB names.
constexpr size_t kMaxLoggedText = 128;

std::string log_text(std::string_view text) {
    std::string out;
    const size_t shown = std::min(text.size(), kMaxLoggedText);
    out.reserve(shown + 32);
    for (size_t i = 0; i < shown; ++i) {
        const unsigned char ch = static_cast<unsigned char>(text[i]);
        if (ch == '\n') {
            out += "\\n";
        } else if (ch < 0x20 || ch == 0x7f) {
            char esc[8];
            std::snprintf(esc, sizeof esc, "\\x%02x", ch);
            out += esc;
        } else {
            out += static_cast<char>(ch);
        }
    }
    if (text.size() > shown) out += "...(" + std::to_string(text.size()) + " bytes)";
    return out;
}

}  // namespace mall
