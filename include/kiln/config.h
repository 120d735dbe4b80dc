/* kiln — what this build runs on: the build's options, the CPU and its vector extensions, the
 * BLAS and oneDNN libraries and what they chose (kiln.show_config(), `python -m kiln`).
 * Every string is static: valid for the life of the process, not to be freed. */
#ifndef KILN_CONFIG_H
#define KILN_CONFIG_H

#include "kiln.h"

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
