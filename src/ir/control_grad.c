/* Gradient rules of control flow. Each builds the backward of a body as a body of its own:
 * the forward body is run eagerly (kiln_body_interpret) under a nested tracer with autograd on,
 * and the gradients kiln_autograd_grad computes are recorded into the same trace. The rules
 * then emit control-flow nodes over those backward bodies, so a traced backward stays a graph:
 * `if` over the two branches' backwards, `while_grad` for a loop. They live with the tracer
 * and the body registry they use; the tape (src/autograd) reaches them through the op table. */
#include "control.h"
#include "../core/hooks.h"
#include "trace_internal.h"

#include "kiln/autograd.h"

static kiln_status zeros_view(const kiln_meta *m, kiln_tensor **out);
static kiln_status residual_bodies(int64_t fwd, int nx, kiln_tensor *const *x, const bool *want, int ny,
                                   kiln_tensor *const *gy, int64_t *fid, int64_t *bid, int *nres,
                                   int64_t *res_bytes);

/* A gradient nobody asked for (want[k] false: an operand or captured tensor that needs none) is
 * returned by a backward body as the input itself: handed out without a copy, where zeros of a
 * big captured tensor (a scan's xs), a view of a constant once optimized, would be copied out of
 * the compiled body every step. The nodes emitted over the body never hand it on: `if` gives
 * gradients only to the inputs that need them, and while_grad reads it as zeros (control_flow.c,
 * backward_facts). */

/* gx[0..nwrt) holds the gradients of the inputs that required them, in order: spread them to
 * gx[0..nx): the input itself where none was asked for (see above), zeros where none flows. */
static kiln_status spread_gradients(int nx, kiln_tensor *const *x, kiln_tensor *const *alias, const bool *want,
                                    int nwrt, kiln_tensor **gx) {
    kiln_status s = KILN_OK;
    for (int k = nx - 1, j = nwrt - 1; k >= 0 && s == KILN_OK; k--) {
        kiln_tensor *gk = NULL;
        if (alias[k]->requires_grad) {
            gk = gx[j];
            gx[j--] = NULL;
        }
        if (!gk && !want[k]) kiln_tensor_retain(gk = alias[k]);
        else if (!gk) s = zeros_view(&x[k]->meta, &gk);
        gx[k] = gk;
    }
    return s;
}

/* Ends the recording of a gradient body whose outputs are outs[0..nx) and copies its graph to *g
 * (status s so far; the tracer is freed). */
static kiln_status end_gradient_trace(kiln_tracer *t, kiln_status s, int nx, const int32_t *outs, kiln_graph **g) {
    kiln_tracer_end(t);
    if (s == KILN_OK) s = kiln_tracer_status(t);
    if (s == KILN_OK) s = kiln_graph_set_outputs(kiln_tracer_graph(t), nx, outs);
    if (s == KILN_OK) s = kiln_graph_clone(kiln_tracer_graph(t), g);
    kiln_tracer_free(t);
    return s;
}

/* A graph (x..., gy...) -> (gx...) computing the gradients of body `fwd` (inputs x, outputs
 * whose incoming gradients are gy) with respect to the float x that `want` names (zeros for the
 * others, and where none flows), registered as *id. x and gy give the values the body is run on
 * while recording (and the metas). */
