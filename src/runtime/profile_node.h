/* The kernel event of a graph node run by a backend (kbk, sink): its op or fused group, source line
 * and footprint (src/ops/footprint.h). Called only while kiln_profiling(). */
#ifndef KILN_RUNTIME_PROFILE_NODE_H
#define KILN_RUNTIME_PROFILE_NODE_H

#include "../core/profile.h"
#include "../plan/plan.h"

/* Records node i of g, begun at start, that ran on in[] and made out[] (NULL where a failed kernel
 * made none). */
void kiln_profile_node(int32_t source, const kiln_graph *g, int32_t i, kiln_tensor *const *in, kiln_tensor *const *out,
                       int64_t start);

#endif
