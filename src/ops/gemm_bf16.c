/* kiln_gemm_bf16 (gemm_bf16.h): oneDNN's matmul primitive on bfloat16 operands with float32
 * accumulation, one primitive per (M, N, K, layouts, destination dtype, bias) made on first use
 * and kept in a bounded cache (least recently used goes first, never one that a thread is
 * running). Lookups run under one mutex; the primitives run outside it, concurrently, each call
 * with its own memory objects, its thread's stream and its thread's scratchpad (the user
 * scratchpad mode: oneDNN's own would be shared between the primitives). A primitive is made and
 * run with one OpenMP thread, as kiln_sgemm runs its providers: the caller splits the work. */
#include "gemm_bf16.h"

#include <dnnl.h>
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>

#include "../core/internal.h"
#include "../core/profile.h"
#include "kiln/config.h"
#include "gemm_select.h"

#define BF_CACHE_SIZE 256
#define BF_KEY 11

typedef struct {
    int64_t key[BF_KEY];
    dnnl_primitive_t prim; /* NULL: oneDNN refused the shape or offered its reference kernel */
    dnnl_memory_desc_t md[4]; /* src, weights, dst, bias */
    dnnl_memory_desc_t scratch_md;
    size_t scratch;
    uint64_t last_use;
    int users; /* threads running it now (under bf_lock) */
} bf_entry;

static pthread_mutex_t bf_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t bf_once = PTHREAD_ONCE_INIT;
static dnnl_engine_t bf_engine;
static const char *bf_path; /* NULL: no hardware path */
static bf_entry *bf_cache[BF_CACHE_SIZE];
static int bf_count;
static uint64_t bf_clock;
static atomic_llong bf_calls;
static atomic_int bf_force = -1; /* kiln_gemm_bf16_force: -1 the choice, 0 the fallback, 1 the hardware path */

static _Thread_local dnnl_stream_t bf_stream;
static _Thread_local void *bf_scratch;
static _Thread_local size_t bf_scratch_size;

static void bf_init(void) {
    unsigned isa = (unsigned)dnnl_get_effective_cpu_isa();
    bool bf16 = (isa & (unsigned)dnnl_cpu_isa_avx512_core_bf16) == (unsigned)dnnl_cpu_isa_avx512_core_bf16;
    bool amx = (isa & (unsigned)dnnl_cpu_isa_avx512_core_amx) == (unsigned)dnnl_cpu_isa_avx512_core_amx;
    /* kiln's own cap as well: ONEDNN_MAX_CPU_ISA wins over KILN_MAX_CPU_ISA for oneDNN (dnnl_isa.c),
     * but a kiln capped below AVX-512 keeps the fallback */
    if (!bf16 || kiln_isa_level() < KILN_ISA_AVX512) return;
    if (dnnl_engine_create(&bf_engine, dnnl_cpu, 0) != dnnl_success) return;
    bf_path = amx ? "oneDNN avx512_core_amx" : "oneDNN avx512_core_bf16";
}

bool kiln_gemm_bf16_hardware(void) {
    pthread_once(&bf_once, bf_init);
    return bf_path != NULL;
}

static void bf_choose(void);
static pthread_once_t bf_choose_once = PTHREAD_ONCE_INIT;
static bool bf_chosen;     /* products take the hardware path (when not switched off) */
static char bf_why[320];   /* how that was decided */

bool kiln_gemm_bf16_available(void) {
    if (!kiln_gemm_bf16_hardware()) return false;
    int force = atomic_load(&bf_force);
    if (force >= 0) return force > 0;
    /* kiln.set_deterministic(True): the fallback, the same in every process whatever the timing chose */
    if (kiln_gemm_pinned()) return false;
    pthread_once(&bf_choose_once, bf_choose);
    return bf_chosen;
}

void kiln_gemm_bf16_force(int how) { atomic_store(&bf_force, how < 0 ? -1 : how > 0); }

const char *kiln_gemm_bf16_path(void) { return kiln_gemm_bf16_available() ? bf_path : NULL; }

