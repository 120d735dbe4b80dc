/* Indexing along one axis: gather (numpy.take), index_add, index_put, and the elementwise pair
 * gather_elements / scatter_add_elements (torch.gather / torch.scatter_add). Index tensors are
 * int32 or int64 of any layout; negative indices count from the end. class_labels checks the
 * integer labels of a loss (no wrapping).
 *
 * Along `axis` a tensor x is viewed as (outer, n, inner); gathering with K indices gives
 * (outer, K, inner) = x.shape[:axis] + idx.shape + x.shape[axis+1:], the "selection". */
#include "../core/internal.h"

/* ---- shared checks -------------------------------------------------------------------- */

static int axis_of(const kiln_attrs *a, int ndim) {
    int64_t axis = a->i[0];
    return (int)(axis < 0 ? axis + ndim : axis);
}

static kiln_status check_axis(const char *op, const kiln_attrs *a, const kiln_meta *x, int *axis) {
    KILN_TRY(kiln_attrs_expect(op, a, 1, 0));
    if (x->ndim == 0)
        return kiln_error(KILN_ERR_VALUE, "%s: cannot index a zero-dimensional tensor along an axis", op);
    int64_t ax = a->i[0];
    KILN_TRY(kiln_normalize_axis(op, &ax, x));
    *axis = (int)ax;
    return KILN_OK;
}

static kiln_status check_index(const char *op, const kiln_meta *idx) {
    if (idx->dtype != KILN_DTYPE_INT32 && idx->dtype != KILN_DTYPE_INT64)
        return kiln_error(KILN_ERR_TYPE, "%s: indices must be int32 or int64, got %s", op,
                          kiln_dtype_name(idx->dtype));
    return KILN_OK;
}

/* Meta of the selection x.shape[:axis] + idx.shape + x.shape[axis+1:] (x's dtype). */
static kiln_status selection_meta(const char *op, const kiln_meta *x, const kiln_meta *idx, int axis,
                                  kiln_meta *out) {
    int nd = x->ndim - 1 + idx->ndim;
    if (nd > KILN_MAX_DIMS) {
        char b1[160], b2[160];
        return kiln_error(KILN_ERR_VALUE, "%s: indexing a tensor of shape %s along axis %d with indices of shape %s "
                          "gives %d dimensions, more than %d", op, kiln_shape_str(x, b1, sizeof b1), axis,
                          kiln_shape_str(idx, b2, sizeof b2), nd, KILN_MAX_DIMS);
    }
    out->dtype = x->dtype;
    out->ndim = nd;
    int d = 0;
    for (int k = 0; k < axis; k++) out->shape[d++] = x->shape[k];
    for (int k = 0; k < idx->ndim; k++) out->shape[d++] = idx->shape[k];
    for (int k = axis + 1; k < x->ndim; k++) out->shape[d++] = x->shape[k];
    return KILN_OK;
}

static bool broadcastable(const kiln_meta *from, const kiln_meta *to) {
    int lead = to->ndim - from->ndim;
    if (lead < 0) return false;
    for (int d = 0; d < from->ndim; d++)
        if (from->shape[d] != 1 && from->shape[d] != to->shape[lead + d]) return false;
    return true;
}

/* idx for gather_elements / scatter_add_elements: x's rank, no larger than x off the axis. */
static kiln_status check_elements_index(const char *op, const kiln_meta *x, const kiln_meta *idx, int axis) {
    KILN_TRY(check_index(op, idx));
    bool ok = idx->ndim == x->ndim;
    for (int d = 0; ok && d < x->ndim; d++) ok = d == axis || idx->shape[d] <= x->shape[d];
    if (!ok) {
        char b1[160], b2[160];
        return kiln_error(KILN_ERR_VALUE, "%s: indices of shape %s do not fit a tensor of shape %s along axis %d "
                          "(same rank; no larger than the tensor off the axis)", op,
                          kiln_shape_str(idx, b1, sizeof b1), kiln_shape_str(x, b2, sizeof b2), axis);
    }
    return KILN_OK;
}

