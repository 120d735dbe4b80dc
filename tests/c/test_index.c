/* Indexing ops (gather, index_add, index_put, gather_elements, scatter_add_elements,
 * class_labels) against
 * plain reference loops: dtypes, negative and duplicate indices, 0-d and 2-d index tensors,
 * strided inputs, finite-difference gradients and error cases. */
#include "check.h"
#include "core/internal.h"

/* ---- helpers ---------------------------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng_next(void) {
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return rng_state;
}
static double rng_uniform(void) { return (double)(rng_next() >> 11) / 9007199254740992.0; }
static int64_t rng_int(int64_t lo, int64_t hi) { return lo + (int64_t)(rng_next() % (uint64_t)(hi - lo)); }

static kiln_attrs axis_attrs(int64_t axis) {
    kiln_attrs a;
    kiln_attrs_clear(&a);
    kiln_attrs_push_int(&a, axis);
    return a;
}

static void fill_random(kiln_tensor *t, int64_t lo, int64_t hi) {
    for (int64_t i = 0; i < t->numel; i++) {
        char *p = (char *)t->data + (size_t)i * kiln_dtype_size(t->meta.dtype);
        switch (t->meta.dtype) {
        case KILN_DTYPE_BOOL: *(uint8_t *)p = (uint8_t)(rng_next() & 1); break;
        case KILN_DTYPE_INT32: *(int32_t *)p = (int32_t)rng_int(lo, hi); break;
        case KILN_DTYPE_INT64: *(int64_t *)p = rng_int(lo, hi); break;
        case KILN_DTYPE_FLOAT16: *(uint16_t *)p = kiln_f32_to_f16((float)(rng_uniform() * 2 - 1)); break;
        case KILN_DTYPE_FLOAT32: *(float *)p = (float)(rng_uniform() * 2 - 1); break;
        case KILN_DTYPE_FLOAT64: *(double *)p = rng_uniform() * 2 - 1; break;
        default: break;
        }
    }
}

/* A tensor of the given logical shape with random values in [lo, hi) for ints; when `strided`,
 * a non-contiguous view (last two axes transposed, or every other element of a 1-d buffer). */
static kiln_tensor *make(kiln_dtype dtype, int ndim, const int64_t *shape, bool strided, int64_t lo, int64_t hi) {
    kiln_tensor *t = NULL;
    if (!strided || ndim == 0) {
        if (kiln_tensor_empty(dtype, ndim, shape, &t) != KILN_OK) exit(2);
        fill_random(t, lo, hi);
        return t;
    }
    int64_t alloc[KILN_MAX_DIMS];
    memcpy(alloc, shape, sizeof(int64_t) * (size_t)ndim);
    kiln_tensor *base = NULL, *view = NULL;
    kiln_status s;
    if (ndim == 1) {
        alloc[0] = 2 * shape[0];
        if (kiln_tensor_empty(dtype, 1, alloc, &base) != KILN_OK) exit(2);
        fill_random(base, lo, hi);
        kiln_attrs sa;
        kiln_attrs_clear(&sa);
        for (int d = 0; d < 24; d++) sa.i[d] = 0;
        sa.i[8] = 2, sa.i[16] = shape[0], sa.ni = 24;
        s = kiln_apply1(KILN_OP_SLICE, base, &sa, &view);
    } else {
        int64_t perm[KILN_MAX_DIMS];
        for (int d = 0; d < ndim; d++) perm[d] = d;
        perm[ndim - 2] = ndim - 1, perm[ndim - 1] = ndim - 2;
        alloc[ndim - 2] = shape[ndim - 1], alloc[ndim - 1] = shape[ndim - 2];
        if (kiln_tensor_empty(dtype, ndim, alloc, &base) != KILN_OK) exit(2);
        fill_random(base, lo, hi);
        s = kiln_emit_permute(base, perm, &view);
    }
    if (s != KILN_OK) {
        fprintf(stderr, "make: %s\n", kiln_last_error());
        exit(2);
    }
    kiln_tensor_release(base);
    return view;
}

static double getd(const kiln_tensor *t, int64_t i) { return kiln_tensor_get_double(t, i); }

static int64_t norm_index(const kiln_tensor *idx, int64_t k, int64_t n) {
    int64_t v = (int64_t)getd(idx, k);
    return v < 0 ? v + n : v;
}

static bool has_shape(const kiln_tensor *t, int ndim, const int64_t *shape) {
    if (!t || t->meta.ndim != ndim) return false;
    for (int d = 0; d < ndim; d++)
        if (t->meta.shape[d] != shape[d]) return false;
    return true;
}

/* Every element of t equals want (within tol relative). */
static bool matches(const kiln_tensor *t, const double *want, int64_t n, double tol) {
    if (!t || t->numel != n) return false;
    for (int64_t i = 0; i < n; i++) {
        double g = getd(t, i);
        if (!(fabs(g - want[i]) <= tol * (1 + fabs(want[i])))) {
            fprintf(stderr, "  element %lld: got %.17g, want %.17g\n", (long long)i, g, want[i]);
            return false;
        }
    }
    return true;
}

typedef struct {
    int64_t outer, n, inner;
} geom;

static geom geom_of(const kiln_tensor *x, int axis) {
    geom g = {1, x->meta.shape[axis], 1};
    for (int d = 0; d < axis; d++) g.outer *= x->meta.shape[d];
    for (int d = axis + 1; d < x->meta.ndim; d++) g.inner *= x->meta.shape[d];
    return g;
}

