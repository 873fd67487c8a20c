// SPDX-License-Identifier: BSD-3-Clause
// control_by_signal.hpp — control by signal (mall_open_ex's control_signal, $MALL_SIGNAL_CONTROL,
// `mallctl signal`): a sigqueue'd value (common/signal_control.hpp's encoding) asks the process for
// a thread count or a cpu range, and a memfd status record tells the sender what became of it.
// Contract: one handle per process owns the control signal. Its handler only records the request
// (the last one wins) and stores kForceApply into seen_generation, the word the mall_step() fast
// path compares already: no second load there; the request is judged and applied on the change
// path (apply_change, under step_mu). Never attached, a request stays within the cpus the process
// had at mall_open(); attached, only when malld allows it (mallctl set JOB --signal-control on) and
// only narrowing malld's published cpus and threads; malld's next generation replaces it. A forked
// child does not inherit the control. The record is rewritten on the change path and at (de)attach,
// never on the fast path; its state lives in a process-wide block that is never destroyed (a late
// signal still finds it).
#pragma once

#include <cstdint>

#include "handle.hpp"

namespace mall::client {

// Claims control by `signal` (a real-time signal, already validated) for m: installs the handler,
// records the opening affinity as the bound, creates the status record. MALL_SUCCESS, or
// MALL_ERR_INVAL with err's words (another handle of the process has it; the signal has a handler
// of someone else's). Until it returns MALL_SUCCESS nothing needs undoing; after, control_release
// (from destroy) undoes it. Throws only std::system_error (the record lock), after the claim.
int control_enable(mall_handle *m, int signal, mall_error_t *err);

// Undoes control_enable when m owns the control (a no-op otherwise): unhooks the handler (leaving
// the signal ignored rather than at its default, which would end the process) and closes the
// record. True when a handler may still be running on m (descheduled for long): the caller must
// then leak the handle and its mall_fd() eventfd rather than free them under it.
bool control_release(mall_handle *m);

// True when m owns the control and a request is waiting (the change path's first question).
bool control_request_pending(const mall_handle *m);
// Takes the waiting request (0 = none) out of the block.
uint64_t control_take_request();

// Judges and applies a request taken by control_take_request() (under step_mu): true when it
// changed the allocation (callbacks run, threads pinned), false when refused; the record says why.
bool apply_control_request(mall_handle *m, uint64_t request);
// Records that malld published `generation` after the request, which replaces it.
void control_request_superseded(mall_handle *m, uint64_t request, uint64_t generation);
// After finish_change(): a request that arrived meanwhile makes the next mall_step() look again.
void recheck_control_request(mall_handle *m);

// Rewrites the status record (mode, job, cpus) after an attach, a detach or an applied change;
// a no-op unless m has control by signal.
void refresh_record(mall_handle *m);

}  // namespace mall::client
