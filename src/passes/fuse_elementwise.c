/* Elementwise and row fusion: trees and DAGs of elementwise ops (broadcasting included), with
 * reductions over the innermost axis and the softmax family among them, whose intermediate
 * results are used only inside the group and are not graph outputs become one `fused` node; its
 * subgraph holds the group and runs as one generated kernel (src/codegen/).
 *
 * Groups grow backwards from their last op (the root). A group has a space: the root's shape,
 * or once it holds a row op (kiln_node_row_op) the shape of the rows that op reads; every row
 * op of a group reads exactly its space (an elementwise group over per-row values grows into the
 * rows of a reduction producing them). An op joins the group of its consumers when all of them
 * are in that one group, its result is no graph output, it is cheap, as large as the space or one
 * value per row of it (a member is computed once per element of the space, per-row values once
 * per row), and no in-place op lies between it and the root (the group is computed at the root's
 * position). A reduction that drops its axis only starts a group. float() constants feeding one
 * group are inlined. Groups of one op are left alone, but for the softmax family. */
#include "../ir/fusion.h"
#include "passes_internal.h"

#define MAX_GROUP_INPUTS 32
#define MAX_GROUP_OPS 64 /* bounds the generated loop body (and its compile time) */

/* Flags of ops that write an input in place: no group computes across one. */
#define WRITES_INPUTS (KILN_OPF_MUTATES | KILN_OPF_WRITES_ANY)

typedef struct {
    const kiln_graph *g;
    int32_t *cons_start, *cons; /* consumers of each value (CSR, node ids, repeats allowed) */
    bool *is_output;
    int32_t *mut_before;        /* per node index i: in-place nodes with index < i */
    int32_t *group;             /* per node: its group (-1: none) */
    int32_t *root;              /* per group: its last node */
    int32_t *size;              /* per group: its ops */
    int32_t *space;             /* per group: the value whose shape is its iteration space */
    bool *rows;                 /* per group: holds a row op */
    int32_t ngroups;
} fusion;

static kiln_status analyse(fusion *f) {
    const kiln_graph *g = f->g;
    int32_t nv = g->nvalues, nn = g->nnodes;
    f->cons_start = kiln_calloc((size_t)nv + 1, sizeof(int32_t));
    f->is_output = kiln_calloc((size_t)(nv ? nv : 1), sizeof(bool));
    f->mut_before = kiln_calloc((size_t)nn + 1, sizeof(int32_t));
    f->group = kiln_malloc(sizeof(int32_t) * (size_t)(nn ? nn : 1));
    f->root = kiln_malloc(sizeof(int32_t) * (size_t)(nn ? nn : 1));
    f->size = kiln_malloc(sizeof(int32_t) * (size_t)(nn ? nn : 1));
    f->space = kiln_malloc(sizeof(int32_t) * (size_t)(nn ? nn : 1));
    f->rows = kiln_malloc(sizeof(bool) * (size_t)(nn ? nn : 1));
    int32_t total = 0;
    for (int32_t i = 0; i < nn; i++) total += g->nodes[i].nin;
    f->cons = kiln_malloc(sizeof(int32_t) * (size_t)(total ? total : 1));
    if (!f->cons_start || !f->is_output || !f->mut_before || !f->group || !f->root || !f->size || !f->cons ||
        !f->space || !f->rows)
        return kiln_error(KILN_ERR_MEMORY, "out of memory in fuse_elementwise");
    for (int32_t i = 0; i < nn; i++)
        for (int k = 0; k < g->nodes[i].nin; k++) f->cons_start[g->nodes[i].in[k] + 1]++;
    for (int32_t v = 0; v < nv; v++) f->cons_start[v + 1] += f->cons_start[v];
    int32_t *fill = kiln_calloc((size_t)(nv ? nv : 1), sizeof(int32_t));
    if (!fill) return kiln_error(KILN_ERR_MEMORY, "out of memory in fuse_elementwise");
    for (int32_t i = 0; i < nn; i++)
        for (int k = 0; k < g->nodes[i].nin; k++) {
            int32_t v = g->nodes[i].in[k];
            f->cons[f->cons_start[v] + fill[v]++] = i;
        }
    free(fill);
    for (int32_t k = 0; k < g->noutputs; k++) f->is_output[g->outputs[k]] = true;
    for (int32_t i = 0; i < nn; i++)
        f->mut_before[i + 1] = f->mut_before[i] + ((kiln_op_table[g->nodes[i].op].flags & WRITES_INPUTS) != 0);
    return KILN_OK;
}

/* Whether value v is one value per row of value space's shape (its last axis 1, the others
 * those of space: the same sizes, as expressions too). */
static bool per_row(const kiln_graph *g, int32_t v, int32_t space) {
    const kiln_value *m = &g->values[v], *sp = &g->values[space];
    if (m->meta.ndim != sp->meta.ndim || m->meta.ndim == 0 || m->meta.shape[m->meta.ndim - 1] != 1 ||
        m->sym[m->meta.ndim - 1])
        return false;
    for (int d = 0; d + 1 < m->meta.ndim; d++)
        if (m->meta.shape[d] != sp->meta.shape[d] || m->sym[d] != sp->sym[d]) return false;
    return true;
}

