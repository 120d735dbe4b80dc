/* The whole-graph "sink" backend: a graph compiled into one generated C function.
 *
 * Preparing reads the plan every backend runs (order, arena, prepared fused groups;
 * src/plan/plan.h) and makes every tensor the graph touches once, by a dry run over the
 * order: intermediates are the arena's tensors (or buffers of their own where the plan has none),
 * views are made by running the view kernels on them, in-place ops alias their input. Only the
 * memory of a call changes from call to call: the inputs' (the caller's tensors) and the
 * outputs' (allocated per call, handed out). Values living in them are "dynamic": their tensors
 * are bound per call (views re-made at the layout the dry run found). Everything else is bound once.
 *
 * The steps (src/codegen/sink_steps.h) become one C function (src/codegen/emit_graph.c) compiled
 * through the codegen driver (same disk cache) and loaded; without a compiler, or with
 * KILN_DISABLE_CODEGEN=1, an interpreted loop runs the same steps.
 *
 * Both check for an interrupt request (kiln_interrupt) before each step.
 *
 * The dry run fixes the inputs' layouts: contiguous. An input arriving in another layout is
 * copied to a contiguous tensor, unless the graph writes it in place or returns it (then that
 * call runs on the kernel-by-kernel backend, prepared over the same plan and arena). Graphs with
 * control-flow nodes run kernel by kernel on every call (their bodies are executables, not kernels
 * a generated function could call). */
#include <pthread.h>

#include "../codegen/codegen.h"
#include "../codegen/sink_steps.h"
#include "../ir/control.h"
#include "../ops/view.h"
#include "backend.h"
#include "kbk.h"
#include "profile_node.h"
#include "weight_cache.h"

typedef enum { BOUND_ONCE, DYN_INPUT, DYN_OUTPUT_ROOT, DYN_VIEW, DYN_SAME_AS } value_binding;

typedef struct kiln_sink kiln_sink;

struct kiln_sink {
    const kiln_plan *p;
    kiln_tensor *const *planned;    /* per value: its tensor over the plan's arena, or NULL */
    int32_t *const *poison_after;   /* per step: the plan's freed buffers, when poisoning; else NULL */
    void *kbk;            /* the kbk backend over the same plan and arena: calls the sink does not serve */
    kiln_fused_kernel **kernel; /* per node: the kernel of a fused group (kbk's too), or NULL */
    const kiln_graph *g;  /* the plan's graph */
    int32_t nv;
    kiln_tensor **own;    /* per value: the tensor made at compile time (a reference; placeholders for dynamic ones) */
    kiln_tensor **t;      /* per value: the tensor of the current call (own[v] between calls) */
    char **d;             /* per value: t[v]->data */
    int32_t *root;        /* per value: the value whose buffer it lives in */
    int32_t *same_as;     /* per value: the value whose tensor it is (in-place results), or -1 */
    int64_t *view_offset; /* per value: DYN_VIEW: its offset relative to its root's */
    uint8_t *binding;     /* per value: value_binding */
    int32_t *dyn, ndyn;   /* the values bound per call other than inputs, in the order they are made */
    bool *pinned;         /* per input: written in place or returned: its layout cannot be changed by a copy */
    kiln_sink_step *steps;
    int32_t nsteps;
    kiln_kernel_fn *kernels;
    const kiln_attrs **attrs;
    void **fused;
    kiln_fused_fn *group_fns; /* per step: a native fused group's loaded kernel, or NULL */
    const int64_t **shp, **str; /* per step: a native loop's sizes and byte strides, or NULL */
    kiln_sink_env env;
    kiln_weight_cache *weights; /* the plan's weight casts, run at the start of a call (not steps) when not kept */
    kiln_sink_fn fn;      /* NULL: interpreted */
    int64_t fallbacks;
    bool via_kbk; /* the graph has control-flow nodes: every call runs on the executor (their subgraphs are
                   * compiled executables, not kernels a generated function could call) */
    pthread_mutex_t lock; /* one call at a time: the tensors and the arena are shared */
};

static bool is_dynamic(const kiln_sink *s, int32_t v) { return s->binding[s->root[v]] != BOUND_ONCE; }

static bool codegen_disabled(void) {
    const char *v = getenv("KILN_DISABLE_CODEGEN");
    return v && *v && strcmp(v, "0") != 0;
}

/* ---- environment functions called by the generated code ------------------------------------- */

static kiln_status env_fused_run(void *k, int nin, kiln_tensor *const *in, kiln_tensor *out) {
    return kiln_fused_run(k, nin, in, out);
}

/* dst (contiguous, the reshape's shape) = src's elements in row-major order. */
static kiln_status env_reshape_copy(kiln_tensor *src, kiln_tensor *dst) {
    kiln_tensor *flat = NULL;
    KILN_TRY(kiln_tensor_view(dst, src->meta.ndim, src->meta.shape, NULL, dst->offset, &flat));
    kiln_status s = kiln_copy_into(flat, src);
    kiln_tensor_release(flat);
    return s;
}

