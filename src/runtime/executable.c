/* kiln_executable: a compiled graph = a plan (owned, or borrowed from an enclosing plan), its
 * arena and the state of the backend that runs it. Everything a caller does with a compiled
 * graph goes through the backend's table (src/runtime/backend.h). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

#include "../codegen/fused.h"
#include "../comm/comm.h"
#include "backend.h"
#include "../core/profile.h"

typedef struct kiln_arena kiln_arena;
static void arena_release(kiln_arena *a); /* below */

struct kiln_executable {
    kiln_plan *own_plan; /* the plan, when this executable made it */
    const kiln_plan *plan;
    kiln_plan_memory mem;
    kiln_arena *shared;  /* the arena, when shared with other bindings of a symbolic plan (else mem.arena is own) */
    const kiln_backend *be;
    void *state;
};

/* An arena the bindings of one symbolic plan share (kiln_executable_bind), reference counted: one run
 * at a time over it. */
struct kiln_arena {
    pthread_mutex_t lock;
    _Atomic int64_t refs;
    char *data;
    size_t bytes;
};

static kiln_status arena_new(size_t bytes, kiln_arena **out) {
    kiln_arena *a = kiln_calloc(1, sizeof *a);
    if (!a || (bytes && !(a->data = kiln_alloc(bytes)))) {
        free(a);
        return kiln_error(KILN_ERR_MEMORY, "out of memory allocating a graph's arena of %zu bytes", bytes);
    }
    pthread_mutex_init(&a->lock, NULL);
    atomic_init(&a->refs, 1);
    a->bytes = bytes;
    *out = a;
    return KILN_OK;
}

static void arena_release(kiln_arena *a) {
    if (!a || atomic_fetch_sub(&a->refs, 1) != 1) return;
    if (a->data) kiln_free(a->data);
    pthread_mutex_destroy(&a->lock);
    free(a);
}


static kiln_status memory_new(const kiln_plan *p, kiln_plan_memory *m, char *shared) {
    const kiln_graph *g = p->g;
    m->planned = kiln_calloc((size_t)(g->nvalues ? g->nvalues : 1), sizeof(kiln_tensor *));
    if (!m->planned) return kiln_error(KILN_ERR_MEMORY, "out of memory compiling a graph");
    if (shared) m->arena = shared;
    else if (p->arena_bytes && !(m->arena = kiln_alloc(p->arena_bytes)))
        return kiln_error(KILN_ERR_MEMORY, "out of memory allocating a graph's arena of %zu bytes", p->arena_bytes);
    for (int32_t v = 0; v < g->nvalues; v++) {
        if (p->offset[v] < 0) continue;
        const kiln_meta *meta = &g->values[v].meta;
        KILN_TRY(kiln_tensor_wrap(meta->dtype, meta->ndim, meta->shape, NULL, m->arena + p->offset[v], NULL, NULL,
                                  &m->planned[v]));
    }
    return KILN_OK;
}

static void memory_free(const kiln_plan *p, kiln_plan_memory *m, kiln_arena *shared) {
    for (int32_t v = 0; m->planned && p && v < p->g->nvalues; v++) kiln_tensor_release(m->planned[v]);
    free(m->planned);
    if (shared) arena_release(shared);
    else if (m->arena) kiln_free(m->arena);
}

static kiln_status prepare(kiln_executable *e, const kiln_plan *p, const kiln_backend *be) {
    e->plan = p;
    e->be = be;
    KILN_TRY(memory_new(p, &e->mem, e->shared ? e->shared->data : NULL));
    return be->prepare(p, &e->mem, &e->state);
}

kiln_status kiln_executable_from_plan(const kiln_plan *p, const kiln_backend *be, kiln_executable **out) {
    kiln_executable *e = kiln_calloc(1, sizeof *e);
    if (!e) return kiln_error(KILN_ERR_MEMORY, "out of memory compiling a graph");
    kiln_status s = prepare(e, p, be);
    if (s != KILN_OK) {
        kiln_executable_free(e);
        return s;
    }
    *out = e;
    return KILN_OK;
}

static bool dump_plan(void) {
    const char *v = getenv("KILN_DUMP_PLAN");
    return v && strcmp(v, "1") == 0;
}

