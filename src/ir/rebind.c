/* Rebinding a recorded graph to other input shapes: the sizes each node's attributes hold are
 * given anew by the caller (kiln.jit's dynamic shapes evaluate them from the bound symbols), every
 * other attribute is kept (or, for a gradient rule's nodes, follows the values whose sizes it held:
 * KILN_ATTR_SET_FOLLOW), the subgraphs of if and while nodes are rebound to what their node now
 * gives them, and the values' metas are inferred again node by node. */
#include "../core/internal.h"
#include "control.h"
#include "kiln/graph.h"
#include "follow.h"
#include "symbolic.h"

/* KILN_ATTR_SET_FOLLOW for a slice or slice_assign: the attrs of the earlier slice node recorded
 * with the same ones, as rebound (every such node agreeing). */
static kiln_status follow_slice(const kiln_graph *orig, kiln_graph *c, kiln_node *n, int32_t node) {
    const kiln_node *was = &orig->nodes[node];
    const kiln_attrs *found = NULL;
    for (int32_t j = 0; j < node; j++) {
        const kiln_node *o = &orig->nodes[j];
        if ((o->op != KILN_OP_SLICE && o->op != KILN_OP_SLICE_ASSIGN) || o->attrs.ni != was->attrs.ni ||
            memcmp(o->attrs.i, was->attrs.i, sizeof(int64_t) * (size_t)was->attrs.ni) != 0)
            continue;
        const kiln_attrs *now = &c->nodes[j].attrs;
        if (found && memcmp(found->i, now->i, sizeof(int64_t) * (size_t)now->ni) != 0)
            return kiln_error(KILN_ERR_VALUE, "rebind: node %d (%s) follows slices that now differ", node,
                              kiln_op_table[n->op].name);
        found = now;
    }
    if (!found)
        return kiln_error(KILN_ERR_VALUE, "rebind: node %d (%s) has no slice to follow", node,
                          kiln_op_table[n->op].name);
    memcpy(n->attrs.i, found->i, sizeof(int64_t) * (size_t)found->ni);
    return KILN_OK;
}

/* follow.c's check of a vote: node n of c infers with the sizes at its span. */
typedef struct follow_check {
    kiln_graph *c;
    kiln_node *n;
    int first, count;
} follow_check;

static bool follow_fits(void *ctx, const kiln_sdim *sizes) {
    follow_check *f = ctx;
    int64_t keep[KILN_MAX_DIMS];
    memcpy(keep, &f->n->attrs.i[f->first], sizeof(int64_t) * (size_t)f->count);
    for (int k = 0; k < f->count; k++) f->n->attrs.i[f->first + k] = sizes[k].v;
    kiln_meta metas[KILN_MAX_OUTPUTS];
    bool ok = kiln_graph_infer_node(f->c, f->n, metas) == KILN_OK;
    memcpy(&f->n->attrs.i[f->first], keep, sizeof(int64_t) * (size_t)f->count);
    return ok;
}

/* KILN_ATTR_SET_FOLLOW for a reshape, expand, full or a convolution's or pooling's backward: the
 * sizes of the values the node was recorded from (kiln_follow_sizes). */
static kiln_status follow_sizes(const kiln_graph *orig, kiln_graph *c, kiln_node *n, int32_t node, int first,
                                int count) {
    follow_check f = {c, n, first, count};
    kiln_sdim got[KILN_MAX_DIMS];
    int options;
    KILN_TRY(kiln_follow_sizes(orig, c, node, follow_fits, &f, "rebind", 0, &options, got));
    if (options > 1)
        return kiln_error(KILN_ERR_VALUE, "rebind: node %d (%s) follows values whose sizes now differ", node,
                          kiln_op_table[n->op].name);
    for (int k = 0; k < count; k++) n->attrs.i[first + k] = got[k].v;
    return KILN_OK;
}

