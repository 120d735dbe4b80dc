"""Grad mode: whether kiln_apply records ops for autograd (thread-local, on by default). Below the
ops (kiln.ops.control_flow runs its branches without recording); kiln.autograd re-exports it."""
import contextlib

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
