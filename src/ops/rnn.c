/* Recurrent layers as single ops: rnn_layer runs one direction of one LSTM, GRU or Elman RNN
 * layer over a whole sequence, rnn_layer_backward its backward through time, and the gradient
 * rule that emits the latter (ops.def documents inputs, outputs and attrs).
 *
 * Forward: every step's input projection x @ w_ihᵀ is one GEMM up front; then per step one
 * (B, H) x (H, G*H) GEMM for the recurrent product and one loop over the gates' elementwise
 * work, which also writes the step's gate activations and state into the workspace. Backward:
 * per step (last first) the gates' gradients from the workspace into a (T, B, G*H) buffer and one
 * GEMM for the gradient flowing into the previous state; then dx, dW_ih and dW_hh as three GEMMs
 * over all the steps and the biases' gradients as column sums.
 *
 * Two kernels from one source (rnn_steps.h): float64 inputs run plain loops in double (the
 * reference kernels, no BLAS), every other float dtype computes in float32 with sgemm (OpenBLAS
 * single-threaded; the GEMMs over all steps split their rows over the OpenMP threads). */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "../core/internal.h"
#include "compute_buffers.h"
#include "exp_f32.h"
#include "gemm_select.h"
#include "matmul.h"

enum { RNN_LSTM, RNN_GRU, RNN_TANH, RNN_RELU, RNN_MODES };
static const char *const rnn_mode_names[RNN_MODES] = {"LSTM", "GRU", "RNN_TANH", "RNN_RELU"};
static const int rnn_gates[RNN_MODES] = {4, 3, 1, 1};

typedef struct {
    int mode;
    bool reverse, bias, lengths;
    int64_t T, B, In, H, G, W; /* W: workspace floats per (step, batch row) */
    /* positions of the inputs (-1 where absent) */
    int x, h0, c0, w_ih, w_hh, b_ih, b_hh, len, n;
} rnn_shape;

/* Workspace row width per mode (rnn_steps.h) */
static int64_t rnn_ws_width(int mode, int64_t H) { return mode == RNN_LSTM ? 6 * H : (mode == RNN_GRU ? 5 * H : H); }

/* Reads the attrs and where each input sits. */
static kiln_status rnn_layout(const char *op, const kiln_attrs *a, rnn_shape *p) {
    KILN_TRY(kiln_attrs_expect(op, a, 4, 0));
    if (a->i[0] < 0 || a->i[0] >= RNN_MODES)
        return kiln_error(KILN_ERR_VALUE, "%s: mode must be 0 (LSTM), 1 (GRU), 2 (RNN tanh) or 3 (RNN relu), got %lld",
                          op, (long long)a->i[0]);
    for (int k = 1; k < 4; k++)
        if (a->i[k] != 0 && a->i[k] != 1)
            return kiln_error(KILN_ERR_VALUE, "%s: attribute %d (reverse, has biases, has lengths) must be 0 or 1, got %lld",
                              op, k, (long long)a->i[k]);
    memset(p, 0, sizeof *p);
    p->mode = (int)a->i[0], p->reverse = a->i[1], p->bias = a->i[2], p->lengths = a->i[3];
    p->G = rnn_gates[p->mode];
    int k = 0;
    p->x = k++, p->h0 = k++;
    p->c0 = p->mode == RNN_LSTM ? k++ : -1;
    p->w_ih = k++, p->w_hh = k++;
    p->b_ih = p->bias ? k++ : -1;
    p->b_hh = p->bias ? k++ : -1;
    p->len = p->lengths ? k++ : -1;
    p->n = k;
    return KILN_OK;
}

