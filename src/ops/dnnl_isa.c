/* KILN_MAX_CPU_ISA caps oneDNN too (include/kiln/config.h): at load, before any primitive is
 * made, its value is handed to dnnl_set_max_cpu_isa, unless ONEDNN_MAX_CPU_ISA (or the older
 * DNNL_MAX_CPU_ISA) is set, which oneDNN reads itself and which then wins. The channel block and
 * the Winograd choice follow from oneDNN's effective ISA (kiln_conv_block_size), and so does
 * whether bf16 products run oneDNN's bf16 primitives (kiln_dnnl_bf16_native, dnnl_lowp.c). */
#include <dnnl.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/config.h"

static const struct {
    const char *name;
    dnnl_cpu_isa_t isa;
} dnnl_caps[] = {
    {"sse41", dnnl_cpu_isa_sse41},
    {"avx", dnnl_cpu_isa_avx},
    {"avx2", dnnl_cpu_isa_avx2},
    {"avx2_vnni", dnnl_cpu_isa_avx2_vnni},
    {"avx512_core", dnnl_cpu_isa_avx512_core},
    {"avx512_core_vnni", dnnl_cpu_isa_avx512_core_vnni},
    {"avx512_core_bf16", dnnl_cpu_isa_avx512_core_bf16},
    {"avx512_core_fp16", dnnl_cpu_isa_avx512_core_bf16}, /* oneDNN 2.x has no fp16 level: the one below */
    {"avx512_core_amx", dnnl_cpu_isa_avx512_core_amx},
};

static void dnnl_isa_cap(void) __attribute__((constructor));
static void dnnl_isa_cap(void) {
    const char *cap = kiln_max_isa_setting(), *own = getenv("ONEDNN_MAX_CPU_ISA"), *old = getenv("DNNL_MAX_CPU_ISA");
    if (!cap || (own && *own) || (old && *old)) return;
    for (size_t k = 0; k < sizeof dnnl_caps / sizeof dnnl_caps[0]; k++)
        if (!strcmp(cap, dnnl_caps[k].name)) {
            dnnl_set_max_cpu_isa(dnnl_caps[k].isa); /* fails only once oneDNN has chosen: nothing to do then */
            return;
        }
}
