// SPDX-License-Identifier: BSD-3-Clause
// backend.cpp — enforces job cpus on the kernel: a job's own cgroups resized in place, cgroup v1 /
// v2 cpuset folders of malld's own, or sched_setaffinity on every thread. Every failure message names the path, the errno text and a
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
#include "log.hpp"
#include "procfs.hpp"
#include "systemd_slice.hpp"

namespace mall {

namespace {

std::string errno_text(int err) { return std::strerror(err); }

// Sets every thread of each pid and of its descendants to `cpus`. A thread that is gone is fine;
// the first other failure goes to *first_error (when given and still empty).
void set_tree_affinity(const std::string &job, const std::vector<pid_t> &pids, const CpuSet &cpus,
                       std::string *first_error) {
    for (pid_t pid : pids) {
        std::vector<pid_t> tree{pid};
        for (pid_t d : descendants_of(pid)) tree.push_back(d);
        for (pid_t p : tree)
            for (pid_t tid : threads_of(p))
                if (!set_thread_affinity(tid, cpus) && errno != ESRCH && first_error && first_error->empty())
                    *first_error = "sched_setaffinity(" + std::to_string(tid) + ", " + cpus.to_string() +
                                   ") failed: " + errno_text(errno) + "; malld needs root or the same uid as job " + job;
    }
}

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
// cgroup backends. v1 and v2 share the layout of malld's own folders, <mount>/<parent>/job_<job>,
// and the in-place rules; they differ in what a folder's cpus are (v1: cpuset.cpus, never empty
// while it holds processes; v2: cpuset.cpus may be empty, meaning "the parent's", and
// cpuset.cpus.effective is what applies) and in which writes order matters (v1 only: a parent
// cannot shrink below a child, and growth does not flow down).

constexpr const char *kJobFolderPrefix = "job_";

bool is_path_prefix(const std::string &ancestor, const std::string &path) {
    if (ancestor == "/") return true;
    return path == ancestor || (path.size() > ancestor.size() && path.compare(0, ancestor.size(), ancestor) == 0 &&
                                path[ancestor.size()] == '/');
}

class CgroupBackend final : public CpusetBackend {
public:
    CgroupBackend(bool v2, std::string mount, std::string parent)
        : v2_(v2),
          mount_(std::move(mount)),
          parent_name_(std::move(parent)),
          parent_rel_("/" + parent_name_),
          parent_dir_(mount_ + parent_rel_),
          self_rel_(process_cgroup(0, v2).value_or("/")) {}

    BackendKind kind() const override { return v2_ ? BackendKind::CgroupV2 : BackendKind::CgroupV1; }

