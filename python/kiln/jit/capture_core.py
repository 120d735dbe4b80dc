"""One capture, whatever the front end: kiln.jit's three capture modes and kiln.trace record
through a Recording.

A Recording owns what a capture sets up and tears down: the tracer, the guard recorder, the logs of
the Cells called and written, the reasons the recording cannot be replayed (kiln.jit.replay), the
symbolic sizes (kiln.jit.dynamic.Capture), the one CompileOptions it compiles with and the
"record" profiling phase. `run(strategy, ...)` runs the user's code under a strategy: a
CallStrategy calls a Python function (trace capture; ast capture calls the converted function;
kiln.trace), an InterpreterStrategy runs the bytecode interpreter (capture_mode="bytecode").
`outputs(result)` and `compile(out_leaves)` (or `finish(result)`, both) end it. What each front
end does with what the run met (a side effect, a value read, a graph break) is its own policy.
"""
import contextlib
import dis
import random
import sys
import threading
import types
import weakref

from .. import _C, grad_hooks
from ..profiler import timed_phase
from . import ast_convert, ast_runtime, dynamic, exclude, guards, tree
from .recording import CallerContainers, bind_inputs, user_frame_tracer
from .replay import (collect_grad_writes, end_reasons, kiln_reads, mark_not_replayable, refusing_unreplayable,
                     set_hooks_traced, start_reasons)


_NOTHING = contextlib.nullcontext()  # (what run enters for a state a front end does not ask for)


_CHECK_EXC_MATCH, _PUSH_EXC_INFO, _POP_TOP = (dis.opmap[n] for n in ("CHECK_EXC_MATCH", "PUSH_EXC_INFO", "POP_TOP"))
_catching = weakref.WeakKeyDictionary()  # code -> whether it has an `except` clause


def catches(code):
    """Whether code has an `except` clause (typed: CHECK_EXC_MATCH; bare: PUSH_EXC_INFO, POP_TOP)."""
    found = _catching.get(code)
    if found is None:
        ops = code.co_code[::2]
        found = _catching[code] = _CHECK_EXC_MATCH in ops or bytes((_PUSH_EXC_INFO, _POP_TOP)) in ops
    return found


def _global_generators():
    """The states of Python's and NumPy's global random generators (random.random, randint, shuffle;
    numpy.random.rand, normal, ...): a capture that changes them drew from them."""
    import numpy

    return random.getstate(), numpy.random.get_state(legacy=False)


def is_generator(obj):
    """Whether obj is a random generator outside kiln (a random.Random, a NumPy Generator or
    RandomState, or a bound method of one)."""
    if isinstance(obj, (types.MethodType, types.BuiltinMethodType)):  # (no attribute of any other object
        obj = obj.__self__                                               # read: a __getattr__ would run)
    kind = type(obj)
    return issubclass(kind, random.Random) or (kind.__module__.startswith("numpy.random") and
                                               kind.__name__ in ("Generator", "RandomState"))


def _clocks():
    """The clocks of the time module: a value of their own at every call."""
    import time

    names = ("time", "time_ns", "perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "process_time",
             "process_time_ns", "thread_time", "thread_time_ns", "clock_gettime", "clock_gettime_ns")
    return tuple(getattr(time, n) for n in names if hasattr(time, n))


def clock_read(recorder):
    """The description of the first guard of recorder on a clock of the time module (`time.time`,
    `from time import perf_counter`), or None: a graph would keep the time read at capture."""
    clocks = _clocks()
    specs, descriptions = recorder.guard_specs()
    for spec, what in zip(specs, descriptions):
        if any(spec[2] is c for c in clocks):
            return what
    return None


def generator_read(recorder):
    """The description of the first guard of recorder (a guards.Recorder after the run) on a random
    generator outside kiln -- the code read one, through a global, a closure or an attribute, most
    likely to draw from it -- or None. (A guard on a container's contents: its items.)"""
    specs, descriptions = recorder.guard_specs()
    for spec, what in zip(specs, descriptions):
        expected = spec[2]
        items = expected.values() if isinstance(expected, dict) else \
            expected if isinstance(expected, (list, tuple, frozenset)) else ()
        if is_generator(expected) or any(is_generator(v) for v in items):
            return what
    return None


