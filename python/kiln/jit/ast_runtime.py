"""The helpers converted code calls (see ast_convert). Each decides while the graph is captured:
a condition that is a Python value runs as plain Python (static, decided at compile time); a
tensor condition becomes kiln.ops.cond / kiln.ops.while_loop."""
import builtins
import contextlib
import functools
import math
import operator
import sys
import threading
import types
import warnings
import weakref

from .. import _C, hooks
from . import ast_convert, dynamic, guards, tree
from .syntax import JitSyntaxError

_state = threading.local()


@contextlib.contextmanager
def capturing(strict):
    """Converted code runs under this while a graph is captured: strict turns every construct
    the converter cannot handle into JitSyntaxError; otherwise it warns once and falls back."""
    prev = getattr(_state, "strict", None)
    _state.strict = strict
    try:
        yield
    finally:
        _state.strict = prev


def is_strict():
    return bool(getattr(_state, "strict", False))


def _is_tensor(x):
    return isinstance(x, _C.TensorBase)


# The sizes of a branch's or loop's value for the runtime's own bookkeeping (comparing the metas of
# paths, zeros of a missing path's structure): read without the dynamic-shape hook, so they neither
# specialize symbols nor bake sizes unseen: a rebound graph's if / while nodes check these metas again.
_shape = _C.raw_shape


def _error(loc, construct, hint=""):
    return JitSyntaxError(construct, loc[0], loc[1], loc[2], hint)


class Undefined:
    """The value of a variable that is not bound on the path taken (Python would raise NameError),
    or that a tensor-dependent if or loop binds only inside itself (`loc`: that statement)."""

    __slots__ = ("name", "loc")

    def __init__(self, name, loc=None):
        self.name, self.loc = name, loc

    def _fail(self, *args, **kwargs):
        if self.loc is not None:
            raise _error(self.loc, f"variable {self.name!r} used after a tensor-dependent if or loop that binds "
                                   "it only inside", "bind it before that statement")
        raise NameError(f"kiln.jit: variable {self.name!r} is not defined on every path that reaches this use")

    __bool__ = __call__ = __iter__ = __len__ = __getitem__ = __index__ = _fail
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __matmul__ = _fail

    def __getattr__(self, attr):
        self._fail()

    def __repr__(self):
        return f"<undefined {self.name}>"


def checked_return(value):
    """A function's return value, refusing variables left unbound by tensor-dependent control flow."""
    if isinstance(value, Undefined):
        value._fail()
    elif isinstance(value, (tuple, list)):
        for v in value:
            checked_return(v)
    elif isinstance(value, dict):
        for v in value.values():
            checked_return(v)
    return value


def values(scope, names):
    """The current values of `names` in a function's locals() (Undefined where unbound)."""
    return tuple(scope[n] if n in scope else Undefined(n) for n in names)


def _as_tensor(value, like=None):
    """A branch or loop value as a tensor: Python numbers become 0-d tensors (of like's dtype
    when given)."""
    if _is_tensor(value):
        return value
    from .._tensor import Tensor

    if like is not None and _is_tensor(like):
        return Tensor(value, like.dtype)
    if isinstance(value, builtins.bool):
        return Tensor(value, _C.bool)
    if isinstance(value, int):
        return Tensor(value, _C.int64)
    return Tensor(value, _C.float64)  # (a Python float is a double; beside a tensor it promotes weakly: binary)


_INPLACE_HINT = "build the new tensor outside it, or select values with kiln.ops.where"


def _no_inplace(inplace, loc, what):
    if inplace:
        raise _error(loc, f"a subscript assignment (an in-place write) inside {what}", _INPLACE_HINT)


class _Drop(Exception):
    """A branch left variable `index` unbound: the if is captured again without it."""

    def __init__(self, index):
        super().__init__(index)
        self.index = index


class _Mismatch(JitSyntaxError):
    """cond / while_loop refused branches or a body whose values differ in dtype or shape (the
    error users see when no retry helps). `wanted`: variable name -> (shape, dtype) it needs,
    for an enclosing loop whose variable it is."""

    def __init__(self, err, wanted=None):
        super().__init__(err.construct, err.filename, err.lineno, err.offset, err.hint)
        self.wanted = wanted or {}


def _run_control(loc, what, fn, *args):
    """kiln.ops.cond / while_loop, with what graph control flow cannot hold reported at loc
    (values that differ between branches or iterations raise _Mismatch carrying the error)."""
    try:
        return fn(*args)
    except NotImplementedError as e:
        raise _error(loc, f"{what} whose body graph control flow cannot hold ({e})", _INPLACE_HINT) from None
    except (ValueError, TypeError) as e:
        if str(e).startswith(("cond:", "while_loop:")):
            raise _Mismatch(_error(loc, f"{what} whose paths give values of different types ({e})",
                                   "give variables the same dtype and shape on every path")) from None
        raise


def _number_as(value, meta):
    """A Python number as a tensor of the (shape, dtype) its variable has on another path."""
    from ..ops import full

    return full(meta[0], value, dtype=meta[1])


def _token():
    """A tensor every branch also returns: graph branches must return at least one tensor."""
    from .._tensor import Tensor

    return Tensor(False, _C.bool)


def _selectable(value):
    return _is_tensor(value) or isinstance(value, (builtins.bool, int, float))


# ---- if ----------------------------------------------------------------------------------

def _structured(value):
    return isinstance(value, (tuple, list, dict))


