// SPDX-License-Identifier: BSD-3-Clause
// time_text.hpp — the wall clock as mallctl's reports show it: now in seconds since the epoch, and
// a moment as local time in a strftime format (the history's "%Y-%m-%d %H:%M:%S", top's
// "%H:%M:%S"). Header-only: the tools and their unit tests share it.
#pragma once

#include <time.h>

#include <chrono>
#include <ctime>
#include <string>

namespace mall::tools {

inline double epoch_now() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// `epoch` (seconds since the epoch) in the local time zone, formatted by strftime with `format`
// (at most 63 characters of output).
inline std::string local_time_text(double epoch, const char *format) {
    const time_t t = static_cast<time_t>(epoch);
    std::tm tm{};
    ::localtime_r(&t, &tm);
    char buffer[64];
    return std::strftime(buffer, sizeof buffer, format, &tm) > 0 ? buffer : "";
}

}  // namespace mall::tools
