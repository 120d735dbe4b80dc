/* The collective ops of ops.def (all_reduce, all_gather, reduce_scatter, broadcast, reduce,
 * barrier, send, recv): inference, kernels over the communication layer (src/comm/comm.h) and
 * gradient rules, which are collectives themselves, so every rank runs the same ones in its
 * backward pass. A rule whose output got no gradient still takes part, with zeros. */
#include "../comm/comm.h"
#include "../core/hooks.h"
#include "../core/internal.h"

static kiln_status group_size(const char *op, const kiln_attrs *a, int slot, int *size) {
    return kiln_comm_size_for(op, (int)a->i[slot], size);
}

static kiln_status check_op(const char *op, int64_t reduce) {
    if (!kiln_comm_reduce_name((int)reduce))
        return kiln_error(KILN_ERR_VALUE, "%s: unknown reduction %lld (sum 0, mean 1, max 2, min 3, prod 4)", op,
                          (long long)reduce);
    return KILN_OK;
}

/* While a control-flow body is traced to be recorded its ops run once without their effect
 * (print does the same): the collective happens when the node runs. */
static bool recording_a_body(kiln_tensor **out, int nout) {
    if (!kiln_thread.trace_in_body) return false;
    for (int k = 0; k < nout; k++)
        memset(out[k]->data, 0, (size_t)out[k]->numel * kiln_dtype_size(out[k]->meta.dtype));
    return true;
}

KILN_INFER(all_reduce) {
    /* FUSION is optional (graphs saved before it have two ints) */
    KILN_TRY(kiln_attrs_expect("all_reduce", a, KILN_A_ALL_REDUCE_FUSION, 0));
    if (a->ni > KILN_A_ALL_REDUCE_FUSION && a->i[KILN_A_ALL_REDUCE_FUSION] < 0)
        return kiln_error(KILN_ERR_VALUE, "all_reduce: the fusion id must be >= 0 (0: never bucketed), got %lld",
                          (long long)a->i[KILN_A_ALL_REDUCE_FUSION]);
    KILN_TRY(check_op("all_reduce", a->i[KILN_A_ALL_REDUCE_OP]));
    int size;
    KILN_TRY(group_size("all_reduce", a, KILN_A_ALL_REDUCE_GROUP, &size));
    *out = in[0]->meta;
    return KILN_OK;
}

KILN_KERNEL(all_reduce) {
    if (recording_a_body(out, 1)) return KILN_OK;
    return kiln_comm_all_reduce(in[0], (int)a->i[KILN_A_ALL_REDUCE_OP], (int)a->i[KILN_A_ALL_REDUCE_GROUP], out[0]);
}

/* all_reduce_bucket and all_reduce_start: one dtype, sum or mean, a 1-D result of every element */
static kiln_status infer_bucket(const char *name, kiln_tensor *const *in, int nin, const kiln_attrs *a, kiln_meta *out) {
    KILN_TRY(kiln_attrs_expect(name, a, KILN_A_ALL_REDUCE_BUCKET_NI, 0));
    int64_t op = a->i[KILN_A_ALL_REDUCE_BUCKET_OP];
    if (op != KILN_COMM_SUM && op != KILN_COMM_MEAN)
        return kiln_error(KILN_ERR_VALUE, "%s: buckets reduce by sum (0) or mean (1), got %lld",
                          name, (long long)op);
    int size;
    KILN_TRY(group_size(name, a, KILN_A_ALL_REDUCE_BUCKET_GROUP, &size));
    if (nin < 1) return kiln_error(KILN_ERR_VALUE, "%s: a bucket holds at least one tensor", name);
    int64_t total = 0;
    for (int k = 0; k < nin; k++) {
        if (in[k]->meta.dtype != in[0]->meta.dtype)
            return kiln_error(KILN_ERR_TYPE, "%s: one dtype per bucket: tensor %d is %s, tensor 0 %s", name, k,
                              kiln_dtype_name(in[k]->meta.dtype), kiln_dtype_name(in[0]->meta.dtype));
        int64_t n;
        KILN_TRY(kiln_shape_numel_checked(in[k]->meta.ndim, in[k]->meta.shape, &n));
        if (total > INT64_MAX - n) return kiln_error(KILN_ERR_LIMIT, "%s: too many elements", name);
        total += n;
    }
    kiln_meta_set(out, in[0]->meta.dtype, 1, &total);
    return KILN_OK;
}

