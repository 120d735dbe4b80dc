/* Common-subexpression elimination: a node with the same op, the same (already merged) inputs
 * (in either order for commutative ops) and identical attributes as an earlier one reuses that one's outputs; equal small constant
 * captures are merged too. Effects are never merged: in-place writes, random draws, and any
 * node reading or producing a buffer that some node of the graph writes in place. Two graph
 * outputs are never merged into one tensor (the caller may write one of them). */
#include "passes_internal.h"

#include "../core/ptrmap.h"

/* Shared by the passes of this directory (declared where used). */
bool kiln_pass_has_effects(const kiln_node *n);
bool *kiln_pass_written_buffers(const kiln_graph *g);

bool kiln_pass_has_effects(const kiln_node *n) { return kiln_node_has_effects(n); }

/* Whether input k of an effectful node is written in place. */
static bool writes_input(const kiln_node *n, int k) { return kiln_node_writes_input(n, k); }

/* Per value: whether its buffer (its own, or the one it views) is written in place by some node.
 * Views and in-place outputs live in their input's buffer; captures sharing storage share a
 * buffer; graph inputs may alias each other, so they count as one buffer. malloc'd. */
bool *kiln_pass_written_buffers(const kiln_graph *g) {
    size_t n = (size_t)(g->nvalues ? g->nvalues : 1);
    int32_t *root = kiln_malloc(sizeof(int32_t) * n);
    bool *written_root = kiln_calloc(n, sizeof(bool)), *written = kiln_calloc(n, sizeof(bool));
    if (!root || !written_root || !written) {
        free(root), free(written_root), free(written);
        kiln_error(KILN_ERR_MEMORY, "out of memory analysing in-place writes");
        return NULL;
    }
    for (int32_t v = 0; v < g->nvalues; v++) root[v] = v;
    for (int32_t i = 1; i < g->ninputs; i++) root[g->inputs[i]] = g->inputs[0];
    kiln_ptrmap storages = {0}; /* storage -> first capture living in it */
    for (int32_t c = 0; c < g->ncaptures; c++) {
        int32_t v = g->captures[c];
        const void *storage = g->values[v].bound->storage;
        int64_t first = storage ? kiln_ptrmap_get(&storages, storage) : -1;
        if (first >= 0) root[v] = (int32_t)first;
        else if (storage && kiln_ptrmap_put(&storages, storage, v) != KILN_OK) {
            kiln_ptrmap_free(&storages);
            free(root), free(written_root), free(written);
            return NULL;
        }
    }
    kiln_ptrmap_free(&storages);
    for (int32_t i = 0; i < g->nnodes; i++) {
        const kiln_node *nd = &g->nodes[i];
        if (nd->nin > 0 && (kiln_op_table[nd->op].flags & (KILN_OPF_VIEW | KILN_OPF_MUTATES)))
            root[nd->out[0]] = root[nd->in[0]];
        if (kiln_pass_has_effects(nd))
            for (int k = 0; k < nd->nin; k++)
                if (writes_input(nd, k)) written_root[root[nd->in[k]]] = true;
    }
    for (int32_t v = 0; v < g->nvalues; v++) written[v] = written_root[root[v]];
    free(root), free(written_root);
    return written;
}

/* ---- hashing ------------------------------------------------------------------------------ */

static uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h * 0xff51afd7ed558ccdull;
}

static uint64_t hash_bytes(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t k = 0; k < n; k++) h = (h ^ b[k]) * 0x100000001b3ull;
    return h;
}

typedef struct {
    int32_t *slots; /* src node (or value) ids, -1 empty */
    uint64_t mask;
} table;

static kiln_status table_init(table *t, int32_t n) {
    t->slots = NULL;
    t->mask = 0;
    uint64_t size = 16;
    while (size < 2 * (uint64_t)n) size *= 2;
    t->slots = kiln_malloc(sizeof(int32_t) * size);
    if (!t->slots) return kiln_error(KILN_ERR_MEMORY, "out of memory in cse");
    for (uint64_t k = 0; k < size; k++) t->slots[k] = -1;
    t->mask = size - 1;
    return KILN_OK;
}

/* ---- nodes -------------------------------------------------------------------------------- */

