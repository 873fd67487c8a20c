// SPDX-License-Identifier: BSD-3-Clause
// server.cpp — malld's loop (see server.hpp). Contract: one thread serves every client and never
// waits on one (non-blocking sockets, bounded outboxes, watchers dropped when they fall behind)
// nor on the disk (persistence.cpp's writer thread does the fsync) nor on slurmctld (its queries
// run on SlurmChecker's thread). What the loop does do synchronously is local kernel work, bounded
// but not free: cgroup writes and /proc reads for a change of allocation (on kernels without
// /proc/PID/task/TID/children, a scan of all of /proc to find a job's descendants), and removing
// an ended job's cgroup, which retries for up to 100 ms while the kernel lets go of an exiting
// process (and first retries, as long again each, removals that failed before). Stop signals
// arrive through a signalfd only. The loop closes no socket a peer may make hang (connections.hpp
// says which go to the closer thread, and what bounds them); while kMaxParkedSockets are parked,
// or while malld is out of descriptors with its spare spent, the listener is out of the loop (new
// clients wait in the backlog) and the loop retries every kListenerRetry.
#include "server.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>
#include <vector>

#include "../common/files.hpp"
#include "../common/job_history.hpp"
#include "../common/metrics_text.hpp"
#include "log.hpp"
#include "mall/mall.h"
#include "procfs.hpp"

