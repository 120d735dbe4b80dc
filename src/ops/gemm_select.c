/* kiln_sgemm: the float32 GEMM of every kernel, dispatched per shape class to OpenBLAS or oneDNN
 * (gemm_select.h). Both run single-threaded per call: kiln's kernels split their GEMMs over
 * kiln's OpenMP threads themselves (matmul.c), and a provider's result then depends only on the
 * product, never on the thread count or on whether the call sits in a parallel region. */
#include "gemm_select.h"

#include <cblas.h>
#include <dnnl.h>
#include <limits.h>
#include <omp.h>
#include <stdatomic.h>

#include "../core/internal.h"
#include "../core/profile.h"

static const char *class_names[KILN_GEMM_CLASSES] = {"small", "small_m", "small_n", "deep", "tall", "wide", "square"};
static const char *provider_names[KILN_GEMM_PROVIDERS] = {"openblas", "onednn"};

static _Atomic int table[KILN_GEMM_CLASSES]; /* all KILN_GEMM_OPENBLAS (0) until set */
static atomic_bool pinned;
static atomic_llong call_counts[KILN_GEMM_PROVIDERS]; /* kiln_sgemm's calls per provider (tests check the dispatch) */

kiln_gemm_class kiln_gemm_class_of(int64_t M, int64_t N, int64_t K) {
    int64_t mn = M > N ? M : N;
    if ((double)M * (double)N * (double)K < 64.0 * 64.0 * 64.0) return KILN_GEMM_SMALL;
    if (M <= 16) return KILN_GEMM_SMALL_M;
    if (N <= 16) return KILN_GEMM_SMALL_N;
    if (K >= 4 * mn) return KILN_GEMM_DEEP;
    if (M >= 4 * N) return KILN_GEMM_TALL;
    if (N >= 4 * M) return KILN_GEMM_WIDE;
    return KILN_GEMM_SQUARE;
}

const char *kiln_gemm_class_name(int cls) { return cls >= 0 && cls < KILN_GEMM_CLASSES ? class_names[cls] : NULL; }

const char *kiln_gemm_provider_name(int provider) {
    return provider >= 0 && provider < KILN_GEMM_PROVIDERS ? provider_names[provider] : NULL;
}

kiln_status kiln_gemm_set_provider(int cls, int provider) {
    if (cls < 0 || cls >= KILN_GEMM_CLASSES || provider < 0 || provider >= KILN_GEMM_PROVIDERS)
        return kiln_error(KILN_ERR_VALUE, "gemm provider table: class %d / provider %d out of range (0..%d / 0..%d)",
                          cls, provider, KILN_GEMM_CLASSES - 1, KILN_GEMM_PROVIDERS - 1);
    atomic_store(&table[cls], provider);
    return KILN_OK;
}

kiln_gemm_provider kiln_gemm_provider_of(int cls) {
    return cls >= 0 && cls < KILN_GEMM_CLASSES ? (kiln_gemm_provider)atomic_load(&table[cls]) : KILN_GEMM_OPENBLAS;
}

kiln_gemm_provider kiln_gemm_provider_used(int cls) {
    return atomic_load(&pinned) ? KILN_GEMM_OPENBLAS : kiln_gemm_provider_of(cls);
}

void kiln_gemm_set_pinned(bool on) { atomic_store(&pinned, on); }
bool kiln_gemm_pinned(void) { return atomic_load(&pinned); }

/* oneDNN's sgemm on one thread: oneDNN (OpenMP runtime) runs sequentially inside a parallel
 * region, and outside one on omp_get_max_threads() threads, so that is 1 for the call. */
static void onednn_sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                         int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    dnnl_status_t st;
    if (omp_in_parallel()) {
        st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    } else {
        int threads = omp_get_max_threads();
        omp_set_num_threads(1);
        st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        omp_set_num_threads(threads);
    }
    if (st != dnnl_success) /* arguments oneDNN refuses (none of kiln's kernels passes such): never a silent no-op */
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)M, (int)N,
                    (int)K, alpha, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
}

void kiln_sgemm_with(kiln_gemm_provider p, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                     const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    if (p == KILN_GEMM_ONEDNN)
        onednn_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    else
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)M, (int)N,
                    (int)K, alpha, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
}