static kiln_status backward_body(int64_t fwd, int nx, kiln_tensor *const *x, const bool *want, int ny,
                                 kiln_tensor *const *gy, int64_t *id) {
    kiln_tracer *tr = NULL;
    int total = nx + ny;
    kiln_tensor **alias = kiln_calloc((size_t)(total ? total : 1), sizeof *alias);
    kiln_tensor **y = kiln_calloc((size_t)(ny ? ny : 1), sizeof *y);
    kiln_tensor **gx = kiln_calloc((size_t)(nx ? nx : 1), sizeof *gx);
    kiln_tensor **roots = kiln_calloc((size_t)(ny ? ny : 1), sizeof *roots);
    kiln_tensor **groots = kiln_calloc((size_t)(ny ? ny : 1), sizeof *groots);
    kiln_tensor **wrt = kiln_calloc((size_t)(nx ? nx : 1), sizeof *wrt);
    int32_t *outs = kiln_calloc((size_t)(nx ? nx : 1), sizeof *outs);
    kiln_graph *g = NULL;
    kiln_status s = alias && y && gx && roots && groots && wrt && outs
                        ? KILN_OK : kiln_error(KILN_ERR_MEMORY, "out of memory building a backward body");
    if (s == KILN_OK) s = kiln_tracer_begin(&tr);
    if (tr) kiln_tracer_set_capture_constants(tr, true); /* only the forward body's constants are met */
    bool prev_grad = kiln_set_grad_enabled(true);
    for (int k = 0; k < total && s == KILN_OK; k++) {
        kiln_tensor *src = k < nx ? x[k] : gy[k - nx];
        s = kiln_tensor_detach(src, &alias[k]);
        if (s == KILN_OK && k < nx && want[k] && kiln_dtype_is_float(src->meta.dtype)) alias[k]->requires_grad = true;
        if (s == KILN_OK) s = kiln_tracer_add_input(tr, alias[k]);
    }
    if (s == KILN_OK) s = kiln_body_interpret(fwd, nx, alias, ny, y);
    int nroots = 0, nwrt = 0;
    for (int k = 0; k < ny && s == KILN_OK; k++)
        if (y[k]->requires_grad) roots[nroots] = y[k], groots[nroots++] = alias[nx + k];
    for (int k = 0; k < nx; k++)
        if (alias && alias[k] && alias[k]->requires_grad) wrt[nwrt++] = alias[k];
    kiln_set_grad_enabled(false);
    if (s == KILN_OK && nroots && nwrt) s = kiln_autograd_grad(nroots, roots, groots, nwrt, wrt, false, gx);
    if (s == KILN_OK) s = spread_gradients(nx, x, alias, want, nwrt, gx);
    for (int k = 0; k < nx && s == KILN_OK; k++) s = kiln_tracer_value_of(tr, gx[k], &outs[k]);
    kiln_set_grad_enabled(prev_grad);
    if (tr) s = end_gradient_trace(tr, s, nx, outs, &g);
    /* the forward ops the gradients do not read (the pass pipeline, a layer above, fills the hook) */
    if (s == KILN_OK) s = kiln_hooks.eliminate_dead_code ? kiln_hooks.eliminate_dead_code(&g)
                                                         : kiln_error(KILN_ERR_RUNTIME, "no pass pipeline registered");
    if (s == KILN_OK) s = kiln_body_register(g, id);
    else kiln_graph_free(g);
    if (alias) kiln_release_all(alias, total);
    if (y) kiln_release_all(y, ny);
    if (gx) kiln_release_all(gx, nx);
    free(alias), free(y), free(gx), free(roots), free(groots), free(wrt), free(outs);
    if (s != KILN_OK) kiln_error_context(s, "building the backward of a control-flow body");
    return s;
}

/* ---- stored residuals -------------------------------------------------------------------------- */

static _Atomic int64_t residual_budget = KILN_LOOP_RESIDUAL_BUDGET_DEFAULT;

void kiln_set_loop_residual_budget(int64_t bytes) { residual_budget = bytes < 0 ? 0 : bytes; }
int64_t kiln_loop_residual_budget(void) { return residual_budget; }

/* The stored-residual split of body `fwd` ((x...) -> y...; x[0..ny) the loop values, the rest
 * lifted tensors): F, (x...) -> (y..., r...), the body also returning the values its backward
 * reads (the residuals r: values the body computes, and the loop values it reads), and B,
 * (x..., gy..., r...) -> (gx...), the backward reading them instead of recomputing the body (and
 * reading none of x[0..ny): a loop then keeps no history of its loop values). The forward is run
 * under tracer A with autograd on; the gradients are recorded under tracer B nested in it, whose
 * inputs for the loop values are stand-ins, so every value of A that B reads, the loop values
 * included, becomes a capture of B: those are the residuals, turned into B's trailing inputs and
 * A's extra outputs. *nres residuals, *res_bytes bytes per step (-1 when a size is symbolic).
 * want: as in backward_body. */
