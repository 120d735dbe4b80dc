/* The runtime of control-flow nodes: `if` runs one of two compiled subgraphs, `while` loops a
 * compiled cond and body entirely in C, `while_grad` reruns the loop keeping every iteration's
 * values and runs the backward body over them in reverse. Every iteration checks for an
 * interrupt request (kiln_interrupt), so a loop that never ends can be stopped. Used by the kbk backend (executables
 * of the nested plans of the enclosing plan) and by the eager kernels (registered bodies,
 * compiled on the call). */
#include "control_flow.h"
#include "../core/hooks.h"

#include "../ir/control.h"
#include "backend.h"

struct kiln_control_node {
    kiln_op op;
    kiln_executable *exe[3]; /* by slot: then/else, cond/body[/backward] (owned) */
    kiln_executable *step;   /* while compiled with a graph: body and cond in one, or NULL (owned) */
    /* while_grad, from its backward body (backward_facts): per loop value, whether the backward
     * body never reads it (its history is not kept); per lifted tensor, whether its gradient is
     * zeros made from nothing (not accumulated). NULL otherwise (owned). */
    bool *unread, *zero;
    /* while_grad, from its backward body (packed_facts): per lifted tensor, whether the body reads
     * it only as permute(x, {1, 0}) of a 2-D float x, and a GEMM reads that transpose: the loop
     * then hands the body x laid out transposed (run_while_grad, pack_transposed), packed once
     * per loop instead of once per step by the GEMM. NULL when none is (owned). */
    bool *packed;
    /* while and while_grad, from the body and cond (row_write_facts): per loop value, whether the
     * body only adds rows into it (index_add of the loop value, its one reader) and the cond never
     * reads it, so an iteration may write it in place. NULL when none is (owned). */
    bool *in_place;
    /* while and while_grad with stored residuals: how many per step, their metas (owned) and the
     * trip count the front end knows (0: unknown), which sizes one buffer per residual holding
     * every step's; given: a while_grad whose while stored them (they are its last inputs) */
    int nres;
    kiln_meta *res_meta;
    int64_t trips;
    bool given;
    int nstacked; /* a given while_grad's stacked cotangents (ops.def STACK), after its gradients */
};

/* The stored-residual facts of a while or while_grad node with attrs a and body (F) graph f. */
static kiln_status residual_facts(kiln_control_node *c, const kiln_attrs *a, const kiln_graph *f, int nloop) {
    c->nres = kiln_loop_nres(c->op, a);
    c->trips = kiln_attr_int(a, KILN_A_WHILE_TRIPS, 0);
    c->given = kiln_loop_given(c->op, a);
    c->nstacked = kiln_loop_nstacked(c->op, a);
    if (c->nres <= 0) return KILN_OK;
    if (f->noutputs != nloop + c->nres || (c->op == KILN_OP_WHILE && c->trips <= 0))
        return kiln_error(KILN_ERR_VALUE, "%s: malformed stored-residual body", kiln_op_table[c->op].name);
    c->res_meta = kiln_malloc(sizeof *c->res_meta * (size_t)c->nres);
    if (!c->res_meta) return kiln_error(KILN_ERR_MEMORY, "out of memory compiling a loop's gradient");
    for (int k = 0; k < c->nres; k++) c->res_meta[k] = f->values[f->outputs[nloop + k]].meta;
    return KILN_OK;
}

/* The facts above: a loop carrying a buffer it writes one row of per iteration (a scan's stacked
 * outputs) then costs a row per iteration, not a copy of the whole buffer. */
static kiln_status row_write_facts(kiln_control_node *c, const kiln_graph *cond, const kiln_graph *body, int nloop) {
    bool any = false;
    bool *in_place = kiln_calloc((size_t)(nloop ? nloop : 1), sizeof *in_place);
    if (!in_place) return kiln_error(KILN_ERR_MEMORY, "out of memory compiling a loop");
    for (int k = 0; k < nloop && k < body->noutputs && k < body->ninputs && k < cond->ninputs; k++) {
        int32_t v = body->inputs[k], o = body->outputs[k];
        const kiln_value *ov = &body->values[o];
        if (ov->kind != KILN_VALUE_NODE || body->nodes[ov->node].op != KILN_OP_INDEX_ADD ||
            body->nodes[ov->node].in[0] != v)
            continue;
        int readers = 0;
        for (int32_t i = 0; i < body->nnodes; i++)
            for (int j = 0; j < body->nodes[i].nin; j++) readers += body->nodes[i].in[j] == v;
        for (int32_t j = 0; j < body->noutputs; j++) readers += body->outputs[j] == v;
        int32_t cv = cond->inputs[k];
        for (int32_t i = 0; i < cond->nnodes; i++)
            for (int j = 0; j < cond->nodes[i].nin; j++) readers += cond->nodes[i].in[j] == cv;
        for (int32_t j = 0; j < cond->noutputs; j++) readers += cond->outputs[j] == cv;
        in_place[k] = readers == 1;
        any |= in_place[k];
    }
    if (any) c->in_place = in_place;
    else free(in_place);
    return KILN_OK;
}

