/* Forward mode (kiln.jvp, kiln.linearize, kiln.jacfwd): a graph transform over a recorded graph.
 * Each node of the graph runs again through kiln_apply, then its op's JVP rule (ops.def KILN_JVP,
 * src/ops/jvp_rules.c) emits the ops giving its outputs' tangents from its inputs'. Under an active
 * tracer those ops are recorded: inside a nested tracer they make the JVP graph (kiln_jvp_graph),
 * inside kiln.jit's or kiln.trace's recording they join it. Eagerly they run as they come: the same
 * one pass, forward and tangents together. */
#include "jvp.h"

#include "../core/hooks.h"
#include "body.h"
#include "control.h"
#include "trace_internal.h"

typedef struct {
    kiln_tensor **val, **tan; /* per value of the graph (new references) */
    int32_t n;
} slots;

static void slots_free(slots *s) {
    if (s->val) kiln_release_all(s->val, s->n);
    if (s->tan) kiln_release_all(s->tan, s->n);
    free(s->val), free(s->tan);
}

/* The error for an op that has no forward mode, naming it and where the user called it. */
static kiln_status no_rule(const kiln_graph *g, const kiln_node *n, const char *why) {
    const char *name = kiln_op_table[n->op].name;
    if (n->loc >= 0)
        return kiln_error(KILN_ERR_VALUE, "jvp: %s '%s' (%s) has no forward-mode (JVP) rule", why, name, g->locs[n->loc]);
    return kiln_error(KILN_ERR_VALUE, "jvp: %s '%s' has no forward-mode (JVP) rule", why, name);
}

/* Whether m holds a float dtype (what carries a tangent). */
static bool carries(const kiln_meta *m) { return kiln_dtype_is_float(m->dtype); }

/* The node (values) and, when a tangent reaches it, the node over its bodies' JVP graphs: if and while. */
typedef kiln_status (*control_apply)(const kiln_graph *g, const kiln_node *n, kiln_tensor **ins, kiln_tensor **tins,
                                     bool tangent, kiln_tensor **outs);
static kiln_status apply_if(const kiln_graph *g, const kiln_node *n, kiln_tensor **ins, kiln_tensor **tins, bool tangent,
                            kiln_tensor **outs);
static kiln_status apply_while(const kiln_graph *g, const kiln_node *n, kiln_tensor **ins, kiln_tensor **tins,
                               bool tangent, kiln_tensor **outs);
static kiln_status run_control(const kiln_graph *g, const kiln_node *n, slots *s, kiln_tensor **ins, kiln_tensor **tins,
                               bool any, control_apply apply);

