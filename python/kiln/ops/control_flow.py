"""Tensor-dependent control flow: cond and while_loop.

Eagerly they are plain Python control flow (the predicate read with bool()), so autograd
records the ops that actually run. While a trace records (kiln.jit), each branch, condition and
loop body is traced once into a subgraph and ONE `if` / `while` node joins the enclosing graph;
the compiled graph then decides at run time, and loops run entirely in C. Tensors the functions
read from outside (closures, Cell parameters) become extra inputs of the node, so gradients
reach them.
"""
from .. import _C, hooks, tree_util
from ..grad_mode import no_grad
from .array import arange, index_select


def _check_tensors(what, values):
    """values' leaves (kiln.tree_util) and their treedef; each leaf must be a Tensor. what: the
    name of one value, with {i} for its position."""
    leaves, treedef = tree_util.tree_flatten(tuple(values))
    if not all(isinstance(v, _C.TensorBase) for v in leaves):
        for i, v in enumerate(values):
            bad = [x for x in tree_util.tree_leaves(v) if not isinstance(x, _C.TensorBase)]
            if bad and bad[0] is v:
                raise TypeError(f"{what.format(i=i)} must be a Tensor, got {type(v).__name__}")
            if bad:
                raise TypeError(f"{what.format(i=i)} must be a Tensor or a pytree of Tensors, got a "
                                f"{type(v).__name__} holding a {type(bad[0]).__name__}")
    return leaves, treedef


class _Shown:
    """A leaf in a structure's description (repr "Tensor", or the leaf's type)."""

    def __init__(self, text):
        self.text = text

    def __repr__(self):
        return self.text


def _describe(treedef, leaves=None):
    """treedef as text, its leaves shown as Tensor (or the type of a leaf that is not one)."""
    shown = [_Shown("Tensor" if leaves is None or isinstance(x, _C.TensorBase) else repr(x)[:40])
             for x in (leaves if leaves is not None else range(treedef.num_leaves))]
    return repr(treedef.unflatten(shown))


def _meta(t):
    return f"{t.dtype.name} {tuple(t.shape)}"


def _one_element(what, value):
    if value.numel() != 1:
        raise ValueError(f"{what} must have one element, got shape {tuple(value.shape)}")


def _flat_outputs(what, out):
    leaves, treedef = tree_util.tree_flatten(out)
    if not leaves or not all(isinstance(x, _C.TensorBase) for x in leaves):
        raise TypeError(f"{what} must return a Tensor or a pytree of Tensors, got {_describe(treedef, leaves)}")
    return treedef, leaves


def refuse_value_reads(tracer, what):
    """A body that read a traced tensor's value into Python (a truth test, item(), int/float) would
    run every iteration or branch with what Python made of the value while it was traced: refused
    (kiln.jit's ast mode then runs the function eagerly; the other captures raise this)."""
    reads, where = tracer.value_reads()
    if reads:
        raise NotImplementedError(f"{what} reads a tensor's value into Python (a truth test, item(), int/float) "
                                  f"at {where or 'an unknown line'}; a compiled body cannot follow it (branch with "
                                  "kiln.ops.cond / switch, or compute it outside the body)")


def _trace_body(fn, args, what, setup=None):
    """fn(*args) traced into a body under a nested tracer: (tracer, output treedef, output leaves).
    setup(tracer), when given, runs before fn (in the trace)."""
    tracer = _C.Tracer(nested=True)
    try:
        aliases = [a.detach() for a in args]
        for a in aliases:
            tracer.add_input(a)
        with no_grad():
            if setup is not None:
                setup(tracer)
            out = fn(*aliases)
        refuse_value_reads(tracer, what)
        if isinstance(out, (bool, int)) and not isinstance(out, _C.TensorBase):
            return tracer, None, out
        treedef, leaves = _flat_outputs(what, out)
        tracer.finish_body(leaves)
    finally:
        tracer.end()
    return tracer, treedef, leaves


def _check_callables(op, **fns):
    for name, fn in fns.items():
        if not callable(fn):
            raise TypeError(f"{op}: {name} must be callable, got {type(fn).__name__}")