/* Normalized indices of `idx` in row-major order (malloc'd), each checked against x.shape[axis]. */
static kiln_status load_indices(const char *op, kiln_tensor *idx, const kiln_meta *x, int axis, int64_t **out) {
    kiln_tensor *c;
    KILN_TRY(kiln_to_contiguous(idx, idx->meta.dtype, &c));
    int64_t K = c->numel, n = x->shape[axis], bad = K;
    int64_t *ix = kiln_malloc(sizeof(int64_t) * (size_t)(K ? K : 1));
    if (!ix) {
        kiln_tensor_release(c);
        return kiln_error(KILN_ERR_MEMORY, "%s: out of memory for %lld indices", op, (long long)K);
    }
    bool i32 = c->meta.dtype == KILN_DTYPE_INT32;
    const int32_t *p32 = c->data;
    const int64_t *p64 = c->data;
#pragma omp parallel for if (K >= KILN_PARALLEL_MIN) reduction(min : bad) schedule(static)
    for (int64_t k = 0; k < K; k++) {
        int64_t v = i32 ? p32[k] : p64[k];
        if (v < 0) v += n;
        if (v < 0 || v >= n) {
            bad = k < bad ? k : bad;
            v = 0;
        }
        ix[k] = v;
    }
    kiln_status s = KILN_OK;
    if (bad < K) {
        char buf[160];
        s = kiln_error(KILN_ERR_INDEX, "%s: index %lld is out of range for axis %d with size %lld (tensor of shape %s)",
                       op, (long long)(i32 ? p32[bad] : p64[bad]), axis, (long long)n,
                       kiln_shape_str(x, buf, sizeof buf));
        free(ix);
        ix = NULL;
    }
    kiln_tensor_release(c);
    *out = ix;
    return s;
}

/* A contiguous tensor of `dtype` shaped `m` holding t broadcast to m (t itself when it already
 * is one and no copy is forced). */
static kiln_status materialize(kiln_tensor *t, kiln_dtype dtype, const kiln_meta *m, bool force_copy,
                               kiln_tensor **out) {
    if (!force_copy && kiln_shape_equal(&t->meta, m->ndim, m->shape)) return kiln_to_contiguous(t, dtype, out);
    KILN_TRY(kiln_tensor_empty(dtype, m->ndim, m->shape, out));
    kiln_status s = kiln_copy_into(*out, t);
    if (s != KILN_OK) {
        kiln_tensor_release(*out);
        *out = NULL;
    }
    return s;
}

/* float16/bfloat16 accumulate in float32. */
static kiln_dtype compute_dtype(kiln_dtype d) {
    return d == KILN_DTYPE_FLOAT16 || d == KILN_DTYPE_BFLOAT16 ? KILN_DTYPE_FLOAT32 : d;
}

/* View of t with `axis` dropped, at position `pos` along it. */
static kiln_status drop_axis_view(kiln_tensor *t, int axis, int64_t pos, kiln_tensor **out) {
    int64_t shape[KILN_MAX_DIMS], strides[KILN_MAX_DIMS];
    int nd = 0;
    for (int d = 0; d < t->meta.ndim; d++) {
        if (d == axis) continue;
        shape[nd] = t->meta.shape[d];
        strides[nd++] = t->strides[d];
    }
    return kiln_tensor_view(t, nd, shape, strides, t->offset + pos * t->strides[axis], out);
}

/* View of a contiguous selection tensor at flat index position k (shaped like x without axis). */
static kiln_status selection_view(kiln_tensor *t, int axis, int kdims, int64_t k, int64_t inner, kiln_tensor **out) {
    int64_t shape[KILN_MAX_DIMS], strides[KILN_MAX_DIMS];
    int nd = 0;
    for (int d = 0; d < t->meta.ndim; d++) {
        if (d >= axis && d < axis + kdims) continue;
        shape[nd] = t->meta.shape[d];
        strides[nd++] = t->strides[d];
    }
    return kiln_tensor_view(t, nd, shape, strides, t->offset + k * inner, out);
}