static int selection_shape(const kiln_tensor *x, const kiln_tensor *idx, int axis, int64_t *shape) {
    int nd = 0;
    for (int d = 0; d < axis; d++) shape[nd++] = x->meta.shape[d];
    for (int d = 0; d < idx->meta.ndim; d++) shape[nd++] = idx->meta.shape[d];
    for (int d = axis + 1; d < x->meta.ndim; d++) shape[nd++] = x->meta.shape[d];
    return nd;
}

/* Value of t broadcast to (ndim, shape) at row-major position i. */
static double get_broadcast(const kiln_tensor *t, int ndim, const int64_t *shape, int64_t i) {
    int64_t ti = 0, tmul = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        int64_t c = i % shape[d];
        i /= shape[d];
        int td = d - (ndim - t->meta.ndim);
        if (td < 0) continue;
        if (t->meta.shape[td] != 1) ti += c * tmul;
        tmul *= t->meta.shape[td];
    }
    return getd(t, ti);
}

/* ---- reference kernels ------------------------------------------------------------------ */

static double *ref_gather(const kiln_tensor *x, const kiln_tensor *idx, int axis) {
    geom g = geom_of(x, axis);
    int64_t K = idx->numel;
    double *r = malloc(sizeof(double) * (size_t)(g.outer * K * g.inner + 1));
    for (int64_t o = 0; o < g.outer; o++)
        for (int64_t k = 0; k < K; k++)
            for (int64_t i = 0; i < g.inner; i++)
                r[(o * K + k) * g.inner + i] = getd(x, (o * g.n + norm_index(idx, k, g.n)) * g.inner + i);
    return r;
}

/* index_add (put = false) or index_put (put = true) */
static double *ref_index_write(const kiln_tensor *x, const kiln_tensor *idx, const kiln_tensor *v, int axis, bool put) {
    geom g = geom_of(x, axis);
    int64_t K = idx->numel, sel[KILN_MAX_DIMS];
    int snd = selection_shape(x, idx, axis, sel);
    double *r = malloc(sizeof(double) * (size_t)(x->numel + 1));
    for (int64_t i = 0; i < x->numel; i++) r[i] = getd(x, i);
    for (int64_t o = 0; o < g.outer; o++)
        for (int64_t k = 0; k < K; k++)
            for (int64_t i = 0; i < g.inner; i++) {
                int64_t at = (o * g.n + norm_index(idx, k, g.n)) * g.inner + i;
                double val = get_broadcast(v, snd, sel, (o * K + k) * g.inner + i);
                r[at] = put ? val : r[at] + val;
            }
    return r;
}

/* Row-major offset in x of idx position p with its axis coordinate replaced by the index. */
static int64_t elements_target(const kiln_tensor *x, const kiln_tensor *idx, int axis, int64_t p) {
    int64_t c[KILN_MAX_DIMS], rest = p;
    for (int d = idx->meta.ndim - 1; d >= 0; d--) {
        c[d] = rest % idx->meta.shape[d];
        rest /= idx->meta.shape[d];
    }
    c[axis] = norm_index(idx, p, x->meta.shape[axis]);
    int64_t off = 0;
    for (int d = 0; d < x->meta.ndim; d++) off = off * x->meta.shape[d] + c[d];
    return off;
}

static double *ref_gather_elements(const kiln_tensor *x, const kiln_tensor *idx, int axis) {
    double *r = malloc(sizeof(double) * (size_t)(idx->numel + 1));
    for (int64_t p = 0; p < idx->numel; p++) r[p] = getd(x, elements_target(x, idx, axis, p));
    return r;
}

static double *ref_scatter_add_elements(const kiln_tensor *x, const kiln_tensor *idx, const kiln_tensor *src, int axis) {
    double *r = malloc(sizeof(double) * (size_t)(x->numel + 1));
    for (int64_t i = 0; i < x->numel; i++) r[i] = getd(x, i);
    for (int64_t p = 0; p < idx->numel; p++) r[elements_target(x, idx, axis, p)] += getd(src, p);
    return r;
}

/* ---- forward tests ---------------------------------------------------------------------- */

typedef struct {
    int ndim;
    int64_t shape[4];
} shape_case;

static const shape_case x_shapes[] = {{1, {5}}, {2, {4, 6}}, {3, {3, 5, 4}}};
static const shape_case idx_shapes[] = {{0, {0}}, {1, {3}}, {2, {2, 3}}};

static void test_gather(void) {
    const kiln_dtype dtypes[] = {KILN_DTYPE_FLOAT32, KILN_DTYPE_FLOAT64, KILN_DTYPE_INT32, KILN_DTYPE_BOOL,
                                 KILN_DTYPE_FLOAT16};
    int cases = 0;
    for (size_t di = 0; di < sizeof dtypes / sizeof *dtypes; di++)
        for (size_t xs = 0; xs < 3; xs++)
            for (int axis = 0; axis < x_shapes[xs].ndim; axis++)
                for (size_t is = 0; is < 3; is++)
                    for (int flags = 0; flags < 8; flags++) {
                        const shape_case *X = &x_shapes[xs], *I = &idx_shapes[is];
                        kiln_dtype idt = flags & 4 ? KILN_DTYPE_INT64 : KILN_DTYPE_INT32;
                        int64_t n = X->shape[axis];
                        kiln_tensor *x = make(dtypes[di], X->ndim, X->shape, flags & 1, -50, 50);
                        kiln_tensor *idx = make(idt, I->ndim, I->shape, flags & 2, -n, n), *out = NULL;
                        kiln_attrs at = axis_attrs(axis);
                        CHECK_OK(kiln_apply2(KILN_OP_GATHER, x, idx, &at, &out));
                        int64_t sel[KILN_MAX_DIMS];
                        int snd = selection_shape(x, idx, axis, sel);
                        double *want = ref_gather(x, idx, axis);
                        CHECK(has_shape(out, snd, sel) && out->meta.dtype == x->meta.dtype);
                        CHECK(matches(out, want, kiln_shape_numel(snd, sel), 0));
                        free(want);
                        kiln_tensor_release(x), kiln_tensor_release(idx), kiln_tensor_release(out);
                        cases++;
                    }
    CHECK(cases > 500);
}

