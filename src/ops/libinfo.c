/* The libraries behind the heavy kernels, for kiln.show_config (include/kiln/config.h):
 * OpenBLAS's configuration and the kernels it chose for this CPU, oneDNN's version and the
 * instruction set it chose. */
#include <cblas.h>
#include <dnnl.h>
#include <pthread.h>
#include <stdio.h>

#include "kiln/config.h"

const char *kiln_blas_config(void) {
    const char *s = openblas_get_config();
    return s ? s : "";
}

const char *kiln_blas_core(void) {
    const char *s = openblas_get_corename();
    return s ? s : "";
}

static pthread_once_t dnnl_once = PTHREAD_ONCE_INIT;
static char dnnl_version_text[96];

static void dnnl_version_init(void) {
    const dnnl_version_t *v = dnnl_version();
    snprintf(dnnl_version_text, sizeof dnnl_version_text, "%d.%d.%d (%s)", v->major, v->minor, v->patch,
             v->hash ? v->hash : "?");
}

const char *kiln_dnnl_version(void) {
    pthread_once(&dnnl_once, dnnl_version_init);
    return dnnl_version_text;
}

const char *kiln_dnnl_isa(void) {
    /* the values of dnnl_cpu_isa_t that oneDNN 2.x and 3.x both name */
    switch ((int)dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_all: return "all (no limit)";
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "other (a value this build of kiln does not name)";
    }
}
