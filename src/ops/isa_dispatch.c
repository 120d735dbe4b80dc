/* The families of kernels compiled per instruction set (isa_dispatch.h) and the choice among
 * their variants: at start-up from kiln_isa_level, or forced by a test. */
#include "isa_dispatch.h"

#include "../core/internal.h"

extern const kiln_isa_kernel kiln_isa_winograd, kiln_isa_norm_f32, kiln_isa_softmax_f32, kiln_isa_elementwise_f32,
    kiln_isa_attention_f32;

static const kiln_isa_kernel *const families[] = {&kiln_isa_winograd, &kiln_isa_norm_f32, &kiln_isa_softmax_f32,
                                                  &kiln_isa_elementwise_f32, &kiln_isa_attention_f32};
#define NFAMILIES ((int)(sizeof families / sizeof families[0]))

int kiln_isa_kernel_count(void) { return NFAMILIES; }

const kiln_isa_kernel *kiln_isa_kernel_at(int k) { return k >= 0 && k < NFAMILIES ? families[k] : NULL; }

const char *kiln_variant_name(kiln_variant v) {
    static const char *const names[KILN_VARIANT_COUNT] = {"baseline", "avx2", "avx512"};
    return v >= 0 && v < KILN_VARIANT_COUNT ? names[v] : "?";
}

kiln_variant kiln_variant_for(kiln_isa isa) {
    if (!KILN_ISA_VARIANTS) return KILN_VARIANT_BASELINE;
    return isa >= KILN_ISA_AVX512 ? KILN_VARIANT_AVX512 : isa >= KILN_ISA_AVX2 ? KILN_VARIANT_AVX2 : KILN_VARIANT_BASELINE;
}

bool kiln_variant_runs(kiln_variant v) {
    if (v == KILN_VARIANT_BASELINE) return true;
    if (!KILN_ISA_VARIANTS || v < 0 || v >= KILN_VARIANT_COUNT) return false;
    return kiln_cpu_isa_level() >= (v == KILN_VARIANT_AVX512 ? KILN_ISA_AVX512 : KILN_ISA_AVX2);
}

kiln_variant kiln_isa_kernel_chosen(const kiln_isa_kernel *k) {
    for (int v = 0; v < KILN_VARIANT_COUNT; v++)
        if (k->variant[v] && *k->slot == k->variant[v]) return (kiln_variant)v;
    return KILN_VARIANT_BASELINE;
}

static void select_all(kiln_variant v) {
    for (int k = 0; k < NFAMILIES; k++) {
        const kiln_isa_kernel *f = families[k];
        *f->slot = f->variant[v] ? f->variant[v] : f->variant[KILN_VARIANT_BASELINE];
    }
}

kiln_status kiln_isa_select(kiln_variant v) {
    if (v < 0 || v >= KILN_VARIANT_COUNT || !kiln_variant_runs(v))
        return kiln_error(KILN_ERR_VALUE, "kernel variant %s: not compiled or not supported by this CPU (%s)",
                          kiln_variant_name(v), kiln_isa_name(kiln_cpu_isa_level()));
    select_all(v);
    return KILN_OK;
}

void kiln_isa_select_default(void) { select_all(kiln_variant_for(kiln_isa_level())); }

/* at load: every family's pointer starts at its baseline (statically) and moves here */
static void isa_dispatch_init(void) __attribute__((constructor));
static void isa_dispatch_init(void) { kiln_isa_select_default(); }
