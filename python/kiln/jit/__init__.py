"""Graph capture and compiled execution: kiln.jit (MindSpore) and kiln.trace (MegEngine)."""
from .function import CacheInfo, JitFunction, jit
from .megengine import SublinearMemoryConfig, TraceMismatchError, trace  # noqa: F401

__all__ = ["CacheInfo", "JitFunction", "jit"]
