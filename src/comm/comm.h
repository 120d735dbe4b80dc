/* kiln's communication layer: ranks, groups and collectives on kiln tensors, over the backend
 * kiln_comm_init chose (backends.def: `local`, one process, built in; `mpi`, a library dlopened
 * when mpirun launched the process). The collective ops of ops.def (src/ops/collective.c) and
 * the Python bindings (src/python/comm.c) call these.
 *
 * Groups are small ints: 0 is every rank (the world), kiln_comm_group_create makes others.
 * Before each collective the ranks of the group exchange a small header (the collective, its
 * reduction and root, the dtype and shape, and how many collectives the group ran before), so a
 * rank that calls a different collective, or one with another shape or dtype, makes every rank
 * fail with an error naming what each rank called instead of hanging or reducing garbage
 * (kiln_comm_set_check(false) skips it). A collective waits kiln_comm_timeout() seconds at most
 * (KILN_COMM_TIMEOUT in the environment, else 300): then the backend fails the call, or (mpi,
 * whose blocking calls cannot be left) prints what it waited in and ends the job. Errors name the
 * collective, the rank and the shapes. The collectives of a process are called from one thread at
 * a time (they number each group's collectives in order). */
#ifndef KILN_COMM_H
#define KILN_COMM_H

#include <stdbool.h>

#include "kiln/core.h"
#include "comm_backend.h"

/* backend: a name of backends.def, or NULL / "" to choose (KILN_COMM_BACKEND in the environment,
 * else the first library backend whose launcher's environment is set, else local). Initializing
 * again with the same backend does nothing; with another fails. */
kiln_status kiln_comm_init(const char *backend);
kiln_status kiln_comm_finalize(void);
bool kiln_comm_initialized(void);
const char *kiln_comm_backend_name(void); /* "" before init */
/* The backends' names, comma-separated. */
const char *kiln_comm_backend_names(void);
/* The backend init would choose now (without initializing). */
const char *kiln_comm_default_backend(void);

kiln_status kiln_comm_rank(int group, int *rank);
kiln_status kiln_comm_size(int group, int *size);
/* The same, its errors naming `what` (an op) */
/* How many collectives this rank ran in the group (each bucket counts once). */
kiln_status kiln_comm_collective_count(int group, long long *count);
kiln_status kiln_comm_size_for(const char *what, int group, int *size);
/* A group of these world ranks (distinct, ascending or not; this rank among them); called by
 * its members only. */
kiln_status kiln_comm_group_create(const int *ranks, int n, int *group);
kiln_status kiln_comm_group_destroy(int group);

void kiln_comm_set_timeout(double seconds); /* <= 0: wait forever */
double kiln_comm_timeout(void);
void kiln_comm_set_check(bool check);
bool kiln_comm_check(void);
/* Deterministic all-reduce (kiln.set_deterministic): a float sum, mean or prod gathers every
 * rank's tensor and combines them in rank order, ((x0 op x1) op x2) ..., the same on every rank
 * and in every run, whatever order the backend's own reduction would take. Off by default. */
void kiln_comm_set_deterministic(bool on);
bool kiln_comm_deterministic(void);
/* The most bytes one fused all-reduce carries: the bucketing pass (src/passes/bucket_all_reduce.c)
 * joins all-reduces of the same fusion id into buckets of at most this size (25 MB unless
 * set_auto_parallel_context's comm_fusion says otherwise). */
void kiln_comm_set_fusion_bytes(int64_t bytes);
int64_t kiln_comm_fusion_bytes(void);

/* out: contiguous, allocated by the caller with the output's shape (all_gather: size * x.shape[0]
 * rows; reduce_scatter: x.shape[0] / size rows); x may have any layout. */
kiln_status kiln_comm_all_reduce(kiln_tensor *x, int op, int group, kiln_tensor *out);
/* The all-reduce of n tensors of one dtype as one call (a gradient bucket): out, 1-D, holds their
 * elements one after the other, reduced; the ranks' headers also compare the tensors' shapes.
 * When the tensors already lie in out, contiguous and in order (a compiled plan put them there),
 * out is reduced in place (the tensors' values are then overwritten); else they are packed. */
kiln_status kiln_comm_all_reduce_bucket(kiln_tensor *const *x, int n, int op, int group, kiln_tensor *out);
/* How many buckets this process reduced in place, and packed (all_reduce_bucket and starts), and
 * the seconds spent in those calls (and the waits): headers, packing or scaling, the all-reduce. */
void kiln_comm_bucket_counts(long long *in_place, long long *packed, double *seconds);
/* The same, in two halves: start packs the tensors and begins the all-reduce into out (a backend
 * without a non-blocking call reduces now); wait, given the same out, completes it. Between them
 * out must stay alive and unread; other collectives may run. */
kiln_status kiln_comm_all_reduce_start(kiln_tensor *const *x, int n, int op, int group, kiln_tensor *out);
kiln_status kiln_comm_all_reduce_wait(kiln_tensor *out);
/* Completes every all-reduce still in flight, their results dropped: a plan that failed between
 * a start and its wait calls it, so no all-reduce goes on writing into memory reused after. */
void kiln_comm_finish_in_flight(void);
/* Whether the bucketing pass splits buckets into start and wait (off by default: see
 * docs/guide/distributed.md; KILN_COMM_OVERLAP=1 or kiln._C.comm_set_overlap(True)). */
void kiln_comm_set_overlap(bool on);
/* Seconds this process has spent in all-reduce calls of the backend (blocking ones, starts and
 * waits; not the packing): what the overlap hides no longer shows here. */
double kiln_comm_all_reduce_seconds(void);
bool kiln_comm_overlap(void);
kiln_status kiln_comm_all_gather(kiln_tensor *x, int group, kiln_tensor *out);
kiln_status kiln_comm_reduce_scatter(kiln_tensor *x, int op, int group, kiln_tensor *out);
kiln_status kiln_comm_broadcast(kiln_tensor *x, int root, int group, kiln_tensor *out);
/* out on root: the reduction; elsewhere zeros */
kiln_status kiln_comm_reduce(kiln_tensor *x, int op, int root, int group, kiln_tensor *out);
kiln_status kiln_comm_barrier(int group);
/* send/recv: the receiver names the dtype and shape it expects (out's); a sender of another is
 * reported on the receiving rank */
kiln_status kiln_comm_send(kiln_tensor *x, int dst, int tag, int group);
kiln_status kiln_comm_recv(kiln_tensor *out, int src, int tag, int group);

/* "sum", "mean", ... for KILN_COMM_SUM, ...; NULL for others */
const char *kiln_comm_reduce_name(int op);
/* Ends every rank of the job (the backend's abort; exit(code) when none is initialized). */
_Noreturn void kiln_comm_abort(int code);

#endif
