// server.cpp — malld's epoll loop (see server.hpp). Contract: one loop thread that never blocks on
// a client (non-blocking sends, bounded outboxes, watchers dropped when full) nor on the disk (a
// helper thread writes the state file after every change of jobs/pool/policy); every request
// authorized in authorize() from the request table, every refusal logged with the peer's uid and
// pid; a process death (pidfd) noticed at once.
#include "server.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string_view>
#include <thread>

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

namespace mall {

// ---------------------------------------------------------------------------------------------
// log

namespace {

std::atomic<int> g_log_level{static_cast<int>(LogLevel::Info)};

const char *level_name(LogLevel level) {
    switch (level) {
        case LogLevel::Error: return "error";
        case LogLevel::Warn: return "warn";
        case LogLevel::Info: return "info";
        case LogLevel::Debug: return "debug";
    }
    return "?";
}

}  // namespace

std::optional<LogLevel> parse_log_level(const std::string &name) {
    if (name == "error") return LogLevel::Error;
    if (name == "warn" || name == "warning") return LogLevel::Warn;
    if (name == "info") return LogLevel::Info;
    if (name == "debug") return LogLevel::Debug;
    return std::nullopt;
}

void set_log_level(LogLevel level) { g_log_level.store(static_cast<int>(level)); }

bool log_enabled(LogLevel level) { return static_cast<int>(level) <= g_log_level.load(); }

void log_line(LogLevel level, const std::string &text) {
    if (!log_enabled(level)) return;
    timespec ts{};
    ::clock_gettime(CLOCK_REALTIME, &ts);
    tm local{};
    ::localtime_r(&ts.tv_sec, &local);
    char stamp[48];
    std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &local);
    char millis[24];
    std::snprintf(millis, sizeof millis, ".%03ld", ts.tv_nsec / 1000000);
    std::string line = std::string(stamp) + millis + " malld[" + std::to_string(::getpid()) + "] " +
                       level_name(level) + ": " + text + "\n";
    // One write per line so that lines of concurrent writers never interleave.
    ssize_t rc = ::write(STDERR_FILENO, line.data(), line.size());
    (void)rc;
}

namespace {

void log_error(const std::string &t) { log_line(LogLevel::Error, t); }
void log_warn(const std::string &t) { log_line(LogLevel::Warn, t); }
void log_info(const std::string &t) { log_line(LogLevel::Info, t); }
void log_debug(const std::string &t) { log_line(LogLevel::Debug, t); }

// Warnings a client can trigger at will (refused connections, slow readers, descriptor
// exhaustion) are logged at most once per second per kind, so a flood cannot fill the disk or
// slow the loop down with log writes; the next line says how many were left out.
void log_warn_limited(const std::string &kind, const std::string &text) {
    struct Window {
        std::chrono::steady_clock::time_point last{};
        uint64_t suppressed = 0;
        bool used = false;
    };
    static std::mutex mutex;
    static std::map<std::string, Window> windows;
    const auto now = std::chrono::steady_clock::now();
    std::unique_lock<std::mutex> lock(mutex);
    Window &w = windows[kind];
    if (w.used && now - w.last < std::chrono::seconds(1)) {
        ++w.suppressed;
        return;
    }
    const uint64_t left_out = w.suppressed;
    w.last = now;
    w.used = true;
    w.suppressed = 0;
    lock.unlock();
    log_warn(text + (left_out ? " (" + std::to_string(left_out) + " similar warning(s) left out)" : ""));
}

// Client-supplied text in a log line: at most 128 characters, control characters escaped, so
// that a client can neither forge log lines (newlines) nor blow up the log with 64 KiB names.
constexpr size_t kMaxLoggedText = 128;
std::string log_text(std::string_view text) {
    std::string out;
    const size_t shown = std::min(text.size(), kMaxLoggedText);
    out.reserve(shown + 32);
    for (size_t i = 0; i < shown; ++i) {
        const unsigned char ch = static_cast<unsigned char>(text[i]);
        if (ch == '\n') {
            out += "\\n";
        } else if (ch < 0x20 || ch == 0x7f) {
            char esc[8];
            std::snprintf(esc, sizeof esc, "\\x%02x", ch);
            out += esc;
        } else {
            out += static_cast<char>(ch);
        }
    }
    if (text.size() > shown) out += "...(" + std::to_string(text.size()) + " bytes)";
    return out;
}

// CLOCK_BOOTTIME in clock ticks: the clock of /proc/PID/stat's start time (field 22).
unsigned long long boot_time_ticks() {
    timespec ts{};
    ::clock_gettime(CLOCK_BOOTTIME, &ts);
    const long hz = ::sysconf(_SC_CLK_TCK) > 0 ? ::sysconf(_SC_CLK_TCK) : 100;
    return static_cast<unsigned long long>(ts.tv_sec) * hz +
           static_cast<unsigned long long>(ts.tv_nsec) * hz / 1000000000ull;
}

// The pid a pidfd refers to, from /proc/self/fdinfo ("Pid:" line): -1 once the process has
// exited and been reaped, nullopt when unreadable.
std::optional<long> pidfd_pid(int pidfd) {
    std::ifstream in("/proc/self/fdinfo/" + std::to_string(pidfd));
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("Pid:", 0) != 0) continue;
        try {
            return std::stol(line.substr(4));
        } catch (...) {
            return std::nullopt;
        }
    }
    return std::nullopt;
}

// True when /proc/PID/status names uid as the process's real or effective uid.
bool process_has_uid(pid_t pid, uid_t uid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/status");
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("Uid:", 0) != 0) continue;
        std::istringstream fields(line.substr(4));
        unsigned long real = 0, effective = 0;
        if (!(fields >> real >> effective)) return false;
        return real == uid || effective == uid;
    }
    return false;
}

// epoll tags: the kind of source in the top byte, its id below.
constexpr uint64_t kTagShift = 56;
constexpr uint64_t kIdMask = (uint64_t{1} << kTagShift) - 1;
enum : uint64_t { kListenTag = 1, kSignalTag = 2, kConnectionTag = 3, kPidTag = 4, kSlurmTag = 5 };
uint64_t make_tag(uint64_t kind, uint64_t id) { return (kind << kTagShift) | (id & kIdMask); }

constexpr size_t kMaxOutbox = 64;          // replies queued for a slow reader before we drop it
constexpr size_t kMaxOutboxBytes = 1 << 20;  // ... and their bytes (Status replies can be large)
constexpr size_t kMaxConnections = 4096;
// One ordinary user cannot take every connection (or malld's descriptors): admins are exempt.
constexpr int kMaxConnectionsPerUid = 64;
// A connection that is not attached, not watching and not waiting for a deferred reply has no
// reason to stay silent this long: it only holds a descriptor.
constexpr auto kIdleTimeout = std::chrono::seconds(30);
constexpr int kRefusalLogsPerSecond = 5;  // per connection
constexpr int kPacketsPerWakeup = 32;      // fairness between connections
constexpr auto kDeferredReplySlack = std::chrono::seconds(5);
constexpr auto kPidPollInterval = std::chrono::seconds(1);  // only without pidfd_open

std::string pid_list_text(const std::vector<pid_t> &pids) {
    std::string s;
    for (pid_t p : pids) s += (s.empty() ? "" : ",") + std::to_string(p);
    return s;
}

std::optional<pid_t> parent_pid(pid_t pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    size_t close = text.rfind(')');
    if (close == std::string::npos) return std::nullopt;
    std::istringstream fields(text.substr(close + 1));
    std::string state;
    long ppid = 0;
    if (!(fields >> state >> ppid)) return std::nullopt;
    return static_cast<pid_t>(ppid);
}

// True when pid is one of `pids` or descends from one (walks the parent chain in /proc).
bool in_process_tree(pid_t pid, const std::vector<pid_t> &pids) {
    pid_t cur = pid;
    for (int depth = 0; depth < 512 && cur > 0; ++depth) {
        if (std::find(pids.begin(), pids.end(), cur) != pids.end()) return true;
        if (cur == 1) return false;
        auto parent = parent_pid(cur);
        if (!parent || *parent == cur) return false;
        cur = *parent;
    }
    return false;
}

uint32_t raw_request_id(const std::string &packet) {
    if (packet.size() < proto::kHeaderSize) return 0;
    uint32_t id = 0;
    std::memcpy(&id, packet.data() + 12, sizeof id);
    return id;
}

bool make_folders(const std::string &path) {
    for (size_t pos = 1; pos <= path.size(); ++pos) {
        if (pos != path.size() && path[pos] != '/') continue;
        std::string prefix = path.substr(0, pos);
        if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) return false;
    }
    return true;
}

double epoch_seconds() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The state file is written on a thread of its own: fsync takes milliseconds on a disk, and the
// loop must not make a job's ack (or anyone else) wait for it. Snapshots coalesce: only the newest
// pending one is written. flush() waits until the newest snapshot is on disk (clean stop).

