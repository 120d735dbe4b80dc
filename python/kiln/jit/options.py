"""Validation of kiln.jit's arguments and options."""
import warnings

from .. import _C
from .sublinear_memory_config import check as check_sublinear

CAPTURE_MODES = ("ast", "bytecode", "trace")
SYNTAX_LEVELS = ("STRICT", "LAX")
JIT_LEVELS = ("O0", "O1", "O2")
# The backends registered in C (src/runtime/backends.def: kbk, sink, reference), each by its name, and
# MindSpore's names as aliases: ms_backend is kernel by kernel, GE the whole-graph sink.
# "" picks by level, as MindSpore does: O0/O1 kernel by kernel, O2 the whole graph sunk.
BACKENDS = {"": "", **{name: name for name in _C.backend_names()}, "ms_backend": "kbk", "GE": "sink"}
EXEC_ORDERS = ("bfs", "dfs")
OPTION_NAMES = ("exec_order", "recompile_limit", "debug_poison", "disable_format_transform", "infer_boost",
                "jit_syntax_level", "ge_options", "profiling", "sublinear_memory_config")
# MindSpore >= 2.6 spells dynamic as an int: 0 static shapes, 1 dynamic; None: automatic (kiln.jit.dynamic)
DYNAMIC_VALUES = {0: False, 1: True, None: None}
GE_OPTION_GROUPS = ("global", "session")


class JitOptions:
    """The validated settings of one jitted function."""

    __slots__ = ("capture_mode", "jit_level", "dynamic", "fullgraph", "backend", "exec_order", "recompile_limit",
                 "debug_poison", "disable_format_transform", "infer_boost", "_syntax_level", "ge_options",
                 "profiling", "sublinear_memory_config", "compile_options")

    @classmethod
    def make(cls, capture_mode="ast", jit_level=None, dynamic=None, fullgraph=False, backend="", **options):
        o = cls()
        if jit_level is None:  # unnamed: set_context's jit_level, else O0
            from ..context import get_context

            jit_level = get_context("jit_level") or "O0"
        if capture_mode not in CAPTURE_MODES:
            raise ValueError(f"jit: capture_mode must be one of {', '.join(map(repr, CAPTURE_MODES))}, "
                             f"got {capture_mode!r}")
        if jit_level not in JIT_LEVELS:
            raise ValueError(f"jit: jit_level must be one of {', '.join(map(repr, JIT_LEVELS))}, got {jit_level!r}")
        if not isinstance(backend, str) or backend not in BACKENDS:
            accepted = ", ".join(map(repr, BACKENDS))
            raise ValueError(f"jit: backend must be one of {accepted}, got {backend!r}")
        if dynamic is not None and (not isinstance(dynamic, (bool, int)) or dynamic not in DYNAMIC_VALUES):
            raise ValueError(f"jit: dynamic must be 0, 1, False, True or None, got {dynamic!r}")
        if not isinstance(fullgraph, bool):
            raise TypeError(f"jit: fullgraph must be True or False, got {fullgraph!r}")
        for name in options:
            if name not in OPTION_NAMES:
                raise ValueError(f"jit: unknown option {name!r}; accepted options: {', '.join(OPTION_NAMES)}")
        o.capture_mode, o.jit_level, o.fullgraph = capture_mode, jit_level, fullgraph
        o.dynamic = DYNAMIC_VALUES[dynamic]
        o.backend = BACKENDS[backend] or ("sink" if jit_level == "O2" else "kbk")
        o.exec_order = options.get("exec_order", "bfs")
        if o.exec_order not in EXEC_ORDERS:
            raise ValueError(f"jit: exec_order must be one of {', '.join(map(repr, EXEC_ORDERS))}, "
                             f"got {o.exec_order!r}")
        o.recompile_limit = options.get("recompile_limit", 8)
        if not isinstance(o.recompile_limit, int) or isinstance(o.recompile_limit, bool) or o.recompile_limit < 1:
            raise ValueError(f"jit: recompile_limit must be a positive int, got {o.recompile_limit!r}")
        o.debug_poison = bool(options.get("debug_poison", False))
        o.disable_format_transform = options.get("disable_format_transform", False)
        if not isinstance(o.disable_format_transform, bool):
            raise ValueError("jit: disable_format_transform must be True or False")
        o.infer_boost = options.get("infer_boost", "off")
        if o.infer_boost not in ("on", "off"):
            raise ValueError(f"jit: infer_boost must be 'on' or 'off', got {o.infer_boost!r}")
        # an explicit jit_syntax_level wins; "" (unset) means STRICT with fullgraph=True (MindSpore), else
        # set_context's level, read at capture time (see jit_syntax_level)
        level = options.get("jit_syntax_level", "") or ("STRICT" if fullgraph else "")
        if level and level not in SYNTAX_LEVELS:
            raise ValueError(f"jit: jit_syntax_level must be 'STRICT', 'LAX' or '', got {level!r}")
        o._syntax_level = level
        o.ge_options = _ge_options(options.get("ge_options"), backend, o.backend)
        o.profiling = options.get("profiling", False)
        if not isinstance(o.profiling, bool):
            raise TypeError(f"jit: profiling must be True or False, got {o.profiling!r}")
        o.sublinear_memory_config = check_sublinear(options.get("sublinear_memory_config"), "jit")
        # what every compile of this function's graphs is given (kiln._C.CompileOptions checks it once)
        o.compile_options = _C.CompileOptions(order=o.exec_order, poison=o.debug_poison, level=o.level,
                                              inference=o.infer_boost == "on",
                                              disable_format_transform=o.disable_format_transform,
                                              backend=o.backend, sublinear=o.sublinear)
        return o

    @property
    def sublinear(self):
        """The sublinear-memory search settings as the compiler takes them, or None."""
        c = self.sublinear_memory_config
        return None if c is None else c.as_tuple()

    def with_capture_mode(self, capture_mode):
        """A copy of these options capturing with capture_mode."""
        o = JitOptions()
        for name in self.__slots__:
            setattr(o, name, getattr(self, name))
        o.capture_mode = capture_mode
        return o

    @property
    def jit_syntax_level(self):
        """"STRICT" or "LAX": this function's own level, or set_context's when it left it empty."""
        if self._syntax_level:
            return self._syntax_level
        from ..context import get_context

        return get_context("jit_syntax_level")

    @property
    def strict(self):
        return self.jit_syntax_level == "STRICT"

    @property
    def level(self):
        """The optimization level as the C pipeline numbers it (O0 = 0)."""
        return JIT_LEVELS.index(self.jit_level)

    def __repr__(self):
        return (f"capture_mode={self.capture_mode!r}, jit_level={self.jit_level!r}, backend={self.backend!r}, "
                f"exec_order={self.exec_order!r}")