/* ---- row kernels: x as (outer, n, inner) rows, selection as (outer, K, inner) ------------- */

typedef struct {
    int64_t outer, n, K, inner;
    size_t isz;
} rows_geom;

static void rows_geom_init(rows_geom *g, const kiln_meta *x, int axis, int64_t K) {
    g->outer = kiln_shape_numel(axis, x->shape);
    g->n = x->shape[axis];
    g->inner = kiln_shape_numel(x->ndim - axis - 1, x->shape + axis + 1);
    g->K = K;
    g->isz = kiln_dtype_size(x->dtype);
}

static inline void copy_bytes(char *d, const char *s, size_t bytes) {
    switch (bytes) { /* constant sizes compile to single moves */
    case 1: memcpy(d, s, 1); break;
    case 2: memcpy(d, s, 2); break;
    case 4: memcpy(d, s, 4); break;
    case 8: memcpy(d, s, 8); break;
    default: memcpy(d, s, bytes); break;
    }
}

static void gather_rows(char *dst, const char *src, const int64_t *ix, const rows_geom *g) {
    int64_t total = g->outer * g->K;
    size_t row = (size_t)g->inner * g->isz;
    bool par = total > 1 && total * g->inner >= KILN_PARALLEL_MIN;
#pragma omp parallel for if (par) schedule(static)
    for (int64_t r = 0; r < total; r++) {
        int64_t o = r / g->K, k = r - o * g->K;
        copy_bytes(dst + (size_t)r * row, src + (size_t)(o * g->n + ix[k]) * row, row);
    }
}

/* Scatters run as tasks of (outer row, column block): each output element belongs to exactly one
 * task, which visits the indices in order, so duplicates accumulate (or the last write wins)
 * the same way on any number of threads. */
#define SCATTER_BLOCK 256

#define SCATTER_TASKS(g, BODY)                                                               \
    do {                                                                                     \
        int64_t nb_ = ((g)->inner + SCATTER_BLOCK - 1) / SCATTER_BLOCK, tasks_ = (g)->outer * nb_; \
        bool par_ = tasks_ > 1 && (g)->outer * (g)->K * (g)->inner >= KILN_PARALLEL_MIN;     \
        _Pragma("omp parallel for if (par_) schedule(static)")                               \
        for (int64_t t_ = 0; t_ < tasks_; t_++) {                                            \
            int64_t o = t_ / nb_, c0 = (t_ - o * nb_) * SCATTER_BLOCK;                       \
            int64_t c1 = c0 + SCATTER_BLOCK < (g)->inner ? c0 + SCATTER_BLOCK : (g)->inner;  \
            for (int64_t k = 0; k < (g)->K; k++) {                                           \
                int64_t drow = (o * (g)->n + ix[k]) * (g)->inner, srow = (o * (g)->K + k) * (g)->inner; \
                BODY                                                                         \
            }                                                                                \
        }                                                                                    \
    } while (0)

static void scatter_rows_assign(char *dst, const char *src, const int64_t *ix, const rows_geom *g) {
    size_t isz = g->isz;
    SCATTER_TASKS(g, memcpy(dst + (size_t)(drow + c0) * isz, src + (size_t)(srow + c0) * isz, (size_t)(c1 - c0) * isz););
}

/* Integer sums wrap (computed unsigned); bool "sums" are logical or. */
#define ADD_FLOAT(x, y) ((x) + (y))
#define ADD_I8(x, y) ((int8_t)(uint8_t)((uint8_t)(x) + (uint8_t)(y)))
#define ADD_I32(x, y) ((int32_t)((uint32_t)(x) + (uint32_t)(y)))
#define ADD_I64(x, y) ((int64_t)((uint64_t)(x) + (uint64_t)(y)))
#define ADD_BOOL(x, y) ((uint8_t)((x) | (y)))

