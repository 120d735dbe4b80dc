/* What the sink backend takes of the kernel-by-kernel one (src/runtime/kbk.c): the sink runs a plan
 * kbk also prepared (for the calls it hands over), over the same fused-group kernels. */
#ifndef KILN_RUNTIME_KBK_H
#define KILN_RUNTIME_KBK_H

#include "../codegen/fused.h"
#include "backend.h"

/* kiln_backend_kbk.prepare over the caller's kernels of p's fused groups (per node; borrowed: they
 * outlive the state). */
kiln_status kiln_kbk_prepare_with(const kiln_plan *p, kiln_plan_memory *mem, kiln_fused_kernel **kernels, void **state);
/* The memo kiln_backend_kbk.prepare_bound keeps: *memo (NULL at first) made from kernels, p's groups
 * of one binding (kept as they are when *memo is set already); and the kernels it holds for p's
 * nodes (NULL for no memo). */
kiln_status kiln_kbk_keep_memo(const kiln_plan *p, kiln_fused_kernel *const *kernels, void **memo);
kiln_fused_kernel *const *kiln_kbk_memo_kernels(const void *memo, const kiln_plan *p);

#endif