/* The facts above of a while_grad's backward body g ((v..., lifted..., gnext...[, r...]) ->
 * (gv..., glifted...)): a loop carrying a buffer it only writes (a sequence's outputs) then keeps
 * one buffer per iteration no longer, and a captured tensor whose gradient is zeros (made from one
 * zero) or nobody asked for (the body returns the tensor itself in its place) costs no full-size
 * addition per iteration. */
static kiln_status backward_facts(kiln_control_node *c, const kiln_graph *g, int nres, int nstacked) {
    int nstate = g->noutputs - nstacked, nloop = g->ninputs - nres - nstate, nlift = nstate - nloop;
    if (nloop < 0 || nlift < 0) return kiln_error(KILN_ERR_VALUE, "while_grad: malformed backward body");
    bool *read = kiln_calloc((size_t)(g->nvalues ? g->nvalues : 1), sizeof *read);
    c->unread = kiln_calloc((size_t)(nloop ? nloop : 1), sizeof *c->unread);
    c->zero = kiln_calloc((size_t)(nlift ? nlift : 1), sizeof *c->zero);
    if (!read || !c->unread || !c->zero) {
        free(read);
        return kiln_error(KILN_ERR_MEMORY, "out of memory compiling a loop's gradient");
    }
    for (int32_t i = 0; i < g->nnodes; i++)
        for (int k = 0; k < g->nodes[i].nin; k++) read[g->nodes[i].in[k]] = true;
    for (int32_t k = 0; k < g->noutputs; k++) read[g->outputs[k]] = true;
    for (int k = 0; k < nloop; k++) c->unread[k] = !read[g->inputs[k]];
    for (int k = 0; k < nlift; k++) {
        const kiln_value *v = &g->values[g->outputs[nloop + k]], *base = v;
        if (v->kind == KILN_VALUE_NODE && g->nodes[v->node].op == KILN_OP_EXPAND) /* zeros as a view of one zero */
            base = &g->values[g->nodes[v->node].in[0]];
        const kiln_node *nd = base->kind == KILN_VALUE_NODE ? &g->nodes[base->node] : NULL;
        bool full_zero = nd && nd->op == KILN_OP_FULL && kiln_attr_float(&nd->attrs, KILN_A_FULL_VALUE, 1.0) == 0.0;
        bool folded_zero = base->kind == KILN_VALUE_CAPTURED && base->constant && base->bound->numel == 1 &&
                           kiln_tensor_get_double(base->bound, 0) == 0.0; /* (optimized bodies fold the full) */
        bool itself = g->outputs[nloop + k] == g->inputs[nloop + k]; /* not asked for (ir/control_grad.c) */
        c->zero[k] = full_zero || folded_zero || itself;
    }
    free(read);
    return KILN_OK;
}

static bool is_transpose_2d(const kiln_graph *g, const kiln_node *nd) {
    return nd->op == KILN_OP_PERMUTE && nd->nin == 1 && nd->attrs.ni == 2 && g->values[nd->in[0]].meta.ndim == 2 &&
           kiln_attr_int(&nd->attrs, KILN_A_PERMUTE_PERM, 0) == 1 &&
           kiln_attr_int(&nd->attrs, KILN_A_PERMUTE_PERM + 1, 0) == 0;
}

/* The packed facts above, of a while_grad's backward body g (its layout as in backward_facts).
 * A GEMM given a transposed operand (dh = dgates @ U^T, the gradient of h @ U) packs it on every
 * call, strided reads of the whole weight, once per step; given the weight laid out transposed
 * (the same values: only the strides differ), the transpose is a contiguous matrix. Only GEMMs
 * reading that transpose may see the other layout: a lifted tensor read otherwise (a recomputed
 * step's h @ U, a transpose viewed again), or returned (but as its own gradient's stand-in, which
 * nobody reads: backward_facts' zero), is not packed. */
static kiln_status packed_facts(kiln_control_node *c, const kiln_graph *g, int nres, int nstacked) {
    int nstate = g->noutputs - nstacked, nloop = g->ninputs - nres - nstate, nlift = nstate - nloop;
    if (nloop < 0 || nlift <= 0) return KILN_OK;
    bool any = false;
    bool *packed = kiln_calloc((size_t)nlift, sizeof *packed);
    if (!packed) return kiln_error(KILN_ERR_MEMORY, "out of memory compiling a loop's gradient");
    for (int k = 0; k < nlift; k++) {
        int32_t v = g->inputs[nloop + k];
        const kiln_meta *m = &g->values[v].meta;
        bool ok = m->ndim == 2 && kiln_dtype_is_float(m->dtype), gemm = false;
        for (int32_t j = 0; j < g->noutputs && ok; j++) ok = g->outputs[j] != v || j == nloop + k;
        for (int32_t i = 0; i < g->nnodes && ok; i++) {
            const kiln_node *nd = &g->nodes[i];
            for (int q = 0; q < nd->nin && ok; q++) {
                if (nd->in[q] != v) continue;
                ok = is_transpose_2d(g, nd); /* ... read by GEMMs alone: they get the contiguous matrix */
                for (int32_t j = 0; j < g->noutputs && ok; j++) ok = g->outputs[j] != nd->out[0];
                for (int32_t r = 0; r < g->nnodes && ok; r++) {
                    kiln_op op = g->nodes[r].op;
                    for (int t = 0; t < g->nodes[r].nin && ok; t++) {
                        if (g->nodes[r].in[t] != nd->out[0]) continue;
                        ok = op == KILN_OP_MATMUL || op == KILN_OP_MATMUL_EPILOGUE;
                        gemm = true;
                    }
                }
            }
        }
        packed[k] = ok && gemm;
        any |= packed[k];
    }
    if (any) c->packed = packed;
    else free(packed);
    return KILN_OK;
}

