// SPDX-License-Identifier: BSD-3-Clause
// backend_cgroup_v1.cpp — the cgroup v1 kernel interface of the cgroup backend: the cpuset
// hierarchy mounted on its own. A folder's cpus are its cpuset.cpus (never empty while it holds
// processes, and growth does not flow down to children); a new folder starts with no memory nodes,
// so malld gives its parent and each job folder the root's cpuset.mems. No systemd slices here.
#include <unistd.h>

#include <memory>

#include "../common/files.hpp"
#include "../common/text.hpp"
#include "backend_cgroup.hpp"
#include "cgroup_tree.hpp"
#include "procfs.hpp"

namespace mall {

namespace {

using cgroup_tree::errno_text;

class CgroupV1Backend final : public CgroupBackend {
public:
    CgroupV1Backend(const std::string &mount, const std::string &parent)
        : CgroupBackend(mount, parent, process_cgroup(0, false).value_or("/")) {}

    BackendKind kind() const override { return BackendKind::CgroupV1; }

protected:
    const char *version_name() const override { return "cgroup-v1"; }
    std::optional<std::string> cgroup_of(pid_t pid) const override { return process_cgroup(pid, false); }
    bool prepare_hierarchy(std::string *) override { return true; }

    bool prepare_parent(std::string *error) override {
        int err = 0;
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
        return true;
    }

    bool prepare_job_folder(const std::string &dir, const std::vector<pid_t> &, std::string *error) override {
        int err = write_file_once(dir + "/cpuset.mems", mems_);
        if (err != 0) {
            ::rmdir(dir.c_str());
            return fail(error, "cannot write '" + mems_ + "' to " + dir +
                                   "/cpuset.mems: " + errno_text(err));
        }
        return true;
    }

    const char *effective_cpus_file() const override { return "/cpuset.cpus"; }
    bool empty_cpus_inherit() const override { return false; }
    bool applies_other_cpus() const override { return false; }
    void restore_inherited(const std::string &) override {}  // v1 has no "inherit": nothing was empty
    bool has_systemd_slices() const override { return false; }
    std::string session_reason(const std::string &) const override { return ""; }
    // Not cpuacct: on v1 it is a hierarchy apart from the cpuset one (often mounted with cpu, as
    // cpu,cpuacct), where a job's in-place cgroups may not exist under the same path and malld's
    // own job folders exist only in the cpuset hierarchy; /proc's times follow the processes.
    bool cgroups_count_cpu_time() const override { return false; }

private:
    std::string mems_;  // the memory nodes every folder of malld's gets (the root's)
};

}  // namespace

std::unique_ptr<CpusetBackend> make_cgroup_v1_backend(const std::string &mount, const std::string &parent) {
    return std::make_unique<CgroupV1Backend>(mount, parent);
}

}  // namespace mall
