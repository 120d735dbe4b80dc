/* Static layouts: the strides a graph value will have when the graph runs, as far as the graph
 * alone tells (inputs and captured tensors taken as contiguous). */
#ifndef KILN_IR_LAYOUT_H
#define KILN_IR_LAYOUT_H

#include "../core/internal.h"

#include "kiln/graph.h"

/* Element strides of value v (its own shape) into strides; false when they do not follow from the
 * graph (a reshape of a non-contiguous view, which may be a view or a copy). */
bool kiln_graph_value_strides(const kiln_graph *g, int32_t v, int64_t *strides);

#endif