namespace mall {

namespace {

// A connection that is not attached, not watching and not waiting for a deferred reply has no
// reason to stay silent this long: it only holds a descriptor.
constexpr auto kIdleTimeout = std::chrono::seconds(30);
constexpr int kPacketsPerWakeup = 32;  // fairness between connections
// While the listener is out of the loop, or sockets are parked, the loop looks this often whether
// the closer has caught up (it wakes the loop in no other way).
constexpr auto kListenerRetry = std::chrono::milliseconds(100);

// Tells a client why its connection is refused before it is closed: a Reply to no request
// (proto::kConnectionRefusalId), which every client reports instead of waiting for its own.
// Non-blocking: a client that sent a queue full of packets just loses the words.
void refuse_connection(int fd, int code, const std::string &text) {
    proto::Message refusal;
    refusal.type = proto::Type::Reply;
    refusal.request_id = proto::kConnectionRefusalId;
    refusal.body = proto::error_reply(code, text);
    try {
        send_packet(fd, proto::encode(refusal), -1, /*nonblocking=*/true);
    } catch (...) {  // out of memory: the hang-up alone must do
    }
}

}  // namespace

int default_connections_per_uid(int cpus) {
    return std::clamp(8 * std::max(cpus, 0), kMinDefaultConnectionsPerUid, kMaxDefaultConnectionsPerUid);
}

Server::Server(ServerOptions options, const Topology &topology, CpuSet pool,
               std::unique_ptr<CpusetBackend> backend)
    : options_(std::move(options)),
      topology_(topology),
      pool_(std::move(pool)),
      backend_(std::move(backend)) {
    access_.admin_uids = options_.admin_uids;
    access_.allow_self_register = options_.allow_self_register;
}

Server::~Server() {
    persistence_.reset();  // writes what is pending, then joins the writer
    handlers_.reset();
    manager_.reset();
    effects_.reset();  // unmaps the pages
    if (listening_) ::unlink(options_.socket_path.c_str());
}

void Server::enable_slurm_checks(std::unique_ptr<SlurmQuery> query, std::chrono::seconds interval,
                                 std::chrono::seconds comment_interval, std::optional<SlurmdSpool> spool) {
    if (handlers_) {  // after start() the handlers and the epoll set would not know of it
        log_error("internal: Slurm checks must be enabled before malld starts; they stay off");
        return;
    }
    slurm_query_ = std::move(query);
    slurm_interval_ = interval;
    slurm_comment_interval_ = comment_interval;
    slurmd_spool_ = std::move(spool);
}

bool Server::start(std::string *error) {
    auto fail = [&](const std::string &text) {
        if (error) *error = text;
        return false;
    };
    ::signal(SIGPIPE, SIG_IGN);
    // Block the stop signals before any thread exists, so they only ever arrive through the
    // signalfd and never kill malld uncleanly (every thread malld starts blocks all signals as
    // well: quiet_thread.hpp).
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
    // A blocking listener would stall the loop in accept() whenever a client gave up first.
    const int listen_flags = ::fcntl(lfd, F_GETFL);
    if (listen_flags < 0 || ::fcntl(lfd, F_SETFL, listen_flags | O_NONBLOCK) != 0)
        return fail(std::string("cannot make the socket non-blocking: ") + std::strerror(errno));
    // No client may push descriptors on malld: closing a peer-chosen file can block the loop.
    // Set on the listener so that it already holds for packets sent before accept().
    if (!refuse_passed_descriptors(lfd))
        log_info(std::string("this kernel cannot refuse passed descriptors (SO_PASSRIGHTS: ") +
                 std::strerror(errno) + "); malld closes any it gets on its closer thread");
    // A descriptor in reserve: when malld runs out, it frees this one to accept and close the
    // next connection, instead of leaving it pending (the listener would wake the loop forever).
    spare_fd_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));

    persistence_ = std::make_unique<Persistence>(options_.state_dir);
    std::string load_error;
    std::optional<SavedState> saved = persistence_->open(&load_error);
    if (!saved && !load_error.empty()) return fail(load_error);

    PolicyKind policy = options_.policy;
    if (saved && !options_.policy_given) {
        if (auto p = parse_policy(saved->policy)) {
            if (*p != policy) log_info("policy " + saved->policy + " restored from the state file");
            policy = *p;
        }
    }
    if (slurm_query_)  // after the mask: its thread must not take the stop signals
        slurm_ = std::make_unique<SlurmReconciler>(std::move(slurm_query_), slurm_interval_, slurm_comment_interval_,
                                                   std::move(slurmd_spool_));
    epoll_fd_.reset(::epoll_create1(EPOLL_CLOEXEC));
    if (!epoll_fd_) return fail(std::string("epoll_create1 failed: ") + std::strerror(errno));
    connections_ = std::make_unique<Connections>(epoll_fd_.get());
    pids_ = std::make_unique<PidWatcher>(epoll_fd_.get());
    effects_ = std::make_unique<KernelEffects>(*backend_, *connections_, *pids_);
    manager_ = std::make_unique<NodeManager>(topology_, pool_, policy, options_.ack_timeout, *effects_);
    effects_->set_manager(manager_.get());
    if (!options_.history_file.empty() || slurm_)
        effects_->set_end_observer([this](const nlohmann::json &ev) { record_job_end(ev); });
    handlers_ = std::make_unique<RequestHandlers>(options_.ack_timeout, pool_, *manager_, *connections_,
                                                  *effects_, *pids_, *backend_, slurm_.get());
    nlohmann::json extras = {{"version", std::to_string(MALL_API_VERSION_MAJOR) + "." +
                                             std::to_string(MALL_API_VERSION_MINOR) + "." +
                                             std::to_string(MALL_API_VERSION_PATCH)},
                             {"host", options_.host}};
    if (!options_.metrics_file.empty()) extras["metrics_file"] = options_.metrics_file;
    if (!options_.history_file.empty()) extras["history_file"] = options_.history_file;
    handlers_->set_status_extras(std::move(extras));

    std::string backend_error;
    if (!backend_->start(pool_, &backend_error)) return fail(backend_error);

    if (saved) persistence_->adopt(*saved, pool_, *manager_, *backend_, *effects_, *pids_);
    Persistence::remove_stale_job_cgroups(*manager_, *backend_);

    signal_fd_.reset(::signalfd(-1, &signals, SFD_NONBLOCK | SFD_CLOEXEC));
    if (!signal_fd_) return fail(std::string("signalfd failed: ") + std::strerror(errno));

    auto watch = [&](int fd, Source kind) {
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.u64 = epoll_tag(kind, 0);
        return ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, fd, &ev) == 0;
    };
    if (!watch(listen_fd_.get(), Source::Listen) || !watch(signal_fd_.get(), Source::Signal))
        return fail(std::string("epoll_ctl failed: ") + std::strerror(errno));
    listener_armed_ = true;
    if (slurm_) {
        if (!watch(slurm_->fd(), Source::Slurm))
            return fail(std::string("epoll_ctl failed: ") + std::strerror(errno));
        slurm_->check_all(*manager_, Clock::now());  // re-adopted registrations are checked at once
    }

    pids_->sync(*manager_);
    persistence_->save_if_changed(*manager_, pool_, *pids_, *backend_, true);
    if (!options_.metrics_file.empty()) write_metrics(Clock::now());
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", options_.socket_mode);
    log_info("listening on " + options_.socket_path + " (mode " + mode + "), state in " +
             options_.state_dir + ", " + std::to_string(manager_->jobs().size()) + " job(s)");
    return true;
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
            const auto kind = static_cast<Source>(events[i].data.u64 >> kSourceShift);
            const uint64_t id = events[i].data.u64 & kSourceIdMask;
            switch (kind) {
                case Source::Listen: handle_listen(); break;
                case Source::Signal: handle_signal(); break;
                case Source::Connection: handle_connection(id, events[i].events); break;
                case Source::Pid:
                    find_container_members(Clock::now());
                    pids_->handle_exit(id, *manager_);
                    break;
                case Source::Slurm: handle_slurm_results(); break;
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
    persistence_->save_if_changed(*manager_, pool_, *pids_, *backend_, true);
    persistence_->flush();
    connections_->close_all();
    stop_descriptor_closer(std::chrono::seconds(2));  // a close that hangs must not hang the stop
    pids_->clear();
    backend_->stop();
    // Stale figures must not look live: node_exporter stops exporting them with the file.
    if (!options_.metrics_file.empty()) ::unlink(options_.metrics_file.c_str());
    if (listening_) {
        ::unlink(options_.socket_path.c_str());
        listening_ = false;
    }
    listen_fd_.reset();
    log_info("stopped");
}

