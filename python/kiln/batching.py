"""kiln.vmap and kiln.jacrev: functions mapped over a batch axis, as one batched graph.

vmap traces the function once on one example (a nested trace: kiln.ops.while_loop's bodies are
traced the same way), batches the recording with each op's batching rule (the KILN_BATCH lines
of src/ops/ops.def, applied by the graph transform of src/passes/vmap.c) and runs the batched
graph's nodes through the dispatcher: eagerly they run kernel by kernel (and autograd records
them), under kiln.jit or kiln.trace they join the enclosing graph. Nested vmap is the transform
applied twice. jacrev is vmap over reverse-mode gradients, the cotangents the rows of the identity.
"""
import functools
import warnings

from . import _C, hooks
from ._optable import INFO
from .autograd import value_and_grad_on_tape
from .grad_mode import no_grad


class VmapFallbackWarning(UserWarning):
    """An op of a vmapped function has no batching rule for its inputs: it runs once per example."""


class VmapControlFlowError(NotImplementedError):
    """A vmapped function holds control flow (ops.cond, ops.while_loop), which vmap cannot batch
    yet. kiln.hessian catches it and takes one pass per basis vector instead (as kiln.jacfwd)."""


class VmapValueReadError(ValueError):
    """A vmapped function reads a tensor's value into Python (a truth test, item()): vmap refuses
    it, as the value may differ per example. kiln.hessian catches it and takes one pass per output
    element instead."""


_SEQ = (tuple, list)


def _leaves(obj, into):
    """obj's tensors in order (tuples, lists and dict values walked); the structure to rebuild it."""
    if isinstance(obj, _C.TensorBase):
        into.append(obj)
        return None
    if isinstance(obj, _SEQ):
        return (type(obj), [_leaves(o, into) for o in obj])
    if isinstance(obj, dict):
        return (dict, [(k, _leaves(v, into)) for k, v in obj.items()])
    return ("const", obj)


def _rebuild(spec, it):
    if spec is None:
        return next(it)
    kind, items = spec
    if kind == "const":
        return items
    if kind is dict:
        return {k: _rebuild(s, it) for k, s in items}
    built = [_rebuild(s, it) for s in items]
    return built if kind is list else kind(built) if kind is tuple else kind(*built)


def _axes_for(obj, axes, where, into):
    """Appends one axis per tensor of obj (in _leaves' order): axes is an int or None for the
    whole of obj, or a tuple / list / dict matching its structure."""
    if axes is None or (isinstance(axes, int) and not isinstance(axes, bool)):
        n = []
        _leaves(obj, n)
        if axes is not None and not n:
            raise ValueError(f"vmap: in_axes {axes} for {where}, which holds no Tensor; give None")
        into.extend([axes] * len(n))
        return
    if isinstance(axes, _SEQ) and isinstance(obj, _SEQ) and len(axes) == len(obj):
        for k, (o, a) in enumerate(zip(obj, axes)):
            _axes_for(o, a, f"{where}[{k}]", into)
        return
    if isinstance(axes, dict) and isinstance(obj, dict) and axes.keys() == obj.keys():
        for k, o in obj.items():
            _axes_for(o, axes[k], f"{where}[{k!r}]", into)
        return
    raise ValueError(f"vmap: in_axes {axes!r} does not match the structure of {where} ({type(obj).__name__}): "
                     f"give an int, None, or a tuple / list / dict of them shaped like the argument")


def _in_axes(args, in_axes):
    """Per tensor leaf of args: its batch axis (made non-negative) or None, and the leaf's name."""
    if isinstance(in_axes, _SEQ):
        if len(in_axes) != len(args):
            raise ValueError(f"vmap: in_axes has {len(in_axes)} entries for {len(args)} arguments")
        per_arg = list(in_axes)
    elif in_axes is None or (isinstance(in_axes, int) and not isinstance(in_axes, bool)):
        per_arg = [in_axes] * len(args)
    else:
        raise TypeError(f"vmap: in_axes must be an int, None, or a tuple / list of them, got {type(in_axes).__name__}")
    axes, names = [], []
    for k, (a, ax) in enumerate(zip(args, per_arg)):
        before = len(axes)
        if ax is not None and not isinstance(a, (_C.TensorBase, tuple, list, dict)):
            raise ValueError(f"vmap: in_axes {ax!r} for argument {k}, a {type(a).__name__}: only Tensors are mapped "
                             f"over; give None")
        _axes_for(a, ax, f"argument {k}", axes)
        names.extend([f"argument {k}"] * (len(axes) - before))
    return axes, names


