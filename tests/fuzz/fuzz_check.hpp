// SPDX-License-Identifier: BSD-3-Clause
// fuzz_check.hpp — the fuzz targets' invariant check. MALL_FUZZ_CHECK(cond, detail) does nothing
// while cond holds; otherwise it prints the condition, where it is and `detail` (a std::string
// expression, built only on failure) on stderr and aborts, which libFuzzer reports as a crash and
// saves the input as crash-<sha1> for reproduction.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace mall::fuzz {

[[noreturn]] inline void invariant_broken(const char *file, int line, const char *condition,
                                          const std::string &detail) {
    std::fprintf(stderr, "==mall-fuzz== invariant broken at %s:%d: %s\n==mall-fuzz== %s\n", file, line,
                 condition, detail.c_str());
    std::abort();
}

// Printable form of arbitrary bytes for failure details: C escapes for everything outside ASCII
// 0x20..0x7e, cut after `limit` bytes.
inline std::string shown(std::string_view bytes, size_t limit = 200) {
    std::string out = "\"";
    for (size_t i = 0; i < bytes.size() && i < limit; ++i) {
        unsigned char c = static_cast<unsigned char>(bytes[i]);
        if (c == '"' || c == '\\') {
            out += '\\';
            out += static_cast<char>(c);
        } else if (c >= 0x20 && c < 0x7f) {
            out += static_cast<char>(c);
        } else {
            char hex[8];
            std::snprintf(hex, sizeof hex, "\\x%02x", c);
            out += hex;
        }
    }
    out += bytes.size() > limit ? "\"..." : "\"";
    return out;
}

}  // namespace mall::fuzz

#define MALL_FUZZ_CHECK(cond, detail)                                                      \
    do {                                                                                   \
        if (!(cond)) ::mall::fuzz::invariant_broken(__FILE__, __LINE__, #cond, (detail)); \
    } while (0)
