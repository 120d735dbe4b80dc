/* Shapes: broadcasting, axes, printing. */
#include "internal.h"

char *kiln_shape_str(const kiln_meta *m, char *buf, size_t size) {
    size_t n = 0;
    n += (size_t)snprintf(buf + n, size - n, "(");
    for (int d = 0; d < m->ndim && n < size; d++)
        n += (size_t)snprintf(buf + n, size - n, d ? ", %lld" : "%lld", (long long)m->shape[d]);
    if (n < size) snprintf(buf + n, size - n, m->ndim == 1 ? ",)" : ")");
    return buf;
}

char *kiln_shapes_str(kiln_tensor *const *in, int nin, char *buf, size_t size) {
    size_t n = 0;
    buf[0] = '\0';
    for (int k = 0; k < nin && n + 1 < size; k++) {
        char one[160];
        kiln_shape_str(&in[k]->meta, one, sizeof one);
        n += (size_t)snprintf(buf + n, size - n, "%s%s", k == 0 ? "" : (k == nin - 1 ? " and " : ", "), one);
    }
    return buf;
}

kiln_status kiln_broadcast_shape(const char *op, int n, kiln_tensor *const *in, int *ndim, int64_t *shape) {
    int nd = 0;
    for (int k = 0; k < n; k++)
        if (in[k]->meta.ndim > nd) nd = in[k]->meta.ndim;
    for (int d = 0; d < nd; d++) shape[d] = 1;
    for (int k = 0; k < n; k++) {
        const kiln_meta *m = &in[k]->meta;
        int lead = nd - m->ndim;
        for (int d = 0; d < m->ndim; d++) {
            int64_t s = m->shape[d], *o = &shape[lead + d];
            if (s == *o || s == 1) continue;
            if (*o == 1) {
                *o = s;
                continue;
            }
            char buf[512];
            return kiln_error(KILN_ERR_VALUE, "%s%sshapes %s cannot be broadcast together", op ? op : "",
                              op ? ": " : "", kiln_shapes_str(in, n, buf, sizeof buf));
        }
    }
    int64_t numel;
    if (!kiln_shape_fits(nd, shape)) { /* (2^40, 1) with (1, 2^40) */
        kiln_shape_numel_checked(nd, shape, &numel); /* the message */
        char buf[512];
        return kiln_error_context(KILN_ERR_VALUE, "%s%sbroadcasting %s", op ? op : "", op ? ": " : "",
                                  kiln_shapes_str(in, n, buf, sizeof buf));
    }
    *ndim = nd;
    return KILN_OK;
}

void kiln_broadcast_strides(const kiln_tensor *t, int ndim, const int64_t *shape, int64_t *strides) {
    int lead = ndim - t->meta.ndim;
    for (int d = 0; d < ndim; d++) {
        int sd = d - lead;
        strides[d] = (sd < 0 || (t->meta.shape[sd] == 1 && shape[d] != 1)) ? 0 : t->strides[sd];
    }
}

kiln_status kiln_normalize_axis(const char *op, int64_t *axis, const kiln_meta *m) {
    int64_t nd = m->ndim ? m->ndim : 1;
    if (*axis < -nd || *axis >= nd) {
        char buf[160];
        return kiln_error(KILN_ERR_INDEX, "%s: axis %lld is out of range for a tensor of shape %s", op,
                          (long long)*axis, kiln_shape_str(m, buf, sizeof buf));
    }
    if (*axis < 0) *axis += nd;
    return KILN_OK;
}
