// SPDX-License-Identifier: BSD-3-Clause
// unix_socket.cpp — AF_UNIX SOCK_SEQPACKET helpers (see unix_socket.hpp): close-on-exec everywhere,
// one packet per call, descriptors passed with SCM_RIGHTS, truncation detected (EMSGSIZE), no
// SIGPIPE. Never throws; failures come back as return values with errno preserved. Descriptors a
// peer pushes on us unasked, and sockets malld is done with, are closed by one closer thread per
// process with a bounded queue (DescriptorCloser).
#include "common/unix_socket.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "common/files.hpp"
#include "common/quiet_thread.hpp"

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif
#ifndef SO_PASSRIGHTS
#define SO_PASSRIGHTS 83
#endif
#ifndef SCM_MAX_FD
#define SCM_MAX_FD 253  // the kernel's cap on descriptors in one message
#endif
static_assert(SCM_MAX_FD == mall::kMaxDescriptorsPerPacket);

namespace mall {

UniqueFd &UniqueFd::operator=(UniqueFd &&o) noexcept {
    if (this != &o) reset(o.release());
    return *this;
}

UniqueFd::~UniqueFd() { reset(); }

int UniqueFd::release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
}

void UniqueFd::reset(int fd) {
    if (fd_ >= 0 && fd_ != fd) {
        int saved = errno;
        ::close(fd_);
        errno = saved;
    }
    fd_ = fd;
}

namespace {

// Fills a sockaddr_un; false with errno = ENAMETOOLONG when the path does not fit.
bool make_address(const std::string &path, sockaddr_un *addr, socklen_t *len) {
    std::memset(addr, 0, sizeof *addr);
    addr->sun_family = AF_UNIX;
    if (path.empty()) {
        errno = ENOENT;
        return false;
    }
    if (path.size() > kMaxSocketPathBytes) {
        errno = ENAMETOOLONG;
        return false;
    }
    std::memcpy(addr->sun_path, path.data(), path.size());
    *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + 1);
    return true;
}

std::string errno_text(int err) { return std::strerror(err); }

// The closer thread (see unix_socket.hpp). Its state is allocated once and never destroyed: a
// closer stuck in a close at exit must not find its mutex destroyed under it by static
// destructors. pthread_atfork keeps it usable in a forked child, which inherits the queue (its
// own copies of those descriptors) but not the thread: the child starts one of its own.
// Each entry carries the owner it was handed in for; an owner's count covers its entries queued
// and the one being closed, so that a close that hangs keeps counting against whoever caused it.
class DescriptorCloser {
public:
    static DescriptorCloser &instance() {
        static DescriptorCloser *closer = new DescriptorCloser;
        return *closer;
    }

    // Queues fd unless kMaxQueuedCloses wait already (false, errno = ENOBUFS, fd untouched).
    bool queue(int fd, uint64_t owner) {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            if (waiting_locked() >= kMaxQueuedCloses) {
                errno = ENOBUFS;
                return false;
            }
        }
        return queue_received({fd}, owner);
    }
    // Queues descriptors already received: all of them, since they are ours now. False when that
    // took the queue over kMaxQueuedCloses (the caller then drops the peer that sent them).
    bool queue_received(const std::vector<int> &fds, uint64_t owner) {
        if (fds.empty()) return true;
        std::deque<Entry> here;  // closed on this thread: no thread could be started, or no memory
        size_t queued = 0;
        bool within = true;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            try {
                for (; queued < fds.size(); ++queued) {
                    queue_.push_back(Entry{fds[queued], owner});
                    ++of_owner_[owner];
                }
            } catch (...) {
            }
            within = waiting_locked() <= kMaxQueuedCloses;
            if (!ensure_thread_locked()) {
                here.swap(queue_);
                of_owner_.clear();
            }
        }
        cv_.notify_one();
        for (const Entry &e : here) ::close(e.fd);
        for (size_t i = queued; i < fds.size(); ++i) ::close(fds[i]);
        return within;
    }
    size_t waiting() {
        std::lock_guard<std::mutex> lock(mutex_);
        return waiting_locked();
    }
    size_t waiting(uint64_t owner) {
        std::lock_guard<std::mutex> lock(mutex_);
        auto it = of_owner_.find(owner);
        return it == of_owner_.end() ? 0 : it->second;
    }
    void stop(std::chrono::milliseconds wait) {
        std::unique_lock<std::mutex> lock(mutex_);
        if (!thread_) return;
        stopping_ = true;
        cv_.notify_one();
        const bool ended = done_.wait_for(lock, wait, [&] { return running_ == 0; });
        std::thread *thread = thread_;
        thread_ = nullptr;
        stopping_ = false;
        lock.unlock();
        if (ended)
            thread->join();
        else
            thread->detach();  // stuck in a close: it ends with the process, or serves on
        delete thread;
    }

