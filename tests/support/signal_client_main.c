/* SPDX-License-Identifier: BSD-3-Clause */
/* signal_client_main.c — mall_signal_client, a C99 program that tests resize by signal through the
 * public C API only: it opens mall (MALL_SIGNAL_CONTROL and MALL_NOTIFY_SIGNAL come from the
 * environment), starts --workers bound threads of which mall_alloc_threads() run and the rest
 * wait, and calls mall_step() every 10 ms from its main loop.
 * Output (line-buffered): "open rc=<rc> pid=<pid>", then for each applied change
 * "change threads=<t> ncpus=<n> cpus=<list> gen=<g>" and "active=<k>" once the workers follow.
 * --no-step never calls mall_step() (a request then stays pending); --drop-handler sets the control
 * signal to SIG_IGN after mall_open() (the record stays, the handler is gone); --raw-fork forks a
 * child with the raw clone system call (no atfork handlers: it keeps the parent's record
 * descriptor) that only waits, and prints "forked=<pid>"; --close-after-s S calls mall_close()
 * after S seconds and runs on without mall ("closed"); --wait-notify sleeps in
 * sigsuspend() until the notification signal's handler ran, then steps ("notified" is printed).
 * Exits 0 on SIGTERM/SIGINT or after --duration-s (default 60). */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "mall/mall.h"

#define MAX_WORKERS 64

/* Set by signal handlers, read by every thread: lock-free atomics (async-signal-safe). */
static atomic_int g_stop = 0;
static atomic_int g_notified = 0;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static int g_active = 0;  /* workers 0..g_active-1 run, under g_mu */
static int g_running = 0; /* workers that run now, under g_mu */
static mall_t *g_mall = NULL;

static void on_stop(int sig) { (void)sig; atomic_store(&g_stop, 1); }
static void on_notify(int sig) { (void)sig; atomic_store(&g_notified, 1); }

static void *worker(void *arg) {
    int index = (int)(long)arg;
    volatile unsigned long sink = 0;
    int running = 0;
    mall_bind_thread(g_mall);
    while (!atomic_load(&g_stop)) {
        pthread_mutex_lock(&g_mu);
        int run = index < g_active;
        if (run != running) {
            g_running += run ? 1 : -1;
            running = run;
            pthread_cond_broadcast(&g_cv);
        }
        if (!run) {
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_nsec += 20 * 1000 * 1000;
            if (until.tv_nsec >= 1000000000L) { until.tv_sec++; until.tv_nsec -= 1000000000L; }
            pthread_cond_timedwait(&g_cv, &g_mu, &until);
            pthread_mutex_unlock(&g_mu);
            continue;
        }
        pthread_mutex_unlock(&g_mu);
        for (int i = 0; i < 20000; ++i) sink += (unsigned long)i;
        struct timespec nap = {0, 1000 * 1000};
        nanosleep(&nap, NULL);
    }
    return NULL;
}

static void on_change(const mall_alloc_t *alloc, void *arg) {
    (void)arg;
    int threads = mall_alloc_threads(alloc);
    printf("change threads=%d ncpus=%d cpus=%s gen=%llu\n", threads, alloc->ncpus, alloc->cpus,
           (unsigned long long)alloc->generation);
    pthread_mutex_lock(&g_mu);
    g_active = threads;
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
}