def if_stmt(pred, true_fn, false_fn, vals, names, in_true, in_false, inplace, loc):
    if not _is_tensor(pred):
        return true_fn(*vals) if pred else false_fn(*vals)
    from ..ops import cond, zeros

    _no_inplace(inplace, loc, "an if on a tensor")
    candidates, static = [], []
    for i, (n, v) in enumerate(zip(names, vals)):
        if isinstance(v, Undefined):
            if n in in_true and n in in_false:
                candidates.append(i)
            elif n.startswith("__kiln_retval_"):
                candidates.append(i)  # a saved return value: the other path fills zeros of its structure
            # else: bound on one path only: local to that branch
        elif _selectable(v) or _structured(v):
            candidates.append(i)
        else:
            static.append(i)
    dropped = set()  # unbound at the end of some path: unbound after the if (an error only if used)
    specs = {}  # (branch, output index) -> structure of the value it gave
    seen = {}  # output index -> (shape, dtype) of a tensor a branch gave
    as_meta = {}  # output index -> (shape, dtype) numbers take on the retry
    leaf_metas = {}  # (branch, output index) -> (shape, dtype) of each tensor of its value
    numbers = {}  # output index -> the Python number types branches gave
    given = {}  # (branch, output index) -> the value it gave (numbers it gave alike stay numbers)

    def flat(i, r, which):
        if _is_tensor(r):
            seen[i] = (_shape(r), r.dtype)
            specs[which, i], leaves = "T", [r]
        elif _selectable(r):
            specs[which, i] = "T"
            numbers.setdefault(i, set()).add(type(r))
            leaves = [_number_as(r, as_meta[i]) if i in as_meta else _as_tensor(r, vals[i])]
        elif _structured(r):
            leaves = []
            specs[which, i] = _flatten_result(r, leaves, floats32[0])
        else:
            raise _error(loc, f"variable {names[i]!r} holding a {type(r).__name__} chosen by an if on a tensor",
                         "only tensors, numbers and tuples/lists of them can depend on a tensor condition")
        leaf_metas[which, i] = [(_shape(t), t.dtype) for t in leaves]
        return leaves

    def branch(fn, other, which, other_which):
        def run():
            res = fn(*vals)
            _check_unchanged(held, loc, names, "an if on a tensor")
            result = []
            for i in outs:
                r = res[i]
                if isinstance(r, Undefined) and names[i].startswith("__kiln_retval_"):
                    # a return value saved on the other path only (return inside a loop): zeros
                    # of its structure here, from the other path's run, or from running the other
                    # path for it (dead code, once) when this path is traced first
                    if (other_which, i) not in specs:
                        other_value = other(*vals)[i]
                        if isinstance(other_value, Undefined):
                            raise _Drop(i)
                        flat(i, other_value, other_which)
                    specs[which, i] = specs[other_which, i]
                    result += [zeros(*shape, dtype=dtype) for shape, dtype in leaf_metas[other_which, i]]
                    continue
                if isinstance(r, Undefined):
                    raise _Drop(i)
                given[which, i] = r
                result += flat(i, r, which)
            for i in static:
                if res[i] is not vals[i]:
                    raise _error(loc, f"variable {names[i]!r} ({type(vals[i]).__name__}) changed by an if on a "
                                      "tensor", "only tensors and numbers can depend on a tensor condition")
            return tuple(result) + (_token(),)

        run.__name__ = which
        return run

    def attempt():
        while True:
            outs[:] = [i for i in candidates if i not in dropped]
            try:
                return _run_control(loc, "an if on a tensor", cond, pred,
                                    branch(true_fn, false_fn, "true_branch", "false_branch"),
                                    branch(false_fn, true_fn, "false_branch", "true_branch"))[:-1]
            except _Drop as d:
                dropped.add(d.index)

    outs = []
    floats32 = [False]  # Python floats in tuples, lists and dicts as float32 (the retry)
    # (run eagerly, cond runs the path taken only)
    held = _held_containers(vals, true_fn, false_fn) if _C.is_tracing() else []

    try:
        results = attempt()
    except _Mismatch:
        # a variable that is a Python number on one path and a tensor on the other: the number
        # takes the tensor's dtype and shape (k = 0, then k = x.sum() on one path)
        as_meta.update(seen)
        for i, kinds in numbers.items():
            if i not in as_meta and len(kinds) > 1:
                # an int on one path and a float on the other: eager's type depends on the path,
                # which no one graph output can follow
                names_ = " and ".join(sorted(k.__name__ for k in kinds))
                raise _error(loc, f"variable {names[i]!r} that is a Python {names_} by the path an if on a tensor "
                                  "takes", f"give it one type on every path (e.g. {names[i]} = 1.0 for a float)")
        # and floats inside tuples, lists and dicts take float32 (beside a float32 tensor on the
        # other path; the retry raises _Mismatch again when that is not what differed)
        floats32[0] = True
        results = attempt()
    out = list(vals)
    leaves = iter(results)
    for i in outs:
        spec_t, spec_f = specs.get(("true_branch", i)), specs.get(("false_branch", i))
        if spec_t is not None and spec_f is not None and not _same_spec(spec_t, spec_f):
            raise _error(loc, f"variable {names[i]!r} with a different structure on each path of an if on a tensor",
                         "give it the same tuple/list structure on both paths")
        out[i] = _keep_numbers(_unflatten_result(spec_t if spec_t is not None else spec_f, leaves),
                               [given[w, i] for w in ("true_branch", "false_branch") if (w, i) in given])
    for i, n in enumerate(names):
        if (isinstance(vals[i], Undefined) and i not in outs) or i in dropped:
            out[i] = Undefined(n, loc)
    return tuple(out)