/* Embedding lookup: large table, many indices (parallel path). */
static void test_gather_large(void) {
    int64_t xs[2] = {1000, 64}, is[1] = {5000};
    kiln_tensor *x = make(KILN_DTYPE_FLOAT32, 2, xs, false, 0, 0);
    kiln_tensor *idx = make(KILN_DTYPE_INT64, 1, is, false, -1000, 1000), *out = NULL;
    kiln_attrs at = axis_attrs(0);
    CHECK_OK(kiln_apply2(KILN_OP_GATHER, x, idx, &at, &out));
    double *want = ref_gather(x, idx, 0);
    CHECK(matches(out, want, 5000 * 64, 0));
    free(want);
    kiln_tensor_release(out);
    /* along the last axis: one element per row */
    at = axis_attrs(1);
    int64_t is2[1] = {40};
    kiln_tensor *idx2 = make(KILN_DTYPE_INT32, 1, is2, true, 0, 64);
    CHECK_OK(kiln_apply2(KILN_OP_GATHER, x, idx2, &at, &out));
    want = ref_gather(x, idx2, 1);
    CHECK(matches(out, want, 1000 * 40, 0));
    free(want);
    kiln_tensor_release(x), kiln_tensor_release(idx), kiln_tensor_release(idx2), kiln_tensor_release(out);
}

static void test_index_add(void) {
    const kiln_dtype dtypes[] = {KILN_DTYPE_FLOAT32, KILN_DTYPE_FLOAT64, KILN_DTYPE_INT32, KILN_DTYPE_FLOAT16};
    for (size_t di = 0; di < sizeof dtypes / sizeof *dtypes; di++)
        for (size_t xs = 0; xs < 3; xs++)
            for (int axis = 0; axis < x_shapes[xs].ndim; axis++)
                for (size_t is = 0; is < 3; is++)
                    for (int flags = 0; flags < 8; flags++) {
                        const shape_case *X = &x_shapes[xs], *I = &idx_shapes[is];
                        int64_t n = X->shape[axis], sel[KILN_MAX_DIMS];
                        kiln_tensor *x = make(dtypes[di], X->ndim, X->shape, flags & 1, -50, 50);
                        /* few distinct values: duplicates */
                        kiln_tensor *idx = make(flags & 4 ? KILN_DTYPE_INT64 : KILN_DTYPE_INT32, I->ndim, I->shape,
                                                flags & 2, -2, 2 < n ? 2 : n);
                        int snd = selection_shape(x, idx, axis, sel);
                        kiln_tensor *src = make(dtypes[di], snd, sel, flags & 1, -50, 50), *out = NULL;
                        kiln_tensor *ins[3] = {x, idx, src};
                        kiln_attrs at = axis_attrs(axis);
                        CHECK_OK(kiln_apply(KILN_OP_INDEX_ADD, 3, ins, &at, &out));
                        double *want = ref_index_write(x, idx, src, axis, false);
                        double tol = dtypes[di] == KILN_DTYPE_FLOAT16 ? 2e-3 : dtypes[di] == KILN_DTYPE_FLOAT32 ? 1e-6 : 0;
                        CHECK(has_shape(out, X->ndim, X->shape) && out->meta.dtype == x->meta.dtype);
                        CHECK(matches(out, want, x->numel, tol));
                        free(want);
                        kiln_tensor_release(x), kiln_tensor_release(idx), kiln_tensor_release(src), kiln_tensor_release(out);
                    }
    /* a source that broadcasts to the selection, and a bool tensor (adds are logical or) */
    int64_t xs[2] = {4, 3}, is[1] = {5}, vs[1] = {3};
    kiln_tensor *x = make(KILN_DTYPE_FLOAT64, 2, xs, false, 0, 0), *idx = make(KILN_DTYPE_INT64, 1, is, false, 0, 4);
    kiln_tensor *v = make(KILN_DTYPE_FLOAT64, 1, vs, false, 0, 0), *out = NULL;
    kiln_tensor *ins[3] = {x, idx, v};
    kiln_attrs at = axis_attrs(0);
    CHECK_OK(kiln_apply(KILN_OP_INDEX_ADD, 3, ins, &at, &out));
    double *want = ref_index_write(x, idx, v, 0, false);
    CHECK(matches(out, want, 12, 1e-12));
    free(want);
    kiln_tensor_release(x), kiln_tensor_release(v), kiln_tensor_release(out);
    kiln_tensor *xb = make(KILN_DTYPE_BOOL, 2, xs, false, 0, 0), *vb = make(KILN_DTYPE_BOOL, 1, vs, false, 0, 0);
    ins[0] = xb, ins[2] = vb;
    CHECK_OK(kiln_apply(KILN_OP_INDEX_ADD, 3, ins, &at, &out));
    want = ref_index_write(xb, idx, vb, 0, false);
    for (int i = 0; i < 12; i++) want[i] = want[i] != 0;
    CHECK(out && out->meta.dtype == KILN_DTYPE_BOOL && matches(out, want, 12, 0));
    free(want);
    kiln_tensor_release(xb), kiln_tensor_release(vb), kiln_tensor_release(idx), kiln_tensor_release(out);
}