    bool start(const CpuSet &pool, std::string *error) override {
        pool_ = pool;
        if (v2_ && self_rel_ != "/") {
            // cgroup v2 below the root: malld runs in a subtree delegated to it (a systemd unit
            // with Delegate=yes, a container): its folders go there, not at the root.
            if (!enter_delegated_subtree(error)) return false;
        } else if (v2_ && !enable_v2_controller(mount_, error)) {
            return false;
        }
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

    bool check_pids(const std::vector<pid_t> &pids, CgroupMode mode,
                    std::string *error) const override {
        if (mode == CgroupMode::ContainerSystemd && !v2_)
            return fail(error, "the container engine uses the systemd cgroup driver, but malld runs the "
                               "cgroup-v1 backend (systemd sets cpusets on cgroup v2 only); configure the "
                               "engine with the cgroupfs driver (podman --cgroup-manager=cgroupfs)");
        if (mode == CgroupMode::ContainerSystemd && !systemd_slice::systemd_booted())
            return fail(error, "the container engine uses the systemd cgroup driver, but systemd does not "
                               "run here (no /run/systemd/system); use the cgroupfs driver");
        for (pid_t pid : pids) {
            auto rel = process_cgroup(pid, v2_);
            if (!rel) continue;  // gone (registration refuses dead pids itself) or no cpuset line
            const bool own = needs_own_folder(*rel);
            if (mode == CgroupMode::Own || is_container_mode(mode) ||
                (mode == CgroupMode::Auto && own))
                continue;
            if (own)
                return fail(error, "pid " + std::to_string(pid) + " lives in cgroup " + *rel + ", " +
                                       own_reason(*rel) +
                                       ": there is no cgroup of its own to resize in place; register "
                                       "it with cgroup mode auto or own");
            if (auto why = cannot_write_in_place(mount_ + *rel))
                return fail(error, "pid " + std::to_string(pid) + " lives in cgroup " + *rel +
                                       ", which malld cannot resize in place: " + *why);
        }
        return true;
    }

    void set_mode(const std::string &job, CgroupMode mode) override {
        if (jobs_.count(job)) return;
        jobs_[job].mode = mode;
        // A container job's folder is made at its first apply(), empty, for the engine.
        if (is_container_mode(mode)) jobs_[job].any_own = true;
    }

    bool add_pids(const std::string &job, const std::vector<pid_t> &pids,
                  std::string *error) override {
        JobCgroups &state = jobs_[job];
        const size_t known = state.in_place.size();
        std::vector<pid_t> to_move = classify(job, state, pids);
        // A task that joins in a cgroup of its own (another Slurm step) gets the job's cpus there
        // now: the job's allocation may not change, so no apply() would come for it.
        std::string first_error;
        if (state.enforced && !state.enforced->empty())
            for (size_t i = known; i < state.in_place.size(); ++i) {
                std::string why;
                if (!resize_in_place(state.in_place[i].path, *state.enforced, &why) && first_error.empty())
                    first_error = why;
            }
        const std::string dir = own_dir(job);
        if (!to_move.empty() && is_directory(dir) && !move_pids(dir, to_move, error)) return false;
        // Its threads keep the masks they had (Slurm's task/affinity pins a task to its step's
        // cores before the plugin registers it, and the kernel keeps requested masks across a
        // move): widen them to the job's cpus, which no apply() may come to do.
        if (state.enforced && !state.enforced->empty() && !is_container_mode(state.mode))
            set_tree_affinity(job, pids, *state.enforced, first_error.empty() ? &first_error : nullptr);
        if (!first_error.empty()) return fail(error, first_error);
        return true;  // pids for malld's folder are moved when the folder is made
    }

    void adopt(const std::string &job, const std::vector<pid_t> &pids,
               const std::vector<JobCgroup> &saved, const CpuSet &enforced) override {
        JobCgroups &state = jobs_[job];
        if (!enforced.empty()) state.enforced = enforced;
        for (const JobCgroup &c : saved)
            if (c.in_place) state.in_place.push_back(c);
        // A container job whose saved folder is its systemd slice (the state file keeps no mode).
        for (const JobCgroup &c : saved)
            if (!c.in_place && state.mode == CgroupMode::Container && c.path == slice_dir(job))
                state.mode = CgroupMode::ContainerSystemd;
        // Where the live pids are now: a cgroup the state file did not name is recorded with its
        // cpus of now as its original (the file was written by a malld before enforcement in place).
        classify(job, state, pids);
    }

    std::vector<JobCgroup> cgroups_of(const std::string &job) const override {
        // No file system access: malld saves this after every batch of events.
        std::vector<JobCgroup> list;
        auto it = jobs_.find(job);
        if (it == jobs_.end()) return list;
        list = it->second.in_place;
        if (it->second.any_own) list.push_back(JobCgroup{own_dir(job), false, ""});
        return list;
    }

    std::vector<pid_t> member_pids(const std::string &job) const override {
        auto it = jobs_.find(job);
        if (it == jobs_.end() || !is_container_mode(it->second.mode)) return {};
        return pids_in_tree(own_dir(job));
    }

    std::string engine_cgroup_parent(const std::string &job) const override {
        auto it = jobs_.find(job);
        if (it == jobs_.end() || !is_container_mode(it->second.mode)) return "";
        if (it->second.mode == CgroupMode::ContainerSystemd)
            return systemd_slice::job_slice_name(job).value_or("");
        return own_dir(job).substr(mount_.size());
    }

    void tidy() override { retry_pending_removals(); }

    bool in_job_cgroups(const std::string &job, pid_t pid) const override {
        auto it = jobs_.find(job);
        if (it == jobs_.end()) return false;
        auto rel = process_cgroup(pid, v2_);
        if (!rel) return false;
        const std::string path = mount_ + *rel;
        for (const JobCgroup &c : it->second.in_place)
            if (is_path_prefix(c.path, path)) return true;
        return it->second.any_own && is_path_prefix(own_dir(job), path);
    }

    bool apply(const std::string &job, const std::vector<pid_t> &pids, const CpuSet &cpus,
               bool growing, std::string *error) override {
        JobCgroups &state = jobs_[job];
        std::vector<pid_t> own_pids = classify(job, state, pids);
        std::string first_error;
        auto note = [&](const std::string &why) {
            if (first_error.empty()) first_error = why;
        };
        for (const JobCgroup &c : state.in_place) {
            std::string why;
            if (!resize_in_place(c.path, cpus, &why)) note(why);
        }
        const std::string dir = own_dir(job);
        if (state.mode == CgroupMode::ContainerSystemd) {
            std::string why;
            if (!apply_slice(job, dir, cpus, growing, &why)) note(why);
        } else if (state.any_own || is_directory(dir)) {
            std::string why;
            if (!apply_own(dir, own_pids, cpus, growing, &why)) note(why);
        }
        state.enforced = cpus;
        if (!first_error.empty()) return fail(error, first_error);
        return true;
    }

    std::optional<CpuSet> current(const std::string &job,
                                  const std::vector<pid_t> &) const override {
        auto it = jobs_.find(job);
        if (it != jobs_.end() && !it->second.in_place.empty())
            return effective_cpus(it->second.in_place.front().path);
        std::string text;
        if (!read_text_file(own_dir(job) + "/cpuset.cpus", &text, nullptr)) return std::nullopt;
        return CpuSet::parse(trim(text));
    }

    void remove(const std::string &job) override {
        retry_pending_removals();
        auto it = jobs_.find(job);
        bool container = false;
        // A job of the systemd driver, or a stale slice of one (remove_stale_job_cgroups).
        bool slice = it == jobs_.end() && v2_ && is_directory(slice_dir(job));
        std::string dir = own_dir(job);
        if (it != jobs_.end()) {
            for (const JobCgroup &c : it->second.in_place) give_back(c);
            container = is_container_mode(it->second.mode);
            slice = it->second.mode == CgroupMode::ContainerSystemd;
            jobs_.erase(it);
        }
        if (slice) {
            remove_slice(job);
            return;
        }
        if (container || (is_directory(dir) && !descendants(dir).empty())) {
            remove_container_folders(dir);
            return;
        }
        if (!is_directory(dir)) return;
        if (!remove_folder(dir)) pending_removals_.insert(dir);
    }

    void stop() override {
        retry_pending_removals();
        stop_parent_slice_if_empty();
        if (!is_directory(parent_dir_)) return;
        if (!job_folders().empty()) return;  // running jobs keep their folders for re-adoption
        remove_folder(parent_dir_);
        // Container engines (runc) make the --cgroup-parent path in every hierarchy: malld's
        // parent folder there goes too, when empty.
        for (const std::string &mount : other_cgroup_mounts()) ::rmdir((mount + parent_rel_).c_str());
    }

    std::string cgroup_path(const std::string &job) const override {
        auto it = jobs_.find(job);
        if (it != jobs_.end() && !it->second.in_place.empty()) return it->second.in_place.front().path;
        return own_dir(job);
    }

    std::vector<std::string> jobs_with_cgroups() const override {
        std::vector<std::string> jobs;
        for (const auto &folder : job_folders()) jobs.push_back(folder.substr(std::strlen(kJobFolderPrefix)));
        for (const auto &job : slice_jobs())
            if (std::find(jobs.begin(), jobs.end(), job) == jobs.end()) jobs.push_back(job);
        return jobs;
    }

    std::string describe() const override {
        return std::string(v2_ ? "cgroup-v2" : "cgroup-v1") + " cpuset at " + mount_ +
               " (jobs in place in their own cgroups; malld's folders under " + parent_dir_ + ")";
    }

private:
    struct JobCgroups {
        CgroupMode mode = CgroupMode::Auto;
        std::vector<JobCgroup> in_place;  // in the order first seen
        std::set<pid_t> seen;             // pids already classified
        bool any_own = false;             // some process needs malld's own folder
        std::optional<CpuSet> enforced;   // the cpus last applied (for cgroups that join later)
    };

    static bool fail(std::string *error, const std::string &text) {
        if (error) *error = text;
        return false;
    }

    std::string own_dir(const std::string &job) const {
        auto it = jobs_.find(job);
        if (it != jobs_.end() && it->second.mode == CgroupMode::ContainerSystemd) return slice_dir(job);
        return parent_dir_ + "/" + kJobFolderPrefix + job;
    }
    // Where systemd puts the job's slice (systemd driver), "" when the name cannot be a unit's.
    std::string slice_dir(const std::string &job) const {
        auto name = systemd_slice::job_slice_name(job);
        return name ? mount_ + systemd_slice::cgroup_path_of(*name) : std::string();
    }

    // True for a cgroup that was not made for one job: the root, malld's own folders, the cgroup
    // malld itself runs in and its ancestors, and (v2) systemd's user slices (login sessions).
    bool needs_own_folder(const std::string &rel) const {
        return !own_reason(rel).empty();
    }
    std::string own_reason(const std::string &rel) const {
        if (rel == "/") return "the hierarchy's root";
        if (is_path_prefix(parent_rel_, rel)) return "a folder of malld's own (" + parent_rel_ + ")";
        if (is_path_prefix(rel, self_rel_)) return "the cgroup malld runs in or one of its ancestors";
        if (v2_ && is_path_prefix("/user.slice", rel)) return "a systemd login session (/user.slice)";
        return "";
    }

    // Why malld may not resize `dir` in place, or nullopt when it may.
    std::optional<std::string> cannot_write_in_place(const std::string &dir) const {
        const std::string file = dir + "/cpuset.cpus";
        if (!is_directory(dir)) return dir + " does not exist";
        if (::access(file.c_str(), F_OK) != 0)
            return "it has no cpuset.cpus (the cpuset controller is not enabled for it: its parent's "
                   "cgroup.subtree_control lacks cpuset; the resource manager must enable it, e.g. "
                   "Slurm's cgroup/v2 plugin with ConstrainCores=yes, or systemd's Delegate=cpuset)";
        if (::access(file.c_str(), W_OK) != 0)
            return "cannot write " + file + ": " + errno_text(errno) +
                   " (malld needs root, or the cgroup delegated to malld's user)";
        return std::nullopt;
    }

    // Sorts pids not seen before: a pid in a cgroup made for it records that cgroup (in place),
    // any other needs malld's own folder. Returns the pids (of all seen) that belong in malld's
    // folder, so the caller can move them.
    std::vector<pid_t> classify(const std::string &job, JobCgroups &state, const std::vector<pid_t> &pids) {
        std::vector<pid_t> own;
        for (pid_t pid : pids) {
            auto rel = process_cgroup(pid, v2_);
            const bool first = state.seen.insert(pid).second;
            if (!rel) continue;
            // A container job: its processes live in the engine's cgroups below the job's folder,
            // which apply() resizes with them; the launcher (mallrun, the engine's client) stays
            // where it is, outside the job's cpus.
            if (is_container_mode(state.mode)) continue;
            const bool in_own = needs_own_folder(*rel);
            if (state.mode == CgroupMode::Own || in_own) {
                own.push_back(pid);
                state.any_own = true;
                continue;
            }
            if (!first) continue;
            const std::string dir = mount_ + *rel;
            bool known = false;
            for (const JobCgroup &c : state.in_place) known = known || c.path == dir;
            if (known) continue;
            std::string original;
            read_text_file(dir + "/cpuset.cpus", &original, nullptr);
            state.in_place.push_back(JobCgroup{dir, true, trim(original)});
            if (state.in_place.size() == 2)
                log_line(LogLevel::Info,
                         "job " + job + "'s processes live in several cgroups (" + state.in_place[0].path +
                             ", " + dir + "); malld resizes each of them in place");
        }
        return own;
    }

    // The cpus that apply to the processes of `dir` (v1 cpuset.cpus; v2 cpuset.cpus.effective).
    std::optional<CpuSet> effective_cpus(const std::string &dir) const {
        std::string text;
        if (!read_text_file(dir + (v2_ ? "/cpuset.cpus.effective" : "/cpuset.cpus"), &text, nullptr))
            return std::nullopt;
        return CpuSet::parse(trim(text));
    }
    // What is written in a folder's cpuset.cpus (v2: may be empty = the parent's).
    std::optional<CpuSet> written_cpus(const std::string &dir) const {
        std::string text;
        if (!read_text_file(dir + "/cpuset.cpus", &text, nullptr)) return std::nullopt;
        return CpuSet::parse(trim(text));
    }

    bool write_cpus(const std::string &dir, const CpuSet &cpus, std::string *error) const {
        int err = write_file_once(dir + "/cpuset.cpus", cpus.to_string());
        if (err == 0) return true;
        return fail(error, "cannot write '" + cpus.to_string() + "' to " + dir + "/cpuset.cpus: " +
                               errno_text(err) +
                               (err == EACCES || err == EPERM
                                    ? " (malld needs root, or the cgroup delegated to its user)"
                                    : err == EINVAL ? " (cpus outside the parent's, or offline)"
                                                    : ""));
    }

    // Every folder below dir, parents before children.
    static std::vector<std::string> descendants(const std::string &dir) {
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

    // The folders between the mount (excluded) and dir (excluded), outermost first.
    std::vector<std::string> ancestors(const std::string &dir) const {
        std::vector<std::string> out;
        std::string rel = dir.substr(mount_.size());
        for (size_t slash = rel.find('/', 1); slash != std::string::npos; slash = rel.find('/', slash + 1))
            out.push_back(mount_ + rel.substr(0, slash));
        return out;
    }

    // Resizes a cgroup someone else made, and its descendants, to `target`, without moving any
    // process. Growth: every ancestor that lacks a target cpu is widened first (outermost first),
    // then the cgroup, then its descendants (v1 growth does not flow down; v2 descendants with
    // cpus of their own keep them). Narrowing: descendants first (deepest first), then the cgroup;
    // ancestors keep their cpus. A move (some cpus out, some in) is a growth to the union followed
    // by a narrowing, so no write ever asks for a child wider than its parent.
    bool resize_in_place(const std::string &dir, const CpuSet &target, std::string *error) {
        if (!is_directory(dir)) return true;  // the resource manager removed it: the job is ending
        if (target.empty()) {
            if (read_pid_list(dir + "/cgroup.procs").empty()) return true;
            return fail(error, "cannot narrow " + dir +
                                   " to no cpus while it holds processes (the kernel refuses an "
                                   "empty cpuset); the job keeps its cpus until some are free");
        }
        auto now = written_cpus(dir);
        if (!now) return fail(error, "cannot read " + dir + "/cpuset.cpus: " + errno_text(errno));
        if (now->empty()) now = effective_cpus(dir);  // v2: inherited
        const std::vector<std::string> below = descendants(dir);
        CpuSet wide = (now ? *now : CpuSet()) | target;
        bool grew = false;
        if (!(target - (now ? *now : CpuSet())).empty()) {
            grew = true;
            for (const std::string &a : ancestors(dir)) {
                auto held = written_cpus(a);
                if (!held) return fail(error, "cannot read " + a + "/cpuset.cpus (an ancestor of " + dir + ")");
                if (held->empty() && v2_) continue;  // inherits: nothing to widen here
                if ((wide - *held).empty()) continue;
                if (!write_cpus(a, *held | wide, error)) return false;
            }
            if (!write_cpus(dir, wide, error)) return false;
            for (const std::string &d : below) {
                auto held = written_cpus(d);
                if (!held || (v2_ && held->empty())) continue;
                if (!write_cpus(d, wide, error)) return false;
            }
        }
        if (wide != target) {
            for (auto it = below.rbegin(); it != below.rend(); ++it) {
                auto held = written_cpus(*it);
                if (!held || (v2_ && held->empty())) continue;
                if (*held != target && !write_cpus(*it, target, error)) return false;
            }
            if (!write_cpus(dir, target, error)) return false;
        }
        if (v2_) {
            auto effective = effective_cpus(dir);
            if (!effective || *effective != target)
                return fail(error, dir + "/cpuset.cpus is '" + target.to_string() +
                                       "' but the kernel applies '" +
                                       (effective ? effective->to_string() : std::string("?")) +
                                       "' (cpuset.cpus.effective): an ancestor's cpus do not hold them");
        }
        if (grew) widen_thread_masks(dir, below, target);
        return true;
    }

    // The kernel keeps each thread's own mask (effective = cpuset ∩ mask): after a growth every
    // thread of the cgroup and its descendants is widened to the job's cpus.
    void widen_thread_masks(const std::string &dir, const std::vector<std::string> &below,
                            const CpuSet &cpus) const {
        std::vector<std::string> all{dir};
        all.insert(all.end(), below.begin(), below.end());
        for (const auto &d : all)
            for (pid_t pid : read_pid_list(d + "/cgroup.procs"))
                for (pid_t tid : threads_of(pid)) set_thread_affinity(tid, cpus);
    }

    // At the job's end an in-place cgroup gets back the cpus it had at registration (its resource
    // manager may be removing it at the same moment: a folder that is gone is fine).
    void give_back(const JobCgroup &c) {
        if (!is_directory(c.path)) return;
        if (c.original.empty()) {
            // v2 "inherit the parent's": kernel 6.1 refuses an empty write while the cgroup holds
            // processes (ENOSPC); the parent's effective cpus are then the nearest equivalent.
            if (v2_ && write_file_once(c.path + "/cpuset.cpus", "") != 0) {
                std::string parent_cpus;
                read_text_file(c.path.substr(0, c.path.rfind('/')) + "/cpuset.cpus.effective", &parent_cpus, nullptr);
                if (!trim(parent_cpus).empty()) write_file_once(c.path + "/cpuset.cpus", trim(parent_cpus));
            }
            return;
        }
        auto original = CpuSet::parse(c.original);
        std::string why;
        if (original && !resize_in_place(c.path, *original, &why) && is_directory(c.path))
            log_line(LogLevel::Warn, "cannot give " + c.path + " back its cpus '" + c.original + "': " + why);
    }

    bool apply_own(const std::string &dir, const std::vector<pid_t> &pids, const CpuSet &cpus,
                   bool growing, std::string *error) {
        bool exists = is_directory(dir);
        if (cpus.empty()) {
            if (!exists) return true;  // nothing enforced yet, nothing to narrow
            if (read_pid_list(dir + "/cgroup.procs").empty()) return true;
            return fail(error, "cannot narrow " + dir +
                                   " to no cpus while it holds processes (the kernel refuses an "
                                   "empty cpuset); the job keeps its cpus until some are free");
        }
        // Cgroups below malld's folder (a container created with --cgroup-parent there) go with
        // it, by the in-place rules: descendants narrowed first (v1), growth carried down.
        if (exists && !descendants(dir).empty()) return resize_in_place(dir, cpus, error);
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
        // v2: the engine's cgroups below the folder need the cpuset controller (the folder holds
        // no process itself, which the "no internal processes" rule requires for this).
        if (created && v2_ && pids.empty()) write_file_once(dir + "/cgroup.subtree_control", "+cpuset");
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

    // v2, malld not in the root cgroup: the subtree malld was given is its cgroup (or that
    // cgroup's parent when malld already sits in its leaf kDaemonLeaf, e.g. after a restart or
    // with systemd's DelegateSubgroup=). The "no internal processes" rule lets a cgroup enable a
    // controller for children only while it holds no process, so malld first moves itself into
    // the leaf, then enables cpuset below the subtree and keeps its job folders in
    // <subtree>/<parent>. A subtree without the cpuset controller (not delegated) leaves the folders
    // at the root, with a warning.
    bool enter_delegated_subtree(std::string *error) {
        static constexpr const char *kDaemonLeaf = "malld";
        std::string subtree_rel = self_rel_;
        const std::string leaf_suffix = std::string("/") + kDaemonLeaf;
        if (subtree_rel.size() > leaf_suffix.size() &&
            subtree_rel.compare(subtree_rel.size() - leaf_suffix.size(), leaf_suffix.size(), leaf_suffix) == 0)
            subtree_rel.resize(subtree_rel.size() - leaf_suffix.size());
        const std::string subtree = mount_ + subtree_rel;
        std::string controllers;
        read_text_file(subtree + "/cgroup.controllers", &controllers, nullptr);
        if (!has_word(controllers, "cpuset")) {
            // Not delegated: malld's folders go to the root as on a host without systemd. Jobs
            // under a resource manager are enforced in place and never need them.
            log_line(LogLevel::Warn,
                     "malld runs in cgroup " + subtree_rel + " (cgroup v2), which was not given the cpuset "
                     "controller (its cgroup.controllers: '" + trim(controllers) + "'), so its own job "
                     "folders go to " + parent_dir_ + " at the root of the tree, which systemd does not "
                     "know; run malld from a unit with Delegate=yes (systemd 244 or later delegates "
                     "cpuset) to keep them in its own subtree");
            return enable_v2_controller(mount_, error);
        }
        const std::string leaf = subtree + leaf_suffix;
        if (subtree_rel == self_rel_) {
            if (::mkdir(leaf.c_str(), 0755) != 0 && errno != EEXIST)
                return fail(error, "cannot create " + leaf + " to move malld into: " + errno_text(errno) +
                                       " (the subtree " + subtree + " must be delegated to malld's user)");
            int err = write_file_once(leaf + "/cgroup.procs", "0");
            if (err != 0)
                return fail(error, "cannot move malld into " + leaf + ": " + errno_text(err) +
                                       " (the subtree " + subtree + " must be delegated to malld's user)");
            self_rel_ = subtree_rel + leaf_suffix;
            log_line(LogLevel::Info, "cgroup v2: malld moved itself into " + leaf +
                                         " so that it can enable cpuset below the delegated subtree " + subtree);
        }
        if (!enable_v2_controller(subtree, error)) return false;
        parent_rel_ = (subtree_rel == "/" ? "" : subtree_rel) + "/" + parent_name_;
        parent_dir_ = mount_ + parent_rel_;
        log_line(LogLevel::Info, "cgroup v2: malld's own job folders go under " + parent_dir_ +
                                     " (the subtree delegated to malld)");
        return true;
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

    // Every process in dir and its descendants (cgroup.procs of each).
    static std::vector<pid_t> pids_in_tree(const std::string &dir) {
        if (!is_directory(dir)) return {};
        std::vector<pid_t> all = read_pid_list(dir + "/cgroup.procs");
        for (const std::string &d : descendants(dir))
            for (pid_t pid : read_pid_list(d + "/cgroup.procs")) all.push_back(pid);
        return all;
    }

    // The other cgroup hierarchies (v1 controllers other than cpuset, and the v2 mount of a hybrid
    // layout), where runc also makes a container's --cgroup-parent path.
    std::vector<std::string> other_cgroup_mounts() const {
        std::vector<std::string> mounts;
        for (const auto &m : read_mountinfo())
            if ((m.fstype == "cgroup" || m.fstype == "cgroup2") && m.mount_point != mount_)
                mounts.push_back(m.mount_point);
        return mounts;
    }

    // A container job's folder and what the engine made below it (an empty conmon folder, a
    // container's folder not removed yet), in every hierarchy, deepest first. Processes are never
    // moved out of a container's cgroup: a folder that still holds some (the job was deregistered
    // while its container runs) is widened to the whole pool, so the container runs on as an
    // ordinary one, and removed later (tidy) once it is empty.
    void remove_container_folders(const std::string &dir) {
        if (is_directory(dir) && !pids_in_tree(dir).empty()) {
            std::string why;
            if (!pool_.empty() && !resize_in_place(dir, pool_, &why))
                log_line(LogLevel::Warn, "cannot widen " + dir + " to the pool: " + why);
            log_line(LogLevel::Info, dir + " still holds processes (a container the job no longer "
                                           "manages): it keeps the whole pool and goes once empty");
        }
        std::vector<std::string> roots{dir};
        const std::string rel = dir.substr(mount_.size());
        for (const std::string &mount : other_cgroup_mounts()) roots.push_back(mount + rel);
        for (const std::string &root : roots) {
            if (!is_directory(root)) continue;
            std::vector<std::string> folders = descendants(root);
            std::reverse(folders.begin(), folders.end());
            folders.push_back(root);
            for (const std::string &f : folders)
                if (::rmdir(f.c_str()) != 0 && errno != ENOENT) pending_rmdirs_.insert(f);
        }
    }

    // The systemd driver: the slice gets the job's cpus as AllowedCPUs (systemd keeps and re-applies
    // them); once systemd has made the slice's cgroup, the same cpus are written there at once
    // (systemd writes the same value from its own loop; up to 2 s for it to enable cpuset there),
    // checked in cpuset.cpus.effective, and on growth every thread's own mask is widened. Before the engine started anything in the slice
    // there is no cgroup yet: systemd applies the cpus when it makes it.
    bool apply_slice(const std::string &job, const std::string &dir, const CpuSet &cpus, bool growing,
                     std::string *error) {
        auto slice = systemd_slice::job_slice_name(job);
        if (!slice) return fail(error, "job " + job + "'s name is too long for a systemd slice name");
        if (cpus.empty()) {
            if (pids_in_tree(dir).empty()) return true;
            return fail(error, "cannot narrow " + *slice + " to no cpus while it holds processes (AllowedCPUs= "
                               "empty means every cpu); the job keeps its cpus until some are free");
        }
        if (!systemd_slice::set_allowed_cpus(*slice, cpus, error)) return false;
        if (!is_directory(dir)) return true;
        // systemd may enable cpuset for the slice from its loop a moment after set-property.
        std::optional<CpuSet> effective;
        for (int attempt = 0; attempt < 100; ++attempt) {
            if (write_file_once(dir + "/cpuset.cpus", cpus.to_string()) == 0 && (effective = effective_cpus(dir)) &&
                *effective == cpus)
                break;
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        if (!effective || *effective != cpus)
            return fail(error, dir + "/cpuset.cpus is '" + cpus.to_string() + "' but the kernel applies '" +
                                   (effective ? effective->to_string() : std::string("?")) +
                                   "' (cpuset.cpus.effective): does an ancestor slice have AllowedCPUs?");
        if (growing) widen_thread_masks(dir, descendants(dir), cpus);
        return true;
    }

    // The job ended: its slice is stopped and forgotten once empty. A container still running
    // there (the job was deregistered) gets the whole pool and goes later (tidy).
    void remove_slice(const std::string &job) {
        if (!pids_in_tree(slice_dir(job)).empty()) {
            std::string why;
            if (auto slice = systemd_slice::job_slice_name(job);
                slice && !pool_.empty() && !systemd_slice::set_allowed_cpus(*slice, pool_, &why))
                log_line(LogLevel::Warn, "cannot widen " + *slice + " to the pool: " + why);
            log_line(LogLevel::Info, slice_dir(job) + " still holds processes (a container the job no "
                                                      "longer manages): it keeps the whole pool and goes once empty");
            pending_slices_.insert(job);
            return;
        }
        release_slice(job);
    }

    void release_slice(const std::string &job) {
        auto slice = systemd_slice::job_slice_name(job);
        if (!slice) return;
        std::string why;
        if (!systemd_slice::stop_and_forget(*slice, &why))
            log_line(LogLevel::Warn, "cannot stop the systemd slice " + *slice + " of ended job " + job + ": " + why);
        stop_parent_slice_if_empty();
    }

    // mall.slice, once it holds no job's slice (systemd starts it again with the next one).
    void stop_parent_slice_if_empty() {
        const std::string parent = mount_ + systemd_slice::parent_cgroup_path();
        if (!v2_ || !is_directory(parent) || !descendants(parent).empty()) return;
        std::string why;
        if (!systemd_slice::run_systemctl({"stop", "--", systemd_slice::kParentSlice}, &why))
            log_line(LogLevel::Warn, "cannot stop " + std::string(systemd_slice::kParentSlice) + ": " + why);
    }

    // Jobs whose slice exists in mall.slice now (systemd driver).
    std::vector<std::string> slice_jobs() const {
        std::vector<std::string> jobs;
        if (!v2_) return jobs;
        const std::string parent = mount_ + systemd_slice::parent_cgroup_path();
        DIR *d = ::opendir(parent.c_str());
        if (!d) return jobs;
        while (dirent *e = ::readdir(d))
            if (e->d_type == DT_DIR)
                if (auto job = systemd_slice::job_of_slice(e->d_name)) jobs.push_back(*job);
        ::closedir(d);
        return jobs;
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
    // just exited may keep the folder busy for a moment, so retry briefly. (A folder with cgroups
    // below it, a container's, goes through remove_container_folders instead.)
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
        // Slices that held a container the job no longer manages: stopped once empty.
        for (auto it = pending_slices_.begin(); it != pending_slices_.end();) {
            if (pids_in_tree(slice_dir(*it)).empty()) {
                release_slice(*it);
                it = pending_slices_.erase(it);
            } else {
                ++it;
            }
        }
        // Container folders: plain rmdir, deepest first, never moving a process.
        std::vector<std::string> rmdirs(pending_rmdirs_.begin(), pending_rmdirs_.end());
        std::sort(rmdirs.begin(), rmdirs.end(),
                  [](const std::string &a, const std::string &b) { return a.size() > b.size(); });
        for (const std::string &f : rmdirs)
            if (::rmdir(f.c_str()) == 0 || errno == ENOENT) pending_rmdirs_.erase(f);
        for (auto it = pending_removals_.begin(); it != pending_removals_.end();) {
            if (!is_directory(*it) || remove_folder(*it))
                it = pending_removals_.erase(it);
            else
                ++it;
        }
    }

    bool v2_;
    std::string mount_;
    std::string parent_name_;  // --cgroup-parent
    std::string parent_rel_;  // "/mall" (or "<delegated subtree>/mall"): malld's folders, relative to the mount
    std::string parent_dir_;
    std::string self_rel_;    // the cgroup malld runs in, relative to the mount
    std::string mems_;
    CpuSet pool_;             // malld's pool (a container folder left running gets all of it)
    std::map<std::string, JobCgroups> jobs_;
    std::set<std::string> pending_removals_;
    std::set<std::string> pending_rmdirs_;  // container folders: removed with rmdir only
    std::set<std::string> pending_slices_;  // jobs whose slice still holds processes
};

// ---------------------------------------------------------------------------------------------
// affinity backend: no cgroups, sched_setaffinity on every thread of the job's process trees.

class AffinityBackend final : public CpusetBackend {
public:
    BackendKind kind() const override { return BackendKind::Affinity; }
    bool start(const CpuSet &, std::string *) override { return true; }
    bool check_pids(const std::vector<pid_t> &, CgroupMode, std::string *) const override {
        return true;  // no cgroups: every mode means "the threads' masks"
    }
    void set_mode(const std::string &, CgroupMode) override {}
    // A task joining a job that already holds cpus gets them now: the allocation may not change,
    // so no apply() would come for it.
    bool add_pids(const std::string &job, const std::vector<pid_t> &pids, std::string *error) override {
        auto it = applied_.find(job);
        if (it == applied_.end()) return true;
        std::string first_error;
        set_tree_affinity(job, pids, it->second, &first_error);
        if (first_error.empty()) return true;
        if (error) *error = first_error;
        return false;
    }
    void adopt(const std::string &, const std::vector<pid_t> &, const std::vector<JobCgroup> &,
               const CpuSet &) override {}
    std::vector<JobCgroup> cgroups_of(const std::string &) const override { return {}; }
    bool in_job_cgroups(const std::string &, pid_t) const override { return false; }

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
        set_tree_affinity(job, pids, cpus, &first_error);
        applied_[job] = cpus;
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

    void remove(const std::string &job) override { applied_.erase(job); }
    void stop() override {}
    std::string cgroup_path(const std::string &) const override { return ""; }
    std::vector<std::string> jobs_with_cgroups() const override { return {}; }
    std::string describe() const override {
        return "affinity (sched_setaffinity on every thread, no cgroups)";
    }

private:
    std::map<std::string, CpuSet> applied_;  // the cpus last applied to each job
};

}  // namespace

std::optional<CgroupMode> parse_cgroup_mode(const std::string &name) {
    if (name == "auto") return CgroupMode::Auto;
    if (name == "own") return CgroupMode::Own;
    if (name == "in-place") return CgroupMode::InPlace;
    if (name == "container") return CgroupMode::Container;
    if (name == "container-systemd") return CgroupMode::ContainerSystemd;
    return std::nullopt;
}

const char *cgroup_mode_name(CgroupMode mode) {
    switch (mode) {
        case CgroupMode::Auto: return "auto";
        case CgroupMode::Own: return "own";
        case CgroupMode::InPlace: return "in-place";
        case CgroupMode::Container: return "container";
        case CgroupMode::ContainerSystemd: return "container-systemd";
    }
    return "unknown";
}

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
