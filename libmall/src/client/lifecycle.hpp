// SPDX-License-Identifier: BSD-3-Clause
// lifecycle.hpp — a handle's birth and death: create_handle (mall_open_ex, before the first
// attach) and destroy (mall_close, and every failed open after create_handle).
// Contract: create_handle either returns MALL_SUCCESS with a handle whose page is a private zero
// page (generation 0: mall_step() says "no change"), whose eventfds exist and which holds the
// control signal if asked, or an error code with err's words and nothing left behind (the control
// signal released); it neither attaches nor starts the monitor. destroy stops and joins the
// monitor, releases the control signal, unmaps the page, closes the descriptors, calls each resize
// callback's release function, and frees the handle, unless a control-signal handler may still
// run on it (then the handle and its mall_fd() eventfd are leaked, never freed under the handler).
// Fork: every open handle is listed; in a forked child (pthread_atfork) each becomes a detached
// copy that never follows malld: no monitor thread (there is none in the child), no connection,
// a private zero page (mall_step() says "no change"), a mall_fd() eventfd of its own, and locks
// free again (the step lock once the forking thread's mall_step() returns: a resize callback
// may fork). Its mall_close() frees only the child's state: it writes nothing the parent shares
// (no stop eventfd write, no message to malld), joins nothing, so the parent's handle keeps
// following malld. A copy made without the fork handlers (raw clone) is recognised at close by its
// pid and treated the same way.
#pragma once

#include "handle.hpp"
#include "open_config.hpp"

namespace mall::client {

// May throw (std::bad_alloc, resolving the socket path); then nothing is left behind either.
int create_handle(OpenConfig &&config, const char *socket_path, mall_handle **out, mall_error_t *err);

void destroy(mall_handle *m);

}  // namespace mall::client