class StateWriter {
public:
    explicit StateWriter(std::string dir) : dir_(std::move(dir)), thread_([this] { loop(); }) {}
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
            bool ok = save_state(dir_, state, &error);
            if (!ok && error != last_error_) log_error(error);  // once per distinct failure
            if (ok && !last_error_.empty()) log_info("the state file is written again");
            last_error_ = ok ? std::string() : error;
            lock.lock();
            busy_ = false;
            idle_.notify_all();
        }
    }

    std::string dir_;
    std::mutex mutex_;
    std::condition_variable wake_;
    std::condition_variable idle_;
    std::optional<SavedState> next_;
    bool busy_ = false;
    bool quit_ = false;
    std::string last_error_;
    std::thread thread_;  // last: starts after the members it uses exist
};

// ---------------------------------------------------------------------------------------------
// The request table: each message type, its handler, and the role a peer needs to send it.
//   admin:    root, malld's own euid, or an --admin-uid. Only admins move cpus between jobs.
//   owner:    Attach. The peer's uid owns the job (or is an admin) and the peer process is one of
//             the job's registered processes or descends from one.
//   attached: Ack, Progress and Usage, only on the connection that attached (so a process can
//             only acknowledge and report for the job it proved it belongs to).
//   any:      read-only requests.
const Server::RequestRule Server::kRequestTable[] = {
    {proto::Type::Register, Role::Admin, &Server::handle_register},
    {proto::Type::Deregister, Role::Admin, &Server::handle_deregister},
    {proto::Type::Attach, Role::Owner, &Server::handle_attach},
    {proto::Type::Ack, Role::Attached, &Server::handle_ack},
    {proto::Type::Progress, Role::Attached, &Server::handle_progress},
    {proto::Type::Status, Role::Any, &Server::handle_status},
    {proto::Type::Set, Role::Admin, &Server::handle_set},
    {proto::Type::Policy, Role::Admin, &Server::handle_policy},
    {proto::Type::Reclaim, Role::Admin, &Server::handle_reclaim},
    {proto::Type::Release, Role::Admin, &Server::handle_release},
    {proto::Type::Watch, Role::Any, &Server::handle_watch},
    {proto::Type::Usage, Role::Attached, &Server::handle_usage},
};

// ---------------------------------------------------------------------------------------------
// set-up and tear-down

Server::Server(ServerOptions options, const Topology &topology, CpuSet pool,
               std::unique_ptr<CpusetBackend> backend)
    : options_(std::move(options)),
      topology_(topology),
      pool_(std::move(pool)),
      backend_(std::move(backend)) {}

Server::~Server() {
    state_writer_.reset();  // writes what is pending, then joins
    for (auto &[job, page] : pages_)
        if (page.page) ::munmap(page.page, kSharedPageSize);
    pages_.clear();
    if (listening_) ::unlink(options_.socket_path.c_str());
}

bool Server::start(std::string *error) {
    auto fail = [&](const std::string &text) {
        if (error) *error = text;
        return false;
    };
    ::signal(SIGPIPE, SIG_IGN);
    // Block the stop signals before any thread exists (the state writer's inherits the mask), so
    // they only ever arrive through the signalfd and never kill malld uncleanly.
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGTERM);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGHUP);
    if (::pthread_sigmask(SIG_BLOCK, &signals, nullptr) != 0)
        return fail(std::string("cannot block signals: ") + std::strerror(errno));

    // The socket first: a second malld must fail here, before it touches state or cgroups.
    std::string why;
    int lfd = unix_listen(options_.socket_path, options_.socket_mode, &why);
    if (lfd < 0) {
        if (errno == EADDRINUSE)
            return fail("a live malld (or another program) is listening on " +
                        options_.socket_path + "; stop it first or pass another --socket");
        return fail("cannot listen on " + options_.socket_path + ": " + why);
    }
    listen_fd_.reset(lfd);
    listening_ = true;
    ::fcntl(lfd, F_SETFL, ::fcntl(lfd, F_GETFL) | O_NONBLOCK);
    // No client may push descriptors on malld: closing a peer-chosen file can block the loop.
    // Set on the listener so that it already holds for packets sent before accept().
    if (!refuse_passed_descriptors(lfd))
        log_info(std::string("this kernel cannot refuse passed descriptors (SO_PASSRIGHTS: ") +
                 std::strerror(errno) + "); malld closes any it gets on a helper thread");
    // A descriptor in reserve: when malld runs out, it frees this one to accept and close the
    // next connection, instead of leaving it pending (the listener would wake the loop forever).
    spare_fd_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));

    if (!make_folders(options_.state_dir))
        return fail("cannot create the state folder " + options_.state_dir + ": " +
                    std::strerror(errno) + "; create it or pass another --state-dir");
    state_writer_ = std::make_unique<StateWriter>(options_.state_dir);
    std::string load_error;
    std::optional<SavedState> saved = load_state(options_.state_dir, &load_error);
    if (!saved && !load_error.empty()) return fail(load_error);

    PolicyKind policy = options_.policy;
    if (saved && !options_.policy_given) {
        if (auto p = parse_policy(saved->policy)) {
            if (*p != policy) log_info("policy " + saved->policy + " restored from the state file");
            policy = *p;
        }
    }
    Effects &effects = *this;  // private base: convert here, where it is accessible
    manager_ = std::make_unique<NodeManager>(topology_, pool_, policy, options_.ack_timeout, effects);

    std::string backend_error;
    if (!backend_->start(pool_, &backend_error)) return fail(backend_error);

    if (saved) adopt_saved_jobs(*saved);
    remove_stale_job_cgroups();

    signal_fd_.reset(::signalfd(-1, &signals, SFD_NONBLOCK | SFD_CLOEXEC));
    if (!signal_fd_) return fail(std::string("signalfd failed: ") + std::strerror(errno));

    epoll_fd_.reset(::epoll_create1(EPOLL_CLOEXEC));
    if (!epoll_fd_) return fail(std::string("epoll_create1 failed: ") + std::strerror(errno));
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = make_tag(kListenTag, 0);
    if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, listen_fd_.get(), &ev) != 0)
        return fail(std::string("epoll_ctl failed: ") + std::strerror(errno));
    ev.data.u64 = make_tag(kSignalTag, 0);
    if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, signal_fd_.get(), &ev) != 0)
        return fail(std::string("epoll_ctl failed: ") + std::strerror(errno));
    if (slurm_) {
        ev.data.u64 = make_tag(kSlurmTag, 0);
        if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, slurm_->fd(), &ev) != 0)
            return fail(std::string("epoll_ctl failed: ") + std::strerror(errno));
        check_slurm_jobs(Clock::now());  // re-adopted registrations are checked at once
    }

    sync_pid_watches();
    save_state_if_changed(true);
    log_info("listening on " + options_.socket_path + " (mode " +
             [&] {
                 char b[8];
                 std::snprintf(b, sizeof b, "%04o", options_.socket_mode);
                 return std::string(b);
             }() +
             "), state in " + options_.state_dir + ", " +
             std::to_string(manager_->jobs().size()) + " job(s)");
    return true;
}

void Server::adopt_saved_jobs(const SavedState &saved) {
    if (saved.pool != pool_.to_string())
        log_warn("the state file was written for pool '" + saved.pool + "', malld now has '" +
                 pool_.to_string() + "': jobs holding cpus outside the new pool are dropped");
    std::map<std::string, CpuSet> reserved;
    for (const auto &[owner, cpus] : saved.reserved)
        if (!(cpus & pool_).empty()) reserved[owner] = cpus & pool_;
    manager_->set_reclaimed(saved.reclaimed & pool_, std::move(reserved));
    bool dropped_any = saved.pool != pool_.to_string();
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
        if (live.empty()) {
            log_info("job " + id + " ended while malld was away (" + gone_text +
                     "); removing its cgroup");
            backend_->remove(id);
            dropped_any = true;
            continue;
        }
        Job job = sj.job;
        job.spec.pids = live;
        job.attachments.clear();
        job.awaiting_ack = false;
        Outcome outcome = manager_->adopt(job);
        if (!outcome.ok) {
            log_error("cannot re-adopt job " + id + ": " + outcome.error +
                      "; its processes keep running without malleability (cgroup removed)");
            backend_->remove(id);
            dropped_any = true;
            continue;
        }
        for (const SavedPid &p : sj.pids)
            if (std::find(live.begin(), live.end(), p.pid) != live.end()) start_times_[p.pid] = p.start_time;
        std::string page_error;
        if (JobPage *page = ensure_page(id, &page_error)) {
            if (job.generation > 0) write_page(*page, job.generation, job.published);
        } else {
            log_error("job " + id + ": " + page_error);
        }
        auto current = backend_->current(id, live);
        // malld may have been killed after a widening cgroup write but before the state file
        // caught up: the job then runs on cpus malld believes free and may lend to another job.
        if (current && !(*current - job.cpuset).empty())
            log_warn("job " + id + " can run on cpus '" + (*current - job.cpuset).to_string() +
                     "' beyond its saved cpuset '" + job.cpuset.to_string() + "' (the kernel enforces '" +
                     current->to_string() + "'; malld probably stopped between widening it and "
                     "saving the state)");
        else if (current && *current != job.cpuset)
            log_warn("job " + id + ": the kernel enforces '" + current->to_string() +
                     "' but the state file says '" + job.cpuset.to_string() +
                     "'; malld will enforce its own set at the job's next change");
        log_info("re-adopted job " + id + " (pids " + pid_list_text(live) + ", cpus '" +
                 job.published.to_string() + "', generation " + std::to_string(job.generation) +
                 ") without touching its cpuset" +
                 (gone.empty() ? "" : "; " + gone_text));
    }
    // Cpus of jobs that ended while malld was away are free again: let the policy lend them.
    if (dropped_any) manager_->set_policy(policy_name(manager_->policy()), Clock::now());
}

