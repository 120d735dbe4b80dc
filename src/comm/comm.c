/* The communication layer (comm.h): the backend registry of backends.def, loading a library
 * backend, groups, the header every collective's ranks exchange first, and the collectives on
 * kiln tensors. */
#define _GNU_SOURCE /* dladdr */
#include "comm.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../core/internal.h"

extern const kiln_comm_backend kiln_comm_backend_local;

typedef struct backend_entry {
    const char *name;
    const kiln_comm_backend *builtin; /* NULL: a library */
    const char *library;
    const char *launch_env;
} backend_entry;

static const backend_entry backends[] = {
#define KILN_COMM_BUILTIN(n) {#n, &kiln_comm_backend_##n, NULL, NULL},
#define KILN_COMM_LIBRARY(n, lib, env) {#n, NULL, lib, env},
#include "backends.def"
#undef KILN_COMM_BUILTIN
#undef KILN_COMM_LIBRARY
};
#define NBACKENDS ((int)(sizeof backends / sizeof backends[0]))

#define MAX_GROUPS 64
#define HEADER 16 /* int64 per rank: seq, kind, op, root, dtype, ndim, shape[8], 2 spare */

typedef struct group {
    bool live;
    void *handle;
    int rank, size;
    int64_t seq; /* collectives this group ran */
} group;

static struct {
    pthread_mutex_t lock;
    const kiln_comm_backend *be;
    void *library;
    char name[32];
    double timeout;
    bool timeout_set, check, deterministic;
    group groups[MAX_GROUPS];
    void *staging; /* where buckets and scaled means are packed; reused (see staging()) */
    size_t staging_bytes;
} comm = {.lock = PTHREAD_MUTEX_INITIALIZER, .check = true};

enum { C_ALL_REDUCE = 1, C_ALL_GATHER, C_REDUCE_SCATTER, C_BROADCAST, C_REDUCE, C_BARRIER, C_SEND, C_RECV };
static const char *const kind_names[] = {"?", "all_reduce", "all_gather", "reduce_scatter", "broadcast",
                                         "reduce", "barrier", "send", "recv"};
static const char *const reduce_names[] = {"sum", "mean", "max", "min", "prod"};

const char *kiln_comm_reduce_name(int op) {
    return op >= 0 && op < KILN_COMM_REDUCE_COUNT ? reduce_names[op] : NULL;
}

const char *kiln_comm_backend_names(void) {
    static char names[256];
    if (!names[0])
        for (int k = 0; k < NBACKENDS; k++) {
            if (k) strncat(names, ",", sizeof names - strlen(names) - 1);
            strncat(names, backends[k].name, sizeof names - strlen(names) - 1);
        }
    return names;
}

static bool launched_by(const backend_entry *b) {
    if (!b->launch_env) return false;
    char vars[128];
    snprintf(vars, sizeof vars, "%s", b->launch_env);
    for (char *save = NULL, *v = strtok_r(vars, " ", &save); v; v = strtok_r(NULL, " ", &save))
        if (getenv(v)) return true;
    return false;
}

const char *kiln_comm_default_backend(void) {
    const char *env = getenv("KILN_COMM_BACKEND");
    if (env && *env) return env;
    for (int k = 0; k < NBACKENDS; k++)
        if (launched_by(&backends[k])) return backends[k].name;
    return "local";
}

static int stop_requested(void) { return kiln_interrupt_requested(); }

/* The library's path: beside the object holding this code (the Python extension or libkiln),
 * unless KILN_COMM_<NAME>_LIBRARY names it. */
static kiln_status load_library(const backend_entry *b, const kiln_comm_backend **out, void **handle) {
    char var[64], path[4096];
    snprintf(var, sizeof var, "KILN_COMM_%s_LIBRARY", b->name);
    for (char *c = var; *c; c++) *c = (char)(*c >= 'a' && *c <= 'z' ? *c - 32 : *c);
    const char *given = getenv(var);
    if (given && *given) {
        snprintf(path, sizeof path, "%s", given);
    } else {
        Dl_info info;
        if (!dladdr((void *)&kiln_comm_init, &info) || !info.dli_fname)
            return kiln_error(KILN_ERR_RUNTIME, "communication: cannot find where kiln is loaded from");
        snprintf(path, sizeof path, "%s", info.dli_fname);
        char *slash = strrchr(path, '/');
        size_t dir = slash ? (size_t)(slash - path + 1) : 0;
        snprintf(path + dir, sizeof path - dir, "%s", b->library);
    }
    /* global: libmpi's own plugins resolve its symbols through the global scope */
    void *h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (!h)
        return kiln_error(KILN_ERR_RUNTIME,
                          "communication: the %s backend's library could not be loaded: %s (kiln is built with it "
                          "when CMake finds its development files: for mpi, Debian's libopenmpi-dev; %s names "
                          "another path)",
                          b->name, dlerror(), var);
    kiln_comm_backend_entry entry = (kiln_comm_backend_entry)dlsym(h, KILN_COMM_BACKEND_ENTRY);
    const kiln_comm_backend *t = entry ? entry() : NULL;
    if (!t || t->abi != KILN_COMM_ABI) {
        dlclose(h);
        return kiln_error(KILN_ERR_RUNTIME, "communication: %s is not a kiln communication backend of this version",
                          path);
    }
    *out = t;
    *handle = h;
    return KILN_OK;
}

