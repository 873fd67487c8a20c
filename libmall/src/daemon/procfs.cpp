// SPDX-License-Identifier: BSD-3-Clause
// procfs.cpp — see procfs.hpp. /proc/PID/stat is split after the LAST ')' because the command
// name may hold spaces and parentheses. descendants_of() reads /proc/PID/task/TID/children where
// the kernel has it (CONFIG_PROC_CHILDREN) and falls back to one scan of every /proc/*/stat.
// A user namespace's owner comes from the ioctls on its /proc/PID/ns/user file (linux/nsfs.h).
#include "procfs.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <linux/nsfs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "../common/files.hpp"

#ifndef SYS_pidfd_send_signal
#define SYS_pidfd_send_signal 424  // the same number on every architecture
#endif

namespace mall {

namespace {

bool is_number(const char *s) {
    if (!*s) return false;
    for (; *s; ++s)
        if (*s < '0' || *s > '9') return false;
    return true;
}

// Fields of a /proc/PID/stat text after the command name; element 0 is field 3 (state).
std::optional<std::vector<std::string>> stat_fields_of(const std::string &text) {
    size_t close = text.rfind(')');
    if (close == std::string::npos) return std::nullopt;
    std::istringstream in(text.substr(close + 1));
    std::vector<std::string> fields;
    std::string f;
    while (in >> f) fields.push_back(f);
    if (fields.empty()) return std::nullopt;
    return fields;
}

std::optional<std::vector<std::string>> stat_fields(pid_t pid) {
    std::string text;
    if (!read_text_file("/proc/" + std::to_string(pid) + "/stat", &text)) return std::nullopt;
    return stat_fields_of(text);
}

// Children via /proc/PID/task/TID/children (each thread lists the children it forked). Cheap,
// but only exact when the kernel has CONFIG_PROC_CHILDREN; nullopt when the file is missing.
std::optional<std::vector<pid_t>> children_from_task_files(pid_t pid) {
    std::vector<pid_t> children;
    const std::vector<pid_t> tids = threads_of(pid);
    if (tids.empty()) return children;  // the process is gone: its children were re-parented
    bool any_file = false;
    for (pid_t tid : tids) {
        std::string text;
        if (!read_text_file("/proc/" + std::to_string(pid) + "/task/" + std::to_string(tid) + "/children",
                            &text))
            continue;
        any_file = true;
        std::istringstream in(text);
        long child;
        while (in >> child) children.push_back(static_cast<pid_t>(child));
    }
    if (!any_file) return std::nullopt;
    return children;
}

// Children of every process, from a scan of /proc/*/stat (works on every kernel).
std::multimap<pid_t, pid_t> children_by_scan() {
    std::multimap<pid_t, pid_t> children;  // ppid -> pid
    DIR *d = ::opendir("/proc");
    if (!d) return children;
    while (dirent *e = ::readdir(d)) {
        if (!is_number(e->d_name)) continue;
        pid_t p = static_cast<pid_t>(std::atol(e->d_name));
        if (auto ppid = parent_pid(p)) children.emplace(*ppid, p);
    }
    ::closedir(d);
    return children;
}

// Unescapes the octal escapes (\040 for a space ...) of /proc/self/mountinfo paths.
std::string unescape_mount_path(const std::string &s) {
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
        bool octal = s[i] == '\\' && i + 3 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '7' &&
                     s[i + 2] >= '0' && s[i + 2] <= '7' && s[i + 3] >= '0' && s[i + 3] <= '7';
        if (octal) {
            out.push_back(static_cast<char>(std::stoi(s.substr(i + 1, 3), nullptr, 8)));
            i += 3;
        } else {
            out.push_back(s[i]);
        }
    }
    return out;
}

}  // namespace

std::optional<unsigned long long> process_start_time(pid_t pid) {
    auto fields = stat_fields(pid);
    // Field 22 (starttime) is element 19 when element 0 is field 3.
    if (!fields || fields->size() < 20) return std::nullopt;
    try {
        return std::stoull((*fields)[19]);
    } catch (...) {
        return std::nullopt;
    }
}

