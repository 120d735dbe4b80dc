/* How far a result is from an expected one (kiln-run --check, the embedded test cases of model
 * files). */
#include <math.h>

#include "internal.h"

kiln_status kiln_tensor_max_error(const kiln_tensor *got, const kiln_tensor *expected, double *max_abs,
                                  double *max_rel) {
    *max_abs = *max_rel = 0;
    if (!kiln_meta_equal(&got->meta, &expected->meta)) {
        char a[160], b[160];
        return kiln_error(KILN_ERR_VALUE, "compare: the result is %s%s, the expected value %s%s",
                          kiln_dtype_name(got->meta.dtype), kiln_shape_str(&got->meta, a, sizeof a),
                          kiln_dtype_name(expected->meta.dtype), kiln_shape_str(&expected->meta, b, sizeof b));
    }
    double scale = 0;
    for (int64_t i = 0; i < expected->numel; i++) {
        double e = fabs(kiln_tensor_get_double(expected, i));
        if (isfinite(e) && e > scale) scale = e;
    }
    double floor = scale > 0 ? 1e-3 * scale : 1e-30;
    for (int64_t i = 0; i < expected->numel; i++) {
        double g = kiln_tensor_get_double(got, i), e = kiln_tensor_get_double(expected, i);
        if (isnan(e) && isnan(g)) continue;
        if (g == e) continue; /* also equal infinities */
        double d = fabs(g - e);
        if (isnan(d)) d = INFINITY;
        double r = d / fmax(fabs(e), floor);
        if (d > *max_abs) *max_abs = d;
        if (r > *max_rel) *max_rel = r;
    }
    return KILN_OK;
}
