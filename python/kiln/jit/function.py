"""kiln.jit: capture a function or Cell as a graph and run it compiled.

A JitFunction keeps one compiled graph per input signature (tensor dtypes, shapes and
requires_grad; the structure and values of non-tensor arguments; grad mode; the training mode of
Cells). The first call of a signature runs the function eagerly while recording its ops; later
calls run the compiled graph. With symbolic sizes (kiln.jit.dynamic) one entry covers every shape
its guards admit, with an instance of its graph per binding of the symbols.
"""
import os
import re
import sys
import time
import types
import warnings

from .. import _C, _optable, grad_hooks, hooks
from .. import _tensor as _tensor_module
from ..autograd import differentiating
from ..profiler import CallRecorder, CompilePhases, capture_phase
from . import ast_convert, ast_runtime, bytecode_capture, dynamic, tree
from .capture_core import (CallStrategy, Entry, EntryCache, NoHistory, Recording, clock_read, generator_read,
                           refuse_backward)
from .eager_switch import jit_disabled
from .options import JitOptions
from .recording import returns_closure, returns_reached
from .replay import grad_read, grad_written, mark_not_replayable
from .syntax import JitSyntaxError

_saved_graphs = [0]


def _save_graph(name, text):
    """set_context(save_graphs=...): the compiled graph's text as save_graphs_path/<name>_<n>.ir."""
    from ..context import get_context

    if not get_context("save_graphs"):
        return
    directory = get_context("save_graphs_path")
    os.makedirs(directory, exist_ok=True)
    _saved_graphs[0] += 1
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)[:100] or "graph"
    with open(os.path.join(directory, f"{safe}_{_saved_graphs[0]}.ir"), "w", encoding="utf-8") as f:
        f.write(text)


_tensor_module.grad_written_while_tracing = grad_written
_tensor_module.backward_while_tracing = lambda: mark_not_replayable(
    "Tensor.backward() accumulates into the leaves' .grad (Python state a graph does not update at later calls)")
_tensor_module.grad_read_while_tracing = grad_read


class ExactSizes(Exception):
    """A capture with symbolic sizes ran user code that may call type() on a size (SymInt, not
    int, there): it is captured again with exact sizes."""


class NotReplayable(Exception):
    """A trace saw something it cannot replay; carries the eager result."""

    def __init__(self, reason, result):
        super().__init__(reason)
        self.reason = reason
        self.result = result


class CacheInfo:
    """Cache statistics of a jitted function."""

    __slots__ = ("hits", "misses", "compiles", "compile_seconds", "eager_calls", "entries", "instances",
                 "instance_seconds", "dynamic")

    def __init__(self):
        self.hits = self.misses = self.compiles = self.eager_calls = self.entries = self.instances = 0
        self.compile_seconds = self.instance_seconds = 0.0
        self.dynamic = []  # per dynamic entry: its symbols, guards and number of instances

    def __repr__(self):
        dyn = f", dynamic={self.dynamic}" if self.dynamic else ""
        return (f"CacheInfo(hits={self.hits}, misses={self.misses}, compiles={self.compiles}, "
                f"compile_seconds={self.compile_seconds:.4f}, eager_calls={self.eager_calls}, "
                f"entries={self.entries}, instances={self.instances}, "
                f"instance_seconds={self.instance_seconds:.4f}{dyn})")


