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
#pragma once

#include "handle.hpp"
#include "open_config.hpp"

namespace mall::client {

// May throw (std::bad_alloc, resolving the socket path); then nothing is left behind either.
int create_handle(OpenConfig &&config, const char *socket_path, mall_handle **out, mall_error_t *err);

void destroy(mall_handle *m);

}  // namespace mall::client
