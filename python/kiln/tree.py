"""kiln.tree: pytree registration for kiln.jit and kiln.trace arguments and results (the
flattening itself is kiln.jit.tree)."""
from .jit.tree import register_pytree_node

__all__ = ["register_pytree_node"]
