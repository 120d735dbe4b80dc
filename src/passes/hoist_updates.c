/* In-place updates as early as they can run: a training step's optimizer writes each parameter
 * after every gradient is computed, which keeps all the gradients alive together. Moved to just
 * after the last node it depends on (its inputs, and every earlier node reading or writing a buffer
 * it writes, or writing a buffer it reads), an update frees its gradient while the backward goes
 * on. Nothing that reads the buffers involved changes sides of the write, so results are the
 * same. Random ops, effects and control flow stay where they are. */
#include "../ir/control.h"
#include "passes_internal.h"

#include "kiln/sublinear.h"

static bool movable(const kiln_node *n) {
    uint64_t f = kiln_op_table[n->op].flags;
    return (f & (KILN_OPF_MUTATES | KILN_OPF_WRITES_ANY)) && !(f & (KILN_OPF_RANDOM | KILN_OPF_EFFECT)) &&
           !kiln_op_is_control(n->op);
}

typedef struct {
    int32_t anchor, node;
    bool moved;
} slot;

static int by_slot(const void *a, const void *b) {
    const slot *x = a, *y = b;
    if (x->anchor != y->anchor) return x->anchor < y->anchor ? -1 : 1;
    if (x->moved != y->moved) return x->moved ? 1 : -1;
    return (x->node > y->node) - (x->node < y->node);
}

kiln_status kiln_hoist_updates(const kiln_graph *g, kiln_graph **out) {
    *out = NULL;
    int32_t nn = g->nnodes, nv = g->nvalues;
    int32_t *root = kiln_malloc(sizeof(int32_t) * (size_t)(nv ? nv : 1));
    slot *s = kiln_malloc(sizeof(slot) * (size_t)(nn ? nn : 1));
    if (!root || !s) {
        free(root), free(s);
        return kiln_error(KILN_ERR_MEMORY, "out of memory ordering updates");
    }
    kiln_value_roots(g, root);
    bool moved_any = false;
    for (int32_t i = 0; i < nn; i++) {
        const kiln_node *m = &g->nodes[i];
        s[i] = (slot){i, i, false};
        if (!movable(m)) continue;
        int32_t a = -1;
        for (int k = 0; k < m->nin; k++) {
            const kiln_value *v = &g->values[m->in[k]];
            if (v->kind == KILN_VALUE_NODE && s[v->node].anchor > a) a = s[v->node].anchor;
        }
        for (int32_t j = i - 1; j > a; j--) { /* the last earlier node touching what m writes or writing what m reads */
            const kiln_node *o = &g->nodes[j];
            bool conflict = false;
            for (int k = 0; k < m->nin && !conflict; k++)
                for (int q = 0; q < o->nin && !conflict; q++) {
                    bool same = root[m->in[k]] == root[o->in[q]];
                    conflict = same && (kiln_node_writes_buffer(m, k) || kiln_node_writes_buffer(o, q));
                }
            if (conflict && s[j].anchor > a) a = s[j].anchor;
        }
        if (a < i - 1) {
            s[i].anchor = a;
            s[i].moved = true;
            moved_any = true;
        }
    }
    free(root);
    if (!moved_any) {
        free(s);
        return KILN_OK;
    }
    qsort(s, (size_t)nn, sizeof *s, by_slot);
    kiln_rewriter rw;
    kiln_status st = kiln_rewriter_begin(&rw, g);
    for (int32_t k = 0; k < nn && st == KILN_OK; k++) st = kiln_rewriter_copy_node(&rw, s[k].node);
    free(s);
    if (st == KILN_OK) return kiln_rewriter_finish(&rw, out);
    kiln_rewriter_abort(&rw);
    return st;
}
