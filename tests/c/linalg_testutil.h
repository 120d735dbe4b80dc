/* Helpers shared by test_matmul.c, test_conv.c and test_pool.c: random tensors,
 * non-contiguous copies, value comparison and a finite-difference gradient check. */
#ifndef KILN_TEST_LINALG_TESTUTIL_H
#define KILN_TEST_LINALG_TESTUTIL_H

#include "check.h"
#include "core/internal.h"

static uint64_t tu_rng = 0x9E3779B97F4A7C15ull;

/* Uniform in [-1, 1). */
static inline double tu_rand(void) {
    tu_rng ^= tu_rng << 13, tu_rng ^= tu_rng >> 7, tu_rng ^= tu_rng << 17;
    return (double)(tu_rng >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

static inline kiln_tensor *tu_tensor(kiln_dtype dt, int nd, const int64_t *shape) {
    kiln_tensor *t = NULL, *src = NULL;
    if (kiln_tensor_empty(dt, nd, shape, &t) != KILN_OK || kiln_tensor_empty(KILN_DTYPE_FLOAT64, nd, shape, &src) != KILN_OK) {
        fprintf(stderr, "tu_tensor: %s\n", kiln_last_error());
        exit(2);
    }
    double *v = src->data;
    for (int64_t i = 0; i < src->numel; i++)
        v[i] = kiln_dtype_is_float(dt) ? tu_rand() : (double)(int)(tu_rand() * 5);
    if (kiln_copy_into(t, src) != KILN_OK) exit(2);
    kiln_tensor_release(src);
    return t;
}

/* The same values in a layout that is not contiguous: `how` 0 = every other element of the
 * last axis, 1 = stored transposed (axes reversed), 2 = both. */
static inline kiln_tensor *tu_noncontig(kiln_tensor *t, int how) {
    int nd = t->meta.ndim;
    bool rev = how != 0, skip = how != 1;
    int64_t bshape[KILN_MAX_DIMS], bstr[KILN_MAX_DIMS], strides[KILN_MAX_DIMS];
    for (int d = 0; d < nd; d++) bshape[d] = t->meta.shape[rev ? nd - 1 - d : d];
    int last = rev ? 0 : nd - 1; /* the stored axis holding the logical last axis */
    if (skip && nd) bshape[last] *= 2;
    kiln_tensor *base = NULL, *view = NULL;
    if (kiln_tensor_zeros(t->meta.dtype, nd, bshape, &base) != KILN_OK) exit(2);
    kiln_contiguous_strides(nd, bshape, bstr);
    for (int d = 0; d < nd; d++) strides[d] = bstr[rev ? nd - 1 - d : d];
    if (skip && nd) strides[nd - 1] *= 2;
    if (kiln_tensor_view(base, nd, t->meta.shape, strides, 0, &view) != KILN_OK) exit(2);
    kiln_tensor_release(base);
    if (kiln_copy_into(view, t) != KILN_OK) exit(2);
    return view;
}

/* Row-major values of any tensor as doubles (caller frees). */
static inline double *tu_values(const kiln_tensor *t) {
    double *v = malloc(sizeof(double) * (size_t)(t->numel ? t->numel : 1));
    for (int64_t i = 0; i < t->numel; i++) v[i] = kiln_tensor_get_double(t, i);
    return v;
}

static inline int tu_close(const double *got, const double *want, int64_t n, double tol, const char *what) {
    for (int64_t i = 0; i < n; i++)
        if (!(fabs(got[i] - want[i]) <= tol * (1.0 + fabs(want[i])))) {
            fprintf(stderr, "  %s: element %lld: got %.10g, want %.10g\n", what, (long long)i, got[i], want[i]);
            return 0;
        }
    return 1;
}

/* Checks a tensor against reference values (row-major). */
static inline int tu_check(const kiln_tensor *got, const double *want, double tol, const char *what) {
    if (!got) return 0;
    double *v = tu_values(got);
    int ok = tu_close(v, want, got->numel, tol, what);
    free(v);
    return ok;
}

static inline double tu_dot(const kiln_tensor *t, const double *r) {
    double s = 0;
    for (int64_t i = 0; i < t->numel; i++) s += kiln_tensor_get_double(t, i) * r[i];
    return s;
}

/* Finite-difference check of d/d(inputs) of sum(op(inputs) * R) for the float64 contiguous
 * inputs marked in `check` (bit j), against kiln_autograd_grad. */
static inline int tu_gradcheck(kiln_op op, int nin, kiln_tensor **ins, const kiln_attrs *at, unsigned check,
                               const char *what) {
    int ok = 1;
    kiln_tensor *y = NULL, *r = NULL, *grads[8] = {0};
    for (int j = 0; j < nin; j++)
        if ((check >> j) & 1u) kiln_tensor_set_requires_grad(ins[j], true);
    if (kiln_apply(op, nin, ins, at, &y) != KILN_OK) {
        fprintf(stderr, "  %s: forward failed: %s\n", what, kiln_last_error());
        return 0;
    }
    r = tu_tensor(KILN_DTYPE_FLOAT64, y->meta.ndim, y->meta.shape);
    double *rv = r->data;
    kiln_tensor *inputs[8];
    int idx[8], n = 0;
    for (int j = 0; j < nin; j++)
        if ((check >> j) & 1u) inputs[n] = ins[j], idx[n++] = j;
    if (kiln_autograd_grad(1, &y, &r, n, inputs, false, grads) != KILN_OK) {
        fprintf(stderr, "  %s: backward failed: %s\n", what, kiln_last_error());
        ok = 0;
    }
    bool prev = kiln_set_grad_enabled(false);
    for (int k = 0; ok && k < n; k++) {
        kiln_tensor *x = ins[idx[k]];
        double *xv = x->data, eps = 1e-6;
        double *num = malloc(sizeof(double) * (size_t)(x->numel ? x->numel : 1));
        for (int64_t i = 0; i < x->numel; i++) {
            double keep = xv[i], f[2];
            for (int sgn = 0; sgn < 2; sgn++) {
                kiln_tensor *yp = NULL;
                xv[i] = keep + (sgn ? -eps : eps);
                if (kiln_apply(op, nin, ins, at, &yp) != KILN_OK) exit(2);
                f[sgn] = tu_dot(yp, rv);
                kiln_tensor_release(yp);
            }
            xv[i] = keep;
            num[i] = (f[0] - f[1]) / (2 * eps);
        }
        char name[128];
        snprintf(name, sizeof name, "%s: gradient of input %d", what, idx[k]);
        if (!grads[k] || grads[k]->meta.ndim != x->meta.ndim) {
            fprintf(stderr, "  %s missing or misshaped\n", name);
            ok = 0;
        } else {
            ok = tu_check(grads[k], num, 1e-6, name);
        }
        free(num);
    }
    kiln_set_grad_enabled(prev);
    for (int j = 0; j < nin; j++) kiln_tensor_set_requires_grad(ins[j], false);
    kiln_release_all(grads, n);
    kiln_tensor_release(y), kiln_tensor_release(r);
    return ok;
}

#endif