static kiln_status rnn_bad(const char *op, const rnn_shape *p, kiln_tensor *const *in, int nin) {
    char buf[600];
    return kiln_error(KILN_ERR_VALUE,
                      "%s (%s): expected x (T, B, I), h0%s (B, H), w_ih (%lld*H, I), w_hh (%lld*H, H)%s%s; got shapes %s",
                      op, rnn_mode_names[p->mode], p->mode == RNN_LSTM ? " and c0" : "", (long long)p->G,
                      (long long)p->G, p->bias ? ", b_ih and b_hh (G*H,)" : "", p->lengths ? ", lengths (B,)" : "",
                      kiln_shapes_str(in, nin, buf, sizeof buf));
}

/* Checks the forward's inputs in[0..p->n) and gives the sizes. */
static kiln_status rnn_shape_of(const char *op, kiln_tensor *const *in, int nin, rnn_shape *p) {
    if (nin < p->n)
        return kiln_error(KILN_ERR_VALUE, "%s (%s): expected %d inputs for these attributes, got %d", op,
                          rnn_mode_names[p->mode], p->n, nin);
    const kiln_meta *x = &in[p->x]->meta, *h0 = &in[p->h0]->meta, *wi = &in[p->w_ih]->meta, *wh = &in[p->w_hh]->meta;
    const int floats[6] = {p->x, p->h0, p->c0, p->w_ih, p->w_hh, p->b_ih};
    for (int k = 0; k < 6; k++) {
        if (floats[k] < 0) continue;
        const kiln_meta *m = &in[floats[k]]->meta;
        if (!kiln_dtype_is_float(m->dtype) || m->dtype != x->dtype)
            return kiln_error(KILN_ERR_TYPE, "%s (%s): x, the states, weights and biases must have one floating-point "
                              "dtype, got %s and %s", op, rnn_mode_names[p->mode], kiln_dtype_name(x->dtype),
                              kiln_dtype_name(m->dtype));
    }
    if (p->bias && in[p->b_hh]->meta.dtype != x->dtype)
        return kiln_error(KILN_ERR_TYPE, "%s (%s): b_hh is %s but x is %s", op, rnn_mode_names[p->mode],
                          kiln_dtype_name(in[p->b_hh]->meta.dtype), kiln_dtype_name(x->dtype));
    if (x->ndim != 3 || h0->ndim != 2 || wi->ndim != 2 || wh->ndim != 2) return rnn_bad(op, p, in, p->n);
    p->T = x->shape[0], p->B = x->shape[1], p->In = x->shape[2], p->H = h0->shape[1];
    int64_t GH = p->G * p->H, state[2] = {p->B, p->H}, wih[2] = {GH, p->In}, whh[2] = {GH, p->H}, bias[1] = {GH};
    if (h0->shape[0] != p->B || !kiln_shape_equal(wi, 2, wih) || !kiln_shape_equal(wh, 2, whh) ||
        (p->c0 >= 0 && !kiln_shape_equal(&in[p->c0]->meta, 2, state)) ||
        (p->bias && (!kiln_shape_equal(&in[p->b_ih]->meta, 1, bias) || !kiln_shape_equal(&in[p->b_hh]->meta, 1, bias))))
        return rnn_bad(op, p, in, p->n);
    if (p->lengths) {
        const kiln_meta *l = &in[p->len]->meta;
        if ((l->dtype != KILN_DTYPE_INT32 && l->dtype != KILN_DTYPE_INT64) || !kiln_shape_equal(l, 1, &p->B))
            return kiln_error(KILN_ERR_VALUE, "%s (%s): lengths must be an int32 or int64 tensor of shape (%lld,), got %s "
                              "of %d dims", op, rnn_mode_names[p->mode], (long long)p->B, kiln_dtype_name(l->dtype),
                              (int)l->ndim);
    }
    p->W = rnn_ws_width(p->mode, p->H);
    return KILN_OK;
}

static kiln_dtype rnn_compute_dtype(kiln_dtype d) { return d == KILN_DTYPE_FLOAT64 ? d : KILN_DTYPE_FLOAT32; }

