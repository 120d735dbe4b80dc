/* The in-register arithmetic peak of one core: vdpbf16ps zmm (AVX512_BF16: 32 bfloat16 products
 * added pairwise into 16 float32 sums, 32 multiply-adds per instruction) against vfmadd231ps zmm
 * (AVX-512F: 16 float32 multiply-adds) and, where the CPU has AVX512_FP16, vfmadd231ph zmm (32
 * float16 multiply-adds). Each loop keeps ACCS independent accumulators in registers, enough to
 * hide the instructions' latency (4-6 cycles) on two issue ports, and touches no memory, so it
 * measures what the execution units can do and nothing else: the bound no GEMM can beat.
 *
 * Output: "clock_ghz <GHz>" (clock_ghz below), then one line per instruction: "<name>
 * <multiply-adds per ns> <ns per instruction>", or "<name> absent (<why>)" where the CPU (cpuid, and the OS's saved AVX-512 state, xgetbv) lacks
 * the instruction set. Built by CMake (target bench_bf16_peak, x86-64 only), run by
 * bench/bench_bf16_peak.py, which prints the ratios. Each kernel is compiled for its own
 * instruction set by a target attribute, and only called after the run-time check.
 *
 *   build/bench_bf16_peak [seconds per measurement, default 0.3] */
#define _POSIX_C_SOURCE 200809L /* clock_gettime under -std=c11 */
#include <cpuid.h>
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* float16 arithmetic needs a compiler whose headers have AVX512_FP16 intrinsics under a target
 * attribute (gcc 12; clang 14 declares them only with -mavx512fp16 on the whole file) */
#if !defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 12
#define HAVE_FP16_KERNEL 1
#endif

#define ACCS 16      /* independent accumulators: latency x ports (5 x 2) with room to spare */
#define INNER 256    /* instructions per accumulator between two checks of the clock */

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* ---- run-time instruction-set checks ------------------------------------------------------- */

static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

/* AVX-512 usable: the CPU has AVX512F and the OS saves its state (XCR0 bits 1, 2, 5, 6, 7). */
static int has_avx512f(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return 0; /* OSXSAVE */
    if ((xgetbv0() & 0xE6) != 0xE6) return 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    return (b >> 16) & 1; /* AVX512F */
}

static int has_avx512bf16(void) {
    unsigned a, b, c, d;
    if (!has_avx512f() || !__get_cpuid_count(7, 1, &a, &b, &c, &d)) return 0;
    return (a >> 5) & 1; /* CPUID.(7,1):EAX[5] AVX512_BF16 */
}

