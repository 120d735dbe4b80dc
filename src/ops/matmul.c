/* Matrix products: matmul (NumPy semantics: 1-D operands, broadcast batch dimensions) and
 * linear. float32/float64 go through BLAS; transposed views go in as CblasTrans without a
 * copy. Tiny products and integer dtypes run through plain loops (integers accumulate in
 * int64, wrapping like NumPy); float16 computes in float32, and so does bfloat16 unless the CPU
 * multiplies bfloat16 itself (gemm_bf16.h: then the operands stay bfloat16, sums are float32 and
 * the result is rounded once, as in the fp32-compute fallback). */
#include <cblas.h>
#include <limits.h>
#include <omp.h>

#include "../core/internal.h"
#include "gemm_bf16.h"
#include "gemm_select.h"
#include "matmul.h"
#include "lowp_pass.h"

/* Up to this many multiply-adds a plain loop beats the BLAS call (OpenBLAS has fast small-
 * matrix kernels, so this is tiny); larger products with layouts BLAS cannot take are copied. */
#define MM_TINY 64
/* Threads: OpenBLAS always runs single-threaded and kiln spreads GEMMs over its OpenMP threads
 * itself, so one thread pool serves every kernel. (OpenBLAS's own pool spins on the cores after
 * each call, and the OpenMP loops of the kernels that follow had to fight it for them.) A GEMM
 * of at least MM_SPLIT_MIN multiply-adds is split into one block of rows or columns per thread;
 * batches of GEMMs are spread over the threads when they divide evenly or are many. */
#define MM_SPLIT_MIN 262144
#define MM_PARALLEL_MIN 65536

/* A matrix operand: rows x cols with element strides. */
typedef struct {
    int64_t rows, cols, rs, cs;
} mm_mat;

static int64_t max1(int64_t v) { return v > 1 ? v : 1; }

/* The BLAS view of m: row-major NoTrans with leading dimension `ld`, or Trans; false when the
 * strides allow neither. */
static bool mm_blas_view(const mm_mat *m, bool *trans, int64_t *ld) {
    if (m->cs == 1 || m->cols <= 1) {
        int64_t l = m->rows <= 1 ? max1(m->cols) : m->rs;
        if (l >= max1(m->cols) && l <= INT_MAX) {
            *trans = false, *ld = l;
            return true;
        }
    }
    if (m->rs == 1 || m->rows <= 1) {
        int64_t l = m->cols <= 1 ? max1(m->rows) : m->cs;
        if (l >= max1(m->rows) && l <= INT_MAX) {
            *trans = true, *ld = l;
            return true;
        }
    }
    return false;
}

static bool mm_tiny(int64_t M, int64_t N, int64_t K) {
    return M * N * K <= MM_TINY || M > INT_MAX || N > INT_MAX || K > INT_MAX;
}

bool kiln_matmul_rows_same_sums(int64_t m1, int64_t m2, int64_t n, int64_t k) {
    if (k <= 1) return true; /* outer products (mm_outer), empty sums */
    return mm_tiny(m1, n, k) == mm_tiny(m2, n, k);
}

/* C (M x N, row stride ldc) = A @ B, or += when `acc`. Any strides; for tiny products. */
#define MM_NAIVE_FLOAT(NAME, T)                                                              \
    static void NAME(int64_t M, int64_t N, int64_t K, const T *A, mm_mat a, const T *B,      \
                     mm_mat b, T *C, int64_t ldc, bool acc) {                                \
        for (int64_t i = 0; i < M; i++)                                                      \
            for (int64_t j = 0; j < N; j++) {                                                \
                T s = acc ? C[i * ldc + j] : 0;                                              \
                for (int64_t p = 0; p < K; p++) s += A[i * a.rs + p * a.cs] * B[p * b.rs + j * b.cs]; \
                C[i * ldc + j] = s;                                                          \
            }                                                                                \
    }
MM_NAIVE_FLOAT(mm_naive_f32, float)
MM_NAIVE_FLOAT(mm_naive_f64, double)

/* Integers: every size comes here, so rows of C accumulate in a vectorizable order. */
static void mm_naive_i64(int64_t M, int64_t N, int64_t K, const int64_t *A, mm_mat a,
                         const int64_t *B, mm_mat b, int64_t *C, int64_t ldc, bool acc) {
    for (int64_t i = 0; i < M; i++) {
        uint64_t *c = (uint64_t *)(C + i * ldc);
        if (!acc)
            for (int64_t j = 0; j < N; j++) c[j] = 0;
        for (int64_t p = 0; p < K; p++) {
            const uint64_t av = (uint64_t)A[i * a.rs + p * a.cs];
            const int64_t *bp = B + p * b.rs;
            for (int64_t j = 0; j < N; j++) c[j] += av * (uint64_t)bp[j * b.cs];
        }
    }
}