/* Runs node n on s->val and its rule on s->tan. */
static kiln_status run_node(const kiln_graph *g, const kiln_node *n, slots *s, kiln_tensor **ins, kiln_tensor **tins,
                            bool *has) {
    bool any = false;
    for (int k = 0; k < n->nin; k++) {
        ins[k] = s->val[n->in[k]];
        tins[k] = s->tan[n->in[k]];
        has[k] = tins[k] != NULL && carries(&ins[k]->meta);
        if (!has[k]) tins[k] = NULL;
        any = any || has[k];
    }
    if (n->op == KILN_OP_IF) return run_control(g, n, s, ins, tins, any, apply_if);
    if (n->op == KILN_OP_WHILE && kiln_loop_nres(n->op, &n->attrs) > 0)
        return kiln_error(KILN_ERR_NOT_IMPLEMENTED, "jvp: a while loop recorded for a reverse-mode gradient (it stores "
                          "residuals for it); take the jvp of the function without grad");
    if (n->op == KILN_OP_WHILE) return run_control(g, n, s, ins, tins, any, apply_while);
    if (kiln_op_is_control(n->op)) return no_rule(g, n, "control flow");
    kiln_tensor *outs[KILN_MAX_OUTPUTS] = {0}, *touts[KILN_MAX_OUTPUTS] = {0};
    KILN_TRY(kiln_apply(n->op, n->nin, ins, &n->attrs, outs));
    for (int k = 0; k < n->nout; k++) s->val[n->out[k]] = outs[k];
    bool float_out = false;
    for (int k = 0; k < n->nout; k++) float_out = float_out || carries(&outs[k]->meta);
    if (!any || !float_out) return KILN_OK; /* nothing flows (integer results: piecewise constant) */
    kiln_jvp_fn rule = kiln_op_jvp(n->op);
    if (!rule) return no_rule(g, n, "op");
    kiln_meta in_meta[64], out_meta[KILN_MAX_OUTPUTS];
    if (n->nin > 64) return kiln_error(KILN_ERR_VALUE, "jvp: '%s' with %d inputs", kiln_op_table[n->op].name, n->nin);
    for (int k = 0; k < n->nin; k++) in_meta[k] = ins[k]->meta;
    for (int k = 0; k < n->nout; k++) out_meta[k] = outs[k]->meta;
    kiln_grad_ctx ctx = {.op = n->op, .nin = n->nin, .nout = n->nout, .in = ins, .out = outs, .in_meta = in_meta,
                         .out_meta = out_meta, .attrs = &n->attrs, .needs_grad = has};
    kiln_status st = rule(&ctx, tins, touts);
    for (int k = 0; k < n->nout && st == KILN_OK; k++) {
        kiln_tensor *t = touts[k];
        if (!t) continue;
        if (!carries(&out_meta[k])) { /* an integer output has no tangent */
            kiln_tensor_release(t);
            touts[k] = NULL;
            continue;
        }
        bool same = t->meta.ndim == out_meta[k].ndim;
        for (int d = 0; same && d < out_meta[k].ndim; d++) same = t->meta.shape[d] == out_meta[k].shape[d];
        if (!same) { /* a rule's result broadcast to its output (a linear op given fewer tangents) */
            kiln_tensor *e = NULL;
            st = kiln_emit_expand(t, out_meta[k].ndim, out_meta[k].shape, &e);
            kiln_tensor_release(t);
            touts[k] = t = e;
        }
        if (st == KILN_OK && t->meta.dtype != out_meta[k].dtype) {
            kiln_tensor *c = NULL;
            st = kiln_emit_cast(t, out_meta[k].dtype, &c);
            kiln_tensor_release(t);
            touts[k] = c;
        }
    }
    if (st != KILN_OK) {
        kiln_release_all(touts, n->nout);
        return st;
    }
    for (int k = 0; k < n->nout; k++) s->tan[n->out[k]] = touts[k];
    return KILN_OK;
}

/* ---- if: an if over its branches' JVP graphs -------------------------------------------------------
 * if(pred, x...) -> y... runs as it is, then (with tangents) if(pred, x..., t..., lifted...) -> ty...,
 * each branch its JVP graph giving the tangents alone (recorded by running both branches once on x, as
 * capture does), the tensors those capture lifted into shared inputs (kiln_bodies_lift). Two nodes,
 * so the values never read a tangent (linearize cuts between them). */
