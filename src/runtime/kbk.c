/* The kernel-by-kernel backend ("kbk"): runs a plan by calling each node's kernel directly in the
 * plan's order (no inference, no autograd, no dispatch at run time), over the plan's arena;
 * fused groups through the kernels its prepare makes (kiln_fused_plan_kernels), control-flow nodes through executables of their
 * nested plans. An interrupt request (kiln_interrupt) is checked before each node. */
#include <pthread.h>

#include "../codegen/fused.h"
#include "../ir/control.h"
#include "backend.h"
#include "control_flow.h"
#include "kbk.h"
#include "profile_node.h"
#include "weight_cache.h"

typedef struct {
    const kiln_plan *p;
    kiln_tensor *const *planned;  /* per value: its tensor over the arena (planned roots only) */
    kiln_tensor **slot;           /* per value: the tensor of the current run */
    kiln_control_node **control;  /* per node: the executables of an if / while, or NULL */
    kiln_fused_kernel **kernel;   /* per node: the kernel of a fused group, or NULL */
    kiln_weight_cache *weights;   /* the weight casts kept between calls, or NULL (none in the plan) */
    bool own_kernels;             /* kernel[] is this state's (else the caller's: kiln_kbk_prepare_with) */
    pthread_mutex_t lock;         /* one run at a time: the arena and slots are shared */
} kbk_state;

static void kbk_free(void *state) {
    kbk_state *e = state;
    if (!e) return;
    for (int32_t i = 0; e->control && i < e->p->g->nnodes; i++) kiln_control_free(e->control[i]);
    if (e->own_kernels) kiln_fused_kernels_free(e->p->g->nnodes, e->kernel);
    kiln_weight_cache_free(e->weights);
    free(e->control), free(e->slot);
    pthread_mutex_destroy(&e->lock);
    free(e);
}

/* The state over kernels (per node; NULL: made here from the plan, from[] the code to reuse). */
static kiln_status prepare_state(const kiln_plan *p, kiln_plan_memory *mem, kiln_fused_kernel **kernels,
                                 kiln_fused_kernel *const *from, void **state) {
    kbk_state *e = kiln_calloc(1, sizeof *e);
    if (!e) return kiln_error(KILN_ERR_MEMORY, "out of memory compiling a graph");
    pthread_mutex_init(&e->lock, NULL);
    e->p = p;
    e->planned = mem->planned;
    int32_t nv = p->g->nvalues, nn = p->g->nnodes;
    e->slot = kiln_calloc((size_t)(nv ? nv : 1), sizeof(kiln_tensor *));
    e->control = kiln_calloc((size_t)(nn ? nn : 1), sizeof(kiln_control_node *));
    kiln_status s = e->slot && e->control ? KILN_OK : kiln_error(KILN_ERR_MEMORY, "out of memory compiling a graph");
    if (s == KILN_OK) s = kiln_weight_cache_new(p, &e->weights);
    kiln_fused_defer_builds(+1); /* this plan's groups and its bodies' build together */
    e->kernel = kernels;
    if (s == KILN_OK && !kernels) {
        s = kiln_fused_plan_kernels(p, from, &e->kernel);
        e->own_kernels = s == KILN_OK;
    }
    for (int32_t i = 0; i < nn && s == KILN_OK; i++)
        if (kiln_op_is_control(p->g->nodes[i].op)) s = kiln_control_prepare(p, i, &kiln_backend_kbk, &e->control[i]);
    kiln_fused_defer_builds(-1);
    if (s != KILN_OK) {
        kbk_free(e);
        return s;
    }
    *state = e;
    return KILN_OK;
}

static kiln_status kbk_prepare(const kiln_plan *p, kiln_plan_memory *mem, void **state) {
    return prepare_state(p, mem, NULL, NULL, state);
}

kiln_status kiln_kbk_prepare_with(const kiln_plan *p, kiln_plan_memory *mem, kiln_fused_kernel **kernels, void **state) {
    return prepare_state(p, mem, kernels, NULL, state);
}