#define MM_GEMM_FLOAT(NAME, T, NAIVE, BLAS)                                                  \
    static void NAME(int64_t M, int64_t N, int64_t K, const T *A, mm_mat a, const T *B,      \
                     mm_mat b, T *C, int64_t ldc, bool acc) {                                \
        bool ta, tb;                                                                         \
        int64_t lda, ldb;                                                                    \
        if (M == 0 || N == 0) return;                                                        \
        if (mm_tiny(M, N, K) || !mm_blas_view(&a, &ta, &lda) || !mm_blas_view(&b, &tb, &ldb)) \
            NAIVE(M, N, K, A, a, B, b, C, ldc, acc);                                         \
        else                                                                                 \
            BLAS(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, \
                 (int)M, (int)N, (int)K, 1, A, (int)lda, B, (int)ldb, acc ? 1 : 0, C, (int)ldc); \
    }
MM_GEMM_FLOAT(mm_gemm_f32, float, mm_naive_f32, kiln_sgemm_cblas)
MM_GEMM_FLOAT(mm_gemm_f64, double, mm_naive_f64, cblas_dgemm)

/* bfloat16 on the hardware path (gemm_bf16.h), C bfloat16: a plain loop for tiny products and
 * layouts oneDNN cannot take (the callers copy those when they are not tiny). The bias (N values,
 * or NULL) is added before the rounding. */
static void mm_gemm_bf16(int64_t M, int64_t N, int64_t K, const uint16_t *A, mm_mat a, const uint16_t *B, mm_mat b,
                         uint16_t *C, int64_t ldc, const uint16_t *bias) {
    bool ta, tb;
    int64_t lda, ldb;
    if (M == 0 || N == 0) return;
    if (mm_tiny(M, N, K) || !mm_blas_view(&a, &ta, &lda) || !mm_blas_view(&b, &tb, &ldb))
        kiln_gemm_bf16_ref(M, N, K, A, a.rs, a.cs, B, b.rs, b.cs, bias, C, false, ldc);
    else
        kiln_gemm_bf16(M, N, K, A, a.rs, a.cs, B, b.rs, b.cs, bias, C, false, ldc);
}

/* One GEMM in compute dtype ct (float32, float64, int64, or bfloat16 on the hardware path, where a
 * bias replaces `acc`: the other dtypes take it as C's starting rows). */
static void mm_gemm(kiln_dtype ct, int64_t M, int64_t N, int64_t K, const void *A, mm_mat a,
                    const void *B, mm_mat b, void *C, int64_t ldc, bool acc, const void *bias) {
    switch (ct) {
    case KILN_DTYPE_BFLOAT16: mm_gemm_bf16(M, N, K, A, a, B, b, C, ldc, bias); break;
    case KILN_DTYPE_FLOAT32: mm_gemm_f32(M, N, K, A, a, B, b, C, ldc, acc); break;
    case KILN_DTYPE_FLOAT64: mm_gemm_f64(M, N, K, A, a, B, b, C, ldc, acc); break;
    default: mm_naive_i64(M, N, K, A, a, B, b, C, ldc, acc); break;
    }
}

/* OpenBLAS single-threaded (see MM_SPLIT_MIN). Called on the caller's thread only, never
 * inside a parallel region. */
void kiln_mm_single_threaded_blas(void) {
    if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
}

/* Whether a GEMM of this size is worth splitting over the threads (outside parallel regions). */
static bool mm_split_worth(int64_t M, int64_t N, int64_t K) {
    return M * N * K >= MM_SPLIT_MIN && (M > 1 || N > 1) && omp_get_max_threads() > 1 && !omp_in_parallel();
}

/* Runs the epilogue (if any) on rows [row0, row0 + rows) x columns [col0, col0 + cols) of the
 * output, rows counted over the whole output viewed as (numel / N, N). */
static void mm_epilogue_run(const kiln_mm_epilogue *epi, int64_t row0, int64_t rows, int64_t col0, int64_t cols) {
    if (epi && rows > 0 && cols > 0) epi->fn(epi->ctx, row0, rows, col0, cols);
}

/* mm_gemm over OpenMP threads: each thread runs one block of columns (when N >= M: every
 * thread then packs all of A, the smaller operand) or of rows, then the epilogue on its block
 * while it is still in cache. Column blocks start on 16-element boundaries. C's first row is
 * row `row0` of the output. */
