"""Mixed precision, as MindSpore's mindspore.amp and MegEngine's megengine.amp spell it (PyTorch's
torch.autocast is kiln.autocast).

Which ops run in the low dtype at each level is ops.def's KILN_AMP table (src/ops/ops.def): while an
amp level is on in a thread (autocast, or a Cell made by auto_mixed_precision / to_float runs), the
dispatcher casts each op's inputs by that table, so the casts are ops like any other: recorded by
kiln.jit and kiln.trace (a compiled call is keyed by the amp setting it ran under), differentiated by
autograd (the gradients run in the dtypes of the forward, never cast again). Levels:

    O0  off
    O1  products (matmul, linear, convolution, attention) in the low dtype; softmax, reductions,
        exp/log/pow, norms in float32; every other op follows its widest input
    O2  as O1, but parameters are cast to the low dtype where they are read (master weights stay
        float32) and softmax, reductions and exp/log take their input's dtype; norms and losses float32
    O3  every float op in the low dtype

Values derived from integers only (arange, casts of integer tensors: positions, rotary angles)
are never narrowed but by a product, at any level. Loss scaling: DynamicLossScaler (functional),
the managers and TrainOneStepWithLossScaleCell (MindSpore), GradScaler (MegEngine).
docs/guide/mixed_precision.md has the tolerances per level.
"""
import functools
import math

import numpy as np

from . import _C
from . import ops
from ._tensor import Tensor
from .autograd import no_grad, value_and_grad
from .jit.bytecode import register_fresh_each_call
from .nn.cell import Cell, WithLossCell
from .nn.layers import BatchNorm1d, BatchNorm2d, LayerNorm, RMSNorm
from .nn.layers_extra import GroupNorm
from .nn.layers_more import BatchNorm3d
from .nn.loss import LossBase

LEVELS = {"O0": 0, "O1": 1, "O2": 2, "O3": 3}
_LOW = (_C.bfloat16, _C.float16)
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _level(level, who):
    if level == "auto":
        return 2
    if level not in LEVELS:
        raise ValueError(f"{who}: amp_level must be one of 'O0', 'O1', 'O2', 'O3' or 'auto', got {level!r}")
    return LEVELS[level]


def _dtype(dtype, who, allowed=_LOW):
    if isinstance(dtype, str):
        dtype = getattr(_C, dtype, dtype)
    if dtype not in allowed:
        names = ", ".join(f"kiln.{d}" for d in allowed)
        raise TypeError(f"{who}: dtype must be one of {names}, got {dtype!r}")
    return dtype


@register_fresh_each_call  # (a bytecode capture's state makes one per call, as eager code does)
class autocast:
    """MegEngine's amp.autocast: a context manager (and a decorator) inside which the ops run in
    mixed precision (products in low_prec_dtype, see the module's levels; level "O1" is
    MegEngine's and PyTorch's autocast). enabled=False turns an enclosing autocast off. Each
    thread has its own setting; a region's setting is restored when it ends."""

    def __init__(self, enabled=True, low_prec_dtype=_C.float16, high_prec_dtype=_C.float32, *, level="O1"):
        self.enabled = bool(enabled)
        self.low_prec_dtype = _dtype(low_prec_dtype, "autocast")
        self.high_prec_dtype = _dtype(high_prec_dtype, "autocast: high_prec_dtype", (_C.float32,))
        self.level = _level(level, "autocast")
        self._saved = []

    def __enter__(self):
        self._saved.append(_C.amp_set(self.level if self.enabled else 0, self.low_prec_dtype))
        return self

    def __exit__(self, *exc):
        _C.amp_set(*self._saved.pop())
        return False

    def __call__(self, fn):
        if not callable(fn):
            raise TypeError(f"autocast: decorates a function, got {type(fn).__name__}")

        @functools.wraps(fn)
        def run(*args, **kwargs):
            with autocast(self.enabled, self.low_prec_dtype, self.high_prec_dtype,
                          level=[k for k, v in LEVELS.items() if v == self.level][0]):
                return fn(*args, **kwargs)

        return run