/* Whether values a and b hold as many elements for every binding. */
static bool same_numel(const kiln_graph *g, int32_t a, int32_t b) {
    if (kiln_meta_numel(&g->values[a].meta) != kiln_meta_numel(&g->values[b].meta)) return false;
    if (!g->syms) return true;
    kiln_sshape sa, sb;
    kiln_graph_value_sshape(g, a, &sa);
    kiln_graph_value_sshape(g, b, &sb);
    kiln_sdim na = kiln_sdim_const(1), nb = kiln_sdim_const(1);
    for (int d = 0; d < sa.ndim; d++)
        if (kiln_sym_mul(g->syms, na, sa.d[d], &na) != KILN_OK) return kiln_clear_error(), false;
    for (int d = 0; d < sb.ndim; d++)
        if (kiln_sym_mul(g->syms, nb, sb.d[d], &nb) != KILN_OK) return kiln_clear_error(), false;
    return kiln_sdim_same(na, nb);
}

/* The group node i can join, or -1. */
static int32_t joinable_group(const fusion *f, int32_t i) {
    const kiln_graph *g = f->g;
    int32_t v = g->nodes[i].out[0];
    int32_t b = f->cons_start[v], e = f->cons_start[v + 1];
    if (f->is_output[v] || b == e) return -1;
    int32_t grp = f->group[f->cons[b]];
    for (int32_t k = b; k < e && grp >= 0; k++)
        if (f->group[f->cons[k]] != grp) grp = -1;
    if (grp < 0 || f->size[grp] >= MAX_GROUP_OPS) return -1;
    int32_t r = f->root[grp];
    if (f->mut_before[r] - f->mut_before[i + 1] != 0) return -1;
    const kiln_node *nd = &g->nodes[i];
    int32_t space = f->space[grp];
    if (kiln_node_row_op(g, i)) {
        int32_t x = nd->in[0];
        if (kiln_node_drops_row_axis(nd)) return -1; /* its result cannot broadcast back along the rows */
        if (kiln_graph_same_shape(g, x, space)) return grp;
        return !f->rows[grp] && kiln_graph_same_shape(g, v, space) && per_row(g, v, x) ? grp : -1;
    }
    if (nd->op != KILN_OP_FULL && kiln_op_calls_math(nd->op) && !same_numel(g, v, space) && !per_row(g, v, space))
        return -1;
    return grp;
}

static void form_groups(fusion *f) {
    const kiln_graph *g = f->g;
    f->ngroups = 0;
    for (int32_t i = g->nnodes - 1; i >= 0; i--) {
        f->group[i] = -1;
        if (!kiln_node_fusable(g, i)) continue;
        bool row_op = kiln_node_row_op(g, i);
        /* a cast to a 16-bit float only ends a group (its value is the group's output) */
        int32_t grp = kiln_node_half_root(g, i) ? -1 : joinable_group(f, i);
        if (grp < 0) {
            grp = f->ngroups++;
            f->root[grp] = i;
            f->size[grp] = 0;
            f->rows[grp] = false;
            f->space[grp] = g->nodes[i].out[0];
        }
        if (row_op) { /* the group's space becomes the rows this op reads */
            f->space[grp] = g->nodes[i].in[0];
            f->rows[grp] = true;
        }
        f->group[i] = grp;
        f->size[grp]++;
    }
}

/* The group's inputs: values its members read that no member produces, in order of first use. */
static int32_t group_inputs(const fusion *f, int32_t grp, int32_t *inputs, int32_t cap) {
    const kiln_graph *g = f->g;
    int32_t n = 0;
    for (int32_t i = 0; i <= f->root[grp]; i++) {
        if (f->group[i] != grp) continue;
        const kiln_node *nd = &g->nodes[i];
        for (int k = 0; k < nd->nin; k++) {
            int32_t u = nd->in[k];
            const kiln_value *val = &g->values[u];
            if (val->kind == KILN_VALUE_NODE && f->group[val->node] == grp) continue;
            bool seen = false;
            for (int32_t j = 0; j < n && !seen; j++) seen = inputs[j] == u;
            if (seen) continue;
            if (n == cap) return -1;
            inputs[n++] = u;
        }
    }
    return n;
}

/* Whether the group is worth a kernel: two ops or more (inlined constants not counted), or one
 * row op along an axis, the softmax family (the generated row kernel keeps each row in cache). */
static bool worth_fusing(const fusion *f, int32_t grp) {
    int ops = 0;
    kiln_op last = KILN_OP_FULL;
    for (int32_t i = 0; i <= f->root[grp] && ops < 2; i++)
        if (f->group[i] == grp && f->g->nodes[i].op != KILN_OP_FULL) ops++, last = f->g->nodes[i].op;
    return ops >= 2 || (ops == 1 && kiln_op_rows[last].axis == KILN_ROWS_ALONG);
}