std::optional<ProcessCpuTime> parse_process_cpu_time(const std::string &stat_text) {
    auto fields = stat_fields_of(stat_text);
    // utime, stime and starttime (fields 14, 15, 22) are elements 11, 12 and 19.
    if (!fields || fields->size() < 20) return std::nullopt;
    ProcessCpuTime out;
    for (auto [index, into] : {std::pair{11, &out.cpu_ticks}, std::pair{12, &out.cpu_ticks},
                               std::pair{19, &out.start_ticks}}) {
        const std::string &f = (*fields)[static_cast<size_t>(index)];
        if (f.empty() || f.find_first_not_of("0123456789") != std::string::npos || f.size() > 19)
            return std::nullopt;
        *into += std::stoull(f);
    }
    return out;
}

std::optional<ProcessCpuTime> process_cpu_time(pid_t pid) {
    if (pid <= 0) return std::nullopt;
    std::string text;
    if (!read_text_file("/proc/" + std::to_string(pid) + "/stat", &text)) return std::nullopt;
    return parse_process_cpu_time(text);
}

long clock_ticks_per_second() {
    static const long hz = ::sysconf(_SC_CLK_TCK) > 0 ? ::sysconf(_SC_CLK_TCK) : 100;
    return hz;
}

bool process_alive(pid_t pid) {
    if (pid <= 0) return false;
    auto fields = stat_fields(pid);
    if (!fields) return false;
    const std::string &state = (*fields)[0];
    return !(state == "Z" || state == "X" || state == "x");
}

std::optional<pid_t> parent_pid(pid_t pid) {
    auto fields = stat_fields(pid);
    if (!fields || fields->size() < 2) return std::nullopt;
    try {
        return static_cast<pid_t>(std::stol((*fields)[1]));
    } catch (...) {
        return std::nullopt;
    }
}

bool in_process_tree(pid_t pid, const std::vector<pid_t> &pids) {
    pid_t cur = pid;
    for (int depth = 0; depth < 512 && cur > 0; ++depth) {
        if (std::find(pids.begin(), pids.end(), cur) != pids.end()) return true;
        if (cur == 1) return false;
        auto parent = parent_pid(cur);
        if (!parent || *parent == cur) return false;
        cur = *parent;
    }
    return false;
}

bool process_has_uid(pid_t pid, uid_t uid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/status");
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("Uid:", 0) != 0) continue;
        std::istringstream fields(line.substr(4));
        unsigned long real = 0, effective = 0;
        if (!(fields >> real >> effective)) return false;
        return real == uid || effective == uid;
    }
    return false;
}

namespace {

// The first number after `key` ("Uid:", "Tgid:") in /proc/PID/status; nullopt when gone.
std::optional<unsigned long> status_number(pid_t pid, const char *key) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/status");
    std::string line;
    const std::string prefix = key;
    while (std::getline(in, line)) {
        if (line.rfind(prefix, 0) != 0) continue;
        std::istringstream fields(line.substr(prefix.size()));
        unsigned long value = 0;
        if (!(fields >> value)) return std::nullopt;
        return value;
    }
    return std::nullopt;
}

constexpr unsigned long kPfKthread = 0x00200000;  // include/linux/sched.h
constexpr pid_t kKthreadd = 2;

}  // namespace

std::optional<uid_t> process_real_uid(pid_t pid) {
    if (pid <= 0) return std::nullopt;
    auto uid = status_number(pid, "Uid:");
    if (!uid) return std::nullopt;
    return static_cast<uid_t>(*uid);
}

std::optional<pid_t> thread_group_of(pid_t pid) {
    if (pid <= 0) return std::nullopt;
    auto tgid = status_number(pid, "Tgid:");
    if (!tgid) return std::nullopt;
    return static_cast<pid_t>(*tgid);
}

bool is_kernel_thread(pid_t pid) {
    auto fields = stat_fields(pid);
    // Field 9 (flags) is element 6 when element 0 is field 3.
    if (!fields || fields->size() < 7) return false;
    try {
        if (std::stoul((*fields)[6]) & kPfKthread) return true;
    } catch (...) {
        return false;
    }
    // kthreadd and its children, should a kernel not set the flag (pid 2 is kthreadd only where
    // its parent is 0: the initial pid namespace).
    const bool kthreadd_here = parent_pid(kKthreadd) == 0;
    return kthreadd_here && (pid == kKthreadd || parent_pid(pid) == kKthreadd);
}

