/* What the kernel-by-kernel executor decided for a graph (order, memory plan, prepared fused
 * kernels), read by the sink backend, which runs the same plan from generated code. */
#ifndef KILN_RUNTIME_PLAN_H
#define KILN_RUNTIME_PLAN_H

#include "../codegen/fused.h"

typedef struct kiln_exec_plan {
    const kiln_graph *g;              /* the executable's own copy of the graph */
    const int32_t *order;             /* node order, norder entries */
    int32_t norder;
    kiln_tensor *const *planned;      /* per value: its tensor over the arena, or NULL (not planned) */
    kiln_fused_kernel *const *fused;  /* per node: the prepared kernel of a fused group, or NULL */
    int32_t *const *freed_after;      /* per step: planned values whose buffers die after it (-1 ended; may be NULL) */
} kiln_exec_plan;

/* The tensor a call hands out for a graph output t whose storage comes from value root: t itself
 * (a new reference), or a private copy when t views a compile-time constant (never the graph's). */
kiln_status kiln_output_hand_out(const kiln_value *root, kiln_tensor *t, kiln_tensor **out);

/* Borrowed views into e, valid while e lives. */
void kiln_executable_get_plan(const kiln_executable *e, kiln_exec_plan *out);

/* kiln_executable_run writing its results into the caller's contiguous buffers into[] (the graph's
 * output metas; none may share memory with an input or a capture): outputs that own their
 * buffer are computed there directly, the others (inputs, views, captures) are copied. */
kiln_status kiln_executable_run_into(kiln_executable *e, int nin, kiln_tensor *const *inputs, int nout,
                                     kiln_tensor *const *into);

#endif
