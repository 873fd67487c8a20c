// SPDX-License-Identifier: BSD-3-Clause
// change.hpp — the change path of mall_step(): what runs when the page's generation differs from
// the one the process applied (malld published a change, a re-attach forced a look, or a control
// signal's handler stored kForceApply).
// Contract: one change path at a time (step_mu). A torn page is left for the next step. A new
// generation with cpus is applied in this order: the handle's allocation, the resize callbacks,
// the bound threads' affinity (every thread's after a control request had pinned them all), the
// Ack to malld, then seen_generation and mall_fd() (finish_change). A generation without cpus is
// acknowledged and the last allocation kept. A pending control request is judged when the page
// holds what was applied; anything malld published since supersedes it. Returns MALL_SUCCESS when
// the allocation changed, MALL_NOUPDT otherwise. May throw (a lock): mall_step() turns that into
// MALL_NOUPDT and the next step tries again.
// The fast path (nothing changed) is not here: mall_step() compares the page's generation inline
// (handle.hpp's page_generation) and calls this only on a difference.
#pragma once

#include "handle.hpp"

namespace mall::client {

__attribute__((noinline, cold)) int apply_change(mall_handle *m);

}  // namespace mall::client
