/* vmap: a recorded graph of one example -> the graph of a batch of them (kiln.vmap).
 *
 * Every value of the new graph is either unbatched (the value of the recording, shared by every
 * example) or batched with the batch axis first. Inputs named by in_axes come batched at their
 * axis and are moved to axis 0 once; each node then follows its op's batching rule (the KILN_BATCH
 * lines of ops.def, documented there); a node with no batched input is copied as it is (computed
 * once for the whole batch). Outputs are moved to their out_axes (an unbatched one broadcast over
 * the batch). A node whose op has no rule, or whose rule does not apply to the way its inputs are
 * batched, runs once per example (slices of the batched inputs, the results stacked): the slow path,
 * reported per op to the caller (kiln.vmap warns naming them). */
#include <string.h>

#include "passes_internal.h"

/* a rule's answer: it does not apply to these inputs (the node runs per example) */
#define NO_RULE ((kiln_status)100)

typedef enum {
    BR_NONE = 0,
    BR_ELEMENTWISE,
    BR_REDUCE,
    BR_ALONG,
    BR_MATMUL,
    BR_LINEAR,
    BR_RESHAPE,
    BR_PERMUTE,
    BR_EXPAND,
    BR_SLICE,
    BR_SLICE_ASSIGN,
    BR_GATHER,
    BR_INDEX_ADD,
    BR_FOLD,
    BR_CONV,
    BR_NORM_BACKWARD,
    BR_CHANNELS,
    BR_LEADING,
    BR_LEADING_ALL,
    BR_UNBATCHED,
} batch_rule;

typedef struct {
    batch_rule rule;
    int arg;
} batch_info;

#define BR_ENUM_elementwise BR_ELEMENTWISE
#define BR_ENUM_reduce BR_REDUCE
#define BR_ENUM_along BR_ALONG
#define BR_ENUM_matmul BR_MATMUL
#define BR_ENUM_linear BR_LINEAR
#define BR_ENUM_reshape BR_RESHAPE
#define BR_ENUM_permute BR_PERMUTE
#define BR_ENUM_expand BR_EXPAND
#define BR_ENUM_slice BR_SLICE
#define BR_ENUM_slice_assign BR_SLICE_ASSIGN
#define BR_ENUM_gather BR_GATHER
#define BR_ENUM_index_add BR_INDEX_ADD
#define BR_ENUM_fold BR_FOLD
#define BR_ENUM_conv BR_CONV
#define BR_ENUM_norm_backward BR_NORM_BACKWARD
#define BR_ENUM_channels BR_CHANNELS
#define BR_ENUM_leading BR_LEADING
#define BR_ENUM_leading_all BR_LEADING_ALL
#define BR_ENUM_unbatched BR_UNBATCHED

static const batch_info rules[KILN_OP_COUNT] = {
#define KILN_OP(...)
#define KILN_BATCH(ENUM, rule, arg) [KILN_OP_##ENUM] = {BR_ENUM_##rule, arg},
#include "../ops/ops.def"
#undef KILN_BATCH
#undef KILN_OP
};

static const char *const rule_names[] = {
    "", "elementwise", "reduce", "along", "matmul", "linear", "reshape", "permute", "expand", "slice",
    "slice_assign", "gather", "index_add", "fold", "conv", "norm_backward", "channels", "leading", "leading_all",
    "unbatched",
};

const char *kiln_batch_rule_name(kiln_op op) {
    return (unsigned)op < KILN_OP_COUNT ? rule_names[rules[op].rule] : "";
}

/* ---- the transform's state ------------------------------------------------------------------- */

typedef struct {
    const kiln_graph *g;
    kiln_graph *ng;
    int64_t B;
    int32_t *map; /* g value -> ng value */
    bool *bat;    /* g value -> batched (axis 0) in ng */
    int32_t loc;  /* of the node being batched */
    const char *op; /* its name, for messages */
    bool *fallback; /* per op: ran per example (may be NULL) */
} vm;

typedef struct {
    int32_t v;
    bool b;
} bv;

static const kiln_meta *meta(const vm *c, int32_t v) { return &c->ng->values[v].meta; }
/* The rank a value has in one example. */
static int rank1(const vm *c, bv x) { return meta(c, x.v)->ndim - (x.b ? 1 : 0); }

static kiln_status add(vm *c, kiln_op op, int nin, const int32_t *in, const kiln_attrs *a, int32_t *out) {
    kiln_status s = kiln_graph_add_node(c->ng, op, nin, in, a, c->loc, out);
    if (s != KILN_OK) kiln_error_context(s, "vmap: batching %s", c->op);
    return s;
}

static kiln_status reshape(vm *c, int32_t v, int ndim, const int64_t *shape, int32_t *out) {
    const kiln_meta *m = meta(c, v);
    bool same = m->ndim == ndim;
    for (int d = 0; same && d < ndim; d++) same = m->shape[d] == shape[d];
    if (same) {
        *out = v;
        return KILN_OK;
    }
    if (ndim > KILN_MAX_DIMS)
        return kiln_error(KILN_ERR_VALUE, "vmap: batching %s needs %d dimensions, more than kiln's %d", c->op, ndim,
                          KILN_MAX_DIMS);
    kiln_attrs a = {.ni = ndim};
    for (int d = 0; d < ndim; d++) a.i[KILN_A_RESHAPE_SHAPE + d] = shape[d];
    return add(c, KILN_OP_RESHAPE, 1, &v, &a, out);
}

static kiln_status permute(vm *c, int32_t v, const int64_t *perm, int32_t *out) {
    const kiln_meta *m = meta(c, v);
    bool identity = true;
    for (int d = 0; d < m->ndim; d++) identity &= perm[d] == d;
    if (identity) {
        *out = v;
        return KILN_OK;
    }
    kiln_attrs a = {.ni = m->ndim};
    for (int d = 0; d < m->ndim; d++) a.i[KILN_A_PERMUTE_PERM + d] = perm[d];
    return add(c, KILN_OP_PERMUTE, 1, &v, &a, out);
}

