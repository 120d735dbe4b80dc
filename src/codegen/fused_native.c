/* Fused groups run by generated code: prepare emits the group's C kernel for the layouts its
 * inputs will have (contiguous unless the caller says otherwise, broadcast to the group's space):
 * each operand moves along the inner axis by one element, not at all, or by any stride
 * (KILN_INNER_*); run binds the tensors of the call. Kernels not loaded yet wait in a
 * process-wide list and the first run of any of them builds them all with one compiler run (a
 * graph's groups compile together, into one object). Inputs in a layout the kernel was not made
 * for are copied to contiguous first; groups the emitter does not handle, machines without a
 * compiler (and KILN_DISABLE_CODEGEN=1) run the interpreted path. KILN_DUMP_CODE=1 prints the
 * generated C. */
#include <pthread.h>
#include <stdatomic.h>

#include "../ir/body.h"
#include "../ir/layout.h"
#include "../ir/symbolic.h"
#include "../plan/plan.h"
#include "codegen.h"
#include "fused.h"

#define MAX_OPERANDS 33 /* the output and up to 32 inputs */

typedef struct {
    int ndim;
    int64_t shape[KILN_MAX_DIMS];
    int64_t st[MAX_OPERANDS][KILN_MAX_DIMS]; /* byte strides */
} loop_plan;

struct kiln_fused_kernel {
    kiln_graph *sub;
    kiln_fused_fn fn;          /* NULL: interpreted (or not built yet) */
    char *source;              /* while waiting to be built */
    atomic_bool waiting;       /* source is in the waiting list */
    char symbol[48];
    int nops;                  /* 1 + inputs */
    int8_t kind[MAX_OPERANDS]; /* per operand: how it moves along the inner axis (KILN_INNER_*) */
    bool rows;                 /* a row kernel: the inner axis is reduced, never merged with others */
    int snd;                   /* the iteration space (kiln_codegen_space) */
    int64_t sshape[KILN_MAX_DIMS];
    size_t itemsize[MAX_OPERANDS];
    loop_plan contiguous;      /* the plan when every operand is contiguous */
    bool contiguous_fits;      /* the kernel runs contiguous operands with that plan */
    void *interp;              /* the interpreted path, made when first needed */
    pthread_mutex_t lock;
};

/* Kernels waiting to be built. */
static struct {
    pthread_mutex_t lock;
    kiln_fused_kernel **items;
    int n, cap;
} waiting = {.lock = PTHREAD_MUTEX_INITIALIZER};


/* Drops size-1 axes and merges axes contiguous for every operand (as kiln_iterate does); for
 * row kernels the last axis (the rows) stays as it is. strides: element strides per operand over
 * (ndim, shape). */
static void plan_loop(loop_plan *p, bool rows, int nops, const size_t *itemsize, int64_t (*strides)[KILN_MAX_DIMS],
                      int ndim, const int64_t *shape) {
    int nd = 0;
    for (int d = 0; d < ndim; d++) {
        bool row_axis = rows && d == ndim - 1;
        if (shape[d] == 1 && !row_axis) continue;
        if (nd > 0 && !row_axis) {
            bool merge = true;
            for (int k = 0; k < nops && merge; k++)
                merge = p->st[k][nd - 1] == strides[k][d] * shape[d] * (int64_t)itemsize[k];
            if (merge) {
                p->shape[nd - 1] *= shape[d];
                for (int k = 0; k < nops; k++) p->st[k][nd - 1] = strides[k][d] * (int64_t)itemsize[k];
                continue;
            }
        }
        p->shape[nd] = shape[d];
        for (int k = 0; k < nops; k++) p->st[k][nd] = strides[k][d] * (int64_t)itemsize[k];
        nd++;
    }
    if (nd == 0) {
        p->shape[0] = 1;
        for (int k = 0; k < nops; k++) p->st[k][0] = 0;
        nd = 1;
    }
    p->ndim = nd;
}

/* Element strides of a (ndim_in, shape_in) tensor with strides own (NULL: contiguous) broadcast
 * to (ndim, shape). */
static void contiguous_broadcast_strides(const kiln_meta *in, const int64_t *own_strides, int ndim, const int64_t *shape,
                                         int64_t *strides) {
    int64_t own[KILN_MAX_DIMS];
    if (own_strides) memcpy(own, own_strides, sizeof(int64_t) * (size_t)in->ndim);
    else kiln_contiguous_strides(in->ndim, in->shape, own);
    int lead = ndim - in->ndim;
    for (int d = 0; d < ndim; d++) {
        int sd = d - lead;
        strides[d] = (sd < 0 || (in->shape[sd] == 1 && shape[d] != 1)) ? 0 : own[sd];
    }
}

