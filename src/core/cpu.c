/* The CPU kiln runs on and how its kernels were built (include/kiln/config.h). The vector
 * extensions are listed twice with the same names: those the compiler was allowed to use for
 * kiln's kernels (predefined macros) and those the CPU has (its cpuid bits). Also the
 * instruction-set level kiln uses: the CPU's, capped by KILN_MAX_CPU_ISA. */
#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "kiln/config.h"
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#ifndef KILN_BUILD_TYPE
#define KILN_BUILD_TYPE "unknown"
#endif
#ifndef KILN_BUILD_FLAGS
#define KILN_BUILD_FLAGS "unknown"
#endif

#define STR2(x) #x
#define STR(x) STR2(x)

const char *kiln_build_options(void) {
    return KILN_BUILD_TYPE ", " KILN_BUILD_FLAGS
#ifdef KILN_BUILD_NATIVE
           ", KILN_NATIVE=ON"
#else
           ", KILN_NATIVE=OFF"
#endif
#if defined(__clang__)
           ", clang " __clang_version__
#elif defined(__GNUC__)
           ", gcc " __VERSION__
#endif
#ifdef _OPENMP
           ", OpenMP " STR(_OPENMP)
#endif
        ;
}

const char *kiln_build_isa(void) {
    static const char isa[] = ""
#ifdef __SSE4_2__
           " sse4.2"
#endif
#ifdef __AVX__
           " avx"
#endif
#ifdef __AVX2__
           " avx2"
#endif
#ifdef __FMA__
           " fma"
#endif
#ifdef __F16C__
           " f16c"
#endif
#ifdef __AVX512F__
           " avx512f"
#endif
#ifdef __AVX512DQ__
           " avx512dq"
#endif
#ifdef __AVX512BW__
           " avx512bw"
#endif
#ifdef __AVX512VL__
           " avx512vl"
#endif
#ifdef __AVX512VNNI__
           " avx512vnni"
#endif
#ifdef __AVX512BF16__
           " avx512bf16"
#endif
        ;
    return isa[0] ? isa + 1 : isa; /* without the leading blank */
}

static pthread_once_t cpu_once = PTHREAD_ONCE_INIT;
static char cpu_model[64], cpu_isa[160];
static kiln_isa cpu_level = KILN_ISA_SSE41;

static void append(char *buf, size_t size, const char *name) {
    size_t n = strlen(buf);
    snprintf(buf + n, size - n, "%s%s", n ? " " : "", name);
}

#if defined(__x86_64__) || defined(__i386__)

static void cpu_init(void) {
    unsigned regs[12];
    if ((unsigned)__get_cpuid_max(0x80000000u, NULL) >= 0x80000004u) { /* int in clang's cpuid.h */
        for (unsigned k = 0; k < 3; k++)
            __get_cpuid(0x80000002u + k, &regs[4 * k], &regs[4 * k + 1], &regs[4 * k + 2], &regs[4 * k + 3]);
        memcpy(cpu_model, regs, sizeof regs);
        cpu_model[sizeof regs] = '\0';
        /* trim the blanks some CPUs pad their name with */
        size_t start = strspn(cpu_model, " "), n = strlen(cpu_model);
        while (n > start && cpu_model[n - 1] == ' ') n--;
        memmove(cpu_model, cpu_model + start, n - start);
        cpu_model[n - start] = '\0';
    }
    __builtin_cpu_init();
    /* __builtin_cpu_supports needs literal names: one line each */
    if (__builtin_cpu_supports("sse4.2")) append(cpu_isa, sizeof cpu_isa, "sse4.2");
    if (__builtin_cpu_supports("avx")) append(cpu_isa, sizeof cpu_isa, "avx");
    if (__builtin_cpu_supports("avx2")) append(cpu_isa, sizeof cpu_isa, "avx2");
    if (__builtin_cpu_supports("fma")) append(cpu_isa, sizeof cpu_isa, "fma");
    unsigned a, b, c, d; /* f16c: CPUID.1:ECX bit 29 (clang 14's __builtin_cpu_supports has no "f16c") */
    if (__get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29))) append(cpu_isa, sizeof cpu_isa, "f16c");
    if (__builtin_cpu_supports("avx512f")) append(cpu_isa, sizeof cpu_isa, "avx512f");
    if (__builtin_cpu_supports("avx512dq")) append(cpu_isa, sizeof cpu_isa, "avx512dq");
    if (__builtin_cpu_supports("avx512bw")) append(cpu_isa, sizeof cpu_isa, "avx512bw");
    if (__builtin_cpu_supports("avx512vl")) append(cpu_isa, sizeof cpu_isa, "avx512vl");
    if (__builtin_cpu_supports("avx512vnni")) append(cpu_isa, sizeof cpu_isa, "avx512vnni");
    if (__builtin_cpu_supports("avx512bf16")) append(cpu_isa, sizeof cpu_isa, "avx512bf16");
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
        cpu_level = KILN_ISA_AVX512;
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        cpu_level = KILN_ISA_AVX2;
    else if (__builtin_cpu_supports("avx"))
        cpu_level = KILN_ISA_AVX;
}
#else
static void cpu_init(void) {}
#endif