private:
    struct Entry {
        int fd;
        uint64_t owner;
    };

    DescriptorCloser() {
        // The child's copies of queued descriptors are left open (close-on-exec, like all of
        // ours): closing them is the parent's closer's business, and a child starts no thread
        // until it hands a descriptor to its own closer.
        ::pthread_atfork([] { instance().mutex_.lock(); }, [] { instance().mutex_.unlock(); },
                         [] {
                             DescriptorCloser &closer = instance();
                             closer.thread_ = nullptr;  // the parent's: not in this process
                             closer.running_ = 0;
                             closer.stopping_ = false;
                             closer.queue_.clear();
                             closer.of_owner_.clear();
                             closer.closing_ = 0;
                             closer.mutex_.unlock();
                         });
    }

    size_t waiting_locked() const { return queue_.size() + closing_; }

    // With mutex_ held (or in the fork child): a thread serves the queue, or false when none can
    // be started.
    bool ensure_thread_locked() {
        if (thread_) return true;
        try {
            thread_ = new std::thread(start_quiet_thread([this] { run(); }));
            ++running_;
            return true;
        } catch (...) {
            return false;
        }
    }

    void run() {
        std::unique_lock<std::mutex> lock(mutex_);
        for (;;) {
            cv_.wait(lock, [&] { return !queue_.empty() || stopping_; });
            if (queue_.empty()) break;  // stopping, and nothing is left to close
            const Entry entry = queue_.front();
            queue_.pop_front();
            ++closing_;
            lock.unlock();
            ::close(entry.fd);
            lock.lock();
            --closing_;
            auto it = of_owner_.find(entry.owner);
            if (it != of_owner_.end() && --it->second == 0) of_owner_.erase(it);
        }
        --running_;
        done_.notify_all();
    }

    std::mutex mutex_;
    std::condition_variable cv_, done_;
    std::deque<Entry> queue_;  // at most kMaxQueuedCloses (+ one packet when recv_packet overfills it)
    std::map<uint64_t, size_t> of_owner_;  // entries queued or being closed, per owner
    size_t closing_ = 0;                   // entries being closed now (a stuck thread's among them)
    std::thread *thread_ = nullptr;  // the serving thread (null: none started yet, or stopped)
    int running_ = 0;                // threads in run(): a stop() that timed out leaves one more
    bool stopping_ = false;
};

// Creates every missing folder above path (mode 0755), like mkdir -p on its dirname.
bool make_parent_folders(const std::string &path, std::string *why) {
    size_t slash = path.find_last_of('/');
    if (slash == std::string::npos || slash == 0) return true;
    std::string parent = path.substr(0, slash);
    std::string failed;
    if (!make_directories(parent, 0755, &failed)) {
        int err = errno;
        if (why)
            *why = "cannot create folder " + failed + " for the socket: " + errno_text(err) +
                   "; create it or choose another --socket";
        errno = err;
        return false;
    }
    struct stat st;
    if (::stat(parent.c_str(), &st) != 0) {
        int err = errno;
        if (why) *why = "cannot use folder " + parent + " for the socket: " + errno_text(err);
        errno = err;
        return false;
    }
    if (!S_ISDIR(st.st_mode)) {
        if (why) *why = parent + " is not a folder; choose another --socket";
        errno = ENOTDIR;
        return false;
    }
    return true;
}

}  // namespace

