/* Normalization and dropout: batch_norm (training and inference, running statistics),
 * layer_norm and rms_norm against plain reference loops on contiguous and strided inputs;
 * finite-difference gradient checks (float64) through kiln_autograd_grad, including the
 * gradients that reach x through the statistics outputs; dropout statistics, determinism
 * and thread invariance; error cases. */
#include <omp.h>

#include "check.h"
#include "core/internal.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double rnd(void) { /* xorshift, uniform in [-1, 1) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) * 0x1.0p-52 - 1.0;
}

/* Random tensor of `dt`; with `perm`, its storage is laid out in permuted order and the
 * returned tensor is a (non-contiguous) permuted view with the requested shape. */
static kiln_tensor *make(kiln_dtype dt, int nd, const int64_t *shape, const int64_t *perm, double lo, double hi) {
    int64_t stored[KILN_MAX_DIMS], inverse[KILN_MAX_DIMS];
    for (int d = 0; d < nd; d++) stored[d] = perm ? shape[perm[d]] : shape[d];
    kiln_tensor *base = NULL, *t = NULL, *f64 = NULL;
    if (kiln_tensor_empty(KILN_DTYPE_FLOAT64, nd, stored, &f64) != KILN_OK) exit(2);
    for (int64_t i = 0; i < f64->numel; i++) ((double *)f64->data)[i] = lo + (hi - lo) * (rnd() + 1) / 2;
    if (kiln_to_contiguous(f64, dt, &base) != KILN_OK) exit(2);
    kiln_tensor_release(f64);
    if (!perm) return base;
    for (int d = 0; d < nd; d++) inverse[perm[d]] = d;
    if (kiln_emit_permute(base, inverse, &t) != KILN_OK) exit(2);
    kiln_tensor_release(base);
    return t;
}

static kiln_tensor *constant(kiln_dtype dt, int nd, const int64_t *shape, double v) {
    kiln_tensor *t = NULL;
    kiln_meta m;
    kiln_meta_set(&m, dt, nd, shape);
    if (kiln_emit_full(&m, v, &t) != KILN_OK) exit(2);
    return t;
}

/* Values in logical row-major order, as doubles (malloc'd). */
static double *values(const kiln_tensor *t) {
    double *v = malloc(sizeof(double) * (size_t)(t->numel + 1));
    for (int64_t i = 0; i < t->numel; i++) v[i] = kiln_tensor_get_double(t, i);
    return v;
}

static bool close_to(const kiln_tensor *t, const double *want, double tol) {
    for (int64_t i = 0; i < t->numel; i++) {
        double got = kiln_tensor_get_double(t, i);
        if (!(fabs(got - want[i]) <= tol * (1 + fabs(want[i])))) {
            fprintf(stderr, "  element %lld: got %.10g, want %.10g\n", (long long)i, got, want[i]);
            return false;
        }
    }
    return true;
}

static bool same_bytes(const kiln_tensor *a, const kiln_tensor *b) {
    return a && b && a->numel == b->numel && memcmp(a->data, b->data, (size_t)a->numel * kiln_dtype_size(a->meta.dtype)) == 0;
}

/* ---- references ---------------------------------------------------------------------------- */

/* x as (N, C, S); updates rm/rv (may be NULL) when batch statistics are used */
static void batch_norm_ref(const double *x, const double *gamma, const double *beta, double *rm, double *rv,
                           int64_t N, int64_t C, int64_t S, bool training, double eps, double momentum, double *y,
                           double *mean, double *invstd) {
    bool batch = training || !rm;
    for (int64_t c = 0; c < C; c++) {
        double mu, var;
        if (batch) {
            double s = 0, q = 0;
            for (int64_t n = 0; n < N; n++)
                for (int64_t k = 0; k < S; k++) s += x[(n * C + c) * S + k];
            mu = s / (double)(N * S);
            for (int64_t n = 0; n < N; n++)
                for (int64_t k = 0; k < S; k++) q += (x[(n * C + c) * S + k] - mu) * (x[(n * C + c) * S + k] - mu);
            var = q / (double)(N * S);
            if (rm) {
                rm[c] = (1 - momentum) * rm[c] + momentum * mu;
                rv[c] = (1 - momentum) * rv[c] + momentum * q / (double)(N * S - 1);
            }
        } else {
            mu = rm[c];
            var = rv[c];
        }
        mean[c] = mu;
        invstd[c] = 1 / sqrt(var + eps);
        for (int64_t n = 0; n < N; n++)
            for (int64_t k = 0; k < S; k++) {
                int64_t i = (n * C + c) * S + k;
                y[i] = (x[i] - mu) * invstd[c] * gamma[c] + beta[c];
            }
    }
}