/* Moves axis `from` of v to `to`. */
static kiln_status move_axis(vm *c, int32_t v, int from, int to, int32_t *out) {
    int n = meta(c, v)->ndim;
    int64_t perm[KILN_MAX_DIMS];
    int k = 0;
    for (int d = 0; d < n; d++)
        if (d != from) perm[k++] = d;
    for (int d = n - 1; d > to; d--) perm[d] = perm[d - 1];
    perm[to] = from;
    return permute(c, v, perm, out);
}

/* x batched with its per-example rank raised to r (ones inserted after the batch axis). */
static kiln_status align(vm *c, bv x, int r, int32_t *out) {
    const kiln_meta *m = meta(c, x.v);
    int r0 = m->ndim - 1;
    if (!x.b || r0 >= r) {
        *out = x.v;
        return KILN_OK;
    }
    int64_t shape[KILN_MAX_DIMS + 1];
    shape[0] = c->B;
    for (int d = 0; d < r - r0; d++) shape[1 + d] = 1;
    for (int d = 0; d < r0; d++) shape[1 + r - r0 + d] = m->shape[1 + d];
    return reshape(c, x.v, r + 1, shape, out);
}

/* x batched: unbatched values broadcast over the batch (a view). */
static kiln_status materialize(vm *c, bv x, int32_t *out) {
    if (x.b) {
        *out = x.v;
        return KILN_OK;
    }
    const kiln_meta *m = meta(c, x.v);
    if (m->ndim + 1 > KILN_MAX_DIMS)
        return kiln_error(KILN_ERR_VALUE, "vmap: batching %s needs %d dimensions, more than kiln's %d", c->op,
                          m->ndim + 1, KILN_MAX_DIMS);
    kiln_attrs a = {.ni = m->ndim + 1};
    a.i[KILN_A_EXPAND_SHAPE] = c->B;
    for (int d = 0; d < m->ndim; d++) a.i[KILN_A_EXPAND_SHAPE + 1 + d] = m->shape[d];
    return add(c, KILN_OP_EXPAND, 1, &x.v, &a, out);
}

/* (B, per-example shape of the recording's value v) */
static int batched_shape(const vm *c, int32_t v, int64_t *shape) {
    const kiln_meta *m = &c->g->values[v].meta;
    shape[0] = c->B;
    for (int d = 0; d < m->ndim; d++) shape[1 + d] = m->shape[d];
    return m->ndim + 1;
}

/* ---- rules ------------------------------------------------------------------------------------ */

static kiln_status rule_elementwise(vm *c, const kiln_node *n, const bv *in, int32_t *out) {
    int r = c->g->values[n->out[0]].meta.ndim;
    int32_t ins[8];
    if (n->nin > 8) return NO_RULE;
    for (int k = 0; k < n->nin; k++) KILN_TRY(align(c, in[k], r, &ins[k]));
    return add(c, n->op, n->nin, ins, &n->attrs, out);
}

/* The recording's output shapes of n, batched, asserted on what the rule made (a rule is never
 * silently wrong about a shape). */
static kiln_status check_outputs(vm *c, const kiln_node *n, const int32_t *out) {
    for (int k = 0; k < n->nout; k++) {
        int64_t shape[KILN_MAX_DIMS + 1];
        int nd = batched_shape(c, n->out[k], shape);
        const kiln_meta *m = meta(c, out[k]);
        bool same = m->ndim == nd;
        for (int d = 0; same && d < nd; d++) same = m->shape[d] == shape[d];
        if (!same) return kiln_error(KILN_ERR_RUNTIME, "vmap: the batching rule of %s gave output %d the wrong shape", c->op, k);
    }
    return KILN_OK;
}

static kiln_status rule_reduce(vm *c, const kiln_node *n, const bv *in, int32_t *out) {
    int64_t mask = n->attrs.i[KILN_A_REDUCE_AXES];
    if ((n->op == KILN_OP_ARGMAX || n->op == KILN_OP_ARGMIN) && (mask & (mask - 1))) return NO_RULE;
    kiln_attrs a = n->attrs;
    a.i[KILN_A_REDUCE_AXES] = mask << 1;
    return add(c, n->op, 1, &in[0].v, &a, out);
}

/* every input batched, the axis attribute (arg) shifted */
static kiln_status rule_along(vm *c, const kiln_node *n, const bv *in, int arg, int32_t *out) {
    int32_t *ins = kiln_malloc(sizeof *ins * (size_t)(n->nin ? n->nin : 1));
    if (!ins) return kiln_error(KILN_ERR_MEMORY, "out of memory");
    kiln_status s = KILN_OK;
    for (int k = 0; k < n->nin && s == KILN_OK; k++) s = materialize(c, in[k], &ins[k]);
    kiln_attrs a = n->attrs;
    if (a.i[arg] < 0) s = NO_RULE;
    a.i[arg] += 1;
    if (s == KILN_OK) s = add(c, n->op, n->nin, ins, &a, out);
    free(ins);
    return s;
}

