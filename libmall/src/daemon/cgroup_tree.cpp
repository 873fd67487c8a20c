// SPDX-License-Identifier: BSD-3-Clause
// cgroup_tree.cpp — reading a cgroup hierarchy as a tree of folders (see cgroup_tree.hpp).
#include "cgroup_tree.hpp"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <sstream>

#include "../common/files.hpp"
#include "../common/text.hpp"

namespace mall::cgroup_tree {

std::string errno_text(int err) { return std::strerror(err); }

bool is_directory(const std::string &path) {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::vector<pid_t> read_pid_list(const std::string &path) {
    std::vector<pid_t> pids;
    std::string text;
    if (!read_text_file(path, &text, nullptr)) return pids;
    std::istringstream in(text);
    long v;
    while (in >> v)
        if (v > 0) pids.push_back(static_cast<pid_t>(v));
    return pids;
}

bool is_path_prefix(const std::string &ancestor, const std::string &path) {
    if (ancestor == "/") return true;
    return path == ancestor || (path.size() > ancestor.size() && path.compare(0, ancestor.size(), ancestor) == 0 &&
                                path[ancestor.size()] == '/');
}

std::vector<std::string> descendants(const std::string &dir) {
    std::vector<std::string> out;
    std::vector<std::string> todo{dir};
    for (size_t i = 0; i < todo.size(); ++i) {
        DIR *d = ::opendir(todo[i].c_str());
        if (!d) continue;
        std::vector<std::string> children;
        while (dirent *e = ::readdir(d)) {
            if (e->d_type != DT_DIR || e->d_name[0] == '.') continue;
            children.push_back(todo[i] + "/" + e->d_name);
        }
        ::closedir(d);
        std::sort(children.begin(), children.end());
        for (auto &c : children) {
            out.push_back(c);
            todo.push_back(c);
        }
    }
    return out;
}

std::vector<pid_t> pids_in_tree(const std::string &dir) {
    if (!is_directory(dir)) return {};
    std::vector<pid_t> all = read_pid_list(dir + "/cgroup.procs");
    for (const std::string &d : descendants(dir))
        for (pid_t pid : read_pid_list(d + "/cgroup.procs")) all.push_back(pid);
    return all;
}

bool has_token(const std::string &list, const std::string &token, char sep) {
    std::istringstream in(list);
    std::string item;
    while (std::getline(in, item, sep))
        if (trim(item) == token) return true;
    return false;
}

bool has_word(const std::string &text, const std::string &word) {
    std::istringstream in(text);
    std::string w;
    while (in >> w)
        if (w == word) return true;
    return false;
}

}  // namespace mall::cgroup_tree