static void rnn_metas(const rnn_shape *p, kiln_dtype dt, kiln_meta *out) {
    out[0] = (kiln_meta){.dtype = dt, .ndim = 3, .shape = {p->T, p->B, p->H}};
    out[1] = (kiln_meta){.dtype = dt, .ndim = 2, .shape = {p->B, p->H}};
    out[2] = out[1];
    out[3] = (kiln_meta){.dtype = rnn_compute_dtype(dt), .ndim = 3, .shape = {p->T, p->B, p->W}};
}

KILN_INFER(rnn_layer) {
    rnn_shape p = {0};
    KILN_TRY(rnn_layout("rnn_layer", a, &p));
    if (nin != p.n)
        return kiln_error(KILN_ERR_VALUE, "rnn_layer (%s): expected %d inputs for these attributes, got %d",
                          rnn_mode_names[p.mode], p.n, nin);
    KILN_TRY(rnn_shape_of("rnn_layer", in, nin, &p));
    rnn_metas(&p, in[0]->meta.dtype, out);
    return KILN_OK;
}

/* rnn_layer_backward(forward inputs..., workspace, gy, gh_n[, gc_n]) */
KILN_INFER(rnn_layer_backward) {
    const char *op = "rnn_layer_backward";
    rnn_shape p = {0};
    KILN_TRY(rnn_layout(op, a, &p));
    int want = p.n + 3 + (p.mode == RNN_LSTM);
    if (nin != want)
        return kiln_error(KILN_ERR_VALUE, "%s (%s): expected %d inputs for these attributes, got %d", op,
                          rnn_mode_names[p.mode], want, nin);
    KILN_TRY(rnn_shape_of(op, in, nin, &p));
    kiln_meta m[4];
    rnn_metas(&p, in[0]->meta.dtype, m);
    const kiln_meta *expect[4] = {&m[3], &m[0], &m[1], &m[2]};
    for (int k = 0; k < want - p.n; k++) {
        const kiln_meta *g = &in[p.n + k]->meta;
        if (!kiln_dtype_is_float(g->dtype) || !kiln_shape_equal(g, expect[k]->ndim, expect[k]->shape)) {
            char buf[600];
            return kiln_error(KILN_ERR_VALUE, "%s (%s): the workspace and output gradients must have the shapes of "
                              "rnn_layer's outputs; got shapes %s", op, rnn_mode_names[p.mode],
                              kiln_shapes_str(in, nin, buf, sizeof buf));
        }
    }
    kiln_dtype dt = in[0]->meta.dtype;
    int64_t GH = p.G * p.H;
    out[0] = in[p.x]->meta, out[1] = in[p.h0]->meta, out[2] = in[p.h0]->meta;
    out[3] = in[p.w_ih]->meta, out[4] = in[p.w_hh]->meta;
    out[5] = (kiln_meta){.dtype = dt, .ndim = 1, .shape = {GH}};
    out[6] = out[5];
    return KILN_OK;
}

/* ---- the two variants ------------------------------------------------------------------------ */

/* float32: sgemm. GEMMs of many rows split their rows over the threads, each running OpenBLAS
 * single-threaded (kiln_mm_single_threaded_blas on the caller's thread first). */
#define RNN_SPLIT_MIN 262144
static void rnn_sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B,
                      int64_t ldb, bool acc, float *C, int64_t ldc) {
    if (M == 0 || N == 0) return;
    if (K == 0) {
        for (int64_t i = 0; i < M && !acc; i++) memset(C + i * ldc, 0, sizeof(float) * (size_t)N);
        return;
    }
    int threads = omp_in_parallel() || M * N * K < RNN_SPLIT_MIN ? 1 : omp_get_max_threads();
    if (threads > M / 16) threads = M / 16 > 0 ? (int)(M / 16) : 1;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int t = 0; t < threads; t++) {
        int64_t lo = M * t / threads, hi = M * (t + 1) / threads;
        if (hi > lo)
            kiln_sgemm(ta, tb, hi - lo, N, K, 1.0f, ta ? A + lo : A + lo * lda, lda, B, ldb, acc ? 1.0f : 0.0f,
                       C + lo * ldc, ldc);
    }
}

