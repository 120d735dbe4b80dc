/* Private to conv.c (and the C tests): kiln's own Winograd convolution F(4x4, 3x3), float32,
 * for 3x3 convolutions of stride 1, dilation 1, one group, with the conv2d_fused epilogue
 * (bias, residual, activation) applied as the output tiles are written. Activations in any
 * kiln_conv_layout, weights OIHW. oneDNN has Winograd only for AVX-512; this one serves the
 * other CPUs in inference graphs. */
#ifndef KILN_OPS_CONV_WINOGRAD_H
#define KILN_OPS_CONV_WINOGRAD_H

#include "conv_dnnl.h"

/* Whether kiln_conv_winograd_run computes problem p with epilogue ep at all: 3x3, stride 1,
 * dilation 1, groups 1 (any sizes, paddings and channel counts). */
bool kiln_conv_winograd_fits(const kiln_conv_params *p, const kiln_conv_epilogue *ep);

/* Whether conv2d_fused runs p through kiln's Winograd: it fits, Winograd is allowed (ep's
 * winograd: inference graphs), oneDNN has no Winograd of its own on this CPU, and the
 * problem is large enough in channels and pixels for the cut in multiplications to beat the
 * cost of the transforms (the direct kernel wins on few channels or tiny images). */
bool kiln_conv_winograd_chosen(const kiln_conv_params *p, const kiln_conv_epilogue *ep);

/* y = act(conv(x, w) + bias + residual) for a problem that fits; bias and residual may be
 * NULL; x, residual and y contiguous in ep->layout, w contiguous OIHW. The weights'
 * transform is kept and reused while w holds the same values. Multi-threaded (OpenMP).
 * *ran is false, and nothing written, when x or w holds a NaN, an infinity or a magnitude of
 * 2^64 or more: Winograd's transforms would spread it over the whole tile (the caller runs
 * the direct convolution instead). */
kiln_status kiln_conv_winograd_run(const kiln_conv_params *p, const kiln_conv_epilogue *ep, const float *x,
                                   const float *w, const float *bias, const float *residual, float *y, bool *ran);

/* The same computation in plain loops, one output tile and channel at a time: the reference
 * the fast kernel is tested against. */
kiln_status kiln_conv_winograd_reference(const kiln_conv_params *p, const kiln_conv_epilogue *ep, const float *x,
                                         const float *w, const float *bias, const float *residual, float *y);

/* ---- training graphs (the O1 pass conv_algorithm sets ep->winograd / the backward ops' flag) */

/* Whether kiln's Winograd runs `kind` for p with Winograd allowed by ep (layout NCHW for the
 * backward ops): as kiln_conv_winograd_chosen, on the transposed problem for backward-input
 * (which needs paddings of at most 2). */
bool kiln_conv_winograd_chosen_for(kiln_conv_kind kind, const kiln_conv_params *p, const kiln_conv_epilogue *ep);

/* gx (N, C, H, W) = conv2d_backward_input(gy, w) of p (3x3, stride 1, paddings at most 2) as
 * the forward Winograd of gy by the turned, channel-swapped filter; NCHW, contiguous. *ran as
 * for kiln_conv_winograd_run (false also when a padding exceeds 2). */
kiln_status kiln_conv_winograd_backward_input(const kiln_conv_params *p, const float *gy, const float *w, float *gx,
                                              bool *ran);
kiln_status kiln_conv_winograd_backward_input_reference(const kiln_conv_params *p, const float *gy, const float *w,
                                                        float *gx);

/* gw (O, C, 3, 3) = conv2d_backward_weight(x, gy) of p: both operands' tiles transformed,
 * multiplied per transformed position and summed over tiles (one GEMM per position),
 * inverse-transformed to 3x3; NCHW, contiguous. *ran false (nothing written) when x or gy
 * holds a NaN, an infinity or a huge value. The reference: the same in plain loops. */
kiln_status kiln_conv_winograd_backward_weight(const kiln_conv_params *p, const float *x, const float *gy, float *gw,
                                               bool *ran);
kiln_status kiln_conv_winograd_backward_weight_reference(const kiln_conv_params *p, const float *x, const float *gy,
                                                         float *gw);

#endif
