/* SPDX-License-Identifier: BSD-3-Clause */
/* A user's MPI program on the installed mall::mpi: opens the collective step without a malld (not
 * malleable), steps once, closes. Built (linked) by the find_package test to prove the exported
 * target carries its include folders and libraries; not run there (it would need mpirun). */
#include <stdio.h>

#include <mall/mall_mpi.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    mall_mpi_t *mm = NULL;
    int rc = mall_mpi_open(NULL, MPI_COMM_WORLD, MALL_MPI_BALANCED, 1, &mm, NULL);
    if (rc == MALL_SUCCESS) {
        mall_mpi_step(mm);
        printf("consumer_mpi: threads %d\n", mall_mpi_threads(mm));
        mall_mpi_close(mm);
    }
    MPI_Finalize();
    return rc == MALL_SUCCESS ? 0 : 1;
}
