/* Algebraic simplification, node by node on the graph being rebuilt (so chains collapse):
 *   x*1, 1*x, x+0, 0+x, x-0, x/1 -> x   (the constant uniform, the result of x's dtype and shape;
 *                                         on floats the zero added must be -0.0 and the zero
 *                                         subtracted +0.0: -0.0 + 0.0 is +0.0, so x+0.0 is not x)
 *   neg(neg(x)) -> x            cast(x) to x's dtype -> x     cast(cast(x, wider), back) -> x
 *   reshape(reshape(x)) -> reshape(x)      reshape/expand to x's own shape -> x
 *   permute(permute(x)) -> permute(x) (identity -> x)       expand(expand(x)) -> expand(x)
 *   contiguous(y) -> y when y's op writes a fresh contiguous buffer
 * A value is never replaced when a buffer involved is written in place by some node (the copy
 * the rewrite drops may be what kept the old value), nor when that would hand out one tensor
 * as two graph outputs, nor when a graph output that eager code makes fresh (or a value a view
 * output reads) would become an existing value: the caller's memory, or a buffer another output
 * shares. Dropped nodes are left for dce. */
#include <math.h>

#include "passes_internal.h"

bool kiln_pass_has_effects(const kiln_node *n); /* cse.c */
bool *kiln_pass_written_buffers(const kiln_graph *g);

#define MAX_CHECKED_CONSTANT 65536

typedef struct {
    const kiln_graph *src;
    kiln_rewriter rw;
    bool *written, *is_output; /* per src value */
    bool *reaches_output;      /* per src value: a graph output is it or a view of it */
    bool *safe, *dst_out;      /* per dst value: buffer never written; a graph output maps to it */
    int32_t cap;               /* of safe and dst_out */
    int32_t changed;
} simp;

static kiln_status grow(simp *s) {
    int32_t n = s->rw.dst->nvalues;
    if (n <= s->cap) return KILN_OK;
    int32_t ncap = s->cap ? s->cap : 64;
    while (ncap < n) ncap *= 2;
    bool *safe = kiln_realloc(s->safe, (size_t)ncap), *out = kiln_realloc(s->dst_out, (size_t)ncap);
    if (safe) s->safe = safe;
    if (out) s->dst_out = out;
    if (!safe || !out) return kiln_error(KILN_ERR_MEMORY, "out of memory in simplify");
    memset(s->safe + s->cap, 0, (size_t)(ncap - s->cap));
    memset(s->dst_out + s->cap, 0, (size_t)(ncap - s->cap));
    s->cap = ncap;
    return KILN_OK;
}

/* Records what src value v, now mapped, tells about its dst value (fresh: v made it). */
static void note(simp *s, int32_t v, bool fresh) {
    int32_t d = s->rw.map[v];
    s->safe[d] = (fresh || s->safe[d]) && !s->written[v];
    if (s->is_output[v]) s->dst_out[d] = true;
}

static const kiln_value *dval(const simp *s, int32_t d) { return &s->rw.dst->values[d]; }

/* The dst node producing d with op `op`, or NULL. */
static const kiln_node *producer(const simp *s, int32_t d, kiln_op op) {
    const kiln_value *v = dval(s, d);
    if (v->kind != KILN_VALUE_NODE) return NULL;
    const kiln_node *n = &s->rw.dst->nodes[v->node];
    return n->op == op ? n : NULL;
}

/* Whether a equals want, zeros' signs compared too (+0.0 and -0.0 are different identities). */
static bool same_number(double a, double want) { return a == want && signbit(a) == signbit(want); }

/* Whether dst value d is a constant whose every element equals `want` (a zero's sign too): a
 * constant capture nobody writes, a full node, or a reshape/expand of one. */
static bool uniform(const simp *s, int32_t d, double want) {
    for (int depth = 0; depth < 8; depth++) {
        const kiln_value *v = dval(s, d);
        if (!s->safe[d]) return false;
        if (v->kind == KILN_VALUE_CAPTURED) {
            if (!v->constant || v->bound->numel > MAX_CHECKED_CONSTANT) return false;
            for (int64_t k = 0; k < v->bound->numel; k++)
                if (!same_number(kiln_tensor_get_double(v->bound, k), want)) return false;
            return true;
        }
        if (v->kind != KILN_VALUE_NODE) return false;
        const kiln_node *n = &s->rw.dst->nodes[v->node];
        if (n->op == KILN_OP_FULL) return n->attrs.nf > KILN_A_FULL_VALUE && same_number(n->attrs.f[KILN_A_FULL_VALUE], want);
        if (n->op != KILN_OP_RESHAPE && n->op != KILN_OP_EXPAND) return false;
        d = n->in[0];
    }
    return false;
}