def cond(pred, true_fn, false_fn, operands=()):
    """true_fn(*operands) if pred else false_fn(*operands).

    pred: a one-element tensor (nonzero is true) or a Python bool/int (a static choice). operands:
    a tuple or list of tensors or pytrees of tensors (kiln.tree_util). Both branches return a
    tensor or a pytree of tensors of the same structure, dtypes and shapes, any number of them
    (compiled, past 32 the node carries them packed)."""
    if not isinstance(operands, (tuple, list)):
        raise TypeError(f"cond: operands must be a tuple or list of Tensors, got {type(operands).__name__}")
    operands = tuple(operands)
    in_leaves, in_def = _check_tensors("cond: operand {i}", operands)
    _check_callables("cond", true_fn=true_fn, false_fn=false_fn)
    if not isinstance(pred, (_C.TensorBase, bool, int)):
        raise TypeError(f"cond: pred must be a one-element Tensor, a bool or an int, got {type(pred).__name__}")
    if not isinstance(pred, _C.TensorBase):
        return (true_fn if pred else false_fn)(*operands)
    _one_element("cond: the predicate", pred)
    if not _C.is_tracing():
        return (true_fn if bool(pred) else false_fn)(*operands)
    if len(in_leaves) > _NODE_VALUES:  # more operands than a node's gradient takes: passed packed
        packed = _Packed(in_leaves)
        return cond(pred, lambda *p: true_fn(*in_def.unflatten(packed.unpack(p))),
                    lambda *p: false_fn(*in_def.unflatten(packed.unpack(p))), packed.pack(in_leaves))
    in_leaves = tuple(in_leaves)

    def on_leaves(fn):
        return lambda *leaves: fn(*in_def.unflatten(leaves))

    then_tr, then_def, then_out = _trace_body(on_leaves(true_fn), in_leaves, "cond: true_fn")
    else_tr, else_def, else_out = _trace_body(on_leaves(false_fn), in_leaves, "cond: false_fn")
    if then_def is None or else_def is None:
        raise TypeError("cond: true_fn and false_fn must return Tensors, got a Python "
                        f"{type(then_out if then_def is None else else_out).__name__}")
    if then_def != else_def:
        raise ValueError(f"cond: true_fn returns {_describe(then_def)} but false_fn returns {_describe(else_def)}")
    for i, (a, b) in enumerate(zip(then_out, else_out)):
        if not _C.same_meta(a, b):  # (checked again when a dynamic-shape graph is rebound)
            raise ValueError(f"cond: output {i} of true_fn is {_meta(a)} but output {i} of false_fn is {_meta(b)}")
    if len(then_out) <= _NODE_VALUES:
        outs = _C.apply_control("if", [then_tr, else_tr], (pred,) + in_leaves)
        return then_def.unflatten(outs)
    # more outputs than a node carries: the branches are traced again returning them packed
    packed = _Packed(then_out)

    def packing(fn):
        def branch(*leaves):
            return packed.pack(tree_util.tree_leaves(fn(*in_def.unflatten(leaves))))
        return branch

    then_tr, _, _ = _trace_body(packing(true_fn), in_leaves, "cond: true_fn")
    else_tr, _, _ = _trace_body(packing(false_fn), in_leaves, "cond: false_fn")
    outs = packed.unpack(_C.apply_control("if", [then_tr, else_tr], (pred,) + in_leaves))
    return then_def.unflatten(outs)


_NODE_VALUES = 32  # the most values a control-flow node carries (KILN_MAX_OUTPUTS); more are packed (_Packed)


def _loop_leaves(init_vals):
    """The loop values' tensors (the leaves of init_vals, a tuple/list of tensors or pytrees of
    tensors) and their treedef."""
    leaves, treedef = _check_tensors("while_loop: loop value {i}", init_vals)
    if not leaves:
        raise ValueError("while_loop: init_vals holds no Tensor")
    return treedef, leaves