/* float64: the reference's plain loops */
static void rnn_ref_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const double *A, int64_t lda,
                         const double *B, int64_t ldb, bool acc, double *C, int64_t ldc) {
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double s = acc ? C[i * ldc + j] : 0;
            for (int64_t k = 0; k < K; k++) s += (ta ? A[k * lda + i] : A[i * lda + k]) * (tb ? B[j * ldb + k] : B[k * ldb + j]);
            C[i * ldc + j] = s;
        }
}

DEFINE_EXP_F32(rnn_expf)
/* tanh through the vectorizable exp: 2 sigmoid(2a) - 1, and its Taylor series below 0.1 (where the
 * subtraction would cost relative precision; the series' next term is under 1e-9 of it there) */
static inline float rnn_tanhf(float a) {
    float a2 = a * a;
    float series = a * (1.0f + a2 * (-1.0f / 3.0f + a2 * (2.0f / 15.0f + a2 * (-17.0f / 315.0f))));
    return fabsf(a) < 0.1f ? series : 2.0f / (1.0f + rnn_expf(-2.0f * a)) - 1.0f;
}

#define RS_T float
#define RS_NAME(x) x##_f32
#define RS_GEMM rnn_sgemm
#define RS_EXP rnn_expf
#define RS_TANH rnn_tanhf
#include "rnn_steps.h"
#undef RS_T
#undef RS_NAME
#undef RS_GEMM
#undef RS_EXP
#undef RS_TANH

#define RS_T double
#define RS_NAME(x) x##_ref
#define RS_GEMM rnn_ref_gemm
#define RS_EXP exp
#define RS_TANH tanh
#include "rnn_steps.h"
#undef RS_T
#undef RS_NAME
#undef RS_GEMM
#undef RS_EXP
#undef RS_TANH

/* ---- kernels ---------------------------------------------------------------------------------- */

/* The lengths as int64 (new reference in *out), checked against [0, T]; NULL when absent. */
static kiln_status rnn_lengths(const char *op, const rnn_shape *p, kiln_tensor *const *in, kiln_tensor **out) {
    *out = NULL;
    if (!p->lengths) return KILN_OK;
    KILN_TRY(kiln_to_contiguous(in[p->len], KILN_DTYPE_INT64, out));
    const int64_t *l = (*out)->data;
    for (int64_t b = 0; b < p->B; b++)
        if (l[b] < 0 || l[b] > p->T) {
            kiln_status s = kiln_error(KILN_ERR_VALUE, "%s (%s): seq_length must lie in [0, %lld] (the sequence length), "
                                       "got %lld at batch index %lld", op, rnn_mode_names[p->mode], (long long)p->T,
                                       (long long)l[b], (long long)b);
            kiln_tensor_release(*out);
            *out = NULL;
            return s;
        }
    return KILN_OK;
}

/* Loads the floating inputs of the forward (x, h0, c0, weights; positions p->x.. as in[]) in the
 * compute dtype: c[k] for input k, NULL for biases and lengths (read separately). */
static kiln_status rnn_load(const rnn_shape *p, kiln_tensor *const *in, int n, kiln_dtype ct, kiln_tensor **c) {
    for (int k = 0; k < n; k++) c[k] = NULL;
    for (int k = 0; k < n; k++) {
        if (k == p->len) continue;
        kiln_status s = kiln_to_contiguous(in[k], ct, &c[k]);
        if (s != KILN_OK) {
            kiln_release_all(c, n);
            return s;
        }
    }
    return KILN_OK;
}

#define RNN_DATA(c, k) ((k) >= 0 ? (c)[k]->data : NULL)