static kiln_status apply_set(const kiln_graph *g, kiln_node *n, int32_t node, const kiln_attr_set *set) {
    const char *name = kiln_op_table[n->op].name;
    if (set->index < 0 || set->index >= n->attrs.ni)
        return kiln_error(KILN_ERR_VALUE, "rebind: node %d (%s) has no int attribute %d", node, name, set->index);
    const kiln_meta *in = n->nin > 0 ? &g->values[n->in[0]].meta : NULL;
    switch (set->kind) {
    case KILN_ATTR_SET_VALUE: n->attrs.i[set->index] = set->value; return KILN_OK;
    case KILN_ATTR_SET_DIM:
        if (!in || set->value < 0 || set->value >= in->ndim)
            return kiln_error(KILN_ERR_VALUE, "rebind: node %d (%s) has no input dimension %lld", node, name,
                              (long long)set->value);
        n->attrs.i[set->index] = in->shape[set->value];
        return KILN_OK;
    case KILN_ATTR_SET_REST: {
        if (!in) return kiln_error(KILN_ERR_VALUE, "rebind: node %d (%s) has no input", node, name);
        int64_t known = 1;
        for (int k = 0; k < n->attrs.ni; k++)
            if (k != set->index) known *= n->attrs.i[k];
        int64_t numel = kiln_meta_numel(in);
        if (known <= 0 || numel % known)
            return kiln_error(KILN_ERR_VALUE, "rebind: node %d (%s): %lld elements do not divide by %lld", node,
                              name, (long long)numel, (long long)known);
        n->attrs.i[set->index] = numel / known;
        return KILN_OK;
    }
    case KILN_ATTR_SET_FOLLOW: break; /* applied by apply_sets */
    }
    return kiln_error(KILN_ERR_VALUE, "rebind: unknown attribute set kind %d", (int)set->kind);
}

/* Applies the sets naming node i (REST last: it divides by the others); *named: whether any did
 * (a FOLLOW set names only the nodes it applies to). */
static kiln_status apply_sets(const kiln_graph *orig, kiln_graph *g, kiln_node *n, int32_t i, int nset,
                              const kiln_attr_set *sets, bool *named) {
    *named = false;
    for (int pass = 0; pass < 2; pass++)
        for (int k = 0; k < nset; k++) {
            if (sets[k].node != i || (sets[k].kind == KILN_ATTR_SET_REST) != (pass == 1)) continue;
            if (sets[k].kind == KILN_ATTR_SET_FOLLOW) {
                int first, count;
                if (n->op == KILN_OP_SLICE || n->op == KILN_OP_SLICE_ASSIGN) KILN_TRY(follow_slice(orig, g, n, i));
                else if (kiln_follow_span(n, &first, &count)) KILN_TRY(follow_sizes(orig, g, n, i, first, count));
                else continue;
            } else {
                KILN_TRY(apply_set(g, n, i, &sets[k]));
            }
            *named = true;
        }
    return KILN_OK;
}

/* An if or while node whose inputs changed shape: its subgraphs rebound to the metas the node gives
 * them (if: all inputs but the predicate; while: all), added to c and named by the node instead. A
 * loop body must still return its loop values' metas (kiln_control_infer checks). */
