/* SPDX-License-Identifier: BSD-3-Clause
 * dlclose_probe_main.c — mall_dlclose_probe LIBMALL: what a plugin host does (issue 37, point 11).
 * It dlopens libmall (not linked to it), opens a handle to a socket nobody serves (the handle's
 * monitor thread then retries in the background: 50 ms doubling to 1 s), dlcloses the library and
 * runs on for 3 s. A libmall unmapped by that dlclose leaves the monitor running unmapped code: the
 * process dies (SIGSEGV). Linked -z nodelete, libmall stays loaded and the probe exits 0, saying so.
 * Exit 1 with words when the setup fails; a 30 s alarm is its watchdog. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mall/mall.h"

typedef int (*open_fn)(const char *, mall_t **, mall_error_t *);

int main(int argc, char **argv) {
    alarm(30);
    if (argc != 2) {
        fprintf(stderr, "usage: mall_dlclose_probe PATH/TO/libmall.so\n");
        return 1;
    }
    char dir[] = "/tmp/mall-dlclose-probe-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    char socket_path[128];
    snprintf(socket_path, sizeof socket_path, "%s/nobody.sock", dir);
    void *library = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!library) {
        fprintf(stderr, "dlopen %s: %s\n", argv[1], dlerror());
        rmdir(dir);
        return 1;
    }
    open_fn mall_open_ptr = (open_fn)dlsym(library, "mall_open");
    mall_t *handle = NULL;
    mall_error_t err;
    int rc = mall_open_ptr ? mall_open_ptr(socket_path, &handle, &err) : MALL_ERR_SYSTEM;
    if (!handle) {
        fprintf(stderr, "mall_open gave no handle (%d): %s\n", rc, mall_open_ptr ? err.text : "no mall_open");
        rmdir(dir);
        return 1;
    }
    dlclose(library);  /* the handle stays open: its monitor thread keeps running */
    void *still = dlopen(argv[1], RTLD_NOW | RTLD_NOLOAD);
    printf("after dlclose with a handle open, libmall is %s\n", still ? "still loaded" : "unloaded");
    fflush(stdout);
    sleep(3); /* the monitor retries several times meanwhile */
    rmdir(dir);
    printf("the process ran on for 3 s with the monitor thread alive\n");
    return 0;
}
