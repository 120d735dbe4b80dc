"""The pieces of a function captured from bytecode (see kiln.jit.bytecode) and the per-call run of
graph, Python instruction at a graph break, graph, ...

A Piece is one compiled graph from a resume point: the start of the function (its bound
arguments) or the instruction after a graph break (the frozen frames). It ends with the
function's return (its outputs are the result's tensors) or at the next graph break (its outputs
are the tensors of the frozen frames, rebuilt around them with the piece's spec). Pieces are
cached per resume point and call key (the frozen state's structure, constants and tensor
signature), each guarded by the GuardSet of what its capture read.
"""
import sys
import time
import warnings

from .. import _C
from . import bytecode, guards, tree
from .syntax import JitSyntaxError

MAX_PIECES = 64  # per function: beyond, the rest of a call is interpreted in Python


class Piece:
    __slots__ = ("executable", "out_spec", "graph_text", "guards", "guard_names", "returns", "reason", "where",
                 "ops")

    def __init__(self, executable, out_spec, guards_, guard_names, returns, reason, where):
        self.executable = executable
        self.out_spec = out_spec
        self.graph_text = executable.graph_str()
        self.ops = self.graph_text.count(" = ")
        self.guards = guards_
        self.guard_names = guard_names
        self.returns = returns  # True: the function's result; False: the state at a graph break
        self.reason = reason  # why the graph breaks after it (None when it returns)
        self.where = where  # "file:line" of the break instruction

    def failed_guard(self):
        k = self.guards.first_failure()
        return None if k < 0 else self.guard_names[k]


class Pieces:
    """The pieces of one jitted function, keyed by (resume point, call key)."""

    def __init__(self, owner):
        self.owner = owner  # the JitFunction
        self.cache = {}
        self.breaks = []  # (reason, where) of each graph break met, in order
        self.recompiles = []  # (resume point, the guard that failed)
        self.count = 0
        self.given_up = None  # why the rest of calls is interpreted in Python

    def lookup(self, key):
        entries = self.cache.get(key)
        if not entries:
            return None
        for e in entries:
            if e.guards.check():
                return e
        self.recompiles.append((key[0], entries[-1].failed_guard()))
        return None

    def add(self, key, piece):
        self.cache.setdefault(key, []).append(piece)
        self.count += 1
        if not piece.returns:
            self.breaks.append((piece.reason, piece.where))


def capture_piece(owner, state, leaves, spec):
    """Runs a capture from a frozen state (its tensors `leaves`, structure `spec`): returns
    (piece, outcome, payload, interp) with outcome "return" (payload: the detached result) or
    "break" (payload: the frames, standing at the break instruction, on real values)."""
    opts = owner.options
    tracer = _C.Tracer()
    recorder = guards.Recorder(top=owner.fn if not isinstance(owner.fn, type) else None)
    called, writes = [], []
    prev_logs = _C.set_cell_logs(called, writes)
    prev_hook = _C.eval_frame_suspend(True)
    try:
        from .function import bind_inputs

        aliases_state = bind_inputs(tracer, spec, leaves)
        interp = bytecode.Interpreter([], recorder=recorder, capture=True)
        frames = bytecode.thaw(aliases_state, interp)
        interp.frames = frames
        for f in frames:
            if f.code.has_try:
                raise bytecode.Unsupported(f"try/with in {f.func.__qualname__} "
                                           f"({f.func.__code__.co_filename}:{f.func.__code__.co_firstlineno})")
        if len(frames) == 1 and frames[0].pc == 0:
            f = frames[0]
            recorder.on_code(f.func.__code__, f.func.__globals__,
                             dict(zip(bytecode.bound_names(f.func.__code__), f.locals)))
            for v in f.locals:
                if isinstance(v, (list, dict)):
                    interp.foreign.add(id(v))
        else:
            for f in frames:
                recorder.on_code(f.func.__code__, f.func.__globals__, {})
        prev_trace = sys.gettrace()
        try:
            outcome, payload = interp.run()
        finally:
            sys.settrace(prev_trace)
        reads, where = tracer.value_reads()
        if reads:
            raise bytecode.Unsupported(f"a tensor's value is read into Python at {where} by code run as it is")
        if outcome == "return":
            out_leaves = []
            out_spec = tree.flatten(payload, out_leaves)
            reason = where_at = None
        else:
            reason, where_at = payload, interp.frames[-1].where()
            if opts.strict:
                op = interp.frames[-1].code.ins[interp.frames[-1].pc][0]
                filename, _, line = where_at.rpartition(":")
                raise JitSyntaxError(f"a graph break at {op} ({reason})", filename, int(line), 0,
                                     "fullgraph=True: keep the function free of graph breaks, or pass "
                                     "fullgraph=False to split it into graphs")
            out_leaves = []
            out_spec = tree.flatten(bytecode.freeze(interp.frames, interp, tracer), out_leaves)
        executable = tracer.finish(out_leaves, order=opts.exec_order, poison=opts.debug_poison, level=opts.level,
                                   inference=opts.infer_boost == "on",
                                   disable_format_transform=opts.disable_format_transform, backend=opts.backend)
    finally:
        tracer.end()
        _C.eval_frame_suspend(prev_hook)
        _C.set_cell_logs(*prev_logs)
    recorder.add_cells(tuple(dict.fromkeys(called)))
    guard_set, guard_names = recorder.guard_set()
    piece = Piece(executable, out_spec, guard_set, guard_names, outcome == "return", reason, where_at)
    detached = [t.detach() if isinstance(t, _C.TensorBase) else t for t in out_leaves]
    value = tree.unflatten(out_spec, detached)[0]
    if outcome == "return":
        return piece, "return", value, None
    run_interp = bytecode.Interpreter([], capture=False)
    return piece, "break", bytecode.thaw(value, run_interp), run_interp