bool set_send_timeout(int fd, std::chrono::milliseconds timeout) {
    auto ms = std::max<long long>(timeout.count(), 1);  // 0 would mean "wait forever"
    timeval tv{static_cast<time_t>(ms / 1000), static_cast<suseconds_t>((ms % 1000) * 1000)};
    return ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) == 0;
}

int unix_connect(const std::string &path, std::chrono::milliseconds max_wait) {
    using Clock = std::chrono::steady_clock;
    sockaddr_un addr;
    socklen_t len = 0;
    if (!make_address(path, &addr, &len)) return -1;
    const bool nonblocking = max_wait.count() <= 0;
    UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | (nonblocking ? SOCK_NONBLOCK : 0), 0));
    if (!fd) return -1;
    if (nonblocking) {
        while (::connect(fd.get(), reinterpret_cast<sockaddr *>(&addr), len) != 0)
            if (errno != EINTR) return -1;
        return fd.release();
    }
    // A Unix socket's blocking connect waits for backlog room at most the send timeout, then fails
    // with EAGAIN (Linux net/unix/af_unix.c): the kernel does the bounded wait, and the connection
    // is made the moment room appears.
    const auto deadline = Clock::now() + max_wait;
    for (;;) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
        if (left.count() <= 0) {
            errno = ETIMEDOUT;
            return -1;
        }
        if (!set_send_timeout(fd.get(), left)) return -1;
        if (::connect(fd.get(), reinterpret_cast<sockaddr *>(&addr), len) == 0) break;
        if (errno == EAGAIN) {
            errno = ETIMEDOUT;
            return -1;
        }
        if (errno != EINTR) return -1;  // interrupted: nothing was done, try again with the time left
    }
    if (!set_send_timeout(fd.get(), max_wait)) return -1;
    return fd.release();
}

int unix_listen(const std::string &path, unsigned mode, std::string *why) {
    auto fail = [&](int err, std::string text) {
        if (why) *why = std::move(text);
        errno = err;
        return -1;
    };
    sockaddr_un addr;
    socklen_t len = 0;
    if (!make_address(path, &addr, &len)) {
        int err = errno;
        return fail(err, "socket path \"" + path + "\" is " +
                             (err == ENAMETOOLONG ? "longer than " + std::to_string(kMaxSocketPathBytes) +
                                                        " bytes; choose a shorter --socket"
                                                  : "empty; pass --socket PATH"));
    }
    if (!make_parent_folders(path, why)) return -1;

    struct stat st;
    if (::lstat(path.c_str(), &st) == 0) {
        if (!S_ISSOCK(st.st_mode))
            return fail(EEXIST, path + " exists and is not a socket; remove it or choose another --socket");
        // A socket file: in use if someone accepts connections on it, stale otherwise.
        UniqueFd probe(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
        if (!probe) {
            int err = errno;
            return fail(err, "cannot create a socket: " + errno_text(err));
        }
        int rc;
        do {
            rc = ::connect(probe.get(), reinterpret_cast<sockaddr *>(&addr), len);
        } while (rc != 0 && errno == EINTR);
        if (rc == 0 || errno == EAGAIN)
            return fail(EADDRINUSE, "another process (a running malld?) is listening on " + path +
                                        "; stop it or choose another --socket");
        if (errno != ECONNREFUSED) {
            int err = errno;
            return fail(err, "cannot check the existing socket " + path + ": " + errno_text(err) +
                                 "; remove it if no malld uses it, or choose another --socket");
        }
        if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
            int err = errno;
            return fail(err, "cannot remove the stale socket " + path + ": " + errno_text(err) +
                                 "; remove it by hand or choose another --socket");
        }
    } else if (errno != ENOENT) {
        int err = errno;
        return fail(err, "cannot inspect " + path + ": " + errno_text(err) + "; choose another --socket");
    }

    UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    if (!fd) {
        int err = errno;
        return fail(err, "cannot create a socket: " + errno_text(err));
    }
    if (::bind(fd.get(), reinterpret_cast<sockaddr *>(&addr), len) != 0) {
        int err = errno;
        return fail(err, "cannot bind " + path + ": " + errno_text(err) +
                             (err == EADDRINUSE ? "; another malld started at the same time?"
                                                : "; check the folder's permissions or choose another --socket"));
    }
    if (::chmod(path.c_str(), mode) != 0) {
        int err = errno;
        ::unlink(path.c_str());
        return fail(err, "cannot set mode " + std::to_string(mode) + " on " + path + ": " + errno_text(err));
    }
    if (::listen(fd.get(), 128) != 0) {
        int err = errno;
        ::unlink(path.c_str());
        return fail(err, "cannot listen on " + path + ": " + errno_text(err));
    }
    return fd.release();
}