def _drew(before):
    """Which global generator moved since before (_global_generators), or None."""
    import numpy

    py, np_state = _global_generators()
    if py != before[0]:
        return "Python's random module"
    old = before[1]
    if old["state"]["pos"] != np_state["state"]["pos"] or not numpy.array_equal(old["state"]["key"],
                                                                                   np_state["state"]["key"]) \
            or old["has_gauss"] != np_state["has_gauss"]:
        return "numpy.random"
    return None


class CallStrategy:
    """Runs a Python function on the bound arguments, the frame hook telling the tracer the user's
    source lines (and the guard recorder each frame of user code); notes exclude_from_trace, and,
    with note_code (kiln.jit's captures, whose policies read them: function.trace_call), in
    rec.catching the code objects of user code with an `except` clause that ran and in
    rec.calls_type whether user code run as it is may call type(). kiln.trace reads neither, and
    its verifying calls record on every call: they pay no Python call per frame for them."""

    __slots__ = ("fn", "note_code")

    def __init__(self, fn, note_code=False):
        self.fn = fn
        self.note_code = note_code

    def __call__(self, rec, args, kwargs):
        prev_trace = sys.gettrace()
        excluded = exclude.noting()
        on_call = show = rec.on_call
        if self.note_code:
            def on_call(frame):
                code = frame.f_code
                if (catches(code) or "type" in code.co_names) and guards.is_user_code(code):
                    if catches(code):
                        rec.catching.append(code)
                    if "type" in code.co_names and code not in ast_convert.CONVERTED_CODE:
                        rec.calls_type = True  # (type() of a symbolic size would be SymInt: see trace_call)
                if show is not None:
                    show(frame)

        # kiln.jit's captures: a draw from Python's or NumPy's global generator would be replayed by the graph
        generators = _global_generators() if self.note_code else None
        sys.settrace(user_frame_tracer(rec.tracer, on_call))
        try:
            with excluded:
                return self.fn(*args, **kwargs)
        finally:
            # (at once: the hook would take the library frames leaving the run's contexts for the user's)
            sys.settrace(prev_trace)
            rec.excluded = getattr(excluded, "used", False)
            drew = generators and _drew(generators)
            if drew:
                mark_not_replayable(f"it draws random numbers from {drew}: a compiled graph would replay the values "
                                    "drawn while it was captured (kiln's rand, randn, normal and dropout are drawn "
                                    "anew at every call)")

    def __repr__(self):
        return f"CallStrategy({getattr(self.fn, '__qualname__', self.fn)!r})"


class InterpreterStrategy:
    """Runs kiln.jit.bytecode's interpreter from its frames (it shows the tracer and the guard
    recorder the user's frames itself); returns its (outcome, payload)."""

    __slots__ = ("interp",)

    def __init__(self, interp):
        self.interp = interp

    def __call__(self, rec):
        return self.interp.run()