static kiln_status residual_bodies(int64_t fwd, int nx, kiln_tensor *const *x, const bool *want, int ny,
                                   kiln_tensor *const *gy, int64_t *fid, int64_t *bid, int *nres,
                                   int64_t *res_bytes) {
    kiln_tracer *ta = NULL, *tb = NULL;
    int total = nx + ny;
    size_t n1 = (size_t)(total ? total : 1);
    kiln_tensor **alias = kiln_calloc(n1, sizeof *alias), **y = kiln_calloc(n1, sizeof *y);
    kiln_tensor **gx = kiln_calloc(n1, sizeof *gx), **roots = kiln_calloc(n1, sizeof *roots);
    kiln_tensor **groots = kiln_calloc(n1, sizeof *groots), **wrt = kiln_calloc(n1, sizeof *wrt);
    kiln_tensor **stand_in = kiln_calloc(n1, sizeof *stand_in); /* B's inputs for the loop values */
    int32_t *outs = kiln_calloc(n1, sizeof *outs);
    int32_t *resv = NULL; /* B's captured values that are A's: the residuals */
    kiln_graph *fg = NULL, *bg = NULL;
    *fid = *bid = -1, *nres = 0, *res_bytes = 0;
    kiln_status s = alias && y && gx && roots && groots && wrt && stand_in && outs
                        ? KILN_OK : kiln_error(KILN_ERR_MEMORY, "out of memory building a backward body");
    if (s == KILN_OK) s = kiln_tracer_begin(&ta);
    if (ta) kiln_tracer_set_capture_constants(ta, true); /* only the forward body's constants are met */
    bool prev_grad = kiln_set_grad_enabled(true);
    for (int k = 0; k < total && s == KILN_OK; k++) {
        kiln_tensor *src = k < nx ? x[k] : gy[k - nx];
        s = kiln_tensor_detach(src, &alias[k]);
        if (s == KILN_OK && k < nx && want[k] && kiln_dtype_is_float(src->meta.dtype)) alias[k]->requires_grad = true;
        if (s == KILN_OK && k < nx) s = kiln_tracer_add_input(ta, alias[k]);
    }
    if (s == KILN_OK) s = kiln_body_interpret(fwd, nx, alias, ny, y);
    if (s == KILN_OK) s = kiln_tracer_begin(&tb); /* nested in A: what it reads of A, it captures */
    for (int k = 0; k < ny && s == KILN_OK; k++) s = kiln_tensor_empty_like_meta(&alias[k]->meta, &stand_in[k]);
    for (int k = 0; k < total && s == KILN_OK; k++) s = kiln_tracer_add_input(tb, k < ny ? stand_in[k] : alias[k]);
    int nroots = 0, nwrt = 0;
    for (int k = 0; k < ny && s == KILN_OK; k++)
        if (y[k]->requires_grad) roots[nroots] = y[k], groots[nroots++] = alias[nx + k];
    for (int k = 0; k < nx; k++)
        if (alias[k] && alias[k]->requires_grad) wrt[nwrt++] = alias[k];
    if (s == KILN_OK && nroots && nwrt) s = kiln_autograd_grad(nroots, roots, groots, nwrt, wrt, false, gx);
    kiln_set_grad_enabled(false);
    if (s == KILN_OK) s = spread_gradients(nx, x, alias, want, nwrt, gx);
    for (int k = 0; k < nx && s == KILN_OK; k++) s = kiln_tracer_value_of(tb, gx[k], &outs[k]);
    kiln_set_grad_enabled(prev_grad);
    if (tb) s = end_gradient_trace(tb, s, nx, outs, &bg);
    /* B's captures: A's values become residuals; the rest are the forward body's constants */
    int ncap = bg ? bg->ncaptures : 0;
    if (s == KILN_OK) {
        resv = kiln_calloc((size_t)(ncap ? ncap : 1), sizeof *resv);
        if (!resv) s = kiln_error(KILN_ERR_MEMORY, "out of memory building a backward body");
    }
    for (int32_t c = 0; c < ncap && s == KILN_OK; c++) {
        kiln_value *v = &bg->values[bg->captures[c]];
        if (v->constant) continue;
        if (!kiln_tracer_knows(ta, v->bound)) {
            v->constant = true;
            continue;
        }
        /* tensors aliasing one value of A (detached copies autograd saved) are one residual */
        int32_t va = -1, vb = -1;
        s = kiln_tracer_value_of(ta, v->bound, &va);
        for (int k = 0; k < *nres && s == KILN_OK && vb < 0; k++) {
            int32_t other = -1;
            s = kiln_tracer_value_of(ta, bg->values[resv[k]].bound, &other);
            if (other == va) vb = resv[k];
        }
        if (s != KILN_OK) break;
        if (vb < 0) {
            resv[(*nres)++] = bg->captures[c];
            continue;
        }
        for (int32_t i = 0; i < bg->nnodes; i++)
            for (int j = 0; j < bg->nodes[i].nin; j++)
                if (bg->nodes[i].in[j] == bg->captures[c]) bg->nodes[i].in[j] = vb;
        for (int32_t j = 0; j < bg->noutputs; j++)
            if (bg->outputs[j] == bg->captures[c]) bg->outputs[j] = vb;
        v->constant = true; /* (read by nothing now) */
    }
    /* A's outputs: y..., then the residuals' values in A; B's trailing inputs: the residuals */
    int32_t *fouts = s == KILN_OK ? kiln_calloc((size_t)(ny + *nres ? ny + *nres : 1), sizeof *fouts) : NULL;
    if (s == KILN_OK && !fouts) s = kiln_error(KILN_ERR_MEMORY, "out of memory building a backward body");
    for (int k = 0; k < ny && s == KILN_OK; k++) s = kiln_tracer_value_of(ta, y[k], &fouts[k]);
    for (int k = 0; k < *nres && s == KILN_OK; k++) {
        const kiln_value *v = &bg->values[resv[k]];
        s = kiln_tracer_value_of(ta, v->bound, &fouts[ny + k]);
        int64_t bytes = kiln_meta_numel(&v->meta) * (int64_t)kiln_dtype_size(v->meta.dtype);
        for (int d = 0; d < v->meta.ndim; d++)
            if (v->sym[d]) bytes = -1;
        if (bytes < 0 || *res_bytes < 0) *res_bytes = -1;
        else *res_bytes += bytes;
    }
    for (int k = 0; k < *nres && s == KILN_OK; k++) s = kiln_graph_capture_to_input(bg, resv[k]);
    if (ta) {
        kiln_tracer_end(ta);
        if (s == KILN_OK) s = kiln_tracer_status(ta);
        if (s == KILN_OK) s = kiln_graph_set_outputs(kiln_tracer_graph(ta), ny + *nres, fouts);
        if (s == KILN_OK) s = kiln_graph_clone(kiln_tracer_graph(ta), &fg);
        kiln_tracer_free(ta);
    }
    free(fouts);
    if (s == KILN_OK && !kiln_hooks.eliminate_dead_code)
        s = kiln_error(KILN_ERR_RUNTIME, "no pass pipeline registered");
    if (s == KILN_OK) s = kiln_hooks.eliminate_dead_code(&fg);
    if (s == KILN_OK) s = kiln_hooks.eliminate_dead_code(&bg);
    if (s == KILN_OK) s = kiln_body_register(fg, fid), fg = NULL;
    if (s == KILN_OK) s = kiln_body_register(bg, bid), bg = NULL;
    kiln_graph_free(fg);
    kiln_graph_free(bg);
    if (s != KILN_OK) {
        kiln_body_release(*fid);
        *fid = -1;
    }
    if (alias) kiln_release_all(alias, total);
    if (y) kiln_release_all(y, ny);
    if (gx) kiln_release_all(gx, nx);
    if (stand_in) kiln_release_all(stand_in, ny);
    free(alias), free(y), free(gx), free(roots), free(groots), free(wrt), free(stand_in), free(outs), free(resv);
    if (s != KILN_OK) kiln_error_context(s, "building the stored-residual backward of a loop body");
    return s;
}

