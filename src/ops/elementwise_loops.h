/* The inner loops of the elementwise kernels, for kernels that apply elementwise steps to their
 * own blocks (matmul_epilogue): the same loop on the same values gives the same bits as the
 * op's eager kernel, and so as generated C (src/core/approx_f32.h). Defined in elementwise.c. */
#ifndef KILN_OPS_ELEMENTWISE_LOOPS_H
#define KILN_OPS_ELEMENTWISE_LOOPS_H

#include "../core/internal.h"

/* The loop op's eager kernel runs for float32 (the instruction-set variant chosen now) or
 * float64 operands and result; NULL for an op that is not elementwise, whose result is bool, or
 * another dtype. Called as fn(ctx, n, {out, in0[, in1]}, byte strides): ctx from
 * kiln_elementwise_loop_ctx (ops with attributes read them from it). The output may alias an
 * input exactly. */
kiln_inner_fn kiln_elementwise_loop(kiln_op op, kiln_dtype dtype);

/* A loop's context for an op without float attributes, which is all an epilogue step has. */
extern const void *const kiln_elementwise_no_attrs;

#endif
