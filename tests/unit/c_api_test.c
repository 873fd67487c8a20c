/* SPDX-License-Identifier: BSD-3-Clause */
/* c_api_test.c — proves mall.h compiles as C99 and libmall links from C: versions agree, every code
 * has words, mall_alloc_t keeps its layout, a missing daemon gives a detached handle that says "nothing changed" (usage caps kept,
 * callback arguments released once at close), NULL is refused. */
#define _POSIX_C_SOURCE 200809L
#include <mall/mall.h>

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../support/watchdog.h"

static int failures = 0;

#define CHECK(cond)                                                              \
    do {                                                                         \
        if (!(cond)) {                                                           \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            ++failures;                                                          \
        }                                                                        \
    } while (0)

static void on_resize(const mall_alloc_t *alloc, void *arg) {
    (void)alloc;
    (void)arg;
}

/* Counts the release calls for each callback argument. */
static int releases[20];
static void count_release(void *arg) { ++releases[(int *)arg - releases]; }

int main(void) {
    mall_test_watchdog_arm(30); /* a hang fails the test */

    /* The header's version and the loaded library's agree. */
    CHECK(MALL_API_VERSION == mall_get_api_version());

    /* mall_alloc_t keeps API 0.2.0's layout (nthreads took a padding slot), and mall_alloc_threads()
     * reads nthreads when it is 1..ncpus, else ncpus (an allocation from a library before 0.3.0). */
    {
        mall_alloc_t a;
        CHECK(offsetof(mall_alloc_t, ncpus) == 8 && offsetof(mall_alloc_t, nthreads) == 12);
        CHECK(offsetof(mall_alloc_t, mask) == 16 && offsetof(mall_alloc_t, cpus) == 144);
        CHECK(sizeof(mall_alloc_t) == 4240);
        memset(&a, 0, sizeof a);
        a.ncpus = 4;
        CHECK(mall_alloc_threads(&a) == 4);
        a.nthreads = 2;
        CHECK(mall_alloc_threads(&a) == 2);
        a.nthreads = 5;
        CHECK(mall_alloc_threads(&a) == 4);
        a.nthreads = -1;
        CHECK(mall_alloc_threads(&a) == 4);
        CHECK(mall_alloc_threads(NULL) == 0);
    }

    /* Every code has words; unknown codes too. */
    {
        const int codes[] = {MALL_SUCCESS,      MALL_NOUPDT,      MALL_ERR_INVAL,    MALL_ERR_NODAEMON,
                             MALL_ERR_DENIED,   MALL_ERR_NOJOB,   MALL_ERR_PROTOCOL, MALL_ERR_NOMEM,
                             MALL_ERR_SYSTEM,   MALL_ERR_DETACHED, MALL_ERR_VERSION, MALL_ERR_FULL};
        size_t i;
        for (i = 0; i < sizeof codes / sizeof codes[0]; ++i) {
            const char *text = mall_strerror(codes[i]);
            CHECK(text != NULL && text[0] != '\0');
            CHECK(strcmp(text, "unknown mall error") != 0);
        }
        CHECK(strcmp(mall_strerror(12345), "unknown mall error") == 0);
        CHECK(strcmp(mall_strerror(-12345), "unknown mall error") == 0);
    }

    /* No daemon: a detached handle, error words, and "nothing changed". */
    {
        char path[128];
        mall_t *m = NULL;
        mall_error_t err;
        mall_alloc_t alloc;
        int rc;
        unsetenv("MALL_JOB_ID");
        unsetenv("MALL_MIN");
        unsetenv("MALL_MAX");
        snprintf(path, sizeof path, "/tmp/mall-c-api-test-%ld/no-such.sock", (long)getpid());
        memset(&err, 0, sizeof err);
        rc = mall_open(path, &m, &err);
        CHECK(rc == MALL_ERR_NODAEMON);
        CHECK(m != NULL);
        CHECK(err.text[0] != '\0');
        if (err.text[0] != '\0') printf("mall_open without a daemon: %s\n", err.text);
        if (m != NULL) {
            CHECK(mall_step(m) == MALL_NOUPDT);
            CHECK(mall_step(m) == MALL_NOUPDT);
            CHECK(mall_attached(m) == MALL_ERR_DETACHED);
            CHECK(mall_job_id(m) != NULL && mall_job_id(m)[0] == '\0');
            CHECK(mall_get_allocation(m, &alloc) == MALL_SUCCESS);
            CHECK(alloc.generation == 0 && alloc.ncpus == 0);
            CHECK(mall_fd(m) >= 0);
            CHECK(mall_on_resize(m, on_resize, NULL) == MALL_SUCCESS);
            CHECK(mall_bind_thread(m) == MALL_SUCCESS);
            CHECK(mall_unbind_thread(m) == MALL_SUCCESS);
            CHECK(mall_report_progress(m, 10) == MALL_SUCCESS);
            CHECK(mall_on_resize(m, NULL, NULL) == MALL_ERR_INVAL);
            CHECK(mall_get_allocation(m, NULL) == MALL_ERR_INVAL);
            /* The usage cap: kept while detached (sent at the next attach); out of range refused. */
            CHECK(mall_set_usage(m, 1) == MALL_SUCCESS);
            CHECK(mall_set_usage(m, 0) == MALL_SUCCESS);
            CHECK(mall_set_usage(m, MALL_MAX_CPUS) == MALL_SUCCESS);
            CHECK(mall_set_usage(m, -1) == MALL_ERR_INVAL);
            CHECK(mall_set_usage(m, MALL_MAX_CPUS + 1) == MALL_ERR_INVAL);
            mall_close(m);
        }
    }

    /* mall_on_resize_with_release: mall_close() releases each registered argument exactly once; a
     * refused registration (NULL function, table full) leaves its argument to the caller. */
    {
        char path[128];
        mall_t *m = NULL;
        int registered = 0, i, rc;
        snprintf(path, sizeof path, "/tmp/mall-c-api-test-%ld/no-such.sock", (long)getpid());
        rc = mall_open(path, &m, NULL);
        CHECK(rc == MALL_ERR_NODAEMON && m != NULL);
        if (m != NULL) {
            CHECK(mall_on_resize_with_release(m, NULL, &releases[19], count_release) == MALL_ERR_INVAL);
            for (i = 0; i < 18; ++i) {
                rc = mall_on_resize_with_release(m, on_resize, &releases[i], count_release);
                if (rc == MALL_SUCCESS) ++registered;
                else CHECK(rc == MALL_ERR_FULL);
            }
            CHECK(registered == 16); /* mall.h: at most 16 callbacks per handle */
            for (i = 0; i < 20; ++i) CHECK(releases[i] == 0); /* nothing released before mall_close */
            mall_close(m);
            for (i = 0; i < 20; ++i) CHECK(releases[i] == (i < 16 ? 1 : 0));
        }
        CHECK(mall_on_resize_with_release(NULL, on_resize, &releases[19], count_release) == MALL_ERR_INVAL);
        CHECK(releases[19] == 0);
    }

    /* NULL handling for every function. */
    {
        mall_alloc_t alloc;
        mall_error_t err;
        CHECK(mall_open(NULL, NULL, &err) == MALL_ERR_INVAL);
        CHECK(err.text[0] != '\0');
        CHECK(mall_open(NULL, NULL, NULL) == MALL_ERR_INVAL);
        CHECK(mall_step(NULL) == MALL_ERR_INVAL);
        CHECK(mall_get_allocation(NULL, &alloc) == MALL_ERR_INVAL);
        CHECK(mall_on_resize(NULL, on_resize, NULL) == MALL_ERR_INVAL);
        CHECK(mall_bind_thread(NULL) == MALL_ERR_INVAL);
        CHECK(mall_unbind_thread(NULL) == MALL_ERR_INVAL);
        CHECK(mall_fd(NULL) == MALL_ERR_INVAL);
        CHECK(mall_report_progress(NULL, 1) == MALL_ERR_INVAL);
        CHECK(mall_attached(NULL) == MALL_ERR_INVAL);
        CHECK(mall_set_usage(NULL, 0) == MALL_ERR_INVAL);
        CHECK(mall_job_id(NULL) == NULL);
        mall_close(NULL);
    }

    if (failures != 0) {
        fprintf(stderr, "c_api_test: %d check(s) failed\n", failures);
        return 1;
    }
    printf("c_api_test: all checks passed\n");
    return 0;
}
