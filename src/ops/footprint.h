/* Footprints of ops (FLOPs from ops.def's KILN_COST lines, bytes from shapes) and the kernel events
 * of profiles (src/core/profile.h) every executor records through kiln_profile_op. */
#ifndef KILN_OPS_FOOTPRINT_H
#define KILN_OPS_FOOTPRINT_H

#include "../core/internal.h"

/* Floating-point operations of one call of op on these shapes (0 for ops without a KILN_COST line). */
KILN_API int64_t kiln_op_flops(kiln_op op, const kiln_attrs *attrs, int nin, const kiln_meta *const *in, int nout,
                               const kiln_meta *const *out);

/* What a kernel event says besides shapes and times. */
typedef struct kiln_profile_op_info {
    int32_t source;    /* kiln_profile_source */
    kiln_op op;
    const kiln_attrs *attrs;
    int32_t node;      /* the graph node, or -1 */
    uint64_t graph;    /* the compiled graph, or 0 */
    const char *name;  /* NULL: the op's name */
    const char *loc;   /* file:line, or NULL */
    int64_t flops;     /* -1: the op's own (kiln_op_flops) */
} kiln_profile_op_info;

/* Records the kernel begun at start (kiln_profile_begin) over these shapes. */
void kiln_profile_op(kiln_profile_op_info *info, int nin, const kiln_meta *const *in, int nout,
                     const kiln_meta *const *out, int64_t start);
/* The same from tensors (outputs left NULL by a failed kernel are skipped). */
void kiln_profile_tensors(kiln_profile_op_info *info, int nin, kiln_tensor *const *in, int nout,
                          kiln_tensor *const *out, int64_t start);

#endif
