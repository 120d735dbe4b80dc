"""kiln.jit: graph capture and compiled execution, MindSpore's jit and MegEngine's megengine.jit.

The package is itself callable: kiln.jit(fn, ...), @kiln.jit and @kiln.jit(...) are
kiln.jit.jit (MindSpore's mindspore.jit). Its attributes are MegEngine's megengine.jit:
kiln.jit.trace, kiln.jit.SublinearMemoryConfig, kiln.jit.DTRConfig,
kiln.jit.GraphOptimizationConfig, and the modules kiln.jit.tracing and
kiln.jit.sublinear_memory_config, dtr_config and graph_opt_config.
"""
import sys as _sys
import types as _types

from .config import JitConfig
from .eager_switch import disable_jit
from .function import CacheInfo, JitFunction, explain, jit
from .syntax import JitSyntaxError
from .dtr_config import DTRConfig
from .graph_opt_config import GraphOptimizationConfig
from .sublinear_memory_config import SublinearMemoryConfig
from .megengine import TraceMismatchError, trace
from .exclude import exclude_from_trace
from . import tracing

__all__ = ["CacheInfo", "disable_jit", "DTRConfig", "exclude_from_trace", "explain", "GraphOptimizationConfig", "JitConfig", "JitFunction", "JitSyntaxError",
           "SublinearMemoryConfig", "TraceMismatchError", "jit", "trace"]


class _CallableModule(_types.ModuleType):
    """kiln.jit's module type: calling the module calls kiln.jit.jit."""

    def __call__(self, function=None, **kwargs):
        return jit(function, **kwargs)

    @property
    def __signature__(self):  # inspect.signature(kiln.jit) shows jit's parameters
        import inspect

        return inspect.signature(jit)


_sys.modules[__name__].__class__ = _CallableModule