static void mm_gemm_par(kiln_dtype ct, int64_t M, int64_t N, int64_t K, const char *A, mm_mat a,
                        const char *B, mm_mat b, char *C, int64_t ldc, bool acc, const char *bias,
                        const kiln_mm_epilogue *epi, int64_t row0) {
    if (!mm_split_worth(M, N, K)) {
        mm_gemm(ct, M, N, K, A, a, B, b, C, ldc, acc, bias);
        mm_epilogue_run(epi, row0, M, 0, N);
        return;
    }
    int64_t isz = (int64_t)kiln_dtype_size(ct);
    bool cols = N >= M;
    int64_t extent = cols ? N : M;
    int threads = omp_get_max_threads();
    if (threads > extent) threads = (int)extent;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int t = 0; t < threads; t++) {
        int64_t lo = extent * t / threads, hi = extent * (t + 1) / threads;
        if (cols) {
            lo = t == 0 ? 0 : lo & ~(int64_t)15;
            hi = t == threads - 1 ? extent : hi & ~(int64_t)15;
        }
        if (hi <= lo) continue;
        if (cols) {
            mm_mat bb = b;
            bb.cols = hi - lo;
            mm_gemm(ct, M, hi - lo, K, A, a, B + lo * b.cs * isz, bb, C + lo * isz, ldc, acc,
                    bias ? bias + lo * isz : NULL);
            mm_epilogue_run(epi, row0, M, lo, hi - lo);
        } else {
            mm_mat aa = a;
            aa.rows = hi - lo;
            mm_gemm(ct, hi - lo, N, K, A + lo * a.rs * isz, aa, B, b, C + lo * ldc * isz, ldc, acc, bias);
            mm_epilogue_run(epi, row0 + lo, hi - lo, 0, N);
        }
    }
}

static kiln_dtype mm_compute_dtype(kiln_dtype d) {
    if (d == KILN_DTYPE_FLOAT64 || (d == KILN_DTYPE_BFLOAT16 && kiln_gemm_bf16_available())) return d;
    return kiln_dtype_is_float(d) ? KILN_DTYPE_FLOAT32 : KILN_DTYPE_INT64;
}

/* Whether operand m needs a contiguous copy before a GEMM of this size in dtype ct. */
static bool mm_needs_copy(kiln_dtype ct, const mm_mat *m, int64_t M, int64_t N, int64_t K) {
    bool t;
    int64_t ld;
    return ct != KILN_DTYPE_INT64 && !mm_tiny(M, N, K) && !mm_blas_view(m, &t, &ld);
}

/* ---- matmul ----------------------------------------------------------------------------- */

/* A batched product: C[t] = A[t] @ B[t] over the broadcast batch shape, C contiguous. */
typedef struct {
    kiln_dtype ct;
    int nb;
    int64_t bshape[KILN_MAX_DIMS], sa[KILN_MAX_DIMS], sb[KILN_MAX_DIMS];
    int64_t M, N, K;
    mm_mat a, b;
} mm_plan;

/* The matrix and batch strides of one operand (`left` for the first) of a product whose batch
 * shape is (nb, bshape). */
static void mm_operand(const kiln_tensor *t, bool left, int nb, const int64_t *bshape, mm_mat *m,
                       int64_t *bstrides) {
    int nd = t->meta.ndim;
    const int64_t *sh = t->meta.shape, *st = t->strides;
    if (nd == 1) {
        *m = left ? (mm_mat){1, sh[0], sh[0], st[0]} : (mm_mat){sh[0], 1, st[0], 1};
    } else {
        *m = (mm_mat){sh[nd - 2], sh[nd - 1], st[nd - 2], st[nd - 1]};
    }
    int ob = nd >= 2 ? nd - 2 : 0;
    for (int d = 0; d < nb; d++) {
        int od = d - (nb - ob);
        bstrides[d] = (od < 0 || sh[od] == 1 || bshape[d] == 1) ? 0 : st[od];
    }
}

/* When B is shared by every batch and A's batches stack as rows of one matrix, the whole
 * product is a single GEMM; returns that stacked A. */
static bool mm_fold(const mm_plan *p, mm_mat *folded) {
    if (!(p->a.cs == 1 || p->a.cols <= 1)) return false;
    for (int d = 0; d < p->nb; d++)
        if (p->bshape[d] > 1 && p->sb[d] != 0) return false;
    int64_t size = p->M, stride = p->a.rs;
    bool have = p->M > 1;
    for (int d = p->nb - 1; d >= 0; d--) {
        if (p->bshape[d] == 1) continue;
        if (!have) {
            size = p->bshape[d], stride = p->sa[d], have = true;
            continue;
        }
        if (p->sa[d] != stride * size) return false;
        size *= p->bshape[d];
    }
    *folded = (mm_mat){size, p->K, stride, p->a.cs};
    return true;
}

/* ---- outer products ---------------------------------------------------------------------- */

#define MM_OUTER_ROW(NAME, T)                                                                \
    static void NAME(T *restrict c, T a, const T *restrict b, int64_t bcs, int64_t n) {     \
        if (bcs == 1) {                                                                      \
            _Pragma("omp simd") for (int64_t j = 0; j < n; j++) c[j] = a * b[j];             \
        } else {                                                                             \
            for (int64_t j = 0; j < n; j++) c[j] = a * b[j * bcs];                           \
        }                                                                                    \
    }
MM_OUTER_ROW(mm_outer_row_f32, float)
MM_OUTER_ROW(mm_outer_row_f64, double)

