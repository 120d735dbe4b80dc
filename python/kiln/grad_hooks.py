"""Backward hooks: Tensor.register_hook, a Cell's backward hooks, ops.HookBackward and
ops.InsertGradientOf (MindSpore's names; PyTorch's register_full_backward_hook and
register_full_backward_pre_hook are aliases of the Cell's).

A tensor's hooks live in C (src/autograd/engine.c, kiln_autograd_add_hook): the engine runs them on
the tensor's gradient in each backward pass that reaches it, in the order they were added, each on
what the one before returned: a leaf's (a parameter, an input) once its whole gradient is summed,
before it goes into .grad or to the grad call that asked for it; another tensor's when its gradient
is complete, before it flows into the op that made it (so a new gradient a hook returns is what
everything below sees). No hook runs for a tensor no gradient reaches. A tensor without hooks costs
the engine one pointer test.

A Cell's backward hooks wrap each call (PyTorch's BackwardHook): the tensors going in and coming
out pass through one identity node each way (kiln._C.record_grad); the node after the outputs sees
the gradients of the outputs (grad_output: the pre-hooks run there and may replace them), the node
before the inputs sees the gradients of the inputs (grad_input: the hooks run there, once per call,
with grad_output too, and may replace grad_input).

Compiled code never drops a hook silently (_unreplayable). kiln.jit's trace and ast captures record
a hook that runs while they record, like the function's own code (their guard recorder sees the
hook's Python: what it reads is guarded, a side effect makes the call eager), when the backward it
runs in belongs to the capture (a grad call inside the function; a parameter's hook). Otherwise a
hook that runs, is added or is set up (a hooked Cell or operator called) while a graph is captured
makes the call run eagerly: bytecode pieces (the backward runs in C, outside the interpreter: that
part runs in Python), kiln.trace (no guard recorder: it runs the hooks at every call, and a change
of the ops they add is its TraceMismatchError), a hook copied to a capture's argument alias.
A graph whose capture ran a backward pass guards on STATE["epoch"], bumped whenever a leaf or a
Cell gains or loses a backward hook, so a hook added between calls is seen; a function left eager
is tried again then too (kiln.jit.function.JitFunction._eager_reason).
"""
from . import _C, hooks, tree_util

# What compiled graphs that ran a backward pass guard on (kiln.jit.capture_core): bumped whenever a
# leaf tensor (a parameter, an input) gains or loses a hook.
STATE = {"epoch": 0}


def _unreplayable(what, traced=False, in_forward=False):
    """While a graph is captured: a hook (Python code run in the backward pass) that the capture
    cannot record makes the call run eagerly (kiln.jit.replay). traced: the hook's ops go into the
    graph when the capture records hooks (kiln.jit's trace and ast captures, whose guard recorder
    sees the hook's Python: its reads guarded, its side effects found); in_forward: a hook set up
    in the forward (registered, a hooked Cell or operator called) is recorded only inside a grad
    call's function, whose backward runs inside this capture too; else the call runs eagerly."""
    if not _C.is_tracing():
        return
    from .jit.replay import hooks_traced, mark_not_replayable

    if traced and hooks_traced() and (not in_forward or differentiating()):
        return
    mark_not_replayable(f"{what}: backward hooks are Python code the compiled graph would not run")


def differentiating():
    """Whether code runs inside a grad call's function (kiln.autograd, registered in kiln.hooks; its
    backward runs in this capture too)."""
    return hooks.differentiating is not None and hooks.differentiating()


class RemovableHandle:
    """What the register_*hook functions return: remove() takes the hook away (twice is harmless);
    also a `with` block that removes it at the end (PyTorch's RemovableHandle)."""

    def __init__(self, remove):
        self._remove = remove

    def remove(self):
        remove, self._remove = self._remove, None
        if remove is not None:
            remove()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()


def _check_hook(name, fn):
    if not callable(fn):
        raise TypeError(f"{name}: the hook must be callable, got {type(fn).__name__}")


