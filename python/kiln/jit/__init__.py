"""Graph capture and compiled execution: kiln.jit (MindSpore) and kiln.trace (MegEngine)."""
from .config import JitConfig
from .function import CacheInfo, JitFunction, jit
from .megengine import SublinearMemoryConfig, TraceMismatchError, trace

__all__ = ["CacheInfo", "JitConfig", "JitFunction", "SublinearMemoryConfig", "TraceMismatchError", "jit", "trace"]
