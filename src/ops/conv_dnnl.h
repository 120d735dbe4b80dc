/* Private to conv.c / conv_dnnl.c / layout.c: the geometry of a 2-D convolution, the oneDNN
 * float32 primitives that run it (created once per problem, cached) and the channels-last
 * transpose. */
#ifndef KILN_OPS_CONV_DNNL_H
#define KILN_OPS_CONV_DNNL_H

#include "../core/internal.h"
#include "conv_epilogue.h"

/* Everything that defines a conv2d problem (all int64: compared with memcmp). */
typedef struct kiln_conv_params {
    int64_t N, C, H, W;   /* input */
    int64_t O, KH, KW;    /* weight (O, C / groups, KH, KW) */
    int64_t OH, OW;       /* output */
    int64_t sh, sw, pt, pb, pl, pr, dh, dw, groups;
} kiln_conv_params;

typedef enum kiln_conv_kind {
    KILN_CONV_FORWARD,          /* (x, w[, b]) -> y */
    KILN_CONV_BACKWARD_INPUT,   /* (gy, w) -> gx */
    KILN_CONV_BACKWARD_WEIGHT,  /* (x, gy) -> gw */
} kiln_conv_kind;

/* What a forward convolution does besides convolving (all int64/double: compared with memcmp):
 * y = activation(conv(x, w) + bias + residual), activations in one kiln_conv_layout. */
typedef struct kiln_conv_epilogue {
    int64_t layout;     /* of x, residual and y (a kiln_conv_layout) */
    int64_t winograd;   /* Winograd allowed (inference): oneDNN's where it has one, else kiln's
                         * (conv_winograd.h) where chosen, else direct */
    int64_t residual;   /* a tensor of y's shape is added after the bias */
    int64_t activation; /* a kiln_conv_activation, applied last */
    double alpha, beta; /* its parameters (clamp: the bounds) */
} kiln_conv_epilogue;

/* Runs one convolution on contiguous float32 buffers: activations NCHW (or ep->layout),
 * weights OIHW. `bias` (forward only), `residual` and `ep` (plain convolution) may be NULL.
 * ep's activation is applied only where kiln_conv_dnnl_applies it: the caller applies the
 * others to `out` afterwards. KILN_ERR_RUNTIME when oneDNN cannot (the caller falls back to
 * plain loops). */
/* Whether kiln_conv_dnnl_run applies `activation` (a kiln_conv_activation) as a post-op: not
 * relu and clamp, which oneDNN computes with max/min instructions that drop NaN. */
bool kiln_conv_dnnl_applies(int64_t activation);

kiln_status kiln_conv_dnnl_run(kiln_conv_kind kind, const kiln_conv_params *p, const kiln_conv_epilogue *ep,
                               const float *a, const float *b, const float *bias, const float *residual, float *out);

/* kiln_conv_dnnl_run on bfloat16 buffers (bias float32): oneDNN's bf16 primitive, accumulating
 * in float32 and rounding each result once; only where kiln_dnnl_bf16_native (dnnl_lowp.h).
 * Winograd is never used (oneDNN has none in bf16). KILN_ERR_RUNTIME when oneDNN cannot, or has
 * only its reference implementation for the problem (the caller converts to float32). */
kiln_status kiln_conv_dnnl_run_bf16(kiln_conv_kind kind, const kiln_conv_params *p, const kiln_conv_epilogue *ep,
                                    const uint16_t *a, const uint16_t *b, const float *bias, const uint16_t *residual,
                                    uint16_t *out);

/* The bf16 convolutions kiln_conv_dnnl_run_bf16 ran in this process. */
int64_t kiln_conv_dnnl_lowp_count(void);

/* Converts float32 activations of NCHW shape `nchw` from one layout to another (oneDNN's
 * reorder, cached per shape). KILN_ERR_RUNTIME when oneDNN cannot. */
kiln_status kiln_conv_dnnl_relayout(const int64_t *nchw, kiln_conv_layout from, kiln_conv_layout to, const float *src,
                                    float *dst);

/* Writes the contiguous x, whose activations are in layout `from`, into the contiguous out in
 * layout `to` (one of the two NCHW); shapes as kiln_conv_layout_shape gives them. */
kiln_status kiln_relayout(const kiln_tensor *x, kiln_conv_layout from, kiln_conv_layout to, kiln_tensor *out);

#endif
