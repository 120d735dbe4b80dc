"""More optimizers with MindSpore's names and rules (PyTorch's spelling as an alias where its rule
is the same): AdamWeightDecay / AdamW (decoupled weight decay), Momentum, RMSProp, Adagrad, Lamb; and an EMA
of parameters.
Their updates are kiln ops written into the parameters and state in place, so a compiled
training step replays them, and a learning-rate schedule is computed in the graph from the step
count as for SGD and Adam (kiln.nn.optim)."""
import math
import numbers

from .. import _C
from .. import ops
from ..autograd import no_grad
from .cell import Cell
from .optim import Adam, Optimizer, SGD, check_nonneg
from .parameter import Parameter, ParameterTuple


def _write(target, value):
    """target's elements set to value, in place (recorded as an in-place update when compiled)."""
    target[...] = value


def _rate_for(lr, param):
    """A rate as an operand beside param: a number, or a schedule's 0-d tensor (computed in the graph)
    in param's dtype, so eager (a number) and compiled steps compute in the same precision."""
    return lr.astype(param.dtype) if isinstance(lr, _C.TensorBase) else lr


class AdamWeightDecay(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter; MindSpore's AdamWeightDecay, PyTorch's
    AdamW): p -= lr * weight_decay * p, then Adam's step without decay in the gradient. MindSpore's
    argument names (learning_rate, beta1, beta2, eps, weight_decay), PyTorch's defaults for AdamW
    (weight_decay 0.01)."""

    def __init__(self, params, learning_rate=1e-3, beta1=0.9, beta2=0.999, eps=1e-6, weight_decay=0.0,
                 loss_scale=1.0, *, use_amsgrad=False):
        super().__init__(params, learning_rate, beta1, beta2, eps, weight_decay=weight_decay, loss_scale=loss_scale,
                         use_amsgrad=use_amsgrad)

    def _update(self, i, param, grad, lr, weight_decay):
        if weight_decay:
            _write(param, param - param * (_rate_for(lr, param) * weight_decay))
        super()._update(i, param, grad, lr, 0.0)


class AdamW(AdamWeightDecay):
    """PyTorch's AdamW: AdamWeightDecay with PyTorch's argument names and defaults
    (lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, amsgrad=False)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, amsgrad=False, *,
                 learning_rate=None):
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"AdamW: betas must be a pair of numbers in [0, 1), got {betas!r}")
        super().__init__(params, lr if learning_rate is None else learning_rate, betas[0], betas[1], eps,
                         weight_decay, use_amsgrad=amsgrad)


class Momentum(SGD):
    """MindSpore's Momentum: accum = momentum * accum + g; p -= lr * accum (use_nesterov:
    p -= lr * (g + momentum * accum)); weight_decay adds weight_decay * p to g. nesterov= is PyTorch's
    name for use_nesterov."""

    def __init__(self, params, learning_rate, momentum, weight_decay=0.0, loss_scale=1.0, use_nesterov=False, *,
                 nesterov=None):
        if not isinstance(momentum, numbers.Real) or isinstance(momentum, bool) or momentum < 0:
            raise ValueError(f"Momentum: momentum must be a number >= 0, got {momentum!r}")
        if nesterov is not None:
            use_nesterov = nesterov
        super().__init__(params, learning_rate, momentum=momentum, weight_decay=weight_decay,
                         nesterov=bool(use_nesterov) and momentum > 0, loss_scale=loss_scale)


class RMSProp(Optimizer):
    """MindSpore's RMSProp: ms = decay * ms + (1 - decay) * g^2 (centered: mg = decay * mg +
    (1 - decay) * g, and ms - mg^2 is used); mom = momentum * mom + lr * g / sqrt(ms + epsilon);
    p -= mom. (PyTorch's RMSprop puts eps outside the square root.)"""

    def __init__(self, params, learning_rate=0.1, decay=0.9, momentum=0.0, epsilon=1e-10, use_locking=False,
                 centered=False, loss_scale=1.0, weight_decay=0.0):
        super().__init__(learning_rate, params, weight_decay, loss_scale)
        if not isinstance(decay, numbers.Real) or not 0.0 <= decay < 1.0:
            raise ValueError(f"RMSProp: decay must be in [0, 1), got {decay!r}")
        self.decay = float(decay)
        self.momentum = check_nonneg("RMSProp", "momentum", momentum)
        self.epsilon = check_nonneg("RMSProp", "epsilon", epsilon)
        self.centered = bool(centered)
        self.mean_square = self._state("mean_square")
        self.moment = self._state("moment")
        self.mean_grad = self._state("mean_grad") if self.centered else None

    def _update(self, i, param, grad, lr, weight_decay):
        if weight_decay:
            grad = grad + param * weight_decay
        ms = self.mean_square[i]
        _write(ms, ms * self.decay + grad * grad * (1.0 - self.decay))
        denom = ms
        if self.centered:
            mg = self.mean_grad[i]
            _write(mg, mg * self.decay + grad * (1.0 - self.decay))
            denom = ms - mg * mg
        mom = self.moment[i]
        _write(mom, mom * self.momentum + grad * _rate_for(lr, param) / ops.sqrt(denom + self.epsilon))
        _write(param, param - mom)


