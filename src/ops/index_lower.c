/* NumPy-style indexing lowered to ops (see index_lower.h). A key becomes one SLICE (a view) of
 * the tensor, a RESHAPE that drops integer-indexed axes and inserts None axes, and, for index
 * tensors, a GATHER (reads) or INDEX_PUT (writes) on that view. Several index tensors are
 * combined into one index over their merged axes. */
#include "../core/hooks.h"
#include "../core/internal.h"

#include "index_lower.h"

#define MAX_VIEW_DIMS 64 /* axes of x[key] before the ops check it (None adds axes) */

typedef struct {
    kiln_attrs slice;                   /* starts, steps, lengths: the slice op's attrs */
    int ndim;                           /* of x: the slice's shape is its LENGTH ints (slice_shape) */
    int view_ndim;
    int64_t view_shape[MAX_VIEW_DIMS];  /* x[key] before gathering */
    int narrays;
    int axes[MAX_VIEW_DIMS];            /* axis of the view each index tensor indexes */
    kiln_tensor *arrays[MAX_VIEW_DIMS]; /* owned */
} lowered;

static void lowered_free(lowered *l) { kiln_release_all(l->arrays, l->narrays); }

static const int64_t *slice_shape(const lowered *l) { return &l->slice.i[KILN_A_SLICE_LENGTH]; }

/* Axes of x an item consumes. */
static int consumed(const kiln_index_item *k) {
    if (k->kind == KILN_INDEX_NEWAXIS || k->kind == KILN_INDEX_ELLIPSIS) return 0;
    if (k->kind == KILN_INDEX_TENSOR && k->tensor->meta.dtype == KILN_DTYPE_BOOL && k->tensor->meta.ndim > 1)
        return k->tensor->meta.ndim;
    return 1;
}

/* The length of start:stop:step over an axis of `size`, with start normalized (Python's
 * PySlice_AdjustIndices). */
static int64_t adjust_slice(int64_t *start, int64_t stop, int64_t step, int64_t size) {
    if (*start < 0) {
        *start = *start == KILN_INDEX_OPEN_LOW ? (step < 0 ? -1 : 0) : *start + size;
        if (*start < 0) *start = step < 0 ? -1 : 0;
    } else if (*start >= size) {
        *start = step < 0 ? size - 1 : size;
    }
    if (stop < 0) {
        stop = stop == KILN_INDEX_OPEN_LOW ? (step < 0 ? -1 : 0) : stop + size;
        if (stop < 0) stop = step < 0 ? -1 : 0;
    } else if (stop >= size) {
        stop = step < 0 ? size - 1 : size;
    }
    if (step < 0) return stop < *start ? (*start - stop - 1) / (-step) + 1 : 0;
    return *start < stop ? (stop - *start - 1) / step + 1 : 0;
}

static kiln_status add_view_axis(lowered *l, int64_t n) {
    if (l->view_ndim == MAX_VIEW_DIMS)
        return kiln_error(KILN_ERR_INDEX, "index: too many axes in the result (more than %d)", MAX_VIEW_DIMS);
    l->view_shape[l->view_ndim++] = n;
    return KILN_OK;
}

static kiln_status add_array(lowered *l, kiln_tensor *t, const kiln_tensor *x, int *dim) {
    l->slice.i[KILN_A_SLICE_LENGTH + *dim] = x->meta.shape[*dim];
    l->axes[l->narrays] = l->view_ndim;
    l->arrays[l->narrays++] = t;
    return add_view_axis(l, x->meta.shape[(*dim)++]);
}

