/* matmul and linear against plain loops: NumPy 1-D and batch-broadcast semantics, dtypes,
 * transposed/strided/broadcast inputs, finite-difference gradients and error messages. */
#include <time.h>

#include "linalg_testutil.h"

/* Reference matmul with NumPy semantics over any layouts; fills the output meta. */
static double *ref_matmul(const kiln_tensor *a, const kiln_tensor *b, kiln_meta *om) {
    const kiln_meta *ma = &a->meta, *mb = &b->meta;
    int64_t M = ma->ndim == 1 ? 1 : ma->shape[ma->ndim - 2], K = ma->shape[ma->ndim - 1];
    int64_t N = mb->ndim == 1 ? 1 : mb->shape[mb->ndim - 1];
    int ba = ma->ndim > 2 ? ma->ndim - 2 : 0, bb = mb->ndim > 2 ? mb->ndim - 2 : 0, nb = ba > bb ? ba : bb;
    int64_t bshape[KILN_MAX_DIMS], count = 1;
    for (int d = 0; d < nb; d++) {
        int da = d - (nb - ba), db = d - (nb - bb);
        int64_t sa = da >= 0 ? ma->shape[da] : 1, sb = db >= 0 ? mb->shape[db] : 1;
        bshape[d] = sa > sb ? sa : sb;
        count *= bshape[d];
    }
    om->ndim = nb;
    for (int d = 0; d < nb; d++) om->shape[d] = bshape[d];
    if (ma->ndim >= 2) om->shape[om->ndim++] = M;
    if (mb->ndim >= 2) om->shape[om->ndim++] = N;
    double *out = calloc((size_t)(count * M * N + 1), sizeof(double));
    for (int64_t t = 0; t < count; t++) {
        int64_t ia = 0, ib = 0, mula = 1, mulb = 1, rem = t;
        int64_t bidx[KILN_MAX_DIMS];
        for (int d = nb - 1; d >= 0; d--) bidx[d] = rem % bshape[d], rem /= bshape[d];
        /* row-major element offsets of the batch part, broadcast dims at index 0 */
        for (int d = nb - 1; d >= 0; d--) {
            int da = d - (nb - ba), db = d - (nb - bb);
            if (da >= 0) ia += (ma->shape[da] == 1 ? 0 : bidx[d]) * mula, mula *= ma->shape[da];
            if (db >= 0) ib += (mb->shape[db] == 1 ? 0 : bidx[d]) * mulb, mulb *= mb->shape[db];
        }
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double s = 0;
                for (int64_t p = 0; p < K; p++)
                    s += kiln_tensor_get_double(a, ia * M * K + i * K + p) * kiln_tensor_get_double(b, ib * K * N + p * N + j);
                out[(t * M + i) * N + j] = s;
            }
    }
    return out;
}

static int same_shape(const kiln_tensor *t, const kiln_meta *m) {
    if (!t || t->meta.ndim != m->ndim) return 0;
    for (int d = 0; d < m->ndim; d++)
        if (t->meta.shape[d] != m->shape[d]) return 0;
    return 1;
}

static double tol_of(kiln_dtype dt) {
    switch (dt) {
    case KILN_DTYPE_FLOAT64: return 1e-12;
    case KILN_DTYPE_FLOAT32: return 2e-5;
    case KILN_DTYPE_FLOAT16: return 2e-3;
    case KILN_DTYPE_BFLOAT16: return 1.5e-2;
    default: return 0;
    }
}