/* What kbk keeps of a binding of a symbolic plan for the next (kiln_backend.prepare_bound): its fused
 * groups' kernels, whose code the next binding's groups take where it fits. */
typedef struct {
    int32_t n;
    kiln_fused_kernel **kernel;
} kbk_memo;

static void kbk_free_memo(void *memo) {
    kbk_memo *m = memo;
    if (m) kiln_fused_kernels_free(m->n, m->kernel);
    free(m);
}

kiln_status kiln_kbk_keep_memo(const kiln_plan *p, kiln_fused_kernel *const *kernels, void **memo) {
    if (*memo) return KILN_OK; /* the first binding's code serves the later ones */
    kbk_memo *m = kiln_calloc(1, sizeof *m);
    if (!m) return kiln_error(KILN_ERR_MEMORY, "out of memory compiling a graph");
    m->n = p->g->nnodes;
    kiln_status s = kiln_fused_plan_kernels(p, kernels, &m->kernel); /* copies: the same code, nothing made */
    if (s != KILN_OK) {
        free(m);
        return s;
    }
    *memo = m;
    return KILN_OK;
}

kiln_fused_kernel *const *kiln_kbk_memo_kernels(const void *memo, const kiln_plan *p) {
    const kbk_memo *m = memo;
    return m && m->n == p->g->nnodes ? m->kernel : NULL;
}

static kiln_status kbk_prepare_bound(const kiln_plan *p, kiln_plan_memory *mem, void **memo, void **state) {
    KILN_TRY(prepare_state(p, mem, NULL, kiln_kbk_memo_kernels(*memo, p), state));
    kiln_status s = kiln_kbk_keep_memo(p, ((kbk_state *)*state)->kernel, memo);
    if (s != KILN_OK) {
        kbk_free(*state);
        *state = NULL;
    }
    return s;
}

/* ---- running ------------------------------------------------------------------------------ */

static void poison(kiln_tensor *t) {
    if (kiln_dtype_is_float(t->meta.dtype)) memset(t->data, 0xff, (size_t)t->numel * kiln_dtype_size(t->meta.dtype));
}

/* Node values' slots hold references; inputs' and captures' borrow (the caller and the graph hold them). */
static void clear_slots(kbk_state *e) {
    const kiln_graph *g = e->p->g;
    for (int32_t v = 0; v < g->nvalues; v++) {
        if (g->values[v].kind == KILN_VALUE_NODE) kiln_tensor_release(e->slot[v]);
        e->slot[v] = NULL;
    }
}

