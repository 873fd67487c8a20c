/* SPDX-License-Identifier: BSD-3-Clause */
/* mall.h — the public C API of libmall, the training-process side of mall.
 *
 * A training process opens a handle once, then calls mall_step() at every training-step boundary.
 * When the node manager (malld) has published a new CPU allocation for the process's job,
 * mall_step() runs the registered resize callbacks, re-pins the registered threads and acknowledges
 * the new generation; otherwise it costs two atomic loads (the generation on the shared page and
 * the one the handle last saw) and a compare. The library never terminates its host process, and
 * its waits are bounded: without a daemon, every call behaves as "nothing changes".
 *
 * Time. mall_open() is the only call that waits for the node manager: at most
 * $MALL_ATTACH_TIMEOUT_MS milliseconds (default 2000, 0 to 60000; 0 = do not wait, attach in the
 * background) for its reply; connecting itself never waits (a node manager whose queue is full
 * counts as not answering). mall_step() without a change makes no system call and takes no lock;
 * with a change it runs the callbacks, re-pins the bound threads and sends one message without
 * waiting. mall_set_usage() sends one message without waiting. mall_close() stops the background
 * thread, which never waits longer than it takes to notice (it polls a stop descriptor).
 * Everything else returns without waiting for anyone.
 *
 * Threads. A handle may be used from several threads at once, with these rules:
 * - mall_step(), mall_get_allocation(), mall_report_progress(), mall_set_usage(), mall_attached(),
 *   mall_job_id() and mall_fd() may run concurrently from any threads. Concurrent mall_step() calls
 *   apply a change once; the callbacks run on the thread whose mall_step() applies it.
 * - mall_bind_thread() / mall_unbind_thread() act on the calling thread; any thread may call them.
 * - mall_on_resize*() may run concurrently with mall_step(); a callback registered meanwhile runs
 *   from the next change on.
 * - A resize callback must not call mall_step() or mall_close() on its handle (it runs inside
 *   mall_step()); other calls are allowed. It may fork (e.g. to start a pool of workers of the new
 *   size): in the child, that mall_step() finishes on the child's detached copy (see mall_open()).
 * - mall_close() must be the handle's last call: no other call on the handle may run concurrently
 *   with it or start after it. It must not be called from a resize callback.
 * - The pointer mall_job_id() returns stays valid, and its text unchanged, until mall_close().
 * - The library's own thread blocks every signal, so signals reach only the host's threads. No
 *   call is async-signal-safe: do not call the library from a signal handler.
 *
 * Output. The library writes to stderr only when the process should know something it cannot
 * see otherwise: one line when the connection to malld is lost (the process keeps its cpus and
 * runs on, not malleable) and one when it is back, and one when a notification signal cannot be
 * sent (see mall_open_ex()); $MALL_QUIET=1 silences them. Each is a single write(2), never from
 * mall_step().
 *
 * This header compiles as C99 and as C++. It is the only header a training process needs.
 */
#ifndef MALL_MALL_H
#define MALL_MALL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(MALL_BUILDING_LIBRARY)
#define MALL_EXPORT __attribute__((visibility("default")))
#else
#define MALL_EXPORT
#endif

/* API version: major * 10000 + minor * 100 + patch. Compare with mall_get_api_version(), which
 * returns the version of the library actually loaded. */
#define MALL_API_VERSION_MAJOR 0
#define MALL_API_VERSION_MINOR 3
#define MALL_API_VERSION_PATCH 0
#define MALL_API_VERSION \
    (MALL_API_VERSION_MAJOR * 10000 + MALL_API_VERSION_MINOR * 100 + MALL_API_VERSION_PATCH)

/* Largest CPU number + 1 that an allocation can hold. */
#define MALL_MAX_CPUS 1024
/* Size of the text form of an allocation ("0-3,8"), including the terminating NUL; large enough
 * for any set of MALL_MAX_CPUS cpus. */
#define MALL_CPULIST_MAX 4096
/* Default socket of the node manager, used when neither the argument nor $MALL_SOCKET is set. */
#define MALL_DEFAULT_SOCKET "/run/mall/malld.sock"

