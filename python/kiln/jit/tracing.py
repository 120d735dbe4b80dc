"""MegEngine's module path megengine.jit.tracing: `from kiln.jit.tracing import trace,
TraceMismatchError` (the implementation lives in kiln.jit.megengine)."""
from .megengine import TraceMismatchError, trace

__all__ = ["TraceMismatchError", "trace"]
