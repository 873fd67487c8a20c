// SPDX-License-Identifier: BSD-3-Clause
// attackers.hpp — helpers for the tests that attack malld's Register and self-registration as the
// users who would (issue 37): throwaway uids, a forked Peer that becomes a uid and sends a request,
// one request on a fresh connection (`ask`), the job names `mallctl status --json` lists, cgroup
// folders delegated to a uid, and a state file rewritten as someone with write access to it could. Implemented in attackers.cpp; whatever a helper starts, its owner ends.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/protocol.hpp"
#include "support/malld_fixture.hpp"

namespace mall::test {

constexpr uid_t kAdminUid = 61001;      // malld --admin-uid
constexpr uid_t kUserUid = 61002;       // a user who self-registers
constexpr uid_t kOtherUserUid = 61003;  // someone else

// The cgroup of pid as /proc/PID/cgroup names it on the cpuset hierarchy; "?" when unknown.
std::string cgroup_of(pid_t pid);

// The cgroup-relative path of a folder under cpuset_root().
std::string relative(const std::string &dir);

// Writes text and a newline to path (truncating it); false when that failed.
bool write_line(const std::string &path, const std::string &text);

// Hands a cgroup folder to uid as a delegation does: the folder and the files that move processes
// (and, on v2, the ones a delegate writes to make children) owned by uid. Asserts on failure.
void delegate(const std::string &dir, uid_t uid);

// "ok <reply body>" or "refused <code> <words>" ("unreachable <why>" when malld did not answer the
// connection): one request on a fresh connection to malld.
std::string ask(const std::string &socket, proto::Type type, const nlohmann::json &body);

// The job names `mallctl status --json` lists (run as the caller), or one entry that says why
// mallctl failed.
std::vector<std::string> listed_jobs(const std::string &socket);

// The argv of a process running /bin/sleep 120 as `uid` (setpriv), started inside `cgroup` when one
// is given.
std::vector<std::string> sleeper_as(uid_t uid, const std::string &cgroup = "");

bool runs_as(pid_t pid, uid_t uid);

// SIGKILLs `malld` (its state file lists one job, saved) and rewrites that job's saved cgroups as
// someone with write access to the state file could: one cgroup in place at `path`, saved on cpu 0
// only (so the next plan grows it, which resizes the cgroup); the file stays 0600. The caller
// restarts malld. Asserts on failure (callers: ASSERT_NO_FATAL_FAILURE or HasFatalFailure()).
void kill_and_craft_saved_cgroup(PrivateMalld &malld, const std::string &path);

// A process forked from the test that (still root) moves itself into `cgroup` when one is given,
// becomes `uid` (setresgid/setresuid, no groups), runs `work` and writes what it returns to the
// test as one line; then it stays alive (its connections to malld open) until released.
class Peer {
public:
    Peer(uid_t uid, const std::string &cgroup, const std::function<std::string()> &work);
    ~Peer();
    Peer(const Peer &) = delete;
    Peer &operator=(const Peer &) = delete;

    pid_t pid() const { return pid_; }
    // The line `work` returned (without its newline); "" when none came within the timeout.
    std::string result(Millis timeout = 20s);
    // Lets the process exit (it ends its connections to malld).
    void release();

private:
    pid_t pid_ = -1;
    int report_ = -1, hold_ = -1;
};

}  // namespace mall::test
