/* Comparing two recordings of one function, for kiln.trace's verification: what a call did is
 * checked against what the trace recorded, op by op, and the first difference is named. */
#include "compare.h"

#include "../core/strbuf.h"

/* ---- effects ------------------------------------------------------------------------------ */

static bool node_has_effects(const kiln_node *n) {
    if (n->op == KILN_OP_BATCH_NORM) return kiln_attr_int(&n->attrs, KILN_A_BATCH_NORM_TRAINING, 0) != 0;
    return kiln_op_has_side_effects(n->op);
}

bool kiln_graph_has_effects(const kiln_graph *g) {
    for (int32_t i = 0; i < g->nnodes; i++)
        if (node_has_effects(&g->nodes[i])) return true;
    for (int32_t k = 0; k < g->nsubgraphs; k++)
        if (kiln_graph_has_effects(g->subgraphs[k])) return true;
    return false;
}

int32_t kiln_graph_first_reader(const kiln_graph *g, int32_t v) {
    for (int32_t i = 0; i < g->nnodes; i++)
        for (int k = 0; k < g->nodes[i].nin; k++)
            if (g->nodes[i].in[k] == v) return i;
    return -1;
}

/* ---- comparing -------------------------------------------------------------------------- */

static bool same_attrs(const kiln_attrs *a, const kiln_attrs *b) {
    if (a->ni != b->ni || a->nf != b->nf) return false;
    for (int k = 0; k < a->ni; k++)
        if (a->i[k] != b->i[k]) return false;
    return a->nf == 0 || memcmp(a->f, b->f, sizeof *a->f * (size_t)a->nf) == 0; /* bit for bit */
}

typedef enum { CAPTURE_CONSTANT, CAPTURE_PARAMETER, CAPTURE_TENSOR } capture_kind;

static capture_kind kind_of(const kiln_value *v) {
    return v->constant ? CAPTURE_CONSTANT : v->bound->requires_grad ? CAPTURE_PARAMETER : CAPTURE_TENSOR;
}

/* Two captured constants of one type hold the same bits (constants are private contiguous copies). */
static bool same_constant(const kiln_value *a, const kiln_value *b) {
    size_t bytes = (size_t)kiln_meta_numel(&a->meta) * kiln_dtype_size(a->meta.dtype);
    return bytes == 0 || memcmp(a->bound->data, b->bound->data, bytes) == 0;
}

/* Whether two values are the same thing: the same argument, capture (of the same kind, type and,
 * for constants, value) or output of the same op. */
static bool same_value(const kiln_value *a, const kiln_value *b) {
    if (a->kind != b->kind || a->index != b->index) return false;
    if (a->kind == KILN_VALUE_NODE) return a->node == b->node;
    if (!kiln_meta_equal(&a->meta, &b->meta)) return false;
    if (a->kind == KILN_VALUE_CAPTURED)
        return kind_of(a) == kind_of(b) && (!a->constant || same_constant(a, b));
    return true;
}

static bool found(kiln_graph_diff *d, kiln_graph_diff_kind kind, const kiln_graph *a, const kiln_graph *b,
                  int32_t node, int32_t slot, int32_t va, int32_t vb) {
    *d = (kiln_graph_diff){kind, a, b, -1, node, slot, va, vb};
    return true;
}

/* Input `slot` of op #node: value va of a against vb of b. */
static bool diff_input(const kiln_graph *a, const kiln_graph *b, int32_t node, int32_t slot, int32_t va, int32_t vb,
                       kiln_graph_diff *d) {
    const kiln_value *x = &a->values[va], *y = &b->values[vb];
    bool ext_x = x->kind == KILN_VALUE_CAPTURED, ext_y = y->kind == KILN_VALUE_CAPTURED;
    if (ext_x != ext_y) return found(d, KILN_DIFF_EXTERNAL, a, b, node, slot, va, vb);
    if (ext_x) {
        if (x->constant && y->constant && kiln_meta_equal(&x->meta, &y->meta) && !same_constant(x, y))
            return found(d, KILN_DIFF_CONSTANT, a, b, node, slot, va, vb);
        if (!kiln_meta_equal(&x->meta, &y->meta)) return found(d, KILN_DIFF_CAPTURE_META, a, b, node, slot, va, vb);
    }
    if (!same_value(x, y)) return found(d, KILN_DIFF_WIRING, a, b, node, slot, va, vb);
    return false;
}

