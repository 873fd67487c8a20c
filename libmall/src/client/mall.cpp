// SPDX-License-Identifier: BSD-3-Clause
// mall.cpp — libmall, the training-process side of mall: implements every function of mall/mall.h.
// Contract: mall_step() costs one acquire load when nothing changed (the page pointer always points
// at a readable mapping, attached or not); a monitor thread per handle keeps the connection to
// malld (Notify -> mall_fd, hang-up -> reconnect with backoff, progress totals); nothing escapes an
// extern "C" function, nothing exits, aborts, raises a signal or blocks a step for long.
#include "mall/mall.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <forward_list>
#include <mutex>
#include <new>
#include <string>
#include <thread>

#include "common/ctl_client.hpp"
#include "common/protocol.hpp"
#include "common/quiet_thread.hpp"
#include "common/shared_page.hpp"
#include "common/signal_control.hpp"
#include "common/cpuset.hpp"
#include "common/unix_socket.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr int kMaxCallbacks = 16;
constexpr int kMaxBoundThreads = 1024;
// mall_open() waits at most this long for malld's attach reply by default ($MALL_ATTACH_TIMEOUT_MS
// changes it, 0 to 60000; the connect itself never waits: a full backlog fails at once).
constexpr milliseconds kDefaultAttachTimeout{2000};
constexpr long kMaxAttachTimeoutMs = 60000;
// Reconnect backoff when no malld answers: 50 ms doubling to 1 s.
constexpr milliseconds kFirstBackoff{50};
constexpr milliseconds kMaxBackoff{1000};
// After a refusal (not this job's owner, no such job, ...) retrying every second would only fill
// malld's log with refusals; a restarted malld or a late registration is still picked up.
constexpr milliseconds kRefusedBackoff{5000};
constexpr milliseconds kProgressInterval{500};
// A "seen generation" no page ever holds: the next mall_step() applies whatever the page says.
constexpr uint64_t kForceApply = UINT64_MAX;

// The page's generation, read without any lock. ThreadSanitizer models the monitor's
// mmap(MAP_FIXED) over the page as a plain write to it; the kernel swaps the mapping atomically, so
// a concurrent reader sees the old page or the new one, both valid. TSan builds skip that read.
#if defined(__SANITIZE_THREAD__)
extern "C" void AnnotateIgnoreReadsBegin(const char *file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char *file, int line);
inline uint64_t page_generation(const mall::SharedPage *page) {
    AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
    uint64_t generation = page->generation.load(std::memory_order_acquire);
    AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
    return generation;
}
#else
inline uint64_t page_generation(const mall::SharedPage *page) {
    return page->generation.load(std::memory_order_acquire);
}
#endif

struct ResizeCallback {
    mall_resize_fn fn;
    void *arg;
    mall_release_fn release;  // called with arg by mall_close(); may be null
};

}  // namespace

struct mall_handle {
    // --- the mall_step() fast path reads only these two words ---
    const mall::SharedPage *page = nullptr;  // fixed address for the handle's whole life
    std::atomic<uint64_t> seen_generation{0};

    // --- progress counters, bumped by mall_report_progress() (lock-free, relaxed) ---
    // mall_set_usage(): the cap, re-sent after every (re)attach; 0 = none.
    std::atomic<int> usage_cap{0};
    alignas(64) std::atomic<uint64_t> work_units{0};
    std::atomic<uint64_t> progress_calls{0};

    // --- set at open, constant afterwards ---
    alignas(64) std::string socket_path;
    nlohmann::json attach_body;  // {"job": $MALL_JOB_ID} or the self-registration {"min", "max"}
    int user_event_fd = -1;  // mall_fd(): readable while a published change is not applied yet
    int stop_event_fd = -1;  // written by mall_close() to stop the monitor

    // conn_mu guards the socket descriptor and the replacement of the page mapping, so that the
    // change path never reads a page while it is swapped and never sends on a closed descriptor.
    std::mutex conn_mu;
    int sock = -1;                      // written by the monitor (and open) only, under conn_mu
    std::atomic<bool> attached{false};
    // mall_job_id()'s text: every distinct name the handle was attached under, kept until
    // mall_close() so that a pointer handed out never changes or dangles; job_name points at the
    // current one. A new entry only when a re-attach names a job never seen before (malld lost its
    // state and self-registered the process anew): a handful per handle at most.
    std::forward_list<std::string> job_names;  // written by the monitor (and open), under conn_mu
    std::atomic<const char *> job_name{""};

    // --- the change path ---
    std::mutex step_mu;     // one change path at a time; guards scratch
    mall_alloc_t scratch{};  // the snapshot being applied (kept off the caller's stack)
    std::mutex state_mu;    // guards applied
    mall_alloc_t applied{};
    std::mutex callbacks_mu;
    ResizeCallback callbacks[kMaxCallbacks] = {};
    int ncallbacks = 0;
    std::mutex threads_mu;
    pid_t threads[kMaxBoundThreads] = {};
    int nthreads = 0;
    // notify_mu makes "user_event_fd is readable" match "the page holds an unapplied generation":
    // the monitor signals and the change path drains under it.
    std::mutex notify_mu;
    bool user_fd_signaled = false;  // under notify_mu: false = surely not readable (saves a read())
    // Notification by signal (mall_open_ex's notify_signal, $MALL_NOTIFY_SIGNAL): 0 = none. Under
    // notify_mu: the last generation signalled, and whether the "no handler" warning was given.
    int notify_signal = 0;
    uint64_t notified_generation = 0;
    bool notify_warned = false;
    // Control by signal: the cpus the process had at mall_open() (requests stay within them).
    bool signal_control = false;
    uint64_t control_bound[MALL_MAX_CPUS / 64] = {};
    // Under state_mu: the cpus of malld's last applied generation (a signal request never widens
    // past them) and that page's flags (kPageFlagSignalControl: malld lets the job take requests).
    bool has_malld_cpus = false;
    uint64_t malld_cpus[MALL_MAX_CPUS / 64] = {};
    int malld_threads = 0;  // the thread count of that generation
    uint32_t page_flags = 0;
    // Under step_mu: a signal request pinned every thread; malld's next allocation re-pins them all.
    bool control_overrode = false;

    // --- the monitor thread and its private state ---
    std::thread monitor;
    uint32_t next_request_id = 1;
    // The job a self-registration created: later attaches (after a malld restart that re-adopted
    // it) name it, since malld refuses to self-register a process that already has a job.
    std::string self_job;
    std::chrono::milliseconds first_retry{kFirstBackoff};  // after mall_open's own attempt
    milliseconds attach_timeout{kDefaultAttachTimeout};    // $MALL_ATTACH_TIMEOUT_MS
    uint64_t progress_base_units = 0, progress_base_calls = 0;
    uint64_t progress_sent_units = 0, progress_sent_calls = 0;
};

