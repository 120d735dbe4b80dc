/* The mpi communication backend: a shared library (libkiln_comm_mpi.so, built when CMake finds
 * MPI) that kiln dlopens at kiln_comm_init when the process was launched by mpirun, so importing
 * kiln never needs libmpi. Every collective is started non-blocking and completed by polling
 * (MPI_Test) until a deadline, so a peer that died or never arrives gives a timeout, not a hang;
 * MPI_ERRORS_RETURN turns MPI's failures into messages. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, setenv */
#include <mpi.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../comm_backend.h"

static int (*stop_requested)(void);
static int we_initialized;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int mpi_failed(int rc, const char *what, char *err, size_t errlen) {
    char text[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(rc, text, &len);
    snprintf(err, errlen, "%s failed: %s", what, text);
    return KILN_COMM_FAILED;
}

/* Polls req until it completes, the deadline passes or kiln is asked to stop. A request given up
 * on is left pending: the job is then broken, which the caller's error says. */
static int wait_for(MPI_Request *req, const char *what, double timeout, char *err, size_t errlen) {
    double deadline = timeout > 0 ? now() + timeout : 0;
    for (unsigned spin = 0;; spin++) {
        int done = 0;
        int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return mpi_failed(rc, what, err, errlen);
        if (done) return KILN_COMM_OK;
        if ((spin & 63) == 63) {
            if (stop_requested && stop_requested()) {
                snprintf(err, errlen, "%s interrupted while waiting for the other ranks", what);
                return KILN_COMM_INTERRUPTED;
            }
            if (deadline > 0 && now() > deadline) {
                snprintf(err, errlen,
                         "%s timed out after %g s waiting for the other ranks (one died, raised, or has not "
                         "reached this collective; KILN_COMM_TIMEOUT sets the limit)",
                         what, timeout);
                return KILN_COMM_TIMEOUT;
            }
            sched_yield(); /* ranks may share cores */
        }
    }
}

static MPI_Comm comm_of(void *group) { return group ? *(MPI_Comm *)group : MPI_COMM_WORLD; }

static MPI_Datatype type_of(int dtype) {
    switch (dtype) {
    case KILN_COMM_INT8: return MPI_INT8_T;
    case KILN_COMM_INT32: return MPI_INT32_T;
    case KILN_COMM_INT64: return MPI_INT64_T;
    case KILN_COMM_FLOAT32: return MPI_FLOAT;
    case KILN_COMM_FLOAT64: return MPI_DOUBLE;
    default: return MPI_BYTE;
    }
}

static MPI_Op op_of(int op) {
    switch (op) {
    case KILN_COMM_MAX: return MPI_MAX;
    case KILN_COMM_MIN: return MPI_MIN;
    case KILN_COMM_PROD: return MPI_PROD;
    default: return MPI_SUM; /* MEAN: the caller divides */
    }
}

static int check_count(int64_t count, const char *what, char *err, size_t errlen) {
    if (count > INT_MAX) {
        snprintf(err, errlen, "%s: %lld elements are more than one MPI call moves (%d)", what, (long long)count,
                 INT_MAX);
        return KILN_COMM_FAILED;
    }
    return KILN_COMM_OK;
}

static int mpi_init(int (*should_stop)(void), char *err, size_t errlen) {
    stop_requested = should_stop;
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        /* Open MPI's shared-memory single-copy transport (CMA) fails in containers that forbid
         * ptrace; copying through the shared segment works everywhere */
        setenv("OMPI_MCA_btl_vader_single_copy_mechanism", "none", 0);
        int provided = 0;
        int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
        if (rc != MPI_SUCCESS) return mpi_failed(rc, "MPI_Init_thread", err, errlen);
        we_initialized = 1;
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    return KILN_COMM_OK;
}

static int mpi_finalize(char *err, size_t errlen) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!we_initialized || finalized) return KILN_COMM_OK;
    int rc = MPI_Finalize();
    return rc == MPI_SUCCESS ? KILN_COMM_OK : mpi_failed(rc, "MPI_Finalize", err, errlen);
}

static int mpi_world_rank(void) {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}

static int mpi_world_size(void) {
    int n = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    return n;
}

static int mpi_group_create(const int *ranks, int n, void **group, char *err, size_t errlen) {
    MPI_Group world, sub;
    MPI_Comm *comm = malloc(sizeof *comm);
    if (!comm) {
        snprintf(err, errlen, "out of memory");
        return KILN_COMM_FAILED;
    }
    int rc = MPI_Comm_group(MPI_COMM_WORLD, &world);
    if (rc == MPI_SUCCESS) rc = MPI_Group_incl(world, n, ranks, &sub);
    if (rc == MPI_SUCCESS) {
        rc = MPI_Comm_create_group(MPI_COMM_WORLD, sub, 0x6b6c, comm);
        MPI_Group_free(&sub);
    }
    MPI_Group_free(&world);
    if (rc != MPI_SUCCESS) {
        free(comm);
        return mpi_failed(rc, "MPI_Comm_create_group", err, errlen);
    }
    MPI_Comm_set_errhandler(*comm, MPI_ERRORS_RETURN);
    *group = comm;
    return KILN_COMM_OK;
}

static void mpi_group_free(void *group) {
    if (!group) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free((MPI_Comm *)group);
    free(group);
}

static int mpi_group_rank(void *group) {
    int r = 0;
    MPI_Comm_rank(comm_of(group), &r);
    return r;
}