def _held_containers(vals, *branches):
    """[(name or index, container, a copy of it)] of the lists, dicts and sets an if on a tensor
    can reach, and of the objects' attributes (a Cell's `self.hits`, a global's `cfg.count`: their
    __dict__): its variables (nested in tuples, lists, dicts and objects too), the enclosing
    function's variables and the globals its paths read. Both paths run while the graph is built, so
    a change made in place on one of them would be made whatever the condition."""
    found, seen = [], set()

    def walk(key, v, depth=0):
        if depth > 8 or id(v) in seen or len(seen) > _MAX_HELD:
            return
        if isinstance(v, (list, dict, set)):
            seen.add(id(v))
            found.append((key, v, v.copy()))
            for x in (v.values() if isinstance(v, dict) else v if isinstance(v, list) else ()):
                walk(key, x, depth + 1)
        elif isinstance(v, tuple):
            for x in v:
                walk(key, x, depth + 1)
        elif _has_attributes(v):
            seen.add(id(v))
            attrs = vars(v)
            found.append((key, v, dict(attrs)))
            for x in attrs.values():
                walk(key, x, depth + 1)

    for i, v in enumerate(vals):
        walk(i, v)
    for fn in branches:
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
            if not name.startswith("__kiln"):
                try:
                    walk(name, cell.cell_contents)
                except ValueError:  # an unbound cell
                    pass
        for name in _global_names(fn.__code__):
            if name in fn.__globals__:
                walk(name, fn.__globals__[name])
    return found


_MAX_HELD = 20000  # (objects and containers looked at per if: a bound on the walk through a network)
_NOT_STATE = (types.ModuleType, type, types.FunctionType, types.MethodType, types.BuiltinFunctionType,
              types.CodeType, functools.partial)


def _has_attributes(v):
    """Whether v is an object whose attributes are Python state of the user's (a Cell, a config)."""
    if isinstance(v, _NOT_STATE) or _is_tensor(v):
        return False
    try:  # (not getattr: an object's own __getattr__ may raise anything, Undefined's does)
        return isinstance(object.__getattribute__(v, "__dict__"), dict)
    except AttributeError:
        return False


def _global_names(code):
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def _same_contents(a, b):
    if not isinstance(a, (list, dict, set)):  # an object: its attributes
        a = vars(a)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(a[k] is b[k] for k in a)
    if isinstance(a, set):
        return a == b
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


def reachable_state(fn):
    """The lists, dicts and sets fn's globals and closure hold (as _held_containers), copied, so
    that a capture attempt given up can be undone before another capture runs fn again."""
    fn = getattr(fn, "__func__", fn)
    return _held_containers((), fn) if isinstance(fn, types.FunctionType) else []


def undo(held):
    """Puts back the contents of the held containers changed since they were copied."""
    for _, c, saved in held:
        if not _same_contents(c, saved):
            if isinstance(c, list):
                c[:] = saved
            else:
                c = c if isinstance(c, (dict, set)) else vars(c)
                c.clear()
                c.update(saved)


def _check_unchanged(held, loc, names, what):
    """Raises (after undoing every change) when a held container was changed in place."""
    changed = next(((key, c) for key, c, saved in held if not _same_contents(c, saved)), None)
    if changed is None:
        return
    undo(held)
    key, c = changed
    name = key if isinstance(key, str) else names[key]
    if isinstance(c, (list, dict, set)):
        raise _error(loc, f"a change of {name!r} (a {type(c).__name__}) in place under {what}",
                     "build a new list or dict on each path (or keep the values in tensors)")
    raise _error(loc, f"an attribute write on {name!r} (a {type(c).__name__}) under {what}",
                 "keep the value in a tensor (e.g. a Parameter updated with ops.assign) or decide outside the if")


# A value an if on a tensor chooses, as (structure, tensor leaves) and back; numbers become
# 0-d tensors (kiln._C.tree, src/python/tree.c, describes the structure)
_flatten_result = _C.tree.branch_flatten  # (value, leaves) -> spec
_unflatten_result = _C.tree.branch_unflatten  # (spec, iterator of the selected tensors) -> value
_same_spec = _C.tree.same_branch_spec  # (a, b): one structure (and equal constants) on both paths


# ---- Python numbers an if on a tensor chooses ------------------------------------------------
# Both paths run while the graph is built, so a number that differs between them is a 0-d tensor
# in the graph; eagerly it is an int, float or bool. Such a tensor is noted here while capturing,
# and a result of the captured function holding it returns the number (ChosenNumber).
_chosen = {}  # id(tensor) -> (weakref to it, the Python type the paths gave)


class ChosenNumber:
    """A Python number an if on a tensor chose, returned by a captured function: a 0-d tensor among
    the graph's outputs, the number of its type after the call."""
    __slots__ = ("tensor", "kind")

    def __init__(self, tensor, kind):
        self.tensor, self.kind = tensor, kind


def _number_of(kind, children):
    (t,) = children
    return kind(t.item()) if _is_tensor(t) else t


tree.register_pytree_node(ChosenNumber, lambda c: ((c.tensor,), c.kind), _number_of)


def _note_chosen(value, kind):
    if _is_tensor(value) and _shape(value) == ():
        _chosen[id(value)] = (weakref.ref(value), kind)
    return value


hooks.note_number = _note_chosen  # (kiln.ops' compiled loops carry Python numbers as 0-d tensors)


def chosen_numbers(result):
    """result with each tensor an if on a tensor chose among Python numbers as a ChosenNumber, and
    the notes cleared (the end of a capture)."""
    if not _chosen:
        return result

    def one(v):
        noted = _chosen.get(id(v))
        return ChosenNumber(v, noted[1]) if noted is not None and noted[0]() is v else v

    try:
        return _replace_leaves(result, one, _is_tensor)
    finally:
        _chosen.clear()