// Connections that are not attached, not watching and not waiting for a deferred reply may be
// closed once idle for kIdleTimeout: they only hold one of malld's descriptors.
bool Server::idle_candidate(const Connection &c, const std::set<uint64_t> &waiting) const {
    return c.job.empty() && !c.watcher && waiting.count(c.id) == 0;
}

int Server::next_timeout_ms() const {
    const TimePoint now = Clock::now();
    std::optional<TimePoint> next = manager_->next_deadline();
    auto consider = [&](std::optional<TimePoint> t) {
        if (t && (!next || *t < *next)) next = t;
    };
    consider(handlers_->next_deadline());
    consider(pids_->next_poll());
    const std::set<uint64_t> waiting = handlers_->connections_waiting();
    for (const auto &[id, c] : connections_->all())
        if (idle_candidate(c, waiting)) consider(c.last_activity + kIdleTimeout);
    if (slurm_) {
        consider(slurm_->next_check());
        consider(slurm_->next_running_record());
    }
    consider(next_metrics_write_);
    consider(next_accounting_checkpoint_);
    if (!manager_->jobs().empty()) consider(next_cpu_sample_);
    for (const auto &[name, job] : manager_->jobs())
        if (job.spec.container) {
            consider(next_container_scan_);
            break;
        }
    if (!listener_armed_ || connections_->parked() > 0) consider(now + kListenerRetry);
    if (!next) return -1;
    if (*next <= now) return 0;
    auto left = std::chrono::duration_cast<std::chrono::microseconds>(*next - now).count();
    int64_t ms = (left + 999) / 1000;  // round up: waking early would only spin
    return static_cast<int>(std::min<int64_t>(ms, 60000));
}

