"""Calls of a function jitted with capture_mode="bytecode" (see kiln.jit.bytecode): the entry
through the frame hook, its pieces and the per-call run of graph, Python instruction at a graph
break, graph, ...

A call goes through the frame hook (kiln._C.run_hooked), which binds the arguments as CPython
does; when they were positional and fill the parameters exactly, later calls find the entry by
their call key without the hook. A function that is one graph taking positional tensors is served
by kiln.jit's C fast path.

A piece (a kiln.jit.capture_core.Entry whose extra is a PieceInfo) is one compiled graph from a
resume point: the start of the function (its bound arguments) or the instruction after a graph
break (the frozen frames). It ends with the
function's return (its outputs are the result's tensors) or at the next graph break (its outputs
are the tensors of the frozen frames, rebuilt around them with the piece's spec). Pieces are
cached per resume point and call key (the frozen state's structure, constants and tensor
signature), each guarded by the GuardSet of what its capture read.

With dynamic shapes (the jit's `dynamic` option, kiln.mark_dynamic; see kiln.jit.dynamic) a piece
is captured with symbolic sizes (dynamic.Capture) when its symbols, chosen as for trace and ast
capture, include any; unless every one ended specialized it is kept by the shape-free key
(Entries.dynamic) and serves each call whose sizes bind its symbols and satisfy its relation
guards, through its DynamicEntry's instance for that binding. While it is captured, len() of a
tensor is its symbolic first size, a size used as a number beside a tensor is a 0-d graph input
(PieceInfo.size_inputs: its value at each call's binding is passed after the state's tensors), a size
live at the graph break is kept in the state as its expression (evaluated per binding when the
state is thawed), and the outputs whose sizes follow the symbols are marked dynamic so that the
piece after the break is captured with symbolic sizes there too. Differentiable pieces keep exact
sizes (piece_grad splits their forward and backward per capture).
"""
import contextlib
import threading
import time
import types
import warnings
import weakref

from .. import _C
from ..autograd import differentiating, gradient_of_gradient_possible
from ..profiler import capture_phase
from . import bytecode, code_cache, dynamic, guards, piece_grad, sym_scalar, tree
from .capture_core import Entry, EntryCache, InterpreterStrategy, NoHistory, PieceInfo, Recording, refuse_backward
from .recording import returns_closure, returns_reached, user_frame_tracer
from .syntax import JitSyntaxError

_local = threading.local()
_owner = weakref.WeakValueDictionary()  # code -> the JitFunction that last ran it (frames met outside its call)
_VAR_ARGS = 0x04 | 0x08

MAX_PIECES = 64  # per wrapper: beyond, the rest of a call is interpreted in Python
# Pieces of one (resume point, call key) kept in a code object's shared Entries: closures made again
# with new cell values each add one; beyond this many the oldest go (a wrapper needing it recompiles).
SHARED_PER_KEY = 32
MAX_DIRECT = 256  # call keys (exact shapes) found without the frame hook, for those served by dynamic pieces


class Entries(EntryCache):
    """The compiled pieces of a code object for one set of options, keyed by (resume point, call
    key) (exact; dynamic: by the key without its shapes, the pieces captured with symbolic sizes),
    with what their captures found: shared by every kiln.jit wrapper of a function of that code with
    those options (see entries_of); a Cell's or a method's are its wrapper's own."""
    __slots__ = ("breaks", "count", "python_steps", "static_scalars", "__weakref__")

    def __init__(self):
        super().__init__()
        self.breaks = []  # (reason, where) of each graph break met, in order
        self.count = 0
        self.python_steps = set()  # positions whose instruction runs in Python whatever the state
        self.static_scalars = set()  # resume points whose ints and floats are constants (kiln.jit.sym_scalar)


def _options_key(opts):
    return tuple(repr(getattr(opts, name, None)) for name in type(opts).__slots__) + (opts.jit_syntax_level,)


def entries_of(fn, opts):
    """The Entries of a plain function's code for these options, kept with the code object
    (kiln.jit.code_cache): wrappers of the code whose options agree share them (kiln.jit twice, a
    closure made again, exec of the same code object), and they go when the code goes. Their
    guards read the globals and closure cells of the function called."""
    return code_cache.entries_dict(fn.__code__).setdefault(_options_key(opts), Entries())


