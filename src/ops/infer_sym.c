/* Symbolic shape inference: the output sizes of an op as expressions of its inputs' symbolic
 * sizes and of its attributes given as sizes, by the rule its KILN_SYM line in ops.def names. The
 * concrete inference (kiln_infer on the hints) has already checked the op at the hints and given
 * the dtypes; a rule checks what must hold for every binding of the symbols (equal sizes are the
 * same expression, a slice stays in bounds), and fails
 * naming the op and the shapes where it cannot show it. */
#include "infer_sym.h"

#include <string.h>

typedef kiln_status (*sym_rule)(kiln_symtab *t, const char *op, int nin, const kiln_sshape *in, const kiln_attrs *a,
                                 const kiln_sdim *ai, int nout, kiln_sshape *out);

static kiln_status fail(const kiln_symtab *t, const char *op, int nin, const kiln_sshape *in, const char *what) {
    kiln_strbuf b = {kiln_malloc(256), 0, 256, false};
    if (!b.buf) return kiln_error(KILN_ERR_MEMORY, "out of memory");
    b.buf[0] = '\0';
    for (int k = 0; k < nin; k++) {
        kiln_strbuf_printf(&b, "%s", k == 0 ? "" : (k == nin - 1 ? " and " : ", "));
        kiln_sshape_print(&b, t, &in[k]);
    }
    kiln_status s = b.failed ? kiln_error(KILN_ERR_MEMORY, "out of memory")
                             : kiln_error(KILN_ERR_VALUE, "%s: %s (symbolic shapes %s)", op, what, b.buf);
    free(b.buf);
    return s;
}

static bool is_one(kiln_sdim a) { return a.e == 0 && a.v == 1; }

/* The broadcast of x and y (a 1 against any size gives that size, whatever its binding), or false
 * when it depends on the binding (two other sizes: equal only for some bindings). */
static bool broadcast_dim(kiln_sdim x, kiln_sdim y, kiln_sdim *out) {
    if (kiln_sdim_same(x, y) || is_one(y)) *out = x;
    else if (is_one(x)) *out = y;
    else return false;
    return true;
}

static kiln_status rule_same(kiln_symtab *t, const char *op, int nin, const kiln_sshape *in, const kiln_attrs *a,
                             const kiln_sdim *ai, int nout, kiln_sshape *out) {
    (void)t, (void)op, (void)nin, (void)a, (void)ai;
    for (int k = 0; k < nout; k++) out[k] = in[0];
    return KILN_OK;
}

static kiln_status rule_broadcast(kiln_symtab *t, const char *op, int nin, const kiln_sshape *in, const kiln_attrs *a,
                                  const kiln_sdim *ai, int nout, kiln_sshape *out) {
    (void)a, (void)ai, (void)nout;
    kiln_sshape r = {0};
    for (int k = 0; k < nin; k++)
        if (in[k].ndim > r.ndim) r.ndim = in[k].ndim;
    for (int d = 0; d < r.ndim; d++) r.d[d] = kiln_sdim_const(1);
    for (int k = 0; k < nin; k++)
        for (int d = 0; d < in[k].ndim; d++) {
            kiln_sdim *o = &r.d[r.ndim - in[k].ndim + d];
            if (!broadcast_dim(*o, in[k].d[d], o))
                return fail(t, op, nin, in, "cannot broadcast these sizes for every value of their symbols");
        }
    out[0] = r;
    return KILN_OK;
}

static kiln_status rule_reduce(kiln_symtab *t, const char *op, int nin, const kiln_sshape *in, const kiln_attrs *a,
                               const kiln_sdim *ai, int nout, kiln_sshape *out) {
    (void)t, (void)op, (void)nin, (void)ai, (void)nout;
    uint64_t mask = (uint64_t)a->i[KILN_A_REDUCE_AXES];
    out[0].ndim = 0;
    for (int d = 0; d < in[0].ndim; d++) {
        if (!((mask >> d) & 1u)) out[0].d[out[0].ndim++] = in[0].d[d];
        else if (a->i[KILN_A_REDUCE_KEEPDIMS]) out[0].d[out[0].ndim++] = kiln_sdim_const(1);
    }
    return KILN_OK;
}

/* NumPy matmul: 1-D operands, batch dimensions broadcast, inner sizes the same expression. */
static kiln_status rule_matmul(kiln_symtab *t, const char *op, int nin, const kiln_sshape *in, const kiln_attrs *a,
                               const kiln_sdim *ai, int nout, kiln_sshape *out) {
    (void)a, (void)ai, (void)nout;
    const kiln_sshape *x = &in[0], *y = &in[1];
    if (!kiln_sdim_same(x->d[x->ndim - 1], y->d[y->ndim == 1 ? 0 : y->ndim - 2]))
        return fail(t, op, nin, in, "the inner sizes are not the same expression");
    int bx = x->ndim > 2 ? x->ndim - 2 : 0, by = y->ndim > 2 ? y->ndim - 2 : 0, nb = bx > by ? bx : by;
    kiln_sshape r = {.ndim = nb};
    for (int d = 0; d < nb; d++) {
        int dx = d - (nb - bx), dy = d - (nb - by);
        kiln_sdim sx = dx >= 0 ? x->d[dx] : kiln_sdim_const(1), sy = dy >= 0 ? y->d[dy] : kiln_sdim_const(1);
        if (!broadcast_dim(sx, sy, &r.d[d]))
            return fail(t, op, nin, in, "cannot broadcast the batch sizes for every value of their symbols");
    }
    if (x->ndim >= 2) r.d[r.ndim++] = x->d[x->ndim - 2];
    if (y->ndim >= 2) r.d[r.ndim++] = y->d[y->ndim - 1];
    out[0] = r;
    return KILN_OK;
}

