// SPDX-License-Identifier: BSD-3-Clause
// shared_page.cpp — the seqlock over the per-job page (see shared_page.hpp).
// Contract: page_read returns a consistent, validated snapshot or false (never spins unboundedly);
// page_write is the single writer's publish. Payload words are copied with relaxed atomic accesses
// so that a concurrent reader and writer are well-defined (and quiet under ThreadSanitizer).
// page_fd_problem is the one rule a reader applies to a page's descriptor before mapping it.
#include "common/shared_page.hpp"

#include <sched.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>

namespace mall {

namespace {

// The payload guarded by `seq`: ncpus, nthreads, mask, cpus and flags, contiguous and 8-byte aligned.
constexpr size_t kPayloadBegin = offsetof(SharedPage, ncpus);
constexpr size_t kPayloadEnd = offsetof(SharedPage, reserved2) + sizeof(uint32_t);
constexpr size_t kPayloadWords = (kPayloadEnd - kPayloadBegin) / sizeof(uint64_t);
static_assert(kPayloadBegin % sizeof(uint64_t) == 0, "payload must start 8-byte aligned");
static_assert((kPayloadEnd - kPayloadBegin) % sizeof(uint64_t) == 0, "payload must be whole words");
static_assert(offsetof(SharedPage, mask) == kPayloadBegin + 8, "ncpus + nthreads precede the mask");
// mall_alloc_t's layout is API: nthreads took a padding hole of 0.2.0, nothing moved.
static_assert(offsetof(mall_alloc_t, nthreads) == 12 && offsetof(mall_alloc_t, mask) == 16 &&
                  offsetof(mall_alloc_t, cpus) == 144 && sizeof(mall_alloc_t) == 4240,
              "mall_alloc_t must keep the layout of API 0.2.0");
static_assert(offsetof(SharedPage, cpus) == offsetof(SharedPage, mask) + sizeof(uint64_t) * (MALL_MAX_CPUS / 64),
              "the text follows the mask");
static_assert(offsetof(SharedPage, flags) == offsetof(SharedPage, cpus) + MALL_CPULIST_MAX, "flags follow the text");

// Attempts before giving up: the writer holds seq odd for well under a microsecond, so this only
// runs out when the writer was descheduled mid-write; the caller retries at its next step.
constexpr int kReadAttempts = 2000;
constexpr int kSpinsBeforeYield = 64;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield" ::: "memory");
#endif
}

struct PayloadCopy {
    uint64_t words[kPayloadWords];
};

}  // namespace

std::string page_fd_problem(int fd) {
    struct stat st;
    if (::fstat(fd, &st) != 0) return std::string("cannot inspect it: ") + std::strerror(errno);
    if (!S_ISREG(st.st_mode)) return "not a regular file (a memfd)";
    const int seals = ::fcntl(fd, F_GET_SEALS);
    const int needed = F_SEAL_SHRINK | F_SEAL_GROW;
    if (seals < 0 || (seals & needed) != needed || !(seals & (F_SEAL_FUTURE_WRITE | F_SEAL_WRITE)))
        return "not sealed against shrinking, growing and writing (F_SEAL_SHRINK|GROW|FUTURE_WRITE)";
    if (::fstat(fd, &st) != 0) return std::string("cannot inspect it: ") + std::strerror(errno);
    if (st.st_size < static_cast<off_t>(kSharedPageSize)) {
        char text[96];
        std::snprintf(text, sizeof text, "%lld bytes, expected at least %zu",
                      static_cast<long long>(st.st_size), kSharedPageSize);
        return text;
    }
    return "";
}