class Pieces:
    """The pieces of one jitted function (its Entries) and what its calls met."""

    def __init__(self, owner, fn, prefix, entries, shared=False):
        self.owner = owner  # the JitFunction
        self.shared = shared  # entries kept with the code object (entries_of), shared by its wrappers
        self.fn, self.prefix = fn, prefix  # the Python function captured, the arguments before the call's
        self.entries = entries
        code = fn.__code__
        self.direct_ok = not code.co_flags & _VAR_ARGS  # positional calls filling the parameters exactly
        self.nparams = code.co_argcount
        self.varkw = (code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & 0x04)
                      if code.co_flags & 0x08 else -1)  # the index of **kwargs among the parameters
        self.direct = {}  # call key of the positional arguments -> (state key, spec) of the entry
        self.fast_keys = set()  # entry keys offered to kiln.jit's C fast path
        self.fast_dyn = {}  # id(dynamic piece) -> (its number in kiln.jit's C fast path, the bindings given it)
        self.recompiles = []  # (resume point, the guard that failed)
        self.new_signatures = []  # what changed in the arguments, for each entry compiled after the first
        self.entry_keys = []
        self.warned = False  # the recompile_limit warning was given
        self.given_up = None  # why the rest of calls is interpreted in Python
        self.own = set()  # ids of the pieces this wrapper captured (its limits count these only)
        self.mine = []  # those pieces, kept alive while the wrapper lives (the ids stay theirs)

    cache = property(lambda self: self.entries.exact)
    breaks = property(lambda self: self.entries.breaks)
    python_steps = property(lambda self: self.entries.python_steps)
    count = property(lambda self: self.entries.count)

    def lookup(self, key):
        found = self.entries.find(key, self.fn)
        if found is None and self.cache.get(key):
            self.recompiles.append((key[0], self.cache[key][-1].failed_guard(self.fn)))
        return found

    def lookup_dynamic(self, key, leaves):
        """(piece, executable, the symbols' sizes) of a piece captured with symbolic sizes whose guards
        (on Python state, and the relations of its sizes) this call satisfies, its instance for the
        call's binding made on first use; or None."""
        found = self.entries.find_dynamic(key, lambda d: self.owner._instance_for(d, leaves), self.fn)
        if found is None:
            return None
        piece, (exe, values, _) = found
        binding = tuple(values[k] for k in piece.dyn.live)
        fast = self.fast_dyn.get(id(piece))
        if fast and binding not in fast[1]:
            fast[1].add(binding)
            self.owner._add_fast_instance(fast[0], binding, exe, piece.dyn.limit)
        return piece, exe, values

    def add(self, key, piece):
        same = self.entries.add(key, piece)
        if self.shared and len(same) > SHARED_PER_KEY:
            del same[0]  # in place: Pieces.direct holds the list
        self.own.add(id(piece))
        self.mine.append(piece)
        self.entries.count += 1
        if not piece.extra.returns:
            self.breaks.append((piece.extra.reason, piece.extra.where))


def _concrete(value):
    """A function's result with each size in it (a SymInt) its captured value, specialized."""
    if type(value) is dynamic.SymInt:
        return value.specialize("returned")
    if type(value) in (tuple, list):
        return type(value)(_concrete(v) for v in value)
    if type(value) is dict:
        return {k: _concrete(v) for k, v in value.items()}
    return value


def _symbolic_dims(capture, graph, out_leaves):
    """Per output of a dynamic capture that breaks, the dimensions whose sizes follow its symbols
    (they differ when the recording is rebound with every live symbol at another size; all of an
    output's when the recording does not hold for those sizes)."""
    live = tuple(k for k in range(len(capture.values)) if k not in capture.specialized)
    if not live:
        return None
    out = []
    for t in out_leaves:
        if not isinstance(t, _C.TensorBase) or t.ndim == 0 or not capture.tracer.knows(t):
            out.append(())
            continue
        v = capture.tracer.value_of(t)
        base, other = graph.value_shape(v), capture._probe(graph, v, live)
        out.append(tuple(d for d in range(len(base)) if other is None or other[d] != base[d]))
    return tuple(out)


def _labels(spec, leaves, top):
    """Per tensor of a frozen state, the name of a local of the frames that holds it (the innermost
    such frame's), else inputK: where cache_info says a piece's symbols come from."""
    where = {}
    for fr in tree.unflatten(spec, list(leaves))[0]:
        code = bytecode.frame_function(fr[0], top).__code__
        for name, v in zip(bytecode.localsplus_names(code), fr[2]):
            if isinstance(v, _C.TensorBase):
                where[id(v)] = name
    return [where.get(id(t), f"input{k}") for k, t in enumerate(leaves)]


@contextlib.contextmanager
def carried_marks(carried):
    """While the next piece's symbols are chosen: the outputs of the dynamic piece that broke before
    it (carried: (piece, its outputs), or None) marked dynamic where their sizes follow its symbols
    (kiln.mark_dynamic), so the piece after the break is symbolic there too; their marks as they
    were afterwards (the tensors may be the caller's own)."""
    saved = []
    if carried is not None:
        piece, outs = carried
        for t, dims in zip(outs, piece.extra.out_dims):
            if dims and isinstance(t, _C.TensorBase):
                marks = dynamic.marks_of(t)
                saved.append((t, None if marks is None else dict(marks)))
                dynamic.mark_dynamic(t, dims)
    try:
        yield
    finally:
        for t, old in saved:
            marks = dynamic.marks_of(t)
            marks.clear()
            marks.update(old or {})


def _holds(value, ids, depth=0):
    """Whether value is, or holds in its lists, tuples and dicts, an object whose id is in ids."""
    if id(value) in ids:
        return True
    if depth < 20 and type(value) in (list, tuple, dict):
        return any(_holds(v, ids, depth + 1) for v in (value.values() if type(value) is dict else value))
    return False


