"""Loops and branch tables as ops: fori_loop, scan, map, switch, and MindSpore's ForiLoop, Scan
and WhileLoop primitives.

Eagerly each is a Python loop (or one call of the chosen branch), so autograd records the ops
that ran. While a trace records (kiln.jit, kiln.trace), a loop becomes ONE `while` node
(control_flow.while_loop): its loop values are a counter and the carry's leaves, and a scan's
stacked outputs are buffers the body writes one row of per step (index_add at the step's row:
the backward body never reads the old buffer, so while_grad keeps no copy of it per step). Its
gradient is while_grad's: the loop values before each step are kept, each step's body is run
again in reverse under its gradient (see docs/guide/transforms.md, "Loops").

Carries are pytrees (tuples, lists, namedtuples, dicts, None) of tensors and Python numbers, any
number of leaves (past 32 the node carries them packed). A Python number leaf stays a number
eagerly and is a 0-d tensor in a compiled loop (bool, int64 or float64), handed back as a number
where the capture returns such numbers.
"""
from .. import _C
from .. import hooks
from ..grad_mode import no_grad
from .array import arange, full, gather, index_add, index_select, stack, zeros
from .control_flow import cond, counted_while_loop, refuse_value_reads
from .primitives import Primitive

_NUMBERS = (bool, int, float)
_PACK_XS = 8  # more scanned arrays than this are read from one packed array per dtype (fewer lifted inputs)


# ---- pytrees of tensors and Python numbers ------------------------------------------------------


def _is_number(v):
    return type(v) in _NUMBERS


def _flatten(op, what, obj, path, leaves, paths):
    """obj's structure (hashable); its tensors and numbers appended to leaves, their paths to paths."""
    if isinstance(obj, _C.TensorBase) or _is_number(obj):
        leaves.append(obj)
        paths.append(path)
        return "*"
    if obj is None:
        return None
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple
        return (type(obj), tuple(_flatten(op, what, v, f"{path}.{f}", leaves, paths) for f, v in zip(obj._fields, obj)))
    if isinstance(obj, (tuple, list)):
        return (type(obj), tuple(_flatten(op, what, v, f"{path}[{k}]", leaves, paths) for k, v in enumerate(obj)))
    if isinstance(obj, dict):
        keys = sorted(obj, key=repr)
        return (dict, tuple(keys), tuple(_flatten(op, what, obj[k], f"{path}[{k!r}]", leaves, paths) for k in keys))
    raise TypeError(f"{op}: {path} in {what} is a {type(obj).__name__}; leaves must be Tensors or Python numbers "
                    "(in tuples, lists, namedtuples and dicts)")


def _tree(op, what, obj, name):
    leaves, paths = [], []
    return _flatten(op, what, obj, name, leaves, paths), leaves, paths


def _unflatten(struct, it):
    if struct == "*":
        return next(it)
    if struct is None:
        return None
    if struct[0] is dict:
        return {k: _unflatten(s, it) for k, s in zip(struct[1], struct[2])}
    kind, children = struct
    values = [_unflatten(s, it) for s in children]
    if kind is list:
        return values
    if kind is tuple:
        return tuple(values)
    return kind(*values)  # a namedtuple


def _rebuild(struct, leaves):
    return _unflatten(struct, iter(leaves))


def _describe(struct):
    if struct == "*":
        return "leaf"
    if struct is None:
        return "None"
    if struct[0] is dict:
        return "{" + ", ".join(f"{k!r}: {_describe(s)}" for k, s in zip(struct[1], struct[2])) + "}"
    kind, children = struct
    inner = ", ".join(_describe(s) for s in children)
    if kind is list:
        return f"[{inner}]"
    if kind is tuple:
        return f"({inner}{',' if len(children) == 1 else ''})"
    return f"{kind.__name__}({inner})"


def _meta(v):
    return f"Tensor {v.dtype.name} {tuple(v.shape)}" if isinstance(v, _C.TensorBase) else f"Python {type(v).__name__}"


def _is_integer(dtype):
    return not dtype.is_floating_point and dtype != _C.bool


def _number_dtype(v):
    return _C.bool if type(v) is bool else _C.int64 if type(v) is int else _C.float64


def _as_tensor(v):
    """A Python number as a 0-d tensor of its kind; a tensor as it is."""
    return full((), v, dtype=_number_dtype(v)) if _is_number(v) else v


