"""Reverse-mode autodiff, MindSpore style: grad, value_and_grad, no_grad."""
import contextlib
import functools
import threading

from . import _C


class no_grad(contextlib.ContextDecorator):
    """Context (or decorator) in which no op is recorded for autograd."""

    def __enter__(self):
        self._prev = _C.set_grad_enabled(False)
        return self

    def __exit__(self, *exc):
        _C.set_grad_enabled(self._prev)
        return False


class enable_grad(contextlib.ContextDecorator):
    """Context (or decorator) in which ops are recorded for autograd."""

    def __enter__(self):
        self._prev = _C.set_grad_enabled(True)
        return self

    def __exit__(self, *exc):
        _C.set_grad_enabled(self._prev)
        return False


def is_grad_enabled():
    return _C.is_grad_enabled()


def set_grad_enabled(mode):
    """Sets grad mode; returns the previous one."""
    return _C.set_grad_enabled(bool(mode))


def _positions(grad_position, nargs):
    if grad_position is None:
        return ()
    single = isinstance(grad_position, int)
    pos = (grad_position,) if single else tuple(grad_position)
    for p in pos:
        if not isinstance(p, int) or not -nargs <= p < nargs:
            raise ValueError(f"grad: grad_position {grad_position!r} is out of range for {nargs} arguments")
    return tuple(p % nargs for p in pos), single


def _weights_list(weights):
    if weights is None:
        return None, False
    if isinstance(weights, _C.TensorBase):
        return [weights], True
    if hasattr(weights, "trainable_params"):
        return list(weights.trainable_params()), False
    return list(weights), False


_nesting = threading.local()  # depth of grad calls running their function on this thread


def differentiating():
    """Whether code runs inside a grad / value_and_grad call (its results will be differentiated)."""
    return getattr(_nesting, "depth", 0) > 0


def _run(fn, grad_position, weights, has_aux, args, kwargs):
    from ._tensor import Tensor

    nargs = len(args)
    if grad_position is None and weights is None:
        raise ValueError("grad: grad_position and weights cannot both be None")
    pos, single = _positions(grad_position, nargs) if grad_position is not None else ((), False)
    args = list(args)
    leaves = []
    for p in pos:
        a = args[p]
        if not isinstance(a, _C.TensorBase):
            raise TypeError(f"grad: argument {p} must be a Tensor to be differentiated, got {type(a).__name__}")
        if not a.dtype.is_floating_point:
            raise TypeError(f"grad: argument {p} has dtype {a.dtype}; only float tensors have gradients")
        if a.requires_grad or (isinstance(a, Tensor) and type(a) is not Tensor):
            leaf = a  # already tracked (e.g. inside an outer grad), or a Parameter keeping its identity
        else:
            leaf = a.detach()
            leaf.requires_grad = True
        args[p] = leaf
        leaves.append(args[p])
    wlist, wsingle = _weights_list(weights)
    depth = getattr(_nesting, "depth", 0)
    _nesting.depth = depth + 1
    try:
        with enable_grad():
            out = fn(*args, **kwargs)
    finally:
        _nesting.depth = depth
    if has_aux:
        if not isinstance(out, tuple) or len(out) < 2:
            raise ValueError("grad: with has_aux=True the function must return a tuple (output, aux, ...)")
        value, outputs = out, out[0]
    else:
        value = out
        outputs = out[0] if isinstance(out, tuple) else out
    if not isinstance(outputs, _C.TensorBase):
        raise TypeError(f"grad: the function must return a Tensor, got {type(outputs).__name__}")
    targets = leaves + (wlist or [])
    if not outputs.requires_grad:
        grads = tuple(_zeros_like(t) for t in targets)
    else:
        # inside another grad's function the gradients must be differentiable themselves
        grads = _C.grad([outputs], targets, None, depth > 0 and is_grad_enabled())
        grads = tuple(g if g is not None else _zeros_like(t) for g, t in zip(grads, targets))
    gin, gw = grads[:len(leaves)], grads[len(leaves):]
    if grad_position is not None and single:
        gin = gin[0]
    if weights is not None and wsingle:
        gw = gw[0]
    if grad_position is None:
        result = gw
    elif weights is None:
        result = gin
    else:
        result = (gin, gw)
    return value, result


def _zeros_like(t):
    from .ops import zeros_like

    return zeros_like(t)


def grad(fn, grad_position=0, weights=None, has_aux=False):
    """A function returning the gradients of fn's output (its first output with has_aux) with
    respect to the arguments at grad_position and/or the given weights (Parameters or a Cell).
    Non-scalar outputs are differentiated with a gradient of ones, as in MindSpore. With has_aux
    the function returns (output, aux, ...) and grad returns (gradients, aux)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        value, grads = _value_and_grads(fn, grad_position, weights, has_aux, args, kwargs)
        if has_aux:  # (gradients, the outputs after the first)
            return grads, (value[1] if len(value) == 2 else value[1:])
        return grads

    wrapper._kiln_grad_of = fn
    return wrapper


def value_and_grad(fn, grad_position=0, weights=None, has_aux=False):
    """Like grad, but the function returns (fn's value, gradients)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return _value_and_grads(fn, grad_position, weights, has_aux, args, kwargs)

    wrapper._kiln_grad_of = fn
    return wrapper


def jitted_of(fn):
    """The kiln.jit function behind fn (fn itself, or a Cell's JitConfig one), or None."""
    from .jit import JitFunction

    return fn if isinstance(fn, JitFunction) else getattr(fn, "__dict__", {}).get("_jitted")


def differentiates_by_pieces(fn):
    """Whether fn (a Python function) is a grad / value_and_grad of a jitted function whose gradients come from its
    compiled pieces on the eager tape (capture_mode="bytecode" with graph breaks): a capture around
    it must call it in Python (a graph break) rather than trace through it."""
    inner = fn.__dict__.get("_kiln_grad_of")
    jitted = None if inner is None else jitted_of(inner)
    return jitted is not None and jitted._grad_through_pieces()


def _value_and_grads(fn, grad_position, weights, has_aux, args, kwargs):
    if not _C.is_tracing():
        jitted = jitted_of(fn)
        if jitted is not None and jitted._grad_through_pieces():
            # bytecode capture with graph breaks: each compiled piece records one node on the tape, its
            # backward compiled with it, and the Python between pieces is recorded as eager code is
            return _run(fn, grad_position, weights, has_aux, args, kwargs)
        if jitted is not None:  # a jitted function, or a Cell given a JitConfig
            # forward and backward compiled together as one graph
            return jitted._grad_variant(grad_position, weights, has_aux)(*args, **kwargs)
    return _run(fn, grad_position, weights, has_aux, args, kwargs)
