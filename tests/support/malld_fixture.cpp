// SPDX-License-Identifier: BSD-3-Clause
// malld_fixture.cpp — implementation of the integration-test helpers (see malld_fixture.hpp).
// Contract: nothing a helper starts or creates outlives it; the watchdog's signal handler uses only
// async-signal-safe calls (kill, waitpid, open/read/write, getdents64, rmdir, unlink, _exit).

#include "support/malld_fixture.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/ctl_client.hpp"
#include "common/protocol.hpp"

extern char **environ;

#ifndef MALL_BIN_DIR
#error "MALL_BIN_DIR must name the folder holding malld, mallctl, mallrun and mall_test_client"
#endif

namespace mall::test {

namespace fs = std::filesystem;

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

void track_group(pid_t pgid) {
    for (auto &slot : g_groups) {
        pid_t expected = 0;
        if (slot.compare_exchange_strong(expected, pgid)) return;
    }
}

void untrack_group(pid_t pgid) {
    for (auto &slot : g_groups) {
        pid_t expected = pgid;
        if (slot.compare_exchange_strong(expected, 0)) return;
    }
}

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

// --- async-signal-safe helpers ---
size_t safe_len(const char *s) {
    size_t n = 0;
    while (s[n]) ++n;
    return n;
}

void safe_write(const char *s) { [[maybe_unused]] auto r = ::write(2, s, safe_len(s)); }

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

// =============================================================================================
// Utilities.

std::string bin_path(const std::string &program) { return std::string(MALL_BIN_DIR) + "/" + program; }

namespace {
std::pair<std::string, bool> find_cpuset_root() {
    std::ifstream mounts("/proc/mounts");
    std::string line, v2_root;
    while (std::getline(mounts, line)) {
        std::istringstream in(line);
        std::string dev, dir, type, opts;
        in >> dev >> dir >> type >> opts;
        if (type == "cgroup" && ("," + opts + ",").find(",cpuset,") != std::string::npos) return {dir, false};
        if (type == "cgroup2" && v2_root.empty()) {
            std::istringstream controllers(read_file(dir + "/cgroup.controllers"));
            std::string c;
            while (controllers >> c)
                if (c == "cpuset") v2_root = dir;
        }
    }
    if (!v2_root.empty()) return {v2_root, true};
    return {kCpusetRoot, false};
}
const std::pair<std::string, bool> &cpuset_hierarchy() {
    static const std::pair<std::string, bool> found = [] {
        auto f = find_cpuset_root();
        if (f.first.size() < kPathLen) std::memcpy(g_cpuset_root, f.first.c_str(), f.first.size() + 1);
        return f;
    }();
    return found;
}
[[maybe_unused]] const bool g_cpuset_root_found = (cpuset_hierarchy(), true);
}  // namespace

std::string cpuset_root() { return cpuset_hierarchy().first; }
bool cpuset_is_v2() { return cpuset_hierarchy().second; }

std::optional<std::string> missing_privileges() { return missing_root_or_any_cpuset(); }

std::string backend_or_system(const std::string &backend) {
    if (!backend.empty()) return backend;
    return cpuset_is_v2() ? "cgroup-v2" : "cgroup-v1";
}

std::optional<std::string> missing_root_or_any_cpuset() {
    if (::geteuid() != 0)
        return std::string("needs root: the integration tests write cgroup cpusets and run children "
                           "as user nobody (run them as root, e.g. in the CI container)");
    if (cpuset_root() == kCpusetRoot && !cpuset_is_v2() &&
        ::access((std::string(kCpusetRoot) + "/cpuset.cpus").c_str(), W_OK) != 0)
        return std::string("no cpuset controller: neither a cgroup-v1 cpuset hierarchy nor a cgroup2 "
                           "mount listing cpuset in cgroup.controllers (tests/vm runs the cgroup-v2 "
                           "cases in a virtual machine)");
    return std::nullopt;
}

TestCgroupTree::TestCgroupTree(const std::string &name) : root_(cpuset_root() + "/" + name) {
    slot_ = track_path(g_cgroup_dirs, g_cgroup_used, root_);
}

TestCgroupTree::~TestCgroupTree() {
    remove_cgroup_tree(root_);
    untrack_path(g_cgroup_used, slot_);
}

std::string TestCgroupTree::make(const std::string &rel, const std::string &cpus, std::string *error) {
    const std::string dir = rel.empty() ? root_ : root_ + "/" + rel;
    auto fail = [&](const std::string &what) {
        if (error) *error = what + ": " + std::strerror(errno);
        return std::string();
    };
    // Every folder from the root down: v2 needs cpuset enabled in each parent's subtree_control,
    // v1 needs cpus and mems in each before a child can have them.
    std::string parent = cpuset_root();
    std::string path = rel.empty() ? name_of_root() : name_of_root() + "/" + rel;
    std::istringstream parts(path);
    std::string part, current = parent;
    while (std::getline(parts, part, '/')) {
        if (part.empty()) continue;
        if (cpuset_is_v2()) {
            std::ofstream(current + "/cgroup.subtree_control") << "+cpuset" << std::endl;
        }
        const std::string next = current + "/" + part;
        if (::mkdir(next.c_str(), 0755) != 0 && errno != EEXIST) return fail("mkdir " + next);
        if (!cpuset_is_v2()) {
            std::string mems = trim(read_file(current + "/cpuset.mems"));
            if (trim(read_file(next + "/cpuset.cpus")).empty()) {
                std::ofstream(next + "/cpuset.cpus") << trim(read_file(current + "/cpuset.cpus")) << std::endl;
            }
            if (trim(read_file(next + "/cpuset.mems")).empty()) std::ofstream(next + "/cpuset.mems") << mems << std::endl;
        }
        current = next;
    }
    {
        std::ofstream out(dir + "/cpuset.cpus");
        out << cpus << std::endl;
        if (!out) return fail("writing '" + cpus + "' to " + dir + "/cpuset.cpus");
    }
    return dir;
}

std::string TestCgroupTree::name_of_root() const { return root_.substr(cpuset_root().size() + 1); }

bool wait_until(const std::function<bool()> &pred, Millis timeout, Millis interval) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
        if (pred()) return true;
        if (std::chrono::steady_clock::now() >= deadline) return pred();
        std::this_thread::sleep_for(interval);
    }
}