kiln_status kiln_comm_init(const char *backend) {
    const char *want = backend && *backend ? backend : kiln_comm_default_backend();
    pthread_mutex_lock(&comm.lock);
    kiln_status s = KILN_OK;
    if (comm.be) {
        if (strcmp(comm.name, want) != 0)
            s = kiln_error(KILN_ERR_VALUE, "communication: already initialized with the %s backend, not %s",
                           comm.name, want);
        goto out;
    }
    const backend_entry *b = NULL;
    for (int k = 0; k < NBACKENDS; k++)
        if (strcmp(backends[k].name, want) == 0) b = &backends[k];
    if (!b) {
        s = kiln_error(KILN_ERR_VALUE, "communication: unknown backend '%s' (the backends: %s)", want,
                       kiln_comm_backend_names());
        goto out;
    }
    const kiln_comm_backend *be = b->builtin;
    void *lib = NULL;
    if (!be && (s = load_library(b, &be, &lib)) != KILN_OK) goto out;
    char err[512] = "";
    if (be->init(stop_requested, err, sizeof err) != KILN_COMM_OK) {
        s = kiln_error(KILN_ERR_RUNTIME, "communication: the %s backend failed to start: %s", b->name, err);
        goto out; /* the library stays loaded: MPI cannot be unloaded and started again anyway */
    }
    if (!comm.timeout_set) {
        const char *t = getenv("KILN_COMM_TIMEOUT");
        comm.timeout = t && *t ? atof(t) : 300.0;
    }
    const char *check = getenv("KILN_COMM_CHECK");
    if (check && strcmp(check, "0") == 0) comm.check = false;
    comm.be = be;
    const char *overlap_env = getenv("KILN_COMM_OVERLAP");
    if (overlap_env && *overlap_env) kiln_comm_set_overlap(strcmp(overlap_env, "0") != 0);
    comm.library = lib;
    snprintf(comm.name, sizeof comm.name, "%s", b->name);
    memset(comm.groups, 0, sizeof comm.groups);
    comm.groups[0] = (group){.live = true, .handle = NULL, .rank = be->world_rank(), .size = be->world_size()};
out:
    pthread_mutex_unlock(&comm.lock);
    return s;
}

kiln_status kiln_comm_finalize(void) {
    pthread_mutex_lock(&comm.lock);
    kiln_status s = KILN_OK;
    if (comm.be) {
        for (int g = 1; g < MAX_GROUPS; g++)
            if (comm.groups[g].live) comm.be->group_free(comm.groups[g].handle);
        char err[512] = "";
        if (comm.be->finalize(err, sizeof err) != KILN_COMM_OK)
            s = kiln_error(KILN_ERR_RUNTIME, "communication: finalize failed: %s", err);
        comm.be = NULL; /* a library backend stays loaded: MPI is not restarted in one process */
        kiln_free(comm.staging);
        comm.staging = NULL, comm.staging_bytes = 0;
        comm.name[0] = 0;
        memset(comm.groups, 0, sizeof comm.groups);
    }
    pthread_mutex_unlock(&comm.lock);
    return s;
}

bool kiln_comm_initialized(void) { return comm.be != NULL; }
const char *kiln_comm_backend_name(void) { return comm.name; }

void kiln_comm_set_timeout(double seconds) {
    comm.timeout = seconds;
    comm.timeout_set = true;
}
double kiln_comm_timeout(void) {
    if (!comm.timeout_set && !comm.be) {
        const char *t = getenv("KILN_COMM_TIMEOUT");
        return t && *t ? atof(t) : 300.0;
    }
    return comm.timeout;
}
static _Atomic int64_t fusion_bytes = 25 * 1024 * 1024;
void kiln_comm_set_fusion_bytes(int64_t bytes) { fusion_bytes = bytes > 0 ? bytes : 1; }
int64_t kiln_comm_fusion_bytes(void) { return fusion_bytes; }

void kiln_comm_set_check(bool check) { comm.check = check; }
bool kiln_comm_check(void) { return comm.check; }
void kiln_comm_set_deterministic(bool on) { comm.deterministic = on; }
bool kiln_comm_deterministic(void) { return comm.deterministic; }

static kiln_status get_group(const char *what, int g, group **out) {
    if (!comm.be)
        return kiln_error(KILN_ERR_RUNTIME,
                          "%s: communication is not initialized (call kiln.communication.init() or "
                          "kiln.distributed.init_process_group() first)",
                          what);
    if (g < 0 || g >= MAX_GROUPS || !comm.groups[g].live)
        return kiln_error(KILN_ERR_VALUE, "%s: no communication group %d", what, g);
    *out = &comm.groups[g];
    return KILN_OK;
}

kiln_status kiln_comm_rank(int g, int *rank) {
    group *gr = NULL;
    KILN_TRY(get_group("get_rank", g, &gr));
    *rank = gr->rank;
    return KILN_OK;
}

kiln_status kiln_comm_size(int g, int *size) { return kiln_comm_size_for("get_group_size", g, size); }

kiln_status kiln_comm_collective_count(int g, long long *count) {
    group *gr = NULL;
    KILN_TRY(get_group("collective_count", g, &gr));
    *count = (long long)gr->seq;
    return KILN_OK;
}

kiln_status kiln_comm_size_for(const char *what, int g, int *size) {
    group *gr = NULL;
    KILN_TRY(get_group(what, g, &gr));
    *size = gr->size;
    return KILN_OK;
}