bool kiln_graph_diff_ops(const kiln_graph *a, const kiln_graph *b, kiln_graph_diff *d) {
    int32_t n = a->nnodes < b->nnodes ? a->nnodes : b->nnodes;
    for (int32_t i = 0; i < n; i++) {
        const kiln_node *x = &a->nodes[i], *y = &b->nodes[i];
        if (x->op != y->op) return found(d, KILN_DIFF_OP, a, b, i, -1, -1, -1);
        if (x->nin != y->nin) return found(d, KILN_DIFF_NUM_INPUTS, a, b, i, -1, -1, -1);
        if (!same_attrs(&x->attrs, &y->attrs)) return found(d, KILN_DIFF_ATTRS, a, b, i, -1, -1, -1);
        for (int k = 0; k < x->nin; k++)
            if (diff_input(a, b, i, k, x->in[k], y->in[k], d)) return true;
        for (int k = 0; k < x->nout && k < y->nout; k++)
            if (!kiln_meta_equal(&a->values[x->out[k]].meta, &b->values[y->out[k]].meta))
                return found(d, KILN_DIFF_OUTPUT_META, a, b, i, k, x->out[k], y->out[k]);
    }
    if (b->nnodes > n) return found(d, KILN_DIFF_MORE_OPS, a, b, n, -1, -1, -1);
    if (a->nnodes > n) return found(d, KILN_DIFF_FEWER_OPS, a, b, n, -1, -1, -1);
    if (a->nsubgraphs != b->nsubgraphs) return found(d, KILN_DIFF_SUBGRAPHS, a, b, -1, -1, -1, -1);
    for (int32_t k = 0; k < a->nsubgraphs; k++) {
        if (kiln_graph_diff_ops(a->subgraphs[k], b->subgraphs[k], d) ||
            kiln_graph_diff_outputs(a->subgraphs[k], b->subgraphs[k], d)) {
            if (d->subgraph < 0) d->subgraph = k; /* (the outermost one when nested) */
            return true;
        }
    }
    return false;
}

bool kiln_graph_diff_outputs(const kiln_graph *a, const kiln_graph *b, kiln_graph_diff *d) {
    if (a->noutputs != b->noutputs) return found(d, KILN_DIFF_NUM_OUTPUTS, a, b, -1, -1, -1, -1);
    for (int32_t k = 0; k < a->noutputs; k++)
        if (!same_value(&a->values[a->outputs[k]], &b->values[b->outputs[k]]))
            return found(d, KILN_DIFF_OUTPUT, a, b, -1, k, a->outputs[k], b->outputs[k]);
    return false;
}

/* Where value v of g is read first: (node, slot), or node -1 and the graph output slot. */
static void first_use(const kiln_graph *g, int32_t v, int32_t *node, int32_t *slot) {
    *node = kiln_graph_first_reader(g, v), *slot = 0;
    if (*node >= 0) {
        while (g->nodes[*node].in[*slot] != v) (*slot)++;
        return;
    }
    for (int32_t k = 0; k < g->noutputs; k++)
        if (g->outputs[k] == v) {
            *slot = k;
            return;
        }
}

/* Capture k of a against capture k of b (kiln_graph_diff_ops found them the same kind and type):
 * made before the call, they must be one tensor; made while the function ran, the same values. */
static bool capture_differs(const kiln_value *x, const kiln_value *y) {
    if (x->constant || y->constant) return false; /* (compared by diff_ops) */
    if (x->fresh != y->fresh) return true;
    if (!x->fresh) return x->bound != y->bound;
    if (!kiln_meta_equal(&x->meta, &y->meta)) return true;
    kiln_tensor *cx = NULL, *cy = NULL;
    bool differs = true;
    if (kiln_to_contiguous(x->bound, x->meta.dtype, &cx) == KILN_OK &&
        kiln_to_contiguous(y->bound, y->meta.dtype, &cy) == KILN_OK) {
        size_t bytes = (size_t)kiln_meta_numel(&x->meta) * kiln_dtype_size(x->meta.dtype);
        differs = bytes && memcmp(cx->data, cy->data, bytes) != 0;
    }
    kiln_clear_error();
    if (cx) kiln_tensor_release(cx);
    if (cy) kiln_tensor_release(cy);
    return differs;
}