namespace {

void set_error(mall_error_t *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void set_error(mall_error_t *err, const char *fmt, ...) {
    if (!err) return;
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(err->text, sizeof err->text, fmt, ap);
    va_end(ap);
}

void clear_error(mall_error_t *err) {
    if (err) err->text[0] = '\0';
}

// Decimal text of a number (std::to_string would export a libstdc++ template from libmall.so).
std::string decimal(long long value) {
    char text[32];
    std::snprintf(text, sizeof text, "%lld", value);
    return text;
}

pid_t current_tid() { return static_cast<pid_t>(::syscall(SYS_gettid)); }

void eventfd_signal(int fd) {
    uint64_t one = 1;
    ssize_t n = ::write(fd, &one, sizeof one);
    (void)n;  // EAGAIN means it is readable already
}

void eventfd_drain(int fd) {
    uint64_t value;
    ssize_t n = ::read(fd, &value, sizeof value);
    (void)n;  // EAGAIN means it was not readable
}

cpu_set_t cpu_set_of(const uint64_t mask[MALL_MAX_CPUS / 64]) {
    cpu_set_t set;
    CPU_ZERO(&set);
    // glibc keeps cpu i at bit i % 64 of word i / 64, as the page's mask does.
    static_assert(sizeof(set.__bits[0]) == sizeof(uint64_t) && CPU_SETSIZE == MALL_MAX_CPUS,
                  "cpu_set_t and the allocation mask share their layout");
    std::memcpy(set.__bits, mask, sizeof(uint64_t) * (MALL_MAX_CPUS / 64));
    return set;
}

void tell_user(mall_handle *m, const char *what);
void refresh_record(mall_handle *m);  // control by signal: the status record (mode, cpus)

// Queues the notification signal to this process, once per generation, unless its disposition is
// the default (it would terminate the process: nothing is sent, and the user is told once) or
// ignore. Called under notify_mu. The value is the generation's low 31 bits.
void send_notify_signal(mall_handle *m, uint64_t generation) {
    if (m->notify_signal <= 0 || generation == m->notified_generation) return;
    struct sigaction current;
    if (::sigaction(m->notify_signal, nullptr, &current) != 0) return;
    if (!(current.sa_flags & SA_SIGINFO) && current.sa_handler == SIG_DFL) {
        if (!m->notify_warned) {
            m->notify_warned = true;
            char what[160];
            std::snprintf(what, sizeof what,
                          "not sending the notification signal %d: the process has no handler for it "
                          "(its default action would end the process)", m->notify_signal);
            tell_user(m, what);
        }
        return;
    }
    if (!(current.sa_flags & SA_SIGINFO) && current.sa_handler == SIG_IGN) return;
    union sigval value;
    value.sival_int = static_cast<int>(generation & 0x7fffffff);
    // Marked only once sent: without a handler yet, or with the queue full (EAGAIN), the monitor's
    // next re-check (500 ms) tries again.
    if (::sigqueue(::getpid(), m->notify_signal, value) == 0) m->notified_generation = generation;
}

// Signals mall_fd() (and the notification signal, when asked for) when the page holds a
// generation the process has not applied.
void signal_if_pending(mall_handle *m) {
    std::lock_guard<std::mutex> lock(m->notify_mu);
    // Written even when signaled already: the caller may have read the eventfd itself.
    const uint64_t generation = page_generation(m->page);
    if (generation != m->seen_generation.load(std::memory_order_acquire)) {
        eventfd_signal(m->user_event_fd);
        m->user_fd_signaled = true;
        send_notify_signal(m, generation);
    }
}

// Sends one message on the current connection without blocking; failures are ignored (a hang-up
// is noticed by the monitor, and malld's ack timeout covers a lost ack).
void send_nonblocking(mall_handle *m, mall::proto::Type type, nlohmann::json body) {
    mall::proto::Message msg;
    msg.type = type;
    msg.body = std::move(body);
    std::string packet = mall::proto::encode(msg);
    std::lock_guard<std::mutex> lock(m->conn_mu);
    if (m->sock >= 0) mall::send_packet(m->sock, packet, -1, true);
}

// ---------------------------------------------------------------------------------------------
// Attaching

int remaining_ms(Clock::time_point deadline) {
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    return left > 0 ? static_cast<int>(std::min<int64_t>(left, 60000)) : 0;
}

// True while addr starts a mapped page (mincore fails with ENOMEM on an unmapped one).
bool page_is_mapped(void *addr) {
    unsigned char resident;
    return ::mincore(addr, mall::kSharedPageSize, &resident) == 0 || errno != ENOMEM;
}

// Moves the job's page, mapped at `incoming` (which this call takes over), to the handle's fixed
// page address, where mall_step() reads it without a lock. Called with conn_mu held. One mremap
// does it: the kernel checks its limits before it lets go of the old page, so on failure the old
// page normally stays. Should the address be unmapped all the same, a zero page goes back (retried
// for up to a second under memory pressure): the fast path must never read an unmapped address.
bool install_page(mall_handle *m, void *incoming, std::string *why) {
    void *at = const_cast<mall::SharedPage *>(m->page);
    void *moved = ::mremap(incoming, mall::kSharedPageSize, mall::kSharedPageSize, MREMAP_MAYMOVE | MREMAP_FIXED, at);
    if (moved == at) return true;
    int err = errno;
    ::munmap(incoming, mall::kSharedPageSize);
    *why = std::string("cannot install malld's page: ") + std::strerror(err);
    for (int attempt = 0; !page_is_mapped(at) && attempt < 1000; ++attempt) {
        if (::mmap(at, mall::kSharedPageSize, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == at) break;
        ::usleep(1000);
    }
    return false;
}

// After a (re)attach whose page shows the generation already applied: a malld that re-adopted the
// job from its state file published nothing new, so ack that generation now (no mall_step() change
// will). A malld that lost its state counts generations from 1 again: if the same number now holds
// other cpus, make the next mall_step() apply it.
void reconcile_after_attach(mall_handle *m) {
    std::lock_guard<std::mutex> step_lock(m->step_mu);  // no change path runs meanwhile
    uint64_t seen = m->seen_generation.load(std::memory_order_acquire);
    if (seen == 0 || seen == kForceApply) return;
    mall_alloc_t &snapshot = m->scratch;
    bool consistent;
    {
        std::lock_guard<std::mutex> lock(m->conn_mu);
        consistent = mall::page_read(m->page, &snapshot);
    }
    if (!consistent || snapshot.generation != seen) return;  // the next mall_step() applies it
    bool same;
    {
        std::lock_guard<std::mutex> lock(m->state_mu);
        same = snapshot.ncpus == m->applied.ncpus && snapshot.nthreads == m->applied.nthreads &&
               std::memcmp(snapshot.mask, m->applied.mask, sizeof snapshot.mask) == 0;
    }
    if (same) {
        send_nonblocking(m, mall::proto::Type::Ack, {{"generation", seen}});
        return;
    }
    std::lock_guard<std::mutex> lock(m->notify_mu);
    m->seen_generation.store(kForceApply, std::memory_order_release);
}

// One attempt to connect and attach, bounded by the attach timeout and interrupted by mall_close().
// On success installs the connection and the page and returns MALL_SUCCESS.
int attach_with(mall_handle *m, const nlohmann::json &body, milliseconds timeout, std::string *why);

int attach_once(mall_handle *m, milliseconds timeout, std::string *why) {
    if (m->self_job.empty()) return attach_with(m, m->attach_body, timeout, why);
    int rc = attach_with(m, nlohmann::json{{"job", m->self_job}}, timeout, why);
    if (rc != MALL_ERR_NOJOB) return rc;
    // malld forgot the job (restarted without its state): register anew.
    m->self_job.clear();
    return attach_with(m, m->attach_body, timeout, why);
}

int attach_with(mall_handle *m, const nlohmann::json &body, milliseconds timeout, std::string *why) {
    const std::string &path = m->socket_path;
    auto deadline = Clock::now() + timeout;
    mall::UniqueFd sock(mall::unix_connect(path, milliseconds(0)));  // non-blocking: a full backlog fails at once
    if (!sock) {
        mall::ConnectFailure failure = mall::explain_connect_failure(path, errno, mall::SocketNaming::Environment);
        *why = failure.text();
        return failure.code;
    }

    mall::proto::Message request;
    request.type = mall::proto::Type::Attach;
    request.request_id = m->next_request_id++;
    if (m->next_request_id == 0) m->next_request_id = 1;
    request.body = body;
    if (!mall::send_packet(sock.get(), mall::proto::encode(request), -1, true)) {
        int err = errno;
        if (auto refusal = mall::pending_refusal(sock.get())) {
            *why = refusal->error;
            return refusal->code;
        }
        *why = "cannot send the attach request to malld at " + path + ": " + std::strerror(err);
        return MALL_ERR_NODAEMON;
    }

    std::string data;
    for (;;) {
        pollfd fds[2] = {{sock.get(), POLLIN, 0}, {m->stop_event_fd, POLLIN, 0}};
        int ready = ::poll(fds, 2, remaining_ms(deadline));
        if (ready < 0 && errno == EINTR) continue;
        if (ready < 0) {
            *why = std::string("waiting for malld failed: ") + std::strerror(errno);
            return MALL_ERR_SYSTEM;
        }
        if (fds[1].revents) {
            *why = "the handle was closed while attaching";
            return MALL_ERR_NODAEMON;
        }
        if (ready == 0) {
            *why = "malld at " + path + " did not answer the attach request within " +
                   decimal(timeout.count()) +
                   " ms (stuck or overloaded?); retrying in the background";
            return MALL_ERR_NODAEMON;
        }
        int passed = -1;
        ssize_t n = mall::recv_packet(sock.get(), &data, mall::proto::kMaxPacket, &passed, true);
        mall::UniqueFd page_fd(passed);
        if (n == 0) {
            *why = "malld at " + path + " closed the connection without answering the attach request";
            return MALL_ERR_NODAEMON;
        }
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) continue;
            if (errno == EMSGSIZE) {
                *why = "malld sent a packet larger than the protocol allows";
                return MALL_ERR_PROTOCOL;
            }
            int err = errno;
            if (auto refusal = mall::pending_refusal(sock.get())) {
                *why = refusal->error;
                return refusal->code;
            }
            *why = "receiving malld's attach reply failed: " + std::string(std::strerror(err));
            return MALL_ERR_NODAEMON;
        }
        std::string decode_error;
        mall::proto::DecodeFailure failure;
        auto reply = mall::proto::decode(data, &decode_error, &failure);
        if (!reply) {
            if (failure.reason == mall::proto::DecodeError::OtherVersion) {
                *why = "malld at " + path + " speaks protocol version " + decimal(failure.version) +
                       ", this libmall speaks " + decimal(mall::proto::kVersion) +
                       "; use libmall and malld from the same release";
            } else {
                *why = "cannot read malld's attach reply: " + decode_error;
            }
            return mall::proto::decode_error_code(failure.reason);
        }
        if (reply->type != mall::proto::Type::Reply) continue;
        const bool refused_connection = reply->request_id == mall::proto::kConnectionRefusalId;
        if (reply->request_id != request.request_id && !refused_connection) continue;

        const nlohmann::json &answer = reply->body;
        mall::proto::ReplyOutcome outcome = mall::proto::read_reply(answer, "attach");
        if (refused_connection) {
            *why = "malld refused the connection: " + (outcome.ok ? std::string("no reason given") : outcome.error);
            return outcome.ok ? MALL_ERR_PROTOCOL : outcome.code;
        }
        if (!outcome.ok) {
            *why = outcome.malformed ? outcome.error : "malld refused to attach: " + outcome.error;
            return outcome.code;
        }

        std::string job;
        try {
            job = mall::proto::get_string(answer, "job");
        } catch (const mall::proto::ProtocolError &e) {
            *why = std::string("malld's attach reply is malformed: ") + e.what();
            return MALL_ERR_PROTOCOL;
        }
        if (auto bad = mall::proto::invalid_job_name(job)) {
            *why = "malld's attach reply names an invalid job: " + *bad;
            return MALL_ERR_PROTOCOL;
        }
        if (!page_fd) {
            *why = "malld's attach reply carried no page descriptor";
            return MALL_ERR_PROTOCOL;
        }
        struct stat st;
        if (::fstat(page_fd.get(), &st) != 0) {
            *why = std::string("cannot inspect malld's page: ") + std::strerror(errno);
            return MALL_ERR_SYSTEM;
        }
        // A shorter file would raise SIGBUS on access: refuse it.
        if (!S_ISREG(st.st_mode) || st.st_size < static_cast<off_t>(mall::kSharedPageSize)) {
            *why = "malld's page is " + decimal(st.st_size) + " bytes, expected at least " +
                   decimal(mall::kSharedPageSize);
            return MALL_ERR_PROTOCOL;
        }
        // Mapped away from the live page and checked there; only a good page replaces it.
        void *incoming = ::mmap(nullptr, mall::kSharedPageSize, PROT_READ, MAP_SHARED, page_fd.get(), 0);
        if (incoming == MAP_FAILED) {
            *why = std::string("cannot map malld's page: ") + std::strerror(errno);
            return MALL_ERR_SYSTEM;
        }
        struct Unmap {
            void *addr;
            ~Unmap() {
                if (addr) ::munmap(addr, mall::kSharedPageSize);
            }
        } unmap_incoming{incoming};
        const auto *incoming_page = static_cast<const mall::SharedPage *>(incoming);
        uint32_t page_magic = __atomic_load_n(&incoming_page->magic, __ATOMIC_RELAXED);
        uint32_t page_version = __atomic_load_n(&incoming_page->version, __ATOMIC_RELAXED);
        if (page_magic != mall::kPageMagic) {
            *why = "malld's page does not start with the page magic";
            return MALL_ERR_PROTOCOL;
        }
        if (page_version != mall::kPageVersion) {
            *why = "malld's page has layout version " + decimal(page_version) + ", this libmall reads " +
                   decimal(mall::kPageVersion) + "; use libmall and malld from the same release";
            return MALL_ERR_VERSION;
        }

        {
            std::lock_guard<std::mutex> lock(m->conn_mu);
            unmap_incoming.addr = nullptr;  // install_page takes it over
            if (!install_page(m, incoming, why)) return MALL_ERR_SYSTEM;
            if (m->sock >= 0) ::close(m->sock);
            m->sock = sock.release();
            if (job != m->job_name.load(std::memory_order_relaxed)) {
                auto known = std::find(m->job_names.begin(), m->job_names.end(), job);
                if (known == m->job_names.end()) known = m->job_names.insert_after(m->job_names.before_begin(), job);
                m->job_name.store(known->c_str(), std::memory_order_release);
            }
            m->progress_base_units = m->work_units.load(std::memory_order_relaxed);
            m->progress_base_calls = m->progress_calls.load(std::memory_order_relaxed);
            m->progress_sent_units = 0;
            m->progress_sent_calls = 0;
            m->attached.store(true, std::memory_order_release);
        }
        if (!m->attach_body.contains("job")) m->self_job = job;
        reconcile_after_attach(m);
        signal_if_pending(m);
        refresh_record(m);
        return MALL_SUCCESS;
    }
}

void detach(mall_handle *m) {
    {
        std::lock_guard<std::mutex> lock(m->conn_mu);
        m->attached.store(false, std::memory_order_release);
        if (m->sock >= 0) ::close(m->sock);
        m->sock = -1;
        // The page stays mapped: its frozen generation keeps mall_step() on the fast path until a
        // new attachment replaces it.
    }
    refresh_record(m);
}

void send_progress_if_changed(mall_handle *m) {
    uint64_t units = m->work_units.load(std::memory_order_relaxed) - m->progress_base_units;
    uint64_t calls = m->progress_calls.load(std::memory_order_relaxed) - m->progress_base_calls;
    if (units == m->progress_sent_units && calls == m->progress_sent_calls) return;
    mall::proto::Message msg;
    msg.type = mall::proto::Type::Progress;
    msg.body = {{"work_units", units}, {"steps", calls}};
    std::string packet = mall::proto::encode(msg);
    std::lock_guard<std::mutex> lock(m->conn_mu);
    if (m->sock >= 0 && mall::send_packet(m->sock, packet, -1, true)) {
        m->progress_sent_units = units;
        m->progress_sent_calls = calls;
    }
}

// Returns false when the connection hung up.
bool read_packets(mall_handle *m, std::string *buffer) {
    for (;;) {
        ssize_t n = mall::recv_packet(m->sock, buffer, mall::proto::kMaxPacket, nullptr, true);
        if (n == 0) return false;
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
            if (errno == EMSGSIZE || errno == EINTR) continue;  // an oversized packet is skipped
            return false;
        }
        auto msg = mall::proto::decode(*buffer, nullptr);
        if (msg && msg->type == mall::proto::Type::Notify) signal_if_pending(m);
        // Other packets (events, replies to nothing) are not for this handle: ignored.
    }
}

