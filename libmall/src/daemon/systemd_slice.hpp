// SPDX-License-Identifier: BSD-3-Clause
// systemd_slice.hpp — the systemd slice of a container job whose engine uses the systemd cgroup
// driver (podman --cgroup-manager=systemd with crun or runc, docker with native.cgroupdriver=systemd).
// Contract: such an engine takes a slice name, not a path, as --cgroup-parent, and puts the
// container's scope (podman: libpod-<id>.scope, its processes in crun's `container` child; docker:
// docker-<id>.scope) and podman's conmon scope in it. A job's slice is mall-<job>.slice below
// mall.slice, i.e. the cgroup /mall.slice/mall-<job>.slice; '-' would nest slices and ':' ends the
// slice in an OCI cgroupsPath, so the job name is escaped as systemd-escape does (\xNN). Systemd owns
// a slice's files: malld resizes it with `systemctl set-property --runtime SLICE AllowedCPUs=...`
// (kept across systemd's re-applications, dropped with `systemctl revert`), never by writing
// cpuset.cpus alone. Header-only: the daemon and the unit tests include it.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "../common/cpuset.hpp"

extern char **environ;

namespace mall::systemd_slice {

constexpr const char *kParentSlice = "mall.slice";
constexpr const char *kJobSlicePrefix = "mall-";
constexpr const char *kSliceSuffix = ".slice";
constexpr size_t kUnitNameMax = 255;  // systemd's UNIT_NAME_MAX less the terminating zero

inline bool plain_unit_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.';
}

// The job's name as one component of a slice name: letters, digits, '_' and '.' stay (a leading
// '.' does not), anything else becomes \xNN (lower-case hex), so the mapping can be undone.
inline std::string escape_component(const std::string &text) {
    std::string out;
    for (size_t i = 0; i < text.size(); ++i) {
        const char c = text[i];
        if (plain_unit_char(c) && !(i == 0 && c == '.')) {
            out += c;
        } else {
            char hex[5];
            std::snprintf(hex, sizeof hex, "\\x%02x", static_cast<unsigned char>(c));
            out += hex;
        }
    }
    return out;
}

inline std::optional<std::string> unescape_component(const std::string &text) {
    std::string out;
    for (size_t i = 0; i < text.size(); ++i) {
        if (text[i] != '\\') {
            if (!plain_unit_char(text[i])) return std::nullopt;
            out += text[i];
            continue;
        }
        if (i + 3 >= text.size() || text[i + 1] != 'x') return std::nullopt;
        unsigned value = 0;
        for (size_t k = i + 2; k < i + 4; ++k) {
            const char h = text[k];
            value = value * 16 + static_cast<unsigned>(h >= '0' && h <= '9'   ? h - '0'
                                                       : h >= 'a' && h <= 'f' ? h - 'a' + 10
                                                                              : 99);
            if (value > 255) return std::nullopt;
        }
        out += static_cast<char>(value);
        i += 3;
    }
    return out;
}

// "mall-<escaped job>.slice"; nullopt when the escaped name is longer than a unit name may be.
inline std::optional<std::string> job_slice_name(const std::string &job) {
    if (job.empty()) return std::nullopt;
    std::string name = kJobSlicePrefix + escape_component(job) + kSliceSuffix;
    if (name.size() > kUnitNameMax) return std::nullopt;
    return name;
}

