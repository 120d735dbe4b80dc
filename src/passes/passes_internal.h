/* The passes of src/passes/, listed by pipeline.c. */
#ifndef KILN_PASSES_INTERNAL_H
#define KILN_PASSES_INTERNAL_H

#include "../core/internal.h"
#include "../ir/symbolic.h"
#include "kiln/passes.h"
#include "kiln/sublinear.h"

/* Nodes whose order and count matter (KILN_OPF_SIDE_EFFECTS). */
static inline bool kiln_node_has_effects(const kiln_node *n) { return kiln_op_has_side_effects(n->op); }

/* Whether n writes its input k in place. */
static inline bool kiln_node_writes_input(const kiln_node *n, int k) {
    return k < 8 && (kiln_op_table[n->op].flags & KILN_OPF_WRITES_INPUT(k));
}

/* Whether n writes the buffer of its input k (in place, or as the op's mutated input 0). */
static inline bool kiln_node_writes_buffer(const kiln_node *n, int k) {
    return kiln_node_writes_input(n, k) || (k == 0 && (kiln_op_table[n->op].flags & KILN_OPF_MUTATES));
}

/* Per value: the value whose buffer it lives in (itself, or the root of input 0 of the view or
 * in-place op making it), as the planner counts buffers. */
void kiln_value_roots(const kiln_graph *g, int32_t *root);

/* Carries a Cell.recompute() mark over to the node a pass just added in place of marked ones. */
static inline kiln_status kiln_keep_recompute_mark(kiln_status s, kiln_graph *dst, int32_t recompute) {
    if (s == KILN_OK && dst->nnodes > 0) dst->nodes[dst->nnodes - 1].recompute = recompute;
    return s;
}

#define KILN_PASS(name) \
    kiln_status kiln_pass_##name(const kiln_graph *in, const kiln_pass_options *opt, kiln_graph **out)

KILN_PASS(dce);
KILN_PASS(hoist_loop_projections);
KILN_PASS(cse);
KILN_PASS(constant_fold);
KILN_PASS(simplify);
KILN_PASS(join_slice_writes);
KILN_PASS(fuse_elementwise);
KILN_PASS(fuse_matmul_epilogue);
KILN_PASS(duplicate_producers);
KILN_PASS(fold_batch_norm);
KILN_PASS(decompose_batch_norm);
KILN_PASS(fuse_conv_epilogue);
KILN_PASS(channels_last);
KILN_PASS(fuse_bn_relu_backward);
KILN_PASS(conv_algorithm);
KILN_PASS(fuse_attention);
KILN_PASS(bucket_all_reduce);

#endif