kiln_status kiln_comm_group_create(const int *ranks, int n, int *out) {
    group *world;
    KILN_TRY(get_group("create_group", 0, &world));
    if (n < 1) return kiln_error(KILN_ERR_VALUE, "create_group: give at least one rank");
    bool member = false;
    for (int k = 0; k < n; k++) {
        if (ranks[k] < 0 || ranks[k] >= world->size)
            return kiln_error(KILN_ERR_VALUE, "create_group: rank %d is not in [0, %d)", ranks[k], world->size);
        for (int j = 0; j < k; j++)
            if (ranks[j] == ranks[k]) return kiln_error(KILN_ERR_VALUE, "create_group: rank %d is given twice", ranks[k]);
        member |= ranks[k] == world->rank;
    }
    if (!member)
        return kiln_error(KILN_ERR_VALUE, "create_group: called on rank %d, which is not among the group's ranks "
                          "(only the members create a group)", world->rank);
    int slot = 1;
    while (slot < MAX_GROUPS && comm.groups[slot].live) slot++;
    if (slot == MAX_GROUPS) return kiln_error(KILN_ERR_LIMIT, "create_group: more than %d groups", MAX_GROUPS - 1);
    void *h = NULL;
    char err[512] = "";
    if (comm.be->group_create(ranks, n, &h, err, sizeof err) != KILN_COMM_OK)
        return kiln_error(KILN_ERR_RUNTIME, "create_group on rank %d: %s", world->rank, err);
    comm.groups[slot] = (group){.live = true, .handle = h, .rank = comm.be->group_rank(h), .size = n};
    *out = slot;
    return KILN_OK;
}

kiln_status kiln_comm_group_destroy(int g) {
    group *gr = NULL;
    KILN_TRY(get_group("destroy_group", g, &gr));
    if (g == 0) return kiln_error(KILN_ERR_VALUE, "destroy_group: the world group (0) lives until finalize");
    comm.be->group_free(gr->handle);
    *gr = (group){0};
    return KILN_OK;
}

/* ---- collectives ------------------------------------------------------------------------ */

typedef struct call {
    int kind, op, root;
    group *g;
    const kiln_meta *m;
    int64_t members, layout; /* a bucketed all-reduce: how many tensors, a hash of their shapes */
} call;

static char *call_str(const call *c, char *buf, size_t size) {
    char shape[128];
    kiln_shape_str(c->m, shape, sizeof shape);
    int n = snprintf(buf, size, "%s", kind_names[c->kind]);
    if (c->kind == C_ALL_REDUCE || c->kind == C_REDUCE_SCATTER || c->kind == C_REDUCE)
        n += snprintf(buf + n, size - (size_t)n, "(%s)", reduce_names[c->op]);
    if (c->kind == C_BROADCAST || c->kind == C_REDUCE)
        n += snprintf(buf + n, size - (size_t)n, " root %d", c->root);
    if (c->kind == C_SEND || c->kind == C_RECV)
        n += snprintf(buf + n, size - (size_t)n, " %s rank %d", c->kind == C_SEND ? "to" : "from", c->root);
    if (c->kind != C_BARRIER) snprintf(buf + n, size - (size_t)n, " of %s%s", kiln_dtype_name(c->m->dtype), shape);
    return buf;
}

/* "all_reduce(sum) of float32(4, 3) on rank 1 of 2: " + message */
static kiln_status fail(kiln_status s, const call *c, const char *fmt, const char *detail) {
    char what[256];
    return kiln_error(s, "%s on rank %d of %d: %s%s", call_str(c, what, sizeof what), c->g->rank, c->g->size, fmt,
                      detail ? detail : "");
}

static kiln_status backend_status(int rc, const call *c, const char *err) {
    kiln_status s = rc == KILN_COMM_INTERRUPTED ? KILN_ERR_INTERRUPTED : KILN_ERR_RUNTIME;
    return fail(s, c, "", err);
}

static int comm_dtype(kiln_dtype d) {
    switch (d) {
    case KILN_DTYPE_INT8: return KILN_COMM_INT8;
    case KILN_DTYPE_INT32: return KILN_COMM_INT32;
    case KILN_DTYPE_INT64: return KILN_COMM_INT64;
    case KILN_DTYPE_FLOAT32: return KILN_COMM_FLOAT32;
    case KILN_DTYPE_FLOAT64: return KILN_COMM_FLOAT64;
    default: return KILN_COMM_BYTES;
    }
}