/* ---- inference and eager kernels --------------------------------------------------------------- */

static kiln_status registered_subgraphs(kiln_op op, const kiln_attrs *a, const kiln_graph **subs) {
    int slots[4], n = kiln_control_slots(op, slots);
    for (int k = 0; k < n; k++)
        if (!(subs[k] = kiln_body_of(op, a, k))) return KILN_ERR_VALUE;
    return KILN_OK;
}

/* Eagerly, attrs name registered bodies. */
static kiln_status infer_eager(kiln_op op, int nin, kiln_tensor *const *in, const kiln_attrs *a, kiln_meta *out) {
    if (a->ni < 3) return kiln_error(KILN_ERR_VALUE, "%s: malformed attributes (%d ints)", kiln_op_table[op].name, a->ni);
    const kiln_graph *subs[4];
    KILN_TRY(registered_subgraphs(op, a, subs));
    kiln_meta small[16], *metas = nin <= 16 ? small : kiln_malloc(sizeof *metas * (size_t)(nin ? nin : 1));
    if (!metas) return kiln_error(KILN_ERR_MEMORY, "out of memory");
    for (int k = 0; k < nin; k++) metas[k] = in[k]->meta;
    kiln_status s = kiln_control_infer(op, nin, metas, a, subs, out);
    if (metas != small) free(metas);
    return s;
}


/* Body k of op compiled for one call: optimized at O1 first (fused kernels: a loop runs as fast as
 * in a compiled graph) when the pass pipeline is there, else (or when optimizing fails) as it is;
 * *opt: the optimized graph (the facts below read what runs), or NULL. */
static kiln_status compile_body(kiln_op op, const kiln_attrs *a, int k, kiln_graph **opt, kiln_executable **exe) {
    const kiln_graph *body = kiln_body_of(op, a, k);
    if (!body) return KILN_ERR_VALUE;
    if (kiln_hooks.optimize_body && kiln_graph_clone(body, opt) == KILN_OK && kiln_hooks.optimize_body(opt) != KILN_OK) {
        kiln_graph_free(*opt); /* (an optimization is not needed to run it) */
        *opt = NULL;
    }
    return kiln_compile(*opt ? *opt : body, NULL, exe);
}

/* Eagerly (while tracing, and when a gradient rule runs without a trace) the bodies are compiled
 * for the call: a loop still runs in C, and no arena outlives it. */
static kiln_status eager_run(kiln_op op, kiln_tensor *const *in, int nin, const kiln_attrs *a, kiln_tensor **out) {
    kiln_control_node c = {.op = op};
    int slots[4], n = kiln_control_slots(op, slots);
    kiln_graph *opt[4] = {0};
    const kiln_graph *g[4] = {0}; /* what runs: the optimized bodies (or the registered ones) */
    kiln_status s = KILN_OK;
    for (int k = 0; k < n && s == KILN_OK; k++) {
        s = compile_body(op, a, k, &opt[k], &c.exe[k]);
        g[k] = opt[k] ? opt[k] : kiln_body_of(op, a, k);
    }
    int nloop = kiln_loop_nloop(op, a, nin, kiln_op_nout(op, a));
    if (s == KILN_OK && op != KILN_OP_IF) s = residual_facts(&c, a, g[1], nloop);
    if (s == KILN_OK && op == KILN_OP_WHILE_GRAD) s = backward_facts(&c, g[2], c.nres, c.nstacked);
    if (s == KILN_OK && op == KILN_OP_WHILE_GRAD) s = packed_facts(&c, g[2], c.nres, c.nstacked);
    if (s == KILN_OK && op != KILN_OP_IF) s = row_write_facts(&c, g[0], g[1], nloop);
    if (s == KILN_OK) s = kiln_control_run(&c, nin, in, kiln_op_nout(op, a), out);
    for (int k = 0; k < n; k++) kiln_executable_free(c.exe[k]), kiln_graph_free(opt[k]);
    free(c.unread), free(c.zero), free(c.packed), free(c.in_place), free(c.res_meta);
    return s;
}

/* The op table's if / while / while_grad entries run these (src/ops/control_ops.c). */
__attribute__((constructor)) static void register_control_kernels(void) {
    kiln_hooks.control_infer = infer_eager;
    kiln_hooks.control_kernel = eager_run;
}

/* ---- compiled with a graph ------------------------------------------------------------------------ */