std::string read_file(const std::string &path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return "";
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

std::string trim(std::string s) {
    auto not_space = [](unsigned char c) { return !std::isspace(c); };
    s.erase(s.begin(), std::find_if(s.begin(), s.end(), not_space));
    s.erase(std::find_if(s.rbegin(), s.rend(), not_space).base(), s.end());
    return s;
}

bool contains_icase(const std::string &haystack, const std::string &needle) {
    auto lower = [](std::string s) {
        for (auto &c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        return s;
    };
    return lower(haystack).find(lower(needle)) != std::string::npos;
}

std::map<pid_t, std::string> thread_cpus_allowed(pid_t pid) {
    std::map<pid_t, std::string> result;
    std::error_code ec;
    fs::directory_iterator it(fs::path("/proc") / std::to_string(pid) / "task", ec);
    if (ec) return result;
    for (const auto &entry : it) {
        pid_t tid = 0;
        try {
            tid = static_cast<pid_t>(std::stoi(entry.path().filename().string()));
        } catch (...) {
            continue;
        }
        std::istringstream status(read_file((entry.path() / "status").string()));
        std::string line;
        while (std::getline(status, line)) {
            if (line.rfind("Cpus_allowed_list:", 0) == 0) {
                result[tid] = trim(line.substr(std::strlen("Cpus_allowed_list:")));
                break;
            }
        }
    }
    return result;
}

std::vector<std::string> split_lines(const std::string &text) {
    std::vector<std::string> lines;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
}

std::string joined_lines(const std::vector<std::string> &lines) {
    std::string s;
    for (const auto &l : lines) s += l + "\n";
    return s;
}

std::optional<std::vector<int>> parse_cpu_list(const std::string &text) {
    std::vector<int> cpus;
    std::string t = trim(text);
    if (t.empty()) return cpus;
    std::istringstream in(t);
    std::string item;
    while (std::getline(in, item, ',')) {
        try {
            auto dash = item.find('-');
            size_t used = 0;
            if (dash == std::string::npos) {
                int v = std::stoi(item, &used);
                if (used != item.size() || v < 0) return std::nullopt;
                cpus.push_back(v);
            } else {
                std::string a = item.substr(0, dash), b = item.substr(dash + 1);
                size_t ua = 0, ub = 0;
                int lo = std::stoi(a, &ua), hi = std::stoi(b, &ub);
                if (ua != a.size() || ub != b.size() || lo < 0 || hi < lo) return std::nullopt;
                for (int c = lo; c <= hi; ++c) cpus.push_back(c);
            }
        } catch (...) {
            return std::nullopt;
        }
    }
    std::sort(cpus.begin(), cpus.end());
    cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
    return cpus;
}

std::vector<int> allowed_cpus_union(const std::vector<pid_t> &pids) {
    std::vector<int> all;
    for (pid_t pid : pids)
        for (const auto &[tid, list] : thread_cpus_allowed(pid))
            if (auto cpus = parse_cpu_list(list)) all.insert(all.end(), cpus->begin(), cpus->end());
    std::sort(all.begin(), all.end());
    all.erase(std::unique(all.begin(), all.end()), all.end());
    return all;
}

bool threads_all_on(const std::vector<pid_t> &pids, const std::string &cpus) {
    if (pids.empty()) return false;
    for (pid_t pid : pids) {
        auto threads = thread_cpus_allowed(pid);
        if (threads.empty()) return false;
        for (const auto &[tid, list] : threads)
            if (list != cpus) return false;
    }
    return true;
}

std::string describe_threads(const std::vector<pid_t> &pids) {
    std::string text;
    for (pid_t pid : pids) {
        auto threads = thread_cpus_allowed(pid);
        if (threads.empty()) text += std::to_string(pid) + "(gone) ";
        for (const auto &[tid, list] : threads)
            text += std::to_string(pid) + "/" + std::to_string(tid) + "=" + list + " ";
    }
    return text.empty() ? "(no pids)" : text;
}

std::optional<std::string> cgroup_cpus(const std::string &cgroup_dir) {
    std::ifstream in(cgroup_dir + "/cpuset.cpus");
    if (!in) return std::nullopt;
    std::string s;
    std::getline(in, s);
    return trim(s);
}

// =============================================================================================
// Spawning.
namespace {

// Everything the child needs, prepared before fork (no allocation after fork).
struct SpawnPlan {
    std::vector<std::string> argv_storage, env_storage;
    std::vector<char *> argv, envp;
    bool as_nobody = false;
    uid_t uid = 0;
    gid_t gid = 0;
};

SpawnPlan make_plan(const std::vector<std::string> &argv,
                    const std::vector<std::pair<std::string, std::string>> &env, bool as_nobody) {
    SpawnPlan plan;
    plan.argv_storage = argv;
    for (char **e = environ; e && *e; ++e)
        if (std::strncmp(*e, "MALL_", 5) != 0) plan.env_storage.emplace_back(*e);
    for (const auto &[k, v] : env) plan.env_storage.push_back(k + "=" + v);
    for (auto &s : plan.argv_storage) plan.argv.push_back(s.data());
    plan.argv.push_back(nullptr);
    for (auto &s : plan.env_storage) plan.envp.push_back(s.data());
    plan.envp.push_back(nullptr);
    plan.as_nobody = as_nobody;
    if (as_nobody) {
        struct passwd *pw = ::getpwnam("nobody");
        plan.uid = pw ? pw->pw_uid : 65534;
        plan.gid = pw ? pw->pw_gid : 65534;
    }
    return plan;
}

// Forks and execs; the child gets its own process group, stdout/stderr on the given fds (-1 =
// inherit). Returns the pid or -1.
pid_t spawn(const SpawnPlan &plan, int stdout_fd, int stderr_fd) {
    pid_t pid = ::fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        ::setpgid(0, 0);
        sigset_t all;
        sigemptyset(&all);
        ::sigprocmask(SIG_SETMASK, &all, nullptr);
        ::signal(SIGPIPE, SIG_DFL);
        int devnull = ::open("/dev/null", O_RDONLY);
        if (devnull >= 0) ::dup2(devnull, 0);
        if (stdout_fd >= 0) ::dup2(stdout_fd, 1);
        if (stderr_fd >= 0) ::dup2(stderr_fd, 2);
        if (plan.as_nobody) {
            if (::chdir("/") != 0 || ::setgroups(0, nullptr) != 0 || ::setgid(plan.gid) != 0 ||
                ::setuid(plan.uid) != 0) {
                safe_write("mall test: cannot become user nobody in the child\n");
                ::_exit(126);
            }
        }
        ::execve(plan.argv[0], plan.argv.data(), plan.envp.data());
        safe_write("mall test: execve failed for ");
        safe_write(plan.argv[0]);
        safe_write("\n");
        ::_exit(127);
    }
    ::setpgid(pid, pid);  // also in the parent, so the group exists before we signal it
    track_group(pid);
    return pid;
}

int decode_status(int status) {
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return -1;
}

// Waits for pid to exit, up to timeout; returns its code or nullopt.
std::optional<int> wait_pid(pid_t pid, Millis timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
        int status = 0;
        pid_t r = ::waitpid(pid, &status, WNOHANG);
        if (r == pid) return decode_status(status);
        if (r < 0 && errno != EINTR) return -1;
        if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
        std::this_thread::sleep_for(5ms);
    }
}

}  // namespace

