/* Epilogue fusion into matmul and linear: a chain of elementwise ops that follows a product —
 * bias or residual adds, scaling, activations — becomes one matmul_epilogue node, which applies
 * the chain to each block of the product as soon as the GEMM has computed it (src/ops/
 * matmul_epilogue.c). A chain grows while the running value has exactly one use (so no other
 * consumer, gradient rules included, ever needed the intermediate), is no graph output, and the
 * next op is one an epilogue can apply, has no attributes, and keeps the product's shape and
 * float dtype. The fused node takes the chain's last position; chains stop before any in-place
 * op, which could change an operand between the product and that position. */
#include "../ops/matmul_epilogue.h"
#include "passes_internal.h"

typedef struct {
    int32_t last;  /* the chain's last node (-1: no chain) */
    int nsteps;
    int32_t operand[KILN_MATMUL_EPILOGUE_MAX_STEPS]; /* value of each step's other operand, or -1 */
    int code[KILN_MATMUL_EPILOGUE_MAX_STEPS], product[KILN_MATMUL_EPILOGUE_MAX_STEPS];
} chain;

/* Grows the chain of base node i; claimed[] marks nodes already in a chain. */
static void grow(const kiln_graph *g, int32_t i, const int32_t *uses, const int32_t *consumer,
                 const int32_t *effects_before, const bool *claimed, chain *c) {
    const kiln_meta *pm = &g->values[g->nodes[i].out[0]].meta;
    c->last = -1, c->nsteps = 0;
    if (pm->dtype != KILN_DTYPE_FLOAT32 && pm->dtype != KILN_DTYPE_FLOAT64) return;
    int32_t v = g->nodes[i].out[0], at = i;
    while (c->nsteps < KILN_MATMUL_EPILOGUE_MAX_STEPS && uses[v] == 1 && consumer[v] >= 0) {
        int32_t j = consumer[v];
        const kiln_node *nd = &g->nodes[j];
        int code = kiln_matmul_epilogue_code(nd->op);
        if (code < 0 || claimed[j] || nd->attrs.ni || nd->attrs.nf || nd->nin != kiln_op_table[nd->op].nin) break;
        if (!kiln_meta_equal(&g->values[nd->out[0]].meta, pm) || !kiln_graph_same_shape(g, nd->out[0], g->nodes[i].out[0]))
            break;
        if (effects_before[j] != effects_before[at + 1]) break; /* an in-place op in between */
        int p = nd->in[0] == v ? 0 : 1;
        c->code[c->nsteps] = code;
        c->product[c->nsteps] = p;
        c->operand[c->nsteps] = nd->nin == 2 ? nd->in[1 - p] : -1;
        c->nsteps++;
        c->last = at = j;
        v = nd->out[0];
    }
}

/* Adds the fused node for chain c of base node i at the current position of rw. */
static kiln_status emit(kiln_rewriter *rw, int32_t i, const chain *c) {
    const kiln_graph *g = rw->src;
    const kiln_node *base = &g->nodes[i];
    int32_t in[3 + KILN_MATMUL_EPILOGUE_MAX_STEPS];
    int nin = 0;
    for (int k = 0; k < base->nin; k++) in[nin++] = rw->map[base->in[k]];
    kiln_attrs a = {0};
    kiln_attrs_push_int(&a, base->op == KILN_OP_LINEAR);
    kiln_attrs_push_int(&a, base->nin);
    kiln_attrs_push_int(&a, c->nsteps);
    for (int s = 0; s < c->nsteps; s++) {
        int operand = -1;
        if (c->operand[s] >= 0) {
            for (int k = base->nin; k < nin && operand < 0; k++)
                if (in[k] == rw->map[c->operand[s]]) operand = k;
            if (operand < 0) {
                operand = nin;
                in[nin++] = rw->map[c->operand[s]];
            }
        }
        kiln_attrs_push_int(&a, c->code[s]);
        kiln_attrs_push_int(&a, operand);
        kiln_attrs_push_int(&a, c->product[s]);
    }
    for (int k = 0; k < nin; k++)
        if (in[k] < 0) return kiln_error(KILN_ERR_VALUE, "fuse_matmul_epilogue: an operand is not defined before its node");
    int32_t last_out = g->nodes[c->last].out[0];
    KILN_TRY(kiln_keep_recompute_mark(
        kiln_graph_add_node(rw->dst, KILN_OP_MATMUL_EPILOGUE, nin, in, &a, g->nodes[c->last].loc, &rw->map[last_out]),
        rw->dst, g->nodes[c->last].recompute));
    return kiln_rewriter_stands_for(rw, i); /* keeps the product's name */
}

KILN_PASS(fuse_matmul_epilogue) {
    (void)opt;
    const kiln_graph *g = in;
    int32_t nn = g->nnodes, nv = g->nvalues;
    int32_t *uses = kiln_graph_use_counts(g);
    int32_t *consumer = kiln_malloc(sizeof(int32_t) * (size_t)(nv ? nv : 1));
    int32_t *effects_before = kiln_calloc((size_t)nn + 1, sizeof(int32_t));
    int32_t *base_of = kiln_malloc(sizeof(int32_t) * (size_t)(nn ? nn : 1)); /* per chain's last node: its base */
    bool *claimed = kiln_calloc((size_t)(nn ? nn : 1), sizeof(bool));
    chain *chains = kiln_calloc((size_t)(nn ? nn : 1), sizeof(chain));
    kiln_status s = KILN_OK;
    *out = NULL;
    if (!uses || !consumer || !effects_before || !base_of || !claimed || !chains) {
        s = kiln_error(KILN_ERR_MEMORY, "out of memory in fuse_matmul_epilogue");
        goto done;
    }
    for (int32_t v = 0; v < nv; v++) consumer[v] = -1;
    for (int32_t i = 0; i < nn; i++) {
        for (int k = 0; k < g->nodes[i].nin; k++) consumer[g->nodes[i].in[k]] = i;
        effects_before[i + 1] = effects_before[i] + kiln_node_has_effects(&g->nodes[i]);
        base_of[i] = -1;
    }
    int nchains = 0;
    for (int32_t i = 0; i < nn; i++) {
        if (g->nodes[i].op != KILN_OP_MATMUL && g->nodes[i].op != KILN_OP_LINEAR) continue;
        grow(g, i, uses, consumer, effects_before, claimed, &chains[i]);
        if (chains[i].last < 0) continue;
        claimed[i] = true;
        for (int32_t v = g->nodes[i].out[0], k = 0; k < chains[i].nsteps; k++) {
            int32_t j = consumer[v];
            claimed[j] = true;
            v = g->nodes[j].out[0];
        }
        base_of[chains[i].last] = i;
        nchains++;
    }
    if (!nchains) goto done;
    kiln_rewriter rw;
    if ((s = kiln_rewriter_begin(&rw, g)) != KILN_OK) goto done;
    for (int32_t i = 0; i < nn && s == KILN_OK; i++) {
        if (base_of[i] >= 0) s = emit(&rw, base_of[i], &chains[base_of[i]]);
        else if (!claimed[i]) s = kiln_rewriter_copy_node(&rw, i);
    }
    if (s == KILN_OK) s = kiln_rewriter_finish(&rw, out);
    else kiln_rewriter_abort(&rw);
done:
    free(uses), free(consumer), free(effects_before), free(base_of), free(claimed), free(chains);
    return s;
}
