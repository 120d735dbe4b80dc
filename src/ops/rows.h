/* Row kernels: ops that generated code computes one row (the last axis) at a time, as the steps
 * their KILN_ROWS entry of ops.def lists; src/codegen/emit_rows.c turns steps into loops. */
#ifndef KILN_OPS_ROWS_H
#define KILN_OPS_ROWS_H

#include "../core/internal.h"

#define KILN_ROW_MAX_STEPS 8

typedef enum kiln_row_step_kind {
    KILN_ROW_END = 0, /* after the last step */
    KILN_ROW_EXPR,    /* a C expression over operands a, b, c, typed T (the op's dtype) */
    KILN_ROW_SUM,     /* reductions over the row of a row-varying operand; SUM, MEAN in double */
    KILN_ROW_MEAN,
    KILN_ROW_MAX,
    KILN_ROW_MIN,
} kiln_row_step_kind;

typedef struct kiln_row_step {
    kiln_row_step_kind kind;
    const char *expr; /* EXPR */
    int nin;
    int8_t in[3]; /* operands: step j is j, input k of the op is KILN_ROW_INPUT(k) */
} kiln_row_step;
#define KILN_ROW_INPUT(k) (-1 - (k))

typedef enum kiln_rows_axis {
    KILN_ROWS_NONE = 0, /* no row kernel */
    KILN_ROWS_REDUCE,   /* i[0] = bitmask of reduced axes, i[1] = keepdims: rows when it is the last axis alone */
    KILN_ROWS_ALONG,    /* i[0] = axis, inputs and output of one shape: rows when it is the last axis */
} kiln_rows_axis;

typedef struct kiln_row_recipe {
    kiln_rows_axis axis;
    kiln_row_step step[KILN_ROW_MAX_STEPS]; /* the last one is the op's result */
} kiln_row_recipe;

/* Indexed by op; axis KILN_ROWS_NONE for ops without a KILN_ROWS entry. */
extern const kiln_row_recipe kiln_op_rows[KILN_OP_COUNT];

#endif