typedef struct {
    int ndim, axis;
    int64_t ishape[KILN_MAX_DIMS];  /* shape of idx (and of the gathered / scattered values) */
    int64_t xstride[KILN_MAX_DIMS]; /* contiguous strides of x */
    int64_t istride[KILN_MAX_DIMS]; /* contiguous strides of idx */
    int64_t lines;                  /* positions of idx off the axis */
} elems_geom;

static void elems_geom_init(elems_geom *g, const kiln_meta *x, const kiln_meta *idx, int axis) {
    g->ndim = x->ndim;
    g->axis = axis;
    memcpy(g->ishape, idx->shape, sizeof(int64_t) * (size_t)idx->ndim);
    kiln_contiguous_strides(x->ndim, x->shape, g->xstride);
    kiln_contiguous_strides(idx->ndim, idx->shape, g->istride);
    g->lines = 1;
    for (int d = 0; d < idx->ndim; d++)
        if (d != axis) g->lines *= idx->shape[d];
}

/* Offsets in x and idx of the first element of line `line` (a run along the axis). */
static inline void line_bases(const elems_geom *g, int64_t line, int64_t *xb, int64_t *ib) {
    int64_t xo = 0, io = 0;
    for (int d = g->ndim - 1; d >= 0; d--) {
        if (d == g->axis) continue;
        int64_t c = line % g->ishape[d];
        line /= g->ishape[d];
        xo += c * g->xstride[d];
        io += c * g->istride[d];
    }
    *xb = xo, *ib = io;
}

/* Lines have distinct off-axis coordinates, so they never write the same element: one thread
 * per line keeps scatter sums in index order. */
#define ELEMS_LINES(g, BODY)                                                                 \
    do {                                                                                     \
        int64_t len_ = (g)->ishape[(g)->axis], is_ = (g)->istride[(g)->axis], xs_ = (g)->xstride[(g)->axis]; \
        bool par_ = (g)->lines > 1 && (g)->lines * len_ >= KILN_PARALLEL_MIN;                \
        _Pragma("omp parallel for if (par_) schedule(static)")                               \
        for (int64_t l_ = 0; l_ < (g)->lines; l_++) {                                        \
            int64_t xb, ib;                                                                  \
            line_bases((g), l_, &xb, &ib);                                                   \
            for (int64_t j_ = 0; j_ < len_; j_++) {                                          \
                int64_t p = ib + j_ * is_, xp = xb + ix[p] * xs_;                            \
                BODY                                                                         \
            }                                                                                \
        }                                                                                    \
    } while (0)

static void gather_elems(char *dst, const char *src, const int64_t *ix, const elems_geom *g, size_t isz) {
    ELEMS_LINES(g, copy_bytes(dst + (size_t)p * isz, src + (size_t)xp * isz, isz););
}

typedef void (*rows_add_fn)(void *dst, const void *src, const int64_t *ix, const rows_geom *g);
typedef void (*elems_add_fn)(void *dst, const void *src, const int64_t *ix, const elems_geom *g);

#define DEFINE_ADDERS(NAME, T, ADD)                                                          \
    static void rows_add_##NAME(void *dstv, const void *srcv, const int64_t *ix, const rows_geom *g) { \
        T *dst = dstv;                                                                       \
        const T *src = srcv;                                                                 \
        SCATTER_TASKS(g, for (int64_t c = c0; c < c1; c++) dst[drow + c] = ADD(dst[drow + c], src[srow + c]););     \
    }                                                                                        \
    static void elems_add_##NAME(void *dstv, const void *srcv, const int64_t *ix, const elems_geom *g) { \
        T *dst = dstv;                                                                       \
        const T *src = srcv;                                                                 \
        ELEMS_LINES(g, dst[xp] = ADD(dst[xp], src[p]););                                     \
    }
DEFINE_ADDERS(f32, float, ADD_FLOAT)
DEFINE_ADDERS(f64, double, ADD_FLOAT)
DEFINE_ADDERS(i8, int8_t, ADD_I8)
DEFINE_ADDERS(i32, int32_t, ADD_I32)
DEFINE_ADDERS(i64, int64_t, ADD_I64)
DEFINE_ADDERS(bool, uint8_t, ADD_BOOL)

