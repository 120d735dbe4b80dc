"""kiln.trace: MegEngine's megengine.jit.trace on kiln's trace capture and executor.

The first call of a trace runs the function eagerly while recording its ops (symbolic=True: with the
values of traced tensors hidden) and compiles the recording at the kiln level its opt_level maps to.
Later calls check the call signature and run the compiled graph (with record_only=True every call
runs the function eagerly and records it, and no compiled graph ever runs). While `trace.verify` is
True (the default, as MegEngine checks every call) each later call also re-runs the Python function
under a fresh recorder and compares what it did, op by op, with the recording, raising
TraceMismatchError at the first difference; `verify=False` skips that re-run and only checks the
signature.

A graph with side effects (in-place updates such as optimizer steps or slice assignment,
batch_norm in training mode, random ops) is never executed twice for one call: when the Python
function ran for that call (recording, symbolic tracing or verification), its results are the
results and the compiled graph is not run again.

Verification compares the graph as recorded (before the level's passes) with this call's recording,
in C (kiln._C.Graph.diff_ops / diff_outputs): values by what they are (argument k, capture k of its
kind and type, output k of op n), ops with their attributes and output types, and constants bit for
bit. When the compiled graph is to give the call's results (it has no effects), the other captured
tensors are compared too (Graph.diff_captured): one that existed before the call must be the same
tensor (a sub-Cell or Parameter replaced, a tensor in a dict replaced, is a mismatch) and one the
function made while it ran must hold the same values, as the graph reads the recorded ones. Tensors
reached through a global or closure name are also checked in Python: a name rebound to another
tensor, and with capture_as_const a changed value, are mismatches.
"""
import copy
import functools
import os
import sys
import warnings

from .. import _C
from ..autograd import differentiating
from ..profiler import CallRecorder, capture_phase
from . import dynamic, tree
from .capture_core import CallStrategy, Entry, EntryCache, NoHistory, Recording, TraceInfo, refuse_backward
from .eager_switch import jit_disabled
from .deploy import dump_trace
from .dtr_config import DTRConfig
from .graph_opt_config import GraphOptimizationConfig
from .sublinear_memory_config import SublinearMemoryConfig


class TraceMismatchError(RuntimeError):
    """A call of a trace did something other than what the trace recorded."""


# ---- arguments -------------------------------------------------------------------------

_labels = _C.tree.arg_labels  # labels of a call's tensor leaves, in order: x, args[1][0], kwargs['k']


def _device(t):
    return getattr(t, "device", "cpu")


def _check_call(old, new, verify):
    """Raises TraceMismatchError when a call's arguments differ from the traced call's in
    count, keywords, tensor-ness or structure (and non-tensor values unless `verify`: then the
    re-run decides whether those mattered); the comparison is kiln._C.tree.check_call."""
    differs = _C.tree.check_call(old, new, verify)
    if differs is not None:
        raise TraceMismatchError(differs)


# ---- globals and closure variables read by the function -----------------------------------

def _code_of(fn):
    while isinstance(fn, functools.partial):
        fn = fn.func
    fn = getattr(fn, "__func__", fn)
    if not hasattr(fn, "__code__"):
        fn = getattr(type(fn), "construct", None) or getattr(type(fn), "__call__", None)
        fn = getattr(fn, "__func__", fn)
    return fn if hasattr(fn, "__code__") else None


class _Bindings:
    """The tensors a function reaches through globals and closure variables, by name. Used to
    notice a name rebound to another tensor between calls (the graph keeps the tensor it
    captured) and, with capture_as_const, a baked-in tensor whose value changed."""

    def __init__(self, fn):
        self.slots = []
        f = _code_of(fn)
        if f is None:
            return
        global_names, free_names = _C.read_names(f.__code__)  # loaded and never stored
        cells = dict(zip(f.__code__.co_freevars, f.__closure__ or ()))
        for name in sorted(global_names):
            self.slots.append((f"global {name!r}", f.__globals__, name))
        for name in sorted(free_names):
            if name in cells:
                self.slots.append((f"closure variable {name!r}", cells[name], None))

    def add_called(self, user_code):
        """Adds the globals read by the functions a recorded run called (helpers of the traced
        function: a global rebound there is a different tensor too)."""
        seen = {(id(where), name) for _, where, name in self.slots}
        for code, globs in user_code.items():
            global_names, _ = _C.read_names(code)
            for name in sorted(global_names):
                if (id(globs), name) not in seen and isinstance(globs.get(name), (_C.TensorBase, dict, list)):
                    seen.add((id(globs), name))
                    self.slots.append((f"global {name!r} (read by {code.co_name})", globs, name))

    @staticmethod
    def _get(where, name):
        try:
            return where[name] if name is not None else where.cell_contents
        except (KeyError, IndexError, ValueError):
            return None

    def snapshot(self, with_values):
        """(outer, inner): (label, where, name, tensor, its values or None) of each tensor a slot
        holds (outer), and of the tensors in a dict or list a slot holds (inner: PARAMS["w"] =
        new_tensor rebinds one too), each read once."""
        outer, inner = [], []
        for label, where, name in self.slots:
            v = self._get(where, name)
            kind = type(v)
            if kind is dict or kind is list:
                for k, t in (v.items() if kind is dict else enumerate(v)):
                    if isinstance(t, _C.TensorBase):
                        inner.append((f"{label}[{k!r}]", v, k, t, t.asnumpy().copy() if with_values else None))
            elif isinstance(v, _C.TensorBase):
                outer.append((label, where, name, v, v.asnumpy().copy() if with_values else None))
        return outer, inner

    @staticmethod
    def check(snap, baked, inside=False):
        """Raises TraceMismatchError for a slot's tensor rebound (inside: those in a slot's dict or
        list, checked after the recordings compare, whose differences name the op) or, baked, changed
        (snap, baked: snapshots)."""
        get = _Bindings._get
        for label, where, name, t, value in snap[inside]:
            if get(where, name) is not t:
                raise TraceMismatchError(f"{label} refers to a different tensor than when the function last ran; the "
                                         "compiled graph keeps the tensor it captured (update it in place, or pass it "
                                         "as an argument)")
        baked = baked[inside]
        if baked:
            import numpy as np

            for label, where, name, t, value in baked:
                if value is not None and not np.array_equal(t.asnumpy(), value, equal_nan=True):
                    raise TraceMismatchError(f"a captured constant changed: {label} has a different value than when "
                                             "it was traced, and capture_as_const=True baked the old value into the "
                                             "graph")