/* Rows [r0, r1) of a batched product over one element (K == 1), rows counted over the whole
 * output viewed as (numel / N, N); then the epilogue on them while they are in cache. */
static void mm_outer_rows(const mm_plan *p, const char *A, const char *B, char *C, int64_t r0, int64_t r1,
                          const kiln_mm_epilogue *epi) {
    int64_t isz = (int64_t)kiln_dtype_size(p->ct);
    for (int64_t r = r0; r < r1; r++) {
        int64_t t = r / p->M, i = r % p->M, oa = 0, ob = 0, rem = t;
        for (int d = p->nb - 1; d >= 0; d--) {
            int64_t k = rem % p->bshape[d];
            rem /= p->bshape[d];
            oa += k * p->sa[d], ob += k * p->sb[d];
        }
        const char *a = A + (oa + i * p->a.rs) * isz, *b = B + ob * isz;
        char *c = C + r * p->N * isz;
        if (p->ct == KILN_DTYPE_FLOAT32)
            mm_outer_row_f32((float *)c, *(const float *)a, (const float *)b, p->b.cs, p->N);
        else
            mm_outer_row_f64((double *)c, *(const double *)a, (const double *)b, p->b.cs, p->N);
    }
    mm_epilogue_run(epi, r0, r1 - r0, 0, p->N);
}

/* A product over one element (K == 1), as a per-example weight gradient gy x^T under kiln.vmap:
 * an outer product per batch, C[t, i, :] = A[t, i] * B[t, :], each output element written once
 * (a GEMM call per batch costs more than it computes; the products are the GEMM's, a * b + 0).
 * Its speed is the memory's write bandwidth. */
static void mm_outer(const mm_plan *p, const char *A, const char *B, char *C, const kiln_mm_epilogue *epi) {
    int64_t rows = kiln_shape_numel(p->nb, p->bshape) * p->M;
    int threads = rows * p->N >= KILN_PARALLEL_MIN && !omp_in_parallel() ? omp_get_max_threads() : 1;
    if (threads > rows) threads = (int)rows;
    if (threads <= 1) {
        mm_outer_rows(p, A, B, C, 0, rows, epi);
        return;
    }
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int t = 0; t < threads; t++) mm_outer_rows(p, A, B, C, rows * t / threads, rows * (t + 1) / threads, epi);
}

static void mm_run(const mm_plan *p, const char *A, const char *B, char *C, const kiln_mm_epilogue *epi) {
    size_t isz = kiln_dtype_size(p->ct);
    int64_t count = kiln_shape_numel(p->nb, p->bshape);
    if (count == 0 || p->M == 0 || p->N == 0) return; /* empty output */
    if (p->K == 0) {                                   /* empty sums */
        memset(C, 0, (size_t)(count * p->M * p->N) * isz);
        mm_epilogue_run(epi, 0, count * p->M, 0, p->N);
        return;
    }
    if (p->K == 1 && (p->ct == KILN_DTYPE_FLOAT32 || p->ct == KILN_DTYPE_FLOAT64)) {
        mm_outer(p, A, B, C, epi);
        return;
    }
    if (count == 1) {
        mm_gemm_par(p->ct, p->M, p->N, p->K, A, p->a, B, p->b, C, p->N, false, NULL, epi, 0);
        return;
    }
    mm_mat folded;
    if (mm_fold(p, &folded)) {
        mm_gemm_par(p->ct, folded.rows, p->N, p->K, A, folded, B, p->b, C, p->N, false, NULL, epi, 0);
        return;
    }
    int64_t work = p->M * p->N * p->K;
    int threads = omp_get_max_threads();
    bool even = count % threads == 0 || count >= 4 * threads || !mm_split_worth(p->M, p->N, p->K);
    bool par = threads > 1 && even && count * work >= MM_PARALLEL_MIN && !omp_in_parallel();
    if (!par) {
        for (int64_t t = 0; t < count; t++) {
            int64_t oa = 0, ob = 0, rem = t;
            for (int d = p->nb - 1; d >= 0; d--) {
                int64_t i = rem % p->bshape[d];
                rem /= p->bshape[d];
                oa += i * p->sa[d], ob += i * p->sb[d];
            }
            mm_gemm_par(p->ct, p->M, p->N, p->K, A + oa * (int64_t)isz, p->a, B + ob * (int64_t)isz, p->b,
                        C + t * p->M * p->N * (int64_t)isz, p->N, false, NULL, epi, t * p->M);
        }
        return;
    }
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < count; t++) {
        int64_t oa = 0, ob = 0, rem = t;
        for (int d = p->nb - 1; d >= 0; d--) {
            int64_t i = rem % p->bshape[d];
            rem /= p->bshape[d];
            oa += i * p->sa[d], ob += i * p->sb[d];
        }
        mm_gemm(p->ct, p->M, p->N, p->K, A + oa * (int64_t)isz, p->a, B + ob * (int64_t)isz, p->b,
                C + t * p->M * p->N * (int64_t)isz, p->N, false, NULL);
        mm_epilogue_run(epi, t * p->M, p->M, 0, p->N);
    }
}

