// SPDX-License-Identifier: BSD-3-Clause
// mall_mpi.cpp — libmall_mpi: implements mall/mall_mpi.h, the collective step of a multi-rank job
// (the protocol is described in the header). Contract: when nothing changed anywhere, a step costs
// one mall_step() load and one MPI_Allreduce of five ints, with no allocation, lock or other system
// call; every rank returns the same code and runs its callbacks in the same call; nothing escapes
// an extern "C" function.
#include "mall/mall_mpi.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

namespace {

constexpr int kMaxCallbacks = 8;
// Who a rank's node job is: "$MALL_SOCKET|job id" (the same job name can exist at two mallds).
constexpr int kKeyMax = 256;
// The reduction: MIN over these five ints.
enum Slot { kChanged, kRegroup, kShare, kLimitedShare, kBalanced, kSlots };
// Values of the kChanged slot: some rank's allocation changed (the callbacks run), or only some
// rank's cap changed (a rank that was limited may not be any more: evaluate the caps again).
constexpr int kAllocationChanged = -2, kCapChanged = -1;
// After a rank raises or lifts its cap, its malld needs a moment to hand it more cpus (at once when
// they are free, after another job's ack when they must be taken back). Meanwhile the rank does
// not count as limiting the job, or the others would cap themselves to its old count and the caps
// would chase each other. If no larger allocation arrives within this wait, the rank counts as
// limited again (its node cannot give it more).
constexpr std::chrono::milliseconds kRaiseWait{1000};
using Clock = std::chrono::steady_clock;

struct Callback {
    mall_mpi_resize_fn fn;
    void *arg;
};

void set_error(mall_error_t *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void set_error(mall_error_t *err, const char *fmt, ...) {
    if (!err) return;
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(err->text, sizeof err->text, fmt, ap);
    va_end(ap);
}

std::string mpi_error_text(int rc) {
    char text[MPI_MAX_ERROR_STRING] = {};
    int length = 0;
    if (MPI_Error_string(rc, text, &length) != MPI_SUCCESS) std::snprintf(text, sizeof text, "MPI error %d", rc);
    return text;
}

bool mask_has(const uint64_t *mask, int cpu) { return (mask[cpu / 64] >> (cpu % 64)) & 1u; }

// Fills alloc->cpus with the Linux list text of alloc->mask and alloc->ncpus with its size.
void describe_mask(mall_alloc_t *alloc) {
    char *out = alloc->cpus;
    size_t left = sizeof alloc->cpus;
    out[0] = '\0';
    int count = 0;
    for (int cpu = 0; cpu < MALL_MAX_CPUS; ++cpu) {
        if (!mask_has(alloc->mask, cpu)) continue;
        int last = cpu;
        while (last + 1 < MALL_MAX_CPUS && mask_has(alloc->mask, last + 1)) ++last;
        count += last - cpu + 1;
        int n = last > cpu ? std::snprintf(out, left, "%s%d-%d", out == alloc->cpus ? "" : ",", cpu, last)
                           : std::snprintf(out, left, "%s%d", out == alloc->cpus ? "" : ",", cpu);
        if (n < 0 || static_cast<size_t>(n) >= left) break;  // cannot happen: MALL_CPULIST_MAX fits all
        out += n;
        left -= static_cast<size_t>(n);
        cpu = last;
    }
    alloc->ncpus = count;
}

}  // namespace

struct mall_mpi_handle {
    mall_t *m = nullptr;
    MPI_Comm comm = MPI_COMM_NULL;       // a duplicate of the caller's communicator
    MPI_Comm node_comm = MPI_COMM_NULL;  // the ranks of comm on this node
    int node_rank = 0, node_size = 1;
    bool want_balanced = true;   // this rank's wish (mall_mpi_set_balanced)
    bool balanced = true;        // in effect: every rank wished it at the last step
    int default_threads = 1;