class Recording:
    """One capture (see the module's text), used as a context manager: entering starts it, leaving
    ends the tracer and puts back what it changed.

    compile_options: the CompileOptions it compiles with. What differs per front end:
    capture_constants (tensors reached outside the arguments become graph constants);
    guards_of: the function captured, whose guards and side effects a guards.Recorder collects
    (None: no guards; on_call then sees each frame of user code); symbols: (names, values,
    per input its sizes as expressions) to capture with symbolic sizes; hide_values: reading a
    traced tensor's value raises (kiln.trace(symbolic=True)); grad_writes: .grad assignments are
    collected (self.grad_log) rather than making the recording unreplayable; refuse: an exception
    type that code a recording cannot replay raises at once (bytecode pieces); keep_undo: the
    in-place writes and the random generator's draws are put back when it ends, unless
    self.undo is cleared; frame_hook_off: the bytecode frame hook is suspended while it runs;
    into_outer: the reasons and the Cells called count for an enclosing recording too; timed:
    the run is the profiler's "record" phase."""

    def __init__(self, compile_options, *, capture_constants=False, guards_of=None, on_call=None, symbols=None,
                 hide_values=False, grad_writes=False, refuse=None, keep_undo=False, frame_hook_off=False,
                 into_outer=False, timed=True):
        self.compile_options = compile_options
        self.capture_constants = capture_constants
        self.guards_of, self.symbols = guards_of, symbols
        self.hide_values, self.grad_writes, self.refuse = hide_values, grad_writes, refuse
        self.keep_undo, self.frame_hook_off, self.into_outer, self.timed = keep_undo, frame_hook_off, into_outer, timed
        self.on_call = on_call  # shown each frame of user code as it starts (with guards: the guard recorder)
        self.tracer = self.recorder = self.capture = self.callers = self.graph = None
        self.outside = None  # the tensors the graph reads from outside its inputs (parameters, closures')
        self.aliases = []
        self.bound_spec = None  # the structure of the call's arguments (bind)
        self.called, self.writes = [], []  # the Cells called, the writes on Cells (guards_of: this run's own)
        self.reasons = []  # why the recording cannot be replayed (kiln.jit.replay)
        self.excluded = False  # exclude_from_trace ran
        self.catching = []  # the code of user code with an `except` clause that ran (CallStrategy)
        self.calls_type = False  # user code run as it is (not ast-converted) that may call type()
        self.grad_log = None
        self.kiln_reads = None
        self.undo = keep_undo

    # ---- set-up and tear-down ---------------------------------------------------------------
    def __enter__(self):
        self.tracer = _C.Tracer(capture_constants=self.capture_constants)
        if self.keep_undo:
            # the tensors written in place and the random generator are kept as they were, put back at
            # the end unless the front end clears self.undo
            self.tracer.keep_undo()
            self._rng = _C.random_state()
        if self.guards_of is not None:
            self.recorder = guards.Recorder(top=self.guards_of)
            self.on_call = self.recorder.on_call
        outer = _C.cell_logs()
        self._prev_logs = _C.set_cell_logs(self.called, self.writes if self.recorder is not None else outer[1])
        self._prev_hook = _C.eval_frame_suspend(True) if self.frame_hook_off else None
        self.reasons, self._prev_reasons = start_reasons()
        self.kiln_reads = kiln_reads()  # the containers kiln's own code read (replay.read_by_kiln): guarded
        if self.recorder is not None:  # (read by add_guarded)
            # a backward pass run by the capture reaches tensors whose hooks may change before a later call
            self._backward_passes, self._hook_epoch = _C.backward_passes(), grad_hooks.STATE["epoch"]
        self._prev_hooks_traced = set_hooks_traced(self.recorder is not None)
        return self

    def __exit__(self, *exc):
        try:
            self.tracer.end()
            if self.undo:
                self.tracer.undo_writes()
                _C.set_random_state(self._rng)
        finally:
            end_reasons(self._prev_reasons)
            set_hooks_traced(self._prev_hooks_traced)
            if self.frame_hook_off:
                _C.eval_frame_suspend(self._prev_hook)
            _C.set_cell_logs(*self._prev_logs)
            if self.into_outer:  # (a recording around this one cannot replay it either)
                if self._prev_reasons[0] is not None:
                    self._prev_reasons[0].extend(self.reasons)
                if self._prev_logs[0] is not None:
                    self._prev_logs[0].extend(self.called)
        return False

    # ---- the inputs ----------------------------------------------------------------------------
    def bind(self, spec, leaves, caller=None):
        """The call's arguments (structure spec, tensors leaves) rebuilt around fresh aliases, each
        a graph input (kiln.jit.recording.bind_inputs); the symbolic sizes' Capture made on them.
        caller: the (args, kwargs) whose lists and dicts the run's copies stand for (self.callers)."""
        bound = bind_inputs(self.tracer, spec, leaves, self.aliases)
        self.bound_spec = spec  # (the sets among the arguments: returns_caller_set)
        if caller is not None:
            self.callers = CallerContainers(caller, bound, leaves, self.aliases)
        if self.symbols is not None:
            self.capture = dynamic.Capture(self.tracer, *self.symbols[:3], self.aliases)
        return bound

    # ---- the run --------------------------------------------------------------------------------
    def run(self, strategy, *args):
        """strategy(self, *args): the user's code run once while its ops are recorded."""
        prev_trace = sys.gettrace()
        try:
            if not (self.hide_values or self.refuse is not None or self.timed):
                # (kiln.trace's recordings, one per verified call: only the states they use are entered)
                with collect_grad_writes() if self.grad_writes else _NOTHING as self.grad_log:
                    if self.capture is None:
                        return strategy(self, *args)
                    with self.capture:
                        return strategy(self, *args)
            hidden = _hidden_values(self.tracer) if self.hide_values else _NOTHING
            collecting = collect_grad_writes() if self.grad_writes else _NOTHING
            refusing = refusing_unreplayable(self.refuse) if self.refuse is not None else _NOTHING
            phase = timed_phase("record", "the function run once, its ops recorded") if self.timed else _NOTHING
            with hidden, collecting as grad_log, refusing, phase:
                self.grad_log = grad_log
                if self.capture is None:
                    return strategy(self, *args)
                with self.capture:
                    return strategy(self, *args)
        finally:
            sys.settrace(prev_trace)
            if self.recorder is not None:  # (later writes on Cells: the enclosing log's; else they are already)
                _C.set_cell_logs(self.called, self._prev_logs[1])

    # ---- the end ----------------------------------------------------------------------------
    def outputs(self, result, concrete=dynamic.concrete):
        """(result, its structure, its leaves): sizes returned as plain ints (concrete, with symbolic
        sizes), numbers an if on a tensor chose returned as numbers."""
        if self.capture is not None:
            result = concrete(result)
        result = ast_runtime.chosen_numbers(result)
        out_leaves = []
        # (a set in the result: each later call gets a copy, as each eager call makes its own; one the
        # call did not make is refused before: returns_caller_set, recording.returns_reached)
        spec, _ = tree.fresh_results(tree.flatten(result, out_leaves))
        return result, spec, out_leaves

    def returns_caller_set(self, result):
        """Whether result holds a set the caller passed in (a compiled call would return a copy)."""
        sets = tree.fresh_results(tree.flatten(result, []))[1]
        if not sets or self.bound_spec is None:
            return False
        passed = {id(a) for a in tree.fresh_results(self.bound_spec)[1]}  # (the caller's, not copies)
        return any(id(s) in passed for s in sets)

    def note_outside(self):
        """Notes the tensors the graph reads from outside its inputs (once the run is over, before
        the recording is compiled): the guards cover their requires_grad (guard_set, add_guarded).
        Without guards (kiln.trace) there is nothing to note."""
        if self.outside is None and self.recorder is not None:
            self.outside = self.tracer.captured()

    def compile(self, out_leaves, compile_options=None, keep_graph=False):
        """The recording ended with out_leaves as its outputs and compiled (with compile_options
        instead of the recording's when given); self.graph is the graph as recorded, before the
        level's passes, when the sizes are symbolic or keep_graph asks for it (one copy the tracer
        makes: kiln.trace's verification reads it on every call)."""
        if self.recorder is not None:
            self.note_outside()
        executable = self.tracer.finish(out_leaves, compile_options or self.compile_options)
        if keep_graph or self.capture is not None:
            self.graph = self.tracer.recorded()
        return executable

    def finish(self, result):
        """(result, out_spec, out_leaves, executable): outputs and compile."""
        result, out_spec, out_leaves = self.outputs(result)
        return result, out_spec, out_leaves, self.compile(out_leaves)

    def add_guarded(self, first=()):
        """Shows the guard recorder the Cells the run called (after `first`) and the tensors the
        graph reads from outside its inputs, for its guards to cover them too."""
        self.recorder.add_cells(tuple(dict.fromkeys(tuple(first) + tuple(self.called))))
        if self.outside is not None:
            self.recorder.add_tensors(self.outside)
        for root, key, what in self.kiln_reads or ():
            self.recorder.add_contents(root, key, what)
        # a tensor from outside whose value the code read into Python (a global's .item()): what it
        # computed from the value holds while no in-place write changes the tensor
        for t, version in self.tracer.outside_value_reads():
            self.recorder.add_version(t, version, "the value of a tensor read from outside (.item(), float(), if)")
        if _C.backward_passes() != self._backward_passes:  # (no hook ran, else the call is eager: kiln.grad_hooks)
            self.recorder.add_value(grad_hooks.STATE, "epoch", self._hook_epoch,
                                    "the backward hooks of tensors (Tensor.register_hook on a parameter or input)")

    def guard_set(self):
        """(GuardSet, descriptions) of the Python state the run read, the Cells it called and the
        tensors it read from outside included."""
        self.add_guarded()
        return self.recorder.guard_set()


