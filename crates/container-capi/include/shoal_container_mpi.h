/* shoal_container_mpi.h: the MPI adapter of libshoal_container (docs/containers-c.md).
 *
 * Header only: these static inline functions are compiled by the application's mpicc, so
 * libshoal_container never links MPI and works with any MPI the application uses. They
 * fill a shoal_comm whose callbacks are MPI calls on a duplicate of the application's
 * communicator (the library's messages never match the application's):
 *
 *   barrier -> MPI_Barrier, bcast -> MPI_Bcast, gatherv -> MPI_Gatherv,
 *   scatterv -> MPI_Scatterv, split -> MPI_Comm_split, free -> MPI_Comm_free,
 *
 * all on MPI_BYTE. The library exchanges every length before the bytes (an 8-byte round
 * of the same call), so each callback is one MPI call on buffers the library allocated.
 * Counts are ints in MPI: one task's piece, and a root's whole gather, are limited to
 * INT_MAX bytes (the library exchanges only metadata through them: a few dozen bytes per
 * task). The callbacks run on the thread that called the library, during that call:
 * MPI_THREAD_SINGLE or MPI_THREAD_FUNNELED from that thread is enough.
 *
 *   shoal_container *h = shoal_container_paropen_mpi("ckpt", "w", chunk, 1, 0,
 *                                                    MPI_COMM_WORLD, NULL);
 */
#ifndef SHOAL_CONTAINER_MPI_H
#define SHOAL_CONTAINER_MPI_H

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>

#include <mpi.h>

#include "shoal_container.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The callbacks' `user` is a malloc'ed MPI_Comm of the library's own. */
#define SHOAL_MPI_COMM_(user) (*(MPI_Comm *)(user))

static inline void shoal_comm_mpi_fill_(MPI_Comm *comm, shoal_comm *out);

static inline int shoal_mpi_rank_(void *user) {
    int r;
    return MPI_Comm_rank(SHOAL_MPI_COMM_(user), &r) == MPI_SUCCESS ? r : -1;
}

static inline int shoal_mpi_size_(void *user) {
    int n;
    return MPI_Comm_size(SHOAL_MPI_COMM_(user), &n) == MPI_SUCCESS ? n : -1;
}

static inline int shoal_mpi_barrier_(void *user) { return MPI_Barrier(SHOAL_MPI_COMM_(user)); }

static inline int shoal_mpi_bcast_(void *user, void *buf, size_t len, int root) {
    /* `len` is the same on every task: all return here alike. */
    if (len > INT_MAX) return MPI_ERR_COUNT;
    return MPI_Bcast(buf, (int)len, MPI_BYTE, root, SHOAL_MPI_COMM_(user));
}

/* The root's counts and displacements as MPI's ints (malloc'ed; NULL elsewhere). */
static inline int shoal_mpi_counts_(const size_t *lens, int n, int **counts, int **displs) {
    size_t at = 0;
    int i;
    *counts = (int *)malloc(sizeof(int) * (size_t)n);
    *displs = (int *)malloc(sizeof(int) * (size_t)n);
    if (*counts == NULL || *displs == NULL) return MPI_ERR_NO_MEM;
    for (i = 0; i < n; i++) {
        if (lens[i] > INT_MAX || at > INT_MAX) return MPI_ERR_COUNT;
        (*counts)[i] = (int)lens[i];
        (*displs)[i] = (int)at;
        at += lens[i];
    }
    return MPI_SUCCESS;
}

static inline int shoal_mpi_gatherv_(void *user, const void *send, size_t len, void *recv, const size_t *lens,
                                     int root) {
    MPI_Comm comm = SHOAL_MPI_COMM_(user);
    int rank, size, rc;
    int *counts = NULL, *displs = NULL;
    if ((rc = MPI_Comm_rank(comm, &rank)) != MPI_SUCCESS || (rc = MPI_Comm_size(comm, &size)) != MPI_SUCCESS)
        return rc;
    if (len > INT_MAX) return MPI_ERR_COUNT;
    if (rank == root && (rc = shoal_mpi_counts_(lens, size, &counts, &displs)) != MPI_SUCCESS) {
        free(counts);
        free(displs);
        return rc;
    }
    rc = MPI_Gatherv(send, (int)len, MPI_BYTE, recv, counts, displs, MPI_BYTE, root, comm);
    free(counts);
    free(displs);
    return rc;
}

