/* kiln — what this build runs on: the build's options, the CPU and its vector extensions, the
 * BLAS and oneDNN libraries and what they chose (kiln.show_config(), `python -m kiln`).
 * Every string is static: valid for the life of the process, not to be freed. */
#ifndef KILN_CONFIG_H
#define KILN_CONFIG_H

#include "kiln/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How the kernels were built: build type, compiler, flags, KILN_NATIVE, OpenMP version. */
KILN_API const char *kiln_build_options(void);
/* The vector extensions the kernels were compiled for (space-separated, e.g. "sse4.2 avx avx2
 * fma"): what they use on every CPU they run on. */
KILN_API const char *kiln_build_isa(void);
/* The CPU's model name ("" when it does not say) and the vector extensions it has, named as
 * kiln_build_isa names them. */
KILN_API const char *kiln_cpu_model(void);
KILN_API const char *kiln_cpu_isa(void);

/* The instruction-set levels kiln's own choices are made between: which compiled variant of a
 * dispatched kernel runs (src/ops/isa_dispatch.h), the -m flags of generated C, and, through
 * oneDNN's cap, the channel block and the Winograd choice. Ordered: each extends the one before. */
typedef enum kiln_isa {
    KILN_ISA_SSE41 = 0,  /* x86-64 below AVX (what is left when the cap is sse41) */
    KILN_ISA_AVX = 1,    /* AVX without AVX2 + FMA */
    KILN_ISA_AVX2 = 2,   /* AVX2 + FMA */
    KILN_ISA_AVX512 = 3, /* AVX-512 F, BW, DQ and VL (oneDNN's avx512_core) */
} kiln_isa;
/* The level kiln uses: the CPU's, capped by the environment variable KILN_MAX_CPU_ISA, read once
 * (case-insensitive: sse41, avx, avx2, avx2_vnni, avx512_core, avx512_core_vnni,
 * avx512_core_bf16, avx512_core_fp16, avx512_core_amx, or default / all for no cap: oneDNN's
 * names for ONEDNN_MAX_CPU_ISA). A value not in that list leaves the CPU's level and makes
 * kiln_max_isa_check fail. */
KILN_API kiln_isa kiln_isa_level(void);
/* The CPU's own level (no cap). */
KILN_API kiln_isa kiln_cpu_isa_level(void);
/* A level's name: "sse41", "avx", "avx2", "avx512_core". */
KILN_API const char *kiln_isa_name(kiln_isa isa);
/* The cap as given, in lower case ("avx2_vnni"), or NULL when KILN_MAX_CPU_ISA is unset, empty,
 * default or all (or not a known name). */
KILN_API const char *kiln_max_isa_setting(void);
/* KILN_OK, or KILN_ERR_VALUE naming the bad value of KILN_MAX_CPU_ISA and the known ones. The
 * Python module refuses to import with such a value. */
KILN_API kiln_status kiln_max_isa_check(void);

/* The BLAS library: its configuration string and the kernels it chose for this CPU. */
KILN_API const char *kiln_blas_config(void);
KILN_API const char *kiln_blas_core(void);
/* oneDNN: its version ("major.minor.patch (commit)") and the instruction set it chose for this
 * CPU (dnnl_get_effective_cpu_isa, e.g. "avx2" or "avx512_core"; ONEDNN_MAX_CPU_ISA caps it). */
KILN_API const char *kiln_dnnl_version(void);
KILN_API const char *kiln_dnnl_isa(void);

#ifdef __cplusplus
}
#endif
#endif
