"""Forward and reverse transforms, MindSpore's signatures (and JAX's linearize and hessian):
jvp, vjp, linearize, jacfwd, hessian.

Forward mode records the function once into a graph (a nested Tracer, as control flow's bodies),
then runs that graph again with each op's JVP rule (ops.def KILN_JVP) after it (kiln._C.jvp,
src/ir/jvp.c): outputs and tangents in one pass, recorded by kiln.jit / kiln.trace when they are
capturing. vjp is the eager tape (kiln._C.grad). jacfwd maps jvp over the input basis with kiln.vmap
(one batched graph: _jacobian_batched); hessian is jacfwd of kiln.jacrev, forward over reverse.
kiln.vmap and kiln.jacrev live above this module (kiln.batching) and reach it through kiln.hooks,
registered when kiln is imported. What vmap refuses (control flow; in jacrev a value read into
Python) takes the loops: a linear-part run per basis vector, a vjp_fn call per output element."""
import functools

from . import _C, hooks
from .autograd import grad_nesting
from .grad_mode import enable_grad, is_grad_enabled, no_grad
from .ops import array as _array
from .ops.array_more import movedim as _movedim


def _tree():
    """kiln.jit.tree, at call time: importing it loads kiln.jit, which must come after kiln.ops
    (kiln.ops imports this module; loading kiln.jit in the middle of kiln.ops changed what its
    capture bound, and .grad writes of compiled functions came out wrong)."""
    from .jit import tree

    return tree


def _flat(obj, what):
    """The tensors of obj (a tensor or a tuple / list / dict / registered pytree of them) and its
    structure; anything but a float tensor as a leaf is an error naming `what`."""
    leaves = []
    spec = _tree().flatten(obj, leaves)
    for k, t in enumerate(leaves):
        if not t.dtype.is_floating_point:
            raise TypeError(f"{what}: tensor {k} has dtype {t.dtype}; only float tensors are differentiated")
    if _has_constants(spec):
        raise TypeError(f"{what}: expected Tensors (or tuples / lists / dicts of them), got {_tree().describe(spec)}")
    return spec, leaves


def _has_constants(spec):
    if isinstance(spec, tuple):
        if spec and spec[0] == "const":
            return True
        return any(_has_constants(s) for s in spec)
    return False


def _same_structure(spec, tspec, leaves, tleaves, what):
    if spec != tspec:
        raise ValueError(f"{what}: the tangents are {_tree().describe(tspec)}, the inputs {_tree().describe(spec)}")
    for k, (x, t) in enumerate(zip(leaves, tleaves)):
        if tuple(x.shape) != tuple(t.shape) or x.dtype != t.dtype:
            raise ValueError(f"{what}: tangent {k} has shape {list(t.shape)} and dtype {t.dtype}, its input "
                             f"{list(x.shape)} and {x.dtype}")


def _zero_constants(obj):
    """obj with its Python numbers made 0 of their type (the tangent, or Jacobian, of a constant
    output), in tuples, lists and dicts; tensors and other objects as they are."""
    if isinstance(obj, _C.TensorBase):
        return obj
    if isinstance(obj, (bool, int, float, complex)):
        return type(obj)(0)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_zero_constants(o) for o in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(_zero_constants(o) for o in obj)
    if isinstance(obj, dict):
        return type(obj)((k, _zero_constants(v)) for k, v in obj.items())
    return obj


def _split_aux(out, has_aux, what):
    """(the differentiated output, aux or None): with has_aux fn returns (output, aux, ...)."""
    if not has_aux:
        return out, None
    if not isinstance(out, tuple) or len(out) < 2:
        raise ValueError(f"{what}: with has_aux=True the function must return a tuple (output, aux, ...)")
    return out[0], (out[1] if len(out) == 2 else tuple(out[1:]))


