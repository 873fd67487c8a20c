// SPDX-License-Identifier: BSD-3-Clause
// monitor.cpp — see monitor.hpp.
#include "monitor.hpp"

#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <string>

#include "attach.hpp"
#include "common/protocol.hpp"
#include "common/quiet_thread.hpp"
#include "common/unix_socket.hpp"
#include "notify.hpp"

namespace mall::client {

namespace {

// Reconnect backoff when no malld answers: kFirstBackoff (50 ms) doubling to 1 s.
constexpr milliseconds kMaxBackoff{1000};
// After a refusal (not this job's owner, no such job, ...) retrying every second would only fill
// malld's log with refusals; a restarted malld or a late registration is still picked up.
constexpr milliseconds kRefusedBackoff{5000};
constexpr milliseconds kProgressInterval{500};

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

}  // namespace

milliseconds next_backoff(int rc, milliseconds backoff) {
    if (rc == MALL_ERR_NODAEMON || rc == MALL_ERR_SYSTEM) return std::min(backoff * 2, kMaxBackoff);
    return kRefusedBackoff;
}

namespace {

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

}  // namespace

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

}  // namespace mall::client