/* rows of D; b NULL for rms_norm (then mean is not written) */
static void layer_norm_ref(const double *x, const double *w, const double *b, int64_t R, int64_t D, double eps,
                           double *y, double *mean, double *rstd) {
    for (int64_t r = 0; r < R; r++) {
        double mu = 0, q = 0;
        if (b) {
            for (int64_t j = 0; j < D; j++) mu += x[r * D + j];
            mu /= (double)D;
            mean[r] = mu;
        }
        for (int64_t j = 0; j < D; j++) q += (x[r * D + j] - mu) * (x[r * D + j] - mu);
        rstd[r] = 1 / sqrt(q / (double)D + eps);
        for (int64_t j = 0; j < D; j++) y[r * D + j] = (x[r * D + j] - mu) * rstd[r] * w[j] + (b ? b[j] : 0);
    }
}

/* ---- op wrappers --------------------------------------------------------------------------- */

static kiln_status batch_norm(kiln_tensor *x, kiln_tensor *g, kiln_tensor *b, kiln_tensor *rm, kiln_tensor *rv,
                              bool training, double eps, double momentum, kiln_tensor **out) {
    kiln_attrs at;
    kiln_attrs_clear(&at);
    kiln_attrs_push_int(&at, training);
    kiln_attrs_push_float(&at, eps);
    kiln_attrs_push_float(&at, momentum);
    kiln_tensor *in[5] = {x, g, b, rm, rv};
    return kiln_apply(KILN_OP_BATCH_NORM, 5, in, &at, out);
}

static kiln_status layer_norm(kiln_tensor *x, kiln_tensor *w, kiln_tensor *b, int64_t k, double eps, kiln_tensor **out) {
    kiln_attrs at;
    kiln_attrs_clear(&at);
    kiln_attrs_push_int(&at, k);
    kiln_attrs_push_float(&at, eps);
    kiln_tensor *in[3] = {x, w, b};
    return b ? kiln_apply(KILN_OP_LAYER_NORM, 3, in, &at, out) : kiln_apply(KILN_OP_RMS_NORM, 2, in, &at, out);
}

static kiln_status dropout(kiln_tensor *x, double p, kiln_tensor **out) {
    kiln_attrs at;
    kiln_attrs_clear(&at);
    kiln_attrs_push_float(&at, p);
    return kiln_apply(KILN_OP_DROPOUT, 1, &x, &at, out);
}

/* ---- batch_norm forward -------------------------------------------------------------------- */

static void check_batch_norm(kiln_dtype dt, int nd, const int64_t *shape, const int64_t *perm, bool training,
                             bool with_running, double tol) {
    int64_t N = shape[0], C = shape[1], S = 1;
    for (int d = 2; d < nd; d++) S *= shape[d];
    kiln_tensor *x = make(dt, nd, shape, perm, -2, 3), *g = make(KILN_DTYPE_FLOAT32, 1, &C, NULL, 0.5, 1.5);
    kiln_tensor *b = make(KILN_DTYPE_FLOAT32, 1, &C, NULL, -1, 1);
    int64_t zero = 0, rc = with_running ? C : 0;
    kiln_tensor *rm = make(dt == KILN_DTYPE_FLOAT64 ? dt : KILN_DTYPE_FLOAT32, 1, &rc, NULL, -0.5, 0.5);
    kiln_tensor *rv = make(dt == KILN_DTYPE_FLOAT64 ? dt : KILN_DTYPE_FLOAT32, 1, &rc, NULL, 0.5, 2);
    double *xv = values(x), *gv = values(g), *bv = values(b), *rmv = values(rm), *rvv = values(rv);
    double *y = malloc(sizeof(double) * (size_t)(N * C * S + 1)), *mean = malloc(sizeof(double) * (size_t)(C + 1));
    double *invstd = malloc(sizeof(double) * (size_t)(C + 1));
    batch_norm_ref(xv, gv, bv, with_running ? rmv : NULL, with_running ? rvv : NULL, N, C, S, training, 1e-5, 0.1, y,
                   mean, invstd);
    kiln_tensor *out[3] = {NULL, NULL, NULL};
    int64_t v0 = kiln_tensor_version(rm);
    CHECK_OK(batch_norm(x, g, b, rm, rv, training, 1e-5, 0.1, out));
    if (out[0]) {
        kiln_dtype sd = dt == KILN_DTYPE_FLOAT64 ? dt : KILN_DTYPE_FLOAT32;
        CHECK(out[0]->meta.dtype == dt && out[1]->meta.dtype == sd && out[2]->meta.ndim == 1 && out[2]->meta.shape[0] == C);
        CHECK(close_to(out[0], y, tol));
        CHECK(close_to(out[1], mean, tol));
        CHECK(close_to(out[2], invstd, tol));
        CHECK(close_to(rm, rmv, tol) && close_to(rv, rvv, tol));
        CHECK(kiln_tensor_version(rm) == v0 + (training && with_running));
    }
    (void)zero;
    kiln_release_all(out, 3);
    kiln_tensor *ts[5] = {x, g, b, rm, rv};
    kiln_release_all(ts, 5);
    free(xv), free(gv), free(bv), free(rmv), free(rvv), free(y), free(mean), free(invstd);
}