CommandResult run_command(const std::vector<std::string> &argv, const RunOptions &options) {
    CommandResult result;
    int out_pipe[2], err_pipe[2];
    if (::pipe2(out_pipe, O_CLOEXEC) != 0) return result;
    if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
        ::close(out_pipe[0]);
        ::close(out_pipe[1]);
        return result;
    }
    SpawnPlan plan = make_plan(argv, options.env, options.as_nobody);
    pid_t pid = spawn(plan, out_pipe[1], err_pipe[1]);
    ::close(out_pipe[1]);
    ::close(err_pipe[1]);
    result.pid = pid;
    if (pid < 0) {
        ::close(out_pipe[0]);
        ::close(err_pipe[0]);
        return result;
    }
    auto deadline = std::chrono::steady_clock::now() + options.timeout;
    struct pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
    int open_fds = 2;
    while (open_fds > 0) {
        auto left = std::chrono::duration_cast<Millis>(deadline - std::chrono::steady_clock::now());
        if (left.count() <= 0) {
            result.timed_out = true;
            break;
        }
        int r = ::poll(fds, 2, static_cast<int>(std::min<long long>(left.count(), 100)));
        if (r < 0 && errno != EINTR) break;
        for (int i = 0; i < 2; ++i) {
            if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            char buf[4096];
            ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
            if (n > 0) {
                (i == 0 ? result.out : result.err).append(buf, static_cast<size_t>(n));
            } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
                ::close(fds[i].fd);
                fds[i].fd = -1;
                --open_fds;
            }
        }
    }
    for (auto &f : fds)
        if (f.fd >= 0) ::close(f.fd);
    if (result.timed_out) ::kill(-pid, SIGKILL);
    auto left = std::chrono::duration_cast<Millis>(deadline - std::chrono::steady_clock::now());
    auto code = wait_pid(pid, std::max(left, Millis(2000)));
    if (!code) {
        result.timed_out = true;
        ::kill(-pid, SIGKILL);
        code = wait_pid(pid, 10s);
    }
    ::kill(-pid, SIGKILL);  // leftovers of its group (a grandchild that outlived it)
    untrack_group(pid);
    result.exit_code = code.value_or(-1);
    return result;
}

