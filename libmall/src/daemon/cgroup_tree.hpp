// SPDX-License-Identifier: BSD-3-Clause
// cgroup_tree.hpp — reading a cgroup hierarchy as a tree of folders, for every file of the cgroup
// backends: which folders lie below one, which processes live in them, whether one path is below
// another, and the small word tests on mount options and controller lists. Contract: readers never
// throw and never write; a folder or file that is gone reads as empty.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace mall::cgroup_tree {

std::string errno_text(int err);  // strerror(err)
bool is_directory(const std::string &path);
// The pids listed in a cgroup.procs file (empty when unreadable).
std::vector<pid_t> read_pid_list(const std::string &path);
// True when `path` is `ancestor` or lies below it ("/" is everyone's ancestor).
bool is_path_prefix(const std::string &ancestor, const std::string &path);
// Every folder below dir, parents before children (each level sorted).
std::vector<std::string> descendants(const std::string &dir);
// Every process in dir and its descendants (cgroup.procs of each); empty when dir is gone.
std::vector<pid_t> pids_in_tree(const std::string &dir);
// True when `token` is one of the `sep`-separated items of `list` (blanks trimmed): mount options.
bool has_token(const std::string &list, const std::string &token, char sep);
// True when `word` is one of the blank-separated words of `text`: cgroup.controllers.
bool has_word(const std::string &text, const std::string &word);

}  // namespace mall::cgroup_tree