static void env_poison(kiln_tensor *t) {
    if (kiln_dtype_is_float(t->meta.dtype)) memset(t->data, 0xff, (size_t)t->numel * kiln_dtype_size(t->meta.dtype));
}

/* ---- compiling: the dry run ---------------------------------------------------------------- */

static kiln_status alloc_arrays(kiln_sink *s) {
    int32_t nv = s->nv ? s->nv : 1, nn = s->g->nnodes ? s->g->nnodes : 1;
    s->own = kiln_calloc((size_t)nv, sizeof *s->own);
    s->t = kiln_calloc((size_t)nv, sizeof *s->t);
    s->d = kiln_calloc((size_t)nv, sizeof *s->d);
    s->root = kiln_malloc(sizeof *s->root * (size_t)nv);
    s->same_as = kiln_malloc(sizeof *s->same_as * (size_t)nv);
    s->view_offset = kiln_calloc((size_t)nv, sizeof *s->view_offset);
    s->binding = kiln_calloc((size_t)nv, sizeof *s->binding);
    s->dyn = kiln_malloc(sizeof *s->dyn * (size_t)nv);
    s->pinned = kiln_calloc((size_t)(s->g->ninputs ? s->g->ninputs : 1), sizeof *s->pinned);
    s->steps = kiln_calloc((size_t)nn, sizeof *s->steps);
    s->kernels = kiln_calloc((size_t)nn, sizeof *s->kernels);
    s->attrs = kiln_calloc((size_t)nn, sizeof *s->attrs);
    s->fused = kiln_calloc((size_t)nn, sizeof *s->fused);
    s->group_fns = kiln_calloc((size_t)nn, sizeof *s->group_fns);
    s->shp = kiln_calloc((size_t)nn, sizeof *s->shp);
    s->str = kiln_calloc((size_t)nn, sizeof *s->str);
    if (!s->group_fns || !s->shp || !s->str || !s->own || !s->t || !s->d || !s->root || !s->same_as || !s->view_offset || !s->binding || !s->dyn ||
        !s->pinned || !s->steps || !s->kernels || !s->attrs || !s->fused)
        return kiln_error(KILN_ERR_MEMORY, "out of memory compiling a graph for the sink backend");
    for (int32_t v = 0; v < s->nv; v++) s->root[v] = v, s->same_as[v] = -1;
    return KILN_OK;
}

static void set_tensor(kiln_sink *s, int32_t v, kiln_tensor *t) { /* takes the reference */
    s->own[v] = s->t[v] = t;
    s->d[v] = t->data;
}

/* Makes the tensors of node i's outputs and its step (or none, for a view). */
static kiln_status dry_run_node(kiln_sink *s, int32_t pos, int32_t i) {
    const kiln_graph *g = s->g;
    const kiln_node *nd = &g->nodes[i];
    const kiln_op_info *info = &kiln_op_table[nd->op];
    kiln_tensor *small[8], **ins = nd->nin <= 8 ? small : kiln_malloc(sizeof *ins * (size_t)nd->nin);
    if (!ins) return kiln_error(KILN_ERR_MEMORY, "out of memory compiling a graph for the sink backend");
    for (int k = 0; k < nd->nin; k++) ins[k] = s->t[nd->in[k]];
    kiln_sink_step step = {.kind = KILN_SINK_KERNEL, .node = i, .nin = nd->nin, .nout = nd->nout, .in = nd->in};
    memcpy(step.out, nd->out, sizeof step.out);
    kiln_status st = KILN_OK;
    bool has_step = true;
    int64_t view[KILN_MAX_DIMS];
    if (nd->op == KILN_OP_RESHAPE && !kiln_view_strides(nd->op, &nd->attrs, &ins[0]->meta, ins[0]->strides, view)) {
        kiln_tensor *out = NULL; /* a copy each call: its buffer, not filled now (the kernel would copy) */
        st = kiln_tensor_empty(ins[0]->meta.dtype, nd->attrs.ni, nd->attrs.i, &out);
        if (st == KILN_OK) set_tensor(s, nd->out[0], out);
        step.kind = KILN_SINK_RESHAPE_COPY;
    } else if (info->flags & KILN_OPF_VIEW) {
        kiln_tensor *out[KILN_MAX_OUTPUTS] = {0};
        st = info->kernel(ins, nd->nin, &nd->attrs, out);
        if (st == KILN_OK) {
            set_tensor(s, nd->out[0], out[0]);
            if (kiln_tensor_same_storage(out[0], ins[0])) {
                s->root[nd->out[0]] = s->root[nd->in[0]];
                has_step = false;
            } else if (nd->op == KILN_OP_RESHAPE) { /* its input's layout asks for a copy: one each call */
                step.kind = KILN_SINK_RESHAPE_COPY;
            } else {
                st = kiln_error(KILN_ERR_NOT_IMPLEMENTED, "sink: %s made a copy where a view was expected", info->name);
            }
        }
    } else if (info->flags & KILN_OPF_MUTATES) {
        if (nd->nout != 1) {
            st = kiln_error(KILN_ERR_NOT_IMPLEMENTED, "sink: in-place op %s has %d outputs", info->name, nd->nout);
        } else {
            kiln_tensor_retain(ins[0]);
            set_tensor(s, nd->out[0], ins[0]);
            s->root[nd->out[0]] = s->root[nd->in[0]];
            s->same_as[nd->out[0]] = nd->in[0];
            step.kind = KILN_SINK_MUTATES;
        }
    } else {
        for (int k = 0; k < nd->nout && st == KILN_OK; k++) {
            int32_t v = nd->out[k];
            kiln_tensor *t = s->planned[v];
            if (t) kiln_tensor_retain(t);
            else st = kiln_tensor_empty_like_meta(&g->values[v].meta, &t); /* the output of a call, or unplanned */
            if (st == KILN_OK) set_tensor(s, v, t);
        }
        if (s->kernel[i]) {
            step.kind = KILN_SINK_FUSED;
            step.fused = s->kernel[i];
        }
        if (kiln_plan_is_weight_cast(s->p, i)) has_step = false; /* run_locked runs it, or keeps it */
    }
    if (ins != small) free(ins);
    if (st != KILN_OK) return st;
    const int32_t *freed = s->poison_after ? s->poison_after[pos] : NULL;
    if (!has_step && !freed) return KILN_OK;
    if (!has_step) step.kind = KILN_SINK_VIEW;
    step.poison_after = freed;
    int32_t n = s->nsteps++;
    s->steps[n] = step;
    s->kernels[n] = info->kernel;
    s->attrs[n] = &nd->attrs;
    s->fused[n] = step.fused;
    return KILN_OK;
}