/* Many duplicate indices on the parallel path: exact against the serial reference (float64 sums
 * in index order) and bitwise identical across runs. */
static void test_index_add_large(void) {
    for (int axis = 0; axis < 2; axis++) {
        int64_t xs[2] = {300, 200}, is[1] = {2000}, sel[2];
        kiln_tensor *x = make(KILN_DTYPE_FLOAT64, 2, xs, false, 0, 0);
        kiln_tensor *idx = make(KILN_DTYPE_INT64, 1, is, false, 0, 50);
        int snd = selection_shape(x, idx, axis, sel);
        kiln_tensor *src = make(KILN_DTYPE_FLOAT64, snd, sel, false, 0, 0), *out = NULL, *again = NULL;
        kiln_tensor *ins[3] = {x, idx, src};
        kiln_attrs at = axis_attrs(axis);
        CHECK_OK(kiln_apply(KILN_OP_INDEX_ADD, 3, ins, &at, &out));
        CHECK_OK(kiln_apply(KILN_OP_INDEX_ADD, 3, ins, &at, &again));
        double *want = ref_index_write(x, idx, src, axis, false);
        CHECK(matches(out, want, x->numel, 0));
        CHECK(out && again && memcmp(out->data, again->data, (size_t)x->numel * 8) == 0);
        free(want);
        kiln_tensor_release(x), kiln_tensor_release(idx), kiln_tensor_release(src);
        kiln_tensor_release(out), kiln_tensor_release(again);
    }
}

static void test_index_put(void) {
    const kiln_dtype dtypes[] = {KILN_DTYPE_FLOAT32, KILN_DTYPE_FLOAT64, KILN_DTYPE_INT32, KILN_DTYPE_BOOL};
    for (size_t di = 0; di < sizeof dtypes / sizeof *dtypes; di++)
        for (size_t xs = 0; xs < 3; xs++)
            for (int axis = 0; axis < x_shapes[xs].ndim; axis++)
                for (size_t is = 0; is < 3; is++)
                    for (int flags = 0; flags < 16; flags++) {
                        const shape_case *X = &x_shapes[xs], *I = &idx_shapes[is];
                        int64_t n = X->shape[axis], sel[KILN_MAX_DIMS];
                        kiln_tensor *x = make(dtypes[di], X->ndim, X->shape, flags & 1, -50, 50);
                        kiln_tensor *idx = make(KILN_DTYPE_INT64, I->ndim, I->shape, flags & 2, -n, n);
                        int snd = selection_shape(x, idx, axis, sel);
                        kiln_tensor *v;
                        if (flags & 8) /* broadcast: a scalar or the trailing axis only */
                            v = make(dtypes[di], snd ? 1 : 0, snd ? sel + snd - 1 : sel, false, -50, 50);
                        else
                            v = make(dtypes[di], snd, sel, flags & 4, -50, 50);
                        double *want = ref_index_write(x, idx, v, axis, true);
                        int64_t version = kiln_tensor_version(x);
                        kiln_tensor *ins[3] = {x, idx, v}, *out = NULL;
                        kiln_attrs at = axis_attrs(axis);
                        CHECK_OK(kiln_apply(KILN_OP_INDEX_PUT, 3, ins, &at, &out));
                        CHECK(out == x);
                        CHECK(kiln_tensor_version(x) > version);
                        CHECK(matches(x, want, x->numel, 0));
                        free(want);
                        kiln_tensor_release(x), kiln_tensor_release(idx), kiln_tensor_release(v), kiln_tensor_release(out);
                    }
    /* duplicates: the last write wins; values that alias x are read before x changes */
    int64_t xs[1] = {4}, is[1] = {3};
    kiln_tensor *x = make(KILN_DTYPE_FLOAT64, 1, xs, false, 0, 0), *idx, *out = NULL;
    CHECK_OK(kiln_tensor_empty(KILN_DTYPE_INT64, 1, is, &idx));
    int64_t *ip = idx->data;
    ip[0] = 1, ip[1] = -3, ip[2] = 2;
    double *xp = x->data;
    xp[0] = 10, xp[1] = 11, xp[2] = 12, xp[3] = 13;
    kiln_attrs sa;
    kiln_attrs_clear(&sa);
    for (int d = 0; d < 24; d++) sa.i[d] = 0;
    sa.i[0] = 1, sa.i[8] = 1, sa.i[16] = 3, sa.ni = 24;
    kiln_tensor *tail = NULL;
    CHECK_OK(kiln_apply1(KILN_OP_SLICE, x, &sa, &tail)); /* x[1:4] = (11, 12, 13) */
    kiln_tensor *ins[3] = {x, idx, tail};
    kiln_attrs at = axis_attrs(0);
    CHECK_OK(kiln_apply(KILN_OP_INDEX_PUT, 3, ins, &at, &out));
    double want[4] = {10, 12, 13, 13};
    CHECK(matches(x, want, 4, 0));
    kiln_tensor_release(x), kiln_tensor_release(idx), kiln_tensor_release(tail), kiln_tensor_release(out);
}