# ---- what a capture made ------------------------------------------------------------------------

class Entry:
    """One compiled capture, whatever the front end: its executable, the structure of its results,
    its graph's text (None: ask the executable), whether its outputs carried autograd history, its
    guards (a GuardSet: kiln.jit.guards; kiln.trace's are its captured constants' versions) with a
    description of each, and with symbolic sizes the Capture and the graph as recorded, and `dyn`,
    the kiln.jit.dynamic.DynamicEntry through which it serves every binding of its symbols (None: the
    shapes it was captured for only). `extra`: what only one front end keeps (PieceInfo for bytecode
    pieces, TraceInfo for kiln.trace), or None."""

    __slots__ = ("executable", "out_spec", "graph_text", "differentiable", "guards", "guard_names", "capture",
                 "graph", "dyn", "extra", "no_history")

    def __init__(self, executable, out_spec, guards_, guard_names, graph_text=None, differentiable=False,
                 extra=None):
        self.executable = executable
        self.out_spec = out_spec
        self.graph_text = graph_text
        self.differentiable = differentiable
        self.guards = guards_
        self.guard_names = guard_names
        self.capture = self.graph = self.dyn = None
        self.extra = extra
        # a NoHistory (the tensors it reads that require grad, the positions of its outputs that would
        # require grad eagerly): a graph run outside grad / value_and_grad gives such outputs no
        # history, so they get a node that refuses to be differentiated (refuse_backward)
        self.no_history = None

    def guards_hold(self):
        return self.guards.check()

    def failed_guard(self, fn=None):
        """What changed since the capture (a description of the first failing guard), or None; fn:
        the function whose globals and closure guards kept with the code are read from."""
        k = self.guards.first_failure(fn)
        return None if k < 0 else self.guard_names[k]