def torch_autocast(device_type="cpu", dtype=_C.bfloat16, enabled=True, cache_enabled=None):
    """PyTorch's torch.autocast (kiln.autocast): products in dtype (bfloat16 by default, as
    PyTorch's on the CPU), the rest as level O1 says."""
    if device_type not in ("cpu", "CPU"):
        raise ValueError(f"autocast: kiln runs on the CPU; device_type must be 'cpu', got {device_type!r}")
    return autocast(enabled, _dtype(dtype, "autocast"))


class _AmpCell(Cell):
    """The network auto_mixed_precision returns: it runs `network` at the amp level (the thread's
    setting while it runs: Cell._amp) and, at O1 and O2, gives its float outputs in float32."""

    def __init__(self, network, level, dtype):
        super().__init__(auto_prefix=False)
        self._backbone = network
        self._amp = (level, dtype)
        self._outputs_fp32 = level in (1, 2)

    def construct(self, *inputs, **kwargs):
        out = self._backbone(*inputs, **kwargs)
        if not self._outputs_fp32:
            return out
        return _to_float32(out)

    @property
    def backbone_network(self):
        return self._backbone


def _to_float32(out):
    if isinstance(out, _C.TensorBase):
        return out.astype(_C.float32) if out.dtype in _LOW else out
    if isinstance(out, (tuple, list)):
        return type(out)(_to_float32(o) for o in out)
    return out


_BATCH_NORMS = (BatchNorm1d, BatchNorm2d, BatchNorm3d)
_FP32_CELLS = (LossBase, LayerNorm, RMSNorm, GroupNorm) + _BATCH_NORMS


def _keep_fp32(network):
    """O2: losses and normalizations inside network run in float32 (MindSpore keeps BatchNorm,
    LayerNorm and the loss in float32)."""
    for _, cell in network.cells_and_names():
        if isinstance(cell, _FP32_CELLS):
            cell.to_float(_C.float32)


def auto_mixed_precision(network, amp_level="O0", dtype=_C.float16):
    """MindSpore's amp.auto_mixed_precision: the network run in mixed precision at amp_level
    ('O0' returns network itself; 'auto' is 'O2'). O2 also sets the normalizations and losses
    inside network to float32 (Cell.to_float). The parameters stay float32 (cast where read)."""
    if not isinstance(network, Cell):
        raise TypeError(f"auto_mixed_precision: network must be a Cell, got {type(network).__name__}")
    level = _level(amp_level, "auto_mixed_precision")
    dtype = _dtype(dtype, "auto_mixed_precision")
    if level == 0:
        return network
    if level == 2:
        _keep_fp32(network)
    return _AmpCell(network, level, dtype)


def all_finite(inputs):
    """MindSpore's amp.all_finite: a bool 0-d tensor, whether every element of the tensors is finite."""
    if isinstance(inputs, _C.TensorBase):
        inputs = (inputs,)
    result = None
    for t in inputs:
        if t is None:
            continue
        ok = ops.all(ops.isfinite(t))
        result = ok if result is None else ops.logical_and(result, ok)
    return Tensor(np.array(True)) if result is None else result


def _map(inputs, fn):
    if isinstance(inputs, (tuple, list)):
        return type(inputs)(None if t is None else fn(t) for t in inputs)
    return fn(inputs)


