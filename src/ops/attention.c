/* Attention: attention(q, k, v[, mask]) = softmax(scale * q @ kᵀ + mask) @ v over the last two
 * axes, with the log-sum-exp of each row of scores as a second output, its backward op and its
 * gradient rule. i[0] (causal, optional) hides key j from query i when j > i (top-left aligned):
 * the blockwise kernels skip the key blocks a query block sees none of. The mask, when given, has
 * q's number of axes, each 1 or the scores' size (..., Hq, Lq, Lk): bool (true: the key takes
 * part; false: its score is -inf) or floating point (added to the scaled scores).
 *
 * Shapes: q (..., Hq, Lq, D), k (..., Hk, Lk, D), v (..., Hk, Lk, Dv), equal leading axes, Hq a
 * multiple of Hk; query head h reads kv head h / (Hq / Hk) (grouped-query attention without
 * copies of K and V). A "unit" below is one kv head of one batch index with its Hq / Hk query
 * heads.
 *
 * Two kernels per direction:
 *   - the reference (float64 inputs): plain loops over the whole Lq x Lk score matrix of each
 *     head, materialized, softmax as written;
 *   - the blockwise one (every other float dtype, computed in float32): FlashAttention-2's
 *     loops. Forward: per block of AT_BR query rows, the key blocks of AT_BC keys in turn, each
 *     score block S = scale * Q_i K_jᵀ from sgemm, an online softmax (running row maximum m and
 *     sum l, the partial output rescaled by exp(m_old - m_new) when the maximum grows) and
 *     O_i += P V_j from sgemm; only an AT_BR x AT_BC block of scores exists at a time. Backward:
 *     per unit, per key block j, per query block i: S recomputed, P = exp(S - lse) from the saved
 *     log-sum-exp, dV_j += Pᵀ dO_i, dP = dO_i V_jᵀ, dS = P (dP - rowsum(dO o O) + glse),
 *     dQ_i += scale dS K_j, dK_j += scale dSᵀ Q_i (five sgemms per block pair).
 * Work is split by shape only (forward: one task per head and query block; backward: one per
 * unit, which owns its dK and dV and its query heads' dQ), and each task's arithmetic does not
 * depend on the thread that runs it, so results are bitwise identical for any thread count.
 * OpenBLAS runs single-threaded inside the tasks (matmul.h). */
#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <omp.h>

#include "../core/internal.h"
#include "compute_buffers.h"
#include "exp_f32.h"
#include "gemm_select.h"
#include "isa_dispatch.h"
#include "matmul.h"

/* Query rows and keys per block of the blockwise kernels (bench/bench_flash.py measured them:
 * ARCHITECTURE.md "Attention") */
#define AT_BR 64
#define AT_BC 256
/* Multiply-adds below which the forward runs on the calling thread alone */
#define AT_PARALLEL_MIN 65536

typedef struct {
    int64_t units, group; /* batch x kv heads; query heads per kv head */
    int64_t Lq, Lk, D, Dv;
    bool causal;
    const void *mask;                              /* additive, in the compute dtype; NULL: none */
    int64_t mask_lead[KILN_MAX_DIMS], mask_rs, mask_cs; /* element strides (0: broadcast) */
    int nlead;                                     /* leading axes, Hq's included */
    int64_t lead[KILN_MAX_DIMS];
} at_shape;

static int64_t at_min(int64_t a, int64_t b) { return a < b ? a : b; }

/* ---- shapes --------------------------------------------------------------------------------- */

static kiln_status at_bad(const char *op, const char *what, kiln_tensor *const *in, int nin) {
    char buf[512];
    return kiln_error(KILN_ERR_VALUE, "%s: %s; got shapes %s", op, what, kiln_shapes_str(in, nin, buf, sizeof buf));
}

