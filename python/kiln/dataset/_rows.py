"""Rows and batches as NumPy, and their conversion to kiln Tensors (shared by both APIs)."""
import numpy as np


def to_numpy(value):
    """A NumPy array of one column value (kiln Tensors by asnumpy, anything else by asarray)."""
    if hasattr(value, "asnumpy"):
        return value.asnumpy()
    return np.asarray(value)


def as_row(item, what):
    """A source item as a tuple of NumPy arrays (a lone value makes a one-column row)."""
    if isinstance(item, dict):
        raise TypeError(f"kiln.dataset: {what} gave a dict; give a tuple of column values instead")
    if isinstance(item, (tuple, list)):
        return tuple(to_numpy(v) for v in item)
    return (to_numpy(item),)


def stack(values, what):
    """np.stack of same-shaped samples, with an error naming the shapes that differ."""
    arrays = [to_numpy(v) for v in values]
    shapes = {a.shape for a in arrays}
    if len(shapes) > 1:
        raise ValueError(f"kiln.dataset: cannot batch {what}: samples have different shapes "
                         f"{sorted(shapes)}; pad them in a map, or use batch_size=1")
    return np.stack(arrays)


def to_tensor(array):
    """A kiln Tensor holding a copy of a NumPy array (Python scalars become 0-d arrays)."""
    from .._tensor import Tensor
    array = np.ascontiguousarray(array)
    if array.dtype.kind in "US" or array.dtype == object:
        raise TypeError(f"kiln.dataset: a column of dtype {array.dtype} cannot become a Tensor; "
                        "use output_numpy=True or convert it in a map")
    return Tensor(array)