class DynamicLossScaler:
    """MindSpore's amp.DynamicLossScaler: scale(x) = x * scale_value, unscale(x) = x / scale_value;
    adjust(grads_finite): after scale_window finite steps in a row the scale grows by scale_factor
    (when the result is finite), after an overflow it is divided by scale_factor (never below 1)
    and the count restarts. scale_value is a float32 0-d tensor."""

    def __init__(self, scale_value, scale_factor, scale_window):
        _check_scale(scale_value, scale_factor, scale_window, "DynamicLossScaler")
        self.scale_value = Tensor(np.array(scale_value, np.float32))
        self.scale_factor = int(scale_factor)
        self.scale_window = int(scale_window)
        self.counter = 0

    def scale(self, inputs):
        return _map(inputs, lambda t: t * self.scale_value.astype(t.dtype))

    def unscale(self, inputs):
        inv = 1.0 / float(self.scale_value)
        return _map(inputs, lambda t: t * inv)

    def adjust(self, grads_finite):
        scale, self.counter = _next_scale(float(self.scale_value), self.counter, bool(grads_finite),
                                          self.scale_factor, self.scale_window)
        self.scale_value = Tensor(np.array(scale, np.float32))
        return True


def _check_scale(scale_value, scale_factor, scale_window, who):
    if not (isinstance(scale_value, (int, float)) and math.isfinite(scale_value) and scale_value >= 1):
        raise ValueError(f"{who}: the loss scale must be a finite number >= 1, got {scale_value!r}")
    if not (isinstance(scale_factor, (int, float)) and scale_factor > 1):
        raise ValueError(f"{who}: scale_factor must be > 1, got {scale_factor!r}")
    if not (isinstance(scale_window, int) and scale_window >= 1):
        raise ValueError(f"{who}: scale_window must be an int >= 1, got {scale_window!r}")


def _next_scale(scale, counter, finite, factor, window):
    """(scale, counter) after one step: the dynamic loss-scaling rule every scaler here follows."""
    if not finite:
        return max(scale / factor, 1.0), 0
    if counter + 1 >= window:
        grown = scale * factor
        return (grown if grown <= _FLOAT32_MAX else scale), 0
    return scale, counter + 1


class LossScaleManager:
    """Base of the managers: get_loss_scale(), update_loss_scale(overflow), get_update_cell()."""

    def get_loss_scale(self):
        raise NotImplementedError

    def update_loss_scale(self, overflow):
        raise NotImplementedError

    def get_update_cell(self):
        raise NotImplementedError


class FixedLossScaleManager(LossScaleManager):
    """MindSpore's FixedLossScaleManager: a constant scale. drop_overflow_update=True skips the
    optimizer step when the gradients overflow."""

    def __init__(self, loss_scale=128.0, drop_overflow_update=True):
        if not (isinstance(loss_scale, (int, float)) and math.isfinite(loss_scale) and loss_scale >= 1):
            raise ValueError(f"FixedLossScaleManager: loss_scale must be a finite number >= 1, got {loss_scale!r}")
        self._loss_scale = float(loss_scale)
        self._drop_overflow_update = bool(drop_overflow_update)

    def get_loss_scale(self):
        return self._loss_scale

    def get_drop_overflow_update(self):
        return self._drop_overflow_update

    def update_loss_scale(self, overflow):
        pass

    def get_update_cell(self):
        return FixedLossScaleUpdateCell(self._loss_scale) if self._drop_overflow_update else None


StaticLossScaleManager = FixedLossScaleManager


class DynamicLossScaleManager(LossScaleManager):
    """MindSpore's DynamicLossScaleManager(init_loss_scale=2**24, scale_factor=2, scale_window=2000):
    the scale shrinks by scale_factor after an overflow (whose step is skipped) and grows by it
    after scale_window steps without one."""

    def __init__(self, init_loss_scale=2 ** 24, scale_factor=2, scale_window=2000):
        _check_scale(init_loss_scale, scale_factor, scale_window, "DynamicLossScaleManager")
        self.loss_scale = float(init_loss_scale)
        self.scale_factor = scale_factor
        self.scale_window = scale_window
        self._counter = 0

    def get_loss_scale(self):
        return self.loss_scale

    def get_drop_overflow_update(self):
        return True

    def update_loss_scale(self, overflow):
        self.loss_scale, self._counter = _next_scale(self.loss_scale, self._counter, not overflow,
                                                     self.scale_factor, self.scale_window)

    def get_update_cell(self):
        return DynamicLossScaleUpdateCell(self.loss_scale, self.scale_factor, self.scale_window)