/* Zeros of meta m as a view of one zero (expand of a 0-d full): a backward body's gradient that
 * nothing flows into costs no full-size buffer per iteration (control_flow.c's backward_facts
 * knows it for zeros and does not accumulate it). */
static kiln_status zeros_view(const kiln_meta *m, kiln_tensor **out) {
    if (m->ndim == 0) return kiln_emit_full(m, 0.0, out);
    kiln_tensor *zero = NULL;
    KILN_TRY(kiln_emit_scalar(0.0, m->dtype, &zero));
    kiln_status s = kiln_emit_expand(zero, m->ndim, m->shape, out);
    kiln_tensor_release(zero);
    return s;
}

/* gout[k], or zeros of output k's meta when it got no gradient (new references). */
static kiln_status output_grads(const kiln_grad_ctx *ctx, kiln_tensor *const *gout, kiln_tensor **gy) {
    for (int k = 0; k < ctx->nout; k++) {
        if (gout[k]) {
            kiln_tensor_retain(gout[k]);
            gy[k] = gout[k];
        } else {
            KILN_TRY(kiln_emit_full(&ctx->out_meta[k], 0.0, &gy[k]));
        }
    }
    return KILN_OK;
}

static bool any_needed(const kiln_grad_ctx *ctx, int from) {
    for (int k = from; k < ctx->nin; k++)
        if (ctx->needs_grad[k]) return true;
    return false;
}

/* Runs op over (prefix..., gy...) and hands the outputs to the inputs that need them. */
static kiln_status emit(const kiln_grad_ctx *ctx, kiln_op op, const kiln_attrs *a, int nprefix,
                        kiln_tensor *const *prefix, kiln_tensor *const *gy, int first_input, kiln_tensor **gin) {
    int nin = nprefix + ctx->nout, nout = kiln_op_nout(op, a);
    kiln_tensor **in = kiln_malloc(sizeof *in * (size_t)nin);
    kiln_tensor *outs[KILN_MAX_OUTPUTS] = {0};
    if (!in) return kiln_error(KILN_ERR_MEMORY, "out of memory in a gradient");
    memcpy(in, prefix, sizeof *in * (size_t)nprefix);
    memcpy(in + nprefix, gy, sizeof *in * (size_t)ctx->nout);
    kiln_status s = kiln_apply(op, nin, in, a, outs);
    free(in);
    if (s != KILN_OK) return s;
    for (int k = 0; k < nout; k++) {
        if (ctx->needs_grad[first_input + k]) gin[first_input + k] = outs[k];
        else kiln_tensor_release(outs[k]);
    }
    return KILN_OK;
}