KILN_INFER(all_reduce_bucket) { return infer_bucket("all_reduce_bucket", in, nin, a, out); }

KILN_INFER(all_reduce_start) { return infer_bucket("all_reduce_start", in, nin, a, out); }

KILN_KERNEL(all_reduce_start) {
    if (recording_a_body(out, 1)) return KILN_OK;
    return kiln_comm_all_reduce_start(in, nin, (int)a->i[KILN_A_ALL_REDUCE_START_OP],
                                      (int)a->i[KILN_A_ALL_REDUCE_START_GROUP], out[0]);
}

KILN_INFER(all_reduce_wait) {
    *out = in[0]->meta;
    return KILN_OK;
}

KILN_KERNEL(all_reduce_wait) {
    if (!kiln_thread.trace_in_body) KILN_TRY(kiln_comm_all_reduce_wait(in[0]));
    kiln_tensor_retain(in[0]);
    out[0] = in[0];
    return KILN_OK;
}

KILN_KERNEL(all_reduce_bucket) {
    if (recording_a_body(out, 1)) return KILN_OK;
    return kiln_comm_all_reduce_bucket(in, nin, (int)a->i[KILN_A_ALL_REDUCE_BUCKET_OP],
                                       (int)a->i[KILN_A_ALL_REDUCE_BUCKET_GROUP], out[0]);
}

KILN_INFER(all_gather) {
    KILN_TRY(kiln_attrs_expect("all_gather", a, KILN_A_ALL_GATHER_NI, 0));
    int size;
    KILN_TRY(group_size("all_gather", a, KILN_A_ALL_GATHER_GROUP, &size));
    const kiln_meta *m = &in[0]->meta;
    if (m->ndim == 0)
        return kiln_error(KILN_ERR_VALUE, "all_gather: the tensor must have at least one axis (the ranks' tensors "
                          "are concatenated along axis 0), got a 0-d tensor");
    *out = *m;
    out->shape[0] = m->shape[0] * size;
    return KILN_OK;
}

KILN_KERNEL(all_gather) {
    if (recording_a_body(out, 1)) return KILN_OK;
    return kiln_comm_all_gather(in[0], (int)a->i[KILN_A_ALL_GATHER_GROUP], out[0]);
}

KILN_INFER(reduce_scatter) {
    KILN_TRY(kiln_attrs_expect("reduce_scatter", a, KILN_A_REDUCE_SCATTER_NI, 0));
    KILN_TRY(check_op("reduce_scatter", a->i[KILN_A_REDUCE_SCATTER_OP]));
    int size;
    KILN_TRY(group_size("reduce_scatter", a, KILN_A_REDUCE_SCATTER_GROUP, &size));
    const kiln_meta *m = &in[0]->meta;
    if (m->ndim == 0 || m->shape[0] % size != 0) {
        char shape[128];
        return kiln_error(KILN_ERR_VALUE,
                          "reduce_scatter: axis 0 of the tensor must divide among the group's %d ranks, got shape %s",
                          size, kiln_shape_str(m, shape, sizeof shape));
    }
    *out = *m;
    out->shape[0] = m->shape[0] / size;
    return KILN_OK;
}

KILN_KERNEL(reduce_scatter) {
    if (recording_a_body(out, 1)) return KILN_OK;
    return kiln_comm_reduce_scatter(in[0], (int)a->i[KILN_A_REDUCE_SCATTER_OP], (int)a->i[KILN_A_REDUCE_SCATTER_GROUP],
                                    out[0]);
}

static kiln_status check_root(const char *op, int64_t root, int size) {
    if (root < 0 || root >= size)
        return kiln_error(KILN_ERR_VALUE, "%s: root %lld is not a rank of the group (its size is %d)", op,
                          (long long)root, size);
    return KILN_OK;
}

KILN_INFER(broadcast) {
    KILN_TRY(kiln_attrs_expect("broadcast", a, KILN_A_BROADCAST_NI, 0));
    int size;
    KILN_TRY(group_size("broadcast", a, KILN_A_BROADCAST_GROUP, &size));
    KILN_TRY(check_root("broadcast", a->i[KILN_A_BROADCAST_ROOT], size));
    *out = in[0]->meta;
    return KILN_OK;
}

