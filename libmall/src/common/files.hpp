// SPDX-License-Identifier: BSD-3-Clause
// files.hpp — the small file-system helpers malld, its backends and the socket code share: read a
// whole (proc or cgroup) file, write a value with one write(2) as cgroup files require, replace a
// file atomically, and create a folder with its missing parents. Each reports errno; none throws.
#pragma once

#include <string>

namespace mall {

// Reads the whole file into *out. False with *err = errno (when err is given) on failure.
bool read_text_file(const std::string &path, std::string *out, int *err = nullptr);

// Writes `value` with a single write(2) (cgroup files take one value per write). Returns 0 on
// success, else the errno of the failed open or write.
int write_file_once(const std::string &path, const std::string &value);

// Replaces `path` with `text` so a reader sees the old file or the new one, never a part: writes
// "<path>.tmp.<pid>" in the same folder with `mode`, then renames it over `path` (no fsync: for
// files rewritten often, such as malld's metrics). False with *error saying what failed.
bool replace_file_atomically(const std::string &path, const std::string &text, unsigned mode,
                             std::string *error);

// Creates `path` and every missing folder above it with `mode` (mkdir -p). False with errno set
// (and *failed naming the folder that could not be made, when given) on failure; a path that
// exists already is fine, even when it is not a folder (the caller's next use says so).
bool make_directories(const std::string &path, unsigned mode = 0755, std::string *failed = nullptr);

}  // namespace mall