/* matmul of a and b (NumPy's rules per example), reshaped to the per-example result shape res. */
static kiln_status batched_matmul(vm *c, bv a, bv b, int rres, const int64_t *res, int32_t *out) {
    int ra = rank1(c, a), rb = rank1(c, b);
    int64_t shape[KILN_MAX_DIMS + 1];
    if (a.b && ra == 1) { /* (B, K) -> (B, 1, K) */
        shape[0] = c->B, shape[1] = 1, shape[2] = meta(c, a.v)->shape[1];
        KILN_TRY(reshape(c, a.v, 3, shape, &a.v));
        ra = 2;
    }
    if (b.b && rb == 1) { /* (B, K) -> (B, K, 1) */
        shape[0] = c->B, shape[1] = meta(c, b.v)->shape[1], shape[2] = 1;
        KILN_TRY(reshape(c, b.v, 3, shape, &b.v));
        rb = 2;
    }
    /* the batched operands get at least as many batch axes as the other one */
    int lead = (ra > rb ? ra : rb);
    if (a.b) KILN_TRY(align(c, a, lead, &a.v));
    if (b.b) KILN_TRY(align(c, b, lead, &b.v));
    int32_t ins[2] = {a.v, b.v}, prod;
    /* a contraction over one element (a per-example weight gradient, gy x^T) is an outer
     * product: matmul's kernel writes it in one pass (mm_outer), without a GEMM per example */
    KILN_TRY(add(c, KILN_OP_MATMUL, 2, ins, NULL, &prod));
    shape[0] = c->B;
    for (int d = 0; d < rres; d++) shape[1 + d] = res[d];
    return reshape(c, prod, rres + 1, shape, out);
}

static kiln_status rule_matmul(vm *c, const kiln_node *n, const bv *in, int32_t *out) {
    const kiln_meta *r = &c->g->values[n->out[0]].meta;
    return batched_matmul(c, in[0], in[1], r->ndim, r->shape, out);
}

static kiln_status rule_linear(vm *c, const kiln_node *n, const bv *in, int32_t *out) {
    if (!in[1].b && (n->nin < 3 || !in[2].b)) { /* x alone batched: the batch is more rows */
        int32_t ins[3] = {in[0].v, in[1].v, n->nin > 2 ? in[2].v : 0};
        return add(c, KILN_OP_LINEAR, n->nin, ins, &n->attrs, out);
    }
    /* batched weights (an ensemble, or per-example weights): x @ w^T + b per example */
    const kiln_meta *r = &c->g->values[n->out[0]].meta;
    int64_t perm[3] = {0, 2, 1}, perm1[2] = {1, 0};
    int32_t prod;
    if (!in[0].b && !in[1].b) { /* the bias alone batched: the product once, the biases added */
        int32_t ins[2] = {in[0].v, in[1].v};
        KILN_TRY(add(c, KILN_OP_LINEAR, 2, ins, &n->attrs, &prod));
    } else {
        bv wt = {0, in[1].b};
        KILN_TRY(permute(c, in[1].v, in[1].b ? perm : perm1, &wt.v));
        KILN_TRY(batched_matmul(c, in[0], wt, r->ndim, r->shape, &prod));
    }
    if (n->nin < 3) {
        *out = prod;
        return KILN_OK;
    }
    int32_t ins[2];
    ins[0] = prod;
    KILN_TRY(align(c, in[2], r->ndim, &ins[1]));
    return add(c, KILN_OP_ADD, 2, ins, NULL, out);
}

static kiln_status rule_reshape(vm *c, const kiln_node *n, const bv *in, int32_t *out) {
    int64_t shape[KILN_MAX_DIMS + 1];
    int nd = batched_shape(c, n->out[0], shape);
    if (nd > KILN_MAX_DIMS) return NO_RULE;
    kiln_attrs a = {.ni = nd};
    for (int d = 0; d < nd; d++) a.i[KILN_A_RESHAPE_SHAPE + d] = shape[d];
    return add(c, KILN_OP_RESHAPE, 1, &in[0].v, &a, out);
}

static kiln_status rule_permute(vm *c, const kiln_node *n, const bv *in, int32_t *out) {
    int64_t perm[KILN_MAX_DIMS];
    perm[0] = 0;
    for (int d = 0; d < n->attrs.ni; d++) perm[1 + d] = n->attrs.i[KILN_A_PERMUTE_PERM + d] + 1;
    kiln_attrs a = {.ni = n->attrs.ni + 1};
    for (int d = 0; d < a.ni; d++) a.i[KILN_A_PERMUTE_PERM + d] = perm[d];
    return add(c, KILN_OP_PERMUTE, 1, &in[0].v, &a, out);
}

static kiln_status rule_expand(vm *c, const kiln_node *n, const bv *in, int32_t *out) {
    int32_t x;
    KILN_TRY(align(c, in[0], n->attrs.ni, &x));
    int64_t shape[KILN_MAX_DIMS + 1];
    int nd = batched_shape(c, n->out[0], shape);
    if (nd > KILN_MAX_DIMS) return NO_RULE;
    kiln_attrs a = {.ni = nd};
    for (int d = 0; d < nd; d++) a.i[KILN_A_EXPAND_SHAPE + d] = shape[d];
    return add(c, KILN_OP_EXPAND, 1, &x, &a, out);
}

/* slice attributes with the batch axis (taken whole) first */
static void shift_slice(const kiln_attrs *from, int r, int64_t B, kiln_attrs *a) {
    *a = *from;
    for (int d = r; d > 0; d--) {
        a->i[KILN_A_SLICE_START + d] = from->i[KILN_A_SLICE_START + d - 1];
        a->i[KILN_A_SLICE_STEP + d] = from->i[KILN_A_SLICE_STEP + d - 1];
        a->i[KILN_A_SLICE_LENGTH + d] = from->i[KILN_A_SLICE_LENGTH + d - 1];
    }
    a->i[KILN_A_SLICE_START] = 0;
    a->i[KILN_A_SLICE_STEP] = 1;
    a->i[KILN_A_SLICE_LENGTH] = B;
}

static kiln_status rule_slice(vm *c, const kiln_node *n, const bv *in, int32_t *out) {
    int r = rank1(c, in[0]);
    if (r + 1 > KILN_MAX_DIMS) return NO_RULE;
    kiln_attrs a;
    shift_slice(&n->attrs, r, c->B, &a);
    return add(c, KILN_OP_SLICE, 1, &in[0].v, &a, out);
}

