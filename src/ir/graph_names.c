/* Names of a graph's values and nodes and the nodes' priorities: what trace.dump keeps of a
 * recording (MegEngine's keep_var_name, keep_param_name, keep_opr_name, keep_opr_priority),
 * carried through the rewrites that rebuild a graph and stored in model files. */
#include "../core/internal.h"

#include "kiln/graph.h"

/* Grows a per-id array (zero-filled) so that index `at` exists. */
static kiln_status reach(void **arr, int32_t *n, size_t item, int32_t at) {
    if (at < *n) return KILN_OK;
    int32_t want = at + 1 > *n * 2 ? at + 1 : *n * 2;
    uint8_t *grown = kiln_realloc(*arr, item * (size_t)want);
    if (!grown) return kiln_error(KILN_ERR_MEMORY, "out of memory naming a graph");
    memset(grown + item * (size_t)*n, 0, item * (size_t)(want - *n));
    *arr = grown;
    *n = want;
    return KILN_OK;
}

static kiln_status set_name(char ***names, int32_t *n, int32_t id, const char *name) {
    if (!name && id >= *n) return KILN_OK;
    KILN_TRY(reach((void **)names, n, sizeof **names, id));
    char *copy = NULL;
    if (name && !(copy = kiln_strdup(name))) return kiln_error(KILN_ERR_MEMORY, "out of memory naming a graph");
    free((*names)[id]);
    (*names)[id] = copy;
    return KILN_OK;
}

kiln_status kiln_graph_set_value_name(kiln_graph *g, int32_t v, const char *name) {
    if (v < 0 || v >= g->nvalues) return kiln_error(KILN_ERR_VALUE, "graph: naming unknown value %d", v);
    return set_name(&g->value_names, &g->nvalue_names, v, name);
}

kiln_status kiln_graph_set_node_name(kiln_graph *g, int32_t n, const char *name) {
    if (n < 0 || n >= g->nnodes) return kiln_error(KILN_ERR_VALUE, "graph: naming unknown node %d", n);
    return set_name(&g->node_names, &g->nnode_names, n, name);
}

kiln_status kiln_graph_set_node_priority(kiln_graph *g, int32_t n, int32_t priority) {
    if (n < 0 || n >= g->nnodes) return kiln_error(KILN_ERR_VALUE, "graph: a priority for unknown node %d", n);
    if (priority < 0) return kiln_error(KILN_ERR_VALUE, "graph: node %d: priority %d is negative", n, priority);
    if (!priority && n >= g->npriorities) return KILN_OK;
    KILN_TRY(reach((void **)&g->priorities, &g->npriorities, sizeof *g->priorities, n));
    g->priorities[n] = priority;
    return KILN_OK;
}

const char *kiln_graph_value_name(const kiln_graph *g, int32_t v) {
    return v >= 0 && v < g->nvalue_names ? g->value_names[v] : NULL;
}
const char *kiln_graph_node_name(const kiln_graph *g, int32_t n) {
    return n >= 0 && n < g->nnode_names ? g->node_names[n] : NULL;
}
int32_t kiln_graph_node_priority(const kiln_graph *g, int32_t n) {
    return n >= 0 && n < g->npriorities ? g->priorities[n] : 0;
}

/* At most this many bytes of an input's name go into a generated node name (whole UTF-8 characters). */
#define QUOTED_NAME_BYTES 256