/* Builds the group's subgraph and adds the fused node in its root's place. */
static kiln_status emit_group(const fusion *f, kiln_rewriter *rw, int32_t grp, const int32_t *inputs, int32_t nin,
                              int32_t *sub_map) {
    const kiln_graph *g = f->g;
    kiln_graph *sub = NULL;
    KILN_TRY(kiln_graph_new(&sub));
    kiln_status s = kiln_graph_copy_symbols(g, sub); /* the group's sizes are the graph's expressions */
    for (int32_t k = 0; k < nin && s == KILN_OK; k++) {
        s = kiln_graph_add_input(sub, &g->values[inputs[k]].meta, &sub_map[inputs[k]]);
        if (s == KILN_OK) memcpy(sub->values[sub_map[inputs[k]]].sym, g->values[inputs[k]].sym, sizeof g->values[0].sym);
    }
    int32_t r = f->root[grp];
    for (int32_t i = 0; i <= r && s == KILN_OK; i++) {
        if (f->group[i] != grp) continue;
        const kiln_node *nd = &g->nodes[i];
        int32_t in[3];
        kiln_sdim ai[KILN_MAX_ATTR_INTS];
        for (int k = 0; k < nd->nin; k++) in[k] = sub_map[nd->in[k]];
        kiln_graph_attr_dims(nd, ai);
        s = kiln_graph_add_node_sym(sub, nd->op, nd->nin, in, &nd->attrs, ai, -1, &sub_map[nd->out[0]]);
    }
    int32_t rv = g->nodes[r].out[0];
    if (s == KILN_OK) s = kiln_graph_set_outputs(sub, 1, &sub_map[rv]);
    int32_t index = -1;
    if (s == KILN_OK) s = kiln_graph_add_subgraph(rw->dst, sub, &index);
    if (s != KILN_OK) kiln_graph_free(sub);
    if (s != KILN_OK) return s;
    const kiln_meta *m = &g->values[rv].meta;
    kiln_attrs a = {0};
    kiln_sdim ai[KILN_MAX_ATTR_INTS] = {{0, index}, {0, m->dtype}, {0, m->ndim}};
    kiln_attrs_push_int(&a, index);
    kiln_attrs_push_int(&a, m->dtype);
    kiln_attrs_push_int(&a, m->ndim);
    for (int d = 0; d < m->ndim; d++) {
        ai[a.ni] = (kiln_sdim){g->values[rv].sym[d], m->shape[d]};
        kiln_attrs_push_int(&a, m->shape[d]);
    }
    int32_t outer[MAX_GROUP_INPUTS];
    for (int32_t k = 0; k < nin; k++) {
        outer[k] = rw->map[inputs[k]];
        if (outer[k] < 0) return kiln_error(KILN_ERR_VALUE, "fuse_elementwise: a group input is not defined before its group");
    }
    return kiln_keep_recompute_mark(kiln_graph_add_node_sym(rw->dst, KILN_OP_FUSED, nin, outer, &a, ai, g->nodes[r].loc,
                                                            &rw->map[rv]),
                                    rw->dst, g->nodes[r].recompute);
}

static kiln_status rewrite(const fusion *f, kiln_graph **out) {
    const kiln_graph *g = f->g;
    bool *fused = kiln_calloc((size_t)(f->ngroups ? f->ngroups : 1), sizeof(bool));
    int32_t *sub_map = kiln_malloc(sizeof(int32_t) * (size_t)(g->nvalues ? g->nvalues : 1));
    int32_t inputs[MAX_GROUP_INPUTS];
    if (!fused || !sub_map) {
        free(fused), free(sub_map);
        return kiln_error(KILN_ERR_MEMORY, "out of memory in fuse_elementwise");
    }
    int32_t nfused = 0;
    for (int32_t grp = 0; grp < f->ngroups; grp++) {
        fused[grp] = worth_fusing(f, grp) && group_inputs(f, grp, inputs, MAX_GROUP_INPUTS) >= 0;
        nfused += fused[grp];
    }
    kiln_status s = KILN_OK;
    *out = NULL;
    if (nfused) {
        kiln_rewriter rw;
        s = kiln_rewriter_begin(&rw, g);
        for (int32_t i = 0; i < g->nnodes && s == KILN_OK; i++) {
            int32_t grp = f->group[i];
            if (grp < 0 || !fused[grp]) {
                s = kiln_rewriter_copy_node(&rw, i);
            } else if (f->root[grp] == i) {
                int32_t nin = group_inputs(f, grp, inputs, MAX_GROUP_INPUTS);
                s = emit_group(f, &rw, grp, inputs, nin, sub_map);
            }
        }
        if (s == KILN_OK) s = kiln_rewriter_finish(&rw, out);
        else kiln_rewriter_abort(&rw);
    }
    free(fused), free(sub_map);
    return s;
}

kiln_status kiln_pass_fuse_elementwise(const kiln_graph *in, const kiln_pass_options *opt, kiln_graph **out) {
    (void)opt;
    fusion f = {.g = in};
    kiln_status s = analyse(&f);
    if (s == KILN_OK) {
        form_groups(&f);
        s = rewrite(&f, out);
    }
    free(f.cons_start), free(f.cons), free(f.is_output), free(f.mut_before), free(f.group), free(f.root), free(f.size);
    free(f.space), free(f.rows);
    return s;
}
