/* The sizes a backward pass's size-holding node follows (KILN_ATTR_SET_FOLLOW): a gradient rule
 * took them from a forward value's shape, so a rebinding (rebind.c) or a symbolic recording
 * (graph_sym.c) gives the node that value's sizes again. Which value is found by its recorded
 * shape (src/ir/follow.c). */
#ifndef KILN_IR_FOLLOW_H
#define KILN_IR_FOLLOW_H

#include "symbolic.h"

/* The int attributes of n that hold the sizes a FOLLOW set gives: [*first, *first + *count);
 * false for an op whose sizes are not followed this way (slices follow earlier slices). */
bool kiln_follow_span(const kiln_node *n, int *first, int *count);

/* Whether node `node` infers with `sizes` at its span (ctx: the caller's). */
typedef bool (*kiln_follow_fits)(void *ctx, const kiln_sdim *sizes);

/* The sizes for node `node` of orig (the recording) in c (orig rebound or made symbolic up to the
 * node: its values' sizes in c, constants or expressions of c's table): every earlier value of
 * orig whose recorded shape holds the node's recorded sizes votes for its sizes in c (the same
 * sizes; a 1 stays 1; for a reshape also its leading sizes merged, as a linear's gradient
 * flattens them). A size seen at the capture can belong to two values (a sequence length equal
 * to a head dimension): when the votes differ, those with which the node does not infer (`fits`)
 * are dropped. *options: how many different votes are left; out gets vote number `pick` of them
 * (the caller decides what more than one means). KILN_ERR_VALUE "<what>: node N (op) ..." when
 * none votes, or none is left. */
kiln_status kiln_follow_sizes(const kiln_graph *orig, const kiln_graph *c, int32_t node, kiln_follow_fits fits,
                              void *ctx, const char *what, int pick, int *options, kiln_sdim *out);

#endif