def _normalized(axis, ndim, what):
    if not -ndim <= axis < ndim:
        raise ValueError(f"vmap: in_axes {axis} is out of bounds for {what} of rank {ndim} "
                         f"(it must be in [{-ndim}, {ndim}))")
    return axis % ndim


def _batch_size(leaves, axes, names):
    size, first = None, None
    for t, ax, name in zip(leaves, axes, names):
        if ax is None:
            continue
        n = t.shape[ax]
        if size is None:
            size, first = n, name
        elif n != size:
            raise ValueError(f"vmap: the mapped axes have different sizes: {first} has {size} along its in_axes, "
                             f"{name} has {n}")
    if size is None:
        raise ValueError("vmap: no argument is mapped over (in_axes is None for every Tensor)")
    if size == 0:
        raise ValueError("vmap: the mapped axis has size 0")
    return size


def _out_axes(out_axes, spec, nout):
    """Per output tensor: its batch axis or None (from an int, None, or a tuple / list per output)."""
    if out_axes is None or (isinstance(out_axes, int) and not isinstance(out_axes, bool)):
        return [out_axes] * nout
    if not isinstance(out_axes, _SEQ):
        raise TypeError(f"vmap: out_axes must be an int, None, or a tuple / list of them, got {type(out_axes).__name__}")
    if spec is None or spec[0] not in (tuple, list) or len(spec[1]) != len(out_axes):
        raise ValueError(f"vmap: out_axes has {len(out_axes)} entries, which does not match the function's outputs")
    axes = []
    for s, ax in zip(spec[1], out_axes):
        n = []
        _rebuild_count(s, n)
        sub = _out_axes(ax, s, len(n))
        axes.extend(sub)
    return axes


def _rebuild_count(spec, into):
    if spec is None:
        into.append(1)
        return
    kind, items = spec
    if kind == "const":
        return
    for s in (items if kind is not dict else [s for _, s in items]):
        _rebuild_count(s, into)


def _trace_example(fn, examples, arg_spec):
    """fn traced on one example: (recorded Graph, output structure)."""
    tracer = _C.Tracer(nested=True)
    tracer.keep_undo()  # the trace runs fn's in-place writes for real: put them back afterwards
    try:
        aliases = [e.detach() for e in examples]
        for a in aliases:
            tracer.add_input(a)
        out = fn(*_rebuild(arg_spec, iter(aliases)))
        leaves = []
        spec = _leaves(out, leaves)
        if not leaves:
            raise TypeError(f"vmap: the function must return Tensors (a Tensor, or tuples / lists / dicts of them), "
                            f"got {type(out).__name__}")
        consts = []
        _find_consts(spec, consts)
        if consts:
            raise TypeError(f"vmap: the function returned a {type(consts[0]).__name__} beside its Tensors; "
                            f"vmap returns Tensors only")
        reads, loc = tracer.value_reads()
        if reads:
            raise VmapValueReadError(f"vmap: the function reads a tensor's value into Python ({loc or 'a truth test, item()'}),"
                                     f" which differs per example; use ops.where / ops.select instead of Python "
                                     f"control flow")
        graph = tracer.finish_graph(leaves)
    finally:
        tracer.end()
        tracer.undo_writes()
    return graph, spec, [tuple(t.shape) for t in leaves]


def _find_consts(spec, into):
    if spec is None:
        return
    kind, items = spec
    if kind == "const":
        into.append(items)
        return
    for s in (items if kind is not dict else [s for _, s in items]):
        _find_consts(s, into)


def _example(t, axis):
    """Element 0 of t along axis (outside any recording: only its shape and values are needed)."""
    token = _C.suspend_tracing()
    try:
        with no_grad():
            return t.detach()[(slice(None),) * axis + (0,)].contiguous()
    finally:
        _C.resume_tracing(token)


