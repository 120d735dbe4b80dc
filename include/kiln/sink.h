/* kiln — the whole-graph "sink" backend (MindSpore's GE / exc_mode="sink").
 *
 * A compiled graph becomes one generated C function over tensors made once at compile time (the
 * kernel-by-kernel executor's order and arena plan; every intermediate and every view of one
 * created once). It calls every node's kernel directly; fused groups, and lone elementwise nodes
 * whose generated loop is bit-for-bit the kernel's, run as generated loops over their fixed
 * layouts. A call binds the inputs, allocates the outputs and runs that function. Without a C compiler (or with
 * KILN_DISABLE_CODEGEN=1) the same steps run through an interpreted loop, with identical results.
 */
#ifndef KILN_SINK_H
#define KILN_SINK_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kiln_sink kiln_sink;

/* Plans and generates g (the sink keeps its own copy; g may be freed). Honors opt->order and
 * opt->poison_freed like kiln_compile. */
KILN_API kiln_status kiln_sink_compile(const kiln_graph *g, const kiln_compile_options *opt, kiln_sink **out);
KILN_API void kiln_sink_free(kiln_sink *s);
/* Runs with the graph inputs bound to `inputs` (metas must match); outputs are new references.
 * Inputs in other layouts are copied to contiguous ones first, except inputs the graph writes
 * in place or returns: those calls run kernel by kernel over the same plan. */
KILN_API kiln_status kiln_sink_run(kiln_sink *s, int nin, kiln_tensor *const *inputs, int nout,
                                   kiln_tensor **outputs);
/* Whether the graph runs as generated native code (false: the interpreted loop). */
KILN_API bool kiln_sink_is_native(const kiln_sink *s);
/* The plan the sink runs (order, arena): for kiln_executable_order_string and the byte counts. */
KILN_API const kiln_executable *kiln_sink_plan(const kiln_sink *s);
/* Calls served kernel by kernel (inputs in layouts the generated code was not made for). */
KILN_API int64_t kiln_sink_fallback_calls(const kiln_sink *s);

#ifdef __cplusplus
}
#endif
#endif
