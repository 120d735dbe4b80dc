/* Mixed precision as a graph rewrite: each node's float inputs are cast to the dtype its KILN_AMP
 * class gives at the level (ops.def; the decision is kiln_amp_input_dtype, the eager dispatcher's
 * own, so the result holds the casts a recording of the same function under kiln.amp.autocast
 * holds). Graph inputs and captures count as parameters (O2 casts them at their use); values
 * derived from integers only stay as they are (kiln_amp_output_exact). One cast per value and
 * dtype. Cast pairs that cancel (bfloat16 -> float32 -> bfloat16, casts to a value's own dtype)
 * are removed by the simplify pass of O1 and later, and the elementwise fusion takes the casts
 * into the kernels around them. Control-flow bodies and fused groups are left as they are. */
#include "passes_internal.h"

typedef struct {
    kiln_rewriter rw;
    bool *exact;    /* per dst value */
    int32_t *memo;  /* per dst value, 3 slots: its cast to float32, float16, bfloat16 (-1: none) */
    int32_t cap;
} amp_state;

static int slot_of(kiln_dtype d) { return d == KILN_DTYPE_FLOAT32 ? 0 : d == KILN_DTYPE_FLOAT16 ? 1 : 2; }

static kiln_status grow(amp_state *a) {
    int32_t n = a->rw.dst->nvalues;
    if (n <= a->cap) return KILN_OK;
    int32_t ncap = a->cap ? a->cap : 64;
    while (ncap < n) ncap *= 2;
    bool *e = kiln_realloc(a->exact, (size_t)ncap);
    if (e) a->exact = e;
    int32_t *m = kiln_realloc(a->memo, sizeof(int32_t) * 3 * (size_t)ncap);
    if (m) a->memo = m;
    if (!e || !m) return kiln_error(KILN_ERR_MEMORY, "out of memory in the amp pass");
    for (int32_t k = a->cap; k < ncap; k++) a->exact[k] = false, a->memo[3 * k] = a->memo[3 * k + 1] = a->memo[3 * k + 2] = -1;
    a->cap = ncap;
    return KILN_OK;
}

static bool is_leaf(const kiln_graph *g, int32_t v) {
    const kiln_value *val = &g->values[v];
    return val->kind == KILN_VALUE_INPUT || (val->kind == KILN_VALUE_CAPTURED && !val->constant);
}

static bool is_literal(const kiln_graph *g, int32_t v) {
    const kiln_value *val = &g->values[v];
    return val->kind == KILN_VALUE_CAPTURED && val->constant && kiln_shape_numel(val->meta.ndim, val->meta.shape) == 1;
}

/* dst value v as dtype d: a (shared) cast node. */
static kiln_status cast_to(amp_state *a, int32_t v, kiln_dtype d, int32_t loc, int32_t *res) {
    int32_t *slot = &a->memo[3 * v + slot_of(d)];
    if (*slot >= 0) return *res = *slot, KILN_OK;
    kiln_attrs at = {0};
    kiln_attrs_push_int(&at, d);
    int32_t out;
    KILN_TRY(kiln_graph_add_node(a->rw.dst, KILN_OP_CAST, 1, &v, &at, loc, &out));
    KILN_TRY(grow(a));
    a->exact[out] = a->exact[v];
    *slot = *res = out;
    return KILN_OK;
}