static inline int shoal_mpi_scatterv_(void *user, const void *send, const size_t *lens, void *recv, size_t len,
                                      int root) {
    MPI_Comm comm = SHOAL_MPI_COMM_(user);
    int rank, size, rc;
    int *counts = NULL, *displs = NULL;
    if ((rc = MPI_Comm_rank(comm, &rank)) != MPI_SUCCESS || (rc = MPI_Comm_size(comm, &size)) != MPI_SUCCESS)
        return rc;
    if (len > INT_MAX) return MPI_ERR_COUNT;
    if (rank == root && (rc = shoal_mpi_counts_(lens, size, &counts, &displs)) != MPI_SUCCESS) {
        free(counts);
        free(displs);
        return rc;
    }
    rc = MPI_Scatterv(send, counts, displs, MPI_BYTE, recv, (int)len, MPI_BYTE, root, comm);
    free(counts);
    free(displs);
    return rc;
}

static inline int shoal_mpi_split_(void *user, uint64_t color, uint64_t key, shoal_comm *out) {
    MPI_Comm comm = SHOAL_MPI_COMM_(user), a, b;
    /* MPI's colors and keys are ints; the library's are 64 bits (a collector group's color
     * holds the file number in its high bits). Every task learns whether any value is too
     * big, so that all take the same path and none waits in a split the others skip. */
    int big[2] = {color > INT_MAX, key > INT_MAX};
    int rc = MPI_Allreduce(MPI_IN_PLACE, big, 2, MPI_INT, MPI_MAX, comm);
    MPI_Comm *c = (MPI_Comm *)malloc(sizeof(MPI_Comm));
    if (c == NULL) return MPI_ERR_NO_MEM;
    if (rc == MPI_SUCCESS && big[1]) rc = MPI_ERR_ARG; /* keys are indexes of tasks: never */
    if (rc == MPI_SUCCESS && !big[0]) {
        rc = MPI_Comm_split(comm, (int)color, (int)key, c);
    } else if (rc == MPI_SUCCESS) {
        /* A 64-bit color in three splits of 31 bits each: tasks end together exactly when
         * their whole colors are equal, ordered by key then rank at every step. */
        rc = MPI_Comm_split(comm, (int)(color >> 62), (int)key, &a);
        if (rc == MPI_SUCCESS) {
            rc = MPI_Comm_split(a, (int)((color >> 31) & INT_MAX), (int)key, &b);
            MPI_Comm_free(&a);
            if (rc == MPI_SUCCESS) {
                rc = MPI_Comm_split(b, (int)(color & INT_MAX), (int)key, c);
                MPI_Comm_free(&b);
            }
        }
    }
    if (rc != MPI_SUCCESS) {
        free(c);
        return rc;
    }
    shoal_comm_mpi_fill_(c, out);
    return MPI_SUCCESS;
}

static inline void shoal_mpi_free_(void *user) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free((MPI_Comm *)user);
    free(user);
}

static inline void shoal_comm_mpi_fill_(MPI_Comm *comm, shoal_comm *out) {
    out->user = comm;
    out->rank = shoal_mpi_rank_;
    out->size = shoal_mpi_size_;
    out->barrier = shoal_mpi_barrier_;
    out->bcast = shoal_mpi_bcast_;
    out->gatherv = shoal_mpi_gatherv_;
    out->scatterv = shoal_mpi_scatterv_;
    out->split = shoal_mpi_split_;
    out->free = shoal_mpi_free_;
}

/* Fill *out with a shoal_comm over a duplicate of `comm` (MPI_Comm_dup: collective over
 * `comm`). Pass it to one shoal_container_paropen, which owns it from then on and frees
 * the duplicate (MPI_Comm_free) at parclose, or when it fails. Returns MPI_SUCCESS or an
 * MPI error code (*out untouched). */
static inline int shoal_comm_from_mpi(MPI_Comm comm, shoal_comm *out) {
    MPI_Comm *c = (MPI_Comm *)malloc(sizeof(MPI_Comm));
    int rc;
    if (c == NULL) return MPI_ERR_NO_MEM;
    if ((rc = MPI_Comm_dup(comm, c)) != MPI_SUCCESS) {
        free(c);
        return rc;
    }
    shoal_comm_mpi_fill_(c, out);
    return MPI_SUCCESS;
}

/* shoal_container_paropen over the tasks of `comm` (SIONlib's sion_paropen_mpi): every
 * task of `comm` calls it. NULL with errno set on failure (EIO if MPI_Comm_dup failed). */
static inline shoal_container *shoal_container_paropen_mpi(const char *name, const char *mode, uint64_t chunksize,
                                                          int nfiles, uint64_t fs_block, MPI_Comm comm,
                                                          const char *config) {
    shoal_comm c;
    if (shoal_comm_from_mpi(comm, &c) != MPI_SUCCESS) {
        errno = EIO;
        return NULL;
    }
    return shoal_container_paropen(name, mode, chunksize, nfiles, fs_block, &c, config);
}

#undef SHOAL_MPI_COMM_

#ifdef __cplusplus
}
#endif

#endif