def plain_numbers(result):
    """result with each ChosenNumber as its number (a result handed back as it is, not rebuilt)."""
    return _replace_leaves(result, lambda c: c.kind(c.tensor.item()), lambda v: type(v) is ChosenNumber)


def _replace_leaves(value, fn, is_leaf, depth=0):
    """value with fn(leaf) for each leaf in its tuples, lists and dicts; a container none of whose
    leaves changed is value itself (a list the caller passed in stays that list)."""
    if is_leaf(value):
        return fn(value)
    if depth > 20 or not isinstance(value, (tuple, list, dict)):
        return value
    items = list(value.values()) if type(value) is dict else list(value) if type(value) in (tuple, list) or (
        isinstance(value, tuple) and hasattr(type(value), "_make")) else None
    if items is None:
        return value
    new = [_replace_leaves(x, fn, is_leaf, depth + 1) for x in items]
    if all(a is b for a, b in zip(new, items)):
        return value
    if type(value) is dict:
        return dict(zip(value.keys(), new))
    if type(value) in (tuple, list):
        return type(value)(new)
    return type(value)._make(new)


def _number_kind(v):
    """The Python number type v is (a number, or a tensor noted as chosen among numbers), or None."""
    if _is_tensor(v):
        noted = _chosen.get(id(v))
        return noted[1] if noted is not None and noted[0]() is v else None
    return type(v) if isinstance(v, (builtins.bool, int, float)) else None


def _kind_of_result(name, ka, kb):
    """The Python type `a <name> b` gives for numbers of types ka and kb (None when numbers do not
    take that operator)."""
    try:
        return type(getattr(operator, name)(ka(1), kb(1)))
    except (TypeError, ValueError, ArithmeticError):
        return None


_KIND_RANK = {builtins.bool: 0, int: 1, float: 2}


def _as_weak_number(t, kind, other_dtype):
    """t (a 0-d tensor standing for a Python number of type kind) in the dtype Python's number
    would take beside a tensor of other_dtype: that dtype when the number's kind is no higher
    (an int beside int32 stays int32), else the kind's default (a float beside ints: float32)."""
    rank = 2 if other_dtype.is_floating_point else 0 if other_dtype == _C.bool else 1
    target = other_dtype if _KIND_RANK[kind] <= rank else (_C.float32 if kind is float else _C.int64)
    return t if t.dtype == target else t.astype(target)


def binary(loc, name, a, b):
    """`a op b` (operator.<name>: converted code's arithmetic and comparisons); a result computed
    from numbers an if or loop on a tensor chose (noted 0-d tensors) and other numbers is noted as
    the number Python would give."""
    if not _chosen:
        return getattr(operator, name)(a, b)
    ka, kb = _number_kind(a), _number_kind(b)
    if _is_tensor(a) and _is_tensor(b) and (ka is None) != (kb is None):
        # a chosen number beside a tensor promotes as the Python number it stands for (weakly)
        if ka is not None:
            a = _as_weak_number(a, ka, b.dtype)
        else:
            b = _as_weak_number(b, kb, a.dtype)
        return getattr(operator, name)(a, b)
    if ka is None or kb is None or not (_is_tensor(a) or _is_tensor(b)):
        return getattr(operator, name)(a, b)
    if name in ("pow", "ipow") and float not in (ka, kb):
        # Python: int ** int is an int for an exponent >= 0, a float for a negative one
        if _is_tensor(b):
            raise _error(loc, "an int raised to an int power chosen by a tensor condition (Python gives an int "
                              "or a float by the exponent's sign)", "make one of them a float")
        if b < 0:
            return _note_chosen(operator.pow(a.float(), b), float)
    out = getattr(operator, name)(a, b)
    kind = _kind_of_result(name, ka, kb)
    return _note_chosen(out, kind) if kind is not None and _is_tensor(out) else out


def unary(name, a):
    out = getattr(operator, name)(a)
    if _chosen and _is_tensor(out):
        ka = _number_kind(a)
        if ka is not None:
            _note_chosen(out, type(getattr(operator, name)(ka(1))))
    return out


def _keep_numbers(value, raws):
    """value (an if on a tensor's result, numbers as 0-d tensors) with each Python number put back
    that every path run gave alike (raws: what each path gave; one path when run eagerly), as eager
    has it: a tensor condition cannot change it."""
    if not raws:
        return value
    first = raws[0]
    kinds = {_number_kind(r) for r in raws}
    if None not in kinds:
        if not any(_is_tensor(r) for r in raws) and all(
                type(r) is type(first) and (r == first or (r != r and first != first)) for r in raws[1:]):
            return first
        return _note_chosen(value, kinds.pop()) if len(kinds) == 1 else value
    if type(value) in (tuple, list) and all(type(r) is type(value) and len(r) == len(value) for r in raws):
        return type(value)(_keep_numbers(v, [r[k] for r in raws]) for k, v in enumerate(value))
    if isinstance(value, tuple) and hasattr(type(value), "_make") and all(
            type(r) is type(value) and len(r) == len(value) for r in raws):
        return type(value)._make(_keep_numbers(v, [r[k] for r in raws]) for k, v in enumerate(value))
    if type(value) is dict and all(type(r) is dict and r.keys() == value.keys() for r in raws):
        return {k: _keep_numbers(v, [r[k] for r in raws]) for k, v in value.items()}
    return value


