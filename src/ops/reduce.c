/* Reductions (sum, mean, prod, max, min, var, std, argmax, argmin) and the softmax family:
 * shape/dtype inference and kernels. Gradient rules live in reduce_grad.c.
 *
 * Reductions compute in three element types: float (float16/bfloat16/float32 inputs), double,
 * and int64 (integer and bool inputs). Floating accumulators are double; float32 sums add
 * blocks of the input in float lanes first. Every kernel's summation order depends on the
 * shapes and strides only, never on the thread count, so results are bitwise reproducible.
 * float32's softmax family is compiled per instruction set (isa_dispatch.h: "softmax_f32"). */
#include <math.h>
#include <omp.h>

#include "../core/internal.h"
#include "exp_f32.h"
#include "isa_dispatch.h"
#include "lowp_pass.h"

/* ---- inference -------------------------------------------------------------------------- */

static int64_t reduced_count(const kiln_meta *m, uint64_t mask) {
    int64_t n = 1;
    for (int d = 0; d < m->ndim; d++)
        if ((mask >> d) & 1u) n *= m->shape[d];
    return n;
}

static kiln_status reduce_meta(const char *op, const kiln_tensor *x, const kiln_attrs *a, kiln_dtype dtype,
                               kiln_meta *out) {
    const kiln_meta *m = &x->meta;
    char buf[160];
    KILN_TRY(kiln_attrs_expect(op, a, 2, 0));
    uint64_t mask = (uint64_t)a->i[0];
    if (m->ndim > 0 && (a->i[0] < 0 || (mask >> m->ndim) != 0))
        return kiln_error(KILN_ERR_VALUE, "%s: axis mask 0x%llx is out of range for a tensor of shape %s", op,
                          (unsigned long long)mask, kiln_shape_str(m, buf, sizeof buf));
    bool keep = a->i[1] != 0;
    out->dtype = dtype;
    out->ndim = 0;
    for (int d = 0; d < m->ndim; d++) {
        if (!((mask >> d) & 1u))
            out->shape[out->ndim++] = m->shape[d];
        else if (keep)
            out->shape[out->ndim++] = 1;
    }
    return KILN_OK;
}

static kiln_status reject_empty(const char *op, const kiln_meta *m, uint64_t mask) {
    if (m->ndim == 0 || reduced_count(m, mask) != 0) return KILN_OK;
    char buf[160];
    return kiln_error(KILN_ERR_VALUE, "%s: cannot reduce over an axis of size 0 (no identity) in a tensor of shape %s",
                      op, kiln_shape_str(m, buf, sizeof buf));
}

/* sum, prod: bool and integer inputs give int64 */
KILN_INFER(reduce) {
    kiln_dtype d = in[0]->meta.dtype;
    return reduce_meta("sum/prod", in[0], a, kiln_dtype_is_float(d) ? d : KILN_DTYPE_INT64, out);
}

/* mean, var, std: bool and integer inputs give float32 */
KILN_INFER(reduce_float) {
    kiln_dtype d = in[0]->meta.dtype;
    return reduce_meta("mean/var/std", in[0], a, kiln_dtype_is_float(d) ? d : KILN_DTYPE_FLOAT32, out);
}

/* max, min keep the dtype and need at least one element per output */
KILN_INFER(reduce_same) {
    KILN_TRY(reduce_meta("max/min", in[0], a, in[0]->meta.dtype, out));
    return reject_empty("max/min", &in[0]->meta, (uint64_t)a->i[0]);
}

/* argmax, argmin: one axis, or all of them for the flattened tensor */
KILN_INFER(reduce_index) {
    const kiln_meta *m = &in[0]->meta;
    KILN_TRY(reduce_meta("argmax/argmin", in[0], a, KILN_DTYPE_INT64, out));
    uint64_t mask = (uint64_t)a->i[0], all = m->ndim ? (~0ull >> (64 - m->ndim)) : 0;
    if (m->ndim > 0 && mask != all && (mask == 0 || (mask & (mask - 1)) != 0)) {
        char buf[160];
        return kiln_error(KILN_ERR_VALUE, "argmax/argmin: expected one axis or all axes, got axis mask 0x%llx for a tensor of shape %s",
                          (unsigned long long)mask, kiln_shape_str(m, buf, sizeof buf));
    }
    return reject_empty("argmax/argmin", m, mask);
}

/* ---- reduction plan ----------------------------------------------------------------------
 * The input's axes are ordered by decreasing stride (0-stride axes outermost), size-1 axes
 * dropped and neighbours merged where both the input and the output are contiguous across
 * them. When the innermost axis is reduced each output reduces whole rows ("row" path);
 * otherwise blocks of neighbouring outputs are reduced together over the reduced axes
 * ("column" path), vectorized over the inner kept axis. */

typedef struct {
    int nk, nr;
    int64_t ks[KILN_MAX_DIMS], kx[KILN_MAX_DIMS], ko[KILN_MAX_DIMS]; /* kept: size, x/out strides */
    int64_t rs[KILN_MAX_DIMS + 1], rx[KILN_MAX_DIMS + 1];             /* reduced: size, x stride */
    int64_t n_out, n_red;
    bool inner_reduced;
} red_plan;

typedef struct {
    int64_t n, xs, os;
    bool red;
} plan_axis;

static int64_t stride_key(int64_t s) { return s == 0 ? INT64_MAX : (s < 0 ? -s : s); }

static void plan_build(red_plan *p, const kiln_tensor *x, uint64_t mask) {
    int nd = x->meta.ndim;
    const int64_t *shape = x->meta.shape;
    plan_axis ax[KILN_MAX_DIMS];
    int na = 0;
    int64_t os = 1, ostr[KILN_MAX_DIMS];
    for (int d = nd - 1; d >= 0; d--) {
        bool red = (mask >> d) & 1u;
        ostr[d] = red ? 0 : os;
        if (!red) os *= shape[d];
    }
    for (int d = 0; d < nd; d++)
        if (shape[d] != 1) ax[na++] = (plan_axis){shape[d], x->strides[d], ostr[d], ((mask >> d) & 1u) != 0};
    for (int i = 1; i < na; i++) /* stable insertion sort, outermost first */
        for (int j = i; j > 0 && stride_key(ax[j - 1].xs) < stride_key(ax[j].xs); j--) {
            plan_axis t = ax[j];
            ax[j] = ax[j - 1];
            ax[j - 1] = t;
        }
    int nm = 0;
    for (int i = 0; i < na; i++) {
        if (nm > 0) {
            plan_axis *o = &ax[nm - 1];
            if (o->red == ax[i].red && o->xs == ax[i].xs * ax[i].n && o->os == ax[i].os * ax[i].n) {
                o->n *= ax[i].n;
                o->xs = ax[i].xs;
                o->os = ax[i].os;
                continue;
            }
        }
        ax[nm++] = ax[i];
    }
    p->nk = p->nr = 0;
    p->n_out = p->n_red = 1;
    bool any_red = false;
    for (int i = 0; i < nm; i++) any_red |= ax[i].red;
    if (!any_red) { /* nothing to reduce: a virtual reduced axis of size 1, outermost */
        p->rs[0] = 1;
        p->rx[0] = 0;
        p->nr = 1;
    }
    for (int i = 0; i < nm; i++) {
        if (ax[i].red) {
            p->rs[p->nr] = ax[i].n;
            p->rx[p->nr++] = ax[i].xs;
            p->n_red *= ax[i].n;
        } else {
            p->ks[p->nk] = ax[i].n;
            p->kx[p->nk] = ax[i].xs;
            p->ko[p->nk++] = ax[i].os;
            p->n_out *= ax[i].n;
        }
    }
    p->inner_reduced = p->nk == 0 || ax[nm - 1].red;
}