def _note_numbers(values, kinds):
    """values (0-d tensors standing for Python numbers of kinds, or None where not) noted for the
    capture around, which then returns them as numbers (kiln.jit's ast and trace modes)."""
    note = hooks.note_number
    if note is not None:
        for v, k in zip(values, kinds):
            if k is not None:
                note(v, k)
    return values


# ---- carries --------------------------------------------------------------------------------------


class _Carry:
    """The structure and leaf kinds of a loop's initial carry, and the check of each new carry
    against them (one error naming the op, the function and the leaf)."""

    def __init__(self, op, init, name):
        self.op, self.name = op, name
        self.struct, leaves, self.paths = _tree(op, name, init, name)
        # per leaf: a tensor's (dtype, shape), or the Python type of a number
        self.kinds = [type(v) if _is_number(v) else (v.dtype, tuple(v.shape)) for v in leaves]
        self.leaves = leaves

    def check(self, fn_name, new, traced):
        """new's leaves, made like the initial carry's: a Python number where the carry holds a
        tensor becomes a tensor of that dtype and shape. traced: number leaves are 0-d tensors."""
        struct, leaves, _ = _tree(self.op, f"the carry {fn_name} returns", new, self.name)
        if struct != self.struct:
            raise ValueError(f"{self.op}: {fn_name} returns a carry structured as {_describe(struct)}, but "
                             f"{self.name} is {_describe(self.struct)}")
        out = []
        for path, kind, v in zip(self.paths, self.kinds, leaves):
            if isinstance(kind, tuple):  # a tensor in the initial carry
                dtype, shape = kind
                if _is_number(v):
                    v = full(shape, v, dtype=dtype)
                elif v.dtype != dtype or tuple(v.shape) != shape:
                    raise ValueError(f"{self.op}: {fn_name} returns {path} as {_meta(v)}, but it is Tensor "
                                     f"{dtype.name} {shape} in {self.name}")
            elif traced:  # a number, a 0-d tensor in the loop
                if _is_number(v):
                    if type(v) is not kind:
                        raise ValueError(f"{self.op}: {fn_name} returns {path} as {_meta(v)}, but it is a Python "
                                         f"{kind.__name__} in {self.name}")
                    v = _as_tensor(v)
                elif v.dtype != _number_dtype(kind(0)) or tuple(v.shape) != ():
                    raise ValueError(f"{self.op}: {fn_name} returns {path} as {_meta(v)}, but it is a Python "
                                     f"{kind.__name__} in {self.name} (a 0-d {_number_dtype(kind(0)).name} tensor "
                                     "in the compiled loop)")
            elif isinstance(v, _C.TensorBase) and v.dtype == _number_dtype(kind(0)) and tuple(v.shape) == ():
                v = kind(v.item())  # (the number's own dtype: exact, as the compiled loop's 0-d tensor)
            elif type(v) is not kind:
                raise ValueError(f"{self.op}: {fn_name} returns {path} as {_meta(v)}, but it is a Python "
                                 f"{kind.__name__} in {self.name}" +
                                 (f" (a 0-d {_number_dtype(kind(0)).name} tensor would do; or give it a Tensor "
                                  "there)" if isinstance(v, _C.TensorBase) else ""))
            out.append(v)
        return out

    def loop_leaves(self):
        return [_as_tensor(v) for v in self.leaves]

    def result(self, leaves):
        """The carry rebuilt from the loop's final tensors, numbers' tensors noted as numbers."""
        kinds = [k if not isinstance(k, tuple) else None for k in self.kinds]
        return _rebuild(self.struct, _note_numbers(list(leaves), kinds))


def _check_callable(op, name, fn):
    if not callable(fn):
        raise TypeError(f"{op}: {name} must be callable, got {type(fn).__name__}")


def _check_unroll(op, unroll):
    if type(unroll) is bool or (type(unroll) is int and unroll >= 1):
        return
    raise TypeError(f"{op}: unroll must be a bool or a positive int, got {unroll!r}")