static kiln_status rule_linear(kiln_symtab *t, const char *op, int nin, const kiln_sshape *in, const kiln_attrs *a,
                               const kiln_sdim *ai, int nout, kiln_sshape *out);

/* matmul_epilogue: the product of its base inputs (i[0]: matmul or linear, i[1] of them); every
 * other operand broadcasts to the product's shape. */
static kiln_status rule_matmul_epilogue(kiln_symtab *t, const char *op, int nin, const kiln_sshape *in,
                                        const kiln_attrs *a, const kiln_sdim *ai, int nout, kiln_sshape *out) {
    int nbase = (int)a->i[KILN_A_MATMUL_EPILOGUE_BASE_INPUTS];
    KILN_TRY(a->i[KILN_A_MATMUL_EPILOGUE_BASE] ? rule_linear(t, op, nbase, in, a, ai, nout, out) : rule_matmul(t, op, 2, in, a, ai, nout, out));
    for (int k = nbase; k < nin; k++) {
        if (in[k].ndim > out[0].ndim) return fail(t, op, nin, in, "an operand has more dimensions than the product");
        for (int d = 0; d < in[k].ndim; d++) {
            kiln_sdim x = in[k].d[d], want = out[0].d[out[0].ndim - in[k].ndim + d];
            if (!kiln_sdim_same(x, want) && !is_one(x))
                return fail(t, op, nin, in, "an operand does not broadcast to the product for every value of the symbols");
        }
    }
    return KILN_OK;
}

/* A shape whose n sizes are the size attributes' expressions from `from` on. */
static void sizes_from(int n, const kiln_sdim *from, kiln_sshape *out) {
    out->ndim = n;
    for (int d = 0; d < n; d++) out->d[d] = from[d];
}

/* fused: i[2] sizes from i[3] (the group's result; its subgraph holds the same expressions) */
static kiln_status rule_fused(kiln_symtab *t, const char *op, int nin, const kiln_sshape *in, const kiln_attrs *a,
                              const kiln_sdim *ai, int nout, kiln_sshape *out) {
    (void)t, (void)op, (void)nin, (void)in, (void)nout;
    sizes_from((int)a->i[KILN_A_FUSED_NDIM], &ai[KILN_A_FUSED_SHAPE], &out[0]);
    return KILN_OK;
}

/* linear(x, w[, b]): (..., in) x (out, in) -> (..., out) */
static kiln_status rule_linear(kiln_symtab *t, const char *op, int nin, const kiln_sshape *in, const kiln_attrs *a,
                               const kiln_sdim *ai, int nout, kiln_sshape *out) {
    (void)a, (void)ai, (void)nout;
    const kiln_sshape *x = &in[0], *w = &in[1];
    if (!kiln_sdim_same(x->d[x->ndim - 1], w->d[w->ndim - 1]))
        return fail(t, op, nin, in, "the input's last size and the weight's are not the same expression");
    if (nin > 2 && in[2].ndim == 1 && !kiln_sdim_same(in[2].d[0], w->d[0]))
        return fail(t, op, nin, in, "the bias's size and the weight's first are not the same expression");
    out[0] = *x;
    out[0].d[x->ndim - 1] = w->d[0];
    return KILN_OK;
}

static kiln_status product(kiln_symtab *t, int n, const kiln_sdim *d, kiln_sdim *out) {
    *out = kiln_sdim_const(1);
    for (int k = 0; k < n; k++) KILN_TRY(kiln_sym_mul(t, *out, d[k], out));
    return KILN_OK;
}

/* reshape: the sizes are the attributes; both shapes must hold the same count as expressions. */
static kiln_status rule_reshape(kiln_symtab *t, const char *op, int nin, const kiln_sshape *in, const kiln_attrs *a,
                                const kiln_sdim *ai, int nout, kiln_sshape *out) {
    (void)nout;
    kiln_sdim before, after;
    KILN_TRY(product(t, in[0].ndim, in[0].d, &before));
    KILN_TRY(product(t, a->ni, ai, &after));
    if (!kiln_sdim_same(before, after))
        return fail(t, op, nin, in, "the element counts of the two shapes are not the same expression");
    sizes_from(a->ni, ai, &out[0]);
    return KILN_OK;
}