/* Offset of linear index `lin` over (n, shape) with the given strides. */
static inline int64_t offset_of(int64_t lin, int n, const int64_t *shape, const int64_t *stride) {
    int64_t off = 0;
    for (int d = n - 1; d >= 0; d--) {
        int64_t i = lin % shape[d];
        lin /= shape[d];
        off += i * stride[d];
    }
    return off;
}

/* ---- per-type row and column loops -------------------------------------------------------
 * row(acc, x, n, s, mean):   *acc = op(*acc, x[0], x[s], ..., x[(n-1)s])
 * col(acc, x, n, s, rs, k, mean, ms): acc[i] = op(acc[i], x[i s], x[i s + rs], ... k rows)
 * comb(acc, other, n):       acc[i] = op(acc[i], other[i])
 * The accumulator type A is double for float and double elements, int64 for integers.
 * `mean` is only read by SQDEV (the sum of squared deviations behind var and std). */

typedef void (*row_fn)(void *acc, const char *x, int64_t n, int64_t s, const double *mean);
typedef void (*col_fn)(void *acc, const char *x, int64_t n, int64_t s, int64_t rs, int k, const double *mean,
                       int64_t ms);
typedef void (*comb_fn)(void *acc, const void *other, int64_t n);

enum { RED_SUM, RED_PROD, RED_MAX, RED_MIN, RED_SQDEV, RED_NOPS };
enum { TY_F32, TY_F64, TY_I64, TY_COUNT };

#define LANES 16   /* partial sums per block: the vectorizer keeps them in registers */
#define WIDE 64    /* running maxima/minima: a loop over these vectorizes with NaN checks */
#define BLOCK 1024 /* float32 elements summed in float lanes before joining the double total */

/* NaN-propagating max and min (`|`, not `||`: no branches, so loops over them vectorize) */
#define FMAX(a, b) ((((b) > (a)) | ((b) != (b))) ? (b) : (a))
#define FMIN(a, b) ((((b) < (a)) | ((b) != (b))) ? (b) : (a))
#define IMAX(a, b) ((b) > (a) ? (b) : (a))
#define IMIN(a, b) ((b) < (a) ? (b) : (a))
#define ADD_F(a, b) ((a) + (b))
#define MUL_F(a, b) ((a) * (b))
#define ADD_I(a, b) ((int64_t)((uint64_t)(a) + (uint64_t)(b))) /* wraps like NumPy */
#define MUL_I(a, b) ((int64_t)((uint64_t)(a) * (uint64_t)(b)))

/* T element, A accumulator, U lane type of sums */
/* Running max or min of a row: WIDE independent lanes, then the lanes and the tail. */
#define DEFINE_EXTREMUM(NAME, SUF, T, A, OP)                                                 \
    static void upd_##NAME##_##SUF(T *restrict acc, const T *restrict x, int64_t n) {       \
        for (int64_t i = 0; i < n; i++) acc[i] = OP(acc[i], x[i]);                           \
    }                                                                                        \
    static void row_##NAME##_##SUF(void *acc, const char *px, int64_t n, int64_t s, const double *mean) { \
        (void)mean;                                                                          \
        const T *x = (const T *)px;                                                          \
        T t = (T) * (A *)acc;                                                                \
        int64_t i = 0;                                                                       \
        if (s == 1 && n >= WIDE) {                                                           \
            T lanes[WIDE];                                                                   \
            memcpy(lanes, x, sizeof lanes);                                                  \
            for (i = WIDE; i + WIDE <= n; i += WIDE) upd_##NAME##_##SUF(lanes, x + i, WIDE);  \
            for (int l = 0; l < WIDE; l++) t = OP(t, lanes[l]);                              \
        }                                                                                    \
        for (; i < n; i++) t = OP(t, x[i * s]);                                              \
        *(A *)acc = (A)t;                                                                    \
    }

#define DEFINE_LOOPS(SUF, T, A, U, ADD, MUL, MAXOP, MINOP)                                    \
    static U block_sum_##SUF(const T *restrict x, int64_t m) {                               \
        U lanes[LANES] = {0};                                                                \
        int64_t i = 0;                                                                       \
        for (; i + LANES <= m; i += LANES)                                                   \
            for (int l = 0; l < LANES; l++) lanes[l] += (U)x[i + l];                         \
        for (int l = 0; i < m; i++, l++) lanes[l] += (U)x[i];                                \
        for (int w = LANES / 2; w > 0; w /= 2)                                               \
            for (int l = 0; l < w; l++) lanes[l] += lanes[l + w];                            \
        return lanes[0];                                                                     \
    }                                                                                        \
    static void row_sum_##SUF(void *acc, const char *px, int64_t n, int64_t s, const double *mean) { \
        (void)mean;                                                                          \
        const T *x = (const T *)px;                                                          \
        A t = *(A *)acc;                                                                     \
        if (s == 1) {                                                                        \
            for (int64_t b = 0; b < n; b += BLOCK)                                           \
                t = ADD(t, (A)block_sum_##SUF(x + b, n - b < BLOCK ? n - b : BLOCK));        \
        } else {                                                                             \
            for (int64_t i = 0; i < n; i++) t = ADD(t, (A)x[i * s]);                         \
        }                                                                                    \
        *(A *)acc = t;                                                                       \
    }                                                                                        \
    static void row_prod_##SUF(void *acc, const char *px, int64_t n, int64_t s, const double *mean) { \
        (void)mean;                                                                          \
        const T *x = (const T *)px;                                                          \
        A t = *(A *)acc;                                                                     \
        for (int64_t i = 0; i < n; i++) t = MUL(t, (A)x[i * s]);                             \
        *(A *)acc = t;                                                                       \
    }                                                                                        \
    DEFINE_EXTREMUM(max, SUF, T, A, MAXOP)                                                   \
    DEFINE_EXTREMUM(min, SUF, T, A, MINOP)

/* sums of squared deviations from a per-output mean, in double */
#define DEFINE_SQDEV(SUF, T)                                                                 \
    static void row_sqdev_##SUF(void *acc, const char *px, int64_t n, int64_t s, const double *mean) { \
        const T *x = (const T *)px;                                                          \
        const double mu = *mean;                                                             \
        double t = *(double *)acc;                                                           \
        int64_t i = 0;                                                                       \
        if (s == 1) {                                                                        \
            double lanes[LANES] = {0};                                                       \
            for (; i + LANES <= n; i += LANES)                                               \
                for (int l = 0; l < LANES; l++) {                                            \
                    double d = (double)x[i + l] - mu;                                        \
                    lanes[l] += d * d;                                                       \
                }                                                                            \
            for (int w = LANES / 2; w > 0; w /= 2)                                           \
                for (int l = 0; l < w; l++) lanes[l] += lanes[l + w];                        \
            t += lanes[0];                                                                   \
        }                                                                                    \
        for (; i < n; i++) {                                                                 \
            double d = (double)x[i * s] - mu;                                                \
            t += d * d;                                                                      \
        }                                                                                    \
        *(double *)acc = t;                                                                  \
    }

DEFINE_LOOPS(f32, float, double, float, ADD_F, MUL_F, FMAX, FMIN)
DEFINE_LOOPS(f64, double, double, double, ADD_F, MUL_F, FMAX, FMIN)
DEFINE_LOOPS(i64, int64_t, int64_t, uint64_t, ADD_I, MUL_I, IMAX, IMIN)
DEFINE_SQDEV(f32, float)
DEFINE_SQDEV(f64, double)