std::vector<pid_t> ancestors_of(pid_t pid) {
    std::vector<pid_t> chain;
    pid_t cur = pid;
    for (int depth = 0; depth < 4096 && cur > 1; ++depth) {
        auto parent = parent_pid(cur);
        if (!parent || *parent <= 0 || *parent == cur) break;
        chain.push_back(*parent);
        cur = *parent;
    }
    return chain;
}

std::optional<bool> shares_user_namespace(pid_t pid) {
    struct stat theirs {}, ours {};
    if (::stat(("/proc/" + std::to_string(pid) + "/ns/user").c_str(), &theirs) != 0 ||
        ::stat("/proc/self/ns/user", &ours) != 0)
        return std::nullopt;
    return theirs.st_dev == ours.st_dev && theirs.st_ino == ours.st_ino;
}

std::optional<uid_t> user_namespace_owner(pid_t pid, int pidfd) {
    const std::optional<OuterUserNamespace> outer = outer_user_namespace(pid, pidfd);
    if (!outer) return std::nullopt;
    return outer->owner;
}

std::optional<OuterUserNamespace> outer_user_namespace(pid_t pid, int pidfd) {
    struct stat ours {};
    if (pid <= 0 || ::stat("/proc/self/ns/user", &ours) != 0) return std::nullopt;
    auto is_ours = [&](int fd) {
        struct stat st {};
        return ::fstat(fd, &st) == 0 && st.st_dev == ours.st_dev && st.st_ino == ours.st_ino;
    };
    int ns = ::open(("/proc/" + std::to_string(pid) + "/ns/user").c_str(), O_RDONLY | O_CLOEXEC);
    if (ns < 0) return std::nullopt;
    // Opened while that process still lived: the file is its (a pid is reused only after an exit).
    if (pidfd >= 0 && ::syscall(SYS_pidfd_send_signal, pidfd, 0, nullptr, 0) != 0) {
        ::close(ns);
        return std::nullopt;
    }
    std::optional<OuterUserNamespace> owner;
    // User namespaces nest at most 32 deep: climb until the parent is this process's namespace.
    for (int depth = 0; depth <= 32 && !is_ours(ns); ++depth) {
        const int parent = ::ioctl(ns, NS_GET_PARENT);
        if (parent < 0) break;  // EPERM: not below this process's namespace
        if (is_ours(parent)) {
            uid_t uid = 0;
            struct stat st {};
            if (::ioctl(ns, NS_GET_OWNER_UID, &uid) == 0 && ::fstat(ns, &st) == 0)
                owner = OuterUserNamespace{uid, static_cast<uint64_t>(st.st_ino)};
            ::close(parent);
            break;
        }
        ::close(ns);
        ns = parent;
    }
    ::close(ns);
    return owner;
}

std::vector<uid_t> process_uids(pid_t pid) {
    std::vector<uid_t> uids;
    if (pid <= 0) return uids;
    std::ifstream in("/proc/" + std::to_string(pid) + "/status");
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("Uid:", 0) != 0) continue;
        std::istringstream fields(line.substr(4));
        for (unsigned long uid = 0; fields >> uid;) uids.push_back(static_cast<uid_t>(uid));
        break;
    }
    return uids;
}

std::vector<pid_t> threads_of(pid_t pid) {
    std::vector<pid_t> tids;
    std::string dir = "/proc/" + std::to_string(pid) + "/task";
    DIR *d = ::opendir(dir.c_str());
    if (!d) return tids;
    while (dirent *e = ::readdir(d))
        if (is_number(e->d_name)) tids.push_back(static_cast<pid_t>(std::atol(e->d_name)));
    ::closedir(d);
    std::sort(tids.begin(), tids.end());
    return tids;
}