def _record(fn, spec, leaves, has_aux, what):
    """fn on the inputs rebuilt from leaves, recorded by a nested Tracer: (tracer, output structure,
    output count, aux structure). The aux tensors are outputs of the recording too (after the
    differentiated ones), so they are computed again with it, never taken from the recording run."""
    tracer = _C.Tracer(nested=True)
    try:
        tracer.keep_undo()  # the recording run's in-place writes are undone: the pass that counts redoes them
        aliases = [a.detach() for a in leaves]
        for a in aliases:
            tracer.add_input(a)
        with no_grad():
            out = fn(*_tree().unflatten(spec, aliases)[0])
        primary, aux = _split_aux(out, has_aux, what)
        outs, auxs = [], []
        out_spec = _tree().flatten(primary, outs)
        aux_spec = _tree().flatten(aux, auxs) if has_aux else None
        tracer.finish_body(outs + auxs)
    finally:
        tracer.end()
        tracer.undo_writes()
    return tracer, out_spec, len(outs), aux_spec


def _args_of(inputs, what):
    """MindSpore's inputs: one Tensor, or a tuple / list of them (each may be a pytree)."""
    if isinstance(inputs, _C.TensorBase):
        return (inputs,), True
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs), False
    raise TypeError(f"{what}: inputs must be a Tensor or a tuple of Tensors, got {type(inputs).__name__}")


def jvp(fn, inputs, v, has_aux=False):
    """(fn(*inputs), its Jacobian-vector product with v) in one forward-mode pass (MindSpore's
    mindspore.jvp): inputs and v are a Tensor or tuples of Tensors (or pytrees of them) of the same
    structure, shapes and dtypes. With has_aux, fn returns (output, aux) (or (output, aux...)): only
    output is differentiated and jvp returns (output, jvp, aux)."""
    _check_flag("jvp", has_aux, fn)
    args, single = _args_of(inputs, "jvp")
    if single != isinstance(v, _C.TensorBase):
        raise ValueError("jvp: v must have the structure of inputs (a Tensor for a Tensor, a tuple for a tuple)")
    tangents = (v,) if single else tuple(v) if isinstance(v, (tuple, list)) else v
    spec, leaves = _flat(args, "jvp: inputs")
    tspec, tleaves = _flat(tangents, "jvp: v")
    _same_structure(spec, tspec, leaves, tleaves, "jvp")
    tracer, out_spec, nout, aux_spec = _record(fn, spec, leaves, has_aux, "jvp")
    ys, tys = _C.jvp(tracer, leaves, tleaves)
    out = _tree().unflatten(out_spec, list(ys[:nout]))[0]
    tan = _zero_constants(_tree().unflatten(out_spec, list(tys[:nout]))[0])
    if has_aux:
        return out, tan, _tree().unflatten(aux_spec, list(ys[nout:]))[0]
    return out, tan


def linearize(fn, *primals):
    """(fn(*primals), f_jvp) as JAX's linearize: f_jvp(*tangents) gives the Jacobian-vector product
    at primals by the tangent part of fn's JVP graph alone, reusing the forward values it reads
    (the residuals) instead of running fn again."""
    _check_flag("linearize", False, fn)
    out, f_jvp, _ = _linearize(fn, primals, False, "linearize")
    return out, f_jvp


def _linearize(fn, primals, has_aux, what):
    spec, leaves = _flat(tuple(primals), f"{what}: primals")
    tracer, out_spec, nout, aux_spec = _record(fn, spec, leaves, has_aux, what)
    ys, residuals, linear = _C.linearize(tracer, leaves)
    out = _tree().unflatten(out_spec, list(ys[:nout]))[0]
    aux = _tree().unflatten(aux_spec, list(ys[nout:]))[0] if has_aux else None

    def f_jvp(*tangents):
        tspec, tleaves = _flat(tuple(tangents), f"{what}: tangents")
        _same_structure(spec, tspec, leaves, tleaves, what)
        tys = _C.run_linear(linear, list(residuals), list(tleaves))
        return _zero_constants(_tree().unflatten(out_spec, list(tys[:nout]))[0])

    f_jvp._kiln_linear = linear
    return out, f_jvp, aux