static kiln_status grad_if(const kiln_grad_ctx *ctx, kiln_tensor *const *gout, kiln_tensor **gin) {
    if (!any_needed(ctx, 1)) return KILN_OK;
    int nx = ctx->nin - 1;
    if (nx > KILN_MAX_OUTPUTS)
        return kiln_error(KILN_ERR_NOT_IMPLEMENTED, "if: gradients of more than %d operands and captured tensors",
                          KILN_MAX_OUTPUTS);
    kiln_tensor *gy[KILN_MAX_OUTPUTS] = {0};
    kiln_attrs a = {0};
    int64_t back[2] = {-1, -1}; /* the backward bodies, held for the emitted node's run */
    kiln_status s = output_grads(ctx, gout, gy);
    int64_t then_id = -1, else_id = -1;
    if (s == KILN_OK) s = kiln_attrs_body(KILN_OP_IF, ctx->attrs, 0, &then_id);
    if (s == KILN_OK) s = kiln_attrs_body(KILN_OP_IF, ctx->attrs, 1, &else_id);
    if (s == KILN_OK) s = backward_body(then_id, nx, ctx->in + 1, ctx->needs_grad + 1, ctx->nout, gy, &back[0]);
    if (s == KILN_OK) s = backward_body(else_id, nx, ctx->in + 1, ctx->needs_grad + 1, ctx->nout, gy, &back[1]);
    a.ni = KILN_A_IF_NI;
    a.i[KILN_A_IF_THEN] = back[0], a.i[KILN_A_IF_ELSE] = back[1];
    a.i[KILN_A_IF_NOUT] = nx;
    /* if(pred, x..., gy...) -> gx... */
    if (s == KILN_OK) s = emit(ctx, KILN_OP_IF, &a, ctx->nin, ctx->in, gy, 1, gin);
    kiln_body_release(back[0]);
    kiln_body_release(back[1]);
    kiln_release_all(gy, ctx->nout);
    return s;
}

/* ---- weight gradients stacked over steps ------------------------------------------------------- */

/* Backward body b ((v..., lifted..., gy..., r...) -> (gv..., glifted...): nloop loop values, nstate
 * values before gy) of a storing while: each lifted tensor's gradient that is exactly
 * matmul(permute(r_k, {1, 0}), d) of a 2-D residual r_k and a per-step d (a weight read by
 * x_t @ w) is taken out of the step: b's copy returns d as an extra output instead (the tensor
 * itself in the gradient's place: not accumulated, control_flow.c backward_facts), and
 * stack[3 * n...] records (lifted j, residual k, output m) for the gradient rule, which sums
 * the steps' products as one matmul of every step's rows (grad_while_given). *b becomes the new
 * body (the old one released) when any is found; *nstack of them (at most max). bytes: what
 * the loop stores per step (its residuals); a stacked cotangent is added only while that and the
 * cotangents fit `room` (the budget per step). */
static kiln_status stack_weight_gradients(int64_t *b, int nloop, int nstate, int nres, int max, int64_t room,
                                          int64_t bytes, int64_t *stack, int *nstack) {
    *nstack = 0;
    const kiln_graph *g = kiln_body_graph(*b);
    if (!g) return KILN_ERR_VALUE;
    int nbase = g->ninputs - nres, nd = 0;
    int32_t douts[KILN_MAX_OUTPUTS];
    for (int j = nloop; j < nstate && *nstack < max && g->noutputs == nstate; j++) {
        const kiln_value *v = &g->values[g->outputs[j]];
        if (v->kind != KILN_VALUE_NODE || g->outputs[j] == g->inputs[j]) continue;
        const kiln_node *mm = &g->nodes[v->node];
        if (mm->op != KILN_OP_MATMUL || mm->nin != 2) continue;
        const kiln_value *pv = &g->values[mm->in[0]], *dv = &g->values[mm->in[1]];
        if (pv->kind != KILN_VALUE_NODE || dv->meta.ndim != 2) continue;
        const kiln_node *pm = &g->nodes[pv->node];
        if (pm->op != KILN_OP_PERMUTE || pm->attrs.ni != 2 || pm->attrs.i[KILN_A_PERMUTE_PERM] != 1 ||
            pm->attrs.i[KILN_A_PERMUTE_PERM + 1] != 0)
            continue;
        int k = -1;
        for (int q = 0; q < nres; q++)
            if (g->inputs[nbase + q] == pm->in[0]) k = q;
        if (k < 0 || g->values[pm->in[0]].meta.ndim != 2 || !kiln_meta_equal(&v->meta, &g->values[g->inputs[j]].meta))
            continue;
        int m = -1;
        for (int q = 0; q < nd; q++)
            if (douts[q] == mm->in[1]) m = q;
        int64_t dbytes = kiln_meta_numel(&dv->meta) * (int64_t)kiln_dtype_size(dv->meta.dtype);
        if (m < 0 && (nstate + nd >= KILN_MAX_OUTPUTS || bytes + dbytes > room)) continue;
        if (m < 0) douts[m = nd++] = mm->in[1], bytes += dbytes;
        stack[3 * *nstack] = j - nloop, stack[3 * *nstack + 1] = k, stack[3 * *nstack + 2] = m;
        (*nstack)++;
    }
    if (!*nstack) return KILN_OK;
    int32_t outs[2 * KILN_MAX_OUTPUTS];
    memcpy(outs, g->outputs, sizeof *outs * (size_t)nstate);
    for (int t = 0; t < *nstack; t++) {
        int j = nloop + (int)stack[3 * t];
        outs[j] = g->inputs[j];
    }
    memcpy(outs + nstate, douts, sizeof *outs * (size_t)nd);
    kiln_graph *copy = NULL;
    int64_t id = -1;
    kiln_status s = kiln_graph_clone(g, &copy);
    if (s == KILN_OK) s = kiln_graph_set_outputs(copy, nstate + nd, outs);
    if (s == KILN_OK) s = kiln_hooks.eliminate_dead_code(&copy);
    if (s == KILN_OK) s = kiln_body_register(copy, &id), copy = NULL;
    kiln_graph_free(copy);
    if (s != KILN_OK) {
        *nstack = 0;
        return s;
    }
    kiln_body_release(*b);
    *b = id;
    return KILN_OK;
}

