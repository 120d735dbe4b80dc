/* The graph IR: building, verifying, printing. */
#include "../core/internal.h"
#include "../core/strbuf.h"

#include "control.h"
#include "kiln/graph.h"
#include "symbolic.h"

#define GROW(arr, count, cap)                                                                \
    do {                                                                                     \
        if ((count) == (cap)) {                                                              \
            int32_t ncap_ = (cap) ? (cap) * 2 : 16;                                          \
            void *grown_ = kiln_realloc((arr), sizeof *(arr) * (size_t)ncap_);                    \
            if (!grown_) return kiln_error(KILN_ERR_MEMORY, "out of memory growing a graph"); \
            (arr) = grown_;                                                                  \
            (cap) = ncap_;                                                                   \
        }                                                                                    \
    } while (0)

kiln_status kiln_graph_new(kiln_graph **out) {
    *out = kiln_calloc(1, sizeof **out);
    return *out ? KILN_OK : kiln_error(KILN_ERR_MEMORY, "out of memory allocating a graph");
}

void kiln_graph_free(kiln_graph *g) {
    if (!g) return;
    for (int32_t v = 0; v < g->nvalues; v++) kiln_tensor_release(g->values[v].bound);
    for (int32_t n = 0; n < g->nnodes; n++) free(g->nodes[n].in), free(g->nodes[n].attr_sym);
    for (int32_t l = 0; l < g->nlocs; l++) free(g->locs[l]);
    for (int32_t s = 0; s < g->nsubgraphs; s++) kiln_graph_free(g->subgraphs[s]);
    kiln_graph_free_names(g);
    free(g->values), free(g->nodes), free(g->inputs), free(g->captures), free(g->outputs);
    free(g->locs), free(g->subgraphs);
    kiln_symtab_free(g->syms);
    free(g);
}

static kiln_status new_value(kiln_graph *g, const kiln_meta *meta, kiln_value_kind kind, int32_t *id) {
    GROW(g->values, g->nvalues, g->cap_values);
    kiln_value *v = &g->values[g->nvalues];
    memset(v, 0, sizeof *v);
    v->meta = *meta;
    v->kind = kind;
    v->node = -1;
    *id = g->nvalues++;
    return KILN_OK;
}

/* A value's dtype and shape, from a caller or an op's inference on attributes (a reshape or a
 * full with huge dimensions): within the limits of a tensor, so every size computed from them
 * later (the memory plan, generated loops) fits. */
static kiln_status check_meta(const kiln_meta *m) {
    if ((unsigned)m->dtype >= KILN_DTYPE_COUNT) return kiln_error(KILN_ERR_TYPE, "graph: invalid dtype %d", (int)m->dtype);
    int64_t n;
    kiln_status s = kiln_shape_numel_checked(m->ndim, m->shape, &n);
    return s == KILN_OK ? KILN_OK : kiln_error_context(s, "graph");
}

kiln_status kiln_graph_add_input(kiln_graph *g, const kiln_meta *meta, int32_t *value) {
    KILN_TRY(check_meta(meta));
    GROW(g->inputs, g->ninputs, g->cap_inputs);
    KILN_TRY(new_value(g, meta, KILN_VALUE_INPUT, value));
    g->values[*value].index = g->ninputs;
    g->inputs[g->ninputs++] = *value;
    return KILN_OK;
}

kiln_status kiln_graph_add_capture(kiln_graph *g, kiln_tensor *t, bool constant, int32_t *value) {
    GROW(g->captures, g->ncaptures, g->cap_captures);
    kiln_tensor *bound = t;
    if (constant) {
        KILN_TRY(kiln_tensor_empty(t->meta.dtype, t->meta.ndim, t->meta.shape, &bound));
        kiln_status s = kiln_copy_into(bound, t);
        if (s != KILN_OK) {
            kiln_tensor_release(bound);
            return s;
        }
    } else {
        kiln_tensor_retain(t);
    }
    kiln_status s = new_value(g, &t->meta, KILN_VALUE_CAPTURED, value);
    if (s != KILN_OK) {
        kiln_tensor_release(bound);
        return s;
    }
    kiln_value *v = &g->values[*value];
    v->bound = bound;
    v->constant = constant;
    v->index = g->ncaptures;
    g->captures[g->ncaptures++] = *value;
    return KILN_OK;
}

