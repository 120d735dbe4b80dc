/* Comparing two recordings of one function (kiln.trace's verification) and the facts of a
 * recording that decide whether it may run twice for one call. */
#ifndef KILN_IR_COMPARE_H
#define KILN_IR_COMPARE_H

#include "../core/internal.h"
#include "kiln/graph.h"

typedef enum kiln_graph_diff_kind {
    KILN_DIFF_NONE,
    KILN_DIFF_OP,           /* op #node is another op */
    KILN_DIFF_NUM_INPUTS,   /* op #node has another number of inputs */
    KILN_DIFF_ATTRS,        /* op #node has other attributes */
    KILN_DIFF_EXTERNAL,     /* input `slot` of op #node is captured on one side only */
    KILN_DIFF_CONSTANT,     /* input `slot` of op #node: captured constants of different values */
    KILN_DIFF_CAPTURE_META, /* input `slot` of op #node: captured tensors of another dtype or shape */
    KILN_DIFF_REPLACED,     /* input `slot` of op #node (graph output `slot` when node < 0): a captured
                             * tensor (not a constant) that is another one, or made by the function
                             * with other values (kiln_graph_diff_captured) */
    KILN_DIFF_WIRING,       /* input `slot` of op #node is another value */
    KILN_DIFF_OUTPUT_META,  /* output `slot` of op #node has another dtype or shape */
    KILN_DIFF_MORE_OPS,     /* b ran more ops; op #node is the first one a lacks */
    KILN_DIFF_FEWER_OPS,    /* b ran fewer ops; op #node is the first one b lacks */
    KILN_DIFF_SUBGRAPHS,    /* another number of subgraphs */
    KILN_DIFF_NUM_OUTPUTS,  /* another number of graph outputs */
    KILN_DIFF_OUTPUT,       /* graph output `slot` is another value */
} kiln_graph_diff_kind;

/* The first difference between two graphs a (as recorded) and b (this call). Values are compared
 * by what they are: argument k, capture k (its kind, dtype and shape, and a constant's value bit
 * for bit), output k of op n. */
typedef struct kiln_graph_diff {
    kiln_graph_diff_kind kind;
    const kiln_graph *a, *b; /* where the difference is: the graphs compared or subgraphs of them */
    int32_t subgraph;        /* -1, or the subgraph of the graphs compared that holds a and b */
    int32_t node, slot;
    int32_t value_a, value_b; /* the values involved (EXTERNAL .. WIRING, OUTPUT); else -1 */
} kiln_graph_diff;

/* Compares the ops of a and b (then their subgraphs), in order. True when they differ, with the
 * first difference in *d. */
bool kiln_graph_diff_ops(const kiln_graph *a, const kiln_graph *b, kiln_graph_diff *d);
/* Compares the captures of a and b that are not constants, once kiln_graph_diff_ops found the
 * graphs alike (so capture k of one is capture k of the other): a tensor that existed before the
 * call (a Parameter, a buffer) must be the same tensor -- one replaced by another of the same type
 * (a sub-Cell or Parameter replaced, a dict entry) -- and one the function made while it ran (from
 * NumPy data, a Python value) must hold the same values; else the compiled graph, which reads the
 * recorded tensors, would not give what this call's code computed. (Graph copies, such as a parsed
 * graph and its printed and parsed again self, hold other tensors: not for them.) */
bool kiln_graph_diff_captured(const kiln_graph *a, const kiln_graph *b, kiln_graph_diff *d);
/* Compares the graph outputs of a and b (the values returned). */
bool kiln_graph_diff_outputs(const kiln_graph *a, const kiln_graph *b, kiln_graph_diff *d);
/* A message saying what differs (malloc'd; NULL when out of memory). labels[k] names argument k
 * (graph input k) in messages; "#k" beyond nlabels. */
char *kiln_graph_diff_message(const kiln_graph_diff *d, int nlabels, const char *const *labels);

/* Whether running g has effects a second run for the same call would repeat: in-place writes,
 * draws from the generator, printing and checks (kiln.trace never runs such a graph after the
 * function ran for that call). batch_norm writes its running statistics only in training. */
bool kiln_graph_has_effects(const kiln_graph *g);

/* The first node of g reading value v, or -1. */
int32_t kiln_graph_first_reader(const kiln_graph *g, int32_t v);

#endif
