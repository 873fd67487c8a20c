// SPDX-License-Identifier: BSD-3-Clause
// persistence.cpp — see persistence.hpp. The fingerprint is state_fingerprint() of the snapshot
// itself, so it can never leave out a field the file holds.
#include "persistence.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "../common/files.hpp"
#include "../common/quiet_thread.hpp"
#include "../common/rules.hpp"
#include "log.hpp"
#include "procfs.hpp"

namespace mall {

namespace {

double epoch_now() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// A steady-clock moment as wall-clock seconds since the epoch, and back (`now` is the steady
// clock's present, read once per conversion batch).
double wall_time(TimePoint moment, TimePoint now) {
    return epoch_now() - std::chrono::duration<double>(now - moment).count();
}
TimePoint steady_time(double wall, TimePoint now) {
    // A wall clock set back gives "now"; one set far forward no earlier than the clock's start.
    const double since_start = std::chrono::duration<double>(now.time_since_epoch()).count();
    const double ago = std::clamp(epoch_now() - wall, 0.0, since_start);
    return now - std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(ago));
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The state file is written on a thread of its own: fsync takes milliseconds on a disk, and the
// loop must not make a job's ack (or anyone else) wait for it. Snapshots coalesce: only the newest
// pending one is written. flush() waits until the newest snapshot is on disk (clean stop).

class StateWriter {
public:
    StateWriter(int dir_fd, std::string dir)
        : dir_fd_(dir_fd), dir_(std::move(dir)), thread_(start_quiet_thread([this] { loop(); })) {}
    ~StateWriter() {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            quit_ = true;
        }
        wake_.notify_all();
        thread_.join();
    }
    void submit(SavedState state) {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            next_ = std::move(state);
        }
        wake_.notify_all();
    }
    void flush() {
        std::unique_lock<std::mutex> lock(mutex_);
        idle_.wait(lock, [this] { return !next_ && !busy_; });
    }

private:
    void loop() {
        std::unique_lock<std::mutex> lock(mutex_);
        for (;;) {
            wake_.wait(lock, [this] { return next_.has_value() || quit_; });
            if (!next_) return;  // quit with nothing left to write
            SavedState state = std::move(*next_);
            next_.reset();
            busy_ = true;
            lock.unlock();
            std::string error;
            bool ok = save_state(dir_fd_, dir_, state, &error);
            if (ok) {
                failures_.succeeded("the state file is written again");
            } else {
                failures_.failed(error, LogLevel::Error, error);
            }
            lock.lock();
            busy_ = false;
            idle_.notify_all();
        }
    }

    int dir_fd_;       // the state folder as opened at start (Persistence owns it)
    std::string dir_;  // its name, for messages
    std::mutex mutex_;
    std::condition_variable wake_;
    std::condition_variable idle_;
    std::optional<SavedState> next_;
    bool busy_ = false;
    bool quit_ = false;
    FailureLog failures_;  // the writer thread's
    std::thread thread_;  // last: starts after the members it uses exist
};

Persistence::Persistence(std::string state_dir) : dir_(std::move(state_dir)) {}

Persistence::~Persistence() = default;

std::optional<SavedState> Persistence::open(std::string *error) {
    // Opened once, walking from "/" (every folder above owned by root or malld's user and writable
    // by nobody else unless sticky; the folder itself malld's alone, made 0700 with any missing
    // folder above it): every later save and load goes through this descriptor.
    std::string why;
    const int fd = open_private_folder(dir_, ::geteuid(), true, 0700, &why);
    if (fd < 0) {
        *error = "the state folder: " + why + "; " + state_folder_fix();
        return std::nullopt;
    }
    dir_fd_.reset(fd);
    // The history of finished jobs, when it lives here, is appended through the same folder.
    pin_folder(dir_, ::dup(fd));
    if (int removed = remove_stale_state_temp_files(dir_fd_.get()))
        log_info("removed " + std::to_string(removed) + " temporary state file(s) a stopped malld left in " + dir_);
    writer_ = std::make_unique<StateWriter>(dir_fd_.get(), dir_);
    return load_state(dir_fd_.get(), dir_, error);
}

std::string Persistence::state_folder_fix() {
    return std::string("malld keeps its state in a folder of its own, which only malld's user may write, below "
                       "folders only root or malld's user may write (or sticky ones, like /tmp): chown ") +
           (::geteuid() == 0 ? std::string("root:") : std::to_string(::geteuid())) +
           " and chmod 0700 the folder, chmod go-w a folder above it, or pass another --state-dir";
}