bool kiln_graph_diff_captured(const kiln_graph *a, const kiln_graph *b, kiln_graph_diff *d) {
    int32_t n = a->ncaptures < b->ncaptures ? a->ncaptures : b->ncaptures;
    for (int32_t k = 0; k < n; k++) {
        int32_t va = a->captures[k], vb = b->captures[k];
        if (!capture_differs(&a->values[va], &b->values[vb])) continue;
        int32_t node, slot;
        first_use(a, va, &node, &slot);
        return found(d, KILN_DIFF_REPLACED, a, b, node, slot, va, vb);
    }
    for (int32_t k = 0; k < a->nsubgraphs && k < b->nsubgraphs; k++)
        if (kiln_graph_diff_captured(a->subgraphs[k], b->subgraphs[k], d)) {
            if (d->subgraph < 0) d->subgraph = k;
            return true;
        }
    return false;
}

/* ---- messages ----------------------------------------------------------------------------- */

typedef struct {
    int nlabels;
    const char *const *labels; /* NULL inside subgraphs: their inputs are not the function's arguments */
    bool precise;              /* print floats with all their digits (the short forms look the same) */
} names;

static void put_type(kiln_strbuf *t, const kiln_meta *m) {
    kiln_strbuf_printf(t, "%s[", kiln_dtype_name(m->dtype));
    for (int d = 0; d < m->ndim; d++) kiln_strbuf_printf(t, d ? ", %lld" : "%lld", (long long)m->shape[d]);
    kiln_strbuf_printf(t, "]");
}

/* " at file.py:12" (the file's base name), or nothing when the node has no location. */
static void put_where(kiln_strbuf *t, const kiln_graph *g, const kiln_node *n) {
    if (n->loc < 0 || n->loc >= g->nlocs) return;
    const char *loc = g->locs[n->loc], *colon = strrchr(loc, ':'), *base = loc;
    if (colon)
        for (const char *p = loc; p < colon; p++)
            if (*p == '/') base = p + 1;
    kiln_strbuf_printf(t, " at %s", colon && colon > loc ? base : loc);
}

/* "exp at f.py:3" */
static void put_op(kiln_strbuf *t, const kiln_graph *g, int32_t node) {
    kiln_strbuf_printf(t, "%s", kiln_op_table[g->nodes[node].op].name);
    put_where(t, g, &g->nodes[node]);
}

static void put_attrs(kiln_strbuf *t, const kiln_attrs *a, bool precise) {
    kiln_strbuf_printf(t, "{");
    for (int k = 0; k < a->ni; k++) kiln_strbuf_printf(t, k ? ", %lld" : "%lld", (long long)a->i[k]);
    if (a->nf) kiln_strbuf_printf(t, "; ");
    for (int k = 0; k < a->nf; k++) kiln_strbuf_printf(t, precise ? (k ? ", %.17g" : "%.17g") : (k ? ", %g" : "%g"), a->f[k]);
    kiln_strbuf_printf(t, "}");
}

/* What value v of g is: "argument x", "the constant 2", "captured tensor #0 (float32[3])",
 * "output 0 of op #1 (exp at f.py:3)". */
static void put_value(kiln_strbuf *t, const kiln_graph *g, int32_t v, const names *nm) {
    const kiln_value *x = &g->values[v];
    switch (x->kind) {
    case KILN_VALUE_INPUT:
        if (nm->labels && x->index < nm->nlabels) kiln_strbuf_printf(t, "argument %s", nm->labels[x->index]);
        else kiln_strbuf_printf(t, "%s #%d", nm->labels ? "argument" : "subgraph input", (int)x->index);
        return;
    case KILN_VALUE_CAPTURED:
        if (x->constant && x->meta.ndim == 0) {
            kiln_strbuf_printf(t, nm->precise ? "the constant %.17g" : "the constant %g",
                               kiln_tensor_get_double(x->bound, 0));
            return;
        }
        kiln_strbuf_printf(t, "captured %s #%d (",
                           x->constant ? "constant" : kind_of(x) == CAPTURE_PARAMETER ? "parameter" : "tensor",
                           (int)x->index);
        put_type(t, &x->meta);
        kiln_strbuf_printf(t, ")");
        return;
    case KILN_VALUE_NODE:
        kiln_strbuf_printf(t, "output %d of op #%d (", (int)x->index, (int)x->node);
        put_op(t, g, x->node);
        kiln_strbuf_printf(t, ")");
        return;
    }
}

