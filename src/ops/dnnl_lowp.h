/* Which reduced-precision arithmetic oneDNN runs on this CPU, for the kernels that hand bf16 or
 * fp16 operands to oneDNN's primitives (convolutions: conv_dnnl.c) instead of converting them to
 * float32 (the fp32-compute fallback). Shared by every kernel with a oneDNN low-precision path. */
#ifndef KILN_OPS_DNNL_LOWP_H
#define KILN_OPS_DNNL_LOWP_H

#include <stdbool.h>

/* Whether bf16 products run oneDNN's bf16 primitives: oneDNN's effective instruction set (the
 * CPU's, capped by KILN_MAX_CPU_ISA or ONEDNN_MAX_CPU_ISA: dnnl_isa.c) has bf16 arithmetic
 * (avx512_core_bf16 or AMX), the bfloat16 GEMM's choice takes the hardware path (gemm_bf16.h:
 * one path for products and convolutions), and kiln_dnnl_bf16_allow has not turned them off. */
bool kiln_dnnl_bf16_native(void);

/* Allows (the default) or forbids the bf16 primitives in this process, returning the previous
 * setting: forbidden, bf16 takes the fp32-compute fallback as on a CPU without bf16 arithmetic
 * (tests and benchmarks compare the two in one process). Not while kernels run. */
bool kiln_dnnl_bf16_allow(bool allow);

/* Whether oneDNN runs fp16 products natively here: never with oneDNN 2.x, whose CPU
 * convolutions and matmuls have no f16 kernels (avx512_core_fp16 arrived in 3.x); true from
 * oneDNN 3 on a CPU with avx512_core_fp16 or AMX-FP16 (not built here: kept false until used). */
bool kiln_dnnl_f16_native(void);

#endif
