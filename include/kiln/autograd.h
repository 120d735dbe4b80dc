/* kiln — reverse-mode autodiff. kiln_apply records a node for each differentiable op whose
 * inputs require grad (while grad mode is on); gradient rules emit ops through kiln_apply,
 * so a backward pass is made of ordinary ops. */
#ifndef KILN_AUTOGRAD_H
#define KILN_AUTOGRAD_H

#include "kiln/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

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

/* Gradient hooks (Tensor.register_hook). add_hook copies hook and runs it, with the others of t in the
 * order they were added, on t's gradient in every backward pass that reaches t: a leaf's once the pass
 * has summed all of it, before it is delivered (into .grad, or as a requested gradient); another
 * tensor's when its gradient is complete, before it flows into the op that made t. What a hook
 * returns replaces the gradient from there on. A hook is not run when no gradient reaches t. *id gets
 * the hook's id. The tensor must require grad (else an error; hook->release runs then too). */
KILN_API kiln_status kiln_autograd_add_hook(kiln_tensor *t, const kiln_grad_hook *hook, int64_t *id);
/* Removes (and releases) the hook id from t; false when t holds no such hook. */
KILN_API bool kiln_autograd_remove_hook(kiln_tensor *t, int64_t id);
/* Whether a hook would see t's gradient. */
KILN_API bool kiln_autograd_has_hooks(const kiln_tensor *t);

#ifdef __cplusplus
}
#endif
#endif