class NoHistory:
    """Entry.no_history: the tensors a graph reads that require grad (reads) and the positions of
    its outputs that would require grad eagerly (positions), with refuse_backward's node for the
    last name it was given made once (refusal)."""

    __slots__ = ("reads", "positions", "named")

    def __init__(self, reads, positions):
        self.reads, self.positions = tuple(reads), tuple(positions)
        self.named = None  # (name, who, refusal)

    def refusal(self, name, who="kiln.jit"):
        """(reads, positions, backward, node name): the refusing node of function `name` of front end
        `who` (kiln._C.refuse_outputs; the C fast path's entries keep it too)."""
        named = self.named
        if named is None or named[0] != name or named[1] != who:
            how = ("differentiate with GradManager (gm.backward)" if who == "kiln.trace" else
                   "differentiate through it with kiln.grad or kiln.value_and_grad (or inside GradManager)")

            def backward(grads, needs, create_graph):
                raise RuntimeError(f"{who}: a result of {name} reached backward, but its compiled graph ran in grad "
                                   "mode outside a gradient computation and kept no autograd history to the "
                                   f"parameters it reads; {how}, or call the function eagerly")
            named = self.named = (name, who, (self.reads, self.positions, backward, f"{who}({name})"))
        return named[2]


def refuse_backward(name, no_history, outs, who="kiln.jit"):
    """Outputs of a compiled graph run in grad mode outside grad / value_and_grad / GradManager, which
    eagerly would carry history back to the parameters they read (no_history: a NoHistory): they get
    one autograd node whose gradient is an error, so a later `.backward()` through them fails, naming
    the function, instead of leaving those parameters' gradients silently short (outs: returned).
    Those outputs are the tensors at no_history's positions that have no history and are none of its
    reads (kiln._C.refuse_outputs)."""
    return _C.refuse_outputs(no_history.refusal(name, who), outs)


class EntryCache:
    """The Entries of one jitted function (kiln.jit, its bytecode pieces, kiln.trace), newest last:
    `exact` (key -> [Entry], each for the shapes of its key) and `dynamic` (the key without its
    shapes, kiln.jit.dynamic.shape_free -> [Entry serving every binding of its symbols, entry.dyn])."""

    __slots__ = ("exact", "dynamic")

    def __init__(self):
        self.exact, self.dynamic = {}, {}

    def find(self, key, fn=None):
        """The first entry of key whose guards hold (fn: the function whose globals and closure
        guards kept with the code are read from), or None."""
        for e in self.exact.get(key, ()):
            if e.guards.check(fn):
                return e
        return None

    def find_dynamic(self, key, instance_for, fn=None):
        """(entry, what instance_for(entry.dyn) found) of the first dynamic entry for key's shape-free
        key whose guards hold and for which instance_for finds something (not None), or None."""
        for e in self.dynamic.get(dynamic.shape_free(key), ()):
            if e.guards.check(fn):
                found = instance_for(e.dyn)
                if found is not None:
                    return e, found
        return None

    def add(self, key, entry):
        """Keeps entry under key (its shape-free key when it is dynamic); returns the list it joined."""
        if entry.dyn is not None:
            same = self.dynamic.setdefault(dynamic.shape_free(key), [])
        else:
            same = self.exact.setdefault(key, [])
        same.append(entry)
        return same

    def total(self):
        """The number of entries kept."""
        return sum(map(len, self.exact.values())) + sum(map(len, self.dynamic.values()))

    def entries(self):
        """Every entry kept, exact ones first."""
        return [e for es in self.exact.values() for e in es] + [e for es in self.dynamic.values() for e in es]