void kiln_sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    kiln_gemm_provider p = kiln_gemm_provider_used(kiln_gemm_class_of(M, N, K));
    atomic_fetch_add_explicit(&call_counts[p], 1, memory_order_relaxed);
    kiln_sgemm_with(p, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

int64_t kiln_gemm_calls(int provider) {
    return provider >= 0 && provider < KILN_GEMM_PROVIDERS ? (int64_t)atomic_load(&call_counts[provider]) : 0;
}

/* ---- timing (calibration and kiln.bench's peak) --------------------------------------------- */

static double now_s(void) { return 1e-9 * (double)kiln_profile_now(); /* (core's monotonic clock) */ }

/* One call of p on the library's own `threads` threads (1: as kiln_sgemm runs it). */
static void rate_call(kiln_gemm_provider p, int threads, int64_t M, int64_t N, int64_t K, const float *A,
                      const float *B, float *C) {
    if (threads <= 1) {
        kiln_sgemm_with(p, false, false, M, N, K, 1.0f, A, K, B, N, 0.0f, C, N);
    } else if (p == KILN_GEMM_ONEDNN) {
        int before = omp_get_max_threads();
        omp_set_num_threads(threads);
        dnnl_sgemm('N', 'N', M, N, K, 1.0f, A, K, B, N, 0.0f, C, N);
        omp_set_num_threads(before);
    } else {
        int before = openblas_get_num_threads();
        openblas_set_num_threads(threads);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)M, (int)N, (int)K, 1.0f, A, (int)K, B, (int)N,
                    0.0f, C, (int)N);
        openblas_set_num_threads(before);
    }
}

kiln_status kiln_gemm_rate(int provider, int64_t M, int64_t N, int64_t K, int threads, int rounds,
                           double min_seconds, double *gflops) {
    if (provider < 0 || provider >= KILN_GEMM_PROVIDERS || M < 1 || N < 1 || K < 1 || M > 1 << 15 ||
        N > 1 << 15 || K > 1 << 15 || threads < 1 || threads > 4096 || rounds < 1 || rounds > 1000 ||
        !(min_seconds >= 0 && min_seconds <= 10))
        return kiln_error(KILN_ERR_VALUE,
                          "gemm_rate: provider 0..%d, sizes 1..32768, threads 1..4096, rounds 1..1000 and "
                          "min_seconds 0..10 expected, got %d, %lld x %lld x %lld, %d, %d, %g",
                          KILN_GEMM_PROVIDERS - 1, provider, (long long)M, (long long)N, (long long)K, threads,
                          rounds, min_seconds);
    float *A = kiln_alloc(sizeof(float) * (size_t)(M * K)), *B = kiln_alloc(sizeof(float) * (size_t)(K * N)),
          *C = kiln_alloc(sizeof(float) * (size_t)(M * N));
    if (!A || !B || !C) {
        kiln_free(A), kiln_free(B), kiln_free(C);
        return KILN_ERR_MEMORY;
    }
    uint32_t s = 12345u; /* a small LCG: values in [-1, 1) */
    for (int64_t i = 0; i < M * K; i++) A[i] = (float)((s = s * 1664525u + 1013904223u) >> 8) / 8388608.0f - 1.0f;
    for (int64_t i = 0; i < K * N; i++) B[i] = (float)((s = s * 1664525u + 1013904223u) >> 8) / 8388608.0f - 1.0f;
    kiln_gemm_provider p = (kiln_gemm_provider)provider;
    rate_call(p, threads, M, N, K, A, B, C);
    double best = 0;
    for (int r = 0; r < rounds; r++) {
        int64_t calls = 0;
        double t0 = now_s(), dt;
        do {
            rate_call(p, threads, M, N, K, A, B, C);
            calls++;
            dt = now_s() - t0;
        } while (dt < min_seconds);
        double rate = 2.0 * (double)M * (double)N * (double)K * (double)calls / (dt > 0 ? dt : 1e-9) / 1e9;
        if (rate > best) best = rate;
    }
    kiln_free(A), kiln_free(B), kiln_free(C);
    *gflops = best;
    return KILN_OK;
}
