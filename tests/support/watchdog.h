/* SPDX-License-Identifier: BSD-3-Clause */
/* watchdog.h — the one watchdog every test program arms, so a hang fails instead of stalling CI.
 * Contract: mall_test_watchdog_arm(s) (re)starts alarm(s); on expiry one line goes to stderr
 * ("watchdog: <program> still running after <s> s; failing instead of hanging"), the expiry hook runs
 * if one is set, and the process dies of SIGALRM. C and C++, header-only (the slurm_test_* programs
 * link no test library); the handler calls only async-signal-safe functions. C needs the POSIX
 * declarations (gnu99, the project default, or _POSIX_C_SOURCE >= 200112L before any include). */
#ifndef MALL_TESTS_SUPPORT_WATCHDOG_H
#define MALL_TESTS_SUPPORT_WATCHDOG_H

#include <signal.h>
#include <stddef.h>
#include <unistd.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GLIBC__)
extern char *program_invocation_short_name; /* glibc: argv[0] without its folders */
#endif

/* A last-resort cleanup run by the handler after the message and before the process dies (the
 * integration helpers kill their process groups and remove their cgroups and temp dirs). It runs in
 * a signal handler: async-signal-safe calls only. */
typedef void (*mall_test_watchdog_hook)(void);

/* C++: inline functions share one state (and so one hook) across a program's translation units.
 * C: static (the C tests are one file each). */
#ifdef __cplusplus
#define MALL_WATCHDOG_FN inline
#else
#define MALL_WATCHDOG_FN static inline
#endif

struct mall_test_watchdog_state {
    char message[256]; /* formatted when armed, so the handler only writes it */
    size_t length;
    mall_test_watchdog_hook hook;
};

MALL_WATCHDOG_FN struct mall_test_watchdog_state *mall_test_watchdog_state_(void) {
    static struct mall_test_watchdog_state state;
    return &state;
}

MALL_WATCHDOG_FN void mall_test_watchdog_append_(struct mall_test_watchdog_state *st, const char *s) {
    while (*s && st->length + 1 < sizeof st->message) st->message[st->length++] = *s++;
    st->message[st->length] = '\0';
}

MALL_WATCHDOG_FN void mall_test_watchdog_fire_(int sig) {
    struct mall_test_watchdog_state *st = mall_test_watchdog_state_();
    size_t done = 0;
    sigset_t alarm_only;
    (void)sig;
    while (done < st->length) {
        ssize_t n = write(2, st->message + done, st->length - done);
        if (n <= 0) break;
        done += (size_t)n;
    }
    if (st->hook) st->hook();
    /* Die of SIGALRM itself (ctest and the shell see the signal): default action, unblocked. */
    signal(SIGALRM, SIG_DFL);
    sigemptyset(&alarm_only);
    sigaddset(&alarm_only, SIGALRM);
    sigprocmask(SIG_UNBLOCK, &alarm_only, NULL);
    raise(SIGALRM);
    _exit(128 + SIGALRM);
}

/* Sets the hook the handler runs on expiry (NULL: none). Safe to call before or after arming. */
MALL_WATCHDOG_FN void mall_test_watchdog_on_expiry(mall_test_watchdog_hook hook) {
    mall_test_watchdog_state_()->hook = hook;
}

/* Installs the handler and (re)starts alarm(seconds): the program fails if it is still running
 * `seconds` from now. Calling it again restarts the count (a test that needs its own budget). */
MALL_WATCHDOG_FN void mall_test_watchdog_arm(unsigned seconds) {
    struct mall_test_watchdog_state *st = mall_test_watchdog_state_();
    struct sigaction sa;
    char digits[16];
    int n = 0;
    unsigned rest = seconds;
    const char *program = "test program";
#if defined(__GLIBC__)
    if (program_invocation_short_name && *program_invocation_short_name)
        program = program_invocation_short_name;
#endif
    do {
        digits[n++] = (char)('0' + rest % 10);
        rest /= 10;
    } while (rest > 0 && n < (int)sizeof digits - 1);
    alarm(0); /* no expiry while the message is rewritten */
    st->length = 0;
    mall_test_watchdog_append_(st, "\nwatchdog: ");
    mall_test_watchdog_append_(st, program);
    mall_test_watchdog_append_(st, " still running after ");
    while (n > 0) {
        char digit[2] = {digits[--n], '\0'};
        mall_test_watchdog_append_(st, digit);
    }
    mall_test_watchdog_append_(st, " s; failing instead of hanging\n");

    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;
    sa.sa_handler = mall_test_watchdog_fire_;
    sigaction(SIGALRM, &sa, NULL);
    alarm(seconds);
}

#undef MALL_WATCHDOG_FN

#ifdef __cplusplus
}  // extern "C"

/* MALL_TEST_WATCHDOG(seconds): arms the watchdog once per test program, while the program loads
 * (before main, so gtest and benchmark programs alike are covered). One use per program. */
#define MALL_TEST_WATCHDOG(seconds)                                                    \
    [[maybe_unused]] static const bool mall_test_watchdog_armed_ =                     \
        (::mall_test_watchdog_arm(seconds), true)
#endif

#endif /* MALL_TESTS_SUPPORT_WATCHDOG_H */