# ---- recording ---------------------------------------------------------------------------

def _run_recorded(fn, spec, leaves, capture_constants, symbolic, level=0, symbolic_shape=False, sublinear=None,
                  caller=None, verifying=False):
    """Runs fn under a recorder; the graph is compiled at kiln level `level` (0-2) and compared
    as recorded. symbolic_shape: every input size of 2 or more is a symbol while recording
    (kiln.jit.dynamic), and run.capture can rebind the recording to other shapes. The .grad
    assignments the function makes are kept as run.extra.grad_targets, their tensors as extra outputs of
    the graph, for each replay to make them (set_grads). run.extra.unreplayable lists what the function
    did that no replay repeats (Tensor.backward accumulating in C, a .grad set before the call read,
    print to a file: kiln.jit.replay). caller: the call's (args, kwargs), whose lists and dicts the
    function must leave alone (a replay would not repeat a change of them: TraceMismatchError).
    verifying: the run checks a call against its recording, whose replay is the call's result, so
    its own result gets its refusing autograd node (Entry.no_history) only where it stands as the
    call's (_verified_result): run.extra.pending holds what that needs."""
    symbols = None
    if symbolic_shape:
        names, values, exprs, _ = dynamic.choose_symbols(leaves, None, True, None)
        symbols = (names, values, exprs) if values else None
    user_code = {}  # the code of every user function the run called -> its globals

    def on_call(frame):
        user_code.setdefault(frame.f_code, frame.f_globals)
    with Recording(_compile_options(level, sublinear), capture_constants=capture_constants,
                   on_call=on_call, symbols=symbols, hide_values=symbolic, grad_writes=True, into_outer=True,
                   timed=False) as rec:
        call_args, call_kwargs = rec.bind(spec, leaves, caller)
        result = rec.run(CallStrategy(fn), call_args, call_kwargs)
        grad_log, capture = rec.grad_log, rec.capture
        changed = None if rec.callers is None else rec.callers.changed()
        if changed is not None:
            raise TraceMismatchError(
                f"kiln.trace: {getattr(fn, '__qualname__', fn)} made {changed}; a trace replays only the tensor "
                "operations it recorded, so later calls would not make that change: return the new values "
                "instead (kiln.jit runs such a function eagerly)")
        try:  # (a size returned is a plain int, as in eager; numbers a compiled loop carried are numbers)
            result, out_spec, out_leaves = rec.outputs(result)
        except TypeError:
            raise TypeError(f"kiln.trace: the function returned {type(result).__name__}; results must be tensors, "
                            "hashable constants, or tuples/lists/dicts of them") from None
        n_results = len(out_leaves)
        last = {id(t): (t, v) for t, v in grad_log.writes}  # (the last assignment of each tensor's .grad stands)
        grad_targets = []
        for t, v in last.values():
            grad_targets.append((t, None if v is None else len(out_leaves)))
            if v is not None:
                out_leaves.append(v)
        diff_out = tuple(k for k in range(n_results) if isinstance(out_leaves[k], _C.TensorBase)
                         and out_leaves[k].requires_grad)
        grad_reads = () if verifying or not diff_out else tuple(
            t for _, t in rec.tracer.recorded().structure()[1] if t.requires_grad)
        executable = rec.compile(out_leaves, keep_graph=True)
        recorded = rec.graph  # the graph before the level's passes
        sources = rec.tracer.constant_sources()
    reasons, excluded, cells = rec.reasons, rec.excluded, rec.called
    info = TraceInfo()
    detached = [t.detach() for t in out_leaves]
    info.result = tree.unflatten(out_spec, detached[:n_results])[0]
    info.grad_targets = grad_targets
    info.unreplayable = list(dict.fromkeys(reasons))
    written = {id(t) for t, _ in grad_targets}
    info.grads_at_entry = [t for t in grad_log.read_as_none if id(t) in written]
    info.excluded = excluded  # exclude_from_trace ran: each call's own run is its result
    info.user_code = user_code
    info.cells = list({id(c): c for c in cells}.values())
    info.modes = tuple(c.training for c in info.cells)
    info.fast = False
    if capture is not None:
        capture.tracer = None  # the trace has ended
    info.requires_grad_key = None
    info.symbolic = None  # symbolic_shape: (the recording made symbolic, it optimized), or False; made on first need
    info.plan = None  # symbolic_shape: info.symbolic's optimized graph planned once, or False: none; made on first need
    info.export_capture = capture  # (kiln.export reads why a size was fixed)
    # the guards: with capture_as_const, the originals of the constants, whose in-place change makes the
    # recording stale
    info.guard_specs = [(t, (), version, _C.GUARD_VERSION) for t, _, version in sources]
    constants = _C.GuardSet(info.guard_specs)
    names = [_constant_name(recorded, int(name[1:]), t) for t, name, _ in sources]
    run = Entry(executable, out_spec, constants, names, extra=info)
    info.pending = None
    if diff_out and verifying:  # (the graph's reads are read from run.graph, the same recording, if they are needed)
        info.pending = (getattr(fn, "__qualname__", type(fn).__name__), diff_out, detached, _C.is_grad_enabled())
    elif diff_out:  # (see Entry.no_history: a later .backward() through a result fails, naming the function)
        run.no_history = NoHistory(grad_reads, diff_out)
        if _C.is_grad_enabled():
            refuse_backward(getattr(fn, "__qualname__", type(fn).__name__), run.no_history, detached, "kiln.trace")
    run.graph = recorded  # (the graph as recorded, before the level's passes)
    run.capture = capture if capture is not None and len(capture.specialized) < len(capture.values) else None
    info.param_names = _param_names(fn, info.cells, sources) if sources else {}
    if not info.unreplayable:  # (else the run's own assignments, and backward's in C, stand)
        set_grads(run, detached)
    return run


