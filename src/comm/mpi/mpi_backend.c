/* The mpi communication backend: a shared library (libkiln_comm_mpi.so, built when CMake finds
 * MPI) that kiln dlopens at kiln_comm_init when the process was launched by mpirun, so importing
 * kiln never needs libmpi. Collectives are MPI's blocking calls under a watchdog thread that ends
 * the job, naming the collective, when one outlasts the timeout (a peer died or never arrives):
 * no hang. MPI_ERRORS_RETURN turns MPI's failures into messages. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, setenv */
#include <mpi.h>
#include <limits.h>
#include <stdatomic.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../comm_backend.h"

static int we_initialized;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The watchdog: a thread that wakes a few times a second and ends the job when the collective in
 * progress has outlasted its deadline. The collectives themselves are MPI's blocking ones (Open
 * MPI's non-blocking all-reduce in place is an order of magnitude slower for large buffers, and
 * out of place slower for small ones); arming costs a clock read and two atomic stores. */
static pthread_mutex_t wd_lock = PTHREAD_MUTEX_INITIALIZER; /* wd_what, starting the thread */
static int wd_started;
static _Atomic double wd_deadline; /* seconds of CLOCK_MONOTONIC; 0: nothing in progress */
static _Atomic double wd_timeout;
static char wd_what[512] = "a collective";

static void *watchdog_main(void *unused) {
    (void)unused;
    for (;;) {
        double t = atomic_load(&wd_timeout);
        double nap = t > 0 && t < 2 ? t / 4 : 0.5;
        struct timespec ts = {(time_t)nap, (long)((nap - (double)(time_t)nap) * 1e9)};
        nanosleep(&ts, NULL);
        double deadline = atomic_load(&wd_deadline);
        if (deadline > 0 && now() > deadline) {
            pthread_mutex_lock(&wd_lock);
            fprintf(stderr,
                    "kiln: %s: timed out after %g s waiting for the other ranks (one died, raised, or has not "
                    "reached this collective; KILN_COMM_TIMEOUT or kiln.communication.set_timeout set the limit); "
                    "ending the job\n",
                    wd_what, atomic_load(&wd_timeout));
            fflush(stderr);
            MPI_Abort(MPI_COMM_WORLD, 1);
            _exit(1);
        }
    }
    return NULL;
}

/* Arms the watchdog for the call about to block (timeout <= 0: none). */
static void arm(double timeout) {
    if (timeout <= 0) return;
    if (!wd_started) {
        pthread_mutex_lock(&wd_lock);
        pthread_t t;
        if (!wd_started && pthread_create(&t, NULL, watchdog_main, NULL) == 0) {
            pthread_detach(t);
            wd_started = 1;
        }
        pthread_mutex_unlock(&wd_lock);
    }
    atomic_store(&wd_timeout, timeout);
    atomic_store(&wd_deadline, now() + timeout);
}

static void disarm(double timeout) {
    if (timeout > 0) atomic_store(&wd_deadline, 0.0);
}

static void mpi_describe(const char *what) {
    pthread_mutex_lock(&wd_lock);
    snprintf(wd_what, sizeof wd_what, "%s", what);
    pthread_mutex_unlock(&wd_lock);
}

