"""kiln.set_context / kiln.get_context: MindSpore's process-wide settings that kiln reads.

jit_syntax_level ("STRICT" | "LAX", default "LAX") is the syntax level of every kiln.jit and
JitConfig that leaves its own empty (read when a function is captured, so a later set_context
applies to functions compiled after it). mode (GRAPH_MODE = 0 | PYNATIVE_MODE = 1, default
PYNATIVE_MODE): in GRAPH_MODE, as in MindSpore, a Cell called from Python runs compiled: through
kiln.jit with its default options (ast capture, O0), or its own Cell.set_jit_config; Cells it
calls are part of its graph, and plain functions stay eager unless wrapped in kiln.jit.
"""
from . import _C

GRAPH_MODE = 0
PYNATIVE_MODE = 1
# MindSpore spells syntax levels as constants of the package; kiln's are their names
STRICT = "STRICT"
LAX = "LAX"

_MODES = {GRAPH_MODE: "GRAPH_MODE", PYNATIVE_MODE: "PYNATIVE_MODE"}
_SYNTAX_LEVELS = (STRICT, LAX)
_context = {"mode": PYNATIVE_MODE, "jit_syntax_level": LAX, "device_target": "CPU", "device_id": 0, "jit_level": "",
            "save_graphs": False, "save_graphs_path": "."}
_JIT_LEVELS = ("", "O0", "O1", "O2")


def set_context(**kwargs):
    """Sets process-wide settings: mode (kiln.GRAPH_MODE or kiln.PYNATIVE_MODE, see the module
    docstring), jit_syntax_level ("STRICT" or "LAX"), jit_level ("O0", "O1", "O2": the level of
    every kiln.jit and GRAPH_MODE Cell made after it that names none; "" kiln's default O0),
    save_graphs (truthy: each graph kiln.jit compiles is written as text to save_graphs_path, as
    <function>_<n>.ir), device_target ("CPU"; another warns and kiln stays on the CPU) and
    device_id (0), background_compile (True: generated C is compiled on a background thread while
    the calls that need it run kiln's interpreted kernels, switching to the native code once it is
    built: first calls cost no compiler run; default False, or True when the environment has
    KILN_BACKGROUND_COMPILE=1; kiln.wait_compiles() waits for the builds). Unknown names raise
    ValueError."""
    for name, value in kwargs.items():
        if name == "mode":
            if isinstance(value, bool) or value not in _MODES:
                raise ValueError(f"set_context: mode must be kiln.GRAPH_MODE (0) or kiln.PYNATIVE_MODE (1), "
                                 f"got {value!r}")
        elif name == "jit_syntax_level":
            if value not in _SYNTAX_LEVELS:
                raise ValueError(f"set_context: jit_syntax_level must be 'STRICT' or 'LAX', got {value!r}")
        elif name == "device_target":
            if not isinstance(value, str):
                raise ValueError(f"set_context: device_target must be a str such as 'CPU', got {value!r}")
        elif name == "jit_level":
            if value not in _JIT_LEVELS:
                raise ValueError(f"set_context: jit_level must be 'O0', 'O1', 'O2' or '', got {value!r}")
        elif name == "save_graphs":
            if not isinstance(value, (bool, int)) or not 0 <= int(value) <= 3:
                raise ValueError(f"set_context: save_graphs must be a bool or 0-3, got {value!r}")
        elif name == "save_graphs_path":
            if not isinstance(value, str) or not value:
                raise ValueError(f"set_context: save_graphs_path must be a non-empty str, got {value!r}")
        elif name == "background_compile":
            if not isinstance(value, bool):
                raise ValueError(f"set_context: background_compile must be a bool, got {value!r}")
        elif name == "device_id":
            if isinstance(value, bool) or value != 0:
                raise ValueError(f"set_context: device_id must be 0 (kiln has one device, the CPU), got {value!r}")
        else:
            raise ValueError(f"set_context: unknown setting {name!r}; accepted: {', '.join(_context)}, "
                             f"background_compile")
    for name, value in kwargs.items():
        if name == "background_compile":
            _C.codegen_background(value)
            continue
        if name == "device_target":
            if value.upper() != "CPU":  # (MindSpore scripts name their device first; kiln runs on the CPU)
                import warnings

                warnings.warn(f"set_context: device_target {value!r} is not available; kiln runs on the CPU",
                              RuntimeWarning, stacklevel=2)
            value = "CPU"
        _context[name] = value



def graph_mode():
    """Whether Cells called from Python run compiled (set_context(mode=GRAPH_MODE))."""
    return _context["mode"] == GRAPH_MODE


def get_context(name):
    """The value of one setting of set_context."""
    if name == "background_compile":
        return _C.codegen_background()
    if name not in _context:
        raise ValueError(f"get_context: unknown setting {name!r}; accepted: {', '.join(_context)}, "
                         f"background_compile")
    return _context[name]


def wait_compiles():
    """Waits until no generated code is being built in the background (set_context(
    background_compile=True)): calls made after it run the native code of every function compiled
    before it."""
    _C.codegen_wait()