kiln_status kiln_compile(const kiln_graph *g, const kiln_compile_options *opt, kiln_executable **out) {
    const kiln_backend *be = kiln_backend_find(opt ? opt->backend : NULL);
    if (!be) return kiln_error_context(KILN_ERR_VALUE, "compile");
    kiln_executable *e = kiln_calloc(1, sizeof *e);
    if (!e) return kiln_error(KILN_ERR_MEMORY, "out of memory compiling a graph");
    int64_t start = kiln_profiling_phases() ? kiln_profile_now() : 0;
    kiln_status s = kiln_plan_build(g, opt, &e->own_plan);
    if (start) kiln_profile_phase("plan", NULL, start);
    if (s == KILN_OK && dump_plan()) {
        char *text = kiln_plan_to_string(e->own_plan);
        fprintf(stderr, "[kiln] %s", text ? text : "(out of memory)\n");
        free(text);
    }
    start = kiln_profiling_phases() ? kiln_profile_now() : 0;
    if (s == KILN_OK) s = prepare(e, e->own_plan, be);
    if (start && s == KILN_OK) {
        char detail[96];
        snprintf(detail, sizeof detail, "backend %s, arena %zu bytes", be->name, e->own_plan->arena_bytes);
        kiln_profile_phase("prepare", detail, start);
    }
    if (s != KILN_OK) {
        kiln_executable_free(e);
        return s;
    }
    *out = e;
    return KILN_OK;
}

/* What the compiled bindings of one symbolic plan share. */
struct kiln_bindings {
    pthread_mutex_t lock; /* one binding compiled at a time */
    kiln_arena *arena;    /* the arena of the largest binding so far (NULL before the first) */
    const kiln_backend *be; /* whose memo this is */
    void *memo;           /* what that backend kept of the code it generated (kiln_backend.prepare_bound) */
};

kiln_status kiln_bindings_new(kiln_bindings **out) {
    kiln_bindings *b = kiln_calloc(1, sizeof *b);
    if (!b) return kiln_error(KILN_ERR_MEMORY, "out of memory compiling a graph");
    pthread_mutex_init(&b->lock, NULL);
    *out = b;
    return KILN_OK;
}

void kiln_bindings_free(kiln_bindings *b) {
    if (!b) return;
    arena_release(b->arena);
    if (b->memo) b->be->free_memo(b->memo);
    pthread_mutex_destroy(&b->lock);
    free(b);
}

size_t kiln_bindings_arena_bytes(const kiln_bindings *b) { return b && b->arena ? b->arena->bytes : 0; }

/* e (its plan bound) in shared's arena, grown (a new arena for this and later bindings) when too small,
 * and prepared for backend be from shared's memo where be keeps one. */
static kiln_status prepare_shared(kiln_executable *e, kiln_bindings *shared, const kiln_backend *be) {
    size_t need = e->own_plan->arena_bytes;
    if (!shared->arena || shared->arena->bytes < need) {
        kiln_arena *grown = NULL;
        KILN_TRY(arena_new(need, &grown));
        arena_release(shared->arena);
        shared->arena = grown;
    }
    atomic_fetch_add(&shared->arena->refs, 1);
    e->shared = shared->arena;
    if (!be->prepare_bound) return prepare(e, e->own_plan, be);
    if (shared->memo && shared->be != be) {
        shared->be->free_memo(shared->memo);
        shared->memo = NULL;
    }
    shared->be = be;
    e->plan = e->own_plan;
    e->be = be;
    KILN_TRY(memory_new(e->plan, &e->mem, e->shared->data));
    return be->prepare_bound(e->plan, &e->mem, &shared->memo, &e->state);
}

kiln_status kiln_executable_bind(const kiln_plan *p, const int64_t *bindings, const kiln_backend *be,
                                 kiln_bindings *shared, kiln_executable **out) {
    kiln_executable *e = kiln_calloc(1, sizeof *e);
    if (!e) return kiln_error(KILN_ERR_MEMORY, "out of memory compiling a graph");
    int64_t start = kiln_profiling_phases() ? kiln_profile_now() : 0;
    kiln_status s = kiln_plan_bind(p, bindings, &e->own_plan);
    if (start) kiln_profile_phase("bind", NULL, start);
    if (s == KILN_OK && shared) {
        pthread_mutex_lock(&shared->lock);
        s = prepare_shared(e, shared, be);
        pthread_mutex_unlock(&shared->lock);
    } else if (s == KILN_OK) {
        s = prepare(e, e->own_plan, be);
    }
    if (s != KILN_OK) {
        kiln_executable_free(e);
        return s;
    }
    *out = e;
    return KILN_OK;
}

void kiln_executable_free(kiln_executable *e) {
    if (!e) return;
    if (e->state) e->be->free(e->state);
    memory_free(e->plan, &e->mem, e->shared);
    kiln_plan_free(e->own_plan);
    free(e);
}

/* A run that failed between an all-reduce's start and its wait leaves it in flight, writing into
 * the plan's memory: it is completed (and dropped) before the error goes back. */
static kiln_status finish_run(kiln_status s) {
    if (s != KILN_OK) kiln_comm_finish_in_flight();
    return s;
}

