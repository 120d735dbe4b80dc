/* The activations a conv2d_fused node can apply as its last step (attribute i[11]) and the
 * activation layouts, shared by the conv kernels and the passes. Codes are stable: they
 * appear in IR text. */
#ifndef KILN_OPS_CONV_EPILOGUE_H
#define KILN_OPS_CONV_EPILOGUE_H

#include "../core/internal.h"

/* Activation layouts of conv2d_fused (attribute i[12]) and of the relayout op. The blocked
 * layouts are oneDNN's nChw16c and nChw8c: the channels split into blocks of 16 (what its
 * AVX-512 kernels read) or 8 (its AVX2, AVX and SSE4.1 kernels); which one a graph uses is
 * chosen per CPU (kiln_conv_block_size). */
typedef enum kiln_conv_layout {
    KILN_CONV_NCHW,      /* (N, C, H, W) */
    KILN_CONV_NHWC,      /* (N, H, W, C) */
    KILN_CONV_BLOCKED16, /* (N, C/16, H, W, 16): oneDNN's nChw16c, C a multiple of 16 */
    KILN_CONV_BLOCKED8,  /* (N, C/8, H, W, 8): oneDNN's nChw8c, C a multiple of 8 */
    KILN_CONV_LAYOUT_COUNT,
} kiln_conv_layout;

/* The channel block of a blocked layout; 0 for the others. */
static inline int64_t kiln_conv_layout_block(kiln_conv_layout layout) {
    return layout == KILN_CONV_BLOCKED16 ? 16 : layout == KILN_CONV_BLOCKED8 ? 8 : 0;
}

/* The blocked layout of channel block `block` (16 or 8); NCHW for any other. */
static inline kiln_conv_layout kiln_conv_blocked_layout(int64_t block) {
    return block == 16 ? KILN_CONV_BLOCKED16 : block == 8 ? KILN_CONV_BLOCKED8 : KILN_CONV_NCHW;
}

/* The channel block of the blocked layout that the fastest float32 convolutions of the CPU
 * oneDNN runs on read: 16 with AVX-512, 8 with AVX2, AVX or SSE4.1, 0 where it has no blocked
 * kernels. From the instruction set oneDNN will use (dnnl_get_effective_cpu_isa: so
 * ONEDNN_MAX_CPU_ISA=AVX2 gives 8 on an AVX-512 machine). Defined in conv_dnnl.c. */
int kiln_conv_block_size(void);

/* The shape of the NCHW tensor s in `layout` (5-D for the blocked ones; C divisible by the block). */
static inline int kiln_conv_layout_shape(kiln_conv_layout layout, const int64_t *s, int64_t *out) {
    int64_t b = kiln_conv_layout_block(layout);
    if (b) {
        int64_t blk[5] = {s[0], s[1] / b, s[2], s[3], b};
        return memcpy(out, blk, sizeof blk), 5;
    }
    int64_t nhwc[4] = {s[0], s[2], s[3], s[1]};
    memcpy(out, layout == KILN_CONV_NHWC ? nhwc : s, sizeof nhwc);
    return 4;
}

/* The NCHW shape of s, a tensor in `layout`. */
static inline void kiln_conv_layout_nchw(kiln_conv_layout layout, const int64_t *s, int64_t *out) {
    int64_t b = kiln_conv_layout_block(layout);
    int64_t nchw[4] = {s[0], s[3], s[1], s[2]}, blk[4] = {s[0], s[1] * b, s[2], s[3]};
    memcpy(out, layout == KILN_CONV_NHWC ? nchw : b ? blk : s, sizeof nchw);
}

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
