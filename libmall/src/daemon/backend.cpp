// backend.cpp — enforces job cpus on the kernel: cgroup v1 / v2 cpuset folders per job, or
// sched_setaffinity on every thread. Every failure message names the path, the errno text and a
// fix. Growing always re-widens every thread's own mask too (the kernel keeps requested masks).
#include "backend.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "../common/files.hpp"
#include "procfs.hpp"

namespace mall {

namespace {

std::string errno_text(int err) { return std::strerror(err); }

std::string trim(std::string s) {
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\t')) s.pop_back();
    size_t i = 0;
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n')) ++i;
    return s.substr(i);
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

bool is_directory(const std::string &path) {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// Where a usable cpuset controller lives, or why there is none.
struct CgroupProbe {
    std::string mount;   // empty when not usable
    std::string reason;  // words: why usable or why not
};

CgroupProbe probe_v1(const std::string &parent) {
    CgroupProbe p;
    std::string found;
    bool read_only = false;
    for (const auto &m : read_mountinfo()) {
        if (m.fstype == "cgroup" && has_token(m.super_options, "cpuset", ',')) {
            found = m.mount_point;
            read_only = has_token(m.mount_options, "ro", ',');
            break;
        }
    }
    if (found.empty()) {
        p.reason = "no cgroup v1 hierarchy with the cpuset controller in /proc/self/mountinfo";
        return p;
    }
    if (read_only) {
        p.reason = "the cgroup v1 cpuset hierarchy at " + found + " is mounted read-only";
        return p;
    }
    // Usable means: malld may create (or already owns) its parent folder there.
    std::string dir = found + "/" + parent;
    if (is_directory(dir)) {
        if (::access((dir + "/cpuset.cpus").c_str(), W_OK) != 0) {
            p.reason = "cannot write " + dir + "/cpuset.cpus: " + errno_text(errno);
            return p;
        }
    } else {
        if (::mkdir(dir.c_str(), 0755) != 0) {
            p.reason = "cannot create " + dir + ": " + errno_text(errno) +
                       " (malld needs root or write access to " + found + ")";
            return p;
        }
        ::rmdir(dir.c_str());
    }
    p.mount = found;
    p.reason = "cgroup v1 cpuset controller mounted read-write at " + found +
               " and malld can create " + dir;
    return p;
}

CgroupProbe probe_v2() {
    CgroupProbe p;
    std::vector<std::string> reasons;
    for (const auto &m : read_mountinfo()) {
        if (m.fstype != "cgroup2") continue;
        std::string controllers;
        if (!read_text_file(m.mount_point + "/cgroup.controllers", &controllers, nullptr)) {
            reasons.push_back("cannot read " + m.mount_point + "/cgroup.controllers");
            continue;
        }
        if (!has_word(controllers, "cpuset")) {
            reasons.push_back(m.mount_point + " lists controllers '" + trim(controllers) +
                              "', no cpuset");
            continue;
        }
        if (has_token(m.mount_options, "ro", ',') ||
            ::access((m.mount_point + "/cgroup.subtree_control").c_str(), W_OK) != 0) {
            reasons.push_back(m.mount_point + " is not writable by malld");
            continue;
        }
        p.mount = m.mount_point;
        p.reason = "cgroup v2 with the cpuset controller at " + m.mount_point;
        return p;
    }
    if (reasons.empty()) reasons.push_back("no cgroup2 mount in /proc/self/mountinfo");
    std::string text;
    for (const auto &r : reasons) text += (text.empty() ? "" : "; ") + r;
    p.reason = text;
    return p;
}

// ---------------------------------------------------------------------------------------------
// cgroup backends (v1 and v2 share the folder layout: <mount>/<parent>/job_<job>)

constexpr const char *kJobFolderPrefix = "job_";

class CgroupBackend final : public CpusetBackend {
public:
    CgroupBackend(bool v2, std::string mount, std::string parent)
        : v2_(v2), mount_(std::move(mount)), parent_dir_(mount_ + "/" + parent) {}

    BackendKind kind() const override { return v2_ ? BackendKind::CgroupV2 : BackendKind::CgroupV1; }

    bool start(const CpuSet &pool, std::string *error) override {
        if (v2_ && !enable_v2_controller(mount_, error)) return false;
        bool created = false;
        if (::mkdir(parent_dir_.c_str(), 0755) == 0) {
            created = true;
        } else if (errno != EEXIST) {
            return fail(error, "cannot create the parent cgroup " + parent_dir_ + ": " +
                                   errno_text(errno) +
                                   "; run malld as root or choose --backend affinity");
        }
        // The parent must hold every cpu a child holds: a restarted malld finds its adopted jobs'
        // folders there, so widen to the pool plus whatever the children still have.
        int err = write_file_once(parent_dir_ + "/cpuset.cpus", pool.to_string());
        if (err != 0) {
            CpuSet wider = pool | children_cpus();
            err = write_file_once(parent_dir_ + "/cpuset.cpus", wider.to_string());
        }
        if (err != 0) {
            if (created) ::rmdir(parent_dir_.c_str());
            return fail(error, "cannot write '" + pool.to_string() + "' to " + parent_dir_ +
                                   "/cpuset.cpus: " + errno_text(err) +
                                   "; check that --cpus lists cpus the system has online");
        }
        if (!v2_) {
            // A new v1 cpuset starts with no memory nodes: give it the root's.
            std::string mems;
            int rerr = 0;
            if (!read_text_file(mount_ + "/cpuset.mems", &mems, &rerr))
                return fail(error, "cannot read " + mount_ + "/cpuset.mems: " + errno_text(rerr));
            mems_ = trim(mems);
            std::string current;
            read_text_file(parent_dir_ + "/cpuset.mems", &current, nullptr);
            if (trim(current).empty()) {
                err = write_file_once(parent_dir_ + "/cpuset.mems", mems_);
                if (err != 0)
                    return fail(error, "cannot write '" + mems_ + "' to " + parent_dir_ +
                                           "/cpuset.mems: " + errno_text(err));
            } else {
                mems_ = trim(current);
            }
        } else {
            err = write_file_once(parent_dir_ + "/cgroup.subtree_control", "+cpuset");
            if (err != 0)
                return fail(error, "cannot enable cpuset for children in " + parent_dir_ +
                                       "/cgroup.subtree_control: " + errno_text(err) +
                                       "; the parent must hold no processes");
        }
        retry_pending_removals();
        return true;
    }

    bool add_pids(const std::string &job, const std::vector<pid_t> &pids,
                  std::string *error) override {
        std::string dir = cgroup_path(job);
        if (!is_directory(dir)) return true;  // moved when the folder is created (first apply)
        return move_pids(dir, pids, error);
    }

    bool apply(const std::string &job, const std::vector<pid_t> &pids, const CpuSet &cpus,
               bool growing, std::string *error) override {
        std::string dir = cgroup_path(job);
        bool exists = is_directory(dir);
        if (cpus.empty()) {
            if (!exists) return true;  // nothing enforced yet, nothing to narrow
            if (read_pid_list(dir + "/cgroup.procs").empty()) return true;
            return fail(error, "cannot narrow " + dir +
                                   " to no cpus while it holds processes (the kernel refuses an "
                                   "empty cpuset); the job keeps its cpus until some are free");
        }
        bool created = false;
        if (!exists) {
            if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
                return fail(error, "cannot create " + dir + ": " + errno_text(errno) +
                                       "; check that malld runs as root and " + parent_dir_ +
                                       " exists");
            created = true;
        }
        int err = write_file_once(dir + "/cpuset.cpus", cpus.to_string());
        if (err != 0) {
            if (created) ::rmdir(dir.c_str());
            return fail(error, "cannot write '" + cpus.to_string() + "' to " + dir +
                                   "/cpuset.cpus: " + errno_text(err) +
                                   "; the cpus must be inside " + parent_dir_ + "/cpuset.cpus");
        }
        if (created && !v2_) {
            err = write_file_once(dir + "/cpuset.mems", mems_);
            if (err != 0) {
                ::rmdir(dir.c_str());
                return fail(error, "cannot write '" + mems_ + "' to " + dir +
                                       "/cpuset.mems: " + errno_text(err));
            }
        }
        bool ok = true;
        if (created) ok = move_pids(dir, pids, error);
        // The cpuset write narrows at once; widening also needs every thread's own mask widened,
        // otherwise a thread pinned earlier stays on its old cpus (effective = cpuset ∩ mask).
        if (growing || created) {
            for (pid_t pid : read_pid_list(dir + "/cgroup.procs"))
                for (pid_t tid : threads_of(pid)) set_thread_affinity(tid, cpus);
        }
        return ok;
    }

    std::optional<CpuSet> current(const std::string &job,
                                  const std::vector<pid_t> &) const override {
        std::string text;
        if (!read_text_file(cgroup_path(job) + "/cpuset.cpus", &text, nullptr)) return std::nullopt;
        return CpuSet::parse(trim(text));
    }

    void remove(const std::string &job) override {
        retry_pending_removals();
        std::string dir = cgroup_path(job);
        if (!is_directory(dir)) return;
        if (!remove_folder(dir)) pending_removals_.insert(dir);
    }

    void stop() override {
        retry_pending_removals();
        if (!is_directory(parent_dir_)) return;
        if (!job_folders().empty()) return;  // running jobs keep their folders for re-adoption
        remove_folder(parent_dir_);
    }

    std::string cgroup_path(const std::string &job) const override {
        return parent_dir_ + "/" + kJobFolderPrefix + job;
    }

    std::vector<std::string> jobs_with_cgroups() const override {
        std::vector<std::string> jobs;
        for (const auto &folder : job_folders()) jobs.push_back(folder.substr(std::strlen(kJobFolderPrefix)));
        return jobs;
    }

    std::string describe() const override {
        return std::string(v2_ ? "cgroup-v2" : "cgroup-v1") + " cpuset at " + parent_dir_;
    }

private:
    static bool fail(std::string *error, const std::string &text) {
        if (error) *error = text;
        return false;
    }

    static bool enable_v2_controller(const std::string &dir, std::string *error) {
        std::string text;
        read_text_file(dir + "/cgroup.subtree_control", &text, nullptr);
        if (has_word(text, "cpuset")) return true;
        int err = write_file_once(dir + "/cgroup.subtree_control", "+cpuset");
        if (err != 0)
            return fail(error, "cannot enable the cpuset controller in " + dir +
                                   "/cgroup.subtree_control: " + errno_text(err) +
                                   "; enable it by hand or choose --backend affinity");
        return true;
    }

    // Moves each pid (all its threads) and its descendants into dir. Pids that are gone are fine.
    bool move_pids(const std::string &dir, const std::vector<pid_t> &pids, std::string *error) {
        std::vector<pid_t> all;
        for (pid_t pid : pids) {
            all.push_back(pid);
            for (pid_t d : descendants_of(pid)) all.push_back(d);
        }
        std::string first_error;
        for (pid_t pid : all) {
            int err = write_file_once(dir + "/cgroup.procs", std::to_string(pid));
            if (err != 0 && err != ESRCH && first_error.empty())
                first_error = "cannot move pid " + std::to_string(pid) + " into " + dir +
                              "/cgroup.procs: " + errno_text(err) +
                              "; check that malld runs as root";
        }
        if (!first_error.empty()) return fail(error, first_error);
        return true;
    }

    std::vector<std::string> job_folders() const {
        std::vector<std::string> names;
        DIR *d = ::opendir(parent_dir_.c_str());
        if (!d) return names;
        while (dirent *e = ::readdir(d)) {
            std::string name = e->d_name;
            if (name.rfind(kJobFolderPrefix, 0) == 0 && is_directory(parent_dir_ + "/" + name))
                names.push_back(name);
        }
        ::closedir(d);
        return names;
    }

    CpuSet children_cpus() const {
        CpuSet all;
        for (const auto &name : job_folders()) {
            std::string text;
            if (read_text_file(parent_dir_ + "/" + name + "/cpuset.cpus", &text, nullptr))
                if (auto set = CpuSet::parse(trim(text))) all |= *set;
        }
        return all;
    }

    // Moves leftover processes to the hierarchy's root, then removes the folder. A process that
    // just exited may keep the folder busy for a moment, so retry briefly.
    bool remove_folder(const std::string &dir) {
        for (int attempt = 0; attempt < 20; ++attempt) {
            for (pid_t pid : read_pid_list(dir + "/cgroup.procs"))
                write_file_once(mount_ + "/cgroup.procs", std::to_string(pid));
            if (::rmdir(dir.c_str()) == 0 || errno == ENOENT) return true;
            if (errno != EBUSY) return false;
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        return false;
    }

    void retry_pending_removals() {
        for (auto it = pending_removals_.begin(); it != pending_removals_.end();) {
            if (!is_directory(*it) || remove_folder(*it))
                it = pending_removals_.erase(it);
            else
                ++it;
        }
    }

    bool v2_;
    std::string mount_;
    std::string parent_dir_;
    std::string mems_;
    std::set<std::string> pending_removals_;
};

// ---------------------------------------------------------------------------------------------
// affinity backend: no cgroups, sched_setaffinity on every thread of the job's process trees.

class AffinityBackend final : public CpusetBackend {
public:
    BackendKind kind() const override { return BackendKind::Affinity; }
    bool start(const CpuSet &, std::string *) override { return true; }
    bool add_pids(const std::string &, const std::vector<pid_t> &, std::string *) override {
        return true;
    }

    bool apply(const std::string &job, const std::vector<pid_t> &pids, const CpuSet &cpus,
               bool, std::string *error) override {
        if (cpus.empty()) {
            if (error)
                *error = "cannot give job " + job +
                         " no cpus with the affinity backend (a thread needs at least one cpu); "
                         "it keeps its cpus until some are free";
            return false;
        }
        std::string first_error;
        for (pid_t pid : pids) {
            std::vector<pid_t> tree{pid};
            for (pid_t d : descendants_of(pid)) tree.push_back(d);
            for (pid_t p : tree) {
                for (pid_t tid : threads_of(p)) {
                    if (!set_thread_affinity(tid, cpus) && errno != ESRCH && first_error.empty())
                        first_error = "sched_setaffinity(" + std::to_string(tid) + ", " +
                                      cpus.to_string() + ") failed: " + errno_text(errno) +
                                      "; malld needs root or the same uid as job " + job;
                }
            }
        }
        if (!first_error.empty()) {
            if (error) *error = first_error;
            return false;
        }
        return true;
    }

    std::optional<CpuSet> current(const std::string &,
                                  const std::vector<pid_t> &pids) const override {
        for (pid_t pid : pids) {
            cpu_set_t set;
            CPU_ZERO(&set);
            if (::sched_getaffinity(pid, sizeof set, &set) != 0) continue;
            std::vector<int> cpus;
            for (int c = 0; c < CPU_SETSIZE && c < CpuSet::kMaxCpus; ++c)
                if (CPU_ISSET(c, &set)) cpus.push_back(c);
            return CpuSet::from_list(cpus);
        }
        return std::nullopt;
    }

    void remove(const std::string &) override {}
    void stop() override {}
    std::string cgroup_path(const std::string &) const override { return ""; }
    std::vector<std::string> jobs_with_cgroups() const override { return {}; }
    std::string describe() const override {
        return "affinity (sched_setaffinity on every thread, no cgroups)";
    }
};

}  // namespace

std::optional<BackendKind> parse_backend(const std::string &name) {
    if (name == "auto") return BackendKind::Auto;
    if (name == "cgroup-v1") return BackendKind::CgroupV1;
    if (name == "cgroup-v2") return BackendKind::CgroupV2;
    if (name == "affinity") return BackendKind::Affinity;
    return std::nullopt;
}

const char *backend_name(BackendKind kind) {
    switch (kind) {
        case BackendKind::Auto: return "auto";
        case BackendKind::CgroupV1: return "cgroup-v1";
        case BackendKind::CgroupV2: return "cgroup-v2";
        case BackendKind::Affinity: return "affinity";
    }
    return "unknown";
}

std::unique_ptr<CpusetBackend> make_backend(BackendKind kind, const std::string &parent,
                                            std::string *why, std::string *error) {
    auto set = [](std::string *out, const std::string &text) {
        if (out) *out = text;
    };
    if (parent.empty() || parent.find('/') != std::string::npos || parent == "." || parent == "..") {
        set(error, "bad cgroup parent name '" + parent +
                       "': give one folder name such as 'mall' (no '/')");
        return nullptr;
    }
    switch (kind) {
        case BackendKind::CgroupV1: {
            CgroupProbe p = probe_v1(parent);
            if (p.mount.empty()) {
                set(error, "backend cgroup-v1 is not usable: " + p.reason +
                               "; choose --backend auto or affinity");
                return nullptr;
            }
            set(why, "requested with --backend cgroup-v1; " + p.reason);
            return std::make_unique<CgroupBackend>(false, p.mount, parent);
        }
        case BackendKind::CgroupV2: {
            CgroupProbe p = probe_v2();
            if (p.mount.empty()) {
                set(error, "backend cgroup-v2 is not usable: " + p.reason +
                               "; choose --backend auto or affinity");
                return nullptr;
            }
            set(why, "requested with --backend cgroup-v2; " + p.reason);
            return std::make_unique<CgroupBackend>(true, p.mount, parent);
        }
        case BackendKind::Affinity:
            set(why, "requested with --backend affinity");
            return std::make_unique<AffinityBackend>();
        case BackendKind::Auto: {
            CgroupProbe v1 = probe_v1(parent);
            if (!v1.mount.empty()) {
                set(why, "auto: " + v1.reason);
                return std::make_unique<CgroupBackend>(false, v1.mount, parent);
            }
            CgroupProbe v2 = probe_v2();
            if (!v2.mount.empty()) {
                set(why, "auto: cgroup-v1 not usable (" + v1.reason + "); " + v2.reason);
                return std::make_unique<CgroupBackend>(true, v2.mount, parent);
            }
            set(why, "auto: cgroup-v1 not usable (" + v1.reason + "); cgroup-v2 not usable (" +
                         v2.reason + "); falling back to thread affinity, which a process may "
                         "undo itself");
            return std::make_unique<AffinityBackend>();
        }
    }
    set(error, "unknown backend");
    return nullptr;
}

bool set_thread_affinity(pid_t tid, const CpuSet &cpus) {
    cpu_set_t set = cpus.to_cpu_set();
    return ::sched_setaffinity(tid, sizeof set, &set) == 0;
}

std::string cgroup_v1_cpuset_mount() {
    for (const auto &m : read_mountinfo())
        if (m.fstype == "cgroup" && has_token(m.super_options, "cpuset", ',')) return m.mount_point;
    return "";
}

}  // namespace mall
