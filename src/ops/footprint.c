/* Per-op footprints for profiles: FLOPs from the op table's KILN_COST lines (src/ops/ops.def), bytes
 * from the shapes, and the kernel events the executors record with them (kiln_profile_op). */
#include "../core/profile.h"
#include "footprint.h"

typedef enum { COST_NONE, COST_PER_OUT, COST_PER_IN, COST_MATMUL, COST_CONV, COST_CONV_BWD_INPUT,
               COST_CONV_BWD_WEIGHT, COST_POOL, COST_ATTENTION } cost_model;

static const struct {
    cost_model model;
    int64_t k;
} cost[KILN_OP_COUNT] = {
#define KILN_OP(...)
#define KILN_COST(ENUM, model_, k_) [KILN_OP_##ENUM] = {COST_##model_, k_},
#include "ops.def"
#undef KILN_COST
#undef KILN_OP
};

static int64_t numel(const kiln_meta *m) { return m ? kiln_shape_numel(m->ndim, m->shape) : 0; }
static int64_t per_lead(const kiln_meta *m) { /* elements per index of the first axis */
    return m && m->ndim > 0 && m->shape[0] > 0 ? numel(m) / m->shape[0] : 0;
}

int64_t kiln_op_flops(kiln_op op, const kiln_attrs *attrs, int nin, const kiln_meta *const *in, int nout,
                      const kiln_meta *const *out) {
    if ((unsigned)op >= KILN_OP_COUNT || nout < 1) return 0;
    const kiln_meta *in0 = nin > 0 ? in[0] : NULL, *in1 = nin > 1 ? in[1] : NULL, *o = out[0];
    int64_t k = cost[op].k;
    switch (cost[op].model) {
    case COST_NONE: return 0;
    case COST_PER_OUT: return k * numel(o);
    case COST_PER_IN: return k * numel(in0);
    case COST_MATMUL: {
        int64_t depth = in0 && in0->ndim > 0 ? in0->shape[in0->ndim - 1] : 0;
        int64_t extra = 0; /* a bias, or the epilogue's steps: one operation per result each */
        if (op == KILN_OP_LINEAR) extra = nin > 2;
        if (op == KILN_OP_MATMUL_EPILOGUE && attrs) /* linear's bias, then the steps */
            extra = (attrs->i[KILN_A_MATMUL_EPILOGUE_BASE] == 1 && attrs->i[KILN_A_MATMUL_EPILOGUE_BASE_INPUTS] == 3) +
                    attrs->i[KILN_A_MATMUL_EPILOGUE_NSTEPS];
        return (2 * depth + extra) * numel(o);
    }
    case COST_CONV: { /* conv2d_fused: its bias, residual and activation one operation per result each */
        int64_t extra = 0;
        if (op == KILN_OP_CONV2D) extra = nin > 2;
        else if (attrs)
            extra = (attrs->i[KILN_A_CONV2D_FUSED_HAS_BIAS] != 0) + (attrs->i[KILN_A_CONV2D_FUSED_HAS_RESIDUAL] != 0) +
                    (attrs->i[KILN_A_CONV2D_FUSED_ACT] != 0);
        return (2 * per_lead(in1) + extra) * numel(o);
    }
    case COST_CONV_BWD_INPUT: return 2 * numel(in0) * per_lead(in1);
    case COST_CONV_BWD_WEIGHT: return 2 * numel(in1) * per_lead(o);
    case COST_ATTENTION: { /* forward (q, k, v) -> out; backward (gout, q, k, ...) */
        const kiln_meta *q = k ? in1 : in0, *kk = nin > 1 + k ? in[1 + k] : NULL, *ov = k ? in0 : o;
        int64_t keys = kk && kk->ndim >= 2 ? kk->shape[kk->ndim - 2] : 0;
        int64_t rows = q && q->ndim > 0 && q->shape[q->ndim - 1] > 0 ? numel(q) / q->shape[q->ndim - 1] : 0;
        return k ? keys * (6 * numel(q) + 4 * numel(ov)) : keys * (2 * numel(q) + 2 * numel(ov) + 4 * rows);
    }
    case COST_POOL: {
        int64_t window = attrs && attrs->ni >= 2 ? attrs->i[KILN_A_POOL_KERNEL] * attrs->i[KILN_A_POOL_KERNEL + 1] : 1;
        return k * window * (op == KILN_OP_AVG_POOL2D_BACKWARD ? numel(in0) : numel(o));
    }
    }
    return 0;
}

