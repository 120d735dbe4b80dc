/* The activations a conv2d_fused node can apply as its last step (attribute i[11]), shared by
 * the conv kernels and the fusion pass. Codes are stable: they appear in IR text. */
#ifndef KILN_OPS_CONV_EPILOGUE_H
#define KILN_OPS_CONV_EPILOGUE_H

#include "../core/internal.h"

typedef enum kiln_conv_activation {
    KILN_CONV_ACT_NONE,
    KILN_CONV_ACT_RELU,
    KILN_CONV_ACT_GELU,
    KILN_CONV_ACT_SILU,
    KILN_CONV_ACT_SIGMOID,
    KILN_CONV_ACT_TANH,
    KILN_CONV_ACT_CLAMP, /* f[0] = min, f[1] = max */
    KILN_CONV_ACT_COUNT,
} kiln_conv_activation;

/* The elementwise op of each activation code (NONE: none). */
static const kiln_op kiln_conv_activation_ops[KILN_CONV_ACT_COUNT] = {
    [KILN_CONV_ACT_NONE] = KILN_OP_COUNT,      [KILN_CONV_ACT_RELU] = KILN_OP_RELU,
    [KILN_CONV_ACT_GELU] = KILN_OP_GELU,       [KILN_CONV_ACT_SILU] = KILN_OP_SILU,
    [KILN_CONV_ACT_SIGMOID] = KILN_OP_SIGMOID, [KILN_CONV_ACT_TANH] = KILN_OP_TANH,
    [KILN_CONV_ACT_CLAMP] = KILN_OP_CLAMP,
};

/* The activation code of op, or KILN_CONV_ACT_NONE when conv2d_fused cannot apply it. */
static inline kiln_conv_activation kiln_conv_activation_of(kiln_op op) {
    for (int k = KILN_CONV_ACT_RELU; k < KILN_CONV_ACT_COUNT; k++)
        if (kiln_conv_activation_ops[k] == op) return (kiln_conv_activation)k;
    return KILN_CONV_ACT_NONE;
}

#endif