/* The ranks exchange what they are about to do; any difference fails on every rank alike. */
static kiln_status agree(const call *c) {
    group *g = c->g;
    int64_t mine[HEADER] = {g->seq, c->kind, c->op, c->root, c->m->dtype, c->m->ndim};
    for (int d = 0; d < c->m->ndim; d++) mine[6 + d] = c->m->shape[d];
    mine[14] = c->members, mine[15] = c->layout;
    g->seq++;
    if (!comm.check || g->size == 1) return KILN_OK;
    int64_t *all = kiln_malloc(sizeof(int64_t) * HEADER * (size_t)g->size);
    if (!all) return KILN_ERR_MEMORY;
    char err[512] = "";
    int rc = comm.be->all_gather(g->handle, mine, all, HEADER, KILN_COMM_INT64, comm.timeout, err, sizeof err);
    if (rc != KILN_COMM_OK) {
        free(all);
        return backend_status(rc, c, err);
    }
    bool same = true;
    for (int r = 0; r < g->size; r++) same &= memcmp(all + r * HEADER, mine, sizeof mine) == 0;
    if (same) {
        free(all);
        return KILN_OK;
    }
    char list[2048] = "";
    size_t n = 0;
    for (int r = 0; r < g->size && n < sizeof list - 200; r++) {
        const int64_t *h = all + r * HEADER;
        kiln_meta m = {.dtype = KILN_DTYPE_FLOAT32};
        if (h[4] >= 0 && h[4] < KILN_DTYPE_COUNT) m.dtype = (kiln_dtype)h[4];
        m.ndim = h[5] >= 0 && h[5] <= KILN_MAX_DIMS ? (int32_t)h[5] : 0;
        for (int d = 0; d < m.ndim; d++) m.shape[d] = h[6 + d];
        group gr = *g;
        call other = {.kind = h[1] >= 1 && h[1] <= C_RECV ? (int)h[1] : 0,
                      .op = h[2] >= 0 && h[2] < KILN_COMM_REDUCE_COUNT ? (int)h[2] : 0, .root = (int)h[3], .g = &gr,
                      .m = &m};
        char what[256];
        n += (size_t)snprintf(list + n, sizeof list - n, "%srank %d: %s", r ? "; " : "", r,
                              call_str(&other, what, sizeof what));
        if (h[14] > 0)
            n += (size_t)snprintf(list + n, sizeof list - n, " (a bucket of %lld tensors, layout %llx)", (long long)h[14],
                                  (unsigned long long)h[15]);
        n += (size_t)snprintf(list + n, sizeof list - n, " (its collective #%lld in this group)", (long long)h[0]);
    }
    free(all);
    return fail(KILN_ERR_VALUE, c, "the ranks called different collectives or shapes or dtypes: ", list);
}

static kiln_status reducible(const call *c) {
    if (comm_dtype(c->m->dtype) == KILN_COMM_BYTES)
        return fail(KILN_ERR_TYPE, c, "", "reductions take int8, int32, int64, float32 or float64 tensors");
    if (c->op == KILN_COMM_MEAN && !kiln_dtype_is_float(c->m->dtype))
        return fail(KILN_ERR_TYPE, c, "", "mean needs a floating-point tensor (use sum for integers)");
    if (c->op < 0 || c->op >= KILN_COMM_REDUCE_COUNT)
        return kiln_error(KILN_ERR_VALUE, "%s: unknown reduction %d", kind_names[c->kind], c->op);
    return KILN_OK;
}

/* x / size; by a product where that is exact (size a power of two), which vectorizes */
static void divide_by_size(kiln_tensor *out, int size) {
    bool exact = (size & (size - 1)) == 0;
    if (out->meta.dtype == KILN_DTYPE_FLOAT32) {
        float *p = out->data, inv = 1.0f / (float)size;
        if (exact)
            for (int64_t k = 0; k < out->numel; k++) p[k] *= inv;
        else
            for (int64_t k = 0; k < out->numel; k++) p[k] /= (float)size;
    } else {
        double *p = out->data, inv = 1.0 / (double)size;
        if (exact)
            for (int64_t k = 0; k < out->numel; k++) p[k] *= inv;
        else
            for (int64_t k = 0; k < out->numel; k++) p[k] /= (double)size;
    }
}

/* Tells the backend what the next calls do (its own messages name it). */
static void describe(const call *c) {
    char what[256], text[320];
    snprintf(text, sizeof text, "%s on rank %d of %d", call_str(c, what, sizeof what), c->g->rank, c->g->size);
    comm.be->describe(text);
}

/* Starts a collective: its group, the agreement, and x as a contiguous tensor (a new reference). */
static kiln_status begin(call *c, const char *name, int g, kiln_tensor *x, kiln_tensor **xc) {
    KILN_TRY(get_group(name, g, &c->g));
    describe(c);
    if (c->kind == C_ALL_REDUCE || c->kind == C_REDUCE_SCATTER || c->kind == C_REDUCE) KILN_TRY(reducible(c));
    if ((c->kind == C_BROADCAST || c->kind == C_REDUCE) && (c->root < 0 || c->root >= c->g->size))
        return fail(KILN_ERR_VALUE, c, "", "the root is not a rank of the group");
    KILN_TRY(agree(c));
    if (!x) return KILN_OK;
    return kiln_to_contiguous(x, x->meta.dtype, xc);
}

#define EMPTY_META (&(kiln_meta){.dtype = KILN_DTYPE_INT8})

/* The all-reduce of set_deterministic for floats (integer sums and products are exact in any
 * order): every rank's x gathered, then combined in rank order into out, so each element is
 * ((x0 op x1) op x2) ... on every rank and in every run. A backend status. */
static void combine_f32(float *o, const float *all, int64_t n, int size, bool prod) {
    memcpy(o, all, (size_t)n * sizeof *o);
    for (int r = 1; r < size; r++) {
        const float *in = all + (int64_t)r * n;
        if (prod)
            for (int64_t k = 0; k < n; k++) o[k] *= in[k];
        else
            for (int64_t k = 0; k < n; k++) o[k] += in[k];
    }
}

static void combine_f64(double *o, const double *all, int64_t n, int size, bool prod) {
    memcpy(o, all, (size_t)n * sizeof *o);
    for (int r = 1; r < size; r++) {
        const double *in = all + (int64_t)r * n;
        if (prod)
            for (int64_t k = 0; k < n; k++) o[k] *= in[k];
        else
            for (int64_t k = 0; k < n; k++) o[k] += in[k];
    }
}

