"""The training step the zoo's examples share: one value_and_grad of the loss over the optimizer's
parameters, the update (after clipping the gradients' global norm, when asked), and the loss;
eagerly (mode "eager") or under kiln.jit with that capture mode."""
import kiln
from kiln import ops


def train_step(loss_of, opt, mode, clip=None):
    """step(*batch) -> loss: loss_of(*batch) differentiated over opt.parameters, then opt."""
    grad_fn = kiln.value_and_grad(loss_of, None, opt.parameters)

    def step(*batch):
        loss, grads = grad_fn(*batch)
        opt(grads if clip is None else ops.clip_by_global_norm(grads, clip))
        return loss

    return step if mode == "eager" else kiln.jit(step, capture_mode=mode)