/* outputs receive new references; or, when `into` is given, the results are written into into[]. */
static kiln_status run_locked(kbk_state *e, int nin, kiln_tensor *const *inputs, int nout, kiln_tensor **outputs,
                              kiln_tensor *const *into) {
    const kiln_plan *p = e->p;
    const kiln_graph *g = p->g;
    KILN_TRY(kiln_check_inputs(g, nin, inputs, nout));
    for (int k = 0; k < nin; k++) e->slot[g->inputs[k]] = inputs[k];
    for (int32_t c = 0; c < g->ncaptures; c++) e->slot[g->captures[c]] = g->values[g->captures[c]].bound;
    kiln_status s = KILN_OK;
    kiln_tensor *small_in[8], **ins = small_in;
    int cap_in = 8;
    bool profiling = kiln_profiling();
    for (int32_t i = 0; i < p->norder && s == KILN_OK; i++) {
        if ((s = kiln_check_interrupt()) != KILN_OK) break;
        const kiln_node *nd = &g->nodes[p->order[i]];
        const kiln_op_info *info = &kiln_op_table[nd->op];
        if (nd->nin > cap_in) {
            kiln_tensor **grown = kiln_malloc(sizeof *grown * (size_t)nd->nin);
            if (!grown) {
                s = kiln_error(KILN_ERR_MEMORY, "out of memory running a graph");
                break;
            }
            if (ins != small_in) free(ins);
            ins = grown;
            cap_in = nd->nin;
        }
        for (int k = 0; k < nd->nin; k++) ins[k] = e->slot[nd->in[k]];
        kiln_tensor *outs[KILN_MAX_OUTPUTS] = {0};
        bool kept = e->weights && kiln_plan_is_weight_cast(p, p->order[i]); /* its result is the cache's */
        if (!kept && !(info->flags & (KILN_OPF_VIEW | KILN_OPF_MUTATES))) {
            for (int k = 0; k < nd->nout && s == KILN_OK; k++) {
                int32_t v = nd->out[k];
                if (e->planned[v]) {
                    kiln_tensor_retain(e->planned[v]);
                    outs[k] = e->planned[v];
                } else if (into && p->direct_output[v] >= 0) {
                    outs[k] = into[p->direct_output[v]];
                    kiln_tensor_retain(outs[k]);
                } else {
                    s = kiln_tensor_empty_like_meta(&g->values[v].meta, &outs[k]);
                }
            }
        }
        if (s == KILN_OK) {
            kiln_fused_kernel *fk = e->kernel[p->order[i]];
            kiln_control_node *cf = e->control[p->order[i]];
            int64_t start = profiling ? kiln_profile_begin() : 0;
            s = fk     ? kiln_fused_run(fk, nd->nin, ins, outs[0])
                : cf   ? kiln_control_run(cf, nd->nin, ins, nd->nout, outs)
                : kept ? kiln_weight_cache_run(e->weights, p->order[i], ins[0], NULL, &outs[0])
                       : info->kernel(ins, nd->nin, &nd->attrs, outs);
            if (profiling) kiln_profile_node(KILN_PROFILE_KBK, g, p->order[i], ins, outs, start);
        }
        if (s == KILN_OK && (info->flags & KILN_OPF_MUTATES)) kiln_tensor_bump_version(ins[0]);
        if (s != KILN_OK) {
            kiln_release_all(outs, nd->nout);
            if (nd->loc >= 0) kiln_error_context(s, "%s (%s)", info->name, g->locs[nd->loc]);
            else kiln_error_context(s, "%s", info->name);
            break;
        }
        for (int k = 0; k < nd->nout; k++) e->slot[nd->out[k]] = outs[k];
        for (const int32_t *d = p->dead_after[i]; *d >= 0; d++) {
            kiln_tensor_release(e->slot[*d]);
            e->slot[*d] = NULL;
        }
        if (p->poison && p->freed_after[i])
            for (const int32_t *f = p->freed_after[i]; *f >= 0; f++) poison(e->planned[*f]);
    }
    if (ins != small_in) free(ins);
    for (int k = 0; k < nout && s == KILN_OK && into; k++)
        if (e->slot[g->outputs[k]] != into[k]) s = kiln_copy_into(into[k], e->slot[g->outputs[k]]);
    for (int k = 0; k < nout && s == KILN_OK && !into; k++) {
        s = kiln_output_hand_out(&g->values[p->root[g->outputs[k]]], e->slot[g->outputs[k]], &outputs[k]);
        if (s != KILN_OK) kiln_release_all(outputs, k);
    }
    clear_slots(e);
    return s;
}

static kiln_status kbk_run(void *state, int nin, kiln_tensor *const *inputs, int nout, kiln_tensor **outputs) {
    kbk_state *e = state;
    pthread_mutex_lock(&e->lock);
    kiln_status s = run_locked(e, nin, inputs, nout, outputs, NULL);
    pthread_mutex_unlock(&e->lock);
    return s;
}

static kiln_status kbk_run_into(void *state, int nin, kiln_tensor *const *inputs, int nout, kiln_tensor *const *into) {
    kbk_state *e = state;
    pthread_mutex_lock(&e->lock);
    kiln_status s = run_locked(e, nin, inputs, nout, NULL, into);
    pthread_mutex_unlock(&e->lock);
    return s;
}

const kiln_backend kiln_backend_kbk = {
    .name = "kbk",
    .prepare = kbk_prepare,
    .run = kbk_run,
    .run_into = kbk_run_into,
    .free = kbk_free,
    .prepare_bound = kbk_prepare_bound,
    .free_memo = kbk_free_memo,
};