static void check_matmul(kiln_tensor *a, kiln_tensor *b, const char *what) {
    kiln_meta om;
    double *want = ref_matmul(a, b, &om);
    kiln_tensor *c = NULL;
    CHECK_OK(kiln_apply2(KILN_OP_MATMUL, a, b, NULL, &c));
    kiln_dtype dt = kiln_dtype_promote(a->meta.dtype, b->meta.dtype);
    CHECK(same_shape(c, &om) && c->meta.dtype == dt);
    if (c && dt != KILN_DTYPE_FLOAT64 && kiln_dtype_is_float(dt)) { /* reference rounded like the inputs */
        double *v = tu_values(c);
        int64_t K = a->meta.shape[a->meta.ndim - 1];
        double tol = tol_of(dt) * (dt == KILN_DTYPE_FLOAT32 ? 1 + (double)K / 64 : 1);
        CHECK(tu_close(v, want, c->numel, tol, what));
        free(v);
    } else if (c) {
        CHECK(tu_check(c, want, tol_of(dt), what));
    }
    kiln_tensor_release(c);
    free(want);
}

typedef struct {
    int na, nb;
    int64_t a[4], b[4];
} mm_case;

static const mm_case cases[] = {
    {2, 2, {2, 3}, {3, 2}},
    {1, 1, {3}, {3}},
    {1, 2, {3}, {3, 4}},
    {2, 1, {2, 3}, {3}},
    {3, 1, {4, 5, 6}, {6}},
    {1, 3, {5}, {2, 5, 3}},
    {3, 2, {5, 64, 48}, {48, 40}},
    {4, 3, {2, 1, 5, 6}, {3, 6, 7}},
    {3, 3, {4, 70, 80}, {4, 80, 90}},
    {3, 3, {64, 20, 30}, {64, 30, 25}},
    {4, 2, {3, 4, 10, 12}, {12, 9}},
    {2, 3, {33, 40}, {3, 40, 20}},
    {2, 2, {130, 200}, {200, 150}},
    {2, 2, {1, 7}, {7, 1}},
    {2, 2, {0, 7}, {7, 3}},
    {2, 2, {4, 0}, {0, 3}},
};

static void test_matmul_values(void) {
    const kiln_dtype dts[] = {KILN_DTYPE_FLOAT32, KILN_DTYPE_FLOAT64, KILN_DTYPE_INT32, KILN_DTYPE_INT64,
                              KILN_DTYPE_FLOAT16, KILN_DTYPE_BFLOAT16};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (size_t k = 0; k < sizeof dts / sizeof dts[0]; k++) {
            const mm_case *mc = &cases[c];
            kiln_tensor *a = tu_tensor(dts[k], mc->na, mc->a), *b = tu_tensor(dts[k], mc->nb, mc->b);
            char what[96];
            snprintf(what, sizeof what, "matmul case %zu %s", c, kiln_dtype_name(dts[k]));
            check_matmul(a, b, what);
            if (dts[k] == KILN_DTYPE_FLOAT32 || dts[k] == KILN_DTYPE_FLOAT64) {
                for (int how = 0; how < 3; how++) { /* strided and transposed layouts */
                    kiln_tensor *an = tu_noncontig(a, how), *bn = tu_noncontig(b, 2 - how);
                    check_matmul(an, b, what);
                    check_matmul(a, bn, what);
                    check_matmul(an, bn, what);
                    kiln_tensor_release(an), kiln_tensor_release(bn);
                }
            }
            kiln_tensor_release(a), kiln_tensor_release(b);
        }
}

static void test_matmul_mixed_and_broadcast_views(void) {
    int64_t sa[3] = {3, 20, 30}, sb[2] = {30, 25}, sbe[3] = {3, 30, 25};
    kiln_tensor *a = tu_tensor(KILN_DTYPE_FLOAT32, 3, sa), *b = tu_tensor(KILN_DTYPE_FLOAT64, 2, sb), *be = NULL;
    check_matmul(a, b, "float32 @ float64");
    kiln_tensor *bi = tu_tensor(KILN_DTYPE_INT32, 2, sb);
    check_matmul(a, bi, "float32 @ int32");
    CHECK_OK(kiln_emit_expand(bi, 3, sbe, &be)); /* batch stride 0 */
    check_matmul(a, be, "float32 @ expanded int32");
    kiln_tensor *bf = tu_tensor(KILN_DTYPE_FLOAT32, 2, sb), *bfe = NULL, *at = NULL;
    CHECK_OK(kiln_emit_expand(bf, 3, sbe, &bfe));
    check_matmul(a, bfe, "float32 @ expanded float32");
    CHECK_OK(kiln_emit_transpose_last(bfe, &at)); /* (3, 25, 30), a transposed broadcast view */
    check_matmul(at, bfe, "transposed expanded @ expanded");
    kiln_tensor_release(a), kiln_tensor_release(b), kiln_tensor_release(bi), kiln_tensor_release(be);
    kiln_tensor_release(bf), kiln_tensor_release(bfe), kiln_tensor_release(at);
}