static kiln_status rule_slice_assign(vm *c, const kiln_node *n, const bv *in, int32_t *out) {
    bv x = in[0];
    if (!x.b) {
        /* a batched value written into an unbatched tensor: allowed into a tensor the function
         * made (a batched copy is written instead), never into an argument or a captured tensor */
        if (c->g->values[n->in[0]].kind != KILN_VALUE_NODE)
            return kiln_error(KILN_ERR_VALUE,
                              "vmap: %s writes a value that varies over the batch into a tensor that does not "
                              "(an argument mapped with in_axes None, or a tensor from outside the function)",
                              c->op);
        int32_t e;
        KILN_TRY(materialize(c, x, &e));
        KILN_TRY(add(c, KILN_OP_CONTIGUOUS, 1, &e, NULL, &x.v));
        x.b = true;
    }
    int r = rank1(c, x);
    if (r + 1 > KILN_MAX_DIMS) return NO_RULE;
    kiln_attrs a;
    shift_slice(&n->attrs, r, c->B, &a);
    int32_t ins[2] = {x.v, 0};
    KILN_TRY(align(c, in[1], r, &ins[1]));
    return add(c, KILN_OP_SLICE_ASSIGN, 2, ins, &a, out);
}

/* batched indices (B, I...) as (B, 1.., n, 1..) broadcast to target (rank nd, n at axis): what
 * gather_elements and scatter_add_elements take for a per-example gather or index_add */
static kiln_status spread_indices(vm *c, int32_t idx, int nd, int axis, const int64_t *target, int32_t *out) {
    int64_t shape[KILN_MAX_DIMS] = {0};
    for (int d = 0; d < nd; d++) shape[d] = d == 0 ? c->B : (d == axis ? target[axis] : 1);
    int32_t r;
    KILN_TRY(reshape(c, idx, nd, shape, &r));
    kiln_attrs a = {.ni = nd};
    for (int d = 0; d < nd; d++) a.i[KILN_A_EXPAND_SHAPE + d] = target[d];
    return add(c, KILN_OP_EXPAND, 1, &r, &a, out);
}

static kiln_status rule_gather(vm *c, const kiln_node *n, const bv *in, int32_t *out) {
    int64_t axis = n->attrs.i[KILN_A_INDEX_AXIS];
    if (axis < 0) return NO_RULE;
    if (in[0].b && !in[1].b) { /* a batch of tables, one index */
        kiln_attrs a = n->attrs;
        a.i[KILN_A_INDEX_AXIS] = axis + 1;
        int32_t ins[2] = {in[0].v, in[1].v};
        return add(c, KILN_OP_GATHER, 2, ins, &a, out);
    }
    if (!in[0].b && in[1].b) { /* one table, a batch of indices: the batch axis lands at `axis` */
        int32_t ins[2] = {in[0].v, in[1].v}, g;
        KILN_TRY(add(c, KILN_OP_GATHER, 2, ins, &n->attrs, &g));
        return move_axis(c, g, (int)axis, 0, out);
    }
    /* a batch of tables and of indices: gather_elements with the indices spread along the axis */
    int32_t x = in[0].v, idx;
    const kiln_meta *mx = meta(c, x);
    int64_t target[KILN_MAX_DIMS];
    int64_t count = 1;
    const kiln_meta *mi = meta(c, in[1].v);
    for (int d = 1; d < mi->ndim; d++) count *= mi->shape[d];
    for (int d = 0; d < mx->ndim; d++) target[d] = mx->shape[d];
    target[axis + 1] = count;
    KILN_TRY(spread_indices(c, in[1].v, mx->ndim, (int)axis + 1, target, &idx));
    kiln_attrs a = {.ni = 1};
    a.i[KILN_A_INDEX_AXIS] = axis + 1;
    int32_t ins[2] = {x, idx}, g;
    KILN_TRY(add(c, KILN_OP_GATHER_ELEMENTS, 2, ins, &a, &g));
    int64_t shape[KILN_MAX_DIMS + 1];
    int nd = batched_shape(c, n->out[0], shape);
    return reshape(c, g, nd, shape, out);
}

static kiln_status rule_index_add(vm *c, const kiln_node *n, const bv *in, int32_t *out) {
    int64_t axis = n->attrs.i[KILN_A_INDEX_AXIS];
    if (axis < 0) return NO_RULE;
    int32_t ins[3];
    KILN_TRY(materialize(c, in[0], &ins[0]));
    ins[1] = in[1].v;
    KILN_TRY(materialize(c, in[2], &ins[2]));
    kiln_attrs a = n->attrs;
    a.i[KILN_A_INDEX_AXIS] = axis + 1;
    if (!in[1].b) return add(c, n->op, 3, ins, &a, out);
    /* per-example indices (a per-example embedding gradient): scatter_add_elements with the
     * indices spread over the source's shape */
    int32_t idx = in[1].v;
    if (meta(c, idx)->ndim == 1) { /* one index per example: the source without the axis */
        int64_t shape[KILN_MAX_DIMS + 1] = {c->B, 1};
        KILN_TRY(reshape(c, idx, 2, shape, &idx));
        const kiln_meta *m0 = meta(c, ins[2]);
        if (m0->ndim + 1 > KILN_MAX_DIMS) return NO_RULE;
        for (int d = 0, k = 0; d <= m0->ndim; d++) shape[d] = d == axis + 1 ? 1 : m0->shape[k++];
        KILN_TRY(reshape(c, ins[2], m0->ndim + 1, shape, &ins[2]));
    }
    const kiln_meta *ms = meta(c, ins[2]);
    if (meta(c, idx)->ndim != 2 || ms->ndim != meta(c, ins[0])->ndim) return NO_RULE;
    KILN_TRY(spread_indices(c, idx, ms->ndim, (int)axis + 1, ms->shape, &ins[1]));
    return add(c, KILN_OP_SCATTER_ADD_ELEMENTS, 3, ins, &a, out);
}

