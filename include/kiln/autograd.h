/* kiln — reverse-mode autodiff. kiln_apply records a node for each differentiable op whose
 * inputs require grad (while grad mode is on); gradient rules emit ops through kiln_apply,
 * so a backward pass is made of ordinary ops. */
#ifndef KILN_AUTOGRAD_H
#define KILN_AUTOGRAD_H

#ifdef __cplusplus
extern "C" {
#endif

/* What a gradient rule sees. in/out hold the saved tensors (detached) when the op's flags ask
 * for them, else NULL; their metas are always available. */
typedef struct kiln_grad_ctx {
    kiln_op op;
    int nin, nout;
    kiln_tensor *const *in;
    kiln_tensor *const *out;
    const kiln_meta *in_meta;
    const kiln_meta *out_meta;
    const kiln_attrs *attrs;
    const bool *needs_grad; /* per input */
} kiln_grad_ctx;

/* Grad mode (thread-local, on by default). Returns the previous value. */
KILN_API bool kiln_grad_enabled(void);
KILN_API bool kiln_set_grad_enabled(bool enabled);

KILN_API kiln_status kiln_tensor_set_requires_grad(kiln_tensor *t, bool requires_grad);

/* Gradients of outputs with respect to inputs, like torch.autograd.grad. grad_outputs may be
 * NULL or hold NULL entries, meaning ones. grads[j] gets a new reference, or NULL when
 * inputs[j] does not influence the outputs. With create_graph the backward ops are recorded
 * so the gradients can be differentiated again. */
KILN_API kiln_status kiln_autograd_grad(int nout, kiln_tensor *const *outputs,
                                        kiln_tensor *const *grad_outputs, int nin,
                                        kiln_tensor *const *inputs, bool create_graph,
                                        kiln_tensor **grads);
/* Accumulates the gradients of outputs into the .grad of every leaf that requires grad. */
KILN_API kiln_status kiln_autograd_backward(int nout, kiln_tensor *const *outputs,
                                            kiln_tensor *const *grad_outputs);

/* Sentinel gradient rule of ops that are not differentiable (ops.def `none`). */
KILN_API kiln_status kiln_grad_none(const kiln_grad_ctx *ctx, kiln_tensor *const *gout,
                                    kiln_tensor **gin);
KILN_API bool kiln_op_differentiable(kiln_op op);

#ifdef __cplusplus
}
#endif
#endif
