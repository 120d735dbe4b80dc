/* The subgraphs nodes name by attrs, looked up with their bounds checked (body.h). */
#include "body.h"

static const char *body_name(kiln_op op, int k) {
    static const char *const control[] = {"cond", "body", "backward"};
    if (op == KILN_OP_FUSED) return "fused group";
    if (op == KILN_OP_IF) return k == 0 ? "then" : "else";
    return k >= 0 && k < 3 ? control[k] : "?";
}

int kiln_op_nbodies(kiln_op op) {
    switch (op) {
    case KILN_OP_FUSED: return 1;
    case KILN_OP_IF:
    case KILN_OP_WHILE: return 2;
    case KILN_OP_WHILE_GRAD: return 3;
    default: return 0;
    }
}

int kiln_op_body_attr(kiln_op op, int k) {
    if (k < 0 || k >= kiln_op_nbodies(op)) return -1;
    switch (op) {
    case KILN_OP_FUSED: return KILN_A_FUSED_SUBGRAPH;
    case KILN_OP_IF: return k == 0 ? KILN_A_IF_THEN : KILN_A_IF_ELSE;
    default:
        return k == 0   ? KILN_A_WHILE_COND
               : k == 1 ? KILN_A_WHILE_BODY
                        : KILN_A_WHILE_BACKWARD;
    }
}

kiln_status kiln_attrs_body(kiln_op op, const kiln_attrs *a, int k, int64_t *id) {
    const char *name = (unsigned)op < KILN_OP_COUNT ? kiln_op_table[op].name : "?";
    int slot = (unsigned)op < KILN_OP_COUNT ? kiln_op_body_attr(op, k) : -1;
    if (slot < 0) return kiln_error(KILN_ERR_VALUE, "%s: has no subgraph %d", name, k);
    if (!a || slot >= a->ni)
        return kiln_error(KILN_ERR_VALUE, "%s: malformed attributes: %d ints, the %s subgraph is named by int %d",
                          name, a ? a->ni : 0, body_name(op, k), slot);
    *id = a->i[slot];
    return KILN_OK;
}

kiln_status kiln_graph_body_index(const kiln_graph *g, kiln_op op, const kiln_attrs *a, int k, int32_t *index) {
    int64_t idx = -1;
    KILN_TRY(kiln_attrs_body(op, a, k, &idx));
    const char *name = kiln_op_table[op].name;
    int32_t count = g ? g->nsubgraphs : 0;
    if (idx < 0 || idx >= count || !g->subgraphs[idx])
        return kiln_error(KILN_ERR_VALUE, "%s names subgraph %lld, which does not exist (its %s subgraph; the graph has %d)",
                          name, (long long)idx, body_name(op, k), count);
    *index = (int32_t)idx;
    return KILN_OK;
}

kiln_status kiln_graph_body(const kiln_graph *g, const kiln_node *n, int k, kiln_graph **body) {
    int32_t idx = -1;
    *body = NULL;
    if (!n) return kiln_error(KILN_ERR_VALUE, "graph body: no node");
    KILN_TRY(kiln_graph_body_index(g, n->op, &n->attrs, k, &idx));
    *body = g->subgraphs[idx];
    return KILN_OK;
}