KILN_INFER(matmul) {
    const kiln_meta *ma = &in[0]->meta, *mb = &in[1]->meta;
    char buf[400];
    if (ma->ndim == 0 || mb->ndim == 0)
        return kiln_error(KILN_ERR_VALUE, "matmul: operands need at least one dimension, got shapes %s",
                          kiln_shapes_str(in, 2, buf, sizeof buf));
    int64_t ka = ma->shape[ma->ndim - 1], kb = mb->shape[mb->ndim == 1 ? 0 : mb->ndim - 2];
    if (ka != kb)
        return kiln_error(KILN_ERR_VALUE, "matmul: inner dimensions of shapes %s do not match (%lld != %lld)",
                          kiln_shapes_str(in, 2, buf, sizeof buf), (long long)ka, (long long)kb);
    int ba = ma->ndim > 2 ? ma->ndim - 2 : 0, bb = mb->ndim > 2 ? mb->ndim - 2 : 0;
    int nb = ba > bb ? ba : bb;
    for (int d = 0; d < nb; d++) {
        int da = d - (nb - ba), db = d - (nb - bb);
        int64_t sa = da >= 0 ? ma->shape[da] : 1, sb = db >= 0 ? mb->shape[db] : 1;
        if (sa != sb && sa != 1 && sb != 1)
            return kiln_error(KILN_ERR_VALUE, "matmul: batch dimensions of shapes %s cannot be broadcast together",
                              kiln_shapes_str(in, 2, buf, sizeof buf));
        out->shape[d] = sa == 1 ? sb : sa;
    }
    out->ndim = nb;
    if (ma->ndim >= 2) out->shape[out->ndim++] = ma->shape[ma->ndim - 2];
    if (mb->ndim >= 2) out->shape[out->ndim++] = mb->shape[mb->ndim - 1];
    out->dtype = kiln_dtype_promote(ma->dtype, mb->dtype);
    return KILN_OK;
}

/* A new reference to t in dtype ct, contiguous when `copy`; when the dtype differs, a copy:
 * 16-bit operands of the float32 fallback widened in their own layout (lowp_pass.h), others
 * contiguous. */
static kiln_status mm_prepare(kiln_tensor *t, kiln_dtype ct, bool copy, kiln_tensor **res) {
    if (t->meta.dtype == ct && !copy) {
        kiln_tensor_retain(t);
        *res = t;
        return KILN_OK;
    }
    if (ct == KILN_DTYPE_FLOAT32 && !copy && kiln_lowp_dtype(t->meta.dtype)) return kiln_lowp_widen(t, true, res);
    return kiln_to_contiguous(t, ct, res);
}

/* The output buffer in compute dtype: out itself, or a temporary copied back by mm_finish. */
static kiln_status mm_output(kiln_tensor *out, kiln_dtype ct, kiln_tensor **c) {
    if (out->meta.dtype == ct) {
        kiln_tensor_retain(out);
        *c = out;
        return KILN_OK;
    }
    return kiln_tensor_empty(ct, out->meta.ndim, out->meta.shape, c);
}

/* A 16-bit result of the float32 fallback rounded block by block, each block as the GEMM finishes
 * it (still in cache), instead of one more pass over the whole float32 result from memory after the
 * GEMM: the same rounding (kiln_lowp_round_row, which the whole-result pass runs too) of the same
 * values, so the same bits. c and out contiguous, both viewed as (numel / N, N). */
typedef struct {
    kiln_dtype half;
    const float *c;
    char *out;
    int64_t N;
} mm_round_ctx;

static void mm_round_block(void *ctx, int64_t row0, int64_t rows, int64_t col0, int64_t cols) {
    const mm_round_ctx *r = ctx;
    for (int64_t i = row0; i < row0 + rows; i++)
        kiln_lowp_round_row(r->half, r->out + (i * r->N + col0) * 2, r->c + i * r->N + col0, cols);
}

/* The rounding epilogue for out when its float32 compute buffer c is a temporary and no other
 * epilogue runs: true (epi_out set up, rounded set: mm_finish must not copy again) or false. */
static bool mm_round_as_finished(kiln_tensor *out, kiln_tensor *c, const kiln_mm_epilogue *epi, int64_t N,
                                 mm_round_ctx *ctx, kiln_mm_epilogue *epi_out) {
    if (epi || c == out || c->meta.dtype != KILN_DTYPE_FLOAT32 || !kiln_lowp_dtype(out->meta.dtype) ||
        !kiln_tensor_is_contiguous(out) || !kiln_tensor_is_contiguous(c) || c->numel != out->numel || N <= 0)
        return false;
    *ctx = (mm_round_ctx){.half = out->meta.dtype, .c = c->data, .out = out->data, .N = N};
    *epi_out = (kiln_mm_epilogue){.fn = mm_round_block, .ctx = ctx};
    return true;
}

