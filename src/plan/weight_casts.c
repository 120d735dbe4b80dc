/* Which casts of captured tensors (parameters, under amp: the float32 master weights cast to
 * bfloat16 or float16) a compiled graph may keep from one call to the next (plan.h: weight_cast).
 * Such a cast depends only on its capture, so while the capture's storage version is unchanged the
 * last call's result is this call's, bit for bit; the runtime keeps it (src/runtime/weight_cache.c).
 *
 * A cast qualifies when its result can be computed at the start of a call and kept between calls:
 *   - it reads a captured tensor (bound by reference, or a constant);
 *   - nothing ordered before it writes that capture (the call's first read is the cast's);
 *   - nothing writes its result (or a view of it), no control-flow node or gradient bucket reads it,
 *     and it is not (a view of) a graph output (a caller's result is never the graph's memory).
 * Its result then lives outside the arena (offset -1), in a buffer of its own. */
#include "plan.h"

#include "../ir/control.h"

/* Whether node nd may write its input k (or keep it beyond its step: control flow, buckets). */
static bool may_write(const kiln_node *nd, int k) {
    uint64_t f = kiln_op_table[nd->op].flags;
    if (k < 16 && (f & KILN_OPF_WRITES_INPUT(k))) return true;
    if (k == 0 && (f & KILN_OPF_MUTATES)) return true;
    return kiln_op_is_control(nd->op) || (f & KILN_OPF_JOINS_INPUTS) || kiln_op_has_side_effects(nd->op);
}

kiln_status kiln_plan_weight_casts(kiln_plan *e, const bool *output_root) {
    const kiln_graph *g = e->g;
    int32_t nn = g->nnodes;
    free(e->weight_cast);
    e->weight_cast = NULL;
    int32_t *step_of = NULL;
    for (int32_t i = 0; i < e->norder; i++) {
        int32_t n = e->order[i];
        const kiln_node *nd = &g->nodes[n];
        if (nd->op != KILN_OP_CAST || nd->nin != 1 || nd->nout != 1) continue;
        const kiln_value *src = &g->values[nd->in[0]];
        int32_t out = nd->out[0];
        if (src->kind != KILN_VALUE_CAPTURED || output_root[e->root[out]]) continue;
        if (!step_of) {
            step_of = kiln_malloc(sizeof(int32_t) * (size_t)(nn ? nn : 1));
            e->weight_cast = kiln_calloc((size_t)(nn ? nn : 1), sizeof(bool));
            if (!step_of || !e->weight_cast) {
                free(step_of);
                return kiln_error(KILN_ERR_MEMORY, "out of memory planning a graph");
            }
            for (int32_t j = 0; j < e->norder; j++) step_of[e->order[j]] = j;
        }
        bool ok = true;
        for (int32_t j = 0; j < e->norder && ok; j++) {
            const kiln_node *other = &g->nodes[e->order[j]];
            for (int k = 0; k < other->nin && ok; k++) {
                if (!may_write(other, k)) continue;
                int32_t r = e->root[other->in[k]];
                if (r == out) ok = false;                                  /* its result is written or kept */
                if (r == e->root[nd->in[0]] && step_of[e->order[j]] < i) ok = false; /* the capture changes first */
            }
        }
        e->weight_cast[n] = ok;
    }
    free(step_of);
    return KILN_OK;
}