static const shape_case el_x[] = {{1, {6}}, {2, {4, 5}}, {3, {3, 4, 5}}};

static void test_gather_scatter_elements(void) {
    const kiln_dtype dtypes[] = {KILN_DTYPE_FLOAT32, KILN_DTYPE_FLOAT64, KILN_DTYPE_INT32, KILN_DTYPE_FLOAT16};
    for (size_t di = 0; di < sizeof dtypes / sizeof *dtypes; di++)
        for (size_t xs = 0; xs < 3; xs++)
            for (int axis = 0; axis < el_x[xs].ndim; axis++)
                for (int flags = 0; flags < 16; flags++) {
                    const shape_case *X = &el_x[xs];
                    int64_t ishape[KILN_MAX_DIMS], n = X->shape[axis];
                    for (int d = 0; d < X->ndim; d++) /* smaller off the axis unless flag 8; any length on it */
                        ishape[d] = d == axis ? 7 : (flags & 8 ? X->shape[d] : X->shape[d] - 1);
                    kiln_tensor *x = make(dtypes[di], X->ndim, X->shape, flags & 1, -50, 50);
                    kiln_tensor *idx = make(flags & 4 ? KILN_DTYPE_INT64 : KILN_DTYPE_INT32, X->ndim, ishape,
                                            flags & 2, -n, n);
                    kiln_tensor *out = NULL, *ins[3] = {x, idx, NULL};
                    kiln_attrs at = axis_attrs(axis);
                    CHECK_OK(kiln_apply(KILN_OP_GATHER_ELEMENTS, 2, ins, &at, &out));
                    double *want = ref_gather_elements(x, idx, axis);
                    CHECK(has_shape(out, X->ndim, ishape) && out->meta.dtype == x->meta.dtype);
                    CHECK(matches(out, want, idx->numel, 0));
                    free(want);
                    kiln_tensor_release(out);
                    kiln_tensor *src = make(dtypes[di], X->ndim, ishape, flags & 1, -50, 50);
                    ins[2] = src;
                    CHECK_OK(kiln_apply(KILN_OP_SCATTER_ADD_ELEMENTS, 3, ins, &at, &out));
                    want = ref_scatter_add_elements(x, idx, src, axis);
                    double tol = dtypes[di] == KILN_DTYPE_FLOAT16 ? 2e-3 : dtypes[di] == KILN_DTYPE_FLOAT32 ? 1e-6 : 0;
                    CHECK(has_shape(out, X->ndim, X->shape) && out->meta.dtype == x->meta.dtype);
                    CHECK(matches(out, want, x->numel, tol));
                    free(want);
                    kiln_tensor_release(x), kiln_tensor_release(idx), kiln_tensor_release(src), kiln_tensor_release(out);
                }
    /* large, parallel, many collisions: exact in float64 and bitwise repeatable */
    for (int axis = 0; axis < 2; axis++) {
        int64_t xs[2] = {60, 70}, is[2] = {axis ? 60 : 500, axis ? 500 : 70};
        kiln_tensor *x = make(KILN_DTYPE_FLOAT64, 2, xs, false, 0, 0);
        kiln_tensor *idx = make(KILN_DTYPE_INT64, 2, is, false, 0, 60);
        kiln_tensor *src = make(KILN_DTYPE_FLOAT64, 2, is, false, 0, 0), *out = NULL, *again = NULL;
        kiln_tensor *ins[3] = {x, idx, src};
        kiln_attrs at = axis_attrs(axis);
        CHECK_OK(kiln_apply(KILN_OP_SCATTER_ADD_ELEMENTS, 3, ins, &at, &out));
        CHECK_OK(kiln_apply(KILN_OP_SCATTER_ADD_ELEMENTS, 3, ins, &at, &again));
        double *want = ref_scatter_add_elements(x, idx, src, axis);
        CHECK(matches(out, want, x->numel, 0));
        CHECK(out && again && memcmp(out->data, again->data, (size_t)x->numel * 8) == 0);
        free(want);
        kiln_tensor_release(out);
        CHECK_OK(kiln_apply(KILN_OP_GATHER_ELEMENTS, 2, ins, &at, &out));
        want = ref_gather_elements(x, idx, axis);
        CHECK(matches(out, want, idx->numel, 0));
        free(want);
        kiln_tensor_release(x), kiln_tensor_release(idx), kiln_tensor_release(src);
        kiln_tensor_release(out), kiln_tensor_release(again);
    }
}

/* ---- gradients by finite differences (float64) ------------------------------------------ */

typedef kiln_status (*forward_fn)(kiln_tensor *const *in, const void *ctx, kiln_tensor **out);

typedef struct {
    kiln_op op;
    int nin;
    int64_t axis;
} op_case;

static kiln_status run_op(kiln_tensor *const *in, const void *vctx, kiln_tensor **out) {
    const op_case *c = vctx;
    kiln_attrs at = axis_attrs(c->axis);
    return kiln_apply(c->op, c->nin, in, &at, out);
}

/* index_put on a copy of input 0, so that input 0 can be a leaf */
static kiln_status run_index_put(kiln_tensor *const *in, const void *vctx, kiln_tensor **out) {
    const op_case *c = vctx;
    kiln_tensor *copy, *ins[3];
    KILN_TRY(kiln_emit_unary(KILN_OP_CONTIGUOUS, in[0], &copy));
    ins[0] = copy, ins[1] = in[1], ins[2] = in[2];
    kiln_attrs at = axis_attrs(c->axis);
    kiln_status s = kiln_apply(KILN_OP_INDEX_PUT, 3, ins, &at, out);
    kiln_tensor_release(copy);
    return s;
}