def run(owner, pieces, key, leaves, spec, side_effects_done=False):
    """One call from a resume point: graphs and break instructions until the function returns."""
    while True:
        piece = pieces.lookup(key)
        if piece is None:
            stale = pieces.cache.get(key, ())
            if len(stale) >= owner.options.recompile_limit and pieces.given_up is None:
                pieces.given_up = (f"compiled {len(stale)} times (recompile_limit="
                                   f"{owner.options.recompile_limit}); the value of {stale[-1].failed_guard()} "
                                   "keeps changing")
                warnings.warn(f"kiln.jit: {owner.__qualname__}: {pieces.given_up}; the rest of each call runs in "
                              "Python", RuntimeWarning, stacklevel=4)
            if pieces.count >= MAX_PIECES or pieces.given_up:
                if pieces.given_up is None:
                    pieces.given_up = f"more than {MAX_PIECES} graphs"
                    warnings.warn(f"kiln.jit: {owner.__qualname__}: {pieces.given_up}; the rest of each call runs "
                                  "in Python", RuntimeWarning, stacklevel=4)
                return _finish_in_python(tree.unflatten(spec, list(leaves))[0])
            t0 = time.perf_counter()
            try:
                piece, outcome, value, interp = capture_piece(owner, tree.unflatten(spec, list(leaves))[0],
                                                              leaves, spec)
            except bytecode.Unsupported as e:
                if not side_effects_done:
                    raise
                pieces.given_up = str(e)
                return _finish_in_python(tree.unflatten(spec, list(leaves))[0])
            owner.stats.compile_seconds += time.perf_counter() - t0
            owner.stats.compiles += 1
            owner.stats.misses += 1
            pieces.add(key, piece)
            owner._last = piece
            if outcome == "return":
                return value
            frames = value
        else:
            owner.stats.hits += 1
            outs = piece.executable(*leaves)
            value = tree.unflatten(piece.out_spec, outs)[0]
            if piece.returns:
                return value
            interp = bytecode.Interpreter([], capture=False)
            frames = bytecode.thaw(value, interp)
        # the break instruction, in Python
        interp.frames = frames
        outcome, result = interp.run(steps=1)
        side_effects_done = True
        if outcome == "return":
            return result
        key, spec, leaves = state_key(bytecode.freeze(interp.frames, interp))


def state_key(state):
    """(resume point, call key of the frozen state), its spec and its tensors."""
    leaves = []
    spec = tree.flatten(state, leaves)
    key, _ = _C.tree.call_key((state,), {}, ())
    return (bytecode.position(state), key), spec, leaves


def _finish_in_python(state):
    interp = bytecode.Interpreter([], capture=False)
    interp.frames = bytecode.thaw(state, interp)
    prev = _C.eval_frame_suspend(False)
    try:
        return interp.run()[1]
    finally:
        _C.eval_frame_suspend(prev)