def _carried_while(op, cond_fn, body_fn, carry, extra=(), trips=0):
    """One while node over (extra..., the carry's leaves): cond_fn(extra, carry) and
    body_fn(extra, carry) -> (extra', carry') where extra are loop tensors of op's own (a counter,
    output buffers). trips: the trip count when known (else 0). Returns (extra', the final
    carry's leaves)."""
    nx = len(extra)

    def split(values):
        return list(values[:nx]), _rebuild(carry.struct, list(values[nx:]))

    def cond_of(*values):
        ex, c = split(values)
        return cond_fn(ex, c)

    def body_of(*values):
        ex, c = split(values)
        new_ex, new_c = body_fn(ex, c)
        return tuple(new_ex) + tuple(new_c)

    out = counted_while_loop(cond_of, body_of, tuple(extra) + tuple(carry.loop_leaves()), trips)
    return list(out[:nx]), list(out[nx:])


# ---- fori_loop -------------------------------------------------------------------------------------


def _bound(op, name, v):
    if type(v) is int:
        return v
    if isinstance(v, _C.TensorBase) and v.numel() == 1 and _is_integer(v.dtype):
        return v
    raise TypeError(f"{op}: {name} must be an int or a one-element integer Tensor, got "
                    f"{_meta(v) if isinstance(v, _C.TensorBase) else type(v).__name__}")


def fori_loop(lower, upper, body_fun, init_val, *, unroll=1):
    """val = body_fun(i, val) for i in range(lower, upper); returns the final val.

    lower, upper: ints or one-element integer tensors (no step; upper <= lower runs no step).
    init_val: a tensor, a Python number or a pytree (tuple/list/namedtuple/dict) of them; body_fun
    returns the same structure, each tensor with its dtype and shape (a Python number where the
    carry holds a tensor is made one; a Python number leaf stays one: body_fun returns a number of
    its type, or a 0-d tensor of that type's dtype, bool, int64 or float64). body_fun gets i as a
    0-d int64 tensor, eagerly and compiled alike (so arithmetic on it gives the same dtypes both
    ways). Compiled, the loop is one `while` node, whose gradient reaches init_val and the tensors
    body_fun reads. unroll is accepted for JAX
    compatibility; a compiled loop runs one step per iteration."""
    op = "fori_loop"
    _check_callable(op, "body_fun", body_fun)
    _check_unroll(op, unroll)
    lower, upper = _bound(op, "lower", lower), _bound(op, "upper", upper)
    carry = _Carry(op, init_val, "init_val")
    if not _C.is_tracing():
        val = init_val
        for k in range(int(lower), int(upper)):
            val = carry.check("body_fun", body_fun(full((), k, dtype=_C.int64), val), False)
            val = _rebuild(carry.struct, val)
        return val

    def as_index(v):
        return full((), v, dtype=_C.int64) if type(v) is int else v.reshape(()).astype(_C.int64)

    hi = upper if type(upper) is int else as_index(upper)

    def cond_fn(ex, c):
        return ex[0] < hi

    def body_fn(ex, c):
        (i,) = ex
        return (i + 1,), carry.check("body_fun", body_fun(i, c), True)

    trips = max(upper - lower, 0) if type(lower) is int and type(upper) is int else 0
    _, leaves = _carried_while(op, cond_fn, body_fn, carry, (as_index(lower),), trips)
    return carry.result(leaves)


# ---- scan and map ----------------------------------------------------------------------------------


def _scan_length(op, xs_leaves, xs_paths, length):
    if length is not None and (type(length) is not int or length < 0):
        raise TypeError(f"{op}: length must be a non-negative int or None, got {length!r}")
    for v, p in zip(xs_leaves, xs_paths):
        if not isinstance(v, _C.TensorBase):
            raise TypeError(f"{op}: {p} is a Python {type(v).__name__}; the arrays scanned over must be Tensors")
        if v.ndim == 0:
            raise ValueError(f"{op}: {p} is 0-d; the arrays scanned over need a leading axis")
    sizes = {int(v.shape[0]) for v in xs_leaves}
    if len(sizes) > 1:
        what = ", ".join(f"{p} {int(v.shape[0])}" for v, p in zip(xs_leaves, xs_paths))
        raise ValueError(f"{op}: the arrays scanned over differ in leading size ({what})")
    if length is None and not sizes:
        raise ValueError(f"{op}: xs holds no array; pass length")
    if length is not None and sizes and length not in sizes:
        raise ValueError(f"{op}: length={length} but xs has leading size {sizes.pop()}")
    return length if length is not None else sizes.pop()