/* Column loops take COL_ROWS, 4 or 2 neighbouring rows of the innermost reduced axis at once
 * (rows rs apart; combined pairwise) or one row (k == 1): fewer accumulator updates, more
 * streams (short reduced axes such as the sum over repeated key/value heads). F is
 * the per-element term (the value, or its squared deviation from the output's mean). */
#define TERM_PLAIN(U, v, i) ((U)(v))
#define TERM_SQDEV(U, v, i) (((double)(v) - mean[(i) * ms]) * ((double)(v) - mean[(i) * ms]))
#define COL_ROWS 8

#define DEFINE_COL(NAME, T, A, U, F, OPU, OPA)                                               \
    static void NAME(void *vacc, const char *px, int64_t n, int64_t s, int64_t rs, int k, const double *mean, \
                     int64_t ms) {                                                           \
        (void)mean, (void)ms;                                                                \
        A *restrict acc = vacc;                                                              \
        const T *restrict x = (const T *)px;                                                 \
        if (k == COL_ROWS && s == 1) {                                                       \
            for (int64_t i = 0; i < n; i++) {                                                \
                U v = OPU(OPU(OPU(F(U, x[i], i), F(U, x[i + rs], i)), OPU(F(U, x[i + 2 * rs], i), F(U, x[i + 3 * rs], i))), \
                          OPU(OPU(F(U, x[i + 4 * rs], i), F(U, x[i + 5 * rs], i)),          \
                              OPU(F(U, x[i + 6 * rs], i), F(U, x[i + 7 * rs], i))));         \
                acc[i] = OPA(acc[i], (A)v);                                                  \
            }                                                                                \
            return;                                                                          \
        }                                                                                    \
        if (k == 4 && s == 1) {                                                              \
            for (int64_t i = 0; i < n; i++) {                                                \
                U v = OPU(OPU(F(U, x[i], i), F(U, x[i + rs], i)), OPU(F(U, x[i + 2 * rs], i), F(U, x[i + 3 * rs], i))); \
                acc[i] = OPA(acc[i], (A)v);                                                  \
            }                                                                                \
            return;                                                                          \
        }                                                                                    \
        if (k == 2 && s == 1) {                                                              \
            for (int64_t i = 0; i < n; i++) acc[i] = OPA(acc[i], (A)OPU(F(U, x[i], i), F(U, x[i + rs], i))); \
            return;                                                                          \
        }                                                                                    \
        for (int j = 0; j < k; j++, x += rs) {                                               \
            if (s == 1)                                                                      \
                for (int64_t i = 0; i < n; i++) acc[i] = OPA(acc[i], (A)F(U, x[i], i));      \
            else                                                                             \
                for (int64_t i = 0; i < n; i++) acc[i] = OPA(acc[i], (A)F(U, x[i * s], i));  \
        }                                                                                    \
    }
#define ADD_U(a, b) ((a) + (b))
DEFINE_COL(col_sum_f32, float, double, float, TERM_PLAIN, ADD_U, ADD_F)
DEFINE_COL(col_sum_f64, double, double, double, TERM_PLAIN, ADD_U, ADD_F)
DEFINE_COL(col_sum_i64, int64_t, int64_t, uint64_t, TERM_PLAIN, ADD_U, ADD_I)
DEFINE_COL(col_prod_f32, float, double, double, TERM_PLAIN, MUL_F, MUL_F)
DEFINE_COL(col_prod_f64, double, double, double, TERM_PLAIN, MUL_F, MUL_F)
DEFINE_COL(col_prod_i64, int64_t, int64_t, uint64_t, TERM_PLAIN, MUL_F, MUL_I)
DEFINE_COL(col_max_f32, float, double, float, TERM_PLAIN, FMAX, FMAX)
DEFINE_COL(col_max_f64, double, double, double, TERM_PLAIN, FMAX, FMAX)
DEFINE_COL(col_max_i64, int64_t, int64_t, int64_t, TERM_PLAIN, IMAX, IMAX)
DEFINE_COL(col_min_f32, float, double, float, TERM_PLAIN, FMIN, FMIN)
DEFINE_COL(col_min_f64, double, double, double, TERM_PLAIN, FMIN, FMIN)
DEFINE_COL(col_min_i64, int64_t, int64_t, int64_t, TERM_PLAIN, IMIN, IMIN)
DEFINE_COL(col_sqdev_f32, float, double, double, TERM_SQDEV, ADD_U, ADD_F)
DEFINE_COL(col_sqdev_f64, double, double, double, TERM_SQDEV, ADD_U, ADD_F)

#define DEFINE_COMBINE(NAME, A, OP)                                                          \
    static void NAME(void *vacc, const void *vother, int64_t n) {                            \
        A *acc = vacc;                                                                       \
        const A *other = vother;                                                             \
        for (int64_t i = 0; i < n; i++) acc[i] = OP(acc[i], other[i]);                       \
    }
DEFINE_COMBINE(comb_sum_d, double, ADD_F)
DEFINE_COMBINE(comb_prod_d, double, MUL_F)
DEFINE_COMBINE(comb_max_d, double, FMAX)
DEFINE_COMBINE(comb_min_d, double, FMIN)
DEFINE_COMBINE(comb_sum_i, int64_t, ADD_I)
DEFINE_COMBINE(comb_prod_i, int64_t, MUL_I)
DEFINE_COMBINE(comb_max_i, int64_t, IMAX)
DEFINE_COMBINE(comb_min_i, int64_t, IMIN)

static const row_fn row_fns[RED_NOPS][TY_COUNT] = {
    {row_sum_f32, row_sum_f64, row_sum_i64},    {row_prod_f32, row_prod_f64, row_prod_i64},
    {row_max_f32, row_max_f64, row_max_i64},    {row_min_f32, row_min_f64, row_min_i64},
    {row_sqdev_f32, row_sqdev_f64, NULL},
};
static const col_fn col_fns[RED_NOPS][TY_COUNT] = {
    {col_sum_f32, col_sum_f64, col_sum_i64},    {col_prod_f32, col_prod_f64, col_prod_i64},
    {col_max_f32, col_max_f64, col_max_i64},    {col_min_f32, col_min_f64, col_min_i64},
    {col_sqdev_f32, col_sqdev_f64, NULL},
};
static const comb_fn comb_fns[RED_NOPS][2] = { /* [op][accumulator is int] */
    {comb_sum_d, comb_sum_i}, {comb_prod_d, comb_prod_i}, {comb_max_d, comb_max_i},
    {comb_min_d, comb_min_i}, {comb_sum_d, NULL},
};
static const double init_d[RED_NOPS] = {0.0, 1.0, -INFINITY, INFINITY, 0.0};
static const int64_t init_i[RED_NOPS] = {0, 1, INT64_MIN, INT64_MAX, 0};

/* ---- the executor ------------------------------------------------------------------------ */

#define COL_BLOCK 4096 /* outputs reduced together on the column path: long runs stream well */
#define CHUNK 32768    /* elements per partial result when few outputs share a long reduction */
#define MAX_CHUNKS 64
#define FEW_OUTPUTS 16

typedef struct {
    const red_plan *p;
    int op, ty;
    bool acc_int;
    const char *x;
    size_t isz;
    char *out;          /* contiguous output in the keepdims layout: float32, float64 or int64 */
    kiln_dtype odt;
    double div;         /* outputs are acc / div ... */
    bool take_sqrt;     /* ... then square-rooted (std) */
    const double *means; /* per output, for SQDEV */
} red_exec;

static inline void acc_init(const red_exec *e, void *acc, int64_t n) {
    if (e->acc_int)
        for (int64_t i = 0; i < n; i++) ((int64_t *)acc)[i] = init_i[e->op];
    else
        for (int64_t i = 0; i < n; i++) ((double *)acc)[i] = init_d[e->op];
}

