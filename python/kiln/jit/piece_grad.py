"""Differentiable pieces of capture_mode="bytecode" (kiln.jit.bytecode_capture): gradients across
graph breaks.

When the caller differentiates through a call (inside grad / value_and_grad, or with inputs that
require grad), each piece is captured with its gradient: once the capture's outputs are known, the
gradient rules run on the trace with one more graph input per differentiable output (its
gradient), recording the backward after the forward in one graph. Graph.split cuts that graph at
the values the backward reads: the forward graph returns the piece's outputs and those residuals,
the backward graph takes the residuals and the output gradients and returns the gradients of the
piece's inputs and of the captured tensors that require grad (a Cell's Parameters).

A call runs the compiled forward, then records one node on kiln's eager autograd tape
(kiln._C.record_grad) over the inputs and parameters, whose outputs are the piece's differentiable
outputs and whose gradient runs the compiled backward on the residuals it keeps. Between pieces
the break instruction runs eagerly, recorded as usual, so a backward pass goes piece -> eager
Python -> piece.

The call that captures a piece runs nothing twice (first_run): the capture computed the forward
on the call's values, and recorded the backward with output gradients of ones, the gradient
value_and_grad and backward() seed a result with. Its node's gradient returns the gradients that
capture computed when the gradients reaching it are those ones, and otherwise runs the backward
eagerly on the capture's own tape (a piece whose outputs feed later work gets other gradients).
"""
from .. import _C
from ..ops import ones, zeros
from ..profiler import timed_phase


class PieceGrad:
    """What a differentiable piece adds to its forward executable. Its backward graph is compiled
    when a call after the capturing one runs the piece (compiled()): the capturing call needs none,
    and a function that is one graph is differentiated through its whole-graph variant from then on
    (JitFunction._grad_variant), so its pieces' backward is never compiled."""
    __slots__ = ("_backward", "_graph", "_options", "nout", "diff_out", "out_metas", "grad_inputs", "params",
                 "present", "passthrough", "name")

    def __init__(self, graph, options, nout, diff_out, out_metas, grad_inputs, params, present, passthrough, name):
        self._graph, self._options = graph, options  # the backward graph and its compile options, until compiled
        self._backward = None  # the compiled backward: (residuals..., output gradients...) -> gradients
        self.nout = nout  # the piece's outputs; the forward's outputs after them are residuals
        self.diff_out = diff_out  # positions of the outputs the node makes (they carry history)
        self.out_metas = out_metas  # their (shape, dtype): a zero gradient where none reached one
        self.grad_inputs = grad_inputs  # positions of the inputs that require grad
        self.params = params  # captured tensors that require grad (Parameters), node inputs after those
        self.present = present  # per node input: its position among the backward's outputs, or -1
        # output position -> input position, ("obj", tensor): returned as it is, or ("same", position):
        # the object of an earlier output
        self.passthrough = passthrough
        self.name = name

    def compiled(self):
        """The compiled backward, compiled at the first call; one kiln cannot compile is
        bytecode.Unsupported (that part runs in Python)."""
        if self._backward is None:
            try:
                self._backward = _C.compile_graph(self._graph, self._options)
            except (RuntimeError, ValueError, TypeError) as e:
                from .bytecode import Unsupported

                raise Unsupported(f"the backward of a graph could not be compiled: {e}") from e
            self._graph = self._options = None
        return self._backward

    def backward_text(self):
        """The backward graph's text: compiled (explain reads what its passes made of it) unless it
        cannot be."""
        try:
            return self.compiled().graph_str()
        except Exception:  # noqa: BLE001 (bytecode.Unsupported: the graph as recorded)
            return str(self._graph)


def _grad_inputs(tracer, aliases):
    """(positions of the aliases that require grad, the captured tensors that require grad)."""
    positions = [k for k, a in enumerate(aliases) if a.requires_grad]
    captures = tracer.recorded().structure()[1]
    return positions, [t for _, t in captures if t.requires_grad]


class FirstRun:
    """What the capture of a differentiable piece computed, for the call that captured it: the
    outputs with their eager history (roots), the node's inputs as the capture saw them (targets:
    the inputs' aliases, then the parameters), and their gradients for output gradients of ones
    (None where none reached one), given out once."""
    __slots__ = ("roots", "targets", "grads")

    def __init__(self, roots, targets, grads):
        self.roots, self.targets, self.grads = roots, targets, grads


def finish(tracer, aliases, out_leaves, opts, name):
    """Ends a capture whose outputs are out_leaves: (forward executable, PieceGrad, FirstRun), or
    None when no output depends on anything that requires grad (the caller then finishes it as
    usual). A backward kiln cannot record, or a forward it cannot compile, is bytecode.Unsupported
    (that part runs in Python)."""
    try:
        return _finish(tracer, aliases, out_leaves, opts, name)
    except (RuntimeError, ValueError, TypeError) as e:
        from .bytecode import Unsupported

        raise Unsupported(f"the backward of a graph could not be compiled: {e}") from e