def _select(pred, true_fn, false_fn, loc, what, held=None):
    """kiln.ops.cond over two functions of no arguments returning nested values. held: the
    containers the paths can reach (_held_containers; default: those the two functions' globals
    and closures hold), which neither path may change in place (both run while capturing)."""
    from ..ops import cond

    specs, raws = {}, {}
    if held is None:
        held = _held_containers((), true_fn, false_fn) if _C.is_tracing() else []
    floats32 = [False]  # Python floats as float32 (to match a float32 tensor on the other path)

    def branch(fn, which):
        def run():
            leaves = []
            raws[which] = fn()
            _check_unchanged(held, loc, (), what)
            specs[which] = _flatten_result(raws[which], leaves, floats32[0])
            return tuple(leaves) + (_token(),)

        run.__name__ = which
        return run

    try:
        results = _run_control(loc, what, cond, pred, branch(true_fn, "true_branch"),
                               branch(false_fn, "false_branch"))[:-1]
    except _Mismatch:
        # a float on one path, a float32 tensor on the other (x.sum() if c else 0.0): the float
        # takes float32, as it does beside that tensor eagerly
        floats32[0] = True
        results = _run_control(loc, what, cond, pred, branch(true_fn, "true_branch"),
                               branch(false_fn, "false_branch"))[:-1]
    if len(specs) == 2 and not _same_spec(specs["true_branch"], specs["false_branch"]):
        raise _error(loc, f"{what} whose branches give different kinds of values",
                     "return tensors (or numbers) of one structure on both paths")
    spec = specs.get("true_branch", specs.get("false_branch"))
    return _keep_numbers(_unflatten_result(spec, iter(results)), list(raws.values()))


def if_return(pred, true_fn, false_fn, vals, names, inplace, loc):
    if not _is_tensor(pred):
        return true_fn(*vals) if pred else false_fn(*vals)
    _no_inplace(inplace, loc, "an if on a tensor")
    held = _held_containers(vals, true_fn, false_fn) if _C.is_tracing() else []
    return _select(pred, lambda: true_fn(*vals), lambda: false_fn(*vals), loc, "a return under an if on a tensor",
                   [(names[k] if isinstance(k, int) else k, c, saved) for k, c, saved in held])


def if_exp(pred, true_thunk, false_thunk, loc):
    if not _is_tensor(pred):
        return true_thunk() if pred else false_thunk()
    return _select(pred, true_thunk, false_thunk, loc, "a conditional expression on a tensor")


# ---- boolean operators -------------------------------------------------------------------

def _truth_of(v):
    """v, a tensor whose truth Python reads: one element, or the error eager gives."""
    shape = _shape(v)
    if all(isinstance(d, int) and d >= 0 for d in shape) and math.prod(shape) != 1:
        raise ValueError(f"the truth value of a tensor of shape {tuple(shape)} is ambiguous; use .any() or .all()")
    return v


def _short_circuit(thunks, stops_at, on_tensor):
    """Python's `a and b ...` (stops_at False) or `a or b ...` (stops_at True): operands evaluated
    left to right until one's truth is stops_at; a tensor operand goes to on_tensor(it, next)."""
    v = thunks[0]()
    for th in thunks[1:]:
        if _is_tensor(v):
            v = on_tensor(_truth_of(v), th)
        elif bool(v) is stops_at:
            return v
        else:
            v = th()
    return v


_TESTS = {"is": operator.is_, "is not": operator.is_not, "in": lambda a, b: a in b, "not in": lambda a, b: a not in b}


def chain_parts(loc, names, *operands):
    """The comparisons of a chained comparison `a < b < c ...` as thunks for and_: operand k (a
    thunk) is evaluated once, when the first comparison that needs it runs (as Python does)."""
    values = {}

    def value(k):
        if k not in values:
            values[k] = operands[k]()
        return values[k]

    def part(k):
        name = names[k]
        test = _TESTS.get(name)
        if test is not None:
            return lambda: test(value(k), value(k + 1))
        return lambda: binary(loc, name, value(k), value(k + 1))

    return [part(k) for k in range(len(names))]


def and_(loc, *thunks):
    """`a and b ...` as Python gives it: the first false operand, else the last; on a tensor
    operand (one element) a selection between the operands in the graph."""
    return _short_circuit(thunks, False, lambda left, th: _select(left, th, lambda: left, loc, "`and` on a tensor"))


def or_(loc, *thunks):
    """`a or b ...` as Python gives it: the first true operand, else the last."""
    return _short_circuit(thunks, True, lambda left, th: _select(left, lambda: left, th, loc, "`or` on a tensor"))


def not_(loc, v):
    """`not v`; of a one-element tensor a bool tensor of its truth (eager gives the Python bool of
    the same truth: a graph cannot give a value read at capture)."""
    return not_cond(loc, v)


# In a condition only the truth of the value matters: and/or/not of tensors are logical ops there.

def and_cond(loc, *thunks):
    from ..ops import logical_and

    return _short_circuit(thunks, False, lambda left, th: logical_and(left, _truth_of(_as_tensor(th()))))


def or_cond(loc, *thunks):
    from ..ops import logical_or

    return _short_circuit(thunks, True, lambda left, th: logical_or(left, _truth_of(_as_tensor(th()))))


def not_cond(loc, v):
    if _is_tensor(v):
        from ..ops import logical_not

        return logical_not(_truth_of(v))
    return not v


def assert_(test, msg_thunk, loc):
    if _is_tensor(test):
        msg = msg_thunk()
        _check(test, AssertionError(msg) if msg is not None else AssertionError(), False, loc, "assert")
    elif not test:
        msg = msg_thunk()
        raise AssertionError(msg) if msg is not None else AssertionError()