def trace_call(fn, args, kwargs, options, capture_constants=False, symbols=None, given_up=()):
    """Runs fn(*args, **kwargs) eagerly while recording; returns (result, entry). The entry's guards
    cover the Python state the run read; a Python side effect of the run makes it NotReplayable
    (STRICT: a JitSyntaxError naming the statement). symbols: (names, values, per input its sizes as
    expressions) of a dynamic capture (kiln.jit.dynamic), whose Capture becomes entry.capture.
    given_up: exception types on which the caller gives this run up and runs the call again (another
    capture, or eagerly): when one ends the run, the tensors it wrote in place and the random draws
    it made are put back, so the call's writes and draws happen once, as in eager (ExactSizes is
    always one); any other ending keeps them, as eager code raising keeps its writes."""
    leaves = []
    spec = tree.flatten((args, kwargs), leaves)
    given_up = (ExactSizes,) + tuple(given_up)
    with Recording(options.compile_options, capture_constants=capture_constants, guards_of=fn,
                   symbols=symbols, keep_undo=bool(given_up) or symbols is not None) as rec:
        try:
            call_args, call_kwargs = rec.bind(spec, leaves, caller=(args, kwargs))
            result = rec.run(CallStrategy(fn, note_code=True), call_args, call_kwargs)
            if rec.calls_type and rec.capture is not None and not rec.reasons and not rec.tracer.value_reads()[0]:
                # code run as it is may have called type() of a size: a SymInt there, where eager sees an
                # int (the Python values it computed from that are in the result, specialized sizes or not)
                raise ExactSizes()
        except given_up:
            raise  # (rec.undo stays set: the run's writes and draws are put back)
        except BaseException:
            rec.undo = False
            raise
        rec.undo = False
        reasons, callers = rec.reasons, rec.callers
        generator = generator_read(rec.recorder)
        if generator is not None:  # (draws from Python's and NumPy's global generators: CallStrategy)
            reasons.append(f"it reads a random generator ({generator}): a compiled graph would replay the values "
                           "drawn from it while it was captured (kiln's rand, randn, normal and dropout are drawn "
                           "anew at every call)")
        clock = clock_read(rec.recorder)
        if clock is not None:
            reasons.append(f"it reads a clock ({clock}): a compiled graph would keep the time read while it was "
                           "captured")
        if rec.excluded:
            reasons.append("exclude_from_trace: its code runs at every call, unrecorded")
        reads, where = rec.tracer.value_reads()
        if reads:
            _on_value_read(fn, options, where, reasons)
        effect = rec.recorder.side_effect(rec.writes)
        if effect is not None:
            _on_side_effect(options, effect, reasons)
        changed = callers.changed()
        if changed is not None and effect is None:
            _on_side_effect(options, changed, reasons)
        if returns_closure(result):
            reasons.append("it returns a function defined inside it (its closure would keep this call's values "
                           "at every later call)")
        if returns_reached(rec.recorder, result):
            reasons.append("it returns a list, dict or set it reached through a global, a closure or an attribute "
                           "(a compiled call would return a copy, which the caller's changes would not reach)")
        elif rec.returns_caller_set(result):
            reasons.append("it returns a set the caller passed in (a compiled call would return a copy)")
        elif changed is None and callers.returned(result):
            reasons.append("it returns a list, dict or object the caller passed in (a compiled call would return a "
                           "copy)")
        grad_reads = tuple(t for _, t in rec.tracer.recorded().structure()[1] if t.requires_grad)
        result, out_spec, out_leaves, executable = rec.finish(result)
        text = executable.graph_str()
        if rec.catching and not reasons:
            _on_checks_under_except(options, text, rec.catching, reasons)
    if reasons:  # the run stands as the call's: its changes of the caller's containers go back to them
        callers.kept = rec.recorder.reached_outside
        callers.write_back()
        raise NotReplayable(reasons[0], callers.to_caller(ast_runtime.plain_numbers(result)))
    if os.environ.get("KILN_DUMP_IR") == "1":
        print(f"[kiln] graph of {getattr(fn, '__qualname__', fn)}:\n{text}", file=sys.stderr)
    _save_graph(getattr(fn, "__qualname__", type(fn).__name__), text)
    detached = [t.detach() if isinstance(t, _C.TensorBase) else t for t in out_leaves]
    guard_set, guard_names = rec.guard_set()
    diff_out = tuple(k for k, t in enumerate(out_leaves) if isinstance(t, _C.TensorBase) and t.requires_grad)
    entry = Entry(executable, out_spec, guard_set, guard_names, text, bool(diff_out))
    if diff_out:
        entry.no_history = NoHistory(grad_reads, diff_out)
        if _C.is_grad_enabled():
            refuse_backward(getattr(fn, "__qualname__", type(fn).__name__), entry.no_history, detached)
    if rec.capture is not None:
        entry.capture, entry.graph = rec.capture, rec.graph
    return tree.unflatten(out_spec, detached)[0], entry


def _on_side_effect(options, effect, reasons):
    """The captured function changed Python state (see kiln.jit.guards): a compiled graph would
    skip that on later calls, so the function runs eagerly (STRICT: an error naming the statement)."""
    hint = ("return the value instead and update the state outside the jitted function, or keep the state in "
            "a tensor updated in place")
    if options.strict:
        raise JitSyntaxError(f"a Python side effect ({effect.what})", effect.filename, effect.line, 0, hint)
    reasons.append(f"a Python side effect ({effect}) would run only once, when the graph is captured")


_OP_NAME = re.compile(r"= (\w+)\(")


def _on_checks_under_except(options, text, catching, reasons):
    """The graph has an op that checks its input values when it runs (an index out of range:
    _optable's checks_values), and user code with an `except` clause ran while it was captured: a
    handler around the op's statement catches its error eagerly, while the graph raises it to the
    caller. So the function runs eagerly (STRICT: an error naming the code)."""
    ops = sorted({m for m in _OP_NAME.findall(text) if m in _optable.INFO and _optable.INFO[m].checks_values})
    if not ops:
        return
    code = catching[0]
    what = (f"{', '.join(ops)} checks its index values when the graph runs, where the `except` clause of "
            f"{code.co_qualname} ({code.co_filename}:{code.co_firstlineno}) cannot catch its error")
    if options.strict:
        raise JitSyntaxError(what, code.co_filename, code.co_firstlineno, 0,
                             "check the indices before indexing instead of catching the IndexError, or index "
                             "outside the try block")
    reasons.append(what)


