/* The strides of a view op's result: one rule for its kernel (view.c) and for the layouts a
 * graph's values will have (src/ir/layout.c). */
#ifndef KILN_OPS_VIEW_H
#define KILN_OPS_VIEW_H

#include "../core/internal.h"

/* Whether op's result shares the storage of its input 0 (meta in, element strides in_strides),
 * and then its element strides: VIEW ops (reshape when some strides view the input, as torch's
 * computeStride) and MUTATES ops (the tensor they write). false: a fresh tensor, strides unset. */
bool kiln_view_strides(kiln_op op, const kiln_attrs *a, const kiln_meta *in, const int64_t *in_strides,
                       int64_t *strides);

#endif