// Job folders that no adopted job owns are left from a malld that died before its state file
// caught up, or from a deleted state file: their processes are not managed any more, so they go
// back to the root cpuset rather than stay confined to cpus malld may lend to others.
void Server::remove_stale_job_cgroups() {
    const std::string probe = backend_->cgroup_path("x");
    if (probe.empty()) return;
    const std::string parent = probe.substr(0, probe.rfind('/'));
    DIR *dir = ::opendir(parent.c_str());
    if (!dir) return;
    std::vector<std::string> stale;
    while (dirent *e = ::readdir(dir)) {
        std::string name = e->d_name;
        if (name.rfind("job_", 0) != 0) continue;
        std::string job = name.substr(4);
        if (!manager_->find(job) && backend_->cgroup_path(job) == parent + "/" + name)
            stale.push_back(job);
    }
    ::closedir(dir);
    for (const auto &job : stale) {
        log_warn("removing the cgroup of unknown job " + job + " (" + backend_->cgroup_path(job) +
                 "); its processes, if any, go back to the root cpuset");
        backend_->remove(job);
    }
}

int Server::run() {
    epoll_event events[64];
    while (!stopping_) {
        int timeout = next_timeout_ms();
        int n = ::epoll_wait(epoll_fd_.get(), events, 64, timeout);
        if (n < 0) {
            if (errno == EINTR) continue;
            log_error(std::string("epoll_wait failed: ") + std::strerror(errno) + "; stopping");
            break;
        }
        for (int i = 0; i < n; ++i) {
            uint64_t kind = events[i].data.u64 >> kTagShift;
            uint64_t id = events[i].data.u64 & kIdMask;
            switch (kind) {
                case kListenTag: handle_listen(); break;
                case kSignalTag: handle_signal(); break;
                case kConnectionTag: handle_connection(id, events[i].events); break;
                case kPidTag: handle_pid_exit(id); break;
                case kSlurmTag: handle_slurm_results(); break;
                default: break;
            }
        }
        after_events();
    }
    stop_cleanly();
    return 0;
}

void Server::stop_cleanly() {
    log_info("stopping: the state file keeps " + std::to_string(manager_->jobs().size()) +
             " running job(s) for the next malld");
    save_state_if_changed(true);
    state_writer_->flush();
    for (auto &[id, c] : connections_) {
        ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, c.fd.get(), nullptr);
        c.fd.reset();
    }
    connections_.clear();
    pid_watches_.clear();
    backend_->stop();
    if (listening_) {
        ::unlink(options_.socket_path.c_str());
        listening_ = false;
    }
    listen_fd_.reset();
    log_info("stopped");
}

int Server::next_timeout_ms() const {
    const TimePoint now = Clock::now();
    std::optional<TimePoint> next = manager_->next_deadline();
    auto consider = [&](TimePoint t) {
        if (!next || t < *next) next = t;
    };
    for (const auto &p : pending_) consider(p.deadline);
    for (const auto &[id, w] : pid_watches_)
        if (!w.pidfd) {
            consider(next_pid_poll_);
            break;
        }
    std::set<uint64_t> waiting;
    for (const auto &p : pending_) waiting.insert(p.connection);
    for (const auto &[id, c] : connections_)
        if (c.job.empty() && !c.watcher && !waiting.count(id)) consider(c.last_activity + kIdleTimeout);
    if (slurm_) consider(next_slurm_check_);
    if (!next) return -1;
    if (*next <= now) return 0;
    auto left = std::chrono::duration_cast<std::chrono::microseconds>(*next - now).count();
    int64_t ms = (left + 999) / 1000;  // round up: waking early would only spin
    return static_cast<int>(std::min<int64_t>(ms, 60000));
}

void Server::after_events() {
    const TimePoint now = Clock::now();
    manager_->tick(now);
    if (now >= next_pid_poll_) poll_unwatched_pids();
    if (slurm_ && now >= next_slurm_check_) check_slurm_jobs(now);
    sync_pid_watches();
    process_pending_replies(Clock::now());
    close_idle_connections(Clock::now());
    // Closing a connection detaches it, which may finish a transition, end a deferred request or
    // drop a watcher in turn: repeat until nothing is left to close.
    for (int round = 0; round < 16; ++round) {
        std::vector<uint64_t> closing;
        for (auto &[id, c] : connections_)
            if (c.closing) closing.push_back(id);
        if (closing.empty()) break;
        for (uint64_t id : closing) {
            auto it = connections_.find(id);
            if (it != connections_.end()) close_connection(it->second);
        }
        process_pending_replies(Clock::now());
    }
    save_state_if_changed();
}

// Connections that are not attached, not watching and not waiting for a deferred reply, and
// have sent nothing for kIdleTimeout, are closed: they only hold one of malld's descriptors.
void Server::close_idle_connections(TimePoint now) {
    std::set<uint64_t> waiting;
    for (const auto &p : pending_) waiting.insert(p.connection);
    for (auto &[id, c] : connections_) {
        if (c.closing || !c.job.empty() || c.watcher || waiting.count(id)) continue;
        if (now - c.last_activity < kIdleTimeout) continue;
        log_debug("closing connection " + std::to_string(id) + " (uid " + std::to_string(c.peer.uid) +
                  " pid " + std::to_string(c.peer.pid) + "): idle for " +
                  std::to_string(std::chrono::duration_cast<std::chrono::seconds>(kIdleTimeout).count()) + " s");
        c.closing = true;
    }
}

// Out of descriptors (EMFILE/ENFILE): the pending connection would keep the listener readable
// and the loop spinning. Free the spare descriptor, accept that connection and close it at once.
void Server::accept_and_drop_one() {
    spare_fd_.reset();
    int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    PeerCred peer;
    if (fd >= 0) {
        peer_credentials(fd, &peer);
        ::close(fd);
    }
    spare_fd_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    log_warn_limited("emfile", "out of file descriptors (" + std::to_string(connections_.size()) +
                                   " connections open): refused a connection from uid " +
                                   std::to_string(peer.uid) + " pid " + std::to_string(peer.pid) +
                                   "; raise malld's open-file limit (ulimit -n / LimitNOFILE)");
}

// ---------------------------------------------------------------------------------------------
// sources

void Server::handle_listen() {
    for (int accepted = 0; accepted < 256; ++accepted) {  // bounded: other sources get their turn
        int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR) continue;
            if ((errno == EMFILE || errno == ENFILE) && spare_fd_) {
                accept_and_drop_one();
                continue;
            }
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                log_warn_limited("accept", std::string("accept failed: ") + std::strerror(errno));
            return;
        }
        UniqueFd owned(fd);
        // Also set on the listener (inherited); repeated here in case the kernel does not pass it on.
        refuse_passed_descriptors(fd);
        PeerCred peer;
        if (!peer_credentials(fd, &peer)) {
            log_warn_limited("credentials", std::string("cannot read the credentials of a new client: ") +
                                                std::strerror(errno) + "; closing it");
            continue;
        }
        if (connections_.size() >= kMaxConnections) {
            log_warn_limited("connections", "refused a connection from uid " + std::to_string(peer.uid) +
                                                " pid " + std::to_string(peer.pid) + ": " +
                                                std::to_string(kMaxConnections) +
                                                " connections are open already");
            continue;
        }
        if (!is_admin(peer.uid) && connections_per_uid_[peer.uid] >= kMaxConnectionsPerUid) {
            log_warn_limited("connections-per-uid",
                             "refused a connection from uid " + std::to_string(peer.uid) + " pid " +
                                 std::to_string(peer.pid) + ": that user has " +
                                 std::to_string(kMaxConnectionsPerUid) +
                                 " connections to malld open already (the limit per non-admin user)");
            continue;
        }
        // The peer process itself, taken now: its pid may be reused before it sends Attach.
        UniqueFd pidfd(peer_pidfd(fd));
        const int pidfd_error = pidfd ? 0 : errno;
        if (!pidfd && pidfd_error == ESRCH) {
            log_debug("connection from uid " + std::to_string(peer.uid) + " pid " +
                      std::to_string(peer.pid) + " closed: that process has exited already");
            continue;
        }
        uint64_t id = next_connection_id_++;
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.u64 = make_tag(kConnectionTag, id);
        if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
            log_warn(std::string("epoll_ctl failed for a new client: ") + std::strerror(errno));
            continue;
        }
        Connection &c = connections_[id];
        c.id = id;
        c.fd = std::move(owned);
        c.peer = peer;
        c.peer_pidfd = std::move(pidfd);
        c.accepted_ticks = boot_time_ticks();
        c.last_activity = Clock::now();
        ++connections_per_uid_[peer.uid];
        log_debug("connection " + std::to_string(id) + " from uid " + std::to_string(peer.uid) +
                  " pid " + std::to_string(peer.pid));
    }
}

