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

/* A node whose gradient is computed by the caller (kiln.jit runs a compiled piece's backward graph
 * there): backward gets the nout output gradients (NULL where none reached an output), which
 * inputs need one, and writes gin[k] (a new reference, or NULL: zero) for each. release(ctx) runs
 * once, when the node is freed. name is what grad_fn names (static storage). */
typedef struct kiln_custom_grad {
    kiln_status (*backward)(void *ctx, int nout, kiln_tensor *const *grads, int nin, const bool *needs,
                            bool create_graph, kiln_tensor **gin);
    void (*release)(void *ctx);
    void *ctx;
    const char *name;
} kiln_custom_grad;

/* Records out (nout tensors just made, without history) as the outputs of one node over in, whose
 * gradient rule is fn (copied; the node owns fn->ctx from here on, on failure too). Only float
 * outputs get the node; nothing is recorded when no input requires grad or grad mode is off (then
 * fn->release runs at once). */
KILN_API kiln_status kiln_autograd_record_custom(int nin, kiln_tensor *const *in, int nout, kiln_tensor **out,
                                                 const kiln_custom_grad *fn);

/* Sentinel gradient rule of ops that are not differentiable (ops.def `none`). */
KILN_API kiln_status kiln_grad_none(const kiln_grad_ctx *ctx, kiln_tensor *const *gout,
                                    kiln_tensor **gin);
KILN_API bool kiln_op_differentiable(kiln_op op);

#ifdef __cplusplus
}
#endif
#endif
