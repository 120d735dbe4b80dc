/* DEVELOPMENT ONLY: weak placeholders for op functions not yet written, so the library links
 * while op families land one by one. Each reports NOT_IMPLEMENTED. Delete this file once every
 * function named in ops.def exists (a missing one is then a link error). */
#include "../core/internal.h"

kiln_status kiln_pending_infer(kiln_tensor *const *in, int nin, const kiln_attrs *a, kiln_meta *out);
kiln_status kiln_pending_kernel(kiln_tensor *const *in, int nin, const kiln_attrs *a, kiln_tensor **out);
kiln_status kiln_pending_grad(const kiln_grad_ctx *ctx, kiln_tensor *const *gout, kiln_tensor **gin);

kiln_status kiln_pending_infer(kiln_tensor *const *in, int nin, const kiln_attrs *a, kiln_meta *out) {
    (void)in, (void)nin, (void)a, (void)out;
    return kiln_error(KILN_ERR_NOT_IMPLEMENTED, "this op is not implemented yet");
}
kiln_status kiln_pending_kernel(kiln_tensor *const *in, int nin, const kiln_attrs *a, kiln_tensor **out) {
    (void)in, (void)nin, (void)a, (void)out;
    return kiln_error(KILN_ERR_NOT_IMPLEMENTED, "this op is not implemented yet");
}
kiln_status kiln_pending_grad(const kiln_grad_ctx *ctx, kiln_tensor *const *gout, kiln_tensor **gin) {
    (void)ctx, (void)gout, (void)gin;
    return kiln_error(KILN_ERR_NOT_IMPLEMENTED, "this gradient is not implemented yet");
}