void Server::handle_signal() {
    signalfd_siginfo info{};
    while (::read(signal_fd_.get(), &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
        if (info.ssi_signo == SIGHUP) {
            log_info("SIGHUP ignored: malld logs to stderr and reads no configuration file");
            continue;
        }
        log_info(std::string("received ") + (info.ssi_signo == SIGTERM ? "SIGTERM" : "SIGINT") +
                 " from pid " + std::to_string(info.ssi_pid));
        stopping_ = true;
    }
}

void Server::handle_connection(uint64_t id, uint32_t events) {
    auto it = connections_.find(id);
    if (it == connections_.end()) return;
    Connection &c = it->second;
    if (events & EPOLLOUT) flush_outbox(c);
    if (!(events & (EPOLLIN | EPOLLHUP | EPOLLERR))) return;
    for (int k = 0; k < kPacketsPerWakeup && !c.closing; ++k) {
        std::string packet;
        // Clients have no business passing descriptors: recv_packet closes any (off this thread,
        // since a close can block) when we ask for none.
        ssize_t n = recv_packet(c.fd.get(), &packet, proto::kMaxPacket, nullptr, true);
        if (n > 0) {
            c.last_activity = Clock::now();
            handle_packet(c, packet);
            continue;
        }
        if (n == 0) {  // hang-up (a client may leave in the middle of a request: fine)
            c.closing = true;
            break;
        }
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        if (errno == EMSGSIZE) {
            std::string text = "packet larger than " + std::to_string(proto::kMaxPacket) +
                               " bytes; closing the connection";
            log_warn_limited("malformed", "malformed packet from uid " + std::to_string(c.peer.uid) +
                                              " pid " + std::to_string(c.peer.pid) + ": " + text);
            reply_error(c, raw_request_id(packet), MALL_ERR_PROTOCOL, text);
        }
        c.closing = true;
        break;
    }
}

void Server::handle_pid_exit(uint64_t watch_id) {
    auto it = pid_watches_.find(watch_id);
    if (it == pid_watches_.end()) return;
    const std::string job = it->second.job;
    const pid_t pid = it->second.pid;
    if (it->second.pidfd) ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, it->second.pidfd.get(), nullptr);
    pid_watches_.erase(it);
    start_times_.erase(pid);
    log_info("process " + std::to_string(pid) + " of job " + job + " exited");
    if (manager_->find(job)) manager_->remove_pid(job, pid, Clock::now());
}

void Server::close_connection(Connection &c) {
    const uint64_t id = c.id;
    const std::string job = c.job;
    const uint64_t attach_id = c.attach_id;
    if (c.fd) ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, c.fd.get(), nullptr);
    log_debug("connection " + std::to_string(id) + " (uid " + std::to_string(c.peer.uid) + " pid " +
              std::to_string(c.peer.pid) + ") closed");
    if (auto count = connections_per_uid_.find(c.peer.uid);
        count != connections_per_uid_.end() && --count->second <= 0)
        connections_per_uid_.erase(count);
    connections_.erase(id);
    // After the erase: detaching may publish or emit events that look at the connections.
    if (!job.empty()) manager_->detach(job, attach_id, Clock::now());
}

// ---------------------------------------------------------------------------------------------
// sending

bool Server::send_message(Connection &c, proto::Type type, uint32_t request_id,
                          const nlohmann::json &body, int pass_fd, bool droppable) {
    if (c.closing || !c.fd) return false;
    proto::Message msg;
    msg.type = type;
    msg.request_id = request_id;
    msg.body = body;
    std::string data;
    try {
        data = proto::encode(msg);
    } catch (const std::exception &e) {
        msg.body = proto::error_reply(MALL_ERR_SYSTEM, std::string("reply too large: ") + e.what());
        data = proto::encode(msg);
    }
    if (c.outbox.empty()) {
        if (send_packet(c.fd.get(), data, pass_fd, true)) return true;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            c.closing = true;  // the peer is gone
            return false;
        }
    }
    if (droppable) return false;
    if (c.outbox.size() >= kMaxOutbox || c.outbox_bytes + data.size() > kMaxOutboxBytes) {
        log_warn_limited("slow-reader", "client uid " + std::to_string(c.peer.uid) + " pid " +
                                            std::to_string(c.peer.pid) +
                                            " does not read its replies; closing its connection");
        c.closing = true;
        return false;
    }
    Outgoing out;
    c.outbox_bytes += data.size();
    out.data = std::move(data);
    if (pass_fd >= 0) out.fd.reset(::fcntl(pass_fd, F_DUPFD_CLOEXEC, 0));
    c.outbox.push_back(std::move(out));
    if (!c.want_write) {
        epoll_event ev{};
        ev.events = EPOLLIN | EPOLLOUT;
        ev.data.u64 = make_tag(kConnectionTag, c.id);
        ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_MOD, c.fd.get(), &ev);
        c.want_write = true;
    }
    return true;
}

void Server::flush_outbox(Connection &c) {
    while (!c.outbox.empty() && !c.closing) {
        Outgoing &out = c.outbox.front();
        if (!send_packet(c.fd.get(), out.data, out.fd ? out.fd.get() : -1, true)) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            c.closing = true;
            return;
        }
        c.outbox_bytes -= std::min(c.outbox_bytes, out.data.size());
        c.outbox.pop_front();
    }
    if (c.want_write && !c.closing) {
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.u64 = make_tag(kConnectionTag, c.id);
        ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_MOD, c.fd.get(), &ev);
        c.want_write = false;
    }
}

void Server::reply(Connection &c, uint32_t request_id, const nlohmann::json &body, int pass_fd) {
    send_message(c, proto::Type::Reply, request_id, body, pass_fd, false);
}

void Server::reply_error(Connection &c, uint32_t request_id, int code, const std::string &text) {
    reply(c, request_id, proto::error_reply(code, text));
}

// ---------------------------------------------------------------------------------------------
// decoding, authorization, dispatch

void Server::handle_packet(Connection &c, const std::string &packet) {
    std::string why;
    std::optional<proto::Message> msg = proto::decode(packet, &why);
    if (!msg) {
        // A peer that sends garbage loses its connection; everyone else is unaffected.
        log_warn_limited("malformed", "malformed packet from uid " + std::to_string(c.peer.uid) +
                                          " pid " + std::to_string(c.peer.pid) + ": " + log_text(why) +
                                          "; closing that connection");
        reply_error(c, raw_request_id(packet), MALL_ERR_PROTOCOL, why);
        c.closing = true;
        return;
    }
    const RequestRule *rule = nullptr;
    for (const auto &r : kRequestTable)
        if (r.type == msg->type) rule = &r;
    if (!rule) {
        std::string text = std::string("message type ") + proto::type_name(msg->type) +
                           " is not a request a client may send";
        log_warn_limited("protocol", "protocol error from uid " + std::to_string(c.peer.uid) + " pid " +
                                         std::to_string(c.peer.pid) + ": " + text +
                                         "; closing that connection");
        reply_error(c, msg->request_id, MALL_ERR_PROTOCOL, text);
        c.closing = true;
        return;
    }
    int code = MALL_ERR_DENIED;
    if (!authorize(c, *rule, *msg, &code, &why)) {
        if (may_log_refusal(c))
            log_warn(std::string("refused ") + proto::type_name(msg->type) + " from uid " +
                     std::to_string(c.peer.uid) + " pid " + std::to_string(c.peer.pid) + ": " +
                     log_text(why));
        reply_error(c, msg->request_id, code, why);
        return;
    }
    if (log_enabled(LogLevel::Debug))
        log_debug(std::string("request ") + proto::type_name(msg->type) + " from uid " +
                  std::to_string(c.peer.uid) + " pid " + std::to_string(c.peer.pid) + ": " +
                  log_text(msg->body.dump()));
    try {
        (this->*rule->handler)(c, *msg);
    } catch (const proto::ProtocolError &e) {
        reply_error(c, msg->request_id, MALL_ERR_INVAL,
                    std::string(proto::type_name(msg->type)) + ": " + e.what());
    } catch (const std::exception &e) {
        reply_error(c, msg->request_id, MALL_ERR_INVAL,
                    std::string(proto::type_name(msg->type)) + ": bad request: " + e.what());
    }
}

bool Server::is_admin(uid_t uid) const {
    return uid == 0 || uid == ::geteuid() || options_.admin_uids.count(uid) != 0;
}