static void test_batch_norm(void) {
    int64_t s4[4] = {4, 3, 5, 6}, s2[2] = {16, 5}, s3[3] = {2, 3, 7}, big[4] = {2, 4, 96, 100}, wide[2] = {4096, 24};
    int64_t huge_s[4] = {2, 2, 300, 300}, many_n[4] = {64, 3, 20, 20};
    int64_t nhwc[4] = {0, 2, 3, 1}, t2[2] = {1, 0};
    for (int training = 0; training < 2; training++) {
        check_batch_norm(KILN_DTYPE_FLOAT32, 4, s4, NULL, training, true, 1e-5);
        check_batch_norm(KILN_DTYPE_FLOAT32, 4, s4, nhwc, training, true, 1e-5); /* channels-last storage */
        check_batch_norm(KILN_DTYPE_FLOAT32, 2, s2, NULL, training, true, 1e-5);
        check_batch_norm(KILN_DTYPE_FLOAT64, 2, s2, t2, training, true, 1e-12);
        check_batch_norm(KILN_DTYPE_FLOAT64, 3, s3, NULL, training, true, 1e-12);
        check_batch_norm(KILN_DTYPE_FLOAT32, 4, big, NULL, training, true, 1e-5); /* parallel, several tasks */
        check_batch_norm(KILN_DTYPE_FLOAT32, 2, wide, NULL, training, true, 1e-5);
        check_batch_norm(KILN_DTYPE_FLOAT32, 4, huge_s, NULL, training, true, 1e-5); /* S in chunks */
        check_batch_norm(KILN_DTYPE_FLOAT64, 4, many_n, nhwc, training, true, 1e-12);
        check_batch_norm(KILN_DTYPE_FLOAT16, 4, s4, NULL, training, true, 2e-3);
        check_batch_norm(KILN_DTYPE_BFLOAT16, 3, s3, NULL, training, true, 2e-2);
    }
    /* without running statistics: batch statistics even in inference mode */
    check_batch_norm(KILN_DTYPE_FLOAT32, 4, s4, NULL, false, false, 1e-5);
    check_batch_norm(KILN_DTYPE_FLOAT64, 3, s3, NULL, true, false, 1e-12);
}

/* Statistics far from zero: the stable accumulation keeps the variance accurate. */
static void test_batch_norm_offset(void) {
    int64_t shape[3] = {64, 2, 300}, C = 2;
    kiln_tensor *x = make(KILN_DTYPE_FLOAT32, 3, shape, NULL, 0, 1);
    float *xs = x->data;
    for (int64_t i = 0; i < x->numel; i++) xs[i] += 10000.0f;
    kiln_tensor *g = constant(KILN_DTYPE_FLOAT32, 1, &C, 1), *b = constant(KILN_DTYPE_FLOAT32, 1, &C, 0);
    kiln_tensor *rm = constant(KILN_DTYPE_FLOAT32, 1, &C, 0), *rv = constant(KILN_DTYPE_FLOAT32, 1, &C, 1);
    kiln_tensor *out[3] = {NULL, NULL, NULL};
    CHECK_OK(batch_norm(x, g, b, rm, rv, true, 0, 0.1, out));
    double *xv = values(x), s = 0, q = 0;
    for (int64_t n = 0; n < 64; n++)
        for (int64_t k = 0; k < 300; k++) s += xv[n * 600 + k];
    double mu = s / 19200;
    for (int64_t n = 0; n < 64; n++)
        for (int64_t k = 0; k < 300; k++) q += (xv[n * 600 + k] - mu) * (xv[n * 600 + k] - mu);
    double want = 1 / sqrt(q / 19200);
    CHECK(out[2] && fabs(((float *)out[2]->data)[0] - want) < 1e-5 * want);
    kiln_release_all(out, 3);
    kiln_tensor *ts[5] = {x, g, b, rm, rv};
    kiln_release_all(ts, 5);
    free(xv);
}

/* ---- layer_norm / rms_norm forward ----------------------------------------------------------- */