/* The executables of control-flow node `node` of p, over its nested plans (owned by p), on be. */
kiln_status kiln_control_prepare(const kiln_plan *p, int32_t node, const kiln_backend *be, kiln_control_node **out) {
    kiln_control_node *c = kiln_calloc(1, sizeof *c);
    if (!c) return kiln_error(KILN_ERR_MEMORY, "out of memory compiling a graph");
    c->op = p->g->nodes[node].op;
    int slots[4], ns = kiln_control_slots(c->op, slots);
    kiln_status s = KILN_OK;
    for (int k = 0; k < ns && s == KILN_OK; k++)
        s = kiln_executable_from_plan(kiln_plan_body(p, node, k), be, &c->exe[k]);
    const kiln_node *nd = &p->g->nodes[node];
    int nloop = kiln_loop_nloop(c->op, &nd->attrs, nd->nin, nd->nout);
    if (s == KILN_OK && c->op != KILN_OP_IF) s = residual_facts(c, &nd->attrs, kiln_plan_body(p, node, 1)->g, nloop);
    if (s == KILN_OK && c->op == KILN_OP_WHILE_GRAD)
        s = backward_facts(c, kiln_plan_body(p, node, 2)->g, c->nres, c->nstacked);
    if (s == KILN_OK && c->op == KILN_OP_WHILE_GRAD)
        s = packed_facts(c, kiln_plan_body(p, node, 2)->g, c->nres, c->nstacked);
    if (s == KILN_OK && c->op != KILN_OP_IF)
        s = row_write_facts(c, kiln_plan_body(p, node, 0)->g, kiln_plan_body(p, node, 1)->g, nloop);
    const kiln_plan *step = kiln_plan_body(p, node, KILN_PLAN_STEP);
    if (s == KILN_OK && step) s = kiln_executable_from_plan(step, be, &c->step);
    if (s != KILN_OK) {
        kiln_control_free(c);
        return s;
    }
    *out = c;
    return KILN_OK;
}

void kiln_control_free(kiln_control_node *c) {
    if (!c) return;
    for (int k = 0; k < 3; k++) kiln_executable_free(c->exe[k]);
    kiln_executable_free(c->step);
    free(c->unread), free(c->zero), free(c->packed), free(c->in_place), free(c->res_meta);
    free(c);
}

/* ---- running ------------------------------------------------------------------------------------- */

static _Atomic int64_t body_runs; /* kiln_loop_body_runs */

int64_t kiln_loop_body_runs(void) { return body_runs; }

static _Atomic int64_t packed_operands; /* kiln_loop_packed_operands */

int64_t kiln_loop_packed_operands(void) { return packed_operands; }

static bool truth(const kiln_tensor *t) { return kiln_tensor_get_double(t, 0) != 0; }

/* out[k] (allocated) = values[k] */
static kiln_status copy_out(int n, kiln_tensor *const *values, kiln_tensor **out) {
    for (int k = 0; k < n; k++) KILN_TRY(kiln_copy_into(out[k], values[k]));
    return KILN_OK;
}

static kiln_status run_if(kiln_control_node *c, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    bool taken = truth(in[0]);
    kiln_tensor *res[KILN_MAX_OUTPUTS] = {0};
    kiln_status s = kiln_executable_run(c->exe[taken ? 0 : 1], nin - 1, in + 1, nout, res);
    if (s != KILN_OK) return kiln_error_context(s, "in the %s branch", taken ? "then" : "else");
    s = copy_out(nout, res, out);
    kiln_release_all(res, nout);
    return s;
}

/* One loop step of the state (v..., lifted...): *go = cond(state); when true, state's loop values
 * are replaced by body(state) (old ones released), and a stored-residual body writes this step's
 * residuals into res[0..c->nres) (given). next: room for nloop + c->nres tensors. */
static kiln_status step(kiln_control_node *c, int nstate, int nloop, kiln_tensor **state, kiln_tensor *const *res,
                        kiln_tensor **next, bool *go) {
    kiln_tensor *p = NULL;
    kiln_status s = kiln_executable_run(c->exe[0], nstate, state, 1, &p);
    if (s != KILN_OK) return kiln_error_context(s, "in the loop condition");
    *go = truth(p);
    kiln_tensor_release(p);
    if (!*go) return KILN_OK;
    body_runs++;
    memset(next, 0, sizeof *next * (size_t)(nloop + c->nres));
    if (c->in_place || c->nres > 0) { /* rows added in place into state's own buffers, the others new */
        for (int k = 0; k < nloop && s == KILN_OK; k++) {
            if (c->in_place && c->in_place[k]) kiln_tensor_retain(next[k] = state[k]);
            else s = kiln_tensor_empty_like_meta(&state[k]->meta, &next[k]);
        }
        for (int k = 0; k < c->nres; k++) next[nloop + k] = res[k];
        if (s == KILN_OK) s = kiln_executable_run_into(c->exe[1], nstate, state, nloop + c->nres, next);
        if (s != KILN_OK) kiln_release_all(next, nloop);
    } else {
        s = kiln_executable_run(c->exe[1], nstate, state, nloop, next);
    }
    if (s != KILN_OK) return kiln_error_context(s, "in the loop body");
    kiln_release_all(state, nloop);
    memcpy(state, next, sizeof *next * (size_t)nloop);
    return KILN_OK;
}

/* state[k] (a reference to a caller's tensor) replaced by its own copy for each loop value written
 * in place: the caller's tensors are never written. */