static kiln_status apply_if(const kiln_graph *g, const kiln_node *n, kiln_tensor **ins, kiln_tensor **tins, bool tangent,
                            kiln_tensor **outs) {
    int nb = n->nin - 1, ny = n->nout;
    kiln_graph *bodies[2] = {NULL, NULL};
    int64_t ids[2] = {-1, -1};
    kiln_tensor **lifted = NULL, **in = NULL;
    bool *owned = NULL;
    int nlifted = 0;
    kiln_status st = KILN_OK;
    for (int k = 0; k < 2 && st == KILN_OK; k++) {
        kiln_graph *branch = NULL;
        st = kiln_graph_body(g, n, k, &branch);
        if (st == KILN_OK) st = tangent ? kiln_jvp_graph(branch, nb, ins + 1, &bodies[k]) : kiln_graph_clone(branch, &bodies[k]);
        if (st == KILN_OK && tangent) { /* the tangents alone */
            int32_t touts[KILN_MAX_OUTPUTS];
            for (int j = 0; j < ny; j++) touts[j] = bodies[k]->outputs[ny + j];
            st = kiln_graph_set_outputs(bodies[k], ny, touts);
            if (st == KILN_OK) st = kiln_hooks.eliminate_dead_code(&bodies[k]);
        }
    }
    if (st == KILN_OK) st = kiln_bodies_lift(2, bodies, &lifted, &nlifted);
    int total = 1 + nb + (tangent ? nb : 0) + nlifted;
    in = st == KILN_OK ? kiln_calloc((size_t)total, sizeof *in) : NULL;
    owned = in ? kiln_calloc((size_t)total, sizeof *owned) : NULL;
    if (st == KILN_OK && !owned) st = kiln_error(KILN_ERR_MEMORY, "out of memory in jvp");
    for (int k = 0; k <= nb && st == KILN_OK; k++) in[k] = ins[k];
    for (int k = 0; tangent && k < nb && st == KILN_OK; k++) {
        in[1 + nb + k] = tins[1 + k];
        if (!tins[1 + k]) st = kiln_emit_full(&ins[1 + k]->meta, 0.0, &in[1 + nb + k]), owned[1 + nb + k] = true;
    }
    for (int k = 0; k < nlifted && st == KILN_OK; k++) in[total - nlifted + k] = lifted[k];
    kiln_attrs a = {.ni = KILN_A_IF_NI};
    a.i[KILN_A_IF_NOUT] = ny;
    for (int k = 0; k < 2 && st == KILN_OK; k++) {
        kiln_graph *b = bodies[k];
        bodies[k] = NULL;
        st = kiln_body_register(b, &ids[k]);
        a.i[kiln_op_body_attr(KILN_OP_IF, k)] = ids[k];
    }
    if (st == KILN_OK) st = kiln_apply(KILN_OP_IF, total, in, &a, outs);
    kiln_graph_free(bodies[0]), kiln_graph_free(bodies[1]);
    kiln_body_release(ids[0]), kiln_body_release(ids[1]);
    for (int k = 0; in && owned && k < total; k++)
        if (owned[k]) kiln_tensor_release(in[k]);
    if (lifted) kiln_release_all(lifted, nlifted);
    free(lifted), free(in), free(owned);
    return st;
}


/* ---- while: a while over the pair (values, tangents) ------------------------------------------------
 * while(v..., l...) -> v... (cond and body take (v..., l...)) runs as it is, then (with tangents)
 * while(v..., tv..., l..., tl..., lifted...) -> (v..., tv...): the body its JVP graph, the cond the
 * same cond taking (and ignoring) the tangents, the inputs of both put in that order. */

/* g's inputs in the order `order` (order[k]: the old position of new input k) */
static void permute_inputs(kiln_graph *g, const int *order) {
    int32_t small[2 * KILN_MAX_OUTPUTS + 64];
    for (int k = 0; k < g->ninputs; k++) small[k] = g->inputs[order[k]];
    for (int k = 0; k < g->ninputs; k++) g->inputs[k] = small[k], g->values[small[k]].index = k;
}

/* (v..., l..., tv..., tl...) -> (v..., tv..., l..., tl...) for nv loop values and nl lifted ones */
static void loop_order(kiln_graph *g, int nv, int nl) {
    int order[2 * KILN_MAX_OUTPUTS + 64], m = 0;
    for (int k = 0; k < nv; k++) order[m++] = k;
    for (int k = 0; k < nv; k++) order[m++] = nv + nl + k;
    for (int k = 0; k < nl; k++) order[m++] = nv + k;
    for (int k = 0; k < nl; k++) order[m++] = 2 * nv + nl + k;
    permute_inputs(g, order);
}

