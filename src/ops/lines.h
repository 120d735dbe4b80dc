/* The lines of a contiguous tensor along one axis, for ops that run along it (scans, sort): line
 * (o, i) holds the n elements base + k * inner, base = o * n * inner + i. A 0-d tensor is one
 * line of one element. */
#ifndef KILN_OPS_LINES_H
#define KILN_OPS_LINES_H
#include "../core/internal.h"

typedef struct {
    int64_t outer, n, inner;
} kiln_lines;

static inline kiln_lines kiln_lines_of(const kiln_meta *m, int64_t axis) {
    kiln_lines l = {1, 1, 1};
    for (int d = 0; d < m->ndim; d++) {
        if (d < axis) l.outer *= m->shape[d];
        else if (d == axis) l.n = m->shape[d];
        else l.inner *= m->shape[d];
    }
    return l;
}

/* KILN_OK when i[0] is an axis of m (0 for a 0-d tensor) and i[1] is 0 or 1; else an error
 * naming op and the shape. */
static inline kiln_status kiln_lines_check(const char *op, const char *flag, const kiln_meta *m, const kiln_attrs *a) {
    KILN_TRY(kiln_attrs_expect(op, a, 2, 0));
    int nd = m->ndim ? m->ndim : 1;
    char buf[160];
    if (a->i[0] < 0 || a->i[0] >= nd)
        return kiln_error(KILN_ERR_VALUE, "%s: axis %lld is out of range for a tensor of shape %s", op,
                          (long long)a->i[0], kiln_shape_str(m, buf, sizeof buf));
    if (a->i[1] != 0 && a->i[1] != 1)
        return kiln_error(KILN_ERR_VALUE, "%s: %s must be 0 or 1, got %lld", op, flag, (long long)a->i[1]);
    return KILN_OK;
}
#endif