static void test_matmul_small_exact(void) {
    int64_t sa[2] = {2, 3}, sb[2] = {3, 2};
    float va[6] = {1, 2, 3, 4, 5, 6}, vb[6] = {7, 8, 9, 10, 11, 12};
    kiln_tensor *a = tensor_f32(2, sa, va), *b = tensor_f32(2, sb, vb), *c = NULL;
    CHECK_OK(kiln_apply2(KILN_OP_MATMUL, a, b, NULL, &c));
    float want[4] = {58, 64, 139, 154};
    CHECK(c && close_f32(c->data, want, 4, 0));
    kiln_tensor_release(c);
    struct timespec t0, t1;
    int reps = 20000;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < reps; i++) {
        kiln_apply2(KILN_OP_MATMUL, a, b, NULL, &c);
        kiln_tensor_release(c);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("2x3 @ 3x2 through kiln_apply: %.0f ns per call\n",
           ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / reps);
    kiln_tensor_release(a), kiln_tensor_release(b);
}

static void test_int_wraps_and_bool(void) {
    int64_t s1[2] = {1, 2}, s2[2] = {2, 1};
    kiln_tensor *a = NULL, *b = NULL, *c = NULL;
    CHECK_OK(kiln_tensor_empty(KILN_DTYPE_INT8, 2, s1, &a));
    CHECK_OK(kiln_tensor_empty(KILN_DTYPE_INT8, 2, s2, &b));
    int8_t *pa = a->data, *pb = b->data;
    pa[0] = 100, pa[1] = 100, pb[0] = 2, pb[1] = 1; /* 300 wraps to 44 in int8, like NumPy */
    CHECK_OK(kiln_apply2(KILN_OP_MATMUL, a, b, NULL, &c));
    CHECK(c && c->meta.dtype == KILN_DTYPE_INT8 && ((int8_t *)c->data)[0] == 44);
    kiln_tensor_release(a), kiln_tensor_release(b), kiln_tensor_release(c);
    CHECK_OK(kiln_tensor_zeros(KILN_DTYPE_BOOL, 2, s1, &a));
    CHECK_OK(kiln_tensor_zeros(KILN_DTYPE_BOOL, 2, s2, &b));
    ((uint8_t *)a->data)[1] = 1, ((uint8_t *)b->data)[1] = 1;
    CHECK_OK(kiln_apply2(KILN_OP_MATMUL, a, b, NULL, &c));
    CHECK(c && c->meta.dtype == KILN_DTYPE_BOOL && ((uint8_t *)c->data)[0] == 1);
    kiln_tensor_release(a), kiln_tensor_release(b), kiln_tensor_release(c);
}

/* ---- linear ---- */

static double *ref_linear(const kiln_tensor *x, const kiln_tensor *w, const kiln_tensor *b) {
    int64_t OUT = w->meta.shape[0], IN = w->meta.shape[1], R = x->numel / IN;
    double *out = calloc((size_t)(R * OUT + 1), sizeof(double));
    for (int64_t r = 0; r < R; r++)
        for (int64_t o = 0; o < OUT; o++) {
            double s = b ? kiln_tensor_get_double(b, o) : 0;
            for (int64_t i = 0; i < IN; i++) s += kiln_tensor_get_double(x, r * IN + i) * kiln_tensor_get_double(w, o * IN + i);
            out[r * OUT + o] = s;
        }
    return out;
}