static kiln_status mm_finish(kiln_tensor *out, kiln_tensor *c, kiln_status s) {
    if (s == KILN_OK && c != out) s = kiln_lowp_copy_into(out, c);
    kiln_tensor_release(c);
    return s;
}

/* The epilogue runs on the compute buffer while it is hot when that is the output itself;
 * after the conversion to a 16-bit or integer output otherwise (as the unfused ops would). */
static kiln_status mm_finish_epilogue(kiln_tensor *out, kiln_tensor *c, int64_t N, const kiln_mm_epilogue *epi) {
    kiln_status s = mm_finish(out, c, KILN_OK);
    if (s == KILN_OK && epi && c != out) mm_epilogue_run(epi, 0, out->numel / max1(N), 0, N);
    return s;
}

KILN_KERNEL(matmul) { return kiln_matmul_into(in[0], in[1], out[0], NULL); }

kiln_status kiln_matmul_into(kiln_tensor *a, kiln_tensor *bt, kiln_tensor *outp, const kiln_mm_epilogue *epi) {
    kiln_tensor *in[2] = {a, bt}, **out = &outp;
    kiln_dtype ct = mm_compute_dtype(out[0]->meta.dtype);
    const kiln_meta *mo = &out[0]->meta;
    mm_plan p = {.ct = ct};
    p.nb = mo->ndim - (in[0]->meta.ndim >= 2) - (in[1]->meta.ndim >= 2);
    for (int d = 0; d < p.nb; d++) p.bshape[d] = mo->shape[d];
    kiln_tensor *x[2] = {NULL, NULL}, *c = NULL;
    kiln_status s = KILN_OK;
    for (int k = 0; k < 2 && s == KILN_OK; k++) {
        mm_mat *m = k ? &p.b : &p.a;
        int64_t *bs = k ? p.sb : p.sa;
        s = mm_prepare(in[k], ct, false, &x[k]);
        if (s != KILN_OK) break;
        mm_operand(x[k], k == 0, p.nb, p.bshape, m, bs);
        if (k == 0) p.M = m->rows, p.K = m->cols;
        else p.N = m->cols;
    }
    for (int k = 0; k < 2 && s == KILN_OK; k++) {
        mm_mat *m = k ? &p.b : &p.a;
        if (!mm_needs_copy(ct, m, p.M, p.N, p.K)) continue;
        kiln_tensor *copy;
        s = mm_prepare(x[k], ct, true, &copy);
        if (s != KILN_OK) break;
        kiln_tensor_release(x[k]);
        x[k] = copy;
        mm_operand(x[k], k == 0, p.nb, p.bshape, m, k ? p.sb : p.sa);
    }
    if (s == KILN_OK) s = mm_output(out[0], ct, &c);
    if (s == KILN_OK) {
        kiln_mm_single_threaded_blas();
        mm_round_ctx rc;
        kiln_mm_epilogue round;
        if (mm_round_as_finished(out[0], c, epi, p.N, &rc, &round)) {
            mm_run(&p, x[0]->data, x[1]->data, c->data, &round);
            kiln_tensor_release(c);
        } else {
            mm_run(&p, x[0]->data, x[1]->data, c->data, c == out[0] ? epi : NULL);
            s = mm_finish_epilogue(out[0], c, p.N, epi);
        }
    }
    kiln_release_all(x, 2);
    return s;
}

/* Reshapes to `nd` dims given by `shape` unless t already has exactly that shape. */
static kiln_status mm_reshape(kiln_tensor *t, int nd, const int64_t *shape, kiln_tensor **out) {
    bool same = t->meta.ndim == nd;
    for (int d = 0; same && d < nd; d++) same = t->meta.shape[d] == shape[d];
    if (same) {
        kiln_tensor_retain(t);
        *out = t;
        return KILN_OK;
    }
    return kiln_emit_reshape(t, nd, shape, out);
}

/* The gradient g (of the 2-D-ised operand) brought to the operand's meta m. */
static kiln_status mm_grad_to(kiln_tensor *g, const kiln_meta *m, kiln_tensor **out) {
    if (g->numel == kiln_meta_numel(m)) return mm_reshape(g, m->ndim, m->shape, out);
    return kiln_emit_sum_to(g, m, out);
}

static kiln_status mm_matmul_t(kiln_tensor *a, bool ta, kiln_tensor *b, bool tb, kiln_tensor **out) {
    kiln_tensor *x = NULL, *y = NULL;
    kiln_status s = ta ? kiln_emit_transpose_last(a, &x) : (kiln_tensor_retain(a), x = a, KILN_OK);
    if (s == KILN_OK) s = tb ? kiln_emit_transpose_last(b, &y) : (kiln_tensor_retain(b), y = b, KILN_OK);
    if (s == KILN_OK) s = kiln_emit_binary(KILN_OP_MATMUL, x, y, out);
    kiln_tensor_release(x);
    kiln_tensor_release(y);
    return s;
}

