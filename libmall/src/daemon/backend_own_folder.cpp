// SPDX-License-Identifier: BSD-3-Clause
// backend_own_folder.cpp — malld's own folder per job, <mount>/<parent>/job_<job>: made at
// the first enforcement for processes that live in no cgroup of their own (they are moved in), or
// empty for a container engine of the cgroupfs driver to create its cgroups below (they are never
// moved out again); removed at the job's end, retried while busy. The modes (cgroup_modes.hpp) call
// these; none of them asks which mode a job has.
#include "backend_cgroup.hpp"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <thread>

#include "../common/files.hpp"
#include "../common/text.hpp"
#include "cgroup_tree.hpp"
#include "procfs.hpp"

namespace mall {

using cgroup_tree::descendants;
using cgroup_tree::errno_text;
using cgroup_tree::is_directory;
using cgroup_tree::pids_in_tree;
using cgroup_tree::read_pid_list;

std::string CgroupBackend::own_folder(const std::string &job) const {
    return parent_dir_ + "/" + kJobFolderPrefix + job;
}

bool CgroupBackend::apply_job_folder(const std::string &dir, const std::vector<pid_t> &pids, const CpuSet &cpus,
                                     bool growing, std::string *error) {
    bool exists = is_directory(dir);
    if (cpus.empty())  // not made yet: nothing enforced, nothing to narrow
        return allow_no_cpus(dir, exists && !read_pid_list(dir + "/cgroup.procs").empty(),
                             "the kernel refuses an empty cpuset", error);
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
    if (created && !prepare_job_folder(dir, pids, error)) return false;
    bool ok = true;
    if (created) ok = move_pids(dir, pids, error);
    // The cpuset write narrows at once; widening also needs every thread's own mask widened,
    // otherwise a thread pinned earlier stays on its old cpus (effective = cpuset ∩ mask).
    if (growing || created) widen_thread_masks(dir, {}, cpus);
    return ok;
}

// Moves each pid (all its threads) and its descendants into dir. Pids that are gone are fine.
bool CgroupBackend::move_pids(const std::string &dir, const std::vector<pid_t> &pids, std::string *error) {
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

// The other cgroup hierarchies (v1 controllers other than cpuset, and the v2 mount of a hybrid
// layout), where runc also makes a container's --cgroup-parent path.
std::vector<std::string> CgroupBackend::other_cgroup_mounts() const {
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
void CgroupBackend::remove_container_folders(const std::string &dir) {
    if (is_directory(dir) && !pids_in_tree(dir).empty())
        keep_running_with_pool(dir, dir, [&](std::string *why) { return resize_in_place(dir, pool_, why); });
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

void CgroupBackend::remove_job_folder(const std::string &dir) {
    if (!is_directory(dir)) return;
    if (!descendants(dir).empty()) {
        remove_container_folders(dir);
        return;
    }
    if (!remove_folder(dir)) pending_removals_.insert(dir);
}

std::vector<std::string> CgroupBackend::job_folders() const {
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

CpuSet CgroupBackend::children_cpus() const {
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
bool CgroupBackend::remove_folder(const std::string &dir) {
    for (int attempt = 0; attempt < 20; ++attempt) {
        for (pid_t pid : read_pid_list(dir + "/cgroup.procs"))
            write_file_once(mount_ + "/cgroup.procs", std::to_string(pid));
        if (::rmdir(dir.c_str()) == 0 || errno == ENOENT) return true;
        if (errno != EBUSY) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
}

}  // namespace mall
