/* The text form of a plan (kiln_plan_to_string), stable enough for tests to compare:
 *
 *   plan: 3 steps, arena 64 bytes, outputs 24 bytes
 *     0: %3 = mul(%0, %1)  %3 @0 24B last 1
 *     1: %4 = add(%3, %2)  %4 output  frees %3
 *     2: %5 = fused(%4) {subgraph 0}  %5 output
 *
 * Each step names its node's outputs and where each lives: `@offset size last step` in the arena,
 * `view of %r`, `output` (allocated per call), `kept between calls` (a weight cast, weight_casts.c),
 * `per call` (neither planned nor returned); then the
 * planned buffers given back after it. A gradient bucket whose inputs the plan laid out in its own
 * block says `{inputs in place}`. Control-flow steps list their nested plans, indented. */
#include "plan.h"

#include "../core/strbuf.h"
#include "../ir/control.h"

static const char *body_name(kiln_op op, int slot) {
    if (slot == KILN_PLAN_STEP) return "step";
    static const char *const if_names[] = {"then", "else"}, *const loop_names[] = {"cond", "body", "backward"};
    return op == KILN_OP_IF ? (slot < 2 ? if_names[slot] : "?") : (slot < 3 ? loop_names[slot] : "?");
}

static void indent(kiln_strbuf *t, int depth) { kiln_strbuf_printf(t, "%*s", 2 * depth, ""); }

static void value_place(kiln_strbuf *t, const kiln_plan *p, int32_t v) {
    int32_t r = p->root[v];
    const kiln_value *val = &p->g->values[v];
    if (r != v) {
        kiln_strbuf_printf(t, "  %%%d view of %%%d", v, r);
        return;
    }
    if (p->offset[v] >= 0) {
        size_t bytes = (size_t)kiln_meta_numel(&val->meta) * kiln_dtype_size(val->meta.dtype);
        kiln_strbuf_printf(t, "  %%%d @%lld %zuB last %d", v, (long long)p->offset[v], bytes, p->last_use[v]);
        return;
    }
    bool output = false;
    for (int32_t k = 0; k < p->g->noutputs; k++) output |= p->root[p->g->outputs[k]] == v;
    bool kept = val->kind == KILN_VALUE_NODE && kiln_plan_is_weight_cast(p, val->node);
    kiln_strbuf_printf(t, "  %%%d %s", v, output ? "output" : kept ? "kept between calls" : "per call");
}

static void plan_text(kiln_strbuf *t, const kiln_plan *p, int depth) {
    const kiln_graph *g = p->g;
    indent(t, depth);
    kiln_strbuf_printf(t, "plan: %d steps, arena %zu bytes, outputs %zu bytes\n", p->norder, p->arena_bytes,
                       p->output_bytes);
    for (int32_t i = 0; i < p->norder; i++) {
        int32_t node = p->order[i];
        const kiln_node *nd = &g->nodes[node];
        indent(t, depth + 1);
        kiln_strbuf_printf(t, "%d: ", i);
        for (int k = 0; k < nd->nout; k++) kiln_strbuf_printf(t, "%s%%%d", k ? ", " : "", nd->out[k]);
        kiln_strbuf_printf(t, " = %s(", kiln_op_table[nd->op].name);
        for (int k = 0; k < nd->nin; k++) kiln_strbuf_printf(t, "%s%%%d", k ? ", " : "", nd->in[k]);
        kiln_strbuf_printf(t, ")");
        if (nd->op == KILN_OP_FUSED)
            kiln_strbuf_printf(t, " {subgraph %lld}", (long long)nd->attrs.i[KILN_A_FUSED_SUBGRAPH]);
        if (kiln_plan_joins_in_place(p, node)) kiln_strbuf_printf(t, " {inputs in place}");
        for (int k = 0; k < nd->nout; k++) value_place(t, p, nd->out[k]);
        if (p->freed_after[i] && p->freed_after[i][0] >= 0) {
            kiln_strbuf_printf(t, "  frees");
            for (const int32_t *f = p->freed_after[i]; *f >= 0; f++) kiln_strbuf_printf(t, " %%%d", *f);
        }
        kiln_strbuf_printf(t, "\n");
        for (int k = 0; k < KILN_PLAN_BODIES; k++) {
            const kiln_plan *b = kiln_plan_body(p, node, k);
            if (!b) continue;
            indent(t, depth + 2);
            kiln_strbuf_printf(t, "%s:\n", body_name(nd->op, k));
            plan_text(t, b, depth + 3);
        }
    }
}

char *kiln_plan_to_string(const kiln_plan *p) {
    kiln_strbuf t = {0};
    plan_text(&t, p, 0);
    if (t.failed) {
        free(t.buf);
        return NULL;
    }
    return t.buf ? t.buf : kiln_calloc(1, 1);
}
