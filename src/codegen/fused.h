/* Fused groups: a subgraph of elementwise ops run as one kernel (generated C when a compiler is
 * available, else the subgraph's own kernels, with identical results to the unfused graph). */
#ifndef KILN_FUSED_H
#define KILN_FUSED_H

#include "../core/internal.h"

#include "kiln/graph.h"

typedef struct kiln_fused_kernel kiln_fused_kernel;

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

/* The interpreted path: the subgraph run kernel by kernel. Code generation does not call the
 * backends: the runtime registers this at start-up (src/runtime/executable.c). */
typedef struct kiln_fused_interpreter {
    kiln_status (*prepare)(const kiln_graph *sub, void **out);
    kiln_status (*run)(void *k, int nin, kiln_tensor *const *in, kiln_tensor *out);
    void (*free)(void *k);
} kiln_fused_interpreter;
void kiln_fused_register_interpreter(const kiln_fused_interpreter *interpreter);

#endif