static kiln_status apply_while(const kiln_graph *g, const kiln_node *n, kiln_tensor **ins, kiln_tensor **tins,
                               bool tangent, kiln_tensor **outs) {
    int nv = n->nout, nl = n->nin - nv, nres = tangent ? 2 * nv : nv;
    if (nres > KILN_MAX_OUTPUTS || n->nin > 64)
        return kiln_error(KILN_ERR_VALUE, "jvp: a while with %d loop values and %d other inputs (forward mode carries "
                          "at most %d and 64)", nv, nl, KILN_MAX_OUTPUTS / 2);
    kiln_graph *bodies[2] = {NULL, NULL}; /* cond, body */
    int64_t ids[2] = {-1, -1};
    kiln_tensor **lifted = NULL, **in = NULL;
    bool *owned = NULL;
    int nlifted = 0;
    kiln_status st = KILN_OK;
    for (int k = 0; k < 2 && st == KILN_OK; k++) {
        kiln_graph *sub = NULL;
        st = kiln_graph_body(g, n, k, &sub);
        if (st == KILN_OK && tangent && k == 1) st = kiln_jvp_graph(sub, n->nin, ins, &bodies[k]);
        else if (st == KILN_OK) st = kiln_graph_clone(sub, &bodies[k]);
        for (int j = 0; tangent && k == 0 && j < n->nin && st == KILN_OK; j++) { /* the cond's unused tangents */
            int32_t v;
            st = kiln_graph_add_input(bodies[0], &ins[j]->meta, &v);
        }
        if (st == KILN_OK && tangent) loop_order(bodies[k], nv, nl);
    }
    if (st == KILN_OK) st = kiln_bodies_lift(2, bodies, &lifted, &nlifted);
    int total = (tangent ? 2 * n->nin : n->nin) + nlifted;
    in = st == KILN_OK ? kiln_calloc((size_t)total, sizeof *in) : NULL;
    owned = in ? kiln_calloc((size_t)total, sizeof *owned) : NULL;
    if (st == KILN_OK && !owned) st = kiln_error(KILN_ERR_MEMORY, "out of memory in jvp");
    /* the inputs in the loop's order: v, (tv), l, (tl), lifted */
    int m = 0;
    for (int part = 0; part < 4 && st == KILN_OK; part++) {
        bool tan_part = part == 1 || part == 3;
        if (tan_part && !tangent) continue;
        int from = part < 2 ? 0 : nv, count = part < 2 ? nv : nl;
        for (int k = from; k < from + count && st == KILN_OK; k++, m++) {
            if (!tan_part) in[m] = ins[k];
            else if (tins[k]) in[m] = tins[k];
            else st = kiln_emit_full(&ins[k]->meta, 0.0, &in[m]), owned[m] = true;
        }
    }
    for (int k = 0; k < nlifted && st == KILN_OK; k++) in[m++] = lifted[k];
    kiln_attrs a = {.ni = KILN_A_IF_NI};
    a.i[KILN_A_WHILE_NOUT] = nres;
    for (int k = 0; k < 2 && st == KILN_OK; k++) {
        kiln_graph *b = bodies[k];
        bodies[k] = NULL;
        st = kiln_body_register(b, &ids[k]);
        a.i[kiln_op_body_attr(KILN_OP_WHILE, k)] = ids[k];
    }
    kiln_tensor *all[KILN_MAX_OUTPUTS] = {0};
    if (st == KILN_OK) st = kiln_apply(KILN_OP_WHILE, total, in, &a, all);
    if (st == KILN_OK) { /* the values, or (with tangents) the tangents */
        for (int k = 0; k < nv; k++) {
            outs[k] = all[tangent ? nv + k : k];
            kiln_tensor_release(tangent ? all[k] : NULL);
        }
    }
    kiln_graph_free(bodies[0]), kiln_graph_free(bodies[1]);
    kiln_body_release(ids[0]), kiln_body_release(ids[1]);
    for (int k = 0; in && owned && k < total; k++)
        if (owned[k]) kiln_tensor_release(in[k]);
    if (lifted) kiln_release_all(lifted, nlifted);
    free(lifted), free(in), free(owned);
    return st;
}