/* A bool mask over the axes of x from *dim: one int64 index per axis (its nonzero positions). */
static kiln_status add_mask(lowered *l, const kiln_tensor *mask, const kiln_tensor *x, int *dim,
                            kiln_value_read_fn note_read) {
    int nd = mask->meta.ndim;
    bool match = nd > 0 && *dim + nd <= x->meta.ndim;
    for (int d = 0; match && d < nd; d++) match = mask->meta.shape[d] == x->meta.shape[*dim + d];
    if (!match) {
        kiln_meta covered = {.dtype = x->meta.dtype, .ndim = 0};
        for (int d = *dim; d < x->meta.ndim && d < *dim + nd; d++) covered.shape[covered.ndim++] = x->meta.shape[d];
        char a[160], b[160], c[160];
        return kiln_error(KILN_ERR_INDEX,
                          "index: a boolean mask of shape %s does not match the indexed axes %s of a tensor of shape %s",
                          kiln_shape_str(&mask->meta, a, sizeof a), kiln_shape_str(&covered, b, sizeof b),
                          kiln_shape_str(&x->meta, c, sizeof c));
    }
    if (note_read) note_read(mask);
    kiln_tensor *dense = (kiln_tensor *)mask;
    if (!kiln_tensor_is_contiguous(mask)) {
        KILN_TRY(kiln_tensor_empty(KILN_DTYPE_BOOL, nd, mask->meta.shape, &dense));
        kiln_status s = kiln_copy_into(dense, mask);
        if (s != KILN_OK) {
            kiln_tensor_release(dense);
            return s;
        }
    } else {
        kiln_tensor_retain(dense);
    }
    const uint8_t *m = dense->data;
    int64_t count = 0;
    for (int64_t i = 0; i < dense->numel; i++) count += m[i] != 0;
    kiln_tensor *idx[KILN_MAX_DIMS] = {0};
    kiln_status s = KILN_OK;
    for (int d = 0; d < nd && s == KILN_OK; d++) s = kiln_tensor_empty(KILN_DTYPE_INT64, 1, &count, &idx[d]);
    if (s == KILN_OK) {
        int64_t at = 0, pos[KILN_MAX_DIMS] = {0};
        for (int64_t i = 0; i < dense->numel; i++) {
            if (m[i])
                for (int d = 0; d < nd; d++) ((int64_t *)idx[d]->data)[at] = pos[d];
            at += m[i] != 0;
            for (int d = nd - 1; d >= 0 && ++pos[d] == mask->meta.shape[d]; d--) pos[d] = 0;
        }
    }
    kiln_tensor_release(dense);
    for (int d = 0; d < nd; d++) {
        if (s == KILN_OK) s = add_array(l, idx[d], x, dim);
        else kiln_tensor_release(idx[d]);
        idx[d] = NULL;
    }
    return s;
}