KILN_KERNEL(broadcast) {
    if (recording_a_body(out, 1)) return KILN_OK;
    return kiln_comm_broadcast(in[0], (int)a->i[KILN_A_BROADCAST_ROOT], (int)a->i[KILN_A_BROADCAST_GROUP], out[0]);
}

KILN_INFER(reduce_to) {
    KILN_TRY(kiln_attrs_expect("reduce", a, KILN_A_REDUCE_TO_NI, 0));
    KILN_TRY(check_op("reduce", a->i[KILN_A_REDUCE_TO_OP]));
    int size;
    KILN_TRY(group_size("reduce", a, KILN_A_REDUCE_TO_GROUP, &size));
    KILN_TRY(check_root("reduce", a->i[KILN_A_REDUCE_TO_ROOT], size));
    *out = in[0]->meta;
    return KILN_OK;
}

KILN_KERNEL(reduce_to) {
    if (recording_a_body(out, 1)) return KILN_OK;
    return kiln_comm_reduce(in[0], (int)a->i[KILN_A_REDUCE_TO_OP], (int)a->i[KILN_A_REDUCE_TO_ROOT],
                            (int)a->i[KILN_A_REDUCE_TO_GROUP], out[0]);
}

KILN_INFER(barrier) {
    KILN_TRY(kiln_attrs_expect("barrier", a, KILN_A_BARRIER_NI, 0));
    int size;
    KILN_TRY(group_size("barrier", a, KILN_A_BARRIER_GROUP, &size));
    kiln_meta_set(out, KILN_DTYPE_INT8, 0, NULL);
    return KILN_OK;
}

KILN_KERNEL(barrier) {
    if (recording_a_body(out, 1)) return KILN_OK;
    *(int8_t *)out[0]->data = 0;
    return kiln_comm_barrier((int)a->i[KILN_A_BARRIER_GROUP]);
}

KILN_INFER(send) {
    KILN_TRY(kiln_attrs_expect("send", a, KILN_A_SEND_NI, 0));
    int size;
    KILN_TRY(group_size("send", a, KILN_A_SEND_GROUP, &size));
    kiln_meta_set(out, KILN_DTYPE_INT8, 0, NULL);
    return KILN_OK;
}

KILN_KERNEL(send) {
    if (recording_a_body(out, 1)) return KILN_OK;
    *(int8_t *)out[0]->data = 0;
    return kiln_comm_send(in[0], (int)a->i[KILN_A_SEND_DST], (int)a->i[KILN_A_SEND_TAG], (int)a->i[KILN_A_SEND_GROUP]);
}

KILN_INFER(recv) {
    KILN_TRY(kiln_attrs_expect("recv", a, KILN_A_RECV_NI, 0));
    int size;
    KILN_TRY(group_size("recv", a, KILN_A_RECV_GROUP, &size));
    int64_t dtype = a->i[KILN_A_RECV_DTYPE], ndim = a->i[KILN_A_RECV_NDIM], numel;
    if (dtype < 0 || dtype >= KILN_DTYPE_COUNT) return kiln_error(KILN_ERR_VALUE, "recv: bad dtype %lld", (long long)dtype);
    if (ndim < 0 || ndim > KILN_MAX_DIMS || a->ni != KILN_A_RECV_SHAPE + ndim)
        return kiln_error(KILN_ERR_VALUE, "recv: %lld dimensions do not match the %d sizes given", (long long)ndim,
                          a->ni - KILN_A_RECV_SHAPE);
    KILN_TRY(kiln_shape_numel_checked((int)ndim, a->i + KILN_A_RECV_SHAPE, &numel));
    kiln_meta_set(out, (kiln_dtype)dtype, (int)ndim, a->i + KILN_A_RECV_SHAPE);
    return KILN_OK;
}

KILN_KERNEL(recv) {
    if (recording_a_body(out, 1)) return KILN_OK;
    return kiln_comm_recv(out[0], (int)a->i[KILN_A_RECV_SRC], (int)a->i[KILN_A_RECV_TAG], (int)a->i[KILN_A_RECV_GROUP]);
}

/* ---- gradients ------------------------------------------------------------------------ */

