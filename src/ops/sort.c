/* sort(x) -> (values, indices int64) along one axis (ops.def: i[0] = axis, i[1] = descending):
 * a stable merge sort of each line's positions by its values, read into a contiguous copy in
 * double (floats: exact) or int64 (integers, bool). NaN is greater than every number: last
 * ascending, first descending, as NumPy's and PyTorch's sorts. */
#include "lines.h"

KILN_INFER(sort) {
    KILN_TRY(kiln_lines_check("sort", "descending", &in[0]->meta, a));
    out[0] = in[0]->meta;
    out[1] = in[0]->meta;
    out[1].dtype = KILN_DTYPE_INT64;
    return KILN_OK;
}

/* Whether a goes strictly before b (NaN counted as the largest value; never for integers). */
#define GOES_BEFORE(a, b, desc) ((desc) ? ((a) > (b) || ((a) != (a) && (b) == (b))) \
                                        : ((a) < (b) || ((b) != (b) && (a) == (a))))

/* One line: key[0..n) (its values, in order), idx: the sorted positions, tmp: n scratch. Bottom-up
 * merge sort: runs of width w merged pairwise, the left element taken on ties (stable). */
#define SORT_LINE(NAME, T)                                                                   \
    static void NAME(const T *key, int64_t *idx, int64_t *tmp, int64_t n, bool desc) {       \
        for (int64_t k = 0; k < n; k++) idx[k] = k;                                          \
        for (int64_t w = 1; w < n; w *= 2) {                                                 \
            for (int64_t lo = 0; lo < n; lo += 2 * w) {                                      \
                int64_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n; \
                int64_t i = lo, j = mid, o = lo;                                             \
                while (i < mid && j < hi)                                                    \
                    tmp[o++] = GOES_BEFORE(key[idx[j]], key[idx[i]], desc) ? idx[j++] : idx[i++]; \
                while (i < mid) tmp[o++] = idx[i++];                                         \
                while (j < hi) tmp[o++] = idx[j++];                                          \
            }                                                                                \
            for (int64_t k = 0; k < n; k++) idx[k] = tmp[k];                                 \
        }                                                                                    \
    }
SORT_LINE(sort_line_double, double)
SORT_LINE(sort_line_int64, int64_t)

/* Every line of src (contiguous, T) sorted: vals and pos (contiguous) get the values and positions. */
#define SORT_LINES(NAME, T, LINE)                                                            \
    static kiln_status NAME(const T *src, T *vals, int64_t *pos, kiln_lines l, bool desc) {  \
        T *key = kiln_malloc(sizeof(T) * (size_t)l.n);                           \
        int64_t *idx = kiln_malloc(sizeof(int64_t) * (size_t)l.n);               \
        int64_t *tmp = kiln_malloc(sizeof(int64_t) * (size_t)l.n);               \
        kiln_status s = key && idx && tmp ? KILN_OK : KILN_ERR_MEMORY;                          \
        for (int64_t o = 0; o < l.outer && s == KILN_OK; o++)                                \
            for (int64_t i = 0; i < l.inner; i++) {                                          \
                int64_t base = o * l.n * l.inner + i;                                        \
                for (int64_t k = 0; k < l.n; k++) key[k] = src[base + k * l.inner];          \
                LINE(key, idx, tmp, l.n, desc);                                              \
                for (int64_t k = 0; k < l.n; k++) {                                          \
                    vals[base + k * l.inner] = key[idx[k]];                                  \
                    pos[base + k * l.inner] = idx[k];                                        \
                }                                                                            \
            }                                                                                \
        free(key);                                                                           \
        free(idx);                                                                           \
        free(tmp);                                                                           \
        return s;                                                                            \
    }
SORT_LINES(sort_double, double, sort_line_double)
SORT_LINES(sort_int64, int64_t, sort_line_int64)

KILN_KERNEL(sort) {
    kiln_tensor *x = in[0];
    bool floating = kiln_dtype_is_float(x->meta.dtype);
    kiln_dtype kd = floating ? KILN_DTYPE_FLOAT64 : KILN_DTYPE_INT64;
    kiln_tensor *src = NULL, *vals = NULL, *pos = NULL;
    KILN_TRY(kiln_to_contiguous(x, kd, &src));
    kiln_status s = kiln_tensor_empty(kd, x->meta.ndim, x->meta.shape, &vals);
    if (s == KILN_OK) s = kiln_tensor_empty(KILN_DTYPE_INT64, x->meta.ndim, x->meta.shape, &pos);
    if (s == KILN_OK) {
        kiln_lines l = kiln_lines_of(&x->meta, a->i[0]);
        s = floating ? sort_double(src->data, vals->data, pos->data, l, a->i[1] != 0)
                     : sort_int64(src->data, vals->data, pos->data, l, a->i[1] != 0);
    }
    if (s == KILN_OK) s = kiln_copy_into(out[0], vals);
    if (s == KILN_OK) s = kiln_copy_into(out[1], pos);
    kiln_tensor_release(src);
    kiln_tensor_release(vals);
    kiln_tensor_release(pos);
    return s;
}