def register_hook(tensor, hook):
    """Tensor.register_hook(hook): hook(grad) -> a new gradient or None runs on tensor's gradient in
    every backward pass that reaches it (see the module's text). Returns a RemovableHandle."""
    _check_hook("register_hook", hook)
    if not tensor.requires_grad:
        raise RuntimeError("register_hook: the tensor does not require grad, so no gradient will reach a hook on "
                           "it (set requires_grad, or hook a tensor computed from one that does)")
    leaf = tensor.is_leaf
    # (a hook on a tensor the capture made is recorded with it; one added to a leaf, a parameter or an
    # argument, lasts beyond the call)
    _unreplayable("Tensor.register_hook on a leaf tensor ran while the graph was captured", traced=not leaf,
                  in_forward=True)
    hid = _C.TensorBase._add_grad_hook(tensor, _Runner(hook, "a Tensor.register_hook hook"))
    if leaf:
        STATE["epoch"] += 1

    def remove():
        if _C.TensorBase._remove_grad_hook(tensor, hid) and leaf:
            STATE["epoch"] += 1

    return RemovableHandle(remove)


class _Runner:
    """Calls a tensor hook on a gradient: the hook's result, checked (a Tensor or None). traced: its ops
    may be recorded by a capture (not a hook copied to a capture's argument: a later call's argument
    may hold other hooks under the same call key)."""

    __slots__ = ("hook", "what", "traced")

    def __init__(self, hook, what, traced=True):
        self.hook, self.what, self.traced = hook, what, traced

    def __call__(self, grad):
        _unreplayable(f"{self.what} ran in the backward pass", self.traced)
        got = self.hook(grad)
        if got is not None and not isinstance(got, _C.TensorBase):
            raise TypeError(f"{self.what} must return a Tensor or None, got {type(got).__name__}")
        return got


def copy_hooks(source, leaf, traced=True):
    """The hooks of the leaf source, run on leaf too (a grad call differentiates a detached copy of
    its tensor arguments: kiln.autograd; a capture, an alias: kiln.jit.recording, traced=False)."""
    for fn in _C.TensorBase._leaf_grad_hooks(source):
        if isinstance(fn, _Runner):
            fn = _Runner(fn.hook, fn.what, fn.traced and traced)
        _C.TensorBase._add_grad_hook(leaf, fn)


def has_hooks(tensor):
    return _C.TensorBase._has_grad_hooks(tensor)


# ---- MindSpore's hook operators ---------------------------------------------------------------

def _identity_with_hook(x, hook, what):
    if not isinstance(x, _C.TensorBase):
        raise TypeError(f"{what}: the input must be a Tensor, got {type(x).__name__}")
    if not (x.requires_grad and _C.is_grad_enabled()):
        return x  # no gradient will flow through: nothing to hook
    _unreplayable(f"{what} was called while the graph was captured", traced=True, in_forward=True)
    y = x.detach()
    _C.record_grad((x,), (y,), _IdentityGrad(hook, what), what, True)
    return y


class _IdentityGrad:
    """The rule of an identity node whose gradient goes through hook(grad) -> new gradient or None."""

    __slots__ = ("hook", "what")

    def __init__(self, hook, what):
        self.hook, self.what = hook, what

    def __call__(self, grads, needs, create_graph):
        g = grads[0]
        if g is None:
            return (None,)
        _unreplayable(f"{self.what} ran in the backward pass", traced=True)
        got = self.hook(g)
        if got is None:
            return (g,)
        if not isinstance(got, _C.TensorBase):
            raise TypeError(f"{self.what}: the hook must return a Tensor or None, got {type(got).__name__}")
        if tuple(got.shape) != tuple(g.shape):
            raise ValueError(f"{self.what}: the hook returned a gradient of shape {tuple(got.shape)} for a gradient "
                             f"of shape {tuple(g.shape)}")
        return (got,)


class HookBackward:
    """MindSpore's ops.HookBackward(hook_fn): an identity whose backward runs hook_fn(grad) -> new
    gradient or None on the gradient passing through (to print or change it)."""

    def __init__(self, hook_fn, cell_id=""):
        _check_hook("HookBackward", hook_fn)
        self.hook_fn, self.cell_id = hook_fn, cell_id

    def __call__(self, *inputs):
        outs = tuple(_identity_with_hook(x, self.hook_fn, "HookBackward") for x in inputs)
        return outs[0] if len(outs) == 1 else outs


class InsertGradientOf:
    """MindSpore's ops.InsertGradientOf(f): an identity whose backward passes the gradient through
    f(grad) -> the new gradient (clipping, scaling)."""

    def __init__(self, f):
        _check_hook("InsertGradientOf", f)
        self.f = f

    def __call__(self, x):
        return _identity_with_hook(x, self._run, "InsertGradientOf")

    def _run(self, grad):
        got = self.f(grad)
        if got is None:
            raise TypeError("InsertGradientOf: the function must return the new gradient, got None")
        return got