@functools.lru_cache(maxsize=32)
def _compile_options(level, sublinear):
    """The CompileOptions of a recording at kiln level `level` with sublinear memory's tuple (or
    None): made once per pair (a verifying trace records, and compiles, on every call)."""
    return _C.CompileOptions(level=level, sublinear=sublinear)


def _verified_result(run):
    """The result of a verifying recording (_run_recorded's verifying) standing as its call's: in
    grad mode, its outputs that would require grad eagerly get their refusing node (Entry.no_history),
    from the tensors the recording read that require grad."""
    if run.extra.pending is not None:
        name, diff_out, detached, grad_mode = run.extra.pending
        run.extra.pending = None
        if grad_mode:
            grad_reads = tuple(t for _, t in run.graph.structure()[1] if t.requires_grad)
            refuse_backward(name, NoHistory(grad_reads, diff_out), detached, "kiln.trace")
    return run.extra.result


def set_grads(run, outs):
    """The .grad assignments a recording made, from a replay's outputs outs."""
    for t, k in run.extra.grad_targets:
        t.grad = None if k is None else outs[k]


def _param_names(fn, cells, sources):
    """{value id: attribute path} of the captured constants that are parameters of the traced Cell
    or of the Cells it called ('conv1.weight'; trace.dump's keep_param_name). A parameter reached
    from several Cells takes its longest path, the one from the outermost."""
    by_storage = {(t._data_ptr, tuple(t.shape), t._strides): int(name[1:]) for t, name, _ in sources}
    roots = list(cells)
    owner = getattr(fn, "__self__", fn)
    if hasattr(owner, "parameters_and_names"):  # a Cell, or a Cell's method
        roots.insert(0, owner)
    names = {}
    for cell in roots:
        for path, p in cell.parameters_and_names():
            value = by_storage.get((p._data_ptr, tuple(p.shape), p._strides))
            if value is not None and len(path) > len(names.get(value, "")):
                names[value] = path
    return names


def _constant_name(graph, value, tensor):
    """A captured constant for messages: its value in the recorded graph, type and first reader."""
    reader = graph.reader_of(value)
    where = f", read by {reader}" if reader is not None else ""
    return f"captured constant %{value} ({tensor.dtype.name}{list(tensor.shape)}{where})"


_MAX_RECORDS = 8
# MegEngine's graph_opt_level -> kiln's jit level: 0 no optimization; 1 MegEngine's rewrites while
# the graph is built, which kiln has no stage for; 2 its global optimizations before compiling;
# 3 those and JIT fusion into generated kernels
_KILN_LEVELS = {0: 0, 1: 0, 2: 1, 3: 2}
_TENSOR_ARGS = {}  # number of positional tensors -> the structure of such a call


