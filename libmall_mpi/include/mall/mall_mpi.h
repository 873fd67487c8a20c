/* SPDX-License-Identifier: BSD-3-Clause */
/* mall_mpi.h — libmall_mpi, the collective step boundary of a multi-rank (MPI) malleable job.
 *
 * Every rank of a communicator calls mall_mpi_step() at the same step boundary. It runs the rank's
 * own mall_step() (two atomic loads when nothing changed) and one MPI_Allreduce of five ints, so
 * every rank learns whether any rank's allocation changed, and every rank applies the job-wide
 * thread count at that same step: the resize callbacks run on all ranks in the same
 * mall_mpi_step() call, and all ranks get the same return code. In balanced mode (the default) every rank runs the thread
 * count the most constrained rank can run, and tells its node's malld (mall_set_usage()) how many
 * of its cpus it really uses, so that node lends the surplus to other jobs; when the constrained
 * rank grows back the others lift their caps and get their cpus back at a later step.
 *
 * Compiles as C99 and as C++; needs <mpi.h>. Link with mall::mpi (libmall_mpi, which links libmall
 * and the MPI C library). Never terminates or hangs its host beyond the MPI collectives it makes:
 * with no malld (m NULL or detached) a rank counts as "not malleable" and runs its default count.
 *
 * Protocol of one mall_mpi_step() (all ranks, same call):
 *   1. local: rc = mall_step(m); on a new allocation the rank's share is recomputed:
 *        share = max(1, ncpus_of_node_job / sharers)
 *      where the "sharers" are the ranks of this communicator on the same node
 *      (MPI_COMM_TYPE_SHARED) attached to the same malld job ($MALL_SOCKET and mall_job_id()
 *      equal: srun tasks of one step join one job); a rank without an attached handle has
 *      share = its default thread count and is not malleable.
 *   2. MPI_Allreduce(MPI_MIN) of { changed (-2: an allocation, -1: only a cap at the last
 *      evaluation, 0: nothing), regroup ? -1 : 0, share, limited ? share : INT_MAX,
 *      balanced wanted ? 1 : 0 }, where limited = !(pending || (cap != 0 && share >= cap)): a rank
 *      that sits at its own usage cap, or that raised or lifted its cap less than a second ago
 *      and has not received a new allocation since (its malld is handing it more cpus), is not
 *      what limits the job. Nothing changed anywhere: the step ends here (MALL_NOUPDT).
 *   3. every rank, same data: balanced = all ranks want it; T = balanced ? min share : own share;
 *      C = min share over the limited ranks (INT_MAX when none). Balanced: when C == INT_MAX and
 *      the rank has a cap, it lifts it (mall_set_usage(0)); when share > C, or its cap is below C,
 *      it sets cap = C and sends mall_set_usage(C * sharers) (one sharer per node job sends;
 *      only when the value changes). Unbalanced: caps are lifted. A cap that changed makes every
 *      rank evaluate once more at the next step; a pending raise that brought nothing within the
 *      second does too (the rank is limited after all, e.g. a borrower keeps its share).
 *   4. when any rank's allocation changed, the mode changed or T changed, every rank runs its
 *      callbacks (threads T, its cpus) and mall_mpi_step() returns MALL_SUCCESS on every rank;
 *      otherwise MALL_NOUPDT on every rank.
 *   A rank whose attached job changes (first attach after a malld restart, another job) asks for
 *   a regroup: all ranks then redo the sharer count (one MPI_Allgather within each node) and the
 *   reduction, in the same call.
 * The cap a rank sends arrives at its malld as a smaller (or larger) allocation at a later
 * mall_step(), which the next mall_mpi_step() sees as a change; in the cases the tests drive
 * (shrink one rank, grow it back, with and without a borrower on another rank's node) this
 * settles in two or three evaluations without oscillating.
 * A shrinking rank acks its new allocation inside mall_step(), before the reduction; its pool is
 * resized in the same mall_mpi_step() call, between two training steps, while no work runs.
 */
#ifndef MALL_MALL_MPI_H
#define MALL_MALL_MPI_H

#include <mpi.h>

#include <mall/mall.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(MALL_MPI_BUILDING_LIBRARY)
#define MALL_MPI_EXPORT __attribute__((visibility("default")))
#else
#define MALL_MPI_EXPORT
#endif

/* Opaque handle, one per communicator that steps together. */
typedef struct mall_mpi_handle mall_mpi_t;

/* Flags of mall_mpi_open(). */
#define MALL_MPI_BALANCED 0   /* default: every rank runs the count of the most constrained rank */
#define MALL_MPI_UNBALANCED 1 /* every rank runs its own allocation (changes still at one step) */

/* Called on every rank, inside the same mall_mpi_step(), when the job-wide picture changed.
 * threads: the count this rank should run from now on (>= 1).
 * cpus: the cpus this rank should run on: its slice of its node job's allocation (ncpus = its
 * share, which may be larger than threads in balanced mode), or, on a rank that is not malleable,
 * the cpus the process was allowed at mall_mpi_open(). Valid during the call only.
 * Must not call mall_mpi_step(), mall_mpi_close(), mall_step() or mall_close(). */
