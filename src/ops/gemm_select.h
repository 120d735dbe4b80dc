/* The one float32 GEMM of src/ops: every kernel's sgemm goes through kiln_sgemm, which runs the
 * provider chosen for the product's shape class (OpenBLAS's cblas_sgemm, or oneDNN's dnnl_sgemm).
 * OpenBLAS serves every class until kiln.gemm_select's calibration (python/kiln/gemm_select.py)
 * sets the table; while pinned (kiln.set_deterministic(True)) OpenBLAS serves every class. The
 * choice depends only on (M, N, K) and the table, so eager and compiled calls of one product
 * run the same provider. */
#ifndef KILN_GEMM_SELECT_H
#define KILN_GEMM_SELECT_H

#include <cblas.h>
#include <stdbool.h>
#include <stdint.h>

#include "kiln/core.h"

typedef enum { KILN_GEMM_OPENBLAS, KILN_GEMM_ONEDNN, KILN_GEMM_PROVIDERS } kiln_gemm_provider;

/* Shape classes, tested in this order: small (M*N*K < 64^3), small_m (M <= 16), small_n
 * (N <= 16), deep (K >= 4 max(M, N)), tall (M >= 4 N), wide (N >= 4 M), square (the rest). */
typedef enum {
    KILN_GEMM_SMALL,
    KILN_GEMM_SMALL_M,
    KILN_GEMM_SMALL_N,
    KILN_GEMM_DEEP,
    KILN_GEMM_TALL,
    KILN_GEMM_WIDE,
    KILN_GEMM_SQUARE,
    KILN_GEMM_CLASSES
} kiln_gemm_class;

kiln_gemm_class kiln_gemm_class_of(int64_t M, int64_t N, int64_t K);
const char *kiln_gemm_class_name(int cls);       /* NULL out of range */
const char *kiln_gemm_provider_name(int provider); /* NULL out of range */

/* C (M x N, row stride ldc) = alpha op(A) op(B) + beta C, row-major, op = transpose when ta/tb;
 * A, B, C and the leading dimensions as cblas_sgemm takes them (sizes up to INT_MAX; beta 0
 * never reads C). Runs single-threaded on the calling thread whichever the provider. */
void kiln_sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
/* The same through one given provider. */
void kiln_sgemm_with(kiln_gemm_provider p, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                     const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc);

/* kiln_sgemm with cblas_sgemm's arguments, for kernels written against it (order: row-major). */
static inline void kiln_sgemm_cblas(CBLAS_ORDER order, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K,
                                    float alpha, const float *A, int lda, const float *B, int ldb, float beta,
                                    float *C, int ldc) {
    (void)order;
    kiln_sgemm(ta == CblasTrans, tb == CblasTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* The table: the provider of one class (KILN_ERR_VALUE when either is out of range), and the one
 * kiln_sgemm runs for it now (OpenBLAS while pinned). */
kiln_status kiln_gemm_set_provider(int cls, int provider);
kiln_gemm_provider kiln_gemm_provider_of(int cls);
kiln_gemm_provider kiln_gemm_provider_used(int cls);
/* How many GEMMs kiln_sgemm ran on `provider` in this process. */
int64_t kiln_gemm_calls(int provider);
/* Pinned: OpenBLAS for every class, whatever the table (kiln.set_deterministic). */
void kiln_gemm_set_pinned(bool on);
bool kiln_gemm_pinned(void);

/* The best GFLOP/s of `provider` on an M x N x K NoTrans product of random operands over
 * `rounds` timings of at least `min_seconds` each (after one warm-up call): single-threaded as
 * kiln_sgemm runs it when threads == 1, else the library's own threads, `threads` of them (the
 * machine's peak, for kiln.bench). Call outside parallel regions. KILN_ERR_VALUE on bad
 * arguments, KILN_ERR_MEMORY when the operands cannot be allocated. */
kiln_status kiln_gemm_rate(int provider, int64_t M, int64_t N, int64_t K, int threads, int rounds,
                           double min_seconds, double *gflops);

#endif