static inline void acc_store(const red_exec *e, int64_t ooff, int64_t os, const void *acc, int64_t n) {
    if (e->acc_int) {
        int64_t *o = (int64_t *)e->out + ooff;
        for (int64_t i = 0; i < n; i++) o[i * os] = ((const int64_t *)acc)[i];
        return;
    }
    const double *v = acc;
    const double div = e->div;
    if (e->odt == KILN_DTYPE_FLOAT32) {
        float *o = (float *)e->out + ooff;
        for (int64_t i = 0; i < n; i++) o[i * os] = (float)(e->take_sqrt ? sqrt(v[i] / div) : v[i] / div);
    } else {
        double *o = (double *)e->out + ooff;
        for (int64_t i = 0; i < n; i++) o[i * os] = e->take_sqrt ? sqrt(v[i] / div) : v[i] / div;
    }
}

/* Row path: reduces elements [begin, end) of the flattened reduced space (outer reduced axes x
 * the inner row) of the output whose input offset is xoff. */
static void row_span(const red_exec *e, int64_t xoff, const double *mean, int64_t begin, int64_t end, void *acc) {
    const red_plan *p = e->p;
    int no = p->nr - 1;
    int64_t n_in = p->rs[no], s_in = p->rx[no];
    if (n_in == 0) return;
    row_fn row = row_fns[e->op][e->ty];
    int64_t r = begin / n_in, i = begin % n_in;
    while (begin < end) {
        int64_t len = n_in - i < end - begin ? n_in - i : end - begin;
        int64_t off = xoff + offset_of(r, no, p->rs, p->rx) + i * s_in;
        row(acc, e->x + off * (int64_t)e->isz, len, s_in, mean);
        begin += len;
        r++;
        i = 0;
    }
}

static void run_rows(const void *ctx, int64_t ob, int64_t oe) {
    const red_exec *e = ctx;
    const red_plan *p = e->p;
    int nk = p->nk;
    int64_t idx[KILN_MAX_DIMS], xoff = 0, ooff = 0, rest = ob;
    for (int d = nk - 1; d >= 0; d--) {
        idx[d] = rest % p->ks[d];
        rest /= p->ks[d];
        xoff += idx[d] * p->kx[d];
        ooff += idx[d] * p->ko[d];
    }
    /* one contiguous or strided row per output: no span bookkeeping */
    bool one_row = p->nr == 1;
    row_fn row = row_fns[e->op][e->ty];
    int64_t n_in = p->rs[p->nr - 1], s_in = p->rx[p->nr - 1], isz = (int64_t)e->isz;
    for (int64_t o = ob; o < oe; o++) {
        union {
            double d;
            int64_t i;
        } acc;
        acc_init(e, &acc, 1);
        const double *mean = e->means ? e->means + ooff : NULL;
        if (one_row)
            row(&acc, e->x + xoff * isz, n_in, s_in, mean);
        else
            row_span(e, xoff, mean, 0, p->n_red, &acc);
        acc_store(e, ooff, 0, &acc, 1);
        for (int d = nk - 1; d >= 0; d--) { /* odometer over the kept axes */
            xoff += p->kx[d], ooff += p->ko[d];
            if (++idx[d] < p->ks[d]) break;
            xoff -= p->kx[d] * p->ks[d], ooff -= p->ko[d] * p->ks[d];
            idx[d] = 0;
        }
    }
}

/* Column path: reduces the inner-axis block [i0, i0 + m) of the outer kept index ko over
 * reduced indices [rb, re). */
static void col_span(const red_exec *e, int64_t xoff, int64_t ooff, int64_t m, int64_t rb, int64_t re, void *acc) {
    const red_plan *p = e->p;
    int nr = p->nr;
    if (rb >= re) return;
    int64_t xs = p->kx[p->nk - 1], ms = p->ko[p->nk - 1];
    col_fn col = col_fns[e->op][e->ty];
    const double *mean = e->means ? e->means + ooff : NULL;
    int64_t idx[KILN_MAX_DIMS + 1], off = 0, r = rb, in = nr - 1, n_in = p->rs[in], s_in = p->rx[in];
    for (int d = nr - 1; d >= 0; d--) {
        idx[d] = r % p->rs[d];
        r /= p->rs[d];
        off += idx[d] * p->rx[d];
    }
    for (r = rb; r < re;) {
        int64_t left = re - r < n_in - idx[in] ? re - r : n_in - idx[in];
        int k = left >= COL_ROWS ? COL_ROWS : left >= 4 ? 4 : left >= 2 ? 2 : 1;
        col(acc, e->x + (xoff + off) * (int64_t)e->isz, m, xs, s_in, k, mean, ms);
        r += k;
        idx[in] += k;
        off += k * s_in;
        if (idx[in] < n_in) continue;
        idx[in] = 0;
        off -= n_in * s_in;
        for (int d = in - 1; d >= 0; d--) { /* odometer over the outer reduced axes */
            off += p->rx[d];
            if (++idx[d] < p->rs[d]) break;
            off -= p->rx[d] * p->rs[d];
            idx[d] = 0;
        }
    }
}

typedef struct {
    int64_t xoff, ooff, m;
} col_task;

static col_task col_task_at(const red_exec *e, int64_t t) {
    const red_plan *p = e->p;
    int ik = p->nk - 1;
    int64_t n_i = p->ks[ik], nblk = (n_i + COL_BLOCK - 1) / COL_BLOCK;
    int64_t ko = t / nblk, i0 = (t % nblk) * COL_BLOCK;
    col_task c;
    c.xoff = offset_of(ko, ik, p->ks, p->kx) + i0 * p->kx[ik];
    c.ooff = offset_of(ko, ik, p->ks, p->ko) + i0 * p->ko[ik];
    c.m = n_i - i0 < COL_BLOCK ? n_i - i0 : COL_BLOCK;
    return c;
}

static void run_cols(const void *ctx, int64_t tb, int64_t te) {
    const red_exec *e = ctx;
    double acc[COL_BLOCK]; /* int64 accumulators share the storage */
    for (int64_t t = tb; t < te; t++) {
        col_task c = col_task_at(e, t);
        acc_init(e, acc, c.m);
        col_span(e, c.xoff, c.ooff, c.m, 0, e->p->n_red, acc);
        acc_store(e, c.ooff, e->p->ko[e->p->nk - 1], acc, c.m);
    }
}

static int64_t col_tasks(const red_plan *p) {
    int64_t n_i = p->ks[p->nk - 1];
    return n_i == 0 ? 0 : (p->n_out / n_i) * ((n_i + COL_BLOCK - 1) / COL_BLOCK);
}

typedef void (*range_fn)(const void *ctx, int64_t begin, int64_t end);

/* fn over [0, n) in one contiguous range per thread (when `parallel`). */
static void run_parallel(const void *ctx, int64_t n, bool parallel, range_fn fn) {
    int threads = parallel ? omp_get_max_threads() : 1;
    if (threads > n) threads = (int)n;
    if (threads <= 1) {
        if (n > 0) fn(ctx, 0, n);
        return;
    }
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int t = 0; t < threads; t++) fn(ctx, n * t / threads, n * (t + 1) / threads);
}

/* Few outputs, long reductions: each output's reduction is cut into fixed chunks reduced in
 * parallel and combined in order (the chunking depends on the sizes only). */
