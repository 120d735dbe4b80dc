/* The passes of src/passes/, listed by pipeline.c. */
#ifndef KILN_PASSES_INTERNAL_H
#define KILN_PASSES_INTERNAL_H

#include "../core/internal.h"

#define KILN_PASS(name) \
    kiln_status kiln_pass_##name(const kiln_graph *in, const kiln_pass_options *opt, kiln_graph **out)

KILN_PASS(dce);
KILN_PASS(cse);
KILN_PASS(constant_fold);
KILN_PASS(simplify);
KILN_PASS(fuse_elementwise);
KILN_PASS(fold_batch_norm);

#endif
