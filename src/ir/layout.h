/* Static layouts: the strides a graph value will have when the graph runs, as far as the graph
 * alone tells (inputs and captured tensors taken as contiguous). */
#ifndef KILN_IR_LAYOUT_H
#define KILN_IR_LAYOUT_H

#include "../core/internal.h"

#include "kiln/graph.h"

/* Element strides of value v (its own shape) into strides; true (views follow their kernels' rule,
 * kiln_view_strides, so a reshape of a non-contiguous view is known to be a view or a copy). */
bool kiln_graph_value_strides(const kiln_graph *g, int32_t v, int64_t *strides);

#endif