static double weighted_sum(forward_fn f, kiln_tensor *const *in, const void *ctx, const kiln_tensor *w) {
    kiln_tensor *out = NULL;
    if (f(in, ctx, &out) != KILN_OK) {
        fprintf(stderr, "forward failed: %s\n", kiln_last_error());
        exit(2);
    }
    double s = 0;
    for (int64_t i = 0; i < out->numel; i++) s += getd(out, i) * getd(w, i);
    kiln_tensor_release(out);
    return s;
}

/* Gradients of sum(f(in) * w) w.r.t. the float64 inputs marked in `diff` vs central differences. */
static void check_grad(const char *what, forward_fn f, const void *ctx, int nin, kiln_tensor *const *in) {
    kiln_tensor *targets[4], *grads[4] = {0}, *out = NULL;
    int nt = 0;
    for (int j = 0; j < nin; j++)
        if (kiln_dtype_is_float(in[j]->meta.dtype)) {
            CHECK_OK(kiln_tensor_set_requires_grad(in[j], true));
            targets[nt++] = in[j];
        }
    CHECK_OK(f(in, ctx, &out));
    if (!out) return;
    kiln_tensor *w = make(KILN_DTYPE_FLOAT64, out->meta.ndim, out->meta.shape, false, 0, 0);
    CHECK_OK(kiln_autograd_grad(1, &out, &w, nt, targets, false, grads));
    kiln_tensor_release(out);
    bool prev = kiln_set_grad_enabled(false);
    const double h = 1e-6;
    int bad = 0;
    for (int j = 0; j < nt; j++) {
        kiln_tensor *t = targets[j];
        CHECK(grads[j] && has_shape(grads[j], t->meta.ndim, t->meta.shape));
        for (int64_t e = 0; e < t->numel && grads[j]; e++) {
            double *p = (double *)t->data + e, keep = *p;
            *p = keep + h;
            double up = weighted_sum(f, in, ctx, w);
            *p = keep - h;
            double down = weighted_sum(f, in, ctx, w);
            *p = keep;
            double num = (up - down) / (2 * h), ana = getd(grads[j], e);
            if (!(fabs(num - ana) <= 1e-6 * (1 + fabs(num)))) {
                if (bad++ < 5) fprintf(stderr, "  %s: input %d element %lld: analytic %.10g, numeric %.10g\n", what, j,
                                       (long long)e, ana, num);
            }
        }
    }
    CHECK(bad == 0);
    kiln_set_grad_enabled(prev);
    kiln_release_all(grads, nt);
    kiln_tensor_release(w);
    for (int j = 0; j < nt; j++) kiln_tensor_set_requires_grad(targets[j], false);
}

static void test_grads(void) {
    int64_t xs[3] = {3, 4, 5}, is2[2] = {2, 3}, sel[KILN_MAX_DIMS];
    for (int axis = 0; axis < 3; axis++) {
        int64_t n = xs[axis];
        kiln_tensor *x = make(KILN_DTYPE_FLOAT64, 3, xs, false, 0, 0);
        kiln_tensor *idx = make(KILN_DTYPE_INT64, 2, is2, false, -n, n); /* 6 draws: duplicates */
        op_case gather = {KILN_OP_GATHER, 2, axis};
        kiln_tensor *ins[3] = {x, idx, NULL};
        check_grad("gather", run_op, &gather, 2, ins);

        int snd = selection_shape(x, idx, axis, sel);
        kiln_tensor *src = make(KILN_DTYPE_FLOAT64, snd, sel, false, 0, 0);
        ins[2] = src;
        op_case index_add = {KILN_OP_INDEX_ADD, 3, axis};
        check_grad("index_add", run_op, &index_add, 3, ins);
        kiln_tensor_release(idx);

        /* index_put with distinct indices (a duplicate's overwritten value has no effect) */
        int64_t is1[1] = {2};
        CHECK_OK(kiln_tensor_empty(KILN_DTYPE_INT32, 1, is1, &idx));
        ((int32_t *)idx->data)[0] = -1, ((int32_t *)idx->data)[1] = 1;
        snd = selection_shape(x, idx, axis, sel);
        kiln_tensor *v = make(KILN_DTYPE_FLOAT64, snd, sel, false, 0, 0);
        kiln_tensor *put_in[3] = {x, idx, v};
        op_case index_put = {KILN_OP_INDEX_PUT, 3, axis};
        check_grad("index_put", run_index_put, &index_put, 3, put_in);
        kiln_tensor_release(v);
        v = make(KILN_DTYPE_FLOAT64, 1, &sel[snd - 1], false, 0, 0); /* broadcast along leading axes */
        put_in[2] = v;
        check_grad("index_put broadcast", run_index_put, &index_put, 3, put_in);
        kiln_tensor_release(v);

        int64_t ies[3] = {2, 3, 4};
        ies[axis] = 6;
        kiln_tensor *eidx = make(KILN_DTYPE_INT64, 3, ies, false, -n, n);
        kiln_tensor *esrc = make(KILN_DTYPE_FLOAT64, 3, ies, false, 0, 0);
        kiln_tensor *eins[3] = {x, eidx, esrc};
        op_case ge = {KILN_OP_GATHER_ELEMENTS, 2, axis}, sae = {KILN_OP_SCATTER_ADD_ELEMENTS, 3, axis};
        check_grad("gather_elements", run_op, &ge, 2, eins);
        check_grad("scatter_add_elements", run_op, &sae, 3, eins);
        kiln_tensor_release(eidx), kiln_tensor_release(esrc);
        kiln_tensor_release(x), kiln_tensor_release(idx), kiln_tensor_release(src);
    }
}