kiln_status kiln_graph_add_loc(kiln_graph *g, const char *loc, int32_t *id) {
    for (int32_t l = g->nlocs - 1; l >= 0; l--)
        if (strcmp(g->locs[l], loc) == 0) {
            *id = l;
            return KILN_OK;
        }
    GROW(g->locs, g->nlocs, g->cap_locs);
    g->locs[g->nlocs] = kiln_strdup(loc);
    if (!g->locs[g->nlocs]) return kiln_error(KILN_ERR_MEMORY, "out of memory");
    *id = g->nlocs++;
    return KILN_OK;
}

/* Tensors carrying only metas, for running inference on graph values. */
static void meta_tensors(const kiln_graph *g, int nin, const int32_t *in, kiln_tensor *store, kiln_tensor **ptrs) {
    for (int k = 0; k < nin; k++) {
        memset(&store[k], 0, sizeof store[k]);
        store[k].meta = g->values[in[k]].meta;
        kiln_contiguous_strides(store[k].meta.ndim, store[k].meta.shape, store[k].strides);
        store[k].numel = kiln_meta_numel(&store[k].meta);
        ptrs[k] = &store[k];
    }
}

static kiln_status infer_node(const kiln_graph *g, kiln_op op, int nin, const int32_t *in, const kiln_attrs *a,
                              kiln_meta *metas) {
    kiln_tensor small[8], *small_ptrs[8] = {0};
    kiln_tensor *store = nin <= 8 ? small : kiln_malloc(sizeof *store * (size_t)nin);
    kiln_tensor **ptrs = nin <= 8 ? small_ptrs : kiln_malloc(sizeof *ptrs * (size_t)nin);
    kiln_status s;
    if (!store || !ptrs) {
        s = kiln_error(KILN_ERR_MEMORY, "out of memory");
    } else {
        meta_tensors(g, nin, in, store, ptrs);
        s = kiln_infer(op, nin, ptrs, a, metas);
    }
    if (store != small) free(store);
    if (ptrs != small_ptrs) free(ptrs);
    return s;
}

/* Control-flow nodes: output metas from the subgraphs their attrs name. */
static kiln_status infer_control(const kiln_graph *g, kiln_op op, int nin, const int32_t *in, const kiln_attrs *a,
                                 kiln_meta *metas) {
    const char *name = kiln_op_table[op].name;
    if (a->ni <= KILN_A_CONTROL_NOUT) return kiln_error(KILN_ERR_VALUE, "%s: malformed attributes (%d ints)", name, a->ni);
    const kiln_graph *subs[4];
    int slots[4], ns = kiln_control_slots(op, slots);
    for (int k = 0; k < ns; k++) {
        int32_t idx;
        KILN_TRY(kiln_graph_body_index(g, op, a, k, &idx));
        subs[k] = g->subgraphs[idx];
    }
    kiln_meta *in_metas = kiln_malloc(sizeof *in_metas * (size_t)(nin ? nin : 1));
    if (!in_metas) return kiln_error(KILN_ERR_MEMORY, "out of memory");
    for (int k = 0; k < nin; k++) in_metas[k] = g->values[in[k]].meta;
    kiln_status s = kiln_control_infer(op, nin, in_metas, a, subs, metas);
    free(in_metas);
    return s;
}

static kiln_status infer_any(const kiln_graph *g, kiln_op op, int nin, const int32_t *in, const kiln_attrs *a,
                             kiln_meta *metas) {
    if ((unsigned)op < KILN_OP_COUNT && kiln_op_is_control(op)) return infer_control(g, op, nin, in, a, metas);
    return infer_node(g, op, nin, in, a, metas);
}

kiln_status kiln_graph_infer_node(const kiln_graph *g, const kiln_node *n, kiln_meta *metas) {
    KILN_TRY(infer_any(g, n->op, n->nin, n->in, &n->attrs, metas));
    for (int k = 0; k < n->nout; k++) KILN_TRY(check_meta(&metas[k]));
    return KILN_OK;
}

kiln_status kiln_graph_add_node(kiln_graph *g, kiln_op op, int nin, const int32_t *in, const kiln_attrs *attrs,
                                int32_t loc, int32_t *out) {
    return kiln_graph_add_node_sym(g, op, nin, in, attrs, NULL, loc, out);
}