static kiln_status own_in_place(kiln_control_node *c, int nloop, kiln_tensor **state) {
    for (int k = 0; k < nloop && c->in_place; k++) {
        if (!c->in_place[k]) continue;
        kiln_tensor *copy = NULL;
        KILN_TRY(kiln_tensor_empty_like_meta(&state[k]->meta, &copy));
        kiln_status s = kiln_copy_into(copy, state[k]);
        if (s != KILN_OK) {
            kiln_tensor_release(copy);
            return s;
        }
        kiln_tensor_release(state[k]);
        state[k] = copy;
    }
    return KILN_OK;
}

/* The error of a failed step, named for the part that fails when the body and the cond run apart
 * (they are pure: rerunning them on the same state fails the same way). */
static kiln_status step_error(kiln_control_node *c, int nin, kiln_tensor *const *state, int nloop, kiln_status s) {
    kiln_tensor *res[KILN_MAX_OUTPUTS] = {0}, *p = NULL;
    kiln_status again = kiln_executable_run(c->exe[1], nin, state, nloop, res);
    if (again != KILN_OK) return kiln_error_context(again, "in the loop body");
    kiln_tensor **next = kiln_malloc(sizeof *next * (size_t)nin);
    if (next) {
        memcpy(next, res, sizeof *next * (size_t)nloop);
        memcpy(next + nloop, state + nloop, sizeof *next * (size_t)(nin - nloop));
        again = kiln_executable_run(c->exe[0], nin, next, 1, &p);
        kiln_tensor_release(p);
    }
    free(next);
    kiln_release_all(res, nloop);
    if (next && again != KILN_OK) return kiln_error_context(again, "in the loop condition");
    return kiln_error_context(s, "in the loop body or condition");
}

/* One iteration from state (not written): the next loop values into dst[], their cond into pred
 * (through the composed step when there is one; into has room for nloop + 1 tensors). */
static kiln_status iterate(kiln_control_node *c, int nin, kiln_tensor *const *state, int nloop, kiln_tensor *const *dst,
                           kiln_tensor *pred, kiln_tensor **into) {
    body_runs++;
    if (c->step) {
        memcpy(into, dst, sizeof *into * (size_t)nloop);
        into[nloop] = pred;
        kiln_status s = kiln_executable_run_into(c->step, nin, state, nloop + 1, into);
        return s == KILN_OK ? s : step_error(c, nin, state, nloop, s);
    }
    kiln_status s = kiln_executable_run_into(c->exe[1], nin, state, nloop, dst);
    if (s != KILN_OK) return kiln_error_context(s, "in the loop body");
    memcpy(into, dst, sizeof *into * (size_t)nloop);
    memcpy(into + nloop, state + nloop, sizeof *into * (size_t)(nin - nloop));
    s = kiln_executable_run_into(c->exe[0], nin, into, 1, &pred);
    return s == KILN_OK ? s : kiln_error_context(s, "in the loop condition");
}

/* Step t's residuals (new references in row[0..c->nres)): rows of one buffer per residual holding
 * every step's when the trip count is known (made at the first step), else tensors of their own. */
static kiln_status residual_rows(kiln_control_node *c, kiln_tensor **stacked, int64_t t, kiln_tensor **row) {
    for (int k = 0; k < c->nres; k++) {
        const kiln_meta *m = &c->res_meta[k];
        if (t >= c->trips) {
            KILN_TRY(kiln_tensor_empty_like_meta(m, &row[k]));
            continue;
        }
        if (!stacked[k]) {
            int64_t shape[KILN_MAX_DIMS + 1] = {c->trips};
            if (m->ndim + 1 > KILN_MAX_DIMS)
                return kiln_error(KILN_ERR_NOT_IMPLEMENTED, "while_grad: a stored residual of %d dimensions", m->ndim);
            memcpy(shape + 1, m->shape, sizeof *shape * (size_t)m->ndim);
            KILN_TRY(kiln_tensor_empty(m->dtype, m->ndim + 1, shape, &stacked[k]));
        }
        if (!kiln_tensor_is_contiguous(stacked[k]))
            return kiln_error(KILN_ERR_VALUE, "while: a stored residual buffer is not contiguous");
        KILN_TRY(kiln_tensor_view(stacked[k], m->ndim, m->shape, NULL, stacked[k]->offset + t * kiln_meta_numel(m),
                                  &row[k]));
    }
    return KILN_OK;
}

/* A while recorded for a gradient (c->nres > 0): each step's body also returns the residuals its
 * backward reads, written into row t of out[nloop + k] (c->trips rows each), which the loop's
 * while_grad then reads instead of running the loop again. */
