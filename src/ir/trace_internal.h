/* What the dispatcher and the extension need of the tracer beyond the public API. */
#ifndef KILN_TRACE_INTERNAL_H
#define KILN_TRACE_INTERNAL_H

#include "../core/internal.h"
#include "kiln/graph.h"

/* Records an op kiln_apply just ran into the thread's active tracer. */
void kiln_tracer_record(kiln_op op, int nin, kiln_tensor *const *in, const kiln_attrs *attrs, int nout,
                        kiln_tensor **out);
/* With a tracer active: `alias` (a detached view of t) stands for t's value. */
void kiln_tracer_alias(const kiln_tensor *t, const kiln_tensor *alias);
/* An op about to write some of its inputs in place: kept in the undo log of the innermost active
 * tracer that keeps one. */
void kiln_tracer_before_write(kiln_op op, int nin, kiln_tensor *const *in);
/* The first error met while recording (KILN_OK when none). */
kiln_status kiln_tracer_status(const kiln_tracer *tr);

#endif
