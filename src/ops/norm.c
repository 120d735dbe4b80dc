/* Normalization: batch_norm, layer_norm, rms_norm, their backward ops and gradient rules.
 *
 * Kernels compute in float64 for float64 inputs and in float32 otherwise (float16/bfloat16
 * through float32), with statistics accumulated in double. Work is split by shape only, never
 * by thread count, and partial results are combined in a fixed order, so results are bitwise
 * identical for any number of threads. The float32 kernels are compiled once per instruction
 * set and chosen at start-up (isa_dispatch.h: family "norm_f32").
 *
 * Statistics outputs are float64 for float64 inputs and float32 otherwise. batch_norm's mean
 * and invstd have shape (C,); layer_norm/rms_norm's have x's shape with the normalized axes
 * kept as 1. batch_norm given running_mean/running_var with zero elements tracks no running
 * statistics and always normalizes with batch statistics. */
#include <math.h>

#include "../core/internal.h"
#include "compute_buffers.h"
#include "isa_dispatch.h"

/* ---- shared helpers ---------------------------------------------------------------------- */

static kiln_dtype compute_dtype(kiln_dtype d) { return d == KILN_DTYPE_FLOAT64 ? d : KILN_DTYPE_FLOAT32; }

static kiln_status shapes_error(kiln_status s, const char *op, const char *what, kiln_tensor *const *in, int nin) {
    char buf[512];
    return kiln_error(s, "%s: %s; got inputs of shapes %s", op, what, kiln_shapes_str(in, nin, buf, sizeof buf));
}

static kiln_status check_float(const char *op, kiln_tensor *const *in, int nin) {
    for (int k = 0; k < nin; k++)
        if (!kiln_dtype_is_float(in[k]->meta.dtype))
            return kiln_error(KILN_ERR_TYPE, "%s: expected floating-point inputs, input %d is %s", op, k,
                              kiln_dtype_name(in[k]->meta.dtype));
    return KILN_OK;
}

/* Element c of a 1-D float tensor of any stride. */
static double vector_get(const kiln_tensor *t, int64_t c) { return kiln_tensor_get_double(t, c); }

static void vector_set(kiln_tensor *t, int64_t c, double v) {
    char *p = (char *)t->data + c * t->strides[0] * (int64_t)kiln_dtype_size(t->meta.dtype);
    switch (t->meta.dtype) {
    case KILN_DTYPE_FLOAT16: *(uint16_t *)p = kiln_f32_to_f16((float)v); break;
    case KILN_DTYPE_BFLOAT16: *(uint16_t *)p = kiln_f32_to_bf16((float)v); break;
    case KILN_DTYPE_FLOAT32: *(float *)p = (float)v; break;
    default: *(double *)p = v; break;
    }
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
static int64_t clamp64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : (v > hi ? hi : v); }

/* Batch norm sees x as (N, C, S). Statistics are computed by tasks over a grid of blocks of
 * batch rows x blocks of channels x chunks of S, each of some 32K elements; every (row block,
 * chunk) pair is a slot whose per-channel partial results are merged in slot order. */
typedef struct {
    int64_t N, C, S;
    int64_t L, nsc;   /* S in nsc chunks of L */
    int64_t cbw, ncb; /* channel blocks of cbw channels */
    int64_t rpb, nrb; /* batch-row blocks of rpb rows */
    int64_t slots, tasks;
    bool parallel;
} bn_plan;

typedef struct {
    int64_t n0, n1, c0, c1, s0, len, slot;
} bn_task;

static bn_plan bn_plan_make(const kiln_meta *x) {
    bn_plan p = {.N = x->shape[0], .C = x->shape[1], .S = 1};
    for (int d = 2; d < x->ndim; d++) p.S *= x->shape[d];
    p.L = p.S > 65536 ? 32768 : (p.S > 0 ? p.S : 1);
    p.nsc = p.S > 0 ? ceil_div(p.S, p.L) : 1;
    int64_t seg = p.S < p.L ? (p.S > 0 ? p.S : 1) : p.L;
    p.cbw = p.nsc > 1 ? 1 : clamp64(ceil_div(4096, seg), 1, p.C > 0 ? p.C : 1);
    p.ncb = ceil_div(p.C, p.cbw);
    p.rpb = clamp64(ceil_div(32768, p.cbw * seg), 1, p.N > 0 ? p.N : 1);
    p.nrb = ceil_div(p.N, p.rpb);
    int64_t cap = ((int64_t)1 << 20) / (p.nsc * (p.C > 0 ? p.C : 1)); /* bounds the partials */
    if (cap < 1) cap = 1;
    if (p.nrb > cap) {
        p.rpb = ceil_div(p.N, cap);
        p.nrb = ceil_div(p.N, p.rpb);
    }
    p.slots = p.nrb * p.nsc;
    p.tasks = p.slots * p.ncb;
    p.parallel = p.N * p.C * p.S >= KILN_PARALLEL_MIN;
    return p;
}

static bn_task bn_task_of(const bn_plan *p, int64_t t) {
    int64_t sc = t % p->nsc, cb = (t / p->nsc) % p->ncb, rb = t / (p->nsc * p->ncb);
    bn_task k;
    k.n0 = rb * p->rpb;
    k.n1 = k.n0 + p->rpb < p->N ? k.n0 + p->rpb : p->N;
    k.c0 = cb * p->cbw;
    k.c1 = k.c0 + p->cbw < p->C ? k.c0 + p->cbw : p->C;
    k.s0 = sc * p->L;
    k.len = p->S - k.s0 < p->L ? p->S - k.s0 : p->L;
    k.slot = rb * p->nsc + sc;
    return k;
}

/* Merges the slots' (mean, M2) per channel in slot order (Chan et al.). */
static void bn_merge_moments(const bn_plan *p, const double *pm, const double *pq, double *mean, double *var) {
    for (int64_t c = 0; c < p->C; c++) {
        double na = 0, ma = 0, qa = 0;
        for (int64_t slot = 0; slot < p->slots; slot++) {
            int64_t rb = slot / p->nsc, sc = slot % p->nsc, n0 = rb * p->rpb, s0 = sc * p->L;
            int64_t rows = n0 + p->rpb < p->N ? p->rpb : p->N - n0, len = p->S - s0 < p->L ? p->S - s0 : p->L;
            double nb = (double)(rows * len), mb = pm[slot * p->C + c], qb = pq[slot * p->C + c];
            if (nb == 0) continue;
            double nab = na + nb, delta = mb - ma;
            ma += delta * nb / nab;
            qa += qb + delta * delta * na * nb / nab;
            na = nab;
        }
        mean[c] = ma;
        var[c] = na > 0 ? qa / na : 0;
    }
}

/* Layer/RMS norm backward: tasks over a grid of row blocks x column blocks; the weight
 * gradients sum per-row-block partials in order. */
typedef struct {
    int64_t R, D, W, ncb, rpb, nrb;
    bool parallel;
} ln_plan;