/* NCHW ops: the batch folded into N. Input 0 batched (with input 1 for the max pool's backward,
 * which reads x), the others (weights) not; arg: the first of the attributes holding the result's
 * (N, C, H, W), or -1. */
static kiln_status rule_fold(vm *c, const kiln_node *n, const bv *in, int arg, int32_t *out) {
    int nfold = n->op == KILN_OP_MAX_POOL2D_BACKWARD ? 2 : 1;
    for (int k = nfold; k < n->nin; k++)
        if (in[k].b) return NO_RULE;
    int32_t ins[8];
    if (n->nin > 8) return NO_RULE;
    for (int k = 0; k < n->nin; k++) ins[k] = in[k].v;
    for (int k = 0; k < nfold; k++) {
        int32_t m;
        KILN_TRY(materialize(c, in[k], &m));
        const kiln_meta *mm = meta(c, m);
        if (mm->ndim != 5) return NO_RULE;
        int64_t shape[4] = {mm->shape[0] * mm->shape[1], mm->shape[2], mm->shape[3], mm->shape[4]};
        KILN_TRY(reshape(c, m, 4, shape, &ins[k]));
    }
    kiln_attrs a = n->attrs;
    if (arg >= 0) a.i[arg] *= c->B;
    int32_t folded;
    KILN_TRY(add(c, n->op, n->nin, ins, &a, &folded));
    int64_t shape[KILN_MAX_DIMS + 1];
    int nd = batched_shape(c, n->out[0], shape);
    return reshape(c, folded, nd, shape, out);
}

/* (B, N, C, H, W) -> (N, B*C, H, W): the batch as groups of channels */
static kiln_status to_groups(vm *c, bv x, int32_t *out) {
    int32_t m, p;
    KILN_TRY(materialize(c, x, &m));
    const kiln_meta *mm = meta(c, m);
    if (mm->ndim != 5) return NO_RULE;
    int64_t perm[5] = {1, 0, 2, 3, 4};
    int64_t shape[4] = {mm->shape[1], mm->shape[0] * mm->shape[2], mm->shape[3], mm->shape[4]};
    KILN_TRY(permute(c, m, perm, &p));
    return reshape(c, p, 4, shape, out);
}

/* (N, B*C, H, W) -> (B, N, C, H, W) */
static kiln_status from_groups(vm *c, int32_t v, int32_t *out) {
    const kiln_meta *m = meta(c, v);
    int64_t shape[5] = {m->shape[0], c->B, m->shape[1] / c->B, m->shape[2], m->shape[3]};
    int64_t perm[5] = {1, 0, 2, 3, 4};
    int32_t r;
    KILN_TRY(reshape(c, v, 5, shape, &r));
    return permute(c, r, perm, out);
}

/* convolutions: a batch of inputs with one weight folds the batch into N (rule_fold); a batch of
 * weights (an ensemble, per-example weight gradients) runs as one grouped convolution, each
 * example's channels a group of their own */
static kiln_status rule_conv(vm *c, const kiln_node *n, const bv *in, int arg, int32_t *out) {
    bool weights = n->op == KILN_OP_CONV2D_BACKWARD_WEIGHT || in[1].b || (n->nin > 2 && in[2].b);
    if (!weights) return rule_fold(c, n, in, arg, out);
    kiln_attrs a = n->attrs;
    a.i[KILN_A_CONV_GROUPS] *= c->B;
    int32_t ins[3], r;
    if (n->op == KILN_OP_CONV2D_BACKWARD_WEIGHT) { /* (x, gy) -> the weight's gradient per example */
        KILN_TRY(to_groups(c, in[0], &ins[0]));
        KILN_TRY(to_groups(c, in[1], &ins[1]));
        a.i[KILN_A_CONV_SHAPE] *= c->B;
        KILN_TRY(add(c, n->op, 2, ins, &a, &r));
        int64_t shape[KILN_MAX_DIMS + 1];
        int nd = batched_shape(c, n->out[0], shape);
        return reshape(c, r, nd, shape, out);
    }
    /* conv2d (x, w[, b]) or conv2d_backward_input (gy, w): input 0 as groups, the weights stacked */
    KILN_TRY(to_groups(c, in[0], &ins[0]));
    int32_t w;
    KILN_TRY(materialize(c, in[1], &w));
    const kiln_meta *mw = meta(c, w);
    if (mw->ndim != 5) return NO_RULE;
    int64_t wshape[4] = {mw->shape[0] * mw->shape[1], mw->shape[2], mw->shape[3], mw->shape[4]};
    KILN_TRY(reshape(c, w, 4, wshape, &ins[1]));
    if (n->nin > 2) {
        int32_t b;
        KILN_TRY(materialize(c, in[2], &b));
        int64_t bshape[1] = {meta(c, b)->shape[0] * meta(c, b)->shape[1]};
        KILN_TRY(reshape(c, b, 1, bshape, &ins[2]));
    }
    if (n->op == KILN_OP_CONV2D_BACKWARD_INPUT) a.i[KILN_A_CONV_SHAPE + 1] *= c->B;
    KILN_TRY(add(c, n->op, n->nin, ins, &a, &r));
    return from_groups(c, r, out);
}

/* ops over trailing axes whose leading axes are independent rows: input 0 batched, the others
 * (weights) not (leading_all: every input batched) */