bool page_read(const SharedPage *page, mall_alloc_t *out, uint32_t *flags) {
    if (!page || !out) return false;
    if (__atomic_load_n(&page->magic, __ATOMIC_RELAXED) != kPageMagic ||
        __atomic_load_n(&page->version, __ATOMIC_RELAXED) != kPageVersion)
        return false;

    const auto *src = reinterpret_cast<const uint64_t *>(reinterpret_cast<const char *>(page) + kPayloadBegin);
    PayloadCopy copy;
    uint64_t generation = 0;
    bool consistent = false;
    for (int attempt = 0; attempt < kReadAttempts; ++attempt) {
        uint64_t before = page->seq.load(std::memory_order_acquire);
        if (before & 1) {
            if (attempt >= kSpinsBeforeYield)
                sched_yield();
            else
                cpu_relax();
            continue;
        }
        generation = page->generation.load(std::memory_order_relaxed);
        for (size_t i = 0; i < kPayloadWords; ++i) copy.words[i] = __atomic_load_n(&src[i], __ATOMIC_RELAXED);
        std::atomic_thread_fence(std::memory_order_acquire);
        if (page->seq.load(std::memory_order_relaxed) == before) {
            consistent = true;
            break;
        }
    }
    if (!consistent) return false;

    const char *bytes = reinterpret_cast<const char *>(copy.words);
    int32_t ncpus;
    std::memcpy(&ncpus, bytes + (offsetof(SharedPage, ncpus) - kPayloadBegin), sizeof ncpus);
    if (ncpus < 0 || ncpus > MALL_MAX_CPUS) return false;
    int32_t nthreads;
    std::memcpy(&nthreads, bytes + (offsetof(SharedPage, nthreads) - kPayloadBegin), sizeof nthreads);
    const char *text = bytes + (offsetof(SharedPage, cpus) - kPayloadBegin);
    if (std::memchr(text, '\0', MALL_CPULIST_MAX) == nullptr) return false;

    out->generation = generation;
    out->ncpus = ncpus;
    // 0 (auto, or a malld before 0.3.0) and anything out of range mean one thread per cpu.
    out->nthreads = (nthreads >= 1 && nthreads <= ncpus) ? nthreads : ncpus;
    std::memcpy(out->mask, bytes + (offsetof(SharedPage, mask) - kPayloadBegin), sizeof out->mask);
    std::memcpy(out->cpus, text, MALL_CPULIST_MAX);
    if (flags) std::memcpy(flags, bytes + (offsetof(SharedPage, flags) - kPayloadBegin), sizeof *flags);
    return true;
}

void page_write(SharedPage *page, uint64_t generation, const uint64_t mask[MALL_MAX_CPUS / 64], int ncpus,
                const char *cpus_text, int nthreads, uint32_t flags) {
    // Build the new payload aside, then copy it word by word inside the odd-seq window.
    PayloadCopy copy;
    std::memset(&copy, 0, sizeof copy);
    char *bytes = reinterpret_cast<char *>(copy.words);
    int32_t n = ncpus;
    std::memcpy(bytes + (offsetof(SharedPage, ncpus) - kPayloadBegin), &n, sizeof n);
    int32_t t = nthreads > 0 ? nthreads : 0;
    std::memcpy(bytes + (offsetof(SharedPage, nthreads) - kPayloadBegin), &t, sizeof t);
    if (mask) std::memcpy(bytes + (offsetof(SharedPage, mask) - kPayloadBegin), mask, sizeof(uint64_t) * (MALL_MAX_CPUS / 64));
    if (cpus_text) {
        size_t len = strnlen(cpus_text, MALL_CPULIST_MAX - 1);
        std::memcpy(bytes + (offsetof(SharedPage, cpus) - kPayloadBegin), cpus_text, len);
    }

    std::memcpy(bytes + (offsetof(SharedPage, flags) - kPayloadBegin), &flags, sizeof flags);

    auto *dst = reinterpret_cast<uint64_t *>(reinterpret_cast<char *>(page) + kPayloadBegin);
    uint64_t seq = page->seq.load(std::memory_order_relaxed);
    if (seq & 1) --seq;  // a writer that died mid-write must not make this write look stable
    page->seq.store(seq + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    for (size_t i = 0; i < kPayloadWords; ++i) __atomic_store_n(&dst[i], copy.words[i], __ATOMIC_RELAXED);
    page->generation.store(generation, std::memory_order_release);
    page->seq.store(seq + 2, std::memory_order_release);
}

}  // namespace mall