/* The slice attrs, view shape and index tensors of x[items]. */
static kiln_status parse(const kiln_tensor *x, int n, const kiln_index_item *items, kiln_value_read_fn note_read,
                         lowered *l) {
    int ndim = x->meta.ndim, ellipses = 0, used = 0;
    memset(l, 0, sizeof *l);
    l->ndim = ndim;
    l->slice.ni = 3 * KILN_MAX_DIMS;
    for (int d = 0; d < KILN_MAX_DIMS; d++) l->slice.i[KILN_A_SLICE_STEP + d] = 1;
    for (int k = 0; k < n; k++) {
        ellipses += items[k].kind == KILN_INDEX_ELLIPSIS;
        used += consumed(&items[k]);
    }
    if (ellipses > 1) return kiln_error(KILN_ERR_INDEX, "index: an index can only have a single ellipsis (...)");
    if (used > ndim) {
        char buf[160];
        return kiln_error(KILN_ERR_INDEX, "index: too many indices for a tensor of shape %s: %d given",
                          kiln_shape_str(&x->meta, buf, sizeof buf), used);
    }
    static const kiln_index_item full = {KILN_INDEX_SLICE, KILN_INDEX_OPEN_LOW, KILN_INDEX_OPEN_HIGH, 1, NULL};
    int dim = 0, fill = ndim - used; /* full slices for the ellipsis, or after the last item */
    for (int k = 0; k <= n; k++) {
        const kiln_index_item *item = k < n ? &items[k] : &full;
        int repeat = 1;
        if (k == n || item->kind == KILN_INDEX_ELLIPSIS) {
            item = &full;
            repeat = fill;
            fill = 0;
        }
        for (int r = 0; r < repeat; r++) {
            switch (item->kind) {
            case KILN_INDEX_NEWAXIS:
                KILN_TRY(add_view_axis(l, 1));
                break;
            case KILN_INDEX_SLICE: {
                int64_t start = item->start, len = adjust_slice(&start, item->stop, item->step, x->meta.shape[dim]);
                l->slice.i[KILN_A_SLICE_START + dim] = len ? start : 0;
                l->slice.i[KILN_A_SLICE_STEP + dim] = item->step;
                l->slice.i[KILN_A_SLICE_LENGTH + dim] = len;
                KILN_TRY(add_view_axis(l, len));
                dim++;
                break;
            }
            case KILN_INDEX_TENSOR: {
                kiln_tensor *t = item->tensor;
                if (t->meta.dtype == KILN_DTYPE_BOOL) {
                    KILN_TRY(add_mask(l, t, x, &dim, note_read));
                } else if (t->meta.dtype == KILN_DTYPE_INT32 || t->meta.dtype == KILN_DTYPE_INT64 ||
                           t->meta.dtype == KILN_DTYPE_INT8) {
                    kiln_tensor_retain(t);
                    KILN_TRY(add_array(l, t, x, &dim));
                } else {
                    return kiln_error(KILN_ERR_INDEX, "index: tensors used as indices must be integer or bool, got kiln.%s",
                                      kiln_dtype_name(t->meta.dtype));
                }
                break;
            }
            case KILN_INDEX_INT: {
                int64_t i = item->start, size = x->meta.shape[dim];
                if (i < -size || i >= size)
                    return kiln_error(KILN_ERR_INDEX, "index %lld is out of bounds for axis %d with size %lld",
                                      (long long)i, dim, (long long)size);
                l->slice.i[KILN_A_SLICE_START + dim] = i < 0 ? i + size : i;
                l->slice.i[KILN_A_SLICE_LENGTH + dim] = 1;
                dim++;
                break;
            }
            case KILN_INDEX_ELLIPSIS:
                break;
            }
        }
    }
    return KILN_OK;
}

/* ---- emitting ------------------------------------------------------------------------------ */

static bool same_shape(int na, const int64_t *a, int nb, const int64_t *b) {
    if (na != nb) return false;
    for (int d = 0; d < na; d++)
        if (a[d] != b[d]) return false;
    return true;
}

static kiln_status apply_axis(kiln_op op, int nin, kiln_tensor **in, int64_t axis, kiln_tensor **out) {
    kiln_attrs a;
    kiln_attrs_clear(&a);
    kiln_attrs_push_int(&a, axis);
    return kiln_apply(op, nin, in, &a, out);
}

/* The slice of x, reshaped to the view's shape when ints or None change it. New reference. */
static kiln_status view_of(kiln_tensor *x, const lowered *l, kiln_tensor **out) {
    kiln_tensor *v = NULL;
    KILN_TRY(kiln_apply(KILN_OP_SLICE, 1, &x, &l->slice, &v));
    if (same_shape(l->ndim, slice_shape(l), l->view_ndim, l->view_shape)) {
        *out = v;
        return KILN_OK;
    }
    kiln_status s = l->view_ndim > KILN_MAX_ATTR_INTS
                        ? kiln_error(KILN_ERR_VALUE, "reshape: %d axes is too many", l->view_ndim)
                        : kiln_emit_reshape(v, l->view_ndim, l->view_shape, out);
    kiln_tensor_release(v);
    return s;
}

/* A Python integer next to an int64 tensor (a literal: a constant when traced). */
static kiln_status literal(int64_t value, kiln_tensor **out) {
    KILN_TRY(kiln_tensor_empty(KILN_DTYPE_INT64, 0, NULL, out));
    *(int64_t *)(*out)->data = value;
    (*out)->literal = true;
    return KILN_OK;
}

/* op(a, <literal value>). */
static kiln_status with_literal(kiln_op op, kiln_tensor *a, int64_t value, kiln_tensor **out) {
    kiln_tensor *c = NULL;
    KILN_TRY(literal(value, &c));
    kiln_status s = kiln_emit_binary(op, a, c, out);
    kiln_tensor_release(c);
    return s;
}