void Server::find_container_members(TimePoint now) {
    next_container_scan_ = now + std::chrono::seconds(1);
    backend_->tidy();
    for (const auto &[name, job] : manager_->jobs()) {
        if (!job.spec.container) continue;
        std::vector<pid_t> joining;
        std::map<pid_t, unsigned long long> starts;
        for (pid_t pid : backend_->member_pids(name)) {
            if (std::find(job.spec.pids.begin(), job.spec.pids.end(), pid) != job.spec.pids.end()) continue;
            if (manager_->pid_in_other_job(pid, name)) continue;
            auto start = process_start_time(pid);
            if (!start || !process_alive(pid)) continue;
            joining.push_back(pid);
            starts[pid] = *start;
        }
        if (joining.empty()) continue;
        // add_pids may replan, which does not add or remove jobs: the loop's map stays valid.
        Outcome outcome = manager_->add_pids(name, job.spec.uid, joining, now);
        if (!outcome.ok) {
            log_warn("container job " + name + ": cannot add its processes " + pid_list_text(joining) +
                     ": " + outcome.error);
            continue;
        }
        for (const auto &[pid, start] : starts) pids_->remember_start(pid, start);
        log_debug("container job " + name + ": processes " + pid_list_text(joining) + " joined from its cgroups");
    }
    pids_->sync(*manager_);
}

void Server::sample_cpu_time(TimePoint now) {
    next_cpu_sample_ = now + kCpuSampleInterval;
    manager_->sample_cpu_times(now);
}

void Server::after_events() {
    const TimePoint now = Clock::now();
    if (now >= next_container_scan_) find_container_members(now);
    if (now >= next_cpu_sample_) sample_cpu_time(now);
    manager_->tick(now);
    pids_->poll(*manager_, now);
    if (slurm_ && now >= slurm_->next_check()) slurm_->check_all(*manager_, now);
    if (slurm_) slurm_->record_running(*manager_, now);
    pids_->sync(*manager_);
    handlers_->process_pending(Clock::now());
    close_idle_connections(Clock::now());
    // Closing a connection detaches it, which may finish a transition, end a deferred request or
    // drop a watcher in turn: repeat until nothing is left to close.
    for (int round = 0; round < 16; ++round) {
        std::vector<uint64_t> closing;
        for (auto &[id, c] : connections_->all())
            if (c.closing) closing.push_back(id);
        if (closing.empty()) break;
        for (uint64_t id : closing) close_connection(id);
        handlers_->process_pending(Clock::now());
    }
    connections_->retry_parked();
    if (!spare_fd_) spare_fd_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    if (spare_fd_) out_of_descriptors_ = false;
    update_listener();
    save_state(Clock::now());
    if (next_metrics_write_ && Clock::now() >= *next_metrics_write_) write_metrics(Clock::now());
}

void Server::save_state(TimePoint now) {
    if (manager_->jobs().empty()) {
        next_accounting_checkpoint_.reset();
        persistence_->save_if_changed(*manager_, pool_, *pids_, *backend_);
        return;
    }
    const bool checkpoint = next_accounting_checkpoint_ && now >= *next_accounting_checkpoint_;
    if (!next_accounting_checkpoint_ || checkpoint) next_accounting_checkpoint_ = now + options_.checkpoint_interval;
    persistence_->save_if_changed(*manager_, pool_, *pids_, *backend_, checkpoint);
}

void Server::write_metrics(TimePoint now) {
    next_metrics_write_ = now + options_.metrics_interval;
    std::string error;
    const bool ok = replace_file_atomically(options_.metrics_file, render_prometheus(handlers_->full_status()),
                                            0644, &error);
    if (ok) {
        metrics_failures_.succeeded("metrics: " + options_.metrics_file + " is written again");
    } else {
        metrics_failures_.failed(error, LogLevel::Error,
                                 "metrics: " + error + "; check --metrics-file (malld tries again every " +
                                     std::to_string(options_.metrics_interval.count()) + " s)");
    }
}

void Server::record_job_end(const nlohmann::json &end_event) {
    if (slurm_) slurm_->record_end(end_event);  // its AdminComment (a Slurm job's)
    if (options_.history_file.empty()) return;
    std::string error;
    const bool ok = append_history(options_.history_file, history_record(end_event, options_.host),
                                   options_.history_max_bytes, &error);
    if (ok) {
        history_failures_.succeeded("history: " + options_.history_file + " is written again");
    } else {
        history_failures_.failed(error, LogLevel::Error,
                                 "history: " + error + "; job " + end_event.value("job", std::string("?")) +
                                     "'s record is lost, and those of later jobs until it is written again "
                                     "(check --history-file)");
    }
}