/* Whether every value of `from` is exactly representable in `mid` (so a round trip is exact). */
static bool exact_widening(kiln_dtype from, kiln_dtype mid) {
    switch (from) {
    case KILN_DTYPE_BOOL: return true;
    case KILN_DTYPE_INT8: return mid != KILN_DTYPE_BOOL;
    case KILN_DTYPE_INT32: return mid == KILN_DTYPE_INT64 || mid == KILN_DTYPE_FLOAT64;
    case KILN_DTYPE_FLOAT16:
    case KILN_DTYPE_BFLOAT16: return mid == KILN_DTYPE_FLOAT32 || mid == KILN_DTYPE_FLOAT64;
    case KILN_DTYPE_FLOAT32: return mid == KILN_DTYPE_FLOAT64;
    default: return false;
    }
}

/* Whether op writes its output into a fresh contiguous buffer. */
static bool fresh_contiguous(kiln_op op) { return !(kiln_op_table[op].flags & (KILN_OPF_VIEW | KILN_OPF_MUTATES)); }

typedef struct {
    int32_t value;    /* replace the node's output by this dst value, or -1 */
    kiln_op op;       /* else, when op < KILN_OP_COUNT: add op(in) with attrs */
    int32_t in;
    kiln_attrs attrs;
    const kiln_node *sizes; /* the node whose size attributes (symbolic ones too) attrs are, or NULL */
} rewrite;

static void identity_of(const simp *s, const kiln_node *n, const int32_t *in, rewrite *r) {
    const kiln_attrs *a = &n->attrs;
    const kiln_node *p;
    /* the zero whose addition leaves every x as it is: -0.0 on floats (+0.0 + -0.0 is +0.0,
     * -0.0 + -0.0 is -0.0), where +0.0 would turn x = -0.0 into +0.0; integers' zero has no sign */
    double add_zero = kiln_dtype_is_float(s->src->values[n->out[0]].meta.dtype) ? -0.0 : 0.0;
    switch (n->op) {
    case KILN_OP_MUL:
        if (uniform(s, in[1], 1)) r->value = in[0];
        else if (uniform(s, in[0], 1)) r->value = in[1];
        break;
    case KILN_OP_ADD:
        if (uniform(s, in[1], add_zero)) r->value = in[0];
        else if (uniform(s, in[0], add_zero)) r->value = in[1];
        break;
    case KILN_OP_SUB: /* x - +0.0 is x + -0.0 */
        if (uniform(s, in[1], 0.0)) r->value = in[0];
        break;
    case KILN_OP_DIV:
        if (uniform(s, in[1], 1)) r->value = in[0];
        break;
    case KILN_OP_NEG:
        if ((p = producer(s, in[0], KILN_OP_NEG))) r->value = p->in[0];
        break;
    case KILN_OP_CAST:
        if (dval(s, in[0])->meta.dtype == (kiln_dtype)a->i[KILN_A_CAST_DTYPE]) r->value = in[0];
        else if ((p = producer(s, in[0], KILN_OP_CAST)) &&
                 dval(s, p->in[0])->meta.dtype == (kiln_dtype)a->i[KILN_A_CAST_DTYPE] &&
                 exact_widening((kiln_dtype)a->i[KILN_A_CAST_DTYPE], dval(s, in[0])->meta.dtype))
            r->value = p->in[0];
        break;
    case KILN_OP_RESHAPE:
    case KILN_OP_EXPAND:
        if (kiln_shape_equal(&dval(s, in[0])->meta, a->ni, a->i)) {
            r->value = in[0];
        } else if ((p = producer(s, in[0], n->op))) {
            if (kiln_shape_equal(&dval(s, p->in[0])->meta, a->ni, a->i)) r->value = p->in[0];
            else r->op = n->op, r->in = p->in[0], r->attrs = *a, r->sizes = n;
        }
        break;
    case KILN_OP_PERMUTE: {
        int64_t perm[KILN_MAX_DIMS];
        int nd = a->ni < KILN_MAX_DIMS ? a->ni : KILN_MAX_DIMS;
        int32_t x = in[0];
        for (int d = 0; d < nd; d++) perm[d] = a->i[d];
        if ((p = producer(s, in[0], KILN_OP_PERMUTE)) && p->attrs.ni == nd) {
            for (int d = 0; d < nd; d++) perm[d] = p->attrs.i[perm[d]]; /* out axis d reads inner axis perm[d] */
            x = p->in[0];
        }
        bool identity = true;
        for (int d = 0; d < nd; d++) identity &= perm[d] == d;
        if (identity) {
            r->value = x;
        } else if (x != in[0]) {
            r->op = KILN_OP_PERMUTE, r->in = x;
            kiln_attrs_clear(&r->attrs);
            for (int d = 0; d < nd; d++) kiln_attrs_push_int(&r->attrs, perm[d]);
        }
        break;
    }
    case KILN_OP_CONTIGUOUS: {
        const kiln_value *v = dval(s, in[0]);
        if (v->kind == KILN_VALUE_NODE && fresh_contiguous(s->rw.dst->nodes[v->node].op)) r->value = in[0];
        break;
    }
    default: break;
    }
}