/* Return codes: 0 success, small positive values for "fine, with news", negative for errors. */
enum mall_rc {
    MALL_SUCCESS = 0,        /* done; for mall_step(): a new allocation was applied */
    MALL_NOUPDT = 1,         /* nothing changed since the last call */
    MALL_ERR_INVAL = -1,     /* a bad argument (NULL handle, NULL output, bad value) */
    MALL_ERR_NODAEMON = -2,  /* no node manager answered at the socket; the handle is detached */
    MALL_ERR_DENIED = -3,    /* the node manager refused the request (not this job's owner, ...) */
    MALL_ERR_NOJOB = -4,     /* no registration for this process and self-registration is off */
    MALL_ERR_PROTOCOL = -5,  /* the node manager answered something this library cannot read */
    MALL_ERR_NOMEM = -6,     /* out of memory */
    MALL_ERR_SYSTEM = -7,    /* a system call failed; the error text says which and why */
    MALL_ERR_DETACHED = -8,  /* the handle is not connected to a node manager (yet) */
    MALL_ERR_VERSION = -9,   /* the node manager speaks an incompatible protocol version */
    MALL_ERR_FULL = -10      /* a fixed-size table is full (callbacks, bound threads) */
};

/* Opaque handle; one per process is the normal use. (The tag is not "mall": C++ code has a
 * namespace mall, and a struct and a namespace cannot share a name.) */
typedef struct mall_handle mall_t;

/* Words for an error, filled by calls that take one (may be NULL). */
typedef struct mall_error {
    char text[160];
} mall_error_t;

/* A CPU allocation as published by the node manager. */
typedef struct mall_alloc {
    uint64_t generation;                    /* increases with every change published for the job */
    int ncpus;                              /* number of cpus in the allocation (>= 1 when attached) */
    /* Since API 0.3.0: the threads to run on these cpus, 1..ncpus: ncpus unless an admin chose
     * fewer (mallctl set JOB --threads N). Libraries before 0.3.0 leave it 0 (it was padding, so
     * the struct's size and offsets are unchanged): read it with mall_alloc_threads(). */
    int nthreads;
    uint64_t mask[MALL_MAX_CPUS / 64];      /* bit i of mask[i / 64] set when cpu i is allocated */
    char cpus[MALL_CPULIST_MAX];            /* the same set as Linux list text, e.g. "0-3,8" */
} mall_alloc_t;

/* The number of threads a process should run for an allocation: nthreads when it is 1..ncpus,
 * else ncpus (an allocation from a library before 0.3.0). Header-only: works with any libmall.so.0. */
static inline int mall_alloc_threads(const mall_alloc_t *alloc) {
    if (alloc == 0) return 0;
    return (alloc->nthreads > 0 && alloc->nthreads <= alloc->ncpus) ? alloc->nthreads : alloc->ncpus;
}

/* Called by mall_step() on the stepping thread when a new allocation arrives, before re-pinning
 * and before the ack. Must not call mall_step() or mall_close() on the same handle. */
typedef void (*mall_resize_fn)(const mall_alloc_t *alloc, void *arg);

/* Frees a callback's argument; called once by mall_close() (see mall_on_resize_with_release()). */
typedef void (*mall_release_fn)(void *arg);

/* Version of the loaded library, in the MALL_API_VERSION encoding. Never fails. */
MALL_EXPORT int mall_get_api_version(void);

/* A static English text for a return code. Never NULL; unknown codes give "unknown mall error". */
MALL_EXPORT const char *mall_strerror(int rc);

/* Opens a handle and attaches to the node manager.
 * socket_path: NULL means $MALL_SOCKET, then MALL_DEFAULT_SOCKET.
 * The process attaches to the registration a launcher made for it ($MALL_JOB_ID names the job;
 * the daemon checks that this process belongs to it). Without $MALL_JOB_ID, the library asks the
 * daemon to self-register the process with $MALL_MIN / $MALL_MAX (defaults 1 and the whole pool),
 * which the daemon grants only when its admin allows it (malld --allow-self-register) and the
 * process lives in a cgroup delegated to its user (else MALL_ERR_DENIED, with the reason).
 * *out is NULL exactly when no handle could be made: MALL_ERR_INVAL, MALL_ERR_NOMEM, and
 * MALL_ERR_SYSTEM when making the handle failed (a page could not be mapped or an eventfd made: the
 * process is out of memory or file descriptors). On every other error *out is a detached handle:
 * every later call on it treats the allocation as unchanged and it keeps trying to attach in the
 * background, so callers may ignore the code (MALL_ERR_SYSTEM with a handle: its background
 * thread could not start; changes still apply at mall_step()). Test *out, not the code, to know
 * whether you hold a handle; mall_close(NULL) does nothing.
 * Waits at most $MALL_ATTACH_TIMEOUT_MS (default 2000) for the node manager's reply; a malformed
 * value is MALL_ERR_INVAL.
 * Returns MALL_SUCCESS, MALL_ERR_INVAL, MALL_ERR_NOMEM, MALL_ERR_NODAEMON (nothing answered in
 * time), MALL_ERR_DENIED (also when the node manager refuses the connection itself, e.g. this user
 * holds as many connections as malld --max-connections-per-user allows), MALL_ERR_NOJOB,
 * MALL_ERR_PROTOCOL, MALL_ERR_VERSION or MALL_ERR_SYSTEM; err (may be NULL) receives words on
 * failure.
 * A handle belongs to the process that opened it: in a forked child the parent's handle is
 * detached (mall_step() reports no change, mall_attached() MALL_ERR_DETACHED), and mall_close()
 * there frees only the child's copy: the parent's handle keeps following malld. A child that is to
 * be malleable opens its own. A resize callback may fork too: the child returns from it and its
 * mall_step() finishes on the detached copy (the later callbacks run there, nothing reaches malld).
 * libmall refuses a server that runs as neither root, this user nor the socket file's owner, the
 * owner only where root and it alone may write every folder on the socket's path (symlinks'
 * included; a sticky /tmp is writable by others), and a page that is not sealed as malld seals it
 * (MALL_ERR_NODAEMON, MALL_ERR_PROTOCOL, with words). */