static kiln_status rule_permute(kiln_symtab *t, const char *op, int nin, const kiln_sshape *in, const kiln_attrs *a,
                                const kiln_sdim *ai, int nout, kiln_sshape *out) {
    (void)t, (void)op, (void)nin, (void)ai, (void)nout;
    out[0].ndim = in[0].ndim;
    for (int d = 0; d < in[0].ndim; d++) out[0].d[d] = in[0].d[a->i[d]];
    return KILN_OK;
}

/* expand: each input size is the target's or 1 (a 1 stays 1 only where the target is 1). */
static kiln_status rule_expand(kiln_symtab *t, const char *op, int nin, const kiln_sshape *in, const kiln_attrs *a,
                               const kiln_sdim *ai, int nout, kiln_sshape *out) {
    (void)nout;
    int lead = a->ni - in[0].ndim;
    for (int d = 0; d < in[0].ndim; d++) {
        kiln_sdim x = in[0].d[d], want = ai[lead + d];
        if (!kiln_sdim_same(x, want) && !is_one(x))
            return fail(t, op, nin, in, "an input size is neither the target's nor 1 for every value of the symbols");
    }
    sizes_from(a->ni, ai, &out[0]);
    return KILN_OK;
}

/* slice: per axis d, LENGTH + d elements from START + d by STEP + d. An axis with a symbol in its
 * size, start or length needs a positive constant step, and must be shown in bounds for every
 * binding by the lower bounds: start >= 0, length >= 0, size - (start + (length - 1) * step + 1) >= 0. */
static kiln_status slice_shape(kiln_symtab *t, const char *op, int nin, const kiln_sshape *in, const kiln_sdim *ai,
                               kiln_sshape *out) {
    const kiln_sshape *x = &in[0];
    out->ndim = x->ndim;
    for (int d = 0; d < x->ndim; d++) {
        kiln_sdim start = ai[KILN_A_SLICE_START + d], step = ai[KILN_A_SLICE_STEP + d], len = ai[KILN_A_SLICE_LENGTH + d];
        out->d[d] = len;
        if (x->d[d].e == 0 && len.e == 0 && start.e == 0 && step.e == 0) continue; /* checked at the hints */
        if (step.e != 0 || step.v <= 0)
            return fail(t, op, nin, in, "a symbolic axis needs a positive constant step");
        kiln_sdim last, rest;
        KILN_TRY(kiln_sym_add(t, len, kiln_sdim_const(-1), &last));
        KILN_TRY(kiln_sym_mul(t, last, step, &last));
        KILN_TRY(kiln_sym_add(t, last, start, &last));
        KILN_TRY(kiln_sym_add(t, last, kiln_sdim_const(1), &last));
        KILN_TRY(kiln_sym_mul(t, last, kiln_sdim_const(-1), &rest));
        KILN_TRY(kiln_sym_add(t, x->d[d], rest, &rest));
        if (kiln_sym_lower_bound(t, rest) < 0 || kiln_sym_lower_bound(t, len) < 0 || kiln_sym_lower_bound(t, start) < 0)
            return fail(t, op, nin, in, "a slice cannot be shown in bounds for every value of the symbols");
    }
    return KILN_OK;
}

static kiln_status rule_slice(kiln_symtab *t, const char *op, int nin, const kiln_sshape *in, const kiln_attrs *a,
                              const kiln_sdim *ai, int nout, kiln_sshape *out) {
    (void)a, (void)nout;
    return slice_shape(t, op, nin, in, ai, &out[0]);
}

/* slice_assign(x, v): v broadcasts into the slice; the result is x. */
static kiln_status rule_slice_assign(kiln_symtab *t, const char *op, int nin, const kiln_sshape *in,
                                     const kiln_attrs *a, const kiln_sdim *ai, int nout, kiln_sshape *out) {
    (void)a, (void)nout;
    kiln_sshape s;
    KILN_TRY(slice_shape(t, op, nin, in, ai, &s));
    for (int d = 0; d < in[1].ndim; d++) {
        kiln_sdim v = in[1].d[d], want = s.d[s.ndim - in[1].ndim + d];
        if (!kiln_sdim_same(v, want) && !is_one(v))
            return fail(t, op, nin, in, "the value does not broadcast to the slice for every value of the symbols");
    }
    out[0] = in[0];
    return KILN_OK;
}

/* concat: i[0] = axis; the other sizes the same expressions, the axis their sum. */
static kiln_status rule_concat(kiln_symtab *t, const char *op, int nin, const kiln_sshape *in, const kiln_attrs *a,
                               const kiln_sdim *ai, int nout, kiln_sshape *out) {
    (void)ai, (void)nout;
    int64_t at = a->i[KILN_A_CONCAT_AXIS];
    int axis = (int)(at < 0 ? at + in[0].ndim : at);
    kiln_sshape r = in[0];
    for (int k = 1; k < nin; k++) {
        for (int d = 0; d < r.ndim; d++)
            if (d != axis && !kiln_sdim_same(r.d[d], in[k].d[d]))
                return fail(t, op, nin, in, "sizes off the axis are not the same expressions");
        KILN_TRY(kiln_sym_add(t, r.d[axis], in[k].d[axis], &r.d[axis]));
    }
    out[0] = r;
    return KILN_OK;
}