static int mpi_group_size(void *group) {
    int n = 1;
    MPI_Comm_size(comm_of(group), &n);
    return n;
}

#define START(call, what)                                                                                   \
    do {                                                                                                    \
        int rc_ = (call);                                                                                   \
        if (rc_ != MPI_SUCCESS) return mpi_failed(rc_, what, err, errlen);                                  \
    } while (0)

static int mpi_all_reduce(void *group, const void *in, void *out, int64_t count, int dtype, int op, double timeout,
                          char *err, size_t errlen) {
    if (check_count(count, "MPI_Iallreduce", err, errlen)) return KILN_COMM_FAILED;
    MPI_Request req;
    START(MPI_Iallreduce(in == out ? MPI_IN_PLACE : in, out, (int)count, type_of(dtype), op_of(op), comm_of(group),
                         &req),
          "MPI_Iallreduce");
    return wait_for(&req, "MPI_Iallreduce", timeout, err, errlen);
}

static int mpi_all_gather(void *group, const void *in, void *out, int64_t count, int dtype, double timeout,
                          char *err, size_t errlen) {
    if (check_count(count, "MPI_Iallgather", err, errlen)) return KILN_COMM_FAILED;
    MPI_Request req;
    START(MPI_Iallgather(in, (int)count, type_of(dtype), out, (int)count, type_of(dtype), comm_of(group), &req),
          "MPI_Iallgather");
    return wait_for(&req, "MPI_Iallgather", timeout, err, errlen);
}

static int mpi_reduce_scatter(void *group, const void *in, void *out, int64_t count, int dtype, int op,
                              double timeout, char *err, size_t errlen) {
    if (check_count(count, "MPI_Ireduce_scatter_block", err, errlen)) return KILN_COMM_FAILED;
    MPI_Request req;
    START(MPI_Ireduce_scatter_block(in, out, (int)count, type_of(dtype), op_of(op), comm_of(group), &req),
          "MPI_Ireduce_scatter_block");
    return wait_for(&req, "MPI_Ireduce_scatter_block", timeout, err, errlen);
}

static int mpi_broadcast(void *group, void *buf, int64_t count, int dtype, int root, double timeout, char *err,
                         size_t errlen) {
    if (check_count(count, "MPI_Ibcast", err, errlen)) return KILN_COMM_FAILED;
    MPI_Request req;
    START(MPI_Ibcast(buf, (int)count, type_of(dtype), root, comm_of(group), &req), "MPI_Ibcast");
    return wait_for(&req, "MPI_Ibcast", timeout, err, errlen);
}

static int mpi_reduce(void *group, const void *in, void *out, int64_t count, int dtype, int op, int root,
                      double timeout, char *err, size_t errlen) {
    if (check_count(count, "MPI_Ireduce", err, errlen)) return KILN_COMM_FAILED;
    MPI_Request req;
    START(MPI_Ireduce(in, out, (int)count, type_of(dtype), op_of(op), root, comm_of(group), &req), "MPI_Ireduce");
    return wait_for(&req, "MPI_Ireduce", timeout, err, errlen);
}

static int mpi_barrier(void *group, double timeout, char *err, size_t errlen) {
    MPI_Request req;
    START(MPI_Ibarrier(comm_of(group), &req), "MPI_Ibarrier");
    return wait_for(&req, "MPI_Ibarrier", timeout, err, errlen);
}

static int mpi_send(void *group, const void *buf, int64_t bytes, int dst, int tag, double timeout, char *err,
                    size_t errlen) {
    if (check_count(bytes, "MPI_Isend", err, errlen)) return KILN_COMM_FAILED;
    MPI_Request req;
    START(MPI_Isend(buf, (int)bytes, MPI_BYTE, dst, tag, comm_of(group), &req), "MPI_Isend");
    return wait_for(&req, "MPI_Isend", timeout, err, errlen);
}

static int mpi_recv(void *group, void *buf, int64_t bytes, int src, int tag, double timeout, char *err,
                    size_t errlen) {
    if (check_count(bytes, "MPI_Irecv", err, errlen)) return KILN_COMM_FAILED;
    MPI_Request req;
    START(MPI_Irecv(buf, (int)bytes, MPI_BYTE, src, tag, comm_of(group), &req), "MPI_Irecv");
    return wait_for(&req, "MPI_Irecv", timeout, err, errlen);
}

static void mpi_abort(int code) {
    MPI_Abort(MPI_COMM_WORLD, code);
    exit(code);
}

static const kiln_comm_backend table = {
    .abi = KILN_COMM_ABI,
    .name = "mpi",
    .init = mpi_init,
    .finalize = mpi_finalize,
    .world_rank = mpi_world_rank,
    .world_size = mpi_world_size,
    .group_create = mpi_group_create,
    .group_free = mpi_group_free,
    .group_rank = mpi_group_rank,
    .group_size = mpi_group_size,
    .all_reduce = mpi_all_reduce,
    .all_gather = mpi_all_gather,
    .reduce_scatter = mpi_reduce_scatter,
    .broadcast = mpi_broadcast,
    .reduce = mpi_reduce,
    .barrier = mpi_barrier,
    .send = mpi_send,
    .recv = mpi_recv,
    .abort = mpi_abort,
};

const kiln_comm_backend *kiln_comm_backend_table(void);
__attribute__((visibility("default"))) const kiln_comm_backend *kiln_comm_backend_table(void) { return &table; }