def vjp(fn, *inputs, has_aux=False):
    """(fn(*inputs), vjp_fn) as MindSpore's mindspore.vjp: vjp_fn(cotangents), cotangents shaped like
    fn's output, returns the tuple of the vector-Jacobian products, one per input (each shaped like
    it). vjp_fn may be called many times. With has_aux, fn returns (output, aux) and vjp returns
    (output, vjp_fn, aux)."""
    _check_flag("vjp", has_aux, fn)
    spec, leaves = _flat(tuple(inputs), "vjp: inputs")
    targets = []
    for a in leaves:
        if a.requires_grad:
            targets.append(a)  # already tracked (inside an outer grad): gradients flow on through it
        else:
            leaf = a.detach()
            leaf.requires_grad = True
            targets.append(leaf)
    depth = getattr(grad_nesting, "depth", 0)
    grad_nesting.depth = depth + 1  # a kiln.grad inside fn keeps its gradients differentiable
    try:
        with enable_grad():
            out = fn(*_tree().unflatten(spec, targets)[0])
    finally:
        grad_nesting.depth = depth
    primary, aux = _split_aux(out, has_aux, "vjp")
    outs = []
    out_spec = _tree().flatten(primary, outs)
    if not outs:
        raise TypeError(f"vjp: the function must return a Tensor (or tensors), got {type(primary).__name__}")
    outer = is_grad_enabled() and any(a.requires_grad for a in leaves)

    def vjp_fn(cotangents):
        couts = []
        cspec = _tree().flatten(cotangents, couts)
        if cspec != out_spec:
            raise ValueError(f"vjp: the cotangents are {_tree().describe(cspec)}, the output "
                             f"{_tree().describe(out_spec)}")
        for k, (o, c) in enumerate(zip(outs, couts)):
            if tuple(o.shape) != tuple(c.shape):
                raise ValueError(f"vjp: cotangent {k} has shape {list(c.shape)}, the output {list(o.shape)}")
        pairs = [(o, c) for o, c in zip(outs, couts) if o.requires_grad]
        if pairs:
            grads = _C.grad([o for o, _ in pairs], targets, [c for _, c in pairs], outer or _C.is_tracing())
        else:
            grads = [None] * len(targets)
        grads = [g if g is not None else _array.zeros_like(t) for g, t in zip(grads, targets)]
        return tuple(_tree().unflatten(spec, grads)[0])

    if has_aux:
        return primary, vjp_fn, aux
    return primary, vjp_fn


def _positions(grad_position, nargs, what):
    single = isinstance(grad_position, int) and not isinstance(grad_position, bool)
    pos = (grad_position,) if single else grad_position
    if not isinstance(pos, tuple) or not pos or any(not isinstance(p, int) or isinstance(p, bool) for p in pos):
        raise TypeError(f"{what}: grad_position must be an int or a non-empty tuple of ints, got {grad_position!r}")
    for p in pos:
        if not -nargs <= p < nargs:
            raise ValueError(f"{what}: grad_position {grad_position!r} is out of range for {nargs} arguments")
    return tuple(p % nargs for p in pos), single


def _at_positions(fn, args, pos):
    """fn of the arguments at pos only (the others fixed to args')."""
    def of_positions(*chosen):
        full = list(args)
        for p, c in zip(pos, chosen):
            full[p] = c
        return fn(*full)
    return of_positions


def _basis(x, k):
    """The k-th basis tensor of x's shape and dtype (1 at flat position k)."""
    flat = _array.zeros((_numel(x),), dtype=x.dtype)
    flat[k] = 1.0
    return flat.reshape(tuple(x.shape))


def _numel(x):
    n = 1
    for s in x.shape:
        n *= s
    return n