static kiln_status run_while_storing(kiln_control_node *c, int nin, kiln_tensor *const *in, int nout,
                                     kiln_tensor **out) {
    int nres = c->nres, nloop = nout - nres;
    kiln_tensor **state = kiln_calloc((size_t)nin, sizeof *state); /* owned */
    kiln_tensor **next = kiln_calloc((size_t)(nloop + nres), sizeof *next);
    kiln_tensor **row = kiln_calloc((size_t)nres, sizeof *row);
    kiln_status s = state && next && row ? KILN_OK : kiln_error(KILN_ERR_MEMORY, "out of memory running a loop");
    for (int k = 0; k < nin && s == KILN_OK; k++) kiln_tensor_retain(state[k] = in[k]);
    if (s == KILN_OK) s = own_in_place(c, nloop, state);
    int64_t steps = 0;
    for (bool go = true; go && s == KILN_OK;) {
        if ((s = kiln_check_interrupt()) != KILN_OK) break;
        s = residual_rows(c, out + nloop, steps, row);
        if (s == KILN_OK) s = step(c, nin, nloop, state, row, next, &go);
        kiln_release_all(row, nres);
        memset(row, 0, sizeof *row * (size_t)nres);
        if (s == KILN_OK && go) steps++;
    }
    if (s == KILN_OK && steps != c->trips)
        s = kiln_error(KILN_ERR_VALUE, "while: the loop ran %lld steps but was recorded for a gradient with %lld (the "
                       "trip count its front end gave)", (long long)steps, (long long)c->trips);
    if (s == KILN_OK) s = copy_out(nloop, state, out);
    if (state) kiln_release_all(state, nin);
    free(state), free(next), free(row);
    return s;
}

/* The loop without allocating per iteration: the cond writes its predicate into one buffer and the
 * body's loop values alternate between out[] and a second set of buffers, so an iteration never
 * writes the buffers it reads (the first reads in[]). */
static kiln_status run_while(kiln_control_node *c, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    if (c->nres > 0) return run_while_storing(c, nin, in, nout, out);
    int nloop = nout;
    kiln_tensor **state = kiln_malloc(sizeof *state * (size_t)nin); /* borrowed: in[], out[] or spare[] */
    kiln_tensor **spare = kiln_calloc((size_t)nloop, sizeof *spare);
    kiln_tensor **into = kiln_malloc(sizeof *into * (size_t)(nin + 1));
    kiln_tensor *pred = NULL;
    kiln_status s = state && spare && into ? KILN_OK : kiln_error(KILN_ERR_MEMORY, "out of memory running a loop");
    if (s == KILN_OK) {
        memcpy(state, in, sizeof *state * (size_t)nin);
        kiln_tensor *first = NULL; /* may be an input or a capture: read, never written */
        s = kiln_executable_run(c->exe[0], nin, state, 1, &first);
        if (s == KILN_OK && truth(first)) s = kiln_tensor_empty_like_meta(&first->meta, &pred);
        else if (s != KILN_OK) kiln_error_context(s, "in the loop condition");
        kiln_tensor_release(first);
    }
    /* a loop value written in place lives in out[k] throughout (in[k] copied there once) */
    for (int k = 0; k < nloop && s == KILN_OK && pred && c->in_place; k++)
        if (c->in_place[k]) {
            s = kiln_copy_into(out[k], in[k]);
            state[k] = out[k];
            kiln_tensor_retain(spare[k] = out[k]);
        }
    for (int64_t it = 0; s == KILN_OK && pred; it++) {
        if ((s = kiln_check_interrupt()) != KILN_OK) break;
        kiln_tensor **dst = it % 2 == 0 ? out : spare;
        for (int k = 0; k < nloop && s == KILN_OK; k++)
            if (!dst[k]) s = kiln_tensor_empty_like_meta(&out[k]->meta, &dst[k]);
        if (s == KILN_OK) s = iterate(c, nin, state, nloop, dst, pred, into);
        if (s != KILN_OK) break;
        memcpy(state, dst, sizeof *state * (size_t)nloop);
        if (!truth(pred)) break;
    }
    for (int k = 0; k < nloop && s == KILN_OK; k++)
        if (state[k] != out[k]) s = kiln_copy_into(out[k], state[k]);
    if (spare) kiln_release_all(spare, nloop);
    kiln_tensor_release(pred);
    free(state), free(spare), free(into);
    return s;
}

/* acc[k] += g[k] (g consumed), or acc[k] = g[k] when acc[k] is NULL. own[k]: acc[k] is a sum this
 * loop made (added into in place); else the first gradient, which a backward body may return as one
 * of its inputs, so the first sum is a new tensor. */
static kiln_status accumulate(int n, kiln_tensor **acc, bool *own, kiln_tensor **g) {
    static const kiln_attrs none;
    kiln_status s = KILN_OK;
    for (int k = 0; k < n; k++) {
        if (!acc[k] || s != KILN_OK) {
            if (s == KILN_OK) acc[k] = g[k];
            else kiln_tensor_release(g[k]);
            g[k] = NULL;
            continue;
        }
        if (!g[k]) continue;
        kiln_tensor *sum = NULL, *pair[2] = {acc[k], g[k]};
        if (own[k]) kiln_tensor_retain(sum = acc[k]);
        else s = kiln_tensor_empty_like_meta(&acc[k]->meta, &sum);
        if (s == KILN_OK) s = kiln_kernel_add(pair, 2, &none, &sum);
        kiln_tensor_release(g[k]);
        g[k] = NULL;
        if (s != KILN_OK) {
            kiln_tensor_release(sum);
            continue;
        }
        kiln_tensor_release(acc[k]);
        acc[k] = sum;
        own[k] = true;
    }
    return s;
}