/* Which values are bound per call, and how. */
static void classify(kiln_sink *s) {
    const kiln_graph *g = s->g;
    for (int32_t k = 0; k < g->ninputs; k++) s->binding[g->inputs[k]] = DYN_INPUT;
    for (int32_t k = 0; k < g->noutputs; k++) {
        int32_t r = s->root[g->outputs[k]];
        if (g->values[r].kind == KILN_VALUE_NODE) {
            KILN_ASSERT(!s->planned[r]); /* results never live in the arena */
            s->binding[r] = DYN_OUTPUT_ROOT;
        }
        if (g->values[r].kind == KILN_VALUE_INPUT) s->pinned[g->values[r].index] = true;
    }
    for (int32_t p = 0; p < s->p->norder; p++) {
        const kiln_node *nd = &g->nodes[s->p->order[p]];
        uint64_t flags = kiln_op_table[nd->op].flags;
        for (int k = 0; k < nd->nin && k < 8; k++) {
            int32_t r = s->root[nd->in[k]];
            bool writes = (flags & KILN_OPF_WRITES_INPUT(k)) || (k == 0 && (flags & KILN_OPF_MUTATES));
            if (writes && g->values[r].kind == KILN_VALUE_INPUT) s->pinned[g->values[r].index] = true;
        }
        for (int k = 0; k < nd->nout; k++) {
            int32_t v = nd->out[k], r = s->root[v];
            if (v == r) {
                if (s->binding[v] == DYN_OUTPUT_ROOT) s->dyn[s->ndyn++] = v;
                continue;
            }
            if (s->binding[r] == BOUND_ONCE) continue;
            if (s->same_as[v] >= 0) {
                s->binding[v] = DYN_SAME_AS;
            } else {
                s->binding[v] = DYN_VIEW;
                s->view_offset[v] = s->own[v]->offset - s->own[r]->offset;
            }
            s->dyn[s->ndyn++] = v;
        }
    }
}

/* Once the layouts are known, the dry run's tensors of dynamic values give their memory back:
 * layout-only tensors (no data) stand in for them between calls. */
static kiln_status drop_placeholders(kiln_sink *s) {
    for (int32_t v = 0; v < s->nv; v++) {
        if (!is_dynamic(s, v)) continue;
        const kiln_tensor *t = s->own[v];
        kiln_tensor *shape_only = NULL;
        KILN_TRY(kiln_tensor_wrap(t->meta.dtype, t->meta.ndim, t->meta.shape, t->strides, NULL, NULL, NULL, &shape_only));
        kiln_tensor_release(s->own[v]);
        set_tensor(s, v, shape_only);
    }
    return KILN_OK;
}

/* Element strides of operand t broadcast over the output's shape, merged into the fewest axes
 * (as the fused kernels plan their loops); false when an inner stride is neither 0 nor one item. */
