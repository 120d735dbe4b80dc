/* Bodies: the subgraphs of its graph a node names by attrs — a fused group's subgraph, if's then and
 * else, while's cond and body, while_grad's cond, body and backward body (ops.def: KILN_ATTRS of
 * FUSED, IF, WHILE). Every lookup of a node's body goes through kiln_graph_body (or
 * kiln_graph_body_index), which checks the index against the graph's subgraph count: attrs that name
 * no subgraph give an error, never a read out of range. */
#ifndef KILN_IR_BODY_H
#define KILN_IR_BODY_H

#include "../core/internal.h"
#include "kiln/graph.h"

/* How many bodies a node of op names (fused 1, if and while 2, while_grad 3, other ops 0). */
int kiln_op_nbodies(kiln_op op);
/* The int of op's attrs that names body k (k < kiln_op_nbodies(op)), else -1. */
int kiln_op_body_attr(kiln_op op, int k);

/* The int naming body k in a (checked: KILN_ERR_VALUE when op has no body k or a lacks it). In a
 * graph it is a position in the graph's subgraphs; given to kiln_apply, a registered body's id. */
kiln_status kiln_attrs_body(kiln_op op, const kiln_attrs *a, int k, int64_t *id);

/* The position in g->subgraphs of body k of a node of g with op and attrs a (a node being added
 * need not be in g->nodes yet). KILN_ERR_VALUE naming the op, the body and g's subgraph count when
 * op has no body k, a lacks the int or it names no subgraph of g. */
kiln_status kiln_graph_body_index(const kiln_graph *g, kiln_op op, const kiln_attrs *a, int k, int32_t *index);
/* Body k of node n of g (borrowed from g), checked as kiln_graph_body_index. */
kiln_status kiln_graph_body(const kiln_graph *g, const kiln_node *n, int k, kiln_graph **body);

#endif