static char *take(kiln_strbuf *t) {
    if (!t->failed) return t->buf;
    free(t->buf);
    return NULL;
}

/* Whether put_value's short forms of the two values of d read the same (then all digits are shown). */
static bool short_forms_agree(const kiln_graph_diff *d, names nm) {
    kiln_strbuf x = {kiln_malloc(64), 0, 64, false}, y = {kiln_malloc(64), 0, 64, false};
    bool same = false;
    if (x.buf && y.buf) {
        x.buf[0] = y.buf[0] = '\0';
        put_value(&x, d->a, d->value_a, &nm);
        put_value(&y, d->b, d->value_b, &nm);
        same = !x.failed && !y.failed && strcmp(x.buf, y.buf) == 0;
    }
    free(x.buf), free(y.buf);
    return same;
}

char *kiln_graph_diff_message(const kiln_graph_diff *d, int nlabels, const char *const *labels) {
    kiln_strbuf t = {kiln_malloc(256), 0, 256, false};
    if (!t.buf) return NULL;
    t.buf[0] = '\0';
    names nm = {nlabels, d->subgraph < 0 ? labels : NULL, false};
    const kiln_graph *a = d->a, *b = d->b;
    const kiln_node *x = d->node >= 0 && d->node < a->nnodes ? &a->nodes[d->node] : NULL;
    const kiln_node *y = d->node >= 0 && d->node < b->nnodes ? &b->nodes[d->node] : NULL;
    if (d->subgraph >= 0) kiln_strbuf_printf(&t, "in subgraph %d: ", (int)d->subgraph);
    if (d->kind == KILN_DIFF_REPLACED && d->node < 0) kiln_strbuf_printf(&t, "output tensor %d", (int)d->slot);
    else if (d->kind >= KILN_DIFF_EXTERNAL && d->kind <= KILN_DIFF_WIRING) kiln_strbuf_printf(&t, "input %d of ", (int)d->slot);
    if (d->kind >= KILN_DIFF_NUM_INPUTS && d->kind <= KILN_DIFF_OUTPUT_META && x) {
        /* "op #2 (mul at f.py:4)": the recorded op, where this call ran it */
        kiln_strbuf_printf(&t, "op #%d (%s", (int)d->node, kiln_op_table[x->op].name);
        put_where(&t, b, y);
        kiln_strbuf_printf(&t, ")");
    }
    switch (d->kind) {
    case KILN_DIFF_NONE:
        kiln_strbuf_printf(&t, "no difference");
        break;
    case KILN_DIFF_OP:
        kiln_strbuf_printf(&t, "op #%d: the trace recorded ", (int)d->node);
        put_op(&t, a, d->node);
        kiln_strbuf_printf(&t, ", this call ran ");
        put_op(&t, b, d->node);
        break;
    case KILN_DIFF_NUM_INPUTS:
        kiln_strbuf_printf(&t, ": the trace recorded it with %d inputs, this call gave it %d", (int)x->nin,
                           (int)y->nin);
        break;
    case KILN_DIFF_ATTRS: {
        kiln_strbuf sx = {kiln_malloc(64), 0, 64, false}, sy = {kiln_malloc(64), 0, 64, false};
        bool precise = false;
        if (sx.buf && sy.buf) {
            sx.buf[0] = sy.buf[0] = '\0';
            put_attrs(&sx, &x->attrs, false), put_attrs(&sy, &y->attrs, false);
            precise = !sx.failed && !sy.failed && strcmp(sx.buf, sy.buf) == 0;
        }
        free(sx.buf), free(sy.buf);
        kiln_strbuf_printf(&t, ": the trace recorded attributes ");
        put_attrs(&t, &x->attrs, precise);
        kiln_strbuf_printf(&t, ", this call used ");
        put_attrs(&t, &y->attrs, precise);
        break;
    }
    case KILN_DIFF_EXTERNAL:
    case KILN_DIFF_CONSTANT:
    case KILN_DIFF_CAPTURE_META:
    case KILN_DIFF_WIRING: {
        const kiln_meta *ma = &a->values[d->value_a].meta, *mb = &b->values[d->value_b].meta;
        if (d->kind == KILN_DIFF_EXTERNAL) {
            bool ext_a = a->values[d->value_a].kind == KILN_VALUE_CAPTURED;
            kiln_strbuf_printf(&t, " switched between external and internal: the trace recorded %s (",
                               ext_a ? "external" : "internal");
            put_value(&t, a, d->value_a, &nm);
            kiln_strbuf_printf(&t, "), this call gave %s (", ext_a ? "internal" : "external");
            put_value(&t, b, d->value_b, &nm);
            kiln_strbuf_printf(&t, ")");
        } else if (d->kind == KILN_DIFF_CAPTURE_META) {
            kiln_strbuf_printf(&t, ": a captured tensor changed %s: the trace recorded ",
                               ma->dtype != mb->dtype ? "dtype" : "shape");
            put_type(&t, ma);
            kiln_strbuf_printf(&t, ", this call used ");
            put_type(&t, mb);
        } else {
            nm.precise = d->kind == KILN_DIFF_CONSTANT && short_forms_agree(d, nm);
            kiln_strbuf_printf(&t, d->kind == KILN_DIFF_CONSTANT ? ": a captured constant changed: the trace recorded "
                                                                 : ": different wiring: the trace recorded ");
            put_value(&t, a, d->value_a, &nm);
            kiln_strbuf_printf(&t, ", this call used ");
            put_value(&t, b, d->value_b, &nm);
            if (d->kind == KILN_DIFF_CONSTANT && ma->ndim > 0) kiln_strbuf_printf(&t, " (other values)");
        }
        break;
    }
    case KILN_DIFF_REPLACED: {
        if (a->values[d->value_a].fresh && b->values[d->value_b].fresh) {
            kiln_strbuf_printf(&t, ": a tensor the function made changed value: the trace recorded ");
            put_value(&t, a, d->value_a, &nm);
            kiln_strbuf_printf(&t, " with other values (the compiled graph would read the recorded ones)");
        } else {
            kiln_strbuf_printf(&t, ": a captured tensor was replaced by another: the trace recorded ");
            put_value(&t, a, d->value_a, &nm);
            kiln_strbuf_printf(&t, ", this call read another tensor of that type (a replaced Parameter, sub-Cell "
                                   "or attribute; the compiled graph would read the recorded one)");
        }
        break;
    }
    case KILN_DIFF_OUTPUT_META: {
        const kiln_meta *ma = &a->values[d->value_a].meta, *mb = &b->values[d->value_b].meta;
        kiln_strbuf_printf(&t, ": output %d changed %s: the trace recorded ", (int)d->slot,
                           ma->dtype != mb->dtype ? "dtype" : "shape");
        put_type(&t, ma);
        kiln_strbuf_printf(&t, ", this call produced ");
        put_type(&t, mb);
        break;
    }
    case KILN_DIFF_MORE_OPS:
        kiln_strbuf_printf(&t, "more ops than recorded: the trace recorded %d ops, this call ran %d; the first one "
                               "not recorded is op #%d (",
                           (int)a->nnodes, (int)b->nnodes, (int)d->node);
        put_op(&t, b, d->node);
        kiln_strbuf_printf(&t, ")");
        break;
    case KILN_DIFF_FEWER_OPS:
        kiln_strbuf_printf(&t, "fewer ops than recorded: the trace recorded %d ops, this call ran only %d; the "
                               "first one missing is op #%d (",
                           (int)a->nnodes, (int)b->nnodes, (int)d->node);
        put_op(&t, a, d->node);
        kiln_strbuf_printf(&t, ")");
        break;
    case KILN_DIFF_SUBGRAPHS:
        kiln_strbuf_printf(&t, "the trace recorded %d subgraphs, this call %d", (int)a->nsubgraphs,
                           (int)b->nsubgraphs);
        break;
    case KILN_DIFF_NUM_OUTPUTS:
        kiln_strbuf_printf(&t, "different outputs: the trace recorded %d output tensors, this call returned %d",
                           (int)a->noutputs, (int)b->noutputs);
        break;
    case KILN_DIFF_OUTPUT:
        nm.precise = short_forms_agree(d, nm);
        kiln_strbuf_printf(&t, "different outputs: output tensor %d was ", (int)d->slot);
        put_value(&t, a, d->value_a, &nm);
        kiln_strbuf_printf(&t, " in the trace, this call returned ");
        put_value(&t, b, d->value_b, &nm);
        break;
    }
    return take(&t);
}