/* gin[nloop + j] for each stacked weight gradient of the while's STACK: sum over steps of
 * permute(r_k) @ d_m, as permute(R_k as (T*rows, n)) @ (D_m as (T*rows, p)). */
static kiln_status stacked_gradients(const kiln_grad_ctx *ctx, int nloop, kiln_tensor *const *res,
                                     kiln_tensor *const *stacked, kiln_tensor **gin) {
    int n = (int)kiln_attr_int(ctx->attrs, KILN_A_WHILE_NSTACK, 0);
    kiln_status s = KILN_OK;
    for (int t = 0; t < n && s == KILN_OK; t++) {
        const int64_t *e = &ctx->attrs->i[KILN_A_WHILE_STACK + 3 * t];
        int j = nloop + (int)e[0];
        if (!ctx->needs_grad[j]) continue;
        kiln_tensor *r = res[e[1]], *d = stacked[e[2]], *r2 = NULL, *rt = NULL, *d2 = NULL;
        int64_t rs[2] = {r->meta.shape[0] * r->meta.shape[1], r->meta.shape[2]};
        int64_t ds[2] = {d->meta.shape[0] * d->meta.shape[1], d->meta.shape[2]}, perm[2] = {1, 0};
        s = kiln_emit_reshape(r, 2, rs, &r2);
        if (s == KILN_OK) s = kiln_emit_permute(r2, perm, &rt);
        if (s == KILN_OK) s = kiln_emit_reshape(d, 2, ds, &d2);
        kiln_tensor *pair[2] = {rt, d2};
        static const kiln_attrs none;
        if (s == KILN_OK) s = kiln_apply(KILN_OP_MATMUL, 2, pair, &none, &gin[j]);
        kiln_tensor_release(r2), kiln_tensor_release(rt), kiln_tensor_release(d2);
    }
    return s;
}

/* Whether the residuals of nres values of res_bytes each per step (-1: symbolic) over `trips`
 * steps fit the budget. */
static bool residuals_fit(int nres, int64_t res_bytes, int64_t trips) {
    int64_t budget = kiln_loop_residual_budget();
    return trips > 0 && budget > 0 && res_bytes >= 0 && nres > 0 && res_bytes <= budget / trips;
}

kiln_status kiln_while_for_gradient(int nin, kiln_tensor *const *in, kiln_attrs *a, int64_t *fwd) {
    *fwd = -1;
    int nloop = (int)kiln_attr_int(a, KILN_A_WHILE_NOUT, 0);
    int64_t trips = kiln_attr_int(a, KILN_A_WHILE_TRIPS, 0), body_id = -1;
    bool needed = false;
    for (int k = 0; k < nin; k++) needed |= in[k]->requires_grad && kiln_dtype_is_float(in[k]->meta.dtype);
    if (!needed || !kiln_grad_enabled() || trips <= 0 || kiln_loop_residual_budget() <= 0 || nloop < 1 ||
        nin > KILN_MAX_OUTPUTS || kiln_loop_nres(KILN_OP_WHILE, a) != 0)
        return KILN_OK;
    KILN_TRY(kiln_attrs_body(KILN_OP_WHILE, a, 1, &body_id));
    /* the body's backward as the gradient rule would build it (want: see grad_while); the incoming
     * gradients' values are not read while it is recorded, only their metas */
    bool want[KILN_MAX_OUTPUTS];
    kiln_tensor *gy[KILN_MAX_OUTPUTS] = {0};
    kiln_status s = KILN_OK;
    for (int k = 0; k < nin; k++) want[k] = k < nloop || (in[k]->requires_grad && kiln_dtype_is_float(in[k]->meta.dtype));
    for (int k = 0; k < nloop && s == KILN_OK; k++) {
        s = kiln_tensor_empty_like_meta(&in[k]->meta, &gy[k]);
        if (s == KILN_OK) memset(gy[k]->data, 0, (size_t)gy[k]->numel * kiln_dtype_size(gy[k]->meta.dtype));
    }
    int64_t f = -1, b = -1, res_bytes = -1;
    int nres = 0;
    if (s == KILN_OK) s = residual_bodies(body_id, nin, in, want, nloop, gy, &f, &b, &nres, &res_bytes);
    kiln_release_all(gy, nloop);
    bool fits = s == KILN_OK && residuals_fit(nres, res_bytes, trips) && nloop + nres <= KILN_MAX_OUTPUTS;
    int64_t stack[3 * KILN_MAX_OUTPUTS];
    int nstack = 0, room = (KILN_MAX_ATTR_INTS - KILN_A_WHILE_STACK) / 3;
    if (fits) s = stack_weight_gradients(&b, nloop, nin, nres, room, kiln_loop_residual_budget() / trips, res_bytes,
                                         stack, &nstack);
    if (fits && s == KILN_OK) s = kiln_body_hold(f, b);
    kiln_body_release(b);
    if (!fits || s != KILN_OK) {
        kiln_body_release(f);
        return s;
    }
    a->i[KILN_A_WHILE_BODY] = f;
    a->i[KILN_A_WHILE_NOUT] = nloop + nres;
    a->i[KILN_A_WHILE_BACKWARD] = -1;
    a->i[KILN_A_WHILE_NRES] = nres;
    a->i[KILN_A_WHILE_RES_BYTES] = res_bytes;
    a->i[KILN_A_WHILE_GIVEN] = 0;
    a->i[KILN_A_WHILE_NSTACK] = nstack;
    memcpy(&a->i[KILN_A_WHILE_STACK], stack, sizeof *stack * (size_t)(3 * nstack));
    a->ni = KILN_A_WHILE_STACK + 3 * nstack;
    *fwd = f;
    return KILN_OK;
}