static kiln_status visit(simp *s, int32_t i) {
    const kiln_node *n = &s->src->nodes[i];
    rewrite r = {.value = -1, .op = KILN_OP_COUNT};
    int32_t in[3];
    bool safe = n->nout == 1 && n->nin <= 3 && !kiln_pass_has_effects(n) && !s->written[n->out[0]];
    for (int k = 0; k < n->nin && safe; k++) {
        in[k] = s->rw.map[n->in[k]];
        safe = s->safe[in[k]];
    }
    if (safe) identity_of(s, n, in, &r);
    const kiln_meta *meta = &s->src->values[n->out[0]].meta;
    bool fresh = true;
    /* a graph output (or what a view output reads) that eager code makes fresh stays fresh: an
     * existing value could be the caller's memory or share a buffer with another output */
    bool hands_out_shared_memory = r.value >= 0 && s->reaches_output[n->out[0]] &&
                                   !(kiln_op_table[n->op].flags & KILN_OPF_VIEW);
    kiln_sdim ai[KILN_MAX_ATTR_INTS];
    if (r.sizes) kiln_graph_attr_dims(r.sizes, ai);
    /* the shapes compared as expressions too: equal hints may be other sizes at another binding */
    if (r.value >= 0 && s->safe[r.value] && kiln_meta_equal(&dval(s, r.value)->meta, meta) &&
        kiln_value_same_shape(dval(s, r.value), &s->src->values[n->out[0]]) &&
        !(s->is_output[n->out[0]] && s->dst_out[r.value]) && !hands_out_shared_memory) {
        s->rw.map[n->out[0]] = r.value;
        fresh = false;
        s->changed++;
    } else if (r.value < 0 && r.op < KILN_OP_COUNT && s->safe[r.in] &&
               kiln_graph_add_node_sym(s->rw.dst, r.op, 1, &r.in, &r.attrs, r.sizes ? ai : NULL, n->loc,
                                       &s->rw.map[n->out[0]]) == KILN_OK) {
        KILN_ASSERT(kiln_meta_equal(&dval(s, s->rw.map[n->out[0]])->meta, meta) &&
                    kiln_value_same_shape(dval(s, s->rw.map[n->out[0]]), &s->src->values[n->out[0]]));
        s->changed++;
    } else {
        kiln_clear_error();
        KILN_TRY(kiln_rewriter_copy_node(&s->rw, i));
    }
    KILN_TRY(grow(s));
    for (int k = 0; k < n->nout; k++) note(s, n->out[k], fresh);
    return KILN_OK;
}

kiln_status kiln_pass_simplify(const kiln_graph *in, const kiln_pass_options *opt, kiln_graph **out) {
    (void)opt;
    *out = NULL;
    simp s = {.src = in};
    s.written = kiln_pass_written_buffers(in);
    s.is_output = kiln_calloc((size_t)(in->nvalues ? in->nvalues : 1), sizeof(bool));
    kiln_status st = KILN_OK;
    if (!s.written || !s.is_output) st = kiln_error(KILN_ERR_MEMORY, "out of memory in simplify");
    for (int32_t k = 0; k < in->noutputs && st == KILN_OK; k++) s.is_output[in->outputs[k]] = true;
    s.reaches_output = kiln_calloc((size_t)(in->nvalues ? in->nvalues : 1), sizeof(bool));
    if (!s.reaches_output && st == KILN_OK) st = kiln_error(KILN_ERR_MEMORY, "out of memory in simplify");
    for (int32_t v = 0; v < in->nvalues && st == KILN_OK; v++) s.reaches_output[v] = s.is_output[v];
    for (int32_t i = in->nnodes - 1; i >= 0 && st == KILN_OK; i--) { /* back through views */
        const kiln_node *n = &in->nodes[i];
        if ((kiln_op_table[n->op].flags & (KILN_OPF_VIEW | KILN_OPF_MUTATES)) && s.reaches_output[n->out[0]])
            s.reaches_output[n->in[0]] = true;
    }
    if (st == KILN_OK) st = kiln_rewriter_begin(&s.rw, in);
    if (st == KILN_OK) {
        st = grow(&s);
        for (int32_t k = 0; k < in->ninputs && st == KILN_OK; k++) note(&s, in->inputs[k], true);
        for (int32_t k = 0; k < in->ncaptures && st == KILN_OK; k++) note(&s, in->captures[k], true);
        for (int32_t i = 0; i < in->nnodes && st == KILN_OK; i++) st = visit(&s, i);
        if (st == KILN_OK && s.changed) st = kiln_rewriter_finish(&s.rw, out);
        else kiln_rewriter_abort(&s.rw);
    }
    free(s.written), free(s.is_output), free(s.reaches_output), free(s.safe), free(s.dst_out);
    return st;
}