def _split_step(op, fname, out):
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        got = f"{len(out)} values" if isinstance(out, (tuple, list)) else type(out).__name__
        raise TypeError(f"{op}: {fname} must return a pair (carry, y), got {got}")
    return out


def _eager_scan(op, fname, f, carry, init, xs_struct, xs_leaves, length, reverse):
    c = init
    steps = range(length - 1, -1, -1) if reverse else range(length)
    ys, y_struct, y_paths = [], None, None
    for t in steps:
        x = _rebuild(xs_struct, [v[t] for v in xs_leaves])
        new_c, y = _split_step(op, fname, f(c, x))
        c = _rebuild(carry.struct, carry.check(fname, new_c, False))
        struct, leaves, paths = _tree(op, "y", y, "y")
        if y_struct is None:
            y_struct, y_paths = struct, paths
        elif struct != y_struct:
            raise ValueError(f"{op}: {fname} returns y structured as {_describe(struct)} at step {t}, but as "
                             f"{_describe(y_struct)} before")
        ys.append(leaves)
    if reverse:
        ys.reverse()
    stacked = []
    for k, path in enumerate(y_paths or ()):
        column = [step[k] for step in ys]
        first = column[0]
        for t, v in enumerate(column):
            if _meta(v) != _meta(first) or (_is_number(v) and type(v) is not type(first)):
                raise ValueError(f"{op}: {fname} returns {path} as {_meta(v)} at step {t}, but as {_meta(first)} at "
                                 "step 0")
        if _is_number(first):
            column = [full((), v, dtype=_number_dtype(v)) for v in column]
        stacked.append(stack(column, 0))
    return c, _rebuild(y_struct, stacked)


class _PackedRows:
    """Many arrays scanned over, read as one per dtype: each (length, ...) array flattened to
    (length, size) and concatenated along axis 1, so a loop body lifts a few tensors, not one per
    array; row t of each is taken apart again by index_select."""

    def __init__(self, leaves, length):
        self.groups = {}
        for k, v in enumerate(leaves):
            self.groups.setdefault(v.dtype, []).append(k)
        self.n = len(leaves)
        self.shapes = [tuple(v.shape[1:]) for v in leaves]
        self.packed, self.spans = [], {}
        for ks in self.groups.values():
            at = 0
            for k in ks:
                size = 1
                for d in self.shapes[k]:
                    size *= d
                self.spans[k] = (at, at + size)
                at += size
            self.packed.append(_C.shape.concat([leaves[k].reshape((length, -1)) for k in ks], 1))

    def rows(self, t):
        out = [None] * self.n
        for p, ks in zip(self.packed, self.groups.values()):
            row = gather(p, t, 0)
            for k in ks:
                out[k] = index_select(row, 0, arange(*self.spans[k], 1, dtype=_C.int64)).reshape(self.shapes[k])
        return out


def _probe(what, fn, args):
    """What fn(*args) returns when traced on stand-ins of args, in a body that is then dropped
    (its structure and the metas of its tensors)."""
    tracer = _C.Tracer(nested=True)
    try:
        aliases = [a.detach() for a in args]
        for a in aliases:
            tracer.add_input(a)
        with no_grad():
            out = fn(*aliases)
        refuse_value_reads(tracer, what)
        return out
    finally:
        tracer.end()