/* The output's gradient, zeros when it got none: the collective of the backward runs on every
 * rank whatever this rank's loss depends on. A new reference. */
static kiln_status gradient_or_zeros(const kiln_grad_ctx *ctx, kiln_tensor *const *gout, kiln_tensor **g) {
    if (gout[0]) {
        kiln_tensor_retain(gout[0]);
        *g = gout[0];
        return KILN_OK;
    }
    return kiln_emit_full(&ctx->out_meta[0], 0.0, g);
}

static kiln_status emit(kiln_op op, kiln_tensor *x, int64_t i0, int64_t i1, int64_t i2, int ni, kiln_tensor **out) {
    kiln_attrs at;
    kiln_attrs_clear(&at);
    int64_t v[3] = {i0, i1, i2};
    for (int k = 0; k < ni; k++) kiln_attrs_push_int(&at, v[k]);
    return kiln_apply(op, 1, &x, &at, out);
}

static kiln_status divide_by_size(kiln_tensor *t, int64_t group, kiln_tensor **out) {
    int size;
    KILN_TRY(kiln_comm_size_for("the gradient of a mean", (int)group, &size));
    kiln_tensor *n;
    KILN_TRY(kiln_emit_scalar((double)size, t->meta.dtype, &n));
    kiln_status s = kiln_emit_binary(KILN_OP_DIV, t, n, out);
    kiln_tensor_release(n);
    return s;
}

KILN_GRAD(all_reduce) {
    const kiln_attrs *a = ctx->attrs;
    int64_t op = a->i[KILN_A_ALL_REDUCE_OP], group = a->i[KILN_A_ALL_REDUCE_GROUP];
    kiln_tensor *g, *total = NULL, *t1 = NULL, *t2 = NULL;
    KILN_TRY(gradient_or_zeros(ctx, gout, &g));
    kiln_status s = emit(KILN_OP_ALL_REDUCE, g, op == KILN_COMM_MEAN ? KILN_COMM_MEAN : KILN_COMM_SUM, group, 0, 2,
                         &total);
    kiln_tensor_release(g);
    if (s != KILN_OK || !ctx->needs_grad[0]) {
        if (total) kiln_tensor_release(total);
        return s;
    }
    if (op == KILN_COMM_SUM || op == KILN_COMM_MEAN) {
        gin[0] = total;
        return KILN_OK;
    }
    if (op == KILN_COMM_MAX || op == KILN_COMM_MIN) { /* to every rank holding the extreme value */
        s = kiln_emit_binary(KILN_OP_EQ, ctx->in[0], ctx->out[0], &t1);
        if (s == KILN_OK) s = kiln_emit_cast(t1, total->meta.dtype, &t2);
        if (s == KILN_OK) s = kiln_emit_binary(KILN_OP_MUL, total, t2, &gin[0]);
    } else { /* prod: d y / d x = y / x */
        s = kiln_emit_binary(KILN_OP_MUL, total, ctx->out[0], &t1);
        if (s == KILN_OK) s = kiln_emit_binary(KILN_OP_DIV, t1, ctx->in[0], &gin[0]);
    }
    kiln_tensor_release(total);
    if (t1) kiln_tensor_release(t1);
    if (t2) kiln_tensor_release(t2);
    return s;
}

/* gradient: all_reduce(g) (sum or mean, as the bucket), each input's part a view of it */
KILN_GRAD(all_reduce_bucket) {
    const kiln_attrs *a = ctx->attrs;
    kiln_tensor *g, *total = NULL;
    KILN_TRY(gradient_or_zeros(ctx, gout, &g));
    kiln_status s = emit(KILN_OP_ALL_REDUCE, g, a->i[KILN_A_ALL_REDUCE_BUCKET_OP], a->i[KILN_A_ALL_REDUCE_BUCKET_GROUP],
                         0, 2, &total);
    kiln_tensor_release(g);
    int64_t at = 0;
    for (int j = 0; j < ctx->nin && s == KILN_OK; j++) {
        const kiln_meta *m = &ctx->in_meta[j];
        int64_t n = 1;
        for (int d = 0; d < m->ndim; d++) n *= m->shape[d];
        if (ctx->needs_grad[j]) {
            kiln_attrs sa, ra;
            kiln_attrs_clear(&sa);
            kiln_attrs_clear(&ra);
            for (int d = 0; d < 24; d++) kiln_attrs_push_int(&sa, d == 0 ? at : d == 8 ? 1 : d == 16 ? n : 0);
            for (int d = 0; d < m->ndim; d++) kiln_attrs_push_int(&ra, m->shape[d]);
            kiln_tensor *part = NULL;
            s = kiln_apply(KILN_OP_SLICE, 1, &total, &sa, &part);
            if (s == KILN_OK) s = kiln_apply(KILN_OP_RESHAPE, 1, &part, &ra, &gin[j]);
            if (part) kiln_tensor_release(part);
        }
        at += n;
    }
    kiln_tensor_release(total);
    return s;
}

