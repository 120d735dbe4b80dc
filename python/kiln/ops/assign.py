"""MindSpore's in-place assignment ops: ops.assign, ops.assign_add and ops.assign_sub write into
`variable` (a Parameter or any tensor) and return it. They are `variable[...] = value` (broadcast;
the variable keeps its dtype and shape, a value that would change either is refused), so every
capture mode records them as the in-place writes they are. A Parameter is written without
gradient history, as an optimizer writes it."""
from .. import _C
from ..grad_mode import no_grad


def _check(op, variable):
    if not isinstance(variable, _C.TensorBase):
        raise TypeError(f"ops.{op}: variable must be a kiln Tensor or Parameter, got {type(variable).__name__}")


def _write(variable, value):
    # a leaf that requires grad (a Parameter) is written as optimizers write it, without history, as
    # MindSpore's Assign updates a Parameter; any other tensor records the write like t[...] = v
    if variable.requires_grad and variable.is_leaf:
        with no_grad():
            variable[...] = value
    else:
        variable[...] = value
    return variable


def assign(variable, value):
    """variable = value, in place; returns variable."""
    _check("assign", variable)
    return _write(variable, value)


def assign_add(variable, value):
    """variable += value, in place; returns variable."""
    _check("assign_add", variable)
    return _write(variable, variable + value)


def assign_sub(variable, value):
    """variable -= value, in place; returns variable."""
    _check("assign_sub", variable)
    return _write(variable, variable - value)
