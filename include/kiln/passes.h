/* kiln — graph passes and the optimization pipeline.
 *
 * A pass is a named graph -> graph function. Each level (O0, O1, O2) is an ordered list of
 * passes (src/passes/pipeline.c). KILN_DUMP_IR=1 prints the graph after every pass.
 */
#ifndef KILN_PASSES_H
#define KILN_PASSES_H

#include "kiln/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kiln_jit_level { KILN_LEVEL_O0, KILN_LEVEL_O1, KILN_LEVEL_O2 } kiln_jit_level;

/* Which epilogues fuse_conv_epilogue folds into convolutions (MegEngine's dump options). */
typedef enum kiln_conv_fusion {
    KILN_CONV_FUSE_ALL = 0,  /* bias, residual (z) and activation: what the jit levels do */
    KILN_CONV_FUSE_NONE,     /* none: bias, add and activation stay nodes of their own */
    KILN_CONV_FUSE_BIAS_ACT, /* bias and activation, not a residual add */
} kiln_conv_fusion;

typedef struct kiln_pass_options {
    kiln_jit_level level;
    bool inference;           /* forward-only graph: inference rewrites allowed (infer_boost) */
    bool disable_format_transform;
    kiln_conv_fusion conv_fusion;
    bool fold_large_constants; /* constant_fold folds results of any size (model files store them once) */
} kiln_pass_options;

/* Builds *out from in; *out may be a new graph or NULL meaning "unchanged". */
typedef kiln_status (*kiln_pass_fn)(const kiln_graph *in, const kiln_pass_options *opt, kiln_graph **out);

typedef struct kiln_pass {
    const char *name;
    kiln_pass_fn run;
} kiln_pass;

/* The passes of a level, in order (count in *n). */
KILN_API const kiln_pass *kiln_pipeline(kiln_jit_level level, int *n);
/* Runs the level's passes; *g is replaced by the optimized graph (the old one freed). */
KILN_API kiln_status kiln_optimize(kiln_graph **g, const kiln_pass_options *opt);
/* Runs one pass by name (for tests); unknown names are a KILN_ERR_VALUE. */
KILN_API kiln_status kiln_run_pass(const char *name, kiln_graph **g, const kiln_pass_options *opt);

/* The graph with every float32 value stored as float16 (src/passes/to_float16.c: trace.dump's
 * enable_io16xc32; each op still computes in float32). */
KILN_API kiln_status kiln_graph_to_float16(const kiln_graph *g, kiln_graph **out);
/* A graph that computes in 16-bit floats already (amp): only its float32 inputs and outputs become
 * float16, each input widened to float32 where the graph starts and each output rounded where it
 * ends; every other value keeps its dtype (src/passes/to_float16.c). */
KILN_API kiln_status kiln_graph_io_to_float16(const kiln_graph *g, kiln_graph **out);
/* Whether a node of g (or of its subgraphs) makes a float16 or bfloat16 value. */
KILN_API bool kiln_graph_computes_16bit(const kiln_graph *g);

/* vmap (src/passes/vmap.c): the graph of `batch` examples of g, each a call of g. in_axes, one per
 * input of g: the axis of the new input that holds the batch, or -1 (the input is shared by every
 * example, unchanged); out_axes, one per output: the axis of the batch in that output, or -1 (the
 * output must not vary over the batch). Each node follows its op's KILN_BATCH rule (ops.def); a
 * node with no rule that applies runs once per example, and fallback (KILN_OP_COUNT flags, may be
 * NULL) marks its op. Control-flow nodes and ops with side effects on batched inputs fail with
 * KILN_ERR_NOT_IMPLEMENTED; graphs with symbolic sizes are refused. */
KILN_API kiln_status kiln_graph_batch(const kiln_graph *g, int64_t batch, const int32_t *in_axes,
                                      const int32_t *out_axes, bool *fallback, kiln_graph **out);
/* The name of op's KILN_BATCH rule ("elementwise", ...), "" when it has none. */
KILN_API const char *kiln_batch_rule_name(kiln_op op);
/* The graph with amp's casts (src/passes/amp.c): each node's float inputs cast to the dtype its
 * KILN_AMP class (src/ops/ops.def) gives at `level` with low dtype `low` (bfloat16 or float16). */
KILN_API kiln_status kiln_graph_amp(const kiln_graph *g, kiln_amp_level level, kiln_dtype low, kiln_graph **out);

/* ---- rewriting helpers for passes -------------------------------------------------------- */

/* Copies a graph node by node: inputs and captures first (same order), then whatever nodes the
 * pass keeps or adds, with old value ids mapped to new ones. */
typedef struct kiln_rewriter {
    const kiln_graph *src;
    kiln_graph *dst;
    int32_t *map; /* src value -> dst value (-1: not yet defined) */
    int32_t *origin; /* dst node -> the src node it stands for + 1 (0: none; kiln_rewriter_stands_for) */
    int32_t norigin;
} kiln_rewriter;

KILN_API kiln_status kiln_rewriter_begin(kiln_rewriter *rw, const kiln_graph *src);
/* Copies src node `node` with its inputs mapped; maps its outputs. */
KILN_API kiln_status kiln_rewriter_copy_node(kiln_rewriter *rw, int32_t node);
/* The dst node added last stands for src node src_node: it takes that node's name and priority
 * (kiln_graph_carry_names; a fused convolution is named after its convolution). */
KILN_API kiln_status kiln_rewriter_stands_for(kiln_rewriter *rw, int32_t src_node);
/* Sets the outputs (mapped), carries the names over (kiln_graph_carry_names) and hands over the
 * new graph. */
KILN_API kiln_status kiln_rewriter_finish(kiln_rewriter *rw, kiln_graph **out);
KILN_API void kiln_rewriter_abort(kiln_rewriter *rw);

/* For each value: how many node inputs and graph outputs use it (malloc'd, nvalues entries). */
KILN_API int32_t *kiln_graph_use_counts(const kiln_graph *g);

#ifdef __cplusplus
}
#endif
#endif
