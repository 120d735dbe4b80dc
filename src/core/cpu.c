/* The CPU kiln runs on and how its kernels were built (include/kiln/config.h). The vector
 * extensions are listed twice with the same names: those the compiler was allowed to use for
 * kiln's kernels (predefined macros) and those the CPU has (its cpuid bits). */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

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

#if defined(__x86_64__) || defined(__i386__)
static void append(char *buf, size_t size, const char *name) {
    size_t n = strlen(buf);
    snprintf(buf + n, size - n, "%s%s", n ? " " : "", name);
}

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
