/* The op table's control-flow entries (if, while, while_grad). Their bodies run compiled graphs and
 * their gradients trace backward bodies: work of the layers above ops, which fill in
 * kiln_hooks.control_* when the library loads (runtime/control_flow.c, ir/control_grad.c). The
 * op table reaches them only through these forwarders, so ops links to nothing above it. */
#include "../core/hooks.h"

static kiln_status not_loaded(kiln_op op, const char *what) {
    return kiln_error(KILN_ERR_RUNTIME, "%s: no %s registered (the control-flow layer is not loaded)",
                      kiln_op_table[op].name, what);
}

static kiln_status infer(kiln_op op, int nin, kiln_tensor *const *in, const kiln_attrs *a, kiln_meta *out) {
    return kiln_hooks.control_infer ? kiln_hooks.control_infer(op, nin, in, a, out) : not_loaded(op, "shape rule");
}

static kiln_status kernel(kiln_op op, kiln_tensor *const *in, int nin, const kiln_attrs *a, kiln_tensor **out) {
    return kiln_hooks.control_kernel ? kiln_hooks.control_kernel(op, in, nin, a, out) : not_loaded(op, "kernel");
}

static kiln_status grad(kiln_op op, const kiln_grad_ctx *ctx, kiln_tensor *const *gout, kiln_tensor **gin) {
    return kiln_hooks.control_grad ? kiln_hooks.control_grad(op, ctx, gout, gin) : not_loaded(op, "gradient rule");
}

KILN_INFER(if) { return infer(KILN_OP_IF, nin, in, a, out); }
KILN_INFER(while) { return infer(KILN_OP_WHILE, nin, in, a, out); }
KILN_INFER(while_grad) { return infer(KILN_OP_WHILE_GRAD, nin, in, a, out); }
KILN_KERNEL(if) { return kernel(KILN_OP_IF, in, nin, a, out); }
KILN_KERNEL(while) { return kernel(KILN_OP_WHILE, in, nin, a, out); }
KILN_KERNEL(while_grad) { return kernel(KILN_OP_WHILE_GRAD, in, nin, a, out); }
KILN_GRAD(if) { return grad(KILN_OP_IF, ctx, gout, gin); }
KILN_GRAD(while) { return grad(KILN_OP_WHILE, ctx, gout, gin); }
KILN_GRAD(while_grad) { return grad(KILN_OP_WHILE_GRAD, ctx, gout, gin); }
