"""Tensor-dependent control flow: cond and while_loop.

Eagerly they are plain Python control flow (the predicate read with bool()), so autograd
records the ops that actually run. While a trace records (kiln.jit), each branch, condition and
loop body is traced once into a subgraph and ONE `if` / `while` node joins the enclosing graph;
the compiled graph then decides at run time, and loops run entirely in C. Tensors the functions
read from outside (closures, Cell parameters) become extra inputs of the node, so gradients
reach them.
"""
from .. import _C
from ..grad_mode import no_grad
from .array import arange, index_select


def _tree():
    from ..jit import tree  # kiln.jit imports kiln.ops: resolved at call time

    return tree


def _check_tensors(what, values):
    for i, v in enumerate(values):
        if not isinstance(v, _C.TensorBase):
            raise TypeError(f"{what}: operand {i} must be a Tensor, got {type(v).__name__}")


def _meta(t):
    return f"{t.dtype.name} {tuple(t.shape)}"


def _one_element(what, value):
    if value.numel() != 1:
        raise ValueError(f"{what} must have one element, got shape {tuple(value.shape)}")


def _flat_outputs(what, out):
    leaves = []
    spec = _tree().flatten(out, leaves)
    if not leaves or any(s[0] == "const" for s in _specs(spec)):
        raise TypeError(f"{what} must return a Tensor or a (nested) tuple/list of Tensors, got {_tree().describe(spec)}")
    return spec, leaves


def _specs(spec):
    if spec == "T":
        return
    if spec[0] == "const":
        yield spec
        return
    for s in spec[-1]:
        yield from _specs(s)


def refuse_value_reads(tracer, what):
    """A body that read a traced tensor's value into Python (a truth test, item(), int/float) would
    run every iteration or branch with what Python made of the value while it was traced: refused
    (kiln.jit's ast mode then runs the function eagerly; the other captures raise this)."""
    reads, where = tracer.value_reads()
    if reads:
        raise NotImplementedError(f"{what} reads a tensor's value into Python (a truth test, item(), int/float) "
                                  f"at {where or 'an unknown line'}; a compiled body cannot follow it (branch with "
                                  "kiln.ops.cond / switch, or compute it outside the body)")


def _trace_body(fn, args, what):
    """fn(*args) traced into a body under a nested tracer: (tracer, output spec, output leaves)."""
    tracer = _C.Tracer(nested=True)
    try:
        aliases = [a.detach() for a in args]
        for a in aliases:
            tracer.add_input(a)
        with no_grad():
            out = fn(*aliases)
        refuse_value_reads(tracer, what)
        if isinstance(out, (bool, int)) and not isinstance(out, _C.TensorBase):
            return tracer, None, out
        spec, leaves = _flat_outputs(what, out)
        tracer.finish_body(leaves)
    finally:
        tracer.end()
    return tracer, spec, leaves


def _check_callables(op, **fns):
    for name, fn in fns.items():
        if not callable(fn):
            raise TypeError(f"{op}: {name} must be callable, got {type(fn).__name__}")


def cond(pred, true_fn, false_fn, operands=()):
    """true_fn(*operands) if pred else false_fn(*operands).

    pred: a one-element tensor (nonzero is true) or a Python bool/int (a static choice). Both
    branches return a tensor or a (nested) tuple/list of tensors of the same structure, dtypes
    and shapes, any number of them (compiled, past 32 the node carries them packed)."""
    if not isinstance(operands, (tuple, list)):
        raise TypeError(f"cond: operands must be a tuple or list of Tensors, got {type(operands).__name__}")
    operands = tuple(operands)
    _check_tensors("cond", operands)
    _check_callables("cond", true_fn=true_fn, false_fn=false_fn)
    if not isinstance(pred, (_C.TensorBase, bool, int)):
        raise TypeError(f"cond: pred must be a one-element Tensor, a bool or an int, got {type(pred).__name__}")
    if not isinstance(pred, _C.TensorBase):
        return (true_fn if pred else false_fn)(*operands)
    _one_element("cond: the predicate", pred)
    if not _C.is_tracing():
        return (true_fn if bool(pred) else false_fn)(*operands)
    if len(operands) > _NODE_VALUES:  # more operands than a node's gradient takes: passed packed
        packed = _Packed(operands)
        return cond(pred, lambda *p: true_fn(*packed.unpack(p)), lambda *p: false_fn(*packed.unpack(p)),
                    packed.pack(operands))
    then_tr, then_spec, then_out = _trace_body(true_fn, operands, "cond: true_fn")
    else_tr, else_spec, else_out = _trace_body(false_fn, operands, "cond: false_fn")
    if then_spec is None or else_spec is None:
        raise TypeError("cond: true_fn and false_fn must return Tensors, got a Python "
                        f"{type(then_out if then_spec is None else else_out).__name__}")
    if then_spec != else_spec:
        raise ValueError(f"cond: true_fn returns {_tree().describe(then_spec)} but false_fn returns "
                         f"{_tree().describe(else_spec)}")
    for i, (a, b) in enumerate(zip(then_out, else_out)):
        if not _C.same_meta(a, b):  # (checked again when a dynamic-shape graph is rebound)
            raise ValueError(f"cond: output {i} of true_fn is {_meta(a)} but output {i} of false_fn is {_meta(b)}")
    if len(then_out) <= _NODE_VALUES:
        outs = _C.apply_control("if", [then_tr, else_tr], (pred,) + operands)
        return _tree().unflatten(then_spec, list(outs))[0]
    # more outputs than a node carries: the branches are traced again returning them packed
    packed = _Packed(then_out)

    def packing(fn):
        def branch(*args):
            leaves = []
            _tree().flatten(fn(*args), leaves)
            return packed.pack(leaves)
        return branch

    then_tr, _, _ = _trace_body(packing(true_fn), operands, "cond: true_fn")
    else_tr, _, _ = _trace_body(packing(false_fn), operands, "cond: false_fn")
    outs = packed.unpack(_C.apply_control("if", [then_tr, else_tr], (pred,) + operands))
    return _tree().unflatten(then_spec, outs)[0]