def _call_batched(fn, in_axes, out_axes, args, extra=(), extra_axes=()):
    """fn(*extra, *args) for every example: extra are tensors already mapped at extra_axes."""
    arg_spec = _leaves(tuple(args), [])
    leaves = []
    _leaves(tuple(args), leaves)
    axes, names = _in_axes(args, in_axes)
    leaves = list(extra) + leaves
    axes = list(extra_axes) + axes
    names = [f"parameter {k}" for k in range(len(extra))] + names
    axes = [None if ax is None else _normalized(ax, t.ndim, name) for t, ax, name in zip(leaves, axes, names)]
    batch = _batch_size(leaves, axes, names)
    examples = [t if ax is None else _example(t, ax) for t, ax in zip(leaves, axes)]
    nextra = len(extra)

    def on_example(*flat):
        return fn(*flat[:nextra], *_rebuild(arg_spec, iter(flat[nextra:])))

    graph, out_spec, out_shapes = _trace_example(on_example, examples, (tuple, [None] * len(examples)))
    oaxes = _out_axes(out_axes, out_spec, len(out_shapes))
    for k, ax in enumerate(oaxes):
        if ax is not None:
            r = len(out_shapes[k]) + 1
            if not -r <= ax < r:
                raise ValueError(f"vmap: out_axes {ax} is out of bounds for output {k} of rank {r} "
                                 f"(it must be in [{-r}, {r}))")
            oaxes[k] = ax % r
    try:
        batched, slow = _C.batch_graph(graph, batch, axes, oaxes)
    except NotImplementedError as e:
        if any(INFO[node[0]].control for node in graph.structure()[2]):
            raise VmapControlFlowError(str(e)) from None
        raise
    if slow:
        warnings.warn(f"vmap: no batching rule applies to {', '.join(slow)} here: it runs once per example "
                      f"(the slow path)", VmapFallbackWarning, stacklevel=3)
    outs = _C.apply_graph(batched, leaves)
    return _rebuild(out_spec, iter(outs))


def _wrapper(fn, call, what):
    def wrapper(*args, **kwargs):
        if kwargs:
            raise TypeError(f"{what}: keyword arguments are not supported; pass them positionally")
        return call(args)

    if callable(fn) and hasattr(fn, "__code__"):
        functools.update_wrapper(wrapper, fn, updated=())
    wrapper.__module__ = __name__
    # capture runs it as kiln's own code (as it runs a kiln.grad wrapper): its ops are recorded
    wrapper._kiln_grad_of = fn
    return wrapper


def vmap(fn, in_axes=0, out_axes=0):
    """fn mapped over a batch axis of its arguments (mindspore.vmap): in_axes an int, None (the
    argument is shared by every example), or a tuple / list with one entry per argument (nested like
    a tuple / list / dict argument); negative axes count from the end. out_axes likewise per output
    (None: an output that does not vary over the batch). fn may also be a CellList of identical
    cells: the ensemble, their parameters stacked, the batch one example per cell."""
    if _is_cell_list(fn):
        return _ensemble(fn, in_axes, out_axes)
    if not callable(fn):
        raise TypeError(f"vmap: fn must be callable, got {type(fn).__name__}")
    return _wrapper(fn, lambda args: _call_batched(fn, in_axes, out_axes, args), "vmap")


def _is_cell_list(obj):
    from .nn.cell import CellList

    return isinstance(obj, CellList)


def _ensemble(cells, in_axes, out_axes):
    from .ops.array import stack

    members = list(cells)
    if not members:
        raise ValueError("vmap: the CellList is empty")
    first = members[0]
    names = [n for n, _ in first.parameters_and_names()]
    for k, c in enumerate(members[1:], 1):
        if type(c) is not type(first):
            raise ValueError(f"vmap: cell {k} of the CellList is a {type(c).__name__}, cell 0 a "
                             f"{type(first).__name__}: an ensemble needs identical cells")
        params = dict(c.parameters_and_names())
        if [n for n in params] != names or any(tuple(params[n].shape) != tuple(p.shape)
                                               for n, p in first.parameters_and_names()):
            raise ValueError(f"vmap: cell {k} of the CellList has other parameters than cell 0: an ensemble needs "
                             f"identical cells")
    own = [p for _, p in first.parameters_and_names()]

    def member(*flat):
        return _call_with_params(first, own, flat[:len(own)], flat[len(own):])

    def call(args):
        stacked = [stack([dict(c.parameters_and_names())[n] for c in members], 0) for n in names]
        return _call_batched(member, in_axes, out_axes, args, extra=stacked, extra_axes=[0] * len(stacked))

    return _wrapper(cells, call, "vmap")