class DynamicLossScaleUpdateCell(Cell):
    """MindSpore's nn.DynamicLossScaleUpdateCell: cell(loss_scale, overflow) updates loss_scale (a
    float32 tensor, in place) by the dynamic rule and returns overflow. The rule runs as tensor ops
    on the tensors (the good-step count is a tensor the cell keeps), so a step compiled by kiln.jit
    updates the scale as eager does."""

    def __init__(self, loss_scale_value, scale_factor, scale_window):
        super().__init__()
        _check_scale(loss_scale_value, scale_factor, scale_window, "DynamicLossScaleUpdateCell")
        self.scale_factor = scale_factor
        self.scale_window = scale_window
        self._counter = Tensor(np.array(0, np.int64))  # good steps in a row
        self._last_scale = Tensor(np.array(loss_scale_value, np.float32))  # what get_loss_scale reads

    @property
    def cur_iter(self):
        return int(self._counter.item())

    @property
    def loss_scale_value(self):
        return float(self._last_scale.item())

    def get_loss_scale(self):
        return self.loss_scale_value

    def construct(self, loss_scale, overflow):
        if not isinstance(loss_scale, _C.TensorBase):
            raise TypeError(f"DynamicLossScaleUpdateCell: loss_scale must be a float32 tensor (updated in place), got "
                            f"{type(loss_scale).__name__}")
        if not isinstance(overflow, _C.TensorBase):
            overflow = Tensor(np.array(bool(overflow)))
        scale = loss_scale.astype(_C.float32).reshape(())
        overflow = overflow.astype(_C.bool).reshape(())
        grown = scale * float(self.scale_factor)
        grow = ops.logical_and(ops.logical_not(overflow), self._counter + 1 >= self.scale_window)
        kept = ops.where(ops.logical_and(grow, grown <= _FLOAT32_MAX), grown, scale)
        shrunk = ops.maximum(scale / float(self.scale_factor), ops.ones_like(scale))
        new_scale = ops.where(overflow, shrunk, kept)
        new_count = ops.where(ops.logical_or(overflow, grow), ops.zeros_like(self._counter), self._counter + 1)
        with no_grad():
            loss_scale[...] = new_scale.astype(loss_scale.dtype)
            self._counter[...] = new_count
            self._last_scale[...] = new_scale
        return overflow


class FixedLossScaleUpdateCell(Cell):
    """MindSpore's nn.FixedLossScaleUpdateCell: the scale never changes; returns overflow."""

    def __init__(self, loss_scale_value):
        super().__init__()
        self.loss_scale_value = float(loss_scale_value)

    def get_loss_scale(self):
        return self.loss_scale_value

    def construct(self, loss_scale, overflow):
        return overflow