#ifdef HAVE_FP16_KERNEL
static int has_avx512fp16(void) {
    unsigned a, b, c, d;
    if (!has_avx512f() || !__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    return (d >> 23) & 1; /* CPUID.(7,0):EDX[23] AVX512_FP16 */
}
#endif

/* ---- the kernels: `rounds` x INNER x ACCS instructions; returns a sum so nothing is dropped ---- */

/* Sixteen accumulators as sixteen variables (an array would live in memory), the same operation
 * on each (OP(acc, a, b)); each round ends with an empty asm that claims to read and write every
 * accumulator in a register, so the compiler can neither merge the chains nor drop them. */
#define KEEP(v) __asm__ volatile("" : "+v"(v))
#define EACH(F) F(0) F(1) F(2) F(3) F(4) F(5) F(6) F(7) F(8) F(9) F(10) F(11) F(12) F(13) F(14) F(15)
#define KERNEL_BODY(T, SETK, OP, ADD, REDUCE)                                    \
    T acc0 = SETK(0), acc1 = SETK(1), acc2 = SETK(2), acc3 = SETK(3), acc4 = SETK(4), acc5 = SETK(5), \
      acc6 = SETK(6), acc7 = SETK(7), acc8 = SETK(8), acc9 = SETK(9), acc10 = SETK(10), acc11 = SETK(11), \
      acc12 = SETK(12), acc13 = SETK(13), acc14 = SETK(14), acc15 = SETK(15);                 \
    for (int64_t r = 0; r < rounds; r++) {                                                 \
        for (int i = 0; i < INNER; i++) {                                                  \
            EACH(STEP_##OP)                                                                \
        }                                                                                  \
        EACH(KEEP_ONE)                                                                     \
    }                                                                                      \
    T s_ = ADD(ADD(ADD(ADD(acc0, acc1), ADD(acc2, acc3)), ADD(ADD(acc4, acc5), ADD(acc6, acc7))), \
               ADD(ADD(ADD(acc8, acc9), ADD(acc10, acc11)), ADD(ADD(acc12, acc13), ADD(acc14, acc15)))); \
    return (float)REDUCE(s_);
#define KEEP_ONE(k) KEEP(acc##k);
#define STEP_DPBF16(k) acc##k = _mm512_dpbf16_ps(acc##k, a, b);
#define STEP_FMAPS(k) acc##k = _mm512_fmadd_ps(a, b, acc##k);
#define STEP_FMAPH(k) acc##k = _mm512_fmadd_ph(a, b, acc##k);
#define SET_PS(k) _mm512_set1_ps((float)(k) * 1e-3f)

__attribute__((target("avx512f,avx512bf16"))) static float run_dpbf16(int64_t rounds) {
    __m512bh a = (__m512bh)_mm512_set1_epi16(0x3F80); /* bfloat16 1.0 */
    __m512bh b = (__m512bh)_mm512_set1_epi16(0x3800); /* bfloat16 2^-15: the sums stay finite */
    KERNEL_BODY(__m512, SET_PS, DPBF16, _mm512_add_ps, _mm512_reduce_add_ps)
}

__attribute__((target("avx512f,fma"))) static float run_fmaps(int64_t rounds) {
    __m512 a = _mm512_set1_ps(1.0f), b = _mm512_set1_ps(0x1p-15f);
    KERNEL_BODY(__m512, SET_PS, FMAPS, _mm512_add_ps, _mm512_reduce_add_ps)
}

#ifdef HAVE_FP16_KERNEL
#define SET_PH(k) _mm512_castsi512_ph(_mm512_set1_epi16((short)(0x1000 + (k))))
__attribute__((target("avx512f,avx512fp16"))) static float run_fmaph(int64_t rounds) {
    __m512h a = _mm512_castsi512_ph(_mm512_set1_epi16(0x3C00)); /* float16 1.0 */
    __m512h b = _mm512_castsi512_ph(_mm512_set1_epi16(0x0400)); /* float16 2^-14: the sums stay finite */
    KERNEL_BODY(__m512h, SET_PH, FMAPH, _mm512_add_ph, _mm512_reduce_add_ph)
}
#endif

/* The core's clock: a chain of dependent 64-bit multiplies (imul r64, r64: 3 cycles of latency on
 * the x86-64 cores of the last decade, Intel and AMD alike; a chain of `add reg, imm` would not do,
 * as Golden Cove's renamer folds immediate adds) runs at a third of an instruction per cycle, so 3 x
 * multiplies per ns is GHz, at the frequency the core runs scalar code (AVX-512 code may run a
 * little slower, which makes the per-cycle figures a lower bound). The best of several timings. */
static double clock_ghz(void) {
    double best = 1e30;
    const int64_t n = 1 << 22;
    for (int rep = 0; rep < 20; rep++) {
        uint64_t x = 3, y = 5;
        double t0 = now();
        for (int64_t i = 0; i < n; i += 8)
            __asm__ volatile("imul %1, %0\n\timul %1, %0\n\timul %1, %0\n\timul %1, %0\n\t"
                             "imul %1, %0\n\timul %1, %0\n\timul %1, %0\n\timul %1, %0" : "+r"(x) : "r"(y));
        double dt = now() - t0;
        if (dt < best) best = dt;
    }
    return 3.0 * (double)n / (best * 1e9);
}

/* ---- measuring -------------------------------------------------------------------------------- */

typedef float (*kernel_fn)(int64_t);

typedef struct {
    const char *name;
    kernel_fn fn;
    int madds;      /* multiply-adds per instruction */
    const char *absent; /* why it cannot run here, or NULL */
    int64_t rounds; /* per timing: about 20 ms */
    double best;    /* seconds, the best timing */
} kernel;

/* Times the kernels that can run, interleaved (each timing of one is next to a timing of the
 * others, so a load from elsewhere falls on all alike), for about `seconds` each; keeps the best
 * timing of each. */
static void measure(kernel *ks, int n, double seconds) {
    volatile float sink = 0;
    int64_t reps = 3;
    for (int k = 0; k < n; k++) {
        if (ks[k].absent) continue;
        sink += ks[k].fn(1); /* warm up: the AVX-512 frequency license */
        double t = 0;
        for (ks[k].rounds = 16; (t = now(), sink += ks[k].fn(ks[k].rounds), t = now() - t) < 0.02;) ks[k].rounds *= 2;
        ks[k].best = t;
        if ((int64_t)(seconds / t) + 1 > reps) reps = (int64_t)(seconds / t) + 1;
    }
    for (int64_t r = 0; r < reps; r++)
        for (int k = 0; k < n; k++) {
            if (ks[k].absent) continue;
            double t0 = now();
            sink += ks[k].fn(ks[k].rounds);
            double dt = now() - t0;
            if (dt < ks[k].best) ks[k].best = dt;
        }
    (void)sink;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 0.3;
    if (!(seconds > 0)) seconds = 0.3;
    kernel ks[3] = {
        {"vfmadd231ps_zmm", run_fmaps, 16, has_avx512f() ? NULL : "no usable AVX-512F", 0, 0},
        {"vdpbf16ps_zmm", run_dpbf16, 32, has_avx512bf16() ? NULL : "no AVX512_BF16", 0, 0},
#ifdef HAVE_FP16_KERNEL
        {"vfmadd231ph_zmm", run_fmaph, 32, has_avx512fp16() ? NULL : "no AVX512_FP16", 0, 0},
#else
        {"vfmadd231ph_zmm", NULL, 32, "this compiler has no AVX512_FP16 intrinsics", 0, 0},
#endif
    };
    measure(ks, 3, seconds);
    printf("clock_ghz %.4f\n", clock_ghz());
    for (int k = 0; k < 3; k++) {
        if (ks[k].absent) {
            printf("%s absent (%s)\n", ks[k].name, ks[k].absent);
            continue;
        }
        double ns_per = ks[k].best * 1e9 / ((double)ks[k].rounds * INNER * ACCS);
        printf("%s %.4f %.5f\n", ks[k].name, ks[k].madds / ns_per, ns_per);
    }
    return 0;
}