/* The history of a while_grad given its while's stored residuals (the buffers R[0..c->nres)): per
 * step, no loop values (its backward body reads none of them: the residuals hold what it reads)
 * and row t of each buffer. */
static kiln_status given_history(kiln_control_node *c, int nloop, kiln_tensor *const *stacked, kiln_tensor ***history,
                                 int64_t *steps) {
    int per = nloop + c->nres;
    for (int k = 0; k < nloop; k++)
        if (!c->unread[k])
            return kiln_error(KILN_ERR_VALUE, "while_grad: given stored residuals, its backward body reads loop value %d",
                              k);
    if (c->trips <= 0) return kiln_error(KILN_ERR_VALUE, "while_grad: stored residuals without a trip count");
    kiln_tensor **h = kiln_calloc((size_t)(c->trips * per), sizeof *h);
    if (!h) return kiln_error(KILN_ERR_MEMORY, "out of memory running a loop's gradient");
    *history = h;
    for (int64_t t = 0; t < c->trips; t++) {
        *steps = t + 1; /* (rows made before a failure are released with the history) */
        KILN_TRY(residual_rows(c, (kiln_tensor **)stacked, t, h + t * per + nloop));
    }
    return KILN_OK;
}

/* state[nloop + k] (a reference) replaced by the same values laid out transposed for each lifted
 * tensor the backward body reads only transposed (c->packed), when the body runs kernel by kernel
 * (whose kernels take any strides; a generated kernel would copy it back per step) over more than
 * one step. x (m x n, contiguous) becomes an m x n view, strides (1, m), of a contiguous copy of
 * x^T: permute(x, {1, 0}) of it is that copy. */
static kiln_status pack_transposed(kiln_control_node *c, int nloop, int nlift, int64_t steps, kiln_tensor **state) {
    if (!c->packed || steps < 2 || strcmp(kiln_executable_backend(c->exe[2]), "kbk") != 0) return KILN_OK;
    for (int k = 0; k < nlift; k++) {
        kiln_tensor *x = state[nloop + k];
        if (!c->packed[k] || !x || x->meta.ndim != 2 || !kiln_tensor_is_contiguous(x)) continue;
        int64_t tshape[2] = {x->meta.shape[1], x->meta.shape[0]}, tstrides[2] = {x->strides[1], x->strides[0]};
        int64_t strides[2] = {1, x->meta.shape[0]};
        kiln_tensor *xt = NULL, *copy = NULL, *laid = NULL;
        kiln_status s = kiln_tensor_view(x, 2, tshape, tstrides, x->offset, &xt);
        if (s == KILN_OK) s = kiln_to_contiguous(xt, xt->meta.dtype, &copy);
        if (s == KILN_OK) s = kiln_tensor_view(copy, 2, x->meta.shape, strides, copy->offset, &laid);
        kiln_tensor_release(xt), kiln_tensor_release(copy);
        if (s != KILN_OK) return s;
        kiln_tensor_release(x);
        state[nloop + k] = laid;
        packed_operands++;
    }
    return KILN_OK;
}

/* in = (v0..., lifted..., gv...[, R...]): nloop loop values, nlift lifted tensors; out = (gv0...,
 * glifted...). With stored residuals (c->nres), the forward rerun's body also writes each step's
 * residuals and the backward body reads them after (v..., lifted..., gnext...); given them (R, one
 * buffer of every step's each, stored by the loop's while), there is no rerun: the backward reads
 * R's rows. */