/* Checks q, k, v (in[0..2]) and gives their sizes. */
static kiln_status at_shape_of(const char *op, kiln_tensor *const *in, int nin, at_shape *p) {
    const kiln_meta *q = &in[0]->meta, *k = &in[1]->meta, *v = &in[2]->meta;
    for (int t = 0; t < 3; t++)
        if (!kiln_dtype_is_float(in[t]->meta.dtype) || in[t]->meta.dtype != q->dtype)
            return kiln_error(KILN_ERR_TYPE, "%s: q, k and v must have one floating-point dtype, got %s, %s and %s", op,
                              kiln_dtype_name(q->dtype), kiln_dtype_name(k->dtype), kiln_dtype_name(v->dtype));
    const char *layout = "expected q (..., Hq, Lq, D), k (..., Hk, Lk, D), v (..., Hk, Lk, Dv) with equal leading axes "
                         "and Hq a multiple of Hk";
    int nd = q->ndim;
    if (nd < 3 || k->ndim != nd || v->ndim != nd) return at_bad(op, layout, in, nin);
    for (int d = 0; d < nd - 3; d++)
        if (k->shape[d] != q->shape[d] || v->shape[d] != q->shape[d]) return at_bad(op, layout, in, nin);
    int64_t hq = q->shape[nd - 3], hk = k->shape[nd - 3];
    if (v->shape[nd - 3] != hk || k->shape[nd - 2] != v->shape[nd - 2] || k->shape[nd - 1] != q->shape[nd - 1] ||
        (hk == 0 ? hq != 0 : hq % hk != 0))
        return at_bad(op, layout, in, nin);
    p->group = hk == 0 ? 1 : hq / hk;
    p->units = kiln_shape_numel(nd - 3, q->shape) * hk;
    p->causal = false, p->mask = NULL, p->nlead = nd - 2;
    for (int d = 0; d < nd - 2; d++) p->lead[d] = q->shape[d];
    p->Lq = q->shape[nd - 2], p->Lk = k->shape[nd - 2], p->D = q->shape[nd - 1], p->Dv = v->shape[nd - 1];
    if (p->D > INT_MAX / AT_BC || p->Dv > INT_MAX / AT_BC)
        return at_bad(op, "head dimensions this large are not supported", in, nin);
    return KILN_OK;
}

/* Checks the mask (bool or float, q's number of axes, each 1 or the scores' (..., Hq, Lq, Lk)
 * size) and sets its strides in p. */
static kiln_status at_mask_of(const char *op, kiln_tensor *const *in, int nin, const kiln_tensor *mask, at_shape *p) {
    const kiln_meta *m = &mask->meta;
    int nd = p->nlead + 2;
    if (m->dtype != KILN_DTYPE_BOOL && !kiln_dtype_is_float(m->dtype))
        return kiln_error(KILN_ERR_TYPE, "%s: the mask must be bool or floating point, got %s", op,
                          kiln_dtype_name(m->dtype));
    const char *want = "expected a mask with q's number of axes, each 1 or the scores' size (..., Hq, Lq, Lk)";
    if (m->ndim != nd) return at_bad(op, want, in, nin);
    int64_t full[KILN_MAX_DIMS], stride = 1, st[KILN_MAX_DIMS];
    for (int d = 0; d < nd - 2; d++) full[d] = p->lead[d];
    full[nd - 2] = p->Lq, full[nd - 1] = p->Lk;
    for (int d = nd - 1; d >= 0; d--) {
        if (m->shape[d] != 1 && m->shape[d] != full[d]) return at_bad(op, want, in, nin);
        st[d] = m->shape[d] == 1 ? 0 : stride;
        stride *= m->shape[d];
    }
    for (int d = 0; d < nd - 2; d++) p->mask_lead[d] = st[d];
    p->mask_rs = st[nd - 2], p->mask_cs = st[nd - 1];
    return KILN_OK;
}

/* The mask's offset of query head h (0 <= h < units * group, over (..., Hq) in order). */
static int64_t at_mask_head(const at_shape *p, int64_t h) {
    int64_t off = 0;
    for (int d = p->nlead - 1; d >= 0; d--) {
        int64_t n = p->lead[d] ? p->lead[d] : 1;
        off += (h % n) * p->mask_lead[d];
        h /= n;
    }
    return off;
}

static kiln_dtype at_compute_dtype(kiln_dtype d) { return d == KILN_DTYPE_FLOAT64 ? d : KILN_DTYPE_FLOAT32; }

/* (out (..., Hq, Lq, Dv) in q's dtype, lse (..., Hq, Lq) in the compute dtype) */
static void at_out_metas(const kiln_meta *q, const kiln_meta *v, kiln_meta *out) {
    out[0] = *q;
    out[0].shape[q->ndim - 1] = v->shape[v->ndim - 1];
    out[1] = *q;
    out[1].ndim = q->ndim - 1;
    out[1].dtype = at_compute_dtype(q->dtype);
}