class trace(_C.JitDispatcher):
    """Wraps a function (or Cell) and runs it as a compiled graph (MegEngine's megengine.jit.trace).

    Usable as trace(fn, ...), @trace and @trace(...). symbolic: trace the first call with
    symbolic values (reading a traced tensor's value raises). capture_as_const: bake the
    tensors the function reaches through globals and closures into the graph as constants
    (otherwise they are captured by reference and stay live). record_only: only record, never
    run a compiled graph: every call runs the function eagerly (kiln records by running) and
    records it anew, so graph_str() shows the last call's graph, and calls return the eager
    results (MegEngine's record_only also skips computing them). symbolic_shape=True lets tensor
    arguments change shape: the recording is made with every input size of 2 or more symbolic
    (kiln.jit.dynamic), and a new shape its symbols bind is served from that graph with no new
    recording (`instances` counts these): the recording is made symbolic and optimized once
    (`optimized_once` counts those), each shape's graph instantiated from it without running a
    pass again (a recording that cannot be made symbolic is rebound and optimized per shape);
    verification compares the call with the recording at its shapes, and dump writes the graph of
    the last call's shapes (a model file holds concrete sizes). A shape outside the symbols records
    a new graph. False makes a shape change a TraceMismatchError.

    opt_level (default 2; None means 2, as in MegEngine 1.x) maps onto kiln's jit levels:
    0 -> O0; 1 -> O0 (MegEngine's level 1 only rewrites arithmetic while the graph is built, a
    stage kiln does not have); 2 -> O1 (dead code, common subexpressions, folding, simplification,
    epilogue and elementwise fusion); 3 -> O2 (O1 and recomputation inside fused kernels: the
    more aggressive fusion MegEngine's level 3 JIT stands for). graph_opt_config (a
    GraphOptimizationConfig): jit_fuse_reduce=True raises the level to O1 at least (kiln's
    fusion takes reductions over the last axis); jit_fuse_reduce=False at O1/O2 and
    jit_fuse_dimshuffle=True cannot be honoured and are ignored with a warning.

    sublinear_memory_config (a SublinearMemoryConfig): the recorded training graph recomputes
    activations instead of keeping them, checkpoints searched (see SublinearMemoryConfig and
    memory_report()). dtr_config (a DTRConfig: kiln has no dynamic tensor rematerialization) is
    checked and stored, and has no effect yet: one warning at the first call names it.
    profiling=True records every compiled run (and the compile phases) through
    kiln's profiler; get_profile() returns them in MegEngine's dict shape (kiln.profiler.
    megengine_profile), which `python -m kiln.tools.profile_analyze` reads once dumped as JSON.
    Profiled calls always come through Python (never the C fast path).

    without_host=True (MegEngine's: after the recording, no Python code of the function runs) is
    verify=False; imperative=True (MegEngine's: the recorded ops executed one by one by the
    imperative runtime) compiles at O0, kernel by kernel without fusion, whatever opt_level says.

    verify (a kiln extension, default True unless without_host; also the attribute `trace.verify`): re-run the
    Python function on every later call and compare it with the recording (see the module
    docstring). Results never carry autograd history; a call with a tensor argument that requires
    grad, in grad mode, runs eagerly so that gradients flow through it (as kiln.jit does; this is
    how kiln.grad/value_and_grad of a trace works). Without verification, calls with
    positional tensors only, of a recorded signature, are served by the C base class without
    entering Python (except for traced Cells, whose training mode must be checked).
    """

    def __new__(cls, function=None, *args, **kwargs):
        if function is None:
            return functools.partial(cls, *args, **kwargs)
        return super().__new__(cls)

    def __init__(self, function=None, symbolic=False, capture_as_const=False, record_only=False,
                 sublinear_memory_config=None, dtr_config=None, profiling=False, opt_level=2, graph_opt_config=None,
                 symbolic_shape=True, without_host=False, imperative=False, *, verify=None):
        if isinstance(function, trace):
            function = function.__wrapped__
        if not callable(function):
            raise TypeError(f"trace: expected a function or a Cell, got {type(function).__name__}")
        for name, value in (("symbolic", symbolic), ("capture_as_const", capture_as_const),
                            ("record_only", record_only), ("profiling", profiling),
                            ("symbolic_shape", symbolic_shape), ("without_host", without_host),
                            ("imperative", imperative), ("verify", True if verify is None else verify)):
            if not isinstance(value, bool):
                raise TypeError(f"trace: {name} must be True or False, got {value!r}")
        for name, value, cls in (("sublinear_memory_config", sublinear_memory_config, SublinearMemoryConfig),
                                 ("dtr_config", dtr_config, DTRConfig),
                                 ("graph_opt_config", graph_opt_config, GraphOptimizationConfig)):
            if value is not None and not isinstance(value, cls):
                raise TypeError(f"trace: {name} must be a {cls.__name__} or None, got {type(value).__name__}")
        if opt_level is not None and (not isinstance(opt_level, int) or isinstance(opt_level, bool)
                                      or not 0 <= opt_level <= 3):
            raise ValueError(f"trace: opt_level must be 0, 1, 2, 3 or None, got {opt_level!r}")
        self.__wrapped__ = function
        self.__name__ = getattr(function, "__name__", type(function).__name__)
        self.__qualname__ = getattr(function, "__qualname__", self.__name__)
        self.__doc__ = getattr(function, "__doc__", None)
        self.symbolic, self.capture_as_const = symbolic, capture_as_const
        self.record_only = record_only
        self.sublinear_memory_config, self.dtr_config, self.profiling = sublinear_memory_config, dtr_config, profiling
        self.opt_level, self.graph_opt_config = opt_level, graph_opt_config
        if without_host and verify:
            raise ValueError("trace: without_host=True runs no Python after the recording, so it cannot verify=True")
        self.without_host, self.imperative = without_host, imperative
        self.symbolic_shape, self.verify = symbolic_shape, not without_host if verify is None else verify
        # imperative: the recorded ops replayed one by one (MegEngine's imperative runtime): kiln's O0, no fusion
        self._level = 0 if imperative else _KILN_LEVELS[2 if opt_level is None else opt_level]  # 0 (O0) - 2 (O2)
        if graph_opt_config is not None and graph_opt_config.jit_fuse_reduce and not imperative:
            self._level = max(self._level, 1)
        self._target = function
        self._bound = {}          # bound traces of instances without a __dict__
        self._owner = None
        self._spec = None         # the traced call's argument structure
        self._metas = None        # (dtype, device) of its tensors
        self._labels = None
        self._entries = EntryCache()  # (shapes, requires_grad, grad mode, amp) -> [Entry] (exact)
        self._last = None
        self._bindings = _Bindings(function)
        self._seen = ([], [])     # global/closure tensors when the function last ran (_Bindings.snapshot)
        self._baked = ([], [])    # their values when traced (capture_as_const)
        self._warned = False
        self.instances = 0        # symbolic_shape: recordings brought to new shapes instead of recorded again
        self.optimized_once = 0   # symbolic_shape: recordings made symbolic and optimized once for their instances
        self._recorder = CallRecorder() if profiling else None

    # methods: @trace on a def inside a class binds like a function, one trace per instance
    # (kept in the instance's __dict__ when it has one, so it lives as long as the instance)
    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        slot = f"_kiln_trace_{id(self)}"
        store = getattr(obj, "__dict__", None)
        if store is None:
            store, slot = self._bound, id(obj)
        t = store.get(slot)
        if t is None or t._owner is not obj:
            t = trace(functools.partial(self.__wrapped__, obj), symbolic=self.symbolic,
                      capture_as_const=self.capture_as_const, record_only=self.record_only,
                      sublinear_memory_config=self.sublinear_memory_config, dtr_config=self.dtr_config,
                      profiling=self.profiling, opt_level=self.opt_level, graph_opt_config=self.graph_opt_config,
                      symbolic_shape=self.symbolic_shape, without_host=self.without_host,
                      imperative=self.imperative, verify=self.verify)
            t.__name__, t.__qualname__, t.__doc__ = self.__name__, self.__qualname__, self.__doc__
            t._owner = obj
            store[slot] = t
        return t

    @property
    def _last(self):
        """The record the latest call ran (what dump and graph_str read): the C fast path's entry's
        when that call did not enter Python (kiln._C.JitDispatcher._last_fast_tag)."""
        served = self._last_fast_tag
        return served if served is not None else self._last_run

    @_last.setter
    def _last(self, run):
        self._last_run = run

    @property
    def jit_level(self):
        """The kiln jit level ("O0" | "O1" | "O2") the trace compiles at (see opt_level)."""
        return f"O{self._level}"

    @property
    def verify(self):
        return self._verify

    @verify.setter
    def verify(self, value):
        self._verify = bool(value)
        self._fast_enabled = not self._verify

    def _slow_call(self, *args, **kwargs):
        if jit_disabled():  # kiln.disable_jit / KILN_DISABLE_JIT: the Python function, eagerly
            return self._target(*args, **kwargs)
        if _C.is_tracing():  # inside another capture: contribute ops to it
            return self._target(*args, **kwargs)
        caller = None  # the arguments' lists and dicts, which the function must not change
        if not kwargs and all(isinstance(a, _C.TensorBase) for a in args):
            leaves = args
            spec = _TENSOR_ARGS.get(len(args)) or _TENSOR_ARGS.setdefault(
                len(args), ("tuple", (("tuple", (tree._TENSOR,) * len(args)), ("dict", (), ()))))
        else:
            if len(kwargs) > 1:  # keyword order must not change the order of the graph's inputs
                kwargs = dict(sorted(kwargs.items()))
            leaves = []
            try:
                spec = tree.flatten((args, kwargs), leaves)
            except TypeError as e:
                raise TypeError(str(e).replace("jit:", "trace:", 1)) from None
            caller = (args, kwargs)
        if _C.is_grad_enabled() and (differentiating() or any(t.requires_grad for t in leaves)):
            # the caller differentiates through this call (inputs that require grad, or inside GradManager
            # / grad / value_and_grad): eager, whose results carry the history a replay's would not
            return self._target(*args, **kwargs)
        if self.record_only:
            return self._record_only(spec, leaves, caller)
        if self._spec is None:
            self._warn_unused()
            return self._first_call(spec, leaves, caller)
        if spec != self._spec:
            _check_call(self._spec, spec, self.verify)
        metas = tuple((t.dtype, _device(t)) for t in leaves)
        if metas != self._metas:
            self._meta_mismatch(metas)
        key = (tuple(t.shape for t in leaves), tuple(t.requires_grad for t in leaves), _C.is_grad_enabled(),
               _C.amp_state())
        if not self.symbolic_shape and key[0] != next(iter(self._entries.exact))[0]:
            self._shape_mismatch(key[0])
        records = self._entries.exact.get(key, ())
        rec = next((r for r in records if all(c.training == m for c, m in zip(r.extra.cells, r.extra.modes))), None)
        if rec is None and self.symbolic_shape:
            rec = self._instantiate(key, leaves)
        if rec is None:
            return self._record(key, spec, leaves, caller)
        self._last_run = rec  # (the _last property's field)
        if self.verify:
            _Bindings.check(self._seen, self._baked)  # names the global or closure variable that changed
        changed = rec.guards.first_failure()
        if changed >= 0:
            raise TraceMismatchError(f"{rec.guard_names[changed]} was changed in place after the trace recorded "
                                     "it: capture_as_const baked its old value into the graph; make a new trace "
                                     "(or trace without capture_as_const to read it live)")
        if self.verify:
            run = self._check_run(rec, spec, leaves, caller)
            if rec.graph.has_effects or rec.extra.excluded or run.extra.excluded or run.extra.unreplayable:
                return _verified_result(run)
        else:
            self._check_grads_at_entry(rec)
        if not rec.extra.fast and self._recorder is None:
            self._register_fast(rec, spec, leaves)
        outs = rec.executable(*leaves) if self._recorder is None else self._recorder.run(rec.executable, *leaves)
        if rec.no_history is not None and _C.is_grad_enabled():
            outs = refuse_backward(self.__qualname__, rec.no_history, outs, "kiln.trace")
        if rec.extra.grad_targets:
            set_grads(rec, outs)
        return tree.unflatten(rec.out_spec, outs)[0]

    def _check_grads_at_entry(self, rec):
        """A replay sets the .grad its recording assigned; where the function found that .grad None
        before assigning it (GradManager.backward), a gradient there now would have been added to."""
        for t in rec.extra.grads_at_entry:
            if t.grad is not None:
                name = getattr(t, "name", None) or f"a {list(t.shape)} tensor"
                raise TraceMismatchError(
                    f"{self.__qualname__}: the .grad of {name} was None when the trace recorded and holds a gradient "
                    "now; the function would accumulate into it, and a replay (without_host=True or verify=False) "
                    "only sets it: clear the gradients before each call (optimizer.clear_grad()), or trace with "
                    "verify=True")

    def _instantiate(self, key, leaves):
        """symbolic_shape: a recording whose symbols bind this call's shapes, at those shapes and
        compiled, with no new recording, or None. The recording is made symbolic and optimized once
        (kiln.jit.dynamic, as jit's dynamic entries: each shape's graph is then instantiated, no pass
        run again); one that cannot be is rebound and optimized per shape. The instance's graph is
        the recording at the call's shapes (what verification compares the call with, and dump
        writes)."""
        for runs in list(self._entries.exact.values()):
            for run in runs:
                cap = run.capture
                if cap is None or run.extra.requires_grad_key != key[1:] or \
                        not all(c.training == m for c, m in zip(run.extra.cells, run.extra.modes)):
                    continue
                values = cap.bind(leaves)
                if values is not None and run.extra.symbolic is None and dynamic.symbolic_instances:
                    run.extra.symbolic = cap.symbolize(run.graph, self._level, False, False, specialize=True) or False
                    self.optimized_once += bool(run.extra.symbolic)
                    values = cap.bind(leaves)  # symbols it specialized are bound again
                if values is None:
                    continue
                executable = None
                if run.extra.symbolic and dynamic.symbolic_instances:
                    recorded, optimized = run.extra.symbolic
                    plan = self._plan(run)
                    if plan is not None:  # the one plan bound to this call's sizes: nothing planned again
                        executable = cap.bind_plan(plan, recorded, values)
                        if executable is None:
                            continue
                        graph = recorded.instantiate(list(values))
                    else:
                        compiled = cap.instantiate(optimized, recorded, values)
                        graph, level = None if compiled is None else recorded.instantiate(list(values)), 0
                else:
                    graph = compiled = cap.rebind_checked(run.graph, values)
                    level = self._level
                if graph is None:
                    continue
                inst = copy.copy(run)
                inst.extra = copy.copy(run.extra)
                inst.graph, inst.extra.fast, inst.capture, inst.extra.symbolic, inst.extra.plan = graph, False, None, None, None
                inst.executable = executable or _C.compile_graph(compiled, _C.CompileOptions(level=level,
                                                                                            sublinear=self._sublinear()))
                self._entries.add(key, inst)
                self.instances += 1
                return inst
        return None

    def _plan(self, run):
        """The optimized symbolic recording of run planned once (kiln._C.plan_symbolic, bound per
        shape), or None where the planner refuses it or sublinear memory rewrites each shape's graph
        (each shape is then planned for itself); made on the first shape that needs it."""
        if run.extra.plan is None:
            run.extra.plan = False
            if dynamic.planned_instances and self._sublinear() is None:
                run.extra.plan = dynamic.Capture.plan(run.extra.symbolic[1])
        return run.extra.plan or None

    def _register_fast(self, rec, spec, leaves):
        """Lets the C base class replay this record for positional tensor calls: its guards and, for
        the Cells it called, that each is in the mode it was recorded in (as _slow_call picks a
        record); in grad mode its results get their refusing node there (no_history), and inside
        grad / GradManager the call goes to Python, which runs it eagerly."""
        rec.extra.fast = True
        if rec.extra.grad_targets or spec is not _TENSOR_ARGS.get(len(leaves)):
            return
        guards = rec.guards
        if rec.extra.cells:
            guards = _C.GuardSet(rec.extra.guard_specs + [(c, (("attr", "training"),), m, _C.GUARD_VALUE)
                                                          for c, m in zip(rec.extra.cells, rec.extra.modes)])
        grad_mode = _C.is_grad_enabled()
        refusal = (rec.no_history.refusal(self.__qualname__, "kiln.trace") if rec.no_history is not None and grad_mode
                   else None)
        out = rec.out_spec
        if out == tree._TENSOR:
            kind = 0
        elif out[0] in ("tuple", "list") and len(out) == 2 and all(s == tree._TENSOR for s in out[1]):
            kind = 1 if out[0] == "tuple" else 2
        else:
            return
        self._add_fast_entry(rec.executable, tuple(leaves), grad_mode, kind, guards, None, refusal, rec)

    def _first_call(self, spec, leaves, caller=None):
        self._spec = spec
        self._metas = tuple((t.dtype, _device(t)) for t in leaves)
        self._labels = _labels(spec)
        key = (tuple(t.shape for t in leaves), tuple(t.requires_grad for t in leaves), _C.is_grad_enabled(),
               _C.amp_state())
        try:
            return self._record(key, spec, leaves, caller)
        except BaseException:
            self._spec = None
            raise

    def _record_only(self, spec, leaves, caller=None):
        """record_only: records this call as the trace's graph; nothing compiled runs."""
        self._warn_unused(stacklevel=4)
        self._spec, self._labels = spec, _labels(spec)
        self._metas = tuple((t.dtype, _device(t)) for t in leaves)
        key = (tuple(t.shape for t in leaves), tuple(t.requires_grad for t in leaves), _C.is_grad_enabled(),
               _C.amp_state())
        run = _run_recorded(self._target, spec, leaves, self.capture_as_const, self.symbolic, self._level,
                            self._sublinear(), caller=caller)
        self._entries.exact.clear()
        self._entries.add(key, run)
        self._last = run
        return run.extra.result

    def _record(self, key, spec, leaves, caller=None):
        args = (self.__qualname__, _run_recorded, self._target, spec, leaves, self.capture_as_const, self.symbolic,
                self._level, self.symbolic_shape, self._sublinear(), caller)
        run = capture_phase(*args) if self._recorder is None else self._recorder.compile(capture_phase, *args)
        run.extra.requires_grad_key = key[1:]
        if os.environ.get("KILN_DUMP_IR") == "1":
            print(f"[kiln] trace of {self.__qualname__}:\n{run.executable.graph_str()}", file=sys.stderr)
        self._entries.add(key, run)
        if self._entries.total() > _MAX_RECORDS:
            oldest = next(k for k in self._entries.exact if k != key or len(self._entries.exact[k]) > 1)
            self._entries.exact[oldest].pop(0)
            if not self._entries.exact[oldest]:
                del self._entries.exact[oldest]
        self._last = run
        self._bindings.add_called(run.extra.user_code)
        self._seen = self._bindings.snapshot(False)
        if self.capture_as_const:
            self._baked = self._bindings.snapshot(True)
        if run.extra.excluded and not self.verify:
            raise TraceMismatchError(f"{self.__qualname__}: exclude_from_trace runs Python at every call, which this "
                                     "trace does not (without_host=True or verify=False); trace with verify=True")
        if run.extra.unreplayable:
            if not self.verify:
                raise TraceMismatchError(
                    f"{self.__qualname__}: {run.extra.unreplayable[0]}; this trace (without_host=True or verify=False) "
                    "would only replay the recorded graph. Compute gradients with GradManager and clear them inside "
                    "or before each call, or trace with verify=True (each call then runs the function)")
            return run.extra.result
        if self.symbolic and not run.graph.has_effects and not run.extra.excluded:
            # a symbolic trace's results come from the graph
            outs = run.executable(*leaves) if self._recorder is None else self._recorder.run(run.executable, *leaves)
            if run.no_history is not None and _C.is_grad_enabled():
                outs = refuse_backward(self.__qualname__, run.no_history, outs, "kiln.trace")
            set_grads(run, outs)
            return tree.unflatten(run.out_spec, outs)[0]
        return run.extra.result

    def _check_run(self, rec, spec, leaves, caller=None):
        seen = self._seen  # (checked by _slow_call: the names outside dicts and lists, before the guards)
        # recorded as the trace records (symbolic shapes: gradient rules count elements with ops)
        run = _run_recorded(self._target, spec, leaves, self.capture_as_const, self.symbolic,
                            symbolic_shape=self.symbolic_shape, caller=caller, verifying=True)
        self._seen = self._bindings.snapshot(False)
        if rec.extra.excluded or run.extra.excluded:  # (exclude_from_trace: the recordings leave out what it ran)
            return run
        differs = rec.graph.diff_ops(run.graph, self._labels)
        if differs is None and rec.out_spec != run.out_spec:
            differs = (f"different outputs: the traced function returned {tree.describe(rec.out_spec)}, "
                       f"this call returned {tree.describe(run.out_spec)}")
        if differs is None:
            differs = rec.graph.diff_outputs(run.graph, self._labels)
        if differs is None and not rec.graph.has_effects:
            # the compiled graph will give this call's results, reading the tensors it recorded (a graph
            # with effects never runs after the function ran for the call: its run's results stand)
            differs = rec.graph.diff_captured(run.graph, self._labels)
        if differs is not None:
            raise TraceMismatchError(differs)
        _Bindings.check(seen, self._baked, inside=True)  # (PARAMS["w"] = new_tensor: the same ops, another tensor)
        return run

    def _meta_mismatch(self, metas):
        for label, (od, odev), (nd, ndev) in zip(self._labels, self._metas, metas):
            if od is not nd:
                raise TraceMismatchError(f"argument {label} changed dtype: {od.name} when traced, {nd.name} now")
            if odev != ndev:
                raise TraceMismatchError(f"argument {label} changed device: {odev} when traced, {ndev} now")

    def _shape_mismatch(self, shapes):
        traced = next(iter(self._entries.exact))[0]
        for label, old, new in zip(self._labels, traced, shapes):
            if old != new:
                raise TraceMismatchError(f"argument {label} changed shape: {old} when traced, {new} now "
                                         "(symbolic_shape=False)")

    def _warn_unused(self, stacklevel=3):
        if self._warned:
            return
        self._warned = True
        unused = []
        if self.dtr_config is not None:
            unused.append("dtr_config (kiln has no dynamic tensor rematerialization)")
        goc = self.graph_opt_config
        if goc is not None and goc.jit_fuse_dimshuffle:
            unused.append("graph_opt_config.jit_fuse_dimshuffle=True (kiln does not fuse transposes into generated "
                          "kernels)")
        if goc is not None and goc.jit_fuse_reduce is False and self._level > 0:
            unused.append(f"graph_opt_config.jit_fuse_reduce=False (kiln's {self.jit_level}, which opt_level="
                          f"{self.opt_level} runs, always fuses reductions over the last axis)")
        if unused:
            verb = "has" if len(unused) == 1 else "have"
            warnings.warn(f"kiln.trace: {'; '.join(unused)} {verb} no effect yet", UserWarning,
                          stacklevel=stacklevel)

    # ---- MegEngine's other methods ------------------------------------------------------
    def trace(self, *args, **kwargs):
        """Runs the traced function like a call, recording it on the first call (the seed's
        "tracing via trace()"; MegEngine's own method refuses and points to __call__)."""
        return self(*args, **kwargs)

    def dump(self, file, *, arg_names=None, output_names=None, append=False, keep_var_name=1, keep_opr_name=False,
             keep_param_name=False, keep_opr_priority=False, strip_info_file=None, append_json=False,
             optimize_for_inference=True, user_info=None, enable_metadata=True, input_data=None, **kwargs):
        """Serializes the last call's graph with its parameters to `file` (a path or a binary file
        object) as a kiln model file (MegEngine's trace.dump; docs/model_format.md), which
        kiln.load, the C runtime and kiln-run read. Requires capture_as_const=True.

        arg_names / output_names: the names of the inputs (default: the argument names) and
        outputs (default "output", or "output0", ...). optimize_for_inference (default True):
        kiln's O1 passes with the inference rewrites (batch norm folded, constants folded,
        elementwise fusion); False writes the graph as recorded. Its keyword options:
        enable_fuse_conv_bias_nonlinearity (convolution, bias and activation become one oneDNN
        primitive), enable_fuse_conv_bias_with_z (also the residual add, as a post-op),
        enable_nchw88 (the CPU's blocked channel layout for x86, oneDNN's nChw8c/nChw16c);
        enable_nchw44 and enable_nchw44_dot (ARM's 4-channel blocking) apply that blocked layout of
        this CPU too, with a warning; enable_nchw4, enable_nchw32, enable_chwn4 and enable_hwcd4
        (GPU layouts) are recorded in the metadata ("options_not_applied") with a warning, the
        graph staying NCHW so the file runs everywhere (each warning once); enable_io16xc32 stores every
        float32 value (parameters, inputs, outputs, values between ops) as float16 while fused ops
        (the convolution fusions above) compute their steps in float32; enable_ioc16 is float16
        throughout: every op's result is rounded to float16 (kiln's float16 arithmetic reads float16
        into float32 registers with F16C and rounds each result, x86 having no float16 arithmetic
        short of AVX512-FP16), so it cannot be combined with the convolution fusions. user_info: any JSON value,
        stored in the file. enable_metadata: store the dump's settings as JSON. input_data: test
        cases embedded for kiln-run --check: a case (a dict by input name, a tuple of inputs, or
        one array) or a list of cases; their expected outputs are what this trace computes.
        strip_info_file: writes the ops and dtypes the graph uses as JSON (append_json: merged
        into the file's). Names (kiln.load's param_names, var_names, op_names, op_priorities):
        keep_var_name 0 stores no value names, 1 (default) the inputs' and outputs' names, 2 also a
        generated name for every op's output ("conv2d3"); keep_param_name the parameters' attribute
        paths in the traced Cell ("conv1.weight"); keep_opr_name a name per op
        ("conv2d(data)[3]": the op, its first input's name, its position in the recording);
        keep_opr_priority each op's position in the recording. The inference rewrites carry them:
        an op they remove loses its name, a fused op keeps its convolution's or product's (else
        the last fused op's). The input and output lists of a file always name its inputs and
        outputs. append=True (file a path) adds this graph after the graphs already in the file
        (a file that is not a kiln model, or is corrupt, raises ValueError); the keyword
        graph_name names it (default: the traced function's qualified name, with ":N" when the
        file has that name already) for kiln.load(path, name=...).

        Returns a DumpInfo (nr_opr, tot_bytes, tensor_value_bytes, inputs, outputs)."""
        return dump_trace(self, file, arg_names=arg_names, output_names=output_names, append=append,
                          keep_var_name=keep_var_name, keep_opr_name=keep_opr_name, keep_param_name=keep_param_name,
                          keep_opr_priority=keep_opr_priority, strip_info_file=strip_info_file,
                          append_json=append_json, optimize_for_inference=optimize_for_inference,
                          user_info=user_info, enable_metadata=enable_metadata, input_data=input_data, **kwargs)

    def get_profile(self):
        """Profiling result of the compiled trace (MegEngine's trace.get_profile): every compiled run
        since the trace was made, as MegEngine's dict (see kiln.profiler.megengine_profile)."""
        if self._recorder is None:
            raise RuntimeError("trace.get_profile: this trace was made with profiling=False; "
                               "use kiln.trace(fn, profiling=True)")
        return self._recorder.get_profile()

    # ---- introspection ------------------------------------------------------------------
    def memory_report(self, *args, **kwargs):
        """The memory of the graph recorded for these arguments (calling the trace with them), or for
        the last call (the plan only): see kiln.tools.memory_report (with what recomputation did,
        when sublinear_memory_config asked for it)."""
        from ..tools.memory import memory_report

        return memory_report(self, *args, **kwargs)

    def _sublinear(self):
        c = self.sublinear_memory_config
        return None if c is None else c.as_tuple()

    def _memory_target(self, args, kwargs):
        if args or kwargs:
            self(*args, **kwargs)
        if self._last is None:
            raise RuntimeError("memory_report: nothing traced yet; call the trace first")
        if not (args or kwargs):
            return self._last.executable, None, None
        if not kwargs and all(isinstance(a, _C.TensorBase) for a in args):
            leaves = list(args)
        else:
            leaves = []
            tree.flatten((args, dict(sorted(kwargs.items()))), leaves)
        return self._last.executable, leaves, lambda: self._target(*args, **kwargs)

    def graph_dot(self, *args, **kwargs):
        """The graph used by the last call (after calling the trace with args, when given) as
        Graphviz DOT: fused groups and control-flow bodies as clusters."""
        if args or kwargs:
            self(*args, **kwargs)
        if self._last is None:
            raise RuntimeError("trace.graph_dot: nothing traced yet; call the trace first")
        return self._last.executable.graph_dot()

    def graph_str(self):
        """The graph used by the last call, in text form."""
        if self._last is None:
            raise RuntimeError("trace.graph_str: nothing traced yet; call the trace first")
        return self._last.executable.graph_str()

    def __repr__(self):
        return f"<kiln.trace {self.__qualname__} (symbolic={self.symbolic}, capture_as_const={self.capture_as_const})>"