def raise_if(test, exc_thunk, loc):
    """`if test: raise exc_thunk()`; on a tensor condition, a check op in the graph."""
    if _is_tensor(test):
        _check(test, _exception(exc_thunk(), loc), True, loc, "if ...: raise")
    elif test:
        raise _exception(exc_thunk(), loc)


def _exception(exc, loc):
    if isinstance(exc, type) and issubclass(exc, BaseException):
        return exc()
    if not isinstance(exc, BaseException):
        raise TypeError("exceptions must derive from BaseException")
    return exc


def _check(test, exc, fail_when, loc, what):
    """A check op raising exc when test (one element) is nonzero (fail_when) or zero. While capturing it
    runs now too (eagerly, as the trace does) and stays in the graph, to check each call."""
    if test.numel() != 1:
        raise _error(loc, f"{what} on a tensor of shape {tuple(test.shape)}",
                     "reduce the condition to one element (.any(), .all())")
    if not _C.is_tracing():
        if builtins.bool(test.item()) == fail_when:
            raise exc
        return
    from .._optable import OP

    _C.apply(OP.check, (test,), (_C.register_check(exc), int(fail_when)))


# ---- loops -------------------------------------------------------------------------------

def _loop_parts(vals, names, loc):
    """Splits loop variables into carried (tensors and numbers: loop values), static (other
    objects, which the body must leave alone), local (unbound before the loop) and returned (the
    value of a `return` inside the loop, unbound before it: see _LoopState.define_returned)."""
    carried, static, local, returned = [], [], [], []
    for i, (n, v) in enumerate(zip(names, vals)):
        if isinstance(v, Undefined):
            (returned if n.startswith("__kiln_retval_") else local).append(i)
        elif _selectable(v):
            carried.append(i)
        else:
            static.append(i)
    return carried, static, local, returned


class _LoopState:
    def __init__(self, vals, names, loc):
        self.names, self.loc = names, loc
        self.carried, self.static, self.local, self.returned = _loop_parts(vals, names, loc)
        self.base = list(vals)
        self.init = tuple(_as_tensor(vals[i]) for i in self.carried)
        self.seen = {}  # carried position -> (shape, dtype) the body gave
        # carried position -> the Python number type the variable keeps (a number before the loop
        # and of that type after each run of the body: a number after the loop too); all None
        # once one changes type (the others' kinds may have been read from it)
        self.kinds = [_number_kind(vals[i]) for i in self.carried]

    def define_returned(self, dry_run):
        """A `return` inside the loop saves its value in a variable unbound before the loop; the
        loop carries it, so it needs a start of its dtype and shape: one run of the body, traced
        aside and discarded (dry_run(loop values) -> the body's variables), gives them, and the
        variable starts as zeros (read after the loop only when the return flag is set)."""
        if not self.returned:
            return
        from ..ops import zeros

        tracer = _C.Tracer(nested=True) if _C.is_tracing() else None
        try:
            res = dry_run(self.init)
        finally:
            if tracer is not None:
                tracer.end()
        for i in self.returned:
            r = res[i]
            if _is_tensor(r) or (isinstance(r, (int, float)) and not isinstance(r, bool)):
                r = _as_tensor(r)
                self.carried.append(i)
                self.kinds.append(None)
                self.init += (zeros(*_shape(r), dtype=r.dtype),)
            else:
                raise _error(self.loc, "return of a " + type(r).__name__ + " inside a loop that runs on a tensor "
                             "condition", "return a tensor there, or break out of the loop and return after it")
        self.returned = []

    def retyped_init(self, wanted):
        """init with the loop variables that start as Python numbers given the dtype and shape the
        body gives them (s = 0, then s = s + x.sum()); None when no such variable differs."""
        init, changed = list(self.init), False
        for k, i in enumerate(self.carried):
            meta = wanted.get(self.names[i], self.seen.get(k))
            if not _is_tensor(self.base[i]) and meta is not None and meta != (_shape(init[k]), init[k].dtype):
                init[k], changed = _number_as(self.base[i], meta), True
        if changed:
            self.init = tuple(init)
        return self.init if changed else None

    def full(self, loop_vals):
        out = list(self.base)
        for i, v, kind in zip(self.carried, loop_vals, self.kinds):
            out[i] = v if kind is None else _note_chosen(v, kind)
        for i in self.local:
            out[i] = Undefined(self.names[i], self.loc)
        return out

    def carry(self, res):
        out = []
        if any(kind is not None and _number_kind(res[i]) is not kind for i, kind in zip(self.carried, self.kinds)):
            self.kinds = [None] * len(self.kinds)
        for k, i in enumerate(self.carried):
            r = res[i]
            if not _selectable(r):
                raise _error(self.loc, f"loop variable {self.names[i]!r} becomes a {type(r).__name__} in a loop "
                                       "on a tensor", "loop variables of such loops must stay tensors or numbers")
            if _is_tensor(r):
                self.seen[k] = (_shape(r), r.dtype)
            elif isinstance(r, float) and not self.init[k].dtype.is_floating_point:
                # an int loop variable given a float: the loop starts over with a float32 one
                self.seen[k] = (_shape(self.init[k]), _C.float32)
                raise _Mismatch(_error(self.loc, f"loop variable {self.names[i]!r} that is an int before the "
                                                 "loop and a float in it", "start it as a float"),
                                {self.names[i]: self.seen[k]})
            out.append(_as_tensor(r, self.init[k]))
        for i in self.static:
            if res[i] is not self.base[i]:
                raise _error(self.loc, f"variable {self.names[i]!r} ({type(self.base[i]).__name__}) changed in a "
                                       "loop on a tensor", "only tensors and numbers can change in such a loop")
        return out