static kiln_status run_control(const kiln_graph *g, const kiln_node *n, slots *s, kiln_tensor **ins, kiln_tensor **tins,
                               bool any, control_apply apply) {
    kiln_tensor *outs[KILN_MAX_OUTPUTS] = {0};
    KILN_TRY(apply(g, n, ins, tins, false, outs));
    for (int k = 0; k < n->nout; k++) s->val[n->out[k]] = outs[k], outs[k] = NULL;
    if (!any) return KILN_OK;
    KILN_TRY(apply(g, n, ins, tins, true, outs));
    for (int k = 0; k < n->nout; k++) {
        if (carries(&outs[k]->meta)) s->tan[n->out[k]] = outs[k];
        else kiln_tensor_release(outs[k]);
    }
    return KILN_OK;
}

bool kiln_jvp_supports(kiln_op op) { return op == KILN_OP_IF || op == KILN_OP_WHILE || kiln_op_jvp(op) != NULL; }

kiln_status kiln_jvp_run(const kiln_graph *g, int nin, kiln_tensor *const *x, kiln_tensor *const *t, int nout,
                         kiln_tensor **y, kiln_tensor **ty) {
    if (nin != g->ninputs || nout != g->noutputs)
        return kiln_error(KILN_ERR_VALUE, "jvp: the function takes %d inputs and returns %d values, got %d and %d",
                          g->ninputs, g->noutputs, nin, nout);
    slots s = {.n = g->nvalues};
    int32_t width = 1;
    for (int32_t i = 0; i < g->nnodes; i++) width = g->nodes[i].nin > width ? g->nodes[i].nin : width;
    s.val = kiln_calloc((size_t)(s.n ? s.n : 1), sizeof *s.val);
    s.tan = kiln_calloc((size_t)(s.n ? s.n : 1), sizeof *s.tan);
    kiln_tensor **ins = kiln_calloc((size_t)width, sizeof *ins), **tins = kiln_calloc((size_t)width, sizeof *tins);
    bool *has = kiln_calloc((size_t)width, sizeof *has);
    kiln_status st = s.val && s.tan && ins && tins && has ? KILN_OK : kiln_error(KILN_ERR_MEMORY, "out of memory in jvp");
    for (int k = 0; k < nin && st == KILN_OK; k++) {
        int32_t v = g->inputs[k];
        kiln_tensor_retain(x[k]);
        s.val[v] = x[k];
        if (t && t[k] && carries(&x[k]->meta)) {
            if (t[k]->meta.dtype != x[k]->meta.dtype || !kiln_meta_equal(&t[k]->meta, &x[k]->meta)) {
                char a[160], b[160];
                st = kiln_error(KILN_ERR_VALUE, "jvp: tangent %d has shape %s and dtype %s, its input %s and %s", k,
                                kiln_shape_str(&t[k]->meta, a, sizeof a), kiln_dtype_name(t[k]->meta.dtype),
                                kiln_shape_str(&x[k]->meta, b, sizeof b), kiln_dtype_name(x[k]->meta.dtype));
                break;
            }
            kiln_tensor_retain(t[k]);
            s.tan[v] = t[k];
        }
    }
    for (int32_t c = 0; c < g->ncaptures && st == KILN_OK; c++) {
        const kiln_value *cv = &g->values[g->captures[c]];
        if (cv->constant) { /* a constant of the recording (a Python number): one of the enclosing trace's too, so
                               kiln.trace compares it call by call rather than reading the old copy live */
            kiln_tensor *alias = NULL;
            st = kiln_tensor_detach(cv->bound, &alias);
            if (st == KILN_OK) alias->literal = true;
            s.val[g->captures[c]] = alias;
        } else {
            kiln_tensor_retain(cv->bound);
            s.val[g->captures[c]] = cv->bound;
        }
    }
    for (int32_t i = 0; i < g->nnodes && st == KILN_OK; i++) {
        const kiln_node *n = &g->nodes[i];
        st = run_node(g, n, &s, ins, tins, has);
        if (st != KILN_OK && n->loc >= 0 && kiln_op_jvp(n->op) && !kiln_op_is_control(n->op))
            kiln_error_context(st, "%s (%s)", kiln_op_table[n->op].name, g->locs[n->loc]);
    }
    for (int k = 0; k < nout && st == KILN_OK; k++) {
        int32_t v = g->outputs[k];
        y[k] = s.val[v];
        kiln_tensor_retain(y[k]);
        if (!ty) continue;
        ty[k] = s.tan[v];
        if (ty[k]) kiln_tensor_retain(ty[k]);
        else st = kiln_emit_full(&y[k]->meta, 0.0, &ty[k]);
    }
    if (st != KILN_OK) {
        for (int k = 0; k < nout; k++) {
            kiln_tensor_release(y[k]), y[k] = NULL;
            if (ty) kiln_tensor_release(ty[k]), ty[k] = NULL;
        }
    }
    slots_free(&s);
    free(ins), free(tins), free(has);
    return st;
}