# ---- a Cell's backward hooks ------------------------------------------------------------------

class CellCall:
    """One call of a Cell with backward hooks (kiln.nn.cell): wrap_inputs before construct and
    wrap_outputs after put the call between two identity nodes, whose gradients run the hooks
    (pre_hooks(cell, grad_output), hooks(cell, grad_input, grad_output); see the module's text)."""

    def __init__(self, cell, pre_hooks, hooks):
        self.cell, self.pre_hooks, self.hooks = cell, pre_hooks, hooks
        self.grad_output = None
        self.nargs = 0
        self.inputs_wrapped = False

    def wrap_inputs(self, args):
        _unreplayable(f"a {type(self.cell).__name__} cell with backward hooks was called while the graph was captured",
                      traced=True, in_forward=True)
        self.nargs = len(args)
        at = [k for k, a in enumerate(args) if isinstance(a, _C.TensorBase) and a.requires_grad]
        if not at or not _C.is_grad_enabled() or not self.hooks:
            return args
        made = tuple(args[k].detach() for k in at)
        _C.record_grad(tuple(args[k] for k in at), made, _CellInputGrad(self, at), "CellBackwardHook", True)
        self.inputs_wrapped = True
        args = list(args)
        for k, m in zip(at, made):
            args[k] = m
        return tuple(args)

    def wrap_outputs(self, output):
        leaves, treedef = tree_util.tree_flatten(output)
        at = [k for k, t in enumerate(leaves) if isinstance(t, _C.TensorBase) and t.requires_grad]
        if not at or not _C.is_grad_enabled():
            return output
        self.nout = len(leaves)
        made = tuple(leaves[k].detach() for k in at)
        _C.record_grad(tuple(leaves[k] for k in at), made, _CellOutputGrad(self, at), "CellBackwardHook", True)
        for k, m in zip(at, made):
            leaves[k] = m
        return treedef.unflatten(leaves)

    def run_hooks(self, grad_input):
        for hook in self.hooks:
            got = hook(self.cell, grad_input, self.grad_output)
            if got is not None:
                got = _as_grads("register_backward_hook", got, grad_input)
                grad_input = got
        return grad_input


def _as_grads(name, got, like):
    got = tuple(got) if isinstance(got, (tuple, list)) else (got,)
    if len(got) != len(like):
        raise ValueError(f"Cell.{name}: the hook returned {len(got)} gradients for {len(like)}")
    for g, w in zip(got, like):
        if g is not None and not isinstance(g, _C.TensorBase):
            raise TypeError(f"Cell.{name}: the hook must return Tensors (or None entries), got {type(g).__name__}")
        if g is not None and w is not None and tuple(g.shape) != tuple(w.shape):
            raise ValueError(f"Cell.{name}: the hook returned a gradient of shape {tuple(g.shape)} for one of shape "
                             f"{tuple(w.shape)}")
    return got


class _CellGrad:
    """A node rule of a hooked Cell call: the gradients it gets, at positions `at` of the call's
    outputs or inputs, spread over all of them (None where none came)."""

    __slots__ = ("call", "at")

    def __init__(self, call, at):
        self.call, self.at = call, at

    def _spread(self, grads, n):
        _unreplayable(f"the backward hooks of a {type(self.call.cell).__name__} cell ran", traced=True)
        full = [None] * n
        for k, g in zip(self.at, grads):
            full[k] = g
        return tuple(full)


class _CellOutputGrad(_CellGrad):
    """The gradients of a hooked call's outputs: the pre-hooks run on them (and may replace them);
    kept as grad_output for the hooks."""

    __slots__ = ()

    def __call__(self, grads, needs, create_graph):
        call = self.call
        grad_output = self._spread(grads, call.nout)
        for hook in call.pre_hooks:
            got = hook(call.cell, grad_output)
            if got is not None:
                grad_output = _as_grads("register_backward_pre_hook", got, grad_output)
        call.grad_output = grad_output
        if not call.inputs_wrapped and call.hooks:  # no input takes a gradient: the hooks run here
            call.run_hooks((None,) * call.nargs)
        return tuple(grad_output[k] for k in self.at)


class _CellInputGrad(_CellGrad):
    """The gradients of a hooked call's inputs: the hooks run on them with grad_output."""

    __slots__ = ()

    def __call__(self, grads, needs, create_graph):
        full = self._spread(grads, self.call.nargs)
        got = self.call.run_hooks(full)
        return tuple(got[k] for k in self.at)