std::vector<pid_t> descendants_of(pid_t pid) {
    static const bool have_children_files = [] {
        const std::string self = std::to_string(::getpid());
        return ::access(("/proc/" + self + "/task/" + self + "/children").c_str(), R_OK) == 0;
    }();
    std::optional<std::multimap<pid_t, pid_t>> scanned;
    std::vector<pid_t> out;
    std::vector<pid_t> todo{pid};
    std::set<pid_t> seen{pid};
    while (!todo.empty()) {
        pid_t cur = todo.back();
        todo.pop_back();
        std::vector<pid_t> kids;
        std::optional<std::vector<pid_t>> listed;
        if (have_children_files) listed = children_from_task_files(cur);
        if (listed) {
            kids = std::move(*listed);
        } else {
            if (!scanned) scanned = children_by_scan();
            auto [lo, hi] = scanned->equal_range(cur);
            for (auto it = lo; it != hi; ++it) kids.push_back(it->second);
        }
        for (pid_t kid : kids) {
            if (!seen.insert(kid).second) continue;
            out.push_back(kid);
            todo.push_back(kid);
        }
    }
    std::sort(out.begin(), out.end());
    return out;
}

std::optional<long> pidfd_pid(int pidfd) {
    std::ifstream in("/proc/self/fdinfo/" + std::to_string(pidfd));
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("Pid:", 0) != 0) continue;
        try {
            return std::stol(line.substr(4));
        } catch (...) {
            return std::nullopt;
        }
    }
    return std::nullopt;
}

unsigned long long boot_time_ticks() {
    timespec ts{};
    ::clock_gettime(CLOCK_BOOTTIME, &ts);
    const long hz = clock_ticks_per_second();
    return static_cast<unsigned long long>(ts.tv_sec) * hz +
           static_cast<unsigned long long>(ts.tv_nsec) * hz / 1000000000ull;
}

std::string pid_list_text(const std::vector<pid_t> &pids) {
    std::string s;
    for (pid_t p : pids) s += (s.empty() ? "" : ",") + std::to_string(p);
    return s;
}

std::vector<MountEntry> read_mountinfo() {
    std::vector<MountEntry> mounts;
    std::ifstream in("/proc/self/mountinfo");
    std::string line;
    while (std::getline(in, line)) {
        // id parent maj:min root mount_point options [optional...] - fstype source super_options
        std::istringstream ls(line);
        std::vector<std::string> tok;
        std::string t;
        while (ls >> t) tok.push_back(t);
        auto dash = std::find(tok.begin(), tok.end(), "-");
        if (tok.size() < 6 || dash == tok.end() || tok.end() - dash < 4) continue;
        MountEntry m;
        m.mount_point = unescape_mount_path(tok[4]);
        m.mount_options = tok[5];
        m.fstype = *(dash + 1);
        m.super_options = *(dash + 3);
        mounts.push_back(std::move(m));
    }
    return mounts;
}

CgroupReading read_process_cgroup(pid_t pid, bool v2) {
    CgroupReading reading;
    std::string text;
    if (!read_text_file(pid == 0 ? "/proc/self/cgroup" : "/proc/" + std::to_string(pid) + "/cgroup", &text))
        return reading;  // Unreadable
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) {
        // hierarchy-id:controller,controller:path (the path may itself hold ':')
        const size_t first = line.find(':');
        const size_t second = first == std::string::npos ? first : line.find(':', first + 1);
        if (second == std::string::npos) continue;
        const std::string id = line.substr(0, first);
        const std::string controllers = line.substr(first + 1, second - first - 1);
        bool ours = v2 && id == "0" && controllers.empty();
        if (!v2) {
            std::istringstream names(controllers);
            for (std::string name; std::getline(names, name, ',');) ours = ours || name == "cpuset";
        }
        if (!ours) continue;
        reading.path = line.substr(second + 1);
        // A cgroup outside the reader's cgroup namespace reads "/../.." (and a path must be plain
        // to be joined to a mount): such a process has no cgroup malld may use.
        reading.kind = absolute_path_problem(reading.path).empty() ? CgroupReading::Kind::Plain
                                                                   : CgroupReading::Kind::NotPlain;
        return reading;
    }
    reading.kind = CgroupReading::Kind::NoLine;
    return reading;
}

std::optional<std::string> process_cgroup(pid_t pid, bool v2) {
    CgroupReading reading = read_process_cgroup(pid, v2);
    if (reading.kind != CgroupReading::Kind::Plain) return std::nullopt;
    return std::move(reading.path);
}

}  // namespace mall