int main(int argc, char **argv) {
    int workers = 4, step = 1, wait_notify = 0, drop_handler = 0, raw_fork = 0;
    pid_t forked = 0;
    double duration_s = 60, close_after_s = -1;
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--workers") && i + 1 < argc) workers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--duration-s") && i + 1 < argc) duration_s = atof(argv[++i]);
        else if (!strcmp(argv[i], "--no-step")) step = 0;
        else if (!strcmp(argv[i], "--wait-notify")) wait_notify = 1;
        else if (!strcmp(argv[i], "--drop-handler")) drop_handler = 1;
        else if (!strcmp(argv[i], "--raw-fork")) raw_fork = 1;
        else if (!strcmp(argv[i], "--close-after-s") && i + 1 < argc) close_after_s = atof(argv[++i]);
        else {
            fprintf(stderr, "usage: mall_signal_client [--workers K] [--duration-s S] [--no-step] [--wait-notify] "
                            "[--drop-handler] [--raw-fork] [--close-after-s S]\n");
            return 2;
        }
    }
    if (workers < 1 || workers > MAX_WORKERS) {
        fprintf(stderr, "mall_signal_client: --workers must be 1 to %d\n", MAX_WORKERS);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    signal(SIGTERM, on_stop);
    signal(SIGINT, on_stop);
    const char *notify = getenv("MALL_NOTIFY_SIGNAL");
    sigset_t unblocked;
    sigemptyset(&unblocked);
    if (wait_notify && notify && !strcmp(notify, "SIGUSR1")) {
        /* Blocked except inside sigsuspend(): a signal between the check and the wait is not lost. */
        signal(SIGUSR1, on_notify);
        sigset_t usr1;
        sigemptyset(&usr1);
        sigaddset(&usr1, SIGUSR1);
        pthread_sigmask(SIG_BLOCK, &usr1, NULL);
    }

    mall_error_t err;
    int rc = mall_open(NULL, &g_mall, &err);
    printf("open rc=%d pid=%ld\n", rc, (long)getpid());
    if (!g_mall) {
        fprintf(stderr, "mall_signal_client: mall_open: %s\n", err.text);
        return 1;
    }
    mall_on_resize(g_mall, on_change, NULL);
    if (drop_handler) signal(SIGRTMAX - 7, SIG_IGN);
    if (raw_fork) {
        forked = (pid_t)syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0);
        if (forked == 0)
            for (;;) pause(); /* only async-signal-safe calls in this child */
        printf("forked=%ld\n", (long)forked);
    }
    /* Without an allocation yet, all workers run (one per cpu of the opening affinity). */
    cpu_set_t start;
    CPU_ZERO(&start);
    sched_getaffinity(0, sizeof start, &start);
    g_active = CPU_COUNT(&start) < workers ? CPU_COUNT(&start) : workers;

    pthread_t threads[MAX_WORKERS];
    for (int i = 0; i < workers; ++i) pthread_create(&threads[i], NULL, worker, (void *)(long)i);

    struct timespec begin, now;
    clock_gettime(CLOCK_MONOTONIC, &begin);
    int reported = -1;
    while (!atomic_load(&g_stop)) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        const double elapsed = (now.tv_sec - begin.tv_sec) + (now.tv_nsec - begin.tv_nsec) / 1e9;
        if (elapsed > duration_s) break;
        if (close_after_s >= 0 && elapsed > close_after_s && g_mall) {
            mall_close(g_mall);
            g_mall = NULL;
            printf("closed\n");
        }
        if (wait_notify) {
            while (!atomic_load(&g_notified) && !atomic_load(&g_stop)) sigsuspend(&unblocked);
            if (atomic_exchange(&g_notified, 0)) printf("notified\n");
        }
        if (step && g_mall) mall_step(g_mall);
        pthread_mutex_lock(&g_mu);
        int settled = g_running == g_active ? g_active : -1;
        pthread_mutex_unlock(&g_mu);
        if (settled >= 0 && settled != reported) {
            printf("active=%d\n", settled);
            reported = settled;
        }
        struct timespec nap = {0, 10 * 1000 * 1000};
        nanosleep(&nap, NULL);
    }
    atomic_store(&g_stop, 1);
    pthread_mutex_lock(&g_mu);
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
    for (int i = 0; i < workers; ++i) pthread_join(threads[i], NULL);
    if (g_mall) mall_close(g_mall);
    if (forked > 0) {
        kill(forked, SIGKILL);
        waitpid(forked, NULL, 0);
    }
    return 0;
}
