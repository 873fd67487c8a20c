// SPDX-License-Identifier: BSD-3-Clause
// fixture_system.cpp — the helpers that read and shape the machine (see malld_fixture.hpp): where
// the binaries and the cpuset controller are, whether the tests may run, TestCgroupTree and
// remove_cgroup_tree, polling, /proc and cgroup readers, cpu-list parsing. Contract: every folder
// TestCgroupTree makes is in the watchdog sweep's registry until its destructor removed it.

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "support/fixture_internal.hpp"

#ifndef MALL_BIN_DIR
#error "MALL_BIN_DIR must name the folder holding malld, mallctl, mallrun and mall_test_client"
#endif

namespace mall::test {

namespace fs = std::filesystem;

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
        internal::set_sweep_cpuset_root(f.first);
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
    slot_ = internal::track_cgroup_dir(root_);
}

TestCgroupTree::~TestCgroupTree() {
    remove_cgroup_tree(root_);
    internal::untrack_cgroup_dir(slot_);
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

}  // namespace mall::test