/* gather(x, idx): x.shape[:axis] + idx.shape + x.shape[axis+1:] */
static kiln_status rule_gather(kiln_symtab *t, const char *op, int nin, const kiln_sshape *in, const kiln_attrs *a,
                               const kiln_sdim *ai, int nout, kiln_sshape *out) {
    (void)t, (void)op, (void)nin, (void)ai, (void)nout;
    int64_t at = a->i[KILN_A_INDEX_AXIS];
    int axis = (int)(at < 0 ? at + in[0].ndim : at);
    kiln_sshape r = {0};
    for (int d = 0; d < axis; d++) r.d[r.ndim++] = in[0].d[d];
    for (int d = 0; d < in[1].ndim; d++) r.d[r.ndim++] = in[1].d[d];
    for (int d = axis + 1; d < in[0].ndim; d++) r.d[r.ndim++] = in[0].d[d];
    out[0] = r;
    return KILN_OK;
}

/* The shape of input 1 (gather_elements: the index's). */
static kiln_status rule_second(kiln_symtab *t, const char *op, int nin, const kiln_sshape *in, const kiln_attrs *a,
                               const kiln_sdim *ai, int nout, kiln_sshape *out) {
    (void)t, (void)op, (void)nin, (void)a, (void)ai, (void)nout;
    out[0] = in[1];
    return KILN_OK;
}

/* layer_norm, rms_norm: y like x; the statistics x's shape with the i[0] normalized sizes 1. */
static kiln_status rule_norm(kiln_symtab *t, const char *op, int nin, const kiln_sshape *in, const kiln_attrs *a,
                             const kiln_sdim *ai, int nout, kiln_sshape *out) {
    (void)t, (void)op, (void)nin, (void)ai;
    for (int k = 0; k < nout; k++) {
        out[k] = in[0];
        for (int d = in[0].ndim - (int)a->i[KILN_A_NORM_NAXES]; k && d < in[0].ndim; d++) out[k].d[d] = kiln_sdim_const(1);
    }
    return KILN_OK;
}

/* *_norm_backward(gy, x, w, ...) -> (gx, gw[, gb]): x's shape, then w's. */
static kiln_status rule_norm_backward(kiln_symtab *t, const char *op, int nin, const kiln_sshape *in,
                                      const kiln_attrs *a, const kiln_sdim *ai, int nout, kiln_sshape *out) {
    (void)t, (void)op, (void)nin, (void)a, (void)ai;
    out[0] = in[1];
    for (int k = 1; k < nout; k++) out[k] = in[2];
    return KILN_OK;
}

/* batch_norm(x, ...) -> (y, mean, invstd): x's shape, then (C,) = x's size 1. */
static kiln_status rule_batch_norm(kiln_symtab *t, const char *op, int nin, const kiln_sshape *in,
                                   const kiln_attrs *a, const kiln_sdim *ai, int nout, kiln_sshape *out) {
    (void)t, (void)op, (void)nin, (void)a, (void)ai, (void)nout;
    out[0] = in[0];
    out[1] = (kiln_sshape){.ndim = 1, .d = {in[0].d[1]}};
    out[2] = out[1];
    return KILN_OK;
}

/* full, rand, randn: i[1] sizes from i[2] */
static kiln_status rule_full(kiln_symtab *t, const char *op, int nin, const kiln_sshape *in, const kiln_attrs *a,
                             const kiln_sdim *ai, int nout, kiln_sshape *out) {
    (void)t, (void)op, (void)nin, (void)in, (void)nout;
    sizes_from((int)a->i[KILN_A_FULL_NDIM], &ai[KILN_A_FULL_SHAPE], &out[0]);
    return KILN_OK;
}

/* arange, linspace: i[1] elements */
static kiln_status rule_count(kiln_symtab *t, const char *op, int nin, const kiln_sshape *in, const kiln_attrs *a,
                              const kiln_sdim *ai, int nout, kiln_sshape *out) {
    (void)t, (void)op, (void)nin, (void)in, (void)a, (void)nout;
    out[0] = (kiln_sshape){.ndim = 1, .d = {ai[KILN_A_ARANGE_COUNT]}};
    return KILN_OK;
}

/* Outputs whose sizes do not follow the inputs' (print's and check's token): the concrete ones. */
static kiln_status rule_token(kiln_symtab *t, const char *op, int nin, const kiln_sshape *in, const kiln_attrs *a,
                              const kiln_sdim *ai, int nout, kiln_sshape *out) {
    (void)t, (void)op, (void)nin, (void)in, (void)a, (void)ai, (void)nout;
    out[0].ndim = 0;
    return KILN_OK;
}

/* ---- convolution and pooling (NCHW; conv2d_fused and relayout in their layouts) ---------------- */

/* floor((size + pad - ext) / stride) + 1, the count of windows of extent ext (a dilated kernel)
 * at `stride` over size + pad, shown to be at least 1 for every binding by the lower bounds. */
