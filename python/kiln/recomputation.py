"""kiln.recompute (JAX's checkpoint / remat): a function whose activations are not kept for the
backward but computed again when the backward needs them.

Eagerly the function runs once, its results become the outputs of ONE node on the autograd tape
(kiln._C.record_grad) over its tensor arguments and the tensors requiring grad it reads (a Cell's
Parameters, found on the history it recorded, which is then dropped with its intermediates); the
node's gradient runs the function again, with the random generator as it was (dropout draws the
same mask), and differentiates that run. While a capture records (kiln.jit, kiln.trace) the ops
the function records are marked, as a Cell.recompute() cell's are, for the recompute pass
(src/passes/recompute.c), which drops their values after the forward and computes them again
before the backward reads them.
"""
import functools

from . import _C, tree_util
from .grad_mode import enable_grad, is_grad_enabled


def recompute(fn=None):
    """fn wrapped so that its activations are recomputed for the backward instead of kept (also a
    decorator: @kiln.recompute). Results and gradients are those of fn itself; the memory the
    backward would keep for fn's intermediates is freed after the forward, at the cost of running
    fn twice. fn's arguments may be pytrees (kiln.tree_util) of tensors and other values; tensors
    fn reads from elsewhere (Parameters, closures) get their gradients too. Tensors fn reads must
    not be changed in place between the forward and the backward (an argument changed so is an
    error; a closure's is not seen)."""
    if fn is None:
        return recompute
    if not callable(fn):
        raise TypeError(f"recompute: expected a function or a Cell, got {type(fn).__name__}")

    def recomputed(*args, **kwargs):
        return call(fn, args, kwargs)

    functools.update_wrapper(recomputed, fn, updated=())  # (not a Cell's __dict__: its _jitted would leak)
    recomputed._kiln_recompute_of = fn
    return recomputed


def call(fn, args, kwargs):
    """fn(*args, **kwargs) with its activations recomputed for the backward."""
    mark = _C.recompute_begin()
    if mark is not None:  # a capture records: the recompute pass does it
        try:
            return fn(*args, **kwargs)
        finally:
            _C.recompute_end(mark)
    if not is_grad_enabled():
        return fn(*args, **kwargs)
    return _eager(fn, args, kwargs)


def call_construct(construct, args, kwargs):
    """A Cell.recompute() cell's construct called eagerly (kiln._C.CellBase's call)."""
    return call(construct, args, kwargs or {})


def _name(fn):
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def _eager(fn, args, kwargs):
    leaves, treedef = tree_util.tree_flatten((args, kwargs))
    # the tensor arguments that take gradients: each becomes a fresh leaf the run is differentiated at
    grad_at = [k for k, x in enumerate(leaves) if isinstance(x, _C.TensorBase) and x.requires_grad]
    inputs = [leaves[k] for k in grad_at]
    versions = [(k, leaves[k], leaves[k]._version) for k, x in enumerate(leaves) if isinstance(x, _C.TensorBase)]
    state = _C.random_state()

    def run(connected=False):
        """fn, recording its history, on fresh leaves of the differentiable arguments (connected:
        on the arguments themselves, so that the history reaches theirs): (result, the tensors
        standing for the differentiable arguments)."""
        fresh = list(leaves)
        for k in grad_at if not connected else ():
            fresh[k] = leaves[k].detach()
            fresh[k].requires_grad_(True)
        a, kw = treedef.unflatten(fresh)
        with enable_grad():
            out = fn(*a, **kw)
        return out, [fresh[k] for k in grad_at]

    since = _C.grad_clock()
    out, aliases = run()
    out_leaves, out_def = tree_util.tree_flatten(out)
    diff = [k for k, x in enumerate(out_leaves) if isinstance(x, _C.TensorBase) and x.requires_grad]
    if not diff:
        return out
    found, outer = _C.grad_leaves(tuple(out_leaves[k] for k in diff), since, tuple(aliases))
    if outer is not None:
        raise ValueError(f"recompute({_name(fn)}): the function reads a tensor made outside it with its own "
                         f"gradient history (by {outer}) without taking it as an argument: pass it as an "
                         "argument so that its gradient can reach it")
    params = list(found)
    made = [out_leaves[k].detach() for k in diff]  # the results, without the history just recorded
    for k, m in zip(diff, made):
        out_leaves[k] = m
    result = out_def.unflatten(out_leaves)
    del out, aliases, found  # the forward's intermediates go with its history
    name = f"recompute({_name(fn)})"

    def backward(grads, needs, create_graph):
        for k, t, v in versions:
            if t._version != v:
                raise RuntimeError(f"{name}: the argument tensor {_argument(treedef, k)} was changed in place (by "
                                   "the function, or after it ran); its recomputation would read the new values")
        saved = _C.random_state()
        _C.set_random_state(state)  # random ops draw what the forward drew
        try:
            # gradients of gradients (create_graph): the recomputed history must reach the arguments'
            again, fresh = run(connected=create_graph)
        finally:
            _C.set_random_state(saved)
        again_leaves = tree_util.tree_leaves(again)
        outs = [again_leaves[k] for k in diff]
        pairs = [(o, g) for o, g in zip(outs, grads) if g is not None and o.requires_grad]
        targets = fresh + params
        if not pairs:
            return [None] * len(targets)
        gs = _C.grad([o for o, _ in pairs], targets, [g for _, g in pairs], create_graph)
        return [g if need else None for g, need in zip(gs, needs)]

    _C.record_grad(tuple(inputs) + tuple(params), tuple(made), backward, name)
    return result


def _argument(treedef, k):
    """The k-th leaf of (args, kwargs) as text: args[1], kwargs['x'], args[0]['w']."""
    path = treedef.leaf_paths()[k]
    return ("args" if path.startswith("[0]") else "kwargs") + path[3:]