const char *kiln_gemm_bf16_why(void) {
    if (!kiln_gemm_bf16_hardware()) return "oneDNN's instruction set has no bfloat16 arithmetic";
    int force = atomic_load(&bf_force);
    if (force >= 0) return force ? "forced on (kiln._C.gemm_bf16_force(1))" : "forced off (kiln._C.gemm_bf16_force(0))";
    if (kiln_gemm_pinned()) return "kiln.set_deterministic(True) keeps the fp32-compute fallback";
    pthread_once(&bf_choose_once, bf_choose);
    return bf_why;
}

int64_t kiln_gemm_bf16_calls(void) { return (int64_t)atomic_load(&bf_calls); }

int kiln_gemm_bf16_cached(void) {
    pthread_mutex_lock(&bf_lock);
    int n = bf_count;
    pthread_mutex_unlock(&bf_lock);
    return n;
}

/* ---- the reference loops ------------------------------------------------------------------- */

void kiln_gemm_bf16_ref(int64_t M, int64_t N, int64_t K, const uint16_t *A, int64_t ars, int64_t acs,
                        const uint16_t *B, int64_t brs, int64_t bcs, const uint16_t *bias, void *C, bool c_f32,
                        int64_t ldc) {
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            float s = 0;
            for (int64_t p = 0; p < K; p++) s += kiln_bf16_to_f32(A[i * ars + p * acs]) * kiln_bf16_to_f32(B[p * brs + j * bcs]);
            if (bias) s += kiln_bf16_to_f32(bias[j]);
            if (c_f32) ((float *)C)[i * ldc + j] = s;
            else ((uint16_t *)C)[i * ldc + j] = kiln_f32_to_bf16(s);
        }
}

/* The fp32-compute way for a product oneDNN does not take: operands widened, kiln_sgemm, the
 * result rounded once (the reference loops when the buffers cannot be had). */
static void bf_widened(int64_t M, int64_t N, int64_t K, const uint16_t *A, int64_t ars, int64_t acs, const uint16_t *B,
                       int64_t brs, int64_t bcs, const uint16_t *bias, void *C, bool c_f32, int64_t ldc) {
    float *a = kiln_malloc(sizeof(float) * (size_t)(M * K + 1)), *b = kiln_malloc(sizeof(float) * (size_t)(K * N + 1)),
          *c = kiln_malloc(sizeof(float) * (size_t)(M * N + 1));
    if (!a || !b || !c) {
        free(a), free(b), free(c);
        kiln_gemm_bf16_ref(M, N, K, A, ars, acs, B, brs, bcs, bias, C, c_f32, ldc);
        return;
    }
    for (int64_t i = 0; i < M; i++)
        for (int64_t p = 0; p < K; p++) a[i * K + p] = kiln_bf16_to_f32(A[i * ars + p * acs]);
    for (int64_t p = 0; p < K; p++)
        for (int64_t j = 0; j < N; j++) b[p * N + j] = kiln_bf16_to_f32(B[p * brs + j * bcs]);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) c[i * N + j] = bias ? kiln_bf16_to_f32(bias[j]) : 0.0f;
    kiln_sgemm(false, false, M, N, K, 1.0f, a, K > 0 ? K : 1, b, N, bias ? 1.0f : 0.0f, c, N);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            if (c_f32) ((float *)C)[i * ldc + j] = c[i * N + j];
            else ((uint16_t *)C)[i * ldc + j] = kiln_f32_to_bf16(c[i * N + j]);
        }
    free(a), free(b), free(c);
}

/* ---- primitives ---------------------------------------------------------------------------- */

/* (rows, cols, rs, cs) as oneDNN strides: a row-major or column-major matrix, the stride of a
 * dimension of size 1 made that of a packed one. */