KILN_GRAD(all_gather) {
    kiln_tensor *g;
    KILN_TRY(gradient_or_zeros(ctx, gout, &g));
    kiln_tensor *r = NULL;
    kiln_status s = emit(KILN_OP_REDUCE_SCATTER, g, KILN_COMM_SUM, ctx->attrs->i[KILN_A_ALL_GATHER_GROUP], 0, 2, &r);
    kiln_tensor_release(g);
    if (s == KILN_OK && ctx->needs_grad[0]) gin[0] = r;
    else if (r) kiln_tensor_release(r);
    return s;
}

KILN_GRAD(reduce_scatter) {
    int64_t op = ctx->attrs->i[KILN_A_REDUCE_SCATTER_OP], group = ctx->attrs->i[KILN_A_REDUCE_SCATTER_GROUP];
    if (op != KILN_COMM_SUM && op != KILN_COMM_MEAN)
        return kiln_error(KILN_ERR_NOT_IMPLEMENTED, "reduce_scatter: the gradient of %s is not implemented (sum and "
                          "mean have one)", kiln_comm_reduce_name((int)op));
    kiln_tensor *g, *r = NULL;
    KILN_TRY(gradient_or_zeros(ctx, gout, &g));
    kiln_status s = emit(KILN_OP_ALL_GATHER, g, group, 0, 0, 1, &r);
    kiln_tensor_release(g);
    if (s == KILN_OK && op == KILN_COMM_MEAN) {
        kiln_tensor *d = NULL;
        s = divide_by_size(r, group, &d);
        kiln_tensor_release(r);
        r = d;
    }
    if (s == KILN_OK && ctx->needs_grad[0]) gin[0] = r;
    else if (r) kiln_tensor_release(r);
    return s;
}

KILN_GRAD(broadcast) {
    kiln_tensor *g, *r = NULL;
    KILN_TRY(gradient_or_zeros(ctx, gout, &g));
    kiln_status s = emit(KILN_OP_REDUCE_TO, g, KILN_COMM_SUM, ctx->attrs->i[KILN_A_BROADCAST_ROOT],
                         ctx->attrs->i[KILN_A_BROADCAST_GROUP], 3, &r);
    kiln_tensor_release(g);
    if (s == KILN_OK && ctx->needs_grad[0]) gin[0] = r;
    else if (r) kiln_tensor_release(r);
    return s;
}

KILN_GRAD(reduce_to) {
    int64_t op = ctx->attrs->i[KILN_A_REDUCE_TO_OP], group = ctx->attrs->i[KILN_A_REDUCE_TO_GROUP];
    if (op != KILN_COMM_SUM && op != KILN_COMM_MEAN)
        return kiln_error(KILN_ERR_NOT_IMPLEMENTED, "reduce: the gradient of %s is not implemented (sum and mean have "
                          "one)", kiln_comm_reduce_name((int)op));
    kiln_tensor *g, *r = NULL;
    KILN_TRY(gradient_or_zeros(ctx, gout, &g));
    kiln_status s = emit(KILN_OP_BROADCAST, g, ctx->attrs->i[KILN_A_REDUCE_TO_ROOT], group, 0, 2, &r);
    kiln_tensor_release(g);
    if (s == KILN_OK && op == KILN_COMM_MEAN) {
        kiln_tensor *d = NULL;
        s = divide_by_size(r, group, &d);
        kiln_tensor_release(r);
        r = d;
    }
    if (s == KILN_OK && ctx->needs_grad[0]) gin[0] = r;
    else if (r) kiln_tensor_release(r);
    return s;
}