typedef void (*mall_mpi_resize_fn)(int threads, const mall_alloc_t *cpus, void *arg);

/* What mall_mpi_get_state() reports about this rank (local values, no communication). */
typedef struct mall_mpi_state {
    int threads;     /* the count this rank should run (as last given to the callbacks) */
    int share;       /* what this rank's own allocation allows (its slice; fewer when an admin set the
                        node job's thread count with mallctl set --threads) */
    int usage_cap;   /* the cap this rank's node job asked for, in per-rank units (0 = none) */
    int sharers;     /* ranks of this communicator sharing this rank's node job (1 = alone) */
    int malleable;   /* 1 when this rank has an attached handle that applied an allocation */
    int balanced;    /* 1 when balanced mode is in effect (every rank asked for it) */
    uint64_t steps;  /* mall_mpi_step() calls so far */
    uint64_t changes; /* steps that returned MALL_SUCCESS */
} mall_mpi_state_t;

/* Opens the collective step over comm (collective: every rank of comm calls it; comm is
 * duplicated, so the library's reductions never mix with the caller's messages).
 * m: this rank's libmall handle, or NULL when the rank is not malleable (no malld); it must
 *   outlive the mall_mpi handle. Do not call mall_step(m) yourself afterwards: mall_mpi_step()
 *   does. mall_on_resize() callbacks on m still run (when this rank's allocation changes, before
 *   the reduction); pools that follow the job-wide count belong in mall_mpi_on_resize().
 * flags: MALL_MPI_BALANCED (0) or MALL_MPI_UNBALANCED.
 * default_threads: this rank's count while it has no allocation (no malld, not attached yet);
 *   0 = the number of cpus the process may run on now.
 * On success *out is set; the first mall_mpi_step() normally brings each attached rank's first
 * allocation (and returns MALL_SUCCESS).
 * Returns MALL_SUCCESS, MALL_ERR_INVAL (NULL out, comm MPI_COMM_NULL, bad flags or
 * default_threads < 0), MALL_ERR_NOMEM, or MALL_ERR_SYSTEM (an MPI call failed; err says which).
 * err (may be NULL) receives words on failure. */
MALL_MPI_EXPORT int mall_mpi_open(mall_t *m, MPI_Comm comm, int flags, int default_threads,
                                  mall_mpi_t **out, mall_error_t *err);

/* Registers a callback (at most 8) run on every rank when the job-wide picture changes (see
 * mall_mpi_resize_fn). Local. Returns MALL_SUCCESS, MALL_ERR_INVAL or MALL_ERR_FULL. */
MALL_MPI_EXPORT int mall_mpi_on_resize(mall_mpi_t *mm, mall_mpi_resize_fn fn, void *arg);

/* The step boundary (collective over the communicator: every rank calls it once per step).
 * When nothing changed anywhere: one mall_step() load and one MPI_Allreduce of five ints, no
 * allocation, no other system call (for at most a second after this rank raised its cap, also a
 * clock read). Returns, identically on every rank: MALL_SUCCESS when the
 * callbacks ran at this step (some rank's allocation changed, the mode changed, or the thread
 * count changed), MALL_NOUPDT otherwise; MALL_ERR_INVAL for NULL; MALL_ERR_SYSTEM when the
 * reduction failed (only with an MPI error handler that returns). */
MALL_MPI_EXPORT int mall_mpi_step(mall_mpi_t *mm);

/* The thread count this rank should run now (>= 1; its default before the first change).
 * Local. Returns the count, or MALL_ERR_INVAL for NULL. */
MALL_MPI_EXPORT int mall_mpi_threads(mall_mpi_t *mm);

/* Copies the cpus this rank should run on (see mall_mpi_resize_fn). Local.
 * Returns MALL_SUCCESS or MALL_ERR_INVAL. */
MALL_MPI_EXPORT int mall_mpi_get_cpus(mall_mpi_t *mm, mall_alloc_t *out);

/* Asks for balanced (on != 0) or unbalanced mode from the next mall_mpi_step() on. Local; the
 * job is balanced only while every rank asks for it, and the switch happens at one step on all
 * ranks (with the callbacks). Returns MALL_SUCCESS or MALL_ERR_INVAL. */
MALL_MPI_EXPORT int mall_mpi_set_balanced(mall_mpi_t *mm, int on);

/* Fills *out with this rank's view (see mall_mpi_state_t). Local.
 * Returns MALL_SUCCESS or MALL_ERR_INVAL. */
MALL_MPI_EXPORT int mall_mpi_get_state(mall_mpi_t *mm, mall_mpi_state_t *out);

/* Closes the handle (collective: frees the duplicated communicators). Lifts this rank's usage
 * cap if it set one, so m can keep stepping alone. Does not close m. NULL is accepted. */
MALL_MPI_EXPORT void mall_mpi_close(mall_mpi_t *mm);

#ifdef __cplusplus
}
#endif

#endif /* MALL_MALL_MPI_H */
