"""Graph capture and compiled execution: kiln.jit (MindSpore) and kiln.trace (MegEngine)."""
from .config import JitConfig
from .function import CacheInfo, JitFunction, jit
from .syntax import JitSyntaxError
from .megengine import SublinearMemoryConfig, TraceMismatchError, trace

__all__ = ["CacheInfo", "JitConfig", "JitFunction", "JitSyntaxError", "SublinearMemoryConfig", "TraceMismatchError", "jit", "trace"]