static kiln_status windows(kiln_symtab *t, const char *op, int nin, const kiln_sshape *in, kiln_sdim size, int64_t pad,
                           int64_t ext, int64_t stride, kiln_sdim *out) {
    kiln_sdim r;
    KILN_TRY(kiln_sym_add(t, size, kiln_sdim_const(pad - ext), &r));
    if (kiln_sym_lower_bound(t, r) < 0)
        return fail(t, op, nin, in, "the window may not fit the padded input for every value of the symbols");
    KILN_TRY(kiln_sym_floordiv(t, r, stride, &r));
    return kiln_sym_add(t, r, kiln_sdim_const(1), out);
}

/* The (N, O, OH, OW) of a convolution (attributes i[0..8] as conv2d's) of x (N, C, H, W) by w
 * (O, C / groups, KH, KW): the kernel's sizes constants, C the same expression as w's times groups. */
static kiln_status conv_out(kiln_symtab *t, const char *op, int nin, const kiln_sshape *in, const kiln_attrs *a,
                            const kiln_sdim *x, const kiln_sdim *w, kiln_sdim *out) {
    const int64_t *stride = &a->i[KILN_A_CONV_STRIDE], *pad = &a->i[KILN_A_CONV_PAD], *dil = &a->i[KILN_A_CONV_DILATION];
    kiln_sdim c;
    KILN_TRY(kiln_sym_mul(t, w[1], kiln_sdim_const(a->i[KILN_A_CONV_GROUPS]), &c));
    if (!kiln_sdim_same(x[1], c))
        return fail(t, op, nin, in, "the input's channels and the weight's are not the same expression");
    if (!kiln_sdim_is_const(w[2]) || !kiln_sdim_is_const(w[3]))
        return fail(t, op, nin, in, "the kernel's sizes must be constants");
    out[0] = x[0], out[1] = w[0];
    KILN_TRY(windows(t, op, nin, in, x[2], pad[0] + pad[1], dil[0] * (w[2].v - 1) + 1, stride[0], &out[2]));
    return windows(t, op, nin, in, x[3], pad[2] + pad[3], dil[1] * (w[3].v - 1) + 1, stride[1], &out[3]);
}

static bool same_dims(int n, const kiln_sdim *x, const kiln_sdim *y) {
    for (int d = 0; d < n; d++)
        if (!kiln_sdim_same(x[d], y[d])) return false;
    return true;
}

/* conv2d(x, w[, b]) */
static kiln_status rule_conv2d(kiln_symtab *t, const char *op, int nin, const kiln_sshape *in, const kiln_attrs *a,
                               const kiln_sdim *ai, int nout, kiln_sshape *out) {
    (void)ai, (void)nout;
    out[0].ndim = 4;
    KILN_TRY(conv_out(t, op, nin, in, a, in[0].d, in[1].d, out[0].d));
    if (nin > 2 && !kiln_sdim_same(in[2].d[0], in[1].d[0]))
        return fail(t, op, nin, in, "the bias's size and the weight's first are not the same expression");
    return KILN_OK;
}

/* A shape in conv layout `layout` (conv_epilogue.h's numbers) to NCHW and back; blocked layouts
 * need constant channels. */
static kiln_status layout_to_nchw(kiln_symtab *t, const char *op, int nin, const kiln_sshape *in, int64_t layout,
                                  const kiln_sshape *x, kiln_sdim *nchw) {
    if (layout == 1) { /* (N, H, W, C) */
        nchw[0] = x->d[0], nchw[1] = x->d[3], nchw[2] = x->d[1], nchw[3] = x->d[2];
        return KILN_OK;
    }
    for (int d = 0; d < 4; d++) nchw[d] = x->d[d];
    if (layout == 0) return KILN_OK;
    if (!kiln_sdim_is_const(x->d[1])) return fail(t, op, nin, in, "a blocked layout needs constant channels");
    nchw[1] = kiln_sdim_const(x->d[1].v * x->d[4].v);
    return KILN_OK;
}

static kiln_status layout_from_nchw(kiln_symtab *t, const char *op, int nin, const kiln_sshape *in, int64_t layout,
                                    const kiln_sdim *nchw, kiln_sshape *out) {
    out->ndim = 4;
    if (layout == 1) {
        out->d[0] = nchw[0], out->d[1] = nchw[2], out->d[2] = nchw[3], out->d[3] = nchw[1];
        return KILN_OK;
    }
    for (int d = 0; d < 4; d++) out->d[d] = nchw[d];
    if (layout == 0) return KILN_OK;
    int64_t block = layout == 2 ? 16 : 8;
    if (!kiln_sdim_is_const(nchw[1]) || nchw[1].v % block)
        return fail(t, op, nin, in, "a blocked layout needs constant channels");
    out->ndim = 5, out->d[1] = kiln_sdim_const(nchw[1].v / block), out->d[4] = kiln_sdim_const(block);
    return KILN_OK;
}

