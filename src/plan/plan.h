/* The plan of a compiled graph: plain data that every backend reads (kernel by kernel, sink,
 * reference). kiln_plan_build decides the node order, which buffer each value lives in and where in
 * one arena, what can go after each step, and the nested plans of control-flow bodies. It holds no
 * function pointer and nothing compiled: what runs a fused group is made by the backend that runs
 * the plan (its prepare; src/codegen/fused.h's kiln_fused_plan_kernels). Nothing here runs a kernel,
 * generates code or allocates the arena.
 *
 * Memory plan (ggml-alloc's rules): every intermediate that owns its buffer gets a block of one
 * arena, freed after the last use of the buffer (through any view of it); an elementwise node
 * writes in place into an input buffer that dies with it when shapes and dtypes match; buffers
 * that graph outputs live in are never planned (they are allocated per call and handed out); the
 * inputs of a gradient bucket (ops.def's JOINS_INPUTS), when this plan makes them, are laid out one
 * after the other in the bucket's own block, so that it reduces them in place.
 * A graph with symbolic sizes is planned once and bound per binding (kiln_plan_bind, below). */
#ifndef KILN_PLAN_H
#define KILN_PLAN_H

#include "../core/internal.h"

#include "kiln/graph.h"

/* Nested plans per control-flow node: its subgraphs in kiln_control_slots order (then/else;
 * cond/body[/backward]), and in the last slot a while's iteration composed into one graph. */
#define KILN_PLAN_BODIES 4
#define KILN_PLAN_STEP (KILN_PLAN_BODIES - 1)

typedef struct kiln_plan kiln_plan;
struct kiln_plan {
    kiln_graph *g;           /* the plan's own copy of the graph */
    int32_t *order, norder;  /* node order: order[step] = node */
    int32_t *root;           /* per value: the value whose buffer it lives in (itself unless a view or alias) */
    int32_t *last_use;       /* per root: the last step using its buffer (norder: kept to the end) */
    int64_t *offset;         /* per value: arena offset of its buffer, -1 when not planned */
    int32_t **dead_after;    /* per step: values whose run-time tensors can go after it (-1 ended) */
    int32_t **freed_after;   /* per step: planned buffers given back after it (-1 ended, or NULL) */
    int32_t *direct_output;  /* per value: the output a run_into call computes it into directly, or -1 */
    bool *weight_cast;       /* per node: a cast of a captured tensor whose result a backend may keep from one call
                              * to the next while the capture's version holds (weight_casts.c; its result is not in
                              * the arena); NULL: none */
    kiln_plan **bodies;      /* per node, KILN_PLAN_BODIES each: nested plans of control-flow nodes, or NULL */
    size_t arena_bytes;      /* the arena every planned buffer lives in */
    size_t output_bytes;     /* the outputs one call allocates */
    bool poison;             /* debug: fill buffers with NaN after their last use */
    bool symbolic;           /* planned at the hints of a graph with symbolic sizes: run only its bindings */
};

/* Marks the casts of captured tensors whose results can be kept between calls (e->weight_cast,
 * src/plan/weight_casts.c); e->root must be set, output_root: per value, whether a graph output lives
 * in its buffer. */
kiln_status kiln_plan_weight_casts(kiln_plan *e, const bool *output_root);
static inline bool kiln_plan_is_weight_cast(const kiln_plan *p, int32_t node) {
    return p->weight_cast && p->weight_cast[node];
}

/* Whether node `node` (a JOINS_INPUTS op: a gradient bucket) finds its inputs laid out in its
 * output's block, in order: it then runs in place (kiln.jit's explain says so). */
bool kiln_plan_joins_in_place(const kiln_plan *p, int32_t node);

/* Plans g (the plan keeps its own copy; g may be freed). */
kiln_status kiln_plan_build(const kiln_graph *g, const kiln_compile_options *opt, kiln_plan **out);
void kiln_plan_free(kiln_plan *p);

/* Plans of graphs with symbolic sizes (issue 16): kiln_plan_build_symbolic plans g once, at its
 * symbols' hints: the order and, at the hints, the buffers. Such a plan is not run itself:
 * kiln_plan_bind gives the plan of one binding (symbol k = bindings[k]) without planning again: the
 * graph instantiated (sizes evaluated, verified: a binding the graph does not hold for fails with
 * KILN_ERR_VALUE), the same order, and the buffers' sizes and offsets evaluated by one walk of the
 * order (the same liveness, sizes of this binding). The bindings' backends keep the code of fused
 * groups from one binding to the next (kiln_backend.prepare_bound). Graphs with control flow are
 * refused (no symbolic shape rule makes them). */
kiln_status kiln_plan_build_symbolic(const kiln_graph *g, const kiln_compile_options *opt, kiln_plan **out);
kiln_status kiln_plan_bind(const kiln_plan *p, const int64_t *bindings, kiln_plan **out);
/* Totals of this process: plans built (kiln_plan_build, kiln_plan_build_symbolic; nested plans of
 * control-flow bodies and interpreted fused groups too) and plans bound (kiln_plan_bind). */
void kiln_plan_counts(int64_t *built, int64_t *bound);
/* The stable text form (malloc'd): steps in order with each value's buffer, offset and last use,
 * what is freed after each step, fused groups and nested plans. KILN_DUMP_PLAN=1 prints it. */
char *kiln_plan_to_string(const kiln_plan *p);
static inline kiln_plan *kiln_plan_body(const kiln_plan *p, int32_t node, int slot) {
    return p->bodies ? p->bodies[(int64_t)node * KILN_PLAN_BODIES + slot] : NULL;
}

/* The memory a plan's arena holds at its busiest step (src/plan/plan_memory.c): a planned buffer
 * lives from the step that makes it through its last use. */
typedef struct kiln_plan_peak {
    int32_t step;       /* the step with the most planned bytes live (-1: no planned buffer) */
    size_t live_bytes;  /* their bytes (at most arena_bytes: the arena adds what packing leaves over) */
    int32_t *values;    /* the buffers live at that step, largest first (malloc'd) */
    int32_t nvalues;
    int32_t *producer;  /* per value: the node that makes it, or -1 (malloc'd, g->nvalues entries) */
} kiln_plan_peak;

kiln_status kiln_plan_peak_find(const kiln_plan *p, kiln_plan_peak *out);
void kiln_plan_peak_free(kiln_plan_peak *peak);
/* The bytes of value v's buffer. */
size_t kiln_plan_value_bytes(const kiln_plan *p, int32_t v);

/* A while's iteration as one graph: (v..., lifted...) -> (the body's next v..., the cond of them)
 * (src/plan/loop_step.c). */
kiln_status kiln_plan_compose_loop_step(const kiln_graph *cond, const kiln_graph *body, int nloop, kiln_graph **out);

#endif