def _traced_scan(op, fname, f, carry, xs_struct, xs_leaves, length, reverse):
    packed = _PackedRows(xs_leaves, length) if len(xs_leaves) > _PACK_XS else None

    def index_of(i):
        return (length - 1) - i if reverse else i

    def x_at(t):
        return _rebuild(xs_struct, packed.rows(t) if packed else [gather(v, t, 0) for v in xs_leaves])

    # y's structure and metas, from f traced once on the first step's values
    def first_step(*leaves):
        c = _rebuild(carry.struct, list(leaves))
        return _split_step(op, fname, f(c, x_at(full((), index_of(0), dtype=_C.int64))))

    _, y = _probe(f"{op}: {fname}", first_step, carry.loop_leaves())
    y_struct, y_leaves, y_paths = _tree(op, "y", y, "y")
    y_kinds = [type(v) if _is_number(v) else None for v in y_leaves]
    y_metas = [(_number_dtype(v), ()) if _is_number(v) else (v.dtype, tuple(v.shape)) for v in y_leaves]
    bufs = [zeros((length,) + shape, dtype=dtype) for dtype, shape in y_metas]
    nb = len(bufs)

    def cond_fn(ex, c):
        return ex[0] < length

    def body_fn(ex, c):
        i, old = ex[0], ex[1:]
        t = index_of(i)
        new_c, y = _split_step(op, fname, f(c, x_at(t)))
        new_leaves = carry.check(fname, new_c, True)
        struct, leaves, _ = _tree(op, "y", y, "y")
        if struct != y_struct:
            raise ValueError(f"{op}: {fname} returns y structured as {_describe(struct)}, but as {_describe(y_struct)} "
                             "on the first step")
        row = t.reshape((1,))
        new_bufs = []
        for (dtype, shape), path, b, v in zip(y_metas, y_paths, old, leaves):
            if _is_number(v):
                v = full(shape, v, dtype=dtype)
            elif v.dtype != dtype or tuple(v.shape) != shape:
                raise ValueError(f"{op}: {fname} returns {path} as {_meta(v)}, but as Tensor {dtype.name} {shape} on the "
                                 "first step")
            new_bufs.append(index_add(b, 0, row, v.unsqueeze(0)))
        return [i + 1] + new_bufs, new_leaves

    ex, leaves = _carried_while(op, cond_fn, body_fn, carry, [full((), 0, dtype=_C.int64)] + bufs, length)
    return carry.result(leaves), _rebuild(y_struct, _note_numbers(ex[1:1 + nb], [None] * nb))


def scan(f, init, xs=None, length=None, reverse=False, unroll=1):
    """carry, y = f(carry, x) for each x along axis 0 of xs; returns (the final carry, the ys
    stacked along a new axis 0).

    init: a tensor, a Python number or a pytree (tuple/list/namedtuple/dict) of them; f returns
    (carry of init's structure, dtypes and shapes, y: a pytree of tensors or numbers of the same
    structure and metas every step). xs: a tensor or a pytree of tensors, all of one leading size,
    or None with length (then f gets x=None). reverse=True walks xs from the end (ys[t] is still
    the step that read xs[t]). A Python number in y is stacked as kiln.Tensor would make it (bool,
    int64, float64). Compiled, the loop is one `while` node and its gradient reaches init, xs and
    what f reads. unroll is accepted for JAX compatibility; a compiled loop runs one step per
    iteration."""
    _check_callable("scan", "f", f)
    _check_unroll("scan", unroll)
    if type(reverse) is not bool:
        raise TypeError(f"scan: reverse must be a bool, got {type(reverse).__name__}")
    return _scan("scan", "f", f, init, xs, length, reverse)


def _scan(op, fname, f, init, xs, length, reverse):
    carry = _Carry(op, init, "init")
    xs_struct, xs_leaves, xs_paths = _tree(op, "xs", xs, "xs")
    n = _scan_length(op, xs_leaves, xs_paths, length)
    if n == 0:
        raise ValueError(f"{op}: length 0 (the stacked outputs' shapes come from a step that never runs)")
    if not _C.is_tracing():
        return _eager_scan(op, fname, f, carry, init, xs_struct, xs_leaves, n, reverse)
    return _traced_scan(op, fname, f, carry, xs_struct, xs_leaves, n, reverse)


def map(f, xs):
    """f applied to each slice along axis 0 of xs (a tensor or a pytree of tensors of one leading
    size), the results stacked: scan without a carry."""
    _check_callable("map", "f", f)
    return scan(lambda c, x: (c, f(x)), (), xs)[1]


# ---- switch -----------------------------------------------------------------------------------------


def switch(index, branches, *operands):
    """branches[index](*operands), index clamped to [0, len(branches) - 1] as JAX does.

    index: an int or a one-element integer tensor. operands: tensors, numbers or pytrees of them.
    Eagerly the chosen branch runs and its value is returned as it is. Compiled with a tensor
    index, every branch is traced and the choice is one `if` node (nested ifs in its else
    branches): the branches return one structure; a leaf is a tensor of one dtype and shape in all
    of them or a Python number in some (made a tensor like the others') or in all (the same number
    in all stays that number; different ones of one kind are a 0-d tensor in the graph)."""
    op = "switch"
    if not isinstance(branches, (tuple, list)) or not branches:
        raise TypeError(f"{op}: branches must be a non-empty sequence of callables, got "
                        f"{type(branches).__name__ if not isinstance(branches, (tuple, list)) else 'an empty one'}")
    for k, b in enumerate(branches):
        _check_callable(op, f"branches[{k}]", b)
    n = len(branches)
    if type(index) is int:
        return branches[min(max(index, 0), n - 1)](*operands)
    if not isinstance(index, _C.TensorBase) or index.numel() != 1 or not _is_integer(index.dtype):
        raise TypeError(f"{op}: index must be an int or a one-element integer Tensor, got "
                        f"{_meta(index) if isinstance(index, _C.TensorBase) else type(index).__name__}")
    if not _C.is_tracing() or n == 1:
        if n == 1:
            return branches[0](*operands)
        return branches[min(max(int(index.reshape(()).item()), 0), n - 1)](*operands)
    return _traced_switch(op, index.reshape(()).astype(_C.int64), branches, operands)


