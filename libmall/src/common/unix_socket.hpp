// SPDX-License-Identifier: BSD-3-Clause
// unix_socket.hpp — small RAII helpers over AF_UNIX SOCK_SEQPACKET sockets: connect/listen,
// send/receive one packet with an optional file descriptor (SCM_RIGHTS), peer credentials, and the
// closer thread that closes what a peer may make hang (descriptors it passed, sockets holding
// them). All functions report failures by return value (errno preserved) and never throw.
#pragma once

#include <sys/types.h>
#include <sys/un.h>

#include <chrono>
#include <cstdint>
#include <string>

#include "rules.hpp"

namespace mall {

// Owns a file descriptor; closes it on destruction.
class UniqueFd {
public:
    UniqueFd() = default;
    explicit UniqueFd(int fd) : fd_(fd) {}
    UniqueFd(const UniqueFd &) = delete;
    UniqueFd &operator=(const UniqueFd &) = delete;
    UniqueFd(UniqueFd &&o) noexcept : fd_(o.release()) {}
    UniqueFd &operator=(UniqueFd &&o) noexcept;
    ~UniqueFd();
    int get() const { return fd_; }
    int release();
    void reset(int fd = -1);
    explicit operator bool() const { return fd_ >= 0; }

private:
    int fd_ = -1;
};

struct PeerCred {
    pid_t pid = -1;
    uid_t uid = static_cast<uid_t>(-1);
    gid_t gid = static_cast<gid_t>(-1);
};

// The longest socket path that fits a Unix socket address (sun_path minus its terminating NUL).
inline constexpr size_t kMaxSocketPathBytes = sizeof(sockaddr_un::sun_path) - 1;

// Connects to a SOCK_SEQPACKET socket at path (close-on-exec), waiting at most max_wait for room
// in the listener's backlog (a stopped or overloaded malld never accepts). Returns -1 and sets
// errno on error: ETIMEDOUT when the wait ran out, ENOENT for an empty path, ENAMETOOLONG for one
// over kMaxSocketPathBytes. max_wait 0: the socket is O_NONBLOCK and a full backlog fails at once
// with EAGAIN. Otherwise the socket is blocking and its send timeout (SO_SNDTIMEO) is max_wait, so
// a later blocking send_packet() to a peer whose queue stays full fails with EAGAIN after that
// long instead of waiting forever (set_send_timeout() changes it).
int unix_connect(const std::string &path, std::chrono::milliseconds max_wait = kDefaultConnectWait);
// Bounds how long a blocking send on fd may wait for room in the peer's queue (SO_SNDTIMEO;
// at least 1 ms). False with errno on failure.
bool set_send_timeout(int fd, std::chrono::milliseconds timeout);
// Creates, binds and listens (mode applied with chmod). Refuses to remove a path that is not a
// socket; removes a stale socket nobody listens on. Returns -1 with errno and *why on error.
int unix_listen(const std::string &path, unsigned mode, std::string *why);
bool peer_credentials(int fd, PeerCred *out);
// Asks the kernel to refuse SCM_RIGHTS sent to this socket (SO_PASSRIGHTS = 0, Linux >= 6.16; a
// listening socket passes it on to the sockets it accepts): a peer's sendmsg with descriptors
// then fails with EPERM. False with errno (ENOPROTOOPT on older kernels) when unsupported.
bool refuse_passed_descriptors(int fd);
// A pidfd for the connected peer process (SO_PEERPIDFD, Linux >= 6.5), close-on-exec; -1 with
// errno when unsupported. It keeps naming the peer even if its pid is later reused.
int peer_pidfd(int fd);

// Sends one packet, optionally carrying fd_to_pass (>= 0). Returns false with errno on failure.
bool send_packet(int fd, const std::string &data, int fd_to_pass = -1, bool nonblocking = false);
// Receives one packet into *data (resized to its length). *received_fd gets a passed descriptor
// (close-on-exec) or -1. Returns: >0 bytes, 0 on orderly hang-up, -1 with errno on error.
// A packet larger than max_size is reported with errno = EMSGSIZE (and *data holds the first bytes).
// Descriptors the caller did not ask for go to the closer thread, counted for closer_owner (see
// below), never closed on the caller's. When they took the closer's queue over kMaxQueuedCloses,
// the packet is dropped with errno = ENOBUFS and the caller must drop the peer. A caller that
// must keep the queue bounded receives only when kMaxDescriptorsPerPacket more fit (malld does:
// connections.hpp), so that this never happens to it.
ssize_t recv_packet(int fd, std::string *data, size_t max_size, int *received_fd = nullptr,
                    bool nonblocking = false, uint64_t closer_owner = 0);
// The most descriptors one packet can carry (the kernel's SCM_MAX_FD).
inline constexpr size_t kMaxDescriptorsPerPacket = 253;
// True when the next packet waiting on fd carries descriptors, seen without taking them: a peek
// with no room for control data (the kernel installs none and says MSG_CTRUNC). False when it
// carries none, or nothing waits, or on error (the receive that follows reports those).
bool next_packet_carries_descriptors(int fd);
// For a socket this process is done with: shuts it down both ways (the peer can queue nothing
// more) and discards what waits in its receive queue, at most max_packets packets, as long as
// none carries descriptors. True when the queue is then empty: closing the socket releases no
// file a peer passed, so it cannot block and may happen on any thread. False: a packet with
// descriptors (or more than max_packets packets) waits: hand the socket to the closer.
bool empty_socket_for_close(int fd, int max_packets = 256);

// The closer: one thread per process (started at first use, and again in a forked child) that
// closes descriptors handed to it, because the last close of a peer-chosen file (a TCP socket
// lingering with unsent data, a FUSE file, a Unix socket whose receive queue holds such files)
// can block for a long time, for ever when the peer wants. Its queue holds at most
// kMaxQueuedCloses descriptors (recv_packet may overfill it by one packet for a caller that does
// not check for room first), so a peer that makes a close hang costs one thread and a bounded
// number of descriptors, never more. Each descriptor is counted for an owner (malld: the user its
// peer counts under) until its close has returned, so a caller can tell whose closes wait.
inline constexpr size_t kMaxQueuedCloses = 1024;
// Queues fd for the closer, counted for owner. False (fd still the caller's, errno = ENOBUFS) when
// the queue is full; when no thread can be started, fd is closed here (the behaviour of old,
// thread-less code).
bool close_off_thread(int fd, uint64_t owner = 0);
// Descriptors queued for the closer or being closed (a stuck close counts), in all or of owner.
size_t descriptors_waiting_to_close();
size_t descriptors_waiting_to_close(uint64_t owner);
// Lets the closer finish its queue for at most `wait`, then returns: the thread is joined when it
// finished in time, else left to end with the process (it is stuck in a close). For shutdown.
void stop_descriptor_closer(std::chrono::milliseconds wait);
// Waits until fd is readable or the timeout passes. Returns 1 readable, 0 timeout, -1 error.
int wait_readable(int fd, std::chrono::milliseconds timeout);

}  // namespace mall