static bool codegen_disabled(void) {
    const char *v = getenv("KILN_DISABLE_CODEGEN");
    return v && *v && strcmp(v, "0") != 0;
}

/* Element strides of the output over the space: a reduction that drops the row axis writes one
 * element per row. */
static void output_strides(const kiln_fused_kernel *k, const kiln_meta *om, const int64_t *own, int64_t *strides) {
    if (k->rows && om->ndim == k->snd - 1) {
        for (int d = 0; d < om->ndim; d++) strides[d] = om->shape[d] == 1 ? 0 : own[d];
        strides[k->snd - 1] = 0;
        return;
    }
    int lead = k->snd - om->ndim;
    for (int d = 0; d < k->snd; d++) {
        int sd = d - lead;
        strides[d] = (sd < 0 || (om->shape[sd] == 1 && k->sshape[d] != 1)) ? 0 : own[sd];
    }
}

/* The kind an operand's inner byte stride calls for; a row kernel reads inputs that vary along
 * the row through a pointer, so those are never FIXED. */
static int8_t kind_of(const kiln_fused_kernel *k, int op, int64_t inner) {
    const kiln_graph *g = k->sub;
    const kiln_meta *m = op == 0 ? &g->values[g->outputs[0]].meta : &g->values[g->inputs[op - 1]].meta;
    bool dropped = op == 0 && k->rows && m->ndim == k->snd - 1;
    bool varies = !dropped && m->ndim >= 1 && m->shape[m->ndim - 1] != 1;
    if (inner == 0 && !varies) return KILN_INNER_FIXED;
    if (inner == (int64_t)k->itemsize[op]) return KILN_INNER_UNIT;
    return KILN_INNER_STRIDED;
}

static bool kind_fits(const kiln_fused_kernel *k, int op, int64_t inner) {
    switch (k->kind[op]) {
    case KILN_INNER_FIXED: return inner == 0;
    case KILN_INNER_UNIT: return inner == (int64_t)k->itemsize[op];
    default: return true;
    }
}

/* The kernel's iteration space, operand kinds and contiguous loop for the layouts in_strides says
 * (NULL: contiguous inputs), from its subgraph's sizes: everything but the code. */
static void plan_layouts(kiln_fused_kernel *k, const int64_t *const *in_strides) {
    const kiln_graph *g = k->sub;
    const kiln_meta *om = &g->values[g->outputs[0]].meta;
    k->rows = kiln_codegen_has_rows(g);
    kiln_codegen_space(g, &k->snd, k->sshape);
    int64_t strides[MAX_OPERANDS][KILN_MAX_DIMS], hinted[MAX_OPERANDS][KILN_MAX_DIMS], own[KILN_MAX_DIMS];
    kiln_contiguous_strides(om->ndim, om->shape, own);
    output_strides(k, om, own, strides[0]);
    memcpy(hinted[0], strides[0], sizeof strides[0]);
    k->itemsize[0] = kiln_dtype_size(om->dtype);
    for (int i = 0; i < g->ninputs; i++) {
        const kiln_meta *m = &g->values[g->inputs[i]].meta;
        contiguous_broadcast_strides(m, NULL, k->snd, k->sshape, strides[1 + i]);
        contiguous_broadcast_strides(m, in_strides ? in_strides[i] : NULL, k->snd, k->sshape, hinted[1 + i]);
        k->itemsize[1 + i] = kiln_dtype_size(m->dtype);
    }
    loop_plan hint;
    plan_loop(&hint, k->rows, k->nops, k->itemsize, hinted, k->snd, k->sshape);
    for (int op = 0; op < k->nops; op++) k->kind[op] = kind_of(k, op, hint.st[op][hint.ndim - 1]);
    loop_plan *p = &k->contiguous;
    plan_loop(p, k->rows, k->nops, k->itemsize, strides, k->snd, k->sshape);
    k->contiguous_fits = true;
    for (int op = 0; op < k->nops; op++) k->contiguous_fits &= kind_fits(k, op, p->st[op][p->ndim - 1]);
}