/* One index tensor of the view's axis `axis` (length n), bounds-checked, negatives wrapped.
 * Eagerly the check reads whether any index is out of range and names the axis. While a trace
 * records, reading it would fix the answer into the graph (and send the capture eager), so an
 * out-of-range index becomes `total` (the size of all the merged axes) instead: the merged index
 * is then >= total, which the gather or index_put it feeds refuses when the graph runs. */
static kiln_status wrapped_part(kiln_tensor *idx, int axis, int64_t n, int64_t total, kiln_value_read_fn note_read,
                                kiln_tensor **out) {
    kiln_tensor *t[10] = {0}; /* part, lo, hi, bad, any, neg, shifted, wrapped, sentinel */
    bool in_graph = kiln_thread.trace_active != NULL && total <= (INT64_MAX / 2) / (total ? total : 1);
    kiln_status s = KILN_OK;
    if (idx->meta.dtype == KILN_DTYPE_INT64) kiln_tensor_retain(t[0] = idx);
    else s = kiln_emit_cast(idx, KILN_DTYPE_INT64, &t[0]);
    if (s == KILN_OK) s = with_literal(KILN_OP_LT, t[0], -n, &t[1]);
    if (s == KILN_OK) s = with_literal(KILN_OP_GE, t[0], n, &t[2]);
    if (s == KILN_OK) s = kiln_emit_binary(KILN_OP_LOGICAL_OR, t[1], t[2], &t[3]);
    if (s == KILN_OK && !in_graph) {
        int nd = t[3]->meta.ndim;
        s = kiln_emit_reduce(KILN_OP_MAX, t[3], nd ? (1ull << nd) - 1 : 0, false, &t[4]);
        if (s == KILN_OK) {
            if (note_read) note_read(t[4]);
            if (kiln_tensor_get_double(t[4], 0) != 0)
                s = kiln_error(KILN_ERR_INDEX, "index: an index is out of bounds for axis %d with size %lld", axis,
                               (long long)n);
        }
    }
    if (s == KILN_OK) s = with_literal(KILN_OP_LT, t[0], 0, &t[5]);
    if (s == KILN_OK) s = with_literal(KILN_OP_ADD, t[0], n, &t[6]);
    kiln_tensor **wrapped = in_graph ? &t[7] : out;
    if (s == KILN_OK) {
        kiln_tensor *in[3] = {t[5], t[6], t[0]};
        s = kiln_apply(KILN_OP_WHERE, 3, in, NULL, wrapped);
    }
    if (s == KILN_OK && in_graph) s = literal(total, &t[8]);
    if (s == KILN_OK && in_graph) {
        kiln_tensor *in[3] = {t[3], t[8], t[7]};
        s = kiln_apply(KILN_OP_WHERE, 3, in, NULL, out);
    }
    kiln_release_all(t, 10);
    return s;
}

/* One int64 index over the merged (adjacent or moved-together) axes of several index tensors:
 * the last axis varies fastest. */
static kiln_status merged_index(const lowered *l, kiln_value_read_fn note_read, kiln_tensor **out) {
    kiln_tensor *index = NULL;
    int64_t stride = 1, total = 1;
    kiln_status s = KILN_OK;
    for (int k = 0; k < l->narrays; k++) total *= l->view_shape[l->axes[k]];
    for (int k = l->narrays - 1; k >= 0 && s == KILN_OK; k--) {
        int64_t n = l->view_shape[l->axes[k]];
        kiln_tensor *part = NULL, *scaled = NULL, *sum = NULL;
        s = wrapped_part(l->arrays[k], l->axes[k], n, total, note_read, &part);
        if (s == KILN_OK) s = with_literal(KILN_OP_MUL, part, stride, &scaled);
        if (s == KILN_OK && index) {
            s = kiln_emit_binary(KILN_OP_ADD, index, scaled, &sum);
            kiln_tensor_release(scaled);
            scaled = sum;
        }
        kiln_tensor_release(part);
        kiln_tensor_release(index);
        index = s == KILN_OK ? scaled : NULL;
        stride *= n;
    }
    *out = index;
    return s;
}