static rows_add_fn rows_add_for(kiln_dtype d) {
    switch (d) {
    case KILN_DTYPE_FLOAT32: return rows_add_f32;
    case KILN_DTYPE_FLOAT64: return rows_add_f64;
    case KILN_DTYPE_INT8: return rows_add_i8;
    case KILN_DTYPE_INT32: return rows_add_i32;
    case KILN_DTYPE_INT64: return rows_add_i64;
    default: return rows_add_bool;
    }
}

static elems_add_fn elems_add_for(kiln_dtype d) {
    switch (d) {
    case KILN_DTYPE_FLOAT32: return elems_add_f32;
    case KILN_DTYPE_FLOAT64: return elems_add_f64;
    case KILN_DTYPE_INT8: return elems_add_i8;
    case KILN_DTYPE_INT32: return elems_add_i32;
    case KILN_DTYPE_INT64: return elems_add_i64;
    default: return elems_add_bool;
    }
}

/* ---- gather ----------------------------------------------------------------------------- */

KILN_INFER(gather) {
    int axis = 0;
    KILN_TRY(check_axis("gather", a, &in[0]->meta, &axis));
    KILN_TRY(check_index("gather", &in[1]->meta));
    return selection_meta("gather", &in[0]->meta, &in[1]->meta, axis, out);
}

KILN_KERNEL(gather) {
    kiln_tensor *x = in[0], *o = out[0];
    int axis = axis_of(a, x->meta.ndim);
    int64_t *ix;
    KILN_TRY(load_indices("gather", in[1], &x->meta, axis, &ix));
    rows_geom g;
    rows_geom_init(&g, &x->meta, axis, in[1]->numel);
    kiln_status s = KILN_OK;
    if (kiln_tensor_is_contiguous(x) || x->numel <= o->numel) {
        kiln_tensor *xc = NULL;
        s = kiln_to_contiguous(x, x->meta.dtype, &xc);
        if (s == KILN_OK) gather_rows(o->data, xc->data, ix, &g);
        kiln_tensor_release(xc);
    } else { /* fewer indices than rows: copy each selected slice straight from x's layout */
        for (int64_t k = 0; k < g.K && s == KILN_OK; k++) {
            kiln_tensor *xv = NULL, *ov = NULL;
            s = drop_axis_view(x, axis, ix[k], &xv);
            if (s == KILN_OK) s = selection_view(o, axis, in[1]->meta.ndim, k, g.inner, &ov);
            if (s == KILN_OK) s = kiln_copy_into(ov, xv);
            kiln_tensor_release(xv);
            kiln_tensor_release(ov);
        }
    }
    free(ix);
    return s;
}

KILN_GRAD(gather) {
    if (!ctx->needs_grad[0] || !gout[0]) return KILN_OK;
    kiln_tensor *zeros;
    KILN_TRY(kiln_emit_full(&ctx->in_meta[0], 0.0, &zeros));
    kiln_tensor *ins[3] = {zeros, ctx->in[1], gout[0]};
    kiln_status s = kiln_apply(KILN_OP_INDEX_ADD, 3, ins, ctx->attrs, &gin[0]);
    kiln_tensor_release(zeros);
    return s;
}

/* ---- index_add -------------------------------------------------------------------------- */

/* Shared by index_add and index_put: `v` (input 2) must broadcast to the selection. */
static kiln_status infer_selection_write(const char *op, kiln_tensor *const *in, const kiln_attrs *a, kiln_meta *out) {
    int axis = 0;
    kiln_meta sel;
    KILN_TRY(check_axis(op, a, &in[0]->meta, &axis));
    KILN_TRY(check_index(op, &in[1]->meta));
    KILN_TRY(selection_meta(op, &in[0]->meta, &in[1]->meta, axis, &sel));
    if (!broadcastable(&in[2]->meta, &sel)) {
        char b1[160], b2[160], b3[160], b4[160];
        return kiln_error(KILN_ERR_VALUE, "%s: values of shape %s do not broadcast to the selection of shape %s "
                          "(tensor of shape %s, indices of shape %s, axis %d)", op,
                          kiln_shape_str(&in[2]->meta, b1, sizeof b1), kiln_shape_str(&sel, b2, sizeof b2),
                          kiln_shape_str(&in[0]->meta, b3, sizeof b3), kiln_shape_str(&in[1]->meta, b4, sizeof b4), axis);
    }
    *out = in[0]->meta;
    return KILN_OK;
}