def _call_with_params(cell, own, params, args):
    """cell(*args) with its parameters read as `params` (the traced inputs of one ensemble member):
    each of its cells' parameter slots (_params and the attribute) holding one of `own` holds the
    matching tensor meanwhile, written around Cell's attribute machinery (no version bump: the
    cell is the same when the call returns)."""
    by_id = {id(p): q for p, q in zip(own, params)}
    slots = [(c, name, p, c.__dict__.get(name) is p) for _, c in cell.cells_and_names()
             for name, p in c._params.items() if p is not None and id(p) in by_id]
    try:
        for c, name, p, attr in slots:
            c._params[name] = by_id[id(p)]
            if attr:
                c.__dict__[name] = by_id[id(p)]
        return cell(*args)
    finally:
        for c, name, p, attr in slots:
            c._params[name] = p
            if attr:
                c.__dict__[name] = p


def jacrev(fn, grad_position=0, has_aux=False):
    """The Jacobian of fn (mindspore.jacrev): for each output y and argument x at grad_position, a
    tensor of shape y.shape + x.shape; a tuple over positions when grad_position is a tuple, and a
    tuple over outputs when fn returns several. Reverse mode, batched: one vmapped backward over the
    rows of the identity, not one gradient call per output element. has_aux: fn returns
    (output, aux...), and jacrev returns (jacobian, aux)."""
    if not callable(fn):
        raise TypeError(f"jacrev: fn must be callable, got {type(fn).__name__}")
    if not isinstance(has_aux, bool):
        raise TypeError(f"jacrev: has_aux must be True or False, got {has_aux!r}")

    def call(args):
        from .ops.array import eye

        with no_grad():
            out = fn(*args)
        if has_aux:
            if not isinstance(out, tuple) or len(out) < 2:
                raise ValueError("jacrev: with has_aux=True the function must return a tuple (output, aux, ...)")
            out, aux = out[0], out[1:]
            aux = aux[0] if len(aux) == 1 else aux
        ys = []
        yspec = _leaves(out, ys)
        if not ys:
            raise TypeError(f"jacrev: the function must return a Tensor (or tensors), got {type(out).__name__}")
        sizes = [y.numel() for y in ys]
        total = sum(sizes)
        basis = eye(total, total, dtype=ys[0].dtype)
        cts, off = [], 0
        for y, n in zip(ys, sizes):
            cts.append(basis[:, off:off + n].reshape((total,) + tuple(y.shape)))
            off += n

        def vjp(*flat):
            cts_, inputs = flat[:len(ys)], flat[len(ys):]
            sens = cts_[0] if yspec is None else _rebuild(yspec, iter(cts_))
            _, grads = value_and_grad_on_tape(fn, grad_position, None, has_aux, tuple(inputs) + (sens,), {},
                                              sens_param=True)
            return grads

        single = isinstance(grad_position, int)
        grads = _call_batched(vjp, None, 0, args, extra=cts, extra_axes=[0] * len(cts))
        per_pos = (grads,) if single else tuple(grads)
        positions = (grad_position,) if single else tuple(grad_position)
        jac = []
        for y, n, o in zip(ys, sizes, _offsets(sizes)):
            row = tuple(g[o:o + n].reshape(tuple(y.shape) + tuple(args[p].shape))
                        for g, p in zip(per_pos, positions))
            jac.append(row[0] if single else row)
        result = jac[0] if yspec is None else tuple(jac)
        return (result, aux) if has_aux else result

    return _wrapper(fn, call, "jacrev")


def _offsets(sizes):
    off = 0
    for n in sizes:
        yield off
        off += n


# kiln.jacfwd and kiln.hessian (kiln.derivatives) batch through them
hooks.vmap, hooks.jacrev = vmap, jacrev
hooks.vmap_refusals = (VmapControlFlowError, VmapValueReadError)
