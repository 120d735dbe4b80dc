/* The graph as Graphviz DOT (kiln_graph_to_dot): a box per node labelled with its op, the dtype and
 * shape of its first output and its source line; inputs, captures and outputs as ellipses; a fused
 * group as a cluster of its subgraph's nodes; a control-flow node as a cluster holding the node and
 * one nested cluster per body (drawn with their own parameters). An edge from a node outside a
 * cluster is written outside it: Graphviz puts every node an edge in a cluster names into the
 * cluster, so written inside, the producers of a fused group's inputs would be drawn in its box. */
#include "control.h"

#include "../core/strbuf.h"

typedef char dot_id[24]; /* "d<k>": every DOT node numbered in the order written */

/* label text, escaped for a DOT string ("\n" stays a DOT line break) */
static void put_label(kiln_strbuf *t, const char *s) {
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') kiln_strbuf_printf(t, "\\%c", *s);
        else if (*s == '\n') kiln_strbuf_printf(t, "\\n");
        else kiln_strbuf_printf(t, "%c", *s);
    }
}

static const char *meta_text(const kiln_meta *m, char *buf, size_t size) {
    size_t used = (size_t)snprintf(buf, size, "%s[", kiln_dtype_name(m->dtype));
    for (int d = 0; d < m->ndim && used + 24 < size; d++)
        used += (size_t)snprintf(buf + used, size - used, "%s%lld", d ? "," : "", (long long)m->shape[d]);
    snprintf(buf + used, size - used, "]");
    return buf;
}

static void put_node(kiln_strbuf *t, int depth, const char *id, const char *shape, const char *label) {
    kiln_strbuf_printf(t, "%*s%s [shape=%s, label=\"", 2 * depth, "", id, shape);
    put_label(t, label);
    kiln_strbuf_printf(t, "\"];\n");
}

static void put_edge(kiln_strbuf *t, int depth, const char *from, const char *to) {
    if (from[0]) kiln_strbuf_printf(t, "%*s%s -> %s;\n", 2 * depth, "", from, to);
}

/* Emits g's nodes (ids from *next on); src[v] is the DOT node making value v (inputs' filled in
 * by the caller when given, else drawn here as parameters). Edges from the caller's nodes (outer[v])
 * go to `outside`, written by the caller after the cluster g is drawn in. */
static void emit(kiln_strbuf *t, const kiln_graph *g, int *next, int depth, dot_id *src, const bool *outer,
                 kiln_strbuf *outside, int outside_depth, bool draw_inputs, bool draw_outputs);

static void emit_sub(kiln_strbuf *t, const kiln_graph *sub, int *next, int depth, const dot_id *in, dot_id *out0,
                     kiln_strbuf *outside, bool draw_inputs) {
    dot_id *src = kiln_calloc((size_t)(sub->nvalues ? sub->nvalues : 1), sizeof *src);
    bool *outer = kiln_calloc((size_t)(sub->nvalues ? sub->nvalues : 1), sizeof *outer);
    if (!src || !outer) {
        free(src), free(outer);
        t->failed = true;
        return;
    }
    for (int32_t k = 0; in && k < sub->ninputs; k++) {
        memcpy(src[sub->inputs[k]], in[k], sizeof(dot_id));
        outer[sub->inputs[k]] = true;
    }
    emit(t, sub, next, depth, src, outer, outside, depth - 1, draw_inputs, draw_inputs);
    if (out0 && sub->noutputs > 0) memcpy(*out0, src[sub->outputs[0]], sizeof(dot_id));
    free(src), free(outer);
}