void Server::close_idle_connections(TimePoint now) {
    const std::set<uint64_t> waiting = handlers_->connections_waiting();
    for (auto &[id, c] : connections_->all()) {
        if (c.closing || !idle_candidate(c, waiting)) continue;
        if (now - c.last_activity < kIdleTimeout) continue;
        log_debug("closing connection " + std::to_string(id) + " (uid " + std::to_string(c.peer.uid) +
                  " pid " + std::to_string(c.peer.pid) + "): idle for " +
                  std::to_string(std::chrono::duration_cast<std::chrono::seconds>(kIdleTimeout).count()) + " s");
        c.closing = true;
    }
}

void Server::close_connection(uint64_t id) {
    auto [job, attach_id] = connections_->close(id);
    // After the erase: detaching may publish or emit events that look at the connections.
    if (!job.empty()) manager_->detach(job, attach_id, Clock::now());
}

// Out of descriptors (EMFILE/ENFILE): the pending connection would keep the listener readable
// and the loop spinning. Free the spare descriptor, accept that connection and dispose of it at
// once. When the spare cannot be had back at once (the socket went to the closer, which has not
// closed it yet), the listener leaves the loop until after_events() has it back.
void Server::accept_and_drop_one() {
    spare_fd_.reset();
    int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    PeerCred peer;
    if (fd >= 0) {
        UniqueFd owned(fd);
        peer_credentials(fd, &peer);
        // Out of descriptors, the peer's namespace may not open: then it counts under its uid.
        const bool admin = access_.is_admin(peer.uid);
        connections_->dispose(std::move(owned), admin ? LimitsOwner::user(peer.uid) : owner_of(peer, -1), admin);
    }
    spare_fd_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    if (!spare_fd_) out_of_descriptors_ = true;
    log_warn_limited("emfile", "out of file descriptors (" + std::to_string(connections_->size()) +
                                   " connections open): refused a connection from uid " +
                                   std::to_string(peer.uid) + " pid " + std::to_string(peer.pid) +
                                   "; raise malld's open-file limit (ulimit -n / LimitNOFILE)");
}

void Server::update_listener() {
    const bool wanted = !out_of_descriptors_ && !connections_->parked_full();
    if (wanted == listener_armed_ || !listen_fd_) return;
    if (wanted) {
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.u64 = epoll_tag(Source::Listen, 0);
        if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, listen_fd_.get(), &ev) != 0) {
            log_warn_limited("listener", std::string("cannot watch the socket again: ") + std::strerror(errno) +
                                             "; malld tries again");
            return;
        }
        listener_armed_ = true;
        log_info("accepting connections again");
        return;
    }
    ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, listen_fd_.get(), nullptr);
    listener_armed_ = false;
    if (out_of_descriptors_)
        log_warn("out of file descriptors and the spare one is still in use: new connections wait in the "
                 "backlog until a descriptor is free (raise malld's open-file limit: ulimit -n / LimitNOFILE)");
    else
        log_warn(std::to_string(connections_->parked()) + " sockets holding passed descriptors wait for malld's "
                 "stuck closer thread (parked: " + connections_->parked_owners_text() + "): new connections "
                 "wait in the backlog until it catches up; ending those users' processes ends their hanging "
                 "closes");
}

// Admins are refused only when every slot is taken, and ordinary users can never take the last
// kAdminConnectionReserve: root's tools, the Slurm plugin and the OCI hook always get in.
LimitsOwner Server::owner_of(const PeerCred &peer, int peer_pidfd) const {
    return limits_owner(peer, peer_pidfd, [this](uid_t uid) { return access_.is_admin(uid); });
}