static kiln_status run_chunked(const red_exec *e, bool rows) {
    const red_plan *p = e->p;
    int64_t ntasks = rows ? p->n_out : col_tasks(p);
    int64_t width = rows ? 1 : (p->ks[p->nk - 1] < COL_BLOCK ? p->ks[p->nk - 1] : COL_BLOCK);
    int64_t per = CHUNK / width > 0 ? CHUNK / width : 1;
    if (per < (p->n_red + MAX_CHUNKS - 1) / MAX_CHUNKS) per = (p->n_red + MAX_CHUNKS - 1) / MAX_CHUNKS;
    int64_t nch = (p->n_red + per - 1) / per;
    double *part = kiln_alloc(sizeof(double) * (size_t)(nch * width));
    if (!part) return KILN_ERR_MEMORY;
    comb_fn comb = comb_fns[e->op][e->acc_int];
    for (int64_t t = 0; t < ntasks; t++) {
        int64_t xoff, ooff, m, stride = 0;
        if (rows) {
            xoff = offset_of(t, p->nk, p->ks, p->kx);
            ooff = offset_of(t, p->nk, p->ks, p->ko);
            m = 1;
        } else {
            col_task c = col_task_at(e, t);
            xoff = c.xoff, ooff = c.ooff, m = c.m;
            stride = p->ko[p->nk - 1];
        }
#pragma omp parallel for schedule(static)
        for (int64_t c = 0; c < nch; c++) {
            double *acc = part + c * width;
            int64_t b = c * per, en = b + per < p->n_red ? b + per : p->n_red;
            acc_init(e, acc, m);
            if (rows)
                row_span(e, xoff, e->means ? e->means + ooff : NULL, b, en, acc);
            else
                col_span(e, xoff, ooff, m, b, en, acc);
        }
        for (int64_t c = 1; c < nch; c++) comb(part, part + c * width, m);
        acc_store(e, ooff, stride, part, m);
    }
    kiln_free(part);
    return KILN_OK;
}

static kiln_status red_execute(const red_exec *e) {
    const red_plan *p = e->p;
    if (p->n_out == 0) return KILN_OK;
    bool big = p->n_out * p->n_red >= KILN_PARALLEL_MIN;
    if (p->inner_reduced) {
        if (p->n_out < FEW_OUTPUTS && p->n_red >= 2 * CHUNK) return run_chunked(e, true);
        run_parallel(e, p->n_out, big, run_rows);
    } else {
        int64_t tasks = col_tasks(p), width = p->ks[p->nk - 1] < COL_BLOCK ? p->ks[p->nk - 1] : COL_BLOCK;
        if (tasks < FEW_OUTPUTS && p->n_red * width >= 2 * CHUNK) return run_chunked(e, false);
        run_parallel(e, tasks, big, run_cols);
    }
    return KILN_OK;
}

/* ---- reduction kernels ------------------------------------------------------------------- */

typedef enum { K_SUM, K_MEAN, K_PROD, K_MAX, K_MIN, K_VAR, K_STD } red_kind;

static int type_index(kiln_dtype d) {
    return d == KILN_DTYPE_FLOAT32 ? TY_F32 : (d == KILN_DTYPE_FLOAT64 ? TY_F64 : TY_I64);
}

/* x itself when it already has dtype `td` (any strides), else a contiguous converted copy. */
static kiln_status as_dtype(kiln_tensor *x, kiln_dtype td, kiln_tensor **out) {
    if (x->meta.dtype == td) {
        kiln_tensor_retain(x);
        *out = x;
        return KILN_OK;
    }
    return kiln_to_contiguous(x, td, out);
}

static kiln_status run_reduce(red_kind kind, kiln_tensor *x, const kiln_attrs *a, kiln_tensor *out) {
    kiln_dtype xd = x->meta.dtype, od = out->meta.dtype;
    bool float_out = kind == K_MEAN || kind == K_VAR || kind == K_STD;
    kiln_dtype td = xd == KILN_DTYPE_FLOAT64 ? KILN_DTYPE_FLOAT64
                    : kiln_dtype_is_float(xd) ? KILN_DTYPE_FLOAT32
                    : float_out               ? KILN_DTYPE_FLOAT64
                                              : KILN_DTYPE_INT64;
    kiln_dtype sd = (od == KILN_DTYPE_FLOAT32 || od == KILN_DTYPE_FLOAT64 || od == KILN_DTYPE_INT64) ? od
                    : kiln_dtype_is_float(od) ? KILN_DTYPE_FLOAT32
                                              : KILN_DTYPE_INT64;
    kiln_tensor *xc = NULL, *res = out;
    double *means = NULL;
    kiln_status s = as_dtype(x, td, &xc);
    if (s == KILN_OK && sd != od) s = kiln_tensor_empty(sd, out->meta.ndim, out->meta.shape, &res);
    if (s != KILN_OK) goto done;
    red_plan p;
    plan_build(&p, xc, x->meta.ndim ? (uint64_t)a->i[0] : 0);
    static const int op_of[] = {RED_SUM, RED_SUM, RED_PROD, RED_MAX, RED_MIN, RED_SUM, RED_SUM};
    red_exec e = {&p, op_of[kind], type_index(td), td == KILN_DTYPE_INT64, xc->data, kiln_dtype_size(td),
                  res->data, sd, 1.0, false, NULL};
    if (kind == K_MEAN) e.div = (double)p.n_red;
    if (kind == K_VAR || kind == K_STD) {
        means = kiln_alloc(sizeof(double) * (size_t)(p.n_out ? p.n_out : 1));
        if (!means) {
            s = KILN_ERR_MEMORY;
            goto done;
        }
        red_exec m = e;
        m.out = (char *)means;
        m.odt = KILN_DTYPE_FLOAT64;
        m.div = (double)p.n_red;
        s = red_execute(&m);
        int64_t ddof = a->ni > 2 ? a->i[2] : 0;
        e.op = RED_SQDEV;
        e.means = means;
        e.div = ddof < p.n_red ? (double)p.n_red - (double)ddof : 0.0; /* (ddof may be anything: no int64 difference) */
        e.take_sqrt = kind == K_STD;
    }
    if (s == KILN_OK) s = red_execute(&e);
    if (s == KILN_OK && res != out) s = kiln_copy_into(out, res);
done:
    kiln_free(means);
    if (res != out) kiln_tensor_release(res);
    kiln_tensor_release(xc);
    return s;
}

KILN_KERNEL(sum) { return run_reduce(K_SUM, in[0], a, out[0]); }
KILN_KERNEL(mean) { return run_reduce(K_MEAN, in[0], a, out[0]); }
KILN_KERNEL(prod) { return run_reduce(K_PROD, in[0], a, out[0]); }
KILN_KERNEL(max) { return run_reduce(K_MAX, in[0], a, out[0]); }
KILN_KERNEL(min) { return run_reduce(K_MIN, in[0], a, out[0]); }
KILN_KERNEL(var) { return run_reduce(K_VAR, in[0], a, out[0]); }
KILN_KERNEL(std) { return run_reduce(K_STD, in[0], a, out[0]); }

/* ---- argmax, argmin ----------------------------------------------------------------------
 * Over a contiguous (O, R, I) view: the first index of the extreme value; a NaN counts as
 * the extreme (the first NaN wins), as in NumPy. */

typedef struct {
    const char *x;
    int64_t R, I;
    int64_t *out;
} arg_ctx;

#define BETTER_FMAX(v, best) (((v) > (best)) | (((v) != (v)) & ((best) == (best))))
#define BETTER_FMIN(v, best) (((v) < (best)) | (((v) != (v)) & ((best) == (best))))
#define BETTER_IMAX(v, best) ((v) > (best))
#define BETTER_IMIN(v, best) ((v) < (best))

#define ARG_BLOCK 1024 /* columns per task for argmax/argmin and the softmax family */

/* Rows (I == 1): the extreme value first (vectorized), then its first position. Columns: a
 * running best value and index per column. */
