/* O2's aggressive fusion: a cheap elementwise op whose result several fusable ops read is copied
 * in front of each of them, so fuse_elementwise computes it inside every consumer's kernel instead
 * of writing it to memory once and reading it back in each. Only ops without math-library calls
 * that read at most one tensor of more than one element are copied (recomputing them costs less
 * than the round trip), at most MAX_USES times, never graph outputs, and never across an in-place
 * write (a copy runs where its consumer runs). An op read only by copied ops is copied once per
 * copy of its readers (chains of such ops). */
#include "../ir/fusion.h"
#include "passes_internal.h"

#define MAX_USES 4

typedef struct {
    const kiln_graph *g;
    int32_t *last_use; /* per value: the last node reading it */
    bool *output;
    bool *copied;      /* per node: copied in front of its consumers instead of kept */
    int32_t *copies;   /* per copied node: how many copies the rewrite makes */
    int32_t *writes_before; /* per node index i: in-place nodes with index < i */
} dup;

static bool worth_copying(dup *d, int32_t i) {
    const kiln_graph *g = d->g;
    const kiln_node *n = &g->nodes[i];
    int32_t v = n->out[0];
    if (n->op == KILN_OP_FULL || n->nout != 1 || d->output[v] || d->last_use[v] < 0) return false;
    if (kiln_op_table[n->op].fusion != KILN_FUSE_ELEMENTWISE || !kiln_node_fusable(g, i) || kiln_op_calls_math(n->op))
        return false;
    int tensors = 0;
    for (int k = 0; k < n->nin; k++) tensors += kiln_meta_numel(&g->values[n->in[k]].meta) > 1;
    if (tensors > 1) return false;
    if (d->writes_before[d->last_use[v] + 1] != d->writes_before[i + 1]) return false;
    int32_t readers = 0; /* the copies of v's readers: one per reader, or as many as it has copies */
    for (int32_t c = i + 1; c <= d->last_use[v]; c++) { /* every reader fuses */
        const kiln_node *cn = &g->nodes[c];
        bool reads = false;
        for (int k = 0; k < cn->nin; k++) reads |= cn->in[k] == v;
        if (!reads) continue;
        if (!kiln_node_fusable(g, c)) return false;
        readers += d->copied[c] ? d->copies[c] : 1;
    }
    d->copies[i] = readers;
    return readers >= 2 && readers <= MAX_USES;
}

/* Emits node i of the source, first a fresh copy of each copied producer it reads. */
static kiln_status emit(const dup *d, kiln_rewriter *rw, int32_t i) {
    const kiln_node *n = &d->g->nodes[i];
    for (int k = 0; k < n->nin; k++) {
        const kiln_value *u = &d->g->values[n->in[k]];
        bool again = false;
        for (int j = 0; j < k; j++) again |= n->in[j] == n->in[k];
        if (u->kind == KILN_VALUE_NODE && d->copied[u->node] && !again) KILN_TRY(emit(d, rw, u->node));
    }
    return kiln_rewriter_copy_node(rw, i);
}

KILN_PASS(duplicate_producers) {
    (void)opt;
    *out = NULL;
    int32_t nn = in->nnodes, nv = in->nvalues;
    dup d = {.g = in};
    d.last_use = kiln_malloc(sizeof(int32_t) * (size_t)(nv ? nv : 1));
    d.output = kiln_calloc((size_t)(nv ? nv : 1), sizeof(bool));
    d.copied = kiln_calloc((size_t)(nn ? nn : 1), sizeof(bool));
    d.copies = kiln_calloc((size_t)(nn ? nn : 1), sizeof(int32_t));
    d.writes_before = kiln_calloc((size_t)nn + 1, sizeof(int32_t));
    kiln_status s = KILN_OK;
    if (!d.last_use || !d.output || !d.copied || !d.copies || !d.writes_before)
        s = kiln_error(KILN_ERR_MEMORY, "out of memory in duplicate_producers");
    int ncopied = 0;
    if (s == KILN_OK) {
        for (int32_t v = 0; v < nv; v++) d.last_use[v] = -1;
        for (int32_t i = 0; i < nn; i++) {
            for (int k = 0; k < in->nodes[i].nin; k++) d.last_use[in->nodes[i].in[k]] = i;
            d.writes_before[i + 1] = d.writes_before[i] + kiln_node_has_effects(&in->nodes[i]);
        }
        for (int32_t k = 0; k < in->noutputs; k++) d.output[in->outputs[k]] = true;
        for (int32_t i = nn - 1; i >= 0; i--) { /* consumers first: a copied op's readers are settled */
            d.copied[i] = worth_copying(&d, i);
            ncopied += d.copied[i];
        }
    }
    if (s == KILN_OK && ncopied) {
        kiln_rewriter rw;
        s = kiln_rewriter_begin(&rw, in);
        for (int32_t i = 0; i < nn && s == KILN_OK; i++)
            if (!d.copied[i]) s = emit(&d, &rw, i);
        if (s == KILN_OK) s = kiln_rewriter_finish(&rw, out);
        else kiln_rewriter_abort(&rw);
    }
    free(d.last_use), free(d.output), free(d.copied), free(d.copies), free(d.writes_before);
    return s;
}