MALL_EXPORT int mall_open(const char *socket_path, mall_t **out, mall_error_t *err);

/* Since API 0.3.0: mall_open() with options. Set the struct up with MALL_OPEN_OPTIONS_INIT, then
 * change what you need; a library that predates a field you set refuses it (MALL_ERR_INVAL).
 *
 * notify_signal: the process is also sent this signal (sigqueue, value = the generation's low 31
 * bits) when malld publishes a change it has not applied yet, for programs blocked in long
 * operations or in event loops without mall_fd(). The handshake itself still happens at the next
 * mall_step(): the handler should only set a flag (a volatile sig_atomic_t or a lock-free atomic)
 * and the program calls mall_step() when it sees it; no mall call is async-signal-safe. Pick
 * SIGUSR1 or SIGUSR2 (a burst of changes then wakes the process once: standard signals do not
 * queue) or a real-time signal SIGRTMIN..SIGRTMAX (one queued signal per change, counted against
 * RLIMIT_SIGPENDING) that nothing else in the process uses. Install the handler (sigaction,
 * without SA_RESTART if a blocked read() should return EINTR) before changes may come: while the
 * signal's disposition is the default, whose action would end the process, libmall sends nothing
 * and says so once on stderr. The signal goes to the process: any thread that does not block it
 * may run the handler (libmall's own thread blocks every signal). 0: $MALL_NOTIFY_SIGNAL (SIGUSR1,
 * SIGUSR2, SIGRTMIN+N, SIGRTMAX-N or a number) or none; -1: none. */
typedef struct mall_open_options {
    size_t size;             /* sizeof(mall_open_options_t): MALL_OPEN_OPTIONS_INIT sets it */
    const char *socket_path; /* as mall_open()'s argument (NULL: $MALL_SOCKET, then the default) */
    unsigned flags;          /* none are defined yet: 0 */
    int notify_signal;       /* see above: 0, -1, SIGUSR1, SIGUSR2 or SIGRTMIN..SIGRTMAX */
    /* Control by signal (`mallctl signal PID --threads N`, `--cpus a-b`), for a process that is
     * not attached to malld (a workstation, a container without the socket, a process started
     * before malld): 0: $MALL_SIGNAL_CONTROL decides (1: the default signal SIGRTMAX-7; a
     * real-time signal's name or number; 0 or unset: off); -1: off; else the real-time signal to
     * use. libmall installs its own handler for it (refused when the signal already has one),
     * one handle per process; a request applies at the next mall_step() through the resize
     * callbacks and the pinning of every thread, within the cpus the process had at mall_open()
     * (mall_step() returns MALL_SUCCESS; the generation stays malld's, 0 without malld). A handle
     * attached to malld refuses requests, since malld's allocation wins, unless the administrator
     * let the job take them (mallctl set JOB --signal-control on): then requests that narrow within
     * malld's cpus apply until malld's next change. The outcome of each request is kept in a
     * close-on-exec memfd named "mall-signal" that `mallctl signal` reads through /proc. */
    int control_signal;
} mall_open_options_t;
#define MALL_OPEN_OPTIONS_INIT { sizeof(mall_open_options_t), 0, 0u, 0, 0 }
MALL_EXPORT int mall_open_ex(const mall_open_options_t *options, mall_t **out, mall_error_t *err);

/* The step-boundary handshake. When nothing changed: two atomic loads (the shared page's
 * generation, the handle's last seen one) and a compare; no system call, no lock, no allocation. When a new generation was published: runs the resize callbacks, re-pins the
 * registered threads, acknowledges the generation to the node manager.
 * Returns MALL_NOUPDT (nothing changed, also for a detached handle), MALL_SUCCESS (a new
 * allocation was applied), MALL_ERR_INVAL (NULL handle). */