def _on_value_read(fn, options, where, reasons):
    """A traced tensor's value was read into Python (a truth test, item(), a NumPy conversion): what
    Python computed from it would be fixed in the graph, and a later call with other values would get
    the first call's branch or number silently. So the function runs eagerly (STRICT: an error), in
    trace mode too: the ast mode converts if/while on tensors into graph control flow instead."""
    what = "a tensor's value is read into Python (a truth test, item(), int/float, a NumPy conversion)"
    if options.strict:
        filename, _, line = (where or "<unknown>:0").rpartition(":")
        raise JitSyntaxError(what, filename, int(line) if line.isdigit() else 0, 0,
                             "keep the computation in kiln ops; if/while on tensors are converted when "
                             "written in the function's own source (capture_mode=\"ast\")")
    reasons.append(f"{what} at {where}, so the graph could not follow it"
                   + ("; capture_mode=\"ast\" converts control flow on tensor values"
                      if options.capture_mode == "trace" else ""))


class JitFunction(_C.JitDispatcher):
    """A function or Cell compiled on first call per input signature (see kiln.jit).

    Calls with positional tensors only, matching a compiled signature, are served by the C base
    class without entering Python; every other call comes to _slow_call."""

    @property
    def _eager_reason(self):
        """Why this function runs eagerly (a trace of it could not be replayed), or None. A backward
        hook added to or removed from a parameter or a Cell since (kiln.grad_hooks.STATE) may have
        been the reason: the next call captures again."""
        why = self.__dict__.get("_eager_why")
        if why is not None and self.__dict__.get("_eager_epoch") != grad_hooks.STATE["epoch"]:
            why = self._eager_why = None
        return why

    @_eager_reason.setter
    def _eager_reason(self, why):
        self._eager_why, self._eager_epoch = why, grad_hooks.STATE["epoch"]

    def __init__(self, fn, options, bound_self=None):
        self.fn = fn
        self.options = options
        self._self_ref = None  # the instance of a bound method (held like a Python bound method holds it)
        if bound_self is not None:
            self._self_ref = lambda obj=bound_self: obj
        self._entries = EntryCache()  # its Entries (dynamic ones: entry.dyn, a kiln.jit.dynamic.DynamicEntry)
        self._sizes_seen = {}  # shape-free key -> per tensor, per dimension, the sizes compiled for
        self._keys = []
        self._warned = False
        self._eager_reason = None  # set when a trace of this function cannot be replayed (see the property)
        self.stats = CacheInfo()
        self._last = None
        self._grad_variants = {}
        self._converted = None  # capture_mode="ast": the converted function (see _capture_target)
        self._ast_fallback = None  # LAX: why this function is traced as it is instead
        self._grad_parent = None  # for the value_and_grad variant of a jitted function: that function
        self._pieces = None  # capture_mode="bytecode": its Pieces (kiln.jit.bytecode_capture)
        self._recompiles = []  # ast and trace: what changed at each capture after the first (explain)
        self._recorder = CallRecorder() if options.profiling else None  # profiling=True: every compiled run
        self._phases = CompilePhases()  # the phases of its captures and compiles (explain)
        try:
            self.__wrapped__ = fn
            self.__name__ = getattr(fn, "__name__", type(fn).__name__)
            self.__qualname__ = getattr(fn, "__qualname__", self.__name__)
            self.__doc__ = getattr(fn, "__doc__", None)
        except AttributeError:
            pass

    @property
    def _self(self):
        return self._self_ref() if self._self_ref is not None else None

    # methods: @kiln.jit on a def inside a class binds like a function, one JitFunction (and
    # cache) per instance, kept in the instance's __dict__ so it lives as long as the instance
    # (and keeps it alive like a bound method does: `f = Model().run; f(x)` works)
    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        d = getattr(obj, "__dict__", None)
        if not isinstance(d, dict):  # no instance dict: no per-instance cache
            return JitFunction(self.fn, self.options, bound_self=obj)
        name = f"_kiln_jit_{id(self):x}"
        jf = d.get(name)
        if jf is None or jf.fn is not self.fn:
            jf = d[name] = JitFunction(self.fn, self.options, bound_self=obj)
        return jf

    def _target(self):
        from ..nn.cell import Cell, overriding_call

        if isinstance(self.fn, Cell) and overriding_call(self.fn) is not None:
            cell, call = self.fn, overriding_call(self.fn)  # what calling it runs eagerly
            return lambda *a, **k: call(cell, *a, **k)
        if isinstance(self.fn, Cell):  # its construct: Cell.__call__ may route back here (set_jit_config)
            cell = self.fn
            return lambda *a, **k: _call_cell_body(cell, a, k)
        if self._self_ref is None:
            return self.fn
        obj = self._self
        return lambda *a, **k: self.fn(obj, *a, **k)

    def _capture_target(self):
        """What a capture runs: with capture_mode="ast" the converted function (control flow
        through kiln.ops.cond / while_loop), else the function itself."""
        if self.options.capture_mode != "ast" or self._ast_fallback is not None:
            return self._target()
        if self._converted is None:
            try:
                self._converted = _convert_target(self.fn)
            except JitSyntaxError as e:
                if self.options.strict:
                    raise
                self._fall_back_to_trace(e)
                return self._target()
        conv = self._converted
        if isinstance(conv, (types.FunctionType, types.MethodType)):  # (defaults replaced since)
            ast_runtime.with_current_defaults(getattr(conv, "__func__", conv))
        if self._self_ref is None:
            return conv
        obj = self._self
        return lambda *a, **k: conv(obj, *a, **k)

    def _fall_back_to_trace(self, err):
        self._ast_fallback = err
        warnings.warn(f"kiln.jit: {err.msg}; {self.__qualname__} falls back to trace capture (Python control "
                      "flow is fixed at compile time)", RuntimeWarning, stacklevel=5)

    def _capture(self, args, kwargs, symbols=None):
        """trace_call of the capture target; in LAX an ast conversion problem found while capturing
        makes this function fall back to trace capture (with one warning)."""
        from . import ast_runtime

        owner = self._grad_parent or self  # a value_and_grad variant captures its parent's conversion
        ast_attempt = owner.options.capture_mode == "ast" and owner._ast_fallback is None
        # what the attempt changes in the globals' and closure's containers is undone if it is given up
        held = ast_runtime.reachable_state(self.fn) if ast_attempt and not owner.options.strict else []
        # a given-up attempt's in-place writes and random draws are put back too (trace_call's given_up):
        # the run that follows makes them again. LAX: a JitSyntaxError falls back to trace capture, a
        # NotImplementedError (graph control flow kiln cannot build) runs the call eagerly (_miss).
        given_up = (JitSyntaxError, NotImplementedError) if ast_attempt and not owner.options.strict else ()
        with ast_runtime.capturing(owner.options.strict):
            try:
                try:
                    return trace_call(self._capture_target(), args, kwargs, self.options, symbols=symbols,
                                      given_up=given_up)
                except ExactSizes:
                    return trace_call(self._capture_target(), args, kwargs, self.options, given_up=given_up)
            except JitSyntaxError as e:
                if owner.options.strict or owner.options.capture_mode != "ast" or owner._ast_fallback is not None:
                    raise
                ast_runtime.undo(held)
                owner._fall_back_to_trace(e)
            except NotImplementedError:
                if given_up:  # (_miss runs the call eagerly)
                    ast_runtime.undo(held)
                raise
            return trace_call(self._capture_target(), args, kwargs, self.options, symbols=symbols)

    def _key(self, args, kwargs):
        """((spec of the arguments, per tensor (dtype id, shape, requires_grad), (grad mode, the
        training mode of each Cell among fn, self and the arguments)), the tensors); in C."""
        return _C.tree.call_key(args, kwargs, (self.fn, self._self))

    def _slow_call(self, *args, **kwargs):
        if jit_disabled():  # kiln.disable_jit / KILN_DISABLE_JIT: the Python function, eagerly
            self.stats.eager_calls += 1
            return self._target()(*args, **kwargs)
        if _C.is_tracing():  # inside another capture: just contribute ops to it
            return self._capture_target()(*args, **kwargs)
        if self.options.capture_mode == "bytecode":
            return bytecode_capture.call(self, args, kwargs)
        key, leaves = self._key(args, kwargs)
        entry = self._entries.find(key)
        if entry is not None and entry.differentiable and key[2][0] and differentiating():
            # inside grad / value_and_grad of an enclosing function: this graph's results would carry no
            # history; the call runs as differentiable pieces, each one compiled forward and backward
            # node on the eager tape (bytecode capture's, kiln.jit.piece_grad)
            return self._differentiable_call(args, kwargs)
        if entry is not None:
            self.stats.hits += 1
            self._last = entry
            outs = entry.executable(*leaves) if self._recorder is None else self._recorder.run(entry.executable, *leaves)
            if entry.no_history is not None and key[2][0]:
                outs = refuse_backward(self.__qualname__, entry.no_history, outs)
            return tree.unflatten(entry.out_spec, outs)[0]
        if self._entries.dynamic:
            found = self._dynamic_call(key, args, kwargs, leaves)
            if found is not _NO_ENTRY:
                return found
        return self._miss(key, args, kwargs)

    def _dynamic_call(self, key, args, kwargs, leaves):
        """Runs the call on a dynamic entry whose guards it satisfies (making the instance of its
        binding on first use), or returns _NO_ENTRY."""
        found = self._entries.find_dynamic(key, lambda d: self._instance_for(d, leaves))
        if found is None:
            return _NO_ENTRY
        entry, (exe, values, made) = found
        d = entry.dyn
        if made and d.fast is not None:
            self._add_fast_instance(d.fast, tuple(values[k] for k in d.live), exe, d.limit)
        if entry.differentiable and key[2][0] and differentiating():
            return self._differentiable_call(args, kwargs)
        self.stats.hits += 1
        self._last = entry
        outs = exe(*leaves) if self._recorder is None else self._recorder.run(exe, *leaves)
        if entry.no_history is not None and key[2][0]:
            outs = refuse_backward(self.__qualname__, entry.no_history, outs)
        return tree.unflatten(entry.out_spec, outs)[0]

    def _instance_for(self, d, leaves):
        """(executable, the symbols' sizes, whether it was made now) of dynamic entry d for a call's
        tensors: its instance for their binding, made (and counted) on first use; None when the call
        is outside d (its relation guards, or a binding its graph does not hold for)."""
        values = d.bind(leaves)
        if values is None:
            return None
        t0 = time.perf_counter()
        exe, made = d.instance(values)
        if exe is None:
            return None
        if made:
            self.stats.instances += 1
            self.stats.instance_seconds += time.perf_counter() - t0
        return exe, values, made

    def _symbols(self, key, leaves, labels=None):
        """The symbols of the next capture for this call (kiln.jit.dynamic.choose_symbols), or None:
        every size exact. Records the call's sizes for automatic mode. labels: per tensor, what
        cache_info calls it (default: input0, input1, ...)."""
        free = dynamic.shape_free(key)
        seen = self._sizes_seen.get(free)
        labels = labels or [f"input{k}" for k in range(len(leaves))]
        names, values, exprs, origins = dynamic.choose_symbols(leaves, labels, self.options.dynamic, seen)
        if seen is None:
            seen = self._sizes_seen[free] = [[set() for _ in t.shape] for t in leaves]
        for row, t in zip(seen, leaves):
            for sizes, size in zip(row, t.shape):
                sizes.add(size)
        return (names, values, exprs, origins) if values else None

    def _needs_eager_autograd(self, key):
        """Inputs that require grad in grad mode: the caller differentiates through this call,
        which only eager execution records (value_and_grad of a jitted function compiles the
        backward instead, see kiln.grad)."""
        return key[2][0] and any(s[2] for s in key[1])

    def _differentiable_call(self, args, kwargs):
        """A call the caller differentiates through (inside grad / value_and_grad, or inputs that
        require grad): graphs of this call's results would carry no autograd history, so it runs as
        bytecode capture's differentiable pieces (a compiled forward, and a node on the eager tape
        running the compiled backward), or eagerly where those cannot be made."""
        if self._eager_reason is not None or self._warned:
            self.stats.eager_calls += 1
            return self._target()(*args, **kwargs)
        return bytecode_capture.call(self, args, kwargs)

    def _miss(self, key, args, kwargs):
        self.stats.misses += 1
        if self._needs_eager_autograd(key) or (key[2][0] and differentiating()):
            return self._differentiable_call(args, kwargs)
        if self._warned:
            self.stats.eager_calls += 1
            return self._target()(*args, **kwargs)
        if self._entries.total() >= self.options.recompile_limit:
            self._warn_recompiles(key)
            self.stats.eager_calls += 1
            return self._target()(*args, **kwargs)
        if self._eager_reason is not None:
            self.stats.eager_calls += 1
            return self._target()(*args, **kwargs)
        if self._keys:
            stale = [e.failed_guard() for e in self._entries.exact.get(key, ())]
            self._recompiles.append(next((f"the value of {g} changed" for g in stale if g), None)
                                    if key in self._entries.exact
                                    else _C.tree.describe_change(self._keys[-1], key))
        t0 = time.perf_counter()
        symbols = self._symbols(key, self._key(args, kwargs)[1])
        try:
            compile_args = (self.__qualname__, self._capture, args, kwargs, symbols and symbols[:3])
            if self._recorder is None:
                result, entry = self._phases.record(capture_phase, *compile_args)
            else:
                result, entry = self._phases.record(self._recorder.compile, capture_phase, *compile_args)
        except NotReplayable as e:
            self._eager_reason = e.reason
            warnings.warn(f"kiln.jit: {self.__qualname__} runs eagerly: {e.reason}", RuntimeWarning, stacklevel=3)
            self.stats.eager_calls += 1
            return e.result
        except NotImplementedError as e:
            # graph control flow that kiln cannot build yet (see kiln.ops.cond / while_loop): a trace would
            # freeze the tensor-dependent branches, so LAX keeps the function working eagerly
            if self.options.strict or self.options.capture_mode != "ast":
                raise
            self._eager_reason = str(e)
            warnings.warn(f"kiln.jit: {self.__qualname__} runs eagerly: {e}", RuntimeWarning, stacklevel=3)
            self.stats.eager_calls += 1
            return self._target()(*args, **kwargs)
        self.stats.compile_seconds += time.perf_counter() - t0
        self.stats.compiles += 1
        self._keys.append(key)
        self._last = entry
        if entry.capture is not None and len(entry.capture.specialized) < len(entry.capture.values):
            entry.dyn = dynamic.DynamicEntry(entry, entry.capture, entry.graph, symbols[3], self.options)
        self._entries.add(key, entry)
        self._register_fast(key, args, kwargs, entry, entry.dyn)
        self.stats.entries = self._entries.total()
        return result

    def _register_fast(self, key, args, kwargs, entry, dyn=None):
        """Lets the C base class serve later calls of this signature (of every binding of dyn, a
        dynamic entry, as its instances are made): plain functions called with positional tensors
        whose results are a tensor or a flat tuple/list of tensors."""
        from ..nn.cell import Cell

        if (kwargs or self._self_ref is not None or isinstance(self.fn, Cell) or key[2][1] or len(key[2]) > 2
                or entry.differentiable or self._recorder is not None):
            return  # (len(key[2]) > 2: one tensor in two places, which the C path never serves)
        if not all(isinstance(a, _C.TensorBase) and a.is_contiguous() for a in args):
            return
        spec = entry.out_spec
        if spec == "T":
            kind = 0
        elif len(spec) == 2 and spec[0] in ("tuple", "list") and all(s == "T" for s in spec[1]):
            kind = 1 if spec[0] == "tuple" else 2
        else:
            return
        if dyn is None:
            self._add_fast_entry(entry.executable, tuple(args), key[2][0], kind, entry.guards)
            return
        index = self._add_fast_entry(None, tuple(args), key[2][0], kind, entry.guards, dyn.dims)
        if index is False:
            return
        dyn.fast = index
        for binding, exe in dyn.instances.items():
            self._add_fast_instance(index, binding, exe, dyn.limit)

    def _warn_recompiles(self, key):
        if self._warned:
            return
        self._warned = True
        stale = [e.failed_guard() for e in self._entries.exact.get(key, ())]
        changing = (next((f"the value of {g}" for g in stale if g), None) if key in self._entries.exact
                    else _C.tree.describe_change(self._keys[-1], key))
        warnings.warn(f"kiln.jit: {self.__qualname__} was compiled {len(self._keys)} times "
                      f"(recompile_limit={self.options.recompile_limit}); {changing} keeps changing. "
                      "New signatures now run eagerly.", RuntimeWarning, stacklevel=4)

    # ---- introspection ----------------------------------------------------------------
    def explain(self):
        """Prints and returns what this function became so far (kiln.jit.explain's report)."""
        from .explain_report import report  # (a module named "explain" would shadow kiln.jit.explain)

        out = report(self)
        print(out)
        return out

    def cache_info(self):
        """Hits, misses, compiles, time spent compiling, eager calls and cached entries."""
        info = CacheInfo()
        for name in CacheInfo.__slots__:
            setattr(info, name, getattr(self.stats, name))
        info.hits += self._fast_hits
        for variant in self._grad_variants.values():  # value_and_grad(this): its forward-and-backward graphs
            got = variant.cache_info()
            for name in CacheInfo.__slots__[:-1]:
                setattr(info, name, getattr(info, name) + getattr(got, name))
        info.dynamic = [e.dyn.describe() for es in self._entries.dynamic.values() for e in es]
        if self._pieces is not None:  # capture_mode="bytecode": its pieces captured with symbolic sizes
            info.dynamic += [p.dyn.describe() for ps in self._pieces.entries.dynamic.values() for p in ps]
        return info

    def _compiled_for(self, args, kwargs):
        """(entry, executable) serving these arguments (compiling, or making the dynamic instance, by
        calling the function when there is none yet; capture_mode="bytecode": the first graph of a
        function split at graph breaks)."""
        for attempt in range(2):
            if self.options.capture_mode == "bytecode":
                found = bytecode_capture.entry_for(self, args, kwargs)
                if found is not None:
                    return found
            else:
                key, leaves = self._key(args, kwargs)
                entry = self._entries.find(key)
                if entry is not None:
                    return entry, entry.executable
                found = self._entries.find_dynamic(key, lambda d: _made_instance(d, leaves))
                if found is not None:
                    return found
            if attempt == 0:
                self(*args, **kwargs)
        raise RuntimeError(f"{self.__qualname__}: these arguments run eagerly (no compiled graph)")

    def graph_str(self, *args, **kwargs):
        """The graph compiled for these arguments (compiling it if needed), or for the last call
        (capture_mode="bytecode": the first graph of a function split at graph breaks). A dynamic
        entry's graph is shown as captured (with the capture's sizes)."""
        entry = self._compiled_for(args, kwargs)[0] if args or kwargs else self._last
        if entry is None:
            raise RuntimeError("graph_str: no graph compiled yet; call the function or pass arguments")
        return entry.graph_text

    def plan_str(self, *args, **kwargs):
        """The plan of the graph compiled for these arguments (compiling it if needed), or for the
        last call: node order, where each value lives in the arena and until which step, what is
        freed after each step, fused groups and the nested plans of control flow; with recomputation
        (SublinearMemoryConfig, Cell.recompute), a last line says what it did (memory_report())."""
        if args or kwargs:
            exe = self.executable(*args, **kwargs)
        elif self._last is None:
            raise RuntimeError("plan_str: no graph compiled yet; call the function or pass arguments")
        else:
            exe = self._last.executable
        r = exe.recompute_report()
        if r.get("recompute", "none") == "none":  # (an instance bound from a symbolic plan reports nothing)
            return exe.plan_str()
        return exe.plan_str() + (f"recompute ({r['recompute']}): planned peak {r['peak_before']} -> {r['peak_after']} "
                                 f"bytes, {r['recomputed_ops']} ops recomputed, {r['extra_flops']} extra FLOPs; "
                                 f"bfs {r['peak_bfs']}, dfs {r['peak_dfs']}\n")

    def get_profile(self):
        """With profiling=True (option, or JitConfig(profiling=True)): every compiled run since the
        function was made, in MegEngine's get_profile() dict shape (kiln.profiler.megengine_profile)."""
        if self._recorder is None:
            raise RuntimeError("get_profile: this function was compiled with profiling=False; use "
                               "kiln.jit(fn, profiling=True)")
        return self._recorder.get_profile()

    def memory_report(self, *args, **kwargs):
        """The memory of the graph compiled for these arguments (compiling it if needed), or for the
        last call (plan only): see kiln.tools.memory_report (with what recomputation did, when
        sublinear_memory_config or Cell.recompute asked for it)."""
        from ..tools.memory import memory_report

        return memory_report(self, *args, **kwargs)

    def graph_dot(self, *args, **kwargs):
        """The graph compiled for these arguments (or for the last call) as Graphviz DOT: fused
        groups and control-flow bodies as clusters, nodes labelled with op, shape and source line."""
        if args or kwargs:
            return self.executable(*args, **kwargs).graph_dot()
        if self._last is None:
            raise RuntimeError("graph_dot: no graph compiled yet; call the function or pass arguments")
        return self._last.executable.graph_dot()

    def _memory_target(self, args, kwargs):
        """(executable, its input tensors, the eager call) for memory_report; no arguments: the
        last call's executable alone."""
        if not (args or kwargs):
            if self._last is None:
                raise RuntimeError("memory_report: no graph compiled yet; call the function or pass arguments")
            return self._last.executable, None, None
        exe = self.executable(*args, **kwargs)
        _, leaves = self._key(args, kwargs)
        return exe, leaves, lambda: self._target()(*args, **kwargs)

    def executable(self, *args, **kwargs):
        """The compiled graph object for these arguments (for its memory plan and order; a dynamic
        entry's instance for their sizes)."""
        return self._compiled_for(args, kwargs)[1]

    def _grad_through_pieces(self):
        """Whether value_and_grad of this function runs its compiled pieces on the eager tape
        (capture_mode="bytecode" split at graph breaks, or not called yet) rather than _grad_variant's
        one forward-and-backward graph (any other function; a bytecode one that is one graph)."""
        return self.options.capture_mode == "bytecode" and not bytecode_capture.one_graph(self)

    def _grad_variant(self, grad_position, weights, has_aux, **how):
        """A jitted function computing (value, grads) of this one: forward and backward as one graph
        (how: autograd.value_and_grad_on_tape's options, sens_param, return_ids, all_inputs)."""
        from ..autograd import value_and_grad_on_tape

        how = {k: v for k, v in how.items() if v}  # the defaults share one variant

        wkey = None if weights is None else (id(weights) if not isinstance(weights, (list, tuple))
                                             else tuple(id(w) for w in weights))
        gkey = (grad_position if not isinstance(grad_position, list) else tuple(grad_position), wkey, has_aux,
                tuple(sorted(how.items())))
        jf = self._grad_variants.get(gkey)
        if jf is None:
            def value_and_grads(*args, **kwargs):
                # captured: the converted function (ast); run eagerly: the function itself
                target = self._capture_target() if _C.is_tracing() else self._target()
                return value_and_grad_on_tape(target, grad_position, weights, has_aux, args, kwargs, **how)

            value_and_grads.__qualname__ = f"value_and_grad({self.__qualname__})"
            jf = self._grad_variants[gkey] = JitFunction(value_and_grads, self.options.with_capture_mode("trace"))
            jf._grad_parent = self
        return jf

    def __repr__(self):
        return f"<kiln.jit {self.__qualname__} ({self.options})>"