/* The node's inputs mapped to dst values, the two of a commutative op in ascending order. */
static int32_t input_of(const kiln_node *n, const int32_t *map, int k) {
    if (n->nin == 2 && (kiln_op_table[n->op].flags & KILN_OPF_COMMUTATIVE)) {
        int32_t a = map[n->in[0]], b = map[n->in[1]];
        return (k == 0) == (a <= b) ? a : b;
    }
    return map[n->in[k]];
}

static uint64_t node_hash(const kiln_node *n, const int32_t *map) {
    uint64_t h = mix(0, (uint64_t)n->op);
    h = mix(h, (uint64_t)n->nin);
    for (int k = 0; k < n->nin; k++) h = mix(h, (uint64_t)input_of(n, map, k));
    h = mix(h, (uint64_t)n->attrs.ni);
    h = mix(h, (uint64_t)n->attrs.nf);
    h = hash_bytes(h, n->attrs.i, sizeof(int64_t) * (size_t)n->attrs.ni);
    return hash_bytes(h, n->attrs.f, sizeof(double) * (size_t)n->attrs.nf);
}

static bool same_node(const kiln_node *a, const kiln_node *b, const int32_t *map) {
    if (a->op != b->op || a->nin != b->nin || a->attrs.ni != b->attrs.ni || a->attrs.nf != b->attrs.nf) return false;
    if (!kiln_node_same_attr_sym(a, b)) return false; /* equal hints of other expressions */
    for (int k = 0; k < a->nin; k++)
        if (input_of(a, map, k) != input_of(b, map, k)) return false;
    return memcmp(a->attrs.i, b->attrs.i, sizeof(int64_t) * (size_t)a->attrs.ni) == 0 &&
           memcmp(a->attrs.f, b->attrs.f, sizeof(double) * (size_t)a->attrs.nf) == 0;
}

/* ---- constants ---------------------------------------------------------------------------- */

#define MAX_MERGED_CONSTANT 65536

static bool mergeable_constant(const kiln_value *v, bool written) {
    return v->constant && !written && kiln_meta_numel(&v->meta) <= MAX_MERGED_CONSTANT;
}

static uint64_t constant_hash(const kiln_value *v) {
    uint64_t h = mix(0, (uint64_t)v->meta.dtype);
    h = hash_bytes(h, v->meta.shape, sizeof(int64_t) * (size_t)v->meta.ndim);
    return hash_bytes(h, v->bound->data, (size_t)v->bound->numel * kiln_dtype_size(v->meta.dtype));
}

static bool same_constant(const kiln_value *a, const kiln_value *b) {
    if (a->meta.dtype != b->meta.dtype || a->meta.ndim != b->meta.ndim) return false;
    for (int d = 0; d < a->meta.ndim; d++)
        if (a->meta.shape[d] != b->meta.shape[d]) return false;
    /* private copies are contiguous */
    return memcmp(a->bound->data, b->bound->data, (size_t)a->bound->numel * kiln_dtype_size(a->meta.dtype)) == 0;
}

/* ---- the pass ----------------------------------------------------------------------------- */

typedef struct {
    const kiln_graph *src;
    kiln_rewriter rw;
    bool *written;   /* per src value */
    bool *is_output; /* per src value: a graph output, or read by a view that is one */
    bool *dst_out;   /* per dst value: a graph output maps to it (sized as src: dst never has more values) */
    int32_t merged;
} cse;

/* Whether mapping src values onto the dst values `to` would alias two graph outputs. */
static bool aliases_outputs(const cse *c, int n, const int32_t *from, const int32_t *to) {
    for (int k = 0; k < n; k++)
        if (c->is_output[from[k]] && c->dst_out[to[k]]) return true;
    return false;
}

static void note_outputs(cse *c, int n, const int32_t *from) {
    for (int k = 0; k < n; k++)
        if (c->is_output[from[k]]) c->dst_out[c->rw.map[from[k]]] = true;
}

