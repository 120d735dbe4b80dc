"""PyTorch's epoch schedulers (torch.optim.lr_scheduler; MindSpore's
mindspore.experimental.optim.lr_scheduler): scheduler.step() after each epoch sets the rate of
every group of the optimizer to the rule's value at the new epoch, computed from the group's
initial rate in closed form.

The optimizer's rates become 0-d tensors (Optimizer.rates_as_tensors) that step() writes in place
and the updates read when they run, so a training step compiled by kiln.jit follows the schedule
without compiling again. (MindSpore's own per-step schedules, nn.cosine_decay_lr and the
LearningRateSchedule cells, are given to the optimizer as its learning_rate instead.)"""
import math
import numbers

from ..grad_mode import no_grad


class LRScheduler:
    """Base class: lr_at(base_lr, epoch) gives a group's rate at an epoch (0 is the initial one)."""

    def __init__(self, optimizer, last_epoch=-1):
        if not hasattr(optimizer, "rates_as_tensors"):
            raise TypeError(f"{type(self).__name__}: expected a kiln.nn optimizer, got {type(optimizer).__name__}")
        if last_epoch != -1:
            raise ValueError(f"{type(self).__name__}: last_epoch={last_epoch}: resuming is done by "
                             f"load_state_dict (last_epoch=-1 starts the schedule)")
        self.optimizer = optimizer
        self.rates = optimizer.rates_as_tensors()
        self.base_lrs = [float(r.item()) for r in self.rates]
        self.last_epoch = -1
        self.step()

    def lr_at(self, base_lr, epoch):
        raise NotImplementedError

    def step(self, epoch=None):
        """Moves to the next epoch (or to epoch) and writes each group's rate."""
        self.last_epoch = self.last_epoch + 1 if epoch is None else int(epoch)
        values = self.rates_at(self.last_epoch)
        with no_grad():
            for rate, value in zip(self.rates, values):
                rate[...] = float(value)

    def rates_at(self, epoch):
        return [self.lr_at(base, epoch) for base in self.base_lrs]

    def get_last_lr(self):
        """The rates step() set last, one per group."""
        return [float(r.item()) for r in self.rates]

    def state_dict(self):
        return {"last_epoch": self.last_epoch, "base_lrs": list(self.base_lrs)}

    def load_state_dict(self, state):
        self.base_lrs = [float(v) for v in state["base_lrs"]]
        self.step(state["last_epoch"])


def _positive_int(cls, name, v):
    if not isinstance(v, numbers.Integral) or isinstance(v, bool) or v <= 0:
        raise ValueError(f"{cls}: {name} must be a positive int, got {v!r}")
    return int(v)


class StepLR(LRScheduler):
    """lr = base_lr * gamma ** (epoch // step_size)."""

    def __init__(self, optimizer, step_size, gamma=0.1, last_epoch=-1):
        self.step_size = _positive_int("StepLR", "step_size", step_size)
        self.gamma = float(gamma)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr, epoch):
        return base_lr * self.gamma ** (epoch // self.step_size)


class MultiStepLR(LRScheduler):
    """lr = base_lr * gamma ** (the number of milestones <= epoch)."""

    def __init__(self, optimizer, milestones, gamma=0.1, last_epoch=-1):
        self.milestones = sorted(int(m) for m in milestones)
        self.gamma = float(gamma)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr, epoch):
        return base_lr * self.gamma ** sum(m <= epoch for m in self.milestones)


class ExponentialLR(LRScheduler):
    """lr = base_lr * gamma ** epoch."""

    def __init__(self, optimizer, gamma, last_epoch=-1):
        self.gamma = float(gamma)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr, epoch):
        return base_lr * self.gamma ** epoch


class CosineAnnealingLR(LRScheduler):
    """lr = eta_min + (base_lr - eta_min) * (1 + cos(pi * epoch / T_max)) / 2 (PyTorch's closed form)."""

    def __init__(self, optimizer, T_max, eta_min=0.0, last_epoch=-1):
        self.T_max = _positive_int("CosineAnnealingLR", "T_max", T_max)
        self.eta_min = float(eta_min)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr, epoch):
        return self.eta_min + (base_lr - self.eta_min) * (1 + math.cos(math.pi * epoch / self.T_max)) / 2


class LambdaLR(LRScheduler):
    """lr = base_lr * lr_lambda(epoch) (one function, or one per group)."""

    def __init__(self, optimizer, lr_lambda, last_epoch=-1):
        self.lr_lambda = lr_lambda
        super().__init__(optimizer, last_epoch)

    def rates_at(self, epoch):
        fns = self.lr_lambda if isinstance(self.lr_lambda, (list, tuple)) else [self.lr_lambda] * len(self.base_lrs)
        if len(fns) != len(self.base_lrs):
            raise ValueError(f"LambdaLR: {len(fns)} functions for {len(self.base_lrs)} parameter groups")
        return [base * fn(epoch) for base, fn in zip(self.base_lrs, fns)]