hooks.jit_function_class = JitFunction  # (autograd, Cell and the capture modes reach it there)

_NO_ENTRY = object()


def _made_instance(d, leaves):
    """The instance of dynamic entry d for the sizes of a call's tensors, if made already, else None."""
    values = d.bind(leaves)
    return None if values is None else d.instances.get(tuple(values[k] for k in d.live))


def _call_cell_body(cell, args, kwargs):
    """A cell's construct, logged for the training-mode guards like a call through Cell.__call__,
    its forward hooks around it."""
    from ..nn.cell import call_construct_hooked

    _C.log_cell_call(cell)
    return call_construct_hooked(cell, cell.construct, args, kwargs)


def _convert_target(fn):
    """The ast conversion of a jitted function, method or Cell (a Cell's converted construct
    bound to it); raises JitSyntaxError."""
    from ..nn.cell import Cell, overriding_call
    from . import ast_runtime

    override = overriding_call(fn) if isinstance(fn, Cell) else None
    if override is not None:  # what calling the cell runs eagerly
        conv = ast_runtime.convert_function(override) if ast_runtime._user_code(override) else override
        return lambda *a, **k: conv(fn, *a, **k)
    if isinstance(fn, Cell):
        construct = type(fn).construct
        if construct is Cell.construct and type(fn).forward is not Cell.forward:
            construct = type(fn).forward  # a module written with forward(): that is the code to convert
        if not isinstance(construct, types.FunctionType):
            raise ast_convert.source_error(construct, "its construct is not a Python function")
        convertible = ast_runtime._user_code(construct) or construct in ast_runtime._library_constructs()
        conv = ast_runtime.convert_function(construct) if convertible else construct
        return lambda *a, **k: ast_runtime.call_cell(fn, conv, a, k)
    if isinstance(fn, types.MethodType):
        func = fn.__func__
        if not isinstance(func, types.FunctionType):
            raise ast_convert.source_error(fn, "it is not a Python function")
        return types.MethodType(ast_runtime.convert_function(func), fn.__self__)
    if isinstance(fn, types.FunctionType):
        return ast_runtime.convert_function(fn)
    if callable(fn) and isinstance(getattr(type(fn), "__call__", None), types.FunctionType):
        call = type(fn).__call__  # a callable object: its __call__
        conv = ast_runtime.convert_function(call)
        return lambda *a, **k: conv(fn, *a, **k)
    raise ast_convert.source_error(fn, f"a {type(fn).__name__} has no Python source")