static void check_linear(kiln_tensor *x, kiln_tensor *w, kiln_tensor *b, const char *what) {
    kiln_tensor *ins[3] = {x, w, b}, *y = NULL;
    double *want = ref_linear(x, w, b);
    CHECK_OK(kiln_apply(KILN_OP_LINEAR, b ? 3 : 2, ins, NULL, &y));
    kiln_meta om = x->meta;
    om.shape[om.ndim - 1] = w->meta.shape[0];
    CHECK(same_shape(y, &om));
    kiln_dtype dt = y ? y->meta.dtype : KILN_DTYPE_FLOAT32;
    CHECK(tu_check(y, want, tol_of(dt) * (dt == KILN_DTYPE_FLOAT32 ? 4 : 1), what));
    kiln_tensor_release(y);
    free(want);
}

static void test_linear_values(void) {
    const kiln_dtype dts[] = {KILN_DTYPE_FLOAT32, KILN_DTYPE_FLOAT64, KILN_DTYPE_INT32, KILN_DTYPE_FLOAT16};
    int64_t xs[3][3] = {{2, 3, 40}, {7, 40, 0}, {40, 0, 0}}, nds[3] = {3, 2, 1};
    int64_t ws[2] = {50, 40}, bs[1] = {50};
    for (size_t k = 0; k < sizeof dts / sizeof dts[0]; k++)
        for (int c = 0; c < 3; c++) {
            kiln_tensor *x = tu_tensor(dts[k], (int)nds[c], xs[c]), *w = tu_tensor(dts[k], 2, ws),
                        *b = tu_tensor(dts[k], 1, bs);
            check_linear(x, w, b, "linear");
            check_linear(x, w, NULL, "linear without bias");
            if (dts[k] == KILN_DTYPE_FLOAT32 || dts[k] == KILN_DTYPE_FLOAT64)
                for (int how = 0; how < 3; how++) {
                    kiln_tensor *xn = tu_noncontig(x, how), *wn = tu_noncontig(w, how);
                    check_linear(xn, w, b, "linear, strided x");
                    check_linear(x, wn, b, "linear, strided w");
                    check_linear(xn, wn, NULL, "linear, strided x and w");
                    kiln_tensor_release(xn), kiln_tensor_release(wn);
                }
            kiln_tensor_release(x), kiln_tensor_release(w), kiln_tensor_release(b);
        }
    /* a sliced x whose leading dims do not stack: (4, 3, 40) viewed every other row */
    int64_t big[3] = {4, 6, 40};
    kiln_tensor *xb = tu_tensor(KILN_DTYPE_FLOAT32, 3, big), *xv = NULL, *w = tu_tensor(KILN_DTYPE_FLOAT32, 2, ws);
    int64_t shape[3] = {4, 3, 40}, strides[3] = {240, 80, 1};
    CHECK_OK(kiln_tensor_view(xb, 3, shape, strides, 0, &xv));
    check_linear(xv, w, NULL, "linear, sliced rows");
    kiln_tensor_release(xb), kiln_tensor_release(xv), kiln_tensor_release(w);
}

/* ---- gradients ---- */