/* The entries of attr_dims (NULL when none is symbolic: *sym stays NULL), with a->i set to their hints. */
static kiln_status attr_entries(const kiln_graph *g, const kiln_sdim *attr_dims, kiln_attrs *a, int32_t **sym) {
    *sym = NULL;
    bool any = false;
    for (int k = 0; attr_dims && k < a->ni; k++) any |= attr_dims[k].e != 0;
    if (!any) return KILN_OK;
    if (!g->syms) return kiln_error(KILN_ERR_VALUE, "graph: a symbolic attribute in a graph without symbols");
    *sym = kiln_malloc(sizeof **sym * (size_t)a->ni);
    if (!*sym) return kiln_error(KILN_ERR_MEMORY, "out of memory");
    for (int k = 0; k < a->ni; k++) {
        (*sym)[k] = attr_dims[k].e;
        if (!attr_dims[k].e) continue;
        kiln_status s = attr_dims[k].e < kiln_symtab_entries(g->syms)
                            ? kiln_sym_eval(g->syms, attr_dims[k], NULL, &a->i[k])
                            : kiln_error(KILN_ERR_VALUE, "graph: attribute %d names no symbolic size of the graph", k);
        if (s != KILN_OK) {
            free(*sym);
            *sym = NULL;
            return s;
        }
    }
    return KILN_OK;
}

kiln_status kiln_graph_add_node_sym(kiln_graph *g, kiln_op op, int nin, const int32_t *in, const kiln_attrs *attrs,
                                    const kiln_sdim *attr_dims, int32_t loc, int32_t *out) {
    static const kiln_attrs none;
    if (!attrs) attrs = &none;
    for (int k = 0; k < nin; k++)
        if (in[k] < 0 || in[k] >= g->nvalues)
            return kiln_error(KILN_ERR_VALUE, "graph: %s input %d refers to unknown value %d",
                              (unsigned)op < KILN_OP_COUNT ? kiln_op_table[op].name : "?", k, in[k]);
    kiln_attrs a = *attrs;
    int32_t *attr_sym;
    KILN_TRY(attr_entries(g, attr_dims, &a, &attr_sym));
    kiln_meta metas[KILN_MAX_OUTPUTS];
    kiln_sshape shapes[KILN_MAX_OUTPUTS];
    bool symbolic = kiln_graph_node_symbolic(g, nin, in, a.ni, attr_sym);
    kiln_status s = infer_any(g, op, nin, in, &a, metas);
    for (int k = 0; k < kiln_op_nout(op, &a) && s == KILN_OK; k++) s = check_meta(&metas[k]);
    if (s == KILN_OK && symbolic)
        s = kiln_graph_infer_sym(g, op, nin, in, &a, attr_sym, kiln_op_nout(op, &a), metas, shapes);
    if (s == KILN_OK && g->nnodes == g->cap_nodes) {
        int32_t ncap = g->cap_nodes ? g->cap_nodes * 2 : 16;
        kiln_node *grown = kiln_realloc(g->nodes, sizeof *grown * (size_t)ncap);
        if (grown) g->nodes = grown, g->cap_nodes = ncap;
        else s = kiln_error(KILN_ERR_MEMORY, "out of memory growing a graph");
    }
    if (s != KILN_OK) {
        free(attr_sym);
        return s;
    }
    kiln_node *n = &g->nodes[g->nnodes];
    memset(n, 0, sizeof *n);
    n->attr_sym = attr_sym;
    n->in = kiln_malloc(sizeof(int32_t) * (size_t)(nin ? nin : 1));
    if (!n->in) {
        free(attr_sym);
        return kiln_error(KILN_ERR_MEMORY, "out of memory");
    }
    if (nin) memcpy(n->in, in, sizeof(int32_t) * (size_t)nin);
    n->op = op;
    n->nin = nin;
    n->nout = kiln_op_nout(op, &a);
    n->attrs = a;
    n->loc = loc;
    int32_t node_id = g->nnodes++;
    for (int k = 0; k < n->nout; k++) {
        KILN_TRY(new_value(g, &metas[k], KILN_VALUE_NODE, &n->out[k]));
        kiln_value *v = &g->values[n->out[k]];
        v->node = node_id;
        v->index = k;
        for (int d = 0; symbolic && d < v->meta.ndim; d++) v->sym[d] = shapes[k].d[d].e;
        if (out) out[k] = n->out[k];
    }
    return KILN_OK;
}

kiln_status kiln_graph_add_subgraph(kiln_graph *g, kiln_graph *sub, int32_t *index) {
    kiln_graph **grown = kiln_realloc(g->subgraphs, sizeof *grown * (size_t)(g->nsubgraphs + 1));
    if (!grown) return kiln_error(KILN_ERR_MEMORY, "out of memory adding a subgraph");
    g->subgraphs = grown;
    g->subgraphs[g->nsubgraphs] = sub;
    *index = g->nsubgraphs++;
    return KILN_OK;
}

