/* Which graph nodes generated C computes (src/codegen/): what the fusion passes may group. Read
 * from the op table (C expressions, row kernels of ops.def) and the nodes' dtypes and shapes. */
#ifndef KILN_IR_FUSION_H
#define KILN_IR_FUSION_H

#include "../core/internal.h"
#include "../ops/rows.h"

#include "kiln/graph.h"

/* Whether generated code can compute node `node` of g: an elementwise op (cast and contiguous
 * included) computing in float32 or float64, or a float full(); inputs of numeric dtypes (16-bit
 * floats too: widened exactly); a cast of float32/float64 to a 16-bit float as its group's root
 * (kiln_node_half_root); or a row op (kiln_node_row_op). */
bool kiln_node_fusable(const kiln_graph *g, int32_t node);
/* Whether node is a cast of a float32/float64 value to bfloat16 or float16: fused only as the root
 * of its group (the one value of a group that is 16-bit), never inside one. */
bool kiln_node_half_root(const kiln_graph *g, int32_t node);
/* Whether node is an op with a row kernel (ops.def: KILN_ROWS) over exactly its input's last axis
 * (of 2 or more elements), in float: an op computed with a reduction over each row. */
bool kiln_node_row_op(const kiln_graph *g, int32_t node);
/* Whether n is a row reduction that drops the reduced axis (no keepdims): its result cannot
 * broadcast back along the rows. */
static inline bool kiln_node_drops_row_axis(const kiln_node *n) {
    return kiln_op_rows[n->op].axis == KILN_ROWS_REDUCE && !kiln_attr_int(&n->attrs, KILN_A_REDUCE_KEEPDIMS, 1);
}
/* The dtype n's C expression computes in: its output's, or for bool-valued ops the promoted
 * dtype of its inputs. */
kiln_dtype kiln_node_compute_dtype(const kiln_graph *g, const kiln_node *n);

#endif