def capture_piece(owner, state, leaves, spec, grad=False, symbols=None):
    """Runs a capture from a frozen state (its tensors `leaves`, structure `spec`): returns
    (piece, outcome, payload, interp, outputs, first) with outcome "return" (payload: the detached result) or
    "break" (payload: the frames, standing at the break instruction, on real values; outputs: the
    tensors of the frozen frames, detached, in the order of piece.extra.out_dims). grad: the
    caller differentiates, the piece is captured with its backward (kiln.jit.piece_grad); when it
    has one, first is its piece_grad.FirstRun, for the call to go on with the capture's outputs
    (payload and interp are then None), else None. symbols:
    (names, values, per tensor its sizes as expressions, origins) of kiln.jit.dynamic.choose_symbols:
    the piece is captured with symbolic sizes (kiln.jit.dynamic.Capture) and, unless every symbol
    ended specialized, serves every binding its guards admit (piece.dyn)."""
    opts = owner.options
    top = owner._pieces.fn
    # the tensors the capture writes in place (a BatchNorm's running statistics, an optimizer's
    # state) and the random generator are kept as they were (keep_undo): put back when the compiled
    # piece runs the writes again (grad: it runs to record its node) or the call runs another way
    # (Unsupported, Specialize); code a piece cannot replay raises Unsupported at once (.grad written, ...)
    # (a piece runs no sublinear-memory search)
    rec = Recording(opts.compile_options.replace(sublinear=None), guards_of=top, symbols=symbols,
                    refuse=bytecode.Unsupported, keep_undo=True, frame_hook_off=True)
    out_dims = None
    with rec:
        tracer, recorder, aliases = rec.tracer, rec.recorder, rec.aliases
        aliases_state = rec.bind(spec, leaves)
        capture = rec.capture
        if grad:  # (bind_inputs marks leaves only: here every input that requires grad is differentiated)
            for a, t in zip(aliases, leaves):
                if t.requires_grad and not a.requires_grad:
                    a.requires_grad = True
        interp = bytecode.Interpreter([], recorder=recorder, capture=True, set_loc=tracer.set_loc)
        interp.user_frames = user_frame_tracer(tracer, recorder.on_call)
        interp.scalar_values = {id(a): t for a, t in zip(aliases, leaves)}  # (the values of symbolic scalars)
        interp.dynamic = capture
        frames = bytecode.thaw(aliases_state, interp, top)
        interp.frames = frames
        for f in frames:
            if f.code.cpython_only:
                raise bytecode.Unsupported(f"{f.code.cpython_only} in {f.func.__qualname__} "
                                           f"({f.func.__code__.co_filename}:{f.func.__code__.co_firstlineno})")
        interp.reads.extend((f, f.named_locals()) for f in frames)
        outcome, payload = rec.run(InterpreterStrategy(interp))
        interp.record_reads()  # (a list only appended to, `LOG.append(x)`, gets no guard on its contents)
        reads, where = tracer.value_reads()
        if reads:
            raise bytecode.Unsupported(f"a tensor's value is read into Python at {where} by code run as it is")
        if outcome == "return":
            if returns_closure(payload):
                raise bytecode.Unsupported("it returns a function defined inside it (its closure would keep this "
                                           "call's values at every later call)")
            if returns_reached(rec.recorder, payload) or _holds(payload, interp.outside):
                raise bytecode.Unsupported("it returns a list, dict or set it reached through a global, a closure or "
                                           "an attribute (a compiled call would return a copy)")
            if any(not interp.local(s) for s in tree.fresh_results(tree.flatten(payload, []))[1]):
                raise bytecode.Unsupported("it returns a set it did not make (a compiled call would return a copy)")
            if _holds(payload, interp.foreign):
                raise bytecode.Unsupported("it returns a list or dict the caller passed in (a compiled call would "
                                           "return a copy)")
            # (numbers a compiled loop carried, returned as numbers)
            payload, out_spec, out_leaves = rec.outputs(payload, concrete=_concrete)
            reason = where_at = None
        else:
            reason, where_at = payload, interp.frames[-1].where()
            if opts.strict:
                op = interp.frames[-1].code.ins[interp.frames[-1].pc][0]
                filename, _, line = where_at.rpartition(":")
                raise JitSyntaxError(f"a graph break at {op} ({reason})", filename, int(line), 0,
                                     "fullgraph=True: keep the function free of graph breaks, or pass "
                                     "fullgraph=False to split it into graphs", capture_mode="bytecode")
            out_leaves = []
            out_spec = tree.flatten(bytecode.freeze(interp.frames, interp, tracer), out_leaves)
            if capture is not None:
                out_dims = _symbolic_dims(capture, tracer.recorded(), out_leaves)
        grad_reads = tuple(t for _, t in tracer.recorded().structure()[1] if t.requires_grad)
        reads_grad = bool(grad_reads)
        rec.note_outside()  # (the parameters and closures' tensors the piece reads)
        made = piece_grad.finish(tracer, aliases, out_leaves, opts, owner.__qualname__) if grad else None
        first = None
        if made is not None:
            executable, pgrad, first = made
        else:
            pgrad = None
            executable = rec.compile(out_leaves)
        graph = rec.graph
        # the call goes on with the capture's values (first) or runs the compiled piece: then the
        # writes and draws are done again
        rec.undo = grad and first is None
    from ..nn.cell import Cell

    rec.add_guarded((owner.fn,) if isinstance(owner.fn, Cell) else ())
    specs = None
    if owner._pieces.shared:  # kept with the code object: guards that hold nothing leading back to it
        specs, guard_names = recorder.guard_specs()
        specs = code_cache.weaken(specs, top)
        guard_set = _C.GuardSet(specs)
    else:
        guard_set, guard_names = recorder.guard_set()
    text = executable.graph_str()
    info = PieceInfo(outcome == "return", reason, where_at, text.count(" = "), pgrad, reads_grad, specs)
    # (with grad the executable is the forward, returning the residuals after the outputs)
    piece = Entry(executable, out_spec, guard_set, guard_names, text, extra=info)
    diff_out = tuple(k for k, t in enumerate(out_leaves) if isinstance(t, _C.TensorBase) and t.requires_grad)
    if pgrad is None and diff_out:  # (run without its backward: see Entry.no_history)
        piece.no_history = NoHistory(grad_reads, diff_out)
    if capture is not None:
        piece.capture, piece.graph = capture, graph
        piece.extra.size_values = capture.values
        piece.extra.size_inputs = tuple(e for e, _ in interp.size_inputs)
    if capture is not None and len(capture.specialized) < len(capture.values):
        piece.dyn = dynamic.DynamicEntry(piece, capture, graph, symbols[3], opts)
        piece.extra.out_dims = out_dims
    detached = [t.detach() if isinstance(t, _C.TensorBase) else t for t in out_leaves]
    if piece.no_history is not None and _C.is_grad_enabled():
        refuse_backward(owner.__qualname__, piece.no_history, detached)
    if first is not None:  # (the call records its node on these, then goes on as after a compiled run)
        return piece, outcome, None, None, detached, first
    value = tree.unflatten(out_spec, detached)[0]
    if outcome == "return":
        return piece, "return", value, None, detached, None
    run_interp = bytecode.Interpreter([], capture=False)
    run_interp.size_values = piece.extra.size_values
    return piece, "break", bytecode.thaw(value, run_interp, top), run_interp, detached, None