static void emit(kiln_strbuf *t, const kiln_graph *g, int *next, int depth, dot_id *src, const bool *outer,
                 kiln_strbuf *outside, int outside_depth, bool draw_inputs, bool draw_outputs) {
    char label[512], meta[200];
    for (int32_t k = 0; draw_inputs && k < g->ninputs; k++) {
        int32_t v = g->inputs[k];
        snprintf(src[v], sizeof(dot_id), "d%d", (*next)++);
        snprintf(label, sizeof label, "input %d\n%s", k, meta_text(&g->values[v].meta, meta, sizeof meta));
        put_node(t, depth, src[v], "ellipse", label);
    }
    for (int32_t c = 0; c < g->ncaptures; c++) {
        int32_t v = g->captures[c];
        snprintf(src[v], sizeof(dot_id), "d%d", (*next)++);
        snprintf(label, sizeof label, "%s\n%s", g->values[v].constant ? "constant" : "capture",
                 meta_text(&g->values[v].meta, meta, sizeof meta));
        put_node(t, depth, src[v], "ellipse", label);
    }
    for (int32_t i = 0; i < g->nnodes; i++) {
        const kiln_node *nd = &g->nodes[i];
        const char *name = kiln_op_table[nd->op].name, *loc = nd->loc >= 0 ? g->locs[nd->loc] : NULL;
        dot_id id;
        snprintf(id, sizeof id, "d%d", (*next)++);
        const kiln_meta *m0 = nd->nout > 0 ? &g->values[nd->out[0]].meta : NULL;
        snprintf(label, sizeof label, "%s\n%s%s%s", name, m0 ? meta_text(m0, meta, sizeof meta) : "", loc ? "\n" : "",
                 loc ? loc : "");
        kiln_graph *sub;
        if (nd->op == KILN_OP_FUSED && kiln_graph_body(g, nd, 0, &sub) == KILN_OK) {
            dot_id *in = kiln_calloc((size_t)(nd->nin ? nd->nin : 1), sizeof *in), out0 = "";
            if (!in) {
                t->failed = true;
                return;
            }
            for (int k = 0; k < nd->nin; k++) memcpy(in[k], src[nd->in[k]], sizeof(dot_id));
            kiln_strbuf_printf(t, "%*ssubgraph cluster_%s {\n%*slabel=\"fused group%s", 2 * depth, "", id, 2 * depth + 2,
                               "", loc ? " " : "");
            if (loc) put_label(t, loc);
            kiln_strbuf_printf(t, "\"; style=filled; fillcolor=\"#eef3ff\";\n");
            kiln_strbuf edges = {0}; /* into the group from outside it */
            emit_sub(t, sub, next, depth + 1, in, &out0, &edges, false);
            kiln_strbuf_printf(t, "%*s}\n", 2 * depth, "");
            if (edges.failed) t->failed = true;
            else if (edges.len) kiln_strbuf_printf(t, "%s", edges.buf);
            free(edges.buf);
            memcpy(src[nd->out[0]], out0, sizeof(dot_id));
            free(in);
            continue;
        }
        int slots[4], nbodies = kiln_control_slots(nd->op, slots);
        if (nbodies > 0) {
            kiln_strbuf_printf(t, "%*ssubgraph cluster_%s {\n%*slabel=\"%s\"; style=rounded;\n", 2 * depth, "", id,
                               2 * depth + 2, "", name);
            put_node(t, depth + 1, id, "box", label);
            for (int b = 0; b < nbodies; b++) {
                kiln_graph *body;
                if (kiln_graph_body(g, nd, b, &body) != KILN_OK) continue;
                static const char *const if_names[] = {"then", "else"}, *const loop_names[] = {"cond", "body", "backward"};
                kiln_strbuf_printf(t, "%*ssubgraph cluster_%s_b%d {\n%*slabel=\"%s\"; style=dashed;\n", 2 * depth + 2,
                                   "", id, b, 2 * depth + 4, "", nd->op == KILN_OP_IF ? if_names[b & 1] : loop_names[b]);
                emit_sub(t, body, next, depth + 2, NULL, NULL, NULL, true);
                kiln_strbuf_printf(t, "%*s}\n", 2 * depth + 2, "");
            }
            kiln_strbuf_printf(t, "%*s}\n", 2 * depth, "");
        } else {
            put_node(t, depth, id, "box", label);
        }
        for (int k = 0; k < nd->nin; k++) {
            bool from_outside = outer && outside && outer[nd->in[k]];
            put_edge(from_outside ? outside : t, from_outside ? outside_depth : depth, src[nd->in[k]], id);
        }
        for (int k = 0; k < nd->nout; k++) memcpy(src[nd->out[k]], id, sizeof(dot_id));
    }
    for (int32_t k = 0; draw_outputs && k < g->noutputs; k++) {
        dot_id id;
        snprintf(id, sizeof id, "d%d", (*next)++);
        snprintf(label, sizeof label, "output %d", k);
        put_node(t, depth, id, "ellipse", label);
        put_edge(t, depth, src[g->outputs[k]], id);
    }
}

char *kiln_graph_to_dot(const kiln_graph *g) {
    kiln_strbuf t = {0};
    kiln_strbuf_printf(&t, "digraph kiln {\n  node [fontname=\"monospace\", fontsize=10];\n");
    int next = 0;
    emit_sub(&t, g, &next, 1, NULL, NULL, NULL, true);
    kiln_strbuf_printf(&t, "}\n");
    if (t.failed) {
        free(t.buf);
        kiln_error(KILN_ERR_MEMORY, "out of memory writing a graph as DOT");
        return NULL;
    }
    return t.buf;
}