static int ordered_all_reduce(const call *c, const void *in, kiln_tensor *out, char *err, size_t errlen) {
    int size = c->g->size, dt = comm_dtype(out->meta.dtype);
    int64_t n = out->numel;
    void *all = kiln_malloc((size_t)n * (size_t)size * kiln_dtype_size(out->meta.dtype) + 1);
    if (!all) {
        snprintf(err, errlen, "out of memory for the %d ranks' tensors of the deterministic all-reduce", size);
        return KILN_COMM_FAILED;
    }
    int rc = comm.be->all_gather(c->g->handle, in, all, n, dt, comm.timeout, err, errlen);
    if (rc == KILN_COMM_OK && dt == KILN_COMM_FLOAT32)
        combine_f32(out->data, all, n, size, c->op == KILN_COMM_PROD);
    else if (rc == KILN_COMM_OK)
        combine_f64(out->data, all, n, size, c->op == KILN_COMM_PROD);
    free(all);
    return rc;
}

/* Whether an all-reduce goes the deterministic way (set_deterministic: floats summed, averaged or
 * multiplied in rank order). */
static bool ordered(const call *c, kiln_dtype dtype) {
    int dt = comm_dtype(dtype);
    return comm.deterministic && c->g->size > 1 && (dt == KILN_COMM_FLOAT32 || dt == KILN_COMM_FLOAT64) &&
           (c->op == KILN_COMM_SUM || c->op == KILN_COMM_MEAN || c->op == KILN_COMM_PROD);
}

/* A mean over a power-of-two number of ranks scales each rank's values by 1 / size while they are
 * packed, and the all-reduce sums them: exact (a power of two), so the same as dividing the sum,
 * without a pass over the result (reading what MPI just wrote is slow); other sizes divide the
 * sum. A bucket and a single tensor do the same, so bucketing changes no value. */
static bool scale_first(int op, int size) { return op == KILN_COMM_MEAN && (size & (size - 1)) == 0; }

/* dst[0..n) = src (contiguous, float dtype when scaling) times scale; dst may be src */
static void copy_scaled(void *dst, const void *src, int64_t n, kiln_dtype dtype, double scale) {
    if (scale == 1.0) {
        if (dst != src) memcpy(dst, src, (size_t)n * kiln_dtype_size(dtype));
    } else if (dtype == KILN_DTYPE_FLOAT32) {
        float *d = dst, f = (float)scale;
        const float *s = src;
        for (int64_t k = 0; k < n; k++) d[k] = s[k] * f;
    } else {
        double *d = dst;
        const double *s = src;
        for (int64_t k = 0; k < n; k++) d[k] = s[k] * scale;
    }
}

/* Copies x (any layout) into dst, scaled. */
static kiln_status pack(void *dst, kiln_tensor *x, double scale) {
    kiln_tensor *xc = x;
    if (!kiln_tensor_is_contiguous(x)) KILN_TRY(kiln_to_contiguous(x, x->meta.dtype, &xc));
    copy_scaled(dst, xc->data, x->numel, x->meta.dtype, scale);
    if (xc != x) kiln_tensor_release(xc);
    return KILN_OK;
}

/* The staging buffer, at least bytes long. Packed data is all-reduced from it into the output:
 * with Open MPI an all-reduce out of place from a buffer used before runs at the speed of one in
 * place in a buffer used before, while one in place in a new buffer (an output) is several times
 * slower for a few hundred KB. */
static void *staging(size_t bytes) {
    if (bytes > comm.staging_bytes) {
        kiln_free(comm.staging);
        comm.staging_bytes = 0;
        comm.staging = kiln_alloc(bytes);
        if (!comm.staging) return NULL;
        comm.staging_bytes = bytes;
    }
    return comm.staging;
}

/* The reduction of in (this rank's values, contiguous) into out, then a mean's division where it
 * was not done while packing. */
/* Seconds this process spent in all-reduces (blocking calls, starts and waits): what overlap
 * hides shows as less time here (kiln_comm_all_reduce_seconds). */
static double all_reduce_seconds;

static double seconds_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double kiln_comm_all_reduce_seconds(void) { return all_reduce_seconds; }

static kiln_status reduce_into(const call *c, const void *in, kiln_tensor *out) {
    char err[512] = "";
    double t0 = seconds_now();
    int rc = ordered(c, out->meta.dtype)
                 ? ordered_all_reduce(c, in, out, err, sizeof err)
                 : comm.be->all_reduce(c->g->handle, in, out->data, out->numel, comm_dtype(out->meta.dtype), c->op,
                                       comm.timeout, err, sizeof err);
    all_reduce_seconds += seconds_now() - t0;
    if (rc != KILN_COMM_OK) return backend_status(rc, c, err);
    if (c->op == KILN_COMM_MEAN && !scale_first(c->op, c->g->size)) divide_by_size(out, c->g->size);
    return KILN_OK;
}

kiln_status kiln_comm_all_reduce(kiln_tensor *x, int op, int g, kiln_tensor *out) {
    call c = {C_ALL_REDUCE, op, 0, NULL, &x->meta, 0, 0};
    KILN_TRY(begin(&c, "all_reduce", g, NULL, NULL));
    if (scale_first(op, c.g->size) && c.g->size > 1) {
        void *buf = staging((size_t)x->numel * kiln_dtype_size(x->meta.dtype));
        if (!buf) return KILN_ERR_MEMORY;
        KILN_TRY(pack(buf, x, 1.0 / c.g->size));
        return reduce_into(&c, buf, out);
    }
    /* from x (contiguous) into the output: with Open MPI this is as fast as an all-reduce in
     * place in a buffer used before, and faster than one in place in a new buffer */
    kiln_tensor *xc;
    KILN_TRY(kiln_to_contiguous(x, x->meta.dtype, &xc));
    kiln_status s = reduce_into(&c, xc->data, out);
    kiln_tensor_release(xc);
    return s;
}