MALL_EXPORT int mall_step(mall_t *m);

/* Copies the allocation last applied by mall_step(): generation 0 and ncpus 0 before the first
 * applied change; after malld goes away, the last one applied (the cores the process still has).
 * Returns MALL_SUCCESS, MALL_ERR_INVAL or MALL_ERR_SYSTEM (a lock failed; *out is unchanged). */
MALL_EXPORT int mall_get_allocation(mall_t *m, mall_alloc_t *out);

/* Registers a callback run by mall_step() on each new allocation (at most 16 per handle).
 * Returns MALL_SUCCESS, MALL_ERR_INVAL, MALL_ERR_FULL or MALL_ERR_SYSTEM (a lock failed; nothing
 * was registered). */
MALL_EXPORT int mall_on_resize(mall_t *m, mall_resize_fn fn, void *arg);

/* As mall_on_resize(), and the handle takes ownership of arg: mall_close() calls release(arg) once
 * (after the last callback can run). On failure nothing is registered and arg stays the caller's.
 * Adapters use it for the state their callback needs. Since API 0.2.0. */
MALL_EXPORT int mall_on_resize_with_release(mall_t *m, mall_resize_fn fn, void *arg, mall_release_fn release);

/* Registers the calling thread to be re-pinned to the allocation on each change, and pins it now
 * to the current allocation if one was applied. At most 1024 threads per handle; threads that
 * have exited are dropped at the next change.
 * Returns MALL_SUCCESS, MALL_ERR_INVAL, MALL_ERR_FULL or MALL_ERR_SYSTEM. */
MALL_EXPORT int mall_bind_thread(mall_t *m);

/* Removes the calling thread from the re-pin list (its current mask stays). Returns MALL_SUCCESS,
 * MALL_ERR_INVAL or MALL_ERR_SYSTEM (a lock failed; the thread stays registered). */
MALL_EXPORT int mall_unbind_thread(mall_t *m);

/* A descriptor that becomes readable when a change is published, for poll/epoll loops. It is
 * drained by mall_step(). Valid until mall_close(); stays the same number across reconnects.
 * Returns the descriptor (>= 0) or MALL_ERR_INVAL. */
MALL_EXPORT int mall_fd(mall_t *m);

/* Adds work units (samples, tokens, steps: any unit, consistently) done since the last call; the
 * node manager's policies use the rate. Lock-free and system-call free: the library sends the
 * totals in the background.
 * Returns MALL_SUCCESS or MALL_ERR_INVAL. */
MALL_EXPORT int mall_report_progress(mall_t *m, uint64_t work_units);

/* Tells the node manager how many of the job's allocated cpus the job actually uses; 0 means all
 * of them (no cap). A balanced multi-rank job runs every rank at the count its most constrained rank
 * can run; its other ranks call this so their nodes lend the surplus to other jobs. The node manager
 * then plans the job as if its max were ncpus (and its min at most ncpus, never below the cpus Slurm
 * guaranteed it); the smaller, or after a raise the larger, allocation arrives as a normal change at
 * a later mall_step(). Kept across reconnects. Sends one message when attached (a system call, no
 * reply): call it when the value changes, not every step; the node manager applies at most one
 * change a second per job (a sooner one waits, and the latest wins). Since API 0.2.0.
 * Returns MALL_SUCCESS, MALL_ERR_INVAL (NULL handle, ncpus < 0 or > MALL_MAX_CPUS), MALL_ERR_NOMEM
 * (out of memory: the value is kept and sent at the next attach) or MALL_ERR_SYSTEM (a lock failed). */
MALL_EXPORT int mall_set_usage(mall_t *m, int ncpus);

/* MALL_SUCCESS when attached to a node manager now, MALL_ERR_DETACHED when not, MALL_ERR_INVAL
 * for NULL. */
MALL_EXPORT int mall_attached(mall_t *m);

/* The job the handle is attached to (empty text when detached). Never NULL for a valid handle;
 * NULL for NULL. The text stays valid and unchanged until mall_close(), also when the handle later
 * re-attaches (a later call may then return another pointer). */
MALL_EXPORT const char *mall_job_id(mall_t *m);

/* Closes the handle: stops the background thread, unmaps the page, closes the socket, and calls
 * the release function of each mall_on_resize_with_release() callback. Bound threads keep their
 * last mask. NULL is accepted. The handle's last call (see "Threads" above). In a forked child it
 * frees only the child's copy (see mall_open()). */
MALL_EXPORT void mall_close(mall_t *m);

#ifdef __cplusplus
}
#endif

#endif /* MALL_MALL_H */