def _finish(tracer, aliases, out_leaves, opts, name):
    positions, params = _grad_inputs(tracer, aliases)
    alias_at = {id(a): k for k, a in enumerate(aliases)}
    passthrough, diff_out, first = {}, [], {}
    for i, t in enumerate(out_leaves):
        if not isinstance(t, _C.TensorBase):
            continue
        if tracer.node_of(t) < 0:  # an input or a captured tensor, returned as it is
            passthrough[i] = alias_at[id(t)] if id(t) in alias_at else ("obj", t)
        elif id(t) in first:  # the same tensor again: the same output object
            passthrough[i] = ("same", first[id(t)])
        elif t.requires_grad:
            first[id(t)] = i
            diff_out.append(i)
    if not diff_out or not (positions or params):
        return None
    cotangents = []
    token = _C.suspend_tracing()  # (made outside the trace: graph inputs, not recorded ops)
    try:
        for i in diff_out:
            cotangents.append(ones(tuple(out_leaves[i].shape), dtype=out_leaves[i].dtype))
    finally:
        _C.resume_tracing(token)
    for c in cotangents:
        tracer.add_input(c)
    targets = [aliases[k] for k in positions] + params
    roots = [out_leaves[i] for i in diff_out]
    with timed_phase("gradient", "bytecode capture: the backward recorded"):
        grads = _C.grad(roots, targets, cotangents, False)
    present, outs = [], []
    for g in grads:
        present.append(-1 if g is None else len(outs))
        if g is not None:
            outs.append(g)
    graph = tracer.finish_graph(list(out_leaves) + outs)
    with timed_phase("split", "bytecode capture: forward and backward cut apart"):
        fwd, bwd, _ = graph.split(len(aliases), len(out_leaves))
    # forward and backward of a training piece: no inference rewrites, no sublinear-memory search
    options = opts.compile_options.replace(inference=False, sublinear=None)
    forward = _C.compile_graph(fwd, options)
    metas = [(tuple(out_leaves[i].shape), out_leaves[i].dtype) for i in diff_out]
    pg = PieceGrad(bwd, options, len(out_leaves), diff_out, metas, positions, params, present, passthrough,
                   f"compiled piece of {name}")
    return forward, pg, FirstRun(roots, targets, list(grads))


def run(forward, pg, leaves, run_exe):
    """Runs a differentiable piece on its input tensors: its outputs, those that carry history
    recorded on the tape as one node whose gradient is the compiled backward (compiled first: one
    that cannot be is bytecode.Unsupported before anything ran)."""
    pg.compiled()
    outs = run_exe(forward, leaves)
    residuals = outs[pg.nout:]
    return _record(pg, leaves, list(outs[:pg.nout]), _backward(pg, residuals))


def first_run(pg, leaves, outs, first):
    """The call that captured the piece: its outputs are the capture's (outs, detached; first: its
    FirstRun), those that carry history recorded on the tape as one node whose gradient is what the
    capture computed (see the module's note)."""
    return _record(pg, leaves, list(outs[:pg.nout]), _first_backward(pg, first))


def _record(pg, leaves, outs, backward):
    for i, src in pg.passthrough.items():
        if not isinstance(src, tuple):
            outs[i] = leaves[src]
        elif src[0] == "obj":
            outs[i] = src[1]
    for i, src in pg.passthrough.items():
        if isinstance(src, tuple) and src[0] == "same":
            outs[i] = outs[src[1]]
    inputs = tuple(leaves[k] for k in pg.grad_inputs) + tuple(pg.params)
    made = tuple(outs[i] for i in pg.diff_out)
    _C.record_grad(inputs, made, backward, pg.name)
    return outs


def _no_higher_order(pg, create_graph):
    if create_graph:
        raise RuntimeError(f"{pg.name}: gradients of gradients through a compiled piece are not supported; "
                           "call the function eagerly for higher-order gradients")


def _filled(pg, grads):
    """The output gradients, zeros where none reached an output."""
    return [g if g is not None else zeros(shape, dtype=dtype) for g, (shape, dtype) in zip(grads, pg.out_metas)]


def _backward(pg, residuals):
    def backward(grads, needs, create_graph):
        _no_higher_order(pg, create_graph)
        got = pg.compiled()(*residuals, *_filled(pg, grads))
        return [got[p] if p >= 0 and need else None for p, need in zip(pg.present, needs)]

    return backward


def _all_ones(grads, metas):
    """Whether every output gradient is there and holds ones (the seed the capture assumed)."""
    for g, (shape, dtype) in zip(grads, metas):
        if g is None or tuple(g.shape) != shape or g.dtype != dtype or not bool((g.asnumpy() == 1).all()):
            return False
    return True


def _first_backward(pg, first):
    def backward(grads, needs, create_graph):
        _no_higher_order(pg, create_graph)
        got = first.grads
        if got is not None and _all_ones(grads, pg.out_metas):
            first.grads = None  # (given out once: the engine may accumulate into what it receives)
        else:  # other output gradients: the capture's backward again, eagerly, on its own tape
            got = _C.grad(first.roots, first.targets, _filled(pg, grads), False)
        return [g if need else None for g, need in zip(got, needs)]

    return backward