def _ge_options(ge_options, backend, resolved):
    """MindSpore's ge_options={"global": {...}, "session": {...}} (str -> str), checked and copied.
    They configure Ascend's graph engine, which kiln's sink backend is not: none has an effect here,
    and one warning lists them."""
    if ge_options is None:
        return None
    if resolved != "sink":
        raise ValueError(f"jit: ge_options apply to backend=\"GE\" (kiln's sink backend), got backend={backend!r}"
                         + ("" if backend else " (kernel by kernel at this jit_level)"))
    if not isinstance(ge_options, dict):
        raise TypeError(f"jit: ge_options must be a dict with keys 'global' and 'session', got "
                        f"{type(ge_options).__name__}")
    out = {}
    for group, values in ge_options.items():
        if group not in GE_OPTION_GROUPS:
            raise ValueError(f"jit: ge_options accepts the keys 'global' and 'session', got {group!r}")
        if not isinstance(values, dict):
            raise TypeError(f"jit: ge_options[{group!r}] must be a dict of str to str, got {type(values).__name__}")
        for k, v in values.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise TypeError(f"jit: ge_options[{group!r}] must map str to str, got {k!r}: {v!r}")
        out[group] = dict(values)
    unused = [f"{group} {k!r}" for group, values in out.items() for k in values]
    if unused:
        warnings.warn(f"jit: ge_options configure Ascend's graph engine; kiln's sink backend has no use for "
                      f"{', '.join(unused)} (recorded on the options, ignored)", UserWarning, stacklevel=4)
    return out