def _jacobian_batched(fn, primals, has_aux):
    """(fn's output, its aux or None, per primal the Jacobians of the output leaves, each of shape
    out.shape + primal.shape): fn recorded once (as jvp records it: a value read into Python there
    is fixed by the primals), then its forward-mode pass mapped with kiln.vmap over the basis of all
    the primals at once, one batched graph whose batch is their total element count (example r: a
    1 at element r of the concatenated primals, the rest 0), not one run per basis vector. The
    forward part does not depend on the tangents: the batched graph computes it once."""
    spec, leaves = _flat(tuple(primals), "jacfwd: primals")
    tracer, out_spec, nout, aux_spec = _record(fn, spec, leaves, has_aux, "jacfwd")
    sizes = [_numel(p) for p in leaves]
    total = sum(sizes)
    if total == 0:
        ys, _ = _C.jvp(tracer, leaves, [_array.zeros_like(p) for p in leaves])
        values = list(ys)
        jacs = [[_array.zeros(tuple(o.shape) + tuple(p.shape), dtype=o.dtype) for o in values[:nout]] for p in leaves]
    else:
        eyes, basis, off = {}, [], 0
        for p, n in zip(leaves, sizes):
            if p.dtype not in eyes:
                eyes[p.dtype] = _array.eye(total, total, dtype=p.dtype)
            basis.append(eyes[p.dtype][:, off:off + n].reshape((total,) + tuple(p.shape)))
            off += n

        def pushforward(*tangents):
            ys, tys = _C.jvp(tracer, leaves, list(tangents))
            return tuple(ys), tuple(tys[:nout])  # the outputs and aux the same for every example

        values, columns = hooks.batching("vmap")(pushforward, out_axes=(None, 0))(*basis)
        jacs, off = [], 0
        for p, n in zip(leaves, sizes):
            per_out = []
            for o, col in zip(values[:nout], columns):  # col: (total,) + out.shape
                block = _movedim(col[off:off + n], 0, -1)  # out.shape + (n,)
                per_out.append(block.reshape(tuple(o.shape) + tuple(p.shape)))
            jacs.append(per_out)
            off += n
    out = _tree().unflatten(out_spec, list(values[:nout]))[0]
    aux = _tree().unflatten(aux_spec, list(values[nout:]))[0] if has_aux else None
    return out, aux, jacs


def _jacobian_by_basis(f_jvp, primals, out_leaves):
    """Per output leaf, per primal: the Jacobian d out / d primal, of shape out.shape + primal.shape,
    from f_jvp (a linearization's tangent part) given each basis vector of each primal in turn, the
    other primals' tangents zero: a loop of linear-part runs, for what kiln.vmap cannot batch (control
    flow)."""
    zeros = [_array.zeros_like(p) for p in primals]
    per_primal = []
    for i, p in enumerate(primals):
        columns = []
        for k in range(_numel(p)):
            tangents = list(zeros)
            tangents[i] = _basis(p, k)
            ty = []
            _tree().flatten(f_jvp(*tangents), ty)
            columns.append(ty)
        jacs = []
        for j, o in enumerate(out_leaves):
            col = [c[j] for c in columns]
            stacked = _array.stack(col, -1) if col else _array.zeros(tuple(o.shape) + (0,), dtype=o.dtype)
            jacs.append(stacked.reshape(tuple(o.shape) + tuple(p.shape)))
        per_primal.append(jacs)
    return per_primal


def _jacobian(fn, primals, has_aux):
    """(output, aux or None, per primal the Jacobians of the output leaves): batched, or by a pass
    per basis vector where kiln.vmap refuses (control flow)."""
    try:
        return _jacobian_batched(fn, primals, has_aux)
    except hooks.batching("vmap_refusals"):
        out, f_jvp, aux = _linearize(fn, primals, has_aux, "jacfwd")
        outs = []
        _tree().flatten(out, outs)
        return out, aux, _jacobian_by_basis(f_jvp, primals, outs)


def _arrange(out_spec, per_position, single):
    """The Jacobians in the output's structure; with several positions each leaf a tuple over them."""
    n = len(per_position[0]) if per_position else 0
    leaves = [per_position[0][j] if single else tuple(pp[j] for pp in per_position) for j in range(n)]
    if single:
        return _zero_constants(_tree().unflatten(out_spec, leaves)[0])
    # tuples as leaves: rebuild the structure with placeholders, then swap them in
    return _replace_leaves(_zero_constants(_tree().unflatten(out_spec, [_Slot(k) for k in range(n)])[0]), leaves)


class _Slot:
    def __init__(self, k):
        self.k = k


def _replace_leaves(obj, leaves):
    if isinstance(obj, _Slot):
        return leaves[obj.k]
    if isinstance(obj, tuple):
        return tuple(_replace_leaves(o, leaves) for o in obj)
    if isinstance(obj, list):
        return [_replace_leaves(o, leaves) for o in obj]
    if isinstance(obj, dict):
        return {k: _replace_leaves(v, leaves) for k, v in obj.items()}
    return obj


