/* The fused op: shape inference from its attributes; it runs only inside a compiled graph,
 * where the executor calls the group's kernel (src/codegen/). */
#include "../core/internal.h"

KILN_INFER(fused) {
    if (a->ni < 3 || a->i[2] < 0 || a->i[2] > KILN_MAX_DIMS || a->ni < 3 + a->i[2])
        return kiln_error(KILN_ERR_VALUE, "fused: malformed attributes (%d ints)", a->ni);
    if (a->i[1] < 0 || a->i[1] >= KILN_DTYPE_COUNT) return kiln_error(KILN_ERR_TYPE, "fused: invalid output dtype");
    kiln_meta_set(out, (kiln_dtype)a->i[1], (int)a->i[2], &a->i[3]);
    return KILN_OK;
}

KILN_KERNEL(fused) {
    (void)out;
    return kiln_error(KILN_ERR_RUNTIME, "fused: a fused group runs only inside a compiled graph (it has no eager kernel)");
}