void Persistence::adopt(const SavedState &saved, const CpuSet &pool, NodeManager &manager,
                        CpusetBackend &backend, KernelEffects &effects, PidWatcher &pids) {
    if (saved.pool != pool.to_string())
        log_warn("the state file was written for pool '" + saved.pool + "', malld now has '" +
                 pool.to_string() + "': jobs holding cpus outside the new pool are dropped");
    std::map<std::string, CpuSet> reserved;
    for (const auto &[owner, cpus] : saved.reserved)
        if (!(cpus & pool).empty()) reserved[owner] = cpus & pool;
    manager.set_reclaimed(saved.reclaimed & pool, std::move(reserved));
    manager.set_totals(saved.totals);
    bool dropped_any = saved.pool != pool.to_string();
    bool narrowing_any = false;  // a job the kernel lets run wider than the file says (see below)
    for (const SavedJob &sj : saved.jobs) {
        const std::string &id = sj.job.spec.id;
        // Only the very processes that registered: a pid whose start time differs was reused.
        std::vector<pid_t> live, gone;
        int reused = 0;
        for (const SavedPid &p : sj.pids) {
            auto start = process_start_time(p.pid);
            const bool alive = process_alive(p.pid);
            if (alive && start && *start == p.start_time) {
                live.push_back(p.pid);
            } else {
                gone.push_back(p.pid);
                if (alive) ++reused;
            }
        }
        const std::string gone_text =
            "pids " + pid_list_text(gone) + " are gone" +
            (reused ? " (" + std::to_string(reused) + " now belong to other processes)" : "");
        // Accounting goes on from where it was: the job held the same cpus while malld was away
        // (nobody else changes them), so its integrals run on from the saved moment.
        const TimePoint now = Clock::now();
        Job job = sj.job;
        if (sj.has_times) {
            job.registered_at = steady_time(sj.times.registered_at, now);
            job.accounted_until = steady_time(sj.times.accounted_until, now);
            if (sj.times.oversubscribed_since)
                job.oversubscribed_since = steady_time(*sj.times.oversubscribed_since, now);
        } else {
            job.registered_at = job.accounted_until = now;
        }
        if (live.empty()) {
            log_info("job " + id + " ended while malld was away (" + gone_text +
                     "); removing its cgroup");
            manager.close_saved_job(job, "ended while malld was away");  // the totals keep its figures
            backend.remove(id);
            dropped_any = true;
            continue;
        }
        if (!valid_weight(job.spec.weight)) {
            log_warn("job " + id + " was saved with weight " + std::to_string(job.spec.weight) +
                     " (an older malld's bound); it now has " + std::to_string(kMaxWeight) +
                     ", the largest weight allowed (" + kWeightRule + ")");
            job.spec.weight = kMaxWeight;
        }
        // A cgroup path the backend would never have saved (outside its cgroup mount, in malld's
        // own folders): the file was not written by malld. Resizing or giving back such a path
        // would let the file's author steer root's writes: the job is not re-adopted.
        std::string foreign;
        for (const JobCgroup &c : sj.cgroups)
            if (auto why = backend.saved_cgroup_problem(id, c); !why.empty() && foreign.empty())
                foreign = "its saved cgroup '" + c.path.substr(0, 256) + "' " + why;
        if (!foreign.empty()) {
            manager.close_saved_job(job, "not re-adopted");
            log_error("cannot re-adopt job " + id + ": " + foreign +
                      " (a state file malld did not write?); its processes keep running without malleability");
            backend.remove(id);
            dropped_any = true;
            continue;
        }
        job.spec.pids = live;
        job.attachments.clear();
        job.awaiting_ack = false;
        // Its processes reattach and read the page as it is: no ack is owed any more, so an
        // oversubscription from before the restart is over (counted up to the saved moment).
        if (job.oversubscribed_since) {
            if (job.accounted_until > *job.oversubscribed_since)
                job.oversubscribed_seconds +=
                    std::chrono::duration<double>(job.accounted_until - *job.oversubscribed_since).count();
            job.oversubscribed_since.reset();
        }
        // A container job made with mallrun --container: its folder is malld's and the engine's
        // cgroups below it are the job's (an OCI hook's container job is in place instead).
        const bool own_container = job.spec.container &&
                                   std::none_of(sj.cgroups.begin(), sj.cgroups.end(),
                                                [](const JobCgroup &c) { return c.in_place; });
        if (own_container) backend.set_mode(id, CgroupMode::Container);
        backend.adopt(id, live, sj.cgroups, job.cpuset);
        // malld may have been killed after a widening cgroup write but before the state file
        // caught up: the kernel then lets the job run on cpus the file calls free. Those cpus are
        // the job's until malld has narrowed it back to its published cpus (the page says those),
        // as after any shrink, so the policy never gives them to another job meanwhile. Cpus the
        // file gives another job stay that job's, and cpus reclaimed (a Slurm prolog's, reserved
        // for a new job or not) stay free: this job is narrowed off them at once.
        const auto current = backend.current(id, live);
        CpuSet others = manager.reclaimed();
        for (const auto &[owner, cpus] : manager.reserved()) others |= cpus;
        for (const SavedJob &other : saved.jobs)
            if (other.job.spec.id != id) others |= other.job.held();
        for (const auto &[other_id, other] : manager.jobs()) others |= other.held();
        const CpuSet beyond = current ? (*current & pool) - job.held() : CpuSet();
        const CpuSet kept = beyond - others, shared = beyond & others;
        job.cpuset |= kept;
        Outcome outcome = manager.adopt(job);
        if (!outcome.ok) {
            manager.close_saved_job(job, "not re-adopted");  // no longer malld's: the totals keep its figures
            log_error("cannot re-adopt job " + id + ": " + outcome.error +
                      "; its processes keep running without malleability (cgroup removed)");
            backend.remove(id);
            dropped_any = true;
            continue;
        }
        for (const SavedPid &p : sj.pids)
            if (std::find(live.begin(), live.end(), p.pid) != live.end()) pids.remember_start(p.pid, p.start_time);
        std::string page_error;
        if (KernelEffects::JobPage *page = effects.ensure_page(id, &page_error)) {
            if (job.generation > 0)
                effects.write_page(*page, job.generation, job.published, job.published_threads,
                                   job.published_signal_control);
        } else {
            log_error("job " + id + ": " + page_error);
        }
        if (!beyond.empty()) {
            log_warn("job " + id + " can run on cpus '" + beyond.to_string() + "' beyond its saved cpuset '" +
                     (job.cpuset - kept).to_string() + "' (the kernel enforces '" + current->to_string() +
                     "'; malld probably stopped between widening it and saving the state): " +
                     (kept.empty() ? std::string()
                                   : "cpus '" + kept.to_string() + "' stay the job's until it is narrowed to its "
                                     "published cpus '" + job.published.to_string() + "'") +
                     (kept.empty() || shared.empty() ? "" : "; ") +
                     (shared.empty() ? std::string()
                                     : "cpus '" + shared.to_string() + "' are another job's or reclaimed: narrowed to '" +
                                           job.cpuset.to_string() + "' now"));
            narrowing_any = true;
            std::string why;
            if (!shared.empty() && !backend.apply(id, live, job.cpuset, false, &why))
                log_error("job " + id + ": cannot narrow it off cpus '" + shared.to_string() + "': " + why);
        } else if (current && *current != job.cpuset) {
            log_warn("job " + id + ": the kernel enforces '" + current->to_string() +
                     "' but the state file says '" + job.cpuset.to_string() +
                     "'; malld will enforce its own set at the job's next change");
        }
        log_info("re-adopted job " + id + " (pids " + pid_list_text(live) + ", cpus '" +
                 job.published.to_string() + "', generation " + std::to_string(job.generation) + ")" +
                 (beyond.empty() ? " without touching its cpuset" : "") +
                 (gone.empty() ? "" : "; " + gone_text));
    }
    // Cpus of jobs that ended while malld was away are free again, and a job wider in the kernel
    // than in the file is narrowed now (advance() enforces its published cpus): replan.
    if (dropped_any || narrowing_any) manager.set_policy(policy_name(manager.policy()), Clock::now());
}