static void check_layer_norm(kiln_dtype dt, int nd, const int64_t *shape, const int64_t *perm, int k, bool rms,
                             double tol) {
    int64_t D = kiln_shape_numel(k, shape + nd - k), R = kiln_shape_numel(nd - k, shape);
    kiln_tensor *x = make(dt, nd, shape, perm, -2, 3), *w = make(dt, k, shape + nd - k, NULL, 0.5, 1.5);
    kiln_tensor *b = rms ? NULL : make(KILN_DTYPE_FLOAT32, k, shape + nd - k, NULL, -1, 1);
    double *xv = values(x), *wv = values(w), *bv = b ? values(b) : NULL;
    double *y = malloc(sizeof(double) * (size_t)(R * D + 1)), *mean = malloc(sizeof(double) * (size_t)(R + 1));
    double *rstd = malloc(sizeof(double) * (size_t)(R + 1));
    layer_norm_ref(xv, wv, bv, R, D, 1e-5, y, mean, rstd);
    kiln_tensor *out[3] = {NULL, NULL, NULL};
    CHECK_OK(layer_norm(x, w, b, k, 1e-5, out));
    if (out[0]) {
        kiln_tensor *rs = out[rms ? 1 : 2];
        CHECK(out[0]->meta.dtype == dt && rs->meta.ndim == nd && rs->meta.shape[nd - 1] == 1 && rs->numel == R);
        CHECK(close_to(out[0], y, tol));
        CHECK(close_to(rs, rstd, tol));
        if (!rms) CHECK(close_to(out[1], mean, tol));
    }
    kiln_release_all(out, 3);
    kiln_tensor_release(x), kiln_tensor_release(w), kiln_tensor_release(b);
    free(xv), free(wv), free(bv), free(y), free(mean), free(rstd);
}

static void test_layer_norm(void) {
    int64_t s2[2] = {4, 10}, s4[4] = {2, 3, 4, 5}, big[2] = {512, 257}, s3[3] = {3, 5, 6};
    int64_t perm4[4] = {3, 1, 0, 2}, perm3[3] = {2, 0, 1};
    for (int rms = 0; rms < 2; rms++) {
        check_layer_norm(KILN_DTYPE_FLOAT32, 2, s2, NULL, 1, rms, 1e-5);
        check_layer_norm(KILN_DTYPE_FLOAT32, 4, s4, NULL, 2, rms, 1e-5);
        check_layer_norm(KILN_DTYPE_FLOAT32, 4, s4, perm4, 3, rms, 1e-5);
        check_layer_norm(KILN_DTYPE_FLOAT64, 3, s3, perm3, 1, rms, 1e-12);
        check_layer_norm(KILN_DTYPE_FLOAT64, 3, s3, NULL, 3, rms, 1e-12);
        check_layer_norm(KILN_DTYPE_FLOAT32, 2, big, NULL, 1, rms, 1e-5);
        check_layer_norm(KILN_DTYPE_FLOAT16, 2, s2, NULL, 1, rms, 3e-3);
        check_layer_norm(KILN_DTYPE_BFLOAT16, 3, s3, NULL, 2, rms, 2e-2);
    }
}

/* ---- gradient checks ------------------------------------------------------------------------- */

/* A forward under test: inputs -> nout outputs. */
typedef struct {
    kiln_op op;
    int nin, nout;
    kiln_attrs attrs;
    kiln_tensor *extra[2]; /* batch_norm: running statistics, replaced per call */
} fwd;

static kiln_status run_fwd(const fwd *f, kiln_tensor **in, kiln_tensor **out) {
    kiln_tensor *all[5] = {in[0], in[1], in[2], NULL, NULL};
    if (f->op == KILN_OP_BATCH_NORM) {
        all[3] = f->extra[0];
        all[4] = f->extra[1];
    }
    kiln_tensor *outs[KILN_MAX_OUTPUTS] = {NULL};
    KILN_TRY(kiln_apply(f->op, f->op == KILN_OP_BATCH_NORM ? 5 : f->nin, all, &f->attrs, outs));
    for (int k = 0; k < kiln_op_get(f->op)->nout; k++) {
        if (k < f->nout)
            out[k] = outs[k];
        else
            kiln_tensor_release(outs[k]);
    }
    return KILN_OK;
}

/* L = sum_k <out_k, cot_k> */
static double objective(const fwd *f, kiln_tensor **in, kiln_tensor **cot) {
    kiln_tensor *out[KILN_MAX_OUTPUTS] = {NULL};
    bool prev = kiln_set_grad_enabled(false);
    if (run_fwd(f, in, out) != KILN_OK) {
        fprintf(stderr, "objective: %s\n", kiln_last_error());
        exit(2);
    }
    kiln_set_grad_enabled(prev);
    double L = 0;
    for (int k = 0; k < f->nout; k++) {
        for (int64_t i = 0; i < out[k]->numel; i++) L += ((double *)out[k]->data)[i] * ((double *)cot[k]->data)[i];
        kiln_tensor_release(out[k]);
    }
    return L;
}

