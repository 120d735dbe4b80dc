"""What every capture mode does to start a recording: its inputs bound as graph inputs, the user's
source lines shown to the tracer, and the check of a result that would keep a call's values
(kiln.jit.function, kiln.jit.bytecode_capture, kiln.trace)."""
import os
import types

from .. import _C
from . import tree

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def user_frame_tracer(tracer, on_call=None):
    """A sys.settrace hook that tells the tracer the user's source line of each op (and shows
    on_call, when given, each frame of user code as it starts); C: kiln._C.FrameHook."""
    return _C.FrameHook(tracer, _PACKAGE_DIR, on_call)


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