def while_stmt(test_fn, body_fn, vals, names, inplace, loc):
    vals = tuple(vals)
    while True:
        t = test_fn(*vals)
        if _is_tensor(t):
            _no_inplace(inplace, loc, "a loop on a tensor condition")
            return _tensor_while(test_fn, body_fn, vals, names, loc)
        if not t:
            return vals
        vals = tuple(body_fn(*vals))


def _tensor_while(test_fn, body_fn, vals, names, loc):
    from ..ops import while_loop

    st = _LoopState(vals, names, loc)
    # the body is traced whether or not the loop runs: state it changes in place would change always
    held = _held_containers(vals, test_fn, body_fn) if _C.is_tracing() else []

    def cond_fn(*lv):
        return test_fn(*st.full(lv))

    def body(*lv):
        out = tuple(st.carry(body_fn(*st.full(lv))))
        _check_unchanged(held, loc, names, "a loop on a tensor condition")
        return out

    st.define_returned(lambda lv: body_fn(*st.full(lv)))
    if not st.init:
        raise _error(loc, "a loop on a tensor condition that changes no tensor or number (it cannot end)",
                     "assign the loop's variables in its body")
    final = _loop_with_retyping(st, loc, "a loop on a tensor condition", while_loop, cond_fn, body, ())
    return tuple(st.full(final))


def _loop_with_retyping(st, loc, what, while_loop, cond_fn, body, prefix):
    for _ in range(len(st.carried) + 1):
        try:
            return _run_control(loc, what, while_loop, cond_fn, body, prefix + st.init)[len(prefix):]
        except _Mismatch as e:
            if st.retyped_init(e.wanted) is None:
                raise  # for an enclosing loop to retype, or for the user
    raise AssertionError("unreachable: each retry retypes a loop variable")


class TensorRange:
    """range() with a tensor bound: a for loop over it becomes a while loop."""

    def __init__(self, args, loc):
        if len(args) == 1:
            args = (0, args[0], 1)
        elif len(args) == 2:
            args = (args[0], args[1], 1)
        self.start, self.stop, self.step = args
        self.loc = loc
        if not _is_tensor(self.step) and self.step == 0:
            raise ValueError("range() arg 3 must not be zero")

    def __iter__(self):
        raise _error(self.loc, "iterating a range() with a tensor bound outside a for statement",
                     "use it directly in a for statement")


def for_stmt(iterable, extra_test, body_fn, vals, names, inplace, loc):
    if isinstance(iterable, TensorRange):
        _no_inplace(inplace, loc, "a loop over a range with a tensor bound")
        return _tensor_range_loop(iterable, extra_test, body_fn, vals, names, loc)
    vals = tuple(vals)
    for item in iterable:
        vals = tuple(body_fn(item, *vals))
        if extra_test is not None:
            go = extra_test(*vals)
            if not _is_tensor(go) and not go:
                break
    return vals


def _tensor_range_loop(rng, extra_test, body_fn, vals, names, loc):
    from ..ops import logical_and, while_loop

    st = _LoopState(vals, names, loc)
    start = _as_tensor(rng.start if _is_tensor(rng.start) else int(rng.start), None).long()
    stop, step = rng.stop, rng.step

    def cond_fn(i, *lv):
        if _is_tensor(step):
            from ..ops import where

            go = where(step > 0, i < stop, i > stop)
        else:
            go = i < stop if step > 0 else i > stop
        if extra_test is not None:
            more = extra_test(*st.full(lv))
            go = logical_and(go, _as_tensor(more)) if (_is_tensor(more) or not more) else go
        return go

    def body(i, *lv):
        res = body_fn(_note_chosen(i, int), *st.full(lv))
        return (i + step,) + tuple(st.carry(res))

    st.define_returned(lambda lv: body_fn(start, *st.full(lv)))
    final = _loop_with_retyping(st, loc, "a loop over a range with a tensor bound", while_loop, cond_fn, body,
                                (start,))
    return tuple(st.full(final))


# ---- calls -------------------------------------------------------------------------------

def _range(*args, loc):
    if any(_is_tensor(a) for a in args):
        return TensorRange(args, loc)
    return range(*args)


def _print(*args, sep=" ", end="\n", file=None, flush=False):
    if file is not None:
        # a write to a file object is a Python side effect a graph would skip on later calls
        from .replay import mark_not_replayable

        mark_not_replayable("print(..., file=...) writes to a Python file object")
        return builtins.print(*args, sep=sep, end=end, file=file, flush=flush)
    from ..ops import print_

    return print_(*args, sep=sep, end=end)


_SCALAR_BUILTINS = {builtins.int: "int()", builtins.float: "float()", builtins.bool: "bool()"}
# (code object, its file) -> converted code object, or the JitSyntaxError converting it raised. Code
# objects compare equal without their file: two modules' identical functions are one code by ==, and
# the first one's converted code would name its file in the other's source locations.
_converted = {}
_warned = set()
_functions = weakref.WeakKeyDictionary()  # function -> converted function


def _user_code(fn):
    """Whether fn is user code to convert (not kiln itself, the standard library or packages)."""
    code = getattr(fn, "__code__", None)
    if code is None or code.co_name.startswith("__kiln_"):
        return False
    if code in ast_convert.CONVERTED_CODE:
        return False
    return guards.is_user_code(code)


def with_current_defaults(new):
    """new, a converted function, given its original's defaults (replaced since it was made:
    `f.__defaults__ = (5.0,)`; the guards on them name the original)."""
    fn = getattr(new, "__kiln_original__", None)
    if fn is not None:
        if new.__defaults__ is not fn.__defaults__:
            new.__defaults__ = fn.__defaults__
        if new.__kwdefaults__ is not fn.__kwdefaults__:
            new.__kwdefaults__ = fn.__kwdefaults__
    return new


