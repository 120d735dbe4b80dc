"""MindSpore's JitConfig(jit_level, exc_mode, jit_syntax_level): how a Cell given one with
Cell.set_jit_config is compiled."""

EXC_MODES = ("auto", "sink", "no_sink")
SYNTAX_LEVELS = ("", "STRICT", "LAX")


class JitConfig:
    """jit_level "O0" | "O1" | "O2" (default "O1"); exc_mode "auto" | "sink" | "no_sink": "auto" runs
    O0/O1 kernel by kernel and O2 sunk (the whole graph as one generated function, kiln.jit's
    backend "GE"), "sink" sinks at any level, "no_sink" runs kernel by kernel at any level (O2's
    passes included); jit_syntax_level "STRICT" | "LAX" | "" (for the ast capture mode; "", the
    default, uses kiln.set_context's jit_syntax_level when the Cell is captured). Further keyword
    arguments are kiln.jit options (capture_mode, exec_order, recompile_limit, ge_options, ...)."""

    def __init__(self, jit_level="O1", exc_mode="auto", jit_syntax_level="", **kwargs):
        from .options import JIT_LEVELS

        if jit_level not in JIT_LEVELS:
            raise ValueError(f"JitConfig: jit_level must be one of {', '.join(map(repr, JIT_LEVELS))}, "
                             f"got {jit_level!r}")
        if exc_mode not in EXC_MODES:
            raise ValueError(f"JitConfig: exc_mode must be one of {', '.join(map(repr, EXC_MODES))}, got {exc_mode!r}")
        if jit_syntax_level not in SYNTAX_LEVELS:
            raise ValueError(f"JitConfig: jit_syntax_level must be one of {', '.join(map(repr, SYNTAX_LEVELS))}, "
                             f"got {jit_syntax_level!r}")
        self.jit_level = jit_level
        self.exc_mode = exc_mode
        self.jit_syntax_level = jit_syntax_level
        self.options = dict(kwargs)
        self._make_options()  # validate now, not at the first call (and warn here, once)

    @property
    def backend(self):
        """The backend this configuration selects."""
        if self.exc_mode == "no_sink":
            return "ms_backend"
        if self.exc_mode == "sink" or self.jit_level == "O2":
            return "GE"
        return "ms_backend"

    def jit_options(self):
        """The kiln.jit options of this configuration (warnings were given when it was made)."""
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return self._make_options()

    def _make_options(self):
        from .options import JitOptions

        options = dict(self.options)
        if self.jit_syntax_level:
            options["jit_syntax_level"] = self.jit_syntax_level
        capture_mode = options.pop("capture_mode", "ast")
        return JitOptions.make(capture_mode=capture_mode, jit_level=self.jit_level, backend=self.backend, **options)

    def __repr__(self):
        return (f"JitConfig(jit_level={self.jit_level!r}, exc_mode={self.exc_mode!r}, "
                f"jit_syntax_level={self.jit_syntax_level!r})")