static kiln_status rule_leading(vm *c, const kiln_node *n, const bv *in, bool all, int32_t *out) {
    int32_t *ins = kiln_malloc(sizeof *ins * (size_t)(n->nin ? n->nin : 1));
    if (!ins) return kiln_error(KILN_ERR_MEMORY, "out of memory");
    kiln_status s = KILN_OK;
    for (int k = 0; k < n->nin && s == KILN_OK; k++) {
        if (all || k == 0) s = materialize(c, in[k], &ins[k]);
        else if (in[k].b) s = NO_RULE;
        else ins[k] = in[k].v;
    }
    if (s == KILN_OK) s = add(c, n->op, n->nin, ins, &n->attrs, out);
    free(ins);
    return s;
}

/* layer_norm_backward (gy, x, w, mean, rstd) -> (gx, gw, gb) and rms_norm_backward (gy, x, w, rstd)
 * -> (gx, gw) with one weight: gx from the op (its rows are independent), the weight's gradients
 * per example summed over each example's rows only (the op would sum over the whole batch). */
static kiln_status rule_norm_backward(vm *c, const kiln_node *n, const bv *in, int32_t *out) {
    if (in[2].b) return NO_RULE;
    bool layer = n->op == KILN_OP_LAYER_NORM_BACKWARD;
    int32_t ins[5], outs[KILN_MAX_OUTPUTS];
    for (int k = 0; k < n->nin; k++) {
        if (k == 2) ins[k] = in[k].v;
        else KILN_TRY(materialize(c, in[k], &ins[k]));
    }
    KILN_TRY(add(c, n->op, n->nin, ins, &n->attrs, outs));
    out[0] = outs[0];
    /* xhat = (x - mean) * rstd, or x * rstd */
    int32_t xhat, prod, two[2];
    two[0] = ins[1], two[1] = ins[3];
    if (layer) KILN_TRY(add(c, KILN_OP_SUB, 2, two, NULL, &two[0]));
    two[1] = ins[layer ? 4 : 3];
    KILN_TRY(add(c, KILN_OP_MUL, 2, two, NULL, &xhat));
    two[0] = ins[0], two[1] = xhat;
    KILN_TRY(add(c, KILN_OP_MUL, 2, two, NULL, &prod));
    int nd = meta(c, ins[1])->ndim;
    int nlead = nd - 1 - (int)n->attrs.i[KILN_A_NORM_NAXES];
    kiln_attrs sum = {.ni = KILN_A_REDUCE_NI};
    for (int d = 1; d <= nlead; d++) sum.i[KILN_A_REDUCE_AXES] |= (int64_t)1 << d;
    int32_t sums[2] = {prod, ins[0]};
    for (int k = 0; k < (layer ? 2 : 1); k++) {
        int32_t s = sums[k];
        if (nlead > 0) KILN_TRY(add(c, KILN_OP_SUM, 1, &sums[k], &sum, &s));
        const kiln_meta *want = &c->g->values[n->out[1 + k]].meta;
        if (meta(c, s)->dtype != want->dtype) {
            kiln_attrs cast = {.ni = KILN_A_CAST_NI};
            cast.i[KILN_A_CAST_DTYPE] = want->dtype;
            KILN_TRY(add(c, KILN_OP_CAST, 1, &s, &cast, &s));
        }
        out[1 + k] = s;
    }
    return KILN_OK;
}

/* (B, N, C, ...) -> (N, B*C, ...): each example's channels a block of channels of their own */
static kiln_status channels_in(vm *c, bv x, int32_t *out) {
    int32_t m, p;
    KILN_TRY(materialize(c, x, &m));
    const kiln_meta *mm = meta(c, m);
    if (mm->ndim < 3) return NO_RULE;
    int64_t perm[KILN_MAX_DIMS], shape[KILN_MAX_DIMS];
    for (int d = 0; d < mm->ndim; d++) perm[d] = d;
    perm[0] = 1, perm[1] = 0;
    shape[0] = mm->shape[1], shape[1] = mm->shape[0] * mm->shape[2];
    for (int d = 3; d < mm->ndim; d++) shape[d - 1] = mm->shape[d];
    KILN_TRY(permute(c, m, perm, &p));
    return reshape(c, p, mm->ndim - 1, shape, out);
}

/* batch_norm_backward (gy, x, gamma, mean, invstd) and batch_norm_relu_backward (..., r): statistics
 * per channel over (N, ...), so the batch folds into the channels: gy, x (and r) as (N, B*C, ...),
 * the per-channel vectors as (B*C,); gx back to (B, N, C, ...), the vectors' gradients to (B, C). */
static kiln_status rule_channels(vm *c, const kiln_node *n, const bv *in, int32_t *out) {
    int32_t ins[6], outs[3];
    if (n->nin > 6) return NO_RULE;
    for (int k = 0; k < n->nin; k++) {
        if (k < 2 || k == 5) {
            KILN_TRY(channels_in(c, in[k], &ins[k]));
            continue;
        }
        int32_t m;
        KILN_TRY(materialize(c, in[k], &m));
        const kiln_meta *mm = meta(c, m);
        if (mm->ndim != 2) return NO_RULE;
        int64_t flat[1] = {mm->shape[0] * mm->shape[1]};
        KILN_TRY(reshape(c, m, 1, flat, &ins[k]));
    }
    KILN_TRY(add(c, n->op, n->nin, ins, &n->attrs, outs));
    const kiln_meta *gx = meta(c, outs[0]);
    int64_t perm[KILN_MAX_DIMS + 1], shape[KILN_MAX_DIMS + 1];
    if (gx->ndim + 1 > KILN_MAX_DIMS)
        return kiln_error(KILN_ERR_VALUE, "vmap: batching %s needs %d dimensions, more than kiln's %d", c->op,
                          gx->ndim + 1, KILN_MAX_DIMS);
    shape[0] = gx->shape[0], shape[1] = c->B, shape[2] = gx->shape[1] / c->B;
    for (int d = 2; d < gx->ndim; d++) shape[d + 1] = gx->shape[d];
    for (int d = 0; d <= gx->ndim; d++) perm[d] = d;
    perm[0] = 1, perm[1] = 0;
    int32_t r;
    KILN_TRY(reshape(c, outs[0], gx->ndim + 1, shape, &r));
    KILN_TRY(permute(c, r, perm, &out[0]));
    for (int k = 1; k < 3; k++) {
        int64_t vs[KILN_MAX_DIMS + 1];
        int nd = batched_shape(c, n->out[k], vs);
        KILN_TRY(reshape(c, outs[k], nd, vs, &out[k]));
    }
    return KILN_OK;
}