static ln_plan ln_plan_make(int64_t R, int64_t D) {
    ln_plan p = {.R = R, .D = D};
    p.W = D <= 2048 ? (D > 0 ? D : 1) : 1024;
    p.ncb = ceil_div(D, p.W);
    p.rpb = clamp64(ceil_div(32768, p.W), 1, R > 0 ? R : 1);
    p.nrb = ceil_div(R, p.rpb);
    int64_t cap = ((int64_t)1 << 20) / (D > 0 ? D : 1);
    if (cap < 1) cap = 1;
    if (p.nrb > cap) {
        p.rpb = ceil_div(R, cap);
        p.nrb = ceil_div(R, p.rpb);
    }
    p.parallel = R * D >= KILN_PARALLEL_MIN;
    return p;
}

/* ---- kernels per compute type --------------------------------------------------------------- */

#define NORM_KERNELS(T, SFX)                                                                                         \
    /* ---- batch norm (tasks: see bn_plan) ---- */                                                                  \
                                                                                                                     \
    /* local mean and M2 per channel of task t, into its slot of pm / pq */                                          \
    static void bn_task_moments_##SFX(const T *x, const bn_plan *p, int64_t t, double *pm, double *pq) {             \
        bn_task k = bn_task_of(p, t);                                                                                \
        double *m = pm + k.slot * p->C, *q = pq + k.slot * p->C;                                                     \
        for (int64_t c = k.c0; c < k.c1; c++) m[c] = q[c] = 0;                                                       \
        for (int64_t n = k.n0; n < k.n1; n++) {                                                                      \
            const T *row = x + n * p->C * p->S + k.s0;                                                               \
            if (p->S == 1) {                                                                                         \
                _Pragma("omp simd") for (int64_t c = k.c0; c < k.c1; c++) m[c] += (double)row[c];                    \
                continue;                                                                                            \
            }                                                                                                        \
            for (int64_t c = k.c0; c < k.c1; c++) {                                                                  \
                const T *seg = row + c * p->S;                                                                       \
                double s = 0;                                                                                        \
                _Pragma("omp simd reduction(+ : s)") for (int64_t j = 0; j < k.len; j++) s += (double)seg[j];        \
                m[c] += s;                                                                                           \
            }                                                                                                        \
        }                                                                                                            \
        double count = (double)((k.n1 - k.n0) * k.len);                                                              \
        for (int64_t c = k.c0; c < k.c1; c++) m[c] /= count;                                                         \
        for (int64_t n = k.n0; n < k.n1; n++) {                                                                      \
            const T *row = x + n * p->C * p->S + k.s0;                                                               \
            if (p->S == 1) {                                                                                         \
                _Pragma("omp simd") for (int64_t c = k.c0; c < k.c1; c++) {                                          \
                    double d = (double)row[c] - m[c];                                                                \
                    q[c] += d * d;                                                                                   \
                }                                                                                                    \
                continue;                                                                                            \
            }                                                                                                        \
            for (int64_t c = k.c0; c < k.c1; c++) {                                                                  \
                const T *seg = row + c * p->S;                                                                       \
                double mu = m[c], s = 0;                                                                             \
                _Pragma("omp simd reduction(+ : s)") for (int64_t j = 0; j < k.len; j++) {                           \
                    double d = (double)seg[j] - mu;                                                                  \
                    s += d * d;                                                                                      \
                }                                                                                                    \
                q[c] += s;                                                                                           \
            }                                                                                                        \
        }                                                                                                            \
    }                                                                                                                \
                                                                                                                     \
    /* per-channel mean and biased variance; part holds 2 * slots * C doubles */                                     \
    static void bn_stats_##SFX(const T *x, const bn_plan *p, double *part, double *mean, double *var) {              \
        double *pm = part, *pq = part + p->slots * p->C;                                                             \
        _Pragma("omp parallel for schedule(static) if (p->parallel)")                                                \
        for (int64_t t = 0; t < p->tasks; t++) bn_task_moments_##SFX(x, p, t, pm, pq);                               \
        bn_merge_moments(p, pm, pq, mean, var);                                                                      \
    }                                                                                                                \
                                                                                                                     \
    /* sums of gy and gy * (x - mean) per channel of task t, into its slot of p0 / p1; with a mask mk (not           \
     * NULL), gy is read as relu_backward(gy, mk): 0 where mk <= 0 */                                                \
    static void bn_task_grad_sums_##SFX(const T *gy, const T *mk, const T *x, const bn_plan *p, int64_t t,           \
                                        const double *mean, double *p0, double *p1) {                                \
        bn_task k = bn_task_of(p, t);                                                                                \
        double *a0 = p0 + k.slot * p->C, *a1 = p1 + k.slot * p->C;                                                   \
        for (int64_t c = k.c0; c < k.c1; c++) a0[c] = a1[c] = 0;                                                     \
        for (int64_t n = k.n0; n < k.n1; n++) {                                                                      \
            int64_t at = n * p->C * p->S + k.s0;                                                                     \
            const T *gr = gy + at, *xr = x + at, *mr = mk ? mk + at : NULL;                                          \
            if (p->S == 1) {                                                                                         \
                _Pragma("omp simd") for (int64_t c = k.c0; c < k.c1; c++) {                                          \
                    double g = mr && mr[c] <= 0 ? 0.0 : (double)gr[c];                                               \
                    a0[c] += g;                                                                                      \
                    a1[c] += g * ((double)xr[c] - mean[c]);                                                          \
                }                                                                                                    \
                continue;                                                                                            \
            }                                                                                                        \
            for (int64_t c = k.c0; c < k.c1; c++) {                                                                  \
                const T *gs = gr + c * p->S, *xs = xr + c * p->S;                                                    \
                double mu = mean[c], s0 = 0, s1 = 0;                                                                 \
                if (mr) {                                                                                            \
                    const T *ms = mr + c * p->S;                                                                     \
                    _Pragma("omp simd reduction(+ : s0, s1)") for (int64_t j = 0; j < k.len; j++) {                  \
                        double g = ms[j] <= 0 ? 0.0 : (double)gs[j];                                                 \
                        s0 += g;                                                                                     \
                        s1 += g * ((double)xs[j] - mu);                                                              \
                    }                                                                                                \
                } else {                                                                                             \
                    _Pragma("omp simd reduction(+ : s0, s1)") for (int64_t j = 0; j < k.len; j++) {                  \
                        s0 += (double)gs[j];                                                                         \
                        s1 += (double)gs[j] * ((double)xs[j] - mu);                                                  \
                    }                                                                                                \
                }                                                                                                    \
                a0[c] += s0;                                                                                         \
                a1[c] += s1;                                                                                         \
            }                                                                                                        \
        }                                                                                                            \
    }                                                                                                                \
    static void bn_grad_sums_##SFX(const T *gy, const T *mk, const T *x, const bn_plan *p, const double *mean,       \
                                   double *part, double *sg, double *sgx) {                                          \
        double *p0 = part, *p1 = part + p->slots * p->C;                                                             \
        _Pragma("omp parallel for schedule(static) if (p->parallel)")                                                \
        for (int64_t t = 0; t < p->tasks; t++) bn_task_grad_sums_##SFX(gy, mk, x, p, t, mean, p0, p1);               \
        for (int64_t c = 0; c < p->C; c++) {                                                                         \
            double s0 = 0, s1 = 0;                                                                                   \
            for (int64_t slot = 0; slot < p->slots; slot++) {                                                        \
                s0 += p0[slot * p->C + c];                                                                           \
                s1 += p1[slot * p->C + c];                                                                           \
            }                                                                                                        \
            sg[c] = s0;                                                                                              \
            sgx[c] = s1;                                                                                             \
        }                                                                                                            \
    }                                                                                                                \
                                                                                                                     \
    /* Per-channel coefficients expanded to one (C, S) sample, for short spatial extents; NULL                       \
     * when S is long (loops then run per (n, c) row) or on allocation failure. */                                   \
    static T *bn_expand_##SFX(const bn_plan *p, int count, const double *const *coef) {                              \
        int64_t cs = p->C * p->S;                                                                                    \
        if (p->S >= 32 || cs > 65536) return NULL;                                                                   \
        T *e = kiln_malloc(sizeof(T) * (size_t)(count * cs + 1));                                                         \
        for (int k = 0; e && k < count; k++)                                                                         \
            for (int64_t j = 0; j < cs; j++) e[k * cs + j] = (T)coef[k][j / p->S];                                   \
        return e;                                                                                                    \
    }                                                                                                                \
                                                                                                                     \
    /* y = x * scale[c] + shift[c] */                                                                                \
    static void bn_affine_##SFX(const T *x, T *y, const bn_plan *p, const double *scale, const double *shift) {      \
        const double *coef[2] = {scale, shift};                                                                      \
        int64_t cs = p->C * p->S;                                                                                    \
        T *e = bn_expand_##SFX(p, 2, coef);                                                                          \
        if (e) {                                                                                                     \
            const T *es = e, *eh = e + cs;                                                                           \
            _Pragma("omp parallel for schedule(static) if (p->parallel)")                                            \
            for (int64_t n = 0; n < p->N; n++) {                                                                     \
                const T *xr = x + n * cs;                                                                            \
                T *yr = y + n * cs;                                                                                  \
                _Pragma("omp simd") for (int64_t j = 0; j < cs; j++) yr[j] = xr[j] * es[j] + eh[j];                  \
            }                                                                                                        \
            free(e);                                                                                                 \
            return;                                                                                                  \
        }                                                                                                            \
        int64_t rows = p->N * p->C;                                                                                  \
        _Pragma("omp parallel for schedule(static) if (p->parallel)")                                                \
        for (int64_t r = 0; r < rows; r++) {                                                                         \
            const T sc = (T)scale[r % p->C], sh = (T)shift[r % p->C];                                                \
            const T *xr = x + r * p->S;                                                                              \
            T *yr = y + r * p->S;                                                                                    \
            _Pragma("omp simd") for (int64_t s = 0; s < p->S; s++) yr[s] = xr[s] * sc + sh;                          \
        }                                                                                                            \
    }                                                                                                                \
                                                                                                                     \
    /* gx = k1[c] * gy + k2[c] * (x - mean[c]) + k3[c], gy masked by mk as in bn_task_grad_sums */                   \
    static void bn_grad_input_##SFX(const T *gy, const T *mk, const T *x, T *gx, const bn_plan *p,                   \
                                    const double *mean, const double *k1, const double *k2, const double *k3) {      \
        const double *coef[4] = {k1, k2, mean, k3};                                                                  \
        int64_t cs = p->C * p->S;                                                                                    \
        T *e = bn_expand_##SFX(p, 4, coef);                                                                          \
        if (e) {                                                                                                     \
            const T *ea = e, *eb = e + cs, *em = e + 2 * cs, *ed = e + 3 * cs;                                       \
            _Pragma("omp parallel for schedule(static) if (p->parallel)")                                            \
            for (int64_t n = 0; n < p->N; n++) {                                                                     \
                const T *gr = gy + n * cs, *xr = x + n * cs;                                                         \
                T *o = gx + n * cs;                                                                                  \
                if (mk) {                                                                                            \
                    const T *mr = mk + n * cs;                                                                       \
                    _Pragma("omp simd") for (int64_t j = 0; j < cs; j++) {                                           \
                        T g = mr[j] <= 0 ? (T)0 : gr[j];                                                             \
                        o[j] = ea[j] * g + eb[j] * (xr[j] - em[j]) + ed[j];                                          \
                    }                                                                                                \
                } else {                                                                                             \
                    _Pragma("omp simd") for (int64_t j = 0; j < cs; j++)                                             \
                        o[j] = ea[j] * gr[j] + eb[j] * (xr[j] - em[j]) + ed[j];                                      \
                }                                                                                                    \
            }                                                                                                        \
            free(e);                                                                                                 \
            return;                                                                                                  \
        }                                                                                                            \
        int64_t rows = p->N * p->C;                                                                                  \
        _Pragma("omp parallel for schedule(static) if (p->parallel)")                                                \
        for (int64_t r = 0; r < rows; r++) {                                                                         \
            int64_t c = r % p->C;                                                                                    \
            const T a = (T)k1[c], b = (T)k2[c], d = (T)k3[c], mu = (T)mean[c];                                       \
            const T *gr = gy + r * p->S, *xr = x + r * p->S;                                                         \
            T *o = gx + r * p->S;                                                                                    \
            if (mk) {                                                                                                \
                const T *mr = mk + r * p->S;                                                                         \
                _Pragma("omp simd") for (int64_t s = 0; s < p->S; s++) {                                             \
                    T g = mr[s] <= 0 ? (T)0 : gr[s];                                                                 \
                    o[s] = a * g + b * (xr[s] - mu) + d;                                                             \
                }                                                                                                    \
            } else {                                                                                                 \
                _Pragma("omp simd") for (int64_t s = 0; s < p->S; s++) o[s] = a * gr[s] + b * (xr[s] - mu) + d;      \
            }                                                                                                        \
        }                                                                                                            \
    }                                                                                                                \
                                                                                                                \
                                                                                                                     \
    /* ---- layer norm (centered) and rms norm over rows of D ---- */                                                \
                                                                                                                     \
    /* b and mean may be NULL */                                                                                     \
    static void ln_forward_##SFX(const T *x, const T *w, const T *b, T *y, T *mean, T *rstd, int64_t R, int64_t D,   \
                                 double eps, bool centered) {                                                        \
        _Pragma("omp parallel for schedule(static) if (R * D >= KILN_PARALLEL_MIN)")                                 \
        for (int64_t r = 0; r < R; r++) {                                                                            \
            const T *xr = x + r * D;                                                                                 \
            T *yr = y + r * D;                                                                                       \
            double sum = 0, q = 0;                                                                                   \
            if (centered) {                                                                                          \
                _Pragma("omp simd reduction(+ : sum)") for (int64_t j = 0; j < D; j++) sum += (double)xr[j];         \
            }                                                                                                        \
            double mu = centered ? sum / (double)D : 0.0;                                                            \
            _Pragma("omp simd reduction(+ : q)") for (int64_t j = 0; j < D; j++) {                                   \
                double d = (double)xr[j] - mu;                                                                       \
                q += d * d;                                                                                          \
            }                                                                                                        \
            double rs = 1.0 / sqrt(q / (double)D + eps);                                                             \
            if (mean) mean[r] = (T)mu;                                                                               \
            rstd[r] = (T)rs;                                                                                         \
            const T tm = (T)mu, tr = (T)rs;                                                                          \
            if (b) {                                                                                                 \
                _Pragma("omp simd") for (int64_t j = 0; j < D; j++) yr[j] = (xr[j] - tm) * tr * w[j] + b[j];         \
            } else {                                                                                                 \
                _Pragma("omp simd") for (int64_t j = 0; j < D; j++) yr[j] = (xr[j] - tm) * tr * w[j];                \
            }                                                                                                        \
        }                                                                                                            \
    }                                                                                                                \
                                                                                                                     \
    /* mean(g) (0 when not centered) and mean(g * xhat) of one row, g = gy * w */                                    \
    static void ln_row_sums_##SFX(const T *gr, const T *xr, const T *w, int64_t D, double mu, double rs, bool centered, \
                                  double *out) {                                                                     \
        double a = 0, b = 0;                                                                                         \
        _Pragma("omp simd reduction(+ : a, b)") for (int64_t j = 0; j < D; j++) {                                    \
            double g = (double)gr[j] * (double)w[j];                                                                 \
            a += g;                                                                                                  \
            b += g * ((double)xr[j] - mu) * rs;                                                                      \
        }                                                                                                            \
        out[0] = centered ? a / (double)D : 0.0;                                                                     \
        out[1] = b / (double)D;                                                                                      \
    }                                                                                                                \
                                                                                                                     \
    /* gx; gw and gb (gb may be NULL) through per-row-block partials; mean NULL for rms norm.                        \
     * part holds 2 * nrb * D doubles, rowsums 2 * R (used when rows are split across tasks) */                      \
    static void ln_backward_##SFX(const T *gy, const T *x, const T *w, const T *mean, const T *rstd, T *gx, T *gw, T *gb, \
                                  const ln_plan *lp, double *part, double *rowsums) {                                \
        const int64_t D = lp->D, R = lp->R;                                                                          \
        if (lp->ncb > 1) {                                                                                           \
            _Pragma("omp parallel for schedule(static) if (lp->parallel)")                                           \
            for (int64_t r = 0; r < R; r++)                                                                          \
                ln_row_sums_##SFX(gy + r * D, x + r * D, w, D, mean ? (double)mean[r] : 0.0, (double)rstd[r], mean != NULL, \
                                  rowsums + 2 * r);                                                                  \
        }                                                                                                            \
        _Pragma("omp parallel for schedule(static) if (lp->parallel)")                                               \
        for (int64_t t = 0; t < lp->nrb * lp->ncb; t++) {                                                            \
            int64_t rb = t / lp->ncb, cb = t % lp->ncb, j0 = cb * lp->W, j1 = j0 + lp->W < D ? j0 + lp->W : D;       \
            int64_t r0 = rb * lp->rpb, r1 = r0 + lp->rpb < R ? r0 + lp->rpb : R;                                     \
            double *pw = part + 2 * rb * D, *pb = pw + D, local[2];                                                  \
            for (int64_t j = j0; j < j1; j++) pw[j] = pb[j] = 0;                                                     \
            for (int64_t r = r0; r < r1; r++) {                                                                      \
                const T *xr = x + r * D, *gr = gy + r * D;                                                           \
                T *o = gx + r * D;                                                                                   \
                double mu = mean ? (double)mean[r] : 0.0, rs = (double)rstd[r];                                      \
                const double *sums = rowsums + 2 * r;                                                                \
                if (lp->ncb == 1) {                                                                                  \
                    ln_row_sums_##SFX(gr, xr, w, D, mu, rs, mean != NULL, local);                                    \
                    sums = local;                                                                                    \
                }                                                                                                    \
                const double sa = sums[0], sb = sums[1];                                                             \
                _Pragma("omp simd") for (int64_t j = j0; j < j1; j++) {                                              \
                    double xh = ((double)xr[j] - mu) * rs, g = (double)gr[j];                                        \
                    o[j] = (T)(rs * (g * (double)w[j] - sa - xh * sb));                                              \
                    pw[j] += g * xh;                                                                                 \
                    pb[j] += g;                                                                                      \
                }                                                                                                    \
            }                                                                                                        \
        }                                                                                                            \
        _Pragma("omp parallel for schedule(static) if (lp->parallel)")                                               \
        for (int64_t j = 0; j < D; j++) {                                                                            \
            double sw = 0, sbias = 0;                                                                                \
            for (int64_t rb = 0; rb < lp->nrb; rb++) {                                                               \
                sw += part[2 * rb * D + j];                                                                          \
                sbias += part[2 * rb * D + D + j];                                                                   \
            }                                                                                                        \
            gw[j] = (T)sw;                                                                                           \
            if (gb) gb[j] = (T)sbias;                                                                                \
        }                                                                                                            \
    }

