"""Optimizers, MindSpore style: opt = SGD(net.trainable_params(), ...); opt(grads) applies one
step given the gradients in the order of opt.parameters. Updates run in place through the
sgd_update / adam_update / adam_amsgrad_update ops."""
import numbers

from .. import _C
from .. import ops
from .._optable import OP
from .._tensor import tensor as _tensor
from ..autograd import no_grad
from ..jit.replay import read_by_kiln
from .cell import Cell
from .parameter import Parameter, ParameterTuple

_apply = _C.apply


def check_nonneg(opt, name, v):
    if not isinstance(v, numbers.Real) or isinstance(v, bool) or not v >= 0:
        raise ValueError(f"{opt}: {name} must be a number >= 0, got {v!r}")
    return float(v)


def _rate(lr):
    """(the lr attribute, the extra inputs) of an update op: a rate computed in a graph (a tensor)
    is the op's last input, read when the update runs."""
    return (0.0, (lr,)) if isinstance(lr, _C.TensorBase) else (lr, ())


class Optimizer(Cell):
    """Base class. parameters: an iterable of Parameters (e.g. net.trainable_params()), a Cell
    (its trainable_params()), or groups [{'params': [...], 'lr': ..., 'weight_decay': ...}, ...].
    learning_rate: a number, a list of per-step values (the last one holds afterwards), or a
    callable global_step -> lr. Gradients are divided by loss_scale before the update."""

    def __init__(self, learning_rate, parameters, weight_decay=0.0, loss_scale=1.0):
        super().__init__(auto_prefix=False)
        name = type(self).__name__
        if isinstance(parameters, Cell):
            parameters = parameters.trainable_params()
        parameters = list(parameters)
        if not parameters:
            raise ValueError(f"{name}: got an empty parameter list")
        groups = parameters if isinstance(parameters[0], dict) else [{"params": parameters}]
        params, lrs, wds, seen = [], [], [], set()
        group_sizes = []  # how many parameters each group has, in order (param_groups)
        for g in groups:
            if not isinstance(g, dict) or "params" not in g:
                raise TypeError(f"{name}: parameter groups must be dicts with a 'params' entry")
            lr = g.get("lr", g.get("learning_rate", learning_rate))
            wd = check_nonneg(name, "weight_decay", g.get("weight_decay", weight_decay))
            self._check_lr(lr)
            for p in g["params"]:
                if not isinstance(p, _C.TensorBase):
                    raise TypeError(f"{name}: parameters must be Parameters, got {type(p).__name__}")
                if p.dtype not in (_C.float32, _C.float64) or not p.is_contiguous():
                    raise TypeError(f"{name}: parameter {getattr(p, 'name', None)!r} must be a contiguous float32 "
                                    f"or float64 tensor, got {p.dtype} of shape {p.shape}")
                if id(p) in seen:
                    raise ValueError(f"{name}: parameter {getattr(p, 'name', None)!r} appears twice")
                seen.add(id(p))
                params.append(p)
                lrs.append(lr)
                wds.append(wd)
            group_sizes.append(len(g["params"]))
        self.parameters = tuple(params)
        self.learning_rate = learning_rate
        self.weight_decay = float(weight_decay)
        self.loss_scale = float(loss_scale)
        if not self.loss_scale > 0:
            raise ValueError(f"{name}: loss_scale must be > 0, got {loss_scale!r}")
        self._lrs = lrs
        self._wds = wds
        self._group_sizes = group_sizes
        # the same counts as int64 tensors the update ops increment themselves, so a compiled
        # training step keeps counting when it is replayed
        self._step_counters = [ops.zeros((), dtype=_C.int64) for _ in params]
        self._global_step = ops.zeros((), dtype=_C.int64)  # a tensor for the same reason
        # id(per-step list) -> (its rates when the table was made, the rates as a tensor compiled steps
        # index); the list is read on every capture, so a rate the user changes in place is seen
        self._lr_tables = {}

    @property
    def global_step(self):
        """Steps taken so far."""
        return int(self._global_step.item())

    @global_step.setter
    def global_step(self, value):
        with no_grad():
            self._global_step[...] = int(value)

    @staticmethod
    def _check_lr(lr):
        if isinstance(lr, _C.TensorBase):
            lr = lr.item()
        if isinstance(lr, numbers.Real) and not isinstance(lr, bool):
            if lr < 0:
                raise ValueError(f"learning_rate must be >= 0, got {lr}")
        elif isinstance(lr, (list, tuple)):
            if not lr:
                raise ValueError("learning_rate: a per-step list must not be empty")
        elif not callable(lr):
            raise TypeError(f"learning_rate must be a number, a list or a callable, got {type(lr).__name__}")

    @staticmethod
    def _lr_at(lr, step):
        if isinstance(lr, _C.TensorBase):
            return float(lr.item())
        if isinstance(lr, (list, tuple)):
            return float(lr[min(step, len(lr) - 1)])
        if callable(lr):
            v = lr(step)
            return float(v.item() if isinstance(v, _C.TensorBase) else v)
        return float(lr)

    def _lr_in_graph(self, lr):
        """The rate at the current step as a 0-d float64 tensor computed from the step count, for
        a schedule (a per-step list, a callable of the step); a rate given as a tensor (a Parameter
        the user may set_data between steps) read by the graph when it runs; a constant rate as a
        number."""
        if isinstance(lr, _C.TensorBase):
            return lr.reshape(()).astype(_C.float64)
        if isinstance(lr, (list, tuple)):
            # the user may change the list in place between calls: the capture guards its contents
            read_by_kiln(vars(self), "_lrs", f"the per-step learning rates of a {type(self).__name__} optimizer")
            rates = tuple(float(v) for v in lr)
            known = self._lr_tables.get(id(lr))
            if known is None or known[0] != rates:
                known = self._lr_tables[id(lr)] = (rates, _tensor(list(rates), dtype=_C.float64))
            table = known[1]
            last = ops.full((), len(lr) - 1, dtype=_C.int64)
            return table[ops.minimum(self._global_step, last)]
        if callable(lr) and not isinstance(lr, _C.TensorBase):
            v = lr(self._global_step)
            if isinstance(v, _C.TensorBase):
                if v.numel() != 1:
                    raise ValueError(f"{type(self).__name__}: the learning-rate schedule returned a tensor of shape "
                                     f"{tuple(v.shape)}; it must return a number or a 1-element tensor")
                return v.reshape(()).astype(_C.float64)
            return float(v)
        if isinstance(lr, _C.TensorBase):  # a rate a scheduler writes: read when the update runs
            return lr
        return self._lr_at(lr, 0)

    def rates_as_tensors(self):
        """Each group's rate as a 0-d float64 tensor the updates read when they run, made from its
        number the first time (a per-step list or a schedule is refused: it already sets the rate).
        A PyTorch-style scheduler (kiln.nn.StepLR, ...) writes them in place after each epoch, so a
        compiled training step follows the new rate without compiling again. Returns them in
        group order, each once."""
        out, start = [], 0
        for size in self._group_sizes:
            if size == 0:
                continue
            lr = self._lrs[start]
            if isinstance(lr, numbers.Real) and not isinstance(lr, bool):
                lr = _tensor(float(lr), dtype=_C.float64)  # one per group: each group's rate is its own
            elif isinstance(lr, _C.TensorBase):
                start += size
                if all(lr is not r for r in out):
                    out.append(lr)
                continue
            else:
                raise TypeError(f"{type(self).__name__}: a scheduler needs a number as the learning rate, got "
                                f"{type(lr).__name__} (a per-step list or a schedule already sets the rate)")
            self._lrs[start:start + size] = [lr] * size
            if all(lr is not r for r in out):
                out.append(lr)
            start += size
        if not isinstance(self.learning_rate, (list, tuple, _C.TensorBase)) and not callable(self.learning_rate):
            self.learning_rate = out[0]  # (once: a Cell attribute written again would recompile a compiled step)
        return out

    def get_lr(self):
        """The learning rate of the next step (of the first group)."""
        return self._lr_at(self._lrs[0], self.global_step)

    def get_lr_parameter(self, param):
        """The learning rate of the next step for param."""
        for p, lr in zip(self.parameters, self._lrs):
            if p is param:
                return self._lr_at(lr, self.global_step)
        raise ValueError("get_lr_parameter: the parameter is not optimized by this optimizer")

    def state_for_checkpoint(self):
        """[(name, tensor)] of this optimizer's state -- each ParameterTuple of moments ("moment1.0",
        ...), the step counts ("step_counters.0", ...) and "global_step" -- what save_checkpoint writes
        and load_param_into_net restores (the tensors themselves: loading writes into them)."""
        out = []
        for attr, value in vars(self).items():
            if isinstance(value, ParameterTuple):
                out += [(f"{attr}.{i}", t) for i, t in enumerate(value)]
        out += [(f"step_counters.{i}", t) for i, t in enumerate(self._step_counters)]
        out.append(("global_step", self._global_step))
        return out

    def _state(self, prefix):
        """Zero-initialized state tensors, one per parameter, named prefix.<parameter name>."""
        return ParameterTuple(Parameter(ops.zeros_like(p), f"{prefix}.{getattr(p, 'name', None) or i}",
                                        requires_grad=False)
                              for i, p in enumerate(self.parameters))

    def construct(self, gradients):
        return self.step(gradients)

    def step(self, gradients=None):
        """One update from gradients (a sequence in the order of self.parameters; None entries
        are skipped). Without gradients, each parameter's .grad is used. Returns True."""
        if gradients is None:
            gradients = [p.grad for p in self.parameters]
        elif isinstance(gradients, _C.TensorBase):
            gradients = (gradients,)
        gradients = tuple(gradients)
        if len(gradients) != len(self.parameters):
            raise ValueError(f"{type(self).__name__}: got {len(gradients)} gradients for {len(self.parameters)} "
                             f"parameters")
        # while a compiled step is captured, a schedule is computed in the graph from the step count
        # (a tensor the graph increments), so one compiled step serves every step
        traced = _C.is_tracing()
        step = None if traced else self.global_step
        with no_grad():
            rates = {}  # id(schedule) -> its rate at this step
            for i, (p, g) in enumerate(zip(self.parameters, gradients)):
                if g is None:
                    continue
                if not isinstance(g, _C.TensorBase):
                    raise TypeError(f"{type(self).__name__}: gradient {i} must be a Tensor, got {type(g).__name__}")
                if self.loss_scale != 1.0:
                    g = g / self.loss_scale
                lr = self._lrs[i]
                if id(lr) not in rates:
                    rates[id(lr)] = self._lr_in_graph(lr) if traced else self._lr_at(lr, step)
                self._update(i, p, g, rates[id(lr)], self._wds[i])
            self._global_step[...] = self._global_step + 1
        return True

    @property
    def param_groups(self):
        """PyTorch's param_groups: one dict-like view per group, {"params": [...], "lr": ...,
        "weight_decay": ...}. Reading "lr" gives the group's rate at the next step; writing it (a
        manual schedule) makes the optimizer's rates tensors (rates_as_tensors) and writes the
        group's, so a compiled step follows it without compiling again."""
        out, start = [], 0
        for size in self._group_sizes:
            out.append(_ParamGroup(self, start, size) if size else {"params": [], "lr": None})
            start += size
        return out

    def zero_grad(self, set_to_none=True):
        """Clears .grad of every parameter (inside a compiled function, each .grad write makes the
        call run eagerly: kiln.Tensor.grad's setter). PyTorch's set_to_none is accepted; kiln
        always sets None (the next backward pass accumulates from nothing either way)."""
        for p in self.parameters:
            p.grad = None

    clear_grad = zero_grad  # MegEngine's name

    def _update(self, i, param, grad, lr, weight_decay):
        raise NotImplementedError


