// SPDX-License-Identifier: BSD-3-Clause
// files.hpp — the small file-system helpers malld, its backends and the socket code share: read a
// whole (proc or cgroup) file, write a value with one write(2) as cgroup files require, create a
// temporary file under an unpredictable name, replace a file atomically, create a folder with its
// missing parents, check that a folder is private to malld, and check a path's form. Each reports
// errno or says why; none throws.
#pragma once

#include <sys/types.h>

#include <string>

namespace mall {

// Reads the whole file into *out. False with *err = errno (when err is given) on failure.
bool read_text_file(const std::string &path, std::string *out, int *err = nullptr);

// Writes `value` with a single write(2) (cgroup files take one value per write). Returns 0 on
// success, else the errno of the failed open or write.
int write_file_once(const std::string &path, const std::string &value);

// Creates a new file "<prefix>.tmp.<random>" (16 random characters from getrandom) with `mode`
// (fchmod'ed, so the umask does not narrow it), open for writing: O_CREAT|O_EXCL|O_NOFOLLOW|
// O_CLOEXEC, so nothing planted in the folder (a symlink, a file, a guessed name) is ever opened
// or followed. Returns the descriptor and sets *path, or -1 with errno set.
int create_temp_file(const std::string &prefix, unsigned mode, std::string *path);

// Replaces `path` with `text` so a reader sees the old file or the new one, never a part: writes
// a create_temp_file() next to it with `mode`, then renames it over `path` (rename replaces a
// symlink planted at `path`, never its target; no fsync: for files rewritten often, such as
// malld's metrics). False with *error saying what failed.
bool replace_file_atomically(const std::string &path, const std::string &text, unsigned mode,
                             std::string *error);

// Creates `path` and every missing folder above it with `mode` (mkdir -p). False with errno set
// (and *failed naming the folder that could not be made, when given) on failure; a path that
// exists already is fine, even when it is not a folder (the caller's next use says so).
bool make_directories(const std::string &path, unsigned mode = 0755, std::string *failed = nullptr);

// Why `path` may not hold files that root writes and trusts (malld's state folder), or "" when
// it may: it must be a real folder (not a symlink), owned by `owner`, and writable by nobody else
// (no group or other write bit). ENOENT gives "" with *missing = true (the caller creates it).
std::string private_folder_problem(const std::string &path, uid_t owner, bool *missing = nullptr);

// Why `path` is not a plain absolute path, or "" when it is: it starts with '/', has no empty,
// "." or ".." component, no trailing '/' (the root "/" aside), no NUL and at most 4096 bytes.
// For paths read from a file malld did not necessarily write (a saved cgroup, /proc/PID/cgroup).
std::string absolute_path_problem(const std::string &path);

}  // namespace mall
