"""Flattening nested arguments and results: tensors become a flat list, everything else
becomes part of a hashable structure (the cache key) and is rebuilt from it.

The work is C (kiln._C.tree, src/python/tree.c), which documents the structure. Constants are
keyed by const_key: the type beside it (1, 1.0 and True differ); floats and complex numbers by
their bits (0.0 and -0.0 differ, a NaN equals itself), NumPy scalars by dtype and bytes, other
numbers by value and repr (Decimal('-0') and Decimal('0')); anything else by its own equality.
"""
from .. import _C

_TENSOR = _C.tree.TENSOR

flatten = _C.tree.flatten  # (obj, leaves) -> spec, appending obj's tensors to leaves
unflatten = _C.tree.unflatten  # (spec, leaves, pos=0) -> (object, next pos)
describe = _C.tree.describe  # spec -> short text, for messages
const_key = _C.tree.const_key


def register_pytree_node(node_type, flatten_fn, unflatten_fn):
    """Lets kiln.jit and kiln.trace take and return objects of node_type: flatten_fn(obj) ->
    (children, aux), children a sequence of tensors and nested containers, aux hashable (part of
    the cache key); unflatten_fn(aux, children) rebuilds the object. Dataclass instances need no
    registration (their init fields are the children)."""
    _C.tree.register_node(node_type, flatten_fn, unflatten_fn)


def _dataclass_node(cls):
    """(flatten, unflatten) of a dataclass: its init fields as children, their names as aux; a
    field set outside __init__ keeps it from being rebuilt, so such a class stays a constant."""
    import dataclasses

    fields = dataclasses.fields(cls)
    if any(not f.init for f in fields):
        return None
    names = tuple(f.name for f in fields)
    return (lambda obj: (tuple(getattr(obj, n) for n in names), names),
            lambda aux, children: cls(**dict(zip(aux, children))))


_C.tree.set_node_default(_dataclass_node)
