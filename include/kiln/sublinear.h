/* kiln — sublinear memory: recomputation of training graphs and the search for what to recompute
 * (MegEngine's SublinearMemoryConfig; Chen et al. 2016). The rewrite is a pass
 * (src/passes/recompute.c); the search scores candidates with the real memory planner
 * (src/plan/sublinear.c). */
#ifndef KILN_SUBLINEAR_H
#define KILN_SUBLINEAR_H

#include "kiln/passes.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kiln_recompute_stats {
    int32_t recomputed_ops; /* nodes copied to recompute dropped values */
    int64_t extra_flops;    /* their estimated floating-point work (kiln_node_flops) */
} kiln_recompute_stats;

/* Estimated floating-point operations of node i (2*M*N*K for products and convolutions, one per
 * element produced otherwise; views 0). */
KILN_API int64_t kiln_node_flops(const kiln_graph *g, int32_t i);

/* Drops values read long after they are made and recomputes them before their late readers
 * (see src/passes/recompute.c). block[n]: the block of node n in node order (runs of equal ids;
 * -1: never dropped nor recomputed); endpoint[n] (may be NULL): n's outputs are checkpoints, kept.
 * *out is NULL when nothing changes. recomputed (may be NULL, nnodes entries) says which nodes
 * were copied. */
KILN_API kiln_status kiln_recompute_rewrite(const kiln_graph *g, const int32_t *block, const bool *endpoint,
                                            kiln_graph **out, kiln_recompute_stats *st, bool *recomputed);
/* The same for the nodes recorded in calls of Cells marked with Cell.recompute (kiln_node.recompute):
 * each call is a block whose last node (the cell's output) is kept. *out is NULL when none is
 * marked. */
KILN_API kiln_status kiln_recompute_marked(const kiln_graph *g, kiln_graph **out, kiln_recompute_stats *st);

/* Moves in-place updates (an optimizer's parameter writes) to just after the last node they
 * depend on, so gradients go as soon as they are applied (src/passes/hoist_updates.c). *out is
 * NULL when nothing moves. */
KILN_API kiln_status kiln_hoist_updates(const kiln_graph *g, kiln_graph **out);

/* The arena bytes kiln_plan_build would plan for g in this order (order and memory only: no
 * kernels prepared, nothing allocated beyond the planner's own tables). */
KILN_API kiln_status kiln_plan_arena_bytes(const kiln_graph *g, kiln_exec_order order, size_t *peak);

typedef struct kiln_sublinear_config {
    int32_t thresh_nr_try;     /* thresholds tried in the linear sweep and again around the best */
    int32_t genetic_nr_iter;   /* rounds of the genetic search over checkpoint sets (0: none) */
    int32_t genetic_pool_size; /* candidates kept per round */
    int64_t lb_memory;         /* bytes: a peak at or below this is good enough; least recompute wins */
    int32_t num_worker;        /* threads scoring candidates (results do not depend on it) */
    uint64_t seed;             /* of the genetic search */
} kiln_sublinear_config;

typedef struct kiln_sublinear_report {
    size_t peak_before, peak_after; /* planned arena bytes without and with the pass */
    size_t peak_hoisted;            /* with in-place updates moved up (kiln_hoist_updates), nothing recomputed */
    size_t peak_greedy;             /* the best peak of the threshold search alone */
    int32_t recomputed_ops;
    int64_t extra_flops;
    int32_t checkpoints; /* split points of the chosen plan */
    int32_t candidates;  /* plans scored */
} kiln_sublinear_report;

/* Moves in-place updates up (kiln_hoist_updates), then searches checkpoints for *g (threshold sweep, then genetic rounds, each candidate rewritten by
 * kiln_recompute_rewrite and planned by kiln_plan_arena_bytes in `order`) and replaces *g by the best
 * (lowest peak; with lb_memory, the least recompute among peaks <= lb_memory; ties: fewer
 * FLOPs, then the smaller checkpoint list). *g is left as it is when nothing beats it, and when
 * lb_memory is at or above its peak. */
KILN_API kiln_status kiln_sublinear_optimize(kiln_graph **g, kiln_exec_order order, const kiln_sublinear_config *cfg,
                                             kiln_sublinear_report *report);

#ifdef __cplusplus
}
#endif
#endif
