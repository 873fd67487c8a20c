// SPDX-License-Identifier: BSD-3-Clause
// procfs.hpp — what malld reads of processes from /proc, in one place: a process's parent, start
// time, cpu time, liveness and kernel-thread flag (/proc/PID/stat), its threads, descendants and
// ancestors, its uids and thread group (/proc/PID/status), its user namespace and who owns it
// (/proc/PID/ns/user),
// the pid behind a pidfd (/proc/self/fdinfo), its cpuset cgroup (/proc/PID/cgroup), and the mount
// table (/proc/self/mountinfo). Every
// reader returns "unknown" (nullopt, false or empty) for a process that is gone or unreadable and
// never throws. Each call reads the files anew (only whether the kernel has
// /proc/PID/task/TID/children is checked once).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mall {

std::optional<unsigned long long> process_start_time(pid_t pid);  // /proc/PID/stat field 22, in clock ticks
bool process_alive(pid_t pid);                                      // exists and is not a zombie
// The cpu time a process used so far, utime + stime (/proc/PID/stat fields 14 and 15, its own
// threads', not its reaped children's), and its start time (field 22), both in clock ticks.
struct ProcessCpuTime {
    unsigned long long start_ticks = 0;
    unsigned long long cpu_ticks = 0;
};
std::optional<ProcessCpuTime> process_cpu_time(pid_t pid);
// The same from a /proc/PID/stat text (split after its last ')': the command name is the user's
// and may hold spaces and parentheses); nullopt when malformed.
std::optional<ProcessCpuTime> parse_process_cpu_time(const std::string &stat_text);
long clock_ticks_per_second();                                      // sysconf(_SC_CLK_TCK)
std::optional<pid_t> parent_pid(pid_t pid);                         // /proc/PID/stat field 4
// True when pid is one of `pids` or descends from one (walks the parent chain).
bool in_process_tree(pid_t pid, const std::vector<pid_t> &pids);
// True when /proc/PID/status names uid as the process's real or effective uid.
bool process_has_uid(pid_t pid, uid_t uid);
// The process's real uid (/proc/PID/status "Uid:", first field); nullopt when gone.
std::optional<uid_t> process_real_uid(pid_t pid);
// The thread group (/proc/PID/status "Tgid:"): pid itself for a process, its process's pid when
// pid names one of its other threads; nullopt when gone.
std::optional<pid_t> thread_group_of(pid_t pid);
// True for a kernel thread: PF_KTHREAD in /proc/PID/stat's flags, or kthreadd (pid 2, parent 0)
// or a child of it.
bool is_kernel_thread(pid_t pid);
// The parent chain of pid, nearest first, down to pid 1 (pid itself not included).
std::vector<pid_t> ancestors_of(pid_t pid);
// True when the process runs in this process's user namespace (/proc/PID/ns/user and
// /proc/self/ns/user are one namespace), false in another one (a rootless container's); nullopt
// when unreadable.
std::optional<bool> shares_user_namespace(pid_t pid);
// The uid that owns the process's user namespace as seen from this process's: for a process in a
// namespace nested below this one, the owner of the outermost namespace below this one (the user
// who made it: a rootless container's, whatever namespaces it made inside). nullopt when the
// process runs in this process's namespace (there is no such owner), is gone, or the kernel
// cannot say (ioctl NS_GET_OWNER_UID / NS_GET_PARENT, Linux 4.11). With `pidfd` (>= 0) for that
// process, also nullopt when it exited before its namespace file was opened (pid reuse).
std::optional<uid_t> user_namespace_owner(pid_t pid, int pidfd = -1);
// That outermost namespace below this process's: the uid that made it (its owner, as above) and
// its inode (/proc/PID/ns/user's, which names it while it exists). Same nullopt cases.
struct OuterUserNamespace {
    uid_t owner = 0;
    uint64_t inode = 0;
};
std::optional<OuterUserNamespace> outer_user_namespace(pid_t pid, int pidfd = -1);
// The process's uids (/proc/PID/status "Uid:": real, effective, saved, filesystem); empty when gone.
std::vector<uid_t> process_uids(pid_t pid);
std::vector<pid_t> threads_of(pid_t pid);      // /proc/PID/task/*, sorted
std::vector<pid_t> descendants_of(pid_t pid);  // children, grandchildren... (not pid), sorted
// The pid a pidfd refers to (/proc/self/fdinfo "Pid:"): -1 once the process has exited and been
// reaped, nullopt when unreadable.
std::optional<long> pidfd_pid(int pidfd);
// CLOCK_BOOTTIME in clock ticks: the clock of process_start_time().
unsigned long long boot_time_ticks();
// "1,2,3": pids for log lines and messages.
std::string pid_list_text(const std::vector<pid_t> &pids);

struct MountEntry {
    std::string mount_point;    // octal escapes (\040) decoded
    std::string mount_options;  // per-mount options ("rw,relatime")
    std::string fstype;
    std::string super_options;  // per-superblock options (for cgroup v1: the controllers)
};
std::vector<MountEntry> read_mountinfo();  // /proc/self/mountinfo

// The cgroup of a process in the hierarchy that holds the cpuset controller, as /proc/PID/cgroup
// shows it ("/" for the root, "/slurm/uid_0/job_5/step_0" ...): on cgroup v1 the line whose
// controller list names cpuset, on cgroup v2 the "0::" line. The one reader of that file: a path
// malld may join to its mount, or why there is none. pid 0 reads /proc/self/cgroup.
struct CgroupReading {
    enum class Kind {
        Plain,        // `path` is the cgroup
        NotPlain,     // the line's path is not plain (absolute_path_problem): "/.." where the
                      // cgroup lies outside the reader's cgroup namespace, empty or "." parts;
                      // `path` is the line's path as the file shows it
        NoLine,       // the file has no such line (no cpuset hierarchy for this process)
        Unreadable,   // the process is gone, or its file cannot be read
    };
    Kind kind = Kind::Unreadable;
    std::string path;
};
CgroupReading read_process_cgroup(pid_t pid, bool v2);
// read_process_cgroup's path when it is Plain; nullopt for every other kind.
std::optional<std::string> process_cgroup(pid_t pid, bool v2);

}  // namespace mall
