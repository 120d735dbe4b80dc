/* Fused attention or the unfused ops (matmul, softmax, matmul): the cost model both the eager
 * kiln.ops.scaled_dot_product_attention and the O1 pass fuse_attention decide by
 * (src/ops/attention_cost.c). */
#ifndef KILN_OPS_ATTENTION_COST_H
#define KILN_OPS_ATTENTION_COST_H

#include "../core/internal.h"

typedef struct {
    int64_t heads;         /* batch x query heads */
    int64_t Lq, Lk, D, Dv; /* query rows and keys per head, head dims */
    kiln_dtype dtype;
    bool causal, masked;   /* the causal flag; an attn_mask (its elements read per score) */
    bool dropout;          /* dropout on the probabilities: the fused kernel has none */
    bool backward;         /* the gradient is taken too */
} kiln_attention_case;

typedef struct {
    bool fused;
    double fused_cost, unfused_cost; /* estimated, in sgemm multiply-add times (flops / 2) */
    char why[200];
} kiln_attention_choice;

/* Chooses for one call (KILN_ATTENTION=fused|unfused in the environment overrides the estimate). */
void kiln_attention_choose(const kiln_attention_case *c, kiln_attention_choice *out);

#endif