// =============================================================================================
// Child.

Child::Child(std::vector<std::string> argv, ChildOptions options) : argv_(std::move(argv)) {
    int out_pipe[2];
    if (::pipe2(out_pipe, O_CLOEXEC) != 0) return;
    SpawnPlan plan = make_plan(argv_, options.env, options.as_nobody);
    pid_ = spawn(plan, out_pipe[1], options.capture_stderr ? out_pipe[1] : -1);
    ::close(out_pipe[1]);
    if (pid_ < 0) {
        ::close(out_pipe[0]);
        eof_ = true;
        return;
    }
    reader_ = std::thread([this, fd = out_pipe[0]] { reader_loop(fd); });
}

void Child::reader_loop(int fd) {
    std::string partial;
    for (;;) {
        struct pollfd p{fd, POLLIN, 0};
        int r = ::poll(&p, 1, 100);
        {
            std::lock_guard lock(mutex_);
            if (eof_) break;  // the destructor asked us to stop
        }
        if (r <= 0) continue;
        char buf[4096];
        ssize_t n = ::read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        std::lock_guard lock(mutex_);
        if (n <= 0) {
            if (!partial.empty()) lines_.push_back(partial);
            eof_ = true;
            cv_.notify_all();
            break;
        }
        partial.append(buf, static_cast<size_t>(n));
        size_t nl;
        while ((nl = partial.find('\n')) != std::string::npos) {
            lines_.push_back(partial.substr(0, nl));
            partial.erase(0, nl + 1);
        }
        cv_.notify_all();
    }
    ::close(fd);
}