_NODE_VALUES = 32  # the most values a control-flow node carries (KILN_MAX_OUTPUTS); more are packed (_Packed)


def _loop_leaves(init_vals):
    """The loop values' tensors (leaves of init_vals, a tuple/list whose items are tensors or
    nested tuples/lists/dicts of tensors) and their structure."""
    for i, v in enumerate(init_vals):
        if not isinstance(v, (_C.TensorBase, tuple, list, dict)):
            raise TypeError(f"while_loop: loop value {i} must be a Tensor, got {type(v).__name__}")
    leaves = []
    spec = _tree().flatten(tuple(init_vals), leaves)
    if any(s[0] == "const" for s in _specs(spec)):
        raise TypeError(f"while_loop: loop values must be Tensors or nested tuples/lists/dicts of Tensors, got "
                        f"{_tree().describe(spec)}")
    if not leaves:
        raise ValueError("while_loop: init_vals holds no Tensor")
    return spec, leaves


def _next_values(body_fn, spec, leaves, nvals):
    """body_fn on the loop values rebuilt from leaves: its new leaves, checked against the old."""
    vals = _tree().unflatten(spec, list(leaves))[0]
    new = body_fn(*vals)
    if nvals == 1 and (isinstance(new, (_C.TensorBase, dict)) or (
            isinstance(new, (tuple, list)) and not isinstance(vals[0], _C.TensorBase) and len(new) != 1)):
        new = (new,)  # the one loop value, returned alone
    if not isinstance(new, (tuple, list)) or len(new) != nvals:
        got = f"{len(new)} values" if isinstance(new, (tuple, list)) else type(new).__name__
        raise ValueError(f"while_loop: body_fn must return {nvals} loop values like init_vals, got {got}")
    for i, b in enumerate(new):
        if not isinstance(b, (_C.TensorBase, tuple, list, dict)):
            raise TypeError(f"while_loop: loop value {i} returned by body_fn must be a Tensor, got {type(b).__name__}")
    new_leaves = []
    new_spec = _tree().flatten(tuple(new), new_leaves)
    if new_spec != spec:
        raise ValueError(f"while_loop: body_fn returns {_tree().describe(new_spec)}, but init_vals is "
                         f"{_tree().describe(spec)}")
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

    init_vals: a tuple/list whose items are tensors or nested tuples/lists/dicts of tensors (any
    number of them). cond_fn returns a one-element tensor (nonzero: go on) or a bool; body_fn
    returns values of init_vals' structure, dtypes and shapes (a lone tensor when there is one
    loop value). Compiled, past 32 tensors the node carries them packed (one tensor per dtype)."""
    _check_callables("while_loop", cond_fn=cond_fn, body_fn=body_fn)
    if not isinstance(init_vals, (tuple, list)):
        raise TypeError(f"while_loop: init_vals must be a tuple or list of Tensors, got {type(init_vals).__name__}")
    as_list = isinstance(init_vals, list)
    if not init_vals:
        raise ValueError("while_loop: init_vals is empty")
    spec, leaves = _loop_leaves(init_vals)
    nvals = len(init_vals)
    traced = _traced_while(cond_fn, body_fn, spec, leaves, nvals) if _C.is_tracing() else None
    if traced is not None:
        leaves = traced
    else:
        while _truth(cond_fn(*_tree().unflatten(spec, list(leaves))[0])):
            leaves = _next_values(body_fn, spec, leaves, nvals)
    vals = _tree().unflatten(spec, list(leaves))[0]
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


def _traced_while(cond_fn, body_fn, spec, leaves, nvals):
    """One `while` node over the loop values' leaves (packed when there are more than a node
    carries): the final leaves, or None when cond_fn gives a Python bool (a static loop: run it in Python)."""
    packed = _Packed(leaves) if len(leaves) > _NODE_VALUES else None
    loop = leaves if packed is None else packed.pack(leaves)

    def unpacked(values):
        return list(values) if packed is None else packed.unpack(values)

    def cond_of(*values):
        return cond_fn(*_tree().unflatten(spec, unpacked(values))[0])

    cond_tr, cond_spec, cond_out = _trace_body(cond_of, loop, "while_loop: cond_fn")
    if cond_spec is None:
        return None
    if cond_spec != "T":
        raise TypeError(f"while_loop: cond_fn must return one Tensor, got {_tree().describe(cond_spec)}")
    _one_element("while_loop: the value of cond_fn", cond_out[0])
    tracer = _C.Tracer(nested=True)
    try:
        aliases = [v.detach() for v in loop]
        for a in aliases:
            tracer.add_input(a)
        with no_grad():
            new = _next_values(body_fn, spec, unpacked(aliases), nvals)
            if packed is not None:
                new = packed.pack(new)
        refuse_value_reads(tracer, "while_loop: body_fn")
        tracer.finish_body(list(new))
    finally:
        tracer.end()
    return unpacked(_C.apply_control("while", [cond_tr, tracer], loop))