KILN_KERNEL(rnn_layer) {
    rnn_shape p = {0};
    KILN_TRY(rnn_layout("rnn_layer", a, &p));
    KILN_TRY(rnn_shape_of("rnn_layer", in, nin, &p));
    kiln_dtype ct = rnn_compute_dtype(in[0]->meta.dtype);
    size_t isz = kiln_dtype_size(ct);
    kiln_tensor *c[8], *buf[4], *len = NULL;
    KILN_TRY(rnn_lengths("rnn_layer", &p, in, &len));
    kiln_status s = rnn_load(&p, in, nin, ct, c);
    if (s != KILN_OK) {
        kiln_tensor_release(len);
        return s;
    }
    s = kiln_compute_outputs(out, 4, ct, buf);
    int64_t GH = p.G * p.H;
    /* the projections, then the GRU's recurrent one per step (B rows) or the summed biases (1 row) */
    void *pre = s == KILN_OK ? kiln_malloc(isz * (size_t)(p.T * p.B * GH + (p.B > 1 ? p.B : 1) * GH + 1)) : NULL;
    if (s == KILN_OK && !pre) s = kiln_error(KILN_ERR_MEMORY, "rnn_layer: out of memory for the gates");
    if (s == KILN_OK) {
        if (p.mode != RNN_LSTM) memset(buf[2]->data, 0, isz * (size_t)(p.B * p.H));
        const int64_t *l = len ? len->data : NULL;
        void *cn = p.mode == RNN_LSTM ? buf[2]->data : NULL;
        if (ct == KILN_DTYPE_FLOAT32) {
            kiln_mm_single_threaded_blas();
            float *pf = pre;
            rs_forward_f32(&p, c[p.x]->data, c[p.h0]->data, RNN_DATA(c, p.c0), c[p.w_ih]->data, c[p.w_hh]->data,
                           RNN_DATA(c, p.b_ih), RNN_DATA(c, p.b_hh), l, buf[0]->data, buf[1]->data, cn, buf[3]->data,
                           pf, pf + p.T * p.B * GH);
        } else {
            double *pd = pre;
            rs_forward_ref(&p, c[p.x]->data, c[p.h0]->data, RNN_DATA(c, p.c0), c[p.w_ih]->data, c[p.w_hh]->data,
                           RNN_DATA(c, p.b_ih), RNN_DATA(c, p.b_hh), l, buf[0]->data, buf[1]->data, cn, buf[3]->data,
                           pd, pd + p.T * p.B * GH);
        }
        s = kiln_store_compute(out, 4, buf);
    } else if (buf[0]) {
        kiln_release_all(buf, 4);
    }
    free(pre);
    kiln_release_all(c, nin);
    kiln_tensor_release(len);
    return s;
}