KILN_INFER(index_add) { return infer_selection_write("index_add", in, a, out); }

KILN_KERNEL(index_add) {
    kiln_tensor *x = in[0], *o = out[0], *acc = NULL, *src = NULL;
    int axis = axis_of(a, x->meta.ndim);
    kiln_meta sel;
    KILN_TRY(selection_meta("index_add", &x->meta, &in[1]->meta, axis, &sel));
    int64_t *ix;
    KILN_TRY(load_indices("index_add", in[1], &x->meta, axis, &ix));
    rows_geom g;
    rows_geom_init(&g, &x->meta, axis, in[1]->numel);
    kiln_dtype cd = compute_dtype(x->meta.dtype);
    kiln_status s = o == x ? KILN_OK : kiln_copy_into(o, x); /* (the same tensor: rows added in place, a loop's) */
    if (s == KILN_OK) s = kiln_to_contiguous(o, cd, &acc);
    if (s == KILN_OK) s = materialize(in[2], cd, &sel, false, &src);
    if (s == KILN_OK) {
        rows_add_for(cd)(acc->data, src->data, ix, &g);
        if (acc != o) s = kiln_copy_into(o, acc);
    }
    kiln_tensor_release(acc);
    kiln_tensor_release(src);
    free(ix);
    return s;
}

KILN_GRAD(index_add) {
    if (!gout[0]) return KILN_OK;
    if (ctx->needs_grad[0]) {
        kiln_tensor_retain(gout[0]);
        gin[0] = gout[0];
    }
    if (ctx->needs_grad[2]) {
        kiln_tensor *picked, *ins[2] = {gout[0], ctx->in[1]};
        KILN_TRY(kiln_apply(KILN_OP_GATHER, 2, ins, ctx->attrs, &picked));
        kiln_status s = kiln_emit_sum_to(picked, &ctx->in_meta[2], &gin[2]);
        kiln_tensor_release(picked);
        return s;
    }
    return KILN_OK;
}

/* ---- index_put (in place) --------------------------------------------------------------- */

KILN_INFER(index_put) { return infer_selection_write("index_put", in, a, out); }

KILN_KERNEL(index_put) {
    kiln_tensor *x = in[0], *vals = NULL;
    KILN_TRY(kiln_check_writable("index assignment", "the tensor", x));
    int axis = axis_of(a, x->meta.ndim);
    kiln_meta sel;
    KILN_TRY(selection_meta("index_put", &x->meta, &in[1]->meta, axis, &sel));
    int64_t *ix;
    KILN_TRY(load_indices("index_put", in[1], &x->meta, axis, &ix));
    rows_geom g;
    rows_geom_init(&g, &x->meta, axis, in[1]->numel);
    /* values that alias x are copied before x changes */
    kiln_status s = materialize(in[2], x->meta.dtype, &sel, kiln_tensor_same_storage(in[2], x), &vals);
    if (s == KILN_OK && kiln_tensor_is_contiguous(x)) {
        scatter_rows_assign(x->data, vals->data, ix, &g);
    } else { /* in index order, so the last of duplicate indices wins as in the fast path */
        for (int64_t k = 0; k < g.K && s == KILN_OK; k++) {
            kiln_tensor *xv = NULL, *vv = NULL;
            s = drop_axis_view(x, axis, ix[k], &xv);
            if (s == KILN_OK) s = selection_view(vals, axis, in[1]->meta.ndim, k, g.inner, &vv);
            if (s == KILN_OK) s = kiln_copy_into(xv, vv);
            kiln_tensor_release(xv);
            kiln_tensor_release(vv);
        }
    }
    kiln_tensor_release(vals);
    free(ix);
    if (s != KILN_OK) return s;
    kiln_tensor_retain(x);
    out[0] = x;
    return KILN_OK;
}