class _ParamGroup(dict):
    """A view of one parameter group of an optimizer (Optimizer.param_groups)."""

    def __init__(self, opt, start, size):
        super().__init__(params=list(opt.parameters[start:start + size]), weight_decay=opt._wds[start])
        self._opt, self._start = opt, start

    def __getitem__(self, key):
        if key == "lr":
            return self._opt._lr_at(self._opt._lrs[self._start], self._opt.global_step)
        return super().__getitem__(key)

    def get(self, key, default=None):
        return self["lr"] if key == "lr" else super().get(key, default)

    def __contains__(self, key):
        return key == "lr" or super().__contains__(key)

    def __setitem__(self, key, value):
        if key != "lr":
            raise KeyError(f"param_groups: only 'lr' can be set, got {key!r}")
        if not isinstance(value, numbers.Real) or isinstance(value, bool) or value < 0:
            raise ValueError(f"param_groups: lr must be a number >= 0, got {value!r}")
        self._opt.rates_as_tensors()
        with no_grad():
            self._opt._lrs[self._start][...] = float(value)


class SGD(Optimizer):
    """Stochastic gradient descent with momentum (PyTorch's and MindSpore's rule):
    d = g + weight_decay * p; buf = momentum * buf + (1 - dampening) * d (buf = d on the first
    step); d = d + momentum * buf if nesterov else buf; p -= lr * d."""

    def __init__(self, params, learning_rate=0.1, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False,
                 loss_scale=1.0, *, lr=None):
        super().__init__(learning_rate if lr is None else lr, params, weight_decay, loss_scale)
        self.momentum = check_nonneg("SGD", "momentum", momentum)
        self.dampening = check_nonneg("SGD", "dampening", dampening)
        self.nesterov = bool(nesterov)
        if self.nesterov and (self.momentum == 0 or self.dampening != 0):
            raise ValueError("SGD: nesterov needs momentum > 0 and dampening = 0")
        self.accum = self._state("accum") if self.momentum else None

    def _update(self, i, param, grad, lr, weight_decay):
        buf = self.accum[i] if self.accum is not None else param
        rate, extra = _rate(lr)
        _apply(OP.sgd_update, (param, grad, buf, self._step_counters[i]) + extra, (int(self.nesterov),),
               (rate, self.momentum, weight_decay, self.dampening))