/* Analytic gradients (kiln_autograd_grad with random cotangents) against central differences. */
static void grad_check(const char *name, fwd *f, kiln_tensor **in, double tol) {
    kiln_tensor *out[KILN_MAX_OUTPUTS] = {NULL}, *cot[KILN_MAX_OUTPUTS] = {NULL}, *grads[3] = {NULL};
    for (int j = 0; j < f->nin; j++) CHECK_OK(kiln_tensor_set_requires_grad(in[j], true));
    CHECK_OK(run_fwd(f, in, out));
    if (!out[0]) return;
    for (int k = 0; k < f->nout; k++) cot[k] = make(KILN_DTYPE_FLOAT64, out[k]->meta.ndim, out[k]->meta.shape, NULL, -1, 1);
    CHECK_OK(kiln_autograd_grad(f->nout, out, cot, f->nin, in, false, grads));
    kiln_release_all(out, f->nout);
    const double h = 1e-6;
    for (int j = 0; j < f->nin; j++) {
        if (!grads[j]) {
            fprintf(stderr, "%s: no gradient for input %d\n", name, j);
            check_failures++;
            continue;
        }
        CHECK(grads[j]->meta.ndim == in[j]->meta.ndim && grads[j]->numel == in[j]->numel);
        double *x = in[j]->data, worst = 0;
        for (int64_t i = 0; i < in[j]->numel; i++) {
            double keep = x[i];
            x[i] = keep + h;
            double lp = objective(f, in, cot);
            x[i] = keep - h;
            double lm = objective(f, in, cot);
            x[i] = keep;
            double fd = (lp - lm) / (2 * h), an = kiln_tensor_get_double(grads[j], i);
            double err = fabs(fd - an) / (1 + fabs(fd));
            worst = err > worst ? err : worst;
        }
        if (!(worst < tol)) {
            fprintf(stderr, "%s: input %d, worst relative gradient error %g\n", name, j, worst);
            check_failures++;
        }
    }
    kiln_release_all(grads, f->nin);
    kiln_release_all(cot, f->nout);
    for (int j = 0; j < f->nin; j++) kiln_tensor_set_requires_grad(in[j], false);
}

static void test_batch_norm_grad(void) {
    int64_t shape[4] = {3, 2, 2, 3}, s2[2] = {5, 3};
    for (int nout = 1; nout <= 3; nout += 2)
        for (int training = 0; training < 2; training++)
            for (int sh = 0; sh < 2; sh++) {
                int nd = sh ? 2 : 4;
                const int64_t *s = sh ? s2 : shape;
                int64_t C = s[1];
                kiln_tensor *in[3] = {make(KILN_DTYPE_FLOAT64, nd, s, NULL, -2, 2),
                                      make(KILN_DTYPE_FLOAT64, 1, &C, NULL, 0.5, 1.5), make(KILN_DTYPE_FLOAT64, 1, &C, NULL, -1, 1)};
                fwd f = {.op = KILN_OP_BATCH_NORM, .nin = 3, .nout = training ? nout : 1};
                kiln_attrs_clear(&f.attrs);
                kiln_attrs_push_int(&f.attrs, training);
                kiln_attrs_push_float(&f.attrs, 1e-3);
                kiln_attrs_push_float(&f.attrs, 0.1);
                f.extra[0] = make(KILN_DTYPE_FLOAT64, 1, &C, NULL, -0.5, 0.5);
                f.extra[1] = make(KILN_DTYPE_FLOAT64, 1, &C, NULL, 0.5, 2);
                char name[64];
                snprintf(name, sizeof name, "batch_norm(training=%d, nout=%d, ndim=%d)", training, f.nout, nd);
                grad_check(name, &f, in, 1e-6);
                kiln_release_all(in, 3);
                kiln_release_all(f.extra, 2);
            }
}

static void test_layer_norm_grad(void) {
    int64_t s3[3] = {2, 3, 4}, s2[2] = {3, 5};
    for (int rms = 0; rms < 2; rms++)
        for (int nout = 1; nout <= 3; nout++) {
            if (rms && nout > 2) continue;
            for (int sh = 0; sh < 2; sh++) {
                int nd = sh ? 2 : 3, k = sh ? 1 : 2;
                const int64_t *s = sh ? s2 : s3;
                kiln_tensor *in[3] = {make(KILN_DTYPE_FLOAT64, nd, s, NULL, -2, 2), make(KILN_DTYPE_FLOAT64, k, s + nd - k, NULL, 0.5, 1.5),
                                      rms ? NULL : make(KILN_DTYPE_FLOAT64, k, s + nd - k, NULL, -1, 1)};
                fwd f = {.op = rms ? KILN_OP_RMS_NORM : KILN_OP_LAYER_NORM, .nin = rms ? 2 : 3, .nout = nout};
                kiln_attrs_clear(&f.attrs);
                kiln_attrs_push_int(&f.attrs, k);
                kiln_attrs_push_float(&f.attrs, 1e-3);
                char name[64];
                snprintf(name, sizeof name, "%s(k=%d, nout=%d)", rms ? "rms_norm" : "layer_norm", k, nout);
                grad_check(name, &f, in, 1e-6);
                kiln_release_all(in, 3);
            }
        }
}