bool wait_for_stop(mall_handle *m, milliseconds timeout) {
    pollfd pfd{m->stop_event_fd, POLLIN, 0};
    int rc = ::poll(&pfd, 1, static_cast<int>(timeout.count()));
    return rc > 0;
}

// Wait before the next attempt after one that ended with rc.
milliseconds next_backoff(int rc, milliseconds backoff) {
    if (rc == MALL_ERR_NODAEMON || rc == MALL_ERR_SYSTEM) return std::min(backoff * 2, kMaxBackoff);
    return kRefusedBackoff;
}

// One line on stderr when the connection to malld is lost and when it is back: between the two the
// process keeps the cpus it has and runs on, not malleable (mall_step() says "no change"). Written
// by the monitor only, with one write(2), never on the step path; MALL_QUIET=1 silences it.
void tell_user(mall_handle *m, const char *what) {
    static const bool quiet = [] {
        const char *q = std::getenv("MALL_QUIET");
        return q != nullptr && q[0] == '1';
    }();
    if (quiet) return;
    std::string line = "mall: " + std::string(what) + " (job " + std::string(m->job_name.load()) +
                       ", malld at " + m->socket_path + ", pid " + std::to_string(::getpid()) + ")\n";
    ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
    (void)ignored;
}

void monitor_loop(mall_handle *m) {
    milliseconds backoff = m->first_retry;
    bool lost = false;  // the connection was lost and not yet back (tell_user said so)
    auto next_progress = Clock::now() + kProgressInterval;
    std::string buffer;
    for (;;) {
        try {
            if (!m->attached.load(std::memory_order_acquire)) {
                if (wait_for_stop(m, backoff)) return;
                std::string why;
                // The monitor's own thread may wait the default even when mall_open() may not.
                int rc = attach_once(m, std::max(m->attach_timeout, kDefaultAttachTimeout), &why);
                if (rc == MALL_SUCCESS) {
                    if (lost) tell_user(m, "reconnected to malld: malleable again");
                    lost = false;
                    // A new connection (maybe a restarted malld): tell it the usage cap again.
                    if (int cap = m->usage_cap.load(); cap > 0)
                        send_nonblocking(m, mall::proto::Type::Usage, {{"cpus_used", cap}});
                    backoff = kFirstBackoff;
                    next_progress = Clock::now() + kProgressInterval;
                } else {
                    backoff = next_backoff(rc, backoff);
                }
                continue;
            }
            int timeout = remaining_ms(next_progress);
            pollfd fds[2] = {{m->sock, POLLIN, 0}, {m->stop_event_fd, POLLIN, 0}};
            int ready = ::poll(fds, 2, timeout);
            if (ready < 0 && errno != EINTR) {
                if (wait_for_stop(m, milliseconds(100))) return;
                continue;
            }
            if (ready > 0 && fds[1].revents) return;
            if (ready > 0 && fds[0].revents) {
                if (!read_packets(m, &buffer)) {
                    detach(m);
                    if (!lost)
                        tell_user(m, "lost the connection to malld: this process keeps its cpus and runs on, "
                                     "not malleable, until malld is back");
                    lost = true;
                    backoff = kFirstBackoff;
                    continue;
                }
            }
            if (Clock::now() >= next_progress) {
                send_progress_if_changed(m);
                signal_if_pending(m);  // covers a Notify that never came
                next_progress = Clock::now() + kProgressInterval;
            }
        } catch (...) {
            // Out of memory or similar: never let it end the process; try again a little later.
            if (wait_for_stop(m, milliseconds(100))) return;
        }
    }
}