class Adam(Optimizer):
    """Adam (Kingma & Ba) with bias correction, weight_decay added to the gradient (L2):
    m = beta1 m + (1 - beta1) g; v = beta2 v + (1 - beta2) g^2;
    p -= lr / (1 - beta1^t) * m / (sqrt(v / (1 - beta2^t)) + eps).
    use_amsgrad (PyTorch: amsgrad): AMSGrad, vmax = max(vmax, v) divides instead of v (PyTorch's
    rule; the largest v is kept in the state max_moment2).
    Arguments after eps are keyword-only (MindSpore puts use_locking / use_nesterov there);
    PyTorch's names lr= and betas= are accepted as aliases of learning_rate and beta1, beta2."""

    def __init__(self, params, learning_rate=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, *, use_locking=False,
                 use_nesterov=False, weight_decay=0.0, loss_scale=1.0, use_amsgrad=False, amsgrad=None, lr=None,
                 betas=None):
        if lr is not None:
            learning_rate = lr
        if betas is not None:
            if not isinstance(betas, (tuple, list)) or len(betas) != 2:
                raise ValueError(f"{type(self).__name__}: betas must be a pair of numbers in [0, 1), got {betas!r}")
            beta1, beta2 = betas
        super().__init__(learning_rate, params, weight_decay, loss_scale)
        if use_nesterov:
            raise ValueError("Adam: use_nesterov=True is not supported")
        for n, b in (("beta1", beta1), ("beta2", beta2)):
            if not isinstance(b, numbers.Real) or not 0.0 <= b < 1.0:
                raise ValueError(f"Adam: {n} must be in [0, 1), got {b!r}")
        self.beta1 = float(beta1)
        self.beta2 = float(beta2)
        self.eps = check_nonneg("Adam", "eps", eps)
        self.use_amsgrad = bool(use_amsgrad if amsgrad is None else amsgrad)
        self.moment1 = self._state("moment1")
        self.moment2 = self._state("moment2")
        self.max_moment2 = self._state("max_moment2") if self.use_amsgrad else None

    amsgrad = property(lambda self: self.use_amsgrad)  # PyTorch's name

    def _update(self, i, param, grad, lr, weight_decay):
        rate, extra = _rate(lr)
        if self.use_amsgrad:
            op, state = OP.adam_amsgrad_update, (self.moment1[i], self.moment2[i], self.max_moment2[i])
        else:
            op, state = OP.adam_update, (self.moment1[i], self.moment2[i])
        _apply(op, (param, grad) + state + (self._step_counters[i],) + extra, (),
               (rate, self.beta1, self.beta2, self.eps, weight_decay))