def _traced_switch(op, index, branches, operands):
    in_struct, in_leaves, _ = _tree(op, "operands", tuple(operands), "operands")
    kinds = [type(v) if _is_number(v) else None for v in in_leaves]
    loop_in = [_as_tensor(v) for v in in_leaves]

    def _const_arg(leaves):  # a number operand stays that number inside the branches
        return [c if kind is not None else v for v, kind, c in zip(leaves, kinds, in_leaves)]

    outs = []
    for k in range(len(branches)):
        out = _probe(f"{op}: branches[{k}]", lambda *leaves, k=k: branches[k](*_rebuild(in_struct, _const_arg(leaves))),
                     loop_in)
        outs.append(_tree(op, f"the value of branches[{k}]", out, "out"))
    struct, _, paths = outs[0]
    for k, (s, _, _) in enumerate(outs):
        if s != struct:
            raise ValueError(f"{op}: branches[{k}] returns {_describe(s)}, but branches[0] returns {_describe(struct)}")
    # per output leaf: a constant (the same number from every branch), or the meta of its tensor
    plan = []
    for j, path in enumerate(paths):
        column = [o[1][j] for o in outs]
        tensors = [(k, v) for k, v in enumerate(column) if isinstance(v, _C.TensorBase)]
        if tensors:
            k0, t0 = tensors[0]
            for k, v in tensors:
                if v.dtype != t0.dtype or tuple(v.shape) != tuple(t0.shape):
                    raise ValueError(f"{op}: branches[{k}] returns {path} as {_meta(v)}, but branches[{k0}] as "
                                     f"{_meta(t0)}")
            plan.append(("tensor", (t0.dtype, tuple(t0.shape)), None))
            continue
        first = column[0]
        for k, v in enumerate(column):
            if type(v) is not type(first):
                raise ValueError(f"{op}: branches[{k}] returns {path} as a Python {type(v).__name__}, but "
                                 f"branches[0] as a Python {type(first).__name__}")
        if all(v == first for v in column):
            plan.append(("const", None, first))
        else:
            plan.append(("number", (_number_dtype(first), ()), type(first)))

    def flat(k):
        def branch(*leaves):
            out = branches[k](*_rebuild(in_struct, _const_arg(leaves)))
            _, got, _ = _tree(op, f"the value of branches[{k}]", out, "out")
            res = []
            for (how, meta, _), v in zip(plan, got):
                if how == "const":
                    continue
                res.append(full(meta[1], v, dtype=meta[0]) if _is_number(v) else v)
            return tuple(res)
        return branch

    live = [p for p in plan if p[0] != "const"]
    if not live:
        return _rebuild(struct, [p[2] for p in plan])

    def chain(k):
        if k == len(branches) - 1:
            return flat(k)
        return lambda *leaves: cond(index <= k, flat(k), chain(k + 1), leaves)

    chosen = chain(0)(*loop_in)
    chosen = list(chosen) if isinstance(chosen, (tuple, list)) else [chosen]
    _note_numbers(chosen, [p[2] if p[0] == "number" else None for p in live])
    it = iter(chosen)
    return _rebuild(struct, [p[2] if p[0] == "const" else next(it) for p in plan])


# ---- MindSpore's primitives ------------------------------------------------------------------------


class ForiLoop(Primitive):
    """MindSpore's ops.ForiLoop()(lower, upper, loop_func, init_val, unroll=True): kiln.ops.fori_loop
    (unroll: a bool, accepted; a compiled loop is one node either way)."""

    def __call__(self, lower, upper, loop_func, init_val, unroll=True):
        if type(unroll) is not bool:
            raise TypeError(f"ForiLoop: unroll must be a bool, got {type(unroll).__name__}")
        return fori_loop(lower, upper, loop_func, init_val)