def explain(fn, *args, **kwargs):
    """Calls fn(*args, **kwargs) jitted — fn itself when it is a kiln.jit function, else
    kiln.jit(fn, capture_mode="bytecode") — then prints and returns the report: graphs and ops,
    graph breaks with reason and line, the guards of each graph, recompiles with what changed."""
    jf = fn if isinstance(fn, JitFunction) else jit(fn, capture_mode="bytecode")
    jf(*args, **kwargs)
    return jf.explain()


def jit(function=None, *, capture_mode="ast", jit_level=None, dynamic=None, fullgraph=False, backend="",
        **options):
    """Compile a function or Cell into a graph (MindSpore's mindspore.jit).

    Works as jit(fn, ...), @jit and @jit(...). capture_mode "ast" (the default) converts the
    function's source so that Python control flow on tensor values becomes graph control flow,
    then captures it; "trace" records the ops of a first eager run as they are; "bytecode"
    interprets the function's bytecode (through a frame hook: no source needed), splitting it into
    graphs around what a graph cannot hold (graph breaks; kiln.jit.explain reports them). jit_level "O0"
    runs the graph kernel by kernel with a static memory plan. backend "kbk" (alias "ms_backend")
    runs it kernel by kernel; "sink" (alias "GE") turns the whole graph into one generated native
    function; "" (the default) picks by level as MindSpore does: O0 and O1 kernel by kernel, O2
    sunk. fullgraph=True (or option jit_syntax_level="STRICT") makes code the ast mode cannot
    compile raise kiln.JitSyntaxError; otherwise ("LAX") such a function falls back to trace
    capture, or eager execution, with a warning; an empty jit_syntax_level uses
    kiln.set_context's. Each compiled graph is guarded on the Python state its capture read
    (globals, closure variables, attributes: see kiln.jit.guards); a capture with a Python side
    effect makes the function run eagerly (STRICT: an error). dynamic (see kiln.jit.dynamic): None
    (the default, automatic: a size that took a second value is symbolic from the next compile on),
    True or 1 (every input size is symbolic), False or 0 (exact shapes; kiln.mark_dynamic still
    applies). Options: exec_order ("bfs" | "dfs"), recompile_limit (default 8),
    debug_poison (fill freed buffers with NaN), jit_syntax_level, ge_options (with backend "GE":
    {"global": {...}, "session": {...}}, checked and recorded), profiling (True: every compiled
    call is recorded, get_profile() returns them in MegEngine's dict shape; such calls always come
    through Python), sublinear_memory_config (a kiln.jit.SublinearMemoryConfig: recompute
    activations of training graphs, checkpoints searched). Any jitted function has memory_report()
    and graph_dot() (see kiln.tools)."""
    opts = JitOptions.make(capture_mode=capture_mode, jit_level=jit_level, dynamic=dynamic, fullgraph=fullgraph,
                           backend=backend, **options)

    def wrap(fn):
        from ..nn.cell import Cell

        if isinstance(fn, JitFunction):  # re-jitted with these options; a bound one keeps its instance
            bound = fn._self if fn._self_ref is not None else None
            fn = fn.fn
            if bound is not None:
                return JitFunction(fn, opts, bound_self=bound)
        if not callable(fn):
            raise TypeError(f"jit: expected a function or a Cell, got {type(fn).__name__}")
        if isinstance(fn, Cell):
            return JitFunction(fn, opts)
        return JitFunction(fn, opts)

    return wrap if function is None else wrap(function)