static kiln_status merge_constants(cse *c) {
    const kiln_graph *g = c->src;
    table t;
    KILN_TRY(table_init(&t, g->ncaptures));
    for (int32_t k = 0; k < g->ncaptures; k++) {
        int32_t v = g->captures[k];
        const kiln_value *val = &g->values[v];
        note_outputs(c, 1, &v);
        if (!mergeable_constant(val, c->written[v])) continue;
        uint64_t slot = constant_hash(val) & t.mask;
        for (; t.slots[slot] >= 0; slot = (slot + 1) & t.mask) {
            int32_t u = t.slots[slot];
            if (same_constant(&g->values[u], val) && !aliases_outputs(c, 1, &v, &c->rw.map[u])) break;
        }
        if (t.slots[slot] < 0) {
            t.slots[slot] = v;
        } else {
            c->rw.map[v] = c->rw.map[t.slots[slot]];
            note_outputs(c, 1, &v);
            c->merged++;
        }
    }
    free(t.slots);
    return KILN_OK;
}

static bool eligible(const cse *c, const kiln_node *n) {
    if (kiln_pass_has_effects(n)) return false;
    for (int k = 0; k < n->nin; k++)
        if (c->written[n->in[k]]) return false;
    for (int k = 0; k < n->nout; k++)
        if (c->written[n->out[k]]) return false;
    return true;
}

static kiln_status merge_nodes(cse *c) {
    const kiln_graph *g = c->src;
    table t;
    KILN_TRY(table_init(&t, g->nnodes));
    kiln_status s = KILN_OK;
    for (int32_t i = 0; i < g->nnodes && s == KILN_OK; i++) {
        const kiln_node *n = &g->nodes[i];
        uint64_t slot = 0;
        bool merge = false;
        if (eligible(c, n)) {
            slot = node_hash(n, c->rw.map) & t.mask;
            for (; t.slots[slot] >= 0; slot = (slot + 1) & t.mask) {
                const kiln_node *rep = &g->nodes[t.slots[slot]];
                int32_t to[KILN_MAX_OUTPUTS];
                for (int k = 0; k < rep->nout; k++) to[k] = c->rw.map[rep->out[k]];
                if (same_node(rep, n, c->rw.map) && !aliases_outputs(c, n->nout, n->out, to)) {
                    merge = true;
                    break;
                }
            }
        }
        if (merge) {
            const kiln_node *rep = &g->nodes[t.slots[slot]];
            for (int k = 0; k < n->nout; k++) c->rw.map[n->out[k]] = c->rw.map[rep->out[k]];
            c->merged++;
        } else {
            s = kiln_rewriter_copy_node(&c->rw, i);
            if (s == KILN_OK && eligible(c, n)) t.slots[slot] = i;
        }
        if (s == KILN_OK) note_outputs(c, n->nout, n->out);
    }
    free(t.slots);
    return s;
}

kiln_status kiln_pass_cse(const kiln_graph *in, const kiln_pass_options *opt, kiln_graph **out) {
    (void)opt;
    *out = NULL;
    cse c = {.src = in};
    size_t nv = (size_t)(in->nvalues ? in->nvalues : 1);
    c.written = kiln_pass_written_buffers(in);
    c.is_output = kiln_calloc(nv, sizeof(bool));
    c.dst_out = kiln_calloc(nv, sizeof(bool));
    kiln_status s = KILN_OK;
    if (!c.written || !c.is_output || !c.dst_out) s = kiln_error(KILN_ERR_MEMORY, "out of memory in cse");
    for (int32_t k = 0; k < in->noutputs && s == KILN_OK; k++) c.is_output[in->outputs[k]] = true;
    /* a value a view output reads counts as an output: two views of one merged buffer would alias */
    for (int32_t i = in->nnodes - 1; i >= 0 && s == KILN_OK; i--) {
        const kiln_node *n = &in->nodes[i];
        if ((kiln_op_table[n->op].flags & (KILN_OPF_VIEW | KILN_OPF_MUTATES)) && c.is_output[n->out[0]])
            c.is_output[n->in[0]] = true;
    }
    if (s == KILN_OK) s = kiln_rewriter_begin(&c.rw, in);
    if (s == KILN_OK) {
        s = merge_constants(&c);
        if (s == KILN_OK) s = merge_nodes(&c);
        if (s == KILN_OK && c.merged) s = kiln_rewriter_finish(&c.rw, out);
        else kiln_rewriter_abort(&c.rw);
    }
    free(c.written), free(c.is_output), free(c.dst_out);
    return s;
}