static kiln_status run_while_grad(kiln_control_node *c, int nin_all, kiln_tensor *const *in, int nout,
                                  kiln_tensor **out) {
    int nres = c->nres, nin = c->given ? nin_all - nres : nin_all;
    int nstate = nout - c->nstacked, nloop = nin - nstate;
    int nlift = nstate - nloop;
    /* state = (loop values, lifted, gradients of the loop values, residuals); entries are owned or NULL */
    kiln_tensor **state = kiln_calloc((size_t)(nin + nres), sizeof *state);
    kiln_tensor **gl = kiln_calloc((size_t)(nlift ? nlift : 1), sizeof *gl);
    bool *gl_own = kiln_calloc((size_t)(nlift ? nlift : 1), sizeof *gl_own);
    kiln_tensor **res = kiln_calloc((size_t)nout, sizeof *res);
    kiln_tensor **stacked = kiln_calloc((size_t)(nres ? nres : 1), sizeof *stacked);
    kiln_tensor **next = kiln_calloc((size_t)(nloop + nres), sizeof *next); /* step()'s */
    kiln_tensor **history = NULL; /* per iteration: the loop values before it (nloop), its residuals (nres) */
    int per = nloop + nres;
    int64_t steps = 0, cap = 0;
    kiln_status s = state && gl && gl_own && res && stacked && next ? KILN_OK
                                                  : kiln_error(KILN_ERR_MEMORY, "out of memory running a loop's gradient");
    for (int k = 0; k < nstate && s == KILN_OK; k++) {
        kiln_tensor_retain(in[k]);
        state[k] = in[k];
    }
    /* a value written in place keeps no history: its backward never reads it (else not in place) */
    for (int k = 0; k < nloop && c->in_place; k++) c->in_place[k] &= c->unread[k];
    if (s == KILN_OK && !c->given) s = own_in_place(c, nloop, state);
    if (s == KILN_OK && c->given) s = given_history(c, nloop, in + nin, &history, &steps);
    for (bool go = !c->given; go && s == KILN_OK;) {
        if ((s = kiln_check_interrupt()) != KILN_OK) break;
        if (steps == cap) {
            int64_t ncap = cap ? cap * 2 : (c->trips > 0 ? c->trips + 1 : 16);
            kiln_tensor **grown = kiln_realloc(history, sizeof *grown * (size_t)(ncap * per));
            if (!grown) {
                s = kiln_error(KILN_ERR_MEMORY, "out of memory running a loop's gradient");
                break;
            }
            history = grown, cap = ncap;
        }
        kiln_tensor **h = history + steps * per;
        for (int k = 0; k < nloop; k++) {
            kiln_tensor *kept = c->unread[k] ? NULL : state[k]; /* (an unread one is never looked at) */
            if (kept) kiln_tensor_retain(kept);
            h[k] = kept;
        }
        memset(h + nloop, 0, sizeof *h * (size_t)nres);
        if (nres) s = residual_rows(c, stacked, steps, h + nloop);
        if (s == KILN_OK) s = step(c, nstate, nloop, state, h + nloop, next, &go);
        if (s != KILN_OK || !go) kiln_release_all(h, per); /* no iteration ran on them */
        else steps++;
    }
    if (s == KILN_OK) {
        kiln_release_all(state, nloop); /* the final values: not needed */
        for (int k = 0; k < nloop; k++) {
            kiln_tensor_retain(in[nstate + k]);
            state[nstate + k] = in[nstate + k]; /* the incoming gradient, then each step's */
        }
    }
    if (s == KILN_OK) s = pack_transposed(c, nloop, nlift, steps, state);
    /* backward: (v_t..., lifted..., g_{t+1}...[, r_t...]) -> (g_t..., glifted_t...) */
    for (int64_t t = steps - 1; t >= 0 && s == KILN_OK; t--) {
        if ((s = kiln_check_interrupt()) != KILN_OK) break;
        kiln_tensor **h = history + t * per;
        memcpy(state, h, sizeof *state * (size_t)nloop);
        memcpy(state + nin, h + nloop, sizeof *state * (size_t)nres);
        for (int k = 0; k < nloop; k++)
            if (c->unread[k]) state[k] = (kiln_tensor *)in[k]; /* stands in (same meta), never read */
        s = kiln_executable_run(c->exe[2], nin + nres, state, nout, res);
        for (int k = 0; k < nloop; k++) state[k] = NULL; /* borrowed from history */
        for (int k = 0; k < nres; k++) state[nin + k] = NULL;
        kiln_release_all(h + nloop, nres); /* read: no longer needed */
        memset(h + nloop, 0, sizeof *h * (size_t)nres);
        if (s != KILN_OK) {
            kiln_error_context(s, "in the backward loop body");
            break;
        }
        for (int k = 0; k < c->nstacked && s == KILN_OK; k++) { /* this step's cotangent into its row */
            kiln_tensor *row = NULL;
            const kiln_meta *m = &res[nstate + k]->meta;
            s = kiln_tensor_view(out[nstate + k], m->ndim, m->shape, NULL,
                                 out[nstate + k]->offset + t * kiln_meta_numel(m), &row);
            if (s == KILN_OK) s = kiln_copy_into(row, res[nstate + k]);
            kiln_tensor_release(row);
        }
        kiln_release_all(res + nstate, c->nstacked);
        if (s != KILN_OK) {
            kiln_release_all(res, nstate);
            break;
        }
        kiln_release_all(state + nstate, nloop);
        memcpy(state + nstate, res, sizeof *res * (size_t)nloop);
        for (int k = 0; k < nlift; k++)
            if (c->zero[k]) kiln_tensor_release(res[nloop + k]), res[nloop + k] = NULL;
        s = accumulate(nlift, gl, gl_own, res + nloop);
    }
    if (s == KILN_OK) s = copy_out(nloop, state + nstate, out);
    for (int k = 0; k < nlift && s == KILN_OK; k++) {
        if (gl[k]) s = kiln_copy_into(out[nloop + k], gl[k]);
        else memset(out[nloop + k]->data, 0, (size_t)out[nloop + k]->numel * kiln_dtype_size(out[nloop + k]->meta.dtype));
    }
    if (state) kiln_release_all(state, nin);
    if (history) kiln_release_all(history, (int)(steps * per));
    if (gl) kiln_release_all(gl, nlift);
    if (stacked) kiln_release_all(stacked, nres);
    free(gl), free(gl_own), free(res), free(history), free(state), free(stacked), free(next);
    return s;
}

kiln_status kiln_control_run(kiln_control_node *c, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    switch (c->op) {
    case KILN_OP_IF: return run_if(c, nin, in, nout, out);
    case KILN_OP_WHILE: return run_while(c, nin, in, nout, out);
    case KILN_OP_WHILE_GRAD: return run_while_grad(c, nin, in, nout, out);
    default: return kiln_error(KILN_ERR_VALUE, "%s is not a control-flow op", kiln_op_table[c->op].name);
    }
}
