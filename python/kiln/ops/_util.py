"""Argument helpers shared by the functional ops."""
import functools
import inspect
import re
import types

from .. import _C
from .._optable import INFO

apply = _C.apply
as_tensor = _C.shape.as_tensor  # x as a kiln tensor: itself, or Tensor(x)
normalize_axis = _C.shape.normalize_axis  # (op, axis, ndim): one axis in [0, ndim) (0-d: 0 and -1)
axes_mask = _C.shape.axes_mask  # (op, axis, ndim): bitmask of reduced axes; None means every axis


def pair(op, name, v):
    """An int or a pair of ints, as a pair."""
    if isinstance(v, int) and not isinstance(v, bool):
        return (v, v)
    if isinstance(v, (tuple, list)) and len(v) == 2 and all(isinstance(x, int) for x in v):
        return tuple(v)
    raise TypeError(f"{op}: {name} must be an int or a pair of ints, got {v!r}")


shape_tuple = _C.shape.shape_tuple  # (op, shape): ints, a tuple or a list, as a tuple of ints

# ---- errors name the function that was called ------------------------------------------------------

_NAMED = re.compile(r"^([A-Za-z_][\w./]*): ")
# what a bad argument may raise deep inside a function: the same class, or, for the two that say "a
# wrong type" or "a value that does not fit" in other words, TypeError and ValueError
_RENAMED = {TypeError: TypeError, ValueError: ValueError, IndexError: IndexError, KeyError: KeyError,
            AttributeError: TypeError, OverflowError: ValueError, ZeroDivisionError: ValueError}


def names_an_op(message, known):
    """Whether an error message says which op or function it is about: it starts with 'name: ' for
    a name in `known` (op-table names, kiln.ops functions, kiln.nn classes)."""
    m = _NAMED.match(message)
    return bool(m) and m.group(1) in known


def _rename(e, name, known):
    """Raises e (a builtin class of _RENAMED) naming `name` when it names no op yet."""
    cls = type(e)
    if cls not in _RENAMED:
        raise e
    message = str(e.args[0]) if len(e.args) == 1 else str(e)
    if _RENAMED[cls] is cls:
        if not names_an_op(message, known):
            e.args = (f"{name}: {message}",)
        raise e
    raise _RENAMED[cls](f"{name}: {message}") from e


def function_names(namespace):
    """The names an error of kiln's functions may already start with ("name: ..."): the op table's
    and those of the public functions in namespace (a module's dict, such as kiln.ops')."""
    return set(INFO) | {n for n, f in namespace.items() if not n.startswith("_") and isinstance(f, types.FunctionType)}


def naming_errors(f, name, known):
    """f, whose exceptions from bad arguments (the builtin classes of _RENAMED, not subclasses:
    kiln's own errors and the user's pass through) name `name` when they name no op yet: a
    numpy or int() error deep inside becomes "name: ...". AttributeError and OverflowError become
    TypeError and ValueError (chained). The wrapper has f's own signature (no *args/**kwargs to
    pack: about 20 ns a call instead of 200)."""
    try:
        params = list(inspect.signature(f).parameters.values())
    except (TypeError, ValueError):
        params = None
    namespace = {"_f": f, "_caught": tuple(_RENAMED), "_rename": _rename, "_known": known}
    if params is None:
        head, call = "*args, **kwargs", "*args, **kwargs"
    else:
        defs, args, star = [], [], False
        for i, p in enumerate(params):
            default = ""
            if p.default is not p.empty:
                namespace[f"_d{i}"] = p.default
                default = f"=_d{i}"
            if p.kind == p.VAR_POSITIONAL:
                defs.append(f"*{p.name}"), args.append(f"*{p.name}")
                star = True
            elif p.kind == p.VAR_KEYWORD:
                defs.append(f"**{p.name}"), args.append(f"**{p.name}")
            elif p.kind == p.KEYWORD_ONLY:
                if not star:
                    defs.append("*")
                    star = True
                defs.append(f"{p.name}{default}"), args.append(f"{p.name}={p.name}")
            else:
                defs.append(f"{p.name}{default}"), args.append(p.name)
                if p.kind == p.POSITIONAL_ONLY and (i + 1 == len(params) or params[i + 1].kind != p.POSITIONAL_ONLY):
                    defs.append("/")
        head, call = ", ".join(defs), ", ".join(args)
    source = ("\n" * (_as_tracebacks_show.__code__.co_firstlineno - 1) +  # (its lines are the ones below)
              f"def wrapper({head}):\n"
              f"    try:\n"
              f"        return _f({call})\n"
              f"    except _caught as e:\n"
              f"        _rename(e, {name!r}, _known)\n")
    exec(compile(source, __file__, "exec"), namespace)  # this file's name: kiln's code, not the user's
    return functools.wraps(f)(namespace["wrapper"])


def _as_tracebacks_show(*arguments):  # what each wrapper naming_errors compiles is, line for line
    try:
        return _f(*arguments)  # noqa: F821 (the wrapper's own: the function wrapped)
    except _caught as e:  # noqa: F821
        _rename(e, "name", _known)  # noqa: F821
