"""What every capture mode does to start a recording: its inputs bound as graph inputs, the user's
source lines shown to the tracer, and the check of a result that would keep a call's values
(used by kiln.jit.capture_core's Recording, through which every capture mode records)."""
import os
import sysconfig
import types

from .. import _C, grad_hooks
from . import tree

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Python's standard library: its frames are not the user's lines (installed packages inside it are)
_PATHS = sysconfig.get_paths()
_STDLIB_DIR = os.path.join(_PATHS["stdlib"], "")
_SITE_DIRS = tuple(sorted({os.path.join(_PATHS[k], "") for k in ("purelib", "platlib")}))


def user_frame_tracer(tracer, on_call=None):
    """A sys.settrace hook that tells the tracer the user's source line of each op (and shows
    on_call, when given, each frame of user code as it starts); C: kiln._C.FrameHook."""
    return _C.FrameHook(tracer, _PACKAGE_DIR, on_call, _STDLIB_DIR, _SITE_DIRS)


def bind_inputs(tracer, spec, leaves, aliases=None):
    """The call's arguments rebuilt around fresh aliases of its tensors, each declared as the
    next graph input (the same tensor passed twice makes two inputs of one alias, so `a is b` holds
    as in eager; the call key tells such calls apart); appended to `aliases` when given."""
    aliases = [] if aliases is None else aliases
    made = {}  # id(tensor) -> its alias: one tensor in two places is one object to the function too
    for t in leaves:
        a = made.get(id(t))
        if a is None:
            a = made[id(t)] = t.detach()
            a.requires_grad = t.requires_grad and t.is_leaf
            if a.requires_grad and grad_hooks.has_hooks(t):  # (one that runs makes the call eager: kiln.grad_hooks)
                grad_hooks.copy_hooks(t, a, traced=False)
        tracer.add_input(a)  # (a second input of the same alias: the graph reads the last, the call passes both)
        aliases.append(a)
    return tree.unflatten(spec, aliases)[0]


def returns_closure(value, depth=0):
    """Whether value is, or holds in its lists, tuples and dicts, a function with a closure."""
    if isinstance(value, types.FunctionType):
        return bool(value.__closure__)
    if depth < 20 and isinstance(value, (list, tuple, dict)):
        return any(returns_closure(v, depth + 1) for v in (value.values() if isinstance(value, dict) else value))
    return False


def returns_reached(recorder, value, depth=0):
    """Whether value is, or holds in its lists, tuples and dicts, a list, dict or set the capture reached
    from before the call (a global's, a closure's, an attribute of a Cell or an argument: the guard
    recorder's reached_outside). Eagerly the caller gets that very object, and what it then does to it
    reaches its owner; a compiled call returns a copy rebuilt from the graph's structure."""
    if isinstance(value, (list, dict, set)) and recorder.reached_outside(value):
        return True
    if depth < 20 and type(value) in (list, tuple, dict):
        return any(returns_reached(recorder, v, depth + 1)
                   for v in (value.values() if type(value) is dict else value))
    return False


class ContainerChange:
    """A change, during a capture, of a list or dict the caller passed in (what _on_side_effect reports)."""

    def __init__(self, kind, filename, line):
        self.what = f"a change of a {kind} passed in as an argument"
        self.filename, self.line = filename, line

    def __str__(self):
        return self.what


class CallerContainers:
    """The lists and dicts among a call's arguments beside the copies a capture runs on (bind_inputs
    rebuilds them around aliases of the tensors): tells whether the run changed a copy or returned one,
    and carries the run's changes back to the caller's objects."""

    def __init__(self, caller, rebuilt, leaves, aliases):
        self.pairs = []  # (the caller's container, its copy, the copy's items before the run, what it is)
        self.objects = {id(a): t for a, t in zip(aliases, leaves)}  # the copy's objects -> the caller's
        self.kept = None  # reached_outside of the run's guard recorder: containers to_caller hands back as they are
        self._pair(caller, rebuilt)

    def _pair(self, orig, copy, kind=None):
        if type(orig) in (list, dict) and type(copy) is type(orig):
            self.objects[id(copy)] = orig
            self.pairs.append((orig, copy, list(copy.items()) if type(copy) is dict else list(copy),
                               kind or type(copy).__name__))
            values = zip(orig.values(), copy.values()) if type(copy) is dict else zip(orig, copy)
        elif isinstance(orig, tuple) and type(copy) is type(orig) and len(orig) == len(copy):
            values = zip(orig, copy)  # (a namedtuple's fields too)
        elif copy is not orig and type(copy) is type(orig) and type(getattr(orig, "__dict__", None)) is dict \
                and type(getattr(copy, "__dict__", None)) is dict:
            # an object the arguments' tree rebuilds (a dataclass, a registered node): the run writes its
            # attributes on the copy, the caller's own must see them as eagerly
            self.objects[id(copy)] = orig
            self._pair(orig.__dict__, copy.__dict__, f"{type(copy).__name__} object's attributes")
            return
        else:
            return
        for o, c in values:
            self._pair(o, c)

    def changed(self):
        """A ContainerChange when the run changed a copy, else None."""
        for orig, copy, before, kind in self.pairs:
            now = list(copy.items()) if type(copy) is dict else list(copy)
            if len(now) != len(before) or any(
                    (a[0] != b[0] or a[1] is not b[1]) if type(copy) is dict else a is not b
                    for a, b in zip(now, before)):
                return ContainerChange(kind, "<an argument>", 0)
        return None

    def returned(self, result, depth=0):
        """Whether result holds one of the copies."""
        if id(result) in self.objects and not isinstance(result, _C.TensorBase):
            return True  # (a list, dict, or an object the arguments' tree rebuilt)
        if depth < 20 and type(result) in (list, tuple, dict):
            return any(self.returned(v, depth + 1) for v in (result.values() if type(result) is dict else result))
        return False

    def to_caller(self, v, depth=0):
        """v with the copies and aliases replaced by the caller's objects, other traced tensors detached
        but, in grad mode, those that require grad: the run computed them eagerly, and their history
        reaches the parameters it read as an eager call's does (the caller's tensors require no grad
        here, else the call would not have been captured)."""
        found = self.objects.get(id(v))
        if found is not None:
            return found
        if self.kept is not None and isinstance(v, (list, dict, set)) and self.kept(v):
            return v  # (a global's or an attribute's own list: the caller gets that list, as eagerly)
        if isinstance(v, _C.TensorBase):
            return v if v.requires_grad and _C.is_grad_enabled() else v.detach()
        if depth < 20 and type(v) in (list, tuple):
            return type(v)(self.to_caller(x, depth + 1) for x in v)
        if depth < 20 and type(v) is dict:
            return {k: self.to_caller(x, depth + 1) for k, x in v.items()}
        return v

    def write_back(self):
        for orig, copy, _, _ in self.pairs:
            if type(orig) is list:
                orig[:] = [self.to_caller(x) for x in copy]
            else:
                items = {k: self.to_caller(x) for k, x in copy.items()}
                orig.clear()
                orig.update(items)