// Refusals are logged (with uid and pid), but at most a few per second per connection: a client
// looping on a refused request must not flood the log.
bool Server::may_log_refusal(Connection &c) {
    const TimePoint now = Clock::now();
    if (now - c.refusal_log_window >= std::chrono::seconds(1)) {
        c.refusal_log_window = now;
        c.refusals_logged = 0;
    }
    return ++c.refusals_logged <= kRefusalLogsPerSecond;
}

// SO_PEERCRED's pid was taken at connect time: by now that process may have exited and its pid
// been given to another process, which must not be taken for the peer (owner check, self-
// registration). With SO_PEERPIDFD the pidfd names the peer itself: its pid in fdinfo must still
// be the credential pid (-1 once it has exited). Without it, the process now holding the pid must
// have started no later than the connection was accepted and run as the peer's uid.
bool Server::peer_still_connected_process(const Connection &c, std::string *why) const {
    const std::string pid = std::to_string(c.peer.pid);
    if (c.peer_pidfd) {
        auto now_pid = pidfd_pid(c.peer_pidfd.get());
        if (!now_pid) {
            *why = "cannot read the pidfd of process " + pid + " (/proc/self/fdinfo)";
            return false;
        }
        if (*now_pid != c.peer.pid) {
            *why = "process " + pid + " that opened this connection has exited";
            return false;
        }
        return true;
    }
    auto start = process_start_time(c.peer.pid);
    if (!start || !process_alive(c.peer.pid)) {
        *why = "process " + pid + " that opened this connection has exited";
        return false;
    }
    if (*start > c.accepted_ticks) {
        *why = "process " + pid + " started after this connection was opened: the connecting "
               "process has exited and its pid was reused";
        return false;
    }
    if (!process_has_uid(c.peer.pid, c.peer.uid)) {
        *why = "process " + pid + " no longer runs as uid " + std::to_string(c.peer.uid) +
               ": the connecting process has exited and its pid was reused";
        return false;
    }
    return true;
}

// Authorization lives here and only here: every request passes through this function before its
// handler runs, so the request table above is malld's whole access policy and no handler can forget
// a check. Identities come from SO_PEERCRED (kernel-verified), never from the message body.
bool Server::authorize(const Connection &c, const RequestRule &rule, const proto::Message &msg,
                       int *code, std::string *why) const {
    const std::string type = proto::type_name(rule.type);
    *code = MALL_ERR_DENIED;
    switch (rule.role) {
        case Role::Any:
            return true;
        case Role::Admin:
            if (is_admin(c.peer.uid)) return true;
            *why = type + " needs root or an admin uid (malld --admin-uid); uid " +
                   std::to_string(c.peer.uid) + " is neither";
            return false;
        case Role::Attached:
            if (!c.job.empty() && manager_->find(c.job)) return true;
            *why = type + " is only accepted on a connection attached to a job (send Attach first)";
            return false;
        case Role::Owner: {
            if (!c.job.empty()) {
                *code = MALL_ERR_INVAL;
                *why = "this connection is already attached to job " + c.job;
                return false;
            }
            // Both ways to attach act on the peer's pid: it must still be the connecting process.
            std::string gone;
            if (!peer_still_connected_process(c, &gone)) {
                *why = gone + "; reconnect and attach again";
                return false;
            }
            auto field = msg.body.find("job");
            if (field == msg.body.end() || field->is_null()) {
                if (options_.allow_self_register) return true;
                *code = MALL_ERR_NOJOB;
                *why = "no job given and self-registration is off: start the process with mallrun "
                       "(which sets MALL_JOB_ID) or run malld with --allow-self-register";
                return false;
            }
            if (!field->is_string()) {
                *code = MALL_ERR_INVAL;
                *why = "field \"job\" must be a string";
                return false;
            }
            const std::string name = field->get<std::string>();
            // Validated before the name is echoed into the reply or the log.
            if (auto bad = proto::invalid_job_name(name)) {
                *code = MALL_ERR_INVAL;
                *why = "bad job name in field \"job\": " + *bad;
                return false;
            }
            const Job *job = manager_->find(name);
            if (!job) {
                *code = MALL_ERR_NOJOB;
                *why = "no job named \"" + name + "\" is registered (MALL_JOB_ID is stale or the "
                       "job has ended)";
                return false;
            }
            if (c.peer.uid != job->spec.uid && !is_admin(c.peer.uid)) {
                *why = "job " + name + " belongs to uid " + std::to_string(job->spec.uid) +
                       "; uid " + std::to_string(c.peer.uid) + " may not attach to it";
                return false;
            }
            if (!in_process_tree(c.peer.pid, job->spec.pids)) {
                *why = "process " + std::to_string(c.peer.pid) + " is not a process of job " + name +
                       " (pids " + pid_list_text(job->spec.pids) + ") nor a descendant of one";
                return false;
            }
            return true;
        }
    }
    *why = "unknown role";
    return false;
}

// ---------------------------------------------------------------------------------------------
// handlers

void Server::handle_register(Connection &c, const proto::Message &msg) {
    const nlohmann::json &body = msg.body;
    JobSpec spec;
    spec.id = proto::get_string(body, "job");
    if (auto bad = proto::invalid_job_name(spec.id)) throw proto::ProtocolError("bad job name: " + *bad);
    spec.uid = static_cast<uid_t>(proto::get_int(body, "uid", 0, 0xFFFFFFFEll));
    spec.min = static_cast<int>(proto::get_int(body, "min", 0, CpuSet::kMaxCpus));
    spec.max = static_cast<int>(proto::get_int(body, "max", 1, CpuSet::kMaxCpus));
    auto pids = body.find("pids");
    if (pids == body.end() || !pids->is_array() || pids->empty())
        throw proto::ProtocolError("field \"pids\" must be a non-empty array of process ids");
    for (const auto &p : *pids) {
        if (!p.is_number_integer() || p.get<int64_t>() <= 0 || p.get<int64_t>() > INT_MAX)
            throw proto::ProtocolError("field \"pids\" must hold positive process ids, got " + p.dump());
        pid_t pid = static_cast<pid_t>(p.get<int64_t>());
        if (std::find(spec.pids.begin(), spec.pids.end(), pid) == spec.pids.end()) spec.pids.push_back(pid);
    }
    if (auto g = proto::get_optional_string(body, "guaranteed")) {
        std::string why;
        auto set = CpuSet::parse(*g, &why);
        if (!set) throw proto::ProtocolError("field \"guaranteed\": " + why);
        spec.guaranteed = *set;
    }
    if (auto w = body.find("weight"); w != body.end()) {
        if (!w->is_number()) throw proto::ProtocolError("field \"weight\" must be a number");
        spec.weight = w->get<double>();
    }
    // "join": a further task of a job already registered on this node (several Slurm tasks of one
    // job share its allocation) adds its pids instead of being refused as a duplicate.
    auto join = body.find("join");
    if (join != body.end() && !join->is_boolean()) throw proto::ProtocolError("field \"join\" must be true or false");
    const bool joining = join != body.end() && join->get<bool>() && manager_->find(spec.id) != nullptr;
    std::map<pid_t, unsigned long long> starts;
    for (pid_t pid : spec.pids) {
        auto start = process_start_time(pid);
        if (!process_alive(pid) || !start) {
            reply_error(c, msg.request_id, MALL_ERR_INVAL,
                        "pid " + std::to_string(pid) + " is not a running process");
            return;
        }
        starts[pid] = *start;
        for (const auto &[name, job] : manager_->jobs()) {
            if (std::find(job.spec.pids.begin(), job.spec.pids.end(), pid) != job.spec.pids.end()) {
                reply_error(c, msg.request_id, MALL_ERR_INVAL,
                            "pid " + std::to_string(pid) + " already belongs to job " + name +
                                "; a process can be in one job only");
                return;
            }
        }
    }
    for (auto &[pid, start] : starts) start_times_[pid] = start;
    registering_pids_[spec.id] = spec.pids;
    Outcome outcome = joining ? manager_->add_pids(spec.id, spec.uid, spec.pids, Clock::now())
                              : manager_->register_job(spec, Clock::now());
    registering_pids_.erase(spec.id);
    if (!outcome.ok) {
        for (auto &[pid, start] : starts) start_times_.erase(pid);
        reply_error(c, msg.request_id, outcome.code, outcome.error);
        return;
    }
    if (auto slurm_id = slurm_job_id_of(spec.id); slurm_ && slurm_id) slurm_->check({*slurm_id});
    std::string error;
    if (!backend_->add_pids(spec.id, spec.pids, &error)) log_warn("job " + spec.id + ": " + error);
    sync_pid_watches();
    // The reply waits until the job holds cpus, so a launcher can start its task on them.
    PendingReply pending{PendingReply::Kind::Register, c.id, msg.request_id, spec.id, {},
                         Clock::now() + options_.ack_timeout + kDeferredReplySlack};
    pending_.push_back(std::move(pending));
}

