// SPDX-License-Identifier: BSD-3-Clause
// shared_page.hpp — layout of the per-job page that malld publishes allocations through.
// malld creates a memfd per job, maps it read-write, seals it (kPageSeals: no shrinking, no
// growing, no writable mapping but malld's own) and passes it to each attached process, which
// checks it (page_fd_problem) and maps it read-only.
// Writer (malld only): seq odd -> payload -> generation -> seq even (a seqlock).
// Reader fast path: one acquire load of `generation`; on change, read the payload under the seqlock.
#pragma once

#include <fcntl.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "mall/mall.h"

namespace mall {

constexpr uint32_t kPageMagic = 0x4D414C50;  // "MALP"
constexpr uint32_t kPageVersion = 1;

struct SharedPage {
    uint32_t magic;
    uint32_t version;
    alignas(64) std::atomic<uint64_t> generation;  // the only word the fast path reads
    alignas(64) std::atomic<uint64_t> seq;         // odd while malld writes the payload
    int32_t ncpus;
    int32_t nthreads;  // 0: one thread per cpu; else 1..ncpus (mallctl set --threads). Was reserved (0).
    uint64_t mask[MALL_MAX_CPUS / 64];
    char cpus[MALL_CPULIST_MAX];
    uint32_t flags;      // kPageFlag* (0 from a malld before 0.3.0: the zero-filled memfd)
    uint32_t reserved2;  // 0
};

// The job's processes may take `mallctl signal` requests, narrowing within the published cpus
// (mallctl set JOB --signal-control on). Without it an attached process refuses them.
constexpr uint32_t kPageFlagSignalControl = 0x1u;

constexpr size_t kSharedPageSize = 8192;
static_assert(sizeof(SharedPage) <= kSharedPageSize, "SharedPage must fit its mapping");
static_assert(std::atomic<uint64_t>::is_always_lock_free, "lock-free 64-bit atomics required");

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010  // Linux 5.1; older C libraries lack the name
#endif
// The seals malld puts on a job's page once it has mapped it read-write, before it passes it on.
// F_SEAL_WRITE cannot be: malld keeps writing through its own mapping; F_SEAL_FUTURE_WRITE
// refuses every later writable mapping and write(2), so only malld writes the page.
constexpr int kPageSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL;

// Reader side: "" when fd is fit to be mapped as a job's page, else a few words on what is wrong
// (kept short: they end up in mall_error_t's 160 bytes).
// A page must be a regular file of at least kSharedPageSize bytes that carries F_SEAL_SHRINK (a
// server that truncated a mapped page would kill the reader with SIGBUS at its next read),
// F_SEAL_GROW, and F_SEAL_FUTURE_WRITE or F_SEAL_WRITE (no process the page was passed to can
// write it for the job's other processes). F_SEAL_SEAL is not required: seals are never removed,
// so one added later can only restrict the server further. The seals are read before the size:
// with them the size cannot change any more.
std::string page_fd_problem(int fd);

// Writer side (malld). The page must be mapped read-write.
inline void page_init(SharedPage *page) {
    page->magic = kPageMagic;
    page->version = kPageVersion;
    page->generation.store(0, std::memory_order_relaxed);
    page->seq.store(0, std::memory_order_relaxed);
    page->ncpus = 0;
    page->nthreads = 0;
    for (auto &w : page->mask) w = 0;
    page->cpus[0] = '\0';
    page->flags = 0;
    page->reserved2 = 0;
}

// Reader side: copies a consistent snapshot into out; returns false if the page is not valid.
// Retries while the writer is active (the writer holds seq odd for well under a microsecond).
// flags (optional) receives the page's kPageFlag* word of the same snapshot.
bool page_read(const SharedPage *page, mall_alloc_t *out, uint32_t *flags = nullptr);

// Writer side: publishes a new allocation with the given generation (must increase).
// nthreads: 0 = one per cpu, else the count to run (clamped to 1..ncpus by the reader).
void page_write(SharedPage *page, uint64_t generation, const uint64_t mask[MALL_MAX_CPUS / 64],
                int ncpus, const char *cpus_text, int nthreads = 0, uint32_t flags = 0);

}  // namespace mall
