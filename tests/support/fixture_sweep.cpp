// SPDX-License-Identifier: BSD-3-Clause
// fixture_sweep.cpp — the watchdog's last resort (see malld_fixture.hpp): a registry of the process
// groups, cgroup folders and temp dirs the helpers create, and the expiry hook that SIGKILLs and
// removes them before the program dies of SIGALRM. Contract: the hook uses only async-signal-safe
// calls (kill, waitpid, open/read/write, getdents64, rmdir, unlink, nanosleep) and no allocation.

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "support/fixture_internal.hpp"

namespace mall::test {

// =============================================================================================
// Last-resort registry for the watchdog: fixed arrays, so the signal handler needs no allocation.
namespace {

constexpr int kMaxTracked = 256;
constexpr int kMaxPaths = 32;
constexpr size_t kPathLen = 512;

std::atomic<pid_t> g_groups[kMaxTracked];
char g_cgroup_dirs[kMaxPaths][kPathLen];
std::atomic<bool> g_cgroup_used[kMaxPaths];
char g_temp_dirs[kMaxPaths][kPathLen];
std::atomic<bool> g_temp_used[kMaxPaths];

}  // namespace

void internal::track_group(pid_t pgid) {
    for (auto &slot : g_groups) {
        pid_t expected = 0;
        if (slot.compare_exchange_strong(expected, pgid)) return;
    }
}

void internal::untrack_group(pid_t pgid) {
    for (auto &slot : g_groups) {
        pid_t expected = pgid;
        if (slot.compare_exchange_strong(expected, 0)) return;
    }
}

namespace {

// The cpuset hierarchy's root for the watchdog's sweep (set once, before any test runs).
char g_cpuset_root[kPathLen] = "/sys/fs/cgroup/cpuset";

int track_path(char (*table)[kPathLen], std::atomic<bool> *used, const std::string &path) {
    if (path.size() >= kPathLen) return -1;
    for (int i = 0; i < kMaxPaths; ++i) {
        bool expected = false;
        if (used[i].compare_exchange_strong(expected, true)) {
            std::memcpy(table[i], path.c_str(), path.size() + 1);
            return i;
        }
    }
    return -1;
}

void untrack_path(std::atomic<bool> *used, int slot) {
    if (slot >= 0) used[slot].store(false);
}

}  // namespace

int internal::track_cgroup_dir(const std::string &path) { return track_path(g_cgroup_dirs, g_cgroup_used, path); }
void internal::untrack_cgroup_dir(int slot) { untrack_path(g_cgroup_used, slot); }
int internal::track_temp_dir(const std::string &path) { return track_path(g_temp_dirs, g_temp_used, path); }
void internal::untrack_temp_dir(int slot) { untrack_path(g_temp_used, slot); }
void internal::set_sweep_cpuset_root(const std::string &root) {
    if (root.size() < kPathLen) std::memcpy(g_cpuset_root, root.c_str(), root.size() + 1);
}

// --- async-signal-safe helpers ---
namespace {

size_t safe_len(const char *s) {
    size_t n = 0;
    while (s[n]) ++n;
    return n;
}

}  // namespace

void internal::safe_write(const char *s) { [[maybe_unused]] auto r = ::write(2, s, safe_len(s)); }

namespace {

// dst = a + "/" + b, truncated to kPathLen.
void safe_join(char *dst, const char *a, const char *b) {
    size_t n = 0;
    for (size_t i = 0; a[i] && n + 1 < kPathLen; ++i) dst[n++] = a[i];
    if (n + 1 < kPathLen) dst[n++] = '/';
    for (size_t i = 0; b[i] && n + 1 < kPathLen; ++i) dst[n++] = b[i];
    dst[n] = '\0';
}

void safe_sleep_ms(long ms) {
    struct timespec ts{ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

struct LinuxDirent64 {
    ino64_t d_ino;
    off64_t d_off;
    unsigned short d_reclen;
    unsigned char d_type;
    char d_name[];
};

// Calls fn(name, type) for each entry of dir except "." and "..".
template <typename Fn>
void safe_for_each_entry(const char *dir, Fn fn) {
    int fd = ::open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return;
    alignas(8) char buf[4096];
    for (;;) {
        long n = ::syscall(SYS_getdents64, fd, buf, sizeof buf);
        if (n <= 0) break;
        for (long off = 0; off < n;) {
            auto *d = reinterpret_cast<LinuxDirent64 *>(buf + off);
            off += d->d_reclen;
            if (std::strcmp(d->d_name, ".") == 0 || std::strcmp(d->d_name, "..") == 0) continue;
            fn(d->d_name, d->d_type);
        }
    }
    ::close(fd);
}

// Moves every pid listed in dir/cgroup.procs to the cpuset root.
void safe_evacuate_cgroup(const char *dir) {
    char path[kPathLen];
    safe_join(path, dir, "cgroup.procs");
    int in = ::open(path, O_RDONLY | O_CLOEXEC);
    if (in < 0) return;
    char root_procs[kPathLen];
    safe_join(root_procs, g_cpuset_root, "cgroup.procs");
    int out = ::open(root_procs, O_WRONLY | O_CLOEXEC);
    char buf[4096];
    long n = ::read(in, buf, sizeof buf - 1);
    ::close(in);
    if (out < 0 || n <= 0) {
        if (out >= 0) ::close(out);
        return;
    }
    char *p = buf;
    char *end = buf + n;
    while (p < end) {
        char *line = p;
        while (p < end && *p != '\n') ++p;
        if (p > line) {
            [[maybe_unused]] auto r = ::write(out, line, static_cast<size_t>(p - line));
        }
        ++p;
    }
    ::close(out);
}

void safe_remove_cgroup_tree(const char *dir, int depth) {
    if (depth > 4) return;
    safe_for_each_entry(dir, [&](const char *name, unsigned char type) {
        if (type != DT_DIR) return;
        char sub[kPathLen];
        safe_join(sub, dir, name);
        safe_remove_cgroup_tree(sub, depth + 1);
    });
    for (int attempt = 0; attempt < 20; ++attempt) {
        safe_evacuate_cgroup(dir);
        if (::rmdir(dir) == 0 || errno == ENOENT) return;
        safe_sleep_ms(50);
    }
}

void safe_remove_tree(const char *dir, int depth) {
    if (depth > 6) return;
    safe_for_each_entry(dir, [&](const char *name, unsigned char type) {
        char sub[kPathLen];
        safe_join(sub, dir, name);
        if (type == DT_DIR) {
            safe_remove_tree(sub, depth + 1);
            ::rmdir(sub);
        } else {
            ::unlink(sub);
        }
    });
    ::rmdir(dir);
}

// The watchdog's expiry hook (support/watchdog.h runs it, then the program dies of SIGALRM).
void sweep_on_watchdog() {
    using internal::safe_write;
    safe_write("watchdog: killing the test's processes, removing its cgroups and temp dirs\n");
    for (auto &slot : g_groups) {
        pid_t pg = slot.load();
        if (pg > 0) ::kill(-pg, SIGKILL);
    }
    for (int i = 0; i < 40; ++i) {  // reap what we can for up to 2 s so cgroups empty out
        while (::waitpid(-1, nullptr, WNOHANG) > 0) {
        }
        safe_sleep_ms(50);
    }
    for (int i = 0; i < kMaxPaths; ++i)
        if (g_cgroup_used[i].load()) safe_remove_cgroup_tree(g_cgroup_dirs[i], 0);
    for (int i = 0; i < kMaxPaths; ++i)
        if (g_temp_used[i].load()) safe_remove_tree(g_temp_dirs[i], 0);
}

[[maybe_unused]] const bool g_sweep_registered = (mall_test_watchdog_on_expiry(sweep_on_watchdog), true);

}  // namespace

}  // namespace mall::test