void Server::handle_deregister(Connection &c, const proto::Message &msg) {
    const std::string job = proto::get_string(msg.body, "job");
    // Checked before the name is echoed back (every registered job has a valid name).
    if (auto bad = proto::invalid_job_name(job)) throw proto::ProtocolError("bad job name: " + *bad);
    auto pid = proto::get_optional_int(msg.body, "pid", 1, INT_MAX);
    Outcome outcome = pid ? manager_->remove_pid(job, static_cast<pid_t>(*pid), Clock::now())
                          : manager_->deregister_job(job, Clock::now());
    if (!outcome.ok) {
        reply_error(c, msg.request_id, outcome.code, outcome.error);
        return;
    }
    nlohmann::json fields{{"job", job}};
    if (pid) fields["pid"] = *pid;
    reply(c, msg.request_id, proto::ok_reply(fields));
}

void Server::handle_attach(Connection &c, const proto::Message &msg) {
    const TimePoint now = Clock::now();
    // Every refusal is logged with the peer's uid and pid (rate-limited per connection).
    auto refuse = [&](int code, const std::string &text) {
        if (may_log_refusal(c))
            log_warn("refused Attach from uid " + std::to_string(c.peer.uid) + " pid " +
                     std::to_string(c.peer.pid) + ": " + log_text(text));
        reply_error(c, msg.request_id, code, text);
    };
    std::string job;
    auto field = msg.body.find("job");
    if (field == msg.body.end() || field->is_null()) {
        // Self-registration (authorize() checked --allow-self-register): within the pool's size.
        const int pool_size = std::max(1, manager_->available_pool().count());
        int64_t min = proto::get_optional_int(msg.body, "min", 1, CpuSet::kMaxCpus).value_or(1);
        int64_t max = proto::get_optional_int(msg.body, "max", 1, CpuSet::kMaxCpus).value_or(pool_size);
        if (min > max)
            throw proto::ProtocolError("min (" + std::to_string(min) + ") is larger than max (" +
                                       std::to_string(max) + ")");
        max = std::min<int64_t>(max, pool_size);
        min = std::min<int64_t>(min, max);
        for (const auto &[name, other] : manager_->jobs()) {
            if (in_process_tree(c.peer.pid, other.spec.pids)) {
                refuse(MALL_ERR_INVAL,
                            "process " + std::to_string(c.peer.pid) + " belongs to job " + name +
                                "; attach to it with MALL_JOB_ID=" + name);
                return;
            }
        }
        auto start = process_start_time(c.peer.pid);
        if (!start) {
            refuse(MALL_ERR_SYSTEM,
                        "cannot read /proc/" + std::to_string(c.peer.pid) + "/stat");
            return;
        }
        JobSpec spec;
        spec.id = "self-" + std::to_string(c.peer.pid);
        spec.uid = c.peer.uid;
        spec.min = static_cast<int>(min);
        spec.max = static_cast<int>(max);
        spec.pids = {c.peer.pid};
        start_times_[c.peer.pid] = *start;
        registering_pids_[spec.id] = spec.pids;
        Outcome outcome = manager_->register_job(spec, now);
        registering_pids_.erase(spec.id);
        if (!outcome.ok) {
            start_times_.erase(c.peer.pid);
            refuse(outcome.code, outcome.error);
            return;
        }
        sync_pid_watches();
        job = spec.id;
        log_info("self-registered job " + job + " for uid " + std::to_string(c.peer.uid) +
                 " (min " + std::to_string(min) + ", max " + std::to_string(max) + ")");
    } else {
        job = field->get<std::string>();
    }
    std::string error;
    JobPage *page = ensure_page(job, &error);
    if (!page) {
        refuse(MALL_ERR_SYSTEM, error);
        return;
    }
    const uint64_t attach_id = next_attach_id_++;
    Outcome outcome = manager_->attach(job, attach_id, now);
    if (!outcome.ok) {
        refuse(outcome.code, outcome.error);
        return;
    }
    c.job = job;
    c.attach_id = attach_id;
    const Job *j = manager_->find(job);
    if (j && page->page->generation.load(std::memory_order_relaxed) != j->generation && j->generation > 0)
        write_page(*page, j->generation, j->published);
    log_info("process " + std::to_string(c.peer.pid) + " (uid " + std::to_string(c.peer.uid) +
             ") attached to job " + job);
    reply(c, msg.request_id,
          proto::ok_reply({{"job", job}, {"generation", j ? j->generation : 0}}),
          page->memfd.get());
}

void Server::handle_ack(Connection &c, const proto::Message &msg) {
    manager_->ack(c.job, c.attach_id, proto::get_uint(msg.body, "generation"), Clock::now());
}

void Server::handle_progress(Connection &c, const proto::Message &msg) {
    manager_->progress(c.job, proto::get_uint(msg.body, "work_units"),
                       proto::get_uint(msg.body, "steps"), Clock::now());
}

void Server::handle_usage(Connection &c, const proto::Message &msg) {
    const uint64_t cpus_used = proto::get_uint(msg.body, "cpus_used");
    if (cpus_used > static_cast<uint64_t>(CpuSet::kMaxCpus)) {
        throw proto::ProtocolError("field \"cpus_used\" is " + std::to_string(cpus_used) +
                                   ", more than " + std::to_string(CpuSet::kMaxCpus));
    }
    Outcome outcome = manager_->set_usage(c.job, static_cast<int>(cpus_used), Clock::now());
    if (!outcome.ok) throw proto::ProtocolError(outcome.error);
}

void Server::handle_status(Connection &c, const proto::Message &msg) {
    reply(c, msg.request_id, proto::ok_reply(full_status()));
}

void Server::handle_set(Connection &c, const proto::Message &msg) {
    const std::string job = proto::get_string(msg.body, "job");
    // Checked before the name is echoed back (every registered job has a valid name).
    if (auto bad = proto::invalid_job_name(job)) throw proto::ProtocolError("bad job name: " + *bad);
    const bool has_cpus = msg.body.contains("cpus"), has_weight = msg.body.contains("weight");
    if (!has_cpus && !has_weight) throw proto::ProtocolError("give field \"cpus\", \"weight\" or both");
    std::optional<CpuSet> pinned;
    if (has_cpus) {
        const std::string text = proto::get_string(msg.body, "cpus");
        if (text != "auto") {
            std::string why;
            pinned = CpuSet::parse(text, &why);
            if (!pinned) throw proto::ProtocolError("field \"cpus\": " + why + " (or \"auto\")");
            if (pinned->empty()) throw proto::ProtocolError("field \"cpus\" is empty; give cpus or \"auto\"");
        }
    }
    double weight = 0;
    if (has_weight) {
        const auto &w = msg.body["weight"];
        if (!w.is_number() || !proto::valid_weight(w.get<double>()))
            throw proto::ProtocolError(std::string("field \"weight\" must be ") + proto::kWeightRule);
        weight = w.get<double>();
    }
    // The weight is valid (checked above), so once the pin is accepted the weight can only be
    // refused for an unknown job, which the pin would have refused first: a refusal changes nothing.
    if (has_cpus) {
        Outcome outcome = manager_->set_cpus(job, pinned, Clock::now());
        if (!outcome.ok) return reply_error(c, msg.request_id, outcome.code, outcome.error);
    }
    if (has_weight) {
        Outcome outcome = manager_->set_weight(job, weight, Clock::now());
        if (!outcome.ok) return reply_error(c, msg.request_id, outcome.code, outcome.error);
    }
    nlohmann::json result{{"job", job}};
    if (has_cpus) result["cpus"] = pinned ? pinned->to_string() : "auto";
    if (const Job *j = manager_->find(job)) result["weight"] = j->spec.weight;
    reply(c, msg.request_id, proto::ok_reply(result));
}

void Server::handle_policy(Connection &c, const proto::Message &msg) {
    const std::string name = proto::get_string(msg.body, "name");
    Outcome outcome = manager_->set_policy(name, Clock::now());
    if (!outcome.ok) {
        reply_error(c, msg.request_id, outcome.code, outcome.error);
        return;
    }
    reply(c, msg.request_id, proto::ok_reply({{"policy", policy_name(manager_->policy())}}));
}

void Server::handle_reclaim(Connection &c, const proto::Message &msg) {
    std::string why;
    auto owner = proto::get_optional_string(msg.body, "owner");
    if (!msg.body.contains("cpus") && owner) {
        // A Slurm job prolog knows the job but not its cores (22.05 gives it no core list): with
        // --slurm, malld asks slurmctld which cores the job has here, off the loop, then reclaims.
        auto slurm_id = slurm_job_id_of(*owner);
        if (!slurm_ || !slurm_id) {
            reply_error(c, msg.request_id, MALL_ERR_INVAL,
                        "no \"cpus\" given; malld can look a job's cpus up only for an owner "
                        "\"slurm-<jobid>\" and when started with --slurm");
            return;
        }
        slurm_->check({*slurm_id});
        pending_.push_back(PendingReply{PendingReply::Kind::LookUp, c.id, msg.request_id, *owner, {},
                                        Clock::now() + options_.ack_timeout + kDeferredReplySlack});
        return;
    }
    auto cpus = CpuSet::parse(proto::get_string(msg.body, "cpus"), &why);
    if (!cpus) throw proto::ProtocolError("field \"cpus\": " + why);
    Outcome outcome = manager_->reclaim(*cpus, Clock::now(), owner.value_or(""));
    if (!outcome.ok) {
        reply_error(c, msg.request_id, outcome.code, outcome.error);
        return;
    }
    log_info("reclaiming cpus " + cpus->to_string() + (owner ? " for " + log_text(*owner) : std::string()));
    // The reply waits until no job holds them, so the caller may start its own work there.
    // The owner's own job may hold its reserved cpus (a later step of the same Slurm job).
    PendingReply pending{PendingReply::Kind::Reclaim, c.id, msg.request_id, owner.value_or(""), *cpus,
                         Clock::now() + options_.ack_timeout + kDeferredReplySlack};
    pending_.push_back(std::move(pending));
}