/* Shapes, causal flag and mask of attention(q, k, v[, mask]) (in: q's position; mask: NULL or it) */
static kiln_status at_setup(const char *op, kiln_tensor *const *in, int nin, const kiln_attrs *a,
                            const kiln_tensor *mask, at_shape *p) {
    KILN_TRY(kiln_attrs_expect(op, a, 0, 1));
    KILN_TRY(at_shape_of(op, in, nin, p));
    p->causal = a->ni > KILN_A_ATTENTION_CAUSAL && a->i[KILN_A_ATTENTION_CAUSAL] != 0;
    return mask ? at_mask_of(op, in, nin, mask, p) : KILN_OK;
}

KILN_INFER(attention) {
    at_shape p;
    if (nin != 3 && nin != 4) return kiln_error(KILN_ERR_VALUE, "attention: expected 3 or 4 inputs, got %d", nin);
    KILN_TRY(at_setup("attention", in, nin, a, nin == 4 ? in[3] : NULL, &p));
    at_out_metas(&in[0]->meta, &in[2]->meta, out);
    return KILN_OK;
}

/* attention_backward(gout, q, k, v, out, lse[, glse[, mask]]) -> (gq, gk, gv) */
KILN_INFER(attention_backward) {
    const char *op = "attention_backward";
    at_shape p;
    kiln_meta want[2];
    if (nin < 6 || nin > 8) return kiln_error(KILN_ERR_VALUE, "%s: expected 6 to 8 inputs, got %d", op, nin);
    KILN_TRY(at_setup(op, in + 1, 3, a, nin == 8 ? in[7] : NULL, &p));
    at_out_metas(&in[1]->meta, &in[3]->meta, want);
    const int which[4] = {0, 4, 5, 6};
    const kiln_meta *wm[4] = {&want[0], &want[0], &want[1], &want[1]};
    for (int t = 0; t < 4 && which[t] < nin; t++) {
        const kiln_meta *m = &in[which[t]]->meta;
        if (!kiln_dtype_is_float(m->dtype) || !kiln_shape_equal(m, wm[t]->ndim, wm[t]->shape))
            return at_bad(op, "gout, out, lse and glse must have the shapes of attention's outputs", in, nin);
    }
    for (int t = 0; t < 3; t++) out[t] = in[1 + t]->meta;
    return KILN_OK;
}

/* ---- the reference kernels: plain loops, the score matrix materialized ------------------- */

/* P = softmax(scale q kᵀ + mask) of query head h, as written */
static void at_ref_softmax_rows(const at_shape *p, double scale, int64_t h, const double *q, const double *k,
                                double *P, double *lse) {
    const double *M = p->mask ? (const double *)p->mask + at_mask_head(p, h) : NULL;
    for (int64_t i = 0; i < p->Lq; i++) {
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < p->Lk; j++) {
            double s = 0;
            for (int64_t c = 0; c < p->D; c++) s += q[i * p->D + c] * k[j * p->D + c];
            s *= scale;
            if (M) s += M[i * p->mask_rs + j * p->mask_cs];
            if (p->causal && j > i) s = -INFINITY;
            P[i * p->Lk + j] = s;
            mx = fmax(mx, s);
        }
        for (int64_t j = 0; j < p->Lk; j++) sum += exp(P[i * p->Lk + j] - mx);
        for (int64_t j = 0; j < p->Lk; j++) P[i * p->Lk + j] = exp(P[i * p->Lk + j] - mx) / sum;
        if (lse) lse[i] = p->Lk ? mx + log(sum) : -INFINITY;
    }
}

static void at_ref_forward(const at_shape *p, double scale, const double *q, const double *k, const double *v,
                           double *o, double *lse, double *P) {
    for (int64_t h = 0; h < p->units * p->group; h++) {
        int64_t u = h / p->group;
        const double *qh = q + h * p->Lq * p->D, *ku = k + u * p->Lk * p->D, *vu = v + u * p->Lk * p->Dv;
        at_ref_softmax_rows(p, scale, h, qh, ku, P, lse + h * p->Lq);
        for (int64_t i = 0; i < p->Lq; i++)
            for (int64_t c = 0; c < p->Dv; c++) {
                double s = 0;
                for (int64_t j = 0; j < p->Lk; j++) s += P[i * p->Lk + j] * vu[j * p->Dv + c];
                o[(h * p->Lq + i) * p->Dv + c] = s;
            }
    }
}