#define COPY_ARRAY(dst, src, n)                                                              \
    do {                                                                                     \
        (dst) = kiln_malloc(sizeof *(dst) * (size_t)((n) ? (n) : 1));                             \
        if (!(dst)) goto oom;                                                                \
        if (n) memcpy((dst), (src), sizeof *(dst) * (size_t)(n));                            \
    } while (0)

kiln_status kiln_graph_clone(const kiln_graph *g, kiln_graph **out) {
    kiln_graph *c;
    KILN_TRY(kiln_graph_new(&c));
    COPY_ARRAY(c->values, g->values, g->nvalues);
    c->nvalues = c->cap_values = g->nvalues;
    for (int32_t v = 0; v < g->nvalues; v++)
        if (c->values[v].bound) kiln_tensor_retain(c->values[v].bound);
    c->nodes = kiln_calloc((size_t)(g->nnodes ? g->nnodes : 1), sizeof *c->nodes);
    if (!c->nodes) goto oom;
    for (int32_t n = 0; n < g->nnodes; n++) {
        c->nodes[n] = g->nodes[n];
        c->nodes[n].in = NULL;
        c->nodes[n].attr_sym = NULL;
        COPY_ARRAY(c->nodes[n].in, g->nodes[n].in, g->nodes[n].nin);
        if (g->nodes[n].attr_sym) COPY_ARRAY(c->nodes[n].attr_sym, g->nodes[n].attr_sym, g->nodes[n].attrs.ni);
        c->nnodes = n + 1;
    }
    c->cap_nodes = c->nnodes = g->nnodes;
    COPY_ARRAY(c->inputs, g->inputs, g->ninputs);
    c->ninputs = c->cap_inputs = g->ninputs;
    COPY_ARRAY(c->captures, g->captures, g->ncaptures);
    c->ncaptures = c->cap_captures = g->ncaptures;
    COPY_ARRAY(c->outputs, g->outputs, g->noutputs);
    c->noutputs = g->noutputs;
    c->locs = kiln_calloc((size_t)(g->nlocs ? g->nlocs : 1), sizeof(char *));
    if (!c->locs) goto oom;
    for (int32_t l = 0; l < g->nlocs; l++) {
        c->locs[l] = kiln_strdup(g->locs[l]);
        if (!c->locs[l]) goto oom;
        c->nlocs = c->cap_locs = l + 1;
    }
    kiln_status s = g->syms ? kiln_symtab_clone(g->syms, &c->syms) : KILN_OK;
    if (s == KILN_OK) s = kiln_graph_copy_subgraphs(g, c);
    if (s == KILN_OK) s = kiln_graph_copy_names(g, c);
    if (s != KILN_OK) {
        kiln_graph_free(c);
        return s;
    }
    *out = c;
    return KILN_OK;
oom:
    kiln_graph_free(c);
    return kiln_error(KILN_ERR_MEMORY, "out of memory copying a graph");
}

kiln_status kiln_graph_copy_subgraphs(const kiln_graph *from, kiln_graph *to) {
    for (int32_t k = 0; k < from->nsubgraphs; k++) {
        kiln_graph *sub = NULL;
        int32_t idx;
        kiln_status s = kiln_graph_clone(from->subgraphs[k], &sub);
        if (s == KILN_OK) s = kiln_graph_add_subgraph(to, sub, &idx);
        if (s != KILN_OK) {
            kiln_graph_free(sub);
            return s;
        }
    }
    return KILN_OK;
}

kiln_status kiln_graph_set_outputs(kiln_graph *g, int n, const int32_t *values) {
    for (int k = 0; k < n; k++)
        if (values[k] < 0 || values[k] >= g->nvalues)
            return kiln_error(KILN_ERR_VALUE, "graph: output %d refers to unknown value %d", k, values[k]);
    int32_t *outs = kiln_malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    if (!outs) return kiln_error(KILN_ERR_MEMORY, "out of memory");
    if (n) memcpy(outs, values, sizeof(int32_t) * (size_t)n);
    free(g->outputs);
    g->outputs = outs;
    g->noutputs = n;
    return KILN_OK;
}