static int mpi_failed(int rc, const char *what, char *err, size_t errlen) {
    char text[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(rc, text, &len);
    snprintf(err, errlen, "%s failed: %s", what, text);
    return KILN_COMM_FAILED;
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
    (void)should_stop; /* a blocked MPI call is not interrupted: mpirun ends the job on Ctrl-C */
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

/* a blocking MPI call under the watchdog */
#define CALL(call, what)                                                                                    \
    do {                                                                                                    \
        arm(timeout);                                                                                       \
        int rc_ = (call);                                                                                   \
        disarm(timeout);                                                                                    \
        return rc_ == MPI_SUCCESS ? KILN_COMM_OK : mpi_failed(rc_, what, err, errlen);                      \
    } while (0)

static int mpi_all_reduce(void *group, const void *in, void *out, int64_t count, int dtype, int op, double timeout,
                          char *err, size_t errlen) {
    if (check_count(count, "MPI_Allreduce", err, errlen)) return KILN_COMM_FAILED;
    CALL(MPI_Allreduce(in == out ? MPI_IN_PLACE : in, out, (int)count, type_of(dtype), op_of(op), comm_of(group)),
         "MPI_Allreduce");
}

static int mpi_all_gather(void *group, const void *in, void *out, int64_t count, int dtype, double timeout,
                          char *err, size_t errlen) {
    if (check_count(count, "MPI_Allgather", err, errlen)) return KILN_COMM_FAILED;
    CALL(MPI_Allgather(in, (int)count, type_of(dtype), out, (int)count, type_of(dtype), comm_of(group)),
         "MPI_Allgather");
}

static int mpi_reduce_scatter(void *group, const void *in, void *out, int64_t count, int dtype, int op,
                              double timeout, char *err, size_t errlen) {
    if (check_count(count, "MPI_Reduce_scatter_block", err, errlen)) return KILN_COMM_FAILED;
    CALL(MPI_Reduce_scatter_block(in, out, (int)count, type_of(dtype), op_of(op), comm_of(group)),
         "MPI_Reduce_scatter_block");
}

static int mpi_broadcast(void *group, void *buf, int64_t count, int dtype, int root, double timeout, char *err,
                         size_t errlen) {
    if (check_count(count, "MPI_Bcast", err, errlen)) return KILN_COMM_FAILED;
    CALL(MPI_Bcast(buf, (int)count, type_of(dtype), root, comm_of(group)), "MPI_Bcast");
}

static int mpi_reduce(void *group, const void *in, void *out, int64_t count, int dtype, int op, int root,
                      double timeout, char *err, size_t errlen) {
    if (check_count(count, "MPI_Reduce", err, errlen)) return KILN_COMM_FAILED;
    CALL(MPI_Reduce(in, out, (int)count, type_of(dtype), op_of(op), root, comm_of(group)), "MPI_Reduce");
}

static int mpi_barrier(void *group, double timeout, char *err, size_t errlen) {
    CALL(MPI_Barrier(comm_of(group)), "MPI_Barrier");
}

static int mpi_send(void *group, const void *buf, int64_t bytes, int dst, int tag, double timeout, char *err,
                    size_t errlen) {
    if (check_count(bytes, "MPI_Send", err, errlen)) return KILN_COMM_FAILED;
    CALL(MPI_Send(buf, (int)bytes, MPI_BYTE, dst, tag, comm_of(group)), "MPI_Send");
}

static int mpi_recv(void *group, void *buf, int64_t bytes, int src, int tag, double timeout, char *err,
                    size_t errlen) {
    if (check_count(bytes, "MPI_Recv", err, errlen)) return KILN_COMM_FAILED;
    CALL(MPI_Recv(buf, (int)bytes, MPI_BYTE, src, tag, comm_of(group), MPI_STATUS_IGNORE), "MPI_Recv");
}

static int mpi_all_reduce_start(void *group, const void *in, void *out, int64_t count, int dtype, int op,
                                void **request, char *err, size_t errlen) {
    if (check_count(count, "MPI_Iallreduce", err, errlen)) return KILN_COMM_FAILED;
    MPI_Request *r = malloc(sizeof *r);
    if (!r) {
        snprintf(err, errlen, "out of memory");
        return KILN_COMM_FAILED;
    }
    int rc = MPI_Iallreduce(in == out ? MPI_IN_PLACE : in, out, (int)count, type_of(dtype), op_of(op), comm_of(group), r);
    if (rc != MPI_SUCCESS) {
        free(r);
        return mpi_failed(rc, "MPI_Iallreduce", err, errlen);
    }
    *request = r;
    return KILN_COMM_OK;
}

static int mpi_wait(void *request, double timeout, char *err, size_t errlen) {
    arm(timeout);
    int rc = MPI_Wait((MPI_Request *)request, MPI_STATUS_IGNORE);
    disarm(timeout);
    free(request);
    return rc == MPI_SUCCESS ? KILN_COMM_OK : mpi_failed(rc, "MPI_Wait", err, errlen);
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
    .describe = mpi_describe,
    .all_reduce_start = mpi_all_reduce_start,
    .wait = mpi_wait,
};

const kiln_comm_backend *kiln_comm_backend_table(void);
__attribute__((visibility("default"))) const kiln_comm_backend *kiln_comm_backend_table(void) { return &table; }