static int64_t meta_bytes(const kiln_meta *m) { return numel(m) * (int64_t)kiln_dtype_size(m->dtype); }

/* Appends text at buf[*used] (size: the buffer's; text that does not fit is cut). */
static void put(char *buf, size_t size, size_t *used, const char *text, size_t n) {
    if (*used + n >= size) n = *used + 1 < size ? size - *used - 1 : 0;
    memcpy(buf + *used, text, n);
    *used += n;
    buf[*used] = '\0';
}

static void put_int(char *buf, size_t size, size_t *used, int64_t v) {
    char digits[24];
    int n = 0;
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    do digits[sizeof digits - 1 - n++] = (char)('0' + u % 10);
    while ((u /= 10) && n < 20);
    if (v < 0) digits[sizeof digits - 1 - n++] = '-';
    put(buf, size, used, digits + sizeof digits - n, (size_t)n);
}

/* "float32[2,3];int64[]" into buf (recording runs per kernel: no printf). */
static void metas_text(int n, const kiln_meta *const *m, char *buf, size_t size) {
    size_t used = 0;
    buf[0] = '\0';
    for (int k = 0; k < n; k++) {
        if (k) put(buf, size, &used, ";", 1);
        const char *dtype = kiln_dtype_name(m[k]->dtype);
        put(buf, size, &used, dtype, strlen(dtype));
        put(buf, size, &used, "[", 1);
        for (int d = 0; d < m[k]->ndim; d++) {
            if (d) put(buf, size, &used, ",", 1);
            put_int(buf, size, &used, m[k]->shape[d]);
        }
        put(buf, size, &used, "]", 1);
    }
}

void kiln_profile_op(kiln_profile_op_info *info, int nin, const kiln_meta *const *in, int nout,
                     const kiln_meta *const *out, int64_t start) {
    const kiln_op_info *op = &kiln_op_table[info->op];
    char ins[1024], outs[512];
    metas_text(nin, in, ins, sizeof ins);
    metas_text(nout, out, outs, sizeof outs);
    kiln_profile_event e = {.source = info->source, .op = info->op, .node = info->node, .graph = info->graph,
                            .name = info->name ? info->name : op->name, .loc = info->loc, .inputs = ins,
                            .outputs = outs};
    e.flops = info->flops >= 0 ? info->flops : kiln_op_flops(info->op, info->attrs, nin, in, nout, out);
    if (!(op->flags & KILN_OPF_VIEW)) { /* a view moves no data */
        for (int k = 0; k < nin; k++) e.bytes_read += meta_bytes(in[k]);
        for (int k = 0; k < nout; k++) e.bytes_written += meta_bytes(out[k]);
    }
    kiln_profile_record_kernel(&e, start);
}

void kiln_profile_tensors(kiln_profile_op_info *info, int nin, kiln_tensor *const *in, int nout,
                          kiln_tensor *const *out, int64_t start) {
    const kiln_meta *small[2 * 16], **m = small;
    if (nin + nout > (int)(sizeof small / sizeof *small)) m = malloc(sizeof *m * (size_t)(nin + nout));
    if (!m) return;
    for (int k = 0; k < nin; k++) m[k] = &in[k]->meta;
    int made = 0; /* outputs a failed kernel left unmade are not listed */
    for (int k = 0; k < nout; k++)
        if (out[k]) m[nin + made++] = &out[k]->meta;
    kiln_profile_op(info, nin, m, made, m + nin, start);
    if (m != small) free(m);
}