    // This rank's node job and the ranks sharing it.
    char key[kKeyMax] = {};
    std::vector<char> keys;  // node_size * kKeyMax, for the regroup's Allgather
    int sharers = 1, sharer_index = 0;

    bool malleable = false;      // an allocation was applied on this rank
    mall_alloc_t node_alloc{};   // the node job's allocation, as last applied
    mall_alloc_t fallback{};     // the cpus the process could use at open
    mall_alloc_t slice{};        // the cpus this rank runs on
    int share = 1;
    int cap = 0;                 // per-rank units; the node job was asked for cap * sharers
    bool recheck = false;        // the cap changed at the last evaluation: evaluate once more
    bool pending = false;        // raised or lifted the cap, no new allocation yet (see kRaiseWait)
    Clock::time_point pending_until{};

    int threads = 1;             // T, as last given to the callbacks
    uint64_t steps = 0, changes = 0;
    Callback callbacks[kMaxCallbacks] = {};
    int ncallbacks = 0;
};

namespace {

// The key of the node job this rank is attached to ("" when none): $MALL_SOCKET + "|" + job id.
void current_key(mall_mpi_handle *mm, char out[kKeyMax]) {
    out[0] = '\0';
    if (mm->m == nullptr || mall_attached(mm->m) != MALL_SUCCESS) return;
    const char *job = mall_job_id(mm->m);
    if (job == nullptr || job[0] == '\0') return;
    const char *socket = std::getenv("MALL_SOCKET");
    std::snprintf(out, kKeyMax, "%s|%s", socket ? socket : MALL_DEFAULT_SOCKET, job);
}

// Recomputes this rank's share and slice from the node job's allocation and the sharer count.
void recompute_share(mall_mpi_handle *mm) {
    if (!mm->malleable) {
        mm->share = mm->default_threads;
        mm->slice = mm->fallback;
        return;
    }
    int cpus[MALL_MAX_CPUS];
    int n = 0;
    for (int cpu = 0; cpu < MALL_MAX_CPUS; ++cpu)
        if (mask_has(mm->node_alloc.mask, cpu)) cpus[n++] = cpu;
    if (n == 0) {  // cannot happen for an applied allocation; keep the fallback
        mm->share = mm->default_threads;
        mm->slice = mm->fallback;
        return;
    }
    const int sharers = std::max(1, mm->sharers);
    mm->share = std::max(1, n / sharers);
    // Sharer i runs on cpus [i * share, (i + 1) * share) of the list (wrapping when there are
    // fewer cpus than sharers), so sharers of one node job do not crowd the same cores.
    std::memset(mm->slice.mask, 0, sizeof mm->slice.mask);
    for (int j = 0; j < mm->share; ++j) {
        const int cpu = cpus[(mm->sharer_index * mm->share + j) % n];
        mm->slice.mask[cpu / 64] |= uint64_t{1} << (cpu % 64);
    }
    mm->slice.generation = mm->node_alloc.generation;
    describe_mask(&mm->slice);
    // An admin's thread count for the node job (mallctl set --threads) is split like its cpus: the
    // rank keeps its slice but counts (and, balanced, the job runs) only its part of the threads.
    const int node_threads = mall_alloc_threads(&mm->node_alloc);
    if (node_threads > 0 && node_threads < n) mm->share = std::min(mm->share, std::max(1, node_threads / sharers));
}

// Collective over every node communicator: finds the ranks that share this rank's node job.
int regroup(mall_mpi_handle *mm) {
    int rc = MPI_Allgather(mm->key, kKeyMax, MPI_CHAR, mm->keys.data(), kKeyMax, MPI_CHAR, mm->node_comm);
    if (rc != MPI_SUCCESS) return rc;
    mm->sharers = 1;
    mm->sharer_index = 0;
    if (mm->key[0] != '\0') {
        int equal = 0, before = 0;
        for (int i = 0; i < mm->node_size; ++i) {
            const char *other = mm->keys.data() + static_cast<size_t>(i) * kKeyMax;
            if (std::strncmp(other, mm->key, kKeyMax) != 0) continue;
            ++equal;
            if (i < mm->node_rank) ++before;
        }
        mm->sharers = std::max(1, equal);
        mm->sharer_index = before;
    }
    recompute_share(mm);
    return MPI_SUCCESS;
}

// Asks this rank's node malld for a cap of `cap` cpus per rank (0 = none). One sharer sends.
void set_cap(mall_mpi_handle *mm, int cap) {
    if (cap == mm->cap) return;
    const bool raised = cap == 0 || (mm->cap != 0 && cap > mm->cap);
    mm->cap = cap;
    mm->recheck = true;  // whether this rank limits the job changed: all ranks look again next step
    mm->pending = raised;
    if (raised) mm->pending_until = Clock::now() + kRaiseWait;
    if (mm->m != nullptr && mm->sharer_index == 0) (void)mall_set_usage(mm->m, cap == 0 ? 0 : cap * mm->sharers);
}

// The rank's own allocation changed (mall_step() applied one): read it; a new job asks for a regroup.
bool take_local_change(mall_mpi_handle *mm) {
    mall_alloc_t &alloc = mm->node_alloc;
    if (mall_get_allocation(mm->m, &alloc) != MALL_SUCCESS || alloc.ncpus <= 0) return false;
    mm->malleable = true;
    mm->pending = false;  // malld answered (a raise may also come in several changes)
    char key[kKeyMax];
    current_key(mm, key);
    bool regroup_needed = false;
    if (key[0] != '\0' && std::strncmp(key, mm->key, kKeyMax) != 0) {
        std::memcpy(mm->key, key, kKeyMax);
        regroup_needed = true;
    }
    recompute_share(mm);
    return regroup_needed;
}

void fill_reduction(const mall_mpi_handle *mm, bool changed, bool regroup_needed, int in[kSlots]) {
    // A rank at its own cap, or waiting for the cpus a raise asked for, does not limit the job.
    const bool limited = !(mm->pending || (mm->cap != 0 && mm->share >= mm->cap));
    in[kChanged] = changed ? kAllocationChanged : mm->recheck ? kCapChanged : 0;
    in[kRegroup] = regroup_needed ? -1 : 0;
    in[kShare] = mm->share;
    in[kLimitedShare] = limited ? mm->share : INT_MAX;
    in[kBalanced] = mm->want_balanced ? 1 : 0;
}

// Everything after a reduction that reported a change somewhere: caps, thread count, callbacks.
int apply_job_wide(mall_mpi_handle *mm, const int out[kSlots]) {
    const bool balanced = out[kBalanced] == 1;
    const int min_share = std::max(1, out[kShare]);
    const int constraint = out[kLimitedShare];
    const int threads = balanced ? min_share : std::max(1, mm->share);

    mm->recheck = false;
    if (!balanced || !mm->malleable) {
        set_cap(mm, 0);
    } else if (constraint == INT_MAX) {
        set_cap(mm, 0);  // every rank sits at its cap: none of them limits the job any more
    } else if (mm->share > constraint || (mm->cap != 0 && constraint > mm->cap)) {
        set_cap(mm, constraint);
    }

    // Only the caps moved (no allocation, mode or count): nothing to apply, same answer everywhere.
    if (out[kChanged] != kAllocationChanged && balanced == mm->balanced && threads == mm->threads) return MALL_NOUPDT;
    mm->balanced = balanced;
    mm->threads = threads;
    ++mm->changes;
    for (int i = 0; i < mm->ncallbacks; ++i) {
        try {
            mm->callbacks[i].fn(threads, &mm->slice, mm->callbacks[i].arg);
        } catch (...) {
            // A C++ callback that throws must not unwind into the caller's C frames.
        }
    }
    return MALL_SUCCESS;
}

int step(mall_mpi_handle *mm) {
    ++mm->steps;
    bool changed = false, regroup_needed = false;
    if (mm->m != nullptr && mall_step(mm->m) == MALL_SUCCESS) {
        changed = true;
        regroup_needed = take_local_change(mm);
    }
    if (__builtin_expect(mm->pending, 0) && Clock::now() >= mm->pending_until) {
        mm->pending = false;  // the raise brought nothing: this rank limits the job again
        mm->recheck = true;
    }
    int in[kSlots], out[kSlots];
    fill_reduction(mm, changed, regroup_needed, in);
    if (MPI_Allreduce(in, out, kSlots, MPI_INT, MPI_MIN, mm->comm) != MPI_SUCCESS) return MALL_ERR_SYSTEM;
    const bool balanced = out[kBalanced] == 1;
    if (__builtin_expect(out[kChanged] == 0 && balanced == mm->balanced, 1)) return MALL_NOUPDT;

    if (out[kRegroup] < 0) {
        // Some rank's node job changed: every rank recounts its sharers, then reduces again with
        // the new shares (the change flag is already known to be set everywhere).
        if (regroup(mm) != MPI_SUCCESS) return MALL_ERR_SYSTEM;
        fill_reduction(mm, changed, false, in);
        in[kChanged] = kAllocationChanged;  // known to be set somewhere: keep it for every rank
        if (MPI_Allreduce(in, out, kSlots, MPI_INT, MPI_MIN, mm->comm) != MPI_SUCCESS) return MALL_ERR_SYSTEM;
    }
    return apply_job_wide(mm, out);
}

void destroy(mall_mpi_handle *mm) {
    int finalized = 1;
    MPI_Finalized(&finalized);
    if (!finalized) {
        if (mm->node_comm != MPI_COMM_NULL) MPI_Comm_free(&mm->node_comm);
        if (mm->comm != MPI_COMM_NULL) MPI_Comm_free(&mm->comm);
    }
    delete mm;
}

}  // namespace

extern "C" {

MALL_MPI_EXPORT int mall_mpi_open(mall_t *m, MPI_Comm comm, int flags, int default_threads, mall_mpi_t **out,
                                  mall_error_t *err) {
    if (err) err->text[0] = '\0';
    if (out == nullptr || comm == MPI_COMM_NULL || (flags & ~MALL_MPI_UNBALANCED) != 0 || default_threads < 0) {
        set_error(err, "mall_mpi_open: bad argument (NULL out, MPI_COMM_NULL, unknown flags or default_threads < 0)");
        return MALL_ERR_INVAL;
    }
    *out = nullptr;
    mall_mpi_handle *mm = new (std::nothrow) mall_mpi_handle;
    if (mm == nullptr) {
        set_error(err, "mall_mpi_open: out of memory");
        return MALL_ERR_NOMEM;
    }
    try {
        mm->m = m;
        mm->want_balanced = mm->balanced = (flags & MALL_MPI_UNBALANCED) == 0;

        cpu_set_t allowed;
        CPU_ZERO(&allowed);
        if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) CPU_SET(0, &allowed);
        for (int cpu = 0; cpu < CPU_SETSIZE && cpu < MALL_MAX_CPUS; ++cpu)
            if (CPU_ISSET(cpu, &allowed)) mm->fallback.mask[cpu / 64] |= uint64_t{1} << (cpu % 64);
        describe_mask(&mm->fallback);
        mm->default_threads = default_threads > 0 ? default_threads : std::max(1, mm->fallback.ncpus);

        int rc = MPI_Comm_dup(comm, &mm->comm);
        if (rc == MPI_SUCCESS)
            rc = MPI_Comm_split_type(mm->comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &mm->node_comm);
        if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(mm->node_comm, &mm->node_rank);
        if (rc == MPI_SUCCESS) rc = MPI_Comm_size(mm->node_comm, &mm->node_size);
        if (rc != MPI_SUCCESS) {
            set_error(err, "mall_mpi_open: duplicating the communicator failed: %s", mpi_error_text(rc).c_str());
            destroy(mm);
            return MALL_ERR_SYSTEM;
        }
        mm->keys.assign(static_cast<size_t>(mm->node_size) * kKeyMax, '\0');
        // An allocation applied before open (the caller stepped m already) counts from the start.
        if (m != nullptr && mall_get_allocation(m, &mm->node_alloc) == MALL_SUCCESS && mm->node_alloc.ncpus > 0)
            mm->malleable = true;
        current_key(mm, mm->key);
        rc = regroup(mm);  // also computes the share and slice
        if (rc != MPI_SUCCESS) {
            set_error(err, "mall_mpi_open: finding the ranks that share a node job failed: %s",
                      mpi_error_text(rc).c_str());
            destroy(mm);
            return MALL_ERR_SYSTEM;
        }
        // The start-up count and mode, as a step would set them: every rank must agree on the
        // mode in effect (a step takes its slow path on all ranks or on none).
        int local[2] = {mm->share, mm->want_balanced ? 1 : 0}, job_min[2] = {0, 0};
        rc = MPI_Allreduce(local, job_min, 2, MPI_INT, MPI_MIN, mm->comm);
        if (rc != MPI_SUCCESS) {
            set_error(err, "mall_mpi_open: the first reduction failed: %s", mpi_error_text(rc).c_str());
            destroy(mm);
            return MALL_ERR_SYSTEM;
        }
        mm->balanced = job_min[1] == 1;
        mm->threads = mm->balanced ? std::max(1, job_min[0]) : mm->share;
        *out = mm;
        return MALL_SUCCESS;
    } catch (...) {
        set_error(err, "mall_mpi_open: out of memory");
        destroy(mm);
        return MALL_ERR_NOMEM;
    }
}

MALL_MPI_EXPORT int mall_mpi_on_resize(mall_mpi_t *mm, mall_mpi_resize_fn fn, void *arg) {
    if (mm == nullptr || fn == nullptr) return MALL_ERR_INVAL;
    if (mm->ncallbacks >= kMaxCallbacks) return MALL_ERR_FULL;
    mm->callbacks[mm->ncallbacks++] = Callback{fn, arg};
    return MALL_SUCCESS;
}

MALL_MPI_EXPORT int mall_mpi_step(mall_mpi_t *mm) {
    if (__builtin_expect(mm == nullptr, 0)) return MALL_ERR_INVAL;
    try {
        return step(mm);
    } catch (...) {
        return MALL_ERR_SYSTEM;
    }
}

MALL_MPI_EXPORT int mall_mpi_threads(mall_mpi_t *mm) { return mm == nullptr ? MALL_ERR_INVAL : mm->threads; }

MALL_MPI_EXPORT int mall_mpi_get_cpus(mall_mpi_t *mm, mall_alloc_t *out) {
    if (mm == nullptr || out == nullptr) return MALL_ERR_INVAL;
    *out = mm->slice;
    return MALL_SUCCESS;
}

MALL_MPI_EXPORT int mall_mpi_set_balanced(mall_mpi_t *mm, int on) {
    if (mm == nullptr) return MALL_ERR_INVAL;
    mm->want_balanced = on != 0;
    return MALL_SUCCESS;
}

MALL_MPI_EXPORT int mall_mpi_get_state(mall_mpi_t *mm, mall_mpi_state_t *out) {
    if (mm == nullptr || out == nullptr) return MALL_ERR_INVAL;
    out->threads = mm->threads;
    out->share = mm->share;
    out->usage_cap = mm->cap;
    out->sharers = mm->sharers;
    out->malleable = mm->malleable ? 1 : 0;
    out->balanced = mm->balanced ? 1 : 0;
    out->steps = mm->steps;
    out->changes = mm->changes;
    return MALL_SUCCESS;
}

MALL_MPI_EXPORT void mall_mpi_close(mall_mpi_t *mm) {
    if (mm == nullptr) return;
    try {
        set_cap(mm, 0);
        destroy(mm);
    } catch (...) {
    }
}

}  // extern "C"