void monitor_main(mall_handle *m) noexcept {
    try {
        monitor_loop(m);
    } catch (...) {
    }
}

// Starts the monitor with every signal blocked from its first instruction on (quiet_thread.hpp):
// the host's signal handlers keep running on the host's threads.
bool start_monitor(mall_handle *m) {
    bool started = true;
    try {
        m->monitor = mall::start_quiet_thread([m] { monitor_main(m); });
    } catch (...) {
        started = false;
    }
    return started;
}

// ---------------------------------------------------------------------------------------------
// Control by signal. One handle per process owns the control signal; its handler only records the
// request (the last one wins) and makes the next mall_step() take the change path, by storing
// kForceApply into the same word the fast path already compares: no second load there.

struct SignalControlBlock {
    std::atomic<mall_handle *> owner{nullptr};
    std::atomic<uint64_t> request{0};  // (sender pid << 32) | value; 0 = none
    std::atomic<int> in_handler{0};
    std::atomic<uint64_t> received{0};
    int signal = 0;
    struct sigaction previous {};
    // The status record `mallctl signal` reads (signal_control.hpp), under record_mu: the decided
    // requests and the last one's outcome. Written on the change path and at (de)attach only.
    std::mutex record_mu;
    int record_fd = -1;
    uint64_t record_seq = 0, handled = 0;
    uint32_t last_value = 0;
    pid_t last_from = 0;
    const char *last_result = "none";
    char last_why[512] = "";
    char record[mall::signal_control::kRecordSize];
};
SignalControlBlock g_control;  // never destroyed: a late signal finds it

// A forked child (a data-loader worker, say) is not the process that opted in: it drops the
// handle and its copy of the record, so `mallctl signal` refuses it ("not enabled"); the handler
// it inherits ignores requests. Runs in the child only (no lock: another thread may have held one).
void control_after_fork_in_child() {
    new (&g_control.record_mu) std::mutex();  // another thread may have held it at the fork
    g_control.owner.store(nullptr);
    g_control.request.store(0);
    if (g_control.record_fd >= 0) ::close(g_control.record_fd);
    g_control.record_fd = -1;
}

void control_handler(int, siginfo_t *info, void *) {
    const int saved_errno = errno;
    g_control.in_handler.fetch_add(1);
    if (info != nullptr && info->si_code == SI_QUEUE) {
        const auto value = static_cast<uint32_t>(info->si_value.sival_int);
        mall_handle *h = g_control.owner.load();
        if (h != nullptr && mall::signal_control::decode(value)) {
            g_control.request.store((static_cast<uint64_t>(static_cast<uint32_t>(info->si_pid)) << 32) | value);
            g_control.received.fetch_add(1);
            h->seen_generation.store(kForceApply);
            // Wake mall_fd() users too (write(2) is async-signal-safe; the change path drains it).
            const uint64_t one = 1;
            if (h->user_event_fd >= 0) (void)!::write(h->user_event_fd, &one, sizeof one);
        }
    }
    g_control.in_handler.fetch_sub(1);
    errno = saved_errno;
}

void destroy(mall_handle *m) {
    bool leak = false;
    if (m->monitor.joinable()) {
        eventfd_signal(m->stop_event_fd);
        m->monitor.join();
    }
    if (m->signal_control && g_control.owner.load() == m) {
        // No handler may still use this handle: unhook it, wait for a running one (bounded), and
        // leave the signal ignored rather than at its default, which would end the process.
        g_control.owner.store(nullptr);
        for (int i = 0; i < 100000 && g_control.in_handler.load() != 0; ++i) sched_yield();
        // A handler still inside (its thread descheduled for long) may yet touch the handle and
        // write to its eventfd: leak both rather than free them under it.
        leak = g_control.in_handler.load() != 0;
        struct sigaction restore = g_control.previous;
        if (!(restore.sa_flags & SA_SIGINFO) && restore.sa_handler == SIG_DFL) restore.sa_handler = SIG_IGN;
        ::sigaction(g_control.signal, &restore, nullptr);
        g_control.request.store(0);
        std::lock_guard<std::mutex> lock(g_control.record_mu);
        if (g_control.record_fd >= 0) ::close(g_control.record_fd);  // mallctl: "not enabled"
        g_control.record_fd = -1;
    }
    if (m->page) ::munmap(const_cast<mall::SharedPage *>(m->page), mall::kSharedPageSize);
    if (m->sock >= 0) ::close(m->sock);
    if (m->user_event_fd >= 0 && !leak) ::close(m->user_event_fd);
    if (m->stop_event_fd >= 0) ::close(m->stop_event_fd);
    // No callback can run any more (mall_step() must not race mall_close()): release their arguments.
    for (int i = 0; i < m->ncallbacks; ++i) {
        if (m->callbacks[i].release) m->callbacks[i].release(m->callbacks[i].arg);
    }
    if (!leak) delete m;
}

// Parses $name as an integer in [min, max]; unset or empty gives fallback. False when malformed.
bool env_int(const char *name, long min, long max, long fallback, long *out) {
    const char *text = std::getenv(name);
    if (!text || !*text) {
        *out = fallback;
        return true;
    }
    errno = 0;
    char *end = nullptr;
    long value = std::strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || value < min || value > max) return false;
    *out = value;
    return true;
}

// ---------------------------------------------------------------------------------------------
// The change path of mall_step()

void repin_bound_threads(mall_handle *m, const mall_alloc_t &alloc) {
    std::lock_guard<std::mutex> lock(m->threads_mu);
    if (m->nthreads == 0) return;
    cpu_set_t set = cpu_set_of(alloc.mask);
    pid_t pid = ::getpid();
    int kept = 0;
    for (int i = 0; i < m->nthreads; ++i) {
        pid_t tid = m->threads[i];
        // tgkill(.., 0) checks that the tid is still a thread of this process: a tid of an exited
        // thread may be reused by another process, which must never be re-pinned.
        if (::syscall(SYS_tgkill, pid, tid, 0) != 0 && errno == ESRCH) continue;
        if (::sched_setaffinity(tid, sizeof set, &set) != 0 && errno == ESRCH) continue;
        m->threads[kept++] = tid;
    }
    m->nthreads = kept;
}