static bool plan_fused_loop(kiln_sink *s, kiln_sink_step *st, int8_t *kind) {
    const kiln_tensor *out = s->own[st->out[0]];
    int nops = 1 + st->nin, ndim = out->meta.ndim;
    int64_t strides[KILN_SINK_MAX_OPERANDS][KILN_MAX_DIMS];
    size_t item[KILN_SINK_MAX_OPERANDS];
    memcpy(strides[0], out->strides, sizeof(int64_t) * (size_t)ndim);
    item[0] = kiln_dtype_size(out->meta.dtype);
    for (int k = 0; k < st->nin; k++) {
        const kiln_tensor *in = s->own[st->in[k]];
        kiln_broadcast_strides(in, ndim, out->meta.shape, strides[1 + k]);
        item[1 + k] = kiln_dtype_size(in->meta.dtype);
    }
    int nd = 0;
    for (int d = 0; d < ndim; d++) {
        int64_t n = out->meta.shape[d];
        if (n == 1) continue;
        bool merge = nd > 0;
        for (int k = 0; k < nops && merge; k++) merge = st->st[k * KILN_MAX_DIMS + nd - 1] == strides[k][d] * n * (int64_t)item[k];
        if (merge) {
            st->shape[nd - 1] *= n;
            for (int k = 0; k < nops; k++) st->st[k * KILN_MAX_DIMS + nd - 1] = strides[k][d] * (int64_t)item[k];
            continue;
        }
        st->shape[nd] = n;
        for (int k = 0; k < nops; k++) st->st[k * KILN_MAX_DIMS + nd] = strides[k][d] * (int64_t)item[k];
        nd++;
    }
    if (nd == 0) {
        st->shape[0] = 1;
        for (int k = 0; k < nops; k++) st->st[k * KILN_MAX_DIMS] = 0;
        nd = 1;
    }
    st->ndim = nd;
    for (int k = 0; k < nops; k++) {
        int64_t inner = st->st[k * KILN_MAX_DIMS + nd - 1];
        if (inner != 0 && inner != (int64_t)item[k]) return false;
        kind[k] = inner != 0 ? KILN_INNER_UNIT : KILN_INNER_FIXED;
    }
    return kind[0] == KILN_INNER_FIXED ? out->numel <= 1 : true;
}

/* A step whose elementwise subgraph the C emitter handles, over layouts it was made for, runs its
 * generated loop straight from the graph's function (no kiln_fused_run checks, no kernel call).
 * exact_only: only when that loop computes what the kernels do, bit for bit: code that needs none
 * of the emitter's optional prelude (its libm name mapping; float32 exp, erf, tanh and log are
 * the kernels' own, src/core/approx_f32.h). */
static kiln_status prepare_native_loop(kiln_sink *s, kiln_sink_step *st, const kiln_graph *sub, bool exact_only) {
    /* row kernels (reductions) walk their own space: they run as the plan prepared them */
    if (1 + st->nin > KILN_SINK_MAX_OPERANDS || !kiln_codegen_supports(sub) || kiln_codegen_has_rows(sub)) return KILN_OK;
    st->st = kiln_calloc((size_t)(1 + st->nin) * KILN_MAX_DIMS, sizeof(int64_t));
    if (!st->st) return kiln_error(KILN_ERR_MEMORY, "out of memory compiling a graph for the sink backend");
    if (!plan_fused_loop(s, st, st->inner)) return KILN_OK;
    kiln_status r = kiln_codegen_emit(sub, st->inner, &st->source, st->symbol);
    if (r == KILN_ERR_NOT_IMPLEMENTED) {
        kiln_clear_error();
        return KILN_OK;
    }
    if (r == KILN_OK && exact_only && strstr(st->source, "#define KILN_PRELUDE_")) {
        free(st->source);
        st->source = NULL;
        return KILN_OK;
    }
    st->native = r == KILN_OK;
    void *fn = NULL;
    if (st->native && kiln_codegen_find(st->source, st->symbol, &fn)) st->loaded = (kiln_fused_fn)(uintptr_t)fn;
    return r;
}

/* A lone elementwise node (any level; all of them at O0) as a one-node group, when exact. */
static kiln_status prepare_native_node(kiln_sink *s, kiln_sink_step *st) {
    const kiln_node *nd = &s->g->nodes[st->node];
    const kiln_op_info *info = &kiln_op_table[nd->op];
    if (info->fusion != KILN_FUSE_ELEMENTWISE || !info->c_expr || nd->nout != 1 || 1 + nd->nin > KILN_SINK_MAX_OPERANDS ||
        (info->flags & (KILN_OPF_VIEW | KILN_OPF_MUTATES | KILN_OPF_RANDOM | KILN_OPF_WRITES_ANY)))
        return KILN_OK;
    kiln_graph *sub = NULL;
    int32_t ins[KILN_SINK_MAX_OPERANDS], o;
    kiln_status r = kiln_graph_new(&sub);
    for (int k = 0; k < nd->nin && r == KILN_OK; k++) r = kiln_graph_add_input(sub, &s->g->values[nd->in[k]].meta, &ins[k]);
    if (r == KILN_OK) r = kiln_graph_add_node(sub, nd->op, nd->nin, ins, &nd->attrs, -1, &o);
    if (r == KILN_OK) r = kiln_graph_set_outputs(sub, 1, &o);
    if (r == KILN_OK) r = prepare_native_loop(s, st, sub, true);
    kiln_graph_free(sub);
    return r;
}