class WhileLoop(Primitive):
    """MindSpore's ops.WhileLoop()(cond_func, loop_func, init_val): while cond_func(val): val =
    loop_func(val); returns val. init_val: a tensor, a Python number or a pytree of them; cond_func
    returns a bool or a one-element tensor. Compiled, one `while` node when cond_func gives a tensor
    (a Python bool decides the loop while tracing, as eagerly)."""

    def __call__(self, cond_func, loop_func, init_val):
        op = "WhileLoop"
        _check_callable(op, "cond_func", cond_func)
        _check_callable(op, "loop_func", loop_func)
        carry = _Carry(op, init_val, "init_val")
        if not _C.is_tracing():
            val = init_val
            while _truth(op, cond_func(val)):
                val = _rebuild(carry.struct, carry.check("loop_func", loop_func(val), False))
            return val
        _, leaves = _carried_while(op, lambda ex, c: cond_func(c),
                                   lambda ex, c: ((), carry.check("loop_func", loop_func(c), True)), carry)
        return carry.result(leaves)


def _truth(op, v):
    if isinstance(v, _C.TensorBase) and v.numel() != 1:
        raise ValueError(f"{op}: cond_func must return a bool or a one-element Tensor, got shape {tuple(v.shape)}")
    return bool(v)


class Scan(Primitive):
    """MindSpore's ops.Scan()(loop_func, init, xs, length=None, unroll=True): carry, y =
    loop_func(carry, x) for each element x of the tuple/list xs (or length times with x=None when xs
    is None); returns (carry, list of the ys). Compiled, elements that are tensors of one dtype and
    shape (or numbers of one kind) are stacked and scanned by one `while` node."""

    def __call__(self, loop_func, init, xs, length=None, unroll=True):
        op = "Scan"
        _check_callable(op, "loop_func", loop_func)
        if xs is not None and not isinstance(xs, (tuple, list)):
            raise TypeError(f"{op}: xs must be a tuple, a list or None, got {type(xs).__name__}")
        if length is not None and (type(length) is not int or length < 0):
            raise TypeError(f"{op}: length must be a non-negative int or None, got {length!r}")
        if type(unroll) is not bool:
            raise TypeError(f"{op}: unroll must be a bool, got {type(unroll).__name__}")
        if xs is None:
            if length is None:
                raise ValueError(f"{op}: xs is None; pass length")
            xs = [None] * length
        elif length is not None and length != len(xs):
            raise ValueError(f"{op}: length={length} but xs has {len(xs)} elements")
        carry = _Carry(op, init, "init")
        stackable = _stackable(xs)
        if not _C.is_tracing() or stackable is None or not xs:
            c, ys = init, []
            for x in xs:
                new_c, y = _split_step(op, "loop_func", loop_func(c, x))
                c = _rebuild(carry.struct, carry.check("loop_func", new_c, False))
                ys.append(y)
            return c, ys
        kind = None if stackable == "none" else stackable
        if kind is None:
            c, ys = _scan(op, "loop_func", lambda c, x: loop_func(c, None), init, None, len(xs), False)
        else:
            xs_t = stack([full((), v, dtype=_number_dtype(v)) if _is_number(v) else v for v in xs], 0)
            c, ys = _scan(op, "loop_func", loop_func, init, xs_t, None, False)  # (numbers: each x a 0-d tensor)
        y_struct, y_leaves, _ = _tree(op, "y", ys, "ys")
        per_step = [[leaf[t] for leaf in y_leaves] for t in range(len(xs))]
        return c, [_rebuild(y_struct, leaves) for leaves in per_step]


def _stackable(xs):
    """How the elements of xs stack: "none" (all None), _C.TensorBase (tensors of one meta), a
    number type (numbers of one kind), or None (they do not)."""
    if all(x is None for x in xs):
        return "none"
    if all(isinstance(x, _C.TensorBase) for x in xs):
        return _C.TensorBase if len({(x.dtype, tuple(x.shape)) for x in xs}) == 1 else None
    kinds = {type(x) for x in xs}
    return kinds.pop() if len(kinds) == 1 and next(iter(kinds)) in _NUMBERS else None