/* gq, gk, gv arrive zeroed. P: Lq * Lk doubles. */
static void at_ref_backward(const at_shape *p, double scale, const double *go, const double *q, const double *k,
                            const double *v, const double *glse, double *gq, double *gk, double *gv, double *P) {
    for (int64_t h = 0; h < p->units * p->group; h++) {
        int64_t u = h / p->group;
        const double *qh = q + h * p->Lq * p->D, *ku = k + u * p->Lk * p->D, *vu = v + u * p->Lk * p->Dv;
        const double *goh = go + h * p->Lq * p->Dv;
        double *gqh = gq + h * p->Lq * p->D, *gku = gk + u * p->Lk * p->D, *gvu = gv + u * p->Lk * p->Dv;
        at_ref_softmax_rows(p, scale, h, qh, ku, P, NULL);
        for (int64_t i = 0; i < p->Lq; i++) {
            /* dp_j = go_i . v_j; ds_j = p_j (dp_j - sum_l p_l dp_l + glse_i) */
            double pdp = 0;
            for (int64_t j = 0; j < p->Lk; j++) {
                double dp = 0;
                for (int64_t c = 0; c < p->Dv; c++) dp += goh[i * p->Dv + c] * vu[j * p->Dv + c];
                pdp += P[i * p->Lk + j] * dp;
            }
            double g = glse ? glse[h * p->Lq + i] : 0;
            for (int64_t j = 0; j < p->Lk; j++) {
                double pij = P[i * p->Lk + j], dp = 0;
                for (int64_t c = 0; c < p->Dv; c++) {
                    dp += goh[i * p->Dv + c] * vu[j * p->Dv + c];
                    gvu[j * p->Dv + c] += pij * goh[i * p->Dv + c];
                }
                double ds = pij * (dp - pdp + g) * scale;
                for (int64_t c = 0; c < p->D; c++) {
                    gqh[i * p->D + c] += ds * ku[j * p->D + c];
                    gku[j * p->D + c] += ds * qh[i * p->D + c];
                }
            }
        }
    }
}

/* ---- the blockwise kernels (float32) ------------------------------------------------------ */

/* C (M x N, row stride ldc) = alpha * op(A) @ op(B) + beta * C, row-major; any size, empty ones
 * included (BLAS wants leading dimensions >= 1). */
static void at_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                    const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    if (M == 0 || N == 0) return;
    if (K == 0) {
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) C[i * ldc + j] = beta == 0 ? 0.0f : beta * C[i * ldc + j];
        return;
    }
    kiln_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* The blockwise kernels' loops beside the GEMMs, compiled per instruction set (isa_dispatch.h:
 * family "attention_f32"): exp_row: s[0..n) = exp(s - m), returning their sum (lanes, then
 * double); row_max; scale_row: o[0..n) *= c; grad_rows: S = S (dP - dd[r]) row by row. */
typedef struct {
    float (*exp_row)(float *restrict s, int64_t n, float m);
    float (*row_max)(const float *s, int64_t n);
    void (*scale_row)(float *o, int64_t n, float c);
    void (*grad_rows)(float *restrict S, const float *restrict dP, const float *dd, int64_t rows, int64_t cols);
} attention_kernels;