bool peer_credentials(int fd, PeerCred *out) {
    if (!out) {
        errno = EINVAL;
        return false;
    }
    ucred cred{};
    socklen_t len = sizeof cred;
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return false;
    out->pid = cred.pid;
    out->uid = cred.uid;
    out->gid = cred.gid;
    return true;
}

bool refuse_passed_descriptors(int fd) {
    int off = 0;
    return ::setsockopt(fd, SOL_SOCKET, SO_PASSRIGHTS, &off, sizeof off) == 0;
}

int peer_pidfd(int fd) {
    int pidfd = -1;
    socklen_t len = sizeof pidfd;
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERPIDFD, &pidfd, &len) != 0) return -1;
    if (pidfd >= 0) ::fcntl(pidfd, F_SETFD, FD_CLOEXEC);
    return pidfd;
}

bool send_packet(int fd, const std::string &data, int fd_to_pass, bool nonblocking) {
    iovec iov{const_cast<char *>(data.data()), data.size()};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    if (fd_to_pass >= 0) {
        std::memset(control, 0, sizeof control);
        msg.msg_control = control;
        msg.msg_controllen = sizeof control;
        cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
        cmsg->cmsg_level = SOL_SOCKET;
        cmsg->cmsg_type = SCM_RIGHTS;
        cmsg->cmsg_len = CMSG_LEN(sizeof(int));
        std::memcpy(CMSG_DATA(cmsg), &fd_to_pass, sizeof(int));
    }
    int flags = MSG_NOSIGNAL | (nonblocking ? MSG_DONTWAIT : 0);
    ssize_t n;
    do {
        n = ::sendmsg(fd, &msg, flags);
    } while (n < 0 && errno == EINTR);
    if (n < 0) return false;
    if (static_cast<size_t>(n) != data.size()) {  // cannot happen for SEQPACKET, but never pretend
        errno = EIO;
        return false;
    }
    return true;
}

ssize_t recv_packet(int fd, std::string *data, size_t max_size, int *received_fd, bool nonblocking,
                    uint64_t closer_owner) {
    if (received_fd) *received_fd = -1;
    if (!data) {
        errno = EINVAL;
        return -1;
    }
    // Receive into a per-thread buffer, then copy only the packet: resizing *data to max_size
    // every time would zero-fill 64 KiB per packet.
    thread_local std::vector<char> buffer;
    if (buffer.size() < max_size) buffer.resize(max_size);
    iovec iov{buffer.data(), max_size};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    // Room for as many descriptors as one message can carry: descriptors that do not fit would be
    // dropped by the kernel inside recvmsg, i.e. closed on this thread.
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * SCM_MAX_FD)];
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    int flags = MSG_CMSG_CLOEXEC | (nonblocking ? MSG_DONTWAIT : 0);
    ssize_t n;
    do {
        n = ::recvmsg(fd, &msg, flags);
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
        data->clear();
        return -1;
    }

    // Collect passed descriptors: keep the first if the caller wants one, hand everything else to
    // the closer.
    int kept = -1;
    std::vector<int> unwanted;
    for (cmsghdr *cmsg = CMSG_FIRSTHDR(&msg); cmsg; cmsg = CMSG_NXTHDR(&msg, cmsg)) {
        if (cmsg->cmsg_level != SOL_SOCKET || cmsg->cmsg_type != SCM_RIGHTS) continue;
        size_t count = (cmsg->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < count; ++i) {
            int passed;
            std::memcpy(&passed, CMSG_DATA(cmsg) + i * sizeof(int), sizeof(int));
            if (kept < 0 && received_fd)
                kept = passed;
            else
                unwanted.push_back(passed);
        }
    }

    data->assign(buffer.data(), static_cast<size_t>(n));
    DescriptorCloser &closer = DescriptorCloser::instance();
    if (msg.msg_flags & MSG_TRUNC) {
        if (kept >= 0) unwanted.push_back(kept);
        closer.queue_received(unwanted, closer_owner);
        errno = EMSGSIZE;
        return -1;
    }
    if (!closer.queue_received(unwanted, closer_owner)) {
        if (kept >= 0) closer.queue_received({kept}, closer_owner);
        errno = ENOBUFS;
        return -1;
    }
    if (received_fd) *received_fd = kept;
    return n;
}