/* FNV-1a over the members' shapes: the header tells buckets of the same size but other tensors
 * apart */
static int64_t layout_hash(kiln_tensor *const *x, int n) {
    uint64_t h = 1469598103934665603ull;
    for (int k = 0; k < n; k++)
        for (int d = -1; d < x[k]->meta.ndim; d++) {
            h ^= (uint64_t)(d < 0 ? x[k]->meta.ndim : x[k]->meta.shape[d]);
            h *= 1099511628211ull;
        }
    return (int64_t)(h >> 1);
}

/* Whether the bucket's tensors already lie in out, contiguous and one after the other (the memory
 * planner put them there: src/plan/plan.c, ops.def's JOINS_INPUTS): then out is reduced in place,
 * nothing packed (DDP's gradients written straight into their bucket). */
static bool laid_out_in(kiln_tensor *const *x, int n, const kiln_tensor *out) {
    size_t item = kiln_dtype_size(out->meta.dtype);
    const char *at = out->data;
    int64_t total = 0;
    for (int k = 0; k < n; k++) {
        if (x[k]->meta.dtype != out->meta.dtype || !kiln_tensor_is_contiguous(x[k]) || (const char *)x[k]->data != at)
            return false;
        at += (size_t)x[k]->numel * item;
        total += x[k]->numel;
    }
    return total == out->numel;
}

static _Atomic long long buckets_in_place, buckets_packed;
static double bucket_seconds; /* whole bucket calls: header, packing or scaling, the all-reduce */

void kiln_comm_bucket_counts(long long *in_place, long long *packed, double *seconds) {
    *in_place = buckets_in_place;
    *packed = buckets_packed;
    *seconds = bucket_seconds;
}

/* The bucket's values in buf (out's data when they lie there already: scaled in place), scaled
 * for a mean over a power-of-two group. */
static kiln_status fill_bucket(const call *c, kiln_tensor *const *x, int n, kiln_tensor *out, char *buf) {
    double scale = scale_first(c->op, c->g->size) ? 1.0 / c->g->size : 1.0;
    if (buf == out->data) {
        if (scale != 1.0) copy_scaled(buf, buf, out->numel, out->meta.dtype, scale);
        buckets_in_place++;
        return KILN_OK;
    }
    size_t item = kiln_dtype_size(out->meta.dtype);
    int64_t at = 0;
    for (int k = 0; k < n; k++) {
        if (x[k]->meta.dtype != out->meta.dtype || at + x[k]->numel > out->numel)
            return fail(KILN_ERR_VALUE, c, "", "the bucket's tensors do not match its buffer");
        KILN_TRY(pack(buf + (size_t)at * item, x[k], scale));
        at += x[k]->numel;
    }
    buckets_packed++;
    return KILN_OK;
}

static kiln_status bucket(kiln_tensor *const *x, int n, int op, int g, kiln_tensor *out) {
    call c = {C_ALL_REDUCE, op, 0, NULL, &out->meta, n, layout_hash(x, n)};
    KILN_TRY(begin(&c, "all_reduce", g, NULL, NULL));
    char *buf = laid_out_in(x, n, out) ? out->data : staging((size_t)out->numel * kiln_dtype_size(out->meta.dtype));
    if (!buf) return KILN_ERR_MEMORY;
    KILN_TRY(fill_bucket(&c, x, n, out, buf));
    return reduce_into(&c, buf, out);
}

kiln_status kiln_comm_all_reduce_bucket(kiln_tensor *const *x, int n, int op, int g, kiln_tensor *out) {
    double t0 = seconds_now();
    kiln_status s = bucket(x, n, op, g, out);
    bucket_seconds += seconds_now() - t0;
    return s;
}

/* ---- all-reduces in flight (a compiled plan's overlap: start after the last gradient, wait at
 * the first use) --------------------------------------------------------------------------- */

#define MAX_PENDING 64

typedef struct pending {
    void *out;     /* the output's data: what the wait names */
    void *request; /* the backend's; NULL when the backend reduced at the start */
    void *packed;  /* this all-reduce's own packed input (freed at the wait) */
    group *g;
    int op;
    char what[200];
} pending;

static pending in_flight[MAX_PENDING];
static int nin_flight;

static kiln_status start(kiln_tensor *const *x, int n, int op, int g, kiln_tensor *out) {
    call c = {C_ALL_REDUCE, op, 0, NULL, &out->meta, n, layout_hash(x, n)};
    KILN_TRY(begin(&c, "all_reduce", g, NULL, NULL));
    if (nin_flight == MAX_PENDING)
        return fail(KILN_ERR_LIMIT, &c, "", "more than 64 all-reduces in flight");
    bool in_place = laid_out_in(x, n, out);
    char *buf = in_place ? out->data : kiln_alloc((size_t)out->numel * kiln_dtype_size(out->meta.dtype) + 1);
    if (!buf) return KILN_ERR_MEMORY;
    kiln_status s = fill_bucket(&c, x, n, out, buf);
    pending p = {.out = out->data, .packed = in_place ? NULL : buf, .g = c.g, .op = op};
    call_str(&c, p.what, sizeof p.what);
    if (s == KILN_OK && comm.be->all_reduce_start && !ordered(&c, out->meta.dtype)) {
        char err[512] = "";
        double t0 = seconds_now();
        int rc = comm.be->all_reduce_start(c.g->handle, buf, out->data, out->numel, comm_dtype(out->meta.dtype), op,
                                           &p.request, err, sizeof err);
        all_reduce_seconds += seconds_now() - t0;
        if (rc != KILN_COMM_OK) s = backend_status(rc, &c, err);
    } else if (s == KILN_OK) { /* no non-blocking call: reduced now, the wait only finishes */
        s = reduce_into(&c, buf, out);
        p.op = KILN_COMM_SUM; /* (a mean's division is done) */
    }
    if (s != KILN_OK) {
        kiln_free(p.packed);
        return s;
    }
    in_flight[nin_flight++] = p;
    return KILN_OK;
}

