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
    KILN_BACKGROUND_COMPILE=1; kiln.wait_compiles() waits for the builds), deterministic ("ON" or
    "OFF", MindSpore 2.2's spelling of set_deterministic), loop_residual_budget (megabytes, default
    1024: the gradient of a compiled loop whose trip count is known — kiln.ops.scan, fori_loop with
    int bounds — stores each step's residuals when trip count x residual bytes per step fits it,
    else recomputes them in the backward; 0 always recomputes; read when a gradient is compiled,
    see docs/guide/transforms.md "Loops"). Unknown names raise ValueError."""
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
        elif name == "deterministic":
            if value not in ("ON", "OFF"):
                raise ValueError(f"set_context: deterministic must be 'ON' or 'OFF', got {value!r}")
        elif name == "loop_residual_budget":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"set_context: loop_residual_budget must be a number of megabytes >= 0, got {value!r}")
        elif name == "device_id":
            if isinstance(value, bool) or value != 0:
                raise ValueError(f"set_context: device_id must be 0 (kiln has one device, the CPU), got {value!r}")
        else:
            raise ValueError(f"set_context: unknown setting {name!r}; accepted: {', '.join(_context)}, "
                             f"background_compile, deterministic, loop_residual_budget")
    for name, value in kwargs.items():
        if name == "background_compile":
            _C.codegen_background(value)
            continue
        if name == "deterministic":
            _C.comm_set_deterministic(value == "ON")
            _C.gemm_set_pinned(value == "ON")
            continue
        if name == "loop_residual_budget":
            _C.loop_residual_budget(int(value * (1 << 20)))
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
    if name == "deterministic":
        return "ON" if _C.comm_deterministic() else "OFF"
    if name == "loop_residual_budget":
        return _C.loop_residual_budget() / (1 << 20)
    if name not in _context:
        raise ValueError(f"get_context: unknown setting {name!r}; accepted: {', '.join(_context)}, "
                         f"background_compile, deterministic, loop_residual_budget")
    return _context[name]


def set_deterministic(deterministic):
    """MindSpore's set_deterministic: with True, the float all-reduces of kiln.communication (sum,
    mean, prod; the gradient all-reduce of data-parallel training) gather every rank's tensor and
    combine them in rank order, ((x0 + x1) + x2) + ..., the same on every rank and in every run,
    whatever order the MPI library's algorithm takes; and every float32 GEMM runs on OpenBLAS,
    whatever provider kiln.gemm_select chose for its shape class, and bfloat16 products take the
    fp32-compute fallback, whatever the per-process timing chose. It changes no other kernel
    (tests/python/test_distributed_deterministic.py checks that training repeats bit for bit with
    it, at a fixed thread count). Read at each all-reduce, eager or compiled. Default False."""
    if not isinstance(deterministic, bool):
        raise TypeError(f"set_deterministic: deterministic must be a bool, got {deterministic!r}")
    _C.comm_set_deterministic(deterministic)
    _C.gemm_set_pinned(deterministic)


def get_deterministic():
    """Whether set_deterministic(True) is in effect."""
    return _C.comm_deterministic()


def wait_compiles():
    """Waits until no generated code is being built in the background (set_context(
    background_compile=True)): calls made after it run the native code of every function compiled
    before it."""
    _C.codegen_wait()


# ---- MindSpore's auto-parallel context (data parallelism over kiln.communication) ----------

class ParallelMode:
    """The parallel modes set_auto_parallel_context accepts: kiln runs stand_alone and
    data_parallel (every rank holds the whole model and a shard of each batch; the gradients are
    all-reduced)."""
    STAND_ALONE = "stand_alone"
    DATA_PARALLEL = "data_parallel"


BUCKET_BYTES = 25 * 1024 * 1024  # gradients per fused all-reduce by default (DDP's bucket)
_AUTO_PARALLEL_DEFAULTS = {"parallel_mode": ParallelMode.STAND_ALONE, "gradients_mean": False, "device_num": 1,
                           "global_rank": 0, "parameter_broadcast": False, "all_reduce_fusion_config": [],
                           "comm_fusion": {"allreduce": {"mode": "size", "config": BUCKET_BYTES // (1024 * 1024)}}}
_auto_parallel = dict(_AUTO_PARALLEL_DEFAULTS)


def _check_comm_fusion(value):
    if not isinstance(value, dict) or set(value) - {"allreduce"}:
        raise ValueError(f"set_auto_parallel_context: comm_fusion must be a dict {{'allreduce': {{'mode': 'size', "
                         f"'config': MB}}}} (or mode 'auto' / 'index'), got {value!r}")
    ar = value.get("allreduce", {})
    if not isinstance(ar, dict) or ar.get("mode", "size") not in ("auto", "size", "index"):
        raise ValueError(f"set_auto_parallel_context: comm_fusion['allreduce'] must have mode 'auto', 'size' or "
                         f"'index', got {ar!r}")
    if ar.get("mode", "size") == "size" and (isinstance(ar.get("config", 25), bool)
                                            or not isinstance(ar.get("config", 25), (int, float))
                                            or ar.get("config", 25) <= 0):
        raise ValueError(f"set_auto_parallel_context: comm_fusion size config must be a number of MB > 0, got "
                         f"{ar.get('config')!r}")


def set_auto_parallel_context(**kwargs):
    """MindSpore's parallel settings: parallel_mode ("stand_alone" or "data_parallel"),
    gradients_mean (average the all-reduced gradients instead of summing them), device_num and
    global_rank (checked against kiln.communication's when given), parameter_broadcast (rank 0's
    parameters are broadcast when a TrainOneStepCell is made), all_reduce_fusion_config (a list
    of increasing parameter indices at which gradient buckets split) and comm_fusion
    ({"allreduce": {"mode": "size", "config": MB}}: buckets of at most that many megabytes,
    25 by default; "auto": the default size; "index": all_reduce_fusion_config). Unknown
    names and bad values raise ValueError and change nothing."""
    for name, value in kwargs.items():
        if name == "parallel_mode":
            if value not in (ParallelMode.STAND_ALONE, ParallelMode.DATA_PARALLEL):
                raise ValueError(f"set_auto_parallel_context: parallel_mode must be 'stand_alone' or "
                                 f"'data_parallel' (kiln runs no other), got {value!r}")
        elif name in ("gradients_mean", "parameter_broadcast"):
            if not isinstance(value, bool):
                raise ValueError(f"set_auto_parallel_context: {name} must be a bool, got {value!r}")
        elif name in ("device_num", "global_rank"):
            if isinstance(value, bool) or not isinstance(value, int) or value < (1 if name == "device_num" else 0):
                raise ValueError(f"set_auto_parallel_context: {name} must be an int "
                                 f"{'>= 1' if name == 'device_num' else '>= 0'}, got {value!r}")
        elif name == "all_reduce_fusion_config":
            if not isinstance(value, (list, tuple)) or any(isinstance(v, bool) or not isinstance(v, int) or v <= 0
                                                           for v in value) or list(value) != sorted(set(value)):
                raise ValueError(f"set_auto_parallel_context: all_reduce_fusion_config must be a list of increasing "
                                 f"parameter indices > 0, got {value!r}")
            value = list(value)
        elif name == "comm_fusion":
            _check_comm_fusion(value)
        else:
            raise ValueError(f"set_auto_parallel_context: unknown setting {name!r}; accepted: "
                             f"{', '.join(_AUTO_PARALLEL_DEFAULTS)}")
    _auto_parallel.update(kwargs)
    _C.comm_set_fusion_bytes(gradient_bucket_bytes())  # what the bucketing pass reads at compile time


def get_auto_parallel_context(name):
    """The value of one setting of set_auto_parallel_context."""
    if name not in _auto_parallel:
        raise ValueError(f"get_auto_parallel_context: unknown setting {name!r}; accepted: "
                         f"{', '.join(_AUTO_PARALLEL_DEFAULTS)}")
    return _auto_parallel[name]


def reset_auto_parallel_context():
    """Every setting of set_auto_parallel_context back to its default (stand_alone)."""
    _auto_parallel.clear()
    _auto_parallel.update(_AUTO_PARALLEL_DEFAULTS)
    _C.comm_set_fusion_bytes(BUCKET_BYTES)


def data_parallel():
    """Whether set_auto_parallel_context(parallel_mode="data_parallel") is in effect."""
    return _auto_parallel["parallel_mode"] == ParallelMode.DATA_PARALLEL


def gradient_bucket_bytes():
    """The most bytes of gradients one fused all-reduce carries (comm_fusion's size)."""
    ar = _auto_parallel["comm_fusion"].get("allreduce", {})
    if ar.get("mode", "size") == "size":
        return int(ar.get("config", BUCKET_BYTES // (1024 * 1024)) * 1024 * 1024)
    return BUCKET_BYTES
