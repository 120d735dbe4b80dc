/* Fused groups: a subgraph of elementwise ops run as one kernel (generated C when a compiler is
 * available, else the subgraph's own kernels, with identical results to the unfused graph). */
#ifndef KILN_FUSED_H
#define KILN_FUSED_H

#include "../core/internal.h"

#include "kiln/graph.h"

typedef struct kiln_fused_kernel kiln_fused_kernel;
struct kiln_plan; /* src/plan/plan.h */

/* Prepares the kernel of a fused node's subgraph (sub stays owned by the caller), generated for
 * contiguous inputs. */
kiln_status kiln_fused_prepare(const kiln_graph *sub, kiln_fused_kernel **out);
/* The same, generated for inputs laid out as in_strides[k] says (element strides of input k's
 * shape; NULL entries or in_strides NULL: contiguous). Any layout still runs (see run). */
kiln_status kiln_fused_prepare_strided(const kiln_graph *sub, const int64_t *const *in_strides, kiln_fused_kernel **out);
/* A kernel for sub, which has the structure of from's subgraph at other sizes (a symbolic group's
 * binding): from's loaded code when every operand moves along the inner axis as in from (the code
 * takes the sizes as arguments), else prepared as kiln_fused_prepare_strided does. */
kiln_status kiln_fused_rebind(kiln_fused_kernel *from, const kiln_graph *sub, const int64_t *const *in_strides,
                              kiln_fused_kernel **out);
/* in: the node's inputs (any strides); out: allocated with the node's output meta. */
kiln_status kiln_fused_run(kiln_fused_kernel *k, int nin, kiln_tensor *const *in, kiln_tensor *out);
void kiln_fused_free(kiln_fused_kernel *k);
/* Builds every prepared kernel still waiting (one compiler run): a compiled graph calls it
 * after preparing its groups, so the build is part of compiling, not of the first run. */
void kiln_fused_build_waiting(void);
/* Whether k runs generated code (false: interpreted); builds it if it waits to be built. */
bool kiln_fused_is_native(kiln_fused_kernel *k);

/* The kernels of plan p's fused groups, per node (NULL at other nodes; *out malloc'd, freed with
 * kiln_fused_kernels_free(p->g->nnodes, ...)), generated for the layouts the groups' inputs have in p's graph.
 * from (NULL, or an earlier binding's kernels of the same symbolic plan, per node): their code
 * again where it fits (kiln_fused_rebind: nothing generated or looked up), else made anew. Built
 * together at once (one compiler run), unless builds are deferred. Backends call it from prepare:
 * the plan itself holds nothing compiled. */
kiln_status kiln_fused_plan_kernels(const struct kiln_plan *p, kiln_fused_kernel *const *from, kiln_fused_kernel ***out);
void kiln_fused_kernels_free(int32_t n, kiln_fused_kernel **k);
/* Builds of waiting kernels wait while the depth (+1 / -1) is above 0, and happen when it returns to
 * 0: a backend preparing a plan and its nested plans builds their groups with one compiler run. */
void kiln_fused_defer_builds(int delta);

/* The interpreted path: the subgraph run kernel by kernel. Code generation does not call the
 * backends: the runtime registers this at start-up (src/runtime/executable.c). */
typedef struct kiln_fused_interpreter {
    kiln_status (*prepare)(const kiln_graph *sub, void **out);
    kiln_status (*run)(void *k, int nin, kiln_tensor *const *in, kiln_tensor *out);
    void (*free)(void *k);
} kiln_fused_interpreter;
void kiln_fused_register_interpreter(const kiln_fused_interpreter *interpreter);

#endif
