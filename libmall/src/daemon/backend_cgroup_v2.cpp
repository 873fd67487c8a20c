// SPDX-License-Identifier: BSD-3-Clause
// backend_cgroup_v2.cpp — the cgroup v2 kernel interface of the cgroup backend: the unified
// hierarchy. A folder's cpuset.cpus may be empty, meaning "the parent's", and cpuset.cpus.effective
// is what applies (checked after every resize); the cpuset controller must be enabled in each
// parent's cgroup.subtree_control, which the "no internal processes" rule allows only in a cgroup
// holding no process, so a malld started inside a delegated subtree first moves itself into a leaf.
// The container-systemd mode (systemd slices) and systemd's login sessions exist only here.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <memory>

#include "../common/files.hpp"
#include "../common/text.hpp"
#include "backend_cgroup.hpp"
#include "cgroup_tree.hpp"
#include "log.hpp"
#include "procfs.hpp"

namespace mall {

namespace {

using cgroup_tree::errno_text;
using cgroup_tree::has_word;
using cgroup_tree::is_path_prefix;

class CgroupV2Backend final : public CgroupBackend {
public:
    CgroupV2Backend(const std::string &mount, const std::string &parent)
        : CgroupBackend(mount, parent, process_cgroup(0, true).value_or("/")) {}

    BackendKind kind() const override { return BackendKind::CgroupV2; }

protected:
    const char *version_name() const override { return "cgroup-v2"; }
    std::optional<std::string> cgroup_of(pid_t pid) const override { return process_cgroup(pid, true); }

    bool prepare_hierarchy(std::string *error) override {
        // cgroup v2 below the root: malld runs in a subtree delegated to it (a systemd unit
        // with Delegate=yes, a container): its folders go there, not at the root.
        if (self_rel_ != "/") return enter_delegated_subtree(error);
        return enable_v2_controller(mount_, error);
    }

    bool prepare_parent(std::string *error) override {
        int err = write_file_once(parent_dir_ + "/cgroup.subtree_control", "+cpuset");
        if (err != 0)
            return fail(error, "cannot enable cpuset for children in " + parent_dir_ +
                                   "/cgroup.subtree_control: " + errno_text(err) +
                                   "; the parent must hold no processes");
        return true;
    }

    bool prepare_job_folder(const std::string &dir, const std::vector<pid_t> &pids, std::string *) override {
        // The engine's cgroups below the folder need the cpuset controller (the folder holds
        // no process itself, which the "no internal processes" rule requires for this).
        if (pids.empty()) write_file_once(dir + "/cgroup.subtree_control", "+cpuset");
        return true;
    }

    const char *effective_cpus_file() const override { return "/cpuset.cpus.effective"; }
    bool empty_cpus_inherit() const override { return true; }
    bool applies_other_cpus() const override { return true; }

    void restore_inherited(const std::string &dir) override {
        // v2 "inherit the parent's": kernel 6.1 refuses an empty write while the cgroup holds
        // processes (ENOSPC); the parent's effective cpus are then the nearest equivalent.
        if (write_file_once(dir + "/cpuset.cpus", "") != 0) {
            std::string parent_cpus;
            read_text_file(dir.substr(0, dir.rfind('/')) + "/cpuset.cpus.effective", &parent_cpus, nullptr);
            if (!trim(parent_cpus).empty()) write_file_once(dir + "/cpuset.cpus", trim(parent_cpus));
        }
    }

    bool has_systemd_slices() const override { return true; }
    // cpu.stat's usage_usec exists in every v2 cgroup, with or without the cpu controller.
    bool cgroups_count_cpu_time() const override { return true; }
    std::string session_reason(const std::string &rel) const override {
        if (is_path_prefix("/user.slice", rel)) return "a systemd login session (/user.slice)";
        return "";
    }

private:
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
};

}  // namespace

std::unique_ptr<CpusetBackend> make_cgroup_v2_backend(const std::string &mount, const std::string &parent) {
    return std::make_unique<CgroupV2Backend>(mount, parent);
}

}  // namespace mall
