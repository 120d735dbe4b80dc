"""kiln.mutable (MindSpore's mindspore.mutable): mark a Python scalar, or a tuple / list / dict of
scalars and tensors, as a variable input of jitted functions rather than a constant.

kiln.jit keys its compiled graphs on the values of non-tensor arguments (each new value is a new
compile, its value baked into the graph). mutable(v) turns every Python scalar inside v into a 0-d
tensor (bool -> bool, int -> int64, float -> float32, kiln's default float), keeping the
containers, so that the values become graph inputs: one compile serves every value, in every capture
mode. The same object is what an eager call receives, so compiled and eager results agree; code
that needs the Python value itself (range(n), a shape) must take the value as a constant instead.
"""
import numpy as np

from .. import _C


def mutable(input_data, dynamic_len=False):
    """input_data with each Python scalar inside it as a 0-d tensor (tensors stay as they are);
    tuples, lists and dicts are rebuilt around them. dynamic_len (MindSpore's variable-length
    sequences) is not supported: True raises."""
    if not isinstance(dynamic_len, bool):
        raise TypeError(f"mutable: dynamic_len must be True or False, got {dynamic_len!r}")
    if dynamic_len:
        raise NotImplementedError("mutable: dynamic_len=True (a sequence of variable length) is not supported; "
                                  "pass a tensor instead")
    return _convert(input_data, "input_data")


def _convert(v, where):
    from .._tensor import Tensor

    if isinstance(v, _C.TensorBase):
        return v
    if isinstance(v, bool):
        return Tensor(np.array(v, dtype=np.bool_))
    if isinstance(v, int):
        if not -(1 << 63) <= v < (1 << 63):
            raise OverflowError(f"mutable: {where} = {v} does not fit in int64")
        return Tensor(np.array(v, dtype=np.int64))
    if isinstance(v, float):
        return Tensor(np.array(v, dtype=np.float32))
    if isinstance(v, tuple):
        return tuple(_convert(x, f"{where}[{k}]") for k, x in enumerate(v))
    if isinstance(v, list):
        return [_convert(x, f"{where}[{k}]") for k, x in enumerate(v)]
    if isinstance(v, dict):
        return {k: _convert(x, f"{where}[{k!r}]") for k, x in v.items()}
    raise TypeError(f"mutable: {where} is a {type(v).__name__}; expected a Tensor, a Python bool, int or float, or "
                    "a tuple, list or dict of them")