static kiln_status prepare_native(kiln_fused_kernel *k, const int64_t *const *in_strides) {
    const kiln_graph *g = k->sub;
    plan_layouts(k, in_strides);
    char *source = NULL;
    KILN_TRY(kiln_codegen_emit(g, k->kind, &source, k->symbol));
    const char *dump = getenv("KILN_DUMP_CODE");
    if (dump && strcmp(dump, "1") == 0) fprintf(stderr, "[kiln] generated %s:\n%s\n", k->symbol, source);
    void *fn = NULL;
    if (kiln_codegen_find(source, k->symbol, &fn)) {
        k->fn = (kiln_fused_fn)(uintptr_t)fn;
        free(source);
        return KILN_OK;
    }
    pthread_mutex_lock(&waiting.lock);
    if (waiting.n == waiting.cap) {
        int ncap = waiting.cap ? 2 * waiting.cap : 16;
        kiln_fused_kernel **grown = kiln_realloc(waiting.items, sizeof *grown * (size_t)ncap);
        if (grown) waiting.items = grown, waiting.cap = ncap;
    }
    bool queued = waiting.n < waiting.cap;
    if (queued) {
        waiting.items[waiting.n++] = k;
        k->source = source;
        atomic_store(&k->waiting, true);
    }
    pthread_mutex_unlock(&waiting.lock);
    if (!queued) {
        free(source);
        return kiln_error(KILN_ERR_MEMORY, "out of memory preparing a fused kernel");
    }
    return KILN_OK;
}

/* Builds every waiting kernel with one compiler run; those that fail run interpreted. */
static void build_waiting(void) {
    pthread_mutex_lock(&waiting.lock);
    int n = waiting.n;
    const char **sources = kiln_malloc(sizeof(char *) * (size_t)(n ? n : 1));
    const char **symbols = kiln_malloc(sizeof(char *) * (size_t)(n ? n : 1));
    void **fns = kiln_calloc((size_t)(n ? n : 1), sizeof(void *));
    void ***targets = kiln_malloc(sizeof(void **) * (size_t)(n ? n : 1));
    bool ok = sources && symbols && fns && targets, later = false, cached = false;
    for (int i = 0; i < n && ok; i++) {
        sources[i] = waiting.items[i]->source, symbols[i] = waiting.items[i]->symbol;
        targets[i] = (void **)&waiting.items[i]->fn;
    }
    if (ok && n > 0 && kiln_codegen_background() && !(cached = kiln_codegen_load_cached(n, sources, symbols, fns))) {
        /* the builder thread stores each k->fn; they run interpreted until then */
        later = kiln_codegen_load_later(n, sources, symbols, targets) == KILN_OK;
        if (!later) kiln_clear_error(); /* built here, as without background builds */
    }
    if (ok && n > 0 && !later && !cached && kiln_codegen_load_many(n, sources, symbols, fns) != KILN_OK) {
        memset(fns, 0, sizeof(void *) * (size_t)n);
        kiln_clear_error(); /* the driver warned once */
    }
    for (int i = 0; i < n; i++) {
        kiln_fused_kernel *k = waiting.items[i];
        if (!later) k->fn = ok ? (kiln_fused_fn)(uintptr_t)fns[i] : NULL;
        free(k->source);
        k->source = NULL;
        atomic_store(&k->waiting, false);
    }
    waiting.n = 0;
    pthread_mutex_unlock(&waiting.lock);
    free(sources), free(symbols), free(fns), free(targets);
}

void kiln_fused_build_waiting(void) { build_waiting(); }

static void build_if_waiting(kiln_fused_kernel *k) {
    if (atomic_load(&k->waiting)) build_waiting();
}

static const kiln_fused_interpreter *interpreter;

void kiln_fused_register_interpreter(const kiln_fused_interpreter *i) { interpreter = i; }

static kiln_status ensure_interp(kiln_fused_kernel *k) {
    if (!interpreter) return kiln_error(KILN_ERR_RUNTIME, "fused: no interpreter registered for fused groups");
    pthread_mutex_lock(&k->lock);
    kiln_status s = k->interp ? KILN_OK : interpreter->prepare(k->sub, &k->interp);
    pthread_mutex_unlock(&k->lock);
    return s;
}

kiln_status kiln_fused_prepare(const kiln_graph *sub, kiln_fused_kernel **out) {
    return kiln_fused_prepare_strided(sub, NULL, out);
}

/* A kernel over a copy of sub, nothing prepared yet. */
static kiln_status kernel_new(const kiln_graph *sub, kiln_fused_kernel **out) {
    kiln_fused_kernel *k = kiln_calloc(1, sizeof *k);
    if (!k) return kiln_error(KILN_ERR_MEMORY, "out of memory preparing a fused kernel");
    pthread_mutex_init(&k->lock, NULL);
    atomic_init(&k->waiting, false);
    kiln_status s = kiln_graph_clone(sub, &k->sub);
    if (s == KILN_OK) s = kiln_graph_verify(k->sub);
    if (s == KILN_OK && sub->noutputs != 1)
        s = kiln_error(KILN_ERR_VALUE, "fused: a fused group has one output, this subgraph has %d", sub->noutputs);
    if (s != KILN_OK) {
        kiln_fused_free(k);
        return s;
    }
    k->nops = 1 + sub->ninputs;
    *out = k;
    return KILN_OK;
}