class PieceInfo:
    """What a piece of capture_mode="bytecode" keeps beyond an Entry (see kiln.jit.bytecode_capture)."""

    __slots__ = ("returns", "reason", "where", "ops", "grad", "reads_grad", "size_values", "size_inputs",
                 "out_dims", "guard_specs")

    def __init__(self, returns, reason, where, ops, grad=None, reads_grad=False, guard_specs=None):
        self.returns = returns  # True: the function's result; False: the state at a graph break
        self.reason = reason  # why the graph breaks after it (None when it returns)
        self.where = where  # "file:line" of the break instruction
        self.ops = ops  # the number of ops of its graph
        self.grad = grad  # a differentiable piece's kiln.jit.piece_grad.PieceGrad (its executable: the forward)
        self.reads_grad = reads_grad  # it reads a captured tensor that requires grad (a Parameter)
        self.guard_specs = guard_specs  # the specs of guards (code_cache.weaken), or None: they hold their roots
        self.size_values = None  # a dynamic capture's sizes of its symbols (its state's sizes are expressions of them)
        self.size_inputs = ()  # expressions of the sizes given as 0-d graph inputs after the state's tensors
        self.out_dims = None  # a dynamic piece that breaks: per output tensor, the dimensions that follow symbols


class TraceInfo:
    """What a recording of kiln.trace keeps beyond an Entry (see kiln.jit.megengine)."""

    __slots__ = ("result", "cells", "modes", "fast", "requires_grad_key", "param_names", "symbolic", "plan",
                 "grad_targets", "export_capture", "excluded", "user_code", "unreplayable", "grads_at_entry",
                 "pending", "guard_specs")


# ---- kiln.trace(symbolic=True): traced tensors have no readable value ------------------------------

_READS = ("asnumpy", "numpy", "item", "tolist", "__array__", "__bool__", "__float__", "__int__", "__index__",
          "__repr__", "__str__")
_guard_lock = threading.Lock()
_guard_users = 0
_guard_saved = {}
_local = threading.local()


def _guarded(name, original):
    def read(self, *args, **kwargs):
        tracers = getattr(_local, "symbolic", None)
        if tracers and tracers[-1].knows(self):
            raise RuntimeError(f"kiln.trace(symbolic=True): can't read the value of a traced tensor ({name}) while "
                               "tracing symbolically; values exist only when the compiled graph runs. Read it outside "
                               "the traced function, return it as an output, or use symbolic=False")
        return original(self, *args, **kwargs)

    read.__name__ = name
    return read


@contextlib.contextmanager
def _hidden_values(tracer):
    """Value reads of tensors `tracer` knows raise, on this thread, inside the block. (NumPy's
    np.asarray/np.array read through the buffer protocol, which Python code can't intercept: they
    still see the eagerly computed values.)"""
    global _guard_users
    from .._tensor import Tensor

    with _guard_lock:
        if _guard_users == 0:
            for name in _READS:
                _guard_saved[name] = Tensor.__dict__.get(name)
                setattr(Tensor, name, _guarded(name, getattr(Tensor, name)))
        _guard_users += 1
    stack = getattr(_local, "symbolic", None)
    if stack is None:
        stack = _local.symbolic = []
    stack.append(tracer)
    try:
        yield
    finally:
        _local.symbolic.pop()
        with _guard_lock:
            _guard_users -= 1
            if _guard_users == 0:
                for name, saved in _guard_saved.items():
                    if saved is None:
                        delattr(Tensor, name)
                    else:
                        setattr(Tensor, name, saved)
                _guard_saved.clear()