#define DEFINE_ARG(NAME, T, A, INIT, ROW, BETTER, ISNAN)                                     \
    static void NAME##_update(T *restrict best, int64_t *restrict at, const T *restrict row, int64_t m, \
                              int64_t r) {                                                   \
        for (int64_t i = 0; i < m; i++) {                                                    \
            T v = row[i], b = best[i];                                                       \
            int take = BETTER(v, b);                                                         \
            best[i] = take ? v : b;                                                          \
            at[i] = take ? r : at[i];                                                        \
        }                                                                                    \
    }                                                                                        \
    static void NAME(const void *vctx, int64_t tb, int64_t te) {                             \
        const arg_ctx *c = vctx;                                                             \
        const int64_t R = c->R, I = c->I, nblk = (I + ARG_BLOCK - 1) / ARG_BLOCK;            \
        for (int64_t t = tb; t < te; t++) {                                                  \
            int64_t o = t / nblk, i0 = (t % nblk) * ARG_BLOCK;                               \
            int64_t m = I - i0 < ARG_BLOCK ? I - i0 : ARG_BLOCK;                             \
            const T *base = (const T *)c->x + o * R * I + i0;                                \
            int64_t *out = c->out + o * I + i0;                                              \
            if (I == 1) {                                                                    \
                A acc = INIT;                                                                \
                ROW(&acc, (const char *)base, R, 1, NULL);                                   \
                const T best = (T)acc;                                                       \
                int64_t r = 0;                                                               \
                if (ISNAN(best))                                                             \
                    while (r < R - 1 && !ISNAN(base[r])) r++;                                \
                else                                                                         \
                    while (r < R - 1 && base[r] != best) r++;                                \
                out[0] = r;                                                                  \
                continue;                                                                    \
            }                                                                                \
            T best[ARG_BLOCK];                                                               \
            int64_t at[ARG_BLOCK];                                                           \
            for (int64_t i = 0; i < m; i++) best[i] = base[i], at[i] = 0;                    \
            for (int64_t r = 1; r < R; r++) NAME##_update(best, at, base + r * I, m, r);     \
            for (int64_t i = 0; i < m; i++) out[i] = at[i];                                  \
        }                                                                                    \
    }
#define ISNAN_F(v) ((v) != (v))
#define ISNAN_I(v) 0
DEFINE_ARG(argmax_f32, float, double, -INFINITY, row_max_f32, BETTER_FMAX, ISNAN_F)
DEFINE_ARG(argmax_f64, double, double, -INFINITY, row_max_f64, BETTER_FMAX, ISNAN_F)
DEFINE_ARG(argmax_i64, int64_t, int64_t, INT64_MIN, row_max_i64, BETTER_IMAX, ISNAN_I)
DEFINE_ARG(argmin_f32, float, double, INFINITY, row_min_f32, BETTER_FMIN, ISNAN_F)
DEFINE_ARG(argmin_f64, double, double, INFINITY, row_min_f64, BETTER_FMIN, ISNAN_F)
DEFINE_ARG(argmin_i64, int64_t, int64_t, INT64_MAX, row_min_i64, BETTER_IMIN, ISNAN_I)

/* (O, R, I) of a contiguous tensor reduced along `axis`. */
static void split_axis(const kiln_meta *m, int axis, int64_t *O, int64_t *R, int64_t *I) {
    *O = *R = *I = 1;
    for (int d = 0; d < m->ndim; d++) *(d < axis ? O : d == axis ? R : I) *= m->shape[d];
}

static kiln_dtype compute_type(kiln_dtype d) {
    return d == KILN_DTYPE_FLOAT64 ? d : kiln_dtype_is_float(d) ? KILN_DTYPE_FLOAT32 : KILN_DTYPE_INT64;
}

static kiln_status run_argreduce(bool is_max, kiln_tensor *x, const kiln_attrs *a, kiln_tensor *out) {
    static const range_fn fns[2][TY_COUNT] = {{argmin_f32, argmin_f64, argmin_i64},
                                              {argmax_f32, argmax_f64, argmax_i64}};
    const kiln_meta *m = &x->meta;
    kiln_dtype td = compute_type(m->dtype);
    kiln_tensor *xc;
    KILN_TRY(kiln_to_contiguous(x, td, &xc));
    uint64_t mask = (uint64_t)a->i[0], all = m->ndim ? (~0ull >> (64 - m->ndim)) : 0;
    arg_ctx c = {xc->data, 1, 1, out->data};
    int64_t O = 1;
    if (mask == all)
        c.R = x->numel;
    else
        split_axis(m, __builtin_ctzll(mask), &O, &c.R, &c.I);
    int64_t tasks = O * ((c.I + ARG_BLOCK - 1) / ARG_BLOCK);
    run_parallel(&c, tasks, x->numel >= KILN_PARALLEL_MIN, fns[is_max][type_index(td)]);
    kiln_tensor_release(xc);
    return KILN_OK;
}

KILN_KERNEL(argmax) { return run_argreduce(true, in[0], a, out[0]); }
KILN_KERNEL(argmin) { return run_argreduce(false, in[0], a, out[0]); }

/* ---- softmax family ----------------------------------------------------------------------
 * Over contiguous (O, R, I) views, blocks of up to ARG_BLOCK neighbouring columns at a time
 * (I == 1: one row). Sums are in double; softmax subtracts the maximum first. */

typedef enum { SM_SOFTMAX, SM_LOG_SOFTMAX, SM_SOFTMAX_BWD, SM_LOG_SOFTMAX_BWD } sm_kind;

typedef struct {
    sm_kind kind;
    const char *a, *b; /* x; or (grad, y) for the backward ops */
    char *y;
    int64_t R, I;
} sm_ctx;

DEFINE_EXP_F32(exp_f32)

/* sum(a * b) in lanes per block, blocks joined in double */
#define DEFINE_DOT(SUF, T)                                                                   \
    static double dot_##SUF(const T *restrict a, const T *restrict b, int64_t n) {           \
        double t = 0.0;                                                                      \
        for (int64_t b0 = 0; b0 < n; b0 += BLOCK) {                                          \
            int64_t m = n - b0 < BLOCK ? n - b0 : BLOCK, i = 0;                              \
            T lanes[LANES] = {0};                                                            \
            for (; i + LANES <= m; i += LANES)                                               \
                for (int l = 0; l < LANES; l++) lanes[l] += a[b0 + i + l] * b[b0 + i + l];  \
            for (int l = 0; i < m; i++, l++) lanes[l] += a[b0 + i] * b[b0 + i];              \
            for (int w = LANES / 2; w > 0; w /= 2)                                           \
                for (int l = 0; l < w; l++) lanes[l] += lanes[l + w];                        \
            t += lanes[0];                                                                   \
        }                                                                                    \
        return t;                                                                            \
    }
DEFINE_DOT(f32, float)
DEFINE_DOT(f64, double)

/* y = exp(a - mx) and its sum in one pass: lanes per block, blocks joined in double (the
 * order of row_sum's) */
#define DEFINE_EXP_SUM(SUF, T, EXP)                                                          \
    static double exp_sum_##SUF(const T *restrict a, T *restrict y, T mx, int64_t n) {        \
        double t = 0.0;                                                                      \
        for (int64_t b0 = 0; b0 < n; b0 += BLOCK) {                                          \
            int64_t m = n - b0 < BLOCK ? n - b0 : BLOCK, i = 0;                              \
            const T *restrict ab = a + b0;                                                   \
            T *restrict yb = y + b0;                                                         \
            T lanes[LANES] = {0};                                                            \
            for (; i + LANES <= m; i += LANES)                                               \
                for (int l = 0; l < LANES; l++) {                                            \
                    T e = EXP(ab[i + l] - mx);                                               \
                    yb[i + l] = e;                                                           \
                    lanes[l] += e;                                                           \
                }                                                                            \
            for (int l = 0; i < m; i++, l++) {                                               \
                T e = EXP(ab[i] - mx);                                                       \
                yb[i] = e;                                                                   \
                lanes[l] += e;                                                               \
            }                                                                                \
            for (int w = LANES / 2; w > 0; w /= 2)                                           \
                for (int l = 0; l < w; l++) lanes[l] += lanes[l + w];                        \
            t += lanes[0];                                                                   \
        }                                                                                    \
        return t;                                                                            \
    }