kiln_status kiln_comm_all_reduce_start(kiln_tensor *const *x, int n, int op, int g, kiln_tensor *out) {
    double t0 = seconds_now();
    kiln_status s = start(x, n, op, g, out);
    bucket_seconds += seconds_now() - t0;
    return s;
}

static kiln_status wait_for(kiln_tensor *out);

kiln_status kiln_comm_all_reduce_wait(kiln_tensor *out) {
    double t0 = seconds_now();
    kiln_status s = wait_for(out);
    bucket_seconds += seconds_now() - t0;
    return s;
}

static kiln_status wait_for(kiln_tensor *out) {
    int k = 0;
    while (k < nin_flight && in_flight[k].out != out->data) k++;
    if (k == nin_flight)
        return kiln_error(KILN_ERR_VALUE, "all_reduce_wait: no all-reduce is in flight into this tensor (all_reduce_wait "
                          "completes what all_reduce_start began)");
    pending p = in_flight[k];
    in_flight[k] = in_flight[--nin_flight];
    int rc = KILN_COMM_OK;
    char err[512] = "";
    if (p.request) {
        char text[320];
        snprintf(text, sizeof text, "%s on rank %d of %d (waiting)", p.what, p.g->rank, p.g->size);
        comm.be->describe(text);
        double t0 = seconds_now();
        rc = comm.be->wait(p.request, comm.timeout, err, sizeof err);
        all_reduce_seconds += seconds_now() - t0;
    }
    kiln_free(p.packed);
    if (rc != KILN_COMM_OK)
        return kiln_error(rc == KILN_COMM_INTERRUPTED ? KILN_ERR_INTERRUPTED : KILN_ERR_RUNTIME, "%s on rank %d of %d: %s",
                          p.what, p.g->rank, p.g->size, err);
    if (p.op == KILN_COMM_MEAN && !scale_first(p.op, p.g->size)) divide_by_size(out, p.g->size);
    return KILN_OK;
}

void kiln_comm_finish_in_flight(void) {
    for (int k = 0; k < nin_flight; k++) {
        char err[512] = "";
        if (in_flight[k].request) comm.be->wait(in_flight[k].request, comm.timeout, err, sizeof err);
        kiln_free(in_flight[k].packed);
    }
    nin_flight = 0;
}

static _Atomic bool overlap = false;
void kiln_comm_set_overlap(bool on) { overlap = on; }
bool kiln_comm_overlap(void) { return overlap; }

kiln_status kiln_comm_all_gather(kiln_tensor *x, int g, kiln_tensor *out) {
    call c = {C_ALL_GATHER, 0, 0, NULL, &x->meta, 0, 0};
    kiln_tensor *xc;
    KILN_TRY(begin(&c, "all_gather", g, x, &xc));
    char err[512] = "";
    int dt = comm_dtype(x->meta.dtype);
    int64_t count = dt == KILN_COMM_BYTES ? x->numel * (int64_t)kiln_dtype_size(x->meta.dtype) : x->numel;
    int rc = comm.be->all_gather(c.g->handle, xc->data, out->data, count, dt, comm.timeout, err, sizeof err);
    kiln_tensor_release(xc);
    return rc == KILN_COMM_OK ? KILN_OK : backend_status(rc, &c, err);
}

kiln_status kiln_comm_reduce_scatter(kiln_tensor *x, int op, int g, kiln_tensor *out) {
    call c = {C_REDUCE_SCATTER, op, 0, NULL, &x->meta, 0, 0};
    kiln_tensor *xc;
    KILN_TRY(begin(&c, "reduce_scatter", g, x, &xc));
    char err[512] = "";
    int rc = comm.be->reduce_scatter(c.g->handle, xc->data, out->data, out->numel, comm_dtype(x->meta.dtype), op,
                                     comm.timeout, err, sizeof err);
    kiln_tensor_release(xc);
    if (rc != KILN_COMM_OK) return backend_status(rc, &c, err);
    if (op == KILN_COMM_MEAN) divide_by_size(out, c.g->size);
    return KILN_OK;
}

kiln_status kiln_comm_broadcast(kiln_tensor *x, int root, int g, kiln_tensor *out) {
    call c = {C_BROADCAST, 0, root, NULL, &x->meta, 0, 0};
    KILN_TRY(begin(&c, "broadcast", g, NULL, NULL));
    if (c.g->rank == root) KILN_TRY(kiln_copy_into(out, x));
    char err[512] = "";
    int rc = comm.be->broadcast(c.g->handle, out->data, out->numel * (int64_t)kiln_dtype_size(x->meta.dtype),
                                KILN_COMM_BYTES, root, comm.timeout, err, sizeof err);
    return rc == KILN_COMM_OK ? KILN_OK : backend_status(rc, &c, err);
}