std::string Server::connection_refusal(const PeerCred &peer, bool admin, const LimitsOwner &owner) const {
    const std::string who = "uid " + std::to_string(peer.uid) + " pid " + std::to_string(peer.pid);
    const size_t open = connections_->size();
    const size_t of_admins = open - static_cast<size_t>(connections_->non_admin_count());
    const bool all_taken = open >= static_cast<size_t>(kMaxDaemonConnections);
    if (all_taken && (!admin || of_admins >= static_cast<size_t>(kAdminConnectionReserve))) {
        const std::string limit = std::to_string(kMaxDaemonConnections);
        log_warn_limited("connections", "refused a connection from " + who + ": " + limit +
                                            " connections are open already");
        return "malld serves " + limit + " connections already, its limit; try again later";
    }
    if (admin) return "";
    if (connections_->non_admin_count() >= kMaxNonAdminConnections) {
        const std::string limit = std::to_string(kMaxNonAdminConnections);
        log_warn_limited("connections-non-admin",
                         "refused a connection from " + who + ": ordinary users hold " + limit +
                             " connections, their share (the other " +
                             std::to_string(kAdminConnectionReserve) + " are kept for admins)");
        return "malld serves " + limit + " connections of ordinary users already, their limit "
               "(the rest are kept for root and admin uids); try again later";
    }
    // Under the uid owning the peer's user namespace: a rootless container's subuids are one user;
    // a namespace root or an admin made is one of its own.
    const std::string user = owner == LimitsOwner::user(peer.uid) ? owner.describe()
                             : owner.is_user_namespace()
                                 ? owner.describe() + ", where uid " + std::to_string(peer.uid) + " runs,"
                                 : owner.describe() + " (owner of uid " + std::to_string(peer.uid) +
                                       "'s user namespace)";
    if (connections_->count_of_owner(owner) >= options_.max_connections_per_uid) {
        const std::string limit = std::to_string(options_.max_connections_per_uid);
        log_warn_limited("connections-per-uid", "refused a connection from " + who + ": " + user + " has " +
                                                    limit + " connections open, the limit per non-admin user "
                                                            "(raise it with malld --max-connections-per-user)");
        return user + " holds " + limit + " connections, the per-user limit (malld --max-connections-per-user)";
    }
    if (const size_t debt = connections_->closer_debt(owner); debt > kMaxCloserDebtPerUser) {
        log_warn_limited("closer-debt", "refused a connection from " + who + ": " + user + " passed malld " +
                                            std::to_string(debt) + " descriptors or sockets still waiting to be "
                                                                   "closed (their close hangs)");
        return user + " passed malld descriptors that are still waiting to be closed; no connection until "
                      "they are (clients never pass descriptors to malld)";
    }
    return "";
}