#define AT_ROWS(V)                                                                            \
    DEFINE_EXP_F32(at_exp_##V)                                                                \
    static float at_exp_row_##V(float *restrict s, int64_t n, float m) {                      \
        enum { LANES = 16 };                                                                  \
        float lanes[LANES] = {0};                                                             \
        int64_t j = 0;                                                                        \
        for (; j + LANES <= n; j += LANES)                                                    \
            for (int l = 0; l < LANES; l++) {                                                 \
                float e = at_exp_##V(s[j + l] - m);                                           \
                s[j + l] = e;                                                                 \
                lanes[l] += e;                                                                \
            }                                                                                 \
        for (int l = 0; j < n; j++, l++) {                                                    \
            float e = at_exp_##V(s[j] - m);                                                   \
            s[j] = e;                                                                         \
            lanes[l] += e;                                                                    \
        }                                                                                     \
        double t = 0;                                                                         \
        for (int l = 0; l < LANES; l++) t += lanes[l];                                        \
        return (float)t;                                                                      \
    }                                                                                         \
    static float at_row_max_##V(const float *s, int64_t n) {                                  \
        float m = -INFINITY;                                                                  \
        for (int64_t j = 0; j < n; j++) m = s[j] > m ? s[j] : m;                              \
        return m;                                                                             \
    }                                                                                         \
    static void at_scale_row_##V(float *o, int64_t n, float c) {                              \
        for (int64_t j = 0; j < n; j++) o[j] *= c;                                            \
    }                                                                                         \
    static void at_grad_rows_##V(float *restrict S, const float *restrict dP, const float *dd, \
                                 int64_t rows, int64_t cols) {                                \
        for (int64_t r = 0; r < rows; r++)                                                    \
            for (int64_t c = 0; c < cols; c++) S[r * cols + c] *= dP[r * cols + c] - dd[r];   \
    }                                                                                         \
    static const attention_kernels attention_f32_##V = {at_exp_row_##V, at_row_max_##V,       \
                                                        at_scale_row_##V, at_grad_rows_##V};

AT_ROWS(baseline)
#if KILN_ISA_VARIANTS
KILN_ISA_BEGIN_AVX2
AT_ROWS(avx2)
KILN_ISA_END
KILN_ISA_BEGIN_AVX512
AT_ROWS(avx512)
KILN_ISA_END
#endif

KILN_ISA_FAMILY(attention_f32)
#define AT_K ((const attention_kernels *)attention_f32_chosen)

/* Adds the mask to the score block S (rows x cols, query rows from i0, keys from j0) of head h
 * and hides the keys causal attention does not see. */
static void at_mask_block(const at_shape *p, int64_t h, int64_t i0, int64_t j0, int64_t rows, int64_t cols, float *S) {
    if (p->mask) {
        const float *M = (const float *)p->mask + at_mask_head(p, h) + i0 * p->mask_rs + j0 * p->mask_cs;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++) S[r * cols + c] += M[r * p->mask_rs + c * p->mask_cs];
    }
    if (p->causal)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = i0 + r + 1 - j0 < 0 ? 0 : i0 + r + 1 - j0; c < cols; c++) S[r * cols + c] = -INFINITY;
}

/* The keys query rows [i0, i0 + rows) see any of: all, or under the causal flag those up to the
 * last row's. */
static int64_t at_keys_seen(const at_shape *p, int64_t i0, int64_t rows) {
    return p->causal ? at_min(p->Lk, i0 + rows) : p->Lk;
}

/* One block of up to AT_BR query rows of head h: out rows and lse. S: AT_BR * AT_BC floats,
 * m and l: AT_BR each. */
static void at_forward_block(const at_shape *p, float scale, int64_t h, int64_t i0, const float *q, const float *k,
                             const float *v, float *o, float *lse, float *S, float *m, float *l) {
    int64_t u = h / p->group, rows = at_min(AT_BR, p->Lq - i0);
    const float *Q = q + (h * p->Lq + i0) * p->D, *K = k + u * p->Lk * p->D, *V = v + u * p->Lk * p->Dv;
    float *O = o + (h * p->Lq + i0) * p->Dv;
    const attention_kernels *kt = AT_K;
    for (int64_t r = 0; r < rows; r++) m[r] = -INFINITY, l[r] = 0;
    if (p->Lk == 0)
        for (int64_t r = 0; r < rows * p->Dv; r++) O[r] = 0;
    int64_t keys = at_keys_seen(p, i0, rows);
    for (int64_t j0 = 0; j0 < keys; j0 += AT_BC) {
        int64_t cols = at_min(AT_BC, keys - j0);
        at_gemm(false, true, rows, cols, p->D, scale, Q, p->D, K + j0 * p->D, p->D, 0.0f, S, cols);
        at_mask_block(p, h, i0, j0, rows, cols, S);
        for (int64_t r = 0; r < rows; r++) {
            float *s = S + r * cols, mx = kt->row_max(s, cols), mnew = mx > m[r] ? mx : m[r];
            float sum = 0;
            if (mnew == -INFINITY) /* every key so far masked: nothing to add yet */
                for (int64_t c = 0; c < cols; c++) s[c] = 0;
            else sum = kt->exp_row(s, cols, mnew);
            if (j0 > 0 && m[r] != mnew) { /* rescale what the earlier key blocks gave */
                float corr = expf(m[r] - mnew);
                l[r] *= corr;
                kt->scale_row(O + r * p->Dv, p->Dv, corr);
            }
            l[r] += sum;
            m[r] = mnew;
        }
        at_gemm(false, false, rows, p->Dv, cols, 1.0f, S, cols, V + j0 * p->Dv, p->Dv, j0 > 0 ? 1.0f : 0.0f, O, p->Dv);
    }
    /* a row whose every key is masked gets NaN, as softmax over -inf scores does */
    for (int64_t r = 0; r < rows && p->Lk > 0; r++) {
        kt->scale_row(O + r * p->Dv, p->Dv, l[r] > 0 ? 1.0f / l[r] : NAN);
        lse[h * p->Lq + i0 + r] = l[r] > 0 ? m[r] + logf(l[r]) : NAN;
    }
    for (int64_t r = 0; r < rows && p->Lk == 0; r++) lse[h * p->Lq + i0 + r] = -INFINITY;
}