std::optional<std::string> Child::read_line(Millis timeout) {
    std::unique_lock lock(mutex_);
    cv_.wait_for(lock, timeout, [&] { return next_unread_ < lines_.size() || eof_; });
    if (next_unread_ < lines_.size()) return lines_[next_unread_++];
    return std::nullopt;
}

std::optional<std::string> Child::wait_for_line(const std::function<bool(const std::string &)> &pred,
                                                Millis timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
        auto left = std::chrono::duration_cast<Millis>(deadline - std::chrono::steady_clock::now());
        if (left.count() < 0) return std::nullopt;
        auto line = read_line(left);
        if (!line) return std::nullopt;
        if (pred(*line)) return line;
    }
}

std::optional<std::string> Child::wait_for_line_starting(const std::string &prefix, Millis timeout) {
    return wait_for_line([&](const std::string &l) { return l.rfind(prefix, 0) == 0; }, timeout);
}

std::vector<std::string> Child::all_lines() const {
    std::lock_guard lock(mutex_);
    return lines_;
}

void Child::signal(int sig) const {
    if (pid_ > 0 && !exit_code_) ::kill(pid_, sig);
}

void Child::signal_group(int sig) const {
    if (pid_ > 0) ::kill(-pid_, sig);
}

std::optional<int> Child::wait_exit(Millis timeout) {
    if (exit_code_) return exit_code_;
    if (pid_ <= 0) return std::nullopt;
    exit_code_ = wait_pid(pid_, timeout);
    return exit_code_;
}

Child::~Child() {
    if (pid_ > 0) {
        if (!exit_code_) {
            ::kill(-pid_, SIGTERM);
            if (!wait_exit(3s)) {
                ::kill(-pid_, SIGKILL);
                wait_exit(30s);
            }
        }
        ::kill(-pid_, SIGKILL);  // anything left in its group (e.g. a grandchild)
        untrack_group(pid_);
    }
    if (reader_.joinable()) {
        // The reader stops at end of output; if a stray process still holds the pipe, tell it to stop.
        auto deadline = std::chrono::steady_clock::now() + 2s;
        while (std::chrono::steady_clock::now() < deadline) {
            {
                std::lock_guard lock(mutex_);
                if (eof_) break;
            }
            std::this_thread::sleep_for(10ms);
        }
        {
            std::lock_guard lock(mutex_);
            eof_ = true;
        }
        reader_.join();
    }
}