kiln_status kiln_fused_rebind(kiln_fused_kernel *from, const kiln_graph *sub, const int64_t *const *in_strides,
                              kiln_fused_kernel **out) {
    build_if_waiting(from);
    kiln_fused_kernel *k = NULL;
    KILN_TRY(kernel_new(sub, &k));
    kiln_fused_fn from_fn = __atomic_load_n(&from->fn, __ATOMIC_ACQUIRE);
    if (from_fn && k->nops == from->nops) {
        plan_layouts(k, in_strides);
        bool same = k->rows == from->rows && k->snd == from->snd; /* the same code when every operand moves the same way */
        for (int op = 0; op < k->nops && same; op++) same = k->kind[op] == from->kind[op];
        if (same) {
            k->fn = from_fn;
            memcpy(k->symbol, from->symbol, sizeof k->symbol);
            *out = k;
            return KILN_OK;
        }
    }
    kiln_fused_free(k);
    return kiln_fused_prepare_strided(sub, in_strides, out); /* other code (or none): made as for a new group */
}

kiln_status kiln_fused_prepare_strided(const kiln_graph *sub, const int64_t *const *in_strides, kiln_fused_kernel **out) {
    kiln_fused_kernel *k = NULL;
    KILN_TRY(kernel_new(sub, &k));
    kiln_status s = KILN_OK;
    bool native = !codegen_disabled() && k->nops <= MAX_OPERANDS && kiln_codegen_supports(sub) &&
                  kiln_codegen_available();
    if (native && prepare_native(k, in_strides) != KILN_OK) {
        native = false;
        if (kiln_last_error()[0]) kiln_clear_error(); /* the driver warned once; run interpreted */
    }
    if (!native && !kiln_graph_is_symbolic(sub)) s = ensure_interp(k); /* a symbolic group: at its bindings */
    if (s != KILN_OK) {
        kiln_fused_free(k);
        return s;
    }
    *out = k;
    return KILN_OK;
}

bool kiln_fused_is_native(kiln_fused_kernel *k) {
    if (!k) return false;
    build_if_waiting(k);
    return __atomic_load_n(&k->fn, __ATOMIC_ACQUIRE) != NULL;
}

/* Binds the call's tensors; false when their layouts do not fit the generated code even after
 * copying inputs to contiguous (copies land in tmp, released by the caller). */
static kiln_status bind(kiln_fused_kernel *k, kiln_tensor *const *in, kiln_tensor *out, kiln_tensor **tmp,
                        loop_plan *p, char **ptrs, bool *fits) {
    int64_t strides[MAX_OPERANDS][KILN_MAX_DIMS];
    *fits = false;
    for (int attempt = 0; attempt < 2; attempt++) {
        output_strides(k, &out->meta, out->strides, strides[0]);
        ptrs[0] = out->data;
        for (int i = 0; i + 1 < k->nops; i++) {
            kiln_tensor *t = tmp[i] ? tmp[i] : in[i];
            kiln_broadcast_strides(t, k->snd, k->sshape, strides[1 + i]);
            ptrs[1 + i] = t->data;
        }
        plan_loop(p, k->rows, k->nops, k->itemsize, strides, k->snd, k->sshape);
        bool ok = true, copied = false;
        for (int op = 0; op < k->nops; op++) {
            if (kind_fits(k, op, p->st[op][p->ndim - 1])) continue;
            ok = false;
            if (op == 0 || tmp[op - 1] || attempt > 0) continue;
            KILN_TRY(kiln_to_contiguous(in[op - 1], in[op - 1]->meta.dtype, &tmp[op - 1]));
            copied = true;
        }
        if (ok) {
            *fits = true;
            return KILN_OK;
        }
        if (!copied) break;
    }
    return KILN_OK;
}