class Adagrad(Optimizer):
    """MindSpore's Adagrad: accum += g^2; p -= lr * g / sqrt(accum), accum starting at `accum`
    (default 0.1); weight_decay adds weight_decay * p to g. (PyTorch's Adagrad starts the sum at
    initial_accumulator_value, default 0, and adds eps to the root: Adagrad(..., accum=0.0, eps=1e-10)
    matches it.)"""

    def __init__(self, params, accum=0.1, learning_rate=0.001, update_slots=True, loss_scale=1.0,
                 weight_decay=0.0, eps=0.0):
        super().__init__(learning_rate, params, weight_decay, loss_scale)
        self.initial_accum = check_nonneg("Adagrad", "accum", accum)
        self.eps = check_nonneg("Adagrad", "eps", eps)
        self.update_slots = bool(update_slots)
        self.accum = self._state("accum")
        for a in self.accum:
            _write(a, self.initial_accum)

    def _update(self, i, param, grad, lr, weight_decay):
        if weight_decay:
            grad = grad + param * weight_decay
        acc = self.accum[i]
        if self.update_slots:
            _write(acc, acc + grad * grad)
        _write(param, param - grad * _rate_for(lr, param) / (ops.sqrt(acc) + self.eps))


class Lamb(Optimizer):
    """MindSpore's Lamb (You et al., layer-wise adaptive moments): Adam's bias-corrected moments
    give r = m_hat / (sqrt(v_hat) + eps) + weight_decay * p; each parameter then moves by
    lr * trust * r, trust = ||p|| / ||r|| (1 when either norm is 0)."""

    def __init__(self, params, learning_rate, beta1=0.9, beta2=0.999, eps=1e-6, weight_decay=0.0, loss_scale=1.0):
        super().__init__(learning_rate, params, weight_decay, loss_scale)
        for name, b in (("beta1", beta1), ("beta2", beta2)):
            if not isinstance(b, numbers.Real) or isinstance(b, bool) or not 0.0 <= b < 1.0:
                raise ValueError(f"Lamb: {name} must be in [0, 1), got {b!r}")
        self.beta1, self.beta2 = float(beta1), float(beta2)
        self.eps = check_nonneg("Lamb", "eps", eps)
        self.moment1 = self._state("moment1")
        self.moment2 = self._state("moment2")

    def _update(self, i, param, grad, lr, weight_decay):
        count = self._step_counters[i]
        _write(count, count + 1)
        t = count.astype(param.dtype)
        m, v = self.moment1[i], self.moment2[i]
        _write(m, m * self.beta1 + grad * (1.0 - self.beta1))
        _write(v, v * self.beta2 + grad * grad * (1.0 - self.beta2))
        m_hat = m / (1.0 - ops.exp(t * math.log(self.beta1))) if self.beta1 > 0 else m
        v_hat = v / (1.0 - ops.exp(t * math.log(self.beta2))) if self.beta2 > 0 else v
        r = m_hat / (ops.sqrt(v_hat) + self.eps)
        if weight_decay:
            r = r + param * weight_decay
        w_norm, r_norm = ops.sqrt((param * param).sum()), ops.sqrt((r * r).sum())
        both = ops.logical_and(w_norm > 0, r_norm > 0)
        trust = ops.where(both, w_norm / ops.where(both, r_norm, ops.ones_like(r_norm)), ops.ones_like(w_norm))
        _write(param, param - r * (trust * _rate_for(lr, param)))


class EMA(Cell):
    """An exponential moving average of parameters (shadow = decay * shadow + (1 - decay) * p on
    each update(); with use_num_updates the decay is min(decay, (1 + n) / (10 + n)) after n
    updates). apply() puts the averages into the parameters (evaluation), restore() puts the
    trained values back. update() writes in place, so it runs inside a compiled training step."""

    def __init__(self, params, decay=0.999, use_num_updates=False):
        super().__init__(auto_prefix=False)
        if isinstance(params, Cell):
            params = params.trainable_params()
        self.params = tuple(params)
        if not self.params or not all(isinstance(p, _C.TensorBase) for p in self.params):
            raise TypeError("EMA: params must be a non-empty sequence of Parameters (or a Cell)")
        if not isinstance(decay, numbers.Real) or isinstance(decay, bool) or not 0.0 <= decay <= 1.0:
            raise ValueError(f"EMA: decay must be in [0, 1], got {decay!r}")
        self.decay, self.use_num_updates = float(decay), bool(use_num_updates)
        self.shadow = ParameterTuple(Parameter(p.clone(), f"ema.{getattr(p, 'name', None) or i}", requires_grad=False)
                                     for i, p in enumerate(self.params))
        self.num_updates = Parameter(ops.zeros((), dtype=_C.int64), "ema.num_updates", requires_grad=False)
        self._backup = None

    def update(self):
        with no_grad():
            decay = self.decay
            if self.use_num_updates:
                n = self.num_updates.astype(_C.float64)
                decay = ops.minimum((n + 1.0) / (n + 10.0), ops.full((), self.decay, dtype=_C.float64))
            _write(self.num_updates, self.num_updates + 1)
            for s, p in zip(self.shadow, self.params):
                d = decay.astype(p.dtype) if isinstance(decay, _C.TensorBase) else decay
                _write(s, s * d + p * (1.0 - d))

    construct = update

    def apply(self):
        """Parameters <- their averages (the trained values are kept for restore())."""
        if self._backup is not None:
            raise RuntimeError("EMA.apply: the averages are already applied; call restore() first")
        with no_grad():
            self._backup = [p.clone() for p in self.params]
            for s, p in zip(self.shadow, self.params):
                _write(p, s)

    def restore(self):
        if self._backup is None:
            raise RuntimeError("EMA.restore: apply() was not called")
        with no_grad():
            for b, p in zip(self._backup, self.params):
                _write(p, b)
        self._backup = None


ExponentialMovingAverage = EMA  # the longer spelling