#pragma weak kiln_infer_unary_same = kiln_pending_infer
#pragma weak kiln_infer_unary_float = kiln_pending_infer
#pragma weak kiln_infer_unary_bool = kiln_pending_infer
#pragma weak kiln_infer_cast = kiln_pending_infer
#pragma weak kiln_infer_binary_arith = kiln_pending_infer
#pragma weak kiln_infer_binary_float = kiln_pending_infer
#pragma weak kiln_infer_compare = kiln_pending_infer
#pragma weak kiln_infer_where = kiln_pending_infer
#pragma weak kiln_infer_reduce = kiln_pending_infer
#pragma weak kiln_infer_reduce_float = kiln_pending_infer
#pragma weak kiln_infer_reduce_same = kiln_pending_infer
#pragma weak kiln_infer_reduce_index = kiln_pending_infer
#pragma weak kiln_infer_matmul = kiln_pending_infer
#pragma weak kiln_infer_linear = kiln_pending_infer
#pragma weak kiln_infer_conv2d = kiln_pending_infer
#pragma weak kiln_infer_conv2d_backward_input = kiln_pending_infer
#pragma weak kiln_infer_conv2d_backward_weight = kiln_pending_infer
#pragma weak kiln_infer_pool2d = kiln_pending_infer
#pragma weak kiln_infer_max_pool2d_backward = kiln_pending_infer
#pragma weak kiln_infer_avg_pool2d_backward = kiln_pending_infer
#pragma weak kiln_infer_batch_norm = kiln_pending_infer
#pragma weak kiln_infer_batch_norm_backward = kiln_pending_infer
#pragma weak kiln_infer_layer_norm = kiln_pending_infer
#pragma weak kiln_infer_layer_norm_backward = kiln_pending_infer
#pragma weak kiln_infer_rms_norm = kiln_pending_infer
#pragma weak kiln_infer_rms_norm_backward = kiln_pending_infer
#pragma weak kiln_infer_dropout = kiln_pending_infer
#pragma weak kiln_infer_reshape = kiln_pending_infer
#pragma weak kiln_infer_permute = kiln_pending_infer
#pragma weak kiln_infer_expand = kiln_pending_infer
#pragma weak kiln_infer_slice = kiln_pending_infer
#pragma weak kiln_infer_slice_assign = kiln_pending_infer
#pragma weak kiln_infer_unary_any = kiln_pending_infer
#pragma weak kiln_infer_concat = kiln_pending_infer
#pragma weak kiln_infer_gather = kiln_pending_infer
#pragma weak kiln_infer_index_add = kiln_pending_infer
#pragma weak kiln_infer_gather_elements = kiln_pending_infer
#pragma weak kiln_infer_scatter_add_elements = kiln_pending_infer
#pragma weak kiln_infer_index_put = kiln_pending_infer
#pragma weak kiln_infer_full = kiln_pending_infer
#pragma weak kiln_infer_arange = kiln_pending_infer
#pragma weak kiln_infer_eye = kiln_pending_infer
#pragma weak kiln_infer_sgd_update = kiln_pending_infer
#pragma weak kiln_infer_adam_update = kiln_pending_infer
#pragma weak kiln_kernel_neg = kiln_pending_kernel
#pragma weak kiln_kernel_abs = kiln_pending_kernel
#pragma weak kiln_kernel_sign = kiln_pending_kernel
#pragma weak kiln_kernel_exp = kiln_pending_kernel
#pragma weak kiln_kernel_log = kiln_pending_kernel
#pragma weak kiln_kernel_sqrt = kiln_pending_kernel
#pragma weak kiln_kernel_rsqrt = kiln_pending_kernel
#pragma weak kiln_kernel_sin = kiln_pending_kernel
#pragma weak kiln_kernel_cos = kiln_pending_kernel
#pragma weak kiln_kernel_tanh = kiln_pending_kernel
#pragma weak kiln_kernel_sigmoid = kiln_pending_kernel
#pragma weak kiln_kernel_relu = kiln_pending_kernel
#pragma weak kiln_kernel_gelu = kiln_pending_kernel
#pragma weak kiln_kernel_silu = kiln_pending_kernel
#pragma weak kiln_kernel_erf = kiln_pending_kernel
#pragma weak kiln_kernel_logical_not = kiln_pending_kernel
#pragma weak kiln_kernel_clamp = kiln_pending_kernel
#pragma weak kiln_kernel_cast = kiln_pending_kernel
#pragma weak kiln_kernel_add = kiln_pending_kernel
#pragma weak kiln_kernel_sub = kiln_pending_kernel
#pragma weak kiln_kernel_mul = kiln_pending_kernel
#pragma weak kiln_kernel_div = kiln_pending_kernel
#pragma weak kiln_kernel_pow = kiln_pending_kernel
#pragma weak kiln_kernel_maximum = kiln_pending_kernel
#pragma weak kiln_kernel_minimum = kiln_pending_kernel
#pragma weak kiln_kernel_eq = kiln_pending_kernel
#pragma weak kiln_kernel_ne = kiln_pending_kernel
#pragma weak kiln_kernel_lt = kiln_pending_kernel
#pragma weak kiln_kernel_le = kiln_pending_kernel
#pragma weak kiln_kernel_gt = kiln_pending_kernel
#pragma weak kiln_kernel_ge = kiln_pending_kernel
#pragma weak kiln_kernel_logical_and = kiln_pending_kernel
#pragma weak kiln_kernel_logical_or = kiln_pending_kernel
#pragma weak kiln_kernel_where = kiln_pending_kernel
#pragma weak kiln_kernel_relu_backward = kiln_pending_kernel
#pragma weak kiln_kernel_gelu_backward = kiln_pending_kernel
#pragma weak kiln_kernel_silu_backward = kiln_pending_kernel
#pragma weak kiln_kernel_sigmoid_backward = kiln_pending_kernel
#pragma weak kiln_kernel_tanh_backward = kiln_pending_kernel
#pragma weak kiln_kernel_sum = kiln_pending_kernel
#pragma weak kiln_kernel_mean = kiln_pending_kernel
#pragma weak kiln_kernel_prod = kiln_pending_kernel
#pragma weak kiln_kernel_max = kiln_pending_kernel
#pragma weak kiln_kernel_min = kiln_pending_kernel
#pragma weak kiln_kernel_var = kiln_pending_kernel
#pragma weak kiln_kernel_std = kiln_pending_kernel
#pragma weak kiln_kernel_argmax = kiln_pending_kernel
#pragma weak kiln_kernel_argmin = kiln_pending_kernel
#pragma weak kiln_kernel_softmax = kiln_pending_kernel
#pragma weak kiln_kernel_log_softmax = kiln_pending_kernel
#pragma weak kiln_kernel_softmax_backward = kiln_pending_kernel
#pragma weak kiln_kernel_log_softmax_backward = kiln_pending_kernel
#pragma weak kiln_kernel_matmul = kiln_pending_kernel
#pragma weak kiln_kernel_linear = kiln_pending_kernel
#pragma weak kiln_kernel_conv2d = kiln_pending_kernel
#pragma weak kiln_kernel_conv2d_backward_input = kiln_pending_kernel
#pragma weak kiln_kernel_conv2d_backward_weight = kiln_pending_kernel
#pragma weak kiln_kernel_max_pool2d = kiln_pending_kernel
#pragma weak kiln_kernel_max_pool2d_backward = kiln_pending_kernel
#pragma weak kiln_kernel_avg_pool2d = kiln_pending_kernel
#pragma weak kiln_kernel_avg_pool2d_backward = kiln_pending_kernel
#pragma weak kiln_kernel_batch_norm = kiln_pending_kernel
#pragma weak kiln_kernel_batch_norm_backward = kiln_pending_kernel
#pragma weak kiln_kernel_layer_norm = kiln_pending_kernel
#pragma weak kiln_kernel_layer_norm_backward = kiln_pending_kernel
#pragma weak kiln_kernel_rms_norm = kiln_pending_kernel
#pragma weak kiln_kernel_rms_norm_backward = kiln_pending_kernel
#pragma weak kiln_kernel_dropout = kiln_pending_kernel
#pragma weak kiln_kernel_reshape = kiln_pending_kernel
#pragma weak kiln_kernel_permute = kiln_pending_kernel
#pragma weak kiln_kernel_expand = kiln_pending_kernel
#pragma weak kiln_kernel_slice = kiln_pending_kernel
#pragma weak kiln_kernel_slice_assign = kiln_pending_kernel
#pragma weak kiln_kernel_contiguous = kiln_pending_kernel
#pragma weak kiln_kernel_concat = kiln_pending_kernel
#pragma weak kiln_kernel_gather = kiln_pending_kernel
#pragma weak kiln_kernel_index_add = kiln_pending_kernel
#pragma weak kiln_kernel_gather_elements = kiln_pending_kernel
#pragma weak kiln_kernel_scatter_add_elements = kiln_pending_kernel
#pragma weak kiln_kernel_index_put = kiln_pending_kernel
#pragma weak kiln_kernel_full = kiln_pending_kernel
#pragma weak kiln_kernel_arange = kiln_pending_kernel
#pragma weak kiln_kernel_linspace = kiln_pending_kernel
#pragma weak kiln_kernel_eye = kiln_pending_kernel
#pragma weak kiln_kernel_rand = kiln_pending_kernel
#pragma weak kiln_kernel_randn = kiln_pending_kernel
#pragma weak kiln_kernel_sgd_update = kiln_pending_kernel
#pragma weak kiln_kernel_adam_update = kiln_pending_kernel
#pragma weak kiln_grad_neg = kiln_pending_grad
#pragma weak kiln_grad_abs = kiln_pending_grad
#pragma weak kiln_grad_exp = kiln_pending_grad
#pragma weak kiln_grad_log = kiln_pending_grad
#pragma weak kiln_grad_sqrt = kiln_pending_grad
#pragma weak kiln_grad_rsqrt = kiln_pending_grad
#pragma weak kiln_grad_sin = kiln_pending_grad
#pragma weak kiln_grad_cos = kiln_pending_grad
#pragma weak kiln_grad_tanh = kiln_pending_grad
#pragma weak kiln_grad_sigmoid = kiln_pending_grad
#pragma weak kiln_grad_relu = kiln_pending_grad
#pragma weak kiln_grad_gelu = kiln_pending_grad
#pragma weak kiln_grad_silu = kiln_pending_grad
#pragma weak kiln_grad_erf = kiln_pending_grad
#pragma weak kiln_grad_clamp = kiln_pending_grad
#pragma weak kiln_grad_cast = kiln_pending_grad
#pragma weak kiln_grad_add = kiln_pending_grad
#pragma weak kiln_grad_sub = kiln_pending_grad
#pragma weak kiln_grad_mul = kiln_pending_grad
#pragma weak kiln_grad_div = kiln_pending_grad
#pragma weak kiln_grad_pow = kiln_pending_grad
#pragma weak kiln_grad_maximum = kiln_pending_grad
#pragma weak kiln_grad_minimum = kiln_pending_grad
#pragma weak kiln_grad_where = kiln_pending_grad
#pragma weak kiln_grad_sum = kiln_pending_grad
#pragma weak kiln_grad_mean = kiln_pending_grad
#pragma weak kiln_grad_prod = kiln_pending_grad
#pragma weak kiln_grad_max = kiln_pending_grad
#pragma weak kiln_grad_min = kiln_pending_grad
#pragma weak kiln_grad_var = kiln_pending_grad
#pragma weak kiln_grad_std = kiln_pending_grad
#pragma weak kiln_grad_softmax = kiln_pending_grad
#pragma weak kiln_grad_log_softmax = kiln_pending_grad
#pragma weak kiln_grad_matmul = kiln_pending_grad
#pragma weak kiln_grad_linear = kiln_pending_grad
#pragma weak kiln_grad_conv2d = kiln_pending_grad
#pragma weak kiln_grad_max_pool2d = kiln_pending_grad
#pragma weak kiln_grad_avg_pool2d = kiln_pending_grad
#pragma weak kiln_grad_batch_norm = kiln_pending_grad
#pragma weak kiln_grad_layer_norm = kiln_pending_grad
#pragma weak kiln_grad_rms_norm = kiln_pending_grad
#pragma weak kiln_grad_dropout = kiln_pending_grad
#pragma weak kiln_grad_reshape = kiln_pending_grad
#pragma weak kiln_grad_permute = kiln_pending_grad
#pragma weak kiln_grad_expand = kiln_pending_grad
#pragma weak kiln_grad_slice = kiln_pending_grad
#pragma weak kiln_grad_slice_assign = kiln_pending_grad
#pragma weak kiln_grad_contiguous = kiln_pending_grad
#pragma weak kiln_grad_concat = kiln_pending_grad
#pragma weak kiln_grad_gather = kiln_pending_grad
#pragma weak kiln_grad_index_add = kiln_pending_grad
#pragma weak kiln_grad_gather_elements = kiln_pending_grad
#pragma weak kiln_grad_scatter_add_elements = kiln_pending_grad
#pragma weak kiln_grad_index_put = kiln_pending_grad
