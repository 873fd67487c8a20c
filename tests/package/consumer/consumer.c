/* SPDX-License-Identifier: BSD-3-Clause */
/* consumer.c — what a user builds against an installed mall: includes <mall/mall.h>, checks that
 * the header and the loaded library agree on the API version, and that a detached handle steps. */
#include <mall/mall.h>
#include <stdio.h>

int main(void) {
    mall_t *m = NULL;
    mall_error_t err;
    if (mall_get_api_version() != MALL_API_VERSION) {
        fprintf(stderr, "consumer: header %d != library %d\n", MALL_API_VERSION, mall_get_api_version());
        return 1;
    }
    int rc = mall_open("/nonexistent/mall-consumer.sock", &m, &err);
    if (rc != MALL_ERR_NODAEMON || m == NULL) {
        fprintf(stderr, "consumer: mall_open gave %d (%s)\n", rc, mall_strerror(rc));
        return 1;
    }
    rc = mall_step(m);
    mall_close(m);
    if (rc != MALL_NOUPDT) {
        fprintf(stderr, "consumer: mall_step gave %d\n", rc);
        return 1;
    }
    printf("consumer: ok, mall API %d\n", mall_get_api_version());
    return 0;
}