static int by_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* A name for every unnamed node output; one that a name set before (the user's) already has gets
 * a "'" appended until it is new. */
static kiln_status generate_value_names(kiln_graph *g) {
    const char **taken = kiln_malloc(sizeof *taken * (size_t)(g->nvalue_names ? g->nvalue_names : 1));
    if (!taken) return kiln_error(KILN_ERR_MEMORY, "out of memory naming a graph");
    size_t ntaken = 0;
    for (int32_t v = 0; v < g->nvalue_names; v++)
        if (g->value_names[v]) taken[ntaken++] = g->value_names[v];
    qsort(taken, ntaken, sizeof *taken, by_str);
    char buf[128];
    kiln_status s = KILN_OK;
    for (int32_t i = 0; i < g->nnodes && s == KILN_OK; i++) {
        const kiln_node *n = &g->nodes[i];
        for (int k = 0; k < n->nout && s == KILN_OK; k++) {
            if (kiln_graph_value_name(g, n->out[k])) continue;
            int len = k == 0 ? snprintf(buf, sizeof buf - 8, "%s%d", kiln_op_table[n->op].name, (int)i)
                             : snprintf(buf, sizeof buf - 8, "%s%d:%d", kiln_op_table[n->op].name, (int)i, k);
            const char *key = buf;
            for (int primes = 0; primes < 7 && bsearch(&key, taken, ntaken, sizeof *taken, by_str); primes++)
                buf[len++] = '\'', buf[len] = '\0';
            s = kiln_graph_set_value_name(g, n->out[k], buf);
        }
    }
    free(taken);
    return s;
}

kiln_status kiln_graph_generate_names(kiln_graph *g, bool values, bool nodes, bool priorities) {
    char buf[QUOTED_NAME_BYTES + 128];
    if (values) KILN_TRY(generate_value_names(g));
    for (int32_t i = 0; i < g->nnodes && nodes; i++) {
        const kiln_node *n = &g->nodes[i];
        if (kiln_graph_node_name(g, i)) continue;
        const char *first = n->nin ? kiln_graph_value_name(g, n->in[0]) : NULL;
        if (first) {
            size_t len = strlen(first);
            if (len > QUOTED_NAME_BYTES) {
                len = QUOTED_NAME_BYTES;
                while (len && ((unsigned char)first[len] & 0xc0) == 0x80) len--; /* a whole character */
            }
            snprintf(buf, sizeof buf, "%s(%.*s)[%d]", kiln_op_table[n->op].name, (int)len, first, (int)i);
        } else {
            snprintf(buf, sizeof buf, "%s[%d]", kiln_op_table[n->op].name, (int)i);
        }
        KILN_TRY(kiln_graph_set_node_name(g, i, buf));
    }
    for (int32_t i = 0; i < g->nnodes && priorities; i++)
        if (!kiln_graph_node_priority(g, i)) KILN_TRY(kiln_graph_set_node_priority(g, i, i + 1));
    return KILN_OK;
}

void kiln_graph_clear_names(kiln_graph *g, bool params, bool values, bool nodes, bool priorities) {
    for (int32_t v = 0; v < g->nvalue_names; v++) {
        bool capture = v < g->nvalues && g->values[v].kind == KILN_VALUE_CAPTURED;
        if (capture ? params : values) {
            free(g->value_names[v]);
            g->value_names[v] = NULL;
        }
    }
    for (int32_t n = 0; n < g->nnode_names && nodes; n++) {
        free(g->node_names[n]);
        g->node_names[n] = NULL;
    }
    for (int32_t n = 0; n < g->npriorities && priorities; n++) g->priorities[n] = 0;
}

/* The dst node that stands for src node i: one whose output an output of i maps to, or -1. */
static int32_t mapped_node(const kiln_graph *src, const kiln_graph *dst, const int32_t *map, int32_t i) {
    const kiln_node *n = &src->nodes[i];
    for (int k = 0; k < n->nout; k++) {
        int32_t d = map[n->out[k]];
        if (d >= 0 && d < dst->nvalues && dst->values[d].kind == KILN_VALUE_NODE) return dst->values[d].node;
    }
    return -1;
}

static kiln_status give_node(const kiln_graph *src, kiln_graph *dst, int32_t from, int32_t to) {
    const char *name = kiln_graph_node_name(src, from);
    int32_t priority = kiln_graph_node_priority(src, from);
    if (name && !kiln_graph_node_name(dst, to)) KILN_TRY(kiln_graph_set_node_name(dst, to, name));
    if (priority && !kiln_graph_node_priority(dst, to)) KILN_TRY(kiln_graph_set_node_priority(dst, to, priority));
    return KILN_OK;
}

kiln_status kiln_graph_carry_names(const kiln_graph *src, kiln_graph *dst, const int32_t *map, const int32_t *origin,
                                   int32_t norigin) {
    for (int32_t v = 0; v < src->nvalue_names; v++) {
        const char *name = src->value_names[v];
        int32_t d = v < src->nvalues ? map[v] : -1;
        if (name && d >= 0 && !kiln_graph_value_name(dst, d)) KILN_TRY(kiln_graph_set_value_name(dst, d, name));
    }
    if (!src->nnode_names && !src->npriorities) return KILN_OK;
    bool *given = kiln_calloc((size_t)(src->nnodes ? src->nnodes : 1), sizeof *given); /* each name to one node */
    if (!given) return kiln_error(KILN_ERR_MEMORY, "out of memory naming a graph");
    kiln_status s = KILN_OK;
    for (int32_t d = 0; origin && d < norigin && d < dst->nnodes && s == KILN_OK; d++)
        if (origin[d] > 0 && origin[d] <= src->nnodes && !given[origin[d] - 1] && !kiln_graph_node_name(dst, d)) {
            given[origin[d] - 1] = true;
            s = give_node(src, dst, origin[d] - 1, d);
        }
    for (int32_t i = 0; i < src->nnodes && s == KILN_OK; i++) {
        if (given[i] || (!kiln_graph_node_name(src, i) && !kiln_graph_node_priority(src, i))) continue;
        int32_t d = mapped_node(src, dst, map, i);
        if (d >= 0 && !kiln_graph_node_name(dst, d) && !kiln_graph_node_priority(dst, d)) s = give_node(src, dst, i, d);
    }
    free(given);
    return s;
}

kiln_status kiln_graph_copy_names(const kiln_graph *src, kiln_graph *dst) {
    for (int32_t v = 0; v < src->nvalue_names; v++)
        if (src->value_names[v]) KILN_TRY(kiln_graph_set_value_name(dst, v, src->value_names[v]));
    for (int32_t n = 0; n < src->nnode_names; n++)
        if (src->node_names[n]) KILN_TRY(kiln_graph_set_node_name(dst, n, src->node_names[n]));
    for (int32_t n = 0; n < src->npriorities; n++)
        if (src->priorities[n]) KILN_TRY(kiln_graph_set_node_priority(dst, n, src->priorities[n]));
    return KILN_OK;
}

void kiln_graph_free_names(kiln_graph *g) {
    for (int32_t v = 0; v < g->nvalue_names; v++) free(g->value_names[v]);
    for (int32_t n = 0; n < g->nnode_names; n++) free(g->node_names[n]);
    free(g->value_names), free(g->node_names), free(g->priorities);
    g->value_names = g->node_names = NULL;
    g->priorities = NULL;
    g->nvalue_names = g->nnode_names = g->npriorities = 0;
}