static kiln_status generate(kiln_sink *s) {
    if (codegen_disabled() || !kiln_codegen_available()) return KILN_OK; /* the driver warned once */
    for (int32_t i = 0; i < s->nsteps; i++) {
        kiln_sink_step *st = &s->steps[i];
        if (st->kind == KILN_SINK_FUSED) {
            kiln_graph *sub;
            KILN_TRY(kiln_graph_body(s->g, &s->g->nodes[st->node], 0, &sub));
            KILN_TRY(prepare_native_loop(s, st, sub, false));
        } else if (st->kind == KILN_SINK_KERNEL)
            KILN_TRY(prepare_native_node(s, st));
        s->group_fns[i] = st->loaded;
        if (st->native) s->shp[i] = st->shape, s->str[i] = st->st;
    }
    char *source = NULL, symbol[48];
    KILN_TRY(kiln_sink_emit(s->g, s->steps, s->nsteps, &source, symbol));
    const char *dump = getenv("KILN_DUMP_CODE");
    if (dump && strcmp(dump, "1") == 0) fprintf(stderr, "[kiln] generated %s:\n%s\n", symbol, source);
    void *fn = NULL;
    kiln_status r;
    const char *sym = symbol;
    if (kiln_codegen_background() && !kiln_codegen_load_cached(1, (const char *const *)&source, &sym, &fn)) {
        /* built by the background builder: the steps run interpreted until it stores s->fn */
        void **target = (void **)&s->fn;
        r = kiln_codegen_load_later(1, (const char *const *)&source, &sym, &target);
        free(source);
        return r;
    }
    r = fn ? KILN_OK : kiln_codegen_load(source, symbol, &fn);
    free(source);
    if (r == KILN_ERR_MEMORY) return r;
    if (r != KILN_OK) { /* the driver warned once: the steps run interpreted */
        kiln_clear_error();
        return KILN_OK;
    }
    s->fn = (kiln_sink_fn)(uintptr_t)fn;
    return KILN_OK;
}

/* ---- bindings of a symbolic plan: the code of an earlier binding, called with these sizes ---------- */

/* What a sink keeps of the code it generated for one binding (kiln_backend.prepare_bound). */
typedef struct {
    kiln_sink_fn fn;
    int32_t nsteps;
    kiln_sink_step *steps; /* kind, node, native, ndim, inner and loaded of each (nothing owned) */
    void *groups;          /* the fused groups' kernels (kbk's memo: kiln_kbk_keep_memo) */
} sink_memo;

static void free_memo(void *memo) {
    sink_memo *m = memo;
    if (m) free(m->steps), kiln_backend_kbk.free_memo(m->groups);
    free(m);
}

static kiln_status keep_memo(const kiln_sink *s, void **memo) {
    sink_memo *m = kiln_calloc(1, sizeof *m);
    if (!m || !(m->steps = kiln_malloc(sizeof *m->steps * (size_t)(s->nsteps ? s->nsteps : 1)))) {
        free(m);
        return kiln_error(KILN_ERR_MEMORY, "out of memory compiling a graph for the sink backend");
    }
    sink_memo *old = *memo;
    if (old) m->groups = old->groups, old->groups = NULL; /* the groups' code of the first binding stays */
    kiln_status st = kiln_kbk_keep_memo(s->p, s->kernel, &m->groups);
    if (st != KILN_OK) {
        free_memo(m);
        return st;
    }
    m->fn = __atomic_load_n(&s->fn, __ATOMIC_ACQUIRE);
    m->nsteps = s->nsteps;
    for (int32_t i = 0; i < s->nsteps; i++) {
        m->steps[i] = s->steps[i];
        m->steps[i].source = NULL, m->steps[i].st = NULL, m->steps[i].in = NULL, m->steps[i].fused = NULL;
        m->steps[i].poison_after = NULL;
    }
    free_memo(*memo);
    *memo = m;
    return KILN_OK;
}

/* Takes m's code when s's steps are m's (same kinds and nodes, native loops over the same number of
 * axes with operands moving the same way, at s's sizes); false (nothing taken) otherwise. */
static kiln_status reuse_memo(kiln_sink *s, const sink_memo *m, bool *reused) {
    *reused = false;
    if (!m || m->nsteps != s->nsteps || s->poison_after) return KILN_OK;
    /* code still building in the background when the memo was kept: generated again (found in
     * memory once built), so this binding is not left interpreted */
    if (!m->fn && kiln_codegen_background()) return KILN_OK;
    for (int32_t i = 0; i < s->nsteps; i++)
        if (s->steps[i].kind != m->steps[i].kind || s->steps[i].node != m->steps[i].node) return KILN_OK;
    for (int32_t i = 0; i < s->nsteps; i++) {
        kiln_sink_step *st = &s->steps[i];
        const kiln_sink_step *was = &m->steps[i];
        if (!was->native) continue;
        if (!st->st && !(st->st = kiln_calloc((size_t)(1 + st->nin) * KILN_MAX_DIMS, sizeof(int64_t))))
            return kiln_error(KILN_ERR_MEMORY, "out of memory compiling a graph for the sink backend");
        if (!plan_fused_loop(s, st, st->inner) || st->ndim != was->ndim ||
            memcmp(st->inner, was->inner, (size_t)(1 + st->nin)) != 0)
            return KILN_OK;
    }
    for (int32_t i = 0; i < s->nsteps; i++) {
        kiln_sink_step *st = &s->steps[i];
        const kiln_sink_step *was = &m->steps[i];
        st->native = was->native;
        st->loaded = was->loaded;
        memcpy(st->symbol, was->symbol, sizeof st->symbol);
        s->group_fns[i] = st->loaded;
        if (st->native) s->shp[i] = st->shape, s->str[i] = st->st;
    }
    s->fn = m->fn;
    *reused = true;
    return KILN_OK;
}