def _execute(jf, piece, leaves, exe=None, sizes=None, first=None):
    """Runs a compiled piece (exe: a dynamic piece's instance for the call's binding `sizes`; recorded when
    jf was made with profiling=True); a differentiable one records its node on the autograd tape. first:
    the call that captured a differentiable piece, whose outputs it computed (first: (outputs,
    piece_grad.FirstRun)); nothing runs again."""
    if first is not None:
        return piece_grad.first_run(piece.extra.grad, leaves, *first)
    recorder = jf._recorder
    if piece.extra.size_inputs:  # sizes used as numbers: their values at this call's binding
        sizes = piece.extra.size_values if exe is None else sizes
        leaves = list(leaves) + [sym_scalar.as_tensor(dynamic.evaluate(e, sizes)) for e in piece.extra.size_inputs]
    if piece.extra.grad is not None:
        return piece_grad.run(piece.executable, piece.extra.grad, leaves,
                              (lambda exe, ts: exe(*ts)) if recorder is None else (lambda exe, ts: recorder.run(exe, *ts)))
    exe = piece.executable if exe is None else exe
    outs = exe(*leaves) if recorder is None else recorder.run(exe, *leaves)
    if piece.no_history is not None and _C.is_grad_enabled():
        outs = refuse_backward(jf.__qualname__, piece.no_history, outs)
    return outs


def grad_key(key, grad):
    """The cache key of a call (state_key) in which the caller differentiates (grad) or not: the
    pieces of the two kinds differ (a differentiable one keeps residuals for its backward)."""
    return (key[0], key[1], (key[2], "differentiated")) if grad else key