// Marks generation as applied and leaves user_event_fd readable only if a newer one is waiting.
void finish_change(mall_handle *m, uint64_t generation) {
    std::lock_guard<std::mutex> lock(m->notify_mu);
    m->seen_generation.store(generation, std::memory_order_release);
    bool pending = page_generation(m->page) != generation;
    // A control signal's handler may have made the eventfd readable behind user_fd_signaled.
    if ((m->user_fd_signaled || m->signal_control) && !pending) {
        eventfd_drain(m->user_event_fd);
        m->user_fd_signaled = false;
    } else if (!m->user_fd_signaled && pending) {
        eventfd_signal(m->user_event_fd);
        m->user_fd_signaled = true;
    }
}

// Every thread of the process on `set` (what malld's affinity backend does for a job).
void pin_every_thread(const cpu_set_t &set) {
    DIR *dir = ::opendir("/proc/self/task");
    if (dir == nullptr) return;
    while (dirent *e = ::readdir(dir)) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        (void)::sched_setaffinity(static_cast<pid_t>(std::strtol(e->d_name, nullptr, 10)), sizeof set, &set);
    }
    ::closedir(dir);
}

void run_callbacks(mall_handle *m, const mall_alloc_t &alloc);

// Rewrites the status record (under record_mu; the caller holds no lock of the handle's but
// possibly step_mu). One pwrite of the whole record: a reader compares seq with end.
// What a control request is judged against, read once under state_mu: the applied allocation,
// the cpus requests stay within (malld's last, else the opening affinity), whether malld's page
// allows requests, and malld's thread count (0 when malld never gave one).
struct ControlView {
    mall_alloc_t current;
    mall::CpuSet bound;
    bool allowed = false;
    int malld_threads = 0;
};

ControlView control_view(mall_handle *m) {
    ControlView v;
    std::lock_guard<std::mutex> lock(m->state_mu);
    v.current = m->applied;
    v.bound = mall::CpuSet::from_mask(m->has_malld_cpus ? m->malld_cpus : m->control_bound);
    v.allowed = (m->page_flags & mall::kPageFlagSignalControl) != 0;
    v.malld_threads = m->has_malld_cpus ? m->malld_threads : 0;
    return v;
}

void write_record_locked(mall_handle *m) {
    namespace sc = mall::signal_control;
    if (g_control.record_fd < 0) return;
    const ControlView view = control_view(m);
    const mall_alloc_t &current = view.current;
    const bool attached = m->attached.load(std::memory_order_acquire);
    const bool allowed = view.allowed;
    const mall::CpuSet bound = attached && !allowed ? mall::CpuSet() : view.bound;
    const mall::CpuSet cpus = current.ncpus > 0 ? mall::CpuSet::from_mask(current.mask)
                                                : mall::CpuSet::from_mask(m->control_bound);
    const int threads = current.ncpus > 0 ? mall_alloc_threads(&current) : cpus.count();
    const uint64_t seq = ++g_control.record_seq;
    std::memset(g_control.record, 0, sizeof g_control.record);
    std::snprintf(g_control.record, sizeof g_control.record,
                  "%s %d\nseq %llu\npid %ld\nsignal %d\napi %d.%d.%d\nmode %s\njob %s\nallowed %d\nbound %s\n"
                  "cpus %s\nthreads %d\nreceived %llu\nhandled %llu\nlast %x\nfrom %ld\nresult %s\nwhy %s\nend %llu\n",
                  sc::kRecordName, sc::kRecordFormat, static_cast<unsigned long long>(seq),
                  static_cast<long>(::getpid()), g_control.signal, MALL_API_VERSION_MAJOR, MALL_API_VERSION_MINOR,
                  MALL_API_VERSION_PATCH, attached ? "attached" : "detached",
                  attached ? m->job_name.load(std::memory_order_acquire) : "", allowed ? 1 : 0,
                  bound.to_string().c_str(), cpus.to_string().c_str(), threads,
                  static_cast<unsigned long long>(g_control.received.load()),
                  static_cast<unsigned long long>(g_control.handled), g_control.last_value,
                  static_cast<long>(g_control.last_from), g_control.last_result, g_control.last_why,
                  static_cast<unsigned long long>(seq));
    (void)!::pwrite(g_control.record_fd, g_control.record, sizeof g_control.record, 0);
}

void refresh_record(mall_handle *m) {
    if (!m->signal_control) return;
    try {
        std::lock_guard<std::mutex> lock(g_control.record_mu);
        write_record_locked(m);
    } catch (...) {
    }
}

