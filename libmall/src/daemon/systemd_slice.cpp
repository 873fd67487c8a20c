// SPDX-License-Identifier: BSD-3-Clause
// systemd_slice.cpp — a job's slice name (escaped as systemd-escape does, and back) and the
// systemctl calls that resize, stop and forget it (see systemd_slice.hpp for the contract).
#include "systemd_slice.hpp"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "../common/run_bounded.hpp"

namespace mall::systemd_slice {

namespace {

bool plain_unit_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.';
}

}  // namespace

std::string escape_component(const std::string &text) {
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

std::optional<std::string> unescape_component(const std::string &text) {
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

std::optional<std::string> job_slice_name(const std::string &job) {
    if (job.empty()) return std::nullopt;
    std::string name = kJobSlicePrefix + escape_component(job) + kSliceSuffix;
    if (name.size() > kUnitNameMax) return std::nullopt;
    return name;
}

std::optional<std::string> job_of_slice(const std::string &name) {
    const std::string prefix = kJobSlicePrefix, suffix = kSliceSuffix;
    if (name.size() <= prefix.size() + suffix.size() || name.compare(0, prefix.size(), prefix) != 0 ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
        return std::nullopt;
    auto job = unescape_component(name.substr(prefix.size(), name.size() - prefix.size() - suffix.size()));
    if (!job || job->empty() || job_slice_name(*job) != name) return std::nullopt;
    return job;
}

std::string cgroup_path_of(const std::string &job_slice) {
    return std::string("/") + kParentSlice + "/" + job_slice;
}

std::string parent_cgroup_path() { return std::string("/") + kParentSlice; }

bool systemd_booted() {
    struct stat st{};
    return ::lstat("/run/systemd/system", &st) == 0 && S_ISDIR(st.st_mode);
}

bool run_systemctl(const std::vector<std::string> &args, std::string *error, std::chrono::milliseconds limit) {
    BoundedCommand command;
    // As root, systemctl is taken from the system folders only, never through $PATH.
    std::string lookup_error;
    auto program = program_to_run("systemctl", ::geteuid() == 0, &lookup_error);
    if (!program) {
        if (error) *error = "cannot run systemctl: " + lookup_error;
        return false;
    }
    command.argv = {program->program, "--no-ask-password"};
    command.argv.insert(command.argv.end(), args.begin(), args.end());
    command.search_path = program->search_path;
    command.capture_stderr = true;
    command.limit = limit;
    command.max_output = 4096;
    const std::string shown = command_text(command.argv);
    auto fail = [&](const std::string &why) {
        if (error) *error = "`" + shown + "` " + why;
        return false;
    };
    if (limit.count() <= 0) return fail("not run: the operation's " + std::to_string(kSystemctlBudget.count()) +
                                     " ms are spent (is systemd busy?)");
    BoundedResult run = run_bounded(command);
    if (run.spawn_error != 0)
        return fail(std::string("could not run: ") + std::strerror(run.spawn_error) +
                    " (is systemd's systemctl installed?)");
    std::string text = std::move(run.output);
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
    if (run.timed_out)
        return fail("did not finish within " + std::to_string(limit.count()) + " ms and was killed (is systemd busy?)");
    if (run.exited_zero()) return true;
    return fail((WIFEXITED(run.status) ? "failed with status " + std::to_string(WEXITSTATUS(run.status))
                                       : std::string("was killed")) +
                (text.empty() ? std::string() : ": " + text));
}

bool set_allowed_cpus(const std::string &unit, const CpuSet &cpus, std::string *error) {
    return run_systemctl({"set-property", "--runtime", "--", unit, "AllowedCPUs=" + cpus.to_string()}, error);
}

bool stop_and_forget(const std::string &unit, std::string *error) {
    // Both calls share one budget: malld's loop waits at most kSystemctlBudget here too.
    using Clock = std::chrono::steady_clock;
    const auto deadline = Clock::now() + kSystemctlBudget;
    auto left = [&] { return std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()); };
    std::string stop_error, revert_error;
    const bool stopped = run_systemctl({"stop", "--", unit}, &stop_error, left());
    const bool reverted = run_systemctl({"revert", "--", unit}, &revert_error, left());
    if (error) *error = !stopped ? stop_error : revert_error;
    return stopped && reverted;
}

}  // namespace mall::systemd_slice