KILN_GRAD(index_put) {
    if (!gout[0]) return KILN_OK;
    kiln_status s = KILN_OK;
    if (ctx->needs_grad[0]) { /* the overwritten positions get no gradient */
        kiln_tensor *zero, *copy;
        KILN_TRY(kiln_emit_scalar(0.0, gout[0]->meta.dtype, &zero));
        s = kiln_emit_unary(KILN_OP_CONTIGUOUS, gout[0], &copy);
        if (s == KILN_OK) {
            kiln_tensor *ins[3] = {copy, ctx->in[1], zero};
            s = kiln_apply(KILN_OP_INDEX_PUT, 3, ins, ctx->attrs, &gin[0]);
            kiln_tensor_release(copy);
        }
        kiln_tensor_release(zero);
    }
    if (s == KILN_OK && ctx->needs_grad[2]) {
        kiln_tensor *picked, *ins[2] = {gout[0], ctx->in[1]};
        KILN_TRY(kiln_apply(KILN_OP_GATHER, 2, ins, ctx->attrs, &picked));
        s = kiln_emit_sum_to(picked, &ctx->in_meta[2], &gin[2]);
        kiln_tensor_release(picked);
    }
    return s;
}

/* ---- gather_elements -------------------------------------------------------------------- */

KILN_INFER(gather_elements) {
    int axis = 0;
    KILN_TRY(check_axis("gather_elements", a, &in[0]->meta, &axis));
    KILN_TRY(check_elements_index("gather_elements", &in[0]->meta, &in[1]->meta, axis));
    *out = in[1]->meta;
    out->dtype = in[0]->meta.dtype;
    return KILN_OK;
}

KILN_KERNEL(gather_elements) {
    kiln_tensor *x = in[0], *xc = NULL;
    int axis = axis_of(a, x->meta.ndim);
    int64_t *ix;
    KILN_TRY(load_indices("gather_elements", in[1], &x->meta, axis, &ix));
    kiln_status s = kiln_to_contiguous(x, x->meta.dtype, &xc);
    if (s == KILN_OK) {
        elems_geom g;
        elems_geom_init(&g, &x->meta, &in[1]->meta, axis);
        gather_elems(out[0]->data, xc->data, ix, &g, kiln_dtype_size(x->meta.dtype));
        kiln_tensor_release(xc);
    }
    free(ix);
    return s;
}

KILN_GRAD(gather_elements) {
    if (!ctx->needs_grad[0] || !gout[0]) return KILN_OK;
    kiln_tensor *zeros;
    KILN_TRY(kiln_emit_full(&ctx->in_meta[0], 0.0, &zeros));
    kiln_tensor *ins[3] = {zeros, ctx->in[1], gout[0]};
    kiln_status s = kiln_apply(KILN_OP_SCATTER_ADD_ELEMENTS, 3, ins, ctx->attrs, &gin[0]);
    kiln_tensor_release(zeros);
    return s;
}

/* ---- scatter_add_elements --------------------------------------------------------------- */

KILN_INFER(scatter_add_elements) {
    int axis = 0;
    const char *op = "scatter_add_elements";
    KILN_TRY(check_axis(op, a, &in[0]->meta, &axis));
    KILN_TRY(check_elements_index(op, &in[0]->meta, &in[1]->meta, axis));
    if (!kiln_shape_equal(&in[2]->meta, in[1]->meta.ndim, in[1]->meta.shape)) {
        char b1[160], b2[160];
        return kiln_error(KILN_ERR_VALUE, "%s: source of shape %s must have the shape of the indices %s", op,
                          kiln_shape_str(&in[2]->meta, b1, sizeof b1), kiln_shape_str(&in[1]->meta, b2, sizeof b2));
    }
    *out = in[0]->meta;
    return KILN_OK;
}