std::vector<std::string> mallrun_argv(const std::string &socket, const std::string &malleable,
                                      const std::string &job, const std::vector<std::string> &cmd,
                                      const std::vector<std::string> &extra) {
    std::vector<std::string> argv{bin_path("mallrun"), "--socket", socket, "--malleable=" + malleable};
    if (!job.empty()) {
        argv.push_back("--job");
        argv.push_back(job);
    }
    argv.insert(argv.end(), extra.begin(), extra.end());
    argv.push_back("--");
    argv.insert(argv.end(), cmd.begin(), cmd.end());
    return argv;
}

std::vector<std::string> test_client_argv(const std::vector<std::string> &options) {
    std::vector<std::string> argv{bin_path("mall_test_client")};
    argv.insert(argv.end(), options.begin(), options.end());
    return argv;
}

std::vector<std::string> mallctl_argv(const std::string &socket, const std::vector<std::string> &args) {
    std::vector<std::string> argv{bin_path("mallctl"), "--socket", socket};
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
}

// =============================================================================================
// PrivateMalld.
namespace {
std::atomic<int> g_malld_counter{0};
// Watchdog slots of each PrivateMalld, keyed by its temp dir.
std::mutex g_slots_mutex;
std::map<std::string, std::pair<int, int>> g_slots;
}  // namespace

PrivateMalld::PrivateMalld(MalldOptions options) : options_(std::move(options)) {
    char tmpl[] = "/tmp/mall_test_XXXXXX";
    if (char *d = ::mkdtemp(tmpl)) dir_ = d;
    // Readable by nobody: the security test runs clients as nobody against this socket.
    ::chmod(dir_.c_str(), 0755);
    socket_ = dir_ + "/malld.sock";
    state_dir_ = dir_ + "/state";
    ::mkdir(state_dir_.c_str(), 0755);
    log_path_ = dir_ + "/malld.log";
    cgroup_parent_ = "mall_test_" + std::to_string(::getpid()) + "_" + std::to_string(g_malld_counter++);
    int cg = track_path(g_cgroup_dirs, g_cgroup_used, cgroup_dir());
    int tmp = track_path(g_temp_dirs, g_temp_used, dir_);
    std::lock_guard lock(g_slots_mutex);
    g_slots[dir_] = {cg, tmp};
}

std::string PrivateMalld::cgroup_dir() const { return cpuset_root() + "/" + cgroup_parent_; }

std::vector<std::string> PrivateMalld::argv() const {
    std::vector<std::string> argv{bin_path("malld"),    "--socket",        socket_,
                                  "--state-dir",        state_dir_,        "--backend",
                                  backend_or_system(options_.backend), "--policy", options_.policy,
                                  "--ack-timeout-ms",   std::to_string(options_.ack_timeout_ms),
                                  "--cgroup-parent",    cgroup_parent_,    "--log-level",
                                  options_.log_level};
    if (!options_.cpus.empty()) {
        argv.push_back("--cpus");
        argv.push_back(options_.cpus);
    }
    argv.insert(argv.end(), options_.extra_args.begin(), options_.extra_args.end());
    return argv;
}