bool next_packet_carries_descriptors(int fd) {
    // No room for control data: the kernel reports it with MSG_CTRUNC and installs nothing (the
    // references it took for the peek are not the last ones: the packet still holds its files).
    char byte;
    iovec iov{&byte, 1};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    ssize_t n;
    do {
        n = ::recvmsg(fd, &msg, MSG_PEEK | MSG_DONTWAIT);
    } while (n < 0 && errno == EINTR);
    return n >= 0 && (msg.msg_flags & MSG_CTRUNC) != 0;
}

bool empty_socket_for_close(int fd, int max_packets) {
    // After the shutdown the peer's sends fail (EPIPE): the receive queue can only shrink. With
    // SO_PASSCRED every packet read comes with SCM_CREDENTIALS, which tells an empty packet from
    // the end of the queue (both read as 0 bytes). The peek's control buffer holds the credentials
    // and nothing more: a packet's descriptors do not fit, so none is installed and MSG_CTRUNC
    // says they are there (the kernel puts the credentials before the descriptors).
    int on = 1;
    if (::shutdown(fd, SHUT_RDWR) != 0 && errno != ENOTCONN) return false;
    if (::setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &on, sizeof on) != 0) return false;
    for (int i = 0; i <= max_packets; ++i) {
        char byte;
        iovec iov{&byte, 1};
        alignas(cmsghdr) char control[CMSG_SPACE(sizeof(ucred))];
        msghdr peek{};
        peek.msg_iov = &iov;
        peek.msg_iovlen = 1;
        peek.msg_control = control;
        peek.msg_controllen = sizeof control;
        ssize_t n;
        do {
            n = ::recvmsg(fd, &peek, MSG_PEEK | MSG_DONTWAIT);
        } while (n < 0 && errno == EINTR);
        if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOTCONN;
        if (peek.msg_flags & MSG_CTRUNC) return false;  // descriptors wait: not on this thread
        bool a_packet = n > 0;
        for (cmsghdr *c = CMSG_FIRSTHDR(&peek); c; c = CMSG_NXTHDR(&peek, c))
            a_packet = a_packet || (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS);
        if (!a_packet) return true;  // the end: nothing is queued
        // A packet without descriptors: discarded (the kernel drops the bytes past the first).
        msghdr take{};
        take.msg_iov = &iov;
        take.msg_iovlen = 1;
        ssize_t got;
        do {
            got = ::recvmsg(fd, &take, MSG_DONTWAIT);
        } while (got < 0 && errno == EINTR);
        if (got < 0) return false;
    }
    return false;  // more than max_packets wait: emptying the rest is the closer's work
}

bool close_off_thread(int fd, uint64_t owner) { return DescriptorCloser::instance().queue(fd, owner); }

size_t descriptors_waiting_to_close() { return DescriptorCloser::instance().waiting(); }

size_t descriptors_waiting_to_close(uint64_t owner) { return DescriptorCloser::instance().waiting(owner); }

void stop_descriptor_closer(std::chrono::milliseconds wait) { DescriptorCloser::instance().stop(wait); }

int wait_readable(int fd, std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
        if (left.count() < 0) left = std::chrono::milliseconds(0);
        pollfd pfd{fd, POLLIN, 0};
        int rc = ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left.count(), INT32_MAX)));
        if (rc > 0) {
            if (pfd.revents & POLLNVAL) {
                errno = EBADF;
                return -1;
            }
            return 1;  // readable, hung up or in error: the next receive says which
        }
        if (rc == 0) return 0;
        if (errno != EINTR) return -1;
    }
}

}  // namespace mall