static void bf_strides(int64_t rows, int64_t cols, int64_t rs, int64_t cs, int64_t *out) {
    if (cs == 1 || cols <= 1) {
        out[0] = rows <= 1 ? (cols > 1 ? cols : 1) : rs;
        out[1] = 1;
    } else {
        out[0] = 1;
        out[1] = cols <= 1 ? (rows > 1 ? rows : 1) : cs;
    }
}

static void bf_destroy(bf_entry *e) {
    if (e->prim) dnnl_primitive_destroy(e->prim);
    free(e);
}

/* Makes the primitive of key (M, N, K, A's strides, B's strides, ldc, c_f32, bias); e->prim stays
 * NULL when oneDNN refuses or offers only its reference implementation. One OpenMP thread. */
static void bf_make(bf_entry *e) {
    const int64_t *k = e->key;
    dnnl_dims_t ad = {k[0], k[2]}, bd = {k[2], k[1]}, cd = {k[0], k[1]}, biasd = {1, k[1]};
    dnnl_dims_t as = {k[3], k[4]}, bs = {k[5], k[6]}, cs = {k[7], 1}, biass = {k[1], 1};
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_matmul_desc_t desc;
    bool ok = dnnl_memory_desc_init_by_strides(&e->md[0], 2, ad, dnnl_bf16, as) == dnnl_success &&
              dnnl_memory_desc_init_by_strides(&e->md[1], 2, bd, dnnl_bf16, bs) == dnnl_success &&
              dnnl_memory_desc_init_by_strides(&e->md[2], 2, cd, k[8] ? dnnl_f32 : dnnl_bf16, cs) == dnnl_success &&
              dnnl_memory_desc_init_by_strides(&e->md[3], 2, biasd, dnnl_bf16, biass) == dnnl_success &&
              dnnl_matmul_desc_init(&desc, &e->md[0], &e->md[1], k[9] ? &e->md[3] : NULL, &e->md[2]) == dnnl_success &&
              dnnl_primitive_attr_create(&attr) == dnnl_success &&
              dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) == dnnl_success;
    int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    ok = ok && dnnl_primitive_desc_create(&pd, &desc, attr, bf_engine, NULL) == dnnl_success;
    const char *impl = NULL;
    ok = ok && dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl &&
         strncmp(impl, "ref", 3) != 0;
    if (ok) {
        const dnnl_memory_desc_t *smd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
        e->scratch = smd ? dnnl_memory_desc_get_size(smd) : 0;
        if (e->scratch) e->scratch_md = *smd;
        if (dnnl_primitive_create(&e->prim, pd) != dnnl_success) e->prim = NULL;
    }
    omp_set_num_threads(threads);
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (attr) dnnl_primitive_attr_destroy(attr);
}

/* The entry of key with its user count raised, made (evicting the least recently used idle
 * entry when the cache is full) if new; NULL when out of memory. */
static bf_entry *bf_acquire(const int64_t *key) {
    pthread_mutex_lock(&bf_lock);
    bf_entry *e = NULL;
    for (int i = 0; i < bf_count && !e; i++)
        if (!memcmp(bf_cache[i]->key, key, sizeof(int64_t) * BF_KEY)) e = bf_cache[i];
    if (!e && (e = kiln_calloc(1, sizeof *e))) {
        memcpy(e->key, key, sizeof(int64_t) * BF_KEY);
        bf_make(e);
        int slot = -1;
        if (bf_count < BF_CACHE_SIZE) {
            slot = bf_count++;
        } else {
            for (int i = 0; i < BF_CACHE_SIZE; i++) /* the least recently used idle one goes */
                if (bf_cache[i]->users == 0 && (slot < 0 || bf_cache[i]->last_use < bf_cache[slot]->last_use)) slot = i;
            if (slot >= 0) bf_destroy(bf_cache[slot]);
        }
        if (slot >= 0) {
            bf_cache[slot] = e;
        } else {
            e->users = -1; /* every entry busy: this one lives for this call only */
        }
    }
    if (e) {
        e->last_use = ++bf_clock;
        if (e->users >= 0) e->users++;
    }
    pthread_mutex_unlock(&bf_lock);
    return e;
}

