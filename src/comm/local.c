/* The local communication backend: one process, rank 0 of 1. Every collective of one rank is
 * the identity (a copy into the output); there is no peer to send to. Needs no library. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_backend.h"

static int elem_size(int dtype) {
    switch (dtype) {
    case KILN_COMM_INT32: case KILN_COMM_FLOAT32: return 4;
    case KILN_COMM_INT64: case KILN_COMM_FLOAT64: return 8;
    default: return 1;
    }
}

static int local_init(int (*should_stop)(void), char *err, size_t errlen) {
    (void)should_stop, (void)err, (void)errlen;
    return KILN_COMM_OK;
}

static int local_finalize(char *err, size_t errlen) {
    (void)err, (void)errlen;
    return KILN_COMM_OK;
}

static int local_zero(void) { return 0; }
static int local_one(void) { return 1; }
static int local_group_zero(void *g) { (void)g; return 0; }
static int local_group_one(void *g) { (void)g; return 1; }

static int local_group_create(const int *ranks, int n, void **group, char *err, size_t errlen) {
    (void)ranks, (void)n, (void)err, (void)errlen; /* comm.c checked ranks == [0] */
    *group = NULL;
    return KILN_COMM_OK;
}

static void local_group_free(void *group) { (void)group; }

static int copy(const void *in, void *out, int64_t count, int dtype) {
    if (in != out) memcpy(out, in, (size_t)count * (size_t)elem_size(dtype));
    return KILN_COMM_OK;
}

static int local_all_reduce(void *g, const void *in, void *out, int64_t count, int dtype, int op, double timeout,
                            char *err, size_t errlen) {
    (void)g, (void)op, (void)timeout, (void)err, (void)errlen;
    return copy(in, out, count, dtype);
}

static int local_all_gather(void *g, const void *in, void *out, int64_t count, int dtype, double timeout, char *err,
                            size_t errlen) {
    (void)g, (void)timeout, (void)err, (void)errlen;
    return copy(in, out, count, dtype);
}

static int local_reduce(void *g, const void *in, void *out, int64_t count, int dtype, int op, int root,
                        double timeout, char *err, size_t errlen) {
    (void)root;
    return local_all_reduce(g, in, out, count, dtype, op, timeout, err, errlen);
}

static int local_broadcast(void *g, void *buf, int64_t count, int dtype, int root, double timeout, char *err,
                           size_t errlen) {
    (void)g, (void)buf, (void)count, (void)dtype, (void)root, (void)timeout, (void)err, (void)errlen;
    return KILN_COMM_OK;
}

static int local_barrier(void *g, double timeout, char *err, size_t errlen) {
    (void)g, (void)timeout, (void)err, (void)errlen;
    return KILN_COMM_OK;
}

static int local_send(void *g, const void *buf, int64_t bytes, int dst, int tag, double timeout, char *err,
                      size_t errlen) {
    (void)g, (void)buf, (void)bytes, (void)dst, (void)tag, (void)timeout;
    snprintf(err, errlen, "a process running alone (the local backend) has no peer to send to");
    return KILN_COMM_FAILED;
}

static int local_recv(void *g, void *buf, int64_t bytes, int src, int tag, double timeout, char *err,
                      size_t errlen) {
    (void)g, (void)buf, (void)bytes, (void)src, (void)tag, (void)timeout;
    snprintf(err, errlen, "a process running alone (the local backend) has no peer to receive from");
    return KILN_COMM_FAILED;
}

static void local_abort(int code) { _Exit(code); }
static void local_describe(const char *what) { (void)what; }

const kiln_comm_backend kiln_comm_backend_local = {
    .abi = KILN_COMM_ABI,
    .name = "local",
    .init = local_init,
    .finalize = local_finalize,
    .world_rank = local_zero,
    .world_size = local_one,
    .group_create = local_group_create,
    .group_free = local_group_free,
    .group_rank = local_group_zero,
    .group_size = local_group_one,
    .all_reduce = local_all_reduce,
    .all_gather = local_all_gather,
    .reduce_scatter = local_all_reduce,
    .broadcast = local_broadcast,
    .reduce = local_reduce,
    .barrier = local_barrier,
    .send = local_send,
    .recv = local_recv,
    .abort = local_abort,
    .describe = local_describe,
};
