// SPDX-License-Identifier: BSD-3-Clause
// attach.hpp — the handle's connection to malld: one attach attempt (connect, Attach request,
// reply, the job's shared page), detach, and sending on the connection without blocking.
// Contract: an attempt never blocks longer than its timeout (the connect itself never waits: a full
// backlog fails at once) and ends early when mall_close() writes the stop eventfd. A server that
// runs as neither root, nor this process's user, nor the socket file's owner is refused before
// anything is sent (SO_PEERCRED). Only a checked page (sealed against shrinking, growing and
// writing: page_fd_problem; its magic and layout version) replaces the live one, moved to the
// handle's fixed address under conn_mu, so mall_step() reads a valid page at every instant,
// attached or not; a failure leaves the previous page (or a zero page) there. A detached handle
// keeps its page: its frozen generation keeps mall_step() on the fast path. Every failure comes
// back as a MALL_ERR_* code with words in *why that say what to fix. Called by mall_open() and the
// monitor thread, never on the fast path.
#pragma once

#include <chrono>
#include <string>

#include <nlohmann/json.hpp>

#include "common/protocol.hpp"
#include "handle.hpp"

namespace mall::client {

// One attempt to connect and attach with m's attach request (the job a self-registration created,
// once there is one), bounded by timeout. MALL_SUCCESS once the connection and page are installed.
int attach_once(mall_handle *m, milliseconds timeout, std::string *why);

// Closes the connection and marks the handle detached; the page stays mapped.
void detach(mall_handle *m);

// Sends one message on the current connection without blocking; failures are ignored (a hang-up
// is noticed by the monitor, and malld's ack timeout covers a lost ack). May throw std::bad_alloc.
void send_nonblocking(mall_handle *m, mall::proto::Type type, nlohmann::json body);

// Milliseconds until deadline, for poll(2): 0 when past, at most 60000.
int remaining_ms(Clock::time_point deadline);

}  // namespace mall::client
