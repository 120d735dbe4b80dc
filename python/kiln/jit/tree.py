"""Flattening nested arguments and results: tensors become a flat list, everything else
becomes part of a hashable structure (the cache key) and is rebuilt from it."""
from .. import _C

_TENSOR = "T"


def flatten(obj, leaves):
    """Appends obj's tensors to `leaves`; returns a hashable description of the rest."""
    if isinstance(obj, _C.TensorBase):
        leaves.append(obj)
        return _TENSOR
    if isinstance(obj, tuple):
        return ("tuple", tuple(flatten(o, leaves) for o in obj))
    if isinstance(obj, list):
        return ("list", tuple(flatten(o, leaves) for o in obj))
    if isinstance(obj, dict):
        keys = tuple(obj.keys())
        return ("dict", keys, tuple(flatten(obj[k], leaves) for k in keys))
    try:
        hash(obj)
    except TypeError:
        raise TypeError(f"jit: argument of type {type(obj).__name__} is neither a Tensor, a container of them, "
                        "nor a hashable constant") from None
    return ("const", type(obj), obj)


def unflatten(spec, leaves, pos=0):
    """Rebuilds the object described by spec from leaves[pos:]; returns (object, next pos)."""
    if spec == _TENSOR:
        return leaves[pos], pos + 1
    kind = spec[0]
    if kind == "const":
        return spec[2], pos
    if kind == "dict":
        out = {}
        for k, s in zip(spec[1], spec[2]):
            out[k], pos = unflatten(s, leaves, pos)
        return out, pos
    items = []
    for s in spec[1]:
        item, pos = unflatten(s, leaves, pos)
        items.append(item)
    return (tuple(items) if kind == "tuple" else items), pos


def describe(spec):
    """Short text of a structure, for messages."""
    if spec == _TENSOR:
        return "Tensor"
    if spec[0] == "const":
        return repr(spec[2])
    if spec[0] == "dict":
        return "{" + ", ".join(f"{k!r}: {describe(s)}" for k, s in zip(spec[1], spec[2])) + "}"
    inner = ", ".join(describe(s) for s in spec[1])
    return f"({inner})" if spec[0] == "tuple" else f"[{inner}]"
