/* concat against a plain reference: dtypes and promotion, every axis, empty and strided inputs,
 * the parallel path, finite-difference gradients and error messages. */
#include "check.h"
#include "core/internal.h"

static uint64_t rng_state = 0x2545f4914f6cdd1dull;
static uint64_t rng_next(void) {
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return rng_state;
}
static double rng_uniform(void) { return (double)(rng_next() >> 11) / 9007199254740992.0; }

static kiln_attrs axis_attrs(int64_t axis) {
    kiln_attrs a;
    kiln_attrs_clear(&a);
    kiln_attrs_push_int(&a, axis);
    return a;
}

static void fill_random(kiln_tensor *t) {
    for (int64_t i = 0; i < t->numel; i++) {
        char *p = (char *)t->data + (size_t)i * kiln_dtype_size(t->meta.dtype);
        double u = rng_uniform();
        switch (t->meta.dtype) {
        case KILN_DTYPE_BOOL: *(uint8_t *)p = u < 0.5; break;
        case KILN_DTYPE_INT32: *(int32_t *)p = (int32_t)(u * 200) - 100; break;
        case KILN_DTYPE_FLOAT32: *(float *)p = (float)(u * 2 - 1); break;
        case KILN_DTYPE_FLOAT64: *(double *)p = u * 2 - 1; break;
        default: break;
        }
    }
}

/* Random tensor of the given shape; when `strided`, a transposed view of its last two axes. */
static kiln_tensor *make(kiln_dtype dtype, int ndim, const int64_t *shape, bool strided) {
    kiln_tensor *t = NULL, *view = NULL;
    if (!strided || ndim < 2) {
        if (kiln_tensor_empty(dtype, ndim, shape, &t) != KILN_OK) exit(2);
        fill_random(t);
        return t;
    }
    int64_t alloc[KILN_MAX_DIMS], perm[KILN_MAX_DIMS];
    for (int d = 0; d < ndim; d++) alloc[d] = shape[d], perm[d] = d;
    alloc[ndim - 2] = shape[ndim - 1], alloc[ndim - 1] = shape[ndim - 2];
    perm[ndim - 2] = ndim - 1, perm[ndim - 1] = ndim - 2;
    if (kiln_tensor_empty(dtype, ndim, alloc, &t) != KILN_OK) exit(2);
    fill_random(t);
    if (kiln_emit_permute(t, perm, &view) != KILN_OK) exit(2);
    kiln_tensor_release(t);
    return view;
}

static double getd(const kiln_tensor *t, int64_t i) { return kiln_tensor_get_double(t, i); }

/* Reference: walk the output in row-major order and read the input that owns each position. */
static double *ref_concat(kiln_tensor *const *in, int nin, int axis, int64_t *numel) {
    int nd = in[0]->meta.ndim;
    int64_t outer = 1, inner = 1, total = 0;
    for (int d = 0; d < axis; d++) outer *= in[0]->meta.shape[d];
    for (int d = axis + 1; d < nd; d++) inner *= in[0]->meta.shape[d];
    for (int k = 0; k < nin; k++) total += in[k]->meta.shape[axis];
    *numel = outer * total * inner;
    double *r = malloc(sizeof(double) * (size_t)(*numel + 1));
    int64_t p = 0;
    for (int64_t o = 0; o < outer; o++)
        for (int k = 0; k < nin; k++) {
            int64_t len = in[k]->meta.shape[axis];
            for (int64_t c = 0; c < len * inner; c++) r[p++] = getd(in[k], o * len * inner + c);
        }
    return r;
}

static bool matches(const kiln_tensor *t, const double *want, int64_t n) {
    if (!t || t->numel != n) return false;
    for (int64_t i = 0; i < n; i++)
        if (getd(t, i) != want[i]) {
            fprintf(stderr, "  element %lld: got %.17g, want %.17g\n", (long long)i, getd(t, i), want[i]);
            return false;
        }
    return true;
}

static void test_concat_reference(void) {
    const kiln_dtype dtypes[] = {KILN_DTYPE_FLOAT32, KILN_DTYPE_FLOAT64, KILN_DTYPE_INT32, KILN_DTYPE_BOOL};
    const int64_t base[3] = {3, 4, 5};
    const int64_t lens[3] = {2, 0, 3}; /* an empty input in the middle */
    for (size_t di = 0; di < 4; di++)
        for (int nd = 1; nd <= 3; nd++)
            for (int axis = 0; axis < nd; axis++)
                for (int strided = 0; strided < 4; strided++) {
                    kiln_tensor *in[3];
                    for (int k = 0; k < 3; k++) {
                        int64_t shape[3];
                        for (int d = 0; d < nd; d++) shape[d] = d == axis ? lens[k] : base[d];
                        in[k] = make(dtypes[di], nd, shape, (strided >> (k & 1)) & 1);
                    }
                    kiln_tensor *out = NULL;
                    kiln_attrs at = axis_attrs(axis);
                    CHECK_OK(kiln_apply(KILN_OP_CONCAT, 3, in, &at, &out));
                    int64_t n;
                    double *want = ref_concat(in, 3, axis, &n);
                    CHECK(out && out->meta.dtype == dtypes[di] && out->meta.ndim == nd);
                    CHECK(out && out->meta.shape[axis] == 5);
                    CHECK(matches(out, want, n));
                    free(want);
                    kiln_tensor_release(out);
                    kiln_release_all(in, 3);
                }
    /* a negative axis and a single input */
    int64_t s[2] = {2, 3};
    kiln_tensor *one = make(KILN_DTYPE_FLOAT32, 2, s, true), *out = NULL;
    kiln_attrs at = axis_attrs(-1);
    CHECK_OK(kiln_apply(KILN_OP_CONCAT, 1, &one, &at, &out));
    int64_t n;
    double *want = ref_concat(&one, 1, 1, &n);
    CHECK(matches(out, want, n));
    free(want);
    kiln_tensor_release(one), kiln_tensor_release(out);
}

