/* Kernels compiled once per instruction set and chosen at run time (include/kiln/config.h's
 * kiln_isa_level: the CPU's, capped by KILN_MAX_CPU_ISA).
 *
 * A kernel family's loops are written once; the file that holds them compiles them up to three
 * times: as built (the baseline: the build's flags, -march=native or x86-64-v3), and between
 * KILN_ISA_BEGIN_AVX2 / KILN_ISA_END and KILN_ISA_BEGIN_AVX512 / KILN_ISA_END, which give every
 * function defined in between that target (GCC's `#pragma GCC target`, clang's `#pragma clang
 * attribute`), so helpers defined there are that variant's own. The AVX2 variant excludes AVX-512
 * even where the build's baseline has it (-march=native on an AVX-512 machine). Each variant is
 * a table of function pointers (one struct type per family); a kiln_isa_kernel entry names the
 * family, its variants and the pointer its callers read, which is set at start-up to the variant
 * of the level kiln uses. Code outside the families is the build's own, whatever the level. */
#ifndef KILN_OPS_ISA_DISPATCH_H
#define KILN_OPS_ISA_DISPATCH_H

#include <stdbool.h>

#include "kiln/config.h"

typedef enum kiln_variant {
    KILN_VARIANT_BASELINE = 0, /* as the build compiled it; the only one off x86-64 */
    KILN_VARIANT_AVX2,
    KILN_VARIANT_AVX512,
    KILN_VARIANT_COUNT,
} kiln_variant;

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define KILN_ISA_VARIANTS 1
#define KILN_ISA_STR2(x) #x
#define KILN_ISA_STR(x) KILN_ISA_STR2(x)
#define KILN_ISA_TARGET_AVX2 "avx,avx2,fma,f16c,bmi,bmi2,lzcnt,popcnt,no-avx512f"
#define KILN_ISA_TARGET_AVX512 "avx,avx2,fma,f16c,bmi,bmi2,lzcnt,popcnt,avx512f,avx512bw,avx512dq,avx512vl"
#if defined(__clang__)
#define KILN_ISA_BEGIN(t) \
    _Pragma(KILN_ISA_STR(clang attribute push(__attribute__((target(t))), apply_to = function)))
#define KILN_ISA_END _Pragma("clang attribute pop")
#else
#define KILN_ISA_BEGIN(t) _Pragma("GCC push_options") _Pragma(KILN_ISA_STR(GCC target(t)))
#define KILN_ISA_END _Pragma("GCC pop_options")
#endif
#define KILN_ISA_BEGIN_AVX2 KILN_ISA_BEGIN(KILN_ISA_TARGET_AVX2)
#define KILN_ISA_BEGIN_AVX512 KILN_ISA_BEGIN(KILN_ISA_TARGET_AVX512)
#else
#define KILN_ISA_VARIANTS 0
#endif

typedef struct kiln_isa_kernel {
    const char *name;
    const void **slot;                        /* the variant callers use (a family's table) */
    const void *variant[KILN_VARIANT_COUNT]; /* NULL where not compiled */
} kiln_isa_kernel;

/* In a family's file, after its tables P_baseline, P_avx2 and P_avx512 (the last two only where
 * KILN_ISA_VARIANTS): `static const void *P_chosen`, the table its callers use (set at start-up),
 * and `const kiln_isa_kernel kiln_isa_P`, the family named "P". */
#if KILN_ISA_VARIANTS
#define KILN_ISA_TABLES(P) {&P##_baseline, &P##_avx2, &P##_avx512}
#else
#define KILN_ISA_TABLES(P) {&P##_baseline, NULL, NULL}
#endif
#define KILN_ISA_FAMILY(P)                             \
    static const void *P##_chosen = &P##_baseline; \
    const kiln_isa_kernel kiln_isa_##P = {#P, &P##_chosen, KILN_ISA_TABLES(P)};

/* The dispatched families, listed in isa_dispatch.c; their tables live beside their loops. */
int kiln_isa_kernel_count(void);
const kiln_isa_kernel *kiln_isa_kernel_at(int k);

/* A variant's name ("baseline", "avx2", "avx512"), and the variant the level `isa` runs. */
const char *kiln_variant_name(kiln_variant v);
kiln_variant kiln_variant_for(kiln_isa isa);
/* Whether this CPU can run v and it was compiled. */
bool kiln_variant_runs(kiln_variant v);
/* The variant a family runs now. */
kiln_variant kiln_isa_kernel_chosen(const kiln_isa_kernel *k);

/* For tests: every family runs variant `v` from now on (KILN_ERR_VALUE when the CPU cannot run it
 * or it was not compiled); kiln_isa_select_default goes back to the level's. Not while kernels run. */
kiln_status kiln_isa_select(kiln_variant v);
void kiln_isa_select_default(void);

#endif
