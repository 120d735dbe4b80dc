"""Validation of kiln.jit's arguments and options."""

CAPTURE_MODES = ("ast", "bytecode", "trace")
IMPLEMENTED_CAPTURE_MODES = ("ast", "trace")
SYNTAX_LEVELS = ("STRICT", "LAX")
JIT_LEVELS = ("O0", "O1", "O2")
# MindSpore's names are accepted as aliases: ms_backend is kernel by kernel, GE the whole-graph sink.
# "" picks by level, as MindSpore does: O0/O1 kernel by kernel, O2 the whole graph sunk.
BACKENDS = {"": "", "kbk": "kbk", "ms_backend": "kbk", "sink": "sink", "GE": "sink"}
EXEC_ORDERS = ("bfs", "dfs")
OPTION_NAMES = ("exec_order", "recompile_limit", "debug_poison", "disable_format_transform", "infer_boost",
                "jit_syntax_level")


class JitOptions:
    """The validated settings of one jitted function."""

    __slots__ = ("capture_mode", "jit_level", "dynamic", "fullgraph", "backend", "exec_order", "recompile_limit",
                 "debug_poison", "disable_format_transform", "infer_boost", "jit_syntax_level")

    @classmethod
    def make(cls, capture_mode="ast", jit_level="O0", dynamic=False, fullgraph=False, backend="", **options):
        o = cls()
        if capture_mode not in CAPTURE_MODES:
            raise ValueError(f"jit: capture_mode must be one of {', '.join(map(repr, CAPTURE_MODES))}, "
                             f"got {capture_mode!r}")
        if capture_mode not in IMPLEMENTED_CAPTURE_MODES:
            raise NotImplementedError(f"jit: capture_mode={capture_mode!r} is not implemented yet; "
                                      "use capture_mode=\"ast\" (the default) or capture_mode=\"trace\"")
        if jit_level not in JIT_LEVELS:
            raise ValueError(f"jit: jit_level must be one of {', '.join(map(repr, JIT_LEVELS))}, got {jit_level!r}")
        if not isinstance(backend, str) or backend not in BACKENDS:
            accepted = ", ".join(map(repr, BACKENDS))
            raise ValueError(f"jit: backend must be one of {accepted}, got {backend!r}")
        if not isinstance(dynamic, bool) or not isinstance(fullgraph, bool):
            raise TypeError("jit: dynamic and fullgraph must be bools")
        for name in options:
            if name not in OPTION_NAMES:
                raise ValueError(f"jit: unknown option {name!r}; accepted options: {', '.join(OPTION_NAMES)}")
        o.capture_mode, o.jit_level, o.dynamic, o.fullgraph = capture_mode, jit_level, dynamic, fullgraph
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
        # fullgraph=True means STRICT (MindSpore); an explicit jit_syntax_level ("" = unset) wins
        level = options.get("jit_syntax_level", "") or ("STRICT" if fullgraph else "LAX")
        if level not in SYNTAX_LEVELS:
            raise ValueError(f"jit: jit_syntax_level must be 'STRICT', 'LAX' or '', got {level!r}")
        o.jit_syntax_level = level
        return o

    def with_capture_mode(self, capture_mode):
        """A copy of these options capturing with capture_mode."""
        o = JitOptions()
        for name in self.__slots__:
            setattr(o, name, getattr(self, name))
        o.capture_mode = capture_mode
        return o

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