def convert_function(fn):
    """The converted version of the Python function fn (raises JitSyntaxError)."""
    try:
        return with_current_defaults(_functions[fn])
    except (KeyError, TypeError):
        pass
    code = fn.__code__
    key = (code, code.co_filename)
    inner = _converted.get(key)
    if inner is None:
        try:
            inner = ast_convert.convert_code(fn)
        except JitSyntaxError as e:
            inner = e
        _converted[key] = inner
    if isinstance(inner, JitSyntaxError):
        raise inner
    new = ast_convert.build_function(fn, inner, sys.modules[__name__])
    try:
        _functions[fn] = new
    except TypeError:
        pass
    return new


def _fallback(fn, err):
    """LAX: warns once per function that it is traced as it is."""
    if is_strict():
        raise err
    key = getattr(fn, "__code__", fn)
    if key not in _warned:
        _warned.add(key)
        warnings.warn(f"kiln.jit: {err.msg}; {getattr(fn, '__qualname__', fn)} is traced as it is "
                      "(its Python control flow is fixed at compile time)", RuntimeWarning, stacklevel=3)
    return fn


def _convert_or_fallback(fn):
    try:
        return convert_function(fn)
    except JitSyntaxError as e:
        return _fallback(fn, e)


def convert_callable(f):
    """What converted code calls for f: converted user functions, methods and Cells; f itself
    for everything else."""
    from ..nn.cell import Cell, overriding_call

    if isinstance(f, types.FunctionType):
        return _convert_or_fallback(f) if _user_code(f) else f
    if isinstance(f, types.MethodType):
        func = f.__func__
        if isinstance(func, types.FunctionType) and _user_code(func):
            return types.MethodType(_convert_or_fallback(func), f.__self__)
        return f
    if isinstance(f, Cell) and not hooks.is_jit_function(f):
        override = overriding_call(f)
        if override is not None:  # what calling it runs eagerly
            return types.MethodType(_convert_or_fallback(override), f) if _user_code(override) else f
        construct = type(f).construct
        if not (isinstance(construct, types.FunctionType) and (_user_code(construct) or
                                                               construct in _library_constructs())):
            return f
        conv = _convert_or_fallback(construct)
        return lambda *a, **k: call_cell(f, conv, a, k)
    call = getattr(type(f), "__call__", None)
    if isinstance(call, types.FunctionType) and _user_code(call):  # a callable object of a user class
        return types.MethodType(_convert_or_fallback(call), f)
    return f


def _library_constructs():
    """kiln's own Cells that call other Cells: converted so the Cells they call are too."""
    from ..nn.cell import SequentialCell, WithLossCell

    return (SequentialCell.construct, WithLossCell.construct)


def call_cell(cell, construct, args, kwargs):
    """A Cell called from converted code: logged for the training-mode guards, then its
    converted construct."""
    from ..nn.cell import call_construct_hooked

    _C.log_cell_call(cell)
    amp = cell.__dict__.get("_amp")  # Cell.to_float, auto_mixed_precision: the level while it runs
    body = functools.partial(construct, cell)
    if amp is None:
        return call_construct_hooked(cell, body, args, kwargs)
    saved = _C.amp_set(*amp)
    try:
        return call_construct_hooked(cell, body, args, kwargs)
    finally:
        _C.amp_set(*saved)


_ROUNDING_BUILTINS = (builtins.round, math.floor, math.ceil, math.trunc)


def _rounded(f, args, kwargs):
    """round(), math.floor, math.ceil or math.trunc of a tensor: a tensor (Tensor.__round__, ...).
    Of a number an if or loop on a tensor chose (a noted 0-d tensor) it is noted as the number
    Python gives: an int (int64), or with round's ndigits the number's own type."""
    kind = _number_kind(args[0])
    if kind is None:
        return f(*args, **kwargs)
    ndigits = args[1] if len(args) > 1 else kwargs.get("ndigits")
    if f is builtins.round and ndigits is not None:
        if kind is float:
            return _note_chosen(f(*args, **kwargs), float)
        # Python rounds an int (or bool) to ndigits as an int: through float64, halves to even
        return _note_chosen(round(args[0].astype(_C.float64), ndigits).astype(_C.int64), int)
    x = args[0].astype(_C.int64) if kind is builtins.bool else args[0]  # (floor(True) is 1)
    return _note_chosen(f(x).astype(_C.int64), int)


def converted_call(loc, f, *args, **kwargs):
    if f is builtins.globals and not args and not kwargs:  # the converted code's (the user's module), not this one's
        return sys._getframe(1).f_globals
    if f is builtins.type and len(args) == 1 and not kwargs and isinstance(args[0], dynamic.SymInt):
        return int  # (a size is an int to the user's code, symbolic or not)
    if f is builtins.print:
        return _print(*args, **kwargs)
    if f is builtins.range:
        return _range(*args, loc=loc)
    if f is builtins.abs and len(args) == 1 and not kwargs:
        return unary("abs", args[0])  # (a chosen number's abs stays a number)
    if f in _ROUNDING_BUILTINS and args and _is_tensor(args[0]):
        return _rounded(f, args, kwargs)
    scalar = _SCALAR_BUILTINS.get(f)
    if scalar is not None and args and _is_tensor(args[0]):
        raise _error(loc, f"{scalar} of a tensor value", "keep the value a tensor (use .astype(), comparisons "
                                                          "and kiln.ops.where instead of Python scalars)")
    return convert_callable(f)(*args, **kwargs)