bool PrivateMalld::start(std::string *error) {
    if (pid_ > 0) {
        if (error) *error = "malld is already running";
        return false;
    }
    int log_fd = ::open(log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0) {
        if (error) *error = "cannot open " + log_path_ + ": " + std::strerror(errno);
        return false;
    }
    std::vector<std::string> command = argv();
    if (!options_.start_in_cgroup.empty()) {
        std::vector<std::string> wrapped{"/bin/sh", "-c",
                                         "echo $$ > '" + options_.start_in_cgroup + "/cgroup.procs' && exec \"$0\" \"$@\""};
        wrapped.insert(wrapped.end(), command.begin(), command.end());
        command = std::move(wrapped);
    }
    SpawnPlan plan = make_plan(command, {}, false);
    pid_ = spawn(plan, log_fd, log_fd);
    ::close(log_fd);
    if (pid_ < 0) {
        if (error) *error = std::string("fork failed: ") + std::strerror(errno);
        return false;
    }
    auto deadline = std::chrono::steady_clock::now() + options_.ready_timeout;
    for (;;) {
        int status = 0;
        if (::waitpid(pid_, &status, WNOHANG) == pid_) {
            untrack_group(pid_);
            pid_ = -1;
            if (error)
                *error = "malld exited with code " + std::to_string(decode_status(status)) +
                         " before answering; its log:\n" + log();
            return false;
        }
        if (status_json(socket_)) return true;
        if (std::chrono::steady_clock::now() >= deadline) {
            if (error) *error = "malld did not answer a Status within the ready timeout; its log:\n" + log();
            return false;
        }
        std::this_thread::sleep_for(20ms);
    }
}

void PrivateMalld::kill9() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    wait_pid(pid_, 30s);
    untrack_group(pid_);
    pid_ = -1;
}

std::optional<int> PrivateMalld::stop(Millis deadline) {
    if (pid_ <= 0) return std::nullopt;
    ::kill(pid_, SIGTERM);
    auto code = wait_pid(pid_, deadline);
    if (!code) {
        ::kill(pid_, SIGKILL);
        code = wait_pid(pid_, 30s);
    }
    untrack_group(pid_);
    pid_ = -1;
    return code;
}

PrivateMalld::~PrivateMalld() {
    stop();
    if (::testing::UnitTest::GetInstance()->current_test_info() && ::testing::Test::HasFailure()) {
        std::string text = log();
        if (text.size() > 12000) text = "...\n" + text.substr(text.size() - 12000);
        std::fprintf(stderr, "---- malld log (%s) ----\n%s---- end of malld log ----\n",
                     log_path_.c_str(), text.c_str());
    }
    if (fs::exists(cgroup_dir())) remove_cgroup_tree(cgroup_dir());
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
    std::lock_guard lock(g_slots_mutex);
    auto it = g_slots.find(dir_);
    if (it != g_slots.end()) {
        untrack_path(g_cgroup_used, it->second.first);
        untrack_path(g_temp_used, it->second.second);
        g_slots.erase(it);
    }
}

bool remove_cgroup_tree(const std::string &dir) {
    std::error_code ec;
    if (!fs::exists(dir, ec)) return true;
    bool ok = true;
    for (const auto &entry : fs::directory_iterator(dir, ec))
        if (entry.is_directory(ec)) ok = remove_cgroup_tree(entry.path().string()) && ok;
    auto deadline = std::chrono::steady_clock::now() + 5s;
    for (;;) {
        std::istringstream procs(read_file(dir + "/cgroup.procs"));
        std::string pid;
        while (std::getline(procs, pid)) {
            std::ofstream root(cpuset_root() + "/cgroup.procs");
            root << pid << std::endl;
        }
        if (::rmdir(dir.c_str()) == 0 || errno == ENOENT) return ok;
        if (std::chrono::steady_clock::now() >= deadline) {
            std::fprintf(stderr, "mall test: cannot remove cgroup %s: %s\n", dir.c_str(), std::strerror(errno));
            return false;
        }
        std::this_thread::sleep_for(20ms);
    }
}

// =============================================================================================
// Talking to malld.

std::string status_text(const PrivateMalld &malld) {
    auto s = status_json(malld.socket());
    return s ? s->dump(1) : std::string("(malld does not answer)");
}

double percentile(std::vector<double> samples, double p) {
    if (samples.empty()) return 0;
    std::sort(samples.begin(), samples.end());
    size_t rank = static_cast<size_t>(std::ceil(p * static_cast<double>(samples.size())));
    return samples[std::clamp<size_t>(rank, 1, samples.size()) - 1];
}