/* Large float32 cases that run in parallel, covering every task layout of the kernels: the
 * forward and backward results do not depend on the thread count and match float64. */
typedef struct {
    int which; /* 0 layer_norm, 1 rms_norm, 2 batch_norm */
    int ndim;
    int64_t shape[4];
} big_case;

/* Forward + backward of case c at dtype dt: outputs then gradients of x, w[, b] in res. */
static void run_big(const big_case *c, kiln_dtype dt, kiln_tensor *const *src, kiln_tensor **res) {
    bool bn = c->which == 2;
    int nin = c->which == 1 ? 2 : 3, nout = c->which == 1 ? 2 : 3;
    int64_t P = bn ? c->shape[1] : c->shape[c->ndim - 1];
    kiln_tensor *ins[4] = {NULL}, *out[3] = {NULL, NULL, NULL};
    for (int k = 0; k < 4; k++) kiln_to_contiguous(src[k], dt, &ins[k]);
    for (int k = 0; k < nin; k++) CHECK_OK(kiln_tensor_set_requires_grad(ins[k], true));
    kiln_tensor *rm = constant(KILN_DTYPE_FLOAT32, 1, &P, 0), *rv = constant(KILN_DTYPE_FLOAT32, 1, &P, 1);
    if (bn)
        CHECK_OK(batch_norm(ins[0], ins[1], ins[2], rm, rv, true, 1e-5, 0.1, out));
    else
        CHECK_OK(layer_norm(ins[0], ins[1], c->which == 0 ? ins[2] : NULL, 1, 1e-5, out));
    CHECK_OK(kiln_autograd_grad(1, out, &ins[3], nin, ins, false, res + nout));
    for (int k = 0; k < nout; k++) kiln_tensor_detach(out[k], &res[k]);
    kiln_release_all(out, 3);
    kiln_release_all(ins, 4);
    kiln_tensor_release(rm), kiln_tensor_release(rv);
}

static void test_big_threads(void) {
    const big_case cases[] = {
        {0, 2, {700, 96}},       {1, 2, {700, 96}},       {0, 2, {20, 3000}},    {1, 2, {12, 5000}},
        {0, 2, {3, 70000}},      {2, 4, {8, 6, 40, 40}},  {2, 2, {2048, 40}},    {2, 3, {64, 512, 7}},
        {2, 4, {2, 2, 300, 300}}, {2, 4, {64, 3, 20, 20}},
    };
    int threads = omp_get_max_threads();
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const big_case *c = &cases[ci];
        bool bn = c->which == 2;
        int64_t P = bn ? c->shape[1] : c->shape[c->ndim - 1];
        kiln_tensor *src[4] = {make(KILN_DTYPE_FLOAT32, c->ndim, c->shape, NULL, -2, 2), make(KILN_DTYPE_FLOAT32, 1, &P, NULL, 0.5, 1.5),
                               make(KILN_DTYPE_FLOAT32, 1, &P, NULL, -1, 1), make(KILN_DTYPE_FLOAT32, c->ndim, c->shape, NULL, -1, 1)};
        int n = c->which == 1 ? 4 : 6;
        kiln_tensor *one[6] = {NULL}, *many[6] = {NULL}, *ref[6] = {NULL};
        omp_set_num_threads(1);
        run_big(c, KILN_DTYPE_FLOAT32, src, one);
        omp_set_num_threads(threads > 1 ? threads : 2);
        run_big(c, KILN_DTYPE_FLOAT32, src, many);
        omp_set_num_threads(threads);
        run_big(c, KILN_DTYPE_FLOAT64, src, ref);
        for (int k = 0; k < n; k++) {
            if (!one[k] || !many[k] || !ref[k]) {
                check_failures++;
                continue;
            }
            if (!same_bytes(one[k], many[k])) fprintf(stderr, "case %zu result %d differs between thread counts\n", ci, k);
            CHECK(same_bytes(one[k], many[k]));
            double *want = values(ref[k]), scale = 0, worst = 0;
            for (int64_t i = 0; i < ref[k]->numel; i++) scale = fmax(scale, fabs(want[i]));
            for (int64_t i = 0; i < ref[k]->numel; i++)
                worst = fmax(worst, fabs(kiln_tensor_get_double(many[k], i) - want[i]) / (1 + scale));
            if (!(worst < 1e-5)) fprintf(stderr, "case %zu result %d: float32 vs float64 error %g\n", ci, k, worst);
            CHECK(worst < 1e-5);
            free(want);
        }
        kiln_release_all(one, 6), kiln_release_all(many, 6), kiln_release_all(ref, 6), kiln_release_all(src, 4);
    }
}

