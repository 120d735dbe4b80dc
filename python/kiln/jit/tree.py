"""Flattening nested arguments and results: tensors become a flat list, everything else
becomes part of a hashable structure (the cache key) and is rebuilt from it.

The work is C (kiln._C.tree, src/python/tree.c), which documents the structure. Constants are
keyed by const_key: the type beside it (1, 1.0 and True differ); floats and complex numbers by
their bits (0.0 and -0.0 differ, a NaN equals itself), NumPy scalars by dtype and bytes, other
numbers by value and repr (Decimal('-0') and Decimal('0')); anything else by its own equality.
"""
from .. import _C
from ..tree_util import register_pytree_node  # noqa: F401 (one registry: kiln.tree_util's)

_TENSOR = _C.tree.TENSOR

flatten = _C.tree.flatten  # (obj, leaves) -> spec, appending obj's tensors to leaves
unflatten = _C.tree.unflatten  # (spec, leaves, pos=0) -> (object, next pos)
describe = _C.tree.describe  # spec -> short text, for messages
fresh_results = _C.tree.fresh_results  # spec of a result -> (spec whose sets unflatten copies, those sets)
const_key = _C.tree.const_key