/* conv2d_fused(x, w[, b][, r]): x, r and the result in layout i[12]; r the result's shape. */
static kiln_status rule_conv2d_fused(kiln_symtab *t, const char *op, int nin, const kiln_sshape *in,
                                     const kiln_attrs *a, const kiln_sdim *ai, int nout, kiln_sshape *out) {
    (void)ai, (void)nout;
    kiln_sdim x[4], y[4];
    KILN_TRY(layout_to_nchw(t, op, nin, in, a->i[KILN_A_CONV2D_FUSED_LAYOUT], &in[0], x));
    KILN_TRY(conv_out(t, op, nin, in, a, x, in[1].d, y));
    if (a->i[KILN_A_CONV2D_FUSED_HAS_BIAS] && !kiln_sdim_same(in[2].d[0], in[1].d[0]))
        return fail(t, op, nin, in, "the bias's size and the weight's first are not the same expression");
    KILN_TRY(layout_from_nchw(t, op, nin, in, a->i[KILN_A_CONV2D_FUSED_LAYOUT], y, &out[0]));
    if (a->i[KILN_A_CONV2D_FUSED_HAS_RESIDUAL] && (in[nin - 1].ndim != out[0].ndim || !same_dims(out[0].ndim, in[nin - 1].d, out[0].d)))
        return fail(t, op, nin, in, "the residual's sizes and the output's are not the same expressions");
    return KILN_OK;
}

/* relayout(x): i[0] x's layout, i[1] the result's */
static kiln_status rule_relayout(kiln_symtab *t, const char *op, int nin, const kiln_sshape *in, const kiln_attrs *a,
                                 const kiln_sdim *ai, int nout, kiln_sshape *out) {
    (void)ai, (void)nout;
    kiln_sdim nchw[4];
    KILN_TRY(layout_to_nchw(t, op, nin, in, a->i[KILN_A_RELAYOUT_FROM], &in[0], nchw));
    return layout_from_nchw(t, op, nin, in, a->i[KILN_A_RELAYOUT_TO], nchw, &out[0]);
}

/* conv2d_backward_input(gy, w): the input's sizes i[9..12], gy the convolution's output of them;
 * conv2d_backward_weight(x, gy): the weight's sizes i[9..12], gy the output of x by them. */
static kiln_status rule_conv2d_backward(kiln_symtab *t, const char *op, int nin, const kiln_sshape *in,
                                        const kiln_attrs *a, const kiln_sdim *ai, int nout, kiln_sshape *out) {
    (void)nout;
    bool input = strcmp(op, "conv2d_backward_input") == 0;
    kiln_sdim y[4];
    KILN_TRY(conv_out(t, op, nin, in, a, input ? &ai[KILN_A_CONV_SHAPE] : in[0].d, input ? in[1].d : &ai[KILN_A_CONV_SHAPE], y));
    if (!same_dims(4, y, in[input ? 0 : 1].d))
        return fail(t, op, nin, in, "the gradient's sizes are not the convolution's output sizes as expressions");
    sizes_from(4, &ai[KILN_A_CONV_SHAPE], &out[0]);
    return KILN_OK;
}

/* The (N, C, OH, OW) of a pooling (attributes i[0..11]) of x (N, C, H, W); ceil_mode only over
 * constant sizes. */
static kiln_status pool_out(kiln_symtab *t, const char *op, int nin, const kiln_sshape *in, const kiln_attrs *a,
                            const kiln_sdim *x, kiln_sdim *out) {
    const int64_t *kernel = &a->i[KILN_A_POOL_KERNEL], *stride = &a->i[KILN_A_POOL_STRIDE];
    const int64_t *pad = &a->i[KILN_A_POOL_PAD], *dil = &a->i[KILN_A_POOL_DILATION];
    bool ceil_mode = a->i[KILN_A_POOL_CEIL_MODE] != 0;
    out[0] = x[0], out[1] = x[1];
    if (ceil_mode && (!kiln_sdim_is_const(x[2]) || !kiln_sdim_is_const(x[3])))
        return fail(t, op, nin, in, "ceil_mode over symbolic sizes has no symbolic form");
    for (int d = 0; ceil_mode && d < 2; d++) { /* constants, as pool.c's pool_out_size */
        int64_t size = x[2 + d].v, s = stride[d], pl = pad[2 * d], ext = dil[d] * (kernel[d] - 1) + 1;
        int64_t num = size + pl + pad[1 + 2 * d] - ext + s - 1, n = num < 0 ? 0 : num / s + 1;
        out[2 + d] = kiln_sdim_const((n - 1) * s >= size + pl ? n - 1 : n);
    }
    if (ceil_mode) return KILN_OK;
    KILN_TRY(windows(t, op, nin, in, x[2], pad[0] + pad[1], dil[0] * (kernel[0] - 1) + 1, stride[0], &out[2]));
    return windows(t, op, nin, in, x[3], pad[2] + pad[3], dil[1] * (kernel[1] - 1) + 1, stride[1], &out[3]);
}