// Records how a request ended and why (printf-style words), then rewrites the record.
void decide_request(mall_handle *m, uint64_t request, const char *result, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void decide_request(mall_handle *m, uint64_t request, const char *result, const char *fmt, ...) {
    try {
        std::lock_guard<std::mutex> lock(g_control.record_mu);
        ++g_control.handled;
        g_control.last_value = static_cast<uint32_t>(request & 0xffffffffu);
        g_control.last_from = static_cast<pid_t>(request >> 32);
        g_control.last_result = result;
        va_list ap;
        va_start(ap, fmt);
        std::vsnprintf(g_control.last_why, sizeof g_control.last_why, fmt, ap);
        va_end(ap);
        for (char *c = g_control.last_why; *c; ++c)
            if (*c == '\n') *c = ' ';
        write_record_locked(m);
    } catch (...) {
    }
}

// Applies a control request (called under step_mu): true when it changed the allocation.
// Never attached: within the cpus the process had at mall_open(). Attached: only when malld lets
// the job take signals (mallctl set JOB --signal-control on), within malld's published cpus
// (narrowing); malld's next generation replaces it. Once attached, malld's last cpus bound it.
bool apply_control_request(mall_handle *m, uint64_t request) {
    namespace sc = mall::signal_control;
    const auto decoded = sc::decode(static_cast<uint32_t>(request & 0xffffffffu));
    if (!decoded) {
        decide_request(m, request, "refused", "the value %#x is not a mall request", static_cast<unsigned>(request));
        return false;
    }
    const ControlView view = control_view(m);
    const mall_alloc_t &current = view.current;
    const mall::CpuSet &bound = view.bound;
    const int malld_threads = view.malld_threads;
    const char *job = m->job_name.load(std::memory_order_acquire);
    if (m->attached.load(std::memory_order_acquire) && !view.allowed) {
        decide_request(m, request, "refused",
                       "attached to malld as job %s, whose allocation wins: use `mallctl set %s --threads N` or "
                       "`--cpus LIST`, or let the job take signals with `mallctl set %s --signal-control on`",
                       job, job, job);
        return false;
    }
    if (m->attached.load(std::memory_order_acquire) && !m->has_malld_cpus) {
        decide_request(m, request, "refused", "attached to malld as job %s but no allocation was applied yet", job);
        return false;
    }
    mall::CpuSet cpus = current.ncpus > 0 ? mall::CpuSet::from_mask(current.mask) : bound;
    if (decoded->op == sc::Op::Range) cpus = mall::CpuSet::range(decoded->first_cpu, decoded->first_cpu + decoded->cpu_count - 1);
    if (!bound.contains(cpus)) {
        decide_request(m, request, "refused", "cpus %s are not all within %s, the cpus this process may use (%s)",
                       cpus.to_string().c_str(), bound.to_string().c_str(),
                       m->has_malld_cpus ? "malld's allocation" : "its affinity at mall_open()");
        return false;
    }
    if (decoded->threads > cpus.count()) {
        decide_request(m, request, "refused", "%d threads exceed the %d cpus (%s) of this process", decoded->threads,
                       cpus.count(), cpus.to_string().c_str());
        return false;
    }
    // Under malld (or after it), malld's thread count is a bound too: a request only narrows.
    if (malld_threads > 0 && decoded->threads > malld_threads) {
        decide_request(m, request, "refused", "%d threads exceed the %d malld gave this process", decoded->threads,
                       malld_threads);
        return false;
    }
    mall_alloc_t &next = m->scratch;
    next = mall_alloc_t{};
    next.generation = current.generation;  // malld's generation (0 without malld): unchanged
    next.ncpus = cpus.count();
    next.nthreads = decoded->threads > 0 ? decoded->threads : next.ncpus;
    if (malld_threads > 0 && next.nthreads > malld_threads) next.nthreads = malld_threads;
    cpus.to_mask(next.mask);
    std::snprintf(next.cpus, sizeof next.cpus, "%s", cpus.to_string().c_str());
    {
        std::lock_guard<std::mutex> lock(m->state_mu);
        m->applied = next;
    }
    run_callbacks(m, next);
    repin_bound_threads(m, next);
    pin_every_thread(cpu_set_of(next.mask));
    m->control_overrode = true;
    decide_request(m, request, "applied", "%d threads on cpus %s", next.nthreads, next.cpus);
    return true;
}

void run_callbacks(mall_handle *m, const mall_alloc_t &alloc) {
    ResizeCallback callbacks[kMaxCallbacks];
    int ncallbacks;
    {
        std::lock_guard<std::mutex> lock(m->callbacks_mu);
        ncallbacks = m->ncallbacks;
        std::copy(m->callbacks, m->callbacks + ncallbacks, callbacks);
    }
    for (int i = 0; i < ncallbacks; ++i) {
        try {
            callbacks[i].fn(&alloc, callbacks[i].arg);
        } catch (...) {
            // A C++ callback that throws must not unwind into the caller's C frames.
        }
    }
}

// After finish_change(): a request that arrived meanwhile makes the next mall_step() look again.
void recheck_control_request(mall_handle *m) {
    if (g_control.owner.load() == m && g_control.request.load() != 0) m->seen_generation.store(kForceApply);
}

__attribute__((noinline, cold)) int apply_change(mall_handle *m) {
    std::lock_guard<std::mutex> step_lock(m->step_mu);
    mall_alloc_t &snapshot = m->scratch;
    bool consistent;
    uint32_t page_flags = 0;
    {
        std::lock_guard<std::mutex> lock(m->conn_mu);
        consistent = mall::page_read(m->page, &snapshot, &page_flags);
    }
    const bool control_pending = m->signal_control && g_control.owner.load() == m && g_control.request.load() != 0;
    // Never attached, the page is a zero page (no magic): generation 0 for a control request.
    if (!consistent && control_pending && !m->attached.load(std::memory_order_acquire)) {
        snapshot = mall_alloc_t{};
        consistent = true;
    }
    if (!consistent) {
        // The private zero page of a handle never attached, with a stray force (a control signal
        // whose request a step took already): back to the fast path. A torn page: next step.
        if (!m->attached.load(std::memory_order_acquire) &&
            __atomic_load_n(&m->page->magic, __ATOMIC_RELAXED) != mall::kPageMagic)
            finish_change(m, page_generation(m->page));
        return MALL_NOUPDT;
    }
    uint64_t generation = snapshot.generation;
    // Does the page hold what was applied last (same generation, and malld's same cpus, thread
    // count and flags)? A control request applies only then; a later page replaces it.
    bool page_unchanged;
    {
        std::lock_guard<std::mutex> lock(m->state_mu);
        page_unchanged = generation == m->applied.generation &&
                         (!m->has_malld_cpus ||
                          (std::memcmp(snapshot.mask, m->malld_cpus, sizeof m->malld_cpus) == 0 &&
                           mall_alloc_threads(&snapshot) == m->malld_threads && page_flags == m->page_flags));
    }
    if (control_pending) {
        // A control request, unless malld published something new (that wins: the request is dropped).
        const uint64_t request = g_control.request.exchange(0);
        if (page_unchanged) {
            const bool changed = apply_control_request(m, request);
            finish_change(m, generation);
            recheck_control_request(m);
            return changed ? MALL_SUCCESS : MALL_NOUPDT;
        }
        decide_request(m, request, "superseded",
                       "malld published generation %llu, which replaces any request made before it",
                       static_cast<unsigned long long>(generation));
    }
    if (generation == m->seen_generation.load(std::memory_order_relaxed)) return MALL_NOUPDT;
    if (page_unchanged && m->has_malld_cpus) {
        // Forced (a control signal's handler stored its marker after a step took the request, or
        // a re-attach), but the page holds what was applied: ack it again (a re-attached malld may
        // wait for it), change nothing, and go back to the fast path.
        try {
            send_nonblocking(m, mall::proto::Type::Ack, {{"generation", generation}});
        } catch (...) {
        }
        finish_change(m, generation);
        recheck_control_request(m);
        return MALL_NOUPDT;
    }

    if (snapshot.ncpus <= 0) {
        // Nothing a process can run on: acknowledge it but keep the last allocation.
        try {
            send_nonblocking(m, mall::proto::Type::Ack, {{"generation", generation}});
        } catch (...) {
        }
        finish_change(m, generation);
        return MALL_NOUPDT;
    }

    {
        std::lock_guard<std::mutex> lock(m->state_mu);
        m->applied = snapshot;
        std::memcpy(m->malld_cpus, snapshot.mask, sizeof m->malld_cpus);
        m->has_malld_cpus = true;
        m->malld_threads = mall_alloc_threads(&snapshot);
        m->page_flags = page_flags;
    }
    run_callbacks(m, snapshot);
    repin_bound_threads(m, snapshot);
    if (m->control_overrode) {
        // A signal request had pinned every thread: malld's allocation replaces it for them all.
        pin_every_thread(cpu_set_of(snapshot.mask));
        m->control_overrode = false;
    }
    try {
        send_nonblocking(m, mall::proto::Type::Ack, {{"generation", generation}});
    } catch (...) {
        // Out of memory: malld's ack timeout covers the missing ack.
    }
    finish_change(m, generation);
    recheck_control_request(m);
    refresh_record(m);
    return MALL_SUCCESS;
}

// A notification signal's name or number: SIGUSR1, SIGUSR2, SIGRTMIN, SIGRTMIN+N, SIGRTMAX-N,
// SIGRTMAX (the "SIG" prefix may be left out) or its number; only those signals are allowed (the
// others have meanings of their own). 0 with *why when not.
int parse_notify_signal(const std::string &text, std::string *why) {
    std::string s = text;
    if (s.rfind("SIG", 0) == 0) s = s.substr(3);
    auto number = [](const std::string &digits, long *out) {
        if (digits.empty() || digits.size() > 4) return false;
        for (char c : digits)
            if (c < '0' || c > '9') return false;
        *out = std::strtol(digits.c_str(), nullptr, 10);
        return true;
    };
    long sig = -1, n = 0;
    if (s == "USR1") sig = SIGUSR1;
    else if (s == "USR2") sig = SIGUSR2;
    else if (s == "RTMIN") sig = SIGRTMIN;
    else if (s == "RTMAX") sig = SIGRTMAX;
    else if (s.rfind("RTMIN+", 0) == 0 && number(s.substr(6), &n)) sig = SIGRTMIN + n;
    else if (s.rfind("RTMAX-", 0) == 0 && number(s.substr(6), &n)) sig = SIGRTMAX - n;
    else if (!number(s, &sig)) sig = -1;
    if (sig == SIGUSR1 || sig == SIGUSR2 || (sig >= SIGRTMIN && sig <= SIGRTMAX)) return static_cast<int>(sig);
    *why = "'" + text + "' is not SIGUSR1, SIGUSR2 or a real-time signal SIGRTMIN..SIGRTMAX (SIGRTMIN+N, SIGRTMAX-N, " +
           std::to_string(SIGRTMIN) + ".." + std::to_string(SIGRTMAX) + " here)";
    return 0;
}

}  // namespace

// -------------------------------------------------------------------------------------------------
// The C API