def _next_values(body_fn, treedef, leaves, nvals):
    """body_fn on the loop values rebuilt from leaves: its new leaves, checked against the old."""
    vals = treedef.unflatten(leaves)
    new = body_fn(*vals)
    if nvals == 1 and tree_util.tree_structure(new) == tree_util.tree_structure(vals[0]):
        new = (new,)  # the one loop value, returned alone
    if not isinstance(new, (tuple, list)) or len(new) != nvals:
        got = f"{len(new)} values" if isinstance(new, (tuple, list)) else type(new).__name__
        raise ValueError(f"while_loop: body_fn must return {nvals} loop values like init_vals, got {got}")
    new_leaves, new_def = _check_tensors("while_loop: loop value {i} returned by body_fn", new)
    if new_def != treedef:
        raise ValueError(f"while_loop: body_fn returns {_describe(new_def)}, but init_vals is {_describe(treedef)}")
    for i, (a, b) in enumerate(zip(leaves, new_leaves)):
        if not _C.same_meta(a, b):  # (checked again when a dynamic-shape graph is rebound)
            raise ValueError(f"while_loop: body_fn returns loop value {i} as {_meta(b)}, but it is {_meta(a)} "
                             "in init_vals")
    return new_leaves


def _truth(value):
    if isinstance(value, _C.TensorBase) and value.size != 1:
        _one_element("while_loop: the value of cond_fn", value)
    return bool(value)


def while_loop(cond_fn, body_fn, init_vals):
    """Runs vals = body_fn(*vals) while cond_fn(*vals), starting from init_vals; returns the final
    values (a tuple, or a list when init_vals is a list).

    init_vals: a tuple/list whose items are tensors or pytrees of tensors (kiln.tree_util: nested
    tuples, lists, dicts, namedtuples, dataclasses, registered types, None; any number of them).
    cond_fn returns a one-element tensor (nonzero: go on) or a bool; body_fn returns values of
    init_vals' structure, dtypes and shapes (the value alone when there is one loop value).
    Compiled, past 32 tensors the node carries them packed (one tensor per dtype)."""
    return counted_while_loop(cond_fn, body_fn, init_vals, 0)


def counted_while_loop(cond_fn, body_fn, init_vals, trips):
    """while_loop whose trip count the caller knows (trips > 0; 0: unknown): kiln.ops.scan and
    fori_loop with int bounds. A compiled loop's gradient may then store each step's residuals
    rather than recompute them (kiln.set_context(loop_residual_budget=...)); recorded inside
    kiln.grad, the loop node itself stores them as it runs."""
    _check_callables("while_loop", cond_fn=cond_fn, body_fn=body_fn)
    if not isinstance(init_vals, (tuple, list)):
        raise TypeError(f"while_loop: init_vals must be a tuple or list of Tensors, got {type(init_vals).__name__}")
    as_list = isinstance(init_vals, list)
    if not init_vals:
        raise ValueError("while_loop: init_vals is empty")
    treedef, leaves = _loop_leaves(init_vals)
    nvals = len(init_vals)
    traced = _traced_while(cond_fn, body_fn, treedef, leaves, nvals, trips) if _C.is_tracing() else None
    if traced is not None:
        leaves = traced
    else:
        while _truth(cond_fn(*treedef.unflatten(leaves))):
            leaves = _next_values(body_fn, treedef, leaves, nvals)
    vals = treedef.unflatten(leaves)
    return list(vals) if as_list else vals


