/* Elementwise kernels against plain loops: broadcasting, strided inputs, dtype promotion, and
 * NaN / ±inf / ±0 through the max-like ops (PyTorch's rules). */
#include "check.h"
#include "core/internal.h"

static void test_add_broadcast(void) {
    int64_t sa[2] = {2, 3}, sb[1] = {3};
    float va[6] = {1, 2, 3, 4, 5, 6}, vb[3] = {10, 20, 30};
    kiln_tensor *a = tensor_f32(2, sa, va), *b = tensor_f32(1, sb, vb), *c = NULL;
    CHECK_OK(kiln_apply2(KILN_OP_ADD, a, b, NULL, &c));
    float want[6] = {11, 22, 33, 14, 25, 36};
    CHECK(c && c->meta.ndim == 2 && c->meta.shape[0] == 2 && c->meta.shape[1] == 3);
    CHECK(c && close_f32(c->data, want, 6, 0));
    kiln_tensor_release(a), kiln_tensor_release(b), kiln_tensor_release(c);
}

static void test_bad_broadcast(void) {
    int64_t sa[2] = {2, 3}, sb[1] = {4};
    kiln_tensor *a = tensor_f32(2, sa, NULL), *b = tensor_f32(1, sb, NULL), *c = NULL;
    CHECK_STATUS(kiln_apply2(KILN_OP_MUL, a, b, NULL, &c), KILN_ERR_VALUE);
    CHECK(c == NULL);
    CHECK(strstr(kiln_last_error(), "(2, 3)") && strstr(kiln_last_error(), "(4,)"));
    kiln_tensor_release(a), kiln_tensor_release(b);
}

static void test_large_parallel_exp(void) {
    int64_t n = 1 << 20;
    kiln_tensor *a = tensor_f32(1, &n, NULL), *c = NULL;
    float *pa = a->data;
    for (int64_t i = 0; i < n; i++) pa[i] = (float)(i % 100) / 50.0f - 1.0f;
    CHECK_OK(kiln_apply1(KILN_OP_EXP, a, NULL, &c));
    int bad = 0;
    for (int64_t i = 0; c && i < n; i++)
        if (fabsf(((float *)c->data)[i] - expf(pa[i])) > 1e-6f * expf(pa[i])) bad++;
    CHECK(bad == 0);
    kiln_tensor_release(a), kiln_tensor_release(c);
}

static void test_transposed_input_and_promotion(void) {
    int64_t sa[2] = {2, 3};
    float va[6] = {1, 2, 3, 4, 5, 6};
    kiln_tensor *a = tensor_f32(2, sa, va), *at = NULL, *i = NULL, *c = NULL;
    int64_t perm[2] = {1, 0};
    CHECK_OK(kiln_emit_permute(a, perm, &at));
    int64_t si[2] = {3, 2};
    CHECK_OK(kiln_tensor_empty(KILN_DTYPE_INT32, 2, si, &i));
    for (int k = 0; k < 6; k++) ((int32_t *)i->data)[k] = k;
    CHECK_OK(kiln_apply2(KILN_OP_SUB, at, i, NULL, &c));
    /* at = [[1,4],[2,5],[3,6]] minus [[0,1],[2,3],[4,5]] */
    float want[6] = {1, 3, 0, 2, -1, 1};
    CHECK(c && c->meta.dtype == KILN_DTYPE_FLOAT32 && close_f32(c->data, want, 6, 0));
    kiln_tensor_release(a), kiln_tensor_release(at), kiln_tensor_release(i), kiln_tensor_release(c);
}

/* ---- NaN, ±inf and ±0 through the max-like ops -------------------------------------------
 * Plain references with PyTorch's rules: NaN propagates (relu, clamp, maximum, minimum; relu's
 * gradient passes at NaN, as its threshold_backward does), relu(-0.0) = -0.0 (clamp_min),
 * abs(-0.0) = 0.0, clamp with min > max gives max. Unary results are compared bit for bit. */

static const double specials[] = {NAN, INFINITY, -INFINITY, 0.0, -0.0, 1.5, -2.0, 0.5, -0.25, 3.0, 1e30, -1e30};
#define NSPECIAL ((int64_t)(sizeof specials / sizeof specials[0]))

static double ref_relu(double x) { return isnan(x) ? x : x < 0 ? 0.0 : x; }
static double ref_abs(double x) { return isnan(x) ? x : fabs(x); }
static double ref_clamp(double x, double lo, double hi) {
    if (isnan(x)) return x;
    double t = x < lo ? lo : x; /* std::min(std::max(x, lo), hi) */
    return hi < t ? hi : t;
}
static double ref_maximum(double a, double b) { return isnan(a) || isnan(b) ? NAN : a > b ? a : b; }
static double ref_minimum(double a, double b) { return isnan(a) || isnan(b) ? NAN : a < b ? a : b; }
static double ref_relu_backward(double g, double x) { return isnan(x) || x > 0 ? g : 0.0; }

static bool same_value(double got, double want, bool sign_of_zero) {
    if (isnan(want)) return isnan(got);
    if (got != want) return false;
    return !sign_of_zero || want != 0 || signbit(got) == signbit(want);
}

/* x: the specials repeated to n elements, as dtype; transposed: a (4, n/4) view of a (n/4, 4)
 * tensor, so the kernels take their strided loops. */