static void sink_free(void *state) {
    kiln_sink *s = state;
    if (!s) return;
    kiln_codegen_forget((void **)&s->fn); /* a background build never writes it after this */
    for (int32_t v = 0; s->own && v < s->nv; v++) kiln_tensor_release(s->own[v]);
    for (int32_t i = 0; s->steps && i < s->nsteps; i++) free(s->steps[i].source), free(s->steps[i].st);
    free(s->own), free(s->t), free(s->d), free(s->root), free(s->same_as), free(s->view_offset), free(s->binding);
    free(s->dyn), free(s->pinned), free(s->steps), free(s->kernels), free(s->attrs), free(s->fused);
    free(s->group_fns), free(s->shp), free(s->str);
    if (s->kbk) kiln_backend_kbk.free(s->kbk);
    kiln_fused_kernels_free(s->g ? s->g->nnodes : 0, s->kernel);
    kiln_weight_cache_free(s->weights);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

static kiln_status sink_prepare_memo(const kiln_plan *p, kiln_plan_memory *mem, void **memo, void **state) {
    kiln_sink *s = kiln_calloc(1, sizeof *s);
    if (!s) return kiln_error(KILN_ERR_MEMORY, "out of memory compiling a graph for the sink backend");
    pthread_mutex_init(&s->lock, NULL);
    s->p = p;
    s->planned = mem->planned;
    s->poison_after = p->poison ? p->freed_after : NULL;
    s->g = p->g;
    s->nv = s->g->nvalues;
    /* the fused groups' kernels (an earlier binding's code where it fits), which kbk runs too */
    const sink_memo *was = memo ? *memo : NULL;
    kiln_fused_defer_builds(+1);
    kiln_status st = kiln_fused_plan_kernels(p, was ? kiln_kbk_memo_kernels(was->groups, p) : NULL, &s->kernel);
    if (st == KILN_OK) st = kiln_kbk_prepare_with(p, mem, s->kernel, &s->kbk);
    kiln_fused_defer_builds(-1);
    if (st == KILN_OK) st = alloc_arrays(s);
    const kiln_graph *pg = s->g;
    for (int32_t i = 0; st == KILN_OK && i < pg->nnodes; i++) s->via_kbk |= kiln_op_is_control(pg->nodes[i].op);
    if (st == KILN_OK && s->via_kbk) {
        *state = s;
        return KILN_OK;
    }
    if (st == KILN_OK) st = kiln_weight_cache_new(p, &s->weights);
    for (int32_t k = 0; st == KILN_OK && k < pg->ninputs; k++) { /* placeholders: the layouts of the dry run */
        kiln_tensor *t = NULL;
        st = kiln_tensor_empty_like_meta(&pg->values[pg->inputs[k]].meta, &t);
        if (st == KILN_OK) set_tensor(s, pg->inputs[k], t);
    }
    for (int32_t c = 0; st == KILN_OK && c < pg->ncaptures; c++) {
        kiln_tensor *t = pg->values[pg->captures[c]].bound;
        kiln_tensor_retain(t);
        set_tensor(s, pg->captures[c], t);
    }
    for (int32_t k = 0; st == KILN_OK && k < p->norder; k++) st = dry_run_node(s, k, p->order[k]);
    if (st == KILN_OK) {
        classify(s);
        st = drop_placeholders(s);
    }
    if (st == KILN_OK) {
        s->env = (kiln_sink_env){.t = s->t, .d = s->d, .k = s->kernels, .a = s->attrs, .fk = s->fused,
                                 .gf = s->group_fns, .shp = s->shp, .str = s->str, .fused_run = env_fused_run, .reshape_copy = env_reshape_copy,
                                 .release = kiln_tensor_release, .bump = kiln_tensor_bump_version,
                                 .poison = env_poison, .stop = (const volatile int *)&kiln_interrupt_flag,
                                 .interrupted = kiln_interrupt_status};
        bool reused = false;
        if (memo) st = reuse_memo(s, *memo, &reused);
        if (st == KILN_OK && !reused) {
            st = generate(s);
            if (st == KILN_OK && memo && !s->poison_after) st = keep_memo(s, memo);
        }
    }
    if (st != KILN_OK) {
        sink_free(s);
        return st;
    }
    *state = s;
    return KILN_OK;
}

static kiln_status sink_prepare(const kiln_plan *p, kiln_plan_memory *mem, void **state) {
    return sink_prepare_memo(p, mem, NULL, state);
}

static bool sink_is_native(const void *state) { return ((const kiln_sink *)state)->fn != NULL; }
static int64_t sink_fallback_calls(const void *state) { return ((const kiln_sink *)state)->fallbacks; }

/* ---- running ---------------------------------------------------------------------------------- */

/* The interpreted path: the steps the generated function would run, in the same order. */
static kiln_status interpret(kiln_sink *s) {
    kiln_tensor *small[16], **ins = small;
    int cap = 16;
    kiln_status st = KILN_OK;
    bool profiling = kiln_profiling();
    for (int32_t i = 0; i < s->nsteps && st == KILN_OK; i++) {
        const kiln_sink_step *step = &s->steps[i];
        if (step->kind != KILN_SINK_VIEW && (st = kiln_check_interrupt()) != KILN_OK) break;
        if (step->nin > cap) {
            kiln_tensor **grown = kiln_malloc(sizeof *grown * (size_t)step->nin);
            if (!grown) {
                st = kiln_error(KILN_ERR_MEMORY, "out of memory running a graph");
                break;
            }
            if (ins != small) free(ins);
            ins = grown, cap = step->nin;
        }
        for (int k = 0; k < step->nin; k++) ins[k] = s->t[step->in[k]];
        kiln_tensor *outs[KILN_MAX_OUTPUTS] = {0};
        int64_t start = profiling && step->kind != KILN_SINK_VIEW ? kiln_profile_begin() : 0;
        switch (step->kind) {
        case KILN_SINK_KERNEL:
            for (int k = 0; k < step->nout; k++) outs[k] = s->t[step->out[k]];
            st = s->kernels[i](ins, step->nin, s->attrs[i], outs);
            break;
        case KILN_SINK_MUTATES:
            st = s->kernels[i](ins, step->nin, s->attrs[i], outs);
            kiln_tensor_release(outs[0]);
            if (st == KILN_OK) kiln_tensor_bump_version(ins[0]);
            break;
        case KILN_SINK_RESHAPE_COPY: st = env_reshape_copy(ins[0], s->t[step->out[0]]); break;
        case KILN_SINK_FUSED: st = kiln_fused_run(step->fused, step->nin, ins, s->t[step->out[0]]); break;
        case KILN_SINK_VIEW: break;
        }
        if (start) {
            kiln_tensor *made[KILN_MAX_OUTPUTS];
            for (int k = 0; k < step->nout; k++) made[k] = s->t[step->out[k]];
            kiln_profile_node(KILN_PROFILE_SINK, s->g, step->node, ins, made, start);
        }
        if (st != KILN_OK) s->env.step = i;
        else if (step->poison_after)
            for (const int32_t *p = step->poison_after; *p >= 0; p++) env_poison(s->t[*p]);
    }
    if (ins != small) free(ins);
    return st;
}

/* Names the failing node: its op, source line and input shapes. */
static kiln_status step_error(kiln_sink *s, kiln_status st) {
    const kiln_sink_step *step = &s->steps[s->env.step];
    const kiln_node *nd = &s->g->nodes[step->node];
    char shapes[512];
    shapes[0] = '\0';
    for (int k = 0, n = 0; k < nd->nin && n < (int)sizeof shapes - 64; k++) {
        char buf[160];
        const kiln_tensor *t = s->t[nd->in[k]];
        n += snprintf(shapes + n, sizeof shapes - (size_t)n, "%s%s %s", k ? ", " : "", kiln_dtype_name(t->meta.dtype),
                      kiln_shape_str(&t->meta, buf, sizeof buf));
    }
    const char *name = kiln_op_table[nd->op].name;
    if (nd->loc >= 0) return kiln_error_context(st, "%s (%s) on %s", name, s->g->locs[nd->loc], shapes);
    return kiln_error_context(st, "%s on %s", name, shapes);
}

/* The plan's weight casts, before the steps (they read captures nothing before them writes), each
 * into its own buffer unless it holds the cast of the capture's current version already. */
static kiln_status run_weight_casts(kiln_sink *s) {
    const kiln_plan *p = s->p;
    bool profiling = kiln_profiling();
    for (int32_t k = 0; k < p->norder; k++) {
        int32_t n = p->order[k];
        if (!kiln_plan_is_weight_cast(p, n)) continue;
        const kiln_node *nd = &s->g->nodes[n];
        kiln_tensor *out = NULL, *src = s->t[nd->in[0]];
        int64_t start = profiling ? kiln_profile_begin() : 0;
        kiln_status st = kiln_weight_cache_run(s->weights, n, src, s->t[nd->out[0]], &out);
        if (start) kiln_profile_node(KILN_PROFILE_SINK, s->g, n, &src, &out, start);
        kiln_tensor_release(out);
        if (st != KILN_OK) {
            if (nd->loc >= 0) return kiln_error_context(st, "%s (%s)", kiln_op_table[nd->op].name, s->g->locs[nd->loc]);
            return kiln_error_context(st, "%s", kiln_op_table[nd->op].name);
        }
    }
    return KILN_OK;
}

/* Puts back the compile-time tensors after a call, releasing what the call made. */
static void unbind(kiln_sink *s, kiln_tensor **copies) {
    const kiln_graph *g = s->g;
    for (int32_t j = 0; j < s->ndyn; j++) {
        int32_t v = s->dyn[j];
        if (s->binding[v] != DYN_SAME_AS && s->t[v] != s->own[v]) kiln_tensor_release(s->t[v]);
        s->t[v] = s->own[v];
        s->d[v] = s->own[v]->data;
    }
    for (int32_t k = 0; k < g->ninputs; k++) {
        int32_t v = g->inputs[k];
        kiln_tensor_release(copies[k]);
        s->t[v] = s->own[v];
        s->d[v] = s->own[v]->data;
    }
}

static kiln_status bind(kiln_sink *s, kiln_tensor *const *inputs, kiln_tensor **copies) {
    const kiln_graph *g = s->g;
    for (int32_t k = 0; k < g->ninputs; k++) {
        kiln_tensor *t = inputs[k];
        if (!kiln_tensor_is_contiguous(t)) {
            KILN_TRY(kiln_to_contiguous(t, t->meta.dtype, &copies[k]));
            t = copies[k];
        }
        s->t[g->inputs[k]] = t;
        s->d[g->inputs[k]] = t->data;
    }
    for (int32_t j = 0; j < s->ndyn; j++) {
        int32_t v = s->dyn[j];
        const kiln_tensor *like = s->own[v];
        switch (s->binding[v]) {
        case DYN_OUTPUT_ROOT: KILN_TRY(kiln_tensor_empty_like_meta(&like->meta, &s->t[v])); break;
        case DYN_SAME_AS: s->t[v] = s->t[s->same_as[v]]; break;
        default: {
            kiln_tensor *base = s->t[s->root[v]];
            KILN_TRY(kiln_tensor_view(base, like->meta.ndim, like->meta.shape, like->strides,
                                      base->offset + s->view_offset[v], &s->t[v]));
        }
        }
        s->d[v] = s->t[v]->data;
    }
    return KILN_OK;
}

static kiln_status run_locked(kiln_sink *s, int nin, kiln_tensor *const *inputs, int nout, kiln_tensor **outputs) {
    const kiln_graph *g = s->g;
    if (s->via_kbk) return kiln_backend_kbk.run(s->kbk, nin, inputs, nout, outputs);
    KILN_TRY(kiln_check_inputs(g, nin, inputs, nout));
    bool fallback = false;
    for (int k = 0; k < nin; k++) fallback |= s->pinned[k] && !kiln_tensor_is_contiguous(inputs[k]);
    if (fallback) {
        s->fallbacks++;
        return kiln_backend_kbk.run(s->kbk, nin, inputs, nout, outputs);
    }
    kiln_tensor *small[8], **copies = nin <= 8 ? small : kiln_calloc((size_t)nin, sizeof *copies);
    if (!copies) return kiln_error(KILN_ERR_MEMORY, "out of memory running a graph");
    for (int k = 0; k < nin && copies == small; k++) copies[k] = NULL;
    kiln_status st = bind(s, inputs, copies);
    if (st == KILN_OK && s->weights) st = run_weight_casts(s);
    if (st == KILN_OK) {
        /* profiled calls run the same steps interpreted, to time each (the generated function has no clock) */
        kiln_sink_fn fn = __atomic_load_n(&s->fn, __ATOMIC_ACQUIRE); /* stored by a background build */
        st = fn && !kiln_profiling() ? (kiln_status)fn(&s->env) : interpret(s);
        if (st != KILN_OK && st != KILN_ERR_INTERRUPTED) step_error(s, st);
    }
    for (int k = 0; k < nout && st == KILN_OK; k++) {
        int32_t v = g->outputs[k];
        st = kiln_output_hand_out(&g->values[s->root[v]], s->t[v], &outputs[k]);
        if (st != KILN_OK) kiln_release_all(outputs, k);
    }
    unbind(s, copies);
    if (copies != small) free(copies);
    return st;
}

static kiln_status sink_run(void *state, int nin, kiln_tensor *const *inputs, int nout, kiln_tensor **outputs) {
    kiln_sink *s = state;
    pthread_mutex_lock(&s->lock);
    kiln_status st = run_locked(s, nin, inputs, nout, outputs);
    pthread_mutex_unlock(&s->lock);
    return st;
}

/* Writing into the caller's buffers (control-flow bodies) is the kernel-by-kernel backend's job. */
static kiln_status sink_run_into(void *state, int nin, kiln_tensor *const *inputs, int nout, kiln_tensor *const *into) {
    kiln_sink *s = state;
    pthread_mutex_lock(&s->lock);
    kiln_status st = kiln_backend_kbk.run_into(s->kbk, nin, inputs, nout, into);
    pthread_mutex_unlock(&s->lock);
    return st;
}

const kiln_backend kiln_backend_sink = {
    .name = "sink",
    .prepare = sink_prepare,
    .run = sink_run,
    .run_into = sink_run_into,
    .free = sink_free,
    .prepare_bound = sink_prepare_memo,
    .free_memo = free_memo,
    .is_native = sink_is_native,
    .fallback_calls = sink_fallback_calls,
};