/* The gradient of a while that stored its residuals (kiln_while_for_gradient): while_grad(v0...,
 * lifted..., gv..., R...) over the backward body its forward body holds, no loop run again. */
static kiln_status grad_while_given(const kiln_grad_ctx *ctx, kiln_tensor *const *gout, kiln_tensor **gin) {
    int nres = kiln_loop_nres(KILN_OP_WHILE, ctx->attrs), nloop = ctx->nout - nres, nstate = ctx->nin;
    int64_t fwd = -1, cond_id = -1;
    KILN_TRY(kiln_attrs_body(KILN_OP_WHILE, ctx->attrs, 0, &cond_id));
    KILN_TRY(kiln_attrs_body(KILN_OP_WHILE, ctx->attrs, 1, &fwd));
    int64_t back = kiln_body_held(fwd);
    if (back < 0 || !ctx->out)
        return kiln_error(KILN_ERR_VALUE, "while: a loop recorded with stored residuals has no backward body");
    int nin = nstate + nloop + nres;
    kiln_tensor **in = kiln_calloc((size_t)nin, sizeof *in);
    kiln_tensor *gx[2 * KILN_MAX_OUTPUTS] = {0};
    if (!in) return kiln_error(KILN_ERR_MEMORY, "out of memory in a gradient");
    kiln_status s = KILN_OK;
    memcpy(in, ctx->in, sizeof *in * (size_t)nstate);
    for (int k = 0; k < nloop && s == KILN_OK; k++) {
        if (gout[k]) kiln_tensor_retain(in[nstate + k] = gout[k]);
        else s = kiln_emit_full(&ctx->out_meta[k], 0.0, &in[nstate + k]);
    }
    memcpy(in + nstate + nloop, ctx->out + nloop, sizeof *in * (size_t)nres);
    kiln_attrs a = *ctx->attrs; /* (STACK as the while's) */
    a.i[KILN_A_WHILE_COND] = cond_id;
    a.i[KILN_A_WHILE_BODY] = fwd;
    a.i[KILN_A_WHILE_NOUT] = nstate;
    a.i[KILN_A_WHILE_BACKWARD] = back;
    a.i[KILN_A_WHILE_TRIPS] = kiln_attr_int(ctx->attrs, KILN_A_WHILE_TRIPS, 0);
    a.i[KILN_A_WHILE_NRES] = nres;
    a.i[KILN_A_WHILE_RES_BYTES] = kiln_attr_int(ctx->attrs, KILN_A_WHILE_RES_BYTES, -1);
    a.i[KILN_A_WHILE_GIVEN] = 1;
    int nd = kiln_loop_nstacked(KILN_OP_WHILE_GRAD, &a);
    a.i[KILN_A_WHILE_NOUT] = nstate + nd;
    if (s == KILN_OK) s = kiln_apply(KILN_OP_WHILE_GRAD, nin, in, &a, gx);
    for (int t = 0; t < (int)a.i[KILN_A_WHILE_NSTACK] && s == KILN_OK; t++) { /* (zeros in while_grad's) */
        int j = nloop + (int)a.i[KILN_A_WHILE_STACK + 3 * t];
        kiln_tensor_release(gx[j]);
        gx[j] = NULL;
    }
    if (s == KILN_OK) s = stacked_gradients(ctx, nloop, ctx->out + nloop, gx + nstate, gx);
    for (int k = 0; k < nstate && s == KILN_OK; k++) {
        if (ctx->needs_grad[k]) gin[k] = gx[k];
        else kiln_tensor_release(gx[k]);
        gx[k] = NULL;
    }
    kiln_release_all(gx, nstate + nd);
    for (int k = 0; k < nloop; k++) kiln_tensor_release(in[nstate + k]);
    free(in);
    return s;
}