def _check_flag(what, has_aux, fn=len):
    if not callable(fn):
        raise TypeError(f"{what}: fn must be a function (or a Cell), got {type(fn).__name__}")
    if not isinstance(has_aux, bool):
        raise TypeError(f"{what}: has_aux must be True or False, got {has_aux!r}")


def jacfwd(fn, grad_position=0, has_aux=False):
    """A function returning fn's Jacobian with respect to the arguments at grad_position, by forward
    mode (MindSpore's mindspore.jacfwd): for an output of shape S and an input of shape P, a tensor
    of shape S + P. Outputs in a tuple / list / dict give Jacobians in that structure; a tuple
    grad_position gives, per output, a tuple over the positions. With has_aux fn returns
    (output, aux) and the function (jacobian, aux)."""
    _check_flag("jacfwd", has_aux, fn)

    @functools.wraps(fn)
    def jac_fn(*args):
        pos, single = _positions(grad_position, len(args), "jacfwd")
        primals = [args[p] for p in pos]
        for p, x in zip(pos, primals):
            if not isinstance(x, _C.TensorBase):
                raise TypeError(f"jacfwd: argument {p} must be a Tensor, got {type(x).__name__}")
        out, aux, per_primal = _jacobian(_at_positions(fn, args, pos), primals, has_aux)
        jac = _arrange(_tree().flatten(out, []), per_primal, single)
        return (jac, aux) if has_aux else jac

    jac_fn._kiln_grad_of = fn  # kiln's own wrapper: capture runs it as it is, recording its ops
    return jac_fn


def _jacrev_by_rows(fn, grad_position=0, has_aux=False):
    """fn's Jacobian by reverse mode: one vjp, its vjp_fn given each basis vector of each output in
    turn (rows stacked): kiln.hessian's inner Jacobian where kiln.jacrev's vmap refuses (control
    flow, a value read into Python)."""

    @functools.wraps(fn)
    def jac_fn(*args):
        pos, single = _positions(grad_position, len(args), "jacrev")
        primals = [args[p] for p in pos]
        res = vjp(_at_positions(fn, args, pos), *primals, has_aux=has_aux)
        out, vjp_fn = res[0], res[1]
        outs = []
        out_spec = _tree().flatten(out, outs)
        rows = []  # rows[j][k]: the gradients (one per primal) of element k of output leaf j
        for j, o in enumerate(outs):
            rows.append([vjp_fn(_tree().unflatten(out_spec, [
                _basis(o, k) if i == j else _array.zeros_like(q) for i, q in enumerate(outs)])[0])
                for k in range(_numel(o))])
        per_position = []
        for i, p in enumerate(primals):
            jacs = []
            for j, o in enumerate(outs):
                g = [r[i] for r in rows[j]]
                stacked = _array.stack(g, 0) if g else _array.zeros((0,) + tuple(p.shape), dtype=p.dtype)
                jacs.append(stacked.reshape(tuple(o.shape) + tuple(p.shape)))
            per_position.append(jacs)
        jac = _arrange(out_spec, per_position, single)
        return (jac, res[2]) if has_aux else jac

    jac_fn._kiln_grad_of = fn
    return jac_fn


def hessian(fn, grad_position=0, has_aux=False):
    """fn's Hessian with respect to the arguments at grad_position (JAX's hessian): jacfwd of
    kiln.jacrev, forward over reverse, each one batched graph (a pass per basis vector and a vjp
    per output element where kiln.vmap refuses: ops.cond / ops.while_loop, values read into
    Python). For a
    scalar output and an input of shape P, a tensor of shape P + P; a tuple grad_position gives
    nested tuples (row position, column position)."""
    _check_flag("hessian", has_aux, fn)
    batched = hooks.batching("jacrev")(fn, grad_position, has_aux)

    @functools.wraps(fn)
    def reverse_jacobian(*args):
        try:
            return batched(*args)
        except hooks.batching("vmap_refusals"):
            return _jacrev_by_rows(fn, grad_position, has_aux)(*args)

    reverse_jacobian._kiln_grad_of = fn
    return jacfwd(reverse_jacobian, grad_position, has_aux)