/* Rows-stacked view (rows, last) of t: its leading dims flattened. */
static kiln_status mm_flatten_rows(kiln_tensor *t, kiln_tensor **out) {
    int nd = t->meta.ndim;
    int64_t shape[2] = {1, t->meta.shape[nd - 1]};
    for (int d = 0; d < nd - 1; d++) shape[0] *= t->meta.shape[d];
    return mm_reshape(t, 2, shape, out);
}

KILN_GRAD(matmul) {
    kiln_tensor *g = gout[0];
    if (!g) return KILN_OK;
    const kiln_meta *ma = &ctx->in_meta[0], *mb = &ctx->in_meta[1];
    kiln_tensor *a2 = NULL, *b2 = NULL, *g2 = NULL, *ga = NULL, *gb = NULL, *af = NULL, *gf = NULL;
    int64_t K = ma->shape[ma->ndim - 1];
    int64_t sa[2] = {1, K}, sb[2] = {K, 1};
    kiln_status s = mm_reshape(ctx->in[0], ma->ndim == 1 ? 2 : ma->ndim, ma->ndim == 1 ? sa : ma->shape, &a2);
    if (s == KILN_OK) s = mm_reshape(ctx->in[1], mb->ndim == 1 ? 2 : mb->ndim, mb->ndim == 1 ? sb : mb->shape, &b2);
    if (s == KILN_OK) { /* g with the unit dims of 1-D operands restored */
        kiln_meta mg = g->meta;
        int nb = mg.ndim - (ma->ndim >= 2) - (mb->ndim >= 2);
        mg.ndim = nb + 2;
        mg.shape[nb] = a2->meta.shape[a2->meta.ndim - 2];
        mg.shape[nb + 1] = b2->meta.shape[b2->meta.ndim - 1];
        s = mm_reshape(g, mg.ndim, mg.shape, &g2);
    }
    if (s == KILN_OK && ctx->needs_grad[0]) {
        s = mm_matmul_t(g2, false, b2, true, &ga);
        if (s == KILN_OK) s = mm_grad_to(ga, ma, &gin[0]);
    }
    if (s == KILN_OK && ctx->needs_grad[1]) {
        if (b2->meta.ndim == 2 && a2->meta.ndim > 2) { /* the sum over batches inside one GEMM */
            s = mm_flatten_rows(a2, &af);
            if (s == KILN_OK) s = mm_flatten_rows(g2, &gf);
            if (s == KILN_OK) s = mm_matmul_t(af, true, gf, false, &gb);
        } else {
            s = mm_matmul_t(a2, true, g2, false, &gb);
        }
        if (s == KILN_OK) s = mm_grad_to(gb, mb, &gin[1]);
    }
    kiln_tensor_release(a2), kiln_tensor_release(b2), kiln_tensor_release(g2);
    kiln_tensor_release(ga), kiln_tensor_release(gb), kiln_tensor_release(af), kiln_tensor_release(gf);
    return s;
}

/* ---- linear ----------------------------------------------------------------------------- */

KILN_INFER(linear) {
    char buf[500];
    if (nin != 2 && nin != 3)
        return kiln_error(KILN_ERR_TYPE, "linear: expected 2 or 3 tensor inputs (x, w[, b]), got %d", nin);
    const kiln_meta *mx = &in[0]->meta, *mw = &in[1]->meta;
    if (mx->ndim < 1 || mw->ndim != 2 || mx->shape[mx->ndim - 1] != mw->shape[1])
        return kiln_error(KILN_ERR_VALUE, "linear: input of shape %s does not match weight (out, in) of shape %s",
                          kiln_shape_str(mx, buf, 200), kiln_shape_str(mw, buf + 200, 200));
    kiln_dtype dt = kiln_dtype_promote(mx->dtype, mw->dtype);
    if (nin == 3) {
        const kiln_meta *mb = &in[2]->meta;
        if (mb->ndim != 1 || mb->shape[0] != mw->shape[0])
            return kiln_error(KILN_ERR_VALUE, "linear: bias of shape %s does not match weight of shape %s",
                              kiln_shape_str(mb, buf, 200), kiln_shape_str(mw, buf + 200, 200));
        dt = kiln_dtype_promote(dt, mb->dtype);
    }
    *out = *mx;
    out->shape[mx->ndim - 1] = mw->shape[0];
    out->dtype = dt;
    return KILN_OK;
}

/* x as a (rows, in) matrix when its leading dims stack with one row stride. */
static bool linear_rows(const kiln_tensor *x, mm_mat *m) {
    int nd = x->meta.ndim;
    const int64_t *sh = x->meta.shape, *st = x->strides;
    int64_t cols = sh[nd - 1], size = 1, stride = cols;
    bool have = false;
    for (int d = nd - 2; d >= 0; d--) {
        if (sh[d] == 1) continue;
        if (!have) {
            size = sh[d], stride = st[d], have = true;
            continue;
        }
        if (st[d] != stride * size) return false;
        size *= sh[d];
    }
    *m = (mm_mat){size, cols, stride, st[nd - 1]};
    return true;
}