DEFINE_EXP_SUM(f32, float, exp_f32)
DEFINE_EXP_SUM(f64, double, exp)

#define DEFINE_SOFTMAX(SUF, T, EXP, LOG)                                                     \
    /* one row (I == 1) */                                                                   \
    static void sm_row_##SUF(const sm_ctx *c, int64_t o) {                                   \
        const int64_t R = c->R;                                                              \
        const T *restrict a = (const T *)c->a + o * R;                                       \
        const T *restrict b = c->b ? (const T *)c->b + o * R : NULL;                         \
        T *restrict y = (T *)c->y + o * R;                                                   \
        double sum = 0.0, mxd = -INFINITY;                                                   \
        switch (c->kind) {                                                                   \
        case SM_SOFTMAX:                                                                     \
        case SM_LOG_SOFTMAX: {                                                               \
            row_max_##SUF(&mxd, (const char *)a, R, 1, NULL);                                \
            const T mx = (T)mxd;                                                             \
            sum = exp_sum_##SUF(a, y, mx, R);                                                \
            if (c->kind == SM_SOFTMAX) {                                                     \
                const T inv = (T)(1.0 / sum);                                                \
                for (int64_t r = 0; r < R; r++) y[r] *= inv;                                 \
            } else {                                                                         \
                const T lse = (T)LOG(sum);                                                   \
                for (int64_t r = 0; r < R; r++) y[r] = (a[r] - mx) - lse;                    \
            }                                                                                \
            break;                                                                           \
        }                                                                                    \
        case SM_SOFTMAX_BWD: { /* y * (g - sum(g * y)) */                                    \
            const T d = (T)dot_##SUF(a, b, R);                                               \
            for (int64_t r = 0; r < R; r++) y[r] = b[r] * (a[r] - d);                        \
            break;                                                                           \
        }                                                                                    \
        case SM_LOG_SOFTMAX_BWD: { /* g - exp(y) * sum(g) */                                 \
            row_sum_##SUF(&sum, (const char *)a, R, 1, NULL);                                \
            const T t = (T)sum;                                                              \
            for (int64_t r = 0; r < R; r++) y[r] = a[r] - EXP(b[r]) * t;                     \
            break;                                                                           \
        }                                                                                    \
        }                                                                                    \
    }                                                                                        \
    /* columns [i0, i0 + m) of outer index o, vectorized across the columns */               \
    static void sm_block_##SUF(const sm_ctx *c, int64_t o, int64_t i0, int64_t m) {          \
        const int64_t R = c->R, I = c->I, base = o * R * I + i0;                             \
        const T *A = (const T *)c->a + base, *B = c->b ? (const T *)c->b + base : NULL;      \
        T *Y = (T *)c->y + base;                                                             \
        T mx[ARG_BLOCK];                                                                     \
        double sum[ARG_BLOCK];                                                               \
        for (int64_t i = 0; i < m; i++) sum[i] = 0.0;                                        \
        switch (c->kind) {                                                                   \
        case SM_SOFTMAX:                                                                     \
        case SM_LOG_SOFTMAX:                                                                 \
            for (int64_t i = 0; i < m; i++) mx[i] = (T)-INFINITY;                            \
            for (int64_t r = 0; r < R; r++) upd_max_##SUF(mx, A + r * I, m);                 \
            if (c->kind == SM_SOFTMAX) {                                                     \
                for (int64_t r = 0; r < R; r++)                                              \
                    for (int64_t i = 0; i < m; i++) {                                        \
                        T e = EXP(A[r * I + i] - mx[i]);                                     \
                        Y[r * I + i] = e;                                                    \
                        sum[i] += e;                                                         \
                    }                                                                        \
                T inv[ARG_BLOCK];                                                            \
                for (int64_t i = 0; i < m; i++) inv[i] = (T)(1.0 / sum[i]);                  \
                for (int64_t r = 0; r < R; r++)                                              \
                    for (int64_t i = 0; i < m; i++) Y[r * I + i] *= inv[i];                  \
            } else {                                                                         \
                for (int64_t r = 0; r < R; r++)                                              \
                    for (int64_t i = 0; i < m; i++) sum[i] += EXP(A[r * I + i] - mx[i]);     \
                T lse[ARG_BLOCK];                                                            \
                for (int64_t i = 0; i < m; i++) lse[i] = (T)LOG(sum[i]);                     \
                for (int64_t r = 0; r < R; r++)                                              \
                    for (int64_t i = 0; i < m; i++) Y[r * I + i] = (A[r * I + i] - mx[i]) - lse[i]; \
            }                                                                                \
            break;                                                                           \
        case SM_SOFTMAX_BWD:                                                                 \
            for (int64_t r = 0; r < R; r++)                                                  \
                for (int64_t i = 0; i < m; i++) sum[i] += (double)(A[r * I + i] * B[r * I + i]); \
            for (int64_t r = 0; r < R; r++)                                                  \
                for (int64_t i = 0; i < m; i++) Y[r * I + i] = B[r * I + i] * (A[r * I + i] - (T)sum[i]); \
            break;                                                                           \
        case SM_LOG_SOFTMAX_BWD:                                                             \
            for (int64_t r = 0; r < R; r++)                                                  \
                for (int64_t i = 0; i < m; i++) sum[i] += A[r * I + i];                      \
            for (int64_t r = 0; r < R; r++)                                                  \
                for (int64_t i = 0; i < m; i++) Y[r * I + i] = A[r * I + i] - EXP(B[r * I + i]) * (T)sum[i]; \
            break;                                                                           \
        }                                                                                    \
    }                                                                                        \
    static void sm_range_##SUF(const void *vctx, int64_t tb, int64_t te) {                   \
        const sm_ctx *c = vctx;                                                              \
        const int64_t w = ARG_BLOCK, nblk = (c->I + w - 1) / w;                                   \
        for (int64_t t = tb; t < te; t++) {                                                  \
            int64_t o = t / nblk, i0 = (t % nblk) * w;                               \
            if (c->I == 1)                                                                   \
                sm_row_##SUF(c, o);                                                          \
            else                                                                             \
                sm_block_##SUF(c, o, i0, c->I - i0 < w ? c->I - i0 : w);     \
        }                                                                                    \
    }
DEFINE_SOFTMAX(f32, float, exp_f32, log)
DEFINE_SOFTMAX(f64, double, exp, log)

/* float32's softmax family compiled per instruction set (isa_dispatch.h), each variant with its
 * own copies of the loops it calls (the reductions' unused ones included: hence the pragma) */