class TrainOneStepWithLossScaleCell(Cell):
    """MindSpore's nn.TrainOneStepWithLossScaleCell(network, optimizer, scale_sense): one training
    step with the loss multiplied by the scale before the gradients are taken and the gradients
    divided by it after; when a gradient is not finite (overflow) the optimizer step is skipped.
    scale_sense: a DynamicLossScaleUpdateCell / FixedLossScaleUpdateCell (which then updates the
    scale), or a float32 tensor (a fixed scale). Returns (loss, overflow, scale used)."""

    def __init__(self, network, optimizer, scale_sense):
        super().__init__(auto_prefix=False)
        self.network = network
        self.optimizer = optimizer
        self.weights = tuple(optimizer.parameters)
        if isinstance(scale_sense, (DynamicLossScaleUpdateCell, FixedLossScaleUpdateCell)):
            self.scale_sense = Tensor(np.array(scale_sense.get_loss_scale(), np.float32))
            self.loss_scaling_manager = scale_sense
        elif isinstance(scale_sense, _C.TensorBase):
            if int(np.prod(scale_sense.shape)) != 1:
                raise ValueError("TrainOneStepWithLossScaleCell: scale_sense must have one element")
            self.scale_sense = scale_sense.astype(_C.float32).reshape(())
            self.loss_scaling_manager = None
        else:
            raise TypeError("TrainOneStepWithLossScaleCell: scale_sense must be a loss scale update Cell or a "
                            f"Tensor, got {type(scale_sense).__name__}")
        self._grad_fn = value_and_grad(self._scaled, None, self.weights, has_aux=True)

    def _scaled(self, *inputs):
        loss = self.network(*inputs)
        return loss * self.scale_sense.astype(loss.dtype), loss

    def set_sense_scale(self, sens):
        self.scale_sense = Tensor(np.array(sens, np.float32)) if not isinstance(sens, _C.TensorBase) else sens

    def _optimizer_state(self):
        """Every tensor the optimizer writes in a step: the parameters, its moments (ParameterTuples),
        its step counts."""
        seen, out = set(), []
        for t in tuple(self.weights) + tuple(t for _, t in self.optimizer.state_for_checkpoint()):
            if id(t) not in seen:
                seen.add(id(t))
                out.append(t)
        return out

    def construct(self, *inputs):
        scale = self.scale_sense.astype(_C.float32).reshape(()) * 1  # the scale this step uses (a copy)
        (_, loss), grads = self._grad_fn(*inputs)
        inv = 1.0 / scale
        grads = tuple(None if g is None else g * inv.astype(g.dtype) for g in grads)
        overflow = ops.logical_not(all_finite(grads))
        if self.loss_scaling_manager is not None:
            overflow = self.loss_scaling_manager(self.scale_sense, overflow)
        if not _C.is_tracing():
            if not bool(overflow):
                self.optimizer(grads)
            return loss, overflow, scale
        # compiled (kiln.jit, kiln.trace): the skip is a select in the graph -- the step's writes
        # are kept or the state before it restored, by the overflow tensor
        state = self._optimizer_state()
        with no_grad():
            # copies by an arithmetic op: clone() of a parameter is captured as a constant today
            before = [t * 1 for t in state]
            self.optimizer(grads)
            for t, b in zip(state, before):
                t[...] = ops.where(overflow, b, t)
        return loss, overflow, scale


def build_train_network(network, optimizer, loss_fn=None, level="O0", boost_level="O0", **kwargs):
    """MindSpore's amp.build_train_network: network (with loss_fn, whose loss then runs in float32
    at O1 and O2) in mixed precision at `level` (auto_mixed_precision), trained by optimizer, with
    loss scaling when kwargs' loss_scale_manager asks for it (O2 and 'auto' default to a
    DynamicLossScaleManager, as MindSpore's). kwargs: cast_model_type (the whole network in that
    dtype instead of level's rule), keep_batchnorm_fp32, loss_scale_manager, dtype (kiln: the low
    dtype, float16 by default as MindSpore's; bfloat16 is the CPU's). Returns the training Cell:
    calling it runs one step."""
    from .nn.cell import TrainOneStepCell

    known = {"cast_model_type", "keep_batchnorm_fp32", "loss_scale_manager", "dtype"}
    unknown = set(kwargs) - known
    if unknown:
        raise ValueError(f"build_train_network: unknown arguments {sorted(unknown)}")
    if boost_level not in ("O0", "O1", "O2"):
        raise ValueError(f"build_train_network: boost_level must be 'O0', 'O1' or 'O2', got {boost_level!r}")
    lvl = _level(level, "build_train_network")
    dtype = _dtype(kwargs.get("dtype", _C.float16), "build_train_network")
    manager = kwargs.get("loss_scale_manager", DynamicLossScaleManager() if level in ("O2", "auto") else None)
    if manager is not None and not isinstance(manager, LossScaleManager):
        raise TypeError(f"build_train_network: loss_scale_manager must be a LossScaleManager, got "
                        f"{type(manager).__name__}")
    cast = kwargs.get("cast_model_type")
    if cast is not None:
        cast = _dtype(cast, "build_train_network: cast_model_type", _LOW + (_C.float32,))
        if cast != _C.float32:
            network.to_float(cast)
            if kwargs.get("keep_batchnorm_fp32", True):
                for _, cell in network.cells_and_names():
                    if isinstance(cell, _BATCH_NORMS):
                        cell.to_float(_C.float32)
    else:
        network = auto_mixed_precision(network, level if level != "auto" else "O2", dtype)
    if loss_fn is not None:
        if lvl in (1, 2):
            loss_fn.to_float(_C.float32)
        network = WithLossCell(network, loss_fn)
    if manager is None:
        return TrainOneStepCell(network, optimizer)
    update = manager.get_update_cell()
    sense = update if update is not None else Tensor(np.array(manager.get_loss_scale(), np.float32))
    return TrainOneStepWithLossScaleCell(network, optimizer, sense)


