"""Flattening nested arguments and results: tensors become a flat list, everything else
becomes part of a hashable structure (the cache key) and is rebuilt from it."""
import numbers
import struct

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
    return ("const", type(obj), const_key(obj), _Payload(obj))


class _Payload:
    """The constant itself, carried in a key without taking part in its equality: two keys are
    equal when their const_key()s are (float('nan') is not equal to itself)."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __eq__(self, other):
        return isinstance(other, _Payload)

    def __hash__(self):
        return 0


def const_key(obj):
    """What distinguishes a constant argument for the compile cache: the type is part of the key
    beside it (1, 1.0 and True differ); floats and complex numbers by their bits (0.0 and -0.0
    differ, a NaN equals itself), NumPy scalars by dtype and bytes, other numbers by value and
    repr (Decimal('-0') and Decimal('0')); anything else by its own equality."""
    if type(obj) is float:
        return struct.pack("<d", obj)
    if type(obj) is complex:
        return struct.pack("<dd", obj.real, obj.imag)
    if type(obj) in (int, bool, str, bytes) or obj is None:
        return obj
    tobytes = getattr(obj, "tobytes", None)
    if tobytes is not None and getattr(obj, "shape", None) == () and hasattr(obj, "dtype"):  # a NumPy scalar
        return (str(obj.dtype), tobytes())
    if isinstance(obj, numbers.Number):
        return (obj, repr(obj))
    return obj


def unflatten(spec, leaves, pos=0):
    """Rebuilds the object described by spec from leaves[pos:]; returns (object, next pos)."""
    if spec == _TENSOR:
        return leaves[pos], pos + 1
    kind = spec[0]
    if kind == "const":
        return spec[3].value, pos
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
        return repr(spec[3].value)
    if spec[0] == "dict":
        return "{" + ", ".join(f"{k!r}: {describe(s)}" for k, s in zip(spec[1], spec[2])) + "}"
    inner = ", ".join(describe(s) for s in spec[1])
    return f"({inner})" if spec[0] == "tuple" else f"[{inner}]"