void Server::handle_release(Connection &c, const proto::Message &msg) {
    if (auto owner = proto::get_optional_string(msg.body, "owner")) {  // a job epilog
        CpuSet released;
        Outcome outcome = manager_->release_owner(*owner, Clock::now(), &released);
        if (!outcome.ok) {
            reply_error(c, msg.request_id, outcome.code, outcome.error);
            return;
        }
        reply(c, msg.request_id, proto::ok_reply({{"owner", *owner}, {"cpus", released.to_string()}}));
        return;
    }
    std::string why;
    auto cpus = CpuSet::parse(proto::get_string(msg.body, "cpus"), &why);
    if (!cpus) throw proto::ProtocolError("field \"cpus\": " + why);
    Outcome outcome = manager_->release(*cpus, Clock::now());
    if (!outcome.ok) {
        reply_error(c, msg.request_id, outcome.code, outcome.error);
        return;
    }
    reply(c, msg.request_id, proto::ok_reply({{"cpus", cpus->to_string()}}));
}

void Server::handle_watch(Connection &c, const proto::Message &msg) {
    c.watcher = true;
    reply(c, msg.request_id, proto::ok_reply());
}

void Server::process_pending_replies(TimePoint now) {
    std::vector<PendingReply> still;
    for (auto &p : pending_) {
        auto it = connections_.find(p.connection);
        if (it == connections_.end() || it->second.closing) continue;  // the asker left
        Connection &c = it->second;
        const auto waited_ms = std::to_string(
            (options_.ack_timeout + std::chrono::duration_cast<std::chrono::milliseconds>(kDeferredReplySlack)).count());
        if (p.kind == PendingReply::Kind::LookUp) {
            if (now >= p.deadline) {
                reply_error(c, p.request_id, MALL_ERR_SYSTEM,
                            "Slurm did not say which cpus " + p.job + " has on this node within " +
                                waited_ms + " ms; nothing was reclaimed (is slurmctld up?)");
            } else {
                still.push_back(std::move(p));
            }
        } else if (p.kind == PendingReply::Kind::Register) {
            const Job *job = manager_->find(p.job);
            if (!job) {
                reply_error(c, p.request_id, MALL_ERR_NOJOB,
                            "job " + p.job + " ended before it was given cpus");
            } else if (manager_->settled(p.job)) {
                reply(c, p.request_id,
                      proto::ok_reply({{"job", p.job},
                                       {"cpus", job->published.to_string()},
                                       {"generation", job->generation}}));
            } else if (now >= p.deadline) {
                reply_error(c, p.request_id, MALL_ERR_SYSTEM,
                            "job " + p.job + " is registered but was not given cpus within " +
                                waited_ms + " ms (the pool may be reclaimed or held by guaranteed "
                                "jobs); it will get cpus when some are free (see `mallctl status`)");
            } else {
                still.push_back(std::move(p));
            }
        } else {
            if (!manager_->holds_any(p.cpus, p.job)) {
                reply(c, p.request_id, proto::ok_reply({{"cpus", p.cpus.to_string()}}));
            } else if (now >= p.deadline) {
                std::string holders;
                for (const auto &[name, job] : manager_->jobs())
                    if (name != p.job && (job.cpuset | job.published).intersects(p.cpus))
                        holders += (holders.empty() ? "" : ", ") + name;
                reply_error(c, p.request_id, MALL_ERR_SYSTEM,
                            "cpus " + p.cpus.to_string() + " are still held by job(s) " + holders +
                                " after " + waited_ms + " ms; they stay reclaimed and will be free "
                                "once those jobs have shrunk (see `mallctl status`)");
            } else {
                still.push_back(std::move(p));
            }
        }
    }
    pending_ = std::move(still);
}

// ---------------------------------------------------------------------------------------------
// Effects

std::vector<pid_t> Server::pids_of(const std::string &job) const {
    if (const Job *j = manager_ ? manager_->find(job) : nullptr) return j->spec.pids;
    auto it = registering_pids_.find(job);
    return it == registering_pids_.end() ? std::vector<pid_t>{} : it->second;
}

bool Server::enforce(const std::string &job, const CpuSet &cpus, bool growing, std::string *error) {
    std::string why;
    bool ok = backend_->apply(job, pids_of(job), cpus, growing, &why);
    if (!ok) {
        log_warn("cannot enforce cpus '" + cpus.to_string() + "' on job " + job + ": " + why);
        if (error) *error = why;
    }
    return ok;
}

void Server::publish(const std::string &job, uint64_t generation, const CpuSet &cpus) {
    std::string error;
    JobPage *page = ensure_page(job, &error);
    if (!page) {
        log_error("cannot publish to job " + job + ": " + error);
        return;
    }
    write_page(*page, generation, cpus);
    // A wake-up only: if the socket is full the client already has unread notifications, and
    // the page holds the truth.
    for (auto &[id, c] : connections_)
        if (c.job == job)
            send_message(c, proto::Type::Notify, 0, {{"generation", generation}}, -1, true);
}

void Server::job_removed(const std::string &job) {
    backend_->remove(job);
    auto page = pages_.find(job);
    if (page != pages_.end()) {
        if (page->second.page) ::munmap(page->second.page, kSharedPageSize);
        pages_.erase(page);
    }
    for (auto it = pid_watches_.begin(); it != pid_watches_.end();) {
        if (it->second.job == job) {
            if (it->second.pidfd) ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, it->second.pidfd.get(), nullptr);
            start_times_.erase(it->second.pid);
            it = pid_watches_.erase(it);
        } else {
            ++it;
        }
    }
    // Its attached processes learn by the hang-up that they are no longer managed.
    for (auto &[id, c] : connections_) {
        if (c.job != job) continue;
        c.job.clear();
        c.attach_id = 0;
        c.closing = true;
    }
}

void Server::event(const nlohmann::json &event) {
    nlohmann::json ev = event;
    if (!ev.contains("time")) ev["time"] = epoch_seconds();
    if (log_enabled(LogLevel::Info)) log_info("event " + ev.dump());
    for (auto &[id, c] : connections_) {
        if (!c.watcher || c.closing) continue;
        if (!send_message(c, proto::Type::Event, 0, ev, -1, true) && !c.closing) {
            log_warn_limited("slow-watcher", "watcher uid " + std::to_string(c.peer.uid) + " pid " +
                                                 std::to_string(c.peer.pid) +
                                                 " does not keep up with events; dropping it");
            c.closing = true;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// pages, pids, state

Server::JobPage *Server::ensure_page(const std::string &job, std::string *error) {
    auto it = pages_.find(job);
    if (it != pages_.end()) return &it->second;
    auto fail = [&](const std::string &what) -> JobPage * {
        if (error) *error = what + " for job " + job + "'s page failed: " + std::strerror(errno);
        return nullptr;
    };
    UniqueFd fd(::memfd_create(("mall-page-" + job).c_str(), MFD_ALLOW_SEALING | MFD_CLOEXEC));
    if (!fd) return fail("memfd_create");
    if (::ftruncate(fd.get(), static_cast<off_t>(kSharedPageSize)) != 0) return fail("ftruncate");
    void *map = ::mmap(nullptr, kSharedPageSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (map == MAP_FAILED) return fail("mmap");
    auto *page = static_cast<SharedPage *>(map);
    page_init(page);
    // After this only malld's existing mapping can write: clients can map it read-only only.
    if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) != 0) {
        ::munmap(map, kSharedPageSize);
        return fail("sealing (F_ADD_SEALS)");
    }
    JobPage &entry = pages_[job];
    entry.memfd = std::move(fd);
    entry.page = page;
    return &entry;
}

void Server::write_page(JobPage &page, uint64_t generation, const CpuSet &cpus) {
    uint64_t mask[MALL_MAX_CPUS / 64];
    cpus.to_mask(mask);
    page_write(page.page, generation, mask, cpus.count(), cpus.to_string().c_str());
}

void Server::sync_pid_watches() {
    std::set<std::pair<std::string, pid_t>> wanted;
    for (const auto &[name, job] : manager_->jobs())
        for (pid_t pid : job.spec.pids) wanted.insert({name, pid});
    std::set<std::pair<std::string, pid_t>> have;
    for (auto it = pid_watches_.begin(); it != pid_watches_.end();) {
        std::pair<std::string, pid_t> key{it->second.job, it->second.pid};
        if (!wanted.count(key)) {
            if (it->second.pidfd) ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, it->second.pidfd.get(), nullptr);
            it = pid_watches_.erase(it);
        } else {
            have.insert(key);
            ++it;
        }
    }
    std::vector<std::pair<std::string, pid_t>> dead;
    for (const auto &key : wanted) {
        if (have.count(key)) continue;
        const pid_t pid = key.second;
        PidWatch watch;
        watch.job = key.first;
        watch.pid = pid;
        int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
        if (fd < 0 && errno == ESRCH) {
            dead.push_back(key);
            continue;
        }
        if (fd >= 0) {
            watch.pidfd.reset(fd);
            ::fcntl(fd, F_SETFD, FD_CLOEXEC);
        } else {
            log_warn("pidfd_open(" + std::to_string(pid) + ") failed: " + std::strerror(errno) +
                     "; checking that process every second instead");
        }
        // The pidfd names whatever process has the pid now: make sure it is the registered one.
        auto start = process_start_time(pid);
        auto known = start_times_.find(pid);
        if (!start || (known != start_times_.end() && known->second != *start)) {
            dead.push_back(key);
            continue;
        }
        if (known == start_times_.end()) start_times_[pid] = *start;
        const uint64_t id = next_watch_id_++;
        if (watch.pidfd) {
            epoll_event ev{};
            ev.events = EPOLLIN;
            ev.data.u64 = make_tag(kPidTag, id);
            if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, watch.pidfd.get(), &ev) != 0)
                watch.pidfd.reset();
        }
        pid_watches_.emplace(id, std::move(watch));
    }
    for (const auto &[job, pid] : dead) {
        log_info("process " + std::to_string(pid) + " of job " + job + " is gone");
        start_times_.erase(pid);
        if (manager_->find(job)) manager_->remove_pid(job, pid, Clock::now());
    }
}