typedef struct {
    void (*range)(const void *ctx, int64_t tb, int64_t te);
} softmax_kernels;
static const softmax_kernels softmax_f32_baseline = {sm_range_f32};
#define SOFTMAX_F32_VARIANT(V)                                                               \
    _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wunused-function\"")     \
    DEFINE_LOOPS(f32_##V, float, double, float, ADD_F, MUL_F, FMAX, FMIN)                    \
    DEFINE_EXP_F32(exp_f32_##V)                                                              \
    DEFINE_DOT(f32_##V, float)                                                               \
    DEFINE_EXP_SUM(f32_##V, float, exp_f32_##V)                                              \
    DEFINE_SOFTMAX(f32_##V, float, exp_f32_##V, log)                                         \
    _Pragma("GCC diagnostic pop")                                                            \
    static const softmax_kernels softmax_f32_##V = {sm_range_f32_##V};
#if KILN_ISA_VARIANTS
KILN_ISA_BEGIN_AVX2
SOFTMAX_F32_VARIANT(avx2)
KILN_ISA_END
KILN_ISA_BEGIN_AVX512
SOFTMAX_F32_VARIANT(avx512)
KILN_ISA_END
#endif

KILN_ISA_FAMILY(softmax_f32)

/* t as a contiguous tensor of dtype cd and shape m (broadcast when the shapes differ). */
static kiln_status materialize(kiln_tensor *t, kiln_dtype cd, const kiln_meta *m, kiln_tensor **out) {
    bool same = t->meta.ndim == m->ndim;
    for (int d = 0; same && d < m->ndim; d++) same = t->meta.shape[d] == m->shape[d];
    if (same && cd == KILN_DTYPE_FLOAT32 && kiln_lowp_dtype(t->meta.dtype)) return kiln_lowp_widen(t, false, out);
    if (same) return kiln_to_contiguous(t, cd, out);
    KILN_TRY(kiln_tensor_empty(cd, m->ndim, m->shape, out));
    kiln_status s = kiln_copy_into(*out, t);
    if (s != KILN_OK) {
        kiln_tensor_release(*out);
        *out = NULL;
    }
    return s;
}

/* The softmax family on 16-bit operands and result of one dtype, all contiguous (amp's softmax and
 * its gradient): groups of whole outer slices (O, R, I)[o] widened into float32 buffers of each
 * thread's own, float32's kernel run on them, the result rounded back as it is stored. Each element
 * depends only on its own slice, so this is the float32 kernel on the widened values rounded
 * once, bit for bit as the whole-tensor copies below give it, without those copies. */
enum { SM_LOWP_GROUP = 16384 }; /* float32 elements per buffer (at least one slice) */

static bool sm_lowp(kiln_tensor *const *in, int nin, const kiln_tensor *out) {
    if (!kiln_lowp_dtype(out->meta.dtype) || !kiln_tensor_is_contiguous(out)) return false;
    for (int k = 0; k < nin; k++) {
        const kiln_meta *mk = &in[k]->meta;
        if (mk->dtype != out->meta.dtype || !kiln_tensor_is_contiguous(in[k]) || mk->ndim != out->meta.ndim) return false;
        for (int d = 0; d < mk->ndim; d++)
            if (mk->shape[d] != out->meta.shape[d]) return false;
    }
    return true;
}

static kiln_status run_softmax_lowp(sm_kind kind, range_fn fn, kiln_tensor *const *in, int nin, kiln_tensor *out,
                                    int64_t O, int64_t R, int64_t I) {
    const kiln_dtype half = out->meta.dtype;
    const int64_t slice = R * I, nblk = (I + ARG_BLOCK - 1) / ARG_BLOCK;
    if (O == 0 || slice == 0) return KILN_OK;
    int64_t group = SM_LOWP_GROUP / slice;
    if (group < 1) group = 1;
    if (group > O) group = O;
    const int64_t ngroups = (O + group - 1) / group, cap = group * slice;
    int threads = out->numel >= KILN_PARALLEL_MIN / 4 && !omp_in_parallel() ? omp_get_max_threads() : 1;
    if (threads > ngroups) threads = (int)ngroups;
    float *buf = kiln_alloc(sizeof(float) * (size_t)(3 * cap * threads));
    if (!buf) return kiln_error(KILN_ERR_MEMORY, "softmax: out of memory for %lld float32 buffers", (long long)(3 * threads));
    const char *a = in[0]->data, *b = nin > 1 ? in[1]->data : NULL;
    char *y = out->data;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int t = 0; t < threads; t++) {
        float *fa = buf + 3 * cap * t, *fb = fa + cap, *fy = fb + cap;
        for (int64_t g = ngroups * t / threads; g < ngroups * (t + 1) / threads; g++) {
            int64_t o0 = g * group, rows = O - o0 < group ? O - o0 : group, n = rows * slice, at = o0 * slice * 2;
            kiln_lowp_widen_row(half, fa, a + at, n);
            if (b) kiln_lowp_widen_row(half, fb, b + at, n);
            sm_ctx c = {kind, (const char *)fa, b ? (const char *)fb : NULL, (char *)fy, R, I};
            fn(&c, 0, rows * nblk);
            kiln_lowp_round_row(half, y + at, fy, n);
        }
    }
    kiln_free(buf);
    return KILN_OK;
}

static kiln_status run_softmax(const char *op, sm_kind kind, kiln_tensor *const *in, int nin, const kiln_attrs *a,
                               kiln_tensor *out) {
    const kiln_meta *m = &out->meta;
    if (a->ni < 1) return kiln_error(KILN_ERR_VALUE, "%s: expected the axis as int attribute 0", op);
    int64_t axis = a->i[0];
    if (axis < 0 || axis >= (m->ndim ? m->ndim : 1)) {
        char buf[160];
        return kiln_error(KILN_ERR_INDEX, "%s: axis %lld is out of range for a tensor of shape %s", op,
                          (long long)axis, kiln_shape_str(m, buf, sizeof buf));
    }
    kiln_dtype cd = m->dtype == KILN_DTYPE_FLOAT64 ? KILN_DTYPE_FLOAT64 : KILN_DTYPE_FLOAT32;
    if (sm_lowp(in, nin, out)) {
        int64_t O, R, I;
        split_axis(m, (int)axis, &O, &R, &I);
        return run_softmax_lowp(kind, ((const softmax_kernels *)softmax_f32_chosen)->range, in, nin, out, O, R, I);
    }
    kiln_tensor *ins[2] = {NULL, NULL}, *res = out;
    kiln_status s = KILN_OK;
    for (int k = 0; k < nin && s == KILN_OK; k++) s = materialize(in[k], cd, m, &ins[k]);
    if (s == KILN_OK && m->dtype != cd) s = kiln_tensor_empty(cd, m->ndim, m->shape, &res);
    if (s == KILN_OK) {
        int64_t O, tasks;
        sm_ctx c = {kind, ins[0]->data, nin > 1 ? ins[1]->data : NULL, res->data, 0, 0};
        split_axis(m, (int)axis, &O, &c.R, &c.I);
        tasks = O * ((c.I + ARG_BLOCK - 1) / ARG_BLOCK);
        run_parallel(&c, c.R ? tasks : 0, kiln_meta_numel(m) >= KILN_PARALLEL_MIN / 4,
                     cd == KILN_DTYPE_FLOAT64 ? sm_range_f64 : ((const softmax_kernels *)softmax_f32_chosen)->range);
        if (res != out) s = kiln_lowp_copy_into(out, res);
    }
    if (res != out) kiln_tensor_release(res);
    kiln_release_all(ins, 2);
    return s;
}

KILN_KERNEL(softmax) { return run_softmax("softmax", SM_SOFTMAX, in, 1, a, out[0]); }
KILN_KERNEL(log_softmax) { return run_softmax("log_softmax", SM_LOG_SOFTMAX, in, 1, a, out[0]); }
KILN_KERNEL(softmax_backward) { return run_softmax("softmax_backward", SM_SOFTMAX_BWD, in, 2, a, out[0]); }
KILN_KERNEL(log_softmax_backward) {
    return run_softmax("log_softmax_backward", SM_LOG_SOFTMAX_BWD, in, 2, a, out[0]);
}