kiln_status kiln_jvp_graph(const kiln_graph *g, int nin, kiln_tensor *const *x, kiln_graph **out) {
    *out = NULL;
    if (nin != g->ninputs)
        return kiln_error(KILN_ERR_VALUE, "jvp: the function takes %d inputs, got %d", g->ninputs, nin);
    int ny = g->noutputs, total = 2 * nin;
    kiln_tensor **in = kiln_calloc((size_t)(total ? total : 1), sizeof *in);
    kiln_tensor **res = kiln_calloc((size_t)(2 * ny + 1), sizeof *res);
    int32_t *ids = kiln_calloc((size_t)(2 * ny + 1), sizeof *ids);
    kiln_status s = in && res && ids ? KILN_OK : kiln_error(KILN_ERR_MEMORY, "out of memory building a JVP graph");
    /* the inputs and the zero tangents the recording runs on (made before it begins: inputs of it) */
    for (int k = 0; k < nin && s == KILN_OK; k++) s = kiln_tensor_detach(x[k], &in[k]);
    for (int k = 0; k < nin && s == KILN_OK; k++) s = kiln_emit_full(&x[k]->meta, 0.0, &in[nin + k]);
    kiln_tracer *tr = NULL;
    if (s == KILN_OK) s = kiln_tracer_begin(&tr);
    bool prev = kiln_set_grad_enabled(false);
    for (int k = 0; k < total && s == KILN_OK; k++) s = kiln_tracer_add_input(tr, in[k]);
    if (s == KILN_OK) s = kiln_jvp_run(g, nin, in, in + nin, ny, res, res + ny);
    for (int k = 0; k < 2 * ny && s == KILN_OK; k++) s = kiln_tracer_value_of(tr, res[k], &ids[k]);
    kiln_set_grad_enabled(prev);
    kiln_graph *jg = NULL;
    if (tr) {
        kiln_tracer_end(tr);
        if (s == KILN_OK) s = kiln_tracer_status(tr);
        if (s == KILN_OK) s = kiln_graph_set_outputs(kiln_tracer_graph(tr), 2 * ny, ids);
        if (s == KILN_OK) s = kiln_graph_clone(kiln_tracer_graph(tr), &jg);
        kiln_tracer_free(tr);
    }
    if (s == KILN_OK) s = kiln_hooks.eliminate_dead_code ? kiln_hooks.eliminate_dead_code(&jg)
                                                         : kiln_error(KILN_ERR_RUNTIME, "no pass pipeline registered");
    if (s == KILN_OK) *out = jg;
    else kiln_graph_free(jg);
    if (in) kiln_release_all(in, total);
    if (res) kiln_release_all(res, 2 * ny);
    free(in), free(res), free(ids);
    return s;
}