KILN_KERNEL(linear) { return kiln_linear_into(in[0], in[1], nin == 3 ? in[2] : NULL, out[0], NULL); }

kiln_status kiln_linear_into(kiln_tensor *xin, kiln_tensor *win, kiln_tensor *bias, kiln_tensor *outp,
                             const kiln_mm_epilogue *epi) {
    kiln_tensor *in[3] = {xin, win, bias}, **out = &outp;
    int nin = bias ? 3 : 2;
    kiln_dtype ct = mm_compute_dtype(out[0]->meta.dtype);
    kiln_tensor *x = NULL, *w = NULL, *b = NULL, *c = NULL;
    mm_mat ma, mb;
    kiln_status s = mm_prepare(in[0], ct, false, &x);
    if (s == KILN_OK) s = mm_prepare(in[1], ct, false, &w);
    if (s == KILN_OK && nin == 3) s = mm_prepare(in[2], ct, true, &b);
    if (s != KILN_OK) goto done;
    int64_t OUT = w->meta.shape[0], IN = w->meta.shape[1];
    bool rows = linear_rows(x, &ma);
    mb = (mm_mat){IN, OUT, w->strides[1], w->strides[0]};
    int64_t R = out[0]->numel / max1(OUT);
    if (!rows || mm_needs_copy(ct, &ma, R, OUT, IN)) {
        kiln_tensor *copy;
        if ((s = mm_prepare(x, ct, true, &copy)) != KILN_OK) goto done;
        kiln_tensor_release(x);
        x = copy;
        linear_rows(x, &ma);
    }
    if (mm_needs_copy(ct, &mb, R, OUT, IN)) {
        kiln_tensor *copy;
        if ((s = mm_prepare(w, ct, true, &copy)) != KILN_OK) goto done;
        kiln_tensor_release(w);
        w = copy;
        mb = (mm_mat){IN, OUT, 1, IN};
    }
    if ((s = mm_output(out[0], ct, &c)) != KILN_OK) goto done;
    bool bias_rows = b && ct != KILN_DTYPE_BFLOAT16; /* bfloat16 adds it before its one rounding */
    if (bias_rows) { /* every row starts as the bias; the GEMM accumulates onto it */
        size_t row = (size_t)OUT * kiln_dtype_size(ct);
#pragma omp parallel for schedule(static) if (R * OUT >= KILN_PARALLEL_MIN)
        for (int64_t r = 0; r < R; r++) memcpy((char *)c->data + (size_t)r * row, b->data, row);
    }
    kiln_mm_single_threaded_blas();
    mm_round_ctx rc;
    kiln_mm_epilogue round;
    if (mm_round_as_finished(out[0], c, epi, OUT, &rc, &round)) {
        mm_gemm_par(ct, R, OUT, IN, x->data, ma, w->data, mb, c->data, OUT, bias_rows,
                    bias_rows || !b ? NULL : b->data, &round, 0);
        kiln_tensor_release(c);
        goto done;
    }
    mm_gemm_par(ct, R, OUT, IN, x->data, ma, w->data, mb, c->data, OUT, bias_rows, bias_rows || !b ? NULL : b->data,
                c == out[0] ? epi : NULL, 0);
    s = mm_finish_epilogue(out[0], c, OUT, epi);
done:
    kiln_tensor_release(x), kiln_tensor_release(w), kiln_tensor_release(b);
    return s;
}

KILN_GRAD(linear) {
    kiln_tensor *gy = gout[0];
    if (!gy) return KILN_OK;
    kiln_tensor *x = ctx->in[0], *w = ctx->in[1], *gf = NULL, *xf = NULL;
    kiln_status s = KILN_OK;
    if (ctx->needs_grad[0]) s = kiln_emit_binary(KILN_OP_MATMUL, gy, w, &gin[0]);
    if (s == KILN_OK && ctx->needs_grad[1]) {
        s = mm_flatten_rows(gy, &gf);
        if (s == KILN_OK) s = mm_flatten_rows(x, &xf);
        if (s == KILN_OK) s = mm_matmul_t(gf, true, xf, false, &gin[1]);
    }
    if (s == KILN_OK && ctx->nin == 3 && ctx->needs_grad[2]) {
        uint64_t mask = (1ull << (gy->meta.ndim - 1)) - 1;
        if (mask) {
            s = kiln_emit_reduce(KILN_OP_SUM, gy, mask, false, &gin[2]);
        } else {
            kiln_tensor_retain(gy);
            gin[2] = gy;
        }
    }
    kiln_tensor_release(gf), kiln_tensor_release(xf);
    return s;
}