/* The slow path: the node once per example, the results stacked. */
static kiln_status per_example(vm *c, const kiln_node *n, const bv *in, int32_t *out) {
    if (kiln_op_has_side_effects(n->op) || (kiln_op_table[n->op].flags & KILN_OPF_CONTROL))
        return kiln_error(KILN_ERR_NOT_IMPLEMENTED,
                          "vmap: %s has no batching rule for these inputs, and writes in place or has effects, so it "
                          "cannot run once per example either", c->op);
    int64_t B = c->B;
    int32_t *ins = kiln_malloc(sizeof *ins * (size_t)(n->nin ? n->nin : 1));
    int32_t *res = kiln_malloc(sizeof *res * (size_t)(B * n->nout + 1));
    if (!ins || !res) {
        free(ins), free(res);
        return kiln_error(KILN_ERR_MEMORY, "out of memory");
    }
    kiln_status s = KILN_OK;
    for (int64_t b = 0; b < B && s == KILN_OK; b++) {
        for (int k = 0; k < n->nin && s == KILN_OK; k++) {
            if (!in[k].b) {
                ins[k] = in[k].v;
                continue;
            }
            const kiln_meta *m = meta(c, in[k].v);
            kiln_attrs a = {.ni = KILN_A_SLICE_NI};
            for (int d = 0; d < m->ndim; d++) {
                a.i[KILN_A_SLICE_START + d] = d == 0 ? b : 0;
                a.i[KILN_A_SLICE_STEP + d] = 1;
                a.i[KILN_A_SLICE_LENGTH + d] = d == 0 ? 1 : m->shape[d];
            }
            int32_t sl;
            s = add(c, KILN_OP_SLICE, 1, &in[k].v, &a, &sl);
            if (s == KILN_OK) s = reshape(c, sl, m->ndim - 1, m->shape + 1, &ins[k]);
        }
        int32_t outs[KILN_MAX_OUTPUTS];
        if (s == KILN_OK) s = add(c, n->op, n->nin, ins, &n->attrs, outs);
        for (int k = 0; k < n->nout && s == KILN_OK; k++) {
            const kiln_meta *m = meta(c, outs[k]);
            int64_t shape[KILN_MAX_DIMS + 1];
            shape[0] = 1;
            memcpy(shape + 1, m->shape, sizeof(int64_t) * (size_t)m->ndim);
            s = reshape(c, outs[k], m->ndim + 1, shape, &res[k * B + b]);
        }
    }
    kiln_attrs cat = {.ni = 1};
    cat.i[KILN_A_CONCAT_AXIS] = 0;
    for (int k = 0; k < n->nout && s == KILN_OK; k++) s = add(c, KILN_OP_CONCAT, (int)B, res + k * B, &cat, &out[k]);
    free(ins), free(res);
    if (s == KILN_OK && c->fallback) c->fallback[n->op] = true;
    return s;
}

static kiln_status batch_node(vm *c, const kiln_node *n, const bv *in, int32_t *out) {
    batch_info r = rules[n->op];
    switch (r.rule) {
    case BR_ELEMENTWISE: return rule_elementwise(c, n, in, out);
    case BR_REDUCE: return rule_reduce(c, n, in, out);
    case BR_ALONG: return rule_along(c, n, in, r.arg, out);
    case BR_MATMUL: return rule_matmul(c, n, in, out);
    case BR_LINEAR: return rule_linear(c, n, in, out);
    case BR_RESHAPE: return rule_reshape(c, n, in, out);
    case BR_PERMUTE: return rule_permute(c, n, in, out);
    case BR_EXPAND: return rule_expand(c, n, in, out);
    case BR_SLICE: return rule_slice(c, n, in, out);
    case BR_SLICE_ASSIGN: return rule_slice_assign(c, n, in, out);
    case BR_GATHER: return rule_gather(c, n, in, out);
    case BR_INDEX_ADD: return rule_index_add(c, n, in, out);
    case BR_FOLD: return rule_fold(c, n, in, r.arg, out);
    case BR_CONV: return rule_conv(c, n, in, r.arg, out);
    case BR_NORM_BACKWARD: return rule_norm_backward(c, n, in, out);
    case BR_CHANNELS: return rule_channels(c, n, in, out);
    case BR_LEADING: return rule_leading(c, n, in, false, out);
    case BR_LEADING_ALL: return rule_leading(c, n, in, true, out);
    case BR_UNBATCHED: /* an op without inputs never has batched ones */
    case BR_NONE: break;
    }
    return NO_RULE;
}

/* ---- the graph --------------------------------------------------------------------------------- */

static kiln_status copy_locs(const kiln_graph *g, kiln_graph *ng) {
    for (int32_t k = 0; k < g->nlocs; k++) {
        int32_t id;
        KILN_TRY(kiln_graph_add_loc(ng, g->locs[k], &id));
        if (id != k) return kiln_error(KILN_ERR_RUNTIME, "vmap: source locations out of order");
    }
    return KILN_OK;
}