static kiln_status rewrite_node(amp_state *a, int32_t i, kiln_amp_level level, kiln_dtype low) {
    const kiln_node *n = &a->rw.src->nodes[i];
    kiln_graph *dst = a->rw.dst;
    int32_t small[16], *ins = n->nin <= 16 ? small : kiln_malloc(sizeof(int32_t) * (size_t)n->nin);
    kiln_dtype dsmall[16], *dts = n->nin <= 16 ? dsmall : kiln_malloc(sizeof(kiln_dtype) * (size_t)n->nin);
    bool esmall[16], *exs = n->nin <= 16 ? esmall : kiln_malloc(sizeof(bool) * (size_t)n->nin);
    kiln_status s = ins && dts && exs ? KILN_OK : kiln_error(KILN_ERR_MEMORY, "out of memory in the amp pass");
    for (int k = 0; k < n->nin && s == KILN_OK; k++) {
        int32_t v = a->rw.map[n->in[k]];
        kiln_dtype d = dst->values[v].meta.dtype;
        kiln_dtype want = kiln_amp_input_dtype(n->op, k, level, low, d, is_leaf(dst, v), a->exact[v]);
        ins[k] = v;
        if (want != d) s = cast_to(a, v, want, n->loc, &ins[k]);
        if (s == KILN_OK) dts[k] = dst->values[ins[k]].meta.dtype, exs[k] = a->exact[ins[k]] || is_literal(dst, ins[k]);
    }
    /* a Python number beside a tensor takes that tensor's dtype when it is recorded (NumPy 2's weak
     * scalars): under eager amp it is made next to the cast operand, so here it follows the cast */
    kiln_amp_class cls = kiln_amp_class_of(n->op);
    if (s == KILN_OK && level != KILN_AMP_O0 && (cls == KILN_AMP_PROMOTE || cls == KILN_AMP_ACCUM) &&
        !(kiln_op_table[n->op].flags & (KILN_OPF_MUTATES | KILN_OPF_EFFECT | KILN_OPF_CONTROL)) && n->op != KILN_OP_CAST) {
        kiln_dtype widest = KILN_DTYPE_COUNT;
        for (int k = 0; k < n->nin; k++)
            if (!is_literal(dst, ins[k]) && kiln_dtype_is_float(dts[k]))
                widest = widest == KILN_DTYPE_COUNT ? dts[k] : kiln_dtype_promote(widest, dts[k]);
        for (int k = 0; k < n->nin && s == KILN_OK && widest != KILN_DTYPE_COUNT; k++)
            if (is_literal(dst, ins[k]) && kiln_dtype_is_float(dts[k]) && dts[k] != widest &&
                dst->values[a->rw.map[n->in[k]]].meta.dtype != widest) {
                s = cast_to(a, ins[k], widest, n->loc, &ins[k]);
                if (s == KILN_OK) dts[k] = widest;
            }
    }
    int32_t outs[KILN_MAX_OUTPUTS];
    if (s == KILN_OK) s = kiln_graph_add_node(dst, n->op, n->nin, ins, &n->attrs, n->loc, outs);
    if (s == KILN_OK) {
        dst->nodes[dst->nnodes - 1].recompute = n->recompute;
        s = kiln_rewriter_stands_for(&a->rw, i);
    }
    if (s == KILN_OK) s = grow(a);
    if (s == KILN_OK) {
        bool exact = !(kiln_op_table[n->op].flags & KILN_OPF_MUTATES) &&
                     kiln_amp_output_exact(n->op, &n->attrs, n->nin, dts, exs);
        for (int k = 0; k < n->nout; k++) {
            a->rw.map[n->out[k]] = outs[k];
            a->exact[outs[k]] = exact && kiln_dtype_is_float(dst->values[outs[k]].meta.dtype);
        }
    }
    if (s != KILN_OK) kiln_error_context(s, "amp: %s", kiln_op_table[n->op].name);
    if (ins != small) free(ins);
    if (dts != dsmall) free(dts);
    if (exs != esmall) free(exs);
    return s;
}

kiln_status kiln_graph_amp(const kiln_graph *in, kiln_amp_level level, kiln_dtype low, kiln_graph **out) {
    *out = NULL;
    KILN_TRY(kiln_graph_require_concrete(in, "amp"));
    if (level < KILN_AMP_O0 || level > KILN_AMP_O3)
        return kiln_error(KILN_ERR_VALUE, "amp level must be O0, O1, O2 or O3, got %d", (int)level);
    if (low != KILN_DTYPE_BFLOAT16 && low != KILN_DTYPE_FLOAT16 && low != KILN_DTYPE_FLOAT32)
        return kiln_error(KILN_ERR_TYPE, "amp: the low-precision dtype must be bfloat16 or float16, got %s",
                          kiln_dtype_name(low));
    amp_state a = {0};
    KILN_TRY(kiln_rewriter_begin(&a.rw, in));
    kiln_status s = grow(&a);
    for (int32_t i = 0; i < in->nnodes && s == KILN_OK; i++) s = rewrite_node(&a, i, level, low);
    if (s == KILN_OK) s = kiln_rewriter_finish(&a.rw, out);
    else kiln_rewriter_abort(&a.rw);
    free(a.exact);
    free(a.memo);
    if (s == KILN_OK) {
        s = kiln_graph_verify(*out);
        if (s != KILN_OK) kiln_graph_free(*out), *out = NULL;
    }
    return s;
}