/* v with its axes a..b merged into one (a view when v's layout allows). New reference. */
static kiln_status merge_axes(kiln_tensor *v, int a, int b, kiln_tensor **out) {
    int64_t shape[KILN_MAX_DIMS], n = 1;
    int nd = 0;
    for (int d = 0; d < a; d++) shape[nd++] = v->meta.shape[d];
    for (int d = a; d <= b; d++) n *= v->meta.shape[d];
    shape[nd++] = n;
    for (int d = b + 1; d < v->meta.ndim; d++) shape[nd++] = v->meta.shape[d];
    return kiln_emit_reshape(v, nd, shape, out);
}

static bool adjacent(const lowered *l) {
    for (int k = 1; k < l->narrays; k++)
        if (l->axes[k] != l->axes[0] + k) return false;
    return true;
}

static kiln_status get_lowered(kiln_tensor *x, lowered *l, kiln_value_read_fn note_read, kiln_tensor **out) {
    kiln_tensor *v = NULL, *index = NULL, *moved = NULL, *merged = NULL;
    KILN_TRY(view_of(x, l, &v));
    kiln_status s = KILN_OK;
    if (l->narrays == 0) {
        *out = v;
        return KILN_OK;
    }
    if (l->narrays == 1) {
        kiln_tensor *in[2] = {v, l->arrays[0]};
        s = apply_axis(KILN_OP_GATHER, 2, in, l->axes[0], out);
    } else {
        s = merged_index(l, note_read, &index);
        if (s == KILN_OK && adjacent(l)) {
            s = merge_axes(v, l->axes[0], l->axes[l->narrays - 1], &merged);
            kiln_tensor *in[2] = {merged, index};
            if (s == KILN_OK) s = apply_axis(KILN_OP_GATHER, 2, in, l->axes[0], out);
        } else if (s == KILN_OK) { /* apart: NumPy puts the indexed axes first */
            int64_t perm[KILN_MAX_DIMS];
            int np = 0;
            for (int k = 0; k < l->narrays; k++) perm[np++] = l->axes[k];
            for (int d = 0; d < v->meta.ndim; d++) {
                bool indexed = false;
                for (int k = 0; k < l->narrays; k++) indexed |= l->axes[k] == d;
                if (!indexed) perm[np++] = d;
            }
            s = kiln_emit_permute(v, perm, &moved);
            if (s == KILN_OK) s = merge_axes(moved, 0, l->narrays - 1, &merged);
            kiln_tensor *in[2] = {merged, index};
            if (s == KILN_OK) s = apply_axis(KILN_OP_GATHER, 2, in, 0, out);
        }
    }
    kiln_tensor_release(v), kiln_tensor_release(index), kiln_tensor_release(moved), kiln_tensor_release(merged);
    return s;
}

kiln_status kiln_index_get(kiln_tensor *x, int n, const kiln_index_item *items, kiln_value_read_fn note_read,
                           kiln_tensor **out) {
    lowered l;
    *out = NULL;
    kiln_status s = parse(x, n, items, note_read, &l);
    if (s == KILN_OK) s = get_lowered(x, &l, note_read, out);
    lowered_free(&l);
    return s;
}

/* x[slice] = value without index tensors: value broadcasts to the view's shape, then takes the
 * slice's (which keeps 1s where ints index). */
