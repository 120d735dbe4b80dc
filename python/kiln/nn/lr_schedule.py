"""Learning-rate schedules as MindSpore spells them: list builders (one rate per step, given to an
optimizer as learning_rate=[...]) and LearningRateSchedule Cells (called with the step count;
given as learning_rate=CosineDecayLR(...)). An optimizer computes either from its step counter
inside a compiled training step, so one compiled step follows the schedule without recompiling."""
import math

from .. import _C
from .. import ops
from .cell import Cell


def _positive_int(fn, name, v):
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise ValueError(f"{fn}: {name} must be a positive int, got {v!r}")
    return v


def _epochs(fn, total_step, step_per_epoch):
    _positive_int(fn, "total_step", total_step)
    _positive_int(fn, "step_per_epoch", step_per_epoch)
    return [i // step_per_epoch for i in range(total_step)]


def cosine_decay_lr(min_lr, max_lr, total_step, step_per_epoch, decay_epoch):
    """min_lr + (max_lr - min_lr) (1 + cos(pi * epoch / decay_epoch)) / 2 per step."""
    _positive_int("cosine_decay_lr", "decay_epoch", decay_epoch)
    return [min_lr + 0.5 * (max_lr - min_lr) * (1.0 + math.cos(math.pi * min(e, decay_epoch) / decay_epoch))
            for e in _epochs("cosine_decay_lr", total_step, step_per_epoch)]


def exponential_decay_lr(learning_rate, decay_rate, total_step, step_per_epoch, decay_epoch, is_stair=False):
    """learning_rate * decay_rate ** (epoch / decay_epoch) per step (is_stair: the exponent floored)."""
    _positive_int("exponential_decay_lr", "decay_epoch", decay_epoch)
    return [learning_rate * decay_rate ** ((e // decay_epoch) if is_stair else e / decay_epoch)
            for e in _epochs("exponential_decay_lr", total_step, step_per_epoch)]


def polynomial_decay_lr(learning_rate, end_learning_rate, total_step, step_per_epoch, decay_epoch, power,
                        update_decay_epoch=False):
    """(learning_rate - end) * (1 - epoch / decay_epoch) ** power + end per step, epoch held at
    decay_epoch (update_decay_epoch: decay_epoch grows to the next multiple of itself instead)."""
    _positive_int("polynomial_decay_lr", "decay_epoch", decay_epoch)
    out = []
    for e in _epochs("polynomial_decay_lr", total_step, step_per_epoch):
        d = decay_epoch
        if update_decay_epoch:
            d = decay_epoch * max(1, math.ceil(e / decay_epoch))
        t = min(e, d)
        out.append((learning_rate - end_learning_rate) * (1.0 - t / d) ** power + end_learning_rate)
    return out


def piecewise_constant_lr(milestone, learning_rates):
    """learning_rates[k] for the steps before milestone[k] (milestones increasing)."""
    if len(milestone) != len(learning_rates) or not milestone:
        raise ValueError("piecewise_constant_lr: milestone and learning_rates must be non-empty and of one length")
    out, last = [], 0
    for m, lr in zip(milestone, learning_rates):
        if not isinstance(m, int) or m <= last:
            raise ValueError(f"piecewise_constant_lr: milestones must be increasing positive ints, got {milestone}")
        out += [lr] * (m - last)
        last = m
    return out


def warmup_lr(learning_rate, total_step, step_per_epoch, warmup_epoch):
    """learning_rate * min(epoch, warmup_epoch) / warmup_epoch per step."""
    _positive_int("warmup_lr", "warmup_epoch", warmup_epoch)
    return [learning_rate * min(e, warmup_epoch) / warmup_epoch
            for e in _epochs("warmup_lr", total_step, step_per_epoch)]


class LearningRateSchedule(Cell):
    """A schedule as a Cell: construct(global_step) -> the rate (a 0-d float32 tensor)."""

    def __call__(self, global_step):
        step = global_step if isinstance(global_step, _C.TensorBase) else ops.full((), global_step, _C.int64)
        return self.construct(ops.cast(step, _C.float32))


class CosineDecayLR(LearningRateSchedule):
    def __init__(self, min_lr, max_lr, decay_steps):
        super().__init__()
        self.min_lr, self.max_lr = float(min_lr), float(max_lr)
        self.decay_steps = _positive_int("CosineDecayLR", "decay_steps", decay_steps)

    def construct(self, step):
        p = ops.minimum(step, float(self.decay_steps)) / self.decay_steps
        return (ops.cos(p * math.pi) + 1.0) * (0.5 * (self.max_lr - self.min_lr)) + self.min_lr


class WarmUpLR(LearningRateSchedule):
    def __init__(self, learning_rate, warmup_steps):
        super().__init__()
        self.learning_rate = float(learning_rate)
        self.warmup_steps = _positive_int("WarmUpLR", "warmup_steps", warmup_steps)

    def construct(self, step):
        return ops.minimum(step, float(self.warmup_steps)) * (self.learning_rate / self.warmup_steps)


class ExponentialDecayLR(LearningRateSchedule):
    def __init__(self, learning_rate, decay_rate, decay_steps, is_stair=False):
        super().__init__()
        self.learning_rate, self.decay_rate = float(learning_rate), float(decay_rate)
        self.decay_steps = _positive_int("ExponentialDecayLR", "decay_steps", decay_steps)
        self.is_stair = bool(is_stair)

    def construct(self, step):
        p = step / self.decay_steps
        if self.is_stair:
            p = ops.floor_divide(p, 1.0)
        return ops.pow(self.decay_rate, p) * self.learning_rate


class PolynomialDecayLR(LearningRateSchedule):
    def __init__(self, learning_rate, end_learning_rate, decay_steps, power, update_decay_steps=False):
        super().__init__()
        if update_decay_steps:
            raise ValueError("PolynomialDecayLR: update_decay_steps=True is not supported; use polynomial_decay_lr")
        self.learning_rate, self.end = float(learning_rate), float(end_learning_rate)
        self.decay_steps = _positive_int("PolynomialDecayLR", "decay_steps", decay_steps)
        self.power = float(power)

    def construct(self, step):
        p = 1.0 - ops.minimum(step, float(self.decay_steps)) / self.decay_steps
        return ops.pow(p, self.power) * (self.learning_rate - self.end) + self.end


class WarmUpCosineDecayLR(LearningRateSchedule):
    """Linear warm-up to max_lr over warmup_steps, then cosine decay to min_lr over decay_steps (the
    schedule of GPT-style training)."""

    def __init__(self, min_lr, max_lr, warmup_steps, decay_steps):
        super().__init__()
        self.warmup = WarmUpLR(max_lr, warmup_steps)
        self.cosine = CosineDecayLR(min_lr, max_lr, decay_steps)
        self.warmup_steps = warmup_steps

    def construct(self, step):
        after = ops.maximum(step - float(self.warmup_steps), 0.0)
        return ops.where(step < float(self.warmup_steps), self.warmup.construct(step), self.cosine.construct(after))