std::optional<nlohmann::json> status_json(const std::string &socket) {
    std::string error;
    auto client = CtlClient::connect(socket, &error);
    if (!client) return std::nullopt;
    auto reply = client->request(proto::Type::Status, nlohmann::json::object(), 5s);
    if (!reply.ok || !reply.body.is_object()) return std::nullopt;
    return reply.body;
}

std::optional<nlohmann::json> find_job(const nlohmann::json &status, const std::string &job) {
    if (!status.contains("jobs") || !status["jobs"].is_array()) return std::nullopt;
    for (const auto &j : status["jobs"])
        if (j.value("job", "") == job) return j;
    return std::nullopt;
}

std::optional<nlohmann::json> job_status(const std::string &socket, const std::string &job) {
    auto status = status_json(socket);
    if (!status) return std::nullopt;
    return find_job(*status, job);
}

bool job_settled_on(const std::string &socket, const std::string &job, const std::string &cpus,
                    int attached) {
    auto j = job_status(socket, job);
    if (!j) return false;
    try {
        return j->value("cpus", "?") == cpus && j->value("cpuset", "?") == cpus &&
               j->value("state", "") == "settled" &&
               j->value("generation", 0ull) == j->value("acked_generation", ~0ull) &&
               (attached < 0 || j->value("attached", -1) == attached);
    } catch (const std::exception &) {
        return false;
    }
}

std::vector<pid_t> job_pids(const nlohmann::json &job) {
    std::vector<pid_t> pids;
    if (job.contains("pids") && job["pids"].is_array())
        for (const auto &p : job["pids"])
            if (p.is_number_integer()) pids.push_back(p.get<pid_t>());
    return pids;
}

// =============================================================================================
// EventRecorder.

struct EventRecorder::Impl {
    std::optional<CtlClient> client;
};

bool EventRecorder::start(const std::string &socket, std::string *error) {
    impl_ = std::make_shared<Impl>();
    impl_->client = CtlClient::connect(socket, error);
    if (!impl_->client) return false;
    auto reply = impl_->client->request(proto::Type::Watch, nlohmann::json::object(), 5s);
    if (!reply.ok) {
        if (error) *error = "Watch refused: " + reply.error;
        return false;
    }
    thread_ = std::thread([this] { loop(); });
    return true;
}

void EventRecorder::loop() {
    for (;;) {
        {
            std::lock_guard lock(mutex_);
            if (stop_) return;
        }
        bool closed = false;
        auto event = impl_->client->next_event(100ms, &closed);
        std::lock_guard lock(mutex_);
        if (event) {
            events_.push_back(std::move(*event));
            cv_.notify_all();
        }
        if (closed) {
            closed_ = true;
            cv_.notify_all();
            return;
        }
    }
}

void EventRecorder::stop() {
    {
        std::lock_guard lock(mutex_);
        stop_ = true;
    }
    if (thread_.joinable()) thread_.join();
}

EventRecorder::~EventRecorder() { stop(); }

std::vector<nlohmann::json> EventRecorder::events() const {
    std::lock_guard lock(mutex_);
    return events_;
}

nlohmann::json EventRecorder::at(size_t index) const {
    std::lock_guard lock(mutex_);
    return index < events_.size() ? events_[index] : nlohmann::json();
}

size_t EventRecorder::size() const {
    std::lock_guard lock(mutex_);
    return events_.size();
}

std::optional<size_t> EventRecorder::wait_for(const std::function<bool(const nlohmann::json &)> &pred,
                                              Millis timeout, size_t from) {
    std::unique_lock lock(mutex_);
    size_t checked = from;
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
        for (; checked < events_.size(); ++checked)
            if (pred(events_[checked])) return checked;
        if (closed_) return std::nullopt;
        if (cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
            for (; checked < events_.size(); ++checked)
                if (pred(events_[checked])) return checked;
            return std::nullopt;
        }
    }
}

bool is_event(const nlohmann::json &e, const std::string &kind, const std::string &job) {
    if (!e.is_object() || e.value("event", "") != kind) return false;
    return job.empty() || e.value("job", "") == job;
}

}  // namespace mall::test