/* ---- dropout ----------------------------------------------------------------------------------- */

static void test_dropout(void) {
    int64_t shape[2] = {1000, 1000};
    kiln_tensor *x = make(KILN_DTYPE_FLOAT32, 2, shape, NULL, 1, 2);
    double ps[3] = {0.1, 0.5, 0.9};
    for (int k = 0; k < 3; k++) {
        kiln_tensor *out[2] = {NULL, NULL};
        CHECK_OK(dropout(x, ps[k], out));
        if (!out[0]) continue;
        int64_t zeros = 0;
        bool ok = true;
        float scale = (float)(1 / (1 - ps[k]));
        const float *xs = x->data, *ys = out[0]->data, *ms = out[1]->data;
        for (int64_t i = 0; i < x->numel; i++) {
            if (ms[i] == 0) {
                zeros++;
                ok &= ys[i] == 0;
            } else {
                ok &= ms[i] == scale && ys[i] == xs[i] * scale;
            }
        }
        CHECK(ok);
        CHECK(fabs((double)zeros / 1e6 - ps[k]) < 0.003);
        kiln_release_all(out, 2);
    }
    /* p = 0: identity, mask of ones */
    kiln_tensor *out[2] = {NULL, NULL};
    CHECK_OK(dropout(x, 0.0, out));
    CHECK(same_bytes(out[0], x));
    bool ones = out[1] != NULL;
    for (int64_t i = 0; ones && i < x->numel; i++) ones = ((float *)out[1]->data)[i] == 1.0f;
    CHECK(ones);
    kiln_release_all(out, 2);
    /* float64, float16 and a transposed input */
    int64_t s2[2] = {40, 30}, perm[2] = {1, 0};
    kiln_dtype dts[3] = {KILN_DTYPE_FLOAT64, KILN_DTYPE_FLOAT16, KILN_DTYPE_BFLOAT16};
    for (int k = 0; k < 3; k++) {
        kiln_tensor *xt = make(dts[k], 2, s2, perm, -1, 1);
        CHECK_OK(dropout(xt, 0.25, out));
        bool ok = out[0] && out[0]->meta.dtype == dts[k] && out[0]->meta.shape[0] == 40;
        for (int64_t i = 0; ok && i < xt->numel; i++) {
            double m = kiln_tensor_get_double(out[1], i), y = kiln_tensor_get_double(out[0], i);
            double want = kiln_tensor_get_double(xt, i) * m;
            ok = (m == 0 || fabs(m - 4.0 / 3) < 1e-2) && fabs(y - want) <= 1e-2 * fabs(want);
        }
        CHECK(ok);
        kiln_release_all(out, 2);
        kiln_tensor_release(xt);
    }
    kiln_tensor_release(x);
}

static void test_dropout_determinism(void) {
    int64_t shape[2] = {300, 301};
    kiln_tensor *x = make(KILN_DTYPE_FLOAT32, 2, shape, NULL, -1, 1), *a[2] = {NULL}, *b[2] = {NULL}, *c[2] = {NULL};
    int threads = omp_get_max_threads();
    kiln_manual_seed(42);
    CHECK_OK(dropout(x, 0.3, a));
    CHECK_OK(dropout(x, 0.3, c));
    kiln_manual_seed(42);
    omp_set_num_threads(1);
    CHECK_OK(dropout(x, 0.3, b));
    omp_set_num_threads(threads);
    CHECK(same_bytes(a[1], b[1]) && same_bytes(a[0], b[0]));
    CHECK(!same_bytes(a[1], c[1]));
    kiln_release_all(a, 2), kiln_release_all(b, 2), kiln_release_all(c, 2);
    kiln_tensor_release(x);
}

static void test_dropout_grad(void) {
    int64_t shape[2] = {6, 7};
    kiln_tensor *x = make(KILN_DTYPE_FLOAT64, 2, shape, NULL, -1, 1), *out[2] = {NULL}, *g = NULL;
    kiln_tensor *cot = make(KILN_DTYPE_FLOAT64, 2, shape, NULL, -1, 1);
    CHECK_OK(kiln_tensor_set_requires_grad(x, true));
    CHECK_OK(dropout(x, 0.5, out));
    CHECK_OK(kiln_autograd_grad(1, out, &cot, 1, &x, false, &g));
    bool ok = g != NULL;
    for (int64_t i = 0; ok && i < x->numel; i++)
        ok = ((double *)g->data)[i] == ((double *)cot->data)[i] * ((double *)out[1]->data)[i];
    CHECK(ok);
    kiln_release_all(out, 2);
    kiln_tensor_release(g), kiln_tensor_release(x), kiln_tensor_release(cot);
}

