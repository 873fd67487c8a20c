// SPDX-License-Identifier: BSD-3-Clause
// change.cpp — see change.hpp.
#include "change.hpp"

#include <cstring>

#include "attach.hpp"
#include "common/protocol.hpp"
#include "control_by_signal.hpp"
#include "notify.hpp"
#include "process_effects.hpp"

namespace mall::client {

int apply_change(mall_handle *m) {
    // A forked child's copy whose zero page could not be mapped: the parent's page is not its to act on.
    if (m->forked_copy) {
        m->seen_generation.store(page_generation(m->page), std::memory_order_relaxed);
        return MALL_NOUPDT;
    }
    std::lock_guard<std::mutex> step_lock(m->step_mu);
    mall_alloc_t &snapshot = m->scratch;
    bool consistent;
    uint32_t page_flags = 0;
    {
        std::lock_guard<std::mutex> lock(m->conn_mu);
        consistent = mall::page_read(m->page, &snapshot, &page_flags);
    }
    const bool control_pending = control_request_pending(m);
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
        const uint64_t request = control_take_request();
        if (page_unchanged) {
            const bool changed = apply_control_request(m, request);
            finish_change(m, generation);
            recheck_control_request(m);
            return changed ? MALL_SUCCESS : MALL_NOUPDT;
        }
        control_request_superseded(m, request, generation);
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

}  // namespace mall::client
