/* Where Winograd pays in training graphs: the cost rule the O1 pass conv_algorithm applies to
 * each 3x3 convolution of a graph that computes gradients (src/ops/conv_winograd.c). */
#ifndef KILN_OPS_CONV_WINOGRAD_COST_H
#define KILN_OPS_CONV_WINOGRAD_COST_H

#include <stdbool.h>
#include <stdint.h>

#include "conv_dnnl.h"

/* Whether Winograd F(4x4, 3x3) computes `kind` of p (3x3, stride 1, dilation 1, one group,
 * float32) faster than the direct convolution on this CPU (oneDNN's Winograd on AVX-512,
 * kiln's own elsewhere), and within the error kiln documents (docs/guide/jit.md). */
bool kiln_conv_winograd_pays(kiln_conv_kind kind, const kiln_conv_params *p);

#endif