static void bf_release(bf_entry *e) {
    if (e->users < 0) {
        bf_destroy(e);
        return;
    }
    pthread_mutex_lock(&bf_lock);
    e->users--;
    pthread_mutex_unlock(&bf_lock);
}

/* Runs e's primitive on the calling thread; false when something failed (nothing written then). */
static bool bf_execute(const bf_entry *e, const void *A, const void *B, const void *bias, void *C) {
    if (!bf_stream && dnnl_stream_create(&bf_stream, bf_engine, dnnl_stream_default_flags) != dnnl_success) {
        bf_stream = NULL;
        return false;
    }
    if (e->scratch > bf_scratch_size) {
        void *grown = kiln_malloc(e->scratch);
        if (!grown) return false;
        free(bf_scratch);
        bf_scratch = grown, bf_scratch_size = e->scratch;
    }
    dnnl_memory_t mem[5] = {NULL, NULL, NULL, NULL, NULL};
    const void *ptr[4] = {A, B, C, bias};
    static const int arg_of[5] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_BIAS, DNNL_ARG_SCRATCHPAD};
    dnnl_exec_arg_t args[5];
    int nargs = 0;
    bool ok = true;
    for (int k = 0; k < 4 && ok; k++) {
        if (!ptr[k]) continue;
        ok = dnnl_memory_create(&mem[k], &e->md[k], bf_engine, (void *)ptr[k]) == dnnl_success;
        if (ok) args[nargs++] = (dnnl_exec_arg_t){arg_of[k], mem[k]};
    }
    if (ok && e->scratch) {
        ok = dnnl_memory_create(&mem[4], &e->scratch_md, bf_engine, bf_scratch) == dnnl_success;
        if (ok) args[nargs++] = (dnnl_exec_arg_t){arg_of[4], mem[4]};
    }
    if (ok) {
        int threads = omp_get_max_threads();
        if (threads != 1) omp_set_num_threads(1);
        ok = dnnl_primitive_execute(e->prim, bf_stream, nargs, args) == dnnl_success &&
             dnnl_stream_wait(bf_stream) == dnnl_success;
        if (threads != 1) omp_set_num_threads(threads);
    }
    for (int k = 0; k < 5; k++)
        if (mem[k]) dnnl_memory_destroy(mem[k]);
    return ok;
}

void kiln_gemm_bf16(int64_t M, int64_t N, int64_t K, const uint16_t *A, int64_t ars, int64_t acs, const uint16_t *B,
                    int64_t brs, int64_t bcs, const uint16_t *bias, void *C, bool c_f32, int64_t ldc) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0 || !kiln_gemm_bf16_hardware()) {
        kiln_gemm_bf16_ref(M, N, K, A, ars, acs, B, brs, bcs, bias, C, c_f32, ldc);
        return;
    }
    int64_t key[BF_KEY] = {M, N, K, 0, 0, 0, 0, ldc < N ? N : ldc, c_f32, bias != NULL, 0};
    bf_strides(M, K, ars, acs, key + 3);
    bf_strides(K, N, brs, bcs, key + 5);
    bf_entry *e = bf_acquire(key);
    bool done = e && e->prim && bf_execute(e, A, B, bias, C);
    if (e) bf_release(e);
    if (done) atomic_fetch_add_explicit(&bf_calls, 1, memory_order_relaxed);
    else bf_widened(M, N, K, A, ars, acs, B, brs, bcs, bias, C, c_f32, ldc);
}

/* ---- the choice ------------------------------------------------------------------------------ */

/* The best seconds of the hardware path (best[0]) and of the fp32-compute way (best[1]) on an
 * n^3 product, their calls interleaved so that both see the same load (after one warm-up call
 * each); false when the hardware path fails. */
