/* Whole-tensor 16-bit <-> float32 conversions: those of the kernels that compute 16-bit floats in
 * float32 (the fp32-compute fallback of matmul and linear: float16 always, bfloat16 off oneDNN's
 * bf16 path, gemm_bf16.h; softmax and its gradient), operands widened to float32 and results
 * rounded back, and the cast op's; each in one pass over memory split over the OpenMP threads. */
#ifndef KILN_LOWP_PASS_H
#define KILN_LOWP_PASS_H

#include "../core/internal.h"

/* Whether d is float16 or bfloat16. */
bool kiln_lowp_dtype(kiln_dtype d);

/* A float32 copy of the float16 / bfloat16 tensor t (widening is exact). With keep_layout, when
 * t's elements fill one block of memory in any order of its axes (contiguous, or a transposed or
 * permuted view of a contiguous tensor), the copy keeps t's strides: a transposed operand stays one
 * that BLAS takes transposed, as a float32 tensor would be. Without it the copy is contiguous. One
 * parallel pass when t is such a block (contiguous without keep_layout), else kiln_to_contiguous.
 * When t's storage keeps a widened copy (a kept weight cast: kiln_tensor_keep_widened) and t is the
 * whole storage, the pass runs once per version of it: the copy is kept and later calls view it. The
 * result is read only (it may be that kept copy). */
kiln_status kiln_lowp_widen(kiln_tensor *t, bool keep_layout, kiln_tensor **res);

/* out = src converted, float32 -> float16 / bfloat16 (rounded once to nearest even, NaN quieted
 * as kiln_f32_to_bf16) or back (exactly): one parallel pass when both are contiguous and of one
 * shape, else (and for every other pair of dtypes) kiln_copy_into. The kernels' results and the
 * cast op. */
kiln_status kiln_lowp_copy_into(kiln_tensor *out, const kiln_tensor *src);

/* One row of n contiguous 16-bit values widened to float32, and back (rounded): the vectorized
 * rows of src/core/half.c for `half` (float16 or bfloat16). */
void kiln_lowp_widen_row(kiln_dtype half, float *dst, const void *src, int64_t n);
void kiln_lowp_round_row(kiln_dtype half, void *dst, const float *src, int64_t n);

/* The plain references of the two passes: element by element, one thread (tests/c/test_lowp_pass.c). */
void kiln_lowp_widen_ref(kiln_dtype half, float *dst, const void *src, int64_t n);
void kiln_lowp_round_ref(kiln_dtype half, void *dst, const float *src, int64_t n);

#endif