/* max_pool2d(x), avg_pool2d(x) */
static kiln_status rule_pool2d(kiln_symtab *t, const char *op, int nin, const kiln_sshape *in, const kiln_attrs *a,
                               const kiln_sdim *ai, int nout, kiln_sshape *out) {
    (void)ai, (void)nout;
    out[0].ndim = 4;
    return pool_out(t, op, nin, in, a, in[0].d, out[0].d);
}

/* max_pool2d_backward(gy, x): x's sizes; avg_pool2d_backward(gy): the input's sizes i[12..15];
 * gy the pooling's output of them. */
static kiln_status rule_pool2d_backward(kiln_symtab *t, const char *op, int nin, const kiln_sshape *in,
                                        const kiln_attrs *a, const kiln_sdim *ai, int nout, kiln_sshape *out) {
    (void)nout;
    if (nin == 2) out[0] = in[1];
    else sizes_from(4, &ai[KILN_A_POOL_SHAPE], &out[0]);
    kiln_sdim y[4];
    KILN_TRY(pool_out(t, op, nin, in, a, out[0].d, y));
    for (int d = 0; d < 4; d++)
        if (!kiln_sdim_same(y[d], in[0].d[d]) && !(a->i[KILN_A_POOL_CEIL_MODE] && d >= 2))
            return fail(t, op, nin, in, "the gradient's sizes are not the pooling's output sizes as expressions");
    return KILN_OK;
}

/* q (..., Hq, Lq, D), k (..., Hk, Lk, D), v (..., Hk, Lk, Dv) as attention reads them: what must be
 * equal the same expression, the head counts constant (Hq a multiple of Hk, checked at the hints). */
static kiln_status attention_operands(kiln_symtab *t, const char *op, int nin, const kiln_sshape *all,
                                      const kiln_sshape *qkv) {
    const kiln_sshape *q = &qkv[0], *k = &qkv[1], *v = &qkv[2];
    int nd = q->ndim;
    bool ok = k->ndim == nd && v->ndim == nd && nd >= 3;
    for (int d = 0; ok && d < nd - 3; d++) ok = kiln_sdim_same(k->d[d], q->d[d]) && kiln_sdim_same(v->d[d], q->d[d]);
    ok = ok && q->d[nd - 3].e == 0 && k->d[nd - 3].e == 0 && kiln_sdim_same(v->d[nd - 3], k->d[nd - 3]) &&
         kiln_sdim_same(k->d[nd - 2], v->d[nd - 2]) && kiln_sdim_same(k->d[nd - 1], q->d[nd - 1]);
    return ok ? KILN_OK
              : fail(t, op, nin, all, "q, k and v's shared sizes are not the same expressions (or a head count is symbolic)");
}

/* attention(q, k, v) -> (out (..., Hq, Lq, Dv), lse (..., Hq, Lq)) */
static kiln_status rule_attention(kiln_symtab *t, const char *op, int nin, const kiln_sshape *in, const kiln_attrs *a,
                                  const kiln_sdim *ai, int nout, kiln_sshape *out) {
    (void)a, (void)ai, (void)nout;
    KILN_TRY(attention_operands(t, op, nin, in, in));
    out[0] = in[0];
    out[0].d[in[0].ndim - 1] = in[2].d[in[2].ndim - 1];
    out[1] = in[0];
    out[1].ndim = in[0].ndim - 1;
    return KILN_OK;
}

/* attention_backward(gout, q, k, v, out, lse[, glse]) -> (gq, gk, gv): q, k and v's shapes, gout and
 * out attention's output, lse and glse its log-sum-exp */
static kiln_status rule_attention_backward(kiln_symtab *t, const char *op, int nin, const kiln_sshape *in,
                                           const kiln_attrs *a, const kiln_sdim *ai, int nout, kiln_sshape *out) {
    kiln_sshape want[2];
    KILN_TRY(rule_attention(t, op, 3, in + 1, a, ai, 2, want));
    const int which[4] = {0, 4, 5, 6};
    for (int w = 0; w < 4 && which[w] < nin; w++) {
        const kiln_sshape *got = &in[which[w]], *exp = &want[w < 2 ? 0 : 1];
        bool ok = got->ndim == exp->ndim;
        for (int d = 0; ok && d < got->ndim; d++) ok = kiln_sdim_same(got->d[d], exp->d[d]);
        if (!ok) return fail(t, op, nin, in, "gout, out, lse and glse are not attention's output sizes as expressions");
    }
    for (int k = 0; k < 3 && k < nout; k++) out[k] = in[1 + k];
    return KILN_OK;
}

/* rnn_layer(x (T, B, I), h0 (B, H)[, c0], w_ih (G*H, I), w_hh (G*H, H), ...) -> (y (T, B, H), h_n and
 * c_n (B, H), workspace (T, B, W)): T and B may be symbols, the hidden size (the workspace's width
 * follows it) must be constant; the sizes x, the states and the weights share the same expressions. */