static void test_concat_promotion(void) {
    int64_t s1[2] = {2, 3}, s2[2] = {2, 2};
    const kiln_dtype pairs[][3] = {
        {KILN_DTYPE_INT32, KILN_DTYPE_FLOAT32, KILN_DTYPE_FLOAT32},
        {KILN_DTYPE_BOOL, KILN_DTYPE_INT32, KILN_DTYPE_INT32},
        {KILN_DTYPE_FLOAT32, KILN_DTYPE_FLOAT64, KILN_DTYPE_FLOAT64},
    };
    for (int p = 0; p < 3; p++) {
        kiln_tensor *in[2] = {make(pairs[p][0], 2, s1, p == 1), make(pairs[p][1], 2, s2, false)}, *out = NULL;
        kiln_attrs at = axis_attrs(1);
        CHECK_OK(kiln_apply(KILN_OP_CONCAT, 2, in, &at, &out));
        CHECK(out && out->meta.dtype == pairs[p][2] && out->meta.shape[1] == 5);
        int64_t n;
        double *want = ref_concat(in, 2, 1, &n);
        for (int64_t i = 0; i < n && pairs[p][2] == KILN_DTYPE_FLOAT32; i++) want[i] = (float)want[i];
        CHECK(matches(out, want, n));
        free(want);
        kiln_tensor_release(out);
        kiln_release_all(in, 2);
    }
}

static void test_concat_large(void) {
    int64_t s1[2] = {4000, 24}, s2[2] = {4000, 40};
    kiln_tensor *in[3] = {make(KILN_DTYPE_FLOAT32, 2, s1, false), make(KILN_DTYPE_FLOAT32, 2, s2, true),
                          make(KILN_DTYPE_FLOAT32, 2, s1, false)};
    kiln_tensor *out = NULL;
    kiln_attrs at = axis_attrs(1);
    CHECK_OK(kiln_apply(KILN_OP_CONCAT, 3, in, &at, &out));
    int64_t n;
    double *want = ref_concat(in, 3, 1, &n);
    CHECK(matches(out, want, n));
    free(want);
    kiln_tensor_release(out);
    kiln_release_all(in, 3);
}

/* d/d(in) of sum(concat(a, permute(b), c) * w) against central differences (float64). */
static double weighted(kiln_tensor *const *leaves, const kiln_tensor *w, kiln_tensor **keep) {
    kiln_tensor *bt = NULL, *out = NULL;
    int64_t perm[2] = {1, 0};
    if (kiln_emit_permute(leaves[1], perm, &bt) != KILN_OK) exit(2);
    kiln_tensor *in[3] = {leaves[0], bt, leaves[2]};
    kiln_attrs at = axis_attrs(1);
    if (kiln_apply(KILN_OP_CONCAT, 3, in, &at, &out) != KILN_OK) {
        fprintf(stderr, "concat failed: %s\n", kiln_last_error());
        exit(2);
    }
    kiln_tensor_release(bt);
    double s = 0;
    for (int64_t i = 0; w && i < out->numel; i++) s += getd(out, i) * getd(w, i);
    if (keep)
        *keep = out;
    else
        kiln_tensor_release(out);
    return s;
}