static kiln_status batch_graph(vm *c, const int32_t *in_axes, const int32_t *out_axes) {
    const kiln_graph *g = c->g;
    kiln_graph *ng = c->ng;
    KILN_TRY(copy_locs(g, ng));
    for (int32_t k = 0; k < g->ninputs; k++) {
        int32_t v = g->inputs[k];
        kiln_meta m = g->values[v].meta;
        int ax = in_axes[k];
        if (ax >= 0) {
            if (ax > m.ndim || m.ndim + 1 > KILN_MAX_DIMS)
                return kiln_error(KILN_ERR_VALUE, "vmap: in_axes %d is out of range for input %d of rank %d", ax, k,
                                  m.ndim + 1);
            for (int d = m.ndim; d > ax; d--) m.shape[d] = m.shape[d - 1];
            m.shape[ax] = c->B;
            m.ndim++;
        }
        int32_t nv;
        KILN_TRY(kiln_graph_add_input(ng, &m, &nv));
        c->map[v] = nv;
        c->bat[v] = ax >= 0;
    }
    for (int32_t k = 0; k < g->ninputs; k++) {
        int32_t v = g->inputs[k];
        c->op = "an input";
        c->loc = -1;
        if (in_axes[k] > 0) KILN_TRY(move_axis(c, c->map[v], in_axes[k], 0, &c->map[v]));
    }
    for (int32_t k = 0; k < g->ncaptures; k++) {
        int32_t v = g->captures[k], nv;
        KILN_TRY(kiln_graph_add_capture(ng, g->values[v].bound, false, &nv));
        ng->values[nv].constant = g->values[v].constant;
        ng->values[nv].fresh = g->values[v].fresh;
        c->map[v] = nv;
        c->bat[v] = false;
    }
    bv *in = NULL;
    int cap = 0;
    kiln_status s = KILN_OK;
    for (int32_t i = 0; i < g->nnodes && s == KILN_OK; i++) {
        const kiln_node *n = &g->nodes[i];
        c->op = kiln_op_table[n->op].name;
        c->loc = n->loc;
        if ((kiln_op_table[n->op].flags & KILN_OPF_CONTROL)) {
            s = kiln_error(KILN_ERR_NOT_IMPLEMENTED, "vmap: %s (control flow: cond, while_loop) inside a vmapped "
                           "function is not supported", c->op);
            break;
        }
        if (n->nin > cap) {
            bv *grown = kiln_realloc(in, sizeof *grown * (size_t)n->nin);
            if (!grown) {
                s = kiln_error(KILN_ERR_MEMORY, "out of memory");
                break;
            }
            in = grown, cap = n->nin;
        }
        bool any = false;
        for (int k = 0; k < n->nin; k++) {
            in[k].v = c->map[n->in[k]];
            in[k].b = c->bat[n->in[k]];
            any |= in[k].b;
        }
        int32_t outs[KILN_MAX_OUTPUTS];
        if (!any) {
            int32_t *ins = kiln_malloc(sizeof *ins * (size_t)(n->nin ? n->nin : 1));
            if (!ins) {
                s = kiln_error(KILN_ERR_MEMORY, "out of memory");
                break;
            }
            for (int k = 0; k < n->nin; k++) ins[k] = in[k].v;
            s = add(c, n->op, n->nin, ins, &n->attrs, outs);
            free(ins);
        } else {
            s = batch_node(c, n, in, outs);
            if (s == NO_RULE) s = per_example(c, n, in, outs);
            if (s == KILN_OK) s = check_outputs(c, n, outs);
        }
        for (int k = 0; k < n->nout && s == KILN_OK; k++) {
            c->map[n->out[k]] = outs[k];
            c->bat[n->out[k]] = any;
        }
    }
    free(in);
    if (s != KILN_OK) return s;
    int32_t *outs = kiln_malloc(sizeof *outs * (size_t)(g->noutputs ? g->noutputs : 1));
    if (!outs) return kiln_error(KILN_ERR_MEMORY, "out of memory");
    c->op = "an output";
    c->loc = -1;
    for (int32_t k = 0; k < g->noutputs && s == KILN_OK; k++) {
        int32_t v = g->outputs[k];
        bv o = {c->map[v], c->bat[v]};
        int ax = out_axes[k];
        if (ax < 0) {
            if (o.b)
                s = kiln_error(KILN_ERR_VALUE, "vmap: out_axes is None for output %d, but it varies over the batch", k);
            outs[k] = o.v;
            continue;
        }
        int r = rank1(c, o);
        if (ax > r) {
            s = kiln_error(KILN_ERR_VALUE, "vmap: out_axes %d is out of range for output %d of rank %d", ax, k, r + 1);
            break;
        }
        s = materialize(c, o, &outs[k]);
        if (s == KILN_OK && ax > 0) s = move_axis(c, outs[k], 0, ax, &outs[k]);
    }
    if (s == KILN_OK) s = kiln_graph_set_outputs(ng, g->noutputs, outs);
    free(outs);
    return s;
}

kiln_status kiln_graph_batch(const kiln_graph *g, int64_t batch, const int32_t *in_axes, const int32_t *out_axes,
                             bool *fallback, kiln_graph **out) {
    *out = NULL;
    if (g->syms) return kiln_error(KILN_ERR_VALUE, "vmap: a graph with symbolic sizes cannot be batched");
    if (batch < 1) return kiln_error(KILN_ERR_VALUE, "vmap: the batch size must be at least 1, got %lld", (long long)batch);
    vm c = {.g = g, .B = batch, .fallback = fallback};
    c.map = kiln_malloc(sizeof *c.map * (size_t)(g->nvalues ? g->nvalues : 1));
    c.bat = kiln_calloc((size_t)(g->nvalues ? g->nvalues : 1), sizeof *c.bat);
    kiln_status s = c.map && c.bat ? kiln_graph_new(&c.ng) : kiln_error(KILN_ERR_MEMORY, "out of memory");
    if (s == KILN_OK) s = batch_graph(&c, in_axes, out_axes);
    free(c.map), free(c.bat);
    if (s != KILN_OK) {
        kiln_graph_free(c.ng);
        return s;
    }
    *out = c.ng;
    return KILN_OK;
}