NORM_KERNELS(double, f64)

/* float32, the hot type, compiled per instruction set (isa_dispatch.h): a table per variant */
typedef struct {
    void (*bn_stats)(const float *x, const bn_plan *p, double *part, double *mean, double *var);
    void (*bn_grad_sums)(const float *gy, const float *mk, const float *x, const bn_plan *p, const double *mean,
                         double *part, double *sg, double *sgx);
    void (*bn_affine)(const float *x, float *y, const bn_plan *p, const double *scale, const double *shift);
    void (*bn_grad_input)(const float *gy, const float *mk, const float *x, float *gx, const bn_plan *p,
                          const double *mean, const double *k1, const double *k2, const double *k3);
    void (*ln_forward)(const float *x, const float *w, const float *b, float *y, float *mean, float *rstd, int64_t R,
                       int64_t D, double eps, bool centered);
    void (*ln_backward)(const float *gy, const float *x, const float *w, const float *mean, const float *rstd,
                        float *gx, float *gw, float *gb, const ln_plan *lp, double *part, double *rowsums);
} norm_kernels;
#define NORM_TABLE(SFX) \
    {bn_stats_##SFX, bn_grad_sums_##SFX, bn_affine_##SFX, bn_grad_input_##SFX, ln_forward_##SFX, ln_backward_##SFX}

NORM_KERNELS(float, f32)
static const norm_kernels norm_f32_baseline = NORM_TABLE(f32);
#if KILN_ISA_VARIANTS
KILN_ISA_BEGIN_AVX2
NORM_KERNELS(float, f32_avx2)
KILN_ISA_END
static const norm_kernels norm_f32_avx2 = NORM_TABLE(f32_avx2);
KILN_ISA_BEGIN_AVX512
NORM_KERNELS(float, f32_avx512)
KILN_ISA_END
static const norm_kernels norm_f32_avx512 = NORM_TABLE(f32_avx512);
#endif

KILN_ISA_FAMILY(norm_f32)

#define DISPATCH(f64, FN, ...) ((f64) ? FN##_f64(__VA_ARGS__) : ((const norm_kernels *)norm_f32_chosen)->FN(__VA_ARGS__))

/* ---- batch_norm ------------------------------------------------------------------------------ */

/* Whether batch statistics are used: in training, or when no running statistics are given
 * (running_mean and running_var with zero elements). */
static bool bn_batch_stats(const kiln_attrs *a, const kiln_meta *running_mean) {
    return a->i[0] != 0 || kiln_meta_numel(running_mean) == 0;
}

static kiln_status bn_check_vectors(const char *op, kiln_tensor *const *in, int nin, int first, int count, int64_t C,
                                    bool allow_empty) {
    for (int k = first; k < first + count; k++) {
        const kiln_meta *m = &in[k]->meta;
        bool ok = m->ndim == 1 && (m->shape[0] == C || (allow_empty && m->shape[0] == 0));
        if (!ok) {
            char what[160];
            snprintf(what, sizeof what, "input %d must have shape (%lld,) (the channels of the input)", k, (long long)C);
            return shapes_error(KILN_ERR_VALUE, op, what, in, nin);
        }
    }
    return KILN_OK;
}

KILN_INFER(batch_norm) {
    const char *op = "batch_norm";
    KILN_TRY(kiln_attrs_expect(op, a, 1, 2));
    KILN_TRY(check_float(op, in, nin));
    const kiln_meta *x = &in[0]->meta;
    if (x->ndim < 2) return shapes_error(KILN_ERR_VALUE, op, "the input must have at least 2 dimensions (N, C, ...)", in, nin);
    int64_t C = x->shape[1];
    KILN_TRY(bn_check_vectors(op, in, nin, 1, 2, C, false));
    KILN_TRY(bn_check_vectors(op, in, nin, 3, 2, C, true));
    if ((in[3]->meta.shape[0] == 0) != (in[4]->meta.shape[0] == 0))
        return shapes_error(KILN_ERR_VALUE, op, "running_mean and running_var must both be given or both be empty", in, nin);
    if (!(a->f[0] >= 0) || !isfinite(a->f[1]))
        return kiln_error(KILN_ERR_VALUE, "%s: eps must be >= 0 and momentum finite, got %g and %g", op, a->f[0], a->f[1]);
    if (bn_batch_stats(a, &in[3]->meta) && C > 0 && kiln_meta_numel(x) / C <= 1)
        return shapes_error(KILN_ERR_VALUE, op, "expected more than 1 value per channel when using batch statistics", in, nin);
    out[0] = *x;
    kiln_meta_set(&out[1], compute_dtype(x->dtype), 1, &C);
    out[2] = out[1];
    return KILN_OK;
}

KILN_KERNEL(batch_norm) {
    kiln_dtype ct = compute_dtype(in[0]->meta.dtype);
    bool f64 = ct == KILN_DTYPE_FLOAT64, batch = bn_batch_stats(a, &in[3]->meta);
    bn_plan p = bn_plan_make(&in[0]->meta);
    double eps = a->f[0], momentum = a->f[1];
    if (batch && in[3]->meta.shape[0] > 0) { /* the running statistics are updated in place */
        KILN_TRY(kiln_check_writable("batch_norm", "the running mean", in[3]));
        KILN_TRY(kiln_check_writable("batch_norm", "the running variance", in[4]));
    }
    kiln_tensor *x, *buf[3];
    KILN_TRY(kiln_to_contiguous(in[0], ct, &x));
    kiln_status s = kiln_compute_outputs(out, 3, ct, buf);
    int64_t C = p.C;
    double *mem = kiln_malloc(sizeof(double) * (size_t)(4 * C + 2 * C * p.slots + 1));
    if (!mem && s == KILN_OK) s = kiln_error(KILN_ERR_MEMORY, "batch_norm: out of memory");
    if (s != KILN_OK) {
        kiln_tensor_release(x);
        kiln_release_all(buf, 3);
        free(mem);
        return s;
    }
    double *mean = mem, *var = mem + C, *scale = mem + 2 * C, *shift = mem + 3 * C, *part = mem + 4 * C;
    if (batch) {
        DISPATCH(f64, bn_stats, x->data, &p, part, mean, var);
    } else {
        for (int64_t c = 0; c < C; c++) {
            mean[c] = vector_get(in[3], c);
            var[c] = vector_get(in[4], c);
        }
    }
    for (int64_t c = 0; c < C; c++) {
        double invstd = 1.0 / sqrt(var[c] + eps), gamma = vector_get(in[1], c), beta = vector_get(in[2], c);
        scale[c] = invstd * gamma;
        shift[c] = beta - mean[c] * scale[c];
        if (f64) {
            ((double *)buf[1]->data)[c] = mean[c];
            ((double *)buf[2]->data)[c] = invstd;
        } else {
            ((float *)buf[1]->data)[c] = (float)mean[c];
            ((float *)buf[2]->data)[c] = (float)invstd;
        }
    }
    DISPATCH(f64, bn_affine, x->data, buf[0]->data, &p, scale, shift);
    if (batch && in[3]->meta.shape[0] > 0) { /* running statistics, unbiased variance */
        double m = (double)(p.N * p.S), unbias = m / (m - 1);
        for (int64_t c = 0; c < C; c++) {
            vector_set(in[3], c, (1 - momentum) * vector_get(in[3], c) + momentum * mean[c]);
            vector_set(in[4], c, (1 - momentum) * vector_get(in[4], c) + momentum * var[c] * unbias);
        }
        kiln_tensor_bump_version(in[3]);
        kiln_tensor_bump_version(in[4]);
    }
    free(mem);
    kiln_tensor_release(x);
    return kiln_store_compute(out, 3, buf);
}

/* (gy, x, gamma, mean, invstd) -> (gx, ggamma, gbeta); i[0] = batch statistics were used */
static kiln_status bn_backward_infer(const char *op, kiln_tensor *const *in, int nin, const kiln_attrs *a,
                                     kiln_meta *out) {
    KILN_TRY(kiln_attrs_expect(op, a, 1, 0));
    KILN_TRY(check_float(op, in, nin));
    const kiln_meta *x = &in[1]->meta;
    if (x->ndim < 2 || !kiln_shape_equal(&in[0]->meta, x->ndim, x->shape))
        return shapes_error(KILN_ERR_VALUE, op, "expected gy and x of one shape (N, C, ...)", in, nin);
    if (nin > 5 && !kiln_shape_equal(&in[5]->meta, x->ndim, x->shape))
        return shapes_error(KILN_ERR_VALUE, op, "expected the relu input of x's shape (N, C, ...)", in, nin);
    KILN_TRY(bn_check_vectors(op, in, 5, 2, 3, x->shape[1], false));
    out[0] = *x;
    out[1] = in[2]->meta;
    out[2] = in[2]->meta;
    return KILN_OK;
}

KILN_INFER(batch_norm_backward) { return bn_backward_infer("batch_norm_backward", in, nin, a, out); }

/* batch_norm_backward, its gy masked as relu_backward(gy, in[5]) when nin is 6: the sums and gx read
 * gy and the mask together, the masked gy is never stored */
static kiln_status bn_backward(const char *op, kiln_tensor *const *in, int nin, const kiln_attrs *a,
                               kiln_tensor **out) {
    kiln_dtype ct = compute_dtype(in[1]->meta.dtype);
    bool f64 = ct == KILN_DTYPE_FLOAT64, batch = a->i[0] != 0;
    bn_plan p = bn_plan_make(&in[1]->meta);
    int64_t C = p.C;
    kiln_tensor *c[3] = {NULL, NULL, NULL}, *buf[3];
    kiln_tensor *loaded[3] = {in[0], in[1], nin > 5 ? in[5] : NULL};
    KILN_TRY(kiln_load_compute(loaded, nin > 5 ? 3 : 2, ct, c));
    kiln_status s = kiln_compute_outputs(out, 3, ct, buf);
    double *mem = s == KILN_OK ? kiln_malloc(sizeof(double) * (size_t)(6 * C + 2 * C * p.slots + 1)) : NULL;
    if (!mem && s == KILN_OK) {
        kiln_release_all(buf, 3);
        s = kiln_error(KILN_ERR_MEMORY, "%s: out of memory", op);
    }
    if (s != KILN_OK) {
        kiln_release_all(c, 3);
        return s;
    }
    const void *mk = c[2] ? c[2]->data : NULL;
    double *mean = mem, *sg = mem + C, *sgx = mem + 2 * C, *k1 = mem + 3 * C, *k2 = mem + 4 * C, *k3 = mem + 5 * C;
    for (int64_t ch = 0; ch < C; ch++) mean[ch] = vector_get(in[3], ch);
    DISPATCH(f64, bn_grad_sums, c[0]->data, mk, c[1]->data, &p, mean, mem + 6 * C, sg, sgx);
    double m = (double)(p.N * p.S);
    for (int64_t ch = 0; ch < C; ch++) {
        double gamma = vector_get(in[2], ch), invstd = vector_get(in[4], ch), ggamma = sgx[ch] * invstd;
        k1[ch] = gamma * invstd;
        k2[ch] = batch ? -gamma * invstd * invstd * invstd * sgx[ch] / m : 0.0;
        k3[ch] = batch ? -gamma * invstd * sg[ch] / m : 0.0;
        if (f64) {
            ((double *)buf[1]->data)[ch] = ggamma;
            ((double *)buf[2]->data)[ch] = sg[ch];
        } else {
            ((float *)buf[1]->data)[ch] = (float)ggamma;
            ((float *)buf[2]->data)[ch] = (float)sg[ch];
        }
    }
    DISPATCH(f64, bn_grad_input, c[0]->data, mk, c[1]->data, buf[0]->data, &p, mean, k1, k2, k3);
    free(mem);
    kiln_release_all(c, 3);
    return kiln_store_compute(out, 3, buf);
}

KILN_KERNEL(batch_norm_backward) { return bn_backward("batch_norm_backward", in, nin, a, out); }

/* (gy, x, gamma, mean, invstd, r) -> batch_norm_backward(relu_backward(gy, r), x, gamma, mean, invstd):
 * the fusion of src/passes/fuse_bn_relu_backward.c */
KILN_INFER(batch_norm_relu_backward) { return bn_backward_infer("batch_norm_relu_backward", in, nin, a, out); }

KILN_KERNEL(batch_norm_relu_backward) { return bn_backward("batch_norm_relu_backward", in, nin, a, out); }

/* ---- gradient rules ------------------------------------------------------------------------ */

/* *acc = op(*acc, b); b borrowed, the old *acc released. */
static kiln_status emit_into(kiln_op op, kiln_tensor **acc, kiln_tensor *b) {
    kiln_tensor *r;
    KILN_TRY(kiln_emit_binary(op, *acc, b, &r));
    kiln_tensor_release(*acc);
    *acc = r;
    return KILN_OK;
}

/* *acc = op(*acc, scalar value) */
static kiln_status emit_into_scalar(kiln_op op, kiln_tensor **acc, double value) {
    kiln_tensor *v;
    KILN_TRY(kiln_emit_scalar(value, (*acc)->meta.dtype, &v));
    kiln_status s = emit_into(op, acc, v);
    kiln_tensor_release(v);
    return s;
}

/* Gradient reaching x through the statistics outputs of a normalization over `count` values:
 * mean = sum(x) / count and rstd = (sum((x - mean)^2) / count + eps)^-1/2 (mean NULL: rms,
 * rstd = (sum(x^2) / count + eps)^-1/2). All statistic tensors broadcast against x. Adds the
 * result to *gx (or sets it). */
static kiln_status stats_grad(kiln_tensor *x, kiln_tensor *mean, kiln_tensor *rstd, kiln_tensor *gmean,
                              kiln_tensor *grstd, double count, kiln_tensor **gx) {
    kiln_tensor *acc = NULL, *t = NULL;
    kiln_status s = KILN_OK;
    if (grstd) { /* d rstd / dx = -rstd^3 (x - mean) / count */
        kiln_tensor_retain(rstd);
        acc = rstd;
        s = emit_into(KILN_OP_MUL, &acc, rstd);
        if (s == KILN_OK) s = emit_into(KILN_OP_MUL, &acc, rstd);
        if (s == KILN_OK) s = emit_into(KILN_OP_MUL, &acc, grstd);
        if (s == KILN_OK) s = emit_into_scalar(KILN_OP_MUL, &acc, -1.0 / count);
        if (s == KILN_OK && mean) {
            s = kiln_emit_binary(KILN_OP_SUB, x, mean, &t);
            if (s == KILN_OK) s = emit_into(KILN_OP_MUL, &acc, t);
            kiln_tensor_release(t);
        } else if (s == KILN_OK) {
            s = emit_into(KILN_OP_MUL, &acc, x);
        }
    }
    if (s == KILN_OK && gmean) { /* d mean / dx = 1 / count */
        kiln_tensor_retain(gmean);
        t = gmean;
        s = emit_into_scalar(KILN_OP_MUL, &t, 1.0 / count);
        if (s == KILN_OK) {
            if (acc)
                s = emit_into(KILN_OP_ADD, &acc, t);
            else
                s = kiln_emit_expand(t, x->meta.ndim, x->meta.shape, &acc);
        }
        kiln_tensor_release(t);
    }
    if (s == KILN_OK && acc) {
        if (*gx)
            s = emit_into(KILN_OP_ADD, gx, acc);
        else {
            kiln_tensor_retain(acc);
            *gx = acc;
        }
    }
    kiln_tensor_release(acc);
    return s;
}

/* Reshapes a (C,) tensor to (C, 1, ..., 1), broadcastable against an (N, C, ...) input. */
static kiln_status channel_view(kiln_tensor *v, int ndim, kiln_tensor **out) {
    int64_t shape[KILN_MAX_DIMS];
    shape[0] = v->meta.shape[0];
    for (int d = 1; d < ndim - 1; d++) shape[d] = 1;
    return kiln_emit_reshape(v, ndim - 1, shape, out);
}

/* Hands gin[k] the computed gradients where needed (zeros where nothing reached them). */
static kiln_status finish_grads(const kiln_grad_ctx *ctx, kiln_tensor **g, int n, kiln_tensor **gin) {
    kiln_status s = KILN_OK;
    for (int k = 0; k < n; k++) {
        if (ctx->needs_grad[k] && s == KILN_OK) {
            if (g[k]) {
                gin[k] = g[k];
                g[k] = NULL;
            } else {
                s = kiln_emit_full(&ctx->in_meta[k], 0.0, &gin[k]);
            }
        }
    }
    kiln_release_all(g, n);
    if (s != KILN_OK) kiln_release_all(gin, n);
    return s;
}

KILN_GRAD(batch_norm) {
    kiln_tensor *g[3] = {NULL, NULL, NULL};
    bool batch = bn_batch_stats(ctx->attrs, &ctx->in_meta[3]);
    kiln_status s = KILN_OK;
    if (gout[0] && (ctx->needs_grad[0] || ctx->needs_grad[1] || ctx->needs_grad[2])) {
        kiln_tensor *ins[5] = {gout[0], ctx->in[0], ctx->in[1], ctx->out[1], ctx->out[2]};
        kiln_attrs at;
        kiln_attrs_clear(&at);
        kiln_attrs_push_int(&at, batch);
        s = kiln_apply(KILN_OP_BATCH_NORM_BACKWARD, 5, ins, &at, g);
    }
    if (s == KILN_OK && batch && ctx->needs_grad[0] && (gout[1] || gout[2])) {
        kiln_tensor *v[4] = {NULL, NULL, NULL, NULL}, *src[4] = {ctx->out[1], ctx->out[2], gout[1], gout[2]};
        int nd = ctx->in_meta[0].ndim;
        for (int k = 0; k < 4 && s == KILN_OK; k++)
            if (src[k]) s = channel_view(src[k], nd, &v[k]);
        double count = (double)(kiln_meta_numel(&ctx->in_meta[0]) / ctx->in_meta[0].shape[1]);
        if (s == KILN_OK) s = stats_grad(ctx->in[0], v[0], v[1], v[2], v[3], count, &g[0]);
        kiln_release_all(v, 4);
    }
    if (s != KILN_OK) {
        kiln_release_all(g, 3);
        return s;
    }
    return finish_grads(ctx, g, 3, gin);
}

/* ---- layer_norm and rms_norm ---------------------------------------------------------------- */

/* x split as (rows, D) with D the product of the trailing k axes. */
static kiln_status ln_split(const char *op, kiln_tensor *const *in, int nin, const kiln_attrs *a, int64_t *rows,
                            int64_t *D) {
    KILN_TRY(kiln_attrs_expect(op, a, 1, 0));
    const kiln_meta *x = &in[0]->meta;
    int64_t k = a->i[0];
    if (k < 1 || k > x->ndim) {
        char buf[160];
        return kiln_error(KILN_ERR_VALUE, "%s: cannot normalize over the last %lld axes of an input of shape %s", op,
                          (long long)k, kiln_shape_str(x, buf, sizeof buf));
    }
    (void)nin;
    *D = kiln_shape_numel((int)k, x->shape + x->ndim - k);
    *rows = kiln_shape_numel(x->ndim - (int)k, x->shape);
    return KILN_OK;
}

/* Shape of the statistics: x's shape with the normalized axes kept as 1. */
static void ln_stats_meta(const kiln_meta *x, int64_t k, kiln_meta *out) {
    *out = *x;
    out->dtype = compute_dtype(x->dtype);
    for (int d = x->ndim - (int)k; d < x->ndim; d++) out->shape[d] = 1;
}

/* Checks that in[first..first+count) have the normalized shape x.shape[-k:]. */
static kiln_status ln_check_weights(const char *op, kiln_tensor *const *in, int nin, const kiln_meta *x, int64_t k,
                                    int first, int count) {
    for (int j = first; j < first + count; j++)
        if (!kiln_shape_equal(&in[j]->meta, (int)k, x->shape + x->ndim - k)) {
            char what[240], buf[160];
            kiln_meta norm;
            kiln_meta_set(&norm, x->dtype, (int)k, x->shape + x->ndim - k);
            snprintf(what, sizeof what, "input %d must have the normalized shape %s", j, kiln_shape_str(&norm, buf, sizeof buf));
            return shapes_error(KILN_ERR_VALUE, op, what, in, nin);
        }
    return KILN_OK;
}

static kiln_status ln_check_stats(const char *op, kiln_tensor *const *in, int nin, int first, int count, int64_t rows) {
    for (int j = first; j < first + count; j++)
        if (kiln_meta_numel(&in[j]->meta) != rows) {
            char what[200];
            snprintf(what, sizeof what, "input %d must hold one statistic per row (%lld values)", j, (long long)rows);
            return shapes_error(KILN_ERR_VALUE, op, what, in, nin);
        }
    return KILN_OK;
}

/* layer_norm(x, w, b) -> (y, mean, rstd); rms_norm(x, w) -> (y, rstd) */
static kiln_status ln_infer(const char *op, kiln_tensor *const *in, int nin, const kiln_attrs *a, kiln_meta *out,
                            bool centered) {
    int64_t rows = 0, D = 0; /* (set by ln_split; gcc cannot always tell) */
    KILN_TRY(kiln_attrs_expect(op, a, 1, 1));
    KILN_TRY(check_float(op, in, nin));
    KILN_TRY(ln_split(op, in, nin, a, &rows, &D));
    KILN_TRY(ln_check_weights(op, in, nin, &in[0]->meta, a->i[0], 1, nin - 1));
    if (!(a->f[0] >= 0)) return kiln_error(KILN_ERR_VALUE, "%s: eps must be >= 0, got %g", op, a->f[0]);
    out[0] = in[0]->meta;
    ln_stats_meta(&in[0]->meta, a->i[0], &out[1]);
    if (centered) out[2] = out[1];
    return KILN_OK;
}

KILN_INFER(layer_norm) { return ln_infer("layer_norm", in, nin, a, out, true); }
KILN_INFER(rms_norm) { return ln_infer("rms_norm", in, nin, a, out, false); }

static kiln_status ln_forward(kiln_tensor *const *in, int nin, const kiln_attrs *a, kiln_tensor **out, bool centered) {
    kiln_dtype ct = compute_dtype(in[0]->meta.dtype);
    bool f64 = ct == KILN_DTYPE_FLOAT64;
    int nout = centered ? 3 : 2;
    int64_t rows = 0, D = 0; /* (set by ln_split; gcc cannot always tell) */
    KILN_TRY(ln_split(centered ? "layer_norm" : "rms_norm", in, nin, a, &rows, &D));
    kiln_tensor *c[3], *buf[3];
    KILN_TRY(kiln_load_compute(in, nin, ct, c));
    kiln_status s = kiln_compute_outputs(out, nout, ct, buf);
    if (s != KILN_OK) {
        kiln_release_all(c, nin);
        return s;
    }
    void *b = centered ? c[2]->data : NULL, *mean = centered ? buf[1]->data : NULL, *rstd = buf[nout - 1]->data;
    DISPATCH(f64, ln_forward, c[0]->data, c[1]->data, b, buf[0]->data, mean, rstd, rows, D, a->f[0], centered);
    kiln_release_all(c, nin);
    return kiln_store_compute(out, nout, buf);
}

KILN_KERNEL(layer_norm) { return ln_forward(in, nin, a, out, true); }
KILN_KERNEL(rms_norm) { return ln_forward(in, nin, a, out, false); }

/* layer_norm_backward(gy, x, w, mean, rstd) -> (gx, gw, gb); rms_norm_backward(gy, x, w, rstd)
 * -> (gx, gw). The backward ops see x as input 1, so checks run on a shifted view. */
static kiln_status ln_backward_infer(const char *op, kiln_tensor *const *in, int nin, const kiln_attrs *a,
                                     kiln_meta *out, bool centered) {
    int64_t rows = 0, D = 0; /* (set by ln_split; gcc cannot always tell) */
    KILN_TRY(check_float(op, in, nin));
    const kiln_meta *x = &in[1]->meta;
    if (!kiln_shape_equal(&in[0]->meta, x->ndim, x->shape))
        return shapes_error(KILN_ERR_VALUE, op, "gy must have the shape of x (input 1)", in, nin);
    KILN_TRY(ln_split(op, in + 1, nin - 1, a, &rows, &D));
    KILN_TRY(ln_check_weights(op, in, nin, x, a->i[0], 2, 1));
    KILN_TRY(ln_check_stats(op, in, nin, 3, centered ? 2 : 1, rows));
    out[0] = *x;
    out[1] = in[2]->meta;
    if (centered) out[2] = in[2]->meta;
    return KILN_OK;
}

KILN_INFER(layer_norm_backward) { return ln_backward_infer("layer_norm_backward", in, nin, a, out, true); }
KILN_INFER(rms_norm_backward) { return ln_backward_infer("rms_norm_backward", in, nin, a, out, false); }

static kiln_status ln_backward(kiln_tensor *const *in, int nin, const kiln_attrs *a, kiln_tensor **out, bool centered) {
    const char *op = centered ? "layer_norm_backward" : "rms_norm_backward";
    kiln_dtype ct = compute_dtype(in[1]->meta.dtype);
    bool f64 = ct == KILN_DTYPE_FLOAT64;
    int nout = centered ? 3 : 2;
    int64_t rows = 0, D = 0; /* (set by ln_split; gcc cannot always tell) */
    KILN_TRY(ln_split(op, in + 1, nin - 1, a, &rows, &D));
    ln_plan lp = ln_plan_make(rows, D);
    kiln_tensor *c[5], *buf[3];
    KILN_TRY(kiln_load_compute(in, nin, ct, c));
    kiln_status s = kiln_compute_outputs(out, nout, ct, buf);
    size_t doubles = (size_t)(2 * lp.nrb * D + (lp.ncb > 1 ? 2 * rows : 0) + 1);
    double *part = s == KILN_OK ? kiln_malloc(sizeof(double) * doubles) : NULL;
    if (!part && s == KILN_OK) {
        kiln_release_all(buf, nout);
        s = kiln_error(KILN_ERR_MEMORY, "%s: out of memory", op);
    }
    if (s != KILN_OK) {
        kiln_release_all(c, nin);
        return s;
    }
    void *mean = centered ? c[3]->data : NULL, *rstd = c[nin - 1]->data, *gb = centered ? buf[2]->data : NULL;
    DISPATCH(f64, ln_backward, c[0]->data, c[1]->data, c[2]->data, mean, rstd, buf[0]->data, buf[1]->data, gb, &lp, part,
             part + 2 * lp.nrb * D);
    free(part);
    kiln_release_all(c, nin);
    return kiln_store_compute(out, nout, buf);
}

KILN_KERNEL(layer_norm_backward) { return ln_backward(in, nin, a, out, true); }
KILN_KERNEL(rms_norm_backward) { return ln_backward(in, nin, a, out, false); }

/* Shared by layer_norm and rms_norm: ctx->out holds (y, [mean,] rstd). */
static kiln_status ln_grad(const kiln_grad_ctx *ctx, kiln_tensor *const *gout, kiln_tensor **gin, bool centered) {
    int nin = centered ? 3 : 2;
    kiln_tensor *g[3] = {NULL, NULL, NULL};
    kiln_status s = KILN_OK;
    bool any = false;
    for (int k = 0; k < nin; k++) any |= ctx->needs_grad[k];
    if (gout[0] && any) {
        kiln_tensor *ins[5] = {gout[0], ctx->in[0], ctx->in[1], ctx->out[1], centered ? ctx->out[2] : NULL};
        s = kiln_apply(centered ? KILN_OP_LAYER_NORM_BACKWARD : KILN_OP_RMS_NORM_BACKWARD, centered ? 5 : 4, ins,
                       ctx->attrs, g);
    }
    kiln_tensor *grstd = gout[centered ? 2 : 1], *gmean = centered ? gout[1] : NULL;
    if (s == KILN_OK && ctx->needs_grad[0] && (gmean || grstd)) {
        const kiln_meta *x = &ctx->in_meta[0];
        double count = (double)kiln_shape_numel((int)ctx->attrs->i[0], x->shape + x->ndim - ctx->attrs->i[0]);
        s = stats_grad(ctx->in[0], centered ? ctx->out[1] : NULL, ctx->out[centered ? 2 : 1], gmean, grstd, count, &g[0]);
    }
    if (s != KILN_OK) {
        kiln_release_all(g, 3);
        return s;
    }
    return finish_grads(ctx, g, nin, gin);
}

KILN_GRAD(layer_norm) { return ln_grad(ctx, gout, gin, true); }
KILN_GRAD(rms_norm) { return ln_grad(ctx, gout, gin, false); }