static kiln_status at_forward_f32(const at_shape *p, float scale, const float *q, const float *k, const float *v,
                                  float *o, float *lse) {
    int64_t nqb = (p->Lq + AT_BR - 1) / AT_BR, tasks = p->units * p->group * nqb;
    int64_t work = p->units * p->group * p->Lq * p->Lk * (p->D + p->Dv);
    bool failed = false;
    kiln_mm_single_threaded_blas();
#pragma omp parallel if (tasks > 1 && work >= AT_PARALLEL_MIN && !omp_in_parallel())
    {
        float *S = kiln_malloc(sizeof(float) * (AT_BR * AT_BC + 2 * AT_BR));
        if (!S) {
#pragma omp atomic write
            failed = true;
        }
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tasks; t++)
            if (S) at_forward_block(p, scale, t / nqb, (t % nqb) * AT_BR, q, k, v, o, lse, S, S + AT_BR * AT_BC,
                                    S + AT_BR * AT_BC + AT_BR);
        free(S);
    }
    return failed ? kiln_error(KILN_ERR_MEMORY, "attention: out of memory") : KILN_OK;
}

/* Unit u's gradients; gq, gk, gv arrive zeroed. S and dP: AT_BR * AT_BC floats each, dd: group *
 * Lq. */
static void at_backward_unit(const at_shape *p, float scale, int64_t u, const float *go, const float *q,
                             const float *k, const float *v, const float *o, const float *lse, const float *glse,
                             float *gq, float *gk, float *gv, float *S, float *dP, float *dd) {
    const int64_t Lq = p->Lq, D = p->D, Dv = p->Dv, h0 = u * p->group;
    /* dd = rowsum(dO o O) - glse: the rows' shift of dS */
    for (int64_t r = 0; r < p->group * Lq; r++) {
        const float *a = go + (h0 * Lq + r) * Dv, *b = o + (h0 * Lq + r) * Dv;
        double t = 0;
        for (int64_t c = 0; c < Dv; c++) t += (double)a[c] * b[c];
        dd[r] = (float)(t - (glse ? glse[h0 * Lq + r] : 0.0f));
    }
    const float *K = k + u * p->Lk * D, *V = v + u * p->Lk * Dv;
    float *gK = gk + u * p->Lk * D, *gV = gv + u * p->Lk * Dv;
    for (int64_t j0 = 0; j0 < p->Lk; j0 += AT_BC) {
        int64_t cols = at_min(AT_BC, p->Lk - j0);
        const float *Kj = K + j0 * D, *Vj = V + j0 * Dv;
        for (int64_t g = 0; g < p->group; g++) {
            int64_t h = h0 + g;
            /* under the causal flag, the query blocks before key j0 see none of this block */
            for (int64_t i0 = p->causal ? j0 / AT_BR * AT_BR : 0; i0 < Lq; i0 += AT_BR) {
                int64_t rows = at_min(AT_BR, Lq - i0), row0 = h * Lq + i0;
                const float *Qi = q + row0 * D, *dOi = go + row0 * Dv, *L = lse + row0, *Di = dd + g * Lq + i0;
                at_gemm(false, true, rows, cols, D, scale, Qi, D, Kj, D, 0.0f, S, cols);
                at_mask_block(p, h, i0, j0, rows, cols, S);
                for (int64_t r = 0; r < rows; r++) AT_K->exp_row(S + r * cols, cols, L[r]);
                at_gemm(true, false, cols, Dv, rows, 1.0f, S, cols, dOi, Dv, 1.0f, gV + j0 * Dv, Dv);
                at_gemm(false, true, rows, cols, Dv, 1.0f, dOi, Dv, Vj, Dv, 0.0f, dP, cols);
                AT_K->grad_rows(S, dP, Di, rows, cols);
                at_gemm(false, false, rows, D, cols, scale, S, cols, Kj, D, 1.0f, gq + row0 * D, D);
                at_gemm(true, false, cols, D, rows, scale, S, cols, Qi, D, 1.0f, gK + j0 * D, D);
            }
        }
    }
}