/* ---- errors --------------------------------------------------------------------------------------- */

static void test_errors(void) {
    int64_t s4[4] = {2, 3, 4, 4}, C = 3, four = 4, s1[1] = {5}, zero = 0;
    kiln_tensor *x = make(KILN_DTYPE_FLOAT32, 4, s4, NULL, 0, 1), *g = constant(KILN_DTYPE_FLOAT32, 1, &C, 1);
    kiln_tensor *g4 = constant(KILN_DTYPE_FLOAT32, 1, &four, 1), *x1 = constant(KILN_DTYPE_FLOAT32, 1, s1, 1);
    kiln_tensor *empty = constant(KILN_DTYPE_FLOAT32, 1, &zero, 0), *out[3] = {NULL, NULL, NULL}, *xi = NULL;
    CHECK_STATUS(batch_norm(x, g4, g, g, g, true, 1e-5, 0.1, out), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "batch_norm") && strstr(kiln_last_error(), "(3,)") && strstr(kiln_last_error(), "(2, 3, 4, 4)") &&
          strstr(kiln_last_error(), "(4,)"));
    CHECK(out[0] == NULL);
    CHECK_STATUS(batch_norm(x1, g, g, g, g, true, 1e-5, 0.1, out), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "at least 2 dimensions"));
    CHECK_STATUS(batch_norm(x, g, g, empty, g, true, 1e-5, 0.1, out), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "both"));
    int64_t one[4] = {1, 3, 1, 1};
    kiln_tensor *x11 = constant(KILN_DTYPE_FLOAT32, 4, one, 1);
    CHECK_STATUS(batch_norm(x11, g, g, g, g, true, 1e-5, 0.1, out), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "more than 1 value per channel"));
    CHECK_OK(batch_norm(x11, g, g, g, g, false, 1e-5, 0.1, out)); /* fine in inference */
    kiln_release_all(out, 3);
    CHECK(kiln_tensor_empty(KILN_DTYPE_INT32, 4, s4, &xi) == KILN_OK);
    CHECK_STATUS(batch_norm(xi, g, g, g, g, true, 1e-5, 0.1, out), KILN_ERR_TYPE);
    /* layer norm: axes and weight shapes */
    kiln_tensor *w4 = constant(KILN_DTYPE_FLOAT32, 1, &four, 1);
    CHECK_STATUS(layer_norm(x, w4, w4, 5, 1e-5, out), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "layer_norm") && strstr(kiln_last_error(), "last 5 axes"));
    CHECK_STATUS(layer_norm(x, w4, w4, 2, 1e-5, out), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "normalized shape (4, 4)"));
    CHECK_STATUS(layer_norm(x, g, NULL, 1, 1e-5, out), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "rms_norm") && strstr(kiln_last_error(), "(4,)"));
    CHECK_OK(layer_norm(x, w4, w4, 1, 1e-5, out));
    kiln_release_all(out, 3);
    /* dropout */
    CHECK_STATUS(dropout(x, 1.0, out), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "dropout") && strstr(kiln_last_error(), "[0, 1)"));
    CHECK_STATUS(dropout(x, -0.1, out), KILN_ERR_VALUE);
    CHECK_STATUS(dropout(xi, 0.5, out), KILN_ERR_TYPE);
    CHECK_STATUS(kiln_apply(KILN_OP_DROPOUT, 1, &x, NULL, out), KILN_ERR_VALUE);
    CHECK(out[0] == NULL);
    /* backward ops with mismatched shapes */
    kiln_attrs at;
    kiln_attrs_clear(&at);
    kiln_attrs_push_int(&at, 1);
    kiln_tensor *bins[5] = {x1, x, g, g, g};
    CHECK_STATUS(kiln_apply(KILN_OP_BATCH_NORM_BACKWARD, 5, bins, &at, out), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "batch_norm_backward"));
    kiln_tensor *lins[4] = {x, x, w4, g};
    CHECK_STATUS(kiln_apply(KILN_OP_RMS_NORM_BACKWARD, 4, lins, &at, out), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "rms_norm_backward") && strstr(kiln_last_error(), "statistic"));
    kiln_tensor *ts[9] = {x, g, g4, x1, empty, x11, xi, w4, NULL};
    kiln_release_all(ts, 9);
}

int main(void) {
    test_batch_norm();
    test_batch_norm_offset();
    test_layer_norm();
    test_batch_norm_grad();
    test_layer_norm_grad();
    test_big_threads();
    test_dropout();
    test_dropout_determinism();
    test_dropout_grad();
    test_errors();
    CHECK_DONE();
}