void Server::handle_listen() {
    for (int accepted = 0; accepted < 256; ++accepted) {  // bounded: other sources get their turn
        // Each refusal may park one more socket: none is accepted with the parked list full.
        if (connections_->parked_full() || out_of_descriptors_) break;
        int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR) continue;
            if (errno == EMFILE || errno == ENFILE) {
                if (spare_fd_) {
                    accept_and_drop_one();
                    continue;
                }
                out_of_descriptors_ = true;  // no spare: the listener waits out of the loop
                break;
            }
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                log_warn_limited("accept", std::string("accept failed: ") + std::strerror(errno));
            break;
        }
        UniqueFd owned(fd);
        // Also set on the listener (inherited); repeated here in case the kernel does not pass it on.
        refuse_passed_descriptors(fd);
        PeerCred peer;
        if (!peer_credentials(fd, &peer)) {
            log_warn_limited("credentials", std::string("cannot read the credentials of a new client: ") +
                                                std::strerror(errno) + "; closing it");
            connections_->dispose(std::move(owned), LimitsOwner::user(peer.uid), false);
            continue;
        }
        const bool admin = access_.is_admin(peer.uid);
        // The peer process itself, taken now: its pid may be reused before it sends Attach.
        UniqueFd pidfd(peer_pidfd(fd));
        const int pidfd_error = pidfd ? 0 : errno;
        if (!pidfd && pidfd_error == ESRCH) {
            log_debug("connection from uid " + std::to_string(peer.uid) + " pid " +
                      std::to_string(peer.pid) + " closed: that process has exited already");
            // Its namespace is read without the pidfd: a peer that passed descriptors and left
            // still counts under its namespace's owner.
            connections_->dispose(std::move(owned), admin ? LimitsOwner::user(peer.uid) : owner_of(peer, -1),
                                  admin);
            continue;
        }
        // An admin's connections count for nobody; its closer debt is kept under its uid.
        const LimitsOwner owner = admin ? LimitsOwner::user(peer.uid) : owner_of(peer, pidfd ? pidfd.get() : -1);
        if (std::string why = connection_refusal(peer, admin, owner); !why.empty()) {
            refuse_connection(owned.get(), MALL_ERR_DENIED, why);
            connections_->dispose(std::move(owned), owner, admin);
            continue;
        }
        Connection *c = connections_->add(std::move(owned), peer, std::move(pidfd), admin, owner);
        if (!c) continue;
        c->accepted_ticks = boot_time_ticks();
        log_debug("connection " + std::to_string(c->id) + " from uid " + std::to_string(peer.uid) +
                  " pid " + std::to_string(peer.pid) +
                  (owner != LimitsOwner::user(peer.uid) ? " (counted for " + owner.describe() + ")" : ""));
    }
    update_listener();
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
    Connection *found = connections_->find(id);
    if (!found) return;
    Connection &c = *found;
    if (events & EPOLLOUT) connections_->flush_outbox(c);
    if (!(events & (EPOLLIN | EPOLLHUP | EPOLLERR))) return;
    for (int k = 0; k < kPacketsPerWakeup && !c.closing; ++k) {
        std::string packet;
        // Clients have no business passing descriptors. recv_packet hands any to the closer thread
        // (a close can block), counted for the peer's user; while that user has some waiting, or
        // the closer has no room for a whole packet, a packet that carries some is not read and
        // the connection is dropped (connections.hpp: what bounds the closer's queue).
        if (!connections_->may_receive_descriptors(c) && next_packet_carries_descriptors(c.fd.get())) {
            log_warn_limited("closer-refused", "dropping the connection of uid " + std::to_string(c.peer.uid) +
                                                   " pid " + std::to_string(c.peer.pid) +
                                                   ": it passes descriptors while " +
                                                   std::to_string(connections_->closer_debt(c.owner)) +
                                                   " of that user's wait to be closed (malld's closer has " +
                                                   std::to_string(descriptors_waiting_to_close()) + " queued)");
            c.closing = true;
            break;
        }
        ssize_t n = recv_packet(c.fd.get(), &packet, proto::kMaxPacket, nullptr, true, c.owner.key());
        if (n > 0) {
            c.last_activity = Clock::now();
            serve_packet(c, packet, access_, *manager_, *backend_, *handlers_, *connections_);
            continue;
        }
        if (n == 0) {  // hang-up (a client may leave in the middle of a request: fine)
            c.closing = true;
            break;
        }
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        if (errno == ENOBUFS) {  // the closer's queue overflowed: the packet was read and dropped
            log_warn_limited("closer-full", "dropping the connection of uid " + std::to_string(c.peer.uid) +
                                                " pid " + std::to_string(c.peer.pid) + ": malld's closer thread has " +
                                                std::to_string(descriptors_waiting_to_close()) +
                                                " descriptors queued (passed files whose close hangs)");
        }
        if (errno == EMSGSIZE) {
            std::string text = "packet larger than " + std::to_string(proto::kMaxPacket) +
                               " bytes; closing the connection";
            log_warn_limited("malformed", "malformed packet from uid " + std::to_string(c.peer.uid) +
                                              " pid " + std::to_string(c.peer.pid) + ": " + text);
            connections_->reply_error(c, proto::request_id_of(packet), MALL_ERR_PROTOCOL, text);
        }
        c.closing = true;
        break;
    }
}

void Server::handle_slurm_results() {
    handlers_->resolve_annotations(slurm_->take_annotations());
    for (const SlurmJobState &state : slurm_->take_results()) {
        handlers_->resolve_lookups(slurm_job_name(state.job_id), state);
        slurm_->apply(state, *manager_);
    }
}

}  // namespace mall