/* ---- errors ----------------------------------------------------------------------------- */

static bool message_has(const char *a, const char *b, const char *c) {
    const char *m = kiln_last_error();
    bool ok = strstr(m, a) && (!b || strstr(m, b)) && (!c || strstr(m, c));
    if (!ok) fprintf(stderr, "  unexpected message: %s\n", m);
    return ok;
}

static void test_errors(void) {
    int64_t xs[2] = {5, 3}, is[1] = {2};
    kiln_tensor *x = make(KILN_DTYPE_FLOAT32, 2, xs, false, 0, 0), *idx = NULL, *out = NULL;
    CHECK_OK(kiln_tensor_empty(KILN_DTYPE_INT64, 1, is, &idx));
    int64_t *ip = idx->data;
    kiln_attrs at = axis_attrs(0);
    kiln_tensor *ins[3] = {x, idx, NULL};

    ip[0] = 1, ip[1] = 7;
    CHECK_STATUS(kiln_apply(KILN_OP_GATHER, 2, ins, &at, &out), KILN_ERR_INDEX);
    CHECK(out == NULL && message_has("gather", "index 7", "size 5"));
    ip[1] = -6;
    CHECK_STATUS(kiln_apply(KILN_OP_GATHER, 2, ins, &at, &out), KILN_ERR_INDEX);
    CHECK(message_has("gather", "-6", "size 5"));
    ip[1] = -5; /* the first row: fine */
    CHECK_OK(kiln_apply(KILN_OP_GATHER, 2, ins, &at, &out));
    kiln_tensor_release(out);
    out = NULL;

    /* index_put with a bad index leaves x untouched */
    ip[0] = 0, ip[1] = 5;
    double before = getd(x, 0);
    int64_t vs[1] = {3};
    kiln_tensor *v = make(KILN_DTYPE_FLOAT32, 1, vs, false, 0, 0);
    ins[2] = v;
    CHECK_STATUS(kiln_apply(KILN_OP_INDEX_PUT, 3, ins, &at, &out), KILN_ERR_INDEX);
    CHECK(message_has("index_put", "index 5", "size 5") && getd(x, 0) == before);
    CHECK_STATUS(kiln_apply(KILN_OP_INDEX_ADD, 3, ins, &at, &out), KILN_ERR_INDEX);
    CHECK(message_has("index_add", "index 5", NULL));
    ip[1] = 0;

    /* float indices */
    kiln_tensor *fidx = make(KILN_DTYPE_FLOAT32, 1, is, false, 0, 0);
    ins[1] = fidx;
    CHECK_STATUS(kiln_apply(KILN_OP_GATHER, 2, ins, &at, &out), KILN_ERR_TYPE);
    CHECK(message_has("gather", "int32 or int64", "float32"));
    CHECK_STATUS(kiln_apply(KILN_OP_INDEX_PUT, 3, ins, &at, &out), KILN_ERR_TYPE);
    CHECK_STATUS(kiln_apply(KILN_OP_GATHER_ELEMENTS, 2, ins, &at, &out), KILN_ERR_TYPE);
    ins[1] = idx;

    /* source / value shapes */
    int64_t bad_s[2] = {2, 4};
    kiln_tensor *bad_src = make(KILN_DTYPE_FLOAT32, 2, bad_s, false, 0, 0);
    ins[2] = bad_src;
    CHECK_STATUS(kiln_apply(KILN_OP_INDEX_ADD, 3, ins, &at, &out), KILN_ERR_VALUE);
    CHECK(message_has("index_add", "(2, 4)", "(2, 3)"));
    CHECK_STATUS(kiln_apply(KILN_OP_INDEX_PUT, 3, ins, &at, &out), KILN_ERR_VALUE);
    CHECK(message_has("index_put", "(2, 4)", "(5, 3)"));

    /* axis out of range, missing attrs, 0-d tensors */
    kiln_attrs at3 = axis_attrs(2);
    CHECK_STATUS(kiln_apply(KILN_OP_GATHER, 2, ins, &at3, &out), KILN_ERR_INDEX);
    CHECK(message_has("gather", "axis 2", "(5, 3)"));
    CHECK_STATUS(kiln_apply(KILN_OP_GATHER, 2, ins, NULL, &out), KILN_ERR_VALUE);
    kiln_tensor *scalar = make(KILN_DTYPE_FLOAT32, 0, xs, false, 0, 0);
    ins[0] = scalar;
    CHECK_STATUS(kiln_apply(KILN_OP_GATHER, 2, ins, &at, &out), KILN_ERR_VALUE);
    ins[0] = x;

    /* too many result dimensions */
    int64_t big[8] = {2, 1, 1, 1, 1, 1, 1, 1}, is2[2] = {1, 1};
    kiln_tensor *x8 = make(KILN_DTYPE_FLOAT32, 8, big, false, 0, 0), *idx2 = make(KILN_DTYPE_INT32, 2, is2, false, 0, 1);
    kiln_tensor *ins8[2] = {x8, idx2};
    CHECK_STATUS(kiln_apply(KILN_OP_GATHER, 2, ins8, &at, &out), KILN_ERR_VALUE);
    CHECK(message_has("gather", "9 dimensions", NULL));

    /* elementwise pair: rank, extent off the axis, source shape, range */
    CHECK_STATUS(kiln_apply(KILN_OP_GATHER_ELEMENTS, 2, ins, &at, &out), KILN_ERR_VALUE);
    CHECK(message_has("gather_elements", "(2,)", "(5, 3)"));
    int64_t es[2] = {2, 4};
    kiln_tensor *eidx = make(KILN_DTYPE_INT64, 2, es, false, 0, 5);
    ins[1] = eidx;
    CHECK_STATUS(kiln_apply(KILN_OP_GATHER_ELEMENTS, 2, ins, &at, &out), KILN_ERR_VALUE);
    CHECK(message_has("gather_elements", "(2, 4)", "(5, 3)"));
    kiln_tensor_release(eidx);
    es[1] = 3;
    eidx = make(KILN_DTYPE_INT64, 2, es, false, 0, 5);
    ins[1] = eidx;
    ins[2] = bad_src;
    CHECK_STATUS(kiln_apply(KILN_OP_SCATTER_ADD_ELEMENTS, 3, ins, &at, &out), KILN_ERR_VALUE);
    CHECK(message_has("scatter_add_elements", "(2, 4)", "(2, 3)"));
    ((int64_t *)eidx->data)[4] = 9;
    CHECK_STATUS(kiln_apply(KILN_OP_GATHER_ELEMENTS, 2, ins, &at, &out), KILN_ERR_INDEX);
    CHECK(message_has("gather_elements", "index 9", "size 5"));
    CHECK(out == NULL);

    kiln_tensor_release(x), kiln_tensor_release(idx), kiln_tensor_release(v), kiln_tensor_release(fidx);
    kiln_tensor_release(bad_src), kiln_tensor_release(scalar), kiln_tensor_release(x8), kiln_tensor_release(idx2);
    kiln_tensor_release(eidx);
}

