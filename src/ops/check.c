/* check: the runtime form of `if <tensor condition>: raise E(...)` and `assert <tensor
 * condition>` in captured code (an effect op: passes keep it and its place). It fails with
 * KILN_ERR_CHECK when the condition says so; the caller raises the exception registered for
 * the check's id. i[0] = id, i[1] = 1: fail when the condition is nonzero, 0: when it is zero.
 * The output is a 0-d int8 token (0). */
#include "../core/internal.h"
#include "../core/hooks.h"

KILN_INFER(check) {
    (void)nin;
    KILN_TRY(kiln_attrs_expect("check", a, 2, 0));
    if (kiln_shape_numel(in[0]->meta.ndim, in[0]->meta.shape) != 1) {
        char buf[160];
        return kiln_error(KILN_ERR_VALUE, "check: the condition must have one element, got shape %s",
                          kiln_shape_str(&in[0]->meta, buf, sizeof buf));
    }
    kiln_meta_set(out, KILN_DTYPE_INT8, 0, NULL);
    return KILN_OK;
}

KILN_KERNEL(check) {
    (void)nin;
    *(int8_t *)out[0]->data = 0;
    if (kiln_thread.trace_in_body) return KILN_OK; /* traced once to be recorded: it checks when the node runs */
    bool nonzero = kiln_tensor_get_double(in[0], 0) != 0.0;
    if (nonzero == (a->i[1] != 0)) return kiln_error_check(a->i[0]);
    return KILN_OK;
}
