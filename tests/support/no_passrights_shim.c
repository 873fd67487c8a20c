/* SPDX-License-Identifier: BSD-3-Clause */
/* no_passrights_shim.c — an LD_PRELOAD library for the tests: makes a program see a kernel before
 * 6.16, which lacks SO_PASSRIGHTS. setsockopt(fd, SOL_SOCKET, SO_PASSRIGHTS, ...) fails with
 * ENOPROTOOPT; every other call goes to the real setsockopt (dlsym(RTLD_NEXT)). test_daemon_floods
 * starts malld with it, so that malld takes the descriptors clients pass, as it does on those
 * kernels. Test code only: never installed. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <sys/socket.h>

#ifndef SO_PASSRIGHTS
#define SO_PASSRIGHTS 83
#endif

int setsockopt(int fd, int level, int name, const void *value, socklen_t length) {
    typedef int (*setsockopt_fn)(int, int, int, const void *, socklen_t);
    static setsockopt_fn real;
    if (level == SOL_SOCKET && name == SO_PASSRIGHTS) {
        errno = ENOPROTOOPT;
        return -1;
    }
    if (!real) real = (setsockopt_fn)dlsym(RTLD_NEXT, "setsockopt");
    if (!real) {
        errno = ENOSYS;
        return -1;
    }
    return real(fd, level, name, value, length);
}