static void test_concat_grad(void) {
    int64_t sa[2] = {3, 2}, sb[2] = {4, 3}, sc[2] = {3, 1}, so[2] = {3, 7};
    kiln_tensor *leaves[3] = {make(KILN_DTYPE_FLOAT64, 2, sa, false), make(KILN_DTYPE_FLOAT64, 2, sb, false),
                              make(KILN_DTYPE_FLOAT64, 2, sc, false)};
    for (int k = 0; k < 3; k++) CHECK_OK(kiln_tensor_set_requires_grad(leaves[k], true));
    kiln_tensor *w = make(KILN_DTYPE_FLOAT64, 2, so, false), *out = NULL, *grads[3] = {0};
    weighted(leaves, NULL, &out);
    CHECK_OK(kiln_autograd_grad(1, &out, &w, 3, leaves, false, grads));
    kiln_tensor_release(out);
    bool prev = kiln_set_grad_enabled(false);
    int bad = 0;
    for (int k = 0; k < 3; k++) {
        CHECK(grads[k] && grads[k]->meta.ndim == 2 && grads[k]->meta.shape[0] == leaves[k]->meta.shape[0] &&
              grads[k]->meta.shape[1] == leaves[k]->meta.shape[1]);
        for (int64_t e = 0; grads[k] && e < leaves[k]->numel; e++) {
            double *p = (double *)leaves[k]->data + e, keep = *p, h = 1e-6;
            *p = keep + h;
            double up = weighted(leaves, w, NULL);
            *p = keep - h;
            double down = weighted(leaves, w, NULL);
            *p = keep;
            double num = (up - down) / (2 * h), ana = getd(grads[k], e);
            if (!(fabs(num - ana) <= 1e-6 * (1 + fabs(num)))) {
                fprintf(stderr, "  input %d element %lld: analytic %g numeric %g\n", k, (long long)e, ana, num);
                bad++;
            }
        }
    }
    CHECK(bad == 0);
    kiln_set_grad_enabled(prev);
    kiln_release_all(grads, 3);
    kiln_release_all(leaves, 3);
    kiln_tensor_release(w);

    /* mixed dtypes: each gradient comes back in its input's dtype; only inputs that need one get one */
    int64_t s[1] = {2};
    kiln_tensor *a = make(KILN_DTYPE_FLOAT32, 1, s, false), *b = make(KILN_DTYPE_FLOAT64, 1, s, false);
    kiln_tensor *c = make(KILN_DTYPE_INT32, 1, s, false), *g[2] = {0};
    CHECK_OK(kiln_tensor_set_requires_grad(a, true));
    CHECK_OK(kiln_tensor_set_requires_grad(b, true));
    kiln_tensor *in[3] = {a, c, b};
    kiln_attrs at = axis_attrs(0);
    CHECK_OK(kiln_apply(KILN_OP_CONCAT, 3, in, &at, &out));
    kiln_tensor *want_grad = make(KILN_DTYPE_FLOAT64, 1, (int64_t[]){6}, false);
    kiln_tensor *targets[2] = {a, b};
    CHECK_OK(kiln_autograd_grad(1, &out, &want_grad, 2, targets, false, g));
    CHECK(g[0] && g[0]->meta.dtype == KILN_DTYPE_FLOAT32 && g[1] && g[1]->meta.dtype == KILN_DTYPE_FLOAT64);
    for (int i = 0; g[0] && g[1] && i < 2; i++) {
        CHECK(getd(g[0], i) == (float)getd(want_grad, i));
        CHECK(getd(g[1], i) == getd(want_grad, 4 + i));
    }
    kiln_release_all(g, 2);
    kiln_tensor_release(a), kiln_tensor_release(b), kiln_tensor_release(c);
    kiln_tensor_release(out), kiln_tensor_release(want_grad);
}

static void test_concat_errors(void) {
    int64_t s1[2] = {2, 3}, s2[2] = {2, 4}, s3[2] = {3, 3}, s4[3] = {2, 3, 1};
    kiln_tensor *a = make(KILN_DTYPE_FLOAT32, 2, s1, false), *b = make(KILN_DTYPE_FLOAT32, 2, s2, false);
    kiln_tensor *c = make(KILN_DTYPE_FLOAT32, 2, s3, false), *d = make(KILN_DTYPE_FLOAT32, 3, s4, false);
    kiln_tensor *out = NULL;
    kiln_attrs at0 = axis_attrs(0), at2 = axis_attrs(2);
    kiln_tensor *abc[3] = {a, b, c};
    CHECK_STATUS(kiln_apply(KILN_OP_CONCAT, 3, abc, &at0, &out), KILN_ERR_VALUE);
    const char *m = kiln_last_error();
    CHECK(strstr(m, "concat") && strstr(m, "(2, 3)") && strstr(m, "(2, 4)") && strstr(m, "(3, 3)") && strstr(m, "axis 0"));
    CHECK(out == NULL);
    kiln_tensor *ad[2] = {a, d};
    CHECK_STATUS(kiln_apply(KILN_OP_CONCAT, 2, ad, &at0, &out), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "(2, 3, 1)") != NULL);
    CHECK_STATUS(kiln_apply(KILN_OP_CONCAT, 1, &a, &at2, &out), KILN_ERR_INDEX);
    CHECK(strstr(kiln_last_error(), "concat") && strstr(kiln_last_error(), "axis 2"));
    CHECK_STATUS(kiln_apply(KILN_OP_CONCAT, 0, NULL, &at0, &out), KILN_ERR_VALUE);
    CHECK_STATUS(kiln_apply(KILN_OP_CONCAT, 2, abc, NULL, &out), KILN_ERR_VALUE);
    kiln_tensor *scalar = make(KILN_DTYPE_FLOAT32, 0, s1, false);
    CHECK_STATUS(kiln_apply(KILN_OP_CONCAT, 1, &scalar, &at0, &out), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "zero-dimensional") != NULL);
    kiln_tensor_release(a), kiln_tensor_release(b), kiln_tensor_release(c), kiln_tensor_release(d);
    kiln_tensor_release(scalar);
}

int main(void) {
    test_concat_reference();
    test_concat_promotion();
    test_concat_large();
    test_concat_grad();
    test_concat_errors();
    CHECK_DONE();
}