/* Per value of jg: whether it reads a tangent input (inputs nin..2 nin-1), directly or not. */
static bool *tangent_values(const kiln_graph *jg, int nin) {
    bool *dep = kiln_calloc((size_t)(jg->nvalues ? jg->nvalues : 1), sizeof *dep);
    if (!dep) return NULL;
    for (int k = nin; k < jg->ninputs; k++) dep[jg->inputs[k]] = true;
    for (int32_t i = 0; i < jg->nnodes; i++) {
        const kiln_node *n = &jg->nodes[i];
        bool d = false;
        for (int k = 0; k < n->nin && !d; k++) d = dep[n->in[k]];
        for (int k = 0; k < n->nout; k++) dep[n->out[k]] = d;
    }
    return dep;
}

kiln_status kiln_jvp_linearize(const kiln_graph *g, int nin, kiln_tensor *const *x, kiln_graph **primal,
                               kiln_graph **linear, int32_t *nresiduals) {
    *primal = *linear = NULL;
    kiln_graph *jg = NULL, *fwd = NULL, *lin = NULL;
    KILN_TRY(kiln_jvp_graph(g, nin, x, &jg));
    int ny = g->noutputs;
    bool *dep = tangent_values(jg, nin);
    bool *kept = kiln_calloc((size_t)(jg->nvalues ? jg->nvalues : 1), sizeof *kept);
    int32_t *outs = kiln_calloc((size_t)(jg->nvalues + 2 * ny + 1), sizeof *outs);
    kiln_status s = dep && kept && outs ? KILN_OK : kiln_error(KILN_ERR_MEMORY, "out of memory in linearize");
    /* the forward values the tangent part reads become outputs of the forward, so the split keeps the
     * nodes that make them there and the linear part reads them as residuals */
    int32_t nout = 0, nr = 0;
    for (int k = 0; k < ny && s == KILN_OK; k++) outs[nout++] = jg->outputs[k];
    for (int32_t i = 0; i < jg->nnodes && s == KILN_OK; i++) {
        const kiln_node *n = &jg->nodes[i];
        if (!dep[n->out[0]]) continue;
        for (int k = 0; k < n->nin; k++) {
            int32_t v = n->in[k];
            if (!dep[v] && !kept[v] && jg->values[v].kind == KILN_VALUE_NODE) kept[v] = true, outs[nout++] = v, nr++;
        }
    }
    for (int k = 0; k < ny && s == KILN_OK; k++) {
        int32_t v = jg->outputs[ny + k];
        if (!dep[v] && !kept[v] && jg->values[v].kind == KILN_VALUE_NODE) kept[v] = true, outs[nout++] = v, nr++;
    }
    for (int k = 0; k < ny && s == KILN_OK; k++) outs[nout++] = jg->outputs[ny + k];
    int32_t nres = 0;
    if (s == KILN_OK) s = kiln_graph_set_outputs(jg, nout, outs);
    if (s == KILN_OK) s = kiln_graph_split(jg, nin, ny + nr, &fwd, &lin, &nres);
    /* the forward returns y..., the kept values..., the residuals: keep y and the residuals */
    if (s == KILN_OK) {
        int32_t m = 0;
        for (int k = 0; k < ny; k++) outs[m++] = fwd->outputs[k];
        for (int k = 0; k < nres; k++) outs[m++] = fwd->outputs[ny + nr + k];
        s = kiln_graph_set_outputs(fwd, m, outs);
    }
    if (s == KILN_OK) s = kiln_hooks.eliminate_dead_code(&fwd);
    if (s == KILN_OK) {
        *primal = fwd, *linear = lin, *nresiduals = nres;
        fwd = lin = NULL;
    }
    kiln_graph_free(jg), kiln_graph_free(fwd), kiln_graph_free(lin);
    free(dep), free(kept), free(outs);
    return s;
}