extern "C" {

MALL_EXPORT int mall_get_api_version(void) { return MALL_API_VERSION; }

MALL_EXPORT const char *mall_strerror(int rc) {
    switch (rc) {
        case MALL_SUCCESS: return "success";
        case MALL_NOUPDT: return "no update: the allocation did not change";
        case MALL_ERR_INVAL: return "invalid argument";
        case MALL_ERR_NODAEMON: return "no node manager (malld) answered; the handle is detached";
        case MALL_ERR_DENIED: return "the node manager refused the request";
        case MALL_ERR_NOJOB: return "no registration for this process and self-registration is off";
        case MALL_ERR_PROTOCOL: return "the node manager sent something this library cannot read";
        case MALL_ERR_NOMEM: return "out of memory";
        case MALL_ERR_SYSTEM: return "a system call failed";
        case MALL_ERR_DETACHED: return "the handle is not connected to a node manager";
        case MALL_ERR_VERSION: return "the node manager speaks an incompatible protocol version";
        case MALL_ERR_FULL: return "a fixed-size table is full";
        default: return "unknown mall error";
    }
}

MALL_EXPORT int mall_open(const char *socket_path, mall_t **out, mall_error_t *err) {
    mall_open_options_t options = MALL_OPEN_OPTIONS_INIT;
    options.socket_path = socket_path;
    return mall_open_ex(&options, out, err);
}

MALL_EXPORT int mall_open_ex(const mall_open_options_t *options, mall_t **out, mall_error_t *err) {
    clear_error(err);
    if (!out) {
        set_error(err, "mall_open: out must point at a mall_t * to fill");
        return MALL_ERR_INVAL;
    }
    *out = nullptr;
    // The options of API 0.3.0 (a caller built against a later header may pass a larger struct
    // whose extra bytes must then be zero: options this library does not know are refused).
    constexpr size_t kKnownSize = sizeof(mall_open_options_t);  // with its tail padding
    if (!options || options->size < kKnownSize) {
        set_error(err, "mall_open_ex: options must be set up with MALL_OPEN_OPTIONS_INIT (size %zu or more)", kKnownSize);
        return MALL_ERR_INVAL;
    }
    for (size_t i = kKnownSize; i < options->size; ++i) {
        if (reinterpret_cast<const unsigned char *>(options)[i] != 0) {
            set_error(err, "mall_open_ex: options of a newer libmall are set (byte %zu); this library is API %d.%d.%d",
                      i, MALL_API_VERSION_MAJOR, MALL_API_VERSION_MINOR, MALL_API_VERSION_PATCH);
            return MALL_ERR_INVAL;
        }
    }
    if (options->flags != 0) {
        set_error(err, "mall_open_ex: unknown flags 0x%x (none are defined in API %d.%d)", options->flags,
                  MALL_API_VERSION_MAJOR, MALL_API_VERSION_MINOR);
        return MALL_ERR_INVAL;
    }
    const char *socket_path = options->socket_path;
    mall_handle *m = nullptr;
    try {
        // The notification signal: the option, else $MALL_NOTIFY_SIGNAL, else none.
        int notify_signal = 0;
        if (options->notify_signal > 0) {
            std::string why;
            notify_signal = parse_notify_signal(std::to_string(options->notify_signal), &why);
            if (notify_signal == 0) {
                set_error(err, "mall_open_ex: notify_signal %s", why.c_str());
                return MALL_ERR_INVAL;
            }
        } else if (options->notify_signal == 0) {
            const char *env = std::getenv("MALL_NOTIFY_SIGNAL");
            if (env && *env) {
                std::string why;
                notify_signal = parse_notify_signal(env, &why);
                if (notify_signal == 0) {
                    set_error(err, "MALL_NOTIFY_SIGNAL: %s; unset it or name one of those", why.c_str());
                    return MALL_ERR_INVAL;
                }
            }
        } else if (options->notify_signal != -1) {
            set_error(err, "mall_open_ex: notify_signal must be -1 (none), 0 ($MALL_NOTIFY_SIGNAL) or a signal number");
            return MALL_ERR_INVAL;
        }
        // Control by signal: the option, else $MALL_SIGNAL_CONTROL (1 = the default signal), else off.
        int control_signal = 0;
        {
            std::string text;
            if (options->control_signal > 0) {
                text = std::to_string(options->control_signal);
            } else if (options->control_signal == 0) {
                const char *env = std::getenv("MALL_SIGNAL_CONTROL");
                text = env ? env : "";
                if (text == "0") text.clear();
                if (text == "1") text = "SIGRTMAX-7";
            } else if (options->control_signal != -1) {
                set_error(err, "mall_open_ex: control_signal must be -1 (off), 0 ($MALL_SIGNAL_CONTROL) or a real-time signal");
                return MALL_ERR_INVAL;
            }
            if (!text.empty()) {
                std::string why;
                control_signal = parse_notify_signal(text, &why);
                if (control_signal == SIGUSR1 || control_signal == SIGUSR2) {
                    control_signal = 0;
                    why = "'" + text + "' is not a real-time signal (a standard signal would drop queued values)";
                }
                if (control_signal == 0) {
                    set_error(err, "MALL_SIGNAL_CONTROL (or control_signal): %s; use 1 for SIGRTMAX-7", why.c_str());
                    return MALL_ERR_INVAL;
                }
                if (control_signal == notify_signal) {
                    set_error(err, "the control signal %d is also the notification signal: choose two", control_signal);
                    return MALL_ERR_INVAL;
                }
            }
        }
        // The attach request, from the environment the launcher set.
        nlohmann::json attach_body = nlohmann::json::object();
        const char *job = std::getenv("MALL_JOB_ID");
        if (job && *job) {
            if (auto bad = mall::proto::invalid_job_name(job)) {
                set_error(err, "MALL_JOB_ID is not a valid job name: %s", bad->c_str());
                return MALL_ERR_INVAL;
            }
            attach_body["job"] = job;
        } else {
            long min = 1, max = 0;
            if (!env_int("MALL_MIN", 1, MALL_MAX_CPUS, 1, &min)) {
                set_error(err, "MALL_MIN must be a whole number from 1 to %d (or unset)", MALL_MAX_CPUS);
                return MALL_ERR_INVAL;
            }
            if (!env_int("MALL_MAX", 0, MALL_MAX_CPUS, 0, &max)) {
                set_error(err, "MALL_MAX must be a whole number from 0 (whole pool) to %d (or unset)", MALL_MAX_CPUS);
                return MALL_ERR_INVAL;
            }
            if (max != 0 && max < min) {
                set_error(err, "MALL_MAX (%ld) is below MALL_MIN (%ld)", max, min);
                return MALL_ERR_INVAL;
            }
            attach_body["min"] = min;
            if (max != 0) attach_body["max"] = max;  // no "max" asks for up to the whole pool
        }

        long attach_timeout_ms = 0;
        if (!env_int("MALL_ATTACH_TIMEOUT_MS", 0, kMaxAttachTimeoutMs, kDefaultAttachTimeout.count(),
                     &attach_timeout_ms)) {
            set_error(err, "MALL_ATTACH_TIMEOUT_MS must be a whole number of milliseconds from 0 to %ld (or unset)",
                      kMaxAttachTimeoutMs);
            return MALL_ERR_INVAL;
        }

        m = new (std::nothrow) mall_handle();
        if (!m) {
            set_error(err, "mall_open: out of memory");
            return MALL_ERR_NOMEM;
        }
        m->attach_timeout = milliseconds(attach_timeout_ms);
        m->notify_signal = notify_signal;
        if (control_signal > 0) {
            // One handle per process; a signal that already has a handler is someone else's.
            mall_handle *expected = nullptr;
            if (!g_control.owner.compare_exchange_strong(expected, m)) {
                set_error(err, "control by signal is already enabled by another mall handle of this process");
                delete m;
                return MALL_ERR_INVAL;
            }
            struct sigaction current {};
            ::sigaction(control_signal, nullptr, &current);
            const bool ours = (current.sa_flags & SA_SIGINFO) && current.sa_sigaction == control_handler;
            if (!ours && ((current.sa_flags & SA_SIGINFO) || (current.sa_handler != SIG_DFL && current.sa_handler != SIG_IGN))) {
                g_control.owner.store(nullptr);
                set_error(err, "signal %d already has a handler in this process; choose another real-time signal "
                               "(MALL_SIGNAL_CONTROL=SIGRTMAX-N)", control_signal);
                delete m;
                return MALL_ERR_INVAL;
            }
            cpu_set_t bound;
            CPU_ZERO(&bound);
            (void)::sched_getaffinity(0, sizeof bound, &bound);
            // Nothing from the claim above to signal_control = true may throw (destroy() would
            // then leave the claim behind): the mask is built in place, without allocating.
            for (int c = 0; c < CPU_SETSIZE && c < MALL_MAX_CPUS; ++c)
                if (CPU_ISSET(c, &bound)) m->control_bound[c / 64] |= uint64_t{1} << (c % 64);
            g_control.request.store(0);
            if (!ours) g_control.previous = current;
            g_control.signal = control_signal;
            struct sigaction sa {};
            sa.sa_sigaction = control_handler;
            sa.sa_flags = SA_SIGINFO | SA_RESTART;
            sigemptyset(&sa.sa_mask);
            ::sigaction(control_signal, &sa, nullptr);
            m->signal_control = true;
            static std::once_flag fork_hook;
            std::call_once(fork_hook, [] { (void)::pthread_atfork(nullptr, nullptr, control_after_fork_in_child); });
            std::lock_guard<std::mutex> lock(g_control.record_mu);
            if (g_control.record_fd < 0) {
                g_control.record_fd = static_cast<int>(::syscall(SYS_memfd_create, mall::signal_control::kRecordName, MFD_CLOEXEC));
                if (g_control.record_fd >= 0 &&
                    ::ftruncate(g_control.record_fd, static_cast<off_t>(mall::signal_control::kRecordSize)) != 0) {
                    ::close(g_control.record_fd);
                    g_control.record_fd = -1;
                }
            }
            g_control.handled = 0;
            g_control.last_value = 0;
            g_control.last_from = 0;
            g_control.last_result = "none";
            g_control.last_why[0] = '\0';
            write_record_locked(m);
        }
        m->socket_path = mall::resolve_socket_path(socket_path ? socket_path : "");
        m->attach_body = std::move(attach_body);

        // Until attached, the page is a private zero page (generation 0 = nothing to apply).
        void *zero = ::mmap(nullptr, mall::kSharedPageSize, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (zero == MAP_FAILED) {
            int e = errno;
            set_error(err, "mall_open: cannot map a page: %s", std::strerror(e));
            destroy(m);  // also unhooks the control signal
            return e == ENOMEM ? MALL_ERR_NOMEM : MALL_ERR_SYSTEM;
        }
        m->page = static_cast<const mall::SharedPage *>(zero);
        m->user_event_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        m->stop_event_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (m->user_event_fd < 0 || m->stop_event_fd < 0) {
            int e = errno;
            set_error(err, "mall_open: cannot create an eventfd: %s", std::strerror(e));
            destroy(m);
            return e == ENOMEM ? MALL_ERR_NOMEM : MALL_ERR_SYSTEM;
        }

        std::string why;
        int rc = attach_once(m, m->attach_timeout, &why);
        if (rc != MALL_SUCCESS) {
            set_error(err, "%s", why.c_str());
            m->first_retry = rc == MALL_ERR_NODAEMON ? kFirstBackoff : next_backoff(rc, kFirstBackoff);
        }
        if (!start_monitor(m)) {
            if (rc == MALL_SUCCESS)
                set_error(err, "mall_open: cannot start the background thread; changes still apply at "
                               "mall_step() but a malld restart will not be followed");
            rc = MALL_ERR_SYSTEM;
        }
        *out = m;
        return rc;
    } catch (const std::bad_alloc &) {
        if (m) destroy(m);
        set_error(err, "mall_open: out of memory");
        return MALL_ERR_NOMEM;
    } catch (const std::exception &e) {
        if (m) destroy(m);
        set_error(err, "mall_open: %s", e.what());
        return MALL_ERR_SYSTEM;
    } catch (...) {
        if (m) destroy(m);
        set_error(err, "mall_open: unexpected error");
        return MALL_ERR_SYSTEM;
    }
}

MALL_EXPORT int mall_step(mall_t *m) {
    if (__builtin_expect(m == nullptr, 0)) return MALL_ERR_INVAL;
    uint64_t g = page_generation(m->page);
    if (__builtin_expect(g == m->seen_generation.load(std::memory_order_relaxed), 1)) return MALL_NOUPDT;
    try {
        return apply_change(m);
    } catch (...) {
        return MALL_NOUPDT;  // e.g. a lock failing: try again at the next step
    }
}

MALL_EXPORT int mall_get_allocation(mall_t *m, mall_alloc_t *out) {
    if (!m || !out) return MALL_ERR_INVAL;
    try {
        std::lock_guard<std::mutex> lock(m->state_mu);
        *out = m->applied;
        return MALL_SUCCESS;
    } catch (...) {
        return MALL_ERR_SYSTEM;
    }
}

MALL_EXPORT int mall_on_resize_with_release(mall_t *m, mall_resize_fn fn, void *arg, mall_release_fn release) {
    if (!m || !fn) return MALL_ERR_INVAL;
    try {
        std::lock_guard<std::mutex> lock(m->callbacks_mu);
        if (m->ncallbacks >= kMaxCallbacks) return MALL_ERR_FULL;
        m->callbacks[m->ncallbacks++] = ResizeCallback{fn, arg, release};
        return MALL_SUCCESS;
    } catch (...) {
        return MALL_ERR_SYSTEM;
    }
}

MALL_EXPORT int mall_on_resize(mall_t *m, mall_resize_fn fn, void *arg) {
    return mall_on_resize_with_release(m, fn, arg, nullptr);
}

MALL_EXPORT int mall_bind_thread(mall_t *m) {
    if (!m) return MALL_ERR_INVAL;
    try {
        pid_t tid = current_tid();
        std::lock_guard<std::mutex> lock(m->threads_mu);
        bool known = std::find(m->threads, m->threads + m->nthreads, tid) != m->threads + m->nthreads;
        if (!known) {
            if (m->nthreads >= kMaxBoundThreads) return MALL_ERR_FULL;
            m->threads[m->nthreads++] = tid;
        }
        uint64_t mask[MALL_MAX_CPUS / 64];
        int ncpus;
        {
            std::lock_guard<std::mutex> state(m->state_mu);
            ncpus = m->applied.ncpus;
            std::memcpy(mask, m->applied.mask, sizeof mask);
        }
        if (ncpus > 0) {
            cpu_set_t set = cpu_set_of(mask);
            if (::sched_setaffinity(0, sizeof set, &set) != 0) return MALL_ERR_SYSTEM;
        }
        return MALL_SUCCESS;
    } catch (...) {
        return MALL_ERR_SYSTEM;
    }
}

MALL_EXPORT int mall_unbind_thread(mall_t *m) {
    if (!m) return MALL_ERR_INVAL;
    try {
        pid_t tid = current_tid();
        std::lock_guard<std::mutex> lock(m->threads_mu);
        pid_t *end = std::remove(m->threads, m->threads + m->nthreads, tid);
        m->nthreads = static_cast<int>(end - m->threads);
        return MALL_SUCCESS;
    } catch (...) {
        return MALL_ERR_SYSTEM;
    }
}

MALL_EXPORT int mall_fd(mall_t *m) {
    if (!m) return MALL_ERR_INVAL;
    return m->user_event_fd;
}

MALL_EXPORT int mall_report_progress(mall_t *m, uint64_t work_units) {
    if (!m) return MALL_ERR_INVAL;
    m->work_units.fetch_add(work_units, std::memory_order_relaxed);
    m->progress_calls.fetch_add(1, std::memory_order_relaxed);
    return MALL_SUCCESS;
}

MALL_EXPORT int mall_set_usage(mall_t *m, int ncpus) {
    if (!m || ncpus < 0 || ncpus > MALL_MAX_CPUS) return MALL_ERR_INVAL;
    try {
        m->usage_cap.store(ncpus);
        // Detached: the monitor sends it after the next attach.
        send_nonblocking(m, mall::proto::Type::Usage, {{"cpus_used", ncpus}});
        return MALL_SUCCESS;
    } catch (const std::bad_alloc &) {
        return MALL_ERR_NOMEM;  // the cap is kept: the monitor sends it at the next attach
    } catch (...) {
        return MALL_ERR_SYSTEM;
    }
}

MALL_EXPORT int mall_attached(mall_t *m) {
    if (!m) return MALL_ERR_INVAL;
    return m->attached.load(std::memory_order_acquire) ? MALL_SUCCESS : MALL_ERR_DETACHED;
}

MALL_EXPORT const char *mall_job_id(mall_t *m) {
    if (!m) return nullptr;
    return m->attached.load(std::memory_order_acquire) ? m->job_name.load(std::memory_order_acquire) : "";
}

MALL_EXPORT void mall_close(mall_t *m) {
    if (!m) return;
    try {
        destroy(m);
    } catch (...) {
        // join() failing (a deadlock would need mall_close from a callback): leak rather than crash.
    }
}

}  // extern "C"