const char *kiln_cpu_model(void) {
    pthread_once(&cpu_once, cpu_init);
    return cpu_model;
}

const char *kiln_cpu_isa(void) {
    pthread_once(&cpu_once, cpu_init);
    return cpu_isa;
}

kiln_isa kiln_cpu_isa_level(void) {
    pthread_once(&cpu_once, cpu_init);
    return cpu_level;
}

/* ---- KILN_MAX_CPU_ISA ------------------------------------------------------------------------- */

/* oneDNN's names (ONEDNN_MAX_CPU_ISA), each with the kiln level it caps to */
static const struct {
    const char *name;
    kiln_isa level;
} isa_caps[] = {
    {"sse41", KILN_ISA_SSE41},
    {"avx", KILN_ISA_AVX},
    {"avx2", KILN_ISA_AVX2},
    {"avx2_vnni", KILN_ISA_AVX2},
    {"avx512_core", KILN_ISA_AVX512},
    {"avx512_core_vnni", KILN_ISA_AVX512},
    {"avx512_core_bf16", KILN_ISA_AVX512},
    {"avx512_core_fp16", KILN_ISA_AVX512},
    {"avx512_core_amx", KILN_ISA_AVX512},
};
#define NCAPS ((int)(sizeof isa_caps / sizeof isa_caps[0]))

static pthread_once_t cap_once = PTHREAD_ONCE_INIT;
static int cap_index = -1;    /* into isa_caps; -1: no cap */
static char cap_bad[64];      /* the value when it is no known name */

static void cap_init(void) {
    const char *v = getenv("KILN_MAX_CPU_ISA");
    if (!v || !*v) return;
    char low[64];
    size_t n = 0;
    for (; v[n] && n < sizeof low - 1; n++) low[n] = (char)tolower((unsigned char)v[n]);
    low[n] = '\0';
    if (!v[n]) {
        if (!strcmp(low, "default") || !strcmp(low, "all")) return;
        for (int k = 0; k < NCAPS; k++)
            if (!strcmp(low, isa_caps[k].name)) {
                cap_index = k;
                return;
            }
    }
    snprintf(cap_bad, sizeof cap_bad, "%s", v);
}

kiln_isa kiln_isa_level(void) {
    pthread_once(&cap_once, cap_init);
    kiln_isa cpu = kiln_cpu_isa_level();
    return cap_index >= 0 && isa_caps[cap_index].level < cpu ? isa_caps[cap_index].level : cpu;
}

const char *kiln_max_isa_setting(void) {
    pthread_once(&cap_once, cap_init);
    return cap_index >= 0 ? isa_caps[cap_index].name : NULL;
}

kiln_status kiln_max_isa_check(void) {
    pthread_once(&cap_once, cap_init);
    if (!cap_bad[0]) return KILN_OK;
    char known[256] = "";
    for (int k = 0; k < NCAPS; k++) append(known, sizeof known, isa_caps[k].name);
    return kiln_error(KILN_ERR_VALUE, "KILN_MAX_CPU_ISA=%s: not an instruction set kiln knows (%s, default, all)",
                      cap_bad, known);
}

const char *kiln_isa_name(kiln_isa isa) {
    switch (isa) {
    case KILN_ISA_AVX: return "avx";
    case KILN_ISA_AVX2: return "avx2";
    case KILN_ISA_AVX512: return "avx512_core";
    default: return "sse41";
    }
}