/* class_labels: ignored labels become 0, others pass; any other label outside [0, C) fails
 * naming the label and C (negative labels never wrap); int32 and int64, strided, threaded. */
static void test_class_labels(void) {
    kiln_dtype dts[2] = {KILN_DTYPE_INT32, KILN_DTYPE_INT64};
    for (int t = 0; t < 2; t++)
        for (int big = 0; big < 2; big++) {
            int64_t n = big ? 100000 : 10, shape[2] = {2, n};
            kiln_tensor *x = NULL, *v = NULL, *y = NULL;
            CHECK_OK(kiln_tensor_empty(dts[t], 2, shape, &x));
            for (int64_t i = 0; i < 2 * n; i++) {
                int64_t lab = i % 7 == 3 ? -100 : i % 5;
                if (dts[t] == KILN_DTYPE_INT32) ((int32_t *)x->data)[i] = (int32_t)lab;
                else ((int64_t *)x->data)[i] = lab;
            }
            int64_t perm[2] = {1, 0};
            CHECK_OK(kiln_emit_permute(x, perm, &v));
            kiln_attrs a;
            kiln_attrs_clear(&a);
            kiln_attrs_push_int(&a, 5);
            kiln_attrs_push_int(&a, -100);
            CHECK_OK(kiln_apply1(KILN_OP_CLASS_LABELS, v, &a, &y));
            bool ok = y && y->meta.dtype == dts[t] && y->meta.shape[0] == n && y->meta.shape[1] == 2;
            for (int64_t i = 0; ok && i < 2 * n; i++) {
                double in = kiln_tensor_get_double(v, i), got = kiln_tensor_get_double(y, i);
                ok = got == (in == -100 ? 0 : in);
            }
            CHECK(ok);
            kiln_tensor_release(y), y = NULL;
            /* one bad label, late in the buffer */
            int64_t at = 2 * n - 3, bad[3] = {-1, 5, -101};
            for (int b = 0; b < 3; b++) {
                if (dts[t] == KILN_DTYPE_INT32) ((int32_t *)x->data)[at] = (int32_t)bad[b];
                else ((int64_t *)x->data)[at] = bad[b];
                CHECK_STATUS(kiln_apply1(KILN_OP_CLASS_LABELS, v, &a, &y), KILN_ERR_INDEX);
                char want[64];
                snprintf(want, sizeof want, "label %lld is out of range for 5 classes", (long long)bad[b]);
                CHECK(y == NULL && strstr(kiln_last_error(), want));
            }
            kiln_tensor_release(v), kiln_tensor_release(x);
        }
    int64_t three = 3;
    kiln_tensor *f = NULL, *y = NULL;
    CHECK_OK(kiln_tensor_empty(KILN_DTYPE_FLOAT32, 1, &three, &f));
    kiln_attrs a;
    kiln_attrs_clear(&a);
    kiln_attrs_push_int(&a, 5);
    kiln_attrs_push_int(&a, -100);
    CHECK_STATUS(kiln_apply1(KILN_OP_CLASS_LABELS, f, &a, &y), KILN_ERR_TYPE);
    kiln_tensor_release(f);
}

int main(void) {
    test_class_labels();
    test_gather();
    test_gather_large();
    test_index_add();
    test_index_add_large();
    test_index_put();
    test_gather_scatter_elements();
    test_grads();
    test_errors();
    CHECK_DONE();
}
