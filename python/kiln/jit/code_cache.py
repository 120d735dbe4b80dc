"""Compiled entries of capture_mode="bytecode" kept with the code object (its co_extra), shared by
every kiln.jit wrapper of that code whose options agree, and freed when the code object goes.

The garbage collector does not see co_extra: an entry that held the function, its globals or its
closure would keep the code object alive for ever (code -> entries -> function -> code). So what
an entry keeps leads nowhere back:
- guards find their roots at check time: the globals and closure cells of the function being
  called (ROOT_GLOBALS, ROOT_CELL), or an object through a weakref (ROOT_WEAK, a dead referent
  fails the guard); an instance's __dict__, a module's or function's globals and a function's
  closure are found from the object that owns them;
- identity guards on functions, modules, Cells and other objects compare with a weakref (an object
  that takes none, a list or dict read through a global, is compared by id: what the function
  read from it is guarded beside it, rooted where the guard on the container starts); bound
  methods by weak function and self;
- a frozen frame state (cache keys, the spec a piece rebuilds the frames with) names the called
  function as TOP, other functions and objects by weakref, closure cells by (frame, index)
  (see kiln.jit.bytecode.freeze).
Tensors (parameters) and compiled graphs are held as they are: they do not lead to Python frames
or functions. What stays held: a guard root that takes no weakref and is found from no other
(none of the cases above), and in a state, a list or dict reached through a global that is live
at a graph break (its contents are rebuilt from it). A guard on the contents of a list, dict or set
is kept only when they are numbers, strings and tensors (held objects could lead back). Two function objects of one code (a closure made twice) find the same entries;
their closure cells and globals are guarded on each call's own.
"""
import types
import weakref

from .. import _C

_ATOMS = (type(None), bool, int, float, complex, str, bytes)


def token(obj):
    """What an entry keeps to recognize obj: a weakref to it, or its id when it takes none."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return id(obj)


def _atomic(v):
    if isinstance(v, tuple):
        return all(_atomic(x) for x in v)
    return type(v) in _ATOMS


def _weak_root(obj, attr=None):
    try:
        ref = weakref.ref(obj)
    except TypeError:
        return None
    return (ref if attr is None else (ref, attr)), _C.ROOT_WEAK, ()


def _owners(specs, top):
    """id(object) -> (root, root kind, path prefix) for the objects guards are rooted at that are
    found from another: the called function's globals and cells; the __dict__, globals and
    closure cells of the objects the guards name; a list or dict a guard finds (its path)."""
    owners = {id(top.__globals__): (None, _C.ROOT_GLOBALS, ())}
    for k, c in enumerate(top.__closure__ or ()):
        owners[id(c)] = (k, _C.ROOT_CELL, ())
    for root, _path, expected, _mode in specs:
        for o in (expected, root):
            if _atomic(o) or isinstance(o, _C.TensorBase):
                continue
            if isinstance(o, types.FunctionType):
                owners.setdefault(id(o.__globals__), _weak_root(o, "__globals__"))
                for k, c in enumerate(o.__closure__ or ()):
                    ref = _weak_root(o, "__closure__")
                    owners.setdefault(id(c), (ref[0], ref[1], (("item", k),)))
            d = getattr(o, "__dict__", None) if not isinstance(o, type) else None
            if type(d) is dict:
                w = _weak_root(o, "__dict__")
                if w is not None:
                    owners.setdefault(id(d), w)
    owners = {k: v for k, v in owners.items() if v is not None}
    for _ in range(4):  # containers found by a chain of guards (TABLE -> TABLE["a"] -> ...)
        grew = False
        for root, path, expected, mode in specs:
            if mode != _C.GUARD_IDENTITY or id(expected) in owners or _atomic(expected) or isinstance(
                    expected, _C.TensorBase) or isinstance(token(expected), weakref.ref):
                continue
            base = owners.get(id(root)) or _weak_root(root)
            if base is not None:
                owners[id(expected)] = (base[0], base[1], base[2] + tuple(path))
                grew = True
        if not grew:
            break
    return owners


def _expected(expected, mode):
    if mode == _C.GUARD_IDENTITY and not isinstance(expected, _C.TensorBase) and not _atomic(expected):
        return token(expected), _C.GUARD_WEAK
    if mode == _C.GUARD_VALUE and not _atomic(expected):
        return token(expected), _C.GUARD_WEAK
    if mode == _C.GUARD_METHOD:
        if isinstance(expected, types.MethodType):
            return (0, token(expected.__func__), token(expected.__self__)), _C.GUARD_WEAK_METHOD
        return (1, expected.__name__, token(expected.__self__)), _C.GUARD_WEAK_METHOD
    return expected, mode


def weaken(specs, top):
    """The guard specs of a capture of top (GuardRecorder.guard_specs) as specs of a GuardSet that
    holds nothing leading back to top's code: checked with check(fn) for the function called."""
    owners = _owners(specs, top)
    out = []
    for root, path, expected, mode in specs:
        found = owners.get(id(root))
        if found is None and not isinstance(root, _C.TensorBase):
            found = _weak_root(root)
        if found is None:  # a tensor, or an object that takes no weakref and is not found from another
            found = (root, _C.ROOT_OBJECT, ())
        base, kind, prefix = found
        if mode == _C.GUARD_CONTENTS and not all(_atomic(x) or isinstance(x, _C.TensorBase) for x in _items(expected)):
            continue  # (contents holding functions or objects would lead back to the code: not kept with it)
        expected, mode = _expected(expected, mode)
        out.append((base, prefix + tuple(path), expected, mode, kind))
    return out


def _items(contents):
    """The objects a contents guard's expected value holds (a set's, a list's items; a dict's keys and
    values; those of the lists and dicts inside, which it holds as tuples)."""
    for x in contents:
        if type(x) is tuple:
            yield from _items(x)
        else:
            yield x


def entries_dict(code):
    """options key -> Entries of a code object (kept in its co_extra)."""
    return _C.code_entries(code)