// Job folders that no adopted job owns are left from a malld that died before its state file
// caught up, or from a deleted state file: their processes are not managed any more, so they go
// back to the root cpuset rather than stay confined to cpus malld may lend to others.
void Persistence::remove_stale_job_cgroups(const NodeManager &manager, CpusetBackend &backend) {
    for (const auto &job : backend.jobs_with_cgroups()) {
        if (manager.find(job)) continue;
        log_warn("removing the cgroup of unknown job " + job + " (" + backend.cgroup_path(job) +
                 "); its processes, if any, go back to the root cpuset");
        backend.remove(job);
    }
}

void Persistence::save_if_changed(const NodeManager &manager, const CpuSet &pool, const PidWatcher &pids,
                                  const CpusetBackend &backend, bool force) {
    SavedState state;
    const TimePoint now = Clock::now();
    state.pool = pool.to_string();
    state.reclaimed = manager.reclaimed();
    state.reserved = manager.reserved();
    state.policy = policy_name(manager.policy());
    for (const auto &[name, job] : manager.jobs()) {
        SavedJob saved;
        saved.job = job;
        NodeManager::account(saved.job, now);  // the figures as of this save
        for (pid_t pid : job.spec.pids) saved.pids.push_back({pid, pids.start_time(pid).value_or(0)});
        saved.cgroups = backend.cgroups_of(name);
        saved.times.registered_at = wall_time(job.registered_at, now);
        saved.times.accounted_until = wall_time(saved.job.accounted_until, now);  // the figures' moment
        if (job.oversubscribed_since) saved.times.oversubscribed_since = wall_time(*job.oversubscribed_since, now);
        saved.has_times = true;
        state.jobs.push_back(std::move(saved));
    }
    state.totals = manager.totals();
    std::string print = state_fingerprint(state);
    if (!force && print == last_saved_) return;
    last_saved_ = std::move(print);
    writer_->submit(std::move(state));
}

void Persistence::flush() {
    if (writer_) writer_->flush();
}

}  // namespace mall