static kiln_status rebind_bodies(kiln_graph *c, kiln_node *n, int32_t i) {
    int first = n->op == KILN_OP_IF ? 1 : 0, nin = n->nin - first;
    int slots[4], ns = kiln_control_slots(n->op, slots);
    kiln_meta *metas = kiln_malloc(sizeof *metas * (size_t)(nin > 0 ? nin : 1));
    if (!metas) return kiln_error(KILN_ERR_MEMORY, "out of memory rebinding a graph");
    for (int k = 0; k < nin; k++) metas[k] = c->values[n->in[first + k]].meta;
    kiln_status s = KILN_OK;
    for (int k = 0; k < ns && s == KILN_OK; k++) {
        int32_t idx;
        if ((s = kiln_graph_body_index(c, n->op, &n->attrs, k, &idx)) != KILN_OK) break;
        if (c->subgraphs[idx]->ninputs != nin) {
            s = kiln_error(KILN_ERR_VALUE, "rebind: node %d (%s) names a subgraph that does not fit it", i,
                           kiln_op_table[n->op].name);
            break;
        }
        kiln_graph *sub = NULL;
        int32_t added;
        s = kiln_graph_rebind(c->subgraphs[idx], metas, 0, NULL, &sub);
        if (s == KILN_OK) s = kiln_graph_add_subgraph(c, sub, &added);
        if (s != KILN_OK) {
            kiln_graph_free(sub);
            s = kiln_error_context(s, "rebind: node %d (%s)", i, kiln_op_table[n->op].name);
        } else {
            n->attrs.i[slots[k]] = added;
        }
    }
    free(metas);
    return s;
}

static kiln_status rebind_nodes(const kiln_graph *orig, kiln_graph *c, bool *changed, int nset,
                                const kiln_attr_set *sets) {
    for (int32_t i = 0; i < c->nnodes; i++) {
        kiln_node *n = &c->nodes[i];
        bool named, moved = false;
        KILN_TRY(apply_sets(orig, c, n, i, nset, sets, &named));
        for (int k = 0; k < n->nin; k++) moved |= changed[n->in[k]];
        if (moved && (n->op == KILN_OP_IF || n->op == KILN_OP_WHILE)) KILN_TRY(rebind_bodies(c, n, i));
        if (moved && !named && (kiln_op_table[n->op].flags & KILN_OPF_SIZED))
            return kiln_error(KILN_ERR_VALUE,
                              "rebind: node %d (%s) holds sizes of the shapes it was recorded with, and its "
                              "inputs changed shape",
                              i, kiln_op_table[n->op].name);
        kiln_meta metas[KILN_MAX_OUTPUTS];
        kiln_status s = kiln_graph_infer_node(c, n, metas);
        if (s != KILN_OK) return kiln_error_context(s, "rebind: node %d", i);
        for (int k = 0; k < n->nout; k++) {
            kiln_meta *m = &c->values[n->out[k]].meta;
            changed[n->out[k]] = !kiln_meta_equal(m, &metas[k]);
            *m = metas[k];
        }
    }
    return KILN_OK;
}

kiln_status kiln_graph_rebind(const kiln_graph *g, const kiln_meta *inputs, int nset, const kiln_attr_set *sets,
                              kiln_graph **out) {
    *out = NULL;
    KILN_TRY(kiln_graph_require_concrete(g, "rebind"));
    for (int32_t k = 0; k < g->ninputs; k++) {
        const kiln_meta *old = &g->values[g->inputs[k]].meta;
        if (inputs[k].dtype != old->dtype || inputs[k].ndim != old->ndim)
            return kiln_error(KILN_ERR_VALUE, "rebind: input %d must keep its dtype and %d dimensions", k,
                              old->ndim);
        int64_t numel;
        KILN_TRY(kiln_shape_numel_checked(inputs[k].ndim, inputs[k].shape, &numel));
    }
    kiln_graph *c;
    KILN_TRY(kiln_graph_clone(g, &c));
    bool *changed = kiln_calloc((size_t)(c->nvalues ? c->nvalues : 1), sizeof *changed);
    if (!changed) {
        kiln_graph_free(c);
        return kiln_error(KILN_ERR_MEMORY, "out of memory rebinding a graph");
    }
    for (int32_t k = 0; k < c->ninputs; k++) {
        kiln_meta *m = &c->values[c->inputs[k]].meta;
        changed[c->inputs[k]] = !kiln_meta_equal(m, &inputs[k]);
        *m = inputs[k];
    }
    kiln_status s = rebind_nodes(g, c, changed, nset, sets);
    free(changed);
    if (s != KILN_OK) {
        kiln_graph_free(c);
        return s;
    }
    *out = c;
    return KILN_OK;
}