static bool bf_time(int64_t n, const uint16_t *A, const uint16_t *B, uint16_t *C, double *best) {
    int64_t key[BF_KEY] = {n, n, n, n, 1, n, 1, n, 0, 0, 0};
    bf_entry *e = bf_acquire(key);
    bool ok = e && e->prim;
    best[0] = best[1] = 1e30;
    for (int r = 0; r < 7 && ok; r++) { /* round 0 warms up */
        for (int way = 0; way < 2 && ok; way++) {
            double t0 = 1e-9 * (double)kiln_profile_now();
            if (way == 0) ok = bf_execute(e, A, B, NULL, C);
            else bf_widened(n, n, n, A, n, 1, B, n, 1, NULL, C, false, n);
            double dt = 1e-9 * (double)kiln_profile_now() - t0;
            if (r > 0 && dt < best[way]) best[way] = dt;
        }
    }
    if (e) bf_release(e);
    return ok;
}

/* KILN_BF16_GEMM=onednn or fallback decides; otherwise (auto) the hardware path is kept where it
 * beats the fp32-compute way on one 512^3 product, single-threaded, as the kernels call them
 * (oneDNN 2.6's bfloat16 matmul on avx512_core_bf16 can be slower than its float32 GEMM: it
 * was half its speed on an Intel Xeon without AMX). */
static void bf_choose(void) {
    const char *env = getenv("KILN_BF16_GEMM");
    if (env && !strcmp(env, "onednn")) {
        bf_chosen = true;
        snprintf(bf_why, sizeof bf_why, "KILN_BF16_GEMM=onednn");
        return;
    }
    if (env && !strcmp(env, "fallback")) {
        snprintf(bf_why, sizeof bf_why, "KILN_BF16_GEMM=fallback");
        return;
    }
    const char *note = env && *env && strcmp(env, "auto") ? " (KILN_BF16_GEMM: onednn, fallback or auto, not this value)" : "";
    enum { N = 512 };
    uint16_t *A = kiln_malloc(2 * N * N), *B = kiln_malloc(2 * N * N), *C = kiln_malloc(2 * N * N);
    if (!A || !B || !C) {
        free(A), free(B), free(C);
        snprintf(bf_why, sizeof bf_why, "out of memory for the measurement");
        return;
    }
    uint32_t s = 12345u;
    for (int64_t i = 0; i < N * N; i++) {
        A[i] = kiln_f32_to_bf16((float)((s = s * 1664525u + 1013904223u) >> 8) / 8388608.0f - 1.0f);
        B[i] = kiln_f32_to_bf16((float)((s = s * 1664525u + 1013904223u) >> 8) / 8388608.0f - 1.0f);
    }
    double best[2], flop = 2.0 * N * N * N / 1e9;
    bool ok = bf_time(N, A, B, C, best);
    double hw = best[0], fb = best[1];
    free(A), free(B), free(C);
    if (!ok) {
        snprintf(bf_why, sizeof bf_why, "oneDNN made no bfloat16 matmul here");
        return;
    }
    bf_chosen = hw <= fb;
    snprintf(bf_why, sizeof bf_why,
             "%s: measured %.0f GFLOP/s against the fp32-compute fallback's %.0f on a %d^3 product on one thread "
             "(KILN_BF16_GEMM=onednn or fallback decides instead)%s",
             bf_chosen ? "faster" : "slower", flop / hw, flop / fb, (int)N, note);
}

/* ---- the peak ------------------------------------------------------------------------------- */