class GradScaler:
    """MegEngine's amp.GradScaler(init_scale=2.0**4, growth_factor=2.0, backoff_factor=0.5,
    growth_interval=2000): backward(gm, y, dy=None) runs gm.backward on the scaled loss, then
    (unscale_grad) divides the attached tensors' gradients by the scale; when one is not finite
    every gradient is set to None (the optimizer skips the step) and update() backs the scale
    off by backoff_factor, else grows it by growth_factor after growth_interval good steps."""

    def __init__(self, init_scale=2.0 ** 4, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
        if not (math.isfinite(init_scale) and init_scale > 0):
            raise ValueError(f"GradScaler: init_scale must be a finite positive number, got {init_scale!r}")
        if not growth_factor > 1 or not 0 < backoff_factor < 1:
            raise ValueError("GradScaler: growth_factor must be > 1 and backoff_factor in (0, 1)")
        if not (isinstance(growth_interval, int) and growth_interval >= 1):
            raise ValueError(f"GradScaler: growth_interval must be an int >= 1, got {growth_interval!r}")
        self.scale_factor = float(init_scale)
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_interval = growth_interval
        self._growth_tracker = 0
        self._found_non_finite = False

    def backward(self, gm, y=None, dy=None, *, unscale_grad=True, update_scale="if_unscale_grad"):
        ys = [y] if isinstance(y, _C.TensorBase) else list(y)
        if dy is None:
            dys = [ops.full_like(t, self.scale_factor) for t in ys]
        else:
            dys = [d * self.scale_factor for d in ([dy] if isinstance(dy, _C.TensorBase) else list(dy))]
        gm.backward(ys, dys)
        if unscale_grad:
            self.unscale(gm.attached_tensors())
            if update_scale == "if_unscale_grad":
                self.update()
        elif update_scale is True:
            self.update()

    def unscale(self, grad_tensors):
        inv = 1.0 / self.scale_factor
        tensors = [t for t in grad_tensors if t is not None and t.grad is not None]
        for t in tensors:
            g = t.grad * inv
            if not bool(ops.all(ops.isfinite(g))):
                self._found_non_finite = True
            t.grad = g
        if self._found_non_finite:
            for t in tensors:
                t.grad = None
        return self

    def update(self, new_scale=None):
        if new_scale is not None:
            self.scale_factor = float(new_scale)
        elif self._found_non_finite:
            self.scale_factor *= self.backoff_factor
            self._growth_tracker = 0
        else:
            self._growth_tracker += 1
            if self._growth_tracker >= self.growth_interval:
                self.scale_factor *= self.growth_factor
                self._growth_tracker = 0
        self._found_non_finite = False

    def state_dict(self):
        return {"scale_factor": self.scale_factor, "growth_factor": self.growth_factor,
                "backoff_factor": self.backoff_factor, "growth_interval": self.growth_interval,
                "_growth_tracker": self._growth_tracker}

    def load_state_dict(self, state):
        self.scale_factor = state["scale_factor"]
        self.growth_factor = state["growth_factor"]
        self.backoff_factor = state["backoff_factor"]
        self.growth_interval = state["growth_interval"]
        self._growth_tracker = state["_growth_tracker"]