static kiln_status at_backward_f32(const at_shape *p, float scale, const float *go, const float *q, const float *k,
                                   const float *v, const float *o, const float *lse, const float *glse, float *gq,
                                   float *gk, float *gv) {
    int64_t work = p->units * p->group * p->Lq * p->Lk * (p->D + p->Dv);
    bool failed = false;
    kiln_mm_single_threaded_blas();
#pragma omp parallel if (p->units > 1 && work >= AT_PARALLEL_MIN && !omp_in_parallel())
    {
        float *S = kiln_malloc(sizeof(float) * (size_t)(2 * AT_BR * AT_BC + p->group * p->Lq));
        if (!S) {
#pragma omp atomic write
            failed = true;
        }
#pragma omp for schedule(static)
        for (int64_t u = 0; u < p->units; u++)
            if (S)
                at_backward_unit(p, scale, u, go, q, k, v, o, lse, glse, gq, gk, gv, S, S + AT_BR * AT_BC,
                                 S + 2 * AT_BR * AT_BC);
        free(S);
    }
    return failed ? kiln_error(KILN_ERR_MEMORY, "attention_backward: out of memory") : KILN_OK;
}

/* ---- kernels -------------------------------------------------------------------------------- */

/* Zeroed output buffers in dtype ct (compute_buffers.h) */
static kiln_status at_outputs(kiln_tensor **out, int n, kiln_dtype ct, kiln_tensor **buf) {
    KILN_TRY(kiln_compute_outputs(out, n, ct, buf));
    for (int t = 0; t < n; t++) memset(buf[t]->data, 0, (size_t)buf[t]->numel * kiln_dtype_size(ct));
    return KILN_OK;
}

static kiln_status at_store(kiln_tensor **out, int n, kiln_tensor **buf, kiln_status s) {
    if (s != KILN_OK) {
        kiln_release_all(buf, n);
        return s;
    }
    return kiln_store_compute(out, n, buf);
}

static kiln_status at_scores_buffer(const char *op, const at_shape *p, double **P) {
    *P = kiln_malloc(sizeof(double) * (size_t)(p->Lq * p->Lk + 1));
    return *P ? KILN_OK : kiln_error(KILN_ERR_MEMORY, "%s: out of memory for the reference's score matrix", op);
}

/* The mask as attention adds it, in place in its compute copy c (dtype ct): a bool one's
 * 1 / 0 as 0 / -inf. */
static void at_additive_mask(const kiln_tensor *mask, kiln_tensor *c, kiln_dtype ct) {
    if (mask->meta.dtype != KILN_DTYPE_BOOL) return;
    for (int64_t e = 0; e < c->numel; e++) {
        if (ct == KILN_DTYPE_FLOAT32) ((float *)c->data)[e] = ((float *)c->data)[e] != 0 ? 0.0f : -INFINITY;
        else ((double *)c->data)[e] = ((double *)c->data)[e] != 0 ? 0.0 : -INFINITY;
    }
}