kiln_status kiln_executable_run(kiln_executable *e, int nin, kiln_tensor *const *inputs, int nout,
                                kiln_tensor **outputs) {
    if (!e->shared) return finish_run(e->be->run(e->state, nin, inputs, nout, outputs));
    pthread_mutex_lock(&e->shared->lock);
    kiln_status s = e->be->run(e->state, nin, inputs, nout, outputs);
    pthread_mutex_unlock(&e->shared->lock);
    return finish_run(s);
}

kiln_status kiln_executable_run_into(kiln_executable *e, int nin, kiln_tensor *const *inputs, int nout,
                                     kiln_tensor *const *into) {
    const kiln_graph *g = e->plan->g;
    for (int k = 0; k < nout && k < g->noutputs; k++)
        if (!kiln_meta_equal(&g->values[g->outputs[k]].meta, &into[k]->meta) || !kiln_tensor_is_contiguous(into[k]))
            return kiln_error(KILN_ERR_VALUE, "graph: output buffer %d does not match the graph's output", k);
    if (!e->shared) return finish_run(e->be->run_into(e->state, nin, inputs, nout, into));
    pthread_mutex_lock(&e->shared->lock);
    kiln_status s = e->be->run_into(e->state, nin, inputs, nout, into);
    pthread_mutex_unlock(&e->shared->lock);
    return finish_run(s);
}

const kiln_plan *kiln_executable_plan(const kiln_executable *e) { return e->plan; }
int kiln_executable_num_outputs(const kiln_executable *e) { return e->plan->g->noutputs; }
size_t kiln_executable_arena_bytes(const kiln_executable *e) { return e->plan->arena_bytes; }
size_t kiln_executable_output_bytes(const kiln_executable *e) { return e->plan->output_bytes; }
char *kiln_executable_plan_string(const kiln_executable *e) { return kiln_plan_to_string(e->plan); }
const char *kiln_executable_backend(const kiln_executable *e) { return e->be->name; }
bool kiln_executable_is_native(const kiln_executable *e) { return e->be->is_native && e->be->is_native(e->state); }
int64_t kiln_executable_fallback_calls(const kiln_executable *e) {
    return e->be->fallback_calls ? e->be->fallback_calls(e->state) : 0;
}

char *kiln_executable_order_string(const kiln_executable *e) {
    const kiln_plan *p = e->plan;
    size_t len = 1;
    for (int32_t i = 0; i < p->norder; i++) len += strlen(kiln_op_table[p->g->nodes[p->order[i]].op].name) + 1;
    char *s = kiln_malloc(len);
    if (!s) return NULL;
    s[0] = '\0';
    for (int32_t i = 0; i < p->norder; i++) {
        if (i) strcat(s, " ");
        strcat(s, kiln_op_table[p->g->nodes[p->order[i]].op].name);
    }
    return s;
}

kiln_status kiln_output_hand_out(const kiln_value *root, kiln_tensor *t, kiln_tensor **out) {
    if (!(root->kind == KILN_VALUE_CAPTURED && root->constant)) {
        kiln_tensor_retain(t);
        *out = t;
        return KILN_OK;
    }
    /* a view of a compile-time constant: the caller gets its own copy, never the graph's */
    kiln_tensor *copy = NULL;
    kiln_status s = kiln_tensor_empty(t->meta.dtype, t->meta.ndim, t->meta.shape, &copy);
    if (s == KILN_OK) s = kiln_copy_into(copy, t);
    if (s != KILN_OK) {
        kiln_tensor_release(copy);
        return s;
    }
    *out = copy;
    return KILN_OK;
}

/* ---- the interpreted path of fused groups ------------------------------------------------------ */

/* A fused group without generated code runs its subgraph kernel by kernel (results are the unfused
 * graph's). Code generation sits beside the backends and must not call them: it gets this at
 * start-up. */
static kiln_status interp_prepare(const kiln_graph *sub, void **out) {
    return kiln_compile(sub, NULL, (kiln_executable **)out);
}

static kiln_status interp_run(void *k, int nin, kiln_tensor *const *in, kiln_tensor *out) {
    kiln_tensor *result = NULL;
    KILN_TRY(kiln_executable_run(k, nin, in, 1, &result));
    kiln_status s = kiln_copy_into(out, result);
    kiln_tensor_release(result);
    return s;
}

static void interp_free(void *k) { kiln_executable_free(k); }

__attribute__((constructor)) static void register_fused_interpreter(void) {
    static const kiln_fused_interpreter interpreter = {interp_prepare, interp_run, interp_free};
    kiln_fused_register_interpreter(&interpreter);
}
