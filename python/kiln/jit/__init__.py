"""Graph capture and compiled execution: kiln.jit (MindSpore) and kiln.trace (MegEngine)."""
from .function import CacheInfo, JitFunction, jit

__all__ = ["CacheInfo", "JitFunction", "jit"]