KILN_KERNEL(attention) {
    at_shape p;
    KILN_TRY(at_setup("attention", in, 3, a, nin == 4 ? in[3] : NULL, &p));
    kiln_dtype ct = at_compute_dtype(in[0]->meta.dtype);
    kiln_tensor *c[4], *buf[2];
    KILN_TRY(kiln_load_compute(in, nin, ct, c));
    if (nin == 4) at_additive_mask(in[3], c[3], ct), p.mask = c[3]->data;
    kiln_status s = at_outputs(out, 2, ct, buf);
    if (s != KILN_OK) {
        kiln_release_all(c, nin);
        return s;
    }
    if (ct == KILN_DTYPE_FLOAT32) {
        s = at_forward_f32(&p, (float)a->f[0], c[0]->data, c[1]->data, c[2]->data, buf[0]->data, buf[1]->data);
    } else {
        double *P;
        s = at_scores_buffer("attention", &p, &P);
        if (s == KILN_OK) at_ref_forward(&p, a->f[0], c[0]->data, c[1]->data, c[2]->data, buf[0]->data, buf[1]->data, P);
        free(P);
    }
    kiln_release_all(c, nin);
    return at_store(out, 2, buf, s);
}

KILN_KERNEL(attention_backward) {
    at_shape p;
    KILN_TRY(at_setup("attention_backward", in + 1, 3, a, nin == 8 ? in[7] : NULL, &p));
    kiln_dtype ct = at_compute_dtype(in[1]->meta.dtype);
    kiln_tensor *c[8], *buf[3];
    KILN_TRY(kiln_load_compute(in, nin, ct, c));
    if (nin == 8) at_additive_mask(in[7], c[7], ct), p.mask = c[7]->data;
    kiln_status s = at_outputs(out, 3, ct, buf);
    if (s != KILN_OK) {
        kiln_release_all(c, nin);
        return s;
    }
    void *glse = nin >= 7 ? c[6]->data : NULL;
    if (ct == KILN_DTYPE_FLOAT32) {
        s = at_backward_f32(&p, (float)a->f[0], c[0]->data, c[1]->data, c[2]->data, c[3]->data, c[4]->data, c[5]->data,
                            glse, buf[0]->data, buf[1]->data, buf[2]->data);
    } else {
        double *P;
        s = at_scores_buffer("attention_backward", &p, &P);
        if (s == KILN_OK)
            at_ref_backward(&p, a->f[0], c[0]->data, c[1]->data, c[2]->data, c[3]->data, glse, buf[0]->data,
                            buf[1]->data, buf[2]->data, P);
        free(P);
    }
    kiln_release_all(c, nin);
    return at_store(out, 3, buf, s);
}

/* ---- gradient rule -------------------------------------------------------------------------- */

/* With a mask, attention_backward takes glse (zeros when lse has no gradient) and the mask last;
 * the mask itself gets no gradient (kiln.ops.scaled_dot_product_attention runs the unfused ops
 * for a mask that needs one). */
KILN_GRAD(attention) {
    bool masked = ctx->nin == 4;
    if (masked && ctx->needs_grad[3])
        return kiln_error(KILN_ERR_VALUE, "attention: no gradient with respect to the mask; use the unfused ops "
                                          "(matmul, softmax, matmul) for a mask that needs one");
    if (!ctx->needs_grad[0] && !ctx->needs_grad[1] && !ctx->needs_grad[2]) return KILN_OK;
    kiln_tensor *go = gout[0], *glse = gout[1], *g[3] = {NULL, NULL, NULL};
    kiln_status s = KILN_OK;
    if (!go) s = kiln_emit_full(&ctx->out_meta[0], 0.0, &go);
    else kiln_tensor_retain(go);
    if (s == KILN_OK && masked && !glse) s = kiln_emit_full(&ctx->out_meta[1], 0.0, &glse);
    else if (glse) kiln_tensor_retain(glse);
    if (s == KILN_OK) {
        kiln_tensor *ins[8] = {go, ctx->in[0], ctx->in[1], ctx->in[2], ctx->out[0], ctx->out[1], glse,
                               masked ? ctx->in[3] : NULL};
        s = kiln_apply(KILN_OP_ATTENTION_BACKWARD, masked ? 8 : glse ? 7 : 6, ins, ctx->attrs, g);
    }
    kiln_tensor_release(go);
    kiln_tensor_release(glse);
    if (s != KILN_OK) return s;
    for (int t = 0; t < 3; t++) {
        if (ctx->needs_grad[t]) gin[t] = g[t];
        else kiln_tensor_release(g[t]);
    }
    return KILN_OK;
}
