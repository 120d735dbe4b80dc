/* The op table, generated from ops.def. */
#include "../core/internal.h"
#include "rows.h"

const kiln_op_info kiln_op_table[KILN_OP_COUNT] = {
#define KILN_OP(ENUM, name_, nin_, nout_, fusion_, flags_, infer_, kernel_, grad_, cexpr_)     \
    [KILN_OP_##ENUM] = {.name = name_,                                                      \
                        .nin = nin_,                                                        \
                        .nout = nout_,                                                      \
                        .fusion = fusion_,                                                  \
                        .flags = flags_,                                                    \
                        .infer = kiln_infer_##infer_,                                       \
                        .kernel = kiln_kernel_##kernel_,                                    \
                        .grad = kiln_grad_##grad_,                                          \
                        .c_expr = fusion_ == KILN_FUSE_ELEMENTWISE ? #cexpr_ : NULL},
#include "ops.def"
#undef KILN_OP
};

/* Every entry filled, every output count within bounds. */
#define KILN_OP(ENUM, name, nin, nout, fusion, flags, infer, kernel, grad, cexpr)           \
    _Static_assert(((nout) >= 1 && (nout) <= KILN_MAX_OUTPUTS) || ((nout) == KILN_VARIADIC && ((flags) & KILN_OPF_CONTROL)), \
                   "outputs of " name);
#include "ops.def"
#undef KILN_OP

/* The gradient rule of ops that are not differentiable (ops.def `none`). */
kiln_status kiln_grad_none(const kiln_grad_ctx *ctx, kiln_tensor *const *gout, kiln_tensor **gin) {
    (void)gout, (void)gin;
    return kiln_error(KILN_ERR_RUNTIME, "%s is not differentiable", kiln_op_table[ctx->op].name);
}

/* Row kernels, from the KILN_ROWS lines. */
#define IN(k) KILN_ROW_INPUT(k)
#define STEP(j) (j)
#define ROW_EXPR(e, ...) {KILN_ROW_EXPR, e, (int)sizeof((int8_t[]){__VA_ARGS__}), {__VA_ARGS__}}
#define ROW_SUM(x) {KILN_ROW_SUM, NULL, 1, {x}}
#define ROW_MEAN(x) {KILN_ROW_MEAN, NULL, 1, {x}}
#define ROW_MAX(x) {KILN_ROW_MAX, NULL, 1, {x}}
#define ROW_MIN(x) {KILN_ROW_MIN, NULL, 1, {x}}
const kiln_row_recipe kiln_op_rows[KILN_OP_COUNT] = {
#define KILN_OP(...)
#define KILN_ROWS(ENUM, axis_, ...) [KILN_OP_##ENUM] = {.axis = KILN_ROWS_##axis_, .step = {__VA_ARGS__}},
#include "ops.def"
#undef KILN_ROWS
#undef KILN_OP
};
#undef IN
#undef STEP
#undef ROW_EXPR
#undef ROW_SUM
#undef ROW_MEAN
#undef ROW_MAX
#undef ROW_MIN

const kiln_op_info *kiln_op_get(kiln_op op) {
    return (unsigned)op < KILN_OP_COUNT ? &kiln_op_table[op] : NULL;
}

kiln_op kiln_op_from_name(const char *name) {
    for (int op = 0; op < KILN_OP_COUNT; op++)
        if (strcmp(kiln_op_table[op].name, name) == 0) return (kiln_op)op;
    return KILN_OP_COUNT;
}

bool kiln_op_differentiable(kiln_op op) {
    return (unsigned)op < KILN_OP_COUNT && kiln_op_table[op].grad != kiln_grad_none;
}
