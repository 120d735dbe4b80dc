/* The bfloat16 GEMM of src/ops: bfloat16 operands, float32 accumulation, the result rounded once
 * to bfloat16 (or kept in float32). Where oneDNN's effective instruction set has bfloat16
 * arithmetic (avx512_core_bf16 or AMX; KILN_MAX_CPU_ISA and ONEDNN_MAX_CPU_ISA cap it, see
 * dnnl_isa.c) it runs a oneDNN matmul primitive, made once per shape and layout and kept in a
 * bounded cache; elsewhere the callers keep the fp32-compute fallback (operands widened to float32,
 * kiln_sgemm, the result rounded once). float16 has no such path: oneDNN 2.6 makes no f16 matmul
 * on CPUs (avx512_core_fp16 included), so float16 products always take the fallback.
 *
 * Like kiln_sgemm, a call runs on the calling thread alone (the callers split their GEMMs over
 * kiln's OpenMP threads), so its result depends only on the product, never on the thread count. */
#ifndef KILN_GEMM_BF16_H
#define KILN_GEMM_BF16_H

#include <stdbool.h>
#include <stdint.h>

#include "kiln/core.h"

/* Whether this CPU and oneDNN's cap give the hardware path (decided once, at the first call), and
 * whether bfloat16 products take it now: the hardware path, chosen (or forced). The
 * choice (once per process, at the first bfloat16 product): the environment variable
 * KILN_BF16_GEMM=onednn or =fallback, else (auto) whichever of the two ran faster on one 512^3
 * product, single-threaded (oneDNN 2.6's bfloat16 matmul is not faster than float32 everywhere). */
bool kiln_gemm_bf16_hardware(void);
bool kiln_gemm_bf16_available(void);
/* Overrides the choice process-wide: 1 the hardware path (where it exists), 0 the fallback, -1
 * back to the choice (tests and benchmarks compare the two in one process). Not while kernels run. */
void kiln_gemm_bf16_force(int how);
/* "oneDNN avx512_core_bf16" / "oneDNN avx512_core_amx" while products take the hardware path, else NULL. */
const char *kiln_gemm_bf16_path(void);
/* How the choice was made (a sentence: the measurement, the environment variable or why there is
 * no hardware path). */
const char *kiln_gemm_bf16_why(void);

/* C (M x N, row stride ldc; float32 when c_f32, else bfloat16) = A @ B (+ bias when not NULL: N
 * bfloat16 values added to every row before the rounding), A (M x K) and B (K x N) bfloat16 with
 * element strides (rs, cs) of which one is 1 (a row- or column-major matrix, as BLAS takes it).
 * Sums in float32, rounds once. On the hardware path only (kiln_gemm_bf16_available); a shape
 * oneDNN refuses or would run with its reference implementation runs the fp32-compute way. */
void kiln_gemm_bf16(int64_t M, int64_t N, int64_t K, const uint16_t *A, int64_t ars, int64_t acs, const uint16_t *B,
                    int64_t brs, int64_t bcs, const uint16_t *bias, void *C, bool c_f32, int64_t ldc);
/* The same as plain loops (any strides): the reference, and the path of tiny products. */
void kiln_gemm_bf16_ref(int64_t M, int64_t N, int64_t K, const uint16_t *A, int64_t ars, int64_t acs,
                        const uint16_t *B, int64_t brs, int64_t bcs, const uint16_t *bias, void *C, bool c_f32,
                        int64_t ldc);

/* How many products kiln_gemm_bf16 ran through oneDNN's primitives in this process (tests check
 * that the hardware path ran), and how many primitives the cache holds now. */
int64_t kiln_gemm_bf16_calls(void);
int kiln_gemm_bf16_cached(void);

/* The best GFLOP/s of oneDNN's bfloat16 matmul (bf16 x bf16 -> bf16, float32 accumulation) on an
 * M x N x K NoTrans product of random operands on `threads` threads of its own, over `rounds`
 * timings of at least `min_seconds` each after one warm-up call: the bf16 GEMM peak kiln.bench and
 * bench/bench_amp.py print. KILN_ERR_VALUE on bad arguments or without the hardware path. */
kiln_status kiln_gemm_bf16_rate(int64_t M, int64_t N, int64_t K, int threads, int rounds, double min_seconds,
                                double *gflops);

#endif