kiln_status kiln_graph_verify(const kiln_graph *g) {
    /* a value is defined once it is an input or capture, or its node has been passed */
    bool *defined = kiln_calloc((size_t)(g->nvalues ? g->nvalues : 1), sizeof *defined);
    if (!defined) return kiln_error(KILN_ERR_MEMORY, "out of memory");
    kiln_status s = KILN_OK;
    for (int32_t v = 0; v < g->nvalues; v++) defined[v] = g->values[v].kind != KILN_VALUE_NODE;
    for (int32_t i = 0; i < g->nnodes && s == KILN_OK; i++) {
        const kiln_node *n = &g->nodes[i];
        if ((unsigned)n->op >= KILN_OP_COUNT) {
            s = kiln_error(KILN_ERR_VALUE, "graph: node %d has unknown op %d", i, (int)n->op);
            break;
        }
        for (int k = 0; k < n->nin && s == KILN_OK; k++)
            if (n->in[k] < 0 || n->in[k] >= g->nvalues || !defined[n->in[k]])
                s = kiln_error(KILN_ERR_VALUE, "graph: node %d (%s) uses value %%%d before it is defined", i,
                               kiln_op_table[n->op].name, n->in[k]);
        kiln_meta metas[KILN_MAX_OUTPUTS];
        if (s == KILN_OK) s = infer_any(g, n->op, n->nin, n->in, &n->attrs, metas);
        for (int k = 0; k < n->nout && s == KILN_OK; k++) {
            const kiln_value *v = &g->values[n->out[k]];
            if (v->kind != KILN_VALUE_NODE || v->node != i || v->index != k || !kiln_meta_equal(&metas[k], &v->meta))
                s = kiln_error(KILN_ERR_VALUE, "graph: output %d of node %d (%s) is miswired or mistyped", k, i,
                               kiln_op_table[n->op].name);
            else
                defined[n->out[k]] = true;
        }
    }
    for (int32_t k = 0; k < g->noutputs && s == KILN_OK; k++)
        if (g->outputs[k] < 0 || g->outputs[k] >= g->nvalues || !defined[g->outputs[k]])
            s = kiln_error(KILN_ERR_VALUE, "graph: output %d refers to an undefined value", k);
    if (s == KILN_OK) s = kiln_graph_verify_sym(g);
    free(defined);
    return s;
}

/* ---- printing ----------------------------------------------------------------------------- */


/* "float32[s0, 64]": a symbolic size as its expression. */
static void put_type(kiln_strbuf *t, const kiln_graph *g, int32_t v) {
    const kiln_value *x = &g->values[v];
    kiln_strbuf_printf(t, "%s[", kiln_dtype_name(x->meta.dtype));
    for (int d = 0; d < x->meta.ndim; d++) {
        if (d) kiln_strbuf_printf(t, ", ");
        if (x->sym[d]) kiln_sym_print(t, g->syms, (kiln_sdim){x->sym[d], x->meta.shape[d]});
        else kiln_strbuf_printf(t, "%lld", (long long)x->meta.shape[d]);
    }
    kiln_strbuf_printf(t, "]");
}

/* "<s0 >= 2 (8), s1 >= 1 (3)>": each symbol, its lower bound and hint. */
static void put_symbols(kiln_strbuf *t, const kiln_graph *g) {
    if (!kiln_graph_is_symbolic(g)) return;
    kiln_strbuf_printf(t, "<");
    for (int32_t k = 0; k < kiln_sym_count(g->syms); k++)
        kiln_strbuf_printf(t, "%ss%d >= %lld (%lld)", k ? ", " : "", k, (long long)kiln_sym_lower(g->syms, k),
                           (long long)kiln_sym_hint(g->syms, k));
    kiln_strbuf_printf(t, ">");
}

/* Whether every element of c holds the same bits (a 0-d constant does): the text form
 * "constant(v)" then gives it back exactly. */
static bool is_filled(const kiln_tensor *c, bool *failed) {
    if (c->numel <= 1) return true;
    kiln_tensor *flat = NULL;
    if (kiln_to_contiguous((kiln_tensor *)c, c->meta.dtype, &flat) != KILN_OK) {
        *failed = true;
        return false;
    }
    size_t es = kiln_dtype_size(c->meta.dtype);
    const char *d = flat->data;
    bool same = true;
    for (int64_t i = 1; i < flat->numel && same; i++) same = memcmp(d, d + (size_t)i * es, es) == 0;
    kiln_tensor_release(flat);
    return same;
}

