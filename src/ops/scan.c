/* cumsum and cumprod: running sums and products along one axis (ops.def: i[0] = axis, i[1] =
 * reverse). Plain loops over a contiguous copy of the input in the accumulating type (double for
 * floats, int64 for integers and bool, wrapping as NumPy's), the results then written in the
 * output's dtype. */
#include "lines.h"

KILN_INFER(scan) {
    KILN_TRY(kiln_lines_check("cumsum/cumprod", "reverse", &in[0]->meta, a));
    *out = in[0]->meta;
    out->dtype = kiln_dtype_is_float(in[0]->meta.dtype) ? in[0]->meta.dtype : KILN_DTYPE_INT64;
    return KILN_OK;
}

static void scan_double(const double *x, double *y, kiln_lines l, bool reverse, bool product) {
    for (int64_t o = 0; o < l.outer; o++)
        for (int64_t i = 0; i < l.inner; i++) {
            int64_t base = o * l.n * l.inner + i;
            double run = product ? 1.0 : 0.0;
            for (int64_t k = 0; k < l.n; k++) {
                int64_t at = base + (reverse ? l.n - 1 - k : k) * l.inner;
                run = product ? run * x[at] : run + x[at];
                y[at] = run;
            }
        }
}

/* in uint64_t: integer overflow wraps (defined), as NumPy's */
static void scan_int64(const int64_t *x, int64_t *y, kiln_lines l, bool reverse, bool product) {
    for (int64_t o = 0; o < l.outer; o++)
        for (int64_t i = 0; i < l.inner; i++) {
            int64_t base = o * l.n * l.inner + i;
            uint64_t run = product ? 1u : 0u;
            for (int64_t k = 0; k < l.n; k++) {
                int64_t at = base + (reverse ? l.n - 1 - k : k) * l.inner;
                run = product ? run * (uint64_t)x[at] : run + (uint64_t)x[at];
                y[at] = (int64_t)run;
            }
        }
}

static kiln_status scan(kiln_tensor *x, const kiln_attrs *a, kiln_tensor *out, bool product) {
    bool floating = kiln_dtype_is_float(x->meta.dtype);
    kiln_dtype acc = floating ? KILN_DTYPE_FLOAT64 : KILN_DTYPE_INT64;
    kiln_tensor *src = NULL, *dst = NULL;
    KILN_TRY(kiln_to_contiguous(x, acc, &src));
    kiln_status s = kiln_tensor_empty(acc, x->meta.ndim, x->meta.shape, &dst);
    if (s == KILN_OK) {
        kiln_lines l = kiln_lines_of(&x->meta, a->i[0]);
        if (floating) scan_double(src->data, dst->data, l, a->i[1] != 0, product);
        else scan_int64(src->data, dst->data, l, a->i[1] != 0, product);
        s = kiln_copy_into(out, dst);
    }
    kiln_tensor_release(src);
    kiln_tensor_release(dst);
    return s;
}

KILN_KERNEL(cumsum) { return scan(in[0], a, out[0], false); }
KILN_KERNEL(cumprod) { return scan(in[0], a, out[0], true); }