def run(owner, pieces, key, leaves, spec, side_effects_done=False, grad=False):
    """One call from a resume point: graphs and break instructions until the function returns
    (grad: the caller differentiates through it, key made by grad_key)."""
    carried = None  # (the last dynamic piece run that broke, its outputs): see carried_marks
    first = None  # (outputs, piece_grad.FirstRun) of the differentiable piece just captured
    while True:
        # (the piece just captured serves its own call, whatever its guards read now)
        piece, exe, sizes = first[2] if first is not None else pieces.lookup(key), None, None
        if piece is None:
            found = pieces.lookup_dynamic(key, leaves) if pieces.entries.dynamic else None
            if found is not None:
                piece, exe, sizes = found
        if piece is None and one_pass_iterator_in(tree.unflatten(spec, list(leaves))[0]):
            # a capture consumes such an iterator: one that then gave up could not give the call back the
            # values it took (nor could CPython, run from the start). Python runs the next instruction
            interp = bytecode.Interpreter([], capture=False)
            frames = bytecode.thaw(tree.unflatten(spec, list(leaves))[0], interp, pieces.fn)
        elif piece is None:
            # (the dynamic pieces of these sizes' shape-free key count too: a call breaking their relations)
            # (only this wrapper's: a closure made again with other cell values is not a recompile)
            stale = [p for p in list(pieces.cache.get(key, ())) + pieces.entries.dynamic.get(dynamic.shape_free(key), [])
                     if id(p) in pieces.own]
            if len(stale) >= owner.options.recompile_limit and pieces.given_up is None:
                failed = stale[-1].failed_guard(pieces.fn)
                pieces.given_up = (f"compiled {len(stale)} times (recompile_limit={owner.options.recompile_limit}); "
                                   + (f"the value of {failed}" if failed else "a relation between sizes its symbols "
                                      "assumed") + " keeps changing")
                if side_effects_done:
                    warnings.warn(f"kiln.jit: {owner.__qualname__}: {pieces.given_up}; the rest of each call runs "
                                  "in Python", RuntimeWarning, stacklevel=4)
            if len(pieces.mine) >= MAX_PIECES or pieces.given_up:
                if pieces.given_up is None:
                    pieces.given_up = f"more than {MAX_PIECES} graphs"
                    warnings.warn(f"kiln.jit: {owner.__qualname__}: {pieces.given_up}; the rest of each call runs "
                                  "in Python", RuntimeWarning, stacklevel=4)
                if not side_effects_done:  # nothing ran in Python yet: CPython runs the whole call
                    raise bytecode.Unsupported(pieces.given_up)
                return _finish_in_python(tree.unflatten(spec, list(leaves))[0], pieces.fn)
            t0 = time.perf_counter()
            try:
                # (a differentiable piece keeps exact sizes: its forward and backward are split per capture)
                with carried_marks(carried):
                    symbols = None if grad else owner._symbols(key, leaves, _labels(spec, leaves, pieces.fn))
                piece, outcome, value, interp, outs, made = owner._phases.record(
                    capture_phase, owner.__qualname__, capture_piece, owner, tree.unflatten(spec, list(leaves))[0],
                    leaves, spec, grad, symbols)
            except bytecode.Unsupported as e:
                if not side_effects_done:
                    raise
                pieces.given_up = str(e)
                return _finish_in_python(tree.unflatten(spec, list(leaves))[0], pieces.fn)
            except bytecode.Specialize:  # a symbolic scalar's value is needed: this point's scalars are constants
                pieces.entries.static_scalars.add(_position_of_state(spec, leaves, pieces.fn))
                interp = bytecode.Interpreter([], capture=False)
                frames = bytecode.thaw(tree.unflatten(spec, list(leaves))[0], interp, pieces.fn)
                key, spec, leaves = state_key(bytecode.freeze(frames, interp))
                key = grad_key(key, grad)
                continue
            owner.stats.compile_seconds += time.perf_counter() - t0
            carried = (piece, outs) if piece.extra.out_dims is not None else None
            if outcome == "break" and piece.extra.ops == 0 and _position(value) == _position_of_state(spec, leaves,
                                                                                                pieces.fn):
                # the resume point's own instruction breaks, no graph before it: a Python step at this
                # point from now on, whatever the state (no piece per value of a Python scalar)
                pieces.python_steps.add(_position(value))
                pieces.breaks.append((piece.extra.reason, piece.extra.where))
                if grad:  # the frames on the call's own tensors (the capture's are detached)
                    interp = bytecode.Interpreter([], capture=False)
                    value = bytecode.thaw(tree.unflatten(spec, list(leaves))[0], interp, pieces.fn)
            else:
                owner.stats.compiles += 1
                owner.stats.misses += 1
                pieces.add(key, piece)
                owner._last = piece
                if grad:  # the capture computed on detached tensors: record the piece's node on its outputs
                    first = None if made is None else (outs, made, piece)
                    continue
            if outcome == "return":
                return value
            frames = value
        else:
            owner.stats.hits += 1
            if owner._last is None:  # (compiled by another wrapper of the code: see entries_of)
                owner._last = piece
            try:
                outs = _execute(owner, piece, leaves, exe, sizes, first and first[:2])
            except bytecode.Unsupported as e:  # (a differentiable piece whose backward, compiled now, cannot be)
                if not side_effects_done:
                    raise
                pieces.given_up = str(e)
                return _finish_in_python(tree.unflatten(spec, list(leaves))[0], pieces.fn)
            first = None
            value = tree.unflatten(piece.out_spec, outs)[0]
            if piece.extra.returns:
                return value
            carried = (piece, outs) if piece.extra.out_dims is not None else None
            interp = bytecode.Interpreter([], capture=False)
            interp.size_values = sizes if sizes is not None else piece.extra.size_values
            try:
                frames = bytecode.thaw(value, interp, pieces.fn)
            except bytecode.Unsupported:
                # the state after the graph names an object of its capture that is gone; on_frame would run
                # the whole call again eagerly, repeating the side effects already done in this call. A graph
                # without ops changed nothing: the rest of the call runs in Python from the state before it
                if not side_effects_done or piece.extra.ops:
                    raise
                return _finish_in_python(tree.unflatten(spec, list(leaves))[0], pieces.fn)
        # the break instruction, in Python (and those of the Python steps after it)
        interp.frames = frames
        while True:
            outcome, result = interp.python_step()
            side_effects_done = True
            if outcome == "return":
                return result
            if not pieces.python_steps or _position(interp.frames) not in pieces.python_steps:
                break
        symbolic = not pieces.entries.static_scalars or _position(interp.frames) not in pieces.entries.static_scalars
        try:
            key, spec, leaves = state_key(bytecode.freeze(interp.frames, interp, symbolic=symbolic))
        except bytecode.Unsupported as e:  # a state no graph can start from: the rest of the call in Python
            pieces.given_up = pieces.given_up or str(e)
            return _run_to_end(interp)
        # a tensor the call made that requires grad (a piece's output, a parameter held in a local): the
        # pieces from here on record their backward, so what they compute from it keeps its history
        grad = grad or _differentiates(leaves)
        key = grad_key(key, grad)