static kiln_status rnn_operands(kiln_symtab *t, const char *op, int nin, const kiln_sshape *in, const kiln_attrs *a) {
    int lstm = a->i[KILN_A_RNN_LAYER_MODE] == 0, wi = 2 + lstm, wh = 3 + lstm;
    const kiln_sshape *x = &in[0], *h = &in[1];
    bool ok = nin > wh && x->ndim == 3 && h->ndim == 2 && in[wi].ndim == 2 && in[wh].ndim == 2 &&
              kiln_sdim_is_const(h->d[1]) && kiln_sdim_same(x->d[1], h->d[0]) && kiln_sdim_same(x->d[2], in[wi].d[1]) &&
              kiln_sdim_same(in[wi].d[0], in[wh].d[0]) && kiln_sdim_same(h->d[1], in[wh].d[1]);
    for (int k = 0; ok && lstm && k < 2; k++) ok = kiln_sdim_same(in[2].d[k], h->d[k]);
    return ok ? KILN_OK
              : fail(t, op, nin, in, "x, the states and the weights' shared sizes are not the same expressions (or the "
                                     "hidden size is symbolic)");
}

static kiln_status rule_rnn_layer(kiln_symtab *t, const char *op, int nin, const kiln_sshape *in, const kiln_attrs *a,
                                  const kiln_sdim *ai, int nout, kiln_sshape *out) {
    (void)ai, (void)nout;
    KILN_TRY(rnn_operands(t, op, nin, in, a));
    int64_t H = in[1].d[1].v, W = a->i[KILN_A_RNN_LAYER_MODE] == 0 ? 6 * H : (a->i[KILN_A_RNN_LAYER_MODE] == 1 ? 5 * H : H); /* ops.def */
    out[0] = (kiln_sshape){3, {in[0].d[0], in[0].d[1], in[1].d[1]}};
    out[1] = out[2] = in[1];
    out[3] = (kiln_sshape){3, {in[0].d[0], in[0].d[1], kiln_sdim_const(W)}};
    return KILN_OK;
}

/* rnn_layer_backward(forward inputs..., workspace, gy, gh_n[, gc_n]) -> the gradients of x, h0, c0,
 * w_ih, w_hh (their shapes) and of the biases (G*H,) */
static kiln_status rule_rnn_layer_backward(kiln_symtab *t, const char *op, int nin, const kiln_sshape *in,
                                           const kiln_attrs *a, const kiln_sdim *ai, int nout, kiln_sshape *out) {
    (void)nout;
    int lstm = a->i[KILN_A_RNN_LAYER_MODE] == 0,
        nfwd = 4 + lstm + 2 * (int)a->i[KILN_A_RNN_LAYER_HAS_BIASES] + (int)a->i[KILN_A_RNN_LAYER_HAS_LENGTHS];
    kiln_sshape want[4];
    KILN_TRY(rule_rnn_layer(t, op, nfwd, in, a, ai, 4, want));
    const int order[4] = {3, 0, 1, 2}; /* workspace, gy, gh_n, gc_n */
    for (int k = 0; nfwd + k < nin && k < 4; k++) {
        const kiln_sshape *got = &in[nfwd + k], *exp = &want[order[k]];
        bool ok = got->ndim == exp->ndim;
        for (int d = 0; ok && d < got->ndim; d++) ok = kiln_sdim_same(got->d[d], exp->d[d]);
        if (!ok) return fail(t, op, nin, in, "the workspace and output gradients are not rnn_layer's output sizes");
    }
    int wi = 2 + lstm;
    out[0] = in[0], out[1] = out[2] = in[1], out[3] = in[wi], out[4] = in[wi + 1];
    out[5] = out[6] = (kiln_sshape){1, {in[wi].d[0]}};
    return KILN_OK;
}

static const sym_rule rules[KILN_OP_COUNT] = {
#define KILN_OP(...)
#define KILN_SYM(ENUM, rule) [KILN_OP_##ENUM] = rule_##rule,
#include "ops.def"
#undef KILN_SYM
#undef KILN_OP
};

bool kiln_op_has_sym_rule(kiln_op op) { return (unsigned)op < KILN_OP_COUNT && rules[op] != NULL; }

kiln_status kiln_infer_sym(kiln_symtab *t, kiln_op op, int nin, const kiln_sshape *in, const kiln_attrs *a,
                           const kiln_sdim *ai, int nout, const kiln_meta *concrete, kiln_sshape *out) {
    const char *name = kiln_op_table[op].name;
    if (!rules[op]) return fail(t, name, nin, in, "the op has no symbolic shape rule (ops.def: KILN_SYM)");
    KILN_TRY(rules[op](t, name, nin, in, a, ai, nout, out));
    for (int k = 0; k < nout; k++) { /* the rule agrees with the concrete inference at the hints */
        bool ok = out[k].ndim == concrete[k].ndim;
        for (int d = 0; ok && d < out[k].ndim; d++) ok = out[k].d[d].v == concrete[k].shape[d];
        if (!ok) return fail(t, name, nin, in, "internal: the symbolic rule disagrees with inference at the hints");
    }
    return KILN_OK;
}
