/* Private to conv.c / conv_dnnl.c: the geometry of a 2-D convolution and the oneDNN
 * float32 primitives that run it (created once per problem, cached). */
#ifndef KILN_OPS_CONV_DNNL_H
#define KILN_OPS_CONV_DNNL_H

#include "../core/internal.h"

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

/* Runs one convolution on contiguous float32 NCHW / OIHW buffers; `bias` (forward only) may
 * be NULL. KILN_ERR_RUNTIME when oneDNN cannot (the caller falls back to plain loops). */
kiln_status kiln_conv_dnnl_run(kiln_conv_kind kind, const kiln_conv_params *p, const float *a,
                               const float *b, const float *bias, float *out);

#endif
