/* Where a plan's memory goes: the step at which the most planned bytes are live and the buffers
 * live there (kiln.jit's memory_report). */
#include "plan.h"

size_t kiln_plan_value_bytes(const kiln_plan *p, int32_t v) {
    const kiln_meta *m = &p->g->values[v].meta;
    return (size_t)kiln_meta_numel(m) * kiln_dtype_size(m->dtype);
}

static bool live_at(const kiln_plan *p, const int32_t *born, int32_t v, int32_t step) {
    return p->offset[v] >= 0 && p->root[v] == v && born[v] >= 0 && born[v] <= step && step <= p->last_use[v];
}

/* The buffers live at step into vals (by offset; of two in one block, an in-place result and the
 * input whose block it took at that step, the newer), returning their count; *bytes: the arena
 * bytes they cover. */
static int32_t live_set(const kiln_plan *p, const int32_t *born, int32_t step, int32_t *vals, size_t *bytes) {
    int32_t n = 0;
    for (int32_t v = 0; v < p->g->nvalues; v++) {
        if (!live_at(p, born, v, step)) continue;
        int32_t k = n++;
        for (; k > 0 && p->offset[vals[k - 1]] > p->offset[v]; k--) vals[k] = vals[k - 1];
        vals[k] = v;
    }
    int32_t kept = 0;
    int64_t covered_to = 0;
    *bytes = 0;
    for (int32_t k = 0; k < n; k++) {
        int32_t v = vals[k];
        int64_t lo = p->offset[v], hi = lo + (int64_t)kiln_plan_value_bytes(p, v);
        if (kept > 0 && p->offset[vals[kept - 1]] == lo) { /* one block: keep the newer value */
            if (born[v] > born[vals[kept - 1]]) vals[kept - 1] = v;
        } else {
            vals[kept++] = v;
        }
        if (hi > covered_to) *bytes += (size_t)(hi - (lo > covered_to ? lo : covered_to)), covered_to = hi;
    }
    return kept;
}

kiln_status kiln_plan_peak_find(const kiln_plan *p, kiln_plan_peak *out) {
    const kiln_graph *g = p->g;
    *out = (kiln_plan_peak){.step = -1};
    int32_t *born = kiln_malloc(sizeof *born * (size_t)(g->nvalues ? g->nvalues : 1));
    out->producer = kiln_malloc(sizeof *out->producer * (size_t)(g->nvalues ? g->nvalues : 1));
    out->values = kiln_malloc(sizeof *out->values * (size_t)(g->nvalues ? g->nvalues : 1));
    if (!born || !out->producer || !out->values) {
        free(born);
        kiln_plan_peak_free(out);
        return kiln_error(KILN_ERR_MEMORY, "out of memory reporting a plan's memory");
    }
    for (int32_t v = 0; v < g->nvalues; v++) born[v] = -1, out->producer[v] = -1;
    for (int32_t i = 0; i < p->norder; i++) {
        const kiln_node *nd = &g->nodes[p->order[i]];
        for (int k = 0; k < nd->nout; k++) born[nd->out[k]] = i, out->producer[nd->out[k]] = p->order[i];
    }
    for (int32_t i = 0; i < p->norder; i++) {
        size_t live = 0;
        live_set(p, born, i, out->values, &live);
        if (live > out->live_bytes) out->live_bytes = live, out->step = i;
    }
    if (out->step >= 0) out->nvalues = live_set(p, born, out->step, out->values, &out->live_bytes);
    free(born);
    for (int32_t j = 1; j < out->nvalues; j++) { /* largest first; ties in value order */
        int32_t v = out->values[j], k = j;
        for (; k > 0 && (kiln_plan_value_bytes(p, out->values[k - 1]) < kiln_plan_value_bytes(p, v) ||
                         (kiln_plan_value_bytes(p, out->values[k - 1]) == kiln_plan_value_bytes(p, v) &&
                          out->values[k - 1] > v));
             k--)
            out->values[k] = out->values[k - 1];
        out->values[k] = v;
    }
    return KILN_OK;
}

void kiln_plan_peak_free(kiln_plan_peak *peak) {
    free(peak->values), free(peak->producer);
    peak->values = peak->producer = NULL;
}