void Server::poll_unwatched_pids() {
    next_pid_poll_ = Clock::now() + kPidPollInterval;
    std::vector<uint64_t> gone;
    for (const auto &[id, w] : pid_watches_) {
        if (w.pidfd) continue;
        auto start = process_start_time(w.pid);
        auto known = start_times_.find(w.pid);
        if (!process_alive(w.pid) || !start || (known != start_times_.end() && known->second != *start))
            gone.push_back(id);
    }
    for (uint64_t id : gone) handle_pid_exit(id);
}

void Server::enable_slurm_checks(std::unique_ptr<SlurmQuery> query, std::chrono::seconds interval) {
    slurm_ = std::make_unique<SlurmChecker>(std::move(query));
    slurm_interval_ = interval;
}

void Server::check_slurm_jobs(TimePoint now) {
    next_slurm_check_ = now + slurm_interval_;
    std::set<uint32_t> ids;
    for (const auto &[name, job] : manager_->jobs())
        if (auto id = slurm_job_id_of(name)) ids.insert(*id);
    for (const auto &[owner, cpus] : manager_->reserved())
        if (auto id = slurm_job_id_of(owner)) ids.insert(*id);
    if (!ids.empty()) slurm_->check(ids);
}

// Reclaims waiting for a job's cpus (Kind::LookUp) become ordinary deferred reclaims once Slurm
// has answered, or fail with its words.
void Server::resolve_lookups(const std::string &owner, const SlurmJobState &state) {
    for (auto &p : pending_) {
        if (p.kind != PendingReply::Kind::LookUp || p.job != owner) continue;
        auto it = connections_.find(p.connection);
        if (it == connections_.end()) continue;
        Connection &c = it->second;
        if (state.kind != SlurmJobState::Kind::Running || !state.cpus_on_node || state.cpus_on_node->empty()) {
            reply_error(c, p.request_id, MALL_ERR_NOJOB,
                        "Slurm gives no cpus on this node to job " + std::to_string(state.job_id) + " (" +
                            state.detail + "); nothing was reclaimed");
            p.connection = 0;  // answered: dropped below
            continue;
        }
        const CpuSet cpus = *state.cpus_on_node & pool_;
        Outcome outcome = manager_->reclaim(cpus, Clock::now(), owner);
        if (!outcome.ok) {
            reply_error(c, p.request_id, outcome.code, outcome.error);
            p.connection = 0;
            continue;
        }
        log_info("reclaiming cpus " + cpus.to_string() + " for " + owner + " (Slurm's allocation on this node)");
        p.kind = PendingReply::Kind::Reclaim;
        p.cpus = cpus;
    }
    pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                  [](const PendingReply &p) { return p.connection == 0; }),
                   pending_.end());
}

// Slurm is the authority on its jobs: a registration or reservation for a job Slurm does not
// run (it ended and the epilog was missed, malld was down meanwhile, or a client invented it),
// or a registration under another uid than the job's, is ended and its cpus go back to the pool.
void Server::handle_slurm_results() {
    for (const SlurmJobState &state : slurm_->take_results()) {
        const std::string name = "slurm-" + std::to_string(state.job_id);
        resolve_lookups(name, state);
        const Job *job = manager_->find(name);
        switch (state.kind) {
            case SlurmJobState::Kind::Unreachable:
                log_warn_limited("slurm", "cannot ask Slurm about job " + std::to_string(state.job_id) +
                                              ": " + state.detail +
                                              "; keeping it as it is (is slurmctld up? is SLURM_CONF set?)");
                break;
            case SlurmJobState::Kind::NotRunning: {
                if (!job && manager_->reserved().count(name) == 0) break;
                log_info("Slurm reports job " + std::to_string(state.job_id) + " " + state.detail +
                         ": ending " + name + " and releasing its cpus");
                CpuSet released;
                manager_->release_owner(name, Clock::now(), &released);
                break;
            }
            case SlurmJobState::Kind::Running:
                if (job && job->spec.uid != state.uid) {
                    log_error("job " + name + " was registered for uid " + std::to_string(job->spec.uid) +
                              " but Slurm runs it for uid " + std::to_string(state.uid) +
                              ": ending the registration");
                    manager_->deregister_job(name, Clock::now());
                } else if (job && state.cpus_on_node && !state.cpus_on_node->contains(job->spec.guaranteed)) {
                    log_warn("job " + name + " claims guaranteed cpus " + job->spec.guaranteed.to_string() +
                             " but Slurm allocated it " + state.cpus_on_node->to_string() +
                             " on this node (Slurm's cpu ids; with several threads per core they differ "
                             "from Linux cpu numbers)");
                }
                break;
        }
    }
}

void Server::save_state_if_changed(bool force) {
    // A cheap fingerprint of everything the state file holds except progress counters (those
    // change at every report and are not worth a disk write on their own): this runs after
    // every batch of events, so it must cost next to nothing when nothing changed.
    std::string print = manager_->reclaimed().to_string();
    for (const auto &[owner, cpus] : manager_->reserved()) print += ';' + owner + '=' + cpus.to_string();
    print += '|';
    print += policy_name(manager_->policy());
    for (const auto &[name, job] : manager_->jobs()) {
        print += '|' + name + ':' + std::to_string(job.spec.uid) + ':' + std::to_string(job.spec.min) +
                 ':' + std::to_string(job.spec.max) + ':' + std::to_string(job.spec.weight) + ':' +
                 job.spec.guaranteed.to_string() + ':' + std::to_string(job.order) + ':' +
                 job.cpuset.to_string() + ':' + job.published.to_string() + ':' +
                 std::to_string(job.generation) + ':' +
                 (job.pinned ? job.pinned->to_string() : std::string("-")) + ':' +
                 std::to_string(job.transitions) + ':' + std::to_string(job.ack_timeouts) + ':';
        for (pid_t pid : job.spec.pids) print += std::to_string(pid) + ',';
    }
    if (!force && print == last_saved_) return;
    last_saved_ = std::move(print);

    SavedState state;
    state.pool = pool_.to_string();
    state.reclaimed = manager_->reclaimed();
    state.reserved = manager_->reserved();
    state.policy = policy_name(manager_->policy());
    for (const auto &[name, job] : manager_->jobs()) {
        SavedJob saved;
        saved.job = job;
        for (pid_t pid : job.spec.pids) {
            auto st = start_times_.find(pid);
            saved.pids.push_back({pid, st == start_times_.end() ? 0ull : st->second});
        }
        state.jobs.push_back(std::move(saved));
    }
    state_writer_->submit(std::move(state));
}

nlohmann::json Server::full_status() const {
    nlohmann::json status = manager_->status();
    status["backend"] = backend_name(backend_->kind());
    if (status.contains("jobs") && status["jobs"].is_array()) {
        for (auto &j : status["jobs"]) {
            const std::string name = j.value("job", std::string());
            j["pids"] = pids_of(name);
            j["cgroup"] = backend_->cgroup_path(name);
        }
    }
    return status;
}

}  // namespace mall
