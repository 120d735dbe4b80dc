/* The interpreted path of fused groups: the subgraph compiled for the kbk executor, so results
 * are those of the unfused graph. */
#include "fused.h"

struct kiln_fused_interp {
    kiln_executable *exe;
};

kiln_status kiln_fused_interp_prepare(const kiln_graph *sub, kiln_fused_interp **out) {
    kiln_fused_interp *k = calloc(1, sizeof *k);
    if (!k) return kiln_error(KILN_ERR_MEMORY, "out of memory preparing a fused kernel");
    kiln_status s = kiln_compile(sub, NULL, &k->exe);
    if (s != KILN_OK) {
        free(k);
        return s;
    }
    *out = k;
    return KILN_OK;
}

kiln_status kiln_fused_interp_run(kiln_fused_interp *k, int nin, kiln_tensor *const *in, kiln_tensor *out) {
    kiln_tensor *result = NULL;
    KILN_TRY(kiln_executable_run(k->exe, nin, in, 1, &result));
    kiln_status s = kiln_copy_into(out, result);
    kiln_tensor_release(result);
    return s;
}

void kiln_fused_interp_free(kiln_fused_interp *k) {
    if (!k) return;
    kiln_executable_free(k->exe);
    free(k);
}