/* The value of c's first element (at c->data), written so that the parser reads back the same
 * value: int64 exactly (beyond 2^53 too), floats in as many digits as they need; the other
 * integer dtypes are exact as doubles. */
static void put_value(kiln_strbuf *t, const kiln_tensor *c) {
    if (c->meta.dtype == KILN_DTYPE_INT64)
        kiln_strbuf_printf(t, "%lld", (long long)*(const int64_t *)c->data);
    else if (c->meta.dtype == KILN_DTYPE_FLOAT32)
        kiln_strbuf_put_float(t, *(const float *)c->data);
    else if (kiln_dtype_is_float(c->meta.dtype))
        kiln_strbuf_put_double(t, kiln_tensor_get_double(c, 0));
    else
        kiln_strbuf_printf(t, "%lld", (long long)kiln_tensor_get_double(c, 0));
}

char *kiln_graph_to_string(const kiln_graph *g) {
    kiln_strbuf t = {kiln_malloc(256), 0, 256, false};
    if (!t.buf) return NULL;
    t.buf[0] = '\0';
    kiln_strbuf_printf(&t, "graph");
    put_symbols(&t, g);
    kiln_strbuf_printf(&t, "(");
    for (int32_t i = 0; i < g->ninputs; i++) {
        kiln_strbuf_printf(&t, "%s%%%d: ", i ? ", " : "", g->inputs[i]);
        put_type(&t, g, g->inputs[i]);
    }
    kiln_strbuf_printf(&t, ") {\n");
    for (int32_t c = 0; c < g->ncaptures; c++) {
        const kiln_value *v = &g->values[g->captures[c]];
        kiln_strbuf_printf(&t, "  %%%d: ", g->captures[c]);
        put_type(&t, g, g->captures[c]);
        if (v->constant && v->bound->numel > 0 && is_filled(v->bound, &t.failed)) {
            kiln_strbuf_printf(&t, " = constant(");
            put_value(&t, v->bound);
            kiln_strbuf_printf(&t, ")\n");
        } else
            kiln_strbuf_printf(&t, " = %s\n", v->constant ? "constant" : (v->bound->requires_grad ? "parameter" : "captured"));
    }
    for (int32_t i = 0; i < g->nnodes; i++) {
        const kiln_node *n = &g->nodes[i];
        kiln_strbuf_printf(&t, "  ");
        for (int k = 0; k < n->nout; k++) {
            kiln_strbuf_printf(&t, "%s%%%d: ", k ? ", " : "", n->out[k]);
            put_type(&t, g, n->out[k]);
        }
        kiln_strbuf_printf(&t, " = %s(", kiln_op_table[n->op].name);
        for (int k = 0; k < n->nin; k++) kiln_strbuf_printf(&t, k ? ", %%%d" : "%%%d", n->in[k]);
        kiln_strbuf_printf(&t, ")");
        if (n->attrs.ni || n->attrs.nf) {
            kiln_strbuf_printf(&t, " {");
            for (int k = 0; k < n->attrs.ni; k++) {
                if (k) kiln_strbuf_printf(&t, ", ");
                kiln_sym_print(&t, g->syms, kiln_graph_attr_dim(n, k));
            }
            if (n->attrs.nf) kiln_strbuf_printf(&t, "; "); /* floats follow ";" (alone: "{; 0.5}") */
            for (int k = 0; k < n->attrs.nf; k++) {
                if (k) kiln_strbuf_printf(&t, ", ");
                kiln_strbuf_put_double(&t, n->attrs.f[k]);
            }
            kiln_strbuf_printf(&t, "}");
        }
        if (n->loc >= 0 && n->loc < g->nlocs) kiln_strbuf_printf(&t, "  # %s", g->locs[n->loc]);
        kiln_strbuf_printf(&t, "\n");
    }
    kiln_strbuf_printf(&t, "  return (");
    for (int32_t k = 0; k < g->noutputs; k++) kiln_strbuf_printf(&t, k ? ", %%%d" : "%%%d", g->outputs[k]);
    kiln_strbuf_printf(&t, ")\n}\n");
    for (int32_t k = 0; k < g->nsubgraphs; k++) {
        char *sub = kiln_graph_to_string(g->subgraphs[k]);
        if (!sub) {
            t.failed = true;
            break;
        }
        kiln_strbuf_printf(&t, "subgraph %d: %s", k, sub);
        free(sub);
    }
    if (t.failed) {
        free(t.buf);
        return NULL;
    }
    return t.buf;
}