static void test_grads(void) {
    static const mm_case gc[] = {
        {2, 2, {3, 4}, {4, 5}},
        {1, 2, {4}, {4, 5}},
        {2, 1, {3, 4}, {4}},
        {1, 1, {4}, {4}},
        {3, 2, {2, 3, 4}, {4, 5}},
        {2, 3, {3, 4}, {2, 4, 5}},
        {4, 3, {2, 1, 3, 4}, {3, 4, 2}},
        {3, 1, {2, 3, 4}, {4}},
        {1, 3, {4}, {2, 4, 3}},
    };
    for (size_t c = 0; c < sizeof gc / sizeof gc[0]; c++) {
        kiln_tensor *ins[2] = {tu_tensor(KILN_DTYPE_FLOAT64, gc[c].na, gc[c].a), tu_tensor(KILN_DTYPE_FLOAT64, gc[c].nb, gc[c].b)};
        char what[64];
        snprintf(what, sizeof what, "matmul grad case %zu", c);
        CHECK(tu_gradcheck(KILN_OP_MATMUL, 2, ins, NULL, 3, what));
        kiln_release_all(ins, 2);
    }
    int64_t xs[3] = {2, 3, 4}, ws[2] = {5, 4}, bs[1] = {5};
    for (int nd = 1; nd <= 3; nd++) {
        kiln_tensor *ins[3] = {tu_tensor(KILN_DTYPE_FLOAT64, nd, xs + 3 - nd), tu_tensor(KILN_DTYPE_FLOAT64, 2, ws),
                               tu_tensor(KILN_DTYPE_FLOAT64, 1, bs)};
        CHECK(tu_gradcheck(KILN_OP_LINEAR, 3, ins, NULL, 7, "linear grad"));
        CHECK(tu_gradcheck(KILN_OP_LINEAR, 2, ins, NULL, 3, "linear grad without bias"));
        kiln_release_all(ins, 3);
    }
}

/* ---- errors ---- */

static void test_errors(void) {
    int64_t s23[2] = {2, 3}, s45[2] = {4, 5}, s234[3] = {2, 3, 4}, s345[3] = {3, 4, 5};
    kiln_tensor *a = tu_tensor(KILN_DTYPE_FLOAT32, 2, s23), *b = tu_tensor(KILN_DTYPE_FLOAT32, 2, s45), *c = NULL;
    CHECK_STATUS(kiln_apply2(KILN_OP_MATMUL, a, b, NULL, &c), KILN_ERR_VALUE);
    CHECK(c == NULL);
    CHECK(strstr(kiln_last_error(), "matmul") && strstr(kiln_last_error(), "(2, 3) and (4, 5)"));
    kiln_tensor *s = tu_tensor(KILN_DTYPE_FLOAT32, 0, NULL);
    CHECK_STATUS(kiln_apply2(KILN_OP_MATMUL, s, a, NULL, &c), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "matmul"));
    kiln_tensor *x3 = tu_tensor(KILN_DTYPE_FLOAT32, 3, s234), *y3 = tu_tensor(KILN_DTYPE_FLOAT32, 3, s345);
    CHECK_STATUS(kiln_apply2(KILN_OP_MATMUL, x3, y3, NULL, &c), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "(2, 3, 4) and (3, 4, 5)") && strstr(kiln_last_error(), "broadcast"));
    /* linear: x (2, 3) with w (4, 5) */
    CHECK_STATUS(kiln_apply2(KILN_OP_LINEAR, a, b, NULL, &c), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "linear") && strstr(kiln_last_error(), "(2, 3)") && strstr(kiln_last_error(), "(4, 5)"));
    int64_t s53[2] = {5, 3}, s4[1] = {4};
    kiln_tensor *w = tu_tensor(KILN_DTYPE_FLOAT32, 2, s53), *bias = tu_tensor(KILN_DTYPE_FLOAT32, 1, s4);
    kiln_tensor *ins[3] = {a, w, bias};
    CHECK_STATUS(kiln_apply(KILN_OP_LINEAR, 3, ins, NULL, &c), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "bias") && strstr(kiln_last_error(), "(4,)"));
    CHECK_STATUS(kiln_apply(KILN_OP_LINEAR, 1, ins, NULL, &c), KILN_ERR_TYPE);
    kiln_tensor_release(a), kiln_tensor_release(b), kiln_tensor_release(s), kiln_tensor_release(x3);
    kiln_tensor_release(y3), kiln_tensor_release(w), kiln_tensor_release(bias);
}

int main(void) {
    test_matmul_small_exact();
    test_matmul_values();
    test_matmul_mixed_and_broadcast_views();
    test_int_wraps_and_bool();
    test_linear_values();
    test_grads();
    test_errors();
    CHECK_DONE();
}
