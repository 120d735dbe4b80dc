/* oneDNN's reduced-precision arithmetic on this CPU (dnnl_lowp.h). */
#include "dnnl_lowp.h"

#include <dnnl.h>

#include "gemm_bf16.h"

static bool bf16_allowed = true;

bool kiln_dnnl_bf16_allow(bool allow) {
    bool prev = bf16_allowed;
    bf16_allowed = allow;
    return prev;
}

bool kiln_dnnl_bf16_native(void) {
    if (!bf16_allowed) return false;
    /* the ISA values are bit sets, each holding the bits of the ones it extends; the effective
     * one already has KILN_MAX_CPU_ISA's cap (dnnl_isa.c sets it at load) */
    unsigned isa = (unsigned)dnnl_get_effective_cpu_isa(), bf16 = (unsigned)dnnl_cpu_isa_avx512_core_bf16;
    /* and the choice the bfloat16 GEMM made (gemm_bf16.h: KILN_BF16_GEMM, the timing, a forced path,
     * set_deterministic): convolutions and products take one path */
    return (isa & bf16) == bf16 && kiln_gemm_bf16_available();
}

bool kiln_dnnl_f16_native(void) { return false; }