_NO_OPS = frozenset(("NOP", "PRECALL", "RESUME"))


def _skip_no_ops(code, pc):
    """The offset of the first instruction at or after pc that does something."""
    while code.ins[pc][0] in _NO_OPS:
        pc += 1
    return code.ins[pc][2]


def _position(frames):
    """Where frames stand: (a weakref to the code, offset of the next instruction that does
    something) of each (kept in Entries, with the code object: see kiln.jit.code_cache)."""
    return tuple((weakref.ref(f.func.__code__), _skip_no_ops(f.code, f.pc)) for f in frames)


def _position_of_state(spec, leaves, top):
    state = tree.unflatten(spec, list(leaves))[0]
    codes = [bytecode.frame_function(s[0], top).__code__ for s in state]
    return tuple((weakref.ref(code), _skip_no_ops(c, c.at[s[1]]))
                 for s, code in zip(state, codes) for c in (bytecode.Code.of(code),))


def one_pass_iterator_in(value, depth=0):
    """Whether a frozen state names, by identity, a one-pass iterator other than a generator (a map
    or itertools object a Python step made, an iterator argument)."""
    if isinstance(value, bytecode.ByIdentity):
        try:
            obj = value.obj
        except bytecode.Unsupported:
            return False
        return hasattr(type(obj), "__next__") and not isinstance(obj, types.GeneratorType)
    if depth < 20 and type(value) in (tuple, list):
        return any(one_pass_iterator_in(v, depth + 1) for v in value)
    if depth < 20 and type(value) is dict:
        return any(one_pass_iterator_in(v, depth + 1) for v in value.values())
    return False


def state_key(state):
    """The call key of a frozen state (its constants include the resume point), its spec and its
    tensors."""
    key, leaves = _C.tree.call_key((state,), {}, ())
    spec = key[0][1][0][1][0]  # of ((state,), {}): the spec of state
    return key, spec, leaves


def _finish_in_python(state, top):
    interp = bytecode.Interpreter([], capture=False)
    interp.frames = bytecode.thaw(state, interp, top)
    return _run_to_end(interp)


def _run_to_end(interp):
    """Runs the Python interpreter's frames to the call's return (side effects done so far stay)."""
    prev = _C.eval_frame_suspend(False)
    try:
        return interp.run()[1]
    finally:
        _C.eval_frame_suspend(prev)


# ---- the entry ---------------------------------------------------------------------------------------


def target(jf):
    """(the Python function whose frames a JitFunction captures, the arguments before the call's)."""
    from ..nn.cell import Cell, overriding_call

    fn, prefix = jf.fn, ()
    if isinstance(fn, Cell) and overriding_call(fn) is not None:
        fn, prefix = overriding_call(fn), (fn,)  # what calling the cell runs eagerly
    elif isinstance(fn, Cell):
        fn, prefix = type(fn).construct, (fn,)
    elif isinstance(fn, types.MethodType):
        fn, prefix = fn.__func__, (fn.__self__,)
    elif not isinstance(fn, types.FunctionType) and isinstance(getattr(type(fn), "__call__", None),
                                                               types.FunctionType):
        fn, prefix = type(fn).__call__, (fn,)
    if not isinstance(fn, types.FunctionType):
        raise TypeError(f"kiln.jit(capture_mode=\"bytecode\"): a {type(jf.fn).__name__} has no Python bytecode")
    if jf._self_ref is not None:
        prefix = (jf._self,) + prefix
    return fn, prefix


def one_graph(jf):
    """Whether the calls so far found jf one graph: compiled, no graph break, never run in Python."""
    pieces = jf._pieces
    return (pieces is not None and pieces.count > 0 and not pieces.breaks and not pieces.python_steps
            and pieces.given_up is None and jf._eager_reason is None)


