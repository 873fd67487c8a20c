// SPDX-License-Identifier: BSD-3-Clause
// files.hpp — the small file-system helpers malld, its backends and the socket code share: read a
// whole (proc or cgroup) file, write a value with one write(2) as cgroup files require, create a
// temporary file under an unpredictable name, replace a file atomically, create a folder with its
// missing parents, check that a folder is private to malld and that no one else can swap the
// folders above a path, open a private folder once so that every later operation goes through its
// descriptor (pinned folders), and check a path's form. Each reports errno or says why; none throws.
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
// The same inside the folder open as `dir_fd` (AT_FDCWD: `prefix` is a path): *name is the new
// file's name relative to dir_fd.
int create_temp_file_at(int dir_fd, const std::string &prefix, unsigned mode, std::string *name);

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

// Why someone other than root or `trusted` could change what `path` names by changing a folder
// above it, or "" when nobody can: each folder above `path` (as the path names them, symlinks
// followed) must be a folder owned by root or `trusted` and writable by neither its group nor
// others, unless it is sticky (like /tmp: others may add names there, but not rename or remove a
// name of root's or `trusted`'s). Path-based (stat): for checks of what is then opened by path
// (the programs root runs); a folder root keeps open is checked by open_private_folder instead.
std::string folder_chain_problem(const std::string &path, uid_t trusted = 0);

// `path` as malld keeps a folder's name: repeated and trailing '/' removed ("/var/lib/mall/" is
// "/var/lib/mall"). "" with *why when it is empty, relative (malld's folders are named in its
// status and read by other programs from other folders) or has a "." or ".." component.
std::string normalized_folder_path(const std::string &path, std::string *why);

// Opens the folder `path` (normalized, absolute) that root (malld) keeps private files in, walking
// from "/" one folder at a time with openat(O_DIRECTORY|O_NOFOLLOW), so what is checked is what is
// opened: every folder above must pass folder_chain_problem's rule for `owner` (a symlink above is
// followed only because it lies in such a folder, and its target is walked by the same rule); the
// folder itself must be a folder (not a symlink) owned by `owner` and writable by neither its group
// nor others. With `create`, missing folders (the folder and those above it) are made with `mode`
// on the way. Returns an O_RDONLY|O_DIRECTORY|O_CLOEXEC descriptor: the caller does every later
// operation through it (openat, renameat, unlinkat, fsync), so a folder renamed away and replaced
// afterwards is never written into. -1 with *error in words (naming the folder at fault and the fix);
// without `create`, a missing folder gives -1 with *missing = true and no error.
int open_private_folder(const std::string &path, uid_t owner, bool create, unsigned mode, std::string *error,
                        bool *missing = nullptr);

// Pinned folders: malld opens its state folder and the history file's folder once at start
// (open_private_folder) and pins the descriptor under the folder's name; append_history() then
// opens, rotates and creates files through it. pin_folder takes ownership of `fd` (replacing a
// descriptor pinned under that name). pinned_folder() is -1 when none is pinned (then callers use
// the path, as mallctl and the tests do).
void pin_folder(const std::string &path, int fd);
int pinned_folder(const std::string &path);

// Why `path` is not a plain absolute path, or "" when it is: it starts with '/', has no empty,
// "." or ".." component, no trailing '/' (the root "/" aside), no NUL and at most 4096 bytes.
// For paths read from a file malld did not necessarily write (a saved cgroup, /proc/PID/cgroup).
std::string absolute_path_problem(const std::string &path);

}  // namespace mall