// The job whose slice `name` is ("mall-a\x2db.slice" -> "a-b"); nullopt for any other name.
inline std::optional<std::string> job_of_slice(const std::string &name) {
    const std::string prefix = kJobSlicePrefix, suffix = kSliceSuffix;
    if (name.size() <= prefix.size() + suffix.size() || name.compare(0, prefix.size(), prefix) != 0 ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
        return std::nullopt;
    auto job = unescape_component(name.substr(prefix.size(), name.size() - prefix.size() - suffix.size()));
    if (!job || job->empty() || job_slice_name(*job) != name) return std::nullopt;
    return job;
}

// Where systemd puts a job slice's cgroup, relative to the cgroup2 mount: "/mall.slice/<name>"
// (each '-' of a slice name is a level; the escaped job has none).
inline std::string cgroup_path_of(const std::string &job_slice) {
    return std::string("/") + kParentSlice + "/" + job_slice;
}
inline std::string parent_cgroup_path() { return std::string("/") + kParentSlice; }

// sd_booted(): systemd is PID 1 and manages units here.
inline bool systemd_booted() {
    struct stat st{};
    return ::lstat("/run/systemd/system", &st) == 0 && S_ISDIR(st.st_mode);
}

// Runs `systemctl ARGS...` without a shell, bounded by `limit`. True on exit 0; otherwise false
// with *error holding the command and what it printed.
inline bool run_systemctl(const std::vector<std::string> &args, std::string *error,
                          std::chrono::milliseconds limit = std::chrono::seconds(15)) {
    std::vector<std::string> words{"systemctl", "--no-ask-password"};
    words.insert(words.end(), args.begin(), args.end());
    std::string shown;
    for (const auto &w : words) shown += (shown.empty() ? "" : " ") + w;
    auto fail = [&](const std::string &why) {
        if (error) *error = "`" + shown + "` " + why;
        return false;
    };
    int out[2];
    if (::pipe2(out, O_CLOEXEC) != 0) return fail(std::string("could not run: pipe: ") + std::strerror(errno));
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&actions, out[1], STDERR_FILENO);
    std::vector<char *> argv;
    for (auto &w : words) argv.push_back(const_cast<char *>(w.c_str()));
    argv.push_back(nullptr);
    pid_t pid = 0;
    const int spawned = posix_spawnp(&pid, "systemctl", &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    ::close(out[1]);
    if (spawned != 0) {
        ::close(out[0]);
        return fail(std::string("could not run: ") + std::strerror(spawned) + " (is systemd's systemctl installed?)");
    }
    std::string text;
    const auto deadline = std::chrono::steady_clock::now() + limit;
    bool timed_out = false;
    for (;;) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
        if (left.count() <= 0) {
            timed_out = true;
            break;
        }
        pollfd p{out[0], POLLIN, 0};
        const int ready = ::poll(&p, 1, static_cast<int>(left.count()));
        if (ready < 0 && errno == EINTR) continue;
        if (ready <= 0) {
            timed_out = ready == 0;
            break;
        }
        char buf[1024];
        const ssize_t n = ::read(out[0], buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        if (text.size() < 4096) text.append(buf, static_cast<size_t>(n));
    }
    ::close(out[0]);
    if (timed_out) ::kill(pid, SIGKILL);
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
    if (timed_out) return fail("did not finish within " + std::to_string(limit.count() / 1000) + " s (is systemd busy?)");
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return true;
    return fail((WIFEXITED(status) ? "failed with status " + std::to_string(WEXITSTATUS(status))
                                   : std::string("was killed")) +
                (text.empty() ? std::string() : ": " + text));
}

// The systemd way to resize a unit's cpuset: AllowedCPUs, for this boot only. Works on a slice that
// is not started yet (systemd keeps the setting and applies it when the engine starts a scope in it).
inline bool set_allowed_cpus(const std::string &unit, const CpuSet &cpus, std::string *error) {
    return run_systemctl({"set-property", "--runtime", "--", unit, "AllowedCPUs=" + cpus.to_string()}, error);
}

// Stops an (empty) slice, which removes its cgroup, and drops what set-property wrote for it.
inline bool stop_and_forget(const std::string &unit, std::string *error) {
    std::string stop_error, revert_error;
    const bool stopped = run_systemctl({"stop", "--", unit}, &stop_error);
    const bool reverted = run_systemctl({"revert", "--", unit}, &revert_error);
    if (error) *error = !stopped ? stop_error : revert_error;
    return stopped && reverted;
}

}  // namespace mall::systemd_slice