def _differentiates(tensors):
    """Whether the caller differentiates through this call: inside grad / value_and_grad, or with
    arguments that require grad, in grad mode (its pieces then record their backward)."""
    return _C.is_grad_enabled() and (differentiating() or any(isinstance(v, _C.TensorBase) and v.requires_grad
                                                              for v in tensors))


def call(jf, args, kwargs):
    """JitFunction's slow path for capture_mode="bytecode". A jitted Cell's forward hooks run in
    Python around its compiled construct, as eagerly around construct."""
    if getattr(jf.fn, "__dict__", {}).get("_kiln_hooks"):  # (only a Cell has forward hooks)
        from ..nn.cell import hooks_after, hooks_before

        args = hooks_before(jf.fn, tuple(args))
        return hooks_after(jf.fn, args, _call(jf, args, kwargs))
    return _call(jf, args, kwargs)


def _call(jf, args, kwargs):
    pieces = jf._pieces
    if (jf._eager_reason is not None and pieces is None) or gradient_of_gradient_possible():
        # (grad inside grad: a compiled piece's backward is not differentiable itself, so the call runs
        # on the eager tape, which records what the outer gradient needs)
        jf.stats.eager_calls += 1
        return jf._target()(*args, **kwargs)
    if pieces is None:
        try:
            fn, prefix = target(jf)
        except TypeError as e:  # nothing to interpret: STRICT raises, LAX runs it eagerly (one warning)
            if jf.options.strict:
                raise
            _give_up(jf, e)
            return jf._target()(*args, **kwargs)
        # a plain function of user code (a Cell's or a method's are per wrapper; so are kiln's own
        # wrappers', e.g. kiln.grad's: the guard recorder does not guard what kiln's code reads, such as
        # the function a wrapper closes over, and every kiln.grad wrapper has the same code)
        shared = not prefix and jf._self_ref is None and guards.is_user_code(fn.__code__)
        pieces = jf._pieces = Pieces(jf, fn, prefix, entries_of(fn, jf.options) if shared else Entries(),
                                         shared)
    else:
        fn, prefix = pieces.fn, pieces.prefix
        if jf._self_ref is not None:
            prefix = (jf._self,) + prefix[1:]
    full = prefix + args
    if not kwargs and pieces.direct_ok and len(full) == pieces.nparams and pieces.direct:
        ck, leaves = _C.tree.call_key(full, {}, ())
        hit = pieces.direct.get(ck)
        # (the key holds grad mode and each tensor's requires_grad: see _runs_eagerly)
        if hit is not None and jf._eager_reason is None and not (
                ck[2][0] and (differentiating() or any(sig[2] for sig in ck[1]))):
            for piece in hit[2]:  # a function that is one graph: no state to rebuild
                if piece.extra.returns and piece.guards.check(fn):
                    jf.stats.hits += 1
                    return tree.unflatten(piece.out_spec, _execute(jf, piece, leaves))[0]
            try:
                return run(jf, pieces, hit[0], leaves, hit[1])
            except bytecode.Unsupported as e:  # before anything ran in Python: the call runs eagerly
                _give_up(jf, e)
                return fn(*full)
    if _C.eval_frame_marked(fn.__code__) is not _frame:
        _C.eval_frame_mark(fn.__code__, _frame)
    _owner[fn.__code__] = jf
    prev = getattr(_local, "pending", None)
    _local.pending = (jf, fn.__code__, args, kwargs)
    try:
        return _C.run_hooked(fn, full, kwargs)
    finally:
        _local.pending = prev


def _frame(func, bound):
    """The frame hook's callback for code marked by capture_mode="bytecode"."""
    pending = getattr(_local, "pending", None)
    if pending is not None and pending[1] is func.__code__:
        _local.pending = None
        return on_frame(pending[0], func, bound, pending)
    jf = _owner.get(func.__code__)
    if jf is None or jf._self_ref is not None or jf._pieces is None or jf._pieces.fn is not func:
        return _C.RUN_EAGER
    return on_frame(jf, func, bound, None)


def entry_key(pieces, func, bound):
    """state_key of a call's first frame, its parameters bound."""
    interp = bytecode.Interpreter([], capture=False)
    for k, v in enumerate(bound):
        if isinstance(v, (list, dict)):  # **kwargs: the frame's own; else the caller's
            (interp.note_created(v) if k == pieces.varkw else interp.foreign.add(id(v)))
    return state_key(bytecode.freeze([bytecode.Frame.start(func, bound)], interp))


def entry_for(jf, args, kwargs):
    """(the piece a call with these arguments starts with (its guards holding), its executable for
    them: a dynamic piece's instance for their sizes), or None."""
    pieces = jf._pieces
    if pieces is None:
        return None
    prefix = pieces.prefix if jf._self_ref is None else (jf._self,) + pieces.prefix[1:]
    key, _, leaves = entry_key(pieces, pieces.fn, bytecode.bind(pieces.fn, prefix + tuple(args), kwargs))
    piece = pieces.entries.find(key, pieces.fn)
    if piece is not None:
        return piece, piece.executable
    found = pieces.lookup_dynamic(key, leaves) if pieces.entries.dynamic else None
    return None if found is None else found[:2]