kiln_status kiln_comm_reduce(kiln_tensor *x, int op, int root, int g, kiln_tensor *out) {
    call c = {C_REDUCE, op, root, NULL, &x->meta, 0, 0};
    kiln_tensor *xc;
    KILN_TRY(begin(&c, "reduce", g, x, &xc));
    char err[512] = "";
    int rc = comm.be->reduce(c.g->handle, xc->data, out->data, x->numel, comm_dtype(x->meta.dtype), op, root,
                             comm.timeout, err, sizeof err);
    kiln_tensor_release(xc);
    if (rc != KILN_COMM_OK) return backend_status(rc, &c, err);
    if (c.g->rank != root)
        memset(out->data, 0, (size_t)out->numel * kiln_dtype_size(out->meta.dtype));
    else if (op == KILN_COMM_MEAN)
        divide_by_size(out, c.g->size);
    return KILN_OK;
}

kiln_status kiln_comm_barrier(int g) {
    call c = {C_BARRIER, 0, 0, NULL, EMPTY_META, 0, 0};
    KILN_TRY(begin(&c, "barrier", g, NULL, NULL));
    char err[512] = "";
    int rc = comm.be->barrier(c.g->handle, comm.timeout, err, sizeof err);
    return rc == KILN_COMM_OK ? KILN_OK : backend_status(rc, &c, err);
}

/* send/recv: a header message (dtype, ndim, shape) before the payload, with the same tag (MPI
 * keeps the order of messages between two ranks with one tag). */
static void point_header(const kiln_meta *m, int64_t *h) {
    memset(h, 0, sizeof(int64_t) * HEADER);
    h[0] = m->dtype;
    h[1] = m->ndim;
    for (int d = 0; d < m->ndim; d++) h[2 + d] = m->shape[d];
}

kiln_status kiln_comm_send(kiln_tensor *x, int dst, int tag, int g) {
    call c = {C_SEND, 0, dst, NULL, &x->meta, 0, 0};
    KILN_TRY(get_group("send", g, &c.g));
    describe(&c);
    if (dst < 0 || dst >= c.g->size || dst == c.g->rank)
        return fail(KILN_ERR_VALUE, &c, "", "the destination must be another rank of the group");
    if (tag < 0 || tag > 32767) return fail(KILN_ERR_VALUE, &c, "", "the tag must be in [0, 32767]");
    int64_t h[HEADER];
    point_header(&x->meta, h);
    kiln_tensor *xc;
    KILN_TRY(kiln_to_contiguous(x, x->meta.dtype, &xc));
    char err[512] = "";
    int rc = comm.be->send(c.g->handle, h, sizeof h, dst, tag, comm.timeout, err, sizeof err);
    if (rc == KILN_COMM_OK)
        rc = comm.be->send(c.g->handle, xc->data, x->numel * (int64_t)kiln_dtype_size(x->meta.dtype), dst, tag,
                           comm.timeout, err, sizeof err);
    kiln_tensor_release(xc);
    return rc == KILN_COMM_OK ? KILN_OK : backend_status(rc, &c, err);
}

kiln_status kiln_comm_recv(kiln_tensor *out, int src, int tag, int g) {
    call c = {C_RECV, 0, src, NULL, &out->meta, 0, 0};
    KILN_TRY(get_group("recv", g, &c.g));
    describe(&c);
    if (src < 0 || src >= c.g->size || src == c.g->rank)
        return fail(KILN_ERR_VALUE, &c, "", "the source must be another rank of the group");
    if (tag < 0 || tag > 32767) return fail(KILN_ERR_VALUE, &c, "", "the tag must be in [0, 32767]");
    int64_t h[HEADER], want[HEADER];
    point_header(&out->meta, want);
    char err[512] = "";
    int rc = comm.be->recv(c.g->handle, h, sizeof h, src, tag, comm.timeout, err, sizeof err);
    if (rc != KILN_COMM_OK) return backend_status(rc, &c, err);
    if (memcmp(h, want, sizeof h) == 0) {
        rc = comm.be->recv(c.g->handle, out->data, out->numel * (int64_t)kiln_dtype_size(out->meta.dtype), src, tag,
                           comm.timeout, err, sizeof err);
        return rc == KILN_COMM_OK ? KILN_OK : backend_status(rc, &c, err);
    }
    /* take the payload off the wire, then say what was sent */
    kiln_meta m = {.dtype = h[0] >= 0 && h[0] < KILN_DTYPE_COUNT ? (kiln_dtype)h[0] : KILN_DTYPE_INT8,
                   .ndim = h[1] >= 0 && h[1] <= KILN_MAX_DIMS ? (int32_t)h[1] : 0};
    int64_t numel = 1;
    for (int d = 0; d < m.ndim; d++) numel *= (m.shape[d] = h[2 + d]);
    size_t bytes = (size_t)numel * kiln_dtype_size(m.dtype);
    void *scratch = kiln_malloc(bytes ? bytes : 1);
    if (scratch) {
        comm.be->recv(c.g->handle, scratch, (int64_t)bytes, src, tag, comm.timeout, err, sizeof err);
        free(scratch);
    }
    char shape[128], msg[256];
    snprintf(msg, sizeof msg, "rank %d sent %s%s", src, kiln_dtype_name(m.dtype), kiln_shape_str(&m, shape, sizeof shape));
    return fail(KILN_ERR_VALUE, &c, "expected the dtype and shape of the receiving tensor, but ", msg);
}

_Noreturn void kiln_comm_abort(int code) {
    fflush(stdout);
    fflush(stderr);
    if (comm.be) comm.be->abort(code);
    exit(code);
}
