// SPDX-License-Identifier: BSD-3-Clause
// training_curve.hpp — what the example trainers' tests read from their output (header-only): the
// digits data file they train on, and the loss curve printed as "step N loss X threads T cpus L"
// lines plus the "final loss X train_accuracy A test_accuracy B ..." line (mall_train_digits and
// mall_train_tf print the same format), and the "parked step N tids T1,T2" lines that say which
// pool workers mall parked, with what a user checks of them: they use no cpu while parked.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace mall::test {

inline constexpr const char *kDigits = "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz";

struct Curve {
    std::map<int, double> loss_at_step;  // from "step N loss X threads T cpus L"
    double final_loss = -1, test_accuracy = -1;
};

inline Curve parse_curve(const std::vector<std::string> &lines) {
    Curve curve;
    const std::regex step_re(R"(^step ([0-9]+) loss ([0-9.eE+-]+) threads)");
    const std::regex final_re(R"(^final loss ([0-9.eE+-]+) train_accuracy [0-9.]+ test_accuracy ([0-9.]+))");
    std::smatch m;
    for (const auto &line : lines) {
        if (std::regex_search(line, m, step_re))
            curve.loss_at_step[std::stoi(m[1])] = std::stod(m[2]);
        else if (std::regex_search(line, m, final_re)) {
            curve.final_loss = std::stod(m[1]);
            curve.test_accuracy = std::stod(m[2]);
        }
    }
    return curve;
}

// The tids of a "parked step N tids T1,T2|-" line (empty for "-" or another line).
inline std::vector<pid_t> parked_tids_of(const std::string &line) {
    std::vector<pid_t> tids;
    const std::string marker = " tids ";
    const auto at = line.find(marker);
    if (line.rfind("parked step ", 0) != 0 || at == std::string::npos) return tids;
    std::stringstream list(line.substr(at + marker.size()));
    for (std::string item; std::getline(list, item, ',');)
        if (!item.empty() && item != "-") tids.push_back(static_cast<pid_t>(std::stol(item)));
    return tids;
}

// Nanoseconds thread tid of process pid has run (/proc/PID/task/TID/schedstat; 0 once it is gone).
inline uint64_t task_cpu_ns(pid_t pid, pid_t tid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/task/" + std::to_string(tid) + "/schedstat");
    uint64_t ns = 0;
    in >> ns;
    return ns;
}

// Nanoseconds every live thread of process pid has run, summed.
inline uint64_t process_cpu_ns(pid_t pid) {
    uint64_t ns = 0;
    std::error_code error;
    for (const auto &task : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", error))
        ns += task_cpu_ns(pid, static_cast<pid_t>(std::stol(task.path().filename().string())));
    return ns;
}

// The cores process pid used over `window` (cpu time / wall time, its threads summed).
inline double process_cores_over(pid_t pid, std::chrono::milliseconds window) {
    const uint64_t before = process_cpu_ns(pid);
    const auto start = std::chrono::steady_clock::now();
    std::this_thread::sleep_for(window);
    const uint64_t gained = process_cpu_ns(pid) - before;
    const auto elapsed = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
    return elapsed > 0 ? static_cast<double>(gained) / elapsed : 0.0;
}

// Over `window`, each parked tid must gain under 5 ms of cpu while the whole process gains over
// 100 ms (it trains on). Returns "" or what failed.
inline std::string parked_workers_idle(pid_t pid, const std::vector<pid_t> &parked,
                                       std::chrono::milliseconds window = std::chrono::milliseconds(600)) {
    auto process_ns = [pid] { return process_cpu_ns(pid); };
    std::vector<uint64_t> before;
    for (pid_t tid : parked) before.push_back(task_cpu_ns(pid, tid));
    const uint64_t process_before = process_ns();
    std::this_thread::sleep_for(window);
    std::ostringstream failed;
    for (size_t i = 0; i < parked.size(); ++i) {
        const uint64_t gained = task_cpu_ns(pid, parked[i]) - before[i];
        if (gained >= 5'000'000) failed << "parked worker " << parked[i] << " used " << gained / 1000 << " us; ";
    }
    const uint64_t process_gained = process_ns() - process_before;
    if (process_gained <= 100'000'000) failed << "the process itself used only " << process_gained / 1000 << " us";
    return failed.str();
}

// What a "parked step N tids ..." line printed after a change to `threads` running workers (on a
// 2-cpu machine, pools of 2) must show: some workers parked, idle while process pid trains on, at
// one thread; none at two. Returns "" or what failed.
inline std::string parked_workers_follow(const std::string &parked_line, pid_t pid, int threads) {
    const std::vector<pid_t> parked = parked_tids_of(parked_line);
    if (threads >= 2) return parked.empty() ? "" : "workers parked while all run: " + parked_line;
    if (parked.empty()) return "no worker parked at one thread: " + parked_line;
    const std::string idle = parked_workers_idle(pid, parked);
    return idle.empty() ? "" : idle + " (" + parked_line + ")";
}

}  // namespace mall::test