def _give_up(jf, err):
    jf._eager_reason = str(err)
    warnings.warn(f"kiln.jit: {jf.__qualname__} runs eagerly: {err}", RuntimeWarning, stacklevel=5)
    jf.stats.eager_calls += 1


def on_frame(jf, func, bound, pending):
    """A frame of the function: its pieces run (captured when new); RUN_EAGER lets CPython run it."""
    if jf._eager_reason is not None:
        jf.stats.eager_calls += 1
        return _C.RUN_EAGER
    pieces = jf._pieces
    grad = _differentiates(bound)
    key, spec, leaves = entry_key(pieces, func, bound)
    key = grad_key(key, grad)
    first = key not in pieces.cache and dynamic.shape_free(key) not in pieces.entries.dynamic
    if first:
        if len(pieces.entry_keys) >= jf.options.recompile_limit:
            if not pieces.warned:
                pieces.warned = True
                change = _C.tree.describe_change(pieces.entry_keys[-1], key)
                warnings.warn(f"kiln.jit: {jf.__qualname__} was compiled for {len(pieces.entry_keys)} signatures "
                              f"(recompile_limit={jf.options.recompile_limit}); {change} keeps changing. New "
                              "signatures now run eagerly.", RuntimeWarning, stacklevel=4)
            jf.stats.eager_calls += 1
            return _C.RUN_EAGER
        if pieces.entry_keys:
            pieces.new_signatures.append(_C.tree.describe_change(pieces.entry_keys[-1], key))
        pieces.entry_keys.append(key)
    try:
        result = run(jf, pieces, key, leaves, spec, grad=grad)
    except bytecode.Unsupported as e:
        _give_up(jf, e)
        return _C.RUN_EAGER
    jf.stats.entries = pieces.count
    dyn = pieces.entries.dynamic.get(dynamic.shape_free(key), ())
    direct_key, direct_leaves = _C.tree.call_key(tuple(bound), {}, ())
    # (the direct path runs the pieces on the arguments' own tensors: only where they are the state's)
    if not grad and pieces.direct_ok and len(bound) == pieces.nparams and len(direct_leaves) == len(leaves) and all(
            a is b for a, b in zip(direct_leaves, leaves)) and (
            key in pieces.cache or dyn and len(pieces.direct) < MAX_DIRECT):  # (a dynamic piece: one per shape)
        pieces.direct[direct_key] = (key, spec, pieces.cache.get(key, ()))
    entries = pieces.cache.get(key, ())
    if (key not in pieces.fast_keys and not grad and pending is not None and len(entries) == 1
            and entries[0].extra.returns and not entries[0].extra.size_inputs):
        _, _, args, kwargs = pending
        pieces.fast_keys.add(key)  # (entries found compiled by another wrapper too)
        if _same_arguments(bound, args) and not kwargs:
            jf._register_fast(jf._key(args, kwargs)[0], args, kwargs, _FastView(entries[0], func))
    if (not entries and len(dyn) == 1 and dyn[0].extra.returns and not dyn[0].extra.size_inputs
            and id(dyn[0]) not in pieces.fast_dyn and not grad and pending is not None):  # every binding of a one-graph function's dynamic piece, from C
        _, _, args, kwargs = pending
        pieces.fast_dyn[id(dyn[0])] = None  # (offered once)
        if _same_arguments(bound, args) and not kwargs:
            d = _FastDims(dyn[0].dyn)
            jf._register_fast(jf._key(args, kwargs)[0], args, kwargs, _FastView(dyn[0], func), d)
            if d.fast is not None:
                pieces.fast_dyn[id(dyn[0])] = (d.fast, set(d.instances))
    return result


def _same_arguments(bound, args):
    """Whether the frame's bound parameters are the call's positional arguments themselves (by
    identity: `==` of tensors is elementwise; a *args parameter is one tuple of them)."""
    return len(bound) == len(args) and all(b is a for b, a in zip(bound, args))


class _FastDims:
    """What JitFunction._register_fast reads of a dynamic entry, for a dynamic piece that returns (its
    number in the C fast path is this wrapper's own: the piece may be shared, see entries_of)."""
    __slots__ = ("dims", "instances", "fast", "limit")

    def __init__(self, d):
        self.dims, self.instances, self.fast, self.limit = d.dims, dict(d.instances), None, d.limit


class _FastView:
    """What JitFunction._register_fast reads of an entry, for a piece that returns."""
    __slots__ = ("executable", "out_spec", "guards", "differentiable")

    def __init__(self, piece, fn):
        self.executable, self.out_spec, self.guards = piece.executable, piece.out_spec, piece.guards
        if piece.extra.guard_specs is not None:  # (guards rooted at the function called: a copy bound to fn)
            self.guards = _C.GuardSet(piece.extra.guard_specs, fn)
        self.differentiable = piece.extra.reads_grad  # (the C fast path cannot tell whether the caller differentiates)