kiln_status kiln_gemm_bf16_rate(int64_t M, int64_t N, int64_t K, int threads, int rounds, double min_seconds,
                                double *gflops) {
    if (M < 1 || N < 1 || K < 1 || M > 1 << 15 || N > 1 << 15 || K > 1 << 15 || threads < 1 || threads > 4096 ||
        rounds < 1 || rounds > 1000 || !(min_seconds >= 0 && min_seconds <= 10))
        return kiln_error(KILN_ERR_VALUE,
                          "gemm_bf16_rate: sizes 1..32768, threads 1..4096, rounds 1..1000 and min_seconds 0..10 "
                          "expected, got %lld x %lld x %lld, %d, %d, %g",
                          (long long)M, (long long)N, (long long)K, threads, rounds, min_seconds);
    if (!kiln_gemm_bf16_hardware())
        return kiln_error(KILN_ERR_VALUE, "gemm_bf16_rate: no bfloat16 hardware path here (oneDNN's instruction set %s)",
                          kiln_dnnl_isa());
    uint16_t *A = kiln_malloc(2 * (size_t)(M * K)), *B = kiln_malloc(2 * (size_t)(K * N)),
             *C = kiln_malloc(2 * (size_t)(M * N));
    dnnl_memory_desc_t md[3];
    dnnl_dims_t ad = {M, K}, bd = {K, N}, cd = {M, N};
    dnnl_matmul_desc_t desc;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t prim = NULL;
    dnnl_stream_t stream = NULL;
    dnnl_memory_t mem[3] = {NULL, NULL, NULL};
    int before = omp_get_max_threads();
    omp_set_num_threads(threads);
    bool ok = A && B && C && dnnl_memory_desc_init_by_tag(&md[0], 2, ad, dnnl_bf16, dnnl_ab) == dnnl_success &&
              dnnl_memory_desc_init_by_tag(&md[1], 2, bd, dnnl_bf16, dnnl_ab) == dnnl_success &&
              dnnl_memory_desc_init_by_tag(&md[2], 2, cd, dnnl_bf16, dnnl_ab) == dnnl_success &&
              dnnl_matmul_desc_init(&desc, &md[0], &md[1], NULL, &md[2]) == dnnl_success &&
              dnnl_primitive_desc_create(&pd, &desc, NULL, bf_engine, NULL) == dnnl_success &&
              dnnl_primitive_create(&prim, pd) == dnnl_success &&
              dnnl_stream_create(&stream, bf_engine, dnnl_stream_default_flags) == dnnl_success;
    void *ptr[3] = {A, B, C};
    for (int k = 0; k < 3 && ok; k++) ok = dnnl_memory_create(&mem[k], &md[k], bf_engine, ptr[k]) == dnnl_success;
    double best = 0;
    if (ok) {
        uint32_t s = 12345u; /* a small LCG: values in [-1, 1) */
        for (int64_t i = 0; i < M * K; i++)
            A[i] = kiln_f32_to_bf16((float)((s = s * 1664525u + 1013904223u) >> 8) / 8388608.0f - 1.0f);
        for (int64_t i = 0; i < K * N; i++)
            B[i] = kiln_f32_to_bf16((float)((s = s * 1664525u + 1013904223u) >> 8) / 8388608.0f - 1.0f);
        dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, mem[0]}, {DNNL_ARG_WEIGHTS, mem[1]}, {DNNL_ARG_DST, mem[2]}};
        ok = dnnl_primitive_execute(prim, stream, 3, args) == dnnl_success && dnnl_stream_wait(stream) == dnnl_success;
        for (int r = 0; r < rounds && ok; r++) {
            int64_t calls = 0;
            double t0 = 1e-9 * (double)kiln_profile_now(), dt;
            do {
                dnnl_primitive_execute(prim, stream, 3, args);
                dnnl_stream_wait(stream);
                calls++;
                dt = 1e-9 * (double)kiln_profile_now() - t0;
            } while (dt < min_seconds);
            double rate = 2.0 * (double)M * (double)N * (double)K * (double)calls / (dt > 0 ? dt : 1e-9) / 1e9;
            if (rate > best) best = rate;
        }
    }
    omp_set_num_threads(before);
    for (int k = 0; k < 3; k++)
        if (mem[k]) dnnl_memory_destroy(mem[k]);
    if (stream) dnnl_stream_destroy(stream);
    if (prim) dnnl_primitive_destroy(prim);
    if (pd) dnnl_primitive_desc_destroy(pd);
    free(A), free(B), free(C);
    if (!ok) return kiln_error(KILN_ERR_MEMORY, "gemm_bf16_rate: oneDNN's bfloat16 matmul could not be made or run");
    *gflops = best;
    return KILN_OK;
}