KILN_KERNEL(rnn_layer_backward) {
    rnn_shape p = {0};
    KILN_TRY(rnn_layout("rnn_layer_backward", a, &p));
    KILN_TRY(rnn_shape_of("rnn_layer_backward", in, nin, &p));
    kiln_dtype ct = rnn_compute_dtype(in[0]->meta.dtype);
    size_t isz = kiln_dtype_size(ct);
    kiln_tensor *c[12], *buf[7], *len = NULL;
    KILN_TRY(rnn_lengths("rnn_layer_backward", &p, in, &len));
    kiln_status s = rnn_load(&p, in, nin, ct, c);
    if (s != KILN_OK) {
        kiln_tensor_release(len);
        return s;
    }
    s = kiln_compute_outputs(out, 7, ct, buf);
    int64_t GH = p.G * p.H, rows = p.T * p.B;
    size_t scratch = (size_t)(rows * GH * (p.mode == RNN_GRU ? 2 : 1) + rows * p.H + 1);
    void *tmp = s == KILN_OK ? kiln_malloc(isz * scratch) : NULL;
    if (s == KILN_OK && !tmp) s = kiln_error(KILN_ERR_MEMORY, "rnn_layer_backward: out of memory for the gates' gradients");
    if (s == KILN_OK) {
        const int64_t *l = len ? len->data : NULL;
        int ws = p.n, gy = p.n + 1, ghn = p.n + 2, gcn = p.mode == RNN_LSTM ? p.n + 3 : -1;
        void *gc0 = p.mode == RNN_LSTM ? buf[2]->data : NULL;
        if (p.mode != RNN_LSTM) memset(buf[2]->data, 0, isz * (size_t)(p.B * p.H));
        if (ct == KILN_DTYPE_FLOAT32) {
            kiln_mm_single_threaded_blas();
            float *dgi = tmp, *dgh = p.mode == RNN_GRU ? dgi + rows * GH : dgi, *hprev = dgh + rows * GH;
            rs_backward_f32(&p, c[p.x]->data, c[p.h0]->data, RNN_DATA(c, p.c0), c[p.w_ih]->data, c[p.w_hh]->data, l,
                            c[ws]->data, c[gy]->data, c[ghn]->data, RNN_DATA(c, gcn), buf[0]->data, buf[1]->data, gc0,
                            buf[3]->data, buf[4]->data, buf[5]->data, buf[6]->data, dgi, dgh, hprev);
        } else {
            double *dgi = tmp, *dgh = p.mode == RNN_GRU ? dgi + rows * GH : dgi, *hprev = dgh + rows * GH;
            rs_backward_ref(&p, c[p.x]->data, c[p.h0]->data, RNN_DATA(c, p.c0), c[p.w_ih]->data, c[p.w_hh]->data, l,
                            c[ws]->data, c[gy]->data, c[ghn]->data, RNN_DATA(c, gcn), buf[0]->data, buf[1]->data, gc0,
                            buf[3]->data, buf[4]->data, buf[5]->data, buf[6]->data, dgi, dgh, hprev);
        }
        if (!p.bias) {
            memset(buf[5]->data, 0, isz * (size_t)GH);
            memset(buf[6]->data, 0, isz * (size_t)GH);
        }
        s = kiln_store_compute(out, 7, buf);
    } else if (buf[0]) {
        kiln_release_all(buf, 7);
    }
    free(tmp);
    kiln_release_all(c, nin);
    kiln_tensor_release(len);
    return s;
}

/* ---- gradient rule ---------------------------------------------------------------------------- */

KILN_GRAD(rnn_layer) {
    rnn_shape p = {0};
    KILN_TRY(rnn_layout("rnn_layer", ctx->attrs, &p));
    if (gout[3])
        return kiln_error(KILN_ERR_VALUE, "rnn_layer: its workspace output (the saved gate activations) is not "
                          "differentiable; differentiate y, h_n and c_n only");
    bool any = false;
    for (int k = 0; k < ctx->nin; k++) any |= ctx->needs_grad[k];
    if (!any) return KILN_OK;
    int ng = 2 + (p.mode == RNN_LSTM);
    kiln_tensor *ins[16], *g[3] = {NULL, NULL, NULL}, *res[7] = {NULL};
    kiln_status s = KILN_OK;
    for (int k = 0; k < ng && s == KILN_OK; k++) {
        if (gout[k]) kiln_tensor_retain(g[k] = gout[k]);
        else s = kiln_emit_full(&ctx->out_meta[k], 0.0, &g[k]);
    }
    if (s == KILN_OK) {
        int n = 0;
        for (int k = 0; k < ctx->nin; k++) ins[n++] = ctx->in[k];
        ins[n++] = ctx->out[3];
        for (int k = 0; k < ng; k++) ins[n++] = g[k];
        s = kiln_apply(KILN_OP_RNN_LAYER_BACKWARD, n, ins, ctx->attrs, res);
    }
    kiln_release_all(g, 3);
    if (s != KILN_OK) return s;
    const int where[7] = {p.x, p.h0, p.c0, p.w_ih, p.w_hh, p.b_ih, p.b_hh};
    for (int k = 0; k < 7; k++) {
        if (where[k] >= 0 && ctx->needs_grad[where[k]]) gin[where[k]] = res[k];
        else kiln_tensor_release(res[k]);
    }
    return KILN_OK;
}
