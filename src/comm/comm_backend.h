/* The table a communication backend fills in: what src/comm/comm.c calls to move bytes between
 * ranks. A backend is built into kiln (local.c) or is a shared library kiln dlopens at init
 * (mpi/mpi_backend.c, linked against libmpi), so this header needs nothing of kiln: plain C
 * types, statuses as ints, messages into the caller's buffer. A NCCL backend would fill in the
 * same table.
 *
 * Every call returns KILN_COMM_OK or one of the failures below with a message in err (errlen
 * bytes). Buffers are contiguous; counts are elements of `dtype`. `group` is what group_create
 * gave (NULL: every rank). `timeout` in seconds (<= 0: wait forever): past it, a call returns
 * KILN_COMM_TIMEOUT or the backend ends the job with a message naming what describe() said. */
#ifndef KILN_COMM_BACKEND_H
#define KILN_COMM_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#define KILN_COMM_ABI 2

enum {
    KILN_COMM_OK = 0,
    KILN_COMM_FAILED = 1,      /* the library reported an error */
    KILN_COMM_TIMEOUT = 2,     /* the peers did not complete in time */
    KILN_COMM_INTERRUPTED = 3, /* should_stop() asked to stop while waiting */
};

/* Element types the backends reduce (others move as KILN_COMM_BYTES). */
enum { KILN_COMM_BYTES, KILN_COMM_INT8, KILN_COMM_INT32, KILN_COMM_INT64, KILN_COMM_FLOAT32, KILN_COMM_FLOAT64 };

/* Reductions. MEAN is SUM divided by the group's size, done by comm.c after the backend's SUM. */
enum { KILN_COMM_SUM, KILN_COMM_MEAN, KILN_COMM_MAX, KILN_COMM_MIN, KILN_COMM_PROD, KILN_COMM_REDUCE_COUNT };

typedef struct kiln_comm_backend {
    int abi; /* KILN_COMM_ABI */
    const char *name;
    /* should_stop: kiln's interrupt request, for a backend that polls while it waits (the mpi
     * backend blocks in MPI instead); may be NULL */
    int (*init)(int (*should_stop)(void), char *err, size_t errlen);
    int (*finalize)(char *err, size_t errlen);
    int (*world_rank)(void);
    int (*world_size)(void);
    /* ranks (world ranks, this one among them) -> a new group; called by the members only */
    int (*group_create)(const int *ranks, int n, void **group, char *err, size_t errlen);
    void (*group_free)(void *group);
    int (*group_rank)(void *group);
    int (*group_size)(void *group);
    int (*all_reduce)(void *group, const void *in, void *out, int64_t count, int dtype, int op, double timeout,
                      char *err, size_t errlen);
    /* out holds size * count elements, rank r's in at r * count */
    int (*all_gather)(void *group, const void *in, void *out, int64_t count, int dtype, double timeout, char *err,
                      size_t errlen);
    /* in holds size * count elements; out gets the reduction of every rank's block number rank */
    int (*reduce_scatter)(void *group, const void *in, void *out, int64_t count, int dtype, int op, double timeout,
                          char *err, size_t errlen);
    /* buf: the root's data on the root, filled on the others */
    int (*broadcast)(void *group, void *buf, int64_t count, int dtype, int root, double timeout, char *err,
                     size_t errlen);
    /* out on the root gets the reduction; untouched elsewhere */
    int (*reduce)(void *group, const void *in, void *out, int64_t count, int dtype, int op, int root,
                  double timeout, char *err, size_t errlen);
    int (*barrier)(void *group, double timeout, char *err, size_t errlen);
    int (*send)(void *group, const void *buf, int64_t bytes, int dst, int tag, double timeout, char *err,
                size_t errlen);
    int (*recv)(void *group, void *buf, int64_t bytes, int src, int tag, double timeout, char *err, size_t errlen);
    /* ends every rank of the job (after an unrecoverable error); does not return */
    void (*abort)(int code);
    /* what the next calls are doing, for the messages of a backend that ends the job itself
     * (the mpi backend's timeout: "all_reduce(sum) of float32(4,) on rank 0 of 2") */
    void (*describe)(const char *what);
    /* A non-blocking all-reduce (NULL in a backend without one: comm.c then reduces at the start):
     * starts it and gives a request for wait, which completes it and frees the request; in and out
     * stay untouched by the caller until then. */
    int (*all_reduce_start)(void *group, const void *in, void *out, int64_t count, int dtype, int op, void **request,
                            char *err, size_t errlen);
    int (*wait)(void *request, double timeout, char *err, size_t errlen);
} kiln_comm_backend;

/* What a backend library exports (dlsym): its table. */
typedef const kiln_comm_backend *(*kiln_comm_backend_entry)(void);
#define KILN_COMM_BACKEND_ENTRY "kiln_comm_backend_table"

#endif