class _Packed:
    """More loop values than a node carries: one 1-D tensor per dtype, the values flattened and
    concatenated, taken apart again by index_select where they are used (slices would not do: a
    slice's gradient writes in place, which a loop body's gradient cannot hold)."""

    def __init__(self, leaves):
        self.groups = {}  # dtype -> positions of its leaves
        for k, t in enumerate(leaves):
            self.groups.setdefault(t.dtype, []).append(k)
        self.shapes = [tuple(t.shape) for t in leaves]
        if any(type(d) is not int for shape in self.shapes for d in shape):
            raise NotImplementedError(f"while_loop: {len(leaves)} loop values (more than {_NODE_VALUES}) whose sizes "
                                      "are dynamic; mark them static or carry fewer values")
        self.n = len(leaves)
        self.spans = {}  # position -> (start, end) of its elements in its dtype's packed tensor
        for ks in self.groups.values():
            at = 0
            for k in ks:
                size = 1
                for d in self.shapes[k]:
                    size *= d
                self.spans[k] = (at, at + size)
                at += size

    def pack(self, leaves):
        return [_C.shape.concat([leaves[k].reshape((-1,)) for k in ks], 0) for ks in self.groups.values()]

    def unpack(self, packed):
        out = [None] * self.n
        for p, ks in zip(packed, self.groups.values()):
            for k in ks:  # (the indices made where they are used: no captured tensor per value)
                out[k] = index_select(p, 0, arange(*self.spans[k], 1, dtype=_C.int64)).reshape(self.shapes[k])
        return out


def _traced_while(cond_fn, body_fn, treedef, leaves, nvals, trips):
    """One `while` node over the loop values' leaves (packed when there are more than a node
    carries): the final leaves, or None when cond_fn gives a Python bool (a static loop: run it in
    Python). When the bodies read more captured tensors needing gradients than the node's gradient
    carries beside the loop values, they are traced again reading those through packed copies."""
    packed = _Packed(leaves) if len(leaves) > _NODE_VALUES else None
    loop = leaves if packed is None else packed.pack(leaves)
    bodies = _trace_loop(cond_fn, body_fn, treedef, nvals, packed, loop, None)
    if bodies is None:
        return None
    captured = {}
    for tr in bodies:
        for t in tr.captured():
            captured.setdefault(id(t), t)
    needing = [t for t in captured.values() if t.requires_grad and t.dtype.is_floating_point]
    if len(loop) + len(captured) > _NODE_VALUES and len(needing) > 1:
        read_through = _Packed(needing)
        bodies = _trace_loop(cond_fn, body_fn, treedef, nvals, packed, loop,
                             (needing, read_through, read_through.pack(needing)))
    # inside kiln.grad the loop node itself keeps each step's residuals for its gradient (which then
    # does not run the loop again); elsewhere (a forward-only capture) it is the plain loop
    out = _C.apply_control("while", list(bodies), loop, trips,
                           trips > 0 and hooks.differentiating is not None and hooks.differentiating())
    return list(out) if packed is None else packed.unpack(out)


def _trace_loop(cond_fn, body_fn, treedef, nvals, packed, loop, read_through):
    """The cond and body tracers of a while node (None when cond_fn gives a Python bool).
    read_through: None, or (captured tensors, their _Packed, the packed tensors): each body reads
    those tensors as pieces of the packed ones (so the node lifts one tensor per dtype for them,
    and their gradients reach them through the packing)."""
    def unpacked(values):
        return list(values) if packed is None else packed.unpack(values)

    def setup(tracer):
        if read_through is not None:
            tensors, how, packs = read_through
            for t, piece in zip(tensors, how.unpack(packs)):
                tracer.bind(t, piece)

    def cond_of(*values):
        return cond_fn(*treedef.unflatten(unpacked(values)))

    cond_tr, cond_def, cond_out = _trace_body(cond_of, loop, "while_loop: cond_fn", setup)
    if cond_def is None:
        return None
    if cond_def.num_nodes != 1:
        raise TypeError(f"while_loop: cond_fn must return one Tensor, got {_describe(cond_def)}")
    _one_element("while_loop: the value of cond_fn", cond_out[0])
    tracer = _C.Tracer(nested=True)
    try:
        aliases = [v.detach() for v in loop]
        for a in aliases:
            tracer.add_input(a)
        with no_grad():
            setup(tracer)
            new = _next_values(body_fn, treedef, unpacked(aliases), nvals)
            if packed is not None:
                new = packed.pack(new)
        refuse_value_reads(tracer, "while_loop: body_fn")
        tracer.finish_body(list(new))
    finally:
        tracer.end()
    return cond_tr, tracer