static kiln_status set_view(kiln_tensor *x, const lowered *l, kiln_tensor *value) {
    kiln_tensor *expanded = NULL, *reshaped = NULL, *done = NULL;
    kiln_status s = KILN_OK;
    const int64_t *ss = slice_shape(l);
    if (!same_shape(value->meta.ndim, value->meta.shape, l->view_ndim, l->view_shape) &&
        value->meta.ndim <= l->view_ndim) {
        s = l->view_ndim > KILN_MAX_ATTR_INTS ? kiln_error(KILN_ERR_VALUE, "expand: %d axes is too many", l->view_ndim)
                                             : kiln_emit_expand(value, l->view_ndim, l->view_shape, &expanded);
        value = expanded;
    }
    if (s == KILN_OK && !same_shape(value->meta.ndim, value->meta.shape, l->ndim, ss) &&
        value->numel == kiln_shape_numel(l->ndim, ss)) {
        s = kiln_emit_reshape(value, l->ndim, ss, &reshaped);
        value = reshaped;
    }
    kiln_tensor *in[2] = {x, value};
    if (s == KILN_OK) s = kiln_apply(KILN_OP_SLICE_ASSIGN, 2, in, &l->slice, &done);
    kiln_tensor_release(expanded), kiln_tensor_release(reshaped), kiln_tensor_release(done);
    return s;
}

static kiln_status set_lowered(kiln_tensor *x, const lowered *l, kiln_tensor *value, kiln_value_read_fn note_read) {
    if (l->narrays == 0) return set_view(x, l, value);
    const int64_t *ss = slice_shape(l);
    bool whole = same_shape(l->ndim, ss, x->meta.ndim, x->meta.shape) &&
                 same_shape(l->view_ndim, l->view_shape, x->meta.ndim, x->meta.shape);
    for (int d = 0; whole && d < l->ndim; d++)
        whole = l->slice.i[KILN_A_SLICE_START + d] == 0 && l->slice.i[KILN_A_SLICE_STEP + d] == 1;
    kiln_tensor *target = NULL, *index = NULL, *merged = NULL, *work = NULL, *back = NULL, *done = NULL;
    kiln_status s = KILN_OK;
    if (whole) kiln_tensor_retain(target = x);
    else s = view_of(x, l, &target);
    if (s == KILN_OK && l->narrays == 1) {
        kiln_tensor *in[3] = {target, l->arrays[0], value};
        s = apply_axis(KILN_OP_INDEX_PUT, 3, in, l->axes[0], &done);
    } else if (s == KILN_OK) {
        int a = l->axes[0], b = l->axes[l->narrays - 1];
        if (!adjacent(l))
            s = kiln_error(KILN_ERR_INDEX, "index assignment: several index tensors must index adjacent axes");
        if (s == KILN_OK) s = merged_index(l, note_read, &index);
        if (s == KILN_OK) s = merge_axes(target, a, b, &merged);
        if (s == KILN_OK && kiln_tensor_same_storage(merged, x)) {
            kiln_tensor *in[3] = {merged, index, value};
            s = apply_axis(KILN_OP_INDEX_PUT, 3, in, a, &done);
        } else if (s == KILN_OK) {
            /* the layout does not allow merging the axes in place: write into a copy, then copy it back */
            kiln_tensor_release(merged);
            merged = NULL;
            s = kiln_apply(KILN_OP_CONTIGUOUS, 1, &target, NULL, &work);
            if (s == KILN_OK) s = merge_axes(work, a, b, &merged);
            kiln_tensor *in[3] = {merged, index, value};
            if (s == KILN_OK) s = apply_axis(KILN_OP_INDEX_PUT, 3, in, a, &done);
            kiln_tensor_release(done);
            done = NULL;
            if (s == KILN_OK) s = kiln_emit_reshape(work, l->ndim, ss, &back);
            kiln_tensor *in2[2] = {x, back};
            if (s == KILN_OK) s = kiln_apply(KILN_OP_SLICE_ASSIGN, 2, in2, &l->slice, &done);
        }
    }
    kiln_tensor_release(target), kiln_tensor_release(index), kiln_tensor_release(merged);
    kiln_tensor_release(work), kiln_tensor_release(back), kiln_tensor_release(done);
    return s;
}

kiln_status kiln_index_set(kiln_tensor *x, int n, const kiln_index_item *items, kiln_tensor *value,
                           kiln_value_read_fn note_read) {
    lowered l;
    kiln_status s = parse(x, n, items, note_read, &l);
    if (s == KILN_OK) s = set_lowered(x, &l, value, note_read);
    lowered_free(&l);
    return s;
}