static kiln_tensor *specials_tensor(kiln_dtype dt, int64_t n, int rotate, bool transposed) {
    kiln_tensor *f = NULL, *t = NULL, *v = NULL;
    int64_t shape[2] = {transposed ? n / 4 : 4, transposed ? 4 : n / 4};
    CHECK_OK(kiln_tensor_empty(KILN_DTYPE_FLOAT64, 2, shape, &f));
    for (int64_t i = 0; i < n; i++) ((double *)f->data)[i] = specials[(i + rotate) % NSPECIAL];
    CHECK_OK(kiln_tensor_empty(dt, 2, shape, &t));
    CHECK_OK(kiln_copy_into(t, f));
    kiln_tensor_release(f);
    if (!transposed) return t;
    int64_t perm[2] = {1, 0};
    CHECK_OK(kiln_emit_permute(t, perm, &v));
    kiln_tensor_release(t);
    return v;
}

static int special_failures;

static void check_special(const char *what, kiln_dtype dt, const kiln_tensor *y, const kiln_tensor *a,
                          const kiln_tensor *b, double (*want)(double, double, const double *), const double *attr,
                          bool sign_of_zero) {
    for (int64_t i = 0; y && i < y->numel; i++) {
        double x = kiln_tensor_get_double(a, i), z = b ? kiln_tensor_get_double(b, b->numel == 1 ? 0 : i) : 0;
        double w = want(x, z, attr), g = kiln_tensor_get_double(y, i);
        if (dt == KILN_DTYPE_FLOAT32) w = (double)(float)w;
        if (!same_value(g, w, sign_of_zero)) {
            if (special_failures++ < 20)
                fprintf(stderr, "  %s on %s: f(%g, %g) = %g, want %g\n", what, kiln_dtype_name(dt), x, z, g, w);
            check_failures++;
            return;
        }
    }
}

static double w_relu(double x, double z, const double *at) { return (void)z, (void)at, ref_relu(x); }
static double w_abs(double x, double z, const double *at) { return (void)z, (void)at, ref_abs(x); }
static double w_clamp(double x, double z, const double *at) { return (void)z, ref_clamp(x, at[0], at[1]); }
static double w_maximum(double x, double z, const double *at) { return (void)at, ref_maximum(x, z); }
static double w_minimum(double x, double z, const double *at) { return (void)at, ref_minimum(x, z); }
static double w_relu_backward(double x, double z, const double *at) { return (void)at, ref_relu_backward(x, z); }

static void test_special_values(void) {
    kiln_dtype dts[2] = {KILN_DTYPE_FLOAT32, KILN_DTYPE_FLOAT64};
    int64_t sizes[2] = {4 * NSPECIAL, 4 * NSPECIAL * 1024}; /* small, and large enough for threads */
    double bounds[3][2] = {{-1, 1.5}, {0, INFINITY}, {2, 1}};
    for (int t = 0; t < 2; t++)
        for (int k = 0; k < 2; k++)
            for (int tr = 0; tr < 2; tr++) {
                kiln_dtype dt = dts[t];
                int64_t n = sizes[k];
                kiln_tensor *a = specials_tensor(dt, n, 0, tr), *y = NULL;
                CHECK_OK(kiln_apply1(KILN_OP_RELU, a, NULL, &y));
                check_special("relu", dt, y, a, NULL, w_relu, NULL, true);
                kiln_tensor_release(y), y = NULL;
                CHECK_OK(kiln_apply1(KILN_OP_ABS, a, NULL, &y));
                check_special("abs", dt, y, a, NULL, w_abs, NULL, true);
                kiln_tensor_release(y), y = NULL;
                for (int c = 0; c < 3; c++) {
                    kiln_attrs at;
                    kiln_attrs_clear(&at);
                    kiln_attrs_push_float(&at, bounds[c][0]);
                    kiln_attrs_push_float(&at, bounds[c][1]);
                    CHECK_OK(kiln_apply1(KILN_OP_CLAMP, a, &at, &y));
                    check_special("clamp", dt, y, a, NULL, w_clamp, bounds[c], true);
                    kiln_tensor_release(y), y = NULL;
                }
                /* every pair (rotations of the specials against each other), and a broadcast scalar */
                for (int r = 0; r < NSPECIAL; r++) {
                    kiln_tensor *b = specials_tensor(dt, n, r, !tr);
                    struct { kiln_op op; const char *name; double (*want)(double, double, const double *); } bins[3] = {
                        {KILN_OP_MAXIMUM, "maximum", w_maximum}, {KILN_OP_MINIMUM, "minimum", w_minimum},
                        {KILN_OP_RELU_BACKWARD, "relu_backward", w_relu_backward}};
                    for (int j = 0; j < 3; j++) {
                        CHECK_OK(kiln_apply2(bins[j].op, a, b, NULL, &y));
                        check_special(bins[j].name, dt, y, a, b, bins[j].want, NULL, false);
                        kiln_tensor_release(y), y = NULL;
                    }
                    kiln_tensor_release(b);
                    int64_t one = 1;
                    kiln_tensor *s = NULL;
                    CHECK_OK(kiln_tensor_empty(dt, 1, &one, &s));
                    if (dt == KILN_DTYPE_FLOAT32) *(float *)s->data = (float)specials[r];
                    else *(double *)s->data = specials[r];
                    for (int j = 0; j < 2; j++) {
                        CHECK_OK(kiln_apply2(bins[j].op, a, s, NULL, &y));
                        check_special(bins[j].name, dt, y, a, s, bins[j].want, NULL, false);
                        kiln_tensor_release(y), y = NULL;
                    }
                    kiln_tensor_release(s);
                }
                kiln_tensor_release(a);
            }
}

int main(void) {
    test_add_broadcast();
    test_bad_broadcast();
    test_large_parallel_exp();
    test_transposed_input_and_promotion();
    test_special_values();
    CHECK_DONE();
}