static kiln_status grad_while(const kiln_grad_ctx *ctx, kiln_tensor *const *gout, kiln_tensor **gin) {
    if (!any_needed(ctx, 0)) return KILN_OK;
    if (kiln_loop_nres(KILN_OP_WHILE, ctx->attrs) > 0) return grad_while_given(ctx, gout, gin);
    int nstate = ctx->nin;
    if (nstate > KILN_MAX_OUTPUTS)
        return kiln_error(KILN_ERR_NOT_IMPLEMENTED, "while: gradients of more than %d loop values and captured tensors",
                          KILN_MAX_OUTPUTS);
    kiln_tensor *gy[KILN_MAX_OUTPUTS] = {0};
    kiln_attrs a = {0};
    int64_t back = -1, fwd = -1; /* the backward (and stored-residual forward) bodies, held for the node's run */
    /* every loop value carries gradients between iterations; a lifted tensor's gradient is made
     * only when it is wanted (the others' are zeros, which while_grad does not accumulate) */
    bool want[KILN_MAX_OUTPUTS];
    for (int k = 0; k < nstate; k++) want[k] = k < ctx->nout || ctx->needs_grad[k];
    kiln_status s = output_grads(ctx, gout, gy);
    int64_t cond_id = -1, body_id = -1;
    int64_t trips = kiln_attr_int(ctx->attrs, KILN_A_WHILE_TRIPS, 0);
    if (s == KILN_OK) s = kiln_attrs_body(KILN_OP_WHILE, ctx->attrs, 0, &cond_id);
    if (s == KILN_OK) s = kiln_attrs_body(KILN_OP_WHILE, ctx->attrs, 1, &body_id);
    /* Stored residuals when the trip count is known and they fit the budget: each step's are
     * stored by the rerun forward, the backward reads them (no recomputation). Else the backward
     * body recomputes the body's internals from each step's loop values. */
    int nres = 0;
    int64_t res_bytes = -1;
    if (s == KILN_OK && trips > 0 && kiln_loop_residual_budget() > 0) {
        s = residual_bodies(body_id, nstate, ctx->in, want, ctx->nout, gy, &fwd, &back, &nres, &res_bytes);
        bool fits = residuals_fit(nres, res_bytes, trips);
        if (s == KILN_OK && !fits) {
            kiln_body_release(fwd), kiln_body_release(back);
            fwd = back = -1, nres = 0;
        }
    }
    if (s == KILN_OK && back < 0) s = backward_body(body_id, nstate, ctx->in, want, ctx->nout, gy, &back);
    a.ni = KILN_A_WHILE_NI;
    a.i[KILN_A_WHILE_COND] = cond_id;
    a.i[KILN_A_WHILE_BODY] = fwd >= 0 ? fwd : body_id;
    a.i[KILN_A_WHILE_NOUT] = nstate;
    a.i[KILN_A_WHILE_BACKWARD] = back;
    a.i[KILN_A_WHILE_TRIPS] = trips;
    a.i[KILN_A_WHILE_NRES] = nres;
    a.i[KILN_A_WHILE_RES_BYTES] = res_bytes;
    /* while_grad(v0..., lifted..., gv...) -> (gv0..., glifted...) */
    if (s == KILN_OK) s = emit(ctx, KILN_OP_WHILE_GRAD, &a, nstate, ctx->in, gy, 0, gin);
    kiln_body_release(back);
    kiln_body_release(fwd);
    kiln_release_all(gy, ctx->nout);
    return s;
}

/* Recorded so that differentiating a loop's gradient again fails loudly instead of giving zeros. */
static kiln_status grad_while_grad(const kiln_grad_ctx *ctx, kiln_tensor *const *gout, kiln_tensor **gin) {
    (void)ctx, (void)gout, (void)gin;
    return kiln_error(KILN_ERR_NOT_IMPLEMENTED,
                      "while_grad: gradients of gradients through a while loop are not supported");
}

static kiln_status grad_control(kiln_op op, const kiln_grad_ctx *ctx, kiln_tensor *const *gout, kiln_tensor **gin) {
    return op == KILN_OP_IF ? grad_if(ctx, gout, gin)
           : op == KILN_OP_WHILE ? grad_while(ctx, gout, gin)
                                 : grad_while_grad(ctx, gout, gin);
}

/* The op table's if / while / while_grad gradient entries run these (src/ops/control_ops.c). */
__attribute__((constructor)) static void register_control_grads(void) { kiln_hooks.control_grad = grad_control; }
