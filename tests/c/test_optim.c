/* Optimizer updates: sgd_update, adam_update and adam_amsgrad_update against plain reference loops over several
 * steps (momentum, dampening, nesterov, weight decay, bias correction), in-place contract,
 * versions, and error cases. */
#include "check.h"
#include "core/internal.h"

static uint64_t rng_state = 88172645463325252ull;
static double rnd(void) { /* xorshift, uniform in [-1, 1) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) * 0x1.0p-52 - 1.0;
}

static kiln_tensor *make(kiln_dtype dt, int nd, const int64_t *shape, double *ref, double scale) {
    kiln_tensor *t = NULL;
    if (kiln_tensor_empty(dt, nd, shape, &t) != KILN_OK) exit(2);
    for (int64_t i = 0; i < t->numel; i++) {
        double v = ref ? rnd() * scale : 0.0;
        if (dt == KILN_DTYPE_FLOAT32) {
            ((float *)t->data)[i] = (float)v;
            v = (float)v;
        } else {
            ((double *)t->data)[i] = v;
        }
        if (ref) ref[i] = v;
    }
    return t;
}

static double max_rel_err(const kiln_tensor *t, const double *ref) {
    double worst = 0;
    for (int64_t i = 0; i < t->numel; i++) {
        double e = fabs(kiln_tensor_get_double(t, i) - ref[i]) / (1.0 + fabs(ref[i]));
        worst = e > worst ? e : worst;
    }
    return worst;
}

/* A step counter holding `done` updates. */
static kiln_tensor *step_counter(int64_t done) {
    kiln_tensor *t = NULL;
    if (kiln_tensor_empty(KILN_DTYPE_INT64, 0, NULL, &t) != KILN_OK) exit(2);
    *(int64_t *)t->data = done;
    return t;
}

static kiln_status sgd(kiln_tensor *p, kiln_tensor *g, kiln_tensor *buf, double lr, double momentum, double wd,
                       double dampening, int nesterov, kiln_tensor **out) {
    kiln_attrs at;
    kiln_attrs_clear(&at);
    kiln_attrs_push_float(&at, lr);
    kiln_attrs_push_float(&at, momentum);
    kiln_attrs_push_float(&at, wd);
    kiln_attrs_push_float(&at, dampening);
    kiln_attrs_push_int(&at, nesterov);
    kiln_tensor *step = step_counter(1); /* past the first step: dampening applies */
    kiln_tensor *in[4] = {p, g, buf, step};
    kiln_status s = kiln_apply(KILN_OP_SGD_UPDATE, 4, in, &at, out);
    kiln_tensor_release(step);
    return s;
}

static kiln_status adam(kiln_tensor *p, kiln_tensor *g, kiln_tensor *m, kiln_tensor *v, double lr, double b1, double b2,
                        double eps, double wd, int64_t step, kiln_tensor **out) {
    kiln_attrs at;
    kiln_attrs_clear(&at);
    kiln_attrs_push_float(&at, lr);
    kiln_attrs_push_float(&at, b1);
    kiln_attrs_push_float(&at, b2);
    kiln_attrs_push_float(&at, eps);
    kiln_attrs_push_float(&at, wd);
    kiln_tensor *counter = step_counter(step - 1);
    kiln_tensor *in[5] = {p, g, m, v, counter};
    kiln_status s = kiln_apply(KILN_OP_ADAM_UPDATE, 5, in, &at, out);
    if (s == KILN_OK && *(int64_t *)counter->data != step) s = kiln_error(KILN_ERR_RUNTIME, "step not incremented");
    kiln_tensor_release(counter);
    return s;
}

/* PyTorch's SGD step, with buf starting as zeros */
static void sgd_ref(double *p, const double *g, double *buf, int64_t n, double lr, double momentum, double wd,
                    double dampening, int nesterov) {
    for (int64_t i = 0; i < n; i++) {
        double d = g[i] + wd * p[i];
        if (momentum != 0) {
            buf[i] = momentum * buf[i] + (1 - dampening) * d;
            d = nesterov ? d + momentum * buf[i] : buf[i];
        }
        p[i] -= lr * d;
    }
}

static void adam_ref(double *p, const double *g, double *m, double *v, int64_t n, double lr, double b1, double b2,
                     double eps, double wd, int64_t step) {
    double bc1 = 1 - pow(b1, (double)step), bc2 = 1 - pow(b2, (double)step);
    for (int64_t i = 0; i < n; i++) {
        double gi = g[i] + wd * p[i];
        m[i] = b1 * m[i] + (1 - b1) * gi;
        v[i] = b2 * v[i] + (1 - b2) * gi * gi;
        p[i] -= lr * (m[i] / bc1) / (sqrt(v[i] / bc2) + eps);
    }
}

static void test_sgd(void) {
    struct {
        double momentum, wd, dampening;
        int nesterov;
    } cases[] = {{0, 0, 0, 0}, {0.9, 0, 0, 0}, {0.9, 1e-2, 0.1, 0}, {0.8, 1e-3, 0, 1}, {0, 0.05, 0, 0}};
    kiln_dtype dts[2] = {KILN_DTYPE_FLOAT32, KILN_DTYPE_FLOAT64};
    int64_t shapes[2][2] = {{7, 13}, {300, 250}}; /* the second runs in parallel */
    for (int c = 0; c < 5; c++)
        for (int d = 0; d < 2; d++)
            for (int s = 0; s < 2; s++) {
                int64_t n = shapes[s][0] * shapes[s][1];
                double *rp = malloc(sizeof(double) * (size_t)n), *rg = malloc(sizeof(double) * (size_t)n);
                double *rb = calloc((size_t)n, sizeof(double));
                kiln_tensor *p = make(dts[d], 2, shapes[s], rp, 1.0), *buf = make(dts[d], 2, shapes[s], NULL, 0);
                bool ok = true;
                for (int step = 0; step < 4; step++) {
                    kiln_tensor *g = make(dts[d], 2, shapes[s], rg, 0.5), *out = NULL;
                    int64_t v0 = kiln_tensor_version(p), vb = kiln_tensor_version(buf);
                    CHECK_OK(sgd(p, g, buf, 0.1, cases[c].momentum, cases[c].wd, cases[c].dampening, cases[c].nesterov, &out));
                    ok &= out == p && kiln_tensor_version(p) > v0;
                    ok &= cases[c].momentum == 0 || kiln_tensor_version(buf) > vb;
                    sgd_ref(rp, rg, rb, n, 0.1, cases[c].momentum, cases[c].wd, cases[c].dampening, cases[c].nesterov);
                    kiln_tensor_release(out), kiln_tensor_release(g);
                }
                double tol = dts[d] == KILN_DTYPE_FLOAT32 ? 1e-5 : 1e-13;
                CHECK(ok);
                if (max_rel_err(p, rp) >= tol)
                    fprintf(stderr, "sgd case %d dtype %d shape %d: error %g\n", c, d, s, max_rel_err(p, rp));
                CHECK(max_rel_err(p, rp) < tol);
                if (cases[c].momentum != 0) CHECK(max_rel_err(buf, rb) < tol);
                kiln_tensor_release(p), kiln_tensor_release(buf);
                free(rp), free(rg), free(rb);
            }
}

/* A transposed gradient of another dtype is read through a converted copy. */
static void test_sgd_strided_grad(void) {
    int64_t shape[2] = {5, 3}, tshape[2] = {3, 5}, perm[2] = {1, 0};
    double rp[15], rg[15], rb[15] = {0};
    kiln_tensor *p = make(KILN_DTYPE_FLOAT64, 2, shape, rp, 1), *gt = make(KILN_DTYPE_FLOAT32, 2, tshape, rg, 1);
    kiln_tensor *buf = make(KILN_DTYPE_FLOAT64, 2, shape, NULL, 0), *g = NULL, *out = NULL;
    CHECK_OK(kiln_emit_permute(gt, perm, &g));
    double gl[15];
    for (int i = 0; i < 15; i++) gl[i] = kiln_tensor_get_double(g, i);
    CHECK_OK(sgd(p, g, buf, 0.5, 0.9, 0, 0, 0, &out));
    sgd_ref(rp, gl, rb, 15, 0.5, 0.9, 0, 0, 0);
    CHECK(max_rel_err(p, rp) < 1e-12);
    kiln_tensor_release(out), kiln_tensor_release(g), kiln_tensor_release(gt);
    kiln_tensor_release(p), kiln_tensor_release(buf);
    (void)rg;
}

static void test_adam(void) {
    kiln_dtype dts[2] = {KILN_DTYPE_FLOAT32, KILN_DTYPE_FLOAT64};
    int64_t shapes[2][2] = {{4, 9}, {512, 129}};
    double wds[2] = {0, 0.01};
    for (int d = 0; d < 2; d++)
        for (int s = 0; s < 2; s++)
            for (int w = 0; w < 2; w++) {
                int64_t n = shapes[s][0] * shapes[s][1];
                double *rp = malloc(sizeof(double) * (size_t)n), *rg = malloc(sizeof(double) * (size_t)n);
                double *rm = calloc((size_t)n, sizeof(double)), *rv = calloc((size_t)n, sizeof(double));
                kiln_tensor *p = make(dts[d], 2, shapes[s], rp, 1.0);
                kiln_tensor *m = make(dts[d], 2, shapes[s], NULL, 0), *v = make(dts[d], 2, shapes[s], NULL, 0);
                bool ok = true;
                for (int64_t step = 1; step <= 5; step++) {
                    kiln_tensor *g = make(dts[d], 2, shapes[s], rg, 0.3), *out = NULL;
                    int64_t v0 = kiln_tensor_version(p), vm = kiln_tensor_version(m), vv = kiln_tensor_version(v);
                    CHECK_OK(adam(p, g, m, v, 1e-2, 0.9, 0.999, 1e-8, wds[w], step, &out));
                    ok &= out == p && kiln_tensor_version(p) > v0 && kiln_tensor_version(m) > vm && kiln_tensor_version(v) > vv;
                    adam_ref(rp, rg, rm, rv, n, 1e-2, 0.9, 0.999, 1e-8, wds[w], step);
                    kiln_tensor_release(out), kiln_tensor_release(g);
                }
                double tol = dts[d] == KILN_DTYPE_FLOAT32 ? 2e-5 : 1e-12;
                CHECK(ok);
                if (max_rel_err(p, rp) >= tol)
                    fprintf(stderr, "adam dtype %d shape %d wd %d: error %g\n", d, s, w, max_rel_err(p, rp));
                CHECK(max_rel_err(p, rp) < tol && max_rel_err(m, rm) < tol && max_rel_err(v, rv) < tol);
                kiln_tensor_release(p), kiln_tensor_release(m), kiln_tensor_release(v);
                free(rp), free(rg), free(rm), free(rv);
            }
}

/* adam_amsgrad_update(p, g, m, v, vmax, step): PyTorch's amsgrad=True, vmax = max(vmax, v) divides */
static void test_adam_amsgrad(void) {
    kiln_dtype dts[2] = {KILN_DTYPE_FLOAT32, KILN_DTYPE_FLOAT64};
    int64_t shape[2] = {300, 250}; /* runs in parallel */
    int64_t n = shape[0] * shape[1];
    for (int d = 0; d < 2; d++) {
        double *rp = malloc(sizeof(double) * (size_t)n), *rg = malloc(sizeof(double) * (size_t)n);
        double *rm = calloc((size_t)n, sizeof(double)), *rv = calloc((size_t)n, sizeof(double));
        double *rx = calloc((size_t)n, sizeof(double));
        kiln_tensor *p = make(dts[d], 2, shape, rp, 1.0), *m = make(dts[d], 2, shape, NULL, 0);
        kiln_tensor *v = make(dts[d], 2, shape, NULL, 0), *vmax = make(dts[d], 2, shape, NULL, 0);
        bool ok = true, kept_max = false;
        for (int64_t step = 1; step <= 6; step++) {
            /* gradients that shrink: v falls below its maximum, which then divides */
            kiln_tensor *g = make(dts[d], 2, shape, rg, 1.0 / (double)(step * step)), *out = NULL;
            kiln_tensor *counter = step_counter(step - 1);
            kiln_attrs at;
            kiln_attrs_clear(&at);
            double f[5] = {1e-2, 0.9, 0.9, 1e-8, 0.01};
            for (int k = 0; k < 5; k++) kiln_attrs_push_float(&at, f[k]);
            int64_t vx = kiln_tensor_version(vmax);
            kiln_tensor *in[6] = {p, g, m, v, vmax, counter};
            CHECK_OK(kiln_apply(KILN_OP_ADAM_AMSGRAD_UPDATE, 6, in, &at, &out));
            ok &= out == p && kiln_tensor_version(vmax) > vx && *(int64_t *)counter->data == step;
            double bc1 = 1 - pow(0.9, (double)step), bc2 = 1 - pow(0.9, (double)step);
            for (int64_t i = 0; i < n; i++) {
                double gi = rg[i] + 0.01 * rp[i];
                rm[i] = 0.9 * rm[i] + 0.1 * gi;
                rv[i] = 0.9 * rv[i] + 0.1 * gi * gi;
                rx[i] = rx[i] > rv[i] ? rx[i] : rv[i];
                kept_max |= rx[i] > rv[i] * 1.5;
                rp[i] -= 1e-2 * (rm[i] / bc1) / (sqrt(rx[i] / bc2) + 1e-8);
            }
            kiln_tensor_release(out), kiln_tensor_release(g), kiln_tensor_release(counter);
        }
        double tol = dts[d] == KILN_DTYPE_FLOAT32 ? 2e-5 : 1e-12;
        CHECK(ok && kept_max);
        if (max_rel_err(p, rp) >= tol) fprintf(stderr, "adam_amsgrad dtype %d: error %g\n", d, max_rel_err(p, rp));
        CHECK(max_rel_err(p, rp) < tol && max_rel_err(vmax, rx) < tol && max_rel_err(v, rv) < tol);
        /* a vmax of another shape is named */
        int64_t s6[1] = {6};
        kiln_tensor *bad = make(dts[d], 1, s6, NULL, 0), *counter = step_counter(0), *out = NULL;
        kiln_attrs at;
        kiln_attrs_clear(&at);
        for (int k = 0; k < 5; k++) kiln_attrs_push_float(&at, k == 0 ? 0.1 : 0.5);
        kiln_tensor *in[6] = {p, p, m, v, bad, counter};
        CHECK_STATUS(kiln_apply(KILN_OP_ADAM_AMSGRAD_UPDATE, 6, in, &at, &out), KILN_ERR_VALUE);
        CHECK(strstr(kiln_last_error(), "adam_amsgrad_update") && strstr(kiln_last_error(), "vmax"));
        kiln_tensor_release(bad), kiln_tensor_release(counter);
        kiln_tensor_release(p), kiln_tensor_release(m), kiln_tensor_release(v), kiln_tensor_release(vmax);
        free(rp), free(rg), free(rm), free(rv), free(rx);
    }
}

static void test_errors(void) {
    int64_t s23[2] = {2, 3}, s32[2] = {3, 2}, s6[1] = {6};
    kiln_tensor *p = make(KILN_DTYPE_FLOAT32, 2, s23, NULL, 0), *g = make(KILN_DTYPE_FLOAT32, 2, s23, NULL, 0);
    kiln_tensor *buf = make(KILN_DTYPE_FLOAT32, 2, s23, NULL, 0), *bad = make(KILN_DTYPE_FLOAT32, 1, s6, NULL, 0);
    kiln_tensor *g64 = make(KILN_DTYPE_FLOAT64, 2, s23, NULL, 0), *out = NULL, *pt = NULL, *ip = NULL;
    CHECK_STATUS(sgd(p, bad, buf, 0.1, 0.9, 0, 0, 0, &out), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "sgd_update") && strstr(kiln_last_error(), "(6,)") && strstr(kiln_last_error(), "(2, 3)"));
    CHECK_STATUS(sgd(p, g, bad, 0.1, 0.9, 0, 0, 0, &out), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "momentum buffer"));
    CHECK_STATUS(sgd(p, g, g64, 0.1, 0.9, 0, 0, 0, &out), KILN_ERR_VALUE); /* state dtype */
    CHECK_OK(sgd(p, g, bad, 0.1, 0, 0, 0, 0, &out)); /* no momentum: buf unused */
    kiln_tensor_release(out);
    out = NULL;
    CHECK_OK(sgd(p, g64, buf, 0.1, 0.9, 0, 0, 0, &out)); /* a float64 gradient is converted */
    kiln_tensor_release(out);
    out = NULL;
    CHECK_STATUS(sgd(p, g, buf, 0.1, 0, 0, 0, 1, &out), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "nesterov"));
    CHECK_STATUS(sgd(p, g, buf, 0.1, -0.5, 0, 0, 0, &out), KILN_ERR_VALUE);
    /* a non-contiguous parameter cannot be updated in place */
    kiln_tensor *p32 = make(KILN_DTYPE_FLOAT32, 2, s32, NULL, 0);
    int64_t perm[2] = {1, 0};
    CHECK_OK(kiln_emit_permute(p32, perm, &pt));
    CHECK_STATUS(sgd(pt, g, buf, 0.1, 0.9, 0, 0, 0, &out), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "contiguous"));
    CHECK(kiln_tensor_empty(KILN_DTYPE_INT32, 2, s23, &ip) == KILN_OK);
    CHECK_STATUS(sgd(ip, g, buf, 0.1, 0.9, 0, 0, 0, &out), KILN_ERR_TYPE);
    CHECK(strstr(kiln_last_error(), "int32"));
    CHECK_STATUS(adam(p, g, buf, buf, 0.1, 0.9, 0.999, 1e-8, 0, 0, &out), KILN_ERR_VALUE); /* counter at -1 */
    CHECK(strstr(kiln_last_error(), "step"));
    kiln_tensor *fstep = NULL, *adam_in[5] = {p, g, buf, buf, NULL};
    CHECK(kiln_tensor_zeros(KILN_DTYPE_FLOAT32, 0, NULL, &fstep) == KILN_OK);
    adam_in[4] = fstep;
    kiln_attrs aat;
    kiln_attrs_clear(&aat);
    for (int k = 0; k < 5; k++) kiln_attrs_push_float(&aat, k == 1 ? 0.9 : (k == 2 ? 0.999 : 0.001));
    CHECK_STATUS(kiln_apply(KILN_OP_ADAM_UPDATE, 5, adam_in, &aat, &out), KILN_ERR_TYPE);
    CHECK(strstr(kiln_last_error(), "step") && strstr(kiln_last_error(), "int64"));
    kiln_tensor_release(fstep);
    CHECK_STATUS(adam(p, g, buf, bad, 0.1, 0.9, 0.999, 1e-8, 0, 1, &out), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "second moment"));
    CHECK_STATUS(adam(p, g, buf, buf, 0.1, 1.0, 0.999, 1e-8, 0, 1, &out), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "betas"));
    kiln_attrs at;
    kiln_attrs_clear(&at);
    kiln_attrs_push_float(&at, 0.1);
    kiln_attrs_push_int(&at, 0);
    kiln_tensor *counter = step_counter(0);
    kiln_tensor *in[4] = {p, g, buf, counter};
    CHECK_STATUS(kiln_apply(KILN_OP_SGD_UPDATE, 4, in, &at, &out), KILN_ERR_VALUE);
    kiln_tensor_release(counter);
    CHECK(out == NULL);
    kiln_tensor *ts[9] = {p, g, buf, bad, g64, pt, p32, ip, NULL};
    for (int k = 0; ts[k]; k++) kiln_tensor_release(ts[k]);
}

/* Parameters that require grad: the update is not recorded (optimizers run outside autograd). */
static void test_param_requires_grad(void) {
    int64_t s[1] = {5};
    double rp[5], rg[5], rb[5] = {0};
    kiln_tensor *p = make(KILN_DTYPE_FLOAT32, 1, s, rp, 1), *g = make(KILN_DTYPE_FLOAT32, 1, s, rg, 1);
    kiln_tensor *buf = make(KILN_DTYPE_FLOAT32, 1, s, NULL, 0), *out = NULL;
    CHECK_OK(kiln_tensor_set_requires_grad(p, true));
    CHECK_OK(sgd(p, g, buf, 1.0, 0, 0, 0, 0, &out));
    sgd_ref(rp, rg, rb, 5, 1.0, 0, 0, 0, 0);
    CHECK(out == p && p->grad_fn == NULL && max_rel_err(p, rp) < 1e-6);
    kiln_tensor_release(out), kiln_tensor_release(p), kiln_tensor_release(g), kiln_tensor_release(buf);
}

int main(void) {
    test_sgd();
    test_sgd_strided_grad();
    test_adam();
    test_adam_amsgrad();
    test_errors();
    test_param_requires_grad();
    CHECK_DONE();
}
