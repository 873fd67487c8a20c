// SPDX-License-Identifier: BSD-3-Clause
// text.hpp — the one trim every part of mall uses on what it reads from files, commands and
// options (cgroup files end in '\n', help2man's captures in blank lines). Header-only and free of
// dependencies, so the Slurm plugin, the tools and the tests share it without linking mall_common.
#pragma once

#include <string>
#include <string_view>

namespace mall {

// `text` without leading and trailing blanks: spaces, tabs, newlines and carriage returns.
inline std::string trim(std::string_view text) {
    constexpr std::string_view kBlanks = " \t\n\r";
    const auto first = text.find_first_not_of(kBlanks);
    if (first == std::string_view::npos) return {};
    const auto last = text.find_last_not_of(kBlanks);
    return std::string(text.substr(first, last - first + 1));
}

}  // namespace mall