kiln_status kiln_fused_run(kiln_fused_kernel *k, int nin, kiln_tensor *const *in, kiln_tensor *out) {
    const kiln_graph *g = k->sub;
    build_if_waiting(k);
    if (nin != g->ninputs)
        return kiln_error(KILN_ERR_VALUE, "fused: the group takes %d inputs, got %d", g->ninputs, nin);
    kiln_fused_fn fn = __atomic_load_n(&k->fn, __ATOMIC_ACQUIRE); /* a background build stores it */
    bool native = fn != NULL && kiln_meta_equal(&out->meta, &g->values[g->outputs[0]].meta);
    for (int i = 0; i < nin && native; i++) {
        const kiln_meta *m = &g->values[g->inputs[i]].meta;
        native = kiln_meta_equal(&in[i]->meta, m) &&
                 !kiln_tensor_same_storage(in[i], out); /* the kernel writes as it reads */
    }
    if (native && k->contiguous_fits && kiln_tensor_is_contiguous(out)) { /* the plan made at prepare time */
        bool contiguous = true;
        for (int i = 0; i < nin && contiguous; i++) contiguous = kiln_tensor_is_contiguous(in[i]);
        if (contiguous) {
            char *ptrs[MAX_OPERANDS];
            ptrs[0] = out->data;
            for (int i = 0; i < nin; i++) ptrs[1 + i] = in[i]->data;
            if (out->numel > 0) fn(ptrs, k->contiguous.ndim, k->contiguous.shape, &k->contiguous.st[0][0]);
            return KILN_OK;
        }
    }
    if (native) {
        kiln_tensor *tmp[MAX_OPERANDS] = {0};
        char *ptrs[MAX_OPERANDS];
        loop_plan p;
        bool fits;
        kiln_status s = bind(k, in, out, tmp, &p, ptrs, &fits);
        if (s == KILN_OK && fits && out->numel > 0) fn(ptrs, p.ndim, p.shape, &p.st[0][0]);
        kiln_release_all(tmp, nin);
        if (s != KILN_OK || fits) return s;
    }
    KILN_TRY(ensure_interp(k));
    return interpreter->run(k->interp, nin, in, out);
}

void kiln_fused_free(kiln_fused_kernel *k) {
    if (!k) return;
    kiln_codegen_forget((void **)&k->fn); /* a background build never writes it after this */
    pthread_mutex_lock(&waiting.lock);
    for (int i = 0; i < waiting.n; i++)
        if (waiting.items[i] == k) waiting.items[i--] = waiting.items[--waiting.n];
    pthread_mutex_unlock(&waiting.lock);
    free(k->source);
    if (k->interp) interpreter->free(k->interp);
    kiln_graph_free(k->sub);
    pthread_mutex_destroy(&k->lock);
    free(k);
}

/* ---- the fused groups of a plan: made by the backend that runs it ------------------------------- */

#define FUSED_MAX_INPUTS 32 /* layouts passed to fused kernels (the fusion pass makes no more inputs) */

static _Thread_local int defer_depth; /* kiln_fused_defer_builds: builds wait while > 0 (compiling is single-threaded per plan) */

void kiln_fused_defer_builds(int delta) {
    defer_depth += delta;
    if (defer_depth == 0) build_waiting();
}

kiln_status kiln_fused_plan_kernels(const kiln_plan *p, kiln_fused_kernel *const *from, kiln_fused_kernel ***out) {
    const kiln_graph *g = p->g;
    int32_t nn = g->nnodes;
    kiln_fused_kernel **k = kiln_calloc((size_t)(nn ? nn : 1), sizeof *k);
    if (!k) return kiln_error(KILN_ERR_MEMORY, "out of memory compiling a graph");
    kiln_status s = KILN_OK;
    bool fused = false;
    for (int32_t i = 0; i < nn && s == KILN_OK; i++) {
        const kiln_node *nd = &g->nodes[i];
        if (nd->op != KILN_OP_FUSED) continue;
        kiln_graph *sub;
        s = kiln_graph_body(g, nd, 0, &sub);
        if (s != KILN_OK) {
            s = kiln_error_context(s, "graph: fused node %d", i);
            break;
        }
        int64_t strides[FUSED_MAX_INPUTS][KILN_MAX_DIMS];
        const int64_t *hints[FUSED_MAX_INPUTS]; /* the layouts its inputs have when the graph runs */
        for (int j = 0; j < nd->nin && j < FUSED_MAX_INPUTS; j++)
            hints[j] = kiln_graph_value_strides(g, nd->in[j], strides[j]) ? strides[j] : NULL;
        const int64_t *const *layouts = nd->nin <= FUSED_MAX_INPUTS ? hints : NULL;
        s = from && from[i] ? kiln_fused_rebind(from[i], sub, layouts, &k[i])
                            : kiln_fused_prepare_strided(sub, layouts, &k[i]);
        fused = true;
    }
    if (s != KILN_OK) {
        kiln_fused_kernels_free(nn, k);
        return s;
    }
    if (fused && defer_depth == 0) build_waiting(); /* the groups build together, now */
    *out = k;
    return KILN_OK;
}

void kiln_fused_kernels_free(int32_t n, kiln_fused_kernel **k) {
    for (int32_t i = 0; k && i < n; i++) kiln_fused_free(k[i]);
    free(k);
}