KILN_KERNEL(scatter_add_elements) {
    kiln_tensor *x = in[0], *o = out[0], *acc = NULL, *src = NULL;
    int axis = axis_of(a, x->meta.ndim);
    int64_t *ix;
    KILN_TRY(load_indices("scatter_add_elements", in[1], &x->meta, axis, &ix));
    kiln_dtype cd = compute_dtype(x->meta.dtype);
    kiln_status s = kiln_copy_into(o, x);
    if (s == KILN_OK) s = kiln_to_contiguous(o, cd, &acc);
    if (s == KILN_OK) s = kiln_to_contiguous(in[2], cd, &src);
    if (s == KILN_OK) {
        elems_geom g;
        elems_geom_init(&g, &x->meta, &in[1]->meta, axis);
        elems_add_for(cd)(acc->data, src->data, ix, &g);
        if (acc != o) s = kiln_copy_into(o, acc);
    }
    kiln_tensor_release(acc);
    kiln_tensor_release(src);
    free(ix);
    return s;
}

KILN_GRAD(scatter_add_elements) {
    if (!gout[0]) return KILN_OK;
    if (ctx->needs_grad[0]) {
        kiln_tensor_retain(gout[0]);
        gin[0] = gout[0];
    }
    if (ctx->needs_grad[2]) {
        kiln_tensor *ins[2] = {gout[0], ctx->in[1]};
        return kiln_apply(KILN_OP_GATHER_ELEMENTS, 2, ins, ctx->attrs, &gin[2]);
    }
    return KILN_OK;
}

/* ---- class_labels ----------------------------------------------------------------------- */

KILN_INFER(class_labels) {
    (void)nin;
    KILN_TRY(kiln_attrs_expect("class_labels", a, 2, 0));
    if (in[0]->meta.dtype != KILN_DTYPE_INT32 && in[0]->meta.dtype != KILN_DTYPE_INT64)
        return kiln_error(KILN_ERR_TYPE, "class_labels: labels must be int32 or int64, got %s",
                          kiln_dtype_name(in[0]->meta.dtype));
    if (a->i[0] < 1)
        return kiln_error(KILN_ERR_VALUE, "class_labels: the class count must be positive, got %lld",
                          (long long)a->i[0]);
    *out = in[0]->meta;
    return KILN_OK;
}

KILN_KERNEL(class_labels) {
    (void)nin;
    kiln_tensor *c, *o = out[0];
    KILN_TRY(kiln_to_contiguous(in[0], in[0]->meta.dtype, &c));
    int64_t K = c->numel, classes = a->i[0], ignore = a->i[1], bad = K;
    bool i32 = c->meta.dtype == KILN_DTYPE_INT32;
    const int32_t *p32 = c->data;
    const int64_t *p64 = c->data;
    kiln_tensor *r = o;
    kiln_status s = kiln_tensor_is_contiguous(o) ? KILN_OK : kiln_tensor_empty(o->meta.dtype, o->meta.ndim, o->meta.shape, &r);
    if (s == KILN_OK) {
        int32_t *q32 = r->data;
        int64_t *q64 = r->data;
#pragma omp parallel for if (K >= KILN_PARALLEL_MIN) reduction(min : bad) schedule(static)
        for (int64_t k = 0; k < K; k++) {
            int64_t v = i32 ? p32[k] : p64[k];
            if (v == ignore) v = 0;
            else if (v < 0 || v >= classes) bad = k < bad ? k : bad, v = 0;
            if (i32) q32[k] = (int32_t)v;
            else q64[k] = v;
        }
        if (bad < K)
            s = kiln_error(KILN_ERR_INDEX, "class_labels: label %lld is out of range for %lld classes (expected 0 to %lld, or "
                           "ignore_index %lld)", (long long)(i32 ? p32[bad] : p64[bad]), (long long)classes,
                           (long long)classes - 1, (long long)ignore);
        else if (r != o)
            s = kiln_copy_into(o, r);
    }
    if (r != o) kiln_tensor_release(r);
    kiln_tensor_release(c);
    return s;
}
